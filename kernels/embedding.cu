/* embedding.cu — CUDA embedding lookup (bf16 rows, 16-byte copies when C allows) and its
 * backward: a scatter-add of bf16 row gradients into the fp32 table gradient. Tokens repeat, so
 * the backward adds in a fixed order, no atomics (a replayed update must equal the original):
 * one thread per column walks the tokens in chunks of EMB_CH; inside a chunk, gradients of a
 * repeated token are summed into its first occurrence, then each distinct row is read and
 * written once (the reads of a chunk are independent, which hides their latency). */
#include "kernels/embedding.cuh"

/* out (T,C) = wte[tokens[t]]; one block row per token, threads over C. */
__global__ void embedding_fwd_kernel(bf16 *out, const int *tokens, const bf16 *wte, int T, int C) {
    int t = blockIdx.x;
    const bf16 *src = wte + (size_t)tokens[t] * C;
    bf16 *dst = out + (size_t)t * C;
    if ((C & 7) == 0) {
        for (int i = threadIdx.x; i < C / 8; i += blockDim.x) ((uint4 *)dst)[i] = ((const uint4 *)src)[i];
    } else {
        for (int i = threadIdx.x; i < C; i += blockDim.x) dst[i] = src[i];
    }
}

#define EMB_CH 16
__global__ void embedding_bwd_kernel(float *dwte, const bf16 *dout, const int *tokens, int T, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int t0 = 0; t0 < T; t0 += EMB_CH) {
        int n = T - t0 < EMB_CH ? T - t0 : EMB_CH, tok[EMB_CH];
        float g[EMB_CH];
#pragma unroll
        for (int k = 0; k < EMB_CH; k++) {
            tok[k] = k < n ? tokens[t0 + k] : -1;
            g[k] = k < n ? __bfloat162float(dout[(size_t)(t0 + k) * C + c]) : 0.0f;
        }
#pragma unroll
        for (int k = 1; k < EMB_CH; k++)
            for (int j = 0; j < k; j++)
                if (tok[k] >= 0 && tok[j] == tok[k]) {
                    g[j] += g[k];
                    tok[k] = -1;
                    break;
                }
        float cur[EMB_CH];
#pragma unroll
        for (int k = 0; k < EMB_CH; k++) cur[k] = tok[k] >= 0 ? dwte[(size_t)tok[k] * C + c] : 0.0f;
#pragma unroll
        for (int k = 0; k < EMB_CH; k++)
            if (tok[k] >= 0) dwte[(size_t)tok[k] * C + c] = cur[k] + g[k];
    }
}

void embedding_fwd_cuda(cu_ctx *c, bf16 *out, const int *tokens, const bf16 *wte, int T, int C) {
    if (c->failed || T <= 0) return;
    embedding_fwd_kernel<<<T, 128, 0, c->stream>>>(out, tokens, wte, T, C);
    CU_LAUNCHED(c, "embedding_fwd_kernel");
}

void embedding_bwd_cuda(cu_ctx *c, float *dwte, const bf16 *dout, const int *tokens, int T, int C) {
    if (c->failed || T <= 0) return;
    embedding_bwd_kernel<<<(C + 63) / 64, 64, 0, c->stream>>>(dwte, dout, tokens, T, C);
    CU_LAUNCHED(c, "embedding_bwd_kernel");
}
