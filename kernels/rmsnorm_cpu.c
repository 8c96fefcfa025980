/* rmsnorm_cpu.c — fp32 reference of rmsnorm.h.
 * Backward: with n = x * r (r = rstd), y = w * n:
 *   dw += dy * n;   dx = r * (w*dy - n * mean(w*dy * n)). */
#include "kernels/rmsnorm.h"

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
