/* moe.cu — the mixture-of-experts MLP (moe.h) on CUDA: the router, a permutation of the
 * (token, slot) pairs by expert, the weighted combine, the experts' tiled GEMMs and the choice
 * of the experts' variant (tune.moe, kernels/tune.h). Legend as moe.h (T, C, E, k, Fm);
 * S = T·k slots, slot ts = t·k + s.
 *
 * The experts' variants, all on the permutation below:
 *   - few (moe_few.cu): a weight stream per routed expert, decided on the device: decode steps
 *     (captured in CUDA graphs) up to MOE_FEW_T tokens under auto;
 *   - grouped (moe_gemm.cu): rows gathered by expert and cuBLAS grouped GEMMs, the counts read on
 *     the host: training and prefill under auto, every backward;
 *   - tiles (here): the first kernels, plain WMMA tiles over the slots gathered in place; kept as
 *     the A/B of bench_moe and tests/gpu/test_ops.c, and because a row's sum order does not
 *     depend on the batch (the grouped GEMMs' does).
 * The kernels here:
 *   - moe_hist_kernel / moe_scan_kernel / moe_place_kernel: per expert, its slots in slot order
 *     (perm), their count and offset, and its tiles of BM rows (toff), by a stable counting sort
 *     over chunks of slots; moe_count_kernel / moe_perm_kernel (one block per expert scanning
 *     every slot) give the same arrays where the experts are too many for the first.
 *   - moe_rows_kernel<MODE>: one block per (expert tile of BM slots, BN outputs). It gathers its
 *     rows' inputs by slot (no permuted copy of x), multiplies by that expert's weights alone
 *     and scatters the result to the slots' rows. The grid is the bound Σ_e ⌈cnt_e/BM⌉ ≤
 *     ⌈S/BM⌉ + min(E, S); blocks past the real tile count return. Only routed experts' weights
 *     are read.
 *   - moe_wgrad_kernel<MODE>: one block per (expert, BM×BN tile of its weight gradient), its
 *     slots summed in slot order; experts no slot chose are not touched.
 * No float atomics: every sum has one owner and a fixed order, so results are bit-identical
 * from run to run. dx of the experts' backward goes through fp32 per-slot rows (scratch, S·C)
 * summed per token in slot order, rounded to bf16 once.
 *
 * Precision beside the fp32 reference: eg, eu, ey, dg, du are bf16 (act-typed, as the dense
 * MLP's); the SwiGLU output a is recomputed from the bf16 eg, eu where it is read; w·dout is
 * rounded to bf16 as the A operand of dWd; the router's logits are fp32 out of a bf16 GEMM and
 * d logit goes to bf16 for its two GEMMs, as autograd's bf16 nn.Linear backward does. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mma.h>
#include <type_traits>

#include "kernels/bf16_vec.cuh"
#include "kernels/matmul.cuh"
#include "kernels/moe.cuh"
#include "kernels/moe_dev.cuh"

using namespace nvcuda;

enum { MOE_BM = 64, MOE_BN = 64, MOE_BK = 32, MOE_NT = 128 };

/* ---------------------------------------------------------------- helpers */

__device__ __forceinline__ int block_sum_int(int v, int *sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* ---------------------------------------------------------------- permutation by expert */

/* cnt[e] = the slots that chose e. Grid E, 256 threads. */
__global__ void moe_count_kernel(int *cnt, const int *topi, int S) {
    __shared__ int sh[32];
    int e = blockIdx.x, n = 0;
    for (int i = threadIdx.x; i < S; i += blockDim.x) n += topi[i] == e;
    n = block_sum_int(n, sh);
    if (threadIdx.x == 0) cnt[e] = n;
}

/* off[e] = Σ_{j<e} cnt[j] and toff[e] = Σ_{j<e} ⌈cnt[j]/BM⌉ (off[E], toff[E] the totals);
 * perm[off[e] ..] = e's slots in slot order. Grid E, 256 threads. */
__global__ void moe_perm_kernel(int *perm, int *off, int *toff, const int *cnt, const int *topi, int S, int E) {
    __shared__ int sh[32], base_sh;
    int e = blockIdx.x, o = 0, to = 0;
    for (int j = threadIdx.x; j < e; j += blockDim.x) {
        o += cnt[j];
        to += (cnt[j] + MOE_BM - 1) / MOE_BM;
    }
    o = block_sum_int(o, sh);
    to = block_sum_int(to, sh);
    if (threadIdx.x == 0) {
        off[e] = o;
        toff[e] = to;
        if (e == E - 1) {
            off[E] = o + cnt[e];
            toff[E] = to + (cnt[e] + MOE_BM - 1) / MOE_BM;
        }
        base_sh = o;
    }
    __syncthreads();
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int i0 = 0; i0 < S; i0 += blockDim.x) { /* ordered compaction, one block-wide chunk at a time */
        int i = i0 + threadIdx.x, hit = i < S && topi[i] == e;
        unsigned m = __ballot_sync(0xffffffffu, hit);
        __syncthreads();
        if (lane == 0) sh[w] = __popc(m);
        __syncthreads();
        int before = base_sh;
        for (int j = 0; j < w; j++) before += sh[j];
        if (hit) perm[before + __popc(m & ((1u << lane) - 1u))] = i;
        __syncthreads();
        if (threadIdx.x == blockDim.x - 1) base_sh = before + __popc(m);
        __syncthreads();
    }
}

/* The same arrays in three short kernels over chunks of MOE_CH slots (a counting sort, stable):
 *   moe_hist_kernel: hist[ch][e] = the slots of chunk ch that chose e;
 *   moe_scan_kernel (one block): cnt, off, toff, and hist[ch][e] turned into the place of chunk
 *     ch's first slot of e (off[e] + the slots of e in the chunks before);
 *   moe_place_kernel: each slot at its chunk's place for its expert + the slots of the same
 *     expert before it in the chunk (the warps before it, then its lanes before it).
 * So perm is the same as moe_perm_kernel's, slot order inside an expert; no atomics reach the
 * arrays (the chunk's histogram counts in shared memory, whose sum has no order). */
enum { MOE_CH = 512 };
__global__ void moe_hist_kernel(int *hist, const int *topi, int S, int E) {
    extern __shared__ int h[];
    for (int e = threadIdx.x; e < E; e += blockDim.x) h[e] = 0;
    __syncthreads();
    int i = blockIdx.x * MOE_CH + threadIdx.x;
    if (i < S) {
        int e = topi[i];
        if (e >= 0 && e < E) atomicAdd(&h[e], 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) hist[(size_t)blockIdx.x * E + e] = h[e];
}
__global__ void moe_scan_kernel(int *hist, int *cnt, int *off, int *toff, int nch, int E) {
    extern __shared__ int h[]; /* (E) the counts */
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int run = 0;
        for (int ch = 0; ch < nch; ch++) {
            int v = hist[(size_t)ch * E + e];
            hist[(size_t)ch * E + e] = run;
            run += v;
        }
        h[e] = cnt[e] = run;
    }
    __syncthreads();
    if (threadIdx.x == 0) { /* E is small: one thread */
        int o = 0, to = 0;
        for (int e = 0; e < E; e++) {
            off[e] = o, toff[e] = to;
            int n = h[e];
            h[e] = o;
            o += n, to += (n + MOE_BM - 1) / MOE_BM;
        }
        off[E] = o, toff[E] = to;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        for (int ch = 0; ch < nch; ch++) hist[(size_t)ch * E + e] += h[e];
}
__global__ void __launch_bounds__(MOE_CH) moe_place_kernel(int *perm, const int *hist, const int *topi, int S, int E) {
    extern __shared__ int wc[]; /* (MOE_CH / 32, E): a warp's slots of each expert */
    const int NW = MOE_CH / 32, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int j = threadIdx.x; j < NW * E; j += blockDim.x) wc[j] = 0;
    __syncthreads();
    int i = blockIdx.x * MOE_CH + threadIdx.x, e = i < S ? topi[i] : -1;
    if (e < 0 || e >= E) e = -1;
    unsigned peers = __match_any_sync(0xffffffffu, e);
    int rank = __popc(peers & ((1u << lane) - 1u));
    if (e >= 0 && rank == 0) wc[w * E + e] = __popc(peers);
    __syncthreads();
    if (e < 0) return;
    int before = rank;
    for (int j = 0; j < w; j++) before += wc[j * E + e];
    perm[hist[(size_t)blockIdx.x * E + e] + before] = i;
}

/* ---------------------------------------------------------------- grouped GEMMs over slots */

enum {
    ROWS_GATE_UP, /* eg|eu[ts] = x[t] Wg|Wu_e^T          K = C,  N = Fm, W (N,K); blockIdx.z: gate 0, up 1 */
    ROWS_DOWN, /* ey[ts] = a[ts] Wd_e^T                 K = Fm, N = C,  W (N,K) */
    ROWS_DA, /* dg, du[ts] from da = w dout[t] Wd_e      K = C,  N = Fm, W (K,N) */
    ROWS_DX, /* part[ts] = dg[ts] Wg_e + du[ts] Wu_e     K = Fm, N = C,  W (K,N), two K segments */
};

typedef struct {
    const int *perm, *off, *cnt, *toff;
    int E, k, K, N;
    const bf16 *a0, *a1; /* GATE_UP: x; DOWN: eg, eu; DA: dout; DX: dg, du */
    const bf16 *w0, *w1; /* stacked (E, ...) weights: the first, the second (GATE_UP: up; DX: Wu) */
    bf16 *o0, *o1; /* GATE_UP: eg, eu; DOWN: ey; DA: dg, du */
    float *of; /* DX: part (S, C) */
    const float *topw; /* DA */
    const bf16 *g, *u; /* DA: eg, eu */
    const float *lt; /* DA with a down adapter: t (S, lr) = w dout Bd_e (moe_lora.cu), da += t Ad_e */
    const bf16 *la; /* DA: Ad (E, lr, N) */
    int lr;
} moe_rows_args;

typedef union {
    struct {
        bf16 a[MOE_BM][MOE_BK + 8];
        bf16 b[MOE_BN * (MOE_BK + 8)]; /* (BN, BK+8) or (BK, BN+8) */
    } in;
    float c[MOE_BM][MOE_BN + 4];
} moe_smem;

/* acc += the BM×BK A tile times the BK×BN B tile in shared memory (4 warps of 32×32). */
template <int B_KN>
__device__ __forceinline__ void moe_mma(wmma::fragment<wmma::accumulator, 16, 16, 16, float> (&acc)[2][2], const moe_smem *sm) {
    int w = threadIdx.x >> 5, wm = (w >> 1) * 32, wn = (w & 1) * 32;
    typedef typename std::conditional<B_KN, wmma::row_major, wmma::col_major>::type BL;
    for (int kk = 0; kk < MOE_BK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> fa[2];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, BL> fb[2];
        for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], &sm->in.a[wm + 16 * i][kk], MOE_BK + 8);
        for (int j = 0; j < 2; j++) {
            if (B_KN) wmma::load_matrix_sync(fb[j], sm->in.b + kk * (MOE_BN + 8) + wn + 16 * j, MOE_BN + 8);
            else wmma::load_matrix_sync(fb[j], sm->in.b + (wn + 16 * j) * (MOE_BK + 8) + kk, MOE_BK + 8);
        }
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
    }
}

/* One K segment: A rows arow[i] (and arow2[i] for DOWN's SwiGLU), W_e of layout B_KN. */
template <int MODE, int B_KN>
__device__ __forceinline__ void moe_rows_segment(wmma::fragment<wmma::accumulator, 16, 16, 16, float> (&acc)[2][2], moe_smem *sm,
                                                 const bf16 *const *arow, const bf16 *const *arow2, const bf16 *W, int K, int N,
                                                 int n0) {
    for (int k0 = 0; k0 < K; k0 += MOE_BK) {
        for (int c = threadIdx.x; c < MOE_BM * MOE_BK / 8; c += MOE_NT) {
            int i = c / (MOE_BK / 8), kc = (c % (MOE_BK / 8)) * 8;
            uint4 q = MODE == ROWS_DOWN ? (arow[i] ? swiglu8(arow[i], arow2[i], k0 + kc, K) : ld8(NULL, 0, 0))
                                        : ld8(arow[i], k0 + kc, K);
            *(uint4 *)&sm->in.a[i][kc] = q;
        }
        for (int c = threadIdx.x; c < MOE_BN * MOE_BK / 8; c += MOE_NT) {
            if (B_KN) { /* W (K, N): row k0+kk, outputs n0+nc.. */
                int kk = c / (MOE_BN / 8), nc = (c % (MOE_BN / 8)) * 8;
                const bf16 *row = k0 + kk < K ? W + (size_t)(k0 + kk) * N : NULL;
                *(uint4 *)(sm->in.b + kk * (MOE_BN + 8) + nc) = ld8(row, n0 + nc, N);
            } else { /* W (N, K): row n0+n, inputs k0+kc.. */
                int n = c / (MOE_BK / 8), kc = (c % (MOE_BK / 8)) * 8;
                const bf16 *row = n0 + n < N ? W + (size_t)(n0 + n) * K : NULL;
                *(uint4 *)(sm->in.b + n * (MOE_BK + 8) + kc) = ld8(row, k0 + kc, K);
            }
        }
        __syncthreads();
        moe_mma<B_KN>(acc, sm);
        __syncthreads();
    }
}

/* Grid (⌈S/BM⌉ + min(E, S), ⌈N/BN⌉, GATE_UP ? 2 : 1), MOE_NT threads. */
template <int MODE> __global__ void __launch_bounds__(MOE_NT) moe_rows_kernel(moe_rows_args p) {
    __shared__ __align__(128) moe_smem sm;
    __shared__ int slot[MOE_BM];
    __shared__ const bf16 *arow[MOE_BM], *arow2[MOE_BM];
    int b = blockIdx.x, E = p.E;
    if (b >= p.toff[E]) return;
    int lo = 0, hi = E - 1; /* the expert whose tiles hold b: the last e with toff[e] <= b */
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (p.toff[mid] <= b) lo = mid;
        else hi = mid - 1;
    }
    int e = lo, r0 = p.off[e] + (b - p.toff[e]) * MOE_BM, nr = min(MOE_BM, p.off[e] + p.cnt[e] - r0);
    int n0 = blockIdx.y * MOE_BN, z = blockIdx.z, K = p.K, N = p.N;
    for (int i = threadIdx.x; i < MOE_BM; i += MOE_NT) {
        int ts = i < nr ? p.perm[r0 + i] : -1;
        slot[i] = ts;
        const bf16 *r = NULL, *r2 = NULL;
        if (ts >= 0) {
            if (MODE == ROWS_GATE_UP || MODE == ROWS_DA) r = p.a0 + (size_t)(ts / p.k) * K; /* the token's row */
            else {
                r = p.a0 + (size_t)ts * K; /* the slot's rows */
                r2 = p.a1 + (size_t)ts * K;
            }
        }
        arow[i] = r;
        arow2[i] = r2;
    }
    __syncthreads();
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    size_t wsz = (size_t)N * K;
    if (MODE == ROWS_GATE_UP) moe_rows_segment<MODE, 0>(acc, &sm, arow, arow2, (z ? p.w1 : p.w0) + e * wsz, K, N, n0);
    if (MODE == ROWS_DOWN) moe_rows_segment<MODE, 0>(acc, &sm, arow, arow2, p.w0 + e * wsz, K, N, n0);
    if (MODE == ROWS_DA) moe_rows_segment<MODE, 1>(acc, &sm, arow, arow2, p.w0 + e * wsz, K, N, n0);
    if (MODE == ROWS_DX) {
        moe_rows_segment<MODE, 1>(acc, &sm, arow, arow2, p.w0 + e * wsz, K, N, n0); /* dg Wg_e */
        moe_rows_segment<MODE, 1>(acc, &sm, arow2, arow2, p.w1 + e * wsz, K, N, n0); /* du Wu_e */
    }
    int w = threadIdx.x >> 5, wm = (w >> 1) * 32, wn = (w & 1) * 32;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(&sm.c[wm + 16 * i][wn + 16 * j], acc[i][j], MOE_BN + 4, wmma::mem_row_major);
    __syncthreads();
    int nn = min(MOE_BN, N - n0);
    for (int c = threadIdx.x; c < nr * MOE_BN; c += MOE_NT) {
        int i = c / MOE_BN, n = c % MOE_BN;
        if (n >= nn) continue;
        size_t ts = (size_t)slot[i], o = ts * N + n0 + n;
        float v = sm.c[i][n];
        if (MODE == ROWS_GATE_UP) (z ? p.o1 : p.o0)[o] = __float2bfloat16(v);
        if (MODE == ROWS_DOWN) p.o0[o] = __float2bfloat16(v);
        if (MODE == ROWS_DX) p.of[o] = v;
        if (MODE == ROWS_DA) { /* da = w · (dout Wd); then SwiGLU's backward on this slot's g, u */
            float da = p.topw[ts] * v, g = __bfloat162float(p.g[o]), u = __bfloat162float(p.u[o]);
            for (int j = 0; j < p.lr; j++)
                da += p.lt[ts * p.lr + j] * __bfloat162float(p.la[((size_t)e * p.lr + j) * N + n0 + n]);
            float sg = 1.0f / (1.0f + __expf(-g));
            p.o0[o] = __float2bfloat16(da * u * (sg + g * sg * (1.0f - sg)));
            p.o1[o] = __float2bfloat16(da * g * sg);
        }
    }
}

/* ---------------------------------------------------------------- weight gradients */

enum {
    WG_DOWN, /* dWd_e (C, Fm) += Σ (w dout[t])^T a[ts]   M = C, N = Fm */
    WG_IN, /* dWg|dWu_e (Fm, C) += Σ d(g|u)[ts]^T x[t]  M = Fm, N = C */
};

typedef struct {
    const int *perm, *off, *cnt;
    int k, M, N;
    const bf16 *a, *g, *u; /* DOWN: dout (A), eg, eu (B: a = silu(g) u); IN: dg or du (A), x (B) */
    const float *topw;
    float *dw; /* stacked (E, M, N) */
} moe_wgrad_args;

/* Grid (⌈N/BN⌉, ⌈M/BM⌉, E), MOE_NT threads: block (n, m, e) owns dW_e's tile, its slots summed
 * in slot order, BK at a time. */
template <int MODE> __global__ void __launch_bounds__(MOE_NT) moe_wgrad_kernel(moe_wgrad_args p) {
    __shared__ __align__(128) union {
        struct {
            bf16 a[MOE_BK][MOE_BM + 8];
            bf16 b[MOE_BK][MOE_BN + 8];
        } in;
        float c[MOE_BM][MOE_BN + 4];
    } sm;
    __shared__ const bf16 *arow[MOE_BK], *brow[MOE_BK], *brow2[MOE_BK];
    __shared__ float wrow[MOE_BK];
    int e = blockIdx.z, n0 = blockIdx.x * MOE_BN, m0 = blockIdx.y * MOE_BM, M = p.M, N = p.N;
    int r0 = p.off[e], nr = p.cnt[e];
    if (nr == 0) return;
    int w = threadIdx.x >> 5, wm = (w >> 1) * 32, wn = (w & 1) * 32;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) wmma::fill_fragment(acc[i][j], 0.0f);
    for (int k0 = 0; k0 < nr; k0 += MOE_BK) {
        for (int i = threadIdx.x; i < MOE_BK; i += MOE_NT) {
            int ts = k0 + i < nr ? p.perm[r0 + k0 + i] : -1;
            const bf16 *ar = NULL, *br = NULL, *br2 = NULL;
            if (ts >= 0 && MODE == WG_DOWN) {
                ar = p.a + (size_t)(ts / p.k) * M;
                br = p.g + (size_t)ts * N;
                br2 = p.u + (size_t)ts * N;
            }
            if (ts >= 0 && MODE == WG_IN) {
                ar = p.a + (size_t)ts * M;
                br = p.g + (size_t)(ts / p.k) * N;
            }
            arow[i] = ar;
            brow[i] = br;
            brow2[i] = br2;
            wrow[i] = ts >= 0 && MODE == WG_DOWN ? p.topw[ts] : 1.0f;
        }
        __syncthreads();
        for (int c = threadIdx.x; c < MOE_BK * MOE_BM / 8; c += MOE_NT) {
            int kk = c / (MOE_BM / 8), mc = (c % (MOE_BM / 8)) * 8;
            uint4 q = ld8(arow[kk], m0 + mc, M);
            if (MODE == WG_DOWN) { /* w · dout, rounded to bf16 */
                float f[8];
                unpack8(q, f);
                for (int j = 0; j < 8; j++) f[j] *= wrow[kk];
                q = pack8(f);
            }
            *(uint4 *)&sm.in.a[kk][mc] = q;
        }
        for (int c = threadIdx.x; c < MOE_BK * MOE_BN / 8; c += MOE_NT) {
            int kk = c / (MOE_BN / 8), nc = (c % (MOE_BN / 8)) * 8;
            uint4 q = MODE == WG_DOWN ? (brow[kk] ? swiglu8(brow[kk], brow2[kk], n0 + nc, N) : ld8(NULL, 0, 0))
                                      : ld8(brow[kk], n0 + nc, N);
            *(uint4 *)&sm.in.b[kk][nc] = q;
        }
        __syncthreads();
        for (int kk = 0; kk < MOE_BK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major> fa[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> fb[2];
            for (int i = 0; i < 2; i++) wmma::load_matrix_sync(fa[i], &sm.in.a[kk][wm + 16 * i], MOE_BM + 8);
            for (int j = 0; j < 2; j++) wmma::load_matrix_sync(fb[j], &sm.in.b[kk][wn + 16 * j], MOE_BN + 8);
            for (int i = 0; i < 2; i++)
                for (int j = 0; j < 2; j++) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++)
            wmma::store_matrix_sync(&sm.c[wm + 16 * i][wn + 16 * j], acc[i][j], MOE_BN + 4, wmma::mem_row_major);
    __syncthreads();
    float *dw = p.dw + (size_t)e * M * N;
    int mm = min(MOE_BM, M - m0), nn = min(MOE_BN, N - n0);
    for (int c = threadIdx.x; c < MOE_BM * MOE_BN; c += MOE_NT) {
        int i = c / MOE_BN, n = c % MOE_BN;
        if (i < mm && n < nn) dw[(size_t)(m0 + i) * N + n0 + n] += sm.c[i][n];
    }
}

/* ---------------------------------------------------------------- per-token kernels */

/* out[t] = res[t] + Σ_s w_ts y[ts] (res NULL: 0), one fp32 sum rounded once, y[ts] the slot's
 * row of ey, or of eyp at inv[ts] (the grouped path's rows by expert), then copied to ey
 * (out NULL: the copy alone); V consecutive values a thread (bf16_vec.cuh) */
template <int V>
__global__ void moe_combine_kernel(bf16 *out, const bf16 *res, bf16 *ey, const bf16 *eyp, const int *inv, const float *topw,
                                   int T, int C, int k) {
    int CV = C / V;
    GRID_STRIDE(u, (long long)T * CV) {
        long long t = u / CV, c = (u - t * CV) * V, i = t * C + c;
        float v[V], y[V];
        if (res) vload<V>(v, res + i);
        else
#pragma unroll
            for (int j = 0; j < V; j++) v[j] = 0.0f;
        for (int s = 0; s < k; s++) {
            long long ts = t * k + s;
            const bf16 *src = inv ? eyp + (long long)inv[ts] * C + c : ey + ts * C + c;
            if (inv) *(typename bf16_pack<V>::t *)(ey + ts * C + c) = *(const typename bf16_pack<V>::t *)src;
            vload<V>(y, src);
            float w = topw[ts];
#pragma unroll
            for (int j = 0; j < V; j++) v[j] += w * y[j];
        }
        if (out) vstore<V>(out + i, v);
    }
}

/* dx[t] = bf16(dx[t] + Σ_s part[ts]), part's row of ts at inv[ts] (inv NULL: ts); V values a
 * thread */
template <int V> __global__ void moe_dx_kernel(bf16 *dx, const float *part, const int *inv, int T, int C, int k) {
    int CV = C / V;
    GRID_STRIDE(u, (long long)T * CV) {
        long long t = u / CV, c = (u - t * CV) * V, i = t * C + c;
        float v[V], d[V];
#pragma unroll
        for (int j = 0; j < V; j++) v[j] = 0.0f;
        for (int s = 0; s < k; s++) {
            const float *p = part + (inv ? (long long)inv[t * k + s] : t * k + s) * C + c;
#pragma unroll
            for (int j = 0; j < V; j++) v[j] += p[j];
        }
        vload<V>(d, dx + i);
#pragma unroll
        for (int j = 0; j < V; j++) d[j] += v[j];
        vstore<V>(dx + i, d);
    }
}

/* dtopw[ts] = dout[t] · ey[ts]; one warp per slot */
__global__ void moe_dtopw_kernel(float *dtopw, const bf16 *dout, const bf16 *ey, int S, int C, int k) {
    int ts = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (ts >= S) return;
    const bf16 *dy = dout + (size_t)(ts / k) * C, *y = ey + (size_t)ts * C;
    float v = 0;
    for (int c = lane; c < C; c += 32) v += __bfloat162float(dy[c]) * __bfloat162float(y[c]);
    v = warp_sum(v);
    if (lane == 0) dtopw[ts] = v;
}

/* probs (T, E) logits in, softmax out; top-k (largest first, the lower index on a tie), or the
 * given experts (T, k; NULL: none; a token whose first is -1: its top-k), and the routing
 * weights (renormalised when norm). One warp per token. */
__global__ void moe_topk_kernel(float *probs, int *topi, float *topw, const int *given, int T, int E, int k, int norm) {
    int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= T) return;
    float *p = probs + (size_t)t * E, mx = -INFINITY, sum = 0;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, p[e]);
    mx = warp_max(mx);
    for (int e = lane; e < E; e += 32) sum += expf(p[e] - mx);
    sum = warp_sum(sum);
    for (int e = lane; e < E; e += 32) p[e] = expf(p[e] - mx) / sum;
    __syncwarp();
    int *ti = topi + (size_t)t * k;
    const int *g = given && given[(size_t)t * k] >= 0 ? given + (size_t)t * k : NULL; /* the warp agrees */
    __syncwarp(); /* every lane has read g[0] before lane 0 may write ti (given may be topi) */
    float *tw = topw + (size_t)t * k, sel = 0;
    for (int s = 0; s < k; s++) {
        float bv = -INFINITY;
        int bi = E;
        if (g) { /* replay: every lane reads the same expert, as the reduction below would leave it */
            bi = g[s];
            bv = p[bi];
        }
        for (int e = lane; e < E && !g; e += 32) {
            int taken = 0;
            for (int j = 0; j < s && !taken; j++) taken = ti[j] == e;
            float v = p[e];
            if (!taken && (bi == E || v > bv)) bv = v, bi = e;
        }
        for (int o = 16; o > 0 && !g; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi < E && (bi == E || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
        }
        if (lane == 0) {
            ti[s] = bi;
            tw[s] = bv;
        }
        sel += bv;
        __syncwarp();
    }
    for (int s = lane; norm && s < k; s += 32) tw[s] /= sel;
}

/* stats[e] += Σ_t c_t [e ∈ i_t], stats[E+e] += Σ_t c_t p_te (block e < E); stats[2E] += Σ_t c_t
 * (block E). Grid E+1, 256 threads: a fixed order per block. */
__global__ void moe_stats_kernel(float *stats, const float *probs, const int *topi, const int *count, int T, int E, int k) {
    __shared__ float sh[32];
    int e = blockIdx.x;
    float f = 0, pe = 0;
    for (int t = threadIdx.x; t < T; t += blockDim.x) {
        float c = count ? (float)count[t] : 1.0f;
        if (e == E) {
            f += c;
            continue;
        }
        for (int s = 0; s < k; s++) f += topi[(size_t)t * k + s] == e ? c : 0.0f;
        pe += c * probs[(size_t)t * E + e];
    }
    f = block_sum(f, sh);
    pe = block_sum(pe, sh);
    if (threadIdx.x == 0) {
        if (e == E) stats[2 * E] += f;
        else {
            stats[e] += f;
            stats[E + e] += pe;
        }
    }
}

/* d logit (T, E) from dtopw, through the renormalisation and the softmax, plus aux_g·count;
 * also as bf16 into dlh for the GEMMs. One warp per token. */
__global__ void moe_router_bwd_kernel(float *dlogit, bf16 *dlh, const float *dtopw, const float *probs, const int *topi,
                                      const float *aux_g, const int *count, int T, int E, int k, int norm) {
    int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (t >= T) return;
    const float *p = probs + (size_t)t * E, *dw = dtopw + (size_t)t * k;
    const int *ti = topi + (size_t)t * k;
    float c = count ? (float)count[t] : 1.0f, S = 0, dot = 0;
    if (norm) {
        for (int s = 0; s < k; s++) S += p[ti[s]];
        for (int s = 0; s < k; s++) dot += dw[s] * p[ti[s]] / S;
    }
    float *dl = dlogit + (size_t)t * E, pd = 0;
    for (int e = lane; e < E; e += 32) {
        float d = aux_g ? aux_g[e] * c : 0.0f;
        for (int s = 0; s < k; s++)
            if (ti[s] == e) d += norm ? (dw[s] - dot) / S : dw[s];
        dl[e] = d;
        pd += p[e] * d;
    }
    pd = warp_sum(pd);
    for (int e = lane; e < E; e += 32) {
        float v = p[e] * (dl[e] - pd);
        dl[e] = v;
        dlh[(size_t)t * E + e] = __float2bfloat16(v);
    }
}

/* ---------------------------------------------------------------- launchers */

static int moe_nch(int S) { return (S + MOE_CH - 1) / MOE_CH; }
const int *moe_perm_cuda(cu_ctx *c, const int *topi, int S, int E, void *scratch) {
    int *cnt = (int *)scratch, *off = cnt + E, *toff = off + E + 1, *perm = toff + E + 1, *hist = perm + S, nch = moe_nch(S);
    if ((size_t)(MOE_CH / 32) * E * sizeof(int) > 48 * 1024) { /* more experts than moe_place_kernel holds */
        moe_count_kernel<<<E, 256, 0, c->stream>>>(cnt, topi, S);
        CU_LAUNCHED(c, "moe_count_kernel");
        moe_perm_kernel<<<E, 256, 0, c->stream>>>(perm, off, toff, cnt, topi, S, E);
        CU_LAUNCHED(c, "moe_perm_kernel");
        return cnt;
    }
    if (S <= 0) { /* no slots: zero counts and offsets */
        CU_CK(c, cudaMemsetAsync(cnt, 0, sizeof(int) * (3 * (size_t)E + 2), c->stream));
        return cnt;
    }
    moe_hist_kernel<<<nch, MOE_CH, sizeof(int) * E, c->stream>>>(hist, topi, S, E);
    CU_LAUNCHED(c, "moe_hist_kernel");
    const int scan_threads = E < 1024 ? E : 1024;
    moe_scan_kernel<<<1, scan_threads, sizeof(int) * E, c->stream>>>(hist, cnt, off, toff, nch, E);
    CU_LAUNCHED(c, "moe_scan_kernel");
    moe_place_kernel<<<nch, MOE_CH, sizeof(int) * (MOE_CH / 32) * E, c->stream>>>(perm, hist, topi, S, E);
    CU_LAUNCHED(c, "moe_place_kernel");
    return cnt;
}
/* cnt, off, toff, perm, then the chunks' histograms (moe_perm_cuda's own) */
size_t moe_perm_bytes(int S, int E) {
    return (((size_t)3 * E + 2 + S + (size_t)moe_nch(S) * E) * sizeof(int) + 255) & ~(size_t)255;
}
void moe_combine_cuda(cu_ctx *c, bf16 *out, const bf16 *res, bf16 *ey, const bf16 *eyp, const int *inv, const float *topw, int T,
                      int C, int k) {
    int v = vec_width(C, out, res, ey, eyp, NULL);
    VEC_LAUNCH(moe_combine_kernel, v, (long long)T * C, out, res, ey, eyp, inv, topw, T, C, k);
}
void moe_dx_cuda(cu_ctx *c, bf16 *dx, const float *part, const int *inv, int T, int C, int k) {
    int v = vec_width(C, dx, part, NULL, NULL, NULL);
    while (v > 1 && (uintptr_t)part % (4u * v)) v >>= 1; /* part is fp32: 4 V bytes */
    VEC_LAUNCH(moe_dx_kernel, v, (long long)T * C, dx, part, inv, T, C, k);
}
void moe_dtopw_cuda(cu_ctx *c, float *dtopw, const bf16 *dout, const bf16 *ey, int S, int C, int k) {
    moe_dtopw_kernel<<<cu_blocks(S, 8), 256, 0, c->stream>>>(dtopw, dout, ey, S, C, k);
    CU_LAUNCHED(c, "moe_dtopw_kernel");
}
/* the arguments of a moe_rows_kernel over moe_perm's arrays (cnt first) */
static moe_rows_args moe_rows_of(const int *cnt, int E, int k, int K, int N, const bf16 *a0, const bf16 *a1, const bf16 *w0,
                                 const bf16 *w1, bf16 *o0, bf16 *o1) {
    moe_rows_args a;
    memset(&a, 0, sizeof a);
    a.cnt = cnt;
    a.off = cnt + E;
    a.toff = a.off + E + 1;
    a.perm = a.toff + E + 1;
    a.E = E;
    a.k = k;
    a.K = K;
    a.N = N;
    a.a0 = a0;
    a.a1 = a1;
    a.w0 = w0;
    a.w1 = w1;
    a.o0 = o0;
    a.o1 = o1;
    return a;
}
static dim3 moe_wgrad_grid(int M, int N, int E) {
    return dim3((unsigned)((N + MOE_BN - 1) / MOE_BN), (unsigned)((M + MOE_BM - 1) / MOE_BM), (unsigned)E);
}
static dim3 moe_rows_grid(int S, int E, int N, int z) {
    return dim3((unsigned)((S + MOE_BM - 1) / MOE_BM + (E < S ? E : S)), (unsigned)((N + MOE_BN - 1) / MOE_BN), (unsigned)z);
}

void moe_router_fwd_cuda(cu_ctx *c, float *probs, int *topi, float *topw, float *stats, const bf16 *x, const bf16 *wr,
                         const int *given, const int *count, int T, int C, int E, int k, int norm) {
    if (c->failed || T <= 0) return;
    gemm_lt(c, 1, 0, E, T, C, 1.0f, wr, C, x, C, 0.0f, probs, E, 1, NULL); /* logits (T, E) in fp32 */
    moe_topk_kernel<<<cu_blocks(T, 8), 256, 0, c->stream>>>(probs, topi, topw, given, T, E, k, norm);
    CU_LAUNCHED(c, "moe_topk_kernel");
    if (!stats) return;
    moe_stats_kernel<<<E + 1, 256, 0, c->stream>>>(stats, probs, topi, count, T, E, k);
    CU_LAUNCHED(c, "moe_stats_kernel");
}

/* the adapters' sources and matrices (moe_lora.cu): a token's row of x, a slot's row, silu(eg)·eu;
 * A (E, r, I) by rows, B (E, O, r) by columns (the j-th of expert e: B_e[:, j]) or by rows */
static moe_lora_src src_tok(const bf16 *x, int ld) { return (moe_lora_src){x, NULL, NULL, ld, 1, 0, 0}; }
static moe_lora_src src_slot(const void *p, int ld, int f32) { return (moe_lora_src){p, NULL, NULL, ld, 0, f32, 0}; }
static moe_lora_src src_swiglu(const bf16 *g, const bf16 *u, int Fm) { return (moe_lora_src){g, u, NULL, Fm, 0, 0, 1}; }
static moe_lora_mat mat_a(const void *A, int r, int I) { return (moe_lora_mat){(const bf16 *)A, (size_t)r * I, (size_t)I, 1}; }
static moe_lora_mat mat_b_cols(const void *B, size_t es, int r) { return (moe_lora_mat){(const bf16 *)B, es, 1, (size_t)r}; }
static moe_lora_mat mat_b_rows(const void *B, size_t es, int r) { return (moe_lora_mat){(const bf16 *)B, es, (size_t)r, 1}; }
static const moe_lora_src NO_SRC = {NULL, NULL, NULL, 0, 0, 0, 0};
static const moe_lora_mat NO_MAT = {NULL, 0, 0, 0};

static void moe_experts_fwd_tiles(cu_ctx *c, bf16 *out, bf16 *eg, bf16 *eu, bf16 *ey, const bf16 *x, const bf16 *res,
                                  const int *topi, const float *topw, const bf16 *wg, const bf16 *wu, const bf16 *wd, int T,
                                  int C, int E, int k, int Fm, const moe_lora *lr) {
    int S = T * k, rmax = lr ? (lr->rg > lr->rd ? lr->rg : lr->rd) : 0;
    size_t pb = moe_perm_bytes(S, E);
    char *scr = c->failed || T <= 0 ? NULL : (char *)cu_scratch(c, pb + (size_t)S * rmax * sizeof(float));
    if (!scr) return;
    const int *cnt = moe_perm_cuda(c, topi, S, E, scr);
    float *h = (float *)(scr + pb); /* (S, r) X A^T of one adapter */
    moe_rows_args a = moe_rows_of(cnt, E, k, C, Fm, x, NULL, wg, wu, eg, eu);
    moe_rows_kernel<ROWS_GATE_UP><<<moe_rows_grid(S, E, Fm, 2), MOE_NT, 0, c->stream>>>(a);
    CU_LAUNCHED(c, "moe_rows_kernel<GATE_UP>");
    if (lr && lr->agu) { /* g, u += (x Agu_e^T) Bg_e^T, Bu_e^T */
        size_t es = (size_t)2 * Fm * lr->rg;
        moe_lora_dot_cuda(c, h, src_tok(x, C), mat_a(lr->agu, lr->rg, C), NO_SRC, NO_MAT, topi, S, k, lr->rg, C);
        moe_lora_add_cuda(c, eg, 0, Fm, h, mat_b_rows(lr->bgu, es, lr->rg), topi, S, Fm, lr->rg);
        moe_lora_add_cuda(c, eu, 0, Fm, h, mat_b_rows((const bf16 *)lr->bgu + (size_t)Fm * lr->rg, es, lr->rg), topi, S, Fm,
                          lr->rg);
    }
    a = moe_rows_of(cnt, E, k, Fm, C, eg, eu, wd, NULL, ey, NULL);
    moe_rows_kernel<ROWS_DOWN><<<moe_rows_grid(S, E, C, 1), MOE_NT, 0, c->stream>>>(a);
    CU_LAUNCHED(c, "moe_rows_kernel<DOWN>");
    if (lr && lr->ad) { /* y += (a Ad_e^T) Bd_e^T */
        moe_lora_dot_cuda(c, h, src_swiglu(eg, eu, Fm), mat_a(lr->ad, lr->rd, Fm), NO_SRC, NO_MAT, topi, S, k, lr->rd, Fm);
        moe_lora_add_cuda(c, ey, 0, C, h, mat_b_rows(lr->bd, (size_t)C * lr->rd, lr->rd), topi, S, C, lr->rd);
    }
    if (out) moe_combine_cuda(c, out, res, ey, NULL, NULL, topw, T, C, k);
}

static void moe_experts_bwd_tiles(cu_ctx *c, bf16 *dx, float *dwg, float *dwu, float *dwd, float *dtopw, bf16 *dg, bf16 *du,
                                  const bf16 *dout, const bf16 *x, const int *topi, const float *topw, const bf16 *eg,
                                  const bf16 *eu, const bf16 *ey, const bf16 *wg, const bf16 *wu, const bf16 *wd, int T, int C,
                                  int E, int k, int Fm, const moe_lora *lr) {
    int S = T * k, rg = lr && lr->agu ? lr->rg : 0, rd = lr && lr->ad ? lr->rd : 0;
    size_t pb = moe_perm_bytes(S, E);
    char *scr = c->failed || T <= 0 ? NULL : (char *)cu_scratch(c, pb + (size_t)S * (C + 2 * (rg + rd)) * sizeof(float));
    if (!scr) return;
    const int *cnt = moe_perm_cuda(c, topi, S, E, scr);
    float *part = (float *)(scr + pb), *tg = part + (size_t)S * C, *hg = tg + (size_t)S * rg, *td = hg + (size_t)S * rg,
          *hd = td + (size_t)S * rd; /* (S, r) each: B^T of a gradient, X A^T */
    moe_lora_src dyw = {dout, NULL, topw, C, 1, 0, 0}; /* w dout[t] */
    moe_dtopw_cuda(c, dtopw, dout, ey, S, C, k);
    if (rd) /* td = w dout Bd_e (S, rd): the down adapter's part of da (moe_rows_kernel<DA>) */
        moe_lora_dot_cuda(c, td, dyw, mat_b_cols(lr->bd, (size_t)C * rd, rd), NO_SRC, NO_MAT, topi, S, k, rd, C);
    moe_rows_args a = moe_rows_of(cnt, E, k, C, Fm, dout, NULL, wd, NULL, dg, du); /* dg, du */
    a.topw = topw;
    a.g = eg;
    a.u = eu;
    a.lt = rd ? td : NULL;
    a.la = rd ? (const bf16 *)lr->ad : NULL;
    a.lr = rd;
    moe_rows_kernel<ROWS_DA><<<moe_rows_grid(S, E, Fm, 1), MOE_NT, 0, c->stream>>>(a);
    CU_LAUNCHED(c, "moe_rows_kernel<DA>");
    a = moe_rows_of(cnt, E, k, Fm, C, dg, du, wg, wu, NULL, NULL); /* dx through both input projections, per slot */
    a.of = part;
    moe_rows_kernel<ROWS_DX><<<moe_rows_grid(S, E, C, 1), MOE_NT, 0, c->stream>>>(a);
    CU_LAUNCHED(c, "moe_rows_kernel<DX>");
    if (rg) { /* tg = dg Bg_e + du Bu_e (S, rg); part += tg Agu_e */
        size_t es = (size_t)2 * Fm * rg;
        const bf16 *bu = (const bf16 *)lr->bgu + (size_t)Fm * rg;
        moe_lora_dot_cuda(c, tg, src_slot(dg, Fm, 0), mat_b_cols(lr->bgu, es, rg), src_slot(du, Fm, 0), mat_b_cols(bu, es, rg),
                          topi, S, k, rg, Fm);
        moe_lora_add_cuda(c, part, 1, C, tg, (moe_lora_mat){(const bf16 *)lr->agu, (size_t)rg * C, 1, (size_t)C}, topi, S, C, rg);
    }
    moe_dx_cuda(c, dx, part, NULL, T, C, k);
    if (dwd) {
        moe_wgrad_args g = {cnt + 3 * E + 2, cnt + E, cnt, k, C, Fm, dout, eg, eu, topw, dwd}; /* moe_perm's arrays */
        moe_wgrad_kernel<WG_DOWN><<<moe_wgrad_grid(C, Fm, E), MOE_NT, 0, c->stream>>>(g);
        CU_LAUNCHED(c, "moe_wgrad_kernel<DOWN>");
    }
    for (int j = 0; j < 2; j++) {
        moe_wgrad_args g = {cnt + 3 * E + 2, cnt + E, cnt, k, Fm, C, j ? du : dg, x, NULL, topw, j ? dwu : dwg};
        if (!g.dw) continue;
        moe_wgrad_kernel<WG_IN><<<moe_wgrad_grid(Fm, C, E), MOE_NT, 0, c->stream>>>(g);
        CU_LAUNCHED(c, "moe_wgrad_kernel<IN>");
    }
    if (rd && (lr->gad || lr->gbd)) { /* dBd_e += Σ (w dout) ⊗ hd, dAd_e += Σ td ⊗ a; hd = a Ad_e^T */
        moe_lora_src sw = src_swiglu(eg, eu, Fm);
        moe_lora_dot_cuda(c, hd, sw, mat_a(lr->ad, rd, Fm), NO_SRC, NO_MAT, topi, S, k, rd, Fm);
        moe_lora_wgrad_cuda(c, lr->gbd, (size_t)C * rd, dyw, src_slot(hd, rd, 1), cnt, E, k, C, rd);
        moe_lora_wgrad_cuda(c, lr->gad, (size_t)rd * Fm, src_slot(td, rd, 1), sw, cnt, E, k, rd, Fm);
    }
    if (rg && (lr->gagu || lr->gbgu)) { /* dBg_e, dBu_e += Σ dg, du ⊗ hg; dAgu_e += Σ tg ⊗ x; hg = x Agu_e^T */
        size_t es = (size_t)2 * Fm * rg;
        moe_lora_dot_cuda(c, hg, src_tok(x, C), mat_a(lr->agu, rg, C), NO_SRC, NO_MAT, topi, S, k, rg, C);
        if (lr->gbgu) {
            moe_lora_wgrad_cuda(c, lr->gbgu, es, src_slot(dg, Fm, 0), src_slot(hg, rg, 1), cnt, E, k, Fm, rg);
            moe_lora_wgrad_cuda(c, lr->gbgu + (size_t)Fm * rg, es, src_slot(du, Fm, 0), src_slot(hg, rg, 1), cnt, E, k, Fm, rg);
        }
        moe_lora_wgrad_cuda(c, lr->gagu, (size_t)rg * C, src_slot(tg, rg, 1), src_tok(x, C), cnt, E, k, rg, C);
    }
}

/* The variant (kernels/tune.h, tune.moe): auto takes the few-slot kernels for a step of at most
 * MOE_FEW_T tokens (decode; what a captured graph holds: they need no host) and the grouped
 * GEMMs above; the tiled kernels are the batch-invariant variant kept for A/B, the one of exact
 * mode, and the one that carries the experts' adapters (moe_lora.cu) where the grouped path
 * cannot (few rows, cuBLAS, ranks or widths not multiples of 8). A stream being captured never
 * takes the grouped GEMMs (they read the counts on the host). */
static int moe_variant(cu_ctx *c, int T, int C, int Fm, const moe_lora *lr) {
    if (cu_exact(c)) return TUNE_MOE_TILES; /* exact mode: one variant at any T */
    int v = c->tune ? c->tune->moe : TUNE_MOE_AUTO;
    if (v == TUNE_MOE_AUTO) v = T <= MOE_FEW_T ? TUNE_MOE_FEW : TUNE_MOE_GROUPED;
    if (lr && (lr->agu || lr->ad) && (v != TUNE_MOE_GROUPED || !moe_lora_grouped_fits(C, Fm, lr))) return TUNE_MOE_TILES;
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if ((v == TUNE_MOE_GROUPED || v == TUNE_MOE_CUBLAS) && cudaStreamIsCapturing(c->stream, &cs) == cudaSuccess &&
        cs != cudaStreamCaptureStatusNone)
        v = lr && (lr->agu || lr->ad) ? TUNE_MOE_TILES : TUNE_MOE_FEW;
    return v;
}

void moe_experts_fwd_cuda(cu_ctx *c, bf16 *out, bf16 *eg, bf16 *eu, bf16 *ey, const bf16 *x, const bf16 *res, const int *topi,
                          const float *topw, const bf16 *wg, const bf16 *wu, const bf16 *wd, int T, int C, int E, int k, int Fm,
                          const moe_lora *lr) {
    if (c->failed || T <= 0) return;
    int v = moe_variant(c, T, C, Fm, lr);
    if (v == TUNE_MOE_TILES) moe_experts_fwd_tiles(c, out, eg, eu, ey, x, res, topi, topw, wg, wu, wd, T, C, E, k, Fm, lr);
    else if (v == TUNE_MOE_FEW) moe_experts_fwd_few(c, out, eg, eu, ey, x, res, topi, topw, wg, wu, wd, T, C, E, k, Fm);
    else moe_experts_fwd_grouped(c, out, eg, eu, ey, x, res, topi, topw, wg, wu, wd, T, C, E, k, Fm, lr);
}

void moe_experts_bwd_cuda(cu_ctx *c, bf16 *dx, float *dwg, float *dwu, float *dwd, float *dtopw, bf16 *dg, bf16 *du,
                          const bf16 *dout, const bf16 *x, const int *topi, const float *topw, const bf16 *eg, const bf16 *eu,
                          const bf16 *ey, const bf16 *wg, const bf16 *wu, const bf16 *wd, int T, int C, int E, int k, int Fm,
                          const moe_lora *lr) {
    if (c->failed || T <= 0) return;
    if (moe_variant(c, T, C, Fm, lr) == TUNE_MOE_TILES)
        moe_experts_bwd_tiles(c, dx, dwg, dwu, dwd, dtopw, dg, du, dout, x, topi, topw, eg, eu, ey, wg, wu, wd, T, C, E, k, Fm, lr);
    else
        moe_experts_bwd_grouped(c, dx, dwg, dwu, dwd, dtopw, dg, du, dout, x, topi, topw, eg, eu, ey, wg, wu, wd, T, C, E, k, Fm,
                                lr);
}

void moe_router_bwd_cuda(cu_ctx *c, bf16 *dx, float *dwr, float *dlogit, const float *dtopw, const float *probs, const int *topi,
                         const bf16 *x, const bf16 *wr, const float *aux_g, const int *count, int T, int C, int E, int k, int norm) {
    bf16 *dlh = c->failed || T <= 0 ? NULL : (bf16 *)cu_scratch(c, (size_t)T * E * sizeof(bf16));
    if (!dlh) return;
    moe_router_bwd_kernel<<<cu_blocks(T, 8), 256, 0, c->stream>>>(dlogit, dlh, dtopw, probs, topi, aux_g, count, T, E, k, norm);
    CU_LAUNCHED(c, "moe_router_bwd_kernel");
    matmul_bwd_cuda(c, dx, dwr, NULL, dlh, x, wr, T, C, E); /* dx += dlogit Wr, dWr += dlogit^T x */
}
