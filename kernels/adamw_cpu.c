/* adamw_cpu.c — fp32 reference of the optimizer step, the gradient norm and the gradient
 * scaling (contract in adamw.h). Element math mirrors torch's eager AdamW kernel
 * operation by operation (mul_, lerp_, mul_/addcmul_, sqrt/div/add, addcdiv_) so the CPU and
 * PyTorch agree to rounding. Legend: n elements. */
#include "kernels/adamw.h"

#include <math.h>

void adamw_cpu(float *p, const float *g, float *m, float *v, long long n, float lr, float beta1,
               float beta2, float eps, float wd, int step) {
    /* scalars as torch computes them: in double from the decimals the user wrote, applied in
     * fp32 (torch casts a Python scalar to the tensor's fp32) */
    const double lr_d = adamw_scalar(lr), b1_d = adamw_scalar(beta1), b2_d = adamw_scalar(beta2);
    const double bc1 = 1.0 - pow(b1_d, step), bc2 = 1.0 - pow(b2_d, step);
    const float decay = (float)(1.0 - lr_d * adamw_scalar(wd));
    const float w1 = (float)(1.0 - b1_d), w2 = (float)(1.0 - b2_d), b2f = (float)b2_d;
    const float step_size = (float)(lr_d / bc1), bc2_sqrt = (float)sqrt(bc2), eps_f = (float)adamw_scalar(eps);
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < n; i++) {
        float pi = p[i] * decay;
        float mi = m[i] + w1 * (g[i] - m[i]);                 /* lerp_(g, 1 - beta1) */
        float vi = v[i] * b2f + w2 * g[i] * g[i];           /* mul_(beta2).addcmul_(g, g, 1 - beta2) */
        float denom = sqrtf(vi) / bc2_sqrt + eps_f;
        p[i] = pi - step_size * (mi / denom);                 /* addcdiv_(m, denom, -step_size) */
        m[i] = mi;
        v[i] = vi;
    }
}

#define SUMSQ_BLOCKS 256
double sumsq_cpu(const float *x, long long n) {
    /* fixed blocks, each summed in order, then the blocks in order: the result does not depend
     * on the number of threads */
    double part[SUMSQ_BLOCKS];
    long long bs = (n + SUMSQ_BLOCKS - 1) / SUMSQ_BLOCKS;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < SUMSQ_BLOCKS; b++) {
        long long i0 = (long long)b * bs, i1 = i0 + bs < n ? i0 + bs : n;
        double s = 0;
        for (long long i = i0; i < i1; i++) s += (double)x[i] * x[i];
        part[b] = s;
    }
    double s = 0;
    for (int b = 0; b < SUMSQ_BLOCKS; b++) s += part[b];
    return s;
}

void scale_cpu(float *x, long long n, float s) {
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < n; i++) x[i] *= s;
}
