/* moe_dev.cuh — device helpers shared by the moe*.cu files (inline functions only): 8-wide bf16
 * loads with zeros past the row's end, the SwiGLU the down projection reads, and the m16n8k16
 * tensor-core step the few-slot kernel issues. Legend as moe.h. */
#ifndef GRPOD_KERNELS_MOE_DEV_CUH
#define GRPOD_KERNELS_MOE_DEV_CUH
#include <stdint.h>

#include "kernels/common.cuh"

__device__ __forceinline__ float moe_silu(float x) { return x / (1.0f + __expf(-x)); }

/* 8 bf16 of row[k..k+8) (zeros past K, or for a NULL row), raw */
__device__ __forceinline__ uint4 ld8(const bf16 *row, int k, int K) {
    if (row && k + 8 <= K && !(((uintptr_t)(row + k)) & 15)) return *(const uint4 *)(row + k);
    union {
        uint4 q;
        bf16 h[8];
    } v;
    for (int j = 0; j < 8; j++) v.h[j] = row && k + j < K ? row[k + j] : __float2bfloat16(0.0f);
    return v.q;
}
__device__ __forceinline__ void unpack8(uint4 q, float *f) {
    const bf16 *h = (const bf16 *)&q;
    for (int j = 0; j < 8; j++) f[j] = __bfloat162float(h[j]);
}
__device__ __forceinline__ uint4 pack8(const float *f) {
    union {
        uint4 q;
        bf16 h[8];
    } v;
    for (int j = 0; j < 8; j++) v.h[j] = __float2bfloat16(f[j]);
    return v.q;
}
/* silu(g) * u of 8 values, the SwiGLU output the down projection reads */
__device__ __forceinline__ uint4 swiglu8(const bf16 *g, const bf16 *u, int k, int K) {
    float a[8], b[8];
    unpack8(ld8(g, k, K), a);
    unpack8(ld8(u, k, K), b);
    for (int j = 0; j < 8; j++) a[j] = moe_silu(a[j]) * b[j];
    return pack8(a);
}

/* d (16x8 fp32) += a (16x16 bf16, row) b (16x8 bf16, col): mma.sync m16n8k16 */
__device__ __forceinline__ void moe_mma16816(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                             unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#endif
