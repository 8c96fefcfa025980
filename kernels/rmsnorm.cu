/* rmsnorm.cu — CUDA RMSNorm (also Qwen3's per-head q/k norm: rows = T*H, C = D).
 * One warp per row, statistics in fp32. Backward adds into dinp (bf16) and accumulates dw in
 * fp32: each block sums its rows' dw in shared memory, then one atomicAdd per block and column
 * into the global dw (the order of the block sums varies, within fp32 rounding). */
#include "kernels/cuda_ops.cuh"

enum { RMS_WARPS = 8 };

__global__ void rmsnorm_fwd_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int T, int C, float eps) {
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * RMS_WARPS + (threadIdx.x >> 5);
    if (row >= T) return;
    const bf16 *x = inp + (size_t)row * C;
    bf16 *y = out + (size_t)row * C;
    float ss = 0;
    for (int i = lane; i < C; i += 32) { float v = __bfloat162float(x[i]); ss += v * v; }
    ss = warp_sum(ss);
    float r = rsqrtf(ss / C + eps);
    if (rstd && lane == 0) rstd[row] = r;
    for (int i = lane; i < C; i += 32)
        y[i] = __float2bfloat16(__bfloat162float(w[i]) * (__bfloat162float(x[i]) * r));
}

/* dx = r (w dy - n mean(w dy n)), n = x r;  dw += dy n.  Shared memory: C floats. */
__global__ void rmsnorm_bwd_kernel(bf16 *dinp, float *dw, const bf16 *dout, const bf16 *inp, const bf16 *w,
                                   const float *rstd, int T, int C) {
    extern __shared__ float dw_s[];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < C; i += blockDim.x) dw_s[i] = 0;
    __syncthreads();
    for (int row = blockIdx.x * RMS_WARPS + warp; row < T; row += gridDim.x * RMS_WARPS) {
        const bf16 *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
        bf16 *dx = dinp + (size_t)row * C;
        float r = rstd[row], dot = 0;
        for (int i = lane; i < C; i += 32) {
            float n = __bfloat162float(x[i]) * r, g = __bfloat162float(dy[i]);
            atomicAdd(&dw_s[i], g * n);
            dot += __bfloat162float(w[i]) * g * n;
        }
        float mean = warp_sum(dot) / C;
        for (int i = lane; i < C; i += 32) {
            float n = __bfloat162float(x[i]) * r;
            float v = __bfloat162float(dx[i]) + r * (__bfloat162float(w[i]) * __bfloat162float(dy[i]) - n * mean);
            dx[i] = __float2bfloat16(v);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += blockDim.x) atomicAdd(dw + i, dw_s[i]);
}

void rmsnorm_fwd_cuda(cu_ctx *c, bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int T, int C, float eps) {
    if (c->failed || T <= 0) return;
    rmsnorm_fwd_kernel<<<cu_blocks(T, RMS_WARPS), RMS_WARPS * 32, 0, c->stream>>>(out, rstd, inp, w, T, C, eps);
    CU_LAUNCHED(c, "rmsnorm_fwd_kernel");
}

void rmsnorm_bwd_cuda(cu_ctx *c, bf16 *dinp, float *dw, const bf16 *dout, const bf16 *inp, const bf16 *w,
                      const float *rstd, int T, int C) {
    if (c->failed || T <= 0) return;
    size_t smem = (size_t)C * sizeof(float);
    if (smem > 48 * 1024 && !c->rms_smem_raised) {
        CU_CK(c, cudaFuncSetAttribute(rmsnorm_bwd_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
        c->rms_smem_raised = 1;
    }
    unsigned blocks = cu_blocks(T, RMS_WARPS), cap = (unsigned)c->n_sm * 4;
    if (blocks > cap) blocks = cap;
    rmsnorm_bwd_kernel<<<blocks, RMS_WARPS * 32, smem, c->stream>>>(dinp, dw, dout, inp, w, rstd, T, C);
    CU_LAUNCHED(c, "rmsnorm_bwd_kernel");
}
