/* swiglu_cpu.c — fp32 reference of swiglu.h.
 * d silu(x)/dx = s + x s (1 - s), s = sigmoid(x). */
#include "kernels/swiglu.h"

#include <math.h>
#include <stddef.h>

void swiglu_fwd_cpu(float *out, const float *gate, const float *up, long long n) {
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < n; i++) {
        float x = gate[i];
        out[i] = x / (1.0f + expf(-x)) * up[i];
    }
}

void swiglu_bwd_cpu(float *dgate, float *dup, const float *dout, const float *gate, const float *up, long long n) {
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < n; i++) {
        float x = gate[i], s = 1.0f / (1.0f + expf(-x));
        float silu = x * s;
        dup[i] = dout[i] * silu;
        dgate[i] = dout[i] * up[i] * (s + x * s * (1.0f - s));
    }
}
