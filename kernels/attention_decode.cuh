/* attention_decode.cuh — the small-T (decode) forward of attention.h, included by attention.cu.
 *
 * Bifurcated split-KV ("flash-decoding"): a block owns a tile of QT consecutive queries, one kv
 * head g (all H/K query heads that read it: ROWS = QT * H/K query rows) and one split s of
 * NS. Inside the tile, consecutive queries with the same range (the N responses of a group
 * share a0/a1) form one segment; a segment's keys are streamed through shared memory once for
 * all its rows, so a prompt's K/V is read once per step for the whole group. Split s takes the
 * s-th 32-key-aligned piece of every segment's range. Each query's own range [b0, b1) goes to a
 * second kernel: a block per (query, kv head), a warp per eighth of the range. Lane j scores key j; each warp owns the rows
 * w, w + 4, ... and keeps their online softmax (log2 domain) and accumulators in registers.
 * Partials (max, sum, acc) per (slot, query, head) go to scratch (NS + DEC_NW slots); a third kernel
 * merges them into out and lse (two warps a block, spread over the SMs) (natural log of the scaled scores). Empty rows give out = 0,
 * lse = -inf, as the CPU reference.
 *
 * The grid depends only on T (and the model dims): ranges are read from device memory, so the
 * launch can be captured in a CUDA graph. Used for D = 64 / 128 and H/K in {1, 2, 4, 8}. */

enum { DEC_MAX_T = 256, DEC_NW = 8, DEC_KC = 32 };   /* 8 warps: half the rows per warp (the kernels
                                                       are latency-bound, one block per SM) */

template <int HPG>
struct dec_shape {
    static constexpr int QT = HPG >= 8 ? 8 : 16;           /* queries per tile */
    static constexpr int ROWS = QT * HPG;                  /* query rows per block (<= 64) */
    static constexpr int MR = ROWS / DEC_NW;               /* rows per warp */
};

/* Number of splits of the shared ranges for T queries: about one block per SM, at most 32. */
static inline int dec_splits(int n_sm, int T, int K, int qt) {
    int blocks = ((T + qt - 1) / qt) * K, ns = (n_sm + blocks - 1) / blocks;
    return ns < 1 ? 1 : ns > 32 ? 32 : ns;
}

template <int D, int HPG>
__global__ void __launch_bounds__(32 * DEC_NW) attn_dec_part_kernel(float *pacc, float2 *pml, const bf16 *q,
                                                                   const bf16 *k, const bf16 *v, attn_ranges r,
                                                                   int T, int H, int K, float scale2) {
    using S = dec_shape<HPG>;
    constexpr int QT = S::QT, ROWS = S::ROWS, MR = S::MR, DL = D / 32, KP = D + 8;
    __shared__ __align__(16) bf16 q_s[ROWS][D];
    __shared__ __align__(16) bf16 k_s[DEC_KC][KP];
    __shared__ __align__(16) bf16 v_s[DEC_KC][D];
    __shared__ float p_s[ROWS][DEC_KC + 1];
    __shared__ int seg_s[QT][4];                  /* qa, qb (tile-relative), lo, hi */
    __shared__ int rng_s[QT][4];
    __shared__ int nseg_s;
    const int s = blockIdx.x, ns = gridDim.x, t0 = blockIdx.y * QT, g = blockIdx.z;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;

    /* queries of the tile: their rows of q and their ranges */
    for (int i = threadIdx.x; i < ROWS * (D / 8); i += blockDim.x) {
        int row = i / (D / 8), c8 = i % (D / 8), t = t0 + row / HPG, h = g * HPG + row % HPG;
        uint4 val = make_uint4(0, 0, 0, 0);
        if (t < T) val = *(const uint4 *)(q + ((size_t)t * H + h) * D + c8 * 8);
        *(uint4 *)&q_s[row][c8 * 8] = val;
    }
    if (threadIdx.x < QT) {
        int t = t0 + threadIdx.x, a0 = 0, a1 = 0, b0 = 0, b1 = 0;
        if (t < T) { a0 = r.a0[t]; a1 = r.a1[t]; b0 = r.b0[t]; b1 = r.b1[t]; }
        rng_s[threadIdx.x][0] = a0; rng_s[threadIdx.x][1] = a1;
        rng_s[threadIdx.x][2] = b0; rng_s[threadIdx.x][3] = b1;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int n = 0, nq = T - t0 < QT ? T - t0 : QT;
        for (int pass = 0; pass < 1; pass++)
            for (int i = 0; i < nq;) {
                int lo = rng_s[i][2 * pass], hi = rng_s[i][2 * pass + 1], j = i + 1;
                while (j < nq && rng_s[j][2 * pass] == lo && rng_s[j][2 * pass + 1] == hi) j++;
                if (hi > lo) { seg_s[n][0] = i; seg_s[n][1] = j; seg_s[n][2] = lo; seg_s[n][3] = hi; n++; }
                i = j;
            }
        nseg_s = n;
    }
    __syncthreads();

    float m[MR], l[MR], acc[MR][DL];
#pragma unroll
    for (int i = 0; i < MR; i++) {
        m[i] = -INFINITY; l[i] = 0.0f;
#pragma unroll
        for (int d = 0; d < DL; d++) acc[i][d] = 0.0f;
    }
    const int nseg = nseg_s;
    for (int sg = 0; sg < nseg; sg++) {
        const int qa = seg_s[sg][0], qb = seg_s[sg][1], lo0 = seg_s[sg][2], hi0 = seg_s[sg][3];
        int per = (hi0 - lo0 + ns - 1) / ns;
        per = (per + DEC_KC - 1) / DEC_KC * DEC_KC;
        const int lo = lo0 + s * per, hi = min(hi0, lo + per);
        for (int j0 = lo; j0 < hi; j0 += DEC_KC) {
            __syncthreads();   /* previous chunk's readers are done */
            for (int i = threadIdx.x; i < DEC_KC * (D / 8); i += blockDim.x) {
                int kk = i / (D / 8), c8 = i % (D / 8), j = j0 + kk;
                uint4 a = make_uint4(0, 0, 0, 0), b = a;
                if (j < hi) {
                    size_t off = ((size_t)j * K + g) * D + c8 * 8;
                    a = *(const uint4 *)(k + off);
                    b = *(const uint4 *)(v + off);
                }
                *(uint4 *)&k_s[kk][c8 * 8] = a;
                *(uint4 *)&v_s[kk][c8 * 8] = b;
            }
            __syncthreads();
            const bool valid = j0 + lane < hi;
            float sc[MR];
#pragma unroll
            for (int i = 0; i < MR; i++) sc[i] = 0.0f;
#pragma unroll 4
            for (int d = 0; d < D; d += 8) {
                uint4 kr = *(const uint4 *)&k_s[lane][d];
                const bf162 *k2 = (const bf162 *)&kr;
                float2 kf[4];
#pragma unroll
                for (int e = 0; e < 4; e++) kf[e] = __bfloat1622float2(k2[e]);
#pragma unroll
                for (int i = 0; i < MR; i++) {
                    int row = w + DEC_NW * i, qi = row / HPG;
                    if (qi < qa || qi >= qb) continue;
                    uint4 qr = *(const uint4 *)&q_s[row][d];
                    const bf162 *q2 = (const bf162 *)&qr;
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float2 qf = __bfloat1622float2(q2[e]);
                        sc[i] = fmaf(qf.x, kf[e].x, fmaf(qf.y, kf[e].y, sc[i]));
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < MR; i++) {
                int row = w + DEC_NW * i, qi = row / HPG;
                if (qi < qa || qi >= qb) continue;
                float x = valid ? sc[i] * scale2 : -INFINITY;
                float mn = fmaxf(m[i], warp_max(x));
                float corr = exp2f(m[i] - mn), p = exp2f(x - mn);   /* mn is finite: a valid key exists */
                l[i] = l[i] * corr + p;                             /* per lane; summed at the end */
#pragma unroll
                for (int d = 0; d < DL; d++) acc[i][d] *= corr;
                m[i] = mn;
                p_s[row][lane] = p;
            }
            __syncwarp();
            for (int j = 0; j < DEC_KC && j0 + j < hi; j++) {
                float vf[DL];
                if (DL == 4) {
                    uint2 vr = *(const uint2 *)&v_s[j][lane * 4];
                    float2 a = __bfloat1622float2(*(const bf162 *)&vr.x), b = __bfloat1622float2(*(const bf162 *)&vr.y);
                    vf[0] = a.x; vf[1] = a.y; vf[DL > 2 ? 2 : 0] = b.x; vf[DL > 3 ? 3 : 1] = b.y;
                } else {
                    float2 a = __bfloat1622float2(*(const bf162 *)&v_s[j][lane * 2]);
                    vf[0] = a.x; vf[DL > 1 ? 1 : 0] = a.y;
                }
#pragma unroll
                for (int i = 0; i < MR; i++) {
                    int row = w + DEC_NW * i, qi = row / HPG;
                    if (qi < qa || qi >= qb) continue;
                    float p = p_s[row][j];
#pragma unroll
                    for (int d = 0; d < DL; d++) acc[i][d] = fmaf(p, vf[d], acc[i][d]);
                }
            }
        }
    }
    /* partials of this split: rows of real queries */
#pragma unroll
    for (int i = 0; i < MR; i++) {
        int row = w + DEC_NW * i, t = t0 + row / HPG, h = g * HPG + row % HPG;
        float lsum = warp_sum(l[i]);
        if (t >= T) continue;
        size_t o = ((size_t)s * T + t) * H + h;
        if (lane == 0) pml[o] = make_float2(m[i], lsum);
#pragma unroll
        for (int d = 0; d < DL; d++) pacc[o * D + lane * DL + d] = acc[i][d];
    }
}

/* Own ranges [b0, b1): a block per (query, kv head), warp w takes the w-th eighth of the range
 * for the H/K heads of the group, keys straight from global memory (lane j: key j of a 32-key
 * chunk), no shared memory or block syncs. Writes partial slots ns + w. */
template <int D, int HPG>
__global__ void __launch_bounds__(32 * DEC_NW) attn_dec_own_kernel(float *pacc, float2 *pml, const bf16 *q,
                                                                  const bf16 *k, const bf16 *v, attn_ranges r,
                                                                  int T, int H, int K, float scale2, int ns) {
    constexpr int DL = D / 32;
    const int t = blockIdx.x, g = blockIdx.y, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int b0 = r.b0[t], b1 = r.b1[t], len = b1 > b0 ? b1 - b0 : 0, per = (len + DEC_NW - 1) / DEC_NW;
    const int lo = b0 + w * per, hi = min(b1, lo + per);
    float m[HPG], l[HPG], acc[HPG][DL];
#pragma unroll
    for (int i = 0; i < HPG; i++) {
        m[i] = -INFINITY; l[i] = 0.0f;
#pragma unroll
        for (int d = 0; d < DL; d++) acc[i][d] = 0.0f;
    }
    const bf16 *qt = q + ((size_t)t * H + g * HPG) * D;
    for (int j0 = lo; j0 < hi; j0 += 32) {
        const int j = j0 + lane;
        const bool valid = j < hi;
        float sc[HPG];
#pragma unroll
        for (int i = 0; i < HPG; i++) sc[i] = 0.0f;
        if (valid) {
            const bf16 *kr = k + ((size_t)j * K + g) * D;
#pragma unroll 4
            for (int d = 0; d < D; d += 8) {
                uint4 kv = *(const uint4 *)(kr + d);
                const bf162 *k2 = (const bf162 *)&kv;
#pragma unroll
                for (int i = 0; i < HPG; i++) {
                    uint4 qv = *(const uint4 *)(qt + i * D + d);
                    const bf162 *q2 = (const bf162 *)&qv;
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float2 a = __bfloat1622float2(q2[e]), b = __bfloat1622float2(k2[e]);
                        sc[i] = fmaf(a.x, b.x, fmaf(a.y, b.y, sc[i]));
                    }
                }
            }
        }
        float p[HPG];
#pragma unroll
        for (int i = 0; i < HPG; i++) {
            float x = valid ? sc[i] * scale2 : -INFINITY;
            float mn = fmaxf(m[i], warp_max(x));
            float corr = exp2f(m[i] - mn);
            p[i] = exp2f(x - mn);
            l[i] = l[i] * corr + p[i];
#pragma unroll
            for (int d = 0; d < DL; d++) acc[i][d] *= corr;
            m[i] = mn;
        }
        const int n = min(32, hi - j0);
        for (int jj = 0; jj < n; jj++) {
            const bf16 *vr = v + ((size_t)(j0 + jj) * K + g) * D + lane * DL;
            float vf[DL];
#pragma unroll
            for (int d = 0; d < DL; d += 2) {
                float2 a = __bfloat1622float2(*(const bf162 *)(vr + d));
                vf[d] = a.x; vf[d + 1] = a.y;
            }
#pragma unroll
            for (int i = 0; i < HPG; i++) {
                float pj = __shfl_sync(0xffffffffu, p[i], jj);
#pragma unroll
                for (int d = 0; d < DL; d++) acc[i][d] = fmaf(pj, vf[d], acc[i][d]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < HPG; i++) {
        float lsum = warp_sum(l[i]);
        size_t o = ((size_t)(ns + w) * T + t) * H + g * HPG + i;
        if (lane == 0) pml[o] = make_float2(m[i], lsum);
#pragma unroll
        for (int d = 0; d < DL; d++) pacc[o * D + lane * DL + d] = acc[i][d];
    }
}

/* One warp per (query, head): merge the nsl partial slots (at most 64). */
template <int D>
__global__ void attn_dec_merge_kernel(bf16 *out, float *lse, const float *pacc, const float2 *pml, int T, int H,
                                      int nsl) {
    constexpr int DL = D / 32;
    int wi = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (wi >= T * H) return;
    size_t TH = (size_t)T * H;
    float2 a = lane < nsl ? pml[lane * TH + wi] : make_float2(-INFINITY, 0.0f);
    float2 b = lane + 32 < nsl ? pml[(lane + 32) * TH + wi] : make_float2(-INFINITY, 0.0f);
    float M = warp_max(fmaxf(a.x, b.x));
    float fa = M == -INFINITY || a.x == -INFINITY ? 0.0f : exp2f(a.x - M);
    float fb = M == -INFINITY || b.x == -INFINITY ? 0.0f : exp2f(b.x - M);
    float L = warp_sum(a.y * fa + b.y * fb), o[DL];
#pragma unroll
    for (int d = 0; d < DL; d++) o[d] = 0.0f;
#pragma unroll 4
    for (int s = 0; s < nsl; s++) {
        float f = __shfl_sync(0xffffffffu, s < 32 ? fa : fb, s & 31);
        if (f == 0.0f) continue;
        const float *src = pacc + (s * TH + wi) * D + lane * DL;
#pragma unroll
        for (int d = 0; d < DL; d++) o[d] += src[d] * f;
    }
    float inv = L > 0.0f ? 1.0f / L : 0.0f;
    bf16 *dst = out + (size_t)wi * D + lane * DL;
#pragma unroll
    for (int d = 0; d < DL; d++) dst[d] = __float2bfloat16(o[d] * inv);
    if (lane == 0) lse[wi] = M == -INFINITY ? -INFINITY : (M + log2f(L)) * LN2;
}

template <int D, int HPG>
static void attn_dec_launch(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                            attn_ranges r, int T, int H, int K, float scale2) {
    constexpr int QT = dec_shape<HPG>::QT;
    int ns = dec_splits(c->n_sm, T, K, QT), nsl = ns + DEC_NW;
    size_t acc_bytes = ((size_t)nsl * T * H * D * sizeof(float) + 255) & ~(size_t)255;
    char *s = (char *)cu_scratch(c, acc_bytes + (size_t)nsl * T * H * sizeof(float2));
    if (!s) return;
    float *pacc = (float *)s;
    float2 *pml = (float2 *)(s + acc_bytes);
    attn_dec_part_kernel<D, HPG><<<dim3(ns, (T + QT - 1) / QT, K), 32 * DEC_NW, 0, c->stream>>>(
        pacc, pml, q, k, v, r, T, H, K, scale2);
    CU_LAUNCHED(c, "attn_dec_part_kernel");
    attn_dec_own_kernel<D, HPG><<<dim3(T, K), 32 * DEC_NW, 0, c->stream>>>(pacc, pml, q, k, v, r, T, H, K, scale2, ns);
    CU_LAUNCHED(c, "attn_dec_own_kernel");
    int warps = T * H;
    attn_dec_merge_kernel<D><<<(warps + 1) / 2, 64, 0, c->stream>>>(out, lse, pacc, pml, T, H, nsl);
    CU_LAUNCHED(c, "attn_dec_merge_kernel");
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
