/* swiglu.cu — CUDA SwiGLU forward/backward on bf16 (math in fp32). Grid-stride loops moving V
 * elements per thread per step (16-byte accesses when n and the pointers allow, bf16_vec.cuh):
 * they are memory-bound. */
#include "kernels/bf16_vec.cuh"
#include "kernels/swiglu.cuh"


/* n / V vectors of V elements */
template <int V> __global__ void swiglu_fwd_kernel(bf16 *out, const bf16 *gate, const bf16 *up, long long n) {
    pdl_wait();
    pdl_trigger();
    GRID_STRIDE(i, n / V) {
        float x[V], u[V];
        vload<V>(x, gate + i * V);
        vload<V>(u, up + i * V);
#pragma unroll
        for (int j = 0; j < V; j++) x[j] = x[j] / (1.0f + expf(-x[j])) * u[j];
        vstore<V>(out + i * V, x);
    }
}

template <int V>
__global__ void swiglu_bwd_kernel(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up, long long n) {
    GRID_STRIDE(i, n / V) {
        float x[V], u[V], d[V], dg[V], du[V];
        vload<V>(x, gate + i * V);
        vload<V>(u, up + i * V);
        vload<V>(d, dout + i * V);
#pragma unroll
        for (int j = 0; j < V; j++) {
            float s = 1.0f / (1.0f + expf(-x[j]));
            du[j] = d[j] * x[j] * s;
            dg[j] = d[j] * u[j] * (s + x[j] * s * (1.0f - s));
        }
        vstore<V>(dup + i * V, du);
        vstore<V>(dgate + i * V, dg);
    }
}

void swiglu_fwd_cuda(cu_ctx *c, bf16 *out, const bf16 *gate, const bf16 *up, long long n) {
    if (c->failed || n <= 0) return;
    int v = vec_width(n, out, gate, up, NULL, NULL);
    void (*k)(bf16 *, const bf16 *, const bf16 *, long long) = v == 8 ? swiglu_fwd_kernel<8>
        : v == 4                                                      ? swiglu_fwd_kernel<4>
        : v == 2                                                      ? swiglu_fwd_kernel<2>
                                                                      : swiglu_fwd_kernel<1>;
    cu_launch_pdl(c, "swiglu_fwd_kernel", k, dim3(ew_blocks(c, n / v)), dim3(256), 0, out, gate, up, n);
}

void swiglu_bwd_cuda(cu_ctx *c, bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up, long long n) {
    if (c->failed || n <= 0) return;
    VEC_LAUNCH(swiglu_bwd_kernel, vec_width(n, dgate, dup, dout, gate, up), n, dgate, dup, dout, gate, up, n);
}
