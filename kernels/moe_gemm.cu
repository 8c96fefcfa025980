/* moe_gemm.cu — the experts' forward and backward (moe.h) for many slots per expert, the
 * training and prefill case: the slots' rows are gathered by expert into contiguous blocks
 * (the permutation of moe.cu, in slot order inside an expert) and each GEMM of the layer is one
 * grouped GEMM, an expert a group: gemm_grouped.cu's wgmma kernel where the shapes fit its
 * rules (contiguous dimensions multiples of 8), else — and with tune.moe = cublas — cuBLAS's.
 * The counts are read on the host (one stream synchronisation per op), which is why decode
 * (captured in graphs) takes moe_few.cu instead.
 * Legend as moe.h (T, C, E, k, Fm); S = T·k slots; a "P" buffer holds rows by expert (row i is
 * slot perm[i]), inv[ts] the row of slot ts.
 *
 *   forward   xP = x[perm/k];  gP|uP = xP Wg|Wu_e^T;  eg, eu = scatter;  aP = silu(gP) uP;
 *             eyP = aP Wd_e^T;  out = res + Σ_s w eyP[inv], ey = scatter
 *   backward  dyP = dout[perm/k], wdyP = bf16(w dyP), aP again;  daP = dyP Wd_e (fp32);
 *             dgP, duP (and dg, du) = SwiGLU' of w daP;  dWd_e += wdyP_e^T aP_e;
 *             partP = dgP Wg_e + duP Wu_e (fp32, one accumulator in house);  dx += Σ_s partP[inv];
 *             xP again;  dWg|dWu_e += dgP|duP_e^T xP_e
 * The roundings are the tiled kernels' (eg, eu, a, ey, dg, du, w·dout in bf16; da, the per-slot
 * dx and the weight gradients in fp32), so the variants differ by the GEMMs' sum order only.
 * Deterministic: both GEMMs give the same bits for the same shapes (no atomics in a GEMM), the
 * scatters and the per-token dx sum have one owner and a fixed order. When the grouped call is
 * refused (a cuBLAS without it for these types), the same problems run one cublasGemmEx each.
 *
 * Scratch: forward S·(2C + 6Fm) bytes, backward S·(4C + 10Fm) bytes, plus the permutation. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>

#include "kernels/bf16_vec.cuh"
#include "kernels/gemm_grouped.cuh"
#include "kernels/matmul.cuh"
#include "kernels/moe.cuh"
#include "kernels/moe_dev.cuh"

/* ---------------------------------------------------------------- gathers and scatters */

/* inv[perm[i]] = i */
__global__ void moe_inv_kernel(int *inv, const int *perm, int S) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < S; i += gridDim.x * blockDim.x) inv[perm[i]] = i;
}

/* dst[i] = src[perm[i] / div] (K values a row), and dstw[i] = bf16(topw[perm[i]] · that) (dstw
 * NULL: none); V (1 or 8, moe_gather's choice) values a thread */
__global__ void moe_gather_kernel(bf16 *dst, bf16 *dstw, const bf16 *src, const int *perm, const float *topw, int S, int K,
                                  int div, int V) {
    int KV = K / V;
    long long n = (long long)S * KV;
    for (long long u = blockIdx.x * (long long)blockDim.x + threadIdx.x; u < n; u += (long long)gridDim.x * blockDim.x) {
        long long i = u / KV, c = (u - i * KV) * V;
        int ts = perm[i];
        const bf16 *s = src + (long long)(ts / div) * K + c;
        bf16 *d = dst + i * K + c;
        if (V == 8) *(uint4 *)d = *(const uint4 *)s;
        else *d = *s;
        if (!dstw) continue;
        float f[8], w = topw[ts];
        if (V == 8) unpack8(*(const uint4 *)s, f);
        else f[0] = __bfloat162float(*s);
        for (int j = 0; j < V; j++) f[j] *= w;
        if (V == 8) *(uint4 *)(dstw + i * K + c) = pack8(f);
        else dstw[i * K + c] = __float2bfloat16(f[0]);
    }
}

/* aP[i] = bf16(silu(g) u) of row i, g and u read at row i (by_slot 0) or at slot perm[i]
 * (by_slot 1); go, uo NULL or the slot's rows to copy g, u to; V values a thread */
template <int V>
__global__ void moe_act_kernel(bf16 *aP, bf16 *go, bf16 *uo, const bf16 *g, const bf16 *u, const int *perm, int by_slot, int S,
                               int F) {
    int FV = F / V;
    GRID_STRIDE(w, (long long)S * FV) {
        long long i = w / FV, f = (w - i * FV) * V, ts = perm[i], r = (by_slot ? ts : i) * F + f;
        typedef typename bf16_pack<V>::t pk;
        pk gq = *(const pk *)(g + r), uq = *(const pk *)(u + r);
        if (go) *(pk *)(go + ts * F + f) = gq;
        if (uo) *(pk *)(uo + ts * F + f) = uq;
        float gv[V], uv[V];
        vload<V>(gv, (const bf16 *)&gq);
        vload<V>(uv, (const bf16 *)&uq);
#pragma unroll
        for (int j = 0; j < V; j++) gv[j] = moe_silu(gv[j]) * uv[j];
        vstore<V>(aP + i * F + f, gv);
    }
}

/* SwiGLU's backward of row i: da = w · daP[i]; dgP, duP[i] and dg, du[perm[i]]; V values a thread */
template <int V>
__global__ void moe_swiglu_bwd_kernel(bf16 *dgP, bf16 *duP, bf16 *dg, bf16 *du, const float *daP, const bf16 *eg, const bf16 *eu,
                                      const int *perm, const float *topw, int S, int F) {
    int FV = F / V;
    GRID_STRIDE(w, (long long)S * FV) {
        long long i = w / FV, f = (w - i * FV) * V, ts = perm[i], o = ts * F + f, v = i * F + f;
        float g[V], u[V], a[V], b[V], tw = topw[ts];
        vload<V>(g, eg + o);
        vload<V>(u, eu + o);
#pragma unroll
        for (int j = 0; j < V; j++) {
            float da = tw * daP[v + j], sg = 1.0f / (1.0f + __expf(-g[j]));
            a[j] = da * u[j] * (sg + g[j] * sg * (1.0f - sg));
            b[j] = da * g[j] * sg;
        }
        vstore<V>(dgP + v, a);
        vstore<V>(duP + v, b);
        vstore<V>(dg + o, a);
        vstore<V>(du + o, b);
    }
}

/* ---------------------------------------------------------------- grouped GEMMs */

/* An operand of expert e at element e·per_e + off_e·per_row of p (one of the two is 0). */
typedef struct {
    const void *p;
    size_t per_e, per_row;
} moe_opnd;

/* Column-major D = op(A) op(B) + beta D for every expert with slots and each of np problems
 * (gate and up share a group); m, n or k < 0: the expert's count. sum: the two problems write
 * one D, D = op(A0) op(B0) + op(A1) op(B1) + beta D. */
typedef struct {
    int ta, tb, m, n, k, lda, ldb, ldd, d_f32, np, sum;
    float beta;
    moe_opnd a[2], b[2], d[2];
} moe_gg;

typedef struct {
    cu_ctx *c;
    const int *hcnt; /* (E) on the host */
    int E;
    void *dptr; /* device room for 3·2·E pointers or 2·E gg_prob (moe_gg_room) */
} moe_gg_ctx;

static const char *moe_gg_ptr(const moe_opnd *o, int e, long long off, int es) {
    return (const char *)o->p + ((size_t)e * o->per_e + (size_t)off * o->per_row) * (size_t)es;
}

static size_t moe_gg_room(int E) {
    size_t a = 6 * (size_t)E * sizeof(void *), b = gemm_grouped_bytes(2 * E);
    return ((a > b ? a : b) + 255) & ~(size_t)255;
}

/* The problems in house (gemm_grouped.cu), unless tune.moe asks for cuBLAS or a problem does not
 * fit its layout rules; 1 when run. Column-major D = op(A) op(B) is row-major D^T = op(B)^T
 * op(A)^T: A' is B (K-major when B is not transposed), B' is A (K-major when A is). */
static int moe_gg_own(const moe_gg_ctx *x, const moe_gg *g) {
    cu_ctx *c = x->c;
    if (c->tune && c->tune->moe == TUNE_MOE_CUBLAS) return 0;
    gg_layout l = {!g->tb, g->ta, g->d_f32};
    gg_prob *p = (gg_prob *)calloc(2 * (size_t)x->E, sizeof *p);
    if (!p) return 0;
    int P = 0, ok = 1;
    long long off = 0;
    for (int e = 0; e < x->E && ok; off += x->hcnt[e], e++) {
        int ce = x->hcnt[e];
        if (ce == 0) continue;
        for (int j = 0; j < g->np && ok; j++) {
            gg_prob *q = &p[P];
            const bf16 *a = (const bf16 *)moe_gg_ptr(&g->b[j], e, off, 2), *b = (const bf16 *)moe_gg_ptr(&g->a[j], e, off, 2);
            if (g->sum && j) { /* the second product of a sum */
                q = &p[P - 1];
                q->a2 = a, q->b2 = b, q->k2 = q->k;
            } else {
                q->a = a, q->b = b;
                q->d = (void *)moe_gg_ptr(&g->d[j], e, off, g->d_f32 ? 4 : 2);
                q->m = g->n < 0 ? ce : g->n;
                q->n = g->m < 0 ? ce : g->m;
                q->k = g->k < 0 ? ce : g->k;
                q->lda = g->ldb, q->ldb = g->lda, q->ldd = g->ldd, q->beta = g->beta;
                P++;
            }
            ok = gemm_grouped_fits(q, l);
        }
    }
    if (ok) gemm_grouped_cuda(c, p, P, l, x->dptr);
    free(p);
    return ok;
}

static void moe_gg_run(const moe_gg_ctx *x, const moe_gg *g) {
    cu_ctx *c = x->c;
    if (moe_gg_own(x, g)) return;
    if (g->sum) { /* cuBLAS: the first product with beta, the second added */
        moe_gg g0 = *g, g1 = *g;
        g0.np = g1.np = 1, g0.sum = g1.sum = 0;
        g1.a[0] = g->a[1], g1.b[0] = g->b[1], g1.d[0] = g->d[1], g1.beta = 1.0f;
        moe_gg_run(x, &g0);
        moe_gg_run(x, &g1);
        return;
    }
    cublasHandle_t h = (cublasHandle_t)gemm_blas(c);
    if (!h) return;
    int E = x->E, np = g->np, G = 0, des = g->d_f32 ? 4 : 2;
    int *iv = (int *)malloc(sizeof(int) * 7 * (size_t)E);
    cublasOperation_t *op = (cublasOperation_t *)malloc(sizeof *op * 2 * (size_t)E);
    float *ab = (float *)malloc(sizeof(float) * 2 * (size_t)E);
    const void **hp = (const void **)malloc(sizeof(void *) * 3 * 2 * (size_t)E);
    if (!iv || !op || !ab || !hp) {
        cu_fail(c, "malloc(moe grouped GEMM)", "out of host memory", __FILE__, __LINE__);
        goto done;
    }
    {
        int *m = iv, *n = iv + E, *kk = iv + 2 * E, *lda = iv + 3 * E, *ldb = iv + 4 * E, *ldd = iv + 5 * E, *gs = iv + 6 * E;
        const void **pa = hp, **pb = hp + 2 * E, **pd = hp + 4 * E;
        long long off = 0;
        for (int e = 0; e < E; off += x->hcnt[e], e++) {
            int ce = x->hcnt[e];
            if (ce == 0) continue;
            m[G] = g->m < 0 ? ce : g->m;
            n[G] = g->n < 0 ? ce : g->n;
            kk[G] = g->k < 0 ? ce : g->k;
            lda[G] = g->lda;
            ldb[G] = g->ldb;
            ldd[G] = g->ldd;
            gs[G] = np;
            op[G] = g->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
            op[E + G] = g->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
            ab[G] = 1.0f;
            ab[E + G] = g->beta;
            for (int j = 0; j < np; j++) {
                pa[G * np + j] = moe_gg_ptr(&g->a[j], e, off, 2);
                pb[G * np + j] = moe_gg_ptr(&g->b[j], e, off, 2);
                pd[G * np + j] = moe_gg_ptr(&g->d[j], e, off, des);
            }
            G++;
        }
        if (G == 0) goto done;
        int P = G * np; /* problems; the device copy packs A, B, D pointers one after another */
        const void **dp = (const void **)x->dptr;
        memmove(hp + P, pb, sizeof(void *) * (size_t)P);
        memmove(hp + 2 * P, pd, sizeof(void *) * (size_t)P);
        CU_CK(c, cudaMemcpyAsync(dp, hp, sizeof(void *) * 3 * (size_t)P, cudaMemcpyHostToDevice, c->stream));
        if (c->failed) goto done;
        cudaDataType_t dt = g->d_f32 ? CUDA_R_32F : CUDA_R_16BF;
        cublasStatus_t st = cublasGemmGroupedBatchedEx(h, op, op + E, m, n, kk, ab, (const void *const *)dp, CUDA_R_16BF, lda,
                                                       (const void *const *)(dp + P), CUDA_R_16BF, ldb, ab + E,
                                                       (void *const *)(dp + 2 * P), dt, ldd, G, gs, CUBLAS_COMPUTE_32F);
        if (st == CUBLAS_STATUS_SUCCESS) goto done;
        (void)cudaGetLastError();
        for (int i = 0; i < P && !c->failed; i++) { /* refused: the same problems one by one */
            int gi = i / np;
            LT_CK(c,
                  cublasGemmEx(h, op[gi], op[E + gi], m[gi], n[gi], kk[gi], &ab[gi], hp[i], CUDA_R_16BF, lda[gi], hp[P + i],
                               CUDA_R_16BF, ldb[gi], &ab[E + gi], (void *)hp[2 * P + i], dt, ldd[gi], CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT));
        }
    }
done:
    free(iv);
    free(op);
    free(ab);
    free(hp);
}

/* ---------------------------------------------------------------- launchers */

static int moe_al16(const void *p) { return !((uintptr_t)p & 15); }
static void moe_gather(cu_ctx *c, bf16 *dst, bf16 *dstw, const bf16 *src, const int *perm, const float *topw, int S, int K,
                       int div) {
    int V = K % 8 == 0 && moe_al16(dst) && moe_al16(src) && (!dstw || moe_al16(dstw)) ? 8 : 1;
    long long n = (long long)S * (K / V), cap = (long long)c->n_sm * 16;
    moe_gather_kernel<<<(unsigned)(cu_blocks(n, 256) < cap ? cu_blocks(n, 256) : cap), 256, 0, c->stream>>>(dst, dstw, src, perm,
                                                                                                            topw, S, K, div, V);
    CU_LAUNCHED(c, "moe_gather_kernel");
}

static unsigned moe_grid(cu_ctx *c, long long n) {
    unsigned b = cu_blocks(n, 256), cap = (unsigned)c->n_sm * 16;
    return b < cap ? b : cap;
}

/* the permutation, inv and the counts on the host (synchronises the stream); NULL when failed */
static int *moe_gg_setup(cu_ctx *c, const int *topi, int S, int E, char *scr, moe_gg_ctx *x, const int **perm, int **inv) {
    const int *cnt = moe_perm_cuda(c, topi, S, E, scr);
    *perm = cnt + 3 * E + 2;
    size_t pb = moe_perm_bytes(S, E);
    *inv = (int *)(scr + pb);
    moe_inv_kernel<<<moe_grid(c, S), 256, 0, c->stream>>>(*inv, *perm, S);
    CU_LAUNCHED(c, "moe_inv_kernel");
    int *hc = (int *)malloc(sizeof(int) * (size_t)E);
    if (!hc) {
        cu_fail(c, "malloc(moe counts)", "out of host memory", __FILE__, __LINE__);
        return NULL;
    }
    CU_CK(c, cudaMemcpyAsync(hc, cnt, sizeof(int) * (size_t)E, cudaMemcpyDeviceToHost, c->stream));
    CU_CK(c, cudaStreamSynchronize(c->stream));
    if (c->failed) {
        free(hc);
        return NULL;
    }
    x->c = c;
    x->hcnt = hc;
    x->E = E;
    x->dptr = scr + pb + (((size_t)S * sizeof(int) + 255) & ~(size_t)255);
    return hc;
}
/* bytes of moe_gg_setup's part of the scratch: the permutation, inv, the pointers */
static size_t moe_gg_bytes(int S, int E) {
    return moe_perm_bytes(S, E) + (((size_t)S * sizeof(int) + 255) & ~(size_t)255) + moe_gg_room(E);
}

/* a grouped GEMM's shape (no problems yet) and its problems, one a call */
static moe_gg moe_gg_shape(int ta, int tb, int m, int n, int k, int lda, int ldb, int ldd, int d_f32, float beta) {
    moe_gg g;
    memset(&g, 0, sizeof g);
    g.ta = ta, g.tb = tb, g.m = m, g.n = n, g.k = k, g.lda = lda, g.ldb = ldb, g.ldd = ldd, g.d_f32 = d_f32, g.beta = beta;
    return g;
}
static void moe_gg_add(moe_gg *g, moe_opnd a, moe_opnd b, moe_opnd d) {
    g->a[g->np] = a;
    g->b[g->np] = b;
    g->d[g->np++] = d;
}
static moe_opnd moe_w(const void *p, size_t per_e) { return moe_opnd{p, per_e, 0}; } /* stacked weights */
static moe_opnd moe_rows(const void *p, size_t row) { return moe_opnd{p, 0, row}; } /* rows by expert */

void moe_experts_fwd_grouped(cu_ctx *c, bf16 *out, bf16 *eg, bf16 *eu, bf16 *ey, const bf16 *x, const bf16 *res, const int *topi,
                             const float *topw, const bf16 *wg, const bf16 *wu, const bf16 *wd, int T, int C, int E, int k, int Fm) {
    size_t S = (size_t)T * k, hb = moe_gg_bytes((int)S, E), nC = (S * C * 2 + 255) & ~(size_t)255;
    size_t nF = (S * Fm * 2 + 255) & ~(size_t)255, W = (size_t)Fm * C;
    char *scr = (char *)cu_scratch(c, hb + nC + 3 * nF);
    if (!scr) return;
    bf16 *xP = (bf16 *)(scr + hb), *eyP = xP; /* eyP reuses xP's room */
    bf16 *gP = (bf16 *)(scr + hb + nC), *uP = (bf16 *)((char *)gP + nF), *aP = (bf16 *)((char *)uP + nF);
    moe_gg_ctx gx;
    const int *perm;
    int *inv, *hc = moe_gg_setup(c, topi, (int)S, E, scr, &gx, &perm, &inv);
    if (!hc) return;
    moe_gather(c, xP, NULL, x, perm, NULL, (int)S, C, k);
    moe_gg g = moe_gg_shape(1, 0, Fm, -1, C, C, C, Fm, 0, 0.0f); /* gP^T (Fm, cnt) = Wg_e^T' xP_e^T; up alike */
    moe_gg_add(&g, moe_w(wg, W), moe_rows(xP, C), moe_rows(gP, Fm));
    moe_gg_add(&g, moe_w(wu, W), moe_rows(xP, C), moe_rows(uP, Fm));
    moe_gg_run(&gx, &g);
    int va = vec_width(Fm, aP, eg, eu, gP, uP);
    VEC_LAUNCH(moe_act_kernel, va, (long long)S * Fm, aP, eg, eu, gP, uP, perm, 0, (int)S, Fm);
    g = moe_gg_shape(1, 0, C, -1, Fm, Fm, Fm, C, 0, 0.0f); /* eyP^T (C, cnt) = Wd_e^T' aP_e^T */
    moe_gg_add(&g, moe_w(wd, W), moe_rows(aP, Fm), moe_rows(eyP, C));
    moe_gg_run(&gx, &g);
    moe_combine_cuda(c, out, res, ey, eyP, inv, topw, T, C, k);
    free(hc);
}

void moe_experts_bwd_grouped(cu_ctx *c, bf16 *dx, float *dwg, float *dwu, float *dwd, float *dtopw, bf16 *dg, bf16 *du,
                             const bf16 *dout, const bf16 *x, const int *topi, const float *topw, const bf16 *eg, const bf16 *eu,
                             const bf16 *ey, const bf16 *wg, const bf16 *wu, const bf16 *wd, int T, int C, int E, int k, int Fm) {
    size_t S = (size_t)T * k, hb = moe_gg_bytes((int)S, E), n4 = (S * C * 4 + 255) & ~(size_t)255, W = (size_t)Fm * C;
    size_t nF2 = (S * Fm * 2 + 255) & ~(size_t)255, nF4 = (S * Fm * 4 + 255) & ~(size_t)255;
    char *scr = (char *)cu_scratch(c, hb + n4 + 3 * nF2 + nF4);
    if (!scr) return;
    /* R1 (S·C fp32): dyP | wdyP, then partP, then xP */
    bf16 *dyP = (bf16 *)(scr + hb), *wdyP = dyP + S * C, *xP = dyP;
    float *partP = (float *)(scr + hb);
    bf16 *aP = (bf16 *)(scr + hb + n4), *dgP = (bf16 *)((char *)aP + nF2), *duP = (bf16 *)((char *)dgP + nF2);
    float *daP = (float *)((char *)duP + nF2);
    moe_dtopw_cuda(c, dtopw, dout, ey, (int)S, C, k);
    moe_gg_ctx gx;
    const int *perm;
    int *inv, *hc = moe_gg_setup(c, topi, (int)S, E, scr, &gx, &perm, &inv);
    if (!hc) return;
    moe_gather(c, dyP, wdyP, dout, perm, topw, (int)S, C, k);
    int va = vec_width(Fm, aP, eg, eu, NULL, NULL);
    VEC_LAUNCH(moe_act_kernel, va, (long long)S * Fm, aP, (bf16 *)NULL, (bf16 *)NULL, eg, eu, perm, 1, (int)S, Fm);
    moe_gg g = moe_gg_shape(0, 0, Fm, -1, C, Fm, C, Fm, 1, 0.0f); /* daP^T (Fm, cnt) = Wd_e-as-(Fm, C) dyP_e^T */
    moe_gg_add(&g, moe_w(wd, W), moe_rows(dyP, C), moe_rows(daP, Fm));
    moe_gg_run(&gx, &g);
    int vs = vec_width(Fm, dgP, duP, dg, du, eg);
    if (vs > 1 && (uintptr_t)eu % (2u * vs)) vs = 1;
    VEC_LAUNCH(moe_swiglu_bwd_kernel, vs, (long long)S * Fm, dgP, duP, dg, du, daP, eg, eu, perm, topw, (int)S, Fm);
    if (dwd) { /* dWd_e^T (Fm, C) += aP_e^T (Fm, cnt) wdyP_e (cnt, C) */
        g = moe_gg_shape(0, 1, Fm, C, -1, Fm, C, Fm, 1, 1.0f);
        moe_gg_add(&g, moe_rows(aP, Fm), moe_rows(wdyP, C), moe_w(dwd, W));
        moe_gg_run(&gx, &g);
    }
    g = moe_gg_shape(0, 0, C, -1, Fm, C, Fm, C, 1, 0.0f); /* partP^T (C, cnt) = Wg_e-as-(C, Fm) dgP_e^T + Wu_e duP_e^T */
    g.sum = 1;
    moe_gg_add(&g, moe_w(wg, W), moe_rows(dgP, Fm), moe_rows(partP, C));
    moe_gg_add(&g, moe_w(wu, W), moe_rows(duP, Fm), moe_rows(partP, C));
    moe_gg_run(&gx, &g);
    moe_dx_cuda(c, dx, partP, inv, T, C, k);
    if (dwg || dwu) { /* dWg_e^T (C, Fm) += xP_e^T (C, cnt) dgP_e (cnt, Fm); up alike */
        moe_gather(c, xP, NULL, x, perm, NULL, (int)S, C, k);
        g = moe_gg_shape(0, 1, C, Fm, -1, C, Fm, C, 1, 1.0f);
        if (dwg) moe_gg_add(&g, moe_rows(xP, C), moe_rows(dgP, Fm), moe_w(dwg, W));
        if (dwu) moe_gg_add(&g, moe_rows(xP, C), moe_rows(duP, Fm), moe_w(dwu, W));
        moe_gg_run(&gx, &g);
    }
    free(hc);
}
