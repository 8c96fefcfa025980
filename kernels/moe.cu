/* moe.cu — CUDA mixture-of-experts launchers (moe.cuh): not built yet. Each marks the context
 * failed with "not supported on cuda yet", so a call that got here anyway ends in a clear
 * sticky error at the next sync instead of wrong numbers. */
#include "kernels/moe.cuh"

static void moe_unsupported(cu_ctx *c, const char *op) { cu_fail(c, op, "not supported on cuda yet", __FILE__, __LINE__); }

void moe_router_fwd_cuda(cu_ctx *c, float *probs, int *topi, float *topw, float *stats, const bf16 *x, const bf16 *wr,
                         const int *count, int T, int C, int E, int k, int norm) {
    moe_unsupported(c, "moe_router_fwd_cuda");
}
void moe_experts_fwd_cuda(cu_ctx *c, bf16 *out, bf16 *eg, bf16 *eu, bf16 *ey, const bf16 *x, const bf16 *res, const int *topi,
                          const float *topw, const bf16 *wg, const bf16 *wu, const bf16 *wd, int T, int C, int E, int k, int Fm) {
    moe_unsupported(c, "moe_experts_fwd_cuda");
}
void moe_experts_bwd_cuda(cu_ctx *c, bf16 *dx, float *dwg, float *dwu, float *dwd, float *dtopw, bf16 *dg, bf16 *du,
                          const bf16 *dout, const bf16 *x, const int *topi, const float *topw, const bf16 *eg, const bf16 *eu,
                          const bf16 *ey, const bf16 *wg, const bf16 *wu, const bf16 *wd, int T, int C, int E, int k, int Fm) {
    moe_unsupported(c, "moe_experts_bwd_cuda");
}
void moe_router_bwd_cuda(cu_ctx *c, bf16 *dx, float *dwr, float *dlogit, const float *dtopw, const float *probs, const int *topi,
                         const bf16 *x, const bf16 *wr, const float *aux_g, const int *count, int T, int C, int E, int k, int norm) {
    moe_unsupported(c, "moe_router_bwd_cuda");
}
