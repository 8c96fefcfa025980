/* rmsnorm.cuh — the CUDA launchers of rmsnorm.cu: RMSNorm, and its fused neighbours
 * (q/k norm + RoPE + KV-cache writes, and their backward). Legend: T tokens, C width, H/K
 * query/kv heads, D head dim.
 * Same arguments as the rmsnorm.h reference with a `_cuda` suffix and a cu_ctx first; bf16 where the
 * CPU has fp32 activations/weights. Launchers enqueue on ctx->stream and never block. */
#ifndef GRPOD_KERNELS_RMSNORM_CUH
#define GRPOD_KERNELS_RMSNORM_CUH
#include "kernels/common.cuh"
#include "kernels/rmsnorm.h"

void rmsnorm_fwd_cuda(cu_ctx *c, bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int T, int C, float eps);
void rmsnorm_bwd_cuda(cu_ctx *c, bf16 *dinp, float *dw, const bf16 *dout, const bf16 *inp, const bf16 *w, const float *rstd,
                      int T, int C);
void qkv_rope_fwd_cuda(cu_ctx *c, const qkv_rope_io *io, const int *pos, const float *inv_freq, int T, int H, int K, int D,
                       float eps);
void qk_norm_rope_bwd_cuda(cu_ctx *c, bf16 *dinp, float *dw, const bf16 *dout, const bf16 *inp, const bf16 *w, const float *rstd,
                           const int *pos, const float *inv_freq, int T, int H, int D);
#endif
