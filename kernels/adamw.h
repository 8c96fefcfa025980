/* adamw.h — the optimizer step on fp32 master weights, the global gradient norm, gradient
 * clipping and the learning-rate schedule. CPU reference in adamw_cpu.c (OpenMP over n); the
 * CUDA version keeps the same names with a _cuda suffix and a stream.
 *
 * adamw_cpu is torch.optim.AdamW (amsgrad=False, maximize=False) for one tensor, step t >= 1:
 *   p -= lr * wd * p                                   (decoupled weight decay, first)
 *   m  = beta1 m + (1 - beta1) g ;  v = beta2 v + (1 - beta2) g^2
 *   p -= (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
 * with the bias corrections in double and the element math in fp32, as torch's eager kernel.
 * Hyperparameters arrive as fp32 but were written as decimals (betas [0.9, 0.999] in a request):
 * adamw_scalar recovers that decimal, so 1 - beta2 is 0.001 as torch computes it in double, not
 * 1 - 0.999f = 0.000999987 (1.3e-5 off in every second moment). The CUDA launcher uses it too.
 * Legend: n elements. */
#ifndef GRPOD_ADAMW_H
#define GRPOD_ADAMW_H
#include <stdio.h>
#include <stdlib.h>

/* The shortest decimal (6..9 significant digits) that rounds to x, as a double. */
static inline double adamw_scalar(float x) {
    char buf[32];
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)x);
        double d = strtod(buf, NULL);
        if ((float)d == x) return d;
    }
    return (double)x;
}

/* One AdamW step over n fp32 parameters. p, m, v (n) updated in place; g (n). step is 1-based. */
void adamw_cpu(float *p, const float *g, float *m, float *v, long long n, float lr, float beta1,
               float beta2, float eps, float wd, int step);

/* Sum of squares of x (n) in double, for the global grad norm sqrt(sum over tensors).
 * Deterministic: fixed blocks summed in a fixed order, whatever the thread count. */
double sumsq_cpu(const float *x, long long n);

/* x (n) *= s (gradient clipping). */
void scale_cpu(float *x, long long n, float s);

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
