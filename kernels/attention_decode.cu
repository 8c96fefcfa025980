/* attention_decode.cu — the small-T (decode) forward of attention.h (attention.cu asks it first);
 * the mma / ldmatrix / cp.async helpers are attention_tiles.cuh's.
 *
 * Bifurcated split-KV ("flash-decoding") on tensor cores, one launch. A cluster of CS = DEC_CS
 * blocks owns a tile of CS consecutive queries and one kv head g: all HPG = H/K query heads that
 * read it. Block `rank` runs two passes over 64-key chunks streamed through a 2-stage cp.async
 * ring:
 *   shared ([a0, a1)), the tile's ROWS = CS * HPG query rows (row = query * HPG + head, padded to
 *     MT m16 tiles): consecutive queries with the same range form a segment (the responses of a
 *     group in the tile) and split `rank` of each segment's keys is computed for all its rows at
 *     once, so a prompt's K/V is read once per step per tile for all its responses and all HPG
 *     heads (a group of N = 16 spans two tiles), spread over the cluster's blocks;
 *   own ([b0, b1)): query t0 + rank's HPG rows over its own keys; the shared pass issues the
 *     own pass's first chunk into the free stage as it runs out of its own, so the ring does
 *     not drain between the passes.
 * In a pass the 4 warps split a chunk WK ways (WK = 4 / MT) and each runs S = Q·K^T and
 * O += P·V with mma.sync on its 16 rows, online softmax in fp32 (log2 domain); the WK partial
 * states of a row are combined through shared memory into the pass's state per row: (max, sum)
 * and the unnormalised accumulator. The shared state waits in registers (a slice a thread)
 * while the own pass runs, then both go to shared memory; after a cluster barrier block `rank`
 * merges its query's rows: the CS shared states (distributed shared memory, ranks in order),
 * then its own state, into out and lse (natural log of the scaled scores); a second barrier
 * keeps every block's states alive until all have read them. Every query's rows go through the
 * same sequence of operations whatever its place in the tile, so identical responses stay
 * identical (greedy decoding of one prompt N times). No partials go through global memory and
 * there is no merge kernel. Empty rows give out = 0, lse = -inf, as the CPU reference.
 *
 * The grid depends only on T (and the model dims): ranges are read from device memory, so the
 * launch can be captured in a CUDA graph. Used for D = 64 / 128 / 256 and H/K in {1, 2, 4, 8}; at
 * D = 256 (Qwen3.5's gated layers) a block needs ~150 KB (one an SM) and a thread's accumulator
 * of 16 rows x 256 is 128 registers. */
#include <cooperative_groups.h>

#include "kernels/attention_tiles.cuh"

/* DEC_CS blocks a cluster = queries a tile. Measured on the H200 (bench_attn decode, Qwen3-1.7B
 * heads, P = 1024, N = 16): clusters of 16 (a group's 16 responses in one tile), 3 or 4 ring
 * stages and 128-key chunks (with 4 or 8 warps: 17-18.5 us vs 12.2 at G = 1) were all slower than
 * 8, 2 and 64-key chunks, which keep three blocks on an SM: the kernel is bound by latency (one
 * warp's dependent instructions), not by the prompt K/V that both tiles of a group read (the
 * second read mostly hits L2). */
enum { DEC_MAX_T = 256, DEC_BN = 64, DEC_NW = 4, DEC_CS = 8 };

template <int HPG, bool OWN> struct dec_shape {
    static constexpr int QT = OWN ? 1 : DEC_CS; /* queries a pass covers */
    static constexpr int ROWS = QT * HPG; /* query rows (<= 64) */
    static constexpr int MT = (ROWS + 15) / 16; /* m16 tiles */
    static constexpr int WK = DEC_NW / MT; /* warps per m16 tile (key split) */
    static constexpr int KW = DEC_BN / WK; /* keys per warp per chunk */
};

/* Dynamic shared memory: Q rows, then the K/V ring. After a pass the ring holds the warps'
 * combine buffer RED; after both, the shared state (SACC, SML, over RED) and the own state
 * (OACC, OML, past both) that the cluster reads. ~74 KB at D = 128 with HPG <= 2: three blocks
 * an SM. */
template <int D, int HPG> struct dec_smem {
    static constexpr int ST = D + 8, RS = D + 4, ROWS = DEC_CS * HPG;
    static constexpr size_t Q = (size_t)dec_shape<HPG, false>::MT * 16 * ST * 2, RING = (size_t)4 * DEC_BN * ST * 2;
    static constexpr size_t RED = (size_t)DEC_NW * 16 * RS * 4;
    static constexpr size_t SACC = (size_t)ROWS * RS * 4, SML = (size_t)ROWS * 8;
    static constexpr size_t OACC_AT = ((RED > SACC + SML ? RED : SACC + SML) + 15) & ~(size_t)15;
    static constexpr size_t OACC = (size_t)HPG * RS * 4, OML = (size_t)HPG * 8;
    static constexpr size_t WORK = RING > OACC_AT + OACC + OML ? RING : OACC_AT + OACC + OML;
    static constexpr size_t BYTES = Q + WORK;
    static_assert(RED <= RING / 2, "dec_smem: a pass combines in one ring stage");
};

/* One pass over the keys of queries [t0, t0 + QT) at kv head g (shared: ranges a, split s of
 * DEC_CS; own: ranges b, QT = 1, the whole range): emit(k, row, d4, M, L, acc4) is called for
 * every row < ROWS and column group d4, k = (the item's index - threadIdx.x) / blockDim.x, with
 * the row's (max in log2 units, sum) and unnormalised accumulator (rows outside every range:
 * -inf, 0, 0). Called by the whole block; begins and ends with a block barrier. When the pass
 * runs out of chunks it issues the next pass's first one (keys [nxt[0], nxt[1]) in shared
 * memory; nxt NULL: no next pass) into the free ring stage, reported in *nxt_st, so its load
 * overlaps this pass's last chunk and combine; the next pass is then called with pre_st = that
 * stage (else -1). */
template <int D, int HPG, bool OWN, typename Emit>
__device__ __forceinline__ void dec_pass(bf16 *q_s, bf16 *kv_s, const bf16 *q, const bf16 *k, const bf16 *v, const int (*rng)[2],
                                         int T, int H, int K, float sc2, int t0, int s, int g, const int *nxt, int pre_st,
                                         int *nxt_st, Emit emit) {
    using S = dec_shape<HPG, OWN>;
    constexpr int QT = S::QT, ROWS = S::ROWS, MT = S::MT, WK = S::WK, KW = S::KW, NT = KW / 8;
    constexpr int ST = D + 8, RS = D + 4, TILE = DEC_BN * ST, NS = OWN ? 1 : DEC_CS;
    constexpr int NI = ROWS * (D / 4), NIT = (NI + 32 * DEC_NW - 1) / (32 * DEC_NW);
    __shared__ int seg_s[QT][4]; /* qa, qb (tile-relative), lo, hi */
    __shared__ int nseg_s;
    __shared__ float m_s[DEC_NW][16], l_s[DEC_NW][16];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, mt = w / WK, kw = w % WK;

    __syncthreads(); /* q_s and the ring are free */
    for (int i = threadIdx.x; i < MT * 16 * (D / 8); i += blockDim.x) {
        int row = i / (D / 8), c8 = i % (D / 8), t = t0 + row / HPG, h = g * HPG + row % HPG;
        bool ok = row < ROWS && t < T;
        fa_cp16(q_s + row * ST + c8 * 8, ok ? q + ((size_t)t * H + h) * D + c8 * 8 : q, ok);
    }
    fa_commit();
    if (threadIdx.x == 0) {
        int n = 0, nq = T - t0 < QT ? T - t0 : QT;
        for (int i = 0; i < nq;) {
            int lo = rng[i][0], hi = rng[i][1], j = i + 1;
            while (j < nq && rng[j][0] == lo && rng[j][1] == hi) j++;
            if (hi > lo) {
                seg_s[n][0] = i;
                seg_s[n][1] = j;
                seg_s[n][2] = lo;
                seg_s[n][3] = hi;
                n++;
            }
            i = j;
        }
        nseg_s = n;
    }
    __syncthreads();
    const int nseg = nseg_s;

    /* split s of segment sg: keys [lo, hi), pieces rounded up to 16 keys */
    auto piece = [&](int sg, int &lo, int &hi) {
        int a = seg_s[sg][2], b = seg_s[sg][3], per = ((b - a + NS - 1) / NS + 15) & ~15;
        lo = a + s * per;
        hi = min(b, lo + per);
    };
    /* the next chunk after (sg, j0): advances within the piece, then to the next non-empty one */
    auto next = [&](int &sg, int &j0, int &hi) {
        int lo;
        if (sg >= 0) {
            j0 += DEC_BN;
            if (j0 < hi) return;
        }
        for (sg++; sg < nseg; sg++) {
            piece(sg, lo, hi);
            if (lo < hi) {
                j0 = lo;
                return;
            }
        }
    };
    auto issue = [&](int st, int j0, int hi) {
        bf16 *ks = kv_s + 2 * st * TILE, *vs = ks + TILE;
        for (int i = threadIdx.x; i < DEC_BN * (D / 8); i += blockDim.x) {
            int kk = i / (D / 8), c8 = i % (D / 8), j = j0 + kk;
            bool ok = j < hi;
            size_t off = ok ? ((size_t)j * K + g) * D + c8 * 8 : 0;
            fa_cp16(ks + kk * ST + c8 * 8, k + off, ok);
            fa_cp16(vs + kk * ST + c8 * 8, v + off, ok);
        }
    };

    float o[1][D / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    fa_zero(o);
    int sg = -1, j0 = 0, hi = 0, st = pre_st >= 0 ? pre_st : 0, issued = -1;
    next(sg, j0, hi);
    if (pre_st < 0) { /* else the pass before issued this pass's first chunk into stage pre_st */
        if (sg < nseg) issue(0, j0, hi);
        fa_commit();
    }
    while (sg < nseg) {
        int sg2 = sg, j02 = j0, hi2 = hi;
        next(sg2, j02, hi2);
        if (sg2 < nseg) issue(st ^ 1, j02, hi2);
        else if (nxt && nxt[0] < nxt[1]) {
            issue(st ^ 1, nxt[0], nxt[1]);
            issued = st ^ 1;
        } /* the next pass's first */
        fa_commit();
        fa_wait<1>();
        __syncthreads();
        const int qa = seg_s[sg][0], qb = seg_s[sg][1];
        const int row0 = mt * 16, r_lo = row0 + (lane >> 2), kb = j0 + kw * KW;
        const bool rows_in = row0 < ROWS && row0 / HPG < qb && (row0 + 15) / HPG >= qa;
        if (rows_in && kb < hi) {
            const bf16 *ks = kv_s + 2 * st * TILE + kw * KW * ST;
            float sa[1][NT][4];
            fa_zero(sa);
            mma_abt<1, NT, D>(sa, q_s + row0 * ST, ks, ST);
            const bool in0 = r_lo / HPG >= qa && r_lo / HPG < qb, in1 = (r_lo + 8) / HPG >= qa && (r_lo + 8) / HPG < qb;
            fa_tile_step<NT, D, false>(o, sa, m, l, sc2, ks + TILE, ST, [&](int n, int e, int hf) {
                return kb + n * 8 + 2 * (lane & 3) + e < hi && (hf ? in1 : in0);
            });
        }
        __syncthreads(); /* stage st is free for the chunk after next */
        sg = sg2;
        j0 = j02;
        hi = hi2;
        st ^= 1;
    }
    if (issued < 0) fa_wait<0>(); /* else all but that chunk's group are done */
    if (nxt_st) *nxt_st = issued;

    /* combine the WK warps of each m16 tile: (max, sum) through m_s / l_s, accumulators
     * through red (over the ring stage the next pass's first chunk is not using) */
    float *red = (float *)(kv_s + (issued == 0 ? 2 * TILE : 0));
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float L = l[hf];
        L += __shfl_xor_sync(FULL, L, 1);
        L += __shfl_xor_sync(FULL, L, 2);
        if ((lane & 3) == 0) {
            m_s[w][(lane >> 2) + 8 * hf] = m[hf] == -INFINITY ? -INFINITY : m[hf] * sc2;
            l_s[w][(lane >> 2) + 8 * hf] = L;
        }
    }
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        float *r0 = red + ((size_t)w * 16 + (lane >> 2)) * RS + n * 8 + 2 * (lane & 3);
        r0[0] = o[0][n][0];
        r0[1] = o[0][n][1];
        r0[8 * RS] = o[0][n][2];
        r0[8 * RS + 1] = o[0][n][3];
    }
    __syncthreads();
#pragma unroll
    for (int it = 0; it < NIT; it++) {
        const int i = threadIdx.x + it * 32 * DEC_NW;
        if (NI % (32 * DEC_NW) && i >= NI) break;
        const int row = i / (D / 4), d4 = (i % (D / 4)) * 4, tm = row / 16, rr = row % 16;
        float M = -INFINITY;
#pragma unroll
        for (int x = 0; x < WK; x++) M = fmaxf(M, m_s[tm * WK + x][rr]);
        float L = 0.0f;
        float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int x = 0; x < WK; x++) {
            const int wx = tm * WK + x;
            const float f = M == -INFINITY || m_s[wx][rr] == -INFINITY ? 0.0f : exp2f(m_s[wx][rr] - M);
            L += l_s[wx][rr] * f;
            const float4 v4 = *(const float4 *)(red + ((size_t)wx * 16 + rr) * RS + d4);
            a.x += v4.x * f;
            a.y += v4.y * f;
            a.z += v4.z * f;
            a.w += v4.w * f;
        }
        emit(it, row, d4, M, L, a);
    }
    __syncthreads(); /* red (the ring) is read */
}

template <int D, int HPG>
__global__ void __launch_bounds__(32 * DEC_NW) attn_dec_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                                                               attn_ranges r, int T, int H, int K, float sc2) {
    using SM = dec_smem<D, HPG>;
    constexpr int CS = DEC_CS, RS = SM::RS, ROWS = SM::ROWS;
    constexpr int NI = ROWS * (D / 4), NIT = (NI + 32 * DEC_NW - 1) / (32 * DEC_NW);
    extern __shared__ __align__(16) unsigned char dec_dyn[];
    bf16 *q_s = (bf16 *)dec_dyn, *kv_s = (bf16 *)(dec_dyn + SM::Q);
    float *sacc = (float *)kv_s;
    float2 *sml = (float2 *)((unsigned char *)kv_s + SM::SACC);
    float *oacc = (float *)((unsigned char *)kv_s + SM::OACC_AT);
    float2 *oml = (float2 *)((unsigned char *)kv_s + SM::OACC_AT + SM::OACC);
    const int rank = blockIdx.x, t0 = blockIdx.y * CS, g = blockIdx.z, t = t0 + rank;
    /* The tile's shared and own ranges, read before the wait: they are written by nothing in
     * flight (attention.cuh), so the round trip overlaps the kernel before. Only dec_pass reads
     * them, after its opening barrier. */
    __shared__ int rng[2][CS][2]; /* [shared a0/a1, own b0/b1][query of the tile][lo, hi] */
    if (threadIdx.x < 2 * CS) {
        const int p = threadIdx.x / CS, i = threadIdx.x % CS, tt = t0 + i;
        int lo = 0, hi = 0;
        if (tt < T) {
            lo = p ? r.b0[tt] : r.a0[tt];
            hi = p ? r.b1[tt] : r.a1[tt];
        }
        rng[p][i][0] = lo;
        rng[p][i][1] = hi;
    }
    pdl_wait();
    pdl_trigger();
    /* shared pass: this thread's items of the state stay in registers through the own pass */
    float4 sh_a[NIT];
    float2 sh_ml[NIT];
    /* (and it issues the own pass's first chunk as it runs out of its own) */
    int own_st = -1;
    dec_pass<D, HPG, false>(q_s, kv_s, q, k, v, rng[0], T, H, K, sc2, t0, rank, g, t < T ? rng[1][rank] : nullptr, -1, &own_st,
                            [&](int it, int row, int d4, float M, float L, float4 a) {
                                sh_a[it] = a;
                                sh_ml[it] = make_float2(M, L);
                            });
    if (t < T)
        dec_pass<D, HPG, true>(q_s, kv_s, q, k, v, rng[1] + rank, T, H, K, sc2, t, 0, g, nullptr, own_st, nullptr,
                               [&](int, int row, int d4, float M, float L, float4 a) {
                                   if (d4 == 0) oml[row] = make_float2(M, L);
                                   *(float4 *)(oacc + (size_t)row * RS + d4) = a;
                               });
#pragma unroll
    for (int it = 0; it < NIT; it++) {
        const int i = threadIdx.x + it * 32 * DEC_NW;
        if (NI % (32 * DEC_NW) && i >= NI) break;
        const int row = i / (D / 4), d4 = (i % (D / 4)) * 4;
        if (d4 == 0) sml[row] = sh_ml[it];
        *(float4 *)(sacc + (size_t)row * RS + d4) = sh_a[it];
    }
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    if (t < T) {
        /* query t's HPG rows: the CS shared states (rows rank * HPG + hh of each block), then
         * its own state, in that fixed order */
        for (int i = threadIdx.x; i < HPG * (D / 4); i += blockDim.x) {
            const int hh = i / (D / 4), d4 = (i % (D / 4)) * 4, row = rank * HPG + hh;
            float M = oml[hh].x;
#pragma unroll
            for (int x = 0; x < CS; x++) M = fmaxf(M, cl.map_shared_rank(sml, x)[row].x);
            float L = 0.0f, a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int x = 0; x <= CS; x++) {
                const float2 ml = x < CS ? cl.map_shared_rank(sml, x)[row] : oml[hh];
                const float f = ml.x == -INFINITY ? 0.0f : exp2f(ml.x - M);
                const float4 v4 = x < CS ? *(const float4 *)(cl.map_shared_rank(sacc, x) + (size_t)row * RS + d4)
                                         : *(const float4 *)(oacc + (size_t)hh * RS + d4);
                L += ml.y * f;
                a[0] += v4.x * f;
                a[1] += v4.y * f;
                a[2] += v4.z * f;
                a[3] += v4.w * f;
            }
            const float inv = L > 0.0f ? 1.0f / L : 0.0f;
            const size_t oi = (size_t)t * H + g * HPG + hh;
            bf16 *dst = out + oi * D + d4;
            dst[0] = __float2bfloat16(a[0] * inv);
            dst[1] = __float2bfloat16(a[1] * inv);
            dst[2] = __float2bfloat16(a[2] * inv);
            dst[3] = __float2bfloat16(a[3] * inv);
            if (d4 == 0) lse[oi] = M == -INFINITY ? -INFINITY : (M + log2f(L)) * LN2;
        }
    }
    cl.sync(); /* every block's states stay alive until the cluster has read them */
}

template <int D, int HPG>
static void attn_dec_launch(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T,
                            int H, int K, float sc2) {
    const size_t smem = dec_smem<D, HPG>::BYTES;
    static unsigned done;
    auto kern = attn_dec_kernel<D, HPG>;
    cu_raise_smem(c, kern, smem, &done);
    if (c->failed) return;
    cu_launch_ex(c, "attn_dec_kernel", kern, dim3(DEC_CS, (T + DEC_CS - 1) / DEC_CS, K), dim3(32 * DEC_NW), smem, DEC_CS, out,
                 lse, q, k, v, r, T, H, K, sc2);
}

/* 1 when the decode kernels took the call (T small, D 64 / 128 / 256, H/K in {1, 2, 4, 8}). */
int attn_decode_fwd_cuda(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T,
                         int H, int K, int D) {
    if (T > DEC_MAX_T || (D != 64 && D != 128 && D != 256) || H % K || !c->tune->attn_decode) return 0;
    int hpg = H / K;
    if (hpg != 1 && hpg != 2 && hpg != 4 && hpg != 8) return 0;
    float sc2 = LOG2E / sqrtf((float)D);
#define DEC_L(DD, G) attn_dec_launch<DD, G>(c, out, lse, q, k, v, r, T, H, K, sc2)
    if (D == 64) {
        if (hpg == 1) DEC_L(64, 1);
        else if (hpg == 2) DEC_L(64, 2);
        else if (hpg == 4) DEC_L(64, 4);
        else DEC_L(64, 8);
    } else if (D == 128) {
        if (hpg == 1) DEC_L(128, 1);
        else if (hpg == 2) DEC_L(128, 2);
        else if (hpg == 4) DEC_L(128, 4);
        else DEC_L(128, 8);
    } else {
        if (hpg == 1) DEC_L(256, 1);
        else if (hpg == 2) DEC_L(256, 2);
        else if (hpg == 4) DEC_L(256, 4);
        else DEC_L(256, 8);
    }
#undef DEC_L
    return 1;
}
