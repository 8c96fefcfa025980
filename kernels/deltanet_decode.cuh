/* deltanet_decode.cuh — the CUDA launchers of deltanet_decode.cu. Same arguments as the
 * deltanet_decode.h reference with a `_cuda` suffix and a cu_ctx first; bf16 activations and
 * weights, the tail and state rows fp32. Launchers enqueue on ctx->stream and never block. */
#ifndef GRPOD_KERNELS_DELTANET_DECODE_CUH
#define GRPOD_KERNELS_DELTANET_DECODE_CUH
#include "kernels/common.cuh"
#include "kernels/deltanet_decode.h"

void deltanet_conv_step_cuda(cu_ctx *c, bf16 *u, float *tail, const bf16 *x, const bf16 *w, const int *srow, int T, int Cc, int Kc);
void deltanet_rule_step_cuda(cu_ctx *c, bf16 *o, float *state, const bf16 *u, const bf16 *a, const bf16 *b, const bf16 *A_log,
                             const bf16 *dt_bias, const int *srow, int T, int Hk, int Hv, int Dk, int Dv);
#endif
