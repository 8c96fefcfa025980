/* moe_shared_cpu.c — the shared expert's gate, fp32 reference (moe_shared.h). */
#include "kernels/moe_shared.h"

#include <math.h>

static float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

void moe_shared_gate_fwd_cpu(float *out, const float *y, const float *z, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float s = sigmoid(z[t]);
        for (int c = 0; c < C; c++) out[(long long)t * C + c] += s * y[(long long)t * C + c];
    }
}

void moe_shared_gate_bwd_cpu(float *y, float *z, const float *dout, int T, int C) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *yt = y + (long long)t * C;
        const float *dt = dout + (long long)t * C;
        double acc = 0;
        for (int c = 0; c < C; c++) acc += (double)dt[c] * yt[c];
        float s = sigmoid(z[t]);
        z[t] = (float)acc * s * (1.0f - s);
        for (int c = 0; c < C; c++) yt[c] = s * dt[c];
    }
}
