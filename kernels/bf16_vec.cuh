/* bf16_vec.cuh — vector loads and stores of V consecutive bf16 values (V = 1, 2, 4, 8: one 2-,
 * 4-, 8- or 16-byte access) converted to and from fp32 registers, for the memory-bound kernels
 * (rmsnorm.cu, swiglu.cu, elementwise.cu). The address must be aligned to 2*V bytes: launchers
 * pick V with vec_width(), which checks the row length and every base pointer. Also the grid
 * of those kernels: GRID_STRIDE loops, ew_blocks (at most 16 blocks an SM), VEC_LAUNCH (a
 * kernel<V> launched at the V vec_width chose). */
#ifndef GRPOD_KERNELS_BF16_VEC_CUH
#define GRPOD_KERNELS_BF16_VEC_CUH
#include <stdint.h>

#include "kernels/common.cuh"

#ifdef __CUDACC__
template <int V> struct bf16_pack;
template <> struct bf16_pack<1> { typedef unsigned short t; };
template <> struct bf16_pack<2> { typedef unsigned int t; };
template <> struct bf16_pack<4> { typedef uint2 t; };
template <> struct bf16_pack<8> { typedef uint4 t; };

template <int V> __device__ __forceinline__ void vload(float (&f)[V], const bf16 *p) {
    typename bf16_pack<V>::t u = *(const typename bf16_pack<V>::t *)p;
    const bf16 *h = (const bf16 *)&u;
#pragma unroll
    for (int j = 0; j < V; j++) f[j] = __bfloat162float(h[j]);
}

template <int V> __device__ __forceinline__ void vstore(bf16 *p, const float (&f)[V]) {
    typename bf16_pack<V>::t u;
    bf16 *h = (bf16 *)&u;
#pragma unroll
    for (int j = 0; j < V; j++) h[j] = __float2bfloat16(f[j]);
    *(typename bf16_pack<V>::t *)p = u;
}

/* round through bf16 (what a store then a load would give) */
__device__ __forceinline__ float bf16_round(float x) { return __bfloat162float(__float2bfloat16(x)); }
#endif

/* The widest V in {8, 4, 2, 1} that divides n and to whose 2*V bytes every pointer is aligned
 * (NULL pointers are ignored). */
static inline int vec_width(long long n, const void *p0, const void *p1, const void *p2, const void *p3, const void *p4) {
    const void *p[5] = {p0, p1, p2, p3, p4};
    for (int v = 8; v > 1; v >>= 1) {
        int ok = n % v == 0;
        for (int i = 0; i < 5 && ok; i++) ok = !p[i] || (uintptr_t)p[i] % (2u * v) == 0;
        if (ok) return v;
    }
    return 1;
}
#ifdef __CUDACC__
#define GRID_STRIDE(i, n) \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); i += (long long)gridDim.x * blockDim.x)

static inline unsigned ew_blocks(cu_ctx *c, long long n) {
    unsigned b = cu_blocks(n, 256), cap = (unsigned)c->n_sm * 16;
    return b < cap ? b : cap;
}

#define VEC_LAUNCH(kernel, v, n, ...) \
    do { \
        switch (v) { \
        case 8: kernel<8><<<ew_blocks(c, (n) / 8), 256, 0, c->stream>>>(__VA_ARGS__); break; \
        case 4: kernel<4><<<ew_blocks(c, (n) / 4), 256, 0, c->stream>>>(__VA_ARGS__); break; \
        case 2: kernel<2><<<ew_blocks(c, (n) / 2), 256, 0, c->stream>>>(__VA_ARGS__); break; \
        default: kernel<1><<<ew_blocks(c, (n)), 256, 0, c->stream>>>(__VA_ARGS__); \
        } \
        CU_LAUNCHED(c, #kernel); \
    } while (0)
#endif
#endif
