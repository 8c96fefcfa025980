/* embedding.cuh — the CUDA launchers of embedding.cu (token embedding lookup and its
 * gradient). Legend: T tokens, C model dim.
 * Same arguments as the embedding.h reference with a `_cuda` suffix and a cu_ctx first; bf16 where the
 * CPU has fp32 activations/weights. Launchers enqueue on ctx->stream and never block. */
#ifndef GRPOD_KERNELS_EMBEDDING_CUH
#define GRPOD_KERNELS_EMBEDDING_CUH
#include "kernels/common.cuh"
#include "kernels/embedding.h"

void embedding_fwd_cuda(cu_ctx *c, bf16 *out, const int *tokens, const bf16 *wte, int T, int C);
void embedding_bwd_cuda(cu_ctx *c, float *dwte, const bf16 *dout, const int *tokens, int T, int C);
#endif
