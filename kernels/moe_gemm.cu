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
    void *dptr; /* device room for 3·2·E pointers or 3·E gg_prob (moe_gg_room) */
} moe_gg_ctx;

static const char *moe_gg_ptr(const moe_opnd *o, int e, long long off, int es) {
    return (const char *)o->p + ((size_t)e * o->per_e + (size_t)off * o->per_row) * (size_t)es;
}

static size_t moe_gg_room(int E) {
    size_t a = 6 * (size_t)E * sizeof(void *), b = gemm_grouped_bytes(3 * E);
    return ((a > b ? a : b) + 255) & ~(size_t)255;
}

/* ---------------------------------------------------------------- row-major problems */

/* Grouped GEMMs in house (gemm_grouped.cu): per expert with slots, D_e (m x n, row-major) =
 * Σ_i A_i,e B_i,e (+ beta D_e); m, n or k < 0: the expert's count. An operand is a moe_opnd and
 * its leading dimension. */
typedef struct {
    moe_opnd a, b;
    int lda, ldb, k;
} moe_rs;
typedef struct {
    int m, n, ldd, ns;
    float beta;
    moe_opnd d;
    moe_rs s[GG_SRC];
} moe_rp;

static moe_rp moe_rp_new(int m, int n, moe_opnd d, int ldd, float beta) {
    moe_rp r;
    memset(&r, 0, sizeof r);
    r.m = m, r.n = n, r.d = d, r.ldd = ldd, r.beta = beta;
    return r;
}
static void moe_rp_add(moe_rp *r, moe_opnd a, int lda, moe_opnd b, int ldb, int k) {
    r->s[r->ns++] = (moe_rs){a, b, lda, ldb, k};
}

/* 1 for a stacked weight (the same address every call), 0 for rows by expert */
static int moe_kept(const moe_opnd *o) { return o->per_row == 0; }

/* nr problems an expert (nr <= 3) as gemm_grouped's problems, expert by expert: *P of them in
 * *out (the caller frees it); 0, or -1 where one is outside gemm_grouped's rules or the host
 * has no memory. */
static int moe_rp_probs(const moe_gg_ctx *x, const moe_rp *r, int nr, gg_layout l, gg_prob **out, int *P) {
    gg_prob *p = (gg_prob *)calloc(3 * (size_t)x->E, sizeof *p);
    *out = p, *P = 0;
    if (!p) return -1;
    long long off = 0;
    for (int e = 0; e < x->E; off += x->hcnt[e], e++) {
        int ce = x->hcnt[e];
        for (int j = 0; j < nr && ce; j++) {
            gg_prob *q = &p[(*P)++];
            q->m = r[j].m < 0 ? ce : r[j].m, q->n = r[j].n < 0 ? ce : r[j].n;
            q->d = (void *)moe_gg_ptr(&r[j].d, e, off, l.d_f32 ? 4 : 2), q->ldd = r[j].ldd, q->beta = r[j].beta;
            q->d_kept = moe_kept(&r[j].d);
            q->ns = r[j].ns;
            for (int i = 0; i < r[j].ns; i++) {
                const moe_rs *u = &r[j].s[i];
                q->s[i] = (gg_src){(const bf16 *)moe_gg_ptr(&u->a, e, off, 2),
                                   (const bf16 *)moe_gg_ptr(&u->b, e, off, 2),
                                   u->k < 0 ? ce : u->k,
                                   u->lda,
                                   u->ldb,
                                   moe_kept(&u->a) | moe_kept(&u->b) << 1};
            }
            if (!gemm_grouped_fits(q, l)) return -1;
        }
    }
    return 0;
}

/* The adapters' problems (moe_lora_grouped_fits checked their shapes), one launch. */
static void moe_rp_run(const moe_gg_ctx *x, const moe_rp *r, int nr, gg_layout l) {
    gg_prob *p;
    int P;
    if (moe_rp_probs(x, r, nr, l, &p, &P))
        cu_fail(x->c, "moe adapters' grouped GEMM", "a shape outside gemm_grouped's rules, or no host memory", __FILE__, __LINE__);
    else gemm_grouped_cuda(x->c, p, P, l, x->dptr);
    free(p);
}

/* A column-major moe_gg in house, unless tune.moe asks for cuBLAS or a problem is outside
 * gemm_grouped's rules; 1 when run. Column-major D = op(A) op(B) is row-major D^T = op(B)^T
 * op(A)^T: A' is B (K-major when B is not transposed), B' is A (K-major when A is); a sum is
 * one problem of two products. */
static int moe_gg_own(const moe_gg_ctx *x, const moe_gg *g) {
    if (x->c->tune && x->c->tune->moe == TUNE_MOE_CUBLAS) return 0;
    moe_rp r[2];
    int nr = 0;
    for (int j = 0; j < g->np; j++) {
        if (!g->sum || !j) r[nr++] = moe_rp_new(g->n, g->m, g->d[j], g->ldd, g->beta);
        moe_rp_add(&r[nr - 1], g->b[j], g->ldb, g->a[j], g->lda, g->k);
    }
    gg_layout l = {!g->tb, g->ta, g->d_f32};
    gg_prob *p;
    int P, ok = !moe_rp_probs(x, r, nr, l, &p, &P);
    if (ok) gemm_grouped_cuda(x->c, p, P, l, x->dptr);
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

int moe_lora_grouped_fits(int C, int Fm, const moe_lora *lr) {
    return C % 8 == 0 && Fm % 8 == 0 && (!lr->agu || lr->rg % 8 == 0) && (!lr->ad || lr->rd % 8 == 0);
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
                             const float *topw, const bf16 *wg, const bf16 *wu, const bf16 *wd, int T, int C, int E, int k,
                             int Fm, const moe_lora *lr) {
    int rg = lr && lr->agu ? lr->rg : 0, rd = lr && lr->ad ? lr->rd : 0, rm = rg > rd ? rg : rd;
    size_t S = (size_t)T * k, hb = moe_gg_bytes((int)S, E), nC = (S * C * 2 + 255) & ~(size_t)255;
    size_t nF = (S * Fm * 2 + 255) & ~(size_t)255, W = (size_t)Fm * C, nH = (S * rm * 2 + 255) & ~(size_t)255;
    char *scr = (char *)cu_scratch(c, hb + nC + 3 * nF + nH);
    if (!scr) return;
    bf16 *xP = (bf16 *)(scr + hb), *eyP = xP; /* eyP reuses xP's room */
    bf16 *gP = (bf16 *)(scr + hb + nC), *uP = (bf16 *)((char *)gP + nF), *aP = (bf16 *)((char *)uP + nF);
    bf16 *hP = (bf16 *)((char *)aP + nF); /* (S, r): an adapter's x A^T */
    moe_gg_ctx gx;
    const int *perm;
    int *inv, *hc = moe_gg_setup(c, topi, (int)S, E, scr, &gx, &perm, &inv);
    if (!hc) return;
    moe_gather(c, xP, NULL, x, perm, NULL, (int)S, C, k);
    const gg_layout kk = {1, 1, 0}; /* row-major D = A B^T-stored: both K-major, bf16 out */
    if (rg) { /* hP = xP Agu_e^T; gP, uP = xP Wg|Wu_e^T + hP Bg|Bu_e^T in one accumulator */
        moe_rp r = moe_rp_new(-1, rg, moe_rows(hP, rg), rg, 0.0f), ru[2];
        moe_rp_add(&r, moe_rows(xP, C), C, moe_w(lr->agu, (size_t)rg * C), C, C);
        moe_rp_run(&gx, &r, 1, kk);
        for (int j = 0; j < 2; j++) {
            ru[j] = moe_rp_new(-1, Fm, moe_rows(j ? uP : gP, Fm), Fm, 0.0f);
            moe_rp_add(&ru[j], moe_rows(xP, C), C, moe_w(j ? wu : wg, W), C, C);
            moe_rp_add(&ru[j], moe_rows(hP, rg), rg, moe_w((const bf16 *)lr->bgu + (size_t)j * Fm * rg, (size_t)2 * Fm * rg), rg,
                       rg);
        }
        moe_rp_run(&gx, ru, 2, kk);
    } else {
        moe_gg g = moe_gg_shape(1, 0, Fm, -1, C, C, C, Fm, 0, 0.0f); /* gP^T (Fm, cnt) = Wg_e^T' xP_e^T; up alike */
        moe_gg_add(&g, moe_w(wg, W), moe_rows(xP, C), moe_rows(gP, Fm));
        moe_gg_add(&g, moe_w(wu, W), moe_rows(xP, C), moe_rows(uP, Fm));
        moe_gg_run(&gx, &g);
    }
    int va = vec_width(Fm, aP, eg, eu, gP, uP);
    VEC_LAUNCH(moe_act_kernel, va, (long long)S * Fm, aP, eg, eu, gP, uP, perm, 0, (int)S, Fm);
    if (rd) { /* hP = aP Ad_e^T; eyP = aP Wd_e^T + hP Bd_e^T */
        moe_rp r = moe_rp_new(-1, rd, moe_rows(hP, rd), rd, 0.0f);
        moe_rp_add(&r, moe_rows(aP, Fm), Fm, moe_w(lr->ad, (size_t)rd * Fm), Fm, Fm);
        moe_rp_run(&gx, &r, 1, kk);
        r = moe_rp_new(-1, C, moe_rows(eyP, C), C, 0.0f);
        moe_rp_add(&r, moe_rows(aP, Fm), Fm, moe_w(wd, W), Fm, Fm);
        moe_rp_add(&r, moe_rows(hP, rd), rd, moe_w(lr->bd, (size_t)C * rd), rd, rd);
        moe_rp_run(&gx, &r, 1, kk);
    } else {
        moe_gg g = moe_gg_shape(1, 0, C, -1, Fm, Fm, Fm, C, 0, 0.0f); /* eyP^T (C, cnt) = Wd_e^T' aP_e^T */
        moe_gg_add(&g, moe_w(wd, W), moe_rows(aP, Fm), moe_rows(eyP, C));
        moe_gg_run(&gx, &g);
    }
    moe_combine_cuda(c, out, res, ey, eyP, inv, topw, T, C, k);
    free(hc);
}

void moe_experts_bwd_grouped(cu_ctx *c, bf16 *dx, float *dwg, float *dwu, float *dwd, float *dtopw, bf16 *dg, bf16 *du,
                             const bf16 *dout, const bf16 *x, const int *topi, const float *topw, const bf16 *eg, const bf16 *eu,
                             const bf16 *ey, const bf16 *wg, const bf16 *wu, const bf16 *wd, int T, int C, int E, int k, int Fm,
                             const moe_lora *lr) {
    int rg = lr && lr->agu ? lr->rg : 0, rd = lr && lr->ad ? lr->rd : 0, rm = rg > rd ? rg : rd;
    int ldg = rd && (lr->gad || lr->gbd), lgu = rg && (lr->gagu || lr->gbgu); /* adapter gradients wanted */
    size_t S = (size_t)T * k, hb = moe_gg_bytes((int)S, E), n4 = (S * C * 4 + 255) & ~(size_t)255, W = (size_t)Fm * C;
    size_t nF2 = (S * Fm * 2 + 255) & ~(size_t)255, nF4 = (S * Fm * 4 + 255) & ~(size_t)255, nH = (S * rm * 2 + 255) & ~(size_t)255;
    char *scr = (char *)cu_scratch(c, hb + n4 + 3 * nF2 + nF4 + 4 * nH);
    if (!scr) return;
    /* R1 (S·C fp32): dyP | wdyP, then partP, then xP */
    bf16 *dyP = (bf16 *)(scr + hb), *wdyP = dyP + S * C, *xP = dyP;
    float *partP = (float *)(scr + hb);
    bf16 *aP = (bf16 *)(scr + hb + n4), *dgP = (bf16 *)((char *)aP + nF2), *duP = (bf16 *)((char *)dgP + nF2);
    float *daP = (float *)((char *)duP + nF2);
    /* the adapters' (S, r) rows: dyP Bd_e, wdyP Bd_e, dgP Bg_e + duP Bu_e, an input's A^T */
    bf16 *tdP = (bf16 *)((char *)daP + nF4), *twP = (bf16 *)((char *)tdP + nH), *tgP = (bf16 *)((char *)twP + nH),
         *hP = (bf16 *)((char *)tgP + nH);
    const gg_layout kk = {1, 1, 0}, kn = {1, 0, 0}, kn4 = {1, 0, 1}, mn4 = {0, 0, 1};
    moe_dtopw_cuda(c, dtopw, dout, ey, (int)S, C, k);
    moe_gg_ctx gx;
    const int *perm;
    int *inv, *hc = moe_gg_setup(c, topi, (int)S, E, scr, &gx, &perm, &inv);
    if (!hc) return;
    moe_gather(c, dyP, wdyP, dout, perm, topw, (int)S, C, k);
    int va = vec_width(Fm, aP, eg, eu, NULL, NULL);
    VEC_LAUNCH(moe_act_kernel, va, (long long)S * Fm, aP, (bf16 *)NULL, (bf16 *)NULL, eg, eu, perm, 1, (int)S, Fm);
    moe_gg g;
    if (rd) { /* tdP, twP = dyP, wdyP Bd_e; daP = dyP Wd_e + tdP Ad_e (fp32) */
        moe_rp r[2];
        for (int j = 0; j < 2; j++) {
            r[j] = moe_rp_new(-1, rd, moe_rows(j ? twP : tdP, rd), rd, 0.0f);
            moe_rp_add(&r[j], moe_rows(j ? wdyP : dyP, C), C, moe_w(lr->bd, (size_t)C * rd), rd, C);
        }
        moe_rp_run(&gx, r, 2, kn);
        r[0] = moe_rp_new(-1, Fm, moe_rows(daP, Fm), Fm, 0.0f);
        moe_rp_add(&r[0], moe_rows(dyP, C), C, moe_w(wd, W), Fm, C);
        moe_rp_add(&r[0], moe_rows(tdP, rd), rd, moe_w(lr->ad, (size_t)rd * Fm), Fm, rd);
        moe_rp_run(&gx, r, 1, kn4);
    } else {
        g = moe_gg_shape(0, 0, Fm, -1, C, Fm, C, Fm, 1, 0.0f); /* daP^T (Fm, cnt) = Wd_e-as-(Fm, C) dyP_e^T */
        moe_gg_add(&g, moe_w(wd, W), moe_rows(dyP, C), moe_rows(daP, Fm));
        moe_gg_run(&gx, &g);
    }
    int vs = vec_width(Fm, dgP, duP, dg, du, eg);
    if (vs > 1 && (uintptr_t)eu % (2u * vs)) vs = 1;
    VEC_LAUNCH(moe_swiglu_bwd_kernel, vs, (long long)S * Fm, dgP, duP, dg, du, daP, eg, eu, perm, topw, (int)S, Fm);
    if (dwd) { /* dWd_e^T (Fm, C) += aP_e^T (Fm, cnt) wdyP_e (cnt, C) */
        g = moe_gg_shape(0, 1, Fm, C, -1, Fm, C, Fm, 1, 1.0f);
        moe_gg_add(&g, moe_rows(aP, Fm), moe_rows(wdyP, C), moe_w(dwd, W));
        moe_gg_run(&gx, &g);
    }
    if (ldg) { /* hP = aP Ad_e^T; dBd_e (C, rd) += wdyP_e^T hP_e; dAd_e (rd, Fm) += twP_e^T aP_e (before partP takes R1) */
        moe_rp r[2];
        r[0] = moe_rp_new(-1, rd, moe_rows(hP, rd), rd, 0.0f);
        moe_rp_add(&r[0], moe_rows(aP, Fm), Fm, moe_w(lr->ad, (size_t)rd * Fm), Fm, Fm);
        moe_rp_run(&gx, r, 1, kk);
        int n = 0;
        if (lr->gbd) {
            r[n] = moe_rp_new(C, rd, moe_w(lr->gbd, (size_t)C * rd), rd, 1.0f);
            moe_rp_add(&r[n++], moe_rows(wdyP, C), C, moe_rows(hP, rd), rd, -1);
        }
        if (lr->gad) {
            r[n] = moe_rp_new(rd, Fm, moe_w(lr->gad, (size_t)rd * Fm), Fm, 1.0f);
            moe_rp_add(&r[n++], moe_rows(twP, rd), rd, moe_rows(aP, Fm), Fm, -1);
        }
        moe_rp_run(&gx, r, n, mn4);
    }
    if (rg) { /* tgP = dgP Bg_e + duP Bu_e; partP = dgP Wg_e + duP Wu_e + tgP Agu_e (fp32) */
        moe_rp r = moe_rp_new(-1, rg, moe_rows(tgP, rg), rg, 0.0f);
        for (int j = 0; j < 2; j++)
            moe_rp_add(&r, moe_rows(j ? duP : dgP, Fm), Fm,
                       moe_w((const bf16 *)lr->bgu + (size_t)j * Fm * rg, (size_t)2 * Fm * rg), rg, Fm);
        moe_rp_run(&gx, &r, 1, kn);
        r = moe_rp_new(-1, C, moe_rows(partP, C), C, 0.0f);
        moe_rp_add(&r, moe_rows(dgP, Fm), Fm, moe_w(wg, W), C, Fm);
        moe_rp_add(&r, moe_rows(duP, Fm), Fm, moe_w(wu, W), C, Fm);
        moe_rp_add(&r, moe_rows(tgP, rg), rg, moe_w(lr->agu, (size_t)rg * C), C, rg);
        moe_rp_run(&gx, &r, 1, kn4);
    } else {
        g = moe_gg_shape(0, 0, C, -1, Fm, C, Fm, C, 1, 0.0f); /* partP^T (C, cnt) = Wg_e-as-(C, Fm) dgP_e^T + Wu_e duP_e^T */
        g.sum = 1;
        moe_gg_add(&g, moe_w(wg, W), moe_rows(dgP, Fm), moe_rows(partP, C));
        moe_gg_add(&g, moe_w(wu, W), moe_rows(duP, Fm), moe_rows(partP, C));
        moe_gg_run(&gx, &g);
    }
    moe_dx_cuda(c, dx, partP, inv, T, C, k);
    if (dwg || dwu || lgu) moe_gather(c, xP, NULL, x, perm, NULL, (int)S, C, k);
    if (dwg || dwu) { /* dWg_e^T (C, Fm) += xP_e^T (C, cnt) dgP_e (cnt, Fm); up alike */
        g = moe_gg_shape(0, 1, C, Fm, -1, C, Fm, C, 1, 1.0f);
        if (dwg) moe_gg_add(&g, moe_rows(xP, C), moe_rows(dgP, Fm), moe_w(dwg, W));
        if (dwu) moe_gg_add(&g, moe_rows(xP, C), moe_rows(duP, Fm), moe_w(dwu, W));
        moe_gg_run(&gx, &g);
    }
    if (lgu) { /* hP = xP Agu_e^T; dBg|dBu_e (Fm, rg) += dgP|duP_e^T hP_e; dAgu_e (rg, C) += tgP_e^T xP_e */
        moe_rp r[3];
        r[0] = moe_rp_new(-1, rg, moe_rows(hP, rg), rg, 0.0f);
        moe_rp_add(&r[0], moe_rows(xP, C), C, moe_w(lr->agu, (size_t)rg * C), C, C);
        moe_rp_run(&gx, r, 1, kk);
        int n = 0;
        for (int j = 0; j < 2 && lr->gbgu; j++) {
            r[n] = moe_rp_new(Fm, rg, moe_w(lr->gbgu + (size_t)j * Fm * rg, (size_t)2 * Fm * rg), rg, 1.0f);
            moe_rp_add(&r[n++], moe_rows(j ? duP : dgP, Fm), Fm, moe_rows(hP, rg), rg, -1);
        }
        if (lr->gagu) {
            r[n] = moe_rp_new(rg, C, moe_w(lr->gagu, (size_t)rg * C), C, 1.0f);
            moe_rp_add(&r[n++], moe_rows(tgP, rg), rg, moe_rows(xP, C), C, -1);
        }
        moe_rp_run(&gx, r, n, mn4);
    }
    free(hc);
}
