/* rope_cpu.c — fp32 reference of rope.h. */
#include "kernels/rope.h"

#include <math.h>
#include <stddef.h>

static void rotate(float *x, const int *pos, const float *inv_freq, int T, int H, int D, float sign) {
    int half = D / 2;
#pragma omp parallel for
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            float ang = (float)pos[t] * inv_freq[i];
            float c = (float)cos((double)ang), s = sign * (float)sin((double)ang);
            for (int h = 0; h < H; h++) {
                float *v = x + ((size_t)t * H + h) * D;
                float x1 = v[i], x2 = v[i + half];
                v[i] = x1 * c - x2 * s;
                v[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

void rope_fwd_cpu(float *x, const int *pos, const float *inv_freq, int T, int H, int D) {
    rotate(x, pos, inv_freq, T, H, D, 1.0f);
}
void rope_bwd_cpu(float *dx, const int *pos, const float *inv_freq, int T, int H, int D) {
    rotate(dx, pos, inv_freq, T, H, D, -1.0f);
}
