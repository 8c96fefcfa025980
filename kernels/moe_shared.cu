/* moe_shared.cu — the shared expert's gate on bf16 (moe_shared.h): one block per token; the
 * backward's sum over C is a block reduction in a fixed order (deterministic). */
#include "kernels/moe_shared.cuh"

#define MS_NT 256

__global__ void __launch_bounds__(MS_NT) moe_shared_gate_fwd_kernel(bf16 *out, const bf16 *y, const bf16 *z, int C) {
    long long t = blockIdx.x;
    float s = 1.0f / (1.0f + expf(-__bfloat162float(z[t])));
    for (int c = threadIdx.x; c < C; c += MS_NT)
        out[t * C + c] = __float2bfloat16(__bfloat162float(out[t * C + c]) + s * __bfloat162float(y[t * C + c]));
}

__global__ void __launch_bounds__(MS_NT) moe_shared_gate_bwd_kernel(bf16 *y, bf16 *z, const bf16 *dout, int C) {
    __shared__ float sh[32];
    long long t = blockIdx.x;
    float acc = 0.0f;
    for (int c = threadIdx.x; c < C; c += MS_NT) acc += __bfloat162float(dout[t * C + c]) * __bfloat162float(y[t * C + c]);
    acc = block_sum(acc, sh); /* every thread has read its y before any writes below */
    float s = 1.0f / (1.0f + expf(-__bfloat162float(z[t])));
    for (int c = threadIdx.x; c < C; c += MS_NT) y[t * C + c] = __float2bfloat16(s * __bfloat162float(dout[t * C + c]));
    if (threadIdx.x == 0) z[t] = __float2bfloat16(acc * s * (1.0f - s));
}

void moe_shared_gate_fwd_cuda(cu_ctx *c, bf16 *out, const bf16 *y, const bf16 *z, int T, int C) {
    if (c->failed || T <= 0) return;
    moe_shared_gate_fwd_kernel<<<T, MS_NT, 0, c->stream>>>(out, y, z, C);
    CU_LAUNCHED(c, "moe_shared_gate_fwd_kernel");
}

void moe_shared_gate_bwd_cuda(cu_ctx *c, bf16 *y, bf16 *z, const bf16 *dout, int T, int C) {
    if (c->failed || T <= 0) return;
    moe_shared_gate_bwd_kernel<<<T, MS_NT, 0, c->stream>>>(y, z, dout, C);
    CU_LAUNCHED(c, "moe_shared_gate_bwd_kernel");
}
