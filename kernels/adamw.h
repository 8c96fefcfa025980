/* adamw.h — the optimizer step on fp32 master weights, the global gradient norm and gradient
 * scaling (the host-side schedule and clip coefficient are engine/train/optim.h). CPU reference in adamw_cpu.c (OpenMP over n); the
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
#include <math.h>
#include <stdint.h>
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

/* The step's fp32 scalars, made once per step from the hyperparameters (every implementation
 * uses these, so the element math below sees the same numbers everywhere). */
typedef struct {
    float decay, w1, w2, b2f, step_size, bc2_sqrt, eps;
} adamw_consts;
static inline adamw_consts adamw_consts_make(float lr, float beta1, float beta2, float eps, float wd, int step) {
    const double lr_d = adamw_scalar(lr), b1_d = adamw_scalar(beta1), b2_d = adamw_scalar(beta2);
    const double bc1 = 1.0 - pow(b1_d, step), bc2 = 1.0 - pow(b2_d, step);
    adamw_consts k = {(float)(1.0 - lr_d * adamw_scalar(wd)),
                      (float)(1.0 - b1_d),
                      (float)(1.0 - b2_d),
                      (float)b2_d,
                      (float)(lr_d / bc1),
                      (float)sqrt(bc2),
                      (float)adamw_scalar(eps)};
    return k;
}

/* What a host step counts as it goes (no second pass over memory): the elements whose new weight
 * (w) or stored second moment (v) is not finite; both 0 on a sound step. */
typedef struct {
    long long w, v;
} adamw_bad;

/* One AdamW step over n fp32 parameters. p, m, v (n) updated in place; g (n). step is 1-based. */
adamw_bad adamw_cpu(float *p, const float *g, float *m, float *v, long long n, float lr, float beta1, float beta2, float eps,
                    float wd, int step);

/* adamw_cpu (the same element math, bit for bit) that also writes the new weights' bf16 bits
 * into act (n), rounded to nearest even as CUDA's __float2bfloat16: the host half of the
 * offloaded optimizer (engine/train/offload.h), one pass over memory, OpenMP + SIMD. */
adamw_bad adamw_bf16_cpu(float *p, uint16_t *act, const float *g, float *m, float *v, long long n, float lr, float beta1,
                         float beta2, float eps, float wd, int step);
/* The same step with the moments held as bf16 (m, v: n bf16 bits each), Megatron's precision-
 * aware optimizer's choice (exp_avg / exp_avg_sq dtype bf16): each moment read exactly, the
 * element math in fp32 as above, the weights moved by the fp32 new moments, which are then
 * stored rounded to nearest even. act NULL: no bf16 copy of the weights. From zero moments the
 * first step's weights are adamw_cpu's bit for bit. 8 bytes of state a parameter, not 12. */
adamw_bad adamw_m16_cpu(float *p, uint16_t *act, const float *g, uint16_t *m, uint16_t *v, long long n, float lr, float beta1,
                        float beta2, float eps, float wd, int step);


/* Sum of squares of x (n) in double, for the global grad norm sqrt(sum over tensors).
 * Deterministic: fixed blocks summed in a fixed order, whatever the thread count. */
double sumsq_cpu(const float *x, long long n);

/* x (n) *= s (gradient clipping). */
void scale_cpu(float *x, long long n, float s);

#endif
