/* elementwise_cpu.c — the fp32 reference of elementwise.h (OpenMP over elements). */
#include "kernels/elementwise.h"

void add_cpu(float *out, const float *x, const float *y, long long n) {
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < n; i++) out[i] = x[i] + y[i];
}

void acc_f32_cpu(float *acc, const float *x, long long n) {
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < n; i++) acc[i] += x[i];
}
