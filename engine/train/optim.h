/* optim.h — the optimizer's host-side arithmetic, per step: the learning-rate schedule and the
 * gradient-clip coefficient. The step itself (AdamW, the gradient norm, the scaling) runs on
 * the backend: kernels/adamw.h. */
#ifndef GRPOD_OPTIM_H
#define GRPOD_OPTIM_H

/* torch.nn.utils.clip_grad_norm_'s factor: min(1, max_norm / (total_norm + 1e-6)); 1 when
 * max_norm <= 0 (no clipping). Multiply the gradients by it (scale_cpu). */
double grad_clip_coef(double total_norm, double max_norm);

/* Learning rate of optimizer step `step` (1-based), as verl 0.9.1's schedulers
 * (verl/utils/torch_functional.py get_constant_schedule_with_warmup and
 * get_cosine_schedule_with_warmup, whose LambdaLR counts c = step - 1 from 0; HF transformers'
 * schedulers of the same names agree):
 *   warm-up (step <= warmup_steps): base_lr * (step - 1) / warmup_steps — linear from 0 at the
 *     first step, base_lr / warmup short of base_lr at the last warm-up step;
 *   then schedule 0 (constant): base_lr;
 *   schedule 1 (cosine, veRL's with its min_lr_ratio floor):
 *     progress = (step - 1 - warmup_steps) / max(1, total_steps - warmup_steps);
 *     base_lr * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + cos(pi * progress))).
 *   Past total_steps (progress > 1) grpod holds the floor, base_lr * min_lr_ratio; veRL's and HF's
 *   cosine would rise again there (their trainers stop at total_steps). */
float lr_schedule(float base_lr, int step, int warmup_steps, int schedule, int total_steps, float min_lr_ratio);
#endif
