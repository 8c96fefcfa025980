/* mma.cuh — the sm_80+ tensor-core building blocks the mma.sync kernels share (attention_mma.cu,
 * attention_decode.cu, gemm_grouped.cu): ldmatrix (plain and transposed), the m16n8k16 bf16 MMA
 * with fp32 accumulation, and 16-byte cp.async with zero fill. __device__ inline functions only.
 * Fragment layouts are PTX's for mma.m16n8k16.row.col: A 16x16 row-major in four 8x8 matrices
 * (rows 0-7 / 8-15 x k 0-7, then k 8-15), B 16x8 in two (k 0-7, k 8-15). */
#ifndef GRPOD_KERNELS_MMA_CUH
#define GRPOD_KERNELS_MMA_CUH
#include "kernels/common.cuh"

__device__ __forceinline__ unsigned fa_smem(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void fa_ldsm4(unsigned (&r)[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fa_smem(p)));
}
__device__ __forceinline__ void fa_ldsm4t(unsigned (&r)[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(fa_smem(p)));
}
__device__ __forceinline__ void fa_mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* 16 bytes global -> shared; zero-filled when !ok (src is then not read). */
__device__ __forceinline__ void fa_cp16(bf16 *dst, const bf16 *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(fa_smem(dst)), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void fa_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void fa_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
#endif
