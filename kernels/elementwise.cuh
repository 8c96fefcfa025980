/* elementwise.cuh — the CUDA launchers of elementwise.cu (elementwise.h on bf16 activations;
 * math in fp32). Launchers enqueue on ctx->stream and never block. Legend: n elements, T rows
 * of row elements, slot (T) each row's destination row. */
#ifndef GRPOD_KERNELS_ELEMENTWISE_CUH
#define GRPOD_KERNELS_ELEMENTWISE_CUH
#include "kernels/common.cuh"
#include "kernels/elementwise.h"

void add_cuda(cu_ctx *c, bf16 *out, const bf16 *x, const bf16 *y, long long n);
void f32_to_bf16_cuda(cu_ctx *c, bf16 *dst, const float *src, long long n);
/* acc (n) fp32 += x (n) bf16: sums kept in fp32 across launches */
void acc_f32_cuda(cu_ctx *c, float *acc, const bf16 *x, long long n);
void scatter_rows_cuda(cu_ctx *c, bf16 *dst, const bf16 *src, const int *slot, int T, int row);
void gather_rows_cuda(cu_ctx *c, bf16 *dst, const bf16 *src, const int *idx, int n, int row);
#endif
