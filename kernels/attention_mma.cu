/* attention_mma.cu — tensor-core attention (FlashAttention-2 style) for attention.h's two key
 * ranges per query on mma.sync, head dims 64 and 256 (attention.cu dispatches; head dim 128 runs
 * on the wgmma kernels of attention_wgmma.cu). The tile shapes per head dim are fa_cfg (below). The helpers named below and the schedule
 * (fa_sched, fa_next, fa_warp_vote, fa_mask, fa_store_rows, fa_dsum_rows) are
 * attention_tiles.cuh, shared with the wgmma and decode kernels.
 *
 * Every product is mma.sync m16n8k16 (bf16 in, fp32 accumulate) on ldmatrix fragments from
 * shared memory with rows padded by 16 bytes (D + 8 elements: ldmatrix rows land on distinct
 * banks). A warp owns 16 MR rows (MR m16 atoms: every B fragment read from shared memory feeds
 * MR mmas); the other operand streams in BN-row tiles through an NS-stage cp.async pipeline with
 * one barrier a tile (the loads of tile i + NS - 1 go out after the barrier that opens tile i,
 * into the stage tile i - 1 used). Helpers:
 *   mma_abt: acc (16MR x 8NT) += A (16MR x KD, smem rows) · B^T, B (8NT x KD, smem rows)
 *   mma_pb:  acc (16MR x 8ND) += P (16MR x 16KB, fp32 accumulators of an mma_abt, rounded to
 *            bf16 in registers: the A operand) · B (16KB x 8ND, smem rows, ldmatrix.trans)
 * Keys are streamed pass by pass (range a, then range b, as the reference does, so a key inside
 * both ranges counts twice). Per pass the block knows the union [blo, bhi) of its queries' ranges
 * and the interval [flo, fhi) inside every query's range: a tile there needs no mask and no vote;
 * any other tile is kept only if some query needs it (a block vote), and each warp then checks
 * its own rows (skip / no mask / mask per element with the query's own range — queries of one
 * tile may belong to different responses or groups).
 *   (the block sizes below are D 64's; D 256's are half as many rows: fa_cfg)
 *   fwd:  block = 256 queries x one head, 8 warps x 32 rows, 64-key tiles; online softmax in fp32
 *         (log2 domain, scale folded into the exp2's FMA); writes out and lse.
 *   dq:   block = 128 queries x one head, 4 warps x 32 rows, 32-key tiles; recomputes P from
 *         lse, dP = dO·V^T, dS = P(dP - Dsum), dq = scale dS·K; also writes Dsum = rowsum(dO∘O)
 *         for dkdv. No atomics: deterministic.
 *   dkdv: block = 128 keys x one kv head; walks every (64-query tile, head of the group) pair
 *         that sees the tile (qlo/qhi from a scan), S^T = K·Q^T, dP^T = V·dO^T, dV += P^T·dO,
 *         dK += dS^T·Q in fp32 registers — the prompt's dK/dV is the sum over all N responses and
 *         all H/K heads — then one += into the bf16 dk/dv. Deterministic. fa_dkdv2_kernel: 4 key groups of 32 x 2 warps, P^T / dS^T through shared memory
 *         (measured faster than 8 warps x 16 keys with everything in registers).
 * Block order: a block's linear index (x fastest) is mapped query-block (fwd, dq) or key-tile
 * (dkdv) major with the heads inside, heaviest blocks first, so every head's long blocks start
 * before any short one (head-major order left a tail: 10-15% of dkdv at the step shape).
 * Legend: T queries (== key rows in backward), H query heads, K kv heads, D head dim. */
#include "kernels/attention_tiles.cuh"

template <int D, int MR, int NW, int BN, int NS>
__global__ void __launch_bounds__(32 * NW, 8 / NW) fa_fwd_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                                                                 const bf16 *v, attn_ranges r, int T, int H, int K, float sc2) {
    constexpr int ST = D + 8, BM = 16 * MR * NW, TILE = BN * ST, NT = BN / 8;
    extern __shared__ __align__(16) unsigned char fa_dyn[];
    bf16 *q_s = (bf16 *)fa_dyn, *k_s = q_s + BM * ST, *v_s = k_s + NS * TILE;
    __shared__ fa_sched<BM> sc;
    FA_QBLOCK();
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, row0 = w * 16 * MR;
    fa_load_rows<D, BM>(q_s, q, t0, T, H, h);
    fa_sched_load(sc, r, t0, T);
    float o[MR][D / 8][4], m[MR][2], l[MR][2];
    fa_zero(o);
#pragma unroll
    for (int mi = 0; mi < MR; mi++) {
        m[mi][0] = m[mi][1] = -INFINITY;
        l[mi][0] = l[mi][1] = 0;
    }
    FA_PIPE_START();
    while (A.have) {
        FA_PIPE_NEXT();
        int s = A.s, j0 = A.j0, full = A.full;
        int need = 1, wfull = 1;
        if (!full) fa_warp_vote<MR>(sc, s, row0, j0, j0 + BN, need, wfull);
        if (need) {
            float sa[MR][NT][4];
            fa_zero(sa);
            mma_abt<MR, NT, D>(sa, q_s + row0 * ST, k_s + buf * TILE, ST);
            if (!wfull) fa_mask<MR, NT>(sa, sc, s, row0, j0);
#pragma unroll
            for (int mi = 0; mi < MR; mi++) {
                float mx0 = m[mi][0], mx1 = m[mi][1];
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    mx0 = fmaxf(mx0, fmaxf(sa[mi][n][0], sa[mi][n][1]));
                    mx1 = fmaxf(mx1, fmaxf(sa[mi][n][2], sa[mi][n][3]));
                }
                mx0 = fmaxf(mx0, __shfl_xor_sync(FULL, mx0, 1));
                mx0 = fmaxf(mx0, __shfl_xor_sync(FULL, mx0, 2));
                mx1 = fmaxf(mx1, __shfl_xor_sync(FULL, mx1, 1));
                mx1 = fmaxf(mx1, __shfl_xor_sync(FULL, mx1, 2));
                /* scaled maxima; a row with nothing yet keeps 0 so exp2 gives 0, never NaN */
                float u0 = mx0 == -INFINITY ? 0.0f : mx0 * sc2, u1 = mx1 == -INFINITY ? 0.0f : mx1 * sc2;
                float c0 = fa_ex2(m[mi][0] * sc2 - u0), c1 = fa_ex2(m[mi][1] * sc2 - u1);
                m[mi][0] = mx0;
                m[mi][1] = mx1;
                float s0 = 0, s1 = 0;
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    sa[mi][n][0] = fa_ex2(fmaf(sa[mi][n][0], sc2, -u0));
                    sa[mi][n][1] = fa_ex2(fmaf(sa[mi][n][1], sc2, -u0));
                    sa[mi][n][2] = fa_ex2(fmaf(sa[mi][n][2], sc2, -u1));
                    sa[mi][n][3] = fa_ex2(fmaf(sa[mi][n][3], sc2, -u1));
                    s0 += sa[mi][n][0] + sa[mi][n][1];
                    s1 += sa[mi][n][2] + sa[mi][n][3];
                }
                l[mi][0] = l[mi][0] * c0 + s0;
                l[mi][1] = l[mi][1] * c1 + s1;
#pragma unroll
                for (int n = 0; n < D / 8; n++) {
                    o[mi][n][0] *= c0;
                    o[mi][n][1] *= c0;
                    o[mi][n][2] *= c1;
                    o[mi][n][3] *= c1;
                }
            }
            mma_pb<MR, NT / 2, D / 8>(o, sa, v_s + buf * TILE, ST);
        }
        FA_PIPE_ADVANCE();
    }
    fa_wait<0>();
    float inv[MR][2];
#pragma unroll
    for (int mi = 0; mi < MR; mi++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float L = l[mi][hf];
            L += __shfl_xor_sync(FULL, L, 1);
            L += __shfl_xor_sync(FULL, L, 2);
            inv[mi][hf] = L > 0 ? 1.0f / L : 0.0f;
            int t = t0 + row0 + mi * 16 + (lane >> 2) + hf * 8;
            if ((lane & 3) == 0 && t < T) lse[(size_t)t * H + h] = L > 0 ? (m[mi][hf] * sc2 + log2f(L)) * LN2 : -INFINITY;
        }
    fa_store_rows<D, MR>(out, q_s, o, inv, t0, row0, T, H, h); /* the warp's own q_s rows */
}

/* dq = scale Σ_j dS_j k_j with P from lse; writes Dsum (T, H) = rowsum(dO ∘ O) first. */
template <int D, int MR, int NW, int BN, int NS>
__global__ void __launch_bounds__(32 * NW, 8 / NW)
    fa_dq_kernel(bf16 *dq, float *dsum, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *out,
                 const float *lse, attn_ranges r, int T, int H, int K, float sc2, float scale) {
    constexpr int ST = D + 8, BM = 16 * MR * NW, TILE = BN * ST, NT = BN / 8;
    extern __shared__ __align__(16) unsigned char fa_dyn[];
    bf16 *q_s = (bf16 *)fa_dyn, *do_s = q_s + BM * ST, *k_s = do_s + BM * ST, *v_s = k_s + NS * TILE;
    __shared__ fa_sched<BM> sc;
    __shared__ float l2_s[BM], ds_s[BM];
    FA_QBLOCK();
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, row0 = w * 16 * MR;
    fa_load_rows<D, BM>(q_s, q, t0, T, H, h);
    fa_load_rows<D, BM>(do_s, dout, t0, T, H, h);
    fa_dsum_rows<D, 16 * MR>(ds_s, dsum, out, dout, t0, row0, T, H, h);
    for (int i = threadIdx.x; i < BM; i += blockDim.x) {
        float L = t0 + i < T ? lse[(size_t)(t0 + i) * H + h] : 0.0f;
        l2_s[i] = L == -INFINITY ? INFINITY : L * LOG2E; /* a query with no keys: P = 0 */
    }
    fa_sched_load(sc, r, t0, T);
    float L[MR][2], Ds[MR][2];
#pragma unroll
    for (int mi = 0; mi < MR; mi++)
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            int rr = row0 + mi * 16 + (lane >> 2) + hf * 8;
            L[mi][hf] = l2_s[rr];
            Ds[mi][hf] = ds_s[rr];
        }
    float acc[MR][D / 8][4];
    fa_zero(acc);
    FA_PIPE_START();
    while (A.have) {
        FA_PIPE_NEXT();
        int s = A.s, j0 = A.j0, full = A.full;
        int need = 1, wfull = 1;
        if (!full) fa_warp_vote<MR>(sc, s, row0, j0, j0 + BN, need, wfull);
        if (need) {
            float sa[MR][NT][4], dp[MR][NT][4];
            fa_zero(sa);
            fa_zero(dp);
            mma_abt<MR, NT, D>(sa, q_s + row0 * ST, k_s + buf * TILE, ST);
            mma_abt<MR, NT, D>(dp, do_s + row0 * ST, v_s + buf * TILE, ST);
            if (!wfull) fa_mask<MR, NT>(sa, sc, s, row0, j0);
#pragma unroll
            for (int mi = 0; mi < MR; mi++)
#pragma unroll
                for (int n = 0; n < NT; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float P = fa_ex2(fmaf(sa[mi][n][e], sc2, -L[mi][e >> 1]));
                        sa[mi][n][e] = P * (dp[mi][n][e] - Ds[mi][e >> 1]);
                    }
            mma_pb<MR, NT / 2, D / 8>(acc, sa, k_s + buf * TILE, ST);
        }
        FA_PIPE_ADVANCE();
    }
    fa_wait<0>();
    float sc_[MR][2];
#pragma unroll
    for (int mi = 0; mi < MR; mi++) sc_[mi][0] = sc_[mi][1] = scale;
    fa_store_rows<D, MR>(dq, q_s, acc, sc_, t0, row0, T, H, h); /* the warp's own q_s rows */
}

/* dkdv, FlashAttention-2 layout: block = 32 (8 / NH) keys x one kv head, 8 warps as 8 / NH key
 * groups (32 keys) x NH parts (NH 2: 128 keys, 4 groups x 2 halves; NH 4 at D 256: 64 keys, 2
 * groups x 4 quarters, so that dK and dV of a warp's 32 keys x D / NH dims stay 128 registers).
 * Phase 1: warp (kg, hf) computes S^T and dP^T for its 32 keys x 64 / NH queries (hf's part of
 * the 64-query tile) and writes P^T and dS^T (bf16) to shared memory; a named barrier joins the
 * NH warps of the key group; phase 2: warp (kg, hf) accumulates dV and dK for its 32 keys x
 * D / NH dims (hf's part) over all 64 queries. Every Q/dO fragment read from shared memory feeds
 * 2 mmas (the one-warp-per-16-keys layout feeds 1). NS-stage Q/dO pipeline; deterministic. */
template <int D, int NH, int NS>
__global__ void __launch_bounds__(256, 1)
    fa_dkdv2_kernel(bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v, const float *lse,
                    const float *dsum, const int *qlo, const int *qhi, attn_ranges r, int T, int S, int H, int K, float sc2,
                    float scale) {
    /* NH warps a key group: phase 1 splits the tile's queries NH ways (QW each), phase 2 D (DW) */
    constexpr int ST = D + 8, BK = 32 * (8 / NH), TILE = FA_Q * ST, PS = FA_Q + 8, QW = FA_Q / NH, DW = D / NH;
    extern __shared__ __align__(16) unsigned char fa_dyn[];
    bf16 *k_s = (bf16 *)fa_dyn, *v_s = k_s + BK * ST, *q_s = v_s + BK * ST, *do_s = q_s + NS * TILE;
    bf16 *pt_s = do_s + NS * TILE, *dst_s = pt_s + BK * PS;
    __shared__ fa_qrows qr[NS];
    int lin = blockIdx.x + blockIdx.y * gridDim.x;
    int kt = lin / K, g = lin % K, j0 = kt * BK, rep = H / K;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, gr = lane >> 2, c2 = 2 * (lane & 3);
    int kg = w / NH, hf = w % NH, kw0 = j0 + kg * 32; /* the group's keys: kw0 .. kw0 + 31 */
    int t_lo = qlo[kt], t_hi = qhi[kt], ntile = (t_hi - t_lo + FA_Q - 1) / FA_Q, npair = ntile * rep;
    fa_load_rows<D, BK>(k_s, k, j0, S, K, g);
    fa_load_rows<D, BK>(v_s, v, j0, S, K, g);
    float dka[2][DW / 8][4], dva[2][DW / 8][4];
    fa_zero(dka);
    fa_zero(dva);
    float xl2 = INFINITY, xds = 0;
    int xa0 = 0, xa1 = 0, xb0 = 0, xb1 = 0;
    auto load_pair = [&](int i, int b) {
        int tb = t_lo + (i / rep) * FA_Q, h = g * rep + i % rep;
        fa_load_rows<D, FA_Q>(q_s + b * TILE, q, tb, t_hi, H, h);
        fa_load_rows<D, FA_Q>(do_s + b * TILE, dout, tb, t_hi, H, h);
        if (threadIdx.x < FA_Q) {
            int t = tb + threadIdx.x;
            xl2 = INFINITY;
            xds = 0;
            xa0 = xa1 = xb0 = xb1 = 0;
            if (t < t_hi) {
                xa0 = r.a0[t];
                xa1 = r.a1[t];
                xb0 = r.b0[t];
                xb1 = r.b1[t];
                float L = lse[(size_t)t * H + h];
                xl2 = L == -INFINITY ? INFINITY : L * LOG2E; /* a query with no keys: P = 0 */
                xds = dsum[(size_t)t * H + h];
            }
        }
    };
    auto store_rows = [&](int b) {
        if (threadIdx.x < FA_Q) {
            fa_qrows &x = qr[b];
            x.l2[threadIdx.x] = xl2;
            x.ds[threadIdx.x] = xds;
            x.rg[threadIdx.x][0] = xa0;
            x.rg[threadIdx.x][1] = xa1;
            x.rg[threadIdx.x][2] = xb0;
            x.rg[threadIdx.x][3] = xb1;
        }
    };
#pragma unroll
    for (int p = 0; p < NS - 1; p++) {
        if (p < npair) {
            load_pair(p, p);
            store_rows(p);
        }
        fa_commit();
    }
    for (int i = 0, b = 0; i < npair; i++, b = b + 1 == NS ? 0 : b + 1) {
        int nx = i + NS - 1, nb = b == 0 ? NS - 1 : b - 1;
        fa_wait<NS - 2>();
        __syncthreads(); /* also: every warp is done reading pt_s / dst_s of pair i - 1 */
        if (nx < npair) load_pair(nx, nb);
        fa_commit();
        const fa_qrows &x = qr[b];
        /* the group's 32 keys against the pair's 64 queries (two a lane): skip, no mask, or mask;
         * both warps of the group reach the same verdict */
        int need = 0, cover = 1;
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int qc = lane + 32 * u, a0 = x.rg[qc][0], a1 = x.rg[qc][1], b0 = x.rg[qc][2], b1 = x.rg[qc][3];
            int ia = max(a0, kw0) < min(a1, kw0 + 32), ib = max(b0, kw0) < min(b1, kw0 + 32);
            int ca = a0 <= kw0 && kw0 + 32 <= a1, cb = b0 <= kw0 && kw0 + 32 <= b1;
            need |= ia | ib;
            cover &= (ca && !ib) || (cb && !ia);
        }
        need = __any_sync(FULL, need);
        int full = __all_sync(FULL, cover);
        const bf16 *qt = q_s + b * TILE, *dt = do_s + b * TILE;
        if (need) {
            float sa[2][QW / 8][4], dp[2][QW / 8][4];
            fa_zero(sa);
            fa_zero(dp);
            mma_abt<2, QW / 8, D>(sa, k_s + kg * 32 * ST, qt + hf * QW * ST, ST); /* S^T: rows keys, cols queries */
            mma_abt<2, QW / 8, D>(dp, v_s + kg * 32 * ST, dt + hf * QW * ST, ST);
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int n = 0; n < QW / 8; n++)
#pragma unroll
                    for (int e2 = 0; e2 < 2; e2++) {
                        int row = kg * 32 + mi * 16 + gr + e2 * 8, col = hf * QW + n * 8 + c2, j = j0 + row;
                        float pv[2], dv2[2];
#pragma unroll
                        for (int e1 = 0; e1 < 2; e1++) {
                            int e = 2 * e2 + e1, qc = col + e1;
                            float P = fa_ex2(fmaf(sa[mi][n][e], sc2, -x.l2[qc]));
                            if (!full)
                                P *= (float)((j >= x.rg[qc][0] && j < x.rg[qc][1]) + (j >= x.rg[qc][2] && j < x.rg[qc][3]));
                            pv[e1] = P;
                            dv2[e1] = P * (dp[mi][n][e] - x.ds[qc]);
                        }
                        *(bf162 *)(pt_s + row * PS + col) = __floats2bfloat162_rn(pv[0], pv[1]);
                        *(bf162 *)(dst_s + row * PS + col) = __floats2bfloat162_rn(dv2[0], dv2[1]);
                    }
        }
        /* P^T / dS^T written -> read: the group's NH warps (named barrier 1 + kg), every pair
         * whether or not the group needs it */
        asm volatile("bar.sync %0, %1;\n" ::"r"(1 + kg), "n"(32 * NH) : "memory");
        if (need) {
            mma_ab<2, FA_Q / 16, DW / 8>(dva, pt_s + kg * 32 * PS, PS, dt + hf * DW, ST);
            mma_ab<2, FA_Q / 16, DW / 8>(dka, dst_s + kg * 32 * PS, PS, qt + hf * DW, ST);
        }
        if (nx < npair) store_rows(nb);
    }
    fa_wait<0>();
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            int j = kw0 + mi * 16 + gr + e2 * 8;
            if (j >= S) continue;
            bf16 *dkr = dk + ((size_t)j * K + g) * D + hf * DW, *dvr = dv + ((size_t)j * K + g) * D + hf * DW;
#pragma unroll
            for (int n = 0; n < DW / 8; n++) {
                bf162 *pk = (bf162 *)(dkr + n * 8 + c2), *pv = (bf162 *)(dvr + n * 8 + c2);
                float2 a = __bfloat1622float2(*pk), bb = __bfloat1622float2(*pv);
                *pk = __floats2bfloat162_rn(a.x + dka[mi][n][2 * e2] * scale, a.y + dka[mi][n][2 * e2 + 1] * scale);
                *pv = __floats2bfloat162_rn(bb.x + dva[mi][n][2 * e2], bb.y + dva[mi][n][2 * e2 + 1]);
            }
        }
}

/* ---------------------------------------------------------------- launchers (D = 64, 256) */

/* Tile shapes by head dim. D 64: fwd MR 2, 8 warps (256 queries), 64-key tiles, 2 stages
 * (measured faster than 3 on H100, 1 block an SM either way); dq MR 2, 4 warps (128 queries),
 * 32-key tiles, 2 stages (2 blocks an SM); dkdv 128-key blocks (NH 2), 3 stages. D 256: one m16
 * atom a warp (MR 1: a row block's D / 8 x 4 fp32 accumulators are 128 registers), 8 warps (128
 * queries) in fwd and dq, dkdv 64-key blocks (NH 4), 2 stages everywhere: each kernel's shared
 * memory is 203-224 KB of the 227 KB an SM has. */
template <int D> struct fa_cfg;
template <> struct fa_cfg<64> {
    enum { MR = 2, FWD_NW = 8, FWD_BN = 64, FWD_NS = 2, DQ_NW = 4, DQ_BN = 32, NH = 2, DKDV_NS = 3 };
};
template <> struct fa_cfg<256> {
    enum { MR = 1, FWD_NW = 8, FWD_BN = 64, FWD_NS = 2, DQ_NW = 8, DQ_BN = 32, NH = 4, DKDV_NS = 2 };
};

/* Sets a flash kernel's dynamic shared memory limit to `rows` rows of stride D + 8, plus `extra` bytes. */
template <typename F> static size_t flash_smem(cu_ctx *c, F *kernel, int rows, int D, size_t extra) {
    size_t bytes = (size_t)rows * (D + 8) * sizeof(bf16) + extra;
    CU_CK(c, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return bytes;
}

template <int D>
static void mma_fwd(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T, int H,
                    int K, float sc2) {
    typedef fa_cfg<D> F;
    constexpr int BM = 16 * F::MR * F::FWD_NW;
    auto kern = fa_fwd_kernel<D, F::MR, F::FWD_NW, F::FWD_BN, F::FWD_NS>;
    size_t sm = flash_smem(c, kern, BM + 2 * F::FWD_NS * F::FWD_BN, D, 0);
    kern<<<dim3((T + BM - 1) / BM, H), 32 * F::FWD_NW, sm, c->stream>>>(out, lse, q, k, v, r, T, H, K, sc2);
    CU_LAUNCHED(c, "fa_fwd_kernel");
}

template <int D>
static void mma_bwd(cu_ctx *c, bf16 *dq, bf16 *dk, bf16 *dv, float *dsum, int *qlo, int *qhi, const bf16 *dout, const bf16 *q,
                    const bf16 *k, const bf16 *v, const bf16 *out, const float *lse, attn_ranges r, int T, int S, int H, int K,
                    float sc2, float scale) {
    typedef fa_cfg<D> F;
    constexpr int BM = 16 * F::MR * F::DQ_NW, BK = 32 * (8 / F::NH), NS = F::DKDV_NS;
    static_assert(BK == ATTN_FLASH_BK || (D == 256 && BK == ATTN_FLASH_BK_D256), "dkdv key tile: attention.cuh's");
    auto dqk = fa_dq_kernel<D, F::MR, F::DQ_NW, F::DQ_BN, 2>;
    size_t sm = flash_smem(c, dqk, 2 * BM + 4 * F::DQ_BN, D, 0);
    dqk<<<dim3((T + BM - 1) / BM, H), 32 * F::DQ_NW, sm, c->stream>>>(dq, dsum, dout, q, k, v, out, lse, r, T, H, K, sc2, scale);
    CU_LAUNCHED(c, "fa_dq_kernel");
    attn_tile_bounds_cuda(c, qlo, qhi, r, T, S, BK);
    /* K, V, NS Q/dO stages, and the P^T / dS^T tiles (BK rows of FA_Q + 8) */
    auto dkv = fa_dkdv2_kernel<D, F::NH, NS>;
    size_t smk = flash_smem(c, dkv, 2 * BK + 2 * NS * FA_Q, D, 2 * BK * (FA_Q + 8) * sizeof(bf16));
    dkv<<<dim3((S + BK - 1) / BK, K), 256, smk, c->stream>>>(dk, dv, dout, q, k, v, lse, dsum, qlo, qhi, r, T, S, H, K, sc2, scale);
    CU_LAUNCHED(c, "fa_dkdv2_kernel");
}

void attn_mma_fwd_cuda(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T, int H,
                       int K, int D, float sc2) {
    if (D == 64) mma_fwd<64>(c, out, lse, q, k, v, r, T, H, K, sc2);
    else mma_fwd<256>(c, out, lse, q, k, v, r, T, H, K, sc2);
}

void attn_mma_bwd_cuda(cu_ctx *c, bf16 *dq, bf16 *dk, bf16 *dv, float *dsum, int *qlo, int *qhi, const bf16 *dout, const bf16 *q,
                       const bf16 *k, const bf16 *v, const bf16 *out, const float *lse, attn_ranges r, int T, int S, int H, int K,
                       int D, float sc2, float scale) {
    if (D == 64) mma_bwd<64>(c, dq, dk, dv, dsum, qlo, qhi, dout, q, k, v, out, lse, r, T, S, H, K, sc2, scale);
    else mma_bwd<256>(c, dq, dk, dv, dsum, qlo, qhi, dout, q, k, v, out, lse, r, T, S, H, K, sc2, scale);
}
