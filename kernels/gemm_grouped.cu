/* gemm_grouped.cu — gemm_grouped.cuh's many GEMMs in one launch, on Hopper's warpgroup MMA
 * (wgmma, bf16 in, fp32 accumulate; sm_90a). Why in house: cuBLAS's grouped GEMM runs only the
 * K-major x K-major problems (the MoE forward) as one grouped kernel; the backward's problems
 * (an N-major weight, or both operands token-major for the weight gradients) ran as one kernel
 * per expert, ~1,300 launches of ~8 us in one 30B-A3B layer's backward.
 *
 * Two forms, the same sums: each output's K range runs in one fixed order, 16 at a time, into
 * one fp32 accumulator, so a problem gives the same values in either (bench_moe measured the
 * two within 1e-5 at 30B-A3B dims).
 *   The TMA form (launches whose problems are all wider than 128 columns, with beta 0 or, in
 *   fp32, 1: the experts' own GEMMs): 128 x 256 tiles, a persistent block an SM, a producer
 *   warpgroup issuing TMA loads from per-problem tensor maps into a 4-stage mbarrier ring, two
 *   consumer warpgroups on m64n256k16, the tile stored (or added) by TMA; below.
 *   The cp.async form (any width; the adapters' rank-wide problems): a block owns a 128 x 128
 *   tile of one problem and walks its K range 64 deep at a time through a 3-stage cp.async
 *   ring; two blocks share an SM (128 registers a thread, 97 KB of shared memory each).
 * An operand's tile sits in shared memory in its own layout, swizzled as wgmma.cuh says
 * (K-major: rows of 64 k; MN-major: 64 k-rows of 64-column blocks), and the MN-major ones reach
 * the MMA through the instruction's transpose flag. Blocks map to tiles through the problems'
 * first-tile offsets (a binary search over at most a few hundred problems); a problem's tiles
 * are consecutive, m-major. Measured and dropped on the way to the cp.async form (one H200,
 * bench_moe 9216): an mma.sync form (128 x 128 x 32 tiles, ldmatrix.trans for the MN-major
 * operands), a 4-stage ring at one block an SM, and a cp.async warp-specialised persistent form. */
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm_grouped.cuh"
#include "kernels/wgmma.cuh"

enum { GG_BM = 128, GG_BN = 128, GG_BK = 64, GG_NS = 3, GG_NT = 256, GG_TILE = GG_BM * GG_BK * 2, GG_DST = GG_BN + 4 };
static const int GG_SMEM = GG_NS * 2 * GG_TILE + 1024; /* + room to align the ring to 1024 bytes */
static_assert(GG_BM * GG_DST * 4 <= GG_NS * 2 * GG_TILE, "the fp32 tile staged in the ring");

/* one operand's 128 x 64 tile at (r0, k0) into the swizzled tile s: K-major as 128 rows of one
 * column block, MN-major as 64 k-rows of two; rows past R and k past K are zero */
template <int KMAJ, int NTH = GG_NT>
__device__ __forceinline__ void gg_load(unsigned char *s, const bf16 *g, int ld, int r0, int R, int k0, int K) {
#pragma unroll
    for (int i = 0; i < GG_BM * GG_BK / 8 / NTH; i++) {
        int ch = threadIdx.x % NTH + i * NTH;
        if (KMAJ) {
            int row = ch >> 3, c = ch & 7, r = r0 + row, k = k0 + c * 8;
            bool ok = r < R && k < K;
            fa_cp16((bf16 *)(s + wg_off<GG_BM>(row, c)), ok ? g + (size_t)r * ld + k : g, ok);
        } else {
            int row = ch >> 4, c = ch & 15, k = k0 + row, r = r0 + c * 8;
            bool ok = r < R && k < K;
            fa_cp16((bf16 *)(s + wg_off<GG_BK>(row, c)), ok ? g + (size_t)k * ld + r : g, ok);
        }
    }
}

/* the problem of tile t (BM x BN tiles) and the tile's first row and column */
template <int BM = GG_BM, int BN = GG_BN>
__device__ __forceinline__ const gg_prob *gg_find(const gg_prob *probs, int np, int t, int &m0, int &n0) {
    int lo = 0, hi = np - 1;
    while (lo < hi) { /* the last problem whose first tile is <= t */
        int mid = (lo + hi + 1) >> 1;
        if (probs[mid].tile0 <= t) lo = mid;
        else hi = mid - 1;
    }
    int local = t - probs[lo].tile0;
    m0 = (local / probs[lo].tiles_n) * BM, n0 = (local % probs[lo].tiles_n) * BN;
    return probs + lo;
}

/* The tile's accumulators (warpgroup wg: rows 64 wg + 16 (warp % 4) + lane / 4 and + 8, columns
 * 8 j + 2 (lane % 4) + {0, 1}) into D at (m0, n0). D = acc directly, as bf16 or fp32; D = acc +
 * beta D staged through shared memory (the ring, free once the last MMA is done), so that the
 * read-modify-write runs as whole 512-byte rows with 16 loads in flight a thread (stored
 * directly, each float2 load waited for before the next store, the weight gradients' epilogue
 * took twice the MMAs' time). */
template <int F32>
__device__ __forceinline__ void gg_store(const gg_prob &p, const float (&acc)[16][4], unsigned char *ring, int m0, int n0) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = warp >> 2, rw = wg * 64 + (warp & 3) * 16 + (lane >> 2);
    if (F32 && p.beta != 0.0f) {
        float *st = (float *)ring;
        __syncthreads(); /* every warpgroup's MMAs are done with the ring */
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int j = 0; j < 16; j++)
                *(float2 *)(st + (rw + h * 8) * GG_DST + j * 8 + (lane & 3) * 2) = make_float2(acc[j][2 * h], acc[j][2 * h + 1]);
        __syncthreads();
        constexpr int RS = GG_NT / 32; /* rows a pass: a warp a row, a lane 4 columns */
        int col = n0 + lane * 4;
        if (col >= p.n) return;
        float4 old[GG_BM / RS];
#pragma unroll
        for (int i = 0; i < GG_BM / RS; i++) {
            int r = m0 + warp + i * RS;
            if (r < p.m) old[i] = *(const float4 *)((const float *)p.d + (size_t)r * p.ldd + col);
        }
#pragma unroll
        for (int i = 0; i < GG_BM / RS; i++) {
            int r = m0 + warp + i * RS;
            if (r >= p.m) continue;
            float4 v = *(const float4 *)(st + (warp + i * RS) * GG_DST + lane * 4);
            v.x += p.beta * old[i].x, v.y += p.beta * old[i].y, v.z += p.beta * old[i].z, v.w += p.beta * old[i].w;
            *(float4 *)((float *)p.d + (size_t)r * p.ldd + col) = v;
        }
        return;
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int r = m0 + rw + h * 8;
        if (r >= p.m) continue;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            int col = n0 + j * 8 + (lane & 3) * 2;
            if (col >= p.n) continue;
            size_t o = (size_t)r * p.ldd + col;
            if (F32) *(float2 *)((float *)p.d + o) = make_float2(acc[j][2 * h], acc[j][2 * h + 1]);
            else *(__nv_bfloat162 *)((bf16 *)p.d + o) = __floats2bfloat162_rn(acc[j][2 * h], acc[j][2 * h + 1]);
        }
    }
}

/* A warpgroup's descriptor of its 64 rows of A (wg 0 or 1), of B's 128 columns, and their k16
 * steps */
template <int KMAJ> __device__ __forceinline__ unsigned long long gg_desc_a(const unsigned char *s, int wg) {
    return KMAJ ? wg_desc_k(s + wg * 64 * 128) : wg_desc_mn<GG_BK>(s + wg * GG_BK * 128);
}
template <int KMAJ> __device__ __forceinline__ unsigned long long gg_desc_b(const unsigned char *s) {
    return KMAJ ? wg_desc_k(s) : wg_desc_mn<GG_BK>(s);
}
template <int KMAJ> __device__ __forceinline__ unsigned gg_step(int kk) { return KMAJ ? wg_step_k<GG_BM>(kk) : wg_step_mn(kk); }

/* 8 warps: two warpgroups of 64 rows each, all threads loading. The ring: tile kt in stage
 * kt % 3, loaded one tile ahead; a warpgroup keeps one tile's MMAs in flight (wait 1), so after
 * the barrier of step kt no MMA reads stage (kt + 1) % 3 any more. */
template <int AK, int BK, int F32>
__global__ void __launch_bounds__(GG_NT, 2) gemm_grouped_kernel(const gg_prob *__restrict__ probs, int np) {
    extern __shared__ __align__(1024) unsigned char gg_smem[];
    unsigned char *sm = gg_smem + ((1024 - (fa_smem(gg_smem) & 1023)) & 1023);
    int m0, n0;
    const gg_prob *pp = gg_find(probs, np, blockIdx.x, m0, n0); /* read in place: sources by index stay in memory */
    const int M = pp->m, N = pp->n, ns = pp->ns;
    int wg = (threadIdx.x >> 5) >> 2;
    float acc[16][4];
#pragma unroll
    for (int j = 0; j < 16; j++)
#pragma unroll
        for (int r = 0; r < 4; r++) acc[j][r] = 0.0f;
    int nk = 0;
    for (int i = 0; i < ns; i++) nk += (pp->s[i].k + GG_BK - 1) / GG_BK;
    auto load = [&](int st, int kt) { /* K tile kt of the products one after another */
                                      int i = 0, nt;
                                      while (kt >= (nt = (pp->s[i].k + GG_BK - 1) / GG_BK)) kt -= nt, i++;
                                      const gg_src *q = &pp->s[i];
                                      gg_load<AK>(sm + 2 * st * GG_TILE, q->a, q->lda, m0, M, kt * GG_BK, q->k);
                                      gg_load<BK>(sm + (2 * st + 1) * GG_TILE, q->b, q->ldb, n0, N, kt * GG_BK, q->k);
    };
#pragma unroll
    for (int s = 0; s < GG_NS - 2; s++) {
        if (s < nk) load(s, s);
        fa_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        fa_wait<GG_NS - 3>();
        wg_proxy_fence();
        __syncthreads();
        int pf = kt + GG_NS - 2;
        if (pf < nk) load(pf % GG_NS, pf);
        fa_commit();
        const unsigned char *sa = sm + 2 * (kt % GG_NS) * GG_TILE, *sb = sa + GG_TILE;
        unsigned long long da = gg_desc_a<AK>(sa, wg), db = gg_desc_b<BK>(sb);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < GG_BK / 16; kk++) wg_mma_ss128<!AK, !BK>(acc, da + gg_step<AK>(kk), db + gg_step<BK>(kk), 1);
        wg_commit();
        wg_wait<1>();
    }
    wg_wait<0>();
    wg_keep(acc);
    fa_wait<0>();
    gg_store<F32>(*pp, acc, sm, m0, n0);
}

/* The TMA form: 128 x 256 tiles 64 deep, a persistent block an SM walking tiles blockIdx.x,
 * + gridDim.x, ... Warpgroup 0 is the producer (40 registers): one thread loads each K tile of
 * A (128 x 64) and B (256 x 64) with TMA (the problem's tensor maps; edges arrive as zeros)
 * into a 4-stage ring of 48 KB stages, signalling "full"; warpgroups 1 and 2 (232 registers)
 * each own 64 rows x 256 columns (one m64n256k16 accumulator, 128 registers a thread), wait
 * "full", run the stage's MMAs, and release the stage before ("empty") once the MMAs of the
 * next stage are issued. The epilogue goes out by TMA stores (gw_store_tma), as the producer
 * already fills the next tile's stages and the warpgroup starts on them. Beside
 * this one in one call (a GPU shared with other jobs, so within its noise): 3 stages, two
 * m64n128k16 a k step, a block a tile instead of persistent blocks, none faster. */
enum {
    GW_BM = 128,
    GW_BN = 256,
    GW_BK = 64,
    GW_NS = 4,
    GW_NT = 384,
    GW_A = GW_BM * GW_BK * 2,
    GW_B = GW_BN * GW_BK * 2,
    GW_STAGE = GW_A + GW_B,
    GG_MAP = 128
};
/* + the TMA-store epilogue's staging: two 8 KB boxes a consumer warpgroup */
enum { GW_BOX = 8192, GW_EPI = 2 * 2 * GW_BOX };
static const int GW_SMEM = GW_NS * GW_STAGE + GW_EPI + 1024 + 2 * GW_NS * 8;

/* TMA stores of a staged box (64 rows x 128 bytes, 128-byte swizzle) at (c0 inner, c1 outer)
 * of map m: written, or added to what is there (fp32: D + box in L2, one add an element) */
__device__ __forceinline__ void tma_store_2d(const void *m, const void *src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(m), "r"(c0), "r"(c1),
                 "r"(fa_smem(src))
                 : "memory");
}
__device__ __forceinline__ void tma_add_2d(const void *m, const void *src, int c0, int c1) {
    asm volatile("cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(m),
                 "r"(c0), "r"(c1), "r"(fa_smem(src))
                 : "memory");
}
__device__ __forceinline__ void tma_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/* until at most N of this thread's store groups still read shared memory / are not yet done */
template <int N> __device__ __forceinline__ void tma_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N> __device__ __forceinline__ void tma_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
/* the 128 threads of consumer warpgroup cw (named barriers 1 and 2) */
__device__ __forceinline__ void gw_bar(int cw) { asm volatile("bar.sync %0, 128;\n" ::"r"(cw + 1) : "memory"); }

/* The epilogue by TMA stores: the warpgroup's 64 x 256 accumulator goes out in boxes of 64 rows
 * x 128 bytes (fp32: 8 boxes of 32 columns, bf16: 4 of 64), each written into one of two
 * staging buffers (128-byte swizzle: 16-byte chunk q of row r at chunk q ^ (r % 8)) and stored
 * by the warpgroup's first thread, or added (beta 1: fp32 D + acc in L2, the sum the register
 * epilogue computes) while the warpgroup goes on to its next tile. The map clips rows past m
 * and columns past n. A buffer is written again once its store two boxes before has read it. */
template <int F32>
__device__ __forceinline__ void gw_store_tma(const CUtensorMap *dm, int add, const float (&acc)[32][4], unsigned char *stg,
                                             int cw, int m0, int n0) {
    constexpr int CB = F32 ? 32 : 64, NB = 256 / CB, JB = CB / 8; /* columns a box, boxes, accumulator blocks a box */
    const int t = threadIdx.x & 127, lane = t & 31, r = (t >> 5) * 16 + (lane >> 2);
#pragma unroll
    for (int b = 0; b < NB; b++) {
        unsigned char *buf = stg + (b & 1) * GW_BOX;
        if (t == 0) tma_wait_read<1>();
        gw_bar(cw);
#pragma unroll
        for (int j = 0; j < JB; j++) {
            int col = j * 8 + (lane & 3) * 2; /* within the box */
#pragma unroll
            for (int hr = 0; hr < 2; hr++) {
                int row = r + hr * 8, byte = col * (F32 ? 4 : 2);
                unsigned char *d = buf + row * 128 + ((((byte >> 4) ^ (row & 7)) << 4) | (byte & 15));
                float x = acc[b * JB + j][2 * hr], y = acc[b * JB + j][2 * hr + 1];
                if (F32) *(float2 *)d = make_float2(x, y);
                else *(__nv_bfloat162 *)d = __floats2bfloat162_rn(x, y);
            }
        }
        wg_proxy_fence();
        gw_bar(cw);
        if (t == 0) {
            if (add) tma_add_2d(dm, buf, n0 + b * CB, m0);
            else tma_store_2d(dm, buf, n0 + b * CB, m0);
            tma_commit();
        }
    }
}

template <int AK, int BK, int F32>
__global__ void __launch_bounds__(GW_NT, 1) gemm_grouped_tma_kernel(const gg_prob *__restrict__ probs, const CUtensorMap *maps,
                                                                    const CUtensorMap *dmaps, int np, int tiles) {
    extern __shared__ __align__(1024) unsigned char gg_smem[];
    unsigned char *sm = gg_smem + ((1024 - (fa_smem(gg_smem) & 1023)) & 1023);
    unsigned long long *full = (unsigned long long *)(sm + GW_NS * GW_STAGE + GW_EPI), *empty = full + GW_NS;
    const int wg = threadIdx.x >> 7;
    if (threadIdx.x == 0) {
        for (int s = 0; s < GW_NS; s++) mb_init(&full[s], 1), mb_init(&empty[s], 2 * 128);
        mb_init_fence();
    }
    __syncthreads();
    int s = 0;
    unsigned ph = 0;
    if (wg == 0) { /* the producer */
        wg_regs_dec<40>();
        if (threadIdx.x != 0) return;
        for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
            int m0, n0;
            const gg_prob *pp = gg_find<GW_BM, GW_BN>(probs, np, t, m0, n0);
            const CUtensorMap *pm = maps + (size_t)(pp - probs) * GG_SRC * 2;
            for (int i = 0; i < pp->ns; i++) {
                const CUtensorMap *ma = pm + 2 * i, *mb = ma + 1;
                tma_map_acquire(ma);
                tma_map_acquire(mb);
                for (int k0 = 0; k0 < pp->s[i].k; k0 += GW_BK) {
                    mb_wait(&empty[s], ph ^ 1);
                    unsigned char *sa = sm + s * GW_STAGE, *sb = sa + GW_A;
                    mb_expect(&full[s], GW_STAGE);
                    if (AK) tma_load_2d(sa, ma, k0, m0, &full[s]);
                    else
#pragma unroll
                        for (int j = 0; j < GW_BM / 64; j++)
                            tma_load_2d(sa + j * (GW_A * 64 / GW_BM), ma, m0 + 64 * j, k0, &full[s]);
                    if (BK) tma_load_2d(sb, mb, k0, n0, &full[s]);
                    else
#pragma unroll
                        for (int j = 0; j < GW_BN / 64; j++)
                            tma_load_2d(sb + j * (GW_B * 64 / GW_BN), mb, n0 + 64 * j, k0, &full[s]);
                    if (++s == GW_NS) s = 0, ph ^= 1;
                }
            }
        }
        return;
    }
    wg_regs_inc<232>();
    const int cw = wg - 1;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        int m0, n0;
        const gg_prob *pp = gg_find<GW_BM, GW_BN>(probs, np, t, m0, n0);
        float acc[32][4];
#pragma unroll
        for (int j = 0; j < 32; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[j][r] = 0.0f;
        int nk = 0, prev = -1;
        for (int i = 0; i < pp->ns; i++) nk += (pp->s[i].k + GW_BK - 1) / GW_BK;
        for (int kt = 0; kt < nk; kt++) {
            mb_wait(&full[s], ph);
            const unsigned char *sa = sm + s * GW_STAGE, *sb = sa + GW_A;
            unsigned long long da = gg_desc_a<AK>(sa, cw), db = gg_desc_b<BK>(sb);
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < GW_BK / 16; kk++) wg_mma_ss256<!AK, !BK>(acc, da + gg_step<AK>(kk), db + gg_step<BK>(kk), 1);
            wg_commit();
            wg_wait<1>();
            if (prev >= 0) mb_arrive(&empty[prev]);
            prev = s;
            if (++s == GW_NS) s = 0, ph ^= 1;
        }
        wg_wait<0>();
        wg_keep(acc);
        if (prev >= 0) mb_arrive(&empty[prev]);
        const CUtensorMap *dm = dmaps + (pp - probs);
        tma_map_acquire(dm);
        gw_store_tma<F32>(dm, F32 && pp->beta != 0.0f, acc, sm + GW_NS * GW_STAGE + cw * 2 * GW_BOX, cw, m0 + 64 * cw, n0);
    }
    if ((threadIdx.x & 127) == 0) tma_wait<0>(); /* the stores done before the block ends */
}

/* cuTensorMapEncodeTiled through the runtime (no link to the driver library); NULL where the
 * driver has none */
static PFN_cuTensorMapEncodeTiled_v12000 gw_encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void *f = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            f = NULL;
        return (PFN_cuTensorMapEncodeTiled_v12000)f;
    }();
    return fn;
}

/* a bf16 matrix of `outer` rows of `inner` contiguous elements, ld apart, read in boxes of
 * 64 x box_outer with the 128-byte swizzle wgmma.cuh's tiles use */
static int gw_map(PFN_cuTensorMapEncodeTiled_v12000 enc, CUtensorMap *m, const void *p, int inner, int outer, int ld,
                  int box_outer) {
    /* box_outer < 0: an output, 64 rows of 128 bytes (gw_store_tma), fp32 (-1) or bf16 (-2) */
    int f32 = box_outer == -1, es = f32 ? 4 : 2;
    cuuint64_t dim[2] = {(cuuint64_t)inner, (cuuint64_t)outer}, stride[1] = {(cuuint64_t)ld * es};
    cuuint32_t box[2] = {(cuuint32_t)(128 / es), (cuuint32_t)(box_outer < 0 ? 64 : box_outer)}, estr[2] = {1, 1};
    return enc(m, f32 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)p, dim, stride, box, estr,
               CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

typedef void (*gw_kernel_fn)(const gg_prob *, const CUtensorMap *, const CUtensorMap *, int, int);
static gw_kernel_fn gw_pick(gg_layout l) {
    static const gw_kernel_fn k[8] = {gemm_grouped_tma_kernel<0, 0, 0>, gemm_grouped_tma_kernel<0, 0, 1>,
                                      gemm_grouped_tma_kernel<0, 1, 0>, gemm_grouped_tma_kernel<0, 1, 1>,
                                      gemm_grouped_tma_kernel<1, 0, 0>, gemm_grouped_tma_kernel<1, 0, 1>,
                                      gemm_grouped_tma_kernel<1, 1, 0>, gemm_grouped_tma_kernel<1, 1, 1>};
    return k[(l.a_kmaj ? 4 : 0) + (l.b_kmaj ? 2 : 0) + (l.d_f32 ? 1 : 0)];
}

/* The host state a context keeps between launches (c->gg_host, its thread only):
 *   kept maps: an open-addressed table of encoded tensor maps by their arguments, for the
 *     operands marked kept (the experts' weights: the same maps every launch, layer and group);
 *     an entry is the map encoding its key would give, so a hit is exact; emptied when 3/4 full;
 *   staging: a ring of pinned buffers the problems (and maps) are written to and copied from, so
 *     that the copy is queued without staging through pageable memory; a buffer is written again
 *     once the event after its copy has passed (a launch or more later).
 * Before (measured in the twentieth session's call): every launch encoded all of its maps,
 * allocated, cleared and freed a pageable buffer and copied from it. */
enum { GW_KEEP = 1 << 15, GW_RING = 8 };
typedef struct {
    const void *p;
    int inner, outer, ld, box;
} gw_key;
typedef struct {
    gw_key k;
    int used;
    CUtensorMap m;
} gw_entry;
typedef struct {
    gw_entry *keep;
    int n_keep;
    unsigned char *stage[GW_RING];
    size_t stage_bytes[GW_RING];
    cudaEvent_t done[GW_RING];
    int next;
} gw_host;

void gemm_grouped_free(cu_ctx *c) {
    gw_host *h = (gw_host *)c->gg_host;
    if (!h) return;
    for (int i = 0; i < GW_RING; i++) {
        if (h->done[i]) cudaEventSynchronize(h->done[i]), cudaEventDestroy(h->done[i]);
        if (h->stage[i]) cudaFreeHost(h->stage[i]);
    }
    free(h->keep);
    free(h);
    c->gg_host = NULL;
}

static gw_host *gw_state(cu_ctx *c) {
    if (!c->gg_host) {
        gw_host *h = (gw_host *)calloc(1, sizeof *h);
        if (h && !(h->keep = (gw_entry *)calloc(GW_KEEP, sizeof *h->keep))) free(h), h = NULL;
        if (!h) cu_fail(c, "calloc(gemm_grouped host state)", "out of host memory", __FILE__, __LINE__);
        c->gg_host = h;
    }
    return (gw_host *)c->gg_host;
}

/* a pinned staging buffer of at least `bytes` whose last copy is done; NULL on failure. *slot
 * is its ring index (gw_staged records its copy). */
static unsigned char *gw_stage(cu_ctx *c, size_t bytes, int *slot) {
    gw_host *h = gw_state(c);
    if (!h) return NULL;
    int i = h->next;
    h->next = (i + 1) % GW_RING;
    if (!h->done[i]) CU_CK(c, cudaEventCreateWithFlags(&h->done[i], cudaEventDisableTiming));
    else CU_CK(c, cudaEventSynchronize(h->done[i]));
    if (!c->failed && h->stage_bytes[i] < bytes) {
        if (h->stage[i]) CU_CK(c, cudaFreeHost(h->stage[i]));
        h->stage[i] = NULL, h->stage_bytes[i] = 0;
        size_t n = (bytes + (1u << 16) - 1) & ~(size_t)((1u << 16) - 1);
        CU_CK(c, cudaHostAlloc((void **)&h->stage[i], n, cudaHostAllocDefault));
        if (!c->failed) h->stage_bytes[i] = n;
    }
    *slot = i;
    return c->failed ? NULL : h->stage[i];
}
/* the copy of `bytes` from staging slot `slot` to dev, queued, and the slot's event after it */
static void gw_staged(cu_ctx *c, int slot, void *dev, size_t bytes) {
    gw_host *h = (gw_host *)c->gg_host;
    CU_CK(c, cudaMemcpyAsync(dev, h->stage[slot], bytes, cudaMemcpyHostToDevice, c->stream));
    CU_CK(c, cudaEventRecord(h->done[slot], c->stream));
}

/* gw_map through the kept maps when keep (a weight), else encoded */
static int gw_map_kept(cu_ctx *c, PFN_cuTensorMapEncodeTiled_v12000 enc, CUtensorMap *m, const void *p, int inner, int outer,
                       int ld, int box, int keep) {
    gw_host *h = keep ? gw_state(c) : NULL;
    if (!h) return gw_map(enc, m, p, inner, outer, ld, box);
    gw_key k = {p, inner, outer, ld, box};
    unsigned long long x = (unsigned long long)(uintptr_t)p * 0x9E3779B97F4A7C15ull;
    x ^= ((unsigned long long)(unsigned)inner << 32 | (unsigned)outer) * 0xC2B2AE3D27D4EB4Full;
    x ^= ((unsigned long long)(unsigned)ld << 32 | (unsigned)box) * 0x165667B19E3779F9ull;
    unsigned i = (unsigned)((x ^ (x >> 29)) & (GW_KEEP - 1));
    for (;; i = (i + 1) & (GW_KEEP - 1)) {
        gw_entry *e = &h->keep[i];
        if (!e->used) break;
        if (!memcmp(&e->k, &k, sizeof k)) {
            *m = e->m;
            return 1;
        }
    }
    if (!gw_map(enc, m, p, inner, outer, ld, box)) return 0;
    if (h->n_keep >= GW_KEEP / 4 * 3) { /* full: start again (the next launches refill it) */
        memset(h->keep, 0, GW_KEEP * sizeof *h->keep);
        h->n_keep = 0;
        return 1;
    }
    gw_entry *e = &h->keep[i];
    memset(&e->k, 0, sizeof e->k); /* the key's padding too: keys compare by bytes */
    e->k = k, e->used = 1, e->m = *m;
    h->n_keep++;
    return 1;
}

/* The launch in the TMA form; 0 (nothing queued) where it does not apply: a problem 128
 * columns wide or less, no encoder, a map the driver refuses. */
static int gw_run(cu_ctx *c, gg_prob *p, int np, gg_layout l, void *dev) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = gw_encoder();
    if (!enc) return 0;
    for (int i = 0; i < np; i++) /* the epilogue stores D or adds to it: beta 0, or 1 in fp32 */
        if (p[i].n <= GG_BN || (p[i].beta != 0.0f && !(l.d_f32 && p[i].beta == 1.0f))) return 0;
    size_t mb = (size_t)np * (GG_SRC * 2 + 1) * GG_MAP, bytes = mb + (size_t)np * sizeof(gg_prob);
    int slot;
    unsigned char *h = gw_stage(c, bytes, &slot);
    if (!h) return 0;
    CUtensorMap *maps = (CUtensorMap *)h;
    int ok = 1;
    long long tiles = 0;
    for (int i = 0; i < np && ok; i++) {
        for (int j = 0; j < p[i].ns && ok; j++) {
            const gg_src *q = &p[i].s[j];
            CUtensorMap *m = maps + ((size_t)i * GG_SRC + j) * 2;
            int ka = q->kept & 1, kb = q->kept & 2;
            ok = (l.a_kmaj ? gw_map_kept(c, enc, m, q->a, q->k, p[i].m, q->lda, GW_BM, ka)
                           : gw_map_kept(c, enc, m, q->a, p[i].m, q->k, q->lda, 64, ka)) &&
                (l.b_kmaj ? gw_map_kept(c, enc, m + 1, q->b, q->k, p[i].n, q->ldb, GW_BN, kb)
                          : gw_map_kept(c, enc, m + 1, q->b, p[i].n, q->k, q->ldb, 64, kb));
        }
        if (ok)
            ok = gw_map_kept(c, enc, maps + (size_t)np * GG_SRC * 2 + i, p[i].d, p[i].n, p[i].m, p[i].ldd, l.d_f32 ? -1 : -2,
                             p[i].d_kept);
        p[i].tiles_n = (p[i].n + GW_BN - 1) / GW_BN;
        p[i].tile0 = (int)tiles;
        tiles += (long long)((p[i].m + GW_BM - 1) / GW_BM) * p[i].tiles_n;
    }
    if (!ok || tiles > 0x7fffffff) return 0;
    memcpy(h + mb, p, (size_t)np * sizeof(gg_prob));
    if (tiles > 0) {
        gw_staged(c, slot, dev, bytes);
        gw_kernel_fn k = gw_pick(l);
        CU_CK(c, cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, GW_SMEM));
        if (!c->failed) {
            int grid = c->n_sm > 0 && c->n_sm < tiles ? c->n_sm : (int)tiles;
            const CUtensorMap *dm = (const CUtensorMap *)dev + (size_t)np * GG_SRC * 2;
            k<<<grid, GW_NT, GW_SMEM, c->stream>>>((const gg_prob *)((char *)dev + mb), (const CUtensorMap *)dev, dm, np,
                                                   (int)tiles);
            CU_LAUNCHED(c, "gemm_grouped_tma_kernel");
        }
    }
    return 1;
}

static int gg_al16(const void *p) { return !((uintptr_t)p & 15); }

int gemm_grouped_fits(const gg_prob *p, gg_layout l) {
    int ok = p->ns >= 1 && p->ns <= GG_SRC && p->ldd % 8 == 0 && p->n % 8 == 0 && gg_al16(p->d) && (l.d_f32 || p->beta == 0.0f);
    for (int i = 0; i < p->ns && ok; i++) {
        const gg_src *q = &p->s[i];
        int ca = l.a_kmaj ? q->k : p->m, cb = l.b_kmaj ? q->k : p->n;
        ok = ca % 8 == 0 && cb % 8 == 0 && q->lda % 8 == 0 && q->ldb % 8 == 0 && gg_al16(q->a) && gg_al16(q->b);
    }
    return ok;
}

typedef void (*gg_kernel_fn)(const gg_prob *, int);
static gg_kernel_fn gg_pick(gg_layout l) {
    static const gg_kernel_fn k[8] = {gemm_grouped_kernel<0, 0, 0>, gemm_grouped_kernel<0, 0, 1>, gemm_grouped_kernel<0, 1, 0>,
                                      gemm_grouped_kernel<0, 1, 1>, gemm_grouped_kernel<1, 0, 0>, gemm_grouped_kernel<1, 0, 1>,
                                      gemm_grouped_kernel<1, 1, 0>, gemm_grouped_kernel<1, 1, 1>};
    return k[(l.a_kmaj ? 4 : 0) + (l.b_kmaj ? 2 : 0) + (l.d_f32 ? 1 : 0)];
}

void gemm_grouped_cuda(cu_ctx *c, gg_prob *p, int np, gg_layout l, void *dev) {
    if (c->failed || np <= 0 || gw_run(c, p, np, l, dev)) return;
    long long tiles = 0;
    for (int i = 0; i < np; i++) {
        p[i].tiles_n = (p[i].n + GG_BN - 1) / GG_BN;
        p[i].tile0 = (int)tiles;
        tiles += (long long)((p[i].m + GG_BM - 1) / GG_BM) * p[i].tiles_n;
    }
    if (tiles == 0) return;
    if (tiles > 0x7fffffff) {
        cu_fail(c, "gemm_grouped", "too many tiles", __FILE__, __LINE__);
        return;
    }
    size_t bytes = (size_t)np * sizeof(gg_prob);
    int slot;
    unsigned char *h = gw_stage(c, bytes, &slot);
    if (!h) return;
    memcpy(h, p, bytes);
    gw_staged(c, slot, dev, bytes);
    gg_kernel_fn k = gg_pick(l);
    CU_CK(c, cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, GG_SMEM));
    if (c->failed) return;
    k<<<(unsigned)tiles, GG_NT, GG_SMEM, c->stream>>>((const gg_prob *)dev, np);
    CU_LAUNCHED(c, "gemm_grouped_kernel");
}
