/* logprob.cuh — the CUDA launchers of logprob.cu: the chunked logprob head (token chunks of
 * LOGPROB_CHUNK rows; never [M x V] at once) and full logits rows for sampling. Legend: M
 * predicted tokens, C model dim, V vocab, R rows.
 * Same arguments as the logprob.h reference with a `_cuda` suffix and a cu_ctx first; bf16 where the
 * CPU has fp32 activations/weights. Launchers enqueue on ctx->stream and never block. */
#ifndef GRPOD_KERNELS_LOGPROB_CUH
#define GRPOD_KERNELS_LOGPROB_CUH
#include "kernels/common.cuh"
#include "kernels/logprob.h"

enum { LOGPROB_CHUNK = 256, LOGPROB_DW_CHUNKS = 4 }; /* rows a chunk; chunks a dW accumulation */
void logprob_fwd_cuda(cu_ctx *c, float *logp, float *ent, const bf16 *h, const int *out_pos, const int *out_tok, const bf16 *w,
                      int M, int C, int V, float temperature);
void logprob_bwd_cuda(cu_ctx *c, bf16 *dh, float *dw, const float *dlogp, const float *dent, const bf16 *h, const int *out_pos,
                      const int *out_tok, const bf16 *w, int M, int C, int V, float temperature);
void logprob_top_cuda(cu_ctx *c, int *ids, float *lps, const bf16 *h, const int *out_pos, const bf16 *w, int M, int C, int V,
                      float temperature, int K);
void lm_head_rows_cuda(cu_ctx *c, float *logits, const bf16 *h, const int *pos, const bf16 *w, int R, int C, int V);
#endif
