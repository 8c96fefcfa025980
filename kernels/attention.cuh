/* attention.cuh — the CUDA launchers of the attention family: attention.cu (dispatch and the
 * SIMT kernels), attention_mma.cu (mma.sync, head dims 64 and 256), attention_wgmma.cu (wgmma,
 * head dim 128), attention_decode.cu (few queries). Legend: T queries, S key rows, H/K query/kv heads,
 * D head dim.
 * Same arguments as the attention.h reference with a `_cuda` suffix and a cu_ctx first; bf16 where the
 * CPU has fp32 activations/weights. Launchers enqueue on ctx->stream and never block. */
#ifndef GRPOD_KERNELS_ATTENTION_CUH
#define GRPOD_KERNELS_ATTENTION_CUH
#include "kernels/common.cuh"
#include "kernels/attention.h"

/* The largest head dim the launchers take (D = 256: Qwen3.5's gated attention). */
enum { ATTN_MAX_HEAD_DIM = 256 };
/* D even, <= ATTN_MAX_HEAD_DIM. Backward: S >= T key rows (S == T: keys are the tokens; S > T: queries that
 * attend to KV-cache rows other forwards wrote, engine/model/split.c), the dk/dv key tiles cover S. The ranges must not
 * be written by the kernel launched just before the forward: at decode sizes it reads them
 * before its dependent-launch wait (they come from host uploads). */
void attention_fwd_cuda(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T,
                        int H, int K, int D);
void attention_bwd_cuda(cu_ctx *c, bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
                        const bf16 *out, const float *lse, attn_ranges r, int T, int S, int H, int K, int D);

/* ---- between the family's translation units (attention.cu picks the path). sc2 = log2(e) /
 * sqrt(D), scale = 1 / sqrt(D). The backward passes take attention.cu's scratch: dsum (T, H)
 * and the key-tile bounds qlo, qhi (S / the key tile rounded up, each). */
/* keys a tile in the tensor-core backward (dk/dv) passes: 128, and 64 at head dim 256 */
enum { ATTN_FLASH_BK = 128, ATTN_FLASH_BK_D256 = 64 };
/* attention.cu: qlo[kt], qhi[kt], the first query and one past the last that sees a key of
 * tile kt (tiles of `tile` keys) */
void attn_tile_bounds_cuda(cu_ctx *c, int *qlo, int *qhi, attn_ranges r, int T, int S, int tile);
/* attention_mma.cu: mma.sync, head dim D = 64 or 256 */
void attn_mma_fwd_cuda(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T, int H,
                       int K, int D, float sc2);
void attn_mma_bwd_cuda(cu_ctx *c, bf16 *dq, bf16 *dk, bf16 *dv, float *dsum, int *qlo, int *qhi, const bf16 *dout, const bf16 *q,
                       const bf16 *k, const bf16 *v, const bf16 *out, const float *lse, attn_ranges r, int T, int S, int H, int K,
                       int D, float sc2, float scale);
/* attention_wgmma.cu: warpgroup MMA (sm_90a), head dim 128 */
void attn_wgmma_fwd_cuda(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T,
                         int H, int K, float sc2);
/* The backward's dk/dv splits the key blocks that see many more query tiles than the mean (a
 * packed group's prompt, seen by all N responses) into up to ATTN_DKDV_SPLIT parts summed in a
 * fixed order; xs is attn_wgmma_bwd_bytes(c, S) bytes of scratch for it. */
enum { ATTN_DKDV_SPLIT = 4 };
size_t attn_wgmma_bwd_bytes(cu_ctx *c, int S);
void attn_wgmma_bwd_cuda(cu_ctx *c, bf16 *dq, bf16 *dk, bf16 *dv, float *dsum, int *qlo, int *qhi, void *xs, const bf16 *dout,
                         const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *out, const float *lse, attn_ranges r, int T,
                         int S, int H, int K, float sc2, float scale);
/* attention_decode.cu: 1 when it took the forward (T small, D 64 / 128, H/K in {1, 2, 4, 8}) */
int attn_decode_fwd_cuda(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T,
                         int H, int K, int D);
/* attention_exact.cu: the batch-invariant forward (tune.exact): every T, D 64 / 128, H/K <= 16;
 * 1 (the context holds the error for other shapes) */
int attn_exact_fwd_cuda(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T,
                        int H, int K, int D);
#endif
