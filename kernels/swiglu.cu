/* swiglu.cu — CUDA SwiGLU forward/backward on bf16 (math in fp32), plus the small elementwise
 * ops the backend table needs beside it: add, fp32 -> bf16 conversion, and the row scatter of
 * KV-cache writes. Grid-stride loops, one element per thread per step. */
#include "kernels/cuda_ops.cuh"

#define GRID_STRIDE(i, n) for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); \
                               i += (long long)gridDim.x * blockDim.x)

static unsigned ew_blocks(cu_ctx *c, long long n) {
    unsigned b = cu_blocks(n, 256), cap = (unsigned)c->n_sm * 16;
    return b < cap ? b : cap;
}

__global__ void swiglu_fwd_kernel(bf16 *out, const bf16 *gate, const bf16 *up, long long n) {
    GRID_STRIDE(i, n) {
        float x = __bfloat162float(gate[i]);
        out[i] = __float2bfloat16(x / (1.0f + expf(-x)) * __bfloat162float(up[i]));
    }
}

__global__ void swiglu_bwd_kernel(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up,
                                  long long n) {
    GRID_STRIDE(i, n) {
        float x = __bfloat162float(gate[i]), u = __bfloat162float(up[i]), d = __bfloat162float(dout[i]);
        float s = 1.0f / (1.0f + expf(-x));
        dup[i] = __float2bfloat16(d * x * s);
        dgate[i] = __float2bfloat16(d * u * (s + x * s * (1.0f - s)));
    }
}

__global__ void add_kernel(bf16 *out, const bf16 *x, const bf16 *y, long long n) {
    GRID_STRIDE(i, n) out[i] = __float2bfloat16(__bfloat162float(x[i]) + __bfloat162float(y[i]));
}

__global__ void f32_to_bf16_kernel(bf16 *dst, const float *src, long long n) {
    GRID_STRIDE(i, n) dst[i] = __float2bfloat16(src[i]);
}

__global__ void scatter_rows_kernel(bf16 *dst, const bf16 *src, const int *slot, int T, int row) {
    long long n = (long long)T * row;
    GRID_STRIDE(i, n) {
        long long t = i / row, e = i - t * row;
        dst[(size_t)slot[t] * row + e] = src[i];
    }
}

void swiglu_fwd_cuda(cu_ctx *c, bf16 *out, const bf16 *gate, const bf16 *up, long long n) {
    if (c->failed || n <= 0) return;
    swiglu_fwd_kernel<<<ew_blocks(c, n), 256, 0, c->stream>>>(out, gate, up, n);
    CU_LAUNCHED(c, "swiglu_fwd_kernel");
}

void swiglu_bwd_cuda(cu_ctx *c, bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up,
                     long long n) {
    if (c->failed || n <= 0) return;
    swiglu_bwd_kernel<<<ew_blocks(c, n), 256, 0, c->stream>>>(dgate, dup, dout, gate, up, n);
    CU_LAUNCHED(c, "swiglu_bwd_kernel");
}

void add_cuda(cu_ctx *c, bf16 *out, const bf16 *x, const bf16 *y, long long n) {
    if (c->failed || n <= 0) return;
    add_kernel<<<ew_blocks(c, n), 256, 0, c->stream>>>(out, x, y, n);
    CU_LAUNCHED(c, "add_kernel");
}

void f32_to_bf16_cuda(cu_ctx *c, bf16 *dst, const float *src, long long n) {
    if (c->failed || n <= 0) return;
    f32_to_bf16_kernel<<<ew_blocks(c, n), 256, 0, c->stream>>>(dst, src, n);
    CU_LAUNCHED(c, "f32_to_bf16_kernel");
}

void scatter_rows_cuda(cu_ctx *c, bf16 *dst, const bf16 *src, const int *slot, int T, int row) {
    if (c->failed || T <= 0 || row <= 0) return;
    scatter_rows_kernel<<<ew_blocks(c, (long long)T * row), 256, 0, c->stream>>>(dst, src, slot, T, row);
    CU_LAUNCHED(c, "scatter_rows_kernel");
}
