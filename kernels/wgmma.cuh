/* wgmma.cuh — the Hopper warpgroup-MMA (wgmma, sm_90a) building blocks shared by
 * attention_wgmma.cu and gemm_grouped.cu: the 128-byte-swizzled shared-memory tile layout,
 * its matrix descriptors (K-major and MN-major) and k16 steps, the async-group fences, and the
 * m64n64k16 / m64n128k16 / m64n256k16 bf16 MMAs with fp32 accumulators, and the mbarriers,
 * TMA loads and register budgets of a producer / consumer ring.
 *
 * Shared-memory tiles: ROWS rows as column blocks of ROWS x 128 bytes (64 bf16 of the row's
 * contiguous dimension), each row's eight 16-byte chunks XOR-swizzled by row % 8, every block
 * 1024-byte aligned. K-major (rows = M or N, the row along K) with SBO = 1024 (eight rows);
 * MN-major (rows = K, the row along M or N, "transposed") with LBO = the column block's size
 * (next 64 of M or N) and SBO = 1024 (next eight k). A k16 step advances the start address 32
 * bytes inside a K-major row (a new column block every 4 steps), or 16 rows (2048 bytes) down
 * an MN-major tile. Accumulator fragments of m64nNk16 are mma.sync's m16n8k16 ones, warp w % 4
 * of the warpgroup owning rows 16 (w % 4) .. + 15: d[n][0..1] row lane/4, cols 8n + 2 (lane % 4)
 * + {0, 1}; d[n][2..3] the same cols, row + 8. */
#ifndef GRPOD_KERNELS_WGMMA_CUH
#define GRPOD_KERNELS_WGMMA_CUH
#include "kernels/mma.cuh"

/* byte offset of 16-byte chunk c of row `row` in a ROWS-row swizzled tile */
template <int ROWS> __device__ __forceinline__ unsigned wg_off(int row, int c) {
    return (c >> 3) * (ROWS * 128) + row * 128 + (((c & 7) ^ (row & 7)) << 4);
}

/* wgmma shared-memory matrix descriptor, 128-byte swizzle */
__device__ __forceinline__ unsigned long long wg_desc(const void *p, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((fa_smem(p) & 0x3FFFF) >> 4) | (unsigned long long)((lbo & 0x3FFFF) >> 4) << 16 |
        (unsigned long long)((sbo & 0x3FFFF) >> 4) << 32 | 1ull << 62;
}
/* Descriptors of a tile's start; a k16 step adds a byte offset >> 4 to the address field:
 * K-major (A = Q, B = K) step kk: column block kk / 4, 32 bytes a step inside it; MN-major (B = V,
 * transposed) step kk: 16 rows (2048 bytes) down. */
__device__ __forceinline__ unsigned long long wg_desc_k(const void *t) { return wg_desc(t, 16, 1024); }
template <int ROWS> __device__ __forceinline__ unsigned long long wg_desc_mn(const void *t) {
    return wg_desc(t, ROWS * 128, 1024);
}
template <int ROWS> __device__ __forceinline__ unsigned wg_step_k(int kk) {
    return ((kk >> 2) * (ROWS * 128) + (kk & 3) * 32) >> 4;
}
__device__ __forceinline__ unsigned wg_step_mn(int kk) { return kk * 128; }

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* after a wait: the accumulators are (re)defined here for the compiler, so no use of them moves
 * above the wait */
template <int NT> __device__ __forceinline__ void wg_keep(float (&d)[NT][4]) {
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(d[n][e])::"memory");
}
/* cp.async writes (generic proxy) -> wgmma reads (async proxy): each writer, before the barrier */
__device__ __forceinline__ void wg_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* d (64 x N) (+)= A (64 x 16) · B (16 x N): ss = A and B from descriptors (K-major, or MN-major
 * where wg_mma_ss128's TA / TB is 1), rs = A from registers (an m16n8k16 A fragment) and B
 * MN-major. acc = 0: d = A·B. */
__device__ __forceinline__ void wg_mma_ss64(float (&d)[8][4], unsigned long long da, unsigned long long db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, "
        "%15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "l"(da), "l"(db), "r"(acc));
}

template <int TA = 0, int TB = 0>
__device__ __forceinline__ void wg_mma_ss128(float (&d)[16][4], unsigned long long da, unsigned long long db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
                 "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, "
                 "%35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, "
                 "%57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
                   "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
                   "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
                   "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                   "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),
                   "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
                   "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]),
                   "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
                   "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]),
                   "+f"(d[15][3])
                 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
}

/* d (64 x 256) (+)= A (64 x 16) · B (16 x 256), both from descriptors (TA / TB as wg_mma_ss128's);
 * the template lists the 128 accumulators 16 (four n8 fragments) a line */
#define WG_F4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
template <int TA = 0, int TB = 0>
__device__ __forceinline__ void wg_mma_ss256(float (&d)[32][4], unsigned long long da, unsigned long long db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
                 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
                 "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
                 "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
                 "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
                 "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
                 "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
                 "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
                 "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
                 "}, %128, %129, p, 1, 1, %131, %132;\n}\n"
                 : WG_F4(0), WG_F4(1), WG_F4(2), WG_F4(3), WG_F4(4), WG_F4(5), WG_F4(6), WG_F4(7), WG_F4(8), WG_F4(9), WG_F4(10),
                   WG_F4(11), WG_F4(12), WG_F4(13), WG_F4(14), WG_F4(15), WG_F4(16), WG_F4(17), WG_F4(18), WG_F4(19), WG_F4(20),
                   WG_F4(21), WG_F4(22), WG_F4(23), WG_F4(24), WG_F4(25), WG_F4(26), WG_F4(27), WG_F4(28), WG_F4(29), WG_F4(30),
                   WG_F4(31)
                 : "l"(da), "l"(db), "r"(acc), "n"(TA), "n"(TB));
}
#undef WG_F4

__device__ __forceinline__ void wg_mma_rs128(float (&d)[16][4], const unsigned (&a)[4], unsigned long long db, int acc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
                 "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, "
                 "%35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, "
                 "%57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
                   "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
                   "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
                   "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                   "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]),
                   "+f"(d[8][3]), "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
                   "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]),
                   "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
                   "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]),
                   "+f"(d[15][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

/* mbarriers for warp-specialised kernels: a producer warpgroup fills a ring with cp.async and
 * signals "full", consumers signal "empty" */
__device__ __forceinline__ void mb_init(unsigned long long *b, int n) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(fa_smem(b)), "r"(n) : "memory");
}
__device__ __forceinline__ void mb_arrive(unsigned long long *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(fa_smem(b)) : "memory");
}
/* one arrival on b once every cp.async this thread issued so far has landed */
__device__ __forceinline__ void mb_arrive_cp(unsigned long long *b) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(fa_smem(b)) : "memory");
}
/* waits until the phase of parity `ph` has completed (a fresh barrier: parity 1 passes at once) */
__device__ __forceinline__ void mb_wait(unsigned long long *b, unsigned ph) {
    asm volatile(
        "{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT;\n}\n" ::"r"(fa_smem(b)),
        "r"(ph)
        : "memory");
}
/* one arrival on b that also expects `bytes` more of asynchronous (TMA) writes */
__device__ __forceinline__ void mb_expect(unsigned long long *b, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(fa_smem(b)), "r"(bytes) : "memory");
}
/* the barriers' initialisation, visible to the asynchronous proxy (TMA) before the block's barrier */
__device__ __forceinline__ void mb_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

/* TMA: the box at (c0 inner, c1 outer) of the 2-D tensor map m (in global memory) into
 * shared memory at dst, completing `bytes` on b; out-of-bounds elements arrive as zeros */
__device__ __forceinline__ void tma_load_2d(void *dst, const void *m, int c0, int c1, unsigned long long *b) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
                     fa_smem(dst)),
                 "l"(m), "r"(c0), "r"(c1), "r"(fa_smem(b))
                 : "memory");
}
/* a tensor map written by a copy (generic proxy) before it is used by TMA (tensormap proxy) */
__device__ __forceinline__ void tma_map_acquire(const void *m) {
    asm volatile("fence.proxy.tensormap::generic.acquire.gpu [%0], 128;\n" ::"l"(m) : "memory");
}
/* warp-specialised register budgets: a producer gives registers back, consumers take them */
template <int R> __device__ __forceinline__ void wg_regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R)); }
template <int R> __device__ __forceinline__ void wg_regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R)); }

/* a consumer's wait on a full barrier: then the tile the producer's cp.async wrote (generic
 * proxy) may be read by wgmma (async proxy) */
__device__ __forceinline__ void mb_acquire(unsigned long long *b, unsigned ph) {
    mb_wait(b, ph);
    wg_proxy_fence();
}
#endif
