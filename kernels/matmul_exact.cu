/* matmul_exact.cu — exact mode's GEMM for many rows (tune.exact): y (T,O) = x (T,I) W^T
 * + b (+ res), each output with the few-row kernel's reduction order (matmul_order.cuh), so a row
 * of a 4096-row training forward has the bits the same row gets in a 16-row decode step. Two
 * tiles of that order: a narrow one (32 rows x 128 outputs) while the wide one would not fill half
 * the SMs, and the wide one (128 x 256, below) for training and prefill.
 *
 * The narrow tile: EX_BM = 32 WM rows x EX_BN = 128 outputs, 8 warps as 2 x 4, a warp 16 WM rows
 * x 32 outputs (WM m16 tiles, 4 n8 tiles). K streams in SK_KC-wide chunks through an EX_ST-stage
 * cp.async ring (one barrier a chunk); a warp keeps two sets of accumulators: the segment's
 * partial, from 0 at each segment's start, and the sum of the segments closed so far, to which
 * the partial is added when its segment ends — the few-row kernel's sum over its warps, in the
 * same order. Shared memory rows are 64 bf16 (eight 16-byte pieces, piece p of row r at
 * p ^ 4 (r & 1)), so a quarter warp's 16-byte fragment loads (rows g, g + 1; pieces q) fall in
 * distinct banks. */
#include "kernels/matmul.cuh"
#include "kernels/matmul_order.cuh"

enum { EX_BN = 128, EX_ST = 4, EX_NTH = 256 };

template <int WM> struct ex_shape {
    static constexpr int BM = 32 * WM;
    static constexpr size_t STAGE = (size_t)(BM + EX_BN) * SK_KC * 2; /* bytes */
    static constexpr size_t SMEM = STAGE * EX_ST;
};

template <int WM>
__global__ void __launch_bounds__(EX_NTH, 1)
    exact_mm_kernel(bf16 *out, const bf16 *x, const bf16 *w, const bf16 *bias, const bf16 *res, int T, int I, int O) {
    constexpr int BM = ex_shape<WM>::BM, PA = BM * SK_KC / 8, PB = EX_BN * SK_KC / 8; /* 16-byte pieces a stage */
    extern __shared__ uint4 ex_ring[]; /* [EX_ST][PA + PB] */
    const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5, g = lane >> 2, q = lane & 3;
    const int wm = wp >> 2, wn = wp & 3, t0 = blockIdx.y * BM, o0 = blockIdx.x * EX_BN;
    const int nch = I / SK_KC;
    pdl_wait();
    pdl_trigger();
    auto issue = [&](int c) {
        uint4 *st = ex_ring + (size_t)(c % EX_ST) * (PA + PB);
        const int k = c * SK_KC;
        for (int i = tid; i < PA; i += EX_NTH) {
            const int r = i >> 3, p = i & 7, t = t0 + r;
            sk_cp16(st + ex_piece(r, p), x + (size_t)(t < T ? t : 0) * I + k + p * 8, t < T ? 16 : 0);
        }
        for (int i = tid; i < PB; i += EX_NTH) {
            const int r = i >> 3, p = i & 7, o = o0 + r;
            sk_cp16(st + PA + ex_piece(r, p), w + (size_t)(o < O ? o : 0) * I + k + p * 8, o < O ? 16 : 0);
        }
    };
#pragma unroll
    for (int c = 0; c < EX_ST - 1; c++) {
        if (c < nch) issue(c);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    float acc[WM][4][4], sum[WM][4][4];
    float *const af = &acc[0][0][0], *const sf = &sum[0][0][0]; /* flat: 16 WM values each */
#pragma unroll
    for (int i = 0; i < WM * 16; i++) af[i] = sf[i] = 0.0f;
    int seg = 0; /* the segments [0, seg) are closed (summed into sum) */
    /* close every segment that ends at chunk c (empty ones add 0) */
    auto close_to = [&](int c) {
        while (seg < SK_WARPS && sk_seg0(seg + 1, nch) <= c) {
#pragma unroll
            for (int i = 0; i < WM * 16; i++) {
                sf[i] += af[i];
                af[i] = 0.0f;
            }
            seg++;
        }
    };
    close_to(0); /* I < SK_KC SK_WARPS: leading empty segments */
    for (int c = 0; c < nch; c++) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(EX_ST - 2));
        __syncthreads(); /* chunk c landed for all; the stage of chunk c - 1 is free */
        if (c + EX_ST - 1 < nch) issue(c + EX_ST - 1);
        asm volatile("cp.async.commit_group;\n" ::);
        const uint4 *sa = ex_ring + (size_t)(c % EX_ST) * (PA + PB), *sb = sa + PA;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint4 lo[WM], hi[WM], wv[4];
#pragma unroll
            for (int m = 0; m < WM; m++) {
                const int r = wm * 16 * WM + m * 16 + g;
                lo[m] = sa[ex_piece(r, 4 * h + q)];
                hi[m] = sa[ex_piece(r + 8, 4 * h + q)];
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++) wv[nt] = sb[ex_piece(wn * 32 + nt * 8 + g, 4 * h + q)];
#pragma unroll
            for (int m = 0; m < WM; m++)
#pragma unroll
                for (int nt = 0; nt < 4; nt++) sk_mma8(acc[m][nt], lo[m], hi[m], wv[nt]);
        }
        close_to(c + 1);
    }
    close_to(nch); /* I < SK_KC SK_WARPS: trailing empty segments */
    asm volatile("cp.async.wait_group 0;\n" ::);
#pragma unroll
    for (int m = 0; m < WM; m++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int t = t0 + wm * 16 * WM + m * 16 + g + 8 * (e >> 1), o = o0 + wn * 32 + nt * 8 + 2 * q + (e & 1);
                if (t >= T || o >= O) continue;
                float s = sum[m][nt][e];
                if (bias) s += __bfloat162float(bias[o]);
                if (res) s += __bfloat162float(res[(size_t)t * O + o]);
                out[(size_t)t * O + o] = __float2bfloat16(s);
            }
}

template <int WM>
static void exact_mm_launch(cu_ctx *c, bf16 *out, const bf16 *x, const bf16 *w, const bf16 *bias, const bf16 *res, int T, int I,
                            int O) {
    static unsigned done;
    cu_raise_smem(c, exact_mm_kernel<WM>, ex_shape<WM>::SMEM, &done);
    if (c->failed) return;
    const dim3 grid((O + EX_BN - 1) / EX_BN, (T + ex_shape<WM>::BM - 1) / ex_shape<WM>::BM);
    cu_launch_pdl(c, "exact_mm_kernel", exact_mm_kernel<WM>, grid, dim3(EX_NTH), ex_shape<WM>::SMEM, out, x, w, bias, res, T, I, O);
}

/* The wide tile for many rows: a block XB_BM = 128 rows x XB_BN = 256 outputs, 8 warps as 2 x 4,
 * a warp 64 x 64 (4 m16 x 8 n8 tiles: 16 fragment loads feed 64 MMAs a k-half, twice the reuse
 * of the tile above). The ring holds k-halves (32 wide: the h of matmul_order.cuh), rows of four
 * 16-byte pieces, unswizzled (a quarter warp's loads cover two whole 64-byte rows). Only one
 * accumulator set lives in registers: a segment's partial; the sum of the closed segments
 * (segments 0 .. SK_WARPS - 2) is kept in shared memory, a thread's 128 values at stride
 * XB_NTH, and the last segment's partial is added to it in the epilogue: the same additions, in
 * the same order, as the tile above. */
enum { XB_BM = 128, XB_BN = 256, XB_KH = 32, XB_ST = 4, XB_NTH = 256, XB_ACC = 128 };
enum : size_t {
    XB_STAGE = (size_t)(XB_BM + XB_BN) * XB_KH * 2, /* bytes */
    XB_SMEM = XB_STAGE * XB_ST + (size_t)XB_ACC * XB_NTH * 4, /* the ring, then the closed sums */
};

__global__ void __launch_bounds__(XB_NTH, 1)
    exact_mm_wide_kernel(bf16 *out, const bf16 *x, const bf16 *w, const bf16 *bias, const bf16 *res, int T, int I, int O) {
    constexpr int PA = XB_BM * 4, PB = XB_BN * 4; /* 16-byte pieces a stage */
    extern __shared__ uint4 xb_ring[]; /* [XB_ST][PA + PB], then float sums[XB_ACC][XB_NTH] */
    float *const sums = (float *)(xb_ring + (size_t)XB_ST * (PA + PB));
    const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5, g = lane >> 2, q = lane & 3;
    const int wm = wp >> 2, wn = wp & 3, t0 = blockIdx.y * XB_BM, o0 = blockIdx.x * XB_BN;
    const int nch = I / SK_KC, nh = 2 * nch;
    pdl_wait();
    pdl_trigger();
    /* k-half s: k = s XB_KH .. + XB_KH */
    auto issue = [&](int s) {
        uint4 *st = xb_ring + (size_t)(s % XB_ST) * (PA + PB);
        const int k = s * XB_KH;
#pragma unroll
        for (int i = tid; i < PA; i += XB_NTH) {
            const int t = t0 + (i >> 2);
            sk_cp16(st + i, x + (size_t)(t < T ? t : 0) * I + k + (i & 3) * 8, t < T ? 16 : 0);
        }
#pragma unroll
        for (int i = tid; i < PB; i += XB_NTH) {
            const int o = o0 + (i >> 2);
            sk_cp16(st + PA + i, w + (size_t)(o < O ? o : 0) * I + k + (i & 3) * 8, o < O ? 16 : 0);
        }
    };
#pragma unroll
    for (int s = 0; s < XB_ST - 1; s++) {
        if (s < nh) issue(s);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    float acc[4][8][4];
    float *const af = &acc[0][0][0];
#pragma unroll
    for (int i = 0; i < XB_ACC; i++) af[i] = 0.0f;
    int seg = 0; /* segments [0, seg) are closed into sums */
    /* close every segment but the last that ends at chunk c (empty ones add 0) */
    auto close_to = [&](int c) {
        while (seg < SK_WARPS - 1 && sk_seg0(seg + 1, nch) <= c) {
#pragma unroll
            for (int i = 0; i < XB_ACC; i++) {
                float *p = sums + (size_t)i * XB_NTH + tid;
                *p = (seg ? *p : 0.0f) + af[i];
                af[i] = 0.0f;
            }
            seg++;
        }
    };
    close_to(0);
    for (int s = 0; s < nh; s++) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(XB_ST - 2));
        __syncthreads(); /* k-half s landed for all; the stage of s - 1 is free */
        if (s + XB_ST - 1 < nh) issue(s + XB_ST - 1);
        asm volatile("cp.async.commit_group;\n" ::);
        const uint4 *sa = xb_ring + (size_t)(s % XB_ST) * (PA + PB), *sb = sa + PA;
        uint4 lo[4], hi[4];
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const int r = wm * 64 + m * 16 + g;
            lo[m] = sa[r * 4 + q];
            hi[m] = sa[(r + 8) * 4 + q];
        }
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            const uint4 wv = sb[(wn * 64 + nt * 8 + g) * 4 + q];
#pragma unroll
            for (int m = 0; m < 4; m++) sk_mma8(acc[m][nt], lo[m], hi[m], wv);
        }
        if (s & 1) close_to((s >> 1) + 1);
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
#pragma unroll
    for (int m = 0; m < 4; m++)
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int t = t0 + wm * 64 + m * 16 + g + 8 * hf, o = o0 + wn * 64 + nt * 8 + 2 * q;
                if (t >= T || o >= O) continue;
                float v[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int i = (m * 8 + nt) * 4 + 2 * hf + e;
                    float s = sums[(size_t)i * XB_NTH + tid] + af[i]; /* the last segment */
                    if (o + e < O) {
                        if (bias) s += __bfloat162float(bias[o + e]);
                        if (res) s += __bfloat162float(res[(size_t)t * O + o + e]);
                    }
                    v[e] = s;
                }
                bf16 *d = out + (size_t)t * O + o;
                if (!(O & 1) && o + 1 < O) *(__nv_bfloat162 *)d = __floats2bfloat162_rn(v[0], v[1]);
                else {
                    d[0] = __float2bfloat16(v[0]);
                    if (o + 1 < O) d[1] = __float2bfloat16(v[1]);
                }
            }
}

/* The wide tile once its blocks fill half the SMs (a single wave of it beats the narrow tile's
 * two), else the 32-row tile (more blocks for few rows). */
void exact_mm_cuda(cu_ctx *c, bf16 *out, const bf16 *x, const bf16 *w, const bf16 *bias, const bf16 *res, int T, int I, int O) {
    if (c->failed || T <= 0) return;
    const long long wide = (long long)((T + XB_BM - 1) / XB_BM) * ((O + XB_BN - 1) / XB_BN);
    if (2 * wide < c->n_sm) {
        exact_mm_launch<1>(c, out, x, w, bias, res, T, I, O);
        return;
    }
    static unsigned done;
    cu_raise_smem(c, exact_mm_wide_kernel, XB_SMEM, &done);
    if (c->failed) return;
    const dim3 grid((O + XB_BN - 1) / XB_BN, (T + XB_BM - 1) / XB_BM);
    cu_launch_pdl(c, "exact_mm_wide_kernel", exact_mm_wide_kernel, grid, dim3(XB_NTH), XB_SMEM, out, x, w, bias, res, T, I, O);
}
