/* deltanet.cu — CUDA gated DeltaNet launchers (deltanet.cuh): not built yet. Each marks the
 * context failed with "not supported on cuda yet", so a call that got here anyway ends in a
 * clear sticky error at the next sync instead of wrong numbers. */
#include "kernels/deltanet.cuh"

static void deltanet_unsupported(cu_ctx *c, const char *op) { cu_fail(c, op, "not supported on cuda yet", __FILE__, __LINE__); }

void deltanet_conv_fwd_cuda(cu_ctx *c, bf16 *u, const bf16 *x, const bf16 *w, attn_ranges r, int T, int Cc, int Kc) {
    deltanet_unsupported(c, "deltanet_conv_fwd_cuda");
}
void deltanet_conv_bwd_cuda(cu_ctx *c, bf16 *dx, float *dw, const bf16 *du, const bf16 *x, const bf16 *w, attn_ranges r, int T,
                            int Cc, int Kc) {
    deltanet_unsupported(c, "deltanet_conv_bwd_cuda");
}
void deltanet_rule_fwd_cuda(cu_ctx *c, bf16 *o, float *states, const bf16 *u, const bf16 *a, const bf16 *b, const bf16 *A_log,
                            const bf16 *dt_bias, attn_ranges r, int T, int Hk, int Hv, int Dk, int Dv) {
    deltanet_unsupported(c, "deltanet_rule_fwd_cuda");
}
void deltanet_rule_bwd_cuda(cu_ctx *c, bf16 *du, bf16 *da, bf16 *db, float *dA_log, float *ddt_bias, float *states,
                            float *dstates, const bf16 *dout, const bf16 *u, const bf16 *a, const bf16 *b, const bf16 *A_log,
                            const bf16 *dt_bias, attn_ranges r, int T, int Hk, int Hv, int Dk, int Dv) {
    deltanet_unsupported(c, "deltanet_rule_bwd_cuda");
}
void deltanet_norm_fwd_cuda(cu_ctx *c, bf16 *y, float *rstd, const bf16 *o, const bf16 *z, const bf16 *w, int T, int Hv, int Dv,
                            float eps) {
    deltanet_unsupported(c, "deltanet_norm_fwd_cuda");
}
void deltanet_norm_bwd_cuda(cu_ctx *c, bf16 *dout, bf16 *dz, float *dw, const bf16 *dy, const bf16 *o, const bf16 *z,
                            const bf16 *w, const float *rstd, int T, int Hv, int Dv) {
    deltanet_unsupported(c, "deltanet_norm_bwd_cuda");
}
