/* moe_shared.cuh — the CUDA launchers of moe_shared.cu (moe_shared.h on bf16 activations, math
 * in fp32). Launchers enqueue on ctx->stream and never block. */
#ifndef GRPOD_KERNELS_MOE_SHARED_CUH
#define GRPOD_KERNELS_MOE_SHARED_CUH
#include "kernels/common.cuh"
#include "kernels/moe_shared.h"

void moe_shared_gate_fwd_cuda(cu_ctx *c, bf16 *out, const bf16 *y, const bf16 *z, int T, int C);
void moe_shared_gate_bwd_cuda(cu_ctx *c, bf16 *y, bf16 *z, const bf16 *dout, int T, int C);
#endif
