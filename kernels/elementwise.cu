/* elementwise.cu — the small elementwise ops of the backend table (elementwise.h): add, fp32 ->
 * bf16 conversion, bf16 added into fp32 sums, and the row scatter that writes KV-cache rows
 * where qkv_rope_fwd (rmsnorm.cu) cannot do it in its own launch. Grid-stride loops; add moves
 * V elements per thread per step (bf16_vec.cuh): they are memory-bound. */
#include "kernels/bf16_vec.cuh"
#include "kernels/elementwise.cuh"

template <int V> __global__ void add_kernel(bf16 *out, const bf16 *x, const bf16 *y, long long n) {
    GRID_STRIDE(i, n / V) {
        float a[V], b[V];
        vload<V>(a, x + i * V);
        vload<V>(b, y + i * V);
#pragma unroll
        for (int j = 0; j < V; j++) a[j] += b[j];
        vstore<V>(out + i * V, a);
    }
}

__global__ void f32_to_bf16_kernel(bf16 *dst, const float *src, long long n) {
    GRID_STRIDE(i, n) dst[i] = __float2bfloat16(src[i]);
}

__global__ void acc_f32_kernel(float *acc, const bf16 *x, long long n) { GRID_STRIDE(i, n) acc[i] += __bfloat162float(x[i]); }
/* two elements a step: n2 = n / 2 pairs, acc 8-byte and x 4-byte aligned */
__global__ void acc_f32_x2_kernel(float2 *acc, const __nv_bfloat162 *x, long long n2) {
    GRID_STRIDE(i, n2) {
        float2 f = __bfloat1622float2(x[i]), a = acc[i];
        a.x += f.x;
        a.y += f.y;
        acc[i] = a;
    }
}

__global__ void gather_rows_kernel(bf16 *dst, const bf16 *src, const int *idx, int n, int row) {
    pdl_wait();
    pdl_trigger();
    long long m = (long long)n * row;
    GRID_STRIDE(i, m) {
        long long t = i / row, e = i - t * row;
        dst[i] = src[(size_t)idx[t] * row + e];
    }
}

__global__ void scatter_rows_kernel(bf16 *dst, const bf16 *src, const int *slot, int T, int row) {
    pdl_wait();
    pdl_trigger();
    long long n = (long long)T * row;
    GRID_STRIDE(i, n) {
        long long t = i / row, e = i - t * row;
        dst[(size_t)slot[t] * row + e] = src[i];
    }
}

void add_cuda(cu_ctx *c, bf16 *out, const bf16 *x, const bf16 *y, long long n) {
    if (c->failed || n <= 0) return;
    VEC_LAUNCH(add_kernel, vec_width(n, out, x, y, NULL, NULL), n, out, x, y, n);
}

void f32_to_bf16_cuda(cu_ctx *c, bf16 *dst, const float *src, long long n) {
    if (c->failed || n <= 0) return;
    f32_to_bf16_kernel<<<ew_blocks(c, n), 256, 0, c->stream>>>(dst, src, n);
    CU_LAUNCHED(c, "f32_to_bf16_kernel");
}

void acc_f32_cuda(cu_ctx *c, float *acc, const bf16 *x, long long n) {
    if (c->failed || n <= 0) return;
    if (n % 2 == 0 && !((uintptr_t)acc & 7) && !((uintptr_t)x & 3)) {
        acc_f32_x2_kernel<<<ew_blocks(c, n / 2), 256, 0, c->stream>>>((float2 *)acc, (const __nv_bfloat162 *)x, n / 2);
        CU_LAUNCHED(c, "acc_f32_x2_kernel");
        return;
    }
    acc_f32_kernel<<<ew_blocks(c, n), 256, 0, c->stream>>>(acc, x, n);
    CU_LAUNCHED(c, "acc_f32_kernel");
}

void gather_rows_cuda(cu_ctx *c, bf16 *dst, const bf16 *src, const int *idx, int n, int row) {
    if (c->failed || n <= 0 || row <= 0) return;
    cu_launch_pdl(c, "gather_rows_kernel", gather_rows_kernel, dim3(ew_blocks(c, (long long)n * row)), dim3(256), 0, dst, src,
                  idx, n, row);
}

void scatter_rows_cuda(cu_ctx *c, bf16 *dst, const bf16 *src, const int *slot, int T, int row) {
    if (c->failed || T <= 0 || row <= 0) return;
    cu_launch_pdl(c, "scatter_rows_kernel", scatter_rows_kernel, dim3(ew_blocks(c, (long long)T * row)), dim3(256), 0, dst, src,
                  slot, T, row);
}
