/* attention_wgmma.cu — Hopper warpgroup-MMA (wgmma, sm_90a) attention for attention.h's two key
 * ranges per query, head dim 128 (attention.cu dispatches); the tile schedule (fa_sched /
 * fa_next / fa_warp_vote / fa_mask) and row store are attention_tiles.cuh's.
 *
 * Shared-memory tiles, descriptors and fragments are wgmma.cuh's: Q and K K-major (S = Q·K^T),
 * V MN-major (B in O = P·V), D/64 column blocks a tile.
 * The three kernels (fwd, dq, dkdv) are warp-specialised, FlashAttention-3's layout with cp.async
 * in place of TMA (the key rows a query may read are bounded by its ranges, not by a tensor
 * extent the backend is given): 384 threads, warpgroup 0 the producer streaming tiles into
 * shared-memory rings signalled by full / empty mbarriers, warpgroups 1 and 2 the consumers,
 * which never meet at a block barrier, so one's elementwise work runs under the other's
 * products. */
#include "kernels/attention_tiles.cuh"
#include "kernels/wgmma.cuh"

/* rows [r0, r0 + ROWS) of a (rows, heads, D) tensor at head `hd` into a swizzled tile, by NTH
 * threads (threadIdx.x % NTH); rows >= end are zero-filled (cp.async: the caller commits and
 * waits, or arrives on an mbarrier). A thread always copies the same chunk of rows NTH / (D / 8)
 * apart (a multiple of 8), so its shared offset (same row % 8) and its source pointer just step. */
template <int D, int ROWS, int NTH = 256>
__device__ __forceinline__ void wg_load_rows(unsigned char *dst, const bf16 *src, int r0, int end, int heads, int hd) {
    constexpr int C = D / 8, RPI = NTH / C;
    static_assert(RPI % 8 == 0 && ROWS % RPI == 0, "wg_load_rows: whole 8-row groups a step");
    int tid = threadIdx.x % NTH, row = tid / C, c = tid % C;
    unsigned char *d = dst + wg_off<ROWS>(row, c);
    const bf16 *p = src + ((size_t)(r0 + row) * heads + hd) * D + c * 8;
    size_t step = (size_t)RPI * heads * D;
#pragma unroll
    for (int it = 0; it < ROWS / RPI; it++) {
        bool ok = r0 + row + it * RPI < end;
        fa_cp16((bf16 *)(d + it * RPI * 128), ok ? p + it * step : src, ok);
    }
}

/* One tile's online softmax for a warp's 16 rows (two a thread): sa (raw scores, masked) becomes
 * P = exp2(sa sc2 - m sc2) with the running max m updated; returns the correction factors of the
 * previous max in c, and adds the tile's row sums (thread-partial) into l after scaling it. */
template <int NT>
__device__ __forceinline__ void wg_softmax(float (&sa)[NT][4], float (&m)[2], float (&l)[2], float (&c)[2], float sc2) {
    /* four partial maxima / sums a row: short dependency chains */
    float a0[4], a1[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        a0[i] = m[0];
        a1[i] = m[1];
    }
#pragma unroll
    for (int n = 0; n < NT; n++) {
        a0[n & 3] = fmaxf(a0[n & 3], fmaxf(sa[n][0], sa[n][1]));
        a1[n & 3] = fmaxf(a1[n & 3], fmaxf(sa[n][2], sa[n][3]));
    }
    float mx0 = fmaxf(fmaxf(a0[0], a0[1]), fmaxf(a0[2], a0[3])), mx1 = fmaxf(fmaxf(a1[0], a1[1]), fmaxf(a1[2], a1[3]));
    mx0 = fmaxf(mx0, __shfl_xor_sync(FULL, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(FULL, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(FULL, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(FULL, mx1, 2));
    /* scaled maxima; a row with nothing yet keeps 0 so exp2 gives 0, never NaN */
    float u0 = mx0 == -INFINITY ? 0.0f : mx0 * sc2, u1 = mx1 == -INFINITY ? 0.0f : mx1 * sc2;
    c[0] = fa_ex2(m[0] * sc2 - u0);
    c[1] = fa_ex2(m[1] * sc2 - u1);
    m[0] = mx0;
    m[1] = mx1;
#pragma unroll
    for (int i = 0; i < 4; i++) a0[i] = a1[i] = 0;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        sa[n][0] = fa_ex2(fmaf(sa[n][0], sc2, -u0));
        sa[n][1] = fa_ex2(fmaf(sa[n][1], sc2, -u0));
        sa[n][2] = fa_ex2(fmaf(sa[n][2], sc2, -u1));
        sa[n][3] = fa_ex2(fmaf(sa[n][3], sc2, -u1));
        a0[n & 3] += sa[n][0] + sa[n][1];
        a1[n & 3] += sa[n][2] + sa[n][3];
    }
    float s0 = (a0[0] + a0[1]) + (a0[2] + a0[3]), s1 = (a1[0] + a1[1]) + (a1[2] + a1[3]);
    l[0] = l[0] * c[0] + s0;
    l[1] = l[1] * c[1] + s1;
}

/* fp32 accumulator fragments (16 x 8NT) -> bf16 register-A fragments of NT/2 k16 steps */
template <int NT> __device__ __forceinline__ void wg_pack(unsigned (&p)[NT / 2][4], const float (&sa)[NT][4]) {
#pragma unroll
    for (int kb = 0; kb < NT / 2; kb++) {
        p[kb][0] = fa_pack(sa[2 * kb][0], sa[2 * kb][1]);
        p[kb][1] = fa_pack(sa[2 * kb][2], sa[2 * kb][3]);
        p[kb][2] = fa_pack(sa[2 * kb + 1][0], sa[2 * kb + 1][1]);
        p[kb][3] = fa_pack(sa[2 * kb + 1][2], sa[2 * kb + 1][3]);
    }
}

/* fwd and dq: 128-query blocks; fwd 128-key tiles (two K and two V stages), dq 64-key tiles
 * (WG_DQ_NS stages of K and V); dkdv: 128-key blocks, WG_DKDV_NS stages of 64-query Q/dO. */
enum { WG_BM = 128, WG_BN = 128, WG_DQ_BN = 64, WG_DQ_NS = 3, WG_KB = 128, WG_DKDV_NS = 3 };

/* ---- the warp-specialised kernels: mbarriers (wgmma.cuh), a producer warpgroup of cp.async loads */
/* fa_next with a warp vote instead of a block vote: every warp that walks the schedule gets
 * the same tiles (the producer's and each consumer's walk agree without a barrier). */
template <int BM, int BN> __device__ __forceinline__ bool fa_next_warp(const fa_sched<BM> &sc, int &s, int &j0, int &full) {
    int lane = threadIdx.x & 31;
    while (s < 2) {
        if (j0 < sc.bhi[s]) {
            if (j0 >= sc.flo[s] && j0 + BN <= sc.fhi[s]) {
                full = 1;
                return true;
            }
            int any = 0;
            for (int i = lane; i < BM; i += 32) any |= max(sc.lo[s][i], j0) < min(sc.hi[s][i], j0 + BN);
            if (__any_sync(FULL, any)) {
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

/* The first tile of a walk, and the next one after X (X.have false at the end). */
template <int BM, int BN> __device__ __forceinline__ fa_tile wg_tile_first(const fa_sched<BM> &sc) {
    fa_tile X = {0, sc.blo[0], 0, false};
    X.have = fa_next_warp<BM, BN>(sc, X.s, X.j0, X.full);
    return X;
}
template <int BM, int BN> __device__ __forceinline__ void wg_tile_next(const fa_sched<BM> &sc, fa_tile &X) {
    X.j0 += BN;
    X.have = fa_next_warp<BM, BN>(sc, X.s, X.j0, X.full);
}

/* A consumer warp's mask of tile X over its 16 rows from row0 (nothing when the tile, or this
 * warp's part of it, is fully visible). */
template <int NT, int BM, int BN>
__device__ __forceinline__ void wg_mask_tile(float (&sa)[1][NT][4], const fa_sched<BM> &sc, const fa_tile &X, int row0) {
    int need = 1, wfull = 1;
    if (!X.full) fa_warp_vote<1>(sc, X.s, row0, X.j0, X.j0 + BN, need, wfull);
    if (!wfull) fa_mask<1, NT>(sa, sc, X.s, row0, X.j0);
}

/* The producer's walk (fwd and dq): every key tile the block needs, K_i into stage i % NS of k_s
 * and V_i into v_s, each after its empty barrier's previous phase (consumers done with tile i -
 * NS) and announced on its full barrier when the copies land. dq passes the same barriers for K
 * and V (one stage = both; two arrivals a thread a phase). */
template <int D, int BM, int BN, int NS>
__device__ __forceinline__ void wg_produce_kv(const fa_sched<BM> &sc, unsigned char *k_s, unsigned char *v_s, const bf16 *k,
                                              const bf16 *v, int K, int g, unsigned long long *kf, unsigned long long *ke,
                                              unsigned long long *vf, unsigned long long *ve) {
    constexpr int TK = BN * D * 2;
    fa_tile X = wg_tile_first<BM, BN>(sc);
    for (int i = 0; X.have; i++) {
        int st = i % NS;
        unsigned ph = ((i / NS) & 1) ^ 1;
        mb_wait(ke + st, ph);
        wg_load_rows<D, BN, 128>(k_s + st * TK, k, X.j0, sc.bhi[X.s], K, g);
        mb_arrive_cp(kf + st);
        mb_wait(ve + st, ph);
        wg_load_rows<D, BN, 128>(v_s + st * TK, v, X.j0, sc.bhi[X.s], K, g);
        mb_arrive_cp(vf + st);
        wg_tile_next<BM, BN>(sc, X);
    }
    fa_wait<0>();
}

/* fwd, D = 128, warp-specialised (FlashAttention-3's layout without TMA): warpgroup 0 is the
 * producer — it walks the block's key tiles and streams Q, then K_i and V_i into two-stage rings
 * with cp.async, each stage's arrival signalled on a "full" mbarrier (one arrival a producer
 * thread when its copies land) and reused after the consumers' "empty" arrivals; warpgroups 1
 * and 2 are the consumers (64 query rows each) and never meet at a block barrier, so one's
 * softmax runs under the other's products. Per tile j a consumer issues S_j = Q·K_j^T together
 * with O += P_{j-1}·V_{j-1}, and runs the softmax of S_j while the second product is in flight
 * (FlashAttention-3's intra-warpgroup overlap); O is rescaled once that product is done. Tiles no
 * query of the block needs are skipped (fa_next_warp); a warp masks only a tile it does not fully
 * see. setmaxnreg gives the consumers 224 registers and the producer 56. */
template <int D>
__global__ void __launch_bounds__(384, 1) wg_fwd_ws_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                                                           attn_ranges r, int T, int H, int K, float sc2) {
    static_assert(D == 128, "wgmma forward: head dim 128");
    constexpr int BM = WG_BM, BN = WG_BN, NT = BN / 8, TQ = BM * D * 2, TK = BN * D * 2;
    extern __shared__ unsigned char wg_dyn[];
    unsigned char *q_s = (unsigned char *)(((size_t)wg_dyn + 1023) & ~(size_t)1023), *k_s = q_s + TQ, *v_s = k_s + 2 * TK;
    __shared__ fa_sched<BM> sc;
    /* q_full, k_full[2], v_full[2], k_empty[2], v_empty[2] */
    __shared__ __align__(8) unsigned long long bar[9];
    unsigned long long *q_full = bar, *k_full = bar + 1, *v_full = bar + 3, *k_empty = bar + 5, *v_empty = bar + 7;
    FA_QBLOCK();
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        for (int i = 0; i < 5; i++) mb_init(bar + i, 128); /* producer threads */
        for (int i = 5; i < 9; i++) mb_init(bar + i, 256); /* consumer threads */
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    fa_sched_load(sc, r, t0, T); /* ends with a block barrier: the mbarriers are ready too */
    if (w < 4) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
        wg_load_rows<D, BM, 128>(q_s, q, t0, T, H, h);
        mb_arrive_cp(q_full);
        wg_produce_kv<D, BM, BN, 2>(sc, k_s, v_s, k, v, K, g, k_full, k_empty, v_full, v_empty);
        return;
    }
    /* the block holds 168 x 384 registers: 128 x 56 + 256 x 224 fits exactly */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
    int cw = w - 4, row0 = cw * 16, wrow = (cw >> 2) * 64;
    float o[1][D / 8][4], sa[1][NT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0}, c[2];
    unsigned p[NT / 2][4];
    fa_zero(o);
    const unsigned long long dq = wg_desc_k(q_s + wrow * 128), dk = wg_desc_k(k_s), dv = wg_desc_mn<BN>(v_s);
    mb_acquire(q_full, 0);
    auto s_issue = [&](int i) {
        mb_acquire(k_full + (i & 1), (i >> 1) & 1);
        wg_fence();
        const unsigned long long dki = dk + (i & 1) * (TK >> 4);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) wg_mma_ss128(sa[0], dq + wg_step_k<BM>(kk), dki + wg_step_k<BN>(kk), kk);
        wg_commit();
    };
    auto pv_issue = [&](int i) {
        mb_acquire(v_full + (i & 1), (i >> 1) & 1);
        wg_fence();
#pragma unroll
        for (int kb = 0; kb < NT / 2; kb++) wg_mma_rs128(o[0], p[kb], dv + (i & 1) * (TK >> 4) + wg_step_mn(kb), 1);
        wg_commit();
    };
    fa_tile X = wg_tile_first<BM, BN>(sc);
    int i = 0;
    if (X.have) {
        s_issue(0);
        wg_wait<0>();
        wg_keep(sa[0]);
        mb_arrive(k_empty);
        wg_mask_tile<NT, BM, BN>(sa, sc, X, row0);
        wg_softmax<NT>(sa[0], m, l, c, sc2);
        wg_pack<NT>(p, sa[0]);
        wg_tile_next<BM, BN>(sc, X);
        for (i = 1; X.have; i++) {
            s_issue(i);
            pv_issue(i - 1);
            wg_wait<1>();
            wg_keep(sa[0]);
            mb_arrive(k_empty + (i & 1));
            wg_mask_tile<NT, BM, BN>(sa, sc, X, row0);
            wg_softmax<NT>(sa[0], m, l, c, sc2);
            wg_wait<0>();
            wg_keep(o[0]);
            mb_arrive(v_empty + ((i - 1) & 1));
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                o[0][n][0] *= c[0];
                o[0][n][1] *= c[0];
                o[0][n][2] *= c[1];
                o[0][n][3] *= c[1];
            }
            wg_pack<NT>(p, sa[0]);
            wg_tile_next<BM, BN>(sc, X);
        }
        pv_issue(i - 1);
        wg_wait<0>();
        wg_keep(o[0]);
    }
    float inv[1][2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        float L = l[hf];
        L += __shfl_xor_sync(FULL, L, 1);
        L += __shfl_xor_sync(FULL, L, 2);
        inv[0][hf] = L > 0 ? 1.0f / L : 0.0f;
        int t = t0 + row0 + (lane >> 2) + hf * 8;
        if ((lane & 3) == 0 && t < T) lse[(size_t)t * H + h] = L > 0 ? (m[hf] * sc2 + log2f(L)) * LN2 : -INFINITY;
    }
    asm volatile("bar.sync 1, 256;\n" ::: "memory"); /* both consumers are done with k_s: it stages the rows */
    fa_store_rows<D, 1>(out, (bf16 *)k_s, o, inv, t0, row0, T, H, h);
}

/* dkdv, D = 128: block = 128 keys x one kv head. It walks every (64-query tile, head of the
 * group) pair that sees its keys (qlo / qhi from attn_tile_bounds_kernel). Warp-specialised like
 * wg_fwd_ws_kernel: warpgroup 0 loads K and V once, then streams each pair's Q, dO and row scalars
 * (lse, Dsum, ranges) into a WG_DKDV_NS-stage ring (full / empty mbarriers); warpgroups 1 and 2
 * own 64 keys each (warp w: 16 keys) and never meet at a block barrier. Per pair: S^T = K·Q^T and
 * dP^T = V·dO^T (both operands from shared memory), P^T = exp2(S^T sc2 - lse2) with the query's
 * ranges applied per key (a key in both ranges counts twice, as the reference does) unless the
 * warp's keys lie wholly inside one range of every query; dV += P^T·dO is issued as soon as P^T
 * is packed, and dS^T = P^T (dP^T - Dsum) is computed under it before dK += dS^T·Q. The prompt's
 * dK/dV is the fp32 sum over all N responses and all H/K heads, added once to the bf16 dk/dv
 * (deterministic). */
template <int D>
__global__ void __launch_bounds__(384, 1)
    wg_dkdv_ws_kernel(bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v, const float *lse,
                      const float *dsum, const int *qlo, const int *qhi, const int *parts, const int *slot0, float *pbuf,
                      attn_ranges r, int T, int S, int H, int K, float sc2, float scale) {
    static_assert(D == 128 && FA_Q == 64 && WG_KB == FA_BK, "wgmma dkdv: head dim 128, 64-query tiles, FA_BK keys");
    constexpr int BK = WG_KB, QT = FA_Q, NT = QT / 8, TK = BK * D * 2, TQ = QT * D * 2, NS = WG_DKDV_NS;
    extern __shared__ unsigned char wg_dyn[];
    unsigned char *k_s = (unsigned char *)(((size_t)wg_dyn + 1023) & ~(size_t)1023), *v_s = k_s + TK;
    unsigned char *q_s = v_s + TK, *do_s = q_s + NS * TQ;
    __shared__ fa_qrows qr[NS];
    /* kv_full, full[NS] (128 copy arrivals + 128 after the row scalars), empty[NS] (consumers) */
    __shared__ __align__(8) unsigned long long bar[1 + 2 * NS];
    unsigned long long *kv_full = bar, *full = bar + 1, *empty = bar + 1 + NS;
    int lin = blockIdx.x + blockIdx.y * gridDim.x;
    int kt = lin / K, g = lin % K, j0 = kt * BK, rep = H / K;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int t_lo = qlo[kt], t_hi = qhi[kt], ntile = (t_hi - t_lo + QT - 1) / QT, npair = ntile * rep;
    int np = parts[kt], part = blockIdx.z; /* this block's pairs: [i0, i1) of the np parts */
    if (part >= np) return;
    int i0 = (int)((long long)npair * part / np), i1 = (int)((long long)npair * (part + 1) / np);
    if (threadIdx.x == 0) {
        mb_init(kv_full, 128);
        for (int i = 0; i < NS; i++) {
            mb_init(full + i, 256);
            mb_init(empty + i, 256);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (w < 4) { /* producer: K and V once, then each pair's Q, dO and row scalars */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        wg_load_rows<D, BK, 128>(k_s, k, j0, S, K, g);
        wg_load_rows<D, BK, 128>(v_s, v, j0, S, K, g);
        mb_arrive_cp(kv_full);
        for (int i = i0; i < i1; i++) {
            int st = (i - i0) % NS, tb = t_lo + (i / rep) * QT, h = g * rep + i % rep;
            mb_wait(empty + st, (((i - i0) / NS) & 1) ^ 1);
            wg_load_rows<D, QT, 128>(q_s + st * TQ, q, tb, t_hi, H, h);
            wg_load_rows<D, QT, 128>(do_s + st * TQ, dout, tb, t_hi, H, h);
            mb_arrive_cp(full + st);
            if (threadIdx.x < QT) {
                int t = tb + threadIdx.x, a0 = 0, a1 = 0, b0 = 0, b1 = 0;
                float l2 = INFINITY, ds = 0;
                if (t < t_hi) {
                    a0 = r.a0[t];
                    a1 = r.a1[t];
                    b0 = r.b0[t];
                    b1 = r.b1[t];
                    float L = lse[(size_t)t * H + h];
                    l2 = L == -INFINITY ? INFINITY : L * LOG2E; /* a query with no keys: P = 0 */
                    ds = dsum[(size_t)t * H + h];
                }
                fa_qrows &x = qr[st];
                x.l2[threadIdx.x] = l2;
                x.ds[threadIdx.x] = ds;
                x.rg[threadIdx.x][0] = a0;
                x.rg[threadIdx.x][1] = a1;
                x.rg[threadIdx.x][2] = b0;
                x.rg[threadIdx.x][3] = b1;
            }
            mb_arrive(full + st);
        }
        fa_wait<0>();
        return;
    }
    /* the block holds 168 x 384 registers: 128 x 24 + 256 x 240 fits exactly (asking for more
     * than the producer gave back would wait forever) */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    int cw = w - 4, c2 = 2 * (lane & 3), kw0 = j0 + cw * 16;
    float dka[1][D / 8][4], dva[1][D / 8][4];
    fa_zero(dka);
    fa_zero(dva);
    const unsigned long long dkd = wg_desc_k(k_s + (cw >> 2) * 64 * 128), dvd = wg_desc_k(v_s + (cw >> 2) * 64 * 128);
    const unsigned long long dqk = wg_desc_k(q_s), ddk = wg_desc_k(do_s), dqm = wg_desc_mn<QT>(q_s), ddm = wg_desc_mn<QT>(do_s);
    mb_acquire(kv_full, 0);
    for (int i = i0; i < i1; i++) {
        int st = (i - i0) % NS;
        mb_acquire(full + st, ((i - i0) / NS) & 1);
        const fa_qrows &x = qr[st];
        const unsigned so = st * (TQ >> 4);
        float sa[NT][4], dp[NT][4];
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) wg_mma_ss64(sa, dkd + wg_step_k<BK>(kk), dqk + so + wg_step_k<QT>(kk), kk);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) wg_mma_ss64(dp, dvd + wg_step_k<BK>(kk), ddk + so + wg_step_k<QT>(kk), kk);
        wg_commit();
        /* the warp's 16 keys inside one range of every query (and not in the other): no mask */
        int cover = 1;
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int qc = lane + 32 * u, a0 = x.rg[qc][0], a1 = x.rg[qc][1], b0 = x.rg[qc][2], b1 = x.rg[qc][3];
            int ia = max(a0, kw0) < min(a1, kw0 + 16), ib = max(b0, kw0) < min(b1, kw0 + 16);
            int ca = a0 <= kw0 && kw0 + 16 <= a1, cb = b0 <= kw0 && kw0 + 16 <= b1;
            cover &= (ca && !ib) || (cb && !ia);
        }
        int full = __all_sync(FULL, cover);
        wg_wait<0>();
        wg_keep(sa);
        wg_keep(dp);
#pragma unroll
        for (int n = 0; n < NT; n++) {
            int qc = n * 8 + c2;
            float2 l2 = *(const float2 *)&x.l2[qc];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float P = fa_ex2(fmaf(sa[n][e], sc2, -(e & 1 ? l2.y : l2.x)));
                if (!full) {
                    int j = kw0 + (lane >> 2) + (e >> 1) * 8, c = qc + (e & 1);
                    P *= (float)((j >= x.rg[c][0] && j < x.rg[c][1]) + (j >= x.rg[c][2] && j < x.rg[c][3]));
                }
                sa[n][e] = P;
            }
        }
        unsigned pp[NT / 2][4], dsp[NT / 2][4];
        wg_pack<NT>(pp, sa);
        wg_fence();
#pragma unroll
        for (int kb = 0; kb < NT / 2; kb++) wg_mma_rs128(dva[0], pp[kb], ddm + so + wg_step_mn(kb), 1);
        wg_commit();
#pragma unroll
        for (int n = 0; n < NT; n++) {
            float2 ds = *(const float2 *)&x.ds[n * 8 + c2];
#pragma unroll
            for (int e = 0; e < 4; e++) dp[n][e] = sa[n][e] * (dp[n][e] - (e & 1 ? ds.y : ds.x));
        }
        wg_pack<NT>(dsp, dp);
        wg_fence();
#pragma unroll
        for (int kb = 0; kb < NT / 2; kb++) wg_mma_rs128(dka[0], dsp[kb], dqm + so + wg_step_mn(kb), 1);
        wg_commit();
        wg_wait<0>();
        wg_keep(dva[0]);
        wg_keep(dka[0]);
        mb_arrive(empty + st);
    }
    if (np > 1) { /* a part: the raw fp32 sums, [dk | dv][BK keys][D], for wg_dkdv_sum_kernel */
        float *pk = pbuf + (size_t)(slot0[kt] + g * np + part) * 2 * BK * D, *pv = pk + BK * D;
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            int jl = cw * 16 + (lane >> 2) + hf * 8;
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                *(float2 *)(pk + jl * D + n * 8 + c2) = make_float2(dka[0][n][2 * hf], dka[0][n][2 * hf + 1]);
                *(float2 *)(pv + jl * D + n * 8 + c2) = make_float2(dva[0][n][2 * hf], dva[0][n][2 * hf + 1]);
            }
        }
        return;
    }
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        int j = kw0 + (lane >> 2) + hf * 8;
        if (j >= S) continue;
        bf16 *dkr = dk + ((size_t)j * K + g) * D, *dvr = dv + ((size_t)j * K + g) * D;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            bf162 *pk = (bf162 *)(dkr + n * 8 + c2), *pv = (bf162 *)(dvr + n * 8 + c2);
            float2 a = __bfloat1622float2(*pk), bb = __bfloat1622float2(*pv);
            *pk = __floats2bfloat162_rn(a.x + dka[0][n][2 * hf] * scale, a.y + dka[0][n][2 * hf + 1] * scale);
            *pv = __floats2bfloat162_rn(bb.x + dva[0][n][2 * hf], bb.y + dva[0][n][2 * hf + 1]);
        }
    }
}


/* dq, D = 128, warp-specialised: warpgroup 0 loads Q and dO once, then streams 64-key tiles
 * (K_i and V_i together) into a WG_DQ_NS-stage ring (full / empty mbarriers); warpgroups 1 and 2
 * (64 query rows each) first write Dsum = rowsum(dO ∘ O) for their rows (for dkdv), then per tile
 * i issue S_i = Q·K_i^T and dP_i = dO·V_i^T together with dQ += dS_{i-1}·K_{i-1}, and compute
 * dS_i = P_i (dP_i - Dsum) while that product runs; a stage is released once its K has fed dQ.
 * No atomics: deterministic. setmaxnreg 56 / 224, as the forward. */
template <int D>
__global__ void __launch_bounds__(384, 1)
    wg_dq_ws_kernel(bf16 *dq, float *dsum, const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *out,
                    const float *lse, attn_ranges r, int T, int H, int K, float sc2, float scale) {
    static_assert(D == 128, "wgmma dq: head dim 128");
    constexpr int BM = WG_BM, BN = WG_DQ_BN, NT = BN / 8, TQ = BM * D * 2, TK = BN * D * 2, NS = WG_DQ_NS;
    extern __shared__ unsigned char wg_dyn[];
    unsigned char *q_s = (unsigned char *)(((size_t)wg_dyn + 1023) & ~(size_t)1023), *do_s = q_s + TQ;
    unsigned char *k_s = do_s + TQ, *v_s = k_s + NS * TK;
    __shared__ fa_sched<BM> sc;
    __shared__ float ds_s[BM];
    /* qd_full, full[NS] (producer copies of K and V), empty[NS] (consumers) */
    __shared__ __align__(8) unsigned long long bar[1 + 2 * NS];
    unsigned long long *qd_full = bar, *full = bar + 1, *empty = bar + 1 + NS;
    FA_QBLOCK();
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (threadIdx.x == 0) {
        mb_init(qd_full, 128);
        for (int i = 0; i < NS; i++) {
            mb_init(full + i, 256);
            mb_init(empty + i, 256);
        } /* full: K and V copies */
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    fa_sched_load(sc, r, t0, T); /* ends with a block barrier: the mbarriers are ready too */
    if (w < 4) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n");
        wg_load_rows<D, BM, 128>(q_s, q, t0, T, H, h);
        wg_load_rows<D, BM, 128>(do_s, dout, t0, T, H, h);
        mb_arrive_cp(qd_full);
        wg_produce_kv<D, BM, BN, NS>(sc, k_s, v_s, k, v, K, g, full, empty, full, empty);
        return;
    }
    /* the block holds 168 x 384 registers: 128 x 56 + 256 x 224 fits exactly */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n");
    int cw = w - 4, row0 = cw * 16, wrow = (cw >> 2) * 64;
    fa_dsum_rows<D, 16>(ds_s, dsum, out, dout, t0, row0, T, H, h);
    __syncwarp();
    float L[2], Ds[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        int rr = row0 + (lane >> 2) + hf * 8, t = t0 + rr;
        float l = t < T ? lse[(size_t)t * H + h] : 0.0f;
        L[hf] = l == -INFINITY ? INFINITY : l * LOG2E; /* a query with no keys: P = 0 */
        Ds[hf] = ds_s[rr];
    }
    float acc[1][D / 8][4], sa[1][NT][4], dp[NT][4];
    unsigned ds[NT / 2][4];
    fa_zero(acc);
    const unsigned long long dqd = wg_desc_k(q_s + wrow * 128), ddo = wg_desc_k(do_s + wrow * 128);
    const unsigned long long dk = wg_desc_k(k_s), dvk = wg_desc_k(v_s), dkmn = wg_desc_mn<BN>(k_s);
    mb_acquire(qd_full, 0);
    auto open_tile = [&](int i) {
        int st = i % NS;
        mb_acquire(full + st, (i / NS) & 1);
        wg_fence();
        const unsigned long long dki = dk + st * (TK >> 4), dvi = dvk + st * (TK >> 4);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) wg_mma_ss64(sa[0], dqd + wg_step_k<BM>(kk), dki + wg_step_k<BN>(kk), kk);
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) wg_mma_ss64(dp, ddo + wg_step_k<BM>(kk), dvi + wg_step_k<BN>(kk), kk);
        wg_commit();
    };
    fa_tile X = wg_tile_first<BM, BN>(sc);
    /* dS_i = P_i (dP_i - Dsum) in sa */
    auto dscore = [&]() {
        wg_mask_tile<NT, BM, BN>(sa, sc, X, row0);
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float P = fa_ex2(fmaf(sa[0][n][e], sc2, -L[e >> 1]));
                sa[0][n][e] = P * (dp[n][e] - Ds[e >> 1]);
            }
    };
    auto dq_mma = [&](int i) {
        wg_fence();
#pragma unroll
        for (int kb = 0; kb < NT / 2; kb++) wg_mma_rs128(acc[0], ds[kb], dkmn + (i % NS) * (TK >> 4) + wg_step_mn(kb), 1);
        wg_commit();
    };
    int i = 0;
    if (X.have) {
        open_tile(0);
        wg_wait<0>();
        wg_keep(sa[0]);
        wg_keep(dp);
        dscore();
        wg_pack<NT>(ds, sa[0]);
        wg_tile_next<BM, BN>(sc, X);
        for (i = 1; X.have; i++) {
            open_tile(i);
            dq_mma(i - 1);
            wg_wait<1>();
            wg_keep(sa[0]);
            wg_keep(dp);
            dscore();
            wg_wait<0>();
            wg_keep(acc[0]);
            mb_arrive(empty + (i - 1) % NS);
            wg_pack<NT>(ds, sa[0]);
            wg_tile_next<BM, BN>(sc, X);
        }
        dq_mma(i - 1);
        wg_wait<0>();
        wg_keep(acc[0]);
    }
    asm volatile("bar.sync 1, 256;\n" ::: "memory"); /* both consumers are done with k_s: it stages the rows */
    float sc_[1][2] = {{scale, scale}};
    fa_store_rows<D, 1>(dq, (bf16 *)k_s, acc, sc_, t0, row0, T, H, h);
}

/* ---------------------------------------------------------------- launchers (D = 128) */

void attn_wgmma_fwd_cuda(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, attn_ranges r, int T,
                         int H, int K, float sc2) {
    static unsigned raised;
    auto kern = wg_fwd_ws_kernel<128>;
    size_t sm = 1024 + (size_t)(WG_BM + 4 * WG_BN) * 128 * sizeof(bf16);
    cu_raise_smem(c, kern, sm, &raised);
    kern<<<dim3((T + WG_BM - 1) / WG_BM, H), 384, sm, c->stream>>>(out, lse, q, k, v, r, T, H, K, sc2);
    CU_LAUNCHED(c, "wg_fwd_ws_kernel");
}

/* The dk/dv split (attention.cuh): a key block (one of nkt tiles x K heads) whose (query tile,
 * head) pairs number more than w* = (all blocks' pairs) / (2 n_sm) runs as
 * min(ATTN_DKDV_SPLIT, ceil(pairs / w*)) parts, so that a few long blocks (a prompt's keys, seen
 * by every response's queries) no longer set the pass's time. Fewer than 2 n_sm / K tiles can
 * exceed w*, so the parts' slots fit in 2 n_sm ATTN_DKDV_SPLIT buffers. One block; slot0[kt]:
 * the tile's first slot (K np of them). */
__global__ void wg_dkdv_parts_kernel(int *parts, int *slot0, const int *qlo, const int *qhi, int nkt, int K, int rep, int n_sm) {
    __shared__ long long tot;
    if (threadIdx.x == 0) tot = 0;
    __syncthreads();
    long long mine = 0;
    for (int kt = threadIdx.x; kt < nkt; kt += blockDim.x) mine += (long long)((qhi[kt] - qlo[kt] + FA_Q - 1) / FA_Q) * rep;
    atomicAdd((unsigned long long *)&tot, (unsigned long long)mine);
    __syncthreads();
    long long w = tot * K / (2 * n_sm) + 1; /* a block's pairs at two blocks an SM */
    for (int kt = threadIdx.x; kt < nkt; kt += blockDim.x) {
        long long np = ((long long)((qhi[kt] - qlo[kt] + FA_Q - 1) / FA_Q) * rep + w - 1) / w;
        parts[kt] = np < 1 ? 1 : np > ATTN_DKDV_SPLIT ? ATTN_DKDV_SPLIT : (int)np;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int kt = 0, s = 0; kt < nkt; kt++) {
            slot0[kt] = s;
            if (parts[kt] > 1) s += parts[kt] * K; /* slot0 + g np + part, g < K */
        }
}

/* dk, dv (+)= the parts' sums in part order (dk scaled), for the split key blocks */
__global__ void wg_dkdv_sum_kernel(bf16 *dk, bf16 *dv, const int *parts, const int *slot0, const float *pbuf, int S, int K,
                                   float scale) {
    constexpr int BK = WG_KB, D = 128;
    int kt = blockIdx.x, g = blockIdx.y, np = parts[kt];
    if (np <= 1) return;
    const float *p0 = pbuf + (size_t)(slot0[kt] + g * np) * 2 * BK * D;
    for (int e = threadIdx.x; e < BK * D; e += blockDim.x) {
        int j = kt * BK + e / D, d = e % D;
        if (j >= S) break;
        float a = 0, b = 0;
        for (int p = 0; p < np; p++) {
            a += p0[(size_t)p * 2 * BK * D + e];
            b += p0[(size_t)p * 2 * BK * D + BK * D + e];
        }
        size_t o = ((size_t)j * K + g) * D + d;
        dk[o] = __float2bfloat16(__bfloat162float(dk[o]) + a * scale);
        dv[o] = __float2bfloat16(__bfloat162float(dv[o]) + b);
    }
}

size_t attn_wgmma_bwd_bytes(cu_ctx *c, int S) {
    int nkt = (S + WG_KB - 1) / WG_KB;
    return ((2 * (size_t)nkt * sizeof(int) + 255) & ~(size_t)255) +
        (size_t)2 * c->n_sm * ATTN_DKDV_SPLIT * 2 * WG_KB * 128 * sizeof(float);
}

void attn_wgmma_bwd_cuda(cu_ctx *c, bf16 *dq, bf16 *dk, bf16 *dv, float *dsum, int *qlo, int *qhi, void *xs, const bf16 *dout,
                         const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *out, const float *lse, attn_ranges r, int T,
                         int S, int H, int K, float sc2, float scale) {
    static unsigned raised_dq, raised_dkdv;
    auto dqk = wg_dq_ws_kernel<128>;
    size_t sm = 1024 + (size_t)(2 * WG_BM + 2 * WG_DQ_NS * WG_DQ_BN) * 128 * sizeof(bf16);
    cu_raise_smem(c, dqk, sm, &raised_dq);
    dqk<<<dim3((T + WG_BM - 1) / WG_BM, H), 384, sm, c->stream>>>(dq, dsum, dout, q, k, v, out, lse, r, T, H, K, sc2, scale);
    CU_LAUNCHED(c, "wg_dq_ws_kernel");
    attn_tile_bounds_cuda(c, qlo, qhi, r, T, S, FA_BK);
    int nkt = (S + FA_BK - 1) / FA_BK, *parts = (int *)xs, *slot0 = parts + nkt;
    float *pbuf = (float *)((char *)xs + ((2 * (size_t)nkt * sizeof(int) + 255) & ~(size_t)255));
    wg_dkdv_parts_kernel<<<1, 1024, 0, c->stream>>>(parts, slot0, qlo, qhi, nkt, K, H / K, c->n_sm);
    CU_LAUNCHED(c, "wg_dkdv_parts_kernel");
    auto dkv = wg_dkdv_ws_kernel<128>;
    size_t smk = 1024 + (size_t)(2 * WG_KB + 2 * WG_DKDV_NS * FA_Q) * 128 * sizeof(bf16);
    cu_raise_smem(c, dkv, smk, &raised_dkdv);
    dkv<<<dim3(nkt, K, ATTN_DKDV_SPLIT), 384, smk, c->stream>>>(dk, dv, dout, q, k, v, lse, dsum, qlo, qhi, parts, slot0, pbuf, r,
                                                                T, S, H, K, sc2, scale);
    CU_LAUNCHED(c, "wg_dkdv_ws_kernel");
    wg_dkdv_sum_kernel<<<dim3(nkt, K), 256, 0, c->stream>>>(dk, dv, parts, slot0, pbuf, S, K, scale);
    CU_LAUNCHED(c, "wg_dkdv_sum_kernel");
}
