/* swiglu.cuh — the CUDA launchers of swiglu.cu. Legend: n elements.
 * Same arguments as the swiglu.h reference with a `_cuda` suffix and a cu_ctx first; bf16 where the
 * CPU has fp32 activations/weights. Launchers enqueue on ctx->stream and never block. */
#ifndef GRPOD_KERNELS_SWIGLU_CUH
#define GRPOD_KERNELS_SWIGLU_CUH
#include "kernels/common.cuh"
#include "kernels/swiglu.h"

void swiglu_fwd_cuda(cu_ctx *c, bf16 *out, const bf16 *gate, const bf16 *up, long long n);
void swiglu_bwd_cuda(cu_ctx *c, bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up, long long n);
#endif
