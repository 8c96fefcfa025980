/* gated_attn.cu — CUDA launchers of the gated full attention's extra ops (gated_attn.cuh): not
 * built yet. Each marks the context failed with "not supported on cuda yet". */
#include "kernels/gated_attn.cuh"

static void gated_attn_unsupported(cu_ctx *c, const char *op) { cu_fail(c, op, "not supported on cuda yet", __FILE__, __LINE__); }

void gated_attn_qk_fwd_cuda(cu_ctx *c, bf16 *q, bf16 *k, float *rstdq, float *rstdk, const bf16 *qg, const bf16 *k0, const bf16 *wq,
                            const bf16 *wk, const int *pos, const float *inv_freq, int T, int H, int K, int D, int R, float eps) {
    gated_attn_unsupported(c, "gated_attn_qk_fwd_cuda");
}
void gated_attn_qk_bwd_cuda(cu_ctx *c, bf16 *dqg, bf16 *dk0, float *dwq, float *dwk, const bf16 *dq, const bf16 *dk,
                            const bf16 *qg, const bf16 *k0, const bf16 *wq, const bf16 *wk, const float *rstdq,
                            const float *rstdk, const int *pos, const float *inv_freq, int T, int H, int K, int D, int R) {
    gated_attn_unsupported(c, "gated_attn_qk_bwd_cuda");
}
void gated_attn_gate_fwd_cuda(cu_ctx *c, bf16 *y, const bf16 *att, const bf16 *qg, int T, int H, int D) {
    gated_attn_unsupported(c, "gated_attn_gate_fwd_cuda");
}
void gated_attn_gate_bwd_cuda(cu_ctx *c, bf16 *datt, bf16 *dqg, const bf16 *dy, const bf16 *att, const bf16 *qg, int T, int H,
                              int D) {
    gated_attn_unsupported(c, "gated_attn_gate_bwd_cuda");
}
