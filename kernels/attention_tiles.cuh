/* attention_tiles.cuh — what the tensor-core attention kernels share: the two-range tile
 * schedule (fa_sched, fa_next, fa_warp_vote, fa_mask), the row stores and row scalars, and the
 * tile constants. __device__ inline functions, templates and
 * constants only (no kernels): included by attention_mma.cu, attention_wgmma.cu,
 * attention_decode.cu, and by attention.cu for the constants. How the helpers are used is told
 * at the top of attention_mma.cu.
 * The mma.sync / ldmatrix / cp.async wrappers themselves are kernels/mma.cuh's.
 * Legend: T queries (== key rows in backward), H query heads, K kv heads, D head dim. */
#ifndef GRPOD_KERNELS_ATTENTION_TILES_CUH
#define GRPOD_KERNELS_ATTENTION_TILES_CUH
#include <limits.h>

#include "kernels/attention.cuh"
#include "kernels/mma.cuh"

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define FULL 0xffffffffu

typedef __nv_bfloat162 bf162;

/* dkdv's key block (wgmma; mma.sync at D 64) and the query tile every dkdv walks; the mma.sync
 * kernels' other tile shapes, per head dim, are attention_mma.cu's fa_cfg. */
enum { FA_BK = ATTN_FLASH_BK, FA_Q = 64 };

__device__ __forceinline__ float fa_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ unsigned fa_pack(float lo, float hi) {
    bf162 v = __floats2bfloat162_rn(lo, hi);
    return *(unsigned *)&v;
}

/* a: the warp's first row; b: the tile's first row. */
template <int MR, int NT, int KD>
__device__ __forceinline__ void mma_abt(float (&acc)[MR][NT][4], const bf16 *a, const bf16 *b, int st) {
    int lane = threadIdx.x & 31, m = lane >> 3, rr = lane & 7;
#pragma unroll
    for (int kk = 0; kk < KD / 16; kk++) {
        unsigned af[MR][4];
#pragma unroll
        for (int mi = 0; mi < MR; mi++) fa_ldsm4(af[mi], a + (mi * 16 + (lane & 15)) * st + kk * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int n = 0; n < NT; n += 2) {
            unsigned bf[4];
            fa_ldsm4(bf, b + (n * 8 + (m >> 1) * 8 + rr) * st + kk * 16 + (m & 1) * 8);
#pragma unroll
            for (int mi = 0; mi < MR; mi++) {
                fa_mma(acc[mi][n], af[mi], bf[0], bf[1]);
                fa_mma(acc[mi][n + 1], af[mi], bf[2], bf[3]);
            }
        }
    }
}

template <int MR, int KB, int ND>
__device__ __forceinline__ void mma_pb(float (&acc)[MR][ND][4], const float (&p)[MR][2 * KB][4], const bf16 *b, int st) {
    int lane = threadIdx.x & 31, m = lane >> 3, rr = lane & 7;
#pragma unroll
    for (int kb = 0; kb < KB; kb++) {
        unsigned af[MR][4];
#pragma unroll
        for (int mi = 0; mi < MR; mi++) {
            af[mi][0] = fa_pack(p[mi][2 * kb][0], p[mi][2 * kb][1]);
            af[mi][1] = fa_pack(p[mi][2 * kb][2], p[mi][2 * kb][3]);
            af[mi][2] = fa_pack(p[mi][2 * kb + 1][0], p[mi][2 * kb + 1][1]);
            af[mi][3] = fa_pack(p[mi][2 * kb + 1][2], p[mi][2 * kb + 1][3]);
        }
#pragma unroll
        for (int n = 0; n < ND; n += 2) {
            unsigned bf[4];
            fa_ldsm4t(bf, b + (kb * 16 + (m & 1) * 8 + rr) * st + n * 8 + (m >> 1) * 8);
#pragma unroll
            for (int mi = 0; mi < MR; mi++) {
                fa_mma(acc[mi][n], af[mi], bf[0], bf[1]);
                fa_mma(acc[mi][n + 1], af[mi], bf[2], bf[3]);
            }
        }
    }
}

template <int MR, int NT> __device__ __forceinline__ void fa_zero(float (&a)[MR][NT][4]) {
#pragma unroll
    for (int mi = 0; mi < MR; mi++)
#pragma unroll
        for (int n = 0; n < NT; n++) a[mi][n][0] = a[mi][n][1] = a[mi][n][2] = a[mi][n][3] = 0;
}

/* One warp's step over a tile of 8 NT keys for its 16 rows (two a thread: lane / 4 and + 8):
 * sa holds the raw scores Q·K^T; keep(n, e, hf) says whether key 8n + 2 (lane % 4) + e counts
 * for the thread's row hf (else its score becomes -inf). Updates the running max m (raw units)
 * and the thread-partial sum l (log2 domain, scale sc2), rescales o and adds P·V (vs: the tile's
 * V rows, stride st). NOOP (attention_exact.cu): a row with no key kept leaves m, l and o
 * unchanged bit for bit — its correction is exactly 1 when the max did not move (m sc2 - u may
 * be contracted into an fma, which leaves m sc2's rounding error, and exp2 of it is not 1), and
 * P = 0 adds exact zeros. attention_decode.cu (NOOP false) and attention_exact.cu. */
template <int NT, int D, bool NOOP, typename Keep>
__device__ __forceinline__ void fa_tile_step(float (&o)[1][D / 8][4], float (&sa)[1][NT][4], float (&m)[2], float (&l)[2],
                                             float sc2, const bf16 *vs, int st, Keep keep) {
    float mx0 = m[0], mx1 = m[1];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            if (!keep(n, e, 0)) sa[0][n][e] = -INFINITY;
            if (!keep(n, e, 1)) sa[0][n][2 + e] = -INFINITY;
            mx0 = fmaxf(mx0, sa[0][n][e]);
            mx1 = fmaxf(mx1, sa[0][n][2 + e]);
        }
    mx0 = fmaxf(mx0, __shfl_xor_sync(FULL, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(FULL, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(FULL, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(FULL, mx1, 2));
    float u0 = mx0 == -INFINITY ? 0.0f : mx0 * sc2, u1 = mx1 == -INFINITY ? 0.0f : mx1 * sc2;
    float c0 = fa_ex2(m[0] * sc2 - u0), c1 = fa_ex2(m[1] * sc2 - u1);
    if (NOOP) {
        c0 = mx0 == m[0] ? 1.0f : c0;
        c1 = mx1 == m[1] ? 1.0f : c1;
    }
    m[0] = mx0;
    m[1] = mx1;
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        sa[0][n][0] = fa_ex2(fmaf(sa[0][n][0], sc2, -u0));
        sa[0][n][1] = fa_ex2(fmaf(sa[0][n][1], sc2, -u0));
        sa[0][n][2] = fa_ex2(fmaf(sa[0][n][2], sc2, -u1));
        sa[0][n][3] = fa_ex2(fmaf(sa[0][n][3], sc2, -u1));
        s0 += sa[0][n][0] + sa[0][n][1];
        s1 += sa[0][n][2] + sa[0][n][3];
    }
    l[0] = l[0] * c0 + s0;
    l[1] = l[1] * c1 + s1;
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        o[0][n][0] *= c0;
        o[0][n][1] *= c0;
        o[0][n][2] *= c1;
        o[0][n][3] *= c1;
    }
    mma_pb<1, NT / 2, D / 8>(o, sa, vs, st);
}

/* rows [r0, r0 + ROWS) of a (rows, heads, D) tensor at head `hd` into smem (stride D + 8);
 * rows >= end are zero-filled. */
template <int D, int ROWS>
__device__ __forceinline__ void fa_load_rows(bf16 *dst, const bf16 *src, int r0, int end, int heads, int hd) {
    constexpr int C = D / 8;
    for (int i = threadIdx.x; i < ROWS * C; i += blockDim.x) {
        int row = i / C, c = i % C, j = r0 + row;
        bool ok = j < end;
        fa_cp16(dst + row * (D + 8) + c * 8, ok ? src + ((size_t)j * heads + hd) * D + c * 8 : src, ok);
    }
}

/* The key tiles of a query block, pass by pass: row ranges lo/hi in shared memory; per pass s
 * the union [blo, bhi) of the rows' ranges and [flo, fhi), inside every row's range. */
template <int BM> struct fa_sched { int lo[2][BM], hi[2][BM], blo[2], bhi[2], flo[2], fhi[2]; };
/* Advances (s, j0) to the first BN-key tile at or after it that some row needs; full: every row
 * needs all of it. Every thread calls it (a block vote for tiles outside [flo, fhi)). */
template <int BM, int BN> __device__ __forceinline__ bool fa_next(const fa_sched<BM> &sc, int &s, int &j0, int &full) {
    while (s < 2) {
        if (j0 < sc.bhi[s]) {
            if (j0 >= sc.flo[s] && j0 + BN <= sc.fhi[s]) {
                full = 1;
                return true;
            }
            int any = 0;
            for (int i = threadIdx.x; i < BM; i += blockDim.x) any |= max(sc.lo[s][i], j0) < min(sc.hi[s][i], j0 + BN);
            if (__syncthreads_or(any)) {
                full = 0;
                return true;
            }
            j0 += BN;
        } else if (++s < 2) {
            j0 = sc.blo[s];
        }
    }
    return false;
}
template <int BM> __device__ __forceinline__ void fa_sched_load(fa_sched<BM> &sc, attn_ranges r, int t0, int T) {
    for (int i = threadIdx.x; i < BM; i += blockDim.x) {
        int t = t0 + i, a0 = 0, a1 = 0, b0 = 0, b1 = 0;
        if (t < T) {
            a0 = r.a0[t];
            a1 = r.a1[t];
            b0 = r.b0[t];
            b1 = r.b1[t];
        }
        sc.lo[0][i] = a0;
        sc.hi[0][i] = a1;
        sc.lo[1][i] = b0;
        sc.hi[1][i] = b1;
    }
    __syncthreads();
    if (threadIdx.x < 64) { /* two warps: pass = warp, lanes split the rows */
        int s = threadIdx.x >> 5, lane = threadIdx.x & 31, lo = INT_MAX, hi = INT_MIN, flo = INT_MIN, fhi = INT_MAX;
        for (int i = lane; i < BM; i += 32) {
            int a = sc.lo[s][i], b = sc.hi[s][i];
            if (a < b) {
                lo = min(lo, a);
                hi = max(hi, b);
            }
            flo = max(flo, a);
            fhi = min(fhi, b); /* an empty row makes [flo, fhi) empty */
        }
        lo = __reduce_min_sync(FULL, lo);
        hi = __reduce_max_sync(FULL, hi);
        flo = __reduce_max_sync(FULL, flo);
        fhi = __reduce_min_sync(FULL, fhi);
        if (lane == 0) {
            sc.blo[s] = lo;
            sc.bhi[s] = hi;
            sc.flo[s] = flo;
            sc.fhi[s] = fhi;
        }
    }
    __syncthreads();
}

/* The warp's own rows (16 MR from `row0`) against keys [j0, j1) of pass s: need (some row sees a
 * key) and wfull (every row sees every key). */
template <int MR, int BM>
__device__ __forceinline__ void fa_warp_vote(const fa_sched<BM> &sc, int s, int row0, int j0, int j1, int &need, int &wfull) {
    int row = row0 + ((threadIdx.x & 31) & (16 * MR - 1)), lo = sc.lo[s][row], hi = sc.hi[s][row];
    need = __any_sync(FULL, max(lo, j0) < min(hi, j1));
    wfull = __all_sync(FULL, lo <= j0 && j1 <= hi);
}

/* Keys outside the row's range of pass s become -inf (raw scores). Rows of this thread:
 * row0 + 16 mi + g and + 8. */
template <int MR, int NT, int BM>
__device__ __forceinline__ void fa_mask(float (&sa)[MR][NT][4], const fa_sched<BM> &sc, int s, int row0, int j0) {
    int lane = threadIdx.x & 31, c2 = 2 * (lane & 3);
#pragma unroll
    for (int mi = 0; mi < MR; mi++) {
        int r0 = row0 + mi * 16 + (lane >> 2);
        int lo0 = sc.lo[s][r0], hi0 = sc.hi[s][r0], lo1 = sc.lo[s][r0 + 8], hi1 = sc.hi[s][r0 + 8];
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int j = j0 + n * 8 + c2 + (e & 1), lo = e < 2 ? lo0 : lo1, hi = e < 2 ? hi0 : hi1;
                if (j < lo || j >= hi) sa[mi][n][e] = -INFINITY;
            }
    }
}

/* The warp's 16 MR rows of acc (16MR x D), times inv per row, as bf16 into its own rows of a
 * staging tile, then 16-byte stores to rows t0 + row0 .. of a (T, H, D) tensor at head h. */
template <int D, int MR>
__device__ __forceinline__ void fa_store_rows(bf16 *dst, bf16 *stage, const float (&acc)[MR][D / 8][4], const float (&inv)[MR][2],
                                              int t0, int row0, int T, int H, int h) {
    constexpr int ST = D + 8;
    int lane = threadIdx.x & 31, gr = lane >> 2, c2 = 2 * (lane & 3);
    bf16 *ow = stage + row0 * ST;
#pragma unroll
    for (int mi = 0; mi < MR; mi++)
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            *(bf162 *)(ow + (mi * 16 + gr) * ST + n * 8 + c2) = __floats2bfloat162_rn(acc[mi][n][0] * inv[mi][0],
                                                                                      acc[mi][n][1] * inv[mi][0]);
            *(bf162 *)(ow + (mi * 16 + gr + 8) * ST + n * 8 + c2) = __floats2bfloat162_rn(acc[mi][n][2] * inv[mi][1],
                                                                                          acc[mi][n][3] * inv[mi][1]);
        }
    __syncwarp();
    for (int i = lane; i < 16 * MR * (D / 8); i += 32) {
        int row = i / (D / 8), c = i % (D / 8), t = t0 + row0 + row;
        if (t < T) *(uint4 *)(dst + ((size_t)t * H + h) * D + c * 8) = *(const uint4 *)(ow + row * ST + c * 8);
    }
}

/* The K/V pipeline of fwd and dq, NS (2 or 3) stages, one barrier a tile: tile i sits in stage
 * i % NS; after the barrier that opens tile i (every warp is done with tile i - 1) the loads of
 * tile i + NS - 1 go into the stage tile i - 1 used. A: the tile being computed, B: the one after
 * it (NS = 3). Every thread runs these (fa_next votes). */
struct fa_tile {
    int s, j0, full;
    bool have;
};
#define FA_PIPE_LOAD(X, st) \
    do { \
        if ((X).have) { \
            fa_load_rows<D, BN>(k_s + (st)*TILE, k, (X).j0, sc.bhi[(X).s], K, g); \
            fa_load_rows<D, BN>(v_s + (st)*TILE, v, (X).j0, sc.bhi[(X).s], K, g); \
        } \
        fa_commit(); \
    } while (0)
#define FA_PIPE_AFTER(X, Y) \
    do { \
        (Y) = (X); \
        (Y).j0 += BN; \
        (Y).have = (X).have && fa_next<BM, BN>(sc, (Y).s, (Y).j0, (Y).full); \
    } while (0)
#define FA_PIPE_START() \
    fa_tile A = {0, sc.blo[0], 0, false}, B = A, N = A; \
    int buf = 0; \
    A.have = fa_next<BM, BN>(sc, A.s, A.j0, A.full); \
    FA_PIPE_LOAD(A, 0); \
    if (NS == 3) { \
        FA_PIPE_AFTER(A, B); \
        FA_PIPE_LOAD(B, 1); \
    }
#define FA_PIPE_NEXT() \
    do { \
        fa_wait<NS - 2>(); \
        __syncthreads(); \
        FA_PIPE_AFTER(NS == 3 ? B : A, N); \
        FA_PIPE_LOAD(N, (buf + NS - 1) % NS); \
    } while (0)
#define FA_PIPE_ADVANCE() \
    do { \
        if (NS == 3) { \
            A = B; \
            B = N; \
        } else A = N; \
        buf = buf + 1 == NS ? 0 : buf + 1; \
    } while (0)

/* The query block and head of a fwd / dq block. Blocks start in linear order (x fastest); the
 * last query blocks see the most keys, so they go first: query block major, heads inside
 * (the longest blocks of every head before any short one: a shorter tail than head major). */
#define FA_QBLOCK() \
    int lin_ = blockIdx.x + blockIdx.y * gridDim.x, xb_ = lin_ / H; \
    int h = lin_ % H, g = h / (H / K), t0 = (gridDim.x - 1 - xb_) * BM

/* Dsum = rowsum(dO ∘ O) for the block's rows [row0, row0 + NR) (a warp's own rows), 8 rows'
 * loads in flight at a time: into ds_s[row] and dsum (T, H). */
template <int D, int NR>
__device__ __forceinline__ void fa_dsum_rows(float *ds_s, float *dsum, const bf16 *out, const bf16 *dout, int t0, int row0, int T,
                                             int H, int h) {
    int lane = threadIdx.x & 31;
    constexpr int CH = D / 64; /* bf162 pairs a lane holds of one row */
#pragma unroll 1
    for (int i0 = 0; i0 < NR; i0 += 8) {
        bf162 a[8][CH], b[8][CH];
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int t = t0 + row0 + i0 + u;
            const bf162 *o2 = (const bf162 *)(out + ((size_t)min(t, T - 1) * H + h) * D);
            const bf162 *d2 = (const bf162 *)(dout + ((size_t)min(t, T - 1) * H + h) * D);
#pragma unroll
            for (int c = 0; c < CH; c++) {
                a[u][c] = o2[lane + 32 * c];
                b[u][c] = d2[lane + 32 * c];
            }
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            int row = row0 + i0 + u, t = t0 + row;
            float acc = 0;
#pragma unroll
            for (int c = 0; c < CH; c++) {
                float2 x = __bfloat1622float2(a[u][c]), y = __bfloat1622float2(b[u][c]);
                acc += x.x * y.x + x.y * y.y;
            }
            acc = t < T ? warp_sum(acc) : 0.0f;
            if (lane == 0) {
                ds_s[row] = acc;
                if (t < T) dsum[(size_t)t * H + h] = acc;
            }
        }
    }
}

/* Per (query tile, head) pair of a dkdv block: row scalars (lse in log2 units, Dsum, ranges). */
struct fa_qrows {
    float l2[FA_Q], ds[FA_Q];
    int rg[FA_Q][4];
};

/* acc (16MR x 8ND) += A (16MR x 16KB, smem rows, stride sa) · B (16KB x 8ND, smem rows, stride sb,
 * ldmatrix.trans): dkdv2's second phase, both operands from shared memory. */
template <int MR, int KB, int ND>
__device__ __forceinline__ void mma_ab(float (&acc)[MR][ND][4], const bf16 *a, int sa, const bf16 *b, int sb) {
    int lane = threadIdx.x & 31, m = lane >> 3, rr = lane & 7;
#pragma unroll
    for (int kb = 0; kb < KB; kb++) {
        unsigned af[MR][4];
#pragma unroll
        for (int mi = 0; mi < MR; mi++) fa_ldsm4(af[mi], a + (mi * 16 + (lane & 15)) * sa + kb * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int n = 0; n < ND; n += 2) {
            unsigned bf[4];
            fa_ldsm4t(bf, b + (kb * 16 + (m & 1) * 8 + rr) * sb + n * 8 + (m >> 1) * 8);
#pragma unroll
            for (int mi = 0; mi < MR; mi++) {
                fa_mma(acc[mi][n], af[mi], bf[0], bf[1]);
                fa_mma(acc[mi][n + 1], af[mi], bf[2], bf[3]);
            }
        }
    }
}
#endif
