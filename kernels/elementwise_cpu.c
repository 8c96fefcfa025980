/* elementwise_cpu.c — the fp32 reference of elementwise.h (OpenMP over elements). */
#include "kernels/elementwise.h"

#include <string.h>

void add_cpu(float *out, const float *x, const float *y, long long n) {
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < n; i++) out[i] = x[i] + y[i];
}

void acc_f32_cpu(float *acc, const float *x, long long n) {
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < n; i++) acc[i] += x[i];
}

void gather_rows_cpu(float *dst, const float *src, const int *idx, int n, int row) {
    for (int i = 0; i < n; i++) memcpy(dst + (size_t)i * row, src + (size_t)idx[i] * row, (size_t)row * sizeof(float));
}

void scatter_rows_cpu(float *dst, const float *src, const int *slot, int T, int row) {
    for (int t = 0; t < T; t++) memcpy(dst + (size_t)slot[t] * row, src + (size_t)t * row, (size_t)row * sizeof(float));
}
