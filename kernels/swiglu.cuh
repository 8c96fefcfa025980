/* swiglu.cuh — the CUDA launchers of swiglu.cu: SwiGLU, and the elementwise add,
 * fp32 -> bf16 conversion, bf16 into fp32 accumulation and row scatter the backend table needs. Legend: n elements, T rows.
 * Same arguments as the swiglu.h reference with a `_cuda` suffix and a cu_ctx first; bf16 where the
 * CPU has fp32 activations/weights. Launchers enqueue on ctx->stream and never block. */
#ifndef GRPOD_KERNELS_SWIGLU_CUH
#define GRPOD_KERNELS_SWIGLU_CUH
#include "kernels/common.cuh"
#include "kernels/swiglu.h"

void swiglu_fwd_cuda(cu_ctx *c, bf16 *out, const bf16 *gate, const bf16 *up, long long n);
void swiglu_bwd_cuda(cu_ctx *c, bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up,
                     long long n);
void add_cuda(cu_ctx *c, bf16 *out, const bf16 *x, const bf16 *y, long long n);
void f32_to_bf16_cuda(cu_ctx *c, bf16 *dst, const float *src, long long n);
/* acc (n) fp32 += x (n) bf16: sums kept in fp32 across launches (engine/model/split.c's prompt dK/dV) */
void acc_f32_cuda(cu_ctx *c, float *acc, const bf16 *x, long long n);
void scatter_rows_cuda(cu_ctx *c, bf16 *dst, const bf16 *src, const int *slot, int T, int row);
#endif
