/* rmsnorm_cpu.c — fp32 reference of rmsnorm.h.
 * Backward: with n = x * r (r = rstd), y = w * n:
 *   dw += dy * n;   dx = r * (w*dy - n * mean(w*dy * n)). */
#include "kernels/rmsnorm.h"

#include "kernels/rope.h"

#include <math.h>
#include <stdlib.h>

void rmsnorm_fwd_cpu(float *out, float *rstd, const float *inp, const float *w, int T, int C, float eps) {
    #pragma omp parallel for
    for (int t = 0; t < T; t++) {
        const float *x = inp + (size_t)t * C;
        float *y = out + (size_t)t * C;
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        float r = 1.0f / sqrtf((float)(ss / C) + eps);
        if (rstd) rstd[t] = r;
        for (int c = 0; c < C; c++) y[c] = w[c] * (x[c] * r);
    }
}

void rmsnorm_bwd_cpu(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                     const float *rstd, int T, int C) {
    #pragma omp parallel
    {
        float *dw_local = calloc((size_t)C, sizeof(float));
        #pragma omp for
        for (int t = 0; t < T; t++) {
            const float *x = inp + (size_t)t * C, *dy = dout + (size_t)t * C;
            float *dx = dinp + (size_t)t * C;
            float r = rstd[t];
            double dot = 0;
            for (int c = 0; c < C; c++) {
                float n = x[c] * r;
                dw_local[c] += dy[c] * n;
                dot += (double)w[c] * dy[c] * n;
            }
            float mean = (float)(dot / C);
            for (int c = 0; c < C; c++) dx[c] += r * (w[c] * dy[c] - x[c] * r * mean);
        }
        #pragma omp critical
        for (int c = 0; c < C; c++) dw[c] += dw_local[c];
        free(dw_local);
    }
}

void add_rmsnorm_fwd_cpu(float *sum, float *out, float *rstd, const float *x, const float *y, const float *w,
                         int T, int C, float eps) {
    long long n = (long long)T * C;
    #pragma omp parallel for schedule(static)
    for (long long i = 0; i < n; i++) sum[i] = x[i] + y[i];
    rmsnorm_fwd_cpu(out, rstd, sum, w, T, C, eps);
}

void qk_norm_rope_fwd_cpu(float *out, float *rstd, const float *inp, const float *w, const int *pos,
                          const float *inv_freq, int T, int H, int D, float eps) {
    rmsnorm_fwd_cpu(out, rstd, inp, w, T * H, D, eps);
    rope_fwd_cpu(out, pos, inv_freq, T, H, D);
}

/* Row by row (one head of one token): rotate dout back as rope_bwd_cpu does, then the
 * backward of rmsnorm_bwd_cpu, written instead of added. */
void qk_norm_rope_bwd_cpu(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                          const float *rstd, const int *pos, const float *inv_freq, int T, int H, int D) {
    int half = D / 2;
    #pragma omp parallel
    {
        float *dw_local = calloc((size_t)D, sizeof(float)), dy[D];
        #pragma omp for
        for (long long row = 0; row < (long long)T * H; row++) {
            const float *g = dout + row * D, *x = inp + row * D;
            float *dx = dinp + row * D, r = rstd[row];
            for (int i = 0; i < half; i++) {
                float ang = (float)pos[row / H] * inv_freq[i];
                float c = (float)cos((double)ang), s = -(float)sin((double)ang);
                dy[i] = g[i] * c - g[i + half] * s;
                dy[i + half] = g[i + half] * c + g[i] * s;
            }
            double dot = 0;
            for (int c = 0; c < D; c++) {
                float n = x[c] * r;
                dw_local[c] += dy[c] * n;
                dot += (double)w[c] * dy[c] * n;
            }
            float mean = (float)(dot / D);
            for (int c = 0; c < D; c++) dx[c] = r * (w[c] * dy[c] - x[c] * r * mean);
        }
        #pragma omp critical
        for (int c = 0; c < D; c++) dw[c] += dw_local[c];
        free(dw_local);
    }
}
