/* gated_attn.cuh — the CUDA launchers of gated_attn.cu. Legend as gated_attn.h (T, H, K, D, R).
 * Same arguments as the gated_attn.h reference with a `_cuda` suffix and a cu_ctx first; bf16
 * where the CPU has fp32 (the norm gains too), fp32 rstd and weight gradients. Limits, refused
 * with a sticky error naming them: D <= 256, R even and <= D. */
#ifndef GRPOD_KERNELS_GATED_ATTN_CUH
#define GRPOD_KERNELS_GATED_ATTN_CUH
#include "kernels/common.cuh"
#include "kernels/gated_attn.h"

void gated_attn_qk_fwd_cuda(cu_ctx *c, bf16 *q, bf16 *k, float *rstdq, float *rstdk, const bf16 *qg, const bf16 *k0, const bf16 *wq,
                            const bf16 *wk, const int *pos, const float *inv_freq, int T, int H, int K, int D, int R, float eps);
void gated_attn_qk_bwd_cuda(cu_ctx *c, bf16 *dqg, bf16 *dk0, float *dwq, float *dwk, const bf16 *dq, const bf16 *dk,
                            const bf16 *qg, const bf16 *k0, const bf16 *wq, const bf16 *wk, const float *rstdq,
                            const float *rstdk, const int *pos, const float *inv_freq, int T, int H, int K, int D, int R);
void gated_attn_gate_fwd_cuda(cu_ctx *c, bf16 *y, const bf16 *att, const bf16 *qg, int T, int H, int D);
void gated_attn_gate_bwd_cuda(cu_ctx *c, bf16 *datt, bf16 *dqg, const bf16 *dy, const bf16 *att, const bf16 *qg, int T, int H,
                              int D);
#endif
