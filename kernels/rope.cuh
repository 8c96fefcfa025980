/* rope.cuh — the CUDA launchers of rope.cu (rotary position embedding in place).
 * Legend: T tokens, H heads, D head dim.
 * Same arguments as the rope.h reference with a `_cuda` suffix and a cu_ctx first; bf16 where the
 * CPU has fp32 activations/weights. Launchers enqueue on ctx->stream and never block. */
#ifndef GRPOD_KERNELS_ROPE_CUH
#define GRPOD_KERNELS_ROPE_CUH
#include "kernels/common.cuh"
#include "kernels/rope.h"

void rope_fwd_cuda(cu_ctx *c, bf16 *x, const int *pos, const float *inv_freq, int T, int H, int D);
void rope_bwd_cuda(cu_ctx *c, bf16 *dx, const int *pos, const float *inv_freq, int T, int H, int D);
#endif
