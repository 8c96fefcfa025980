/* attention.cu — CUDA attention with attention.h's two key ranges per query: the dispatch of
 * the family's paths, and the simple path's kernels.
 *
 * Fast path: tensor-core flash kernels for D = 64, 128 and 256, forward and a deterministic
 * backward (dq pass + dk/dv pass, no atomics): warpgroup MMA (attention_wgmma.cu) for D = 128,
 * mma.sync (attention_mma.cu) for D = 64 and 256; a few queries (decode) go to
 * attention_decode.cu first. Used for every call with those head dims (training and prefill; the
 * forward reads key rows only inside the queries' ranges, so a KV cache with S != T works too). tune.attn = TUNE_ATTN_SIMT
 * forces the simple path (tests). The mma.sync kernels at D = 128, once an A/B switch against
 * wgmma, are no longer built (measured slower: docs/benchmarks.md, "attention on wgmma").
 *
 * Simple path (below; every even D up to 256, zero-padded to DM = 16, 32, 64, 128 or 256): plain
 * SIMT fp32 kernels, the first version, and the path for the other head dims (at DM = 256 its
 * shared arrays, 49-65 KB, are dynamic: block_smem).
 * Forward: a block is 16 consecutive queries of one head (4 warps x 4 queries). The keys that
 * any of its queries sees, pass by pass (range a, then range b), are streamed through shared
 * memory in tiles of 32; lane j scores key j for the warp's 4 queries, an online softmax in
 * fp32 (log2 domain) keeps max and sum, and lanes split D to accumulate P·V. lse is saved.
 * Backward, in three kernels and without atomics:
 *   dq:    the forward's blocking; recomputes P from lse, writes dq and Dsum = dout·out;
 *   tiles: for each key tile, the first and last query that sees it (a scan of the ranges);
 *   dk/dv: a block per (key tile, kv head) walks those queries for every head of the group,
 *          lane j owning key j and warp w a quarter of D; dk/dv (bf16) get one += at the end,
 *          so the N responses' contributions to a shared prompt's keys are summed in fp32.
 * A key inside both ranges of a query counts twice, as in the CPU reference.
 * Backward: S key rows (S >= T; S > T when queries attend to KV-cache rows that other forwards
 * wrote, engine/model/split.c), the key tiles cover all S.
 * Extra ranges (a prefix tree's, attn_ranges.nx > 0): further launches of the paths above, two
 * ranges each, merged by their softmax weights (the last banner). */
#include <limits.h>

#include "kernels/attention.cuh"
#include "kernels/attention_tiles.cuh"

enum { QT = 16, KT = 32, NT = 128, QB = 8 };

/* A kernel's shared arrays S: static up to DM = 128 (within the 48 KB static limit), dynamic at
 * DM = 256 (49-65 KB; the launch passes sizeof(S), smem_bytes raised the limit). */
template <class S, int DM> __device__ __forceinline__ S &block_smem() {
    if constexpr (DM > 128) {
        extern __shared__ __align__(16) unsigned char attn_dyn_smem[];
        return *reinterpret_cast<S *>(attn_dyn_smem);
    } else {
        __shared__ S s;
        return s;
    }
}

/* The dynamic shared bytes a launch of kernel<DM> passes: 0 up to DM = 128, else sizeof(S). */
template <class S, int DM, typename Kernel> static size_t smem_bytes(cu_ctx *c, Kernel kernel, unsigned *done) {
    if (DM <= 128) return 0;
    cu_raise_smem(c, kernel, sizeof(S), done);
    return sizeof(S);
}

/* One 32-key tile of k (and v) rows [j0, j0+32) into shared memory, rows past `end` and
 * columns past D zeroed. kp / vp: padded row strides in elements (DM + 2 keeps lanes on
 * distinct banks). */
template <int DM>
__device__ __forceinline__ void load_tile(bf16 *k_s, int kp, bf16 *v_s, int vp, const bf16 *k, const bf16 *v, int j0, int end,
                                          int K, int g, int D) {
    for (int i = threadIdx.x; i < KT * (DM / 2); i += NT) {
        int kk = i / (DM / 2), c2 = i % (DM / 2), j = j0 + kk;
        bf162 a = __floats2bfloat162_rn(0.0f, 0.0f), b = a;
        if (j < end && 2 * c2 < D) {
            size_t off = ((size_t)j * K + g) * D + 2 * c2;
            a = *(const bf162 *)(k + off);
            b = *(const bf162 *)(v + off);
        }
        *(bf162 *)(k_s + kk * kp + 2 * c2) = a;
        *(bf162 *)(v_s + kk * vp + 2 * c2) = b;
    }
}

/* The block's queries' ranges into shared memory and, per pass, the union [blo, bhi). */
__device__ __forceinline__ void load_ranges(int (*lo_s)[QT], int (*hi_s)[QT], int *blo, int *bhi, attn_ranges r, int t0, int T) {
    if (threadIdx.x < QT) {
        int t = t0 + threadIdx.x, a0 = 0, a1 = 0, b0 = 0, b1 = 0;
        if (t < T) {
            a0 = r.a0[t];
            a1 = r.a1[t];
            b0 = r.b0[t];
            b1 = r.b1[t];
        }
        lo_s[0][threadIdx.x] = a0;
        hi_s[0][threadIdx.x] = a1;
        lo_s[1][threadIdx.x] = b0;
        hi_s[1][threadIdx.x] = b1;
    }
    __syncthreads();
    if (threadIdx.x < 2) {
        int s = threadIdx.x, lo = INT_MAX, hi = INT_MIN;
        for (int i = 0; i < QT; i++)
            if (lo_s[s][i] < hi_s[s][i]) {
                lo = min(lo, lo_s[s][i]);
                hi = max(hi, hi_s[s][i]);
            }
        blo[s] = lo;
        bhi[s] = hi;
    }
    __syncthreads();
}

template <int DM> struct fwd_smem {
    float q_s[QT][DM];
    __align__(16) bf16 k_s[KT * (DM + 2)];
    __align__(16) bf16 v_s[KT * DM];
    int lo_s[2][QT], hi_s[2][QT], blo[2], bhi[2];
};

template <int DM>
__global__ void __launch_bounds__(NT) attn_fwd_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                                                      attn_ranges r, int T, int H, int K, int D, float scale2) {
    constexpr int KP = DM + 2, NP = (DM + 63) / 64;
    fwd_smem<DM> &sm = block_smem<fwd_smem<DM>, DM>();
    auto &q_s = sm.q_s;
    bf16 *k_s = sm.k_s, *v_s = sm.v_s;
    auto &lo_s = sm.lo_s, &hi_s = sm.hi_s;
    int *blo = sm.blo, *bhi = sm.bhi;
    int h = blockIdx.y, g = h / (H / K), t0 = blockIdx.x * QT, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < QT * DM; i += NT) {
        int qi = i / DM, d = i % DM, t = t0 + qi;
        q_s[qi][d] = t < T && d < D ? __bfloat162float(q[((size_t)t * H + h) * D + d]) * scale2 : 0.0f;
    }
    load_ranges(lo_s, hi_s, blo, bhi, r, t0, T);
    float m[4], l[4], acc[4][2 * NP];
#pragma unroll
    for (int a = 0; a < 4; a++) {
        m[a] = -INFINITY;
        l[a] = 0;
#pragma unroll
        for (int e = 0; e < 2 * NP; e++) acc[a][e] = 0;
    }
    for (int s = 0; s < 2; s++) {
        for (int j0 = blo[s]; j0 < bhi[s]; j0 += KT) {
            load_tile<DM>(k_s, KP, v_s, DM, k, v, j0, bhi[s], K, g, D);
            __syncthreads();
            int j = j0 + lane;
            bool valid[4], any = false;
#pragma unroll
            for (int a = 0; a < 4; a++) {
                int qi = warp * 4 + a;
                valid[a] = j >= lo_s[s][qi] && j < hi_s[s][qi];
                any |= valid[a];
            }
            if (__any_sync(FULL, any)) {
                float sc[4] = {0, 0, 0, 0};
                const bf162 *kr = (const bf162 *)(k_s + lane * KP);
#pragma unroll 8
                for (int d2 = 0; d2 < DM / 2; d2++) {
                    float2 kf = __bfloat1622float2(kr[d2]);
#pragma unroll
                    for (int a = 0; a < 4; a++) {
                        float2 qf = *(const float2 *)&q_s[warp * 4 + a][2 * d2];
                        sc[a] += qf.x * kf.x + qf.y * kf.y;
                    }
                }
                float p[4];
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    float sv = valid[a] ? sc[a] : -INFINITY;
                    float mn = fmaxf(m[a], warp_max(sv));
                    p[a] = mn == -INFINITY ? 0.0f : exp2f(sv - mn);
                    float corr = mn == -INFINITY ? 1.0f : exp2f(m[a] - mn);
                    l[a] = l[a] * corr + warp_sum(p[a]);
                    m[a] = mn;
#pragma unroll
                    for (int e = 0; e < 2 * NP; e++) acc[a][e] *= corr;
                }
#pragma unroll 4
                for (int jj = 0; jj < KT; jj++) {
                    const bf162 *vr = (const bf162 *)(v_s + jj * DM);
                    float2 vf[NP];
#pragma unroll
                    for (int pi = 0; pi < NP; pi++)
                        vf[pi] = lane + 32 * pi < DM / 2 ? __bfloat1622float2(vr[lane + 32 * pi]) : make_float2(0, 0);
#pragma unroll
                    for (int a = 0; a < 4; a++) {
                        float pj = __shfl_sync(FULL, p[a], jj);
#pragma unroll
                        for (int pi = 0; pi < NP; pi++) {
                            acc[a][2 * pi] += pj * vf[pi].x;
                            acc[a][2 * pi + 1] += pj * vf[pi].y;
                        }
                    }
                }
            }
            __syncthreads();
        }
    }
#pragma unroll
    for (int a = 0; a < 4; a++) {
        int t = t0 + warp * 4 + a;
        if (t >= T) continue;
        float inv = l[a] > 0 ? 1.0f / l[a] : 0.0f;
        bf162 *o = (bf162 *)(out + ((size_t)t * H + h) * D);
#pragma unroll
        for (int pi = 0; pi < NP; pi++)
            if (2 * (lane + 32 * pi) < D)
                o[lane + 32 * pi] = __floats2bfloat162_rn(acc[a][2 * pi] * inv, acc[a][2 * pi + 1] * inv);
        if (lane == 0) lse[(size_t)t * H + h] = l[a] > 0 ? (m[a] + log2f(l[a])) * LN2 : -INFINITY;
    }
}

/* dq = scale Σ_j P_j (dP_j - Dsum) k_j, dP_j = dout·v_j; also writes Dsum (T,H) for dk/dv. */
template <int DM> struct dq_smem {
    float q_s[QT][DM], do_s[QT][DM];
    __align__(16) bf16 k_s[KT * (DM + 2)];
    __align__(16) bf16 v_s[KT * (DM + 2)];
    int lo_s[2][QT], hi_s[2][QT], blo[2], bhi[2];
};

template <int DM>
__global__ void __launch_bounds__(NT)
    attn_bwd_dq_kernel(bf16 *dq, float *dsum, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *out,
                       const float *lse, attn_ranges r, int T, int H, int K, int D, float scale2, float scale) {
    constexpr int KP = DM + 2, NP = (DM + 63) / 64;
    dq_smem<DM> &sm = block_smem<dq_smem<DM>, DM>();
    auto &q_s = sm.q_s, &do_s = sm.do_s;
    bf16 *k_s = sm.k_s, *v_s = sm.v_s;
    auto &lo_s = sm.lo_s, &hi_s = sm.hi_s;
    int *blo = sm.blo, *bhi = sm.bhi;
    int h = blockIdx.y, g = h / (H / K), t0 = blockIdx.x * QT, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < QT * DM; i += NT) {
        int qi = i / DM, d = i % DM, t = t0 + qi;
        size_t off = ((size_t)t * H + h) * D + d;
        q_s[qi][d] = t < T && d < D ? __bfloat162float(q[off]) * scale2 : 0.0f;
        do_s[qi][d] = t < T && d < D ? __bfloat162float(dout[off]) : 0.0f;
    }
    float L2[4], Ds[4], acc[4][2 * NP];
#pragma unroll
    for (int a = 0; a < 4; a++) {
        int t = t0 + warp * 4 + a;
        float s = 0;
        if (t < T) {
            const bf16 *o = out + ((size_t)t * H + h) * D, *dd = dout + ((size_t)t * H + h) * D;
            for (int d = lane; d < D; d += 32) s += __bfloat162float(o[d]) * __bfloat162float(dd[d]);
        }
        Ds[a] = warp_sum(s);
        L2[a] = t < T ? lse[(size_t)t * H + h] * LOG2E : 0.0f;
        if (t < T && lane == 0) dsum[(size_t)t * H + h] = Ds[a];
#pragma unroll
        for (int e = 0; e < 2 * NP; e++) acc[a][e] = 0;
    }
    load_ranges(lo_s, hi_s, blo, bhi, r, t0, T);
    for (int s = 0; s < 2; s++) {
        for (int j0 = blo[s]; j0 < bhi[s]; j0 += KT) {
            load_tile<DM>(k_s, KP, v_s, KP, k, v, j0, bhi[s], K, g, D);
            __syncthreads();
            int j = j0 + lane;
            bool valid[4], any = false;
#pragma unroll
            for (int a = 0; a < 4; a++) {
                int qi = warp * 4 + a;
                valid[a] = j >= lo_s[s][qi] && j < hi_s[s][qi];
                any |= valid[a];
            }
            if (__any_sync(FULL, any)) {
                float sc[4] = {0, 0, 0, 0}, dp[4] = {0, 0, 0, 0};
                const bf162 *kr = (const bf162 *)(k_s + lane * KP), *vr = (const bf162 *)(v_s + lane * KP);
#pragma unroll 8
                for (int d2 = 0; d2 < DM / 2; d2++) {
                    float2 kf = __bfloat1622float2(kr[d2]), vf = __bfloat1622float2(vr[d2]);
#pragma unroll
                    for (int a = 0; a < 4; a++) {
                        float2 qf = *(const float2 *)&q_s[warp * 4 + a][2 * d2];
                        float2 of = *(const float2 *)&do_s[warp * 4 + a][2 * d2];
                        sc[a] += qf.x * kf.x + qf.y * kf.y;
                        dp[a] += of.x * vf.x + of.y * vf.y;
                    }
                }
                float ds[4];
#pragma unroll
                for (int a = 0; a < 4; a++) {
                    float P = valid[a] ? exp2f(sc[a] - L2[a]) : 0.0f;
                    ds[a] = P * (dp[a] - Ds[a]);
                }
#pragma unroll 4
                for (int jj = 0; jj < KT; jj++) {
                    const bf162 *kk = (const bf162 *)(k_s + jj * KP);
                    float2 kf[NP];
#pragma unroll
                    for (int pi = 0; pi < NP; pi++)
                        kf[pi] = lane + 32 * pi < DM / 2 ? __bfloat1622float2(kk[lane + 32 * pi]) : make_float2(0, 0);
#pragma unroll
                    for (int a = 0; a < 4; a++) {
                        float dj = __shfl_sync(FULL, ds[a], jj);
#pragma unroll
                        for (int pi = 0; pi < NP; pi++) {
                            acc[a][2 * pi] += dj * kf[pi].x;
                            acc[a][2 * pi + 1] += dj * kf[pi].y;
                        }
                    }
                }
            }
            __syncthreads();
        }
    }
#pragma unroll
    for (int a = 0; a < 4; a++) {
        int t = t0 + warp * 4 + a;
        if (t >= T) continue;
        bf162 *o = (bf162 *)(dq + ((size_t)t * H + h) * D);
#pragma unroll
        for (int pi = 0; pi < NP; pi++)
            if (2 * (lane + 32 * pi) < D)
                o[lane + 32 * pi] = __floats2bfloat162_rn(acc[a][2 * pi] * scale, acc[a][2 * pi + 1] * scale);
    }
}

/* qlo[kt], qhi[kt]: the first query, and one past the last, that sees a key of tile kt. */
__global__ void attn_tile_bounds_kernel(int *qlo, int *qhi, attn_ranges r, int T, int S, int kt) {
    __shared__ int lo_s, hi_s;
    int j0 = blockIdx.x * kt, j1 = min(j0 + kt, S), lo = INT_MAX, hi = -1;
    if (threadIdx.x == 0) {
        lo_s = INT_MAX;
        hi_s = -1;
    }
    __syncthreads();
    for (int t = threadIdx.x; t < T; t += blockDim.x) {
        bool sees = max(r.a0[t], j0) < min(r.a1[t], j1) || max(r.b0[t], j0) < min(r.b1[t], j1);
        if (sees) {
            lo = min(lo, t);
            hi = max(hi, t);
        }
    }
    lo = __reduce_min_sync(FULL, lo);
    hi = __reduce_max_sync(FULL, hi);
    if ((threadIdx.x & 31) == 0) {
        atomicMin(&lo_s, lo);
        atomicMax(&hi_s, hi);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        qlo[blockIdx.x] = hi_s < 0 ? 0 : lo_s;
        qhi[blockIdx.x] = hi_s < 0 ? 0 : hi_s + 1;
    }
}

void attn_tile_bounds_cuda(cu_ctx *c, int *qlo, int *qhi, attn_ranges r, int T, int S, int tile) {
    attn_tile_bounds_kernel<<<(S + tile - 1) / tile, 256, 0, c->stream>>>(qlo, qhi, r, T, S, tile);
    CU_LAUNCHED(c, "attn_tile_bounds_kernel");
}

template <int DM> struct dkdv_smem {
    __align__(16) bf16 k_s[KT * (DM + 2)];
    __align__(16) bf16 v_s[KT * (DM + 2)];
    float q_s[QB][DM], do_s[QB][DM];
    float ps_s[4][QB][KT], pd_s[4][QB][KT];
    float lse_s[QB], ds_s[QB];
    int rg[QB][4];
};

template <int DM>
__global__ void __launch_bounds__(NT)
    attn_bwd_dkdv_kernel(bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v, const float *lse,
                         const float *dsum, const int *qlo, const int *qhi, attn_ranges r, int T, int S, int H, int K, int D,
                         float scale2, float scale) {
    constexpr int KP = DM + 2, DW = DM / 4;
    dkdv_smem<DM> &sm = block_smem<dkdv_smem<DM>, DM>();
    bf16 *k_s = sm.k_s, *v_s = sm.v_s;
    auto &q_s = sm.q_s, &do_s = sm.do_s;
    auto &ps_s = sm.ps_s, &pd_s = sm.pd_s;
    float *lse_s = sm.lse_s, *ds_s = sm.ds_s;
    auto &rg = sm.rg;
    int kt = blockIdx.x, g = blockIdx.y, j0 = kt * KT, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int rep = H / K, d0 = warp * DW, j = j0 + lane, t_lo = qlo[kt], t_hi = qhi[kt];
    load_tile<DM>(k_s, KP, v_s, KP, k, v, j0, S, K, g, D);
    float dk_acc[DW], dv_acc[DW];
#pragma unroll
    for (int e = 0; e < DW; e++) {
        dk_acc[e] = 0;
        dv_acc[e] = 0;
    }
    __syncthreads();
    for (int h = g * rep; h < (g + 1) * rep; h++) {
        for (int tb = t_lo; tb < t_hi; tb += QB) {
            for (int i = threadIdx.x; i < QB * DM; i += NT) {
                int qb = i / DM, d = i % DM, t = tb + qb;
                size_t off = ((size_t)t * H + h) * D + d;
                q_s[qb][d] = t < t_hi && d < D ? __bfloat162float(q[off]) : 0.0f;
                do_s[qb][d] = t < t_hi && d < D ? __bfloat162float(dout[off]) : 0.0f;
            }
            int flag = 0;
            if (threadIdx.x < QB) {
                int t = tb + threadIdx.x, a0 = 0, a1 = 0, b0 = 0, b1 = 0;
                if (t < t_hi) {
                    a0 = r.a0[t];
                    a1 = r.a1[t];
                    b0 = r.b0[t];
                    b1 = r.b1[t];
                    lse_s[threadIdx.x] = lse[(size_t)t * H + h] * LOG2E;
                    ds_s[threadIdx.x] = dsum[(size_t)t * H + h];
                    flag = max(a0, j0) < min(a1, j0 + KT) || max(b0, j0) < min(b1, j0 + KT);
                }
                rg[threadIdx.x][0] = a0;
                rg[threadIdx.x][1] = a1;
                rg[threadIdx.x][2] = b0;
                rg[threadIdx.x][3] = b1;
            }
            if (!__syncthreads_or(flag)) continue;
            const bf162 *kr = (const bf162 *)(k_s + lane * KP + d0), *vr = (const bf162 *)(v_s + lane * KP + d0);
#pragma unroll
            for (int qb = 0; qb < QB; qb++) {
                float ps = 0, pd = 0;
#pragma unroll
                for (int d2 = 0; d2 < DW / 2; d2++) {
                    float2 kf = __bfloat1622float2(kr[d2]), vf = __bfloat1622float2(vr[d2]);
                    float2 qf = *(const float2 *)&q_s[qb][d0 + 2 * d2], of = *(const float2 *)&do_s[qb][d0 + 2 * d2];
                    ps += qf.x * kf.x + qf.y * kf.y;
                    pd += of.x * vf.x + of.y * vf.y;
                }
                ps_s[warp][qb][lane] = ps;
                pd_s[warp][qb][lane] = pd;
            }
            __syncthreads();
#pragma unroll
            for (int qb = 0; qb < QB; qb++) {
                int mult = (j >= rg[qb][0] && j < rg[qb][1]) + (j >= rg[qb][2] && j < rg[qb][3]);
                if (!mult) continue;
                float s = (ps_s[0][qb][lane] + ps_s[1][qb][lane] + ps_s[2][qb][lane] + ps_s[3][qb][lane]) * scale2;
                float dp = pd_s[0][qb][lane] + pd_s[1][qb][lane] + pd_s[2][qb][lane] + pd_s[3][qb][lane];
                float P = exp2f(s - lse_s[qb]) * mult;
                float dS = P * (dp - ds_s[qb]) * scale;
#pragma unroll
                for (int e = 0; e < DW; e++) {
                    dv_acc[e] += P * do_s[qb][d0 + e];
                    dk_acc[e] += dS * q_s[qb][d0 + e];
                }
            }
            __syncthreads();
        }
    }
    if (j < S) {
        bf162 *dkr = (bf162 *)(dk + ((size_t)j * K + g) * D + d0), *dvr = (bf162 *)(dv + ((size_t)j * K + g) * D + d0);
#pragma unroll
        for (int e = 0; e < DW / 2; e++) {
            if (d0 + 2 * e >= D) break;
            float2 a = __bfloat1622float2(dkr[e]), b = __bfloat1622float2(dvr[e]);
            dkr[e] = __floats2bfloat162_rn(a.x + dk_acc[2 * e], a.y + dk_acc[2 * e + 1]);
            dvr[e] = __floats2bfloat162_rn(b.x + dv_acc[2 * e], b.y + dv_acc[2 * e + 1]);
        }
    }
}

/* 0 when D is not an even head dim up to ATTN_MAX_HEAD_DIM (the context then holds the error). */
static int head_dim_ok(cu_ctx *c, int D) {
    if (D >= 2 && D <= ATTN_MAX_HEAD_DIM && D % 2 == 0) return 1;
    char what[80];
    snprintf(what, sizeof what, "head dim %d (supported: even, at most %d)", D, ATTN_MAX_HEAD_DIM);
    cu_fail(c, "attention", what, __FILE__, __LINE__);
    return 0;
}

static unsigned raised_fwd, raised_dq, raised_dkdv; /* smem_bytes' once-per-device bits (DM = 256) */

static int use_flash(cu_ctx *c, int D) { return (D == 64 || D == 128 || D == 256) && c->tune->attn != TUNE_ATTN_SIMT; }

/* The key tile of the backward's dk/dv pass (and of its qlo / qhi bounds). */
static int key_tile(cu_ctx *c, int D) {
    return !use_flash(c, D) ? (int)KT : D == 256 ? (int)ATTN_FLASH_BK_D256 : (int)ATTN_FLASH_BK;
}

#define SIMPLE_DM(D, launch) \
    do { \
        if ((D) <= 16) launch(16); \
        else if ((D) <= 32) launch(32); \
        else if ((D) <= 64) launch(64); \
        else if ((D) <= 128) launch(128); \
        else launch(256); \
    } while (0)

/* The forward of ranges a and b (r.nx ignored): the family's dispatch. */
static void fwd_pair(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T, int H,
                     int K, int D) {
    if (c->tune->exact && attn_exact_fwd_cuda(c, out, lse, q, k, v, r, T, H, K, D)) return; /* attention_exact.cu */
    /* ---- decode dispatch point: a small-T decode kernel (attention_decode.cu) returns here
     * before the training kernels below. */
    if ((use_flash(c, D) || (D == 256 && c->tune->attn != TUNE_ATTN_SIMT)) &&
        attn_decode_fwd_cuda(c, out, lse, q, k, v, r, T, H, K, D))
        return;
    float scale2 = LOG2E / sqrtf((float)D);
    if (use_flash(c, D)) {
        if (D == 128) attn_wgmma_fwd_cuda(c, out, lse, q, k, v, r, T, H, K, scale2);
        else attn_mma_fwd_cuda(c, out, lse, q, k, v, r, T, H, K, D, scale2);
        return;
    }
    dim3 grid((T + QT - 1) / QT, H);
#define L_(DM) \
    attn_fwd_kernel<DM><<<grid, NT, smem_bytes<fwd_smem<DM>, DM>(c, attn_fwd_kernel<DM>, &raised_fwd), c->stream>>>( \
        out, lse, q, k, v, r, T, H, K, D, scale2)
    SIMPLE_DM(D, L_);
#undef L_
    CU_LAUNCHED(c, "attn_fwd_kernel");
}

/* The scratch bwd_pair takes: Dsum (T, H), the key tiles' query bounds, wgmma's split parts. */
static size_t bwd_scratch_bytes(cu_ctx *c, int T, int S, int H, int D, size_t *dsum_bytes, size_t *tb, int *ntiles) {
    int flash = use_flash(c, D), kt = key_tile(c, D);
    *ntiles = (S + kt - 1) / kt;
    *dsum_bytes = (((size_t)T * H * sizeof(float)) + 255) & ~(size_t)255;
    *tb = (2 * (size_t)*ntiles * sizeof(int) + 255) & ~(size_t)255;
    return *dsum_bytes + *tb + (flash && D == 128 ? attn_wgmma_bwd_bytes(c, S) : 0);
}

/* The backward of ranges a and b (r.nx ignored; S >= T): dq overwritten, dk/dv +=. */
static void bwd_pair(cu_ctx *c, bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
                     const bf16 *out, const float *lse, attn_ranges r, int T, int S, int H, int K, int D) {
    int flash = use_flash(c, D), kt = key_tile(c, D), ntiles;
    size_t dsum_bytes, tb;
    char *s = (char *)cu_scratch(c, bwd_scratch_bytes(c, T, S, H, D, &dsum_bytes, &tb, &ntiles));
    if (!s) return;
    float *dsum = (float *)s;
    int *qlo = (int *)(s + dsum_bytes), *qhi = qlo + ntiles;
    float scale = 1.0f / sqrtf((float)D), scale2 = LOG2E * scale;
    if (flash) {
        if (D == 128)
            attn_wgmma_bwd_cuda(c, dq, dk, dv, dsum, qlo, qhi, s + dsum_bytes + tb, dout, q, k, v, out, lse, r, T, S, H, K,
                                scale2, scale);
        else attn_mma_bwd_cuda(c, dq, dk, dv, dsum, qlo, qhi, dout, q, k, v, out, lse, r, T, S, H, K, D, scale2, scale);
        return;
    }
    dim3 gq((T + QT - 1) / QT, H), gk(ntiles, K);
#define L_(DM) \
    attn_bwd_dq_kernel<DM><<<gq, NT, smem_bytes<dq_smem<DM>, DM>(c, attn_bwd_dq_kernel<DM>, &raised_dq), c->stream>>>( \
        dq, dsum, dout, q, k, v, out, lse, r, T, H, K, D, scale2, scale)
    SIMPLE_DM(D, L_);
#undef L_
    CU_LAUNCHED(c, "attn_bwd_dq_kernel");
    attn_tile_bounds_cuda(c, qlo, qhi, r, T, S, kt);
#define L_(DM) \
    attn_bwd_dkdv_kernel<DM><<<gk, NT, smem_bytes<dkdv_smem<DM>, DM>(c, attn_bwd_dkdv_kernel<DM>, &raised_dkdv), c->stream>>>( \
        dk, dv, dout, q, k, v, lse, dsum, qlo, qhi, r, T, S, H, K, D, scale2, scale)
    SIMPLE_DM(D, L_);
#undef L_
    CU_LAUNCHED(c, "attn_bwd_dkdv_kernel");
}

/* ---------------------------------------------------------------- extra ranges (prefix trees)
 * A query with extra ranges (attn_ranges.nx > 0) runs as 1 + ceil(nx / 2) launches of the
 * two-range paths above: ranges (a, b), then the extras two at a time. Forward: each later
 * launch's output and lse (scratch) merge into out and lse by their softmax weights. Backward:
 * every launch gets the merged out and lse, so its P = exp(s - lse) and Dsum = dout·out are the
 * whole softmax's and its dq / dk / dv are exactly its keys' share: dk, dv add up (+=), dq from
 * the later launches is added into the first one's. With nx = 0 nothing here runs. */

/* The two-range view of extras x and x + 1 (or x alone: b empty) of r. */
static attn_ranges extra_pair(attn_ranges r, int x, int T) {
    const int *lo = r.x0 + (size_t)x * T, *hi = r.x1 + (size_t)x * T;
    int two = x + 1 < r.nx;
    return (attn_ranges){lo, hi, two ? lo + T : hi, two ? hi + T : hi, NULL, NULL, 0};
}

/* One warp per (t, h) row: out, lse := the softmax merge of (out, lse) and (o2, l2). */
__global__ void attn_merge_kernel(bf16 *out, float *lse, const bf16 *o2, const float *l2, long long rows, int D) {
    long long row = (long long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    float L1 = lse[row], L2 = l2[row];
    if (L2 == -INFINITY) return; /* no key in these ranges */
    float M = fmaxf(L1, L2), w1 = L1 == -INFINITY ? 0.0f : expf(L1 - M), w2 = expf(L2 - M), inv = 1.0f / (w1 + w2);
    bf162 *o = (bf162 *)(out + row * D);
    const bf162 *p = (const bf162 *)(o2 + row * D);
    for (int d = lane; d < D / 2; d += 32) {
        float2 a = __bfloat1622float2(o[d]), b = __bfloat1622float2(p[d]);
        o[d] = __floats2bfloat162_rn((a.x * w1 + b.x * w2) * inv, (a.y * w1 + b.y * w2) * inv);
    }
    if (lane == 0) lse[row] = M + logf(w1 + w2);
}

/* dq += d2 (n elements, even) */
__global__ void attn_add_kernel(bf16 *dq, const bf16 *d2, long long n2) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n2; i += (long long)gridDim.x * blockDim.x) {
        float2 a = __bfloat1622float2(((bf162 *)dq)[i]), b = __bfloat1622float2(((const bf162 *)d2)[i]);
        ((bf162 *)dq)[i] = __floats2bfloat162_rn(a.x + b.x, a.y + b.y);
    }
}

void attention_fwd_cuda(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T,
                        int H, int K, int D) {
    if (c->failed || T <= 0 || !head_dim_ok(c, D)) return;
    fwd_pair(c, out, lse, q, k, v, r, T, H, K, D);
    if (r.nx <= 0) return;
    long long rows = (long long)T * H;
    size_t ob = ((size_t)rows * D * sizeof(bf16) + 255) & ~(size_t)255;
    char *s = (char *)cu_scratch(c, ob + (size_t)rows * sizeof(float));
    if (!s) return;
    bf16 *o2 = (bf16 *)s;
    float *l2 = (float *)(s + ob);
    for (int x = 0; x < r.nx; x += 2) {
        fwd_pair(c, o2, l2, q, k, v, extra_pair(r, x, T), T, H, K, D);
        attn_merge_kernel<<<cu_blocks(rows, 8), 256, 0, c->stream>>>(out, lse, o2, l2, rows, D);
        CU_LAUNCHED(c, "attn_merge_kernel");
    }
}

void attention_bwd_cuda(cu_ctx *c, bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
                        const bf16 *out, const float *lse, attn_ranges r, int T, int S, int H, int K, int D) {
    if (c->failed || T <= 0 || !head_dim_ok(c, D)) return;
    if (S < T) S = T;
    bwd_pair(c, dq, dk, dv, dout, q, k, v, out, lse, r, T, S, H, K, D);
    if (r.nx <= 0) return;
    /* dq2 after bwd_pair's own scratch, which it then finds in place */
    size_t dsum_bytes, tb;
    int ntiles;
    size_t inner = (bwd_scratch_bytes(c, T, S, H, D, &dsum_bytes, &tb, &ntiles) + 255) & ~(size_t)255;
    long long n = (long long)T * H * D;
    char *s = (char *)cu_scratch(c, inner + (size_t)n * sizeof(bf16));
    if (!s) return;
    bf16 *dq2 = (bf16 *)(s + inner);
    for (int x = 0; x < r.nx; x += 2) {
        bwd_pair(c, dq2, dk, dv, dout, q, k, v, out, lse, extra_pair(r, x, T), T, S, H, K, D);
        attn_add_kernel<<<cu_blocks(n / 2, 256) < 4096 ? cu_blocks(n / 2, 256) : 4096, 256, 0, c->stream>>>(dq, dq2, n / 2);
        CU_LAUNCHED(c, "attn_add_kernel");
    }
}
