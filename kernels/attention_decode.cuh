/* attention_decode.cuh — the small-T (decode) forward of attention.h, included by attention.cu
 * after attention_flash.cuh (its mma / ldmatrix / cp.async helpers).
 *
 * Bifurcated split-KV ("flash-decoding") on tensor cores. A block owns a tile of QT consecutive
 * queries, one kv head g (all HPG = H/K query heads that read it: ROWS = QT * HPG query rows,
 * padded to MT m16 tiles) and one split s. Shared pass (ranges [a0, a1)): consecutive queries of
 * the tile with the same range form a segment (the N responses of a group), and a segment's keys
 * stream through shared memory once for all its rows, so a prompt's K/V is read once per step
 * for the whole group and all HPG heads; split s takes the s-th piece of every segment's range.
 * Own pass ([b0, b1)): the same kernel with one query a tile. Keys come in 64-key chunks through
 * a 2-stage cp.async ring; the 4 warps split a chunk WK ways (WK = 4 / MT) and each runs
 * S = Q·K^T and O += P·V with mma.sync on its 16 rows, online softmax in fp32 (log2 domain); the
 * WK partial states of a row are combined through shared memory at the end and written to the
 * split's slot: (max, sum) in pml and the unnormalised accumulator in pacc, slots [0, ns) for
 * the shared pass and [ns, ns + no) for the own pass. A merge kernel (two warps a block, spread
 * over the SMs) folds the slots into out and lse (natural log of the scaled scores). Empty rows
 * give out = 0, lse = -inf, as the CPU reference.
 *
 * The grid depends only on T (and the model dims): ranges are read from device memory, so the
 * launch can be captured in a CUDA graph. Used for D = 64 / 128 and H/K in {1, 2, 4, 8}. */

enum { DEC_MAX_T = 256, DEC_BN = 64, DEC_NW = 4, DEC_SPLITS = 16, DEC_OWN_SPLITS = 8 };

template <int HPG, bool OWN>
struct dec_shape {
    static constexpr int QT = OWN ? 1 : HPG >= 8 ? 8 : 16;   /* queries per tile */
    static constexpr int ROWS = QT * HPG;                      /* query rows per block (<= 64) */
    static constexpr int MT = (ROWS + 15) / 16;                /* m16 tiles */
    static constexpr int WK = DEC_NW / MT;                     /* warps per m16 tile (key split) */
    static constexpr int KW = DEC_BN / WK;                     /* keys per warp per chunk */
};

template <int D, int HPG, bool OWN>
struct dec_smem {
    static constexpr int ST = D + 8;
    static constexpr size_t Q = (size_t)dec_shape<HPG, OWN>::MT * 16 * ST * 2, KV = (size_t)DEC_BN * ST * 2;
    static constexpr size_t RED = (size_t)DEC_NW * 16 * (D + 4) * 4;   /* combine buffer, over the ring */
    static constexpr size_t BYTES = Q + (4 * KV > RED ? 4 * KV : RED);
};

/* Splits of a pass with `blocks` blocks a split: about two blocks an SM, at most cap. */
static inline int dec_splits(int n_sm, int blocks, int cap) {
    int ns = (2 * n_sm + blocks - 1) / blocks;
    return ns < 1 ? 1 : ns > cap ? cap : ns;
}

template <int D, int HPG, bool OWN>
__global__ void __launch_bounds__(32 * DEC_NW) attn_dec_part_kernel(float *pacc, float2 *pml, const bf16 *q,
                                                                   const bf16 *k, const bf16 *v, attn_ranges r,
                                                                   int T, int H, int K, float sc2, int slot0) {
    using S = dec_shape<HPG, OWN>;
    constexpr int QT = S::QT, ROWS = S::ROWS, MT = S::MT, WK = S::WK, KW = S::KW, NT = KW / 8;
    constexpr int ST = D + 8, TILE = DEC_BN * ST;
    extern __shared__ __align__(16) unsigned char dec_dyn[];
    bf16 *q_s = (bf16 *)dec_dyn, *kv_s = q_s + MT * 16 * ST;   /* ring: k0 v0 k1 v1 */
    __shared__ int seg_s[QT][4];                  /* qa, qb (tile-relative), lo, hi */
    __shared__ int rng_s[QT][2];
    __shared__ int nseg_s;
    __shared__ float m_s[DEC_NW][16], l_s[DEC_NW][16];
    const int s = blockIdx.x, ns = gridDim.x, t0 = blockIdx.y * QT, g = blockIdx.z;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, mt = w / WK, kw = w % WK;
    pdl_wait();
    pdl_trigger();

    /* the tile's query rows (row = query * HPG + head of the group; padding rows zero) */
    for (int i = threadIdx.x; i < MT * 16 * (D / 8); i += blockDim.x) {
        int row = i / (D / 8), c8 = i % (D / 8), t = t0 + row / HPG, h = g * HPG + row % HPG;
        bool ok = row < ROWS && t < T;
        fa_cp16(q_s + row * ST + c8 * 8, ok ? q + ((size_t)t * H + h) * D + c8 * 8 : q, ok);
    }
    fa_commit();
    if (threadIdx.x < QT) {
        int t = t0 + threadIdx.x, lo = 0, hi = 0;
        if (t < T) { lo = OWN ? r.b0[t] : r.a0[t]; hi = OWN ? r.b1[t] : r.a1[t]; }
        rng_s[threadIdx.x][0] = lo; rng_s[threadIdx.x][1] = hi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int n = 0, nq = T - t0 < QT ? T - t0 : QT;
        for (int i = 0; i < nq;) {
            int lo = rng_s[i][0], hi = rng_s[i][1], j = i + 1;
            while (j < nq && rng_s[j][0] == lo && rng_s[j][1] == hi) j++;
            if (hi > lo) { seg_s[n][0] = i; seg_s[n][1] = j; seg_s[n][2] = lo; seg_s[n][3] = hi; n++; }
            i = j;
        }
        nseg_s = n;
    }
    __syncthreads();
    const int nseg = nseg_s;

    /* split s of segment sg: keys [lo, hi), pieces rounded up to 16 keys */
    auto piece = [&](int sg, int &lo, int &hi) {
        int a = seg_s[sg][2], b = seg_s[sg][3], per = ((b - a + ns - 1) / ns + 15) & ~15;
        lo = a + s * per; hi = min(b, lo + per);
    };
    /* the next chunk after (sg, j0): advances within the piece, then to the next non-empty one */
    auto next = [&](int &sg, int &j0, int &hi) {
        int lo;
        if (sg >= 0) { j0 += DEC_BN; if (j0 < hi) return; }
        for (sg++; sg < nseg; sg++) { piece(sg, lo, hi); if (lo < hi) { j0 = lo; return; } }
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

    float o[1][D / 8][4], m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f };
    fa_zero(o);
    int sg = -1, j0 = 0, hi = 0, st = 0;
    next(sg, j0, hi);
    if (sg < nseg) issue(0, j0, hi);
    fa_commit();
    while (sg < nseg) {
        int sg2 = sg, j02 = j0, hi2 = hi;
        next(sg2, j02, hi2);
        if (sg2 < nseg) issue(st ^ 1, j02, hi2);
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
            float mx0 = m[0], mx1 = m[1];
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    bool kin = kb + n * 8 + 2 * (lane & 3) + e < hi;
                    if (!(kin && in0)) sa[0][n][e] = -INFINITY;
                    if (!(kin && in1)) sa[0][n][2 + e] = -INFINITY;
                    mx0 = fmaxf(mx0, sa[0][n][e]);
                    mx1 = fmaxf(mx1, sa[0][n][2 + e]);
                }
            mx0 = fmaxf(mx0, __shfl_xor_sync(FULL, mx0, 1)); mx0 = fmaxf(mx0, __shfl_xor_sync(FULL, mx0, 2));
            mx1 = fmaxf(mx1, __shfl_xor_sync(FULL, mx1, 1)); mx1 = fmaxf(mx1, __shfl_xor_sync(FULL, mx1, 2));
            float u0 = mx0 == -INFINITY ? 0.0f : mx0 * sc2, u1 = mx1 == -INFINITY ? 0.0f : mx1 * sc2;
            float c0 = fa_ex2(m[0] * sc2 - u0), c1 = fa_ex2(m[1] * sc2 - u1);
            m[0] = mx0; m[1] = mx1;
            float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
            for (int n = 0; n < NT; n++) {
                sa[0][n][0] = fa_ex2(fmaf(sa[0][n][0], sc2, -u0)); sa[0][n][1] = fa_ex2(fmaf(sa[0][n][1], sc2, -u0));
                sa[0][n][2] = fa_ex2(fmaf(sa[0][n][2], sc2, -u1)); sa[0][n][3] = fa_ex2(fmaf(sa[0][n][3], sc2, -u1));
                s0 += sa[0][n][0] + sa[0][n][1];
                s1 += sa[0][n][2] + sa[0][n][3];
            }
            l[0] = l[0] * c0 + s0; l[1] = l[1] * c1 + s1;
#pragma unroll
            for (int n = 0; n < D / 8; n++) { o[0][n][0] *= c0; o[0][n][1] *= c0; o[0][n][2] *= c1; o[0][n][3] *= c1; }
            mma_pb<1, NT / 2, D / 8>(o, sa, ks + TILE, ST);
        }
        __syncthreads();   /* stage st is free for the chunk after next */
        sg = sg2; j0 = j02; hi = hi2; st ^= 1;
    }
    fa_wait<0>();

    /* combine the WK warps of each m16 tile: (max, sum) through m_s / l_s, accumulators
     * through red (over the ring), then each row of a real query goes to slot slot0 + s */
    float *red = (float *)kv_s;
    constexpr int RS = D + 4;
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float L = l[hf];
        L += __shfl_xor_sync(FULL, L, 1); L += __shfl_xor_sync(FULL, L, 2);
        if ((lane & 3) == 0) {
            m_s[w][(lane >> 2) + 8 * hf] = m[hf] == -INFINITY ? -INFINITY : m[hf] * sc2;
            l_s[w][(lane >> 2) + 8 * hf] = L;
        }
    }
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        float *r0 = red + ((size_t)w * 16 + (lane >> 2)) * RS + n * 8 + 2 * (lane & 3);
        r0[0] = o[0][n][0]; r0[1] = o[0][n][1];
        r0[8 * RS] = o[0][n][2]; r0[8 * RS + 1] = o[0][n][3];
    }
    __syncthreads();
    for (int i = threadIdx.x; i < ROWS * (D / 4); i += blockDim.x) {
        const int row = i / (D / 4), d4 = (i % (D / 4)) * 4, t = t0 + row / HPG, h = g * HPG + row % HPG;
        if (t >= T) continue;
        const int tm = row / 16, rr = row % 16;
        float M = -INFINITY;
#pragma unroll
        for (int x = 0; x < WK; x++) M = fmaxf(M, m_s[tm * WK + x][rr]);
        float L = 0.0f, a[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
#pragma unroll
        for (int x = 0; x < WK; x++) {
            const int wx = tm * WK + x;
            const float f = M == -INFINITY || m_s[wx][rr] == -INFINITY ? 0.0f : exp2f(m_s[wx][rr] - M);
            L += l_s[wx][rr] * f;
            const float4 v4 = *(const float4 *)(red + ((size_t)wx * 16 + rr) * RS + d4);
            a[0] += v4.x * f; a[1] += v4.y * f; a[2] += v4.z * f; a[3] += v4.w * f;
        }
        const size_t oi = ((size_t)(slot0 + s) * T + t) * H + h;
        if (d4 == 0) pml[oi] = make_float2(M, L);
        *(float4 *)(pacc + oi * D + d4) = make_float4(a[0], a[1], a[2], a[3]);
    }
}

/* One warp per (query, head), a lane per D/32 columns: merge the nsl partial slots. Every slot
 * was written (empty ones as max -inf, sum 0, accumulator 0); each lane reads the slots' (max,
 * sum) itself (one broadcast load a slot), so the loops carry no shuffles and their loads go
 * out eight slots at a time. */
template <int D>
__global__ void attn_dec_merge_kernel(bf16 *out, float *lse, const float *pacc, const float2 *pml, int T, int H,
                                      int nsl) {
    constexpr int DL = D / 32;
    pdl_wait();
    pdl_trigger();
    int wi = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (wi >= T * H) return;
    const size_t TH = (size_t)T * H;
    const float2 *ml = pml + wi;
    float M = -INFINITY;
#pragma unroll 8
    for (int s = 0; s < nsl; s++) M = fmaxf(M, ml[s * TH].x);
    float L = 0.0f, o[DL];
#pragma unroll
    for (int d = 0; d < DL; d++) o[d] = 0.0f;
    const float *src = pacc + wi * D + lane * DL;
#pragma unroll 8
    for (int s = 0; s < nsl; s++) {
        const float2 a = ml[s * TH];
        const float f = a.x == -INFINITY ? 0.0f : exp2f(a.x - M);
        L += a.y * f;
        if (DL == 4) {
            float4 x = *(const float4 *)(src + s * TH * D);
            o[0] += x.x * f; o[DL > 1 ? 1 : 0] += x.y * f; o[DL > 2 ? 2 : 0] += x.z * f; o[DL > 3 ? 3 : 0] += x.w * f;
        } else {
            float2 x = *(const float2 *)(src + s * TH * D);
            o[0] += x.x * f; o[DL > 1 ? 1 : 0] += x.y * f;
        }
    }
    float inv = L > 0.0f ? 1.0f / L : 0.0f;
    bf16 *dst = out + (size_t)wi * D + lane * DL;
#pragma unroll
    for (int d = 0; d < DL; d++) dst[d] = __float2bfloat16(o[d] * inv);
    if (lane == 0) lse[wi] = M == -INFINITY ? -INFINITY : (M + log2f(L)) * LN2;
}

template <int D, int HPG, bool OWN>
static void attn_dec_part(cu_ctx *c, float *pacc, float2 *pml, const bf16 *q, const bf16 *k, const bf16 *v,
                          attn_ranges r, int T, int H, int K, float sc2, int ns, int slot0) {
    constexpr int QT = dec_shape<HPG, OWN>::QT;
    const size_t smem = dec_smem<D, HPG, OWN>::BYTES;
    static unsigned done;
    cu_raise_smem(c, attn_dec_part_kernel<D, HPG, OWN>, smem, &done);
    if (c->failed) return;
    cu_launch_pdl(c, "attn_dec_part_kernel", attn_dec_part_kernel<D, HPG, OWN>, dim3(ns, (T + QT - 1) / QT, K),
                  dim3(32 * DEC_NW), smem, pacc, pml, q, k, v, r, T, H, K, sc2, slot0);
}

template <int D, int HPG>
static void attn_dec_launch(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                            attn_ranges r, int T, int H, int K, float sc2) {
    constexpr int QT = dec_shape<HPG, false>::QT;
    int ns = dec_splits(c->n_sm, (T + QT - 1) / QT * K, DEC_SPLITS), no = dec_splits(c->n_sm, T * K, DEC_OWN_SPLITS);
    int nsl = ns + no;
    size_t acc_bytes = ((size_t)nsl * T * H * D * sizeof(float) + 255) & ~(size_t)255;
    char *s = (char *)cu_scratch(c, acc_bytes + (size_t)nsl * T * H * sizeof(float2));
    if (!s) return;
    float *pacc = (float *)s;
    float2 *pml = (float2 *)(s + acc_bytes);
    attn_dec_part<D, HPG, false>(c, pacc, pml, q, k, v, r, T, H, K, sc2, ns, 0);
    attn_dec_part<D, HPG, true>(c, pacc, pml, q, k, v, r, T, H, K, sc2, no, ns);
    if (c->failed) return;
    int warps = T * H;
    cu_launch_pdl(c, "attn_dec_merge_kernel", attn_dec_merge_kernel<D>, dim3((warps + 1) / 2), dim3(64), 0, out, lse,
                  (const float *)pacc, (const float2 *)pml, T, H, nsl);
}

/* 1 when the decode kernels took the call (T small, D 64 / 128, H/K in {1, 2, 4, 8}). */
static int attn_decode_fwd(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                           attn_ranges r, int T, int H, int K, int D) {
    const char *e = getenv("GRPOD_ATTN_DECODE");
    if (T > DEC_MAX_T || (D != 64 && D != 128) || H % K || (e && e[0] == '0')) return 0;
    int hpg = H / K;
    if (hpg != 1 && hpg != 2 && hpg != 4 && hpg != 8) return 0;
    float sc2 = LOG2E / sqrtf((float)D);
#define DEC_L(DD, G) attn_dec_launch<DD, G>(c, out, lse, q, k, v, r, T, H, K, sc2)
    if (D == 64) {
        if (hpg == 1) DEC_L(64, 1); else if (hpg == 2) DEC_L(64, 2); else if (hpg == 4) DEC_L(64, 4); else DEC_L(64, 8);
    } else {
        if (hpg == 1) DEC_L(128, 1); else if (hpg == 2) DEC_L(128, 2); else if (hpg == 4) DEC_L(128, 4); else DEC_L(128, 8);
    }
#undef DEC_L
    return 1;
}
