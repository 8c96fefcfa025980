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

/* transformers' _compute_default_rope_parameters and _compute_llama3_parameters, in fp32:
 * inv_freq = 1 / theta^(arange(0, D, 2) / D); llama3 divides low frequencies by factor and
 * blends the band between the two wavelength thresholds. */
void rope_inv_freq(float *inv_freq, int D, float theta, float factor, float low_freq_factor,
                   float high_freq_factor, int original_max_pos) {
    for (int i = 0; i < D / 2; i++) {
        float expo = (float)(2 * i) / (float)D;
        inv_freq[i] = 1.0f / powf(theta, expo);
    }
    if (factor <= 0) return;
    float low_wavelen = (float)original_max_pos / low_freq_factor;
    float high_wavelen = (float)original_max_pos / high_freq_factor;
    for (int i = 0; i < D / 2; i++) {
        float f = inv_freq[i];
        float wavelen = 2.0f * (float)M_PI / f;
        float scaled = wavelen > low_wavelen ? f / factor : f;
        float smooth = ((float)original_max_pos / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
        float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
        int medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
        inv_freq[i] = medium ? smoothed : scaled;
    }
}
