/* logprob.cu — the CUDA logprob head over token chunks: never [M x V] at once.
 * Per chunk of up to LOGPROB_CHUNK predictions: gather the hidden rows at out_pos (bf16), one
 * GEMM against W into an fp32 logits chunk (alpha = 1/temperature), then one block per row for
 * logsumexp, the target's logit and the entropy. Backward recomputes the chunk's logits, turns
 * each row into dlogits (bf16) in the same row kernel, then two GEMMs: dh_chunk = dz · W (fp32,
 * added into the rows at out_pos in a fixed order) and, once every LOGPROB_DW_CHUNKS chunks (and
 * after the last), dW += dz^T · h over those chunks' rows (fp32, beta = 1): dW is V·C fp32
 * (1.2 GB at 152k x 2048) and each accumulation reads and writes it whole, so at one chunk a
 * pass it cost 0.93 ms a chunk of 256 rows on an H200 (ncu), 3.6x its products.
 * Scratch: CH·C bf16 + CH·V fp32, and with gradients G·CH·C bf16 + G·CH·V bf16 + CH·C fp32,
 * G = LOGPROB_DW_CHUNKS (V = 152k: ~470 MB). */
#include "kernels/elementwise.cuh"
#include "kernels/logprob.cuh"
#include "kernels/logprob_row.cuh"
#include "kernels/matmul.cuh"

#include <limits.h>

enum { CH = LOGPROB_CHUNK, DWG = LOGPROB_DW_CHUNKS, ROW_THREADS = LOGPROB_ROW_THREADS };

__global__ void logprob_row_fwd_kernel(float *logp, float *ent, const float *z, const int *tok, int V) {
    int i = blockIdx.x;
    const float *zr = z + (size_t)i * V;
    float lse, ez;
    row_stats(zr, 1.0f, V, &lse, &ez);
    if (threadIdx.x == 0) {
        logp[i] = zr[tok[i]] - lse;
        if (ent) ent[i] = lse - ez;
    }
}

/* logprob_top: K rounds of a block arg-max over the row, each taking the best entry after the
 * previous pick in the order (z desc, id asc), so no list of taken ids is kept; z and lse as
 * logprob_row_fwd_kernel has them, so the logprobs are the ones it reports. */
__device__ void block_best(float *v, int *id) {
    __shared__ float sv[32];
    __shared__ int si[32];
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_down_sync(0xffffffffu, *v, o);
        int oi = __shfl_down_sync(0xffffffffu, *id, o);
        if (ov > *v || (ov == *v && oi < *id)) {
            *v = ov;
            *id = oi;
        }
    }
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    if (lane == 0) {
        sv[wid] = *v;
        si[wid] = *id;
    }
    __syncthreads();
    if (wid == 0) {
        *v = lane < nw ? sv[lane] : -INFINITY;
        *id = lane < nw ? si[lane] : INT_MAX;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_down_sync(0xffffffffu, *v, o);
            int oi = __shfl_down_sync(0xffffffffu, *id, o);
            if (ov > *v || (ov == *v && oi < *id)) {
                *v = ov;
                *id = oi;
            }
        }
        if (lane == 0) {
            sv[0] = *v;
            si[0] = *id;
        }
    }
    __syncthreads();
    *v = sv[0];
    *id = si[0];
    __syncthreads(); /* sv, si are reused by the next call */
}

__global__ void logprob_top_kernel(int *ids, float *lps, const float *z, int V, int K) {
    int i = blockIdx.x;
    const float *zr = z + (size_t)i * V;
    float lse, ez;
    row_stats(zr, 1.0f, V, &lse, &ez);
    float pz = INFINITY;
    int pj = -1;
    for (int k = 0; k < K; k++) {
        float bv = -INFINITY;
        int bj = INT_MAX;
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            float x = zr[j];
            int after = x < pz || (x == pz && j > pj);
            if (after && (bj == INT_MAX || x > bv || (x == bv && j < bj))) {
                bv = x;
                bj = j;
            }
        }
        block_best(&bv, &bj);
        if (threadIdx.x == 0) {
            ids[(size_t)i * K + k] = bj == INT_MAX ? -1 : bj;
            lps[(size_t)i * K + k] = bj == INT_MAX ? -INFINITY : zr[bj] - lse;
        }
        if (bj == INT_MAX) pz = -INFINITY, pj = INT_MAX; /* nothing left: the rest are -1 */
        else pz = bv, pj = bj;
    }
}

static __device__ __forceinline__ bf16 dz_of(float x, int j, int target, float lse, float ez, float gl, float ge, float inv_t) {
    float p = __expf(x - lse);
    float g = -gl * p - ge * p * (x - ez);
    if (j == target) g += gl;
    return __float2bfloat16(g * inv_t);
}

/* dz_j = (dlogp (1[j = tok] - p_j) - dent p_j (z_j - E z)) / temperature, as bf16 for the GEMMs. */
__global__ void logprob_row_bwd_kernel(bf16 *dz, const float *z, const int *tok, const float *dlogp, const float *dent, int V,
                                       float inv_t) {
    int i = blockIdx.x;
    const float *zr = z + (size_t)i * V;
    float lse, ez;
    row_stats(zr, 1.0f, V, &lse, &ez);
    float gl = dlogp[i], ge = dent ? dent[i] : 0.0f;
    int target = tok[i];
    bf16 *d = dz + (size_t)i * V;
    int B = blockDim.x, j = threadIdx.x;
    for (; j + 3 * B < V; j += 4 * B) { /* four loads in flight (row_stats) */
        float x[4] = {zr[j], zr[j + B], zr[j + 2 * B], zr[j + 3 * B]};
#pragma unroll
        for (int u = 0; u < 4; u++) d[j + u * B] = dz_of(x[u], j + u * B, target, lse, ez, gl, ge, inv_t);
    }
    for (; j < V; j += B) d[j] = dz_of(zr[j], j, target, lse, ez, gl, ge, inv_t);
}

/* dh rows at pos += src rows (n of them), in a fixed order and without atomics: positions repeat
 * in a chunk (a group's last prompt position predicts the first token of each of its N
 * responses), and bf16 atomics from N blocks would add them in whatever order the blocks ran, so
 * two runs of the same backward would differ (a replayed update would not equal the original).
 * The block of a position's first row adds every row of that position, in row order, in fp32,
 * and rounds once; the blocks of its later rows do nothing. */
__global__ void scatter_add_rows_kernel(bf16 *dh, const float *src, const int *pos, int n, int C) {
    __shared__ int later[CH];
    __shared__ int n_later;
    const int i = blockIdx.x, p = pos[i];
    int seen = 0;
    for (int j = threadIdx.x; j < i; j += blockDim.x) seen |= pos[j] == p;
    if (__syncthreads_or(seen)) return;
    if (threadIdx.x == 0) {
        int k = 0;
        for (int j = i + 1; j < n; j++)
            if (pos[j] == p) later[k++] = j;
        n_later = k;
    }
    __syncthreads();
    bf16 *dst = dh + (size_t)p * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = __bfloat162float(dst[c]) + src[(size_t)i * C + c];
        for (int k = 0; k < n_later; k++) s += src[(size_t)later[k] * C + c];
        dst[c] = __float2bfloat16(s);
    }
}

typedef struct {
    bf16 *hc;
    float *z;
    bf16 *dz;
    float *dhc;
} lp_scratch;

static int lp_scratch_get(cu_ctx *c, lp_scratch *s, int C, int V, int grad) {
    size_t g = grad ? DWG : 1, a = ((g * CH * C * 2) + 255) & ~(size_t)255, b = (((size_t)CH * V * 4) + 255) & ~(size_t)255;
    size_t d = grad ? ((g * CH * V * 2) + 255) & ~(size_t)255 : 0, e = grad ? (size_t)CH * C * 4 : 0;
    char *p = (char *)cu_scratch(c, a + b + d + e);
    if (!p) return 0;
    s->hc = (bf16 *)p;
    s->z = (float *)(p + a);
    s->dz = grad ? (bf16 *)(p + a + b) : NULL;
    s->dhc = grad ? (float *)(p + a + b + d) : NULL;
    return 1;
}

/* logits chunk z (mc, V) = hc (mc, C) · W^T * alpha, after gathering hc from h at pos. */
static void chunk_logits(cu_ctx *c, bf16 *hc, const bf16 *h, const int *pos, const bf16 *w, int mc, int C, int V, float alpha,
                         float *z) {
    gather_rows_cuda(c, hc, h, pos, mc, C);
    gemm_lt(c, 1, 0, V, mc, C, alpha, w, C, hc, C, 0.0f, z, V, 1, NULL);
}

void logprob_fwd_cuda(cu_ctx *c, float *logp, float *ent, const bf16 *h, const int *out_pos, const int *out_tok, const bf16 *w,
                      int M, int C, int V, float temperature) {
    lp_scratch s;
    if (c->failed || M <= 0 || !lp_scratch_get(c, &s, C, V, 0)) return;
    for (int m0 = 0; m0 < M && !c->failed; m0 += CH) {
        int mc = M - m0 < CH ? M - m0 : CH;
        chunk_logits(c, s.hc, h, out_pos + m0, w, mc, C, V, 1.0f / temperature, s.z);
        logprob_row_fwd_kernel<<<mc, ROW_THREADS, 0, c->stream>>>(logp + m0, ent ? ent + m0 : NULL, s.z, out_tok + m0, V);
        CU_LAUNCHED(c, "logprob_row_fwd_kernel");
    }
}

void logprob_bwd_cuda(cu_ctx *c, bf16 *dh, float *dw, const float *dlogp, const float *dent, const bf16 *h, const int *out_pos,
                      const int *out_tok, const bf16 *w, int M, int C, int V, float temperature) {
    lp_scratch s;
    if (c->failed || M <= 0 || !lp_scratch_get(c, &s, C, V, 1)) return;
    float inv_t = 1.0f / temperature;
    for (int m0 = 0; m0 < M && !c->failed; m0 += CH) {
        int mc = M - m0 < CH ? M - m0 : CH, j = (m0 / CH) % DWG; /* chunk j of the rows dW takes at once */
        bf16 *hc = s.hc + (size_t)j * CH * C, *dz = s.dz + (size_t)j * CH * V;
        chunk_logits(c, hc, h, out_pos + m0, w, mc, C, V, inv_t, s.z);
        logprob_row_bwd_kernel<<<mc, ROW_THREADS, 0, c->stream>>>(dz, s.z, out_tok + m0, dlogp + m0, dent ? dent + m0 : NULL, V,
                                                                  inv_t);
        CU_LAUNCHED(c, "logprob_row_bwd_kernel");
        /* dh_chunk^T (C, mc) = W^T (C, V) · dz^T (V, mc) */
        gemm_lt(c, 0, 0, C, mc, V, 1.0f, w, C, dz, V, 0.0f, s.dhc, C, 1, NULL);
        if (c->failed) return;
        scatter_add_rows_kernel<<<mc, 256, 0, c->stream>>>(dh, s.dhc, out_pos + m0, mc, C);
        CU_LAUNCHED(c, "scatter_add_rows_kernel");
        /* dW^T (C, V) += hc^T (C, rows) · dz (rows, V) over the chunks since the last */
        if (dw && (j == DWG - 1 || m0 + mc >= M))
            gemm_lt(c, 0, 1, C, V, j * CH + mc, 1.0f, s.hc, C, s.dz, V, 1.0f, dw, C, 1, NULL);
    }
}

void logprob_top_cuda(cu_ctx *c, int *ids, float *lps, const bf16 *h, const int *out_pos, const bf16 *w, int M, int C, int V,
                      float temperature, int K) {
    lp_scratch s;
    if (c->failed || M <= 0 || K <= 0 || !lp_scratch_get(c, &s, C, V, 0)) return;
    for (int m0 = 0; m0 < M && !c->failed; m0 += CH) {
        int mc = M - m0 < CH ? M - m0 : CH;
        chunk_logits(c, s.hc, h, out_pos + m0, w, mc, C, V, 1.0f / temperature, s.z);
        logprob_top_kernel<<<mc, ROW_THREADS, 0, c->stream>>>(ids + (size_t)m0 * K, lps + (size_t)m0 * K, s.z, V, K);
        CU_LAUNCHED(c, "logprob_top_kernel");
    }
}

void lm_head_rows_cuda(cu_ctx *c, float *logits, const bf16 *h, const int *pos, const bf16 *w, int R, int C, int V) {
    lp_scratch s;
    if (c->failed || R <= 0 || !lp_scratch_get(c, &s, C, V, 0)) return;
    for (int r0 = 0; r0 < R && !c->failed; r0 += CH) {
        int rc = R - r0 < CH ? R - r0 : CH;
        chunk_logits(c, s.hc, h, pos + r0, w, rc, C, V, 1.0f, logits + (size_t)r0 * V);
    }
}
