/* sampling.cu — CUDA version of kernels/sampling.h: one block per row of logits; each thread
 * keeps an online max/sum of exp(logits / T) and the best Gumbel-perturbed score over its
 * strided share of the vocabulary, then the block merges them. Only tok and logprob (R ints,
 * R floats) leave the device. The Gumbel noise is computed in double from the shared hash. */
#include "kernels/cuda_ops.cuh"
#include "kernels/sampling.h"

#define SAMPLE_THREADS 512

__global__ void sample_kernel(int *tok, float *logprob, const float *logits, const uint64_t *keys,
                              uint64_t counter, int V, float temperature) {
    __shared__ float sh[32];
    __shared__ double sb[32];
    __shared__ int si[32];
    int r = blockIdx.x;
    const float *x = logits + (size_t)r * V;
    float T = temperature > 0 ? temperature : 1.0f;
    uint64_t key = keys ? keys[r] : 0;
    float m = -INFINITY, s = 0.0f;
    double best = -INFINITY;
    int pick = 0x7fffffff;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float z = x[j] / T;
        if (z > m) { s = s * __expf(m - z) + 1.0f; m = z; }
        else s += __expf(z - m);
        double score = temperature > 0 ? (double)z + sampling_gumbel(key, counter, j) : (double)z;
        if (score > best) { best = score; pick = j; }   /* j increases: first max wins per thread */
    }
    float M = block_max(m, sh);
    float S = block_sum(m == -INFINITY ? 0.0f : s * __expf(m - M), sh);
    /* argmax of (best, pick), lowest id on ties */
    for (int o = 16; o > 0; o >>= 1) {
        double b2 = __shfl_xor_sync(0xffffffffu, best, o);
        int p2 = __shfl_xor_sync(0xffffffffu, pick, o);
        if (b2 > best || (b2 == best && p2 < pick)) { best = b2; pick = p2; }
    }
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) { sb[w] = best; si[w] = pick; }
    __syncthreads();
    if (w == 0) {
        best = lane < nw ? sb[lane] : -INFINITY;
        pick = lane < nw ? si[lane] : 0x7fffffff;
        for (int o = 16; o > 0; o >>= 1) {
            double b2 = __shfl_xor_sync(0xffffffffu, best, o);
            int p2 = __shfl_xor_sync(0xffffffffu, pick, o);
            if (b2 > best || (b2 == best && p2 < pick)) { best = b2; pick = p2; }
        }
        if (lane == 0) {
            if (pick >= V) pick = 0;   /* all -inf/NaN logits */
            tok[r] = pick;
            logprob[r] = x[pick] / T - (M + logf(S));
        }
    }
}

void sample_cuda(cu_ctx *c, int *tok, float *logprob, const float *logits, const uint64_t *keys, uint64_t counter,
                 int R, int V, float temperature) {
    if (c->failed || R <= 0) return;
    sample_kernel<<<R, SAMPLE_THREADS, 0, c->stream>>>(tok, logprob, logits, keys, counter, V, temperature);
    CU_LAUNCHED(c, "sample_kernel");
}
