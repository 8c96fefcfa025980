/* matmul_exact_few.cu — exact mode's GEMM for decode's rows past the few-row kernel's
 * (tune.exact, T = 17 .. XF_MAX_T): out_i (T,O_i) = x (T,I) W_i^T + bias_i (+ res_i) for up to
 * XF_PARTS weights sharing x, in the reduction order of matmul_order.cuh, so a row has the bits
 * the few-row kernel gives it alone and the training forward gives it among thousands.
 *
 * Each weight is read once, over all the SMs, whatever T: the K split of the order (SK_WARPS
 * segments of SK_KC-wide chunks, fixed by I alone) becomes a split over blocks. A cluster of
 * SK_WARPS blocks takes one tile of BN outputs and all T rows; block s of it (its cluster rank)
 * walks segment s's chunks through an XF_ST-stage cp.async ring (x and W, swizzled as
 * ex_piece), its 8 warps as 2 (rows) x 4 (outputs), a warp MT / 2 m16 tiles x NTW n8 tiles,
 * into a partial from 0 — the same m16n8k16 steps in the same order as the few-row kernel's warp
 * s. Then each block leaves its partial in its shared memory, and after a cluster barrier block
 * s sums a slice of the tile's outputs over the SK_WARPS partials in segment order from 0.0f
 * (distributed shared memory), + bias, + residual, one rounding: the few-row kernel's epilogue.
 * No partial goes through global memory. x is read once a tile (from L2). */
#include <cooperative_groups.h>

#include "kernels/matmul.cuh"
#include "kernels/matmul_order.cuh"

enum { XF_ST = 3, XF_NTH = 32 * SK_WARPS, XF_MAX_T = 256 };

typedef struct {
    bf16 *out[XF_PARTS];
    const bf16 *w[XF_PARTS], *bias[XF_PARTS], *res[XF_PARTS];
    int O[XF_PARTS], b0[XF_PARTS + 1]; /* part i's tiles: [b0[i], b0[i + 1]) */
} xf_args;

template <int MT, int NTW> struct xf_shape {
    static constexpr int BM = 16 * MT, BN = 4 * 8 * NTW, WMT = MT / 2; /* WMT m16 tiles a warp */
    static constexpr size_t STAGE = (size_t)(BM + BN) * SK_KC * 2; /* bytes */
    static constexpr size_t RED = (size_t)BM * BN * 4; /* the block's partial, over the ring */
    static constexpr size_t SMEM = STAGE * XF_ST > RED ? STAGE *XF_ST : RED;
};

template <int MT, int NTW>
__global__ void __launch_bounds__(XF_NTH, 2) exact_few_kernel(const xf_args a, const bf16 *x, int T, int I) {
    constexpr int BM = xf_shape<MT, NTW>::BM, BN = xf_shape<MT, NTW>::BN, WMT = xf_shape<MT, NTW>::WMT;
    constexpr int PA = BM * SK_KC / 8, PB = BN * SK_KC / 8; /* 16-byte pieces a stage */
    extern __shared__ uint4 xf_ring[]; /* [XF_ST][PA + PB]; at the end the partial [BM][BN] floats */
    const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5, g = lane >> 2, q = lane & 3, wm = wp >> 2, wn = wp & 3;
    const int s = (int)blockIdx.x % SK_WARPS, tile = (int)blockIdx.x / SK_WARPS;
    const int pi = (tile >= a.b0[1]) + (tile >= a.b0[2]), o0 = (tile - a.b0[pi]) * BN, O = a.O[pi];
    const bf16 *const w = a.w[pi];
    const int nch = I / SK_KC, c0 = sk_seg0(s, nch), n = sk_seg0(s + 1, nch) - c0;
    auto issue_w = [&](int j) {
        uint4 *st = xf_ring + (size_t)(j % XF_ST) * (PA + PB) + PA;
        const int k = (c0 + j) * SK_KC;
#pragma unroll
        for (int i = tid; i < PB; i += XF_NTH) {
            const int r = i >> 3, p = i & 7, o = o0 + r;
            sk_cp16(st + ex_piece(r, p), w + (size_t)(o < O ? o : 0) * I + k + p * 8, o < O ? 16 : 0);
        }
    };
    auto issue_x = [&](int j) {
        uint4 *st = xf_ring + (size_t)(j % XF_ST) * (PA + PB);
        const int k = (c0 + j) * SK_KC;
#pragma unroll
        for (int i = tid; i < PA; i += XF_NTH) {
            const int r = i >> 3, p = i & 7;
            sk_cp16(st + ex_piece(r, p), x + (size_t)(r < T ? r : 0) * I + k + p * 8, r < T ? 16 : 0);
        }
    };
    /* the weights of the first stages go out before the wait for the kernel before (x is its
     * output; W is written by nothing in flight) */
#pragma unroll
    for (int j = 0; j < XF_ST - 1; j++)
        if (j < n) issue_w(j);
    pdl_wait();
    pdl_trigger();
#pragma unroll
    for (int j = 0; j < XF_ST - 1; j++) {
        if (j < n) issue_x(j);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    float acc[WMT][NTW][4];
#pragma unroll
    for (int m = 0; m < WMT; m++)
#pragma unroll
        for (int nt = 0; nt < NTW; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[m][nt][e] = 0.0f;
    for (int j = 0; j < n; j++) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(XF_ST - 2));
        __syncthreads(); /* chunk j landed for all; the stage of chunk j - 1 is free */
        if (j + XF_ST - 1 < n) {
            issue_w(j + XF_ST - 1);
            issue_x(j + XF_ST - 1);
        }
        asm volatile("cp.async.commit_group;\n" ::);
        const uint4 *sa = xf_ring + (size_t)(j % XF_ST) * (PA + PB), *sb = sa + PA;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint4 wv[NTW];
#pragma unroll
            for (int nt = 0; nt < NTW; nt++) wv[nt] = sb[ex_piece((wn * NTW + nt) * 8 + g, 4 * h + q)];
#pragma unroll
            for (int m = 0; m < WMT; m++) {
                const int rw = (wm * WMT + m) * 16 + g;
                const uint4 lo = sa[ex_piece(rw, 4 * h + q)], hi = sa[ex_piece(rw + 8, 4 * h + q)];
#pragma unroll
                for (int nt = 0; nt < NTW; nt++) sk_mma8(acc[m][nt], lo, hi, wv[nt]);
            }
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads(); /* the ring is free: the partial goes over it */
    float *const red = (float *)xf_ring;
#pragma unroll
    for (int m = 0; m < WMT; m++)
#pragma unroll
        for (int nt = 0; nt < NTW; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++)
                *(float2 *)(red + (size_t)((wm * WMT + m) * 16 + g + 8 * hf) * BN + (wn * NTW + nt) * 8 +
                            2 * q) = make_float2(acc[m][nt][2 * hf], acc[m][nt][2 * hf + 1]);
    namespace cg = cooperative_groups;
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    /* block s: elements [s E8, (s + 1) E8) of the tile, four outputs a thread at a time */
    constexpr int E8 = BM * BN / SK_WARPS;
    const bf16 *const bias = a.bias[pi], *const res = a.res[pi];
    bf16 *const out = a.out[pi];
    for (int i = 4 * tid; i < E8; i += 4 * XF_NTH) {
        const int e = s * E8 + i, t = e / BN, oc = o0 + e % BN;
        if (t >= T || oc >= O) continue;
        float4 sm = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int r = 0; r < SK_WARPS; r++) {
            const float4 v = *(const float4 *)(cl.map_shared_rank(red, r) + e);
            sm.x += v.x;
            sm.y += v.y;
            sm.z += v.z;
            sm.w += v.w;
        }
        const float sv[4] = {sm.x, sm.y, sm.z, sm.w};
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int o = oc + u;
            if (o >= O) break;
            float v = sv[u];
            if (bias) v += __bfloat162float(bias[o]);
            if (res) v += __bfloat162float(res[(size_t)t * O + o]);
            out[(size_t)t * O + o] = __float2bfloat16(v);
        }
    }
    cl.sync(); /* every block's partial stays alive until the cluster has read it */
}

template <int MT, int NTW> static void exact_few_launch(cu_ctx *c, xf_args a, int n, const bf16 *x, int T, int I) {
    constexpr int BN = xf_shape<MT, NTW>::BN;
    static unsigned done;
    cu_raise_smem(c, exact_few_kernel<MT, NTW>, xf_shape<MT, NTW>::SMEM, &done);
    if (c->failed) return;
    a.b0[0] = 0;
    for (int i = 0; i < XF_PARTS; i++) a.b0[i + 1] = a.b0[i] + (i < n ? (a.O[i] + BN - 1) / BN : 0);
    cu_launch_ex(c, "exact_few_kernel", exact_few_kernel<MT, NTW>, dim3(SK_WARPS * a.b0[XF_PARTS]), dim3(XF_NTH),
                 xf_shape<MT, NTW>::SMEM, SK_WARPS, a, x, T, I);
}

/* MT m16 tiles for T rows; NTW (outputs a tile: 32 NTW) the widest whose clusters still give
 * the SMs one and a half blocks each (fewer, wider tiles read x fewer times and load fewer
 * fragments a product), at most 16 m16 x n8 tiles a warp */
int exact_few_cuda(cu_ctx *c, int n, bf16 *const *out, const bf16 *const *w, const bf16 *const *bias, const bf16 *const *res,
                   const int *O, const bf16 *x, int T, int I) {
    if (T > XF_MAX_T || n > XF_PARTS || I % SK_KC) return 0;
    if (c->failed || T <= 0) return 1;
    xf_args a = {};
    for (int i = 0; i < n; i++) {
        a.out[i] = out[i];
        a.w[i] = w[i];
        a.bias[i] = bias ? bias[i] : NULL;
        a.res[i] = res ? res[i] : NULL;
        a.O[i] = O[i];
    }
    const int MT = T <= 32 ? 2 : T <= 64 ? 4 : T <= 128 ? 8 : 16;
    int ntw = 1;
    for (int cand = 4; cand > 1; cand /= 2) {
        long long tiles = 0;
        for (int i = 0; i < n; i++) tiles += (O[i] + 32 * cand - 1) / (32 * cand);
        if (MT / 2 * cand <= 16 && 2LL * SK_WARPS * tiles >= 3LL * c->n_sm) {
            ntw = cand;
            break;
        }
    }
#define XF_L(M, N) exact_few_launch<M, N>(c, a, n, x, T, I)
    if (MT == 2) {
        if (ntw == 4) XF_L(2, 4);
        else if (ntw == 2) XF_L(2, 2);
        else XF_L(2, 1);
    } else if (MT == 4) {
        if (ntw == 4) XF_L(4, 4);
        else if (ntw == 2) XF_L(4, 2);
        else XF_L(4, 1);
    } else if (MT == 8) {
        if (ntw == 4) XF_L(8, 4);
        else if (ntw == 2) XF_L(8, 2);
        else XF_L(8, 1);
    } else {
        if (ntw == 2) XF_L(16, 2);
        else XF_L(16, 1);
    }
#undef XF_L
    return 1;
}
