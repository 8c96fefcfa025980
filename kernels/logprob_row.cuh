/* logprob_row.cuh — the one order in which a row's log-softmax statistics are summed, shared by
 * the logprob head (logprob.cu) and, in exact mode, the sampler's reported logprob (sampling.cu),
 * so that a rollout's logprob equals the trainer's bit for bit. One block of
 * LOGPROB_ROW_THREADS threads a row; the order depends on V only, never on the rows beside it. */
#ifndef GRPOD_KERNELS_LOGPROB_ROW_CUH
#define GRPOD_KERNELS_LOGPROB_ROW_CUH
#include "kernels/common.cuh"

enum { LOGPROB_ROW_THREADS = 1024 };

/* one element z into a thread's running max mx, Σ exp(z - mx) s and Σ z exp(z - mx) sz */
static __device__ __forceinline__ void row_step(float z, float &mx, float &s, float &sz) {
    if (z > mx) {
        float c = __expf(mx - z);
        s *= c;
        sz *= c;
        mx = z;
    }
    float e = __expf(z - mx);
    s += e;
    sz += e * z;
}

/* (lse, E[z]) of the row z_j = x_j * scale (j < V) over the block; scale 1 reads x as it is.
 * A thread takes j = threadIdx.x, + blockDim.x, ... in that order; its loads are issued four at
 * a time ahead of the sums (one load in flight a thread held the logprob head's row kernel to
 * about half the memory bandwidth), which does not change the order. */
static __device__ void row_stats(const float *x, float scale, int V, float *lse_out, float *ez_out) {
    __shared__ float sh[32];
    float mx = -INFINITY, s = 0, sz = 0;
    int B = blockDim.x, j = threadIdx.x;
    for (; j + 3 * B < V; j += 4 * B) {
        float x0 = x[j], x1 = x[j + B], x2 = x[j + 2 * B], x3 = x[j + 3 * B];
        row_step(x0 * scale, mx, s, sz);
        row_step(x1 * scale, mx, s, sz);
        row_step(x2 * scale, mx, s, sz);
        row_step(x3 * scale, mx, s, sz);
    }
    for (; j < V; j += B) row_step(x[j] * scale, mx, s, sz);
    float M = block_max(mx, sh);
    float c = mx == -INFINITY ? 0.0f : __expf(mx - M);
    float S = block_sum(s * c, sh);
    float SZ = block_sum(sz * c, sh);
    *lse_out = M + logf(S);
    *ez_out = SZ / S;
}
#endif
