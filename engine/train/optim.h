/* optim.h — the optimizer's host-side arithmetic, per step: the learning-rate schedule and the
 * gradient-clip coefficient. The step itself (AdamW, the gradient norm, the scaling) runs on
 * the backend: kernels/adamw.h. */
#ifndef GRPOD_OPTIM_H
#define GRPOD_OPTIM_H

/* torch.nn.utils.clip_grad_norm_'s factor: min(1, max_norm / (total_norm + 1e-6)); 1 when
 * max_norm <= 0 (no clipping). Multiply the gradients by it (scale_cpu). */
double grad_clip_coef(double total_norm, double max_norm);

/* Learning rate of optimizer step `step` (1-based).
 *   warm-up (step <= warmup_steps): base_lr * step / warmup_steps — linear, reaching base_lr at
 *     the last warm-up step (HF's schedulers use (step - 1) / warmup and start from 0; we never
 *     spend a step at lr 0);
 *   then schedule 0 (constant): base_lr;
 *   schedule 1 (cosine, as HF get_cosine_schedule_with_warmup with a min_lr_ratio floor, as veRL):
 *     progress = (step - 1 - warmup_steps) / max(1, total_steps - warmup_steps), clamped to [0, 1];
 *     base_lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + cos(pi * progress))). */
float lr_schedule(float base_lr, int step, int warmup_steps, int schedule, int total_steps,
                  float min_lr_ratio);
#endif
