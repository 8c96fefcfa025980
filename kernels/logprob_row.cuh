/* logprob_row.cuh — the one order in which a row's log-softmax statistics are summed, shared by
 * the logprob head (logprob.cu) and, in exact mode, the sampler's reported logprob (sampling.cu),
 * so that a rollout's logprob equals the trainer's bit for bit. One block of
 * LOGPROB_ROW_THREADS threads a row; the order depends on V only, never on the rows beside it. */
#ifndef GRPOD_KERNELS_LOGPROB_ROW_CUH
#define GRPOD_KERNELS_LOGPROB_ROW_CUH
#include "kernels/common.cuh"

enum { LOGPROB_ROW_THREADS = 1024 };

/* (lse, E[z]) of the row z_j = x_j * scale (j < V) over the block; scale 1 reads x as it is. */
static __device__ void row_stats(const float *x, float scale, int V, float *lse_out, float *ez_out) {
    __shared__ float sh[32];
    float mx = -INFINITY, s = 0, sz = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float z = x[j] * scale;
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
    float M = block_max(mx, sh);
    float c = mx == -INFINITY ? 0.0f : __expf(mx - M);
    float S = block_sum(s * c, sh);
    float SZ = block_sum(sz * c, sh);
    *lse_out = M + logf(S);
    *ez_out = SZ / S;
}
#endif
