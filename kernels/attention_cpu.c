/* attention_cpu.c — fp32 reference of attention.h: one query at a time, exact softmax, its key
 * ranges in order (a, the extras, b).
 * Forward is parallel over (token, head); backward over kv heads, so each thread owns the
 * dk/dv rows it adds into and the sums do not depend on the thread count. */
#include "kernels/attention.h"

#include <math.h>
#include <stdlib.h>

enum { NR = 2 + ATTN_XR_MAX };

/* The keys query t sees, as 2 + nx ranges in the order a, the extras, b (T queries in all):
 * a prefix tree's ancestors in packed order, then the token's own segment, so the keys come in
 * position order as in the flat layout and in decode, and a row's sums take the same order
 * (bit-equal logprobs across layouts and batches); returns how many keys. */
static inline int ranges_of(attn_ranges r, int t, int T, int lo[NR], int hi[NR]) {
    lo[0] = r.a0[t];
    hi[0] = r.a1[t];
    int n = hi[0] - lo[0];
    for (int x = 0; x < r.nx; x++) {
        lo[1 + x] = r.x0[(size_t)x * T + t];
        hi[1 + x] = r.x1[(size_t)x * T + t];
        n += hi[1 + x] - lo[1 + x];
    }
    lo[1 + r.nx] = r.b0[t];
    hi[1 + r.nx] = r.b1[t];
    return n + hi[1 + r.nx] - lo[1 + r.nx];
}

static inline float dotd(const float *a, const float *b, int D) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

void attention_fwd_cpu(float *out, float *lse, const float *q, const float *k, const float *v, attn_ranges r, int T, int H, int K,
                       int D) {
    float scale = 1.0f / sqrtf((float)D);
    int rep = H / K, nmax = 1;
    for (int t = 0; t < T; t++) {
        int lo[NR], hi[NR], n = ranges_of(r, t, T, lo, hi);
        if (n > nmax) nmax = n;
    }
#pragma omp parallel
    {
        float *p = malloc((size_t)nmax * sizeof(float));
#pragma omp for collapse(2) schedule(dynamic, 16)
        for (int t = 0; t < T; t++) {
            for (int h = 0; h < H; h++) {
                int g = h / rep, lo[NR], hi[NR];
                ranges_of(r, t, T, lo, hi);
                const float *qt = q + ((size_t)t * H + h) * D;
                float mx = -INFINITY;
                int n = 0;
                for (int s = 0; s < 2 + r.nx; s++)
                    for (int j = lo[s]; j < hi[s]; j++, n++) {
                        p[n] = scale * dotd(qt, k + ((size_t)j * K + g) * D, D);
                        if (p[n] > mx) mx = p[n];
                    }
                double sum = 0;
                for (int i = 0; i < n; i++) {
                    p[i] = expf(p[i] - mx);
                    sum += p[i];
                }
                float inv = (float)(1.0 / sum);
                float *o = out + ((size_t)t * H + h) * D;
                for (int d = 0; d < D; d++) o[d] = 0;
                n = 0;
                for (int s = 0; s < 2 + r.nx; s++)
                    for (int j = lo[s]; j < hi[s]; j++, n++) {
                        const float *vj = v + ((size_t)j * K + g) * D;
                        float w = p[n] * inv;
#pragma omp simd
                        for (int d = 0; d < D; d++) o[d] += w * vj[d];
                    }
                lse[(size_t)t * H + h] = mx + (float)log(sum);
            }
        }
        free(p);
    }
}

void attention_bwd_cpu(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v,
                       const float *out, const float *lse, attn_ranges r, int T, int H, int K, int D) {
    float scale = 1.0f / sqrtf((float)D);
    int rep = H / K;
#pragma omp parallel for schedule(static)
    for (int g = 0; g < K; g++) {
        for (int t = 0; t < T; t++) {
            for (int h = g * rep; h < (g + 1) * rep; h++) {
                int lo[NR], hi[NR];
                ranges_of(r, t, T, lo, hi);
                size_t th = (size_t)t * H + h;
                const float *qt = q + th * D, *dot_ = dout + th * D, *ot = out + th * D;
                float *dqt = dq + th * D;
                float L = lse[th];
                float Dsum = dotd(dot_, ot, D); /* Σ_j P_j dP_j */
                for (int d = 0; d < D; d++) dqt[d] = 0;
                for (int s = 0; s < 2 + r.nx; s++)
                    for (int j = lo[s]; j < hi[s]; j++) {
                        size_t jg = (size_t)j * K + g;
                        const float *kj = k + jg * D, *vj = v + jg * D;
                        float P = expf(scale * dotd(qt, kj, D) - L);
                        float dP = dotd(dot_, vj, D);
                        float dS = P * (dP - Dsum) * scale;
                        float *dkj = dk + jg * D, *dvj = dv + jg * D;
#pragma omp simd
                        for (int d = 0; d < D; d++) {
                            dqt[d] += dS * kj[d];
                            dkj[d] += dS * qt[d];
                            dvj[d] += P * dot_[d];
                        }
                    }
            }
        }
    }
}
