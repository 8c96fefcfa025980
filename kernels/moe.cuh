/* moe.cuh — the CUDA launchers of moe.cu. Legend as moe.h (T, C, E, k, Fm).
 * Same arguments as the moe.h reference with a `_cuda` suffix and a cu_ctx first; bf16 where the
 * CPU has fp32 activations/weights (probs, topw, dtopw, dlogit, stats and the weight
 * gradients stay fp32). Launchers enqueue on ctx->stream and never block: the expert
 * permutation is built on the device (moe.cu), so the calls can be captured in a graph. They
 * use ctx->scratch: the experts' T·k slot indices, and in the backward T·k·C fp32 more. */
#ifndef GRPOD_KERNELS_MOE_CUH
#define GRPOD_KERNELS_MOE_CUH
#include "kernels/common.cuh"
#include "kernels/moe.h"

void moe_router_fwd_cuda(cu_ctx *c, float *probs, int *topi, float *topw, float *stats, const bf16 *x, const bf16 *wr,
                         const int *count, int T, int C, int E, int k, int norm);
void moe_experts_fwd_cuda(cu_ctx *c, bf16 *out, bf16 *eg, bf16 *eu, bf16 *ey, const bf16 *x, const bf16 *res, const int *topi,
                          const float *topw, const bf16 *wg, const bf16 *wu, const bf16 *wd, int T, int C, int E, int k, int Fm);
void moe_experts_bwd_cuda(cu_ctx *c, bf16 *dx, float *dwg, float *dwu, float *dwd, float *dtopw, bf16 *dg, bf16 *du,
                          const bf16 *dout, const bf16 *x, const int *topi, const float *topw, const bf16 *eg, const bf16 *eu,
                          const bf16 *ey, const bf16 *wg, const bf16 *wu, const bf16 *wd, int T, int C, int E, int k, int Fm);
void moe_router_bwd_cuda(cu_ctx *c, bf16 *dx, float *dwr, float *dlogit, const float *dtopw, const float *probs, const int *topi,
                         const bf16 *x, const bf16 *wr, const float *aux_g, const int *count, int T, int C, int E, int k, int norm);
#endif
