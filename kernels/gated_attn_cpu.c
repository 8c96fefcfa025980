/* gated_attn_cpu.c — fp32 reference of gated_attn.h. The per-head norm is rmsnorm_cpu.c's
 * (mean of squares in double); the rotation is rope_cpu.c's (angles pos·inv_freq in fp32, cos
 * and sin in double), on the first R dims. */
#include "kernels/gated_attn.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* x (D) rotated in place by position p over its first R dims (sign -1: the inverse, the backward) */
static void rotate(float *x, int p, const float *inv_freq, int R, float sign) {
    int half = R / 2;
    for (int i = 0; i < half; i++) {
        float ang = (float)p * inv_freq[i];
        float c = (float)cos((double)ang), s = sign * (float)sin((double)ang);
        float x1 = x[i], x2 = x[i + half];
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
    }
}

static void norm_rope_row(float *y, float *rstd, const float *x, const float *w, int p, const float *inv_freq, int D, int R,
                          float eps) {
    double ss = 0;
    for (int i = 0; i < D; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)(ss / D) + eps);
    *rstd = r;
    for (int i = 0; i < D; i++) y[i] = w[i] * (x[i] * r);
    rotate(y, p, inv_freq, R, 1.0f);
}

void gated_attn_qk_fwd_cpu(float *q, float *k, float *rstdq, float *rstdk, const float *qg, const float *k0, const float *wq,
                           const float *wk, const int *pos, const float *inv_freq, int T, int H, int K, int D, int R, float eps) {
#pragma omp parallel for
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < H; h++)
            norm_rope_row(q + ((size_t)t * H + h) * D, rstdq + (size_t)t * H + h, qg + ((size_t)t * H + h) * 2 * D, wq, pos[t],
                          inv_freq, D, R, eps);
        for (int h = 0; h < K; h++)
            norm_rope_row(k + ((size_t)t * K + h) * D, rstdk + (size_t)t * K + h, k0 + ((size_t)t * K + h) * D, wk, pos[t],
                          inv_freq, D, R, eps);
    }
}

/* dx (D) from dy (D) through rope then y = w x r: un-rotate dy, then rmsnorm's backward */
static void norm_rope_row_bwd(float *dx, const float *dy_in, const float *x, const float *w, float r, int p,
                              const float *inv_freq, int D, int R) {
    float dy[1024];
    memcpy(dy, dy_in, (size_t)D * sizeof(float));
    rotate(dy, p, inv_freq, R, -1.0f);
    double s = 0;
    for (int i = 0; i < D; i++) s += (double)(w[i] * dy[i]) * (x[i] * r);
    float mean = (float)(s / D);
    for (int i = 0; i < D; i++) dx[i] = r * (w[i] * dy[i] - x[i] * r * mean);
}

/* dw (D) += Σ_rows un-rotated dy ⊙ x r, rows in order */
static void norm_rope_dw(float *dw, const float *dy, const float *x, const float *rstd, const int *pos, const float *inv_freq,
                         int T, int NH, int D, int R, int xstride) {
    double acc[1024] = {0};
    float d[1024];
    for (int t = 0; t < T; t++)
        for (int h = 0; h < NH; h++) {
            size_t row = (size_t)t * NH + h;
            memcpy(d, dy + row * D, (size_t)D * sizeof(float));
            rotate(d, pos[t], inv_freq, R, -1.0f);
            for (int i = 0; i < D; i++) acc[i] += (double)d[i] * (x[row * xstride + i] * rstd[row]);
        }
    for (int i = 0; i < D; i++) dw[i] += (float)acc[i];
}

void gated_attn_qk_bwd_cpu(float *dqg, float *dk0, float *dwq, float *dwk, const float *dq, const float *dk, const float *qg,
                           const float *k0, const float *wq, const float *wk, const float *rstdq, const float *rstdk,
                           const int *pos, const float *inv_freq, int T, int H, int K, int D, int R) {
#pragma omp parallel for
    for (int t = 0; t < T; t++) {
        for (int h = 0; h < H; h++) {
            size_t row = (size_t)t * H + h;
            norm_rope_row_bwd(dqg + row * 2 * D, dq + row * D, qg + row * 2 * D, wq, rstdq[row], pos[t], inv_freq, D, R);
        }
        for (int h = 0; h < K; h++) {
            size_t row = (size_t)t * K + h;
            norm_rope_row_bwd(dk0 + row * D, dk + row * D, k0 + row * D, wk, rstdk[row], pos[t], inv_freq, D, R);
        }
    }
    norm_rope_dw(dwq, dq, qg, rstdq, pos, inv_freq, T, H, D, R, 2 * D);
    norm_rope_dw(dwk, dk, k0, rstdk, pos, inv_freq, T, K, D, R, D);
}

void gated_attn_gate_fwd_cpu(float *y, const float *att, const float *qg, int T, int H, int D) {
#pragma omp parallel for
    for (long long row = 0; row < (long long)T * H; row++)
        for (int i = 0; i < D; i++) y[row * D + i] = att[row * D + i] * sigmoid(qg[row * 2 * D + D + i]);
}

void gated_attn_gate_bwd_cpu(float *datt, float *dqg, const float *dy, const float *att, const float *qg, int T, int H, int D) {
#pragma omp parallel for
    for (long long row = 0; row < (long long)T * H; row++)
        for (int i = 0; i < D; i++) {
            float sg = sigmoid(qg[row * 2 * D + D + i]), g = dy[row * D + i];
            datt[row * D + i] = g * sg;
            dqg[row * 2 * D + D + i] = g * att[row * D + i] * sg * (1.0f - sg);
        }
}
