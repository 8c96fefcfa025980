/* rope.cu — CUDA rotary embedding in place on bf16 (T,H,D), Hugging Face rotate_half layout.
 * The angle is the fp32 product pos * inv_freq[i] as HF computes it; sin/cos at full precision
 * (sincosf, not the fast intrinsics: positions reach 1e5 rad). Backward rotates by -angle. */
#include "kernels/rope.cuh"

__global__ void rope_kernel(bf16 *x, const int *pos, const float *inv_freq, int T, int H, int D, float sign) {
    int half = D / 2;
    long long n = (long long)T * H * half;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < n; idx += (long long)gridDim.x * blockDim.x) {
        int i = (int)(idx % half);
        long long th = idx / half;
        int t = (int)(th / H);
        float ang = (float)pos[t] * inv_freq[i], s, co;
        sincosf(ang, &s, &co);
        s *= sign;
        bf16 *v = x + th * D;
        float x1 = __bfloat162float(v[i]), x2 = __bfloat162float(v[i + half]);
        v[i] = __float2bfloat16(x1 * co - x2 * s);
        v[i + half] = __float2bfloat16(x2 * co + x1 * s);
    }
}

static void rope_launch(cu_ctx *c, bf16 *x, const int *pos, const float *inv_freq, int T, int H, int D, float sign) {
    if (c->failed || T <= 0) return;
    long long n = (long long)T * H * (D / 2);
    unsigned b = cu_blocks(n, 256), cap = (unsigned)c->n_sm * 16;
    rope_kernel<<<(b < cap ? b : cap), 256, 0, c->stream>>>(x, pos, inv_freq, T, H, D, sign);
    CU_LAUNCHED(c, "rope_kernel");
}

void rope_fwd_cuda(cu_ctx *c, bf16 *x, const int *pos, const float *inv_freq, int T, int H, int D) {
    rope_launch(c, x, pos, inv_freq, T, H, D, 1.0f);
}
void rope_bwd_cuda(cu_ctx *c, bf16 *dx, const int *pos, const float *inv_freq, int T, int H, int D) {
    rope_launch(c, dx, pos, inv_freq, T, H, D, -1.0f);
}
