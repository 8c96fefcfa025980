/* matmul_order.cuh — the reduction order of the few-row GEMM (skinny_kernel, matmul.cu), shared
 * with exact mode's many-row GEMM (matmul_exact.cu), so that an output row gets the same bits
 * from either kernel whatever the batch beside it (tune.exact):
 *   - K in SK_KC-wide chunks, nch = I / SK_KC of them, in SK_WARPS contiguous segments: segment w
 *     is chunks [w nch / SK_WARPS, (w + 1) nch / SK_WARPS), summed in chunk order into its own
 *     fp32 partial (from 0);
 *   - inside a chunk, lane (g, q) of a warp holds k = c + 8 q .. + 8 (h = 0) and c + 32 + 8 q .. + 8
 *     (h = 1) of its rows; per h two m16n8k16 steps, the first on the 4 lower k of each 8 (.x,
 *     .y), the second on the upper 4 (.z, .w): the same permutation for both operands;
 *   - the segments' partials summed in segment order from 0.0f, then + bias, then + residual, one
 *     rounding to bf16. */
#ifndef GRPOD_KERNELS_MATMUL_ORDER_CUH
#define GRPOD_KERNELS_MATMUL_ORDER_CUH
#include "kernels/common.cuh"

enum { SK_WARPS = 8, SK_KC = 64 };

/* segment w's first chunk of nch (w = SK_WARPS: nch) */
__host__ __device__ __forceinline__ int sk_seg0(int w, int nch) { return w * nch / SK_WARPS; }

__device__ __forceinline__ void sk_cp16(void *dst, const void *src, int bytes) {
    unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void sk_mma(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* piece p (16 bytes) of row r of a [rows][SK_KC] bf16 tile in shared memory, swizzled so that a
 * quarter warp's fragment loads (rows g, g + 1; pieces q of one k-half) fall in distinct banks */
__device__ __forceinline__ int ex_piece(int r, int p) { return r * (SK_KC / 8) + (p ^ ((r & 1) << 2)); }

/* one k-half of a chunk: rows lo (g) and hi (g + 8) of an m16 tile against n8 tile w */
__device__ __forceinline__ void sk_mma8(float (&d)[4], const uint4 &lo, const uint4 &hi, const uint4 &w) {
    sk_mma(d, lo.x, hi.x, lo.y, hi.y, w.x, w.y);
    sk_mma(d, lo.z, hi.z, lo.w, hi.w, w.z, w.w);
}
#endif
