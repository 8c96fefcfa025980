/* deltanet.cuh — the CUDA launchers of deltanet.cu. Legend as deltanet.h (T, Hk, Hv, Dk, Dv, Kc, Cc).
 * Same arguments as the deltanet.h reference with a `_cuda` suffix and a cu_ctx first; bf16
 * where the CPU has fp32 activations/weights (A_log and dt_bias too: the model's weights),
 * fp32 states and weight gradients; the carry (cy, NULL: none) as the reference's, in device
 * memory, fp32. The rule's states/dstates are the scratch
 * deltanet_scratch_cuda sizes (checkpoints, not every token's state). Limits, refused with a
 * sticky error naming them: Kc <= 16, Dk <= 256, Hv a multiple of Hk. */
#ifndef GRPOD_KERNELS_DELTANET_CUH
#define GRPOD_KERNELS_DELTANET_CUH
#include "kernels/common.cuh"
#include "kernels/deltanet.h"

/* the floats states and dstates must hold at T tokens */
void deltanet_scratch_cuda(long long *states, long long *dstates, int T, int Hk, int Hv, int Dk, int Dv);
void deltanet_conv_fwd_cuda(cu_ctx *c, bf16 *u, const bf16 *x, const bf16 *w, attn_ranges r, const deltanet_carry *cy, int T,
                            int Cc, int Kc);
void deltanet_conv_bwd_cuda(cu_ctx *c, bf16 *dx, float *dw, const bf16 *du, const bf16 *x, const bf16 *w, attn_ranges r,
                            const deltanet_carry *cy, int T, int Cc, int Kc);
void deltanet_rule_fwd_cuda(cu_ctx *c, bf16 *o, float *states, const bf16 *u, const bf16 *a, const bf16 *b, const bf16 *A_log,
                            const bf16 *dt_bias, attn_ranges r, const deltanet_carry *cy, int T, int Hk, int Hv, int Dk, int Dv);
void deltanet_rule_bwd_cuda(cu_ctx *c, bf16 *du, bf16 *da, bf16 *db, float *dA_log, float *ddt_bias, float *states,
                            float *dstates, const bf16 *dout, const bf16 *u, const bf16 *a, const bf16 *b, const bf16 *A_log,
                            const bf16 *dt_bias, attn_ranges r, const deltanet_carry *cy, int T, int Hk, int Hv, int Dk, int Dv);
void deltanet_norm_fwd_cuda(cu_ctx *c, bf16 *y, float *rstd, const bf16 *o, const bf16 *z, const bf16 *w, int T, int Hv, int Dv,
                            float eps);
void deltanet_norm_bwd_cuda(cu_ctx *c, bf16 *dout, bf16 *dz, float *dw, const bf16 *dy, const bf16 *o, const bf16 *z,
                            const bf16 *w, const float *rstd, int T, int Hv, int Dv);
#endif
