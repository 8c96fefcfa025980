/* adamw_cpu.c — fp32 reference of the optimizer step, the gradient norm and the gradient
 * scaling (contract in adamw.h). Element math mirrors torch's eager AdamW kernel
 * operation by operation (mul_, lerp_, mul_/addcmul_, sqrt/div/add, addcdiv_) so the CPU and
 * PyTorch agree to rounding. Legend: n elements. */
#include "common/bf16.h"
#include "kernels/adamw.h"

#include <float.h>
#include <math.h>

/* One element: torch's eager order of operations (lerp_, mul_/addcmul_, sqrt/div/add, addcdiv_),
 * from the moments' old values mo, vo; the new ones in mi_, vi_ for the caller to store. */
#define ADAMW_ELEM(k, p, g, mo, vo, i, pnew) \
    float pi_ = (p)[i] * (k).decay; \
    float gi_ = (g)[i]; \
    float mi_ = (mo) + (k).w1 * (gi_ - (mo)); /* lerp_(g, 1 - beta1) */ \
    float vi_ = (vo) * (k).b2f + (k).w2 * gi_ * gi_; /* mul_(beta2).addcmul_(g, g, 1 - beta2) */ \
    float denom_ = sqrtf(vi_) / (k).bc2_sqrt + (k).eps; \
    float pnew = pi_ - (k).step_size * (mi_ / denom_); /* addcdiv_(m, denom, -step_size) */

/* The element loops built for AVX-512 and AVX2 beside the baseline, chosen at load time: the
 * same bits (each operation is IEEE-rounded, no contraction, sqrt and division exact at any
 * width), two to four times the elements a cycle on the hosts the GPUs sit in. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ADAMW_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ADAMW_CLONES
#endif

/* fp32 moments read and stored as they are (bf16 ones: f32_from_bf16, bf16_from_f32) */
static inline float f32_same(float x) { return x; }
/* 1 when a value is not finite (NaN compares false) */
static inline int bad_f32(float x) { return !(fabsf(x) <= FLT_MAX); }

/* One loop over [i0, i1) of one step: moments read by LD, stored by ST, and the weights' bf16
 * copy written where act is not NULL (two loops, so each vectorizes without a branch); the new
 * weights and the stored second moments (read back by LD) that are not finite counted in bw, bv
 * (ints, as the lanes are 32 bits: a range is at most a block). */
#define ADAMW_LOOPS(LD, ST) \
    if (act) { \
        _Pragma("omp simd reduction(+ : bw, bv)") for (long long i = i0; i < i1; i++) { \
            ADAMW_ELEM(k, p, g, LD(m[i]), LD(v[i]), i, pn) \
            m[i] = ST(mi_); \
            v[i] = ST(vi_); \
            p[i] = pn; \
            act[i] = bf16_from_f32(pn); \
            bw += bad_f32(pn); \
            bv += bad_f32(LD(v[i])); \
        } \
    } else { \
        _Pragma("omp simd reduction(+ : bw, bv)") for (long long i = i0; i < i1; i++) { \
            ADAMW_ELEM(k, p, g, LD(m[i]), LD(v[i]), i, pn) \
            m[i] = ST(mi_); \
            v[i] = ST(vi_); \
            p[i] = pn; \
            bw += bad_f32(pn); \
            bv += bad_f32(LD(v[i])); \
        } \
    }

/* Elements [i0, i1) of one step; act NULL: no bf16 copy. The Makefile builds this file with
 * -fno-math-errno so that sqrtf vectorizes (sqrtps rounds correctly, as sqrtss: the same bits;
 * there is no other library call here). */
ADAMW_CLONES static adamw_bad adamw_range(const adamw_consts *kp, float *restrict p, uint16_t *restrict act,
                                          const float *restrict g, float *restrict m, float *restrict v, long long i0,
                                          long long i1) {
    const adamw_consts k = *kp;
    int bw = 0, bv = 0;
    ADAMW_LOOPS(f32_same, f32_same)
    return (adamw_bad){bw, bv};
}

/* The same with bf16 moments: read exactly, stepped in fp32, the weights moved by the fp32 new
 * moments, then stored rounded to nearest even (adamw_m16_cpu). */
ADAMW_CLONES static adamw_bad adamw_range_m16(const adamw_consts *kp, float *restrict p, uint16_t *restrict act,
                                              const float *restrict g, uint16_t *restrict m, uint16_t *restrict v, long long i0,
                                              long long i1) {
    const adamw_consts k = *kp;
    int bw = 0, bv = 0;
    ADAMW_LOOPS(f32_from_bf16, bf16_from_f32)
    return (adamw_bad){bw, bv};
}

/* static blocks of 64 KiB-aligned ranges, one call of adamw_range each (m16: m, v are bf16) */
static adamw_bad adamw_run(const adamw_consts *k, float *p, uint16_t *act, const float *g, void *m, void *v, int m16, long long n) {
    const long long blk = 16384;
    long long nb = (n + blk - 1) / blk, bw = 0, bv = 0;
#pragma omp parallel for schedule(static) reduction(+ : bw, bv)
    for (long long b = 0; b < nb; b++) {
        long long i0 = b * blk, i1 = i0 + blk < n ? i0 + blk : n;
        adamw_bad r = m16 ? adamw_range_m16(k, p, act, g, m, v, i0, i1) : adamw_range(k, p, act, g, m, v, i0, i1);
        bw += r.w;
        bv += r.v;
    }
    return (adamw_bad){bw, bv};
}

adamw_bad adamw_cpu(float *p, const float *g, float *m, float *v, long long n, float lr, float beta1, float beta2, float eps,
                    float wd, int step) {
    /* scalars as torch computes them: in double from the decimals the user wrote, applied in
     * fp32 (torch casts a Python scalar to the tensor's fp32) */
    const adamw_consts k = adamw_consts_make(lr, beta1, beta2, eps, wd, step);
    return adamw_run(&k, p, NULL, g, m, v, 0, n);
}

adamw_bad adamw_bf16_cpu(float *p, uint16_t *act, const float *g, float *m, float *v, long long n, float lr, float beta1,
                         float beta2, float eps, float wd, int step) {
    const adamw_consts k = adamw_consts_make(lr, beta1, beta2, eps, wd, step);
    return adamw_run(&k, p, act, g, m, v, 0, n);
}

adamw_bad adamw_m16_cpu(float *p, uint16_t *act, const float *g, uint16_t *m, uint16_t *v, long long n, float lr, float beta1,
                        float beta2, float eps, float wd, int step) {
    const adamw_consts k = adamw_consts_make(lr, beta1, beta2, eps, wd, step);
    return adamw_run(&k, p, act, g, m, v, 1, n);
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
