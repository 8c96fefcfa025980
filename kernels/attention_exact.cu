/* attention_exact.cu — the batch-invariant forward of attention.h, taken by
 * attention.cu for every T when tune.exact is set: a query row's out and lse have the same bits
 * whatever the rows beside it, so decode's rows (few queries over the KV pool) equal the training
 * forward's (the packed P+NR micro-batch) for the same query and keys.
 *
 * A row's arithmetic, in both kernels below: its keys in spans of EX_SPAN tiles of EX_BN keys —
 * range a's from a0, then range b's from b0 (aligned to the range starts, never to the packed
 * index or the block's place) — each span's online softmax from a fresh state (same mma.sync
 * m16n8k16 for Q·K^T and P·V, fa_tile_step), the spans' states merged in that order (ex_merge),
 * then normalised (ex_store). Nothing about it depends on T, the rows beside it or the kernel;
 * the fast wgmma / split-KV kernels stay untouched for exact = 0.
 *
 * Training (T > EX_DECODE_T): a warp takes one kv head g and QW = 16 / HPG consecutive queries,
 * its m16 tile's rows = query-major (query, head) pairs, padded with zero rows; a block is
 * EX_WARPS warps of consecutive queries (they share each K/V tile). The block splits its queries
 * into segments: runs with the same range starts (a0, b0) (a response's tokens). For each segment
 * it walks range a's tiles, then range b's, to the largest end of the segment's rows (an empty
 * range, whatever its start, matches any other empty one and is not walked), closing a span at
 * each span boundary; a row masks keys past its own end. K/V tiles stream through a 2-stage
 * cp.async ring. A tile wholly past a row's end leaves its state unchanged bit for bit (max
 * unchanged, so the correction is set to exactly 1: fa_tile_step's NOOP; P = 0, the MMA adds
 * exact zeros), and so does a span wholly past it (ex_merge skips a row with no key), so a row's
 * result is a function of its q, its ranges and those keys only. (Without NOOP, exp2(m sc2 - u)
 * with the product fused was 1 + ~1e-7 on such tiles: out still equal in bf16, but 6 of 256 lse
 * values differed at P=1024 on the H200.) K/V rows past the segment's end are zero-filled, never
 * read. Empty rows: out 0, lse -inf.
 *
 * Decode (T <= EX_DECODE_T): attn_exact_dec_kernel (below): a tile of the queries that fill
 * an m16 tile and a kv head a cluster, the tile's spans spread over the cluster's warps (a
 * group's prompt tiles read once a tile, its spans walked on as many SMs), their states merged
 * in span order through distributed shared memory. */
#include <cooperative_groups.h>

#include "kernels/attention_tiles.cuh"

enum { EX_BN = 32, EX_DECODE_T = 256, EX_WARPS = 4, EX_SPAN = 4, EX_DEC_NS = 2 };

template <int D> struct ex_attn_shape {
    static constexpr int ST = D + 8;
    static size_t smem(int w, int ns) { return ((size_t)w * 16 + 2 * ns * EX_BN) * ST * sizeof(bf16); }
    /* the decode kernel with clusters of cs blocks: Q, dec_w warps' K/V rings, then dec_w span
     * slots of 32 lanes x SL floats (one block an SM at cs = 1, two else up to D = 128) */
    static constexpr int SL = D / 2 + 4, DEC_NS = D > 128 ? 2 : EX_DEC_NS;
    __host__ __device__ static constexpr int dec_w(int cs) { return cs > 1 || D > 128 ? 2 : 4; }
    static constexpr size_t dec_smem(int cs) {
        return ((size_t)16 + 2 * dec_w(cs) * DEC_NS * EX_BN) * ST * sizeof(bf16) + (size_t)dec_w(cs) * SL * 32 * 4;
    }
};

/* One thread's online-softmax state for its two rows (lane / 4 and + 8): the accumulator o, the
 * running max m (raw units, the same in a row's four lanes) and the thread-partial sum l. */
template <int D> struct ex_state { float o[1][D / 8][4], m[2], l[2]; };
template <int D> __device__ __forceinline__ void ex_fresh(ex_state<D> &s) {
    fa_zero(s.o);
    s.m[0] = s.m[1] = -INFINITY;
    s.l[0] = s.l[1] = 0.0f;
}

/* A merge's scales for one row, running max rm and span max sm (not -inf): the larger max M
 * (returned), ar for the running side, as for the span's (a side already at M by exactly 1). The
 * roundings are spelled out (no contraction left to the compiler), so every merge — the training
 * kernel's, the decode kernel's split over a cluster — does the same arithmetic. */
__device__ __forceinline__ float ex_scales(float rm, float sm, float sc2, float &ar, float &as) {
    const float M = fmaxf(rm, sm), u = __fmul_rn(M, sc2);
    ar = rm == M ? 1.0f : fa_ex2(__fsub_rn(__fmul_rn(rm, sc2), u));
    as = sm == M ? 1.0f : fa_ex2(__fsub_rn(__fmul_rn(sm, sc2), u));
    return M;
}
__device__ __forceinline__ float ex_fold(float r, float s, float ar, float as) { return __fmaf_rn(s, as, __fmul_rn(r, ar)); }

/* r = r (+) s, a span's state merged into the running one, row by row: a row of s with no key
 * (max -inf) leaves r's row unchanged bit for bit; else both rescale to the larger max. */
template <int D> __device__ __forceinline__ void ex_merge(ex_state<D> &r, const ex_state<D> &s, float sc2) {
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        if (s.m[hf] == -INFINITY) continue;
        float ar, as;
        r.m[hf] = ex_scales(r.m[hf], s.m[hf], sc2, ar, as);
        r.l[hf] = ex_fold(r.l[hf], s.l[hf], ar, as);
#pragma unroll
        for (int n = 0; n < D / 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) r.o[0][n][2 * hf + e] = ex_fold(r.o[0][n][2 * hf + e], s.o[0][n][2 * hf + e], ar, as);
    }
}

/* a row's 1 / L and lse from its max m and its four lanes' sums summed as ex_store's shuffles do */
__device__ __forceinline__ float ex_inv(float L) { return L > 0.0f ? 1.0f / L : 0.0f; }
__device__ __forceinline__ float ex_lse(float m, float L, float sc2) {
    return m == -INFINITY ? -INFINITY : __fmul_rn(__fmaf_rn(m, sc2, log2f(L)), LN2);
}

/* out and lse of the thread's rows in (row hf's output index oi[hf]); all 32 lanes call it */
template <int D>
__device__ __forceinline__ void ex_store(const ex_state<D> &s, const bool (&in)[2], const size_t (&oi)[2], bf16 *out, float *lse,
                                         float sc2) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float L = s.l[hf];
        L += __shfl_xor_sync(FULL, L, 1);
        L += __shfl_xor_sync(FULL, L, 2);
        if (!in[hf]) continue;
        const float inv = ex_inv(L);
        bf162 *dst = (bf162 *)(out + oi[hf] * D) + (lane & 3);
#pragma unroll
        for (int n = 0; n < D / 8; n++) dst[4 * n] = __floats2bfloat162_rn(s.o[0][n][2 * hf] * inv, s.o[0][n][2 * hf + 1] * inv);
        if ((lane & 3) == 0) lse[oi[hf]] = ex_lse(s.m[hf], L, sc2);
    }
}

/* W warps a block: warp w takes queries [t0 + w qw, t0 + (w + 1) qw) (its 16 rows, its own Q tile);
 * the segments are the block's (runs of equal range starts over all its queries), each walked
 * to the largest end of its rows in the block; the K/V tiles are loaded by all W warps into one
 * ring and read by each. A row sees the tiles a lone warp would give it (aligned to its range
 * starts) plus tiles wholly past its end, which leave it unchanged (NOOP): the same bits for any
 * W and any queries beside it. Three blocks an SM up to D = 128 (168 registers): the running
 * state, touched once a span, is what the compiler spills (376 bytes at D = 128; 254 registers
 * and two blocks an SM without the bound). */
template <int D, int W, int NS>
__global__ void __launch_bounds__(32 * W, D <= 128 ? 3 : 1)
    attn_exact_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T, int H, int K,
                      int qw, float sc2) {
    constexpr int ST = ex_attn_shape<D>::ST, NT = EX_BN / 8;
    extern __shared__ __align__(16) bf16 ex_sm[]; /* q [W][16][ST], then k, v [NS stages][EX_BN][ST] */
    const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5, g = blockIdx.y, hpg = H / K;
    const int tb = blockIdx.x * W * qw, t0 = tb + wp * qw;
    const int nqb = min(W * qw, T - tb), nq = max(0, min(qw, T - t0)), rows = nq * hpg;
    bf16 *const q_s = ex_sm + wp * 16 * ST, *const k_s = ex_sm + W * 16 * ST, *const v_s = k_s + NS * EX_BN * ST;
    for (int i = lane; i < 16 * (D / 8); i += 32) {
        int row = i / (D / 8), c8 = i % (D / 8), t = t0 + row / hpg, h = g * hpg + row % hpg;
        bool ok = row < rows;
        fa_cp16(q_s + row * ST + c8 * 8, ok ? q + ((size_t)t * H + h) * D + c8 * 8 : q, ok);
    }
    fa_commit();
    /* this thread's two rows (lane / 4 and + 8) and their queries */
    const int r0 = lane >> 2, r1 = r0 + 8;
    const int q0 = r0 < rows ? t0 + r0 / hpg : -1, q1 = r1 < rows ? t0 + r1 / hpg : -1;
    /* a range's start, or INT_MIN when it is empty (pack.c gives empty ranges any start) */
    auto start = [&](int t, int s) {
        int lo = s ? r.b0[t] : r.a0[t], hi = s ? r.b1[t] : r.a1[t];
        return hi > lo ? lo : INT_MIN;
    };
    for (int i = 0; i < nqb;) {
        const int t = tb + i, a0 = start(t, 0), b0 = start(t, 1);
        int j = i + 1, ahi = a0 == INT_MIN ? a0 : r.a1[t], bhi = b0 == INT_MIN ? b0 : r.b1[t];
        while (j < nqb && start(tb + j, 0) == a0 && start(tb + j, 1) == b0) {
            if (a0 != INT_MIN) ahi = max(ahi, r.a1[tb + j]);
            if (b0 != INT_MIN) bhi = max(bhi, r.b1[tb + j]);
            j++;
        }
        /* rows of queries [t, tb + j) */
        const bool in0 = q0 >= t && q0 < tb + j, in1 = q1 >= t && q1 < tb + j;
        const bool any = __any_sync(FULL, in0 || in1); /* this warp has rows in the segment */
        ex_state<D> run, sp; /* the merged spans; the span being walked */
        ex_fresh(run);
        ex_fresh(sp);
        /* the segment's tiles, pass s (0: a, 1: b) from its start; a row's end in each pass
         * (INT_MIN for rows outside the segment: every key masked) */
        const int ea0 = in0 ? r.a1[q0] : INT_MIN, ea1 = in1 ? r.a1[q1] : INT_MIN;
        const int eb0 = in0 ? r.b1[q0] : INT_MIN, eb1 = in1 ? r.b1[q1] : INT_MIN;
        auto to_pass = [&](int &s, int &j0) {
            for (; s < 2; s++)
                if ((s ? b0 : a0) < (s ? bhi : ahi)) {
                    j0 = s ? b0 : a0;
                    return;
                }
        };
        auto issue = [&](int st, int s, int j0) {
            const int hi = s ? bhi : ahi;
            bf16 *ks = k_s + st * EX_BN * ST, *vs = v_s + st * EX_BN * ST;
            for (int x = tid; x < EX_BN * (D / 8); x += 32 * W) {
                int kk = x / (D / 8), c8 = x % (D / 8), jj = j0 + kk;
                bool ok = jj < hi;
                size_t off = ok ? ((size_t)jj * K + g) * D + c8 * 8 : 0;
                fa_cp16(ks + kk * ST + c8 * 8, k + off, ok);
                fa_cp16(vs + kk * ST + c8 * 8, v + off, ok);
            }
        };
        /* the tile after (s, j0) in the walk */
        auto advance = [&](int &s, int &j0) {
            j0 += EX_BN;
            if (j0 >= (s ? bhi : ahi)) {
                s++;
                to_pass(s, j0);
            }
        };
        /* the walk's first NS - 1 tiles in flight; then each tile's compute overlaps the loads
         * of the NS - 1 after it */
        int s = 0, j0 = 0, si, ji, st = 0;
        to_pass(s, j0);
        si = s, ji = j0; /* the next tile to load */
#pragma unroll
        for (int p = 0; p < NS - 1; p++) {
            if (si < 2) {
                issue(p, si, ji);
                advance(si, ji);
            }
            fa_commit();
        }
        while (s < 2) { /* tile (s, j0) in stage st */
            if (si < 2) {
                issue((st + NS - 1) % NS, si, ji);
                advance(si, ji);
            }
            fa_commit();
            fa_wait<NS - 1>();
            if (W > 1) __syncthreads();
            else __syncwarp();
            if (any) {
                if ((j0 - (s ? b0 : a0)) / EX_BN % EX_SPAN == 0) { /* a span starts */
                    ex_merge(run, sp, sc2);
                    ex_fresh(sp);
                }
                float sa[1][NT][4];
                fa_zero(sa);
                mma_abt<1, NT, D>(sa, q_s, k_s + st * EX_BN * ST, ST);
                const int e0 = s ? eb0 : ea0, e1 = s ? eb1 : ea1;
                fa_tile_step<NT, D, true>(sp.o, sa, sp.m, sp.l, sc2, v_s + st * EX_BN * ST, ST,
                                          [&](int n, int e, int hf) { return j0 + n * 8 + 2 * (lane & 3) + e < (hf ? e1 : e0); });
            }
            if (W > 1) __syncthreads(); /* stage st is free */
            else __syncwarp();
            advance(s, j0);
            st = (st + 1) % NS;
        }
        ex_merge(run, sp, sc2);
        const bool in[2] = {in0, in1};
        const size_t oi[2] = {(size_t)q0 * H + g * hpg + r0 % hpg, (size_t)q1 * H + g * hpg + r1 % hpg};
        ex_store(run, in, oi, out, lse, sc2);
        i = j;
    }
}

/* Decode (T <= EX_DECODE_T): a cluster of CS blocks (8, 4, 2: the widest whose blocks fit the
 * SMs in one wave; 1 past that) takes a tile of qb = 16 / HPG consecutive queries (the m16
 * tile's rows: a group's responses) and a kv head; its CS x W warps walk the tile's spans at
 * once — span sp by warp (sp / CS) % W of block sp % CS, each through the warp's own
 * DEC_NS-stage ring and from a fresh state, so one group's prompt spans go to as many SMs as
 * there are spans and each prompt tile is read once a tile. The spans are those of the tile's
 * segments: the runs of its queries with equal range-a starts, then those with equal range-b
 * starts (an empty range is not walked), EX_SPAN tiles each from the segment's start up to the
 * largest end of its queries; a row takes part in its own segments only (in the others every
 * key is masked: its state stays fresh, and the merge skips it).
 * After each round of CS x W spans the states wait in their warps' slots, and the cluster's
 * threads merge them in span order through distributed shared memory, each thread one row's
 * lane of a quad and a slice of its columns (the scales depend on the maxima only, so the slices
 * share them), with ex_merge's arithmetic, into running states they hold; after the last round
 * they store out and lse as ex_store does. So a row sees its range a's spans, then its range
 * b's, with the tiles, tile steps and merges the training kernel's walk gives it (which adds
 * only tiles and spans past the row's end, which leave it unchanged): the same bits for any
 * tile, cluster or batch. */
enum { EX_DEC_SEG = 32 }; /* segments a tile (two a query) */
template <int D, int CS>
__global__ void __launch_bounds__(32 * ex_attn_shape<D>::dec_w(CS))
    attn_exact_dec_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T, int H, int K,
                          int qb, float sc2) {
    constexpr int ST = ex_attn_shape<D>::ST, SL = ex_attn_shape<D>::SL, W = ex_attn_shape<D>::dec_w(CS),
                  NS = ex_attn_shape<D>::DEC_NS;
    constexpr int S = CS * W, NT = EX_BN / 8, SK = EX_SPAN * EX_BN;
    /* the merge: 16 rows x 4 lanes of a quad x PT slices of NPT column groups (8 wide) each */
    constexpr int PT = S / 2 < D / 8 ? S / 2 : D / 8, NPT = D / 8 / PT, MB = S < 8 ? S : 8; /* MB: spans a load batch */
    static_assert(S % MB == 0, "attn_exact_dec_kernel: whole load batches");
    static_assert(16 * 4 * PT <= 32 * S, "attn_exact_dec_kernel: a merge item a thread");
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    /* the cluster's barrier (the block's alone), block x's slots (this block's alone) */
    auto csync = [&] {
        if constexpr (CS > 1) cl.sync();
        else __syncthreads();
    };
    extern __shared__ __align__(16) bf16 ex_sm[]; /* q [16][ST], k [W][NS][EX_BN][ST], v likewise, slots [W][SL][32] floats */
    __shared__ int seg_lo[EX_DEC_SEG], seg_hi[EX_DEC_SEG], seg_cum[EX_DEC_SEG + 1], rng[2][16][2];
    __shared__ unsigned seg_mask[EX_DEC_SEG]; /* bit i: query t0 + i takes part; bit 31: a range-b segment */
    const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5, rank = CS > 1 ? (int)cl.block_rank() : 0, g = blockIdx.y,
              hpg = H / K;
    const int t0 = blockIdx.x / CS * qb, nq = min(qb, T - t0), rows = nq * hpg;
    bf16 *const q_s = ex_sm, *const k_s = q_s + 16 * ST + wp * NS * EX_BN * ST, *const v_s = k_s + W * NS * EX_BN * ST;
    float *const slots = (float *)(ex_sm + 16 * ST + 2 * W * NS * EX_BN * ST);
    /* the tile's ranges (written by nothing in flight), read before the wait */
    if (tid < 2 * qb) {
        const int p = tid / qb, i = tid % qb;
        rng[p][i][0] = i < nq ? (p ? r.b0[t0 + i] : r.a0[t0 + i]) : 0;
        rng[p][i][1] = i < nq ? (p ? r.b1[t0 + i] : r.a1[t0 + i]) : 0;
    }
    pdl_wait();
    pdl_trigger();
    for (int i = tid; i < 16 * (D / 8); i += 32 * W) {
        const int row = i / (D / 8), c8 = i % (D / 8);
        const bool ok = row < rows;
        fa_cp16(q_s + row * ST + c8 * 8, ok ? q + ((size_t)(t0 + row / hpg) * H + g * hpg + row % hpg) * D + c8 * 8 : q, ok);
    }
    fa_commit();
    __syncthreads();
    if (tid == 0) { /* the segments and their first span's index */
        int ns = 0;
        seg_cum[0] = 0;
        for (int s = 0; s < 2; s++)
            for (int i = 0; i < nq; i++) {
                const int lo = rng[s][i][0], hi = rng[s][i][1];
                if (hi <= lo) continue;
                if (ns && (seg_mask[ns - 1] >> 31) == (unsigned)s && seg_lo[ns - 1] == lo) {
                    seg_mask[ns - 1] |= 1u << i;
                    seg_hi[ns - 1] = max(seg_hi[ns - 1], hi);
                } else {
                    seg_lo[ns] = lo, seg_hi[ns] = hi, seg_mask[ns] = (unsigned)s << 31 | 1u << i;
                    ns++;
                }
            }
        for (int j = 0; j < ns; j++) seg_cum[j + 1] = seg_cum[j] + (seg_hi[j] - seg_lo[j] + SK - 1) / SK;
        for (int j = ns; j < EX_DEC_SEG; j++) seg_cum[j + 1] = seg_cum[j];
    }
    __syncthreads();
    const int n = seg_cum[EX_DEC_SEG], slot = wp * CS + rank;
    const int r0 = lane >> 2, r1 = r0 + 8;
    const bool in[2] = {r0 < rows, r1 < rows};
    const int i0 = r0 / hpg, i1 = r1 / hpg; /* the rows' queries in the tile */
    /* a walk over this warp's tiles: span sp (sp >= n: done) of segment sg, tile j0, the span's end je */
    struct walk {
        int sp, sg, j0, je;
    };
    auto span_at = [&](walk &w, int sp) {
        w.sp = sp;
        if (sp >= n) return;
        int j = 0;
        while (seg_cum[j + 1] <= sp) j++;
        w.sg = j;
        w.j0 = seg_lo[j] + (sp - seg_cum[j]) * SK;
        w.je = min(w.j0 + SK, seg_hi[j]);
    };
    auto advance = [&](walk &w) {
        w.j0 += EX_BN;
        if (w.j0 >= w.je) span_at(w, w.sp + S);
    };
    /* a row's end in segment sg (INT_MIN: not its segment, every key masked) */
    auto row_end = [&](int sg, bool ok, int i) {
        const unsigned m = seg_mask[sg];
        if (!ok || !(m >> i & 1u)) return INT_MIN;
        return m >> 31 ? rng[1][i][1] : rng[0][i][1];
    };
    auto issue = [&](int st, const walk &w) {
        bf16 *ks = k_s + st * EX_BN * ST, *vs = v_s + st * EX_BN * ST;
        for (int x = lane; x < EX_BN * (D / 8); x += 32) {
            const int kk = x / (D / 8), c8 = x % (D / 8), jj = w.j0 + kk;
            const bool ok = jj < w.je;
            const size_t off = ok ? ((size_t)jj * K + g) * D + c8 * 8 : 0;
            fa_cp16(ks + kk * ST + c8 * 8, k + off, ok);
            fa_cp16(vs + kk * ST + c8 * 8, v + off, ok);
        }
    };
    walk ld, cw; /* the next tile to load; the tile to compute */
    span_at(ld, slot);
    span_at(cw, slot);
#pragma unroll
    for (int p = 0; p < NS - 1; p++) {
        if (ld.sp < n) {
            issue(p, ld);
            advance(ld);
        }
        fa_commit();
    }
    fa_wait<NS - 1>(); /* Q landed (the oldest group), its rows loaded by every warp */
    __syncthreads();
    /* this thread's merge item: row mr (lane ml of its quad), column groups [mp NPT, + NPT) */
    const int it = rank * 32 * W + tid, mr = it / (4 * PT), mc = it / PT % 4, mp = it % PT;
    const bool mine = mr < rows; /* (it < 64 PT, as rows <= 16) */
    const int mlane = (mr & 7) * 4, mhf = mr >> 3;
    float rm = -INFINITY, rl[4] = {0.0f, 0.0f, 0.0f, 0.0f}, ro[NPT][2];
#pragma unroll
    for (int j = 0; j < NPT; j++) ro[j][0] = ro[j][1] = 0.0f;
    int st = 0;
    for (int base = 0; base < n; base += S) {
        if (base + slot < n) { /* (then cw.sp == base + slot) */
            ex_state<D> sp;
            ex_fresh(sp);
            const int e0 = row_end(cw.sg, in[0], i0), e1 = row_end(cw.sg, in[1], i1), my = cw.sp;
            while (cw.sp == my) {
                if (ld.sp < n) {
                    issue((st + NS - 1) % NS, ld);
                    advance(ld);
                }
                fa_commit();
                fa_wait<NS - 1>();
                __syncwarp();
                float sa[1][NT][4];
                fa_zero(sa);
                mma_abt<1, NT, D>(sa, q_s, k_s + st * EX_BN * ST, ST);
                const int j0 = cw.j0;
                fa_tile_step<NT, D, true>(sp.o, sa, sp.m, sp.l, sc2, v_s + st * EX_BN * ST, ST, [&](int nn, int ee, int hf) {
                    return j0 + nn * 8 + 2 * (lane & 3) + ee < (hf ? e1 : e0);
                });
                __syncwarp(); /* stage st is free */
                advance(cw);
                st = (st + 1) % NS;
            }
            float *sl = slots + (size_t)wp * SL * 32 + lane;
#pragma unroll
            for (int i = 0; i < D / 2; i++) sl[i * 32] = sp.o[0][i / 4][i % 4];
            sl[(D / 2) * 32] = sp.m[0], sl[(D / 2 + 1) * 32] = sp.m[1];
            sl[(D / 2 + 2) * 32] = sp.l[0], sl[(D / 2 + 3) * 32] = sp.l[1];
        }
        csync(); /* the round's spans are in their slots */
        /* span base + x: warp x / CS of block x % CS; MB spans' values loaded at once (a slot
         * no warp filled this round is read but not used) */
        if (mine)
            for (int x0 = 0; x0 < S && base + x0 < n; x0 += MB) {
                float vm[MB], vl[MB][4], vo[MB][NPT][2];
#pragma unroll
                for (int y = 0; y < MB; y++) {
                    const float *sl = (CS > 1 ? cl.map_shared_rank(slots, (x0 + y) % CS) : slots) +
                        (size_t)((x0 + y) / CS) * SL * 32 + mlane;
                    vm[y] = sl[(D / 2 + mhf) * 32];
#pragma unroll
                    for (int c = 0; c < 4; c++) vl[y][c] = sl[(D / 2 + 2 + mhf) * 32 + c];
#pragma unroll
                    for (int j = 0; j < NPT; j++)
#pragma unroll
                        for (int e = 0; e < 2; e++) vo[y][j][e] = sl[((mp * NPT + j) * 4 + 2 * mhf + e) * 32 + mc];
                }
#pragma unroll
                for (int y = 0; y < MB; y++) {
                    if (base + x0 + y >= n || vm[y] == -INFINITY) continue;
                    float ar, as;
                    rm = ex_scales(rm, vm[y], sc2, ar, as);
#pragma unroll
                    for (int c = 0; c < 4; c++) rl[c] = ex_fold(rl[c], vl[y][c], ar, as);
#pragma unroll
                    for (int j = 0; j < NPT; j++)
#pragma unroll
                        for (int e = 0; e < 2; e++) ro[j][e] = ex_fold(ro[j][e], vo[y][j][e], ar, as);
                }
            }
        csync(); /* the slots are free */
    }
    if (mine) {
        const float L = (rl[0] + rl[1]) + (rl[2] + rl[3]), inv = ex_inv(L);
        const size_t oi = (size_t)(t0 + mr / hpg) * H + g * hpg + mr % hpg;
        bf162 *dst = (bf162 *)(out + oi * D) + mc;
#pragma unroll
        for (int j = 0; j < NPT; j++) dst[4 * (mp * NPT + j)] = __floats2bfloat162_rn(ro[j][0] * inv, ro[j][1] * inv);
        if (mc == 0 && mp == 0) lse[oi] = ex_lse(rm, L, sc2);
    }
}

template <int D, int W, int NS>
static void attn_exact_launch(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T,
                              int H, int K, int qw, float sc2) {
    static unsigned done;
    const size_t smem = ex_attn_shape<D>::smem(W, NS);
    cu_raise_smem(c, attn_exact_kernel<D, W, NS>, smem, &done);
    if (c->failed) return;
    const dim3 grid((T + W * qw - 1) / (W * qw), K);
    attn_exact_kernel<D, W, NS><<<grid, 32 * W, smem, c->stream>>>(out, lse, q, k, v, r, T, H, K, qw, sc2);
    CU_LAUNCHED(c, "attn_exact_kernel");
}

typedef void (*attn_exact_fn)(cu_ctx *, bf16 *, float *, const bf16 *, const bf16 *, const bf16 *, attn_ranges, int, int, int,
                              int, float);

template <int D, int CS>
static void attn_exact_dec_launch(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r,
                                  int T, int H, int K, int qw, float sc2) {
    static unsigned done;
    constexpr size_t smem = ex_attn_shape<D>::dec_smem(CS);
    cu_raise_smem(c, attn_exact_dec_kernel<D, CS>, smem, &done);
    if (c->failed) return;
    cu_launch_ex(c, "attn_exact_dec_kernel", attn_exact_dec_kernel<D, CS>, dim3((T + qw - 1) / qw * CS, K),
                 dim3(32 * ex_attn_shape<D>::dec_w(CS)), smem, CS, out, lse, q, k, v, r, T, H, K, qw, sc2);
}

/* the head dims exact mode runs (the m16n8k16 steps want D % 16 == 0), a launcher each */
template <int D>
static void attn_exact_run(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T,
                           int H, int K, int qw, float sc2) {
    if (T > EX_DECODE_T) { /* EX_WARPS warps share the K/V tiles */
        attn_exact_launch<D, EX_WARPS, 2>(c, out, lse, q, k, v, r, T, H, K, qw, sc2);
        return;
    }
    /* clusters as wide as fit the SMs in one wave (two blocks an SM), down to one block a tile */
    static const attn_exact_fn dec[] = {attn_exact_dec_launch<D, 8>, attn_exact_dec_launch<D, 4>, attn_exact_dec_launch<D, 2>,
                                        attn_exact_dec_launch<D, 1>};
    const long long tiles = (long long)((T + qw - 1) / qw) * K;
    int i = 0;
    while (i < 3 && tiles * (8 >> i) > 2LL * c->n_sm) i++;
    dec[i](c, out, lse, q, k, v, r, T, H, K, qw, sc2);
}
static const struct {
    int D;
    attn_exact_fn run;
} ex_dims[] = {{16, attn_exact_run<16>},
               {32, attn_exact_run<32>},
               {64, attn_exact_run<64>},
               {128, attn_exact_run<128>},
               {256, attn_exact_run<256>}};

int attn_exact_fwd_cuda(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T,
                        int H, int K, int D) {
    const int hpg = K > 0 && H % K == 0 ? H / K : 0;
    attn_exact_fn run = NULL;
    for (size_t i = 0; i < sizeof ex_dims / sizeof ex_dims[0]; i++)
        if (ex_dims[i].D == D) run = ex_dims[i].run;
    if (!run || hpg < 1 || hpg > 16) {
        char what[112];
        snprintf(what, sizeof what,
                 "exact mode: head dim %d with %d query heads a kv head (supported: 16, 32, 64, 128, 256; 1-16)", D, hpg);
        cu_fail(c, "attention", what, __FILE__, __LINE__);
        return 1;
    }
    run(c, out, lse, q, k, v, r, T, H, K, 16 / hpg, LOG2E / sqrtf((float)D));
    return 1;
}
