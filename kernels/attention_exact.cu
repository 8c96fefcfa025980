/* attention_exact.cu — the batch-invariant forward of attention.h, taken by
 * attention.cu for every T when tune.exact is set: a query row's out and lse have the same bits
 * whatever the rows beside it, so decode's rows (few queries over the KV pool) equal the training
 * forward's (the packed P+NR micro-batch) for the same query and keys.
 *
 * Why one kernel for both rather than a decode kernel matching the training one: the per-row
 * arithmetic is then the same code by construction (same mma.sync m16n8k16 for Q·K^T and P·V,
 * same online-softmax order, same normalisation), and nothing about it depends on T; the fast
 * wgmma / split-KV kernels stay untouched for exact = 0.
 *
 * A warp takes one kv head g and QW consecutive queries (QW = 16 / HPG for many queries,
 * 1 for decode sizes: only throughput differs), its m16 tile's rows = query-major (query, head)
 * pairs, padded with zero rows; a block is one warp for decode sizes, EX_WARPS warps of
 * consecutive queries for more (they share each K/V tile). The block splits its queries into
 * segments: runs with the same range starts (a0, b0) (a response's tokens; each decode query is
 * its own). For each segment it walks range a's keys in BN-key tiles from a0, then range b's from
 * b0 — tiles aligned to the segment's starts, never to the packed index or the block's place — to
 * the largest end of the segment's rows (an empty range, whatever its start, matches any other
 * empty one and is not walked); a row masks keys past its own end. K/V tiles stream through an
 * NS-stage cp.async ring (the NS - 1 tiles after this one load while it is computed: 4 for
 * decode's lone warp, 2 for the shared blocks). The stages and warps change only when a tile
 * arrives, never a row's arithmetic. A tile wholly past a row's end leaves its
 * state unchanged bit for bit (max unchanged, so the correction is set to exactly 1: fa_tile_step's
 * NOOP; P = 0, the MMA adds exact zeros), so a row's result is a function of its q, its ranges and
 * those keys only. (Without NOOP, exp2(m sc2 - u) with the product fused was 1 + ~1e-7 on such
 * tiles: out still equal in bf16, but 6 of 256 lse values differed at P=1024 on the H200.) K/V rows
 * past the segment's end are zero-filled, never read. Empty rows: out 0, lse -inf. */
#include "kernels/attention_tiles.cuh"

enum { EX_BN = 32, EX_DECODE_T = 256, EX_WARPS = 4, EX_DEC_NS = 4 };

template <int D> struct ex_attn_shape {
    static constexpr int ST = D + 8;
    static size_t smem(int w, int ns) { return ((size_t)w * 16 + 2 * ns * EX_BN) * ST * sizeof(bf16); }
};

/* W warps a block: warp w takes queries [t0 + w qw, t0 + (w + 1) qw) (its 16 rows, its own Q tile);
 * the segments are the block's (runs of equal range starts over all its queries), each walked
 * to the largest end of its rows in the block; the K/V tiles are loaded by all W warps into one
 * ring and read by each. A row sees the tiles a lone warp would give it (aligned to its range
 * starts) plus tiles wholly past its end, which leave it unchanged (NOOP): the same bits for any
 * W and any queries beside it. */
template <int D, int W, int NS>
__global__ void __launch_bounds__(32 * W) attn_exact_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                                                            attn_ranges r, int T, int H, int K, int qw, float sc2) {
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
        float o[1][D / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
        fa_zero(o);
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
                float sa[1][NT][4];
                fa_zero(sa);
                mma_abt<1, NT, D>(sa, q_s, k_s + st * EX_BN * ST, ST);
                const int e0 = s ? eb0 : ea0, e1 = s ? eb1 : ea1;
                fa_tile_step<NT, D, true>(o, sa, m, l, sc2, v_s + st * EX_BN * ST, ST,
                                          [&](int n, int e, int hf) { return j0 + n * 8 + 2 * (lane & 3) + e < (hf ? e1 : e0); });
            }
            if (W > 1) __syncthreads(); /* stage st is free */
            else __syncwarp();
            advance(s, j0);
            st = (st + 1) % NS;
        }
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float L = l[hf];
            L += __shfl_xor_sync(FULL, L, 1);
            L += __shfl_xor_sync(FULL, L, 2);
            const int row = hf ? r1 : r0, qq = hf ? q1 : q0;
            if (!(hf ? in1 : in0)) continue;
            const size_t oi = (size_t)qq * H + g * hpg + row % hpg;
            const float inv = L > 0.0f ? 1.0f / L : 0.0f;
            bf162 *dst = (bf162 *)(out + oi * D) + (lane & 3);
#pragma unroll
            for (int n = 0; n < D / 8; n++) dst[4 * n] = __floats2bfloat162_rn(o[0][n][2 * hf] * inv, o[0][n][2 * hf + 1] * inv);
            if ((lane & 3) == 0) lse[oi] = m[hf] == -INFINITY ? -INFINITY : (m[hf] * sc2 + log2f(L)) * LN2;
        }
        i = j;
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

/* the head dims exact mode runs (the m16n8k16 steps want D % 16 == 0), a launcher each */
template <int D>
static void attn_exact_run(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T, int H,
                           int K, int qw, float sc2) {
    if (T <= EX_DECODE_T) attn_exact_launch<D, 1, EX_DEC_NS>(c, out, lse, q, k, v, r, T, H, K, qw, sc2); /* a block a query's heads */
    else attn_exact_launch<D, EX_WARPS, 2>(c, out, lse, q, k, v, r, T, H, K, qw, sc2); /* EX_WARPS warps share the K/V tiles */
}
typedef void (*attn_exact_fn)(cu_ctx *, bf16 *, float *, const bf16 *, const bf16 *, const bf16 *, attn_ranges, int, int, int, int, float);
static const struct {
    int D;
    attn_exact_fn run;
} ex_dims[] = {{16, attn_exact_run<16>}, {32, attn_exact_run<32>}, {64, attn_exact_run<64>}, {128, attn_exact_run<128>},
               {256, attn_exact_run<256>}};

int attn_exact_fwd_cuda(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T,
                        int H, int K, int D) {
    const int hpg = K > 0 && H % K == 0 ? H / K : 0;
    attn_exact_fn run = NULL;
    for (size_t i = 0; i < sizeof ex_dims / sizeof ex_dims[0]; i++)
        if (ex_dims[i].D == D) run = ex_dims[i].run;
    if (!run || hpg < 1 || hpg > 16) {
        char what[112];
        snprintf(what, sizeof what, "exact mode: head dim %d with %d query heads a kv head (supported: 16, 32, 64, 128, 256; 1-16)", D,
                 hpg);
        cu_fail(c, "attention", what, __FILE__, __LINE__);
        return 1;
    }
    run(c, out, lse, q, k, v, r, T, H, K, T <= EX_DECODE_T ? 1 : 16 / hpg, LOG2E / sqrtf((float)D));
    return 1;
}
