/* embedding.cu — CUDA embedding lookup (bf16 rows, 16-byte copies when C allows) and its
 * backward: a scatter-add of bf16 row gradients into the fp32 table gradient with fp32 atomics
 * (tokens may repeat; the sum order then varies between runs, within fp32 rounding). */
#include "kernels/cuda_ops.cuh"

/* out (T,C) = wte[tokens[t]]; one block row per token, threads over C. */
__global__ void embedding_fwd_kernel(bf16 *out, const int *tokens, const bf16 *wte, int T, int C) {
    int t = blockIdx.x;
    const bf16 *src = wte + (size_t)tokens[t] * C;
    bf16 *dst = out + (size_t)t * C;
    if ((C & 7) == 0) {
        for (int i = threadIdx.x; i < C / 8; i += blockDim.x)
            ((uint4 *)dst)[i] = ((const uint4 *)src)[i];
    } else {
        for (int i = threadIdx.x; i < C; i += blockDim.x) dst[i] = src[i];
    }
}

__global__ void embedding_bwd_kernel(float *dwte, const bf16 *dout, const int *tokens, int T, int C) {
    int t = blockIdx.x;
    float *row = dwte + (size_t)tokens[t] * C;
    const bf16 *d = dout + (size_t)t * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) atomicAdd(row + i, __bfloat162float(d[i]));
}

void embedding_fwd_cuda(cu_ctx *c, bf16 *out, const int *tokens, const bf16 *wte, int T, int C) {
    if (c->failed || T <= 0) return;
    embedding_fwd_kernel<<<T, 128, 0, c->stream>>>(out, tokens, wte, T, C);
    CU_LAUNCHED(c, "embedding_fwd_kernel");
}

void embedding_bwd_cuda(cu_ctx *c, float *dwte, const bf16 *dout, const int *tokens, int T, int C) {
    if (c->failed || T <= 0) return;
    embedding_bwd_kernel<<<T, 256, 0, c->stream>>>(dwte, dout, tokens, T, C);
    CU_LAUNCHED(c, "embedding_bwd_kernel");
}
