/* embedding_cpu.c — fp32 reference of embedding.h. */
#include "kernels/embedding.h"

#include <string.h>

void embedding_fwd_cpu(float *out, const int *tokens, const float *wte, int T, int C) {
#pragma omp parallel for
    for (int t = 0; t < T; t++) memcpy(out + (size_t)t * C, wte + (size_t)tokens[t] * C, (size_t)C * sizeof(float));
}

void embedding_bwd_cpu(float *dwte, const float *dout, const int *tokens, int T, int C) {
    /* Sequential over tokens: repeated ids add into one row, and the order stays fixed. */
    for (int t = 0; t < T; t++) {
        float *row = dwte + (size_t)tokens[t] * C;
        const float *d = dout + (size_t)t * C;
        for (int c = 0; c < C; c++) row[c] += d[c];
    }
}
