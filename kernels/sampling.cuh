/* sampling.cuh — the CUDA launcher of sampling.cu (one token per logits row).
 * Legend: R rows, V vocab.
 * Same arguments as the sampling.h reference with a `_cuda` suffix and a cu_ctx first; bf16 where the
 * CPU has fp32 activations/weights. Launchers enqueue on ctx->stream and never block. */
#ifndef GRPOD_KERNELS_SAMPLING_CUH
#define GRPOD_KERNELS_SAMPLING_CUH
#include "kernels/common.cuh"
#include "kernels/sampling.h"

void sample_cuda(cu_ctx *c, int *tok, float *logprob, const float *logits, const sample_params *p, const int *ban,
                 const uint32_t *allow, int R, int V);
#endif
