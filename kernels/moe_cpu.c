/* moe_cpu.c — fp32 reference of moe.h: plain loops over tokens and their k slots.
 *
 * The router's logits are one GEMM (matmul_fwd_cpu), the softmax and top-k are per token. The
 * experts run slot by slot: each (token, slot) pair multiplies its token's row by its expert's
 * three matrices (a gather, not a permutation: the spec, not the fast path). Sums that cross
 * threads are owned by one thread each: a token's dx by its token, an expert's weight
 * gradients by its expert (tokens in order), so results do not depend on the thread count. */
#include "kernels/moe.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/matmul.h"

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

/* ---------------------------------------------------------------- router */

void moe_router_fwd_cpu(float *probs, int *topi, float *topw, float *stats, const float *x, const float *wr, const int *given,
                        const int *count, int T, int C, int E, int k, int norm) {
    matmul_fwd_cpu(probs, x, wr, NULL, T, C, E);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *p = probs + (size_t)t * E, mx = p[0], sum = 0;
        for (int e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        for (int e = 0; e < E; e++) sum += p[e] = expf(p[e] - mx);
        for (int e = 0; e < E; e++) p[e] /= sum;
        int *ti = topi + (size_t)t * k;
        const int *g = given && given[(size_t)t * k] >= 0 ? given + (size_t)t * k : NULL;
        float *tw = topw + (size_t)t * k, sel = 0;
        for (int s = 0; s < k; s++) { /* the largest not yet taken; the lower index on a tie */
            int best = g ? g[s] : -1;
            for (int e = 0; e < E && !g; e++) {
                int taken = 0;
                for (int j = 0; j < s && !taken; j++) taken = ti[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            ti[s] = best;
            tw[s] = p[best];
            sel += p[best];
        }
        if (norm)
            for (int s = 0; s < k; s++) tw[s] /= sel;
    }
    if (!stats) return;
    for (int t = 0; t < T; t++) { /* in token order: the same sums on any thread count */
        float c = count ? (float)count[t] : 1.0f;
        for (int s = 0; s < k; s++) stats[topi[(size_t)t * k + s]] += c;
        for (int e = 0; e < E; e++) stats[E + e] += c * probs[(size_t)t * E + e];
        stats[2 * E] += c;
    }
}

void moe_router_bwd_cpu(float *dx, float *dwr, float *dlogit, const float *dtopw, const float *probs, const int *topi,
                        const float *x, const float *wr, const float *aux_g, const int *count, int T, int C, int E, int k,
                        int norm) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const float *p = probs + (size_t)t * E, *dw = dtopw + (size_t)t * k;
        const int *ti = topi + (size_t)t * k;
        float *dp = dlogit + (size_t)t * E, c = count ? (float)count[t] : 1.0f;
        for (int e = 0; e < E; e++) dp[e] = aux_g ? aux_g[e] * c : 0.0f;
        if (norm) { /* w_s = p_s / S: d p_s = (dw_s - Σ_j dw_j w_j) / S */
            float S = 0, dot = 0;
            for (int s = 0; s < k; s++) S += p[ti[s]];
            for (int s = 0; s < k; s++) dot += dw[s] * p[ti[s]] / S;
            for (int s = 0; s < k; s++) dp[ti[s]] += (dw[s] - dot) / S;
        } else {
            for (int s = 0; s < k; s++) dp[ti[s]] += dw[s];
        }
        float pd = 0; /* softmax: d logit_e = p_e (d p_e - Σ_j p_j d p_j) */
        for (int e = 0; e < E; e++) pd += p[e] * dp[e];
        for (int e = 0; e < E; e++) dp[e] = p[e] * (dp[e] - pd);
    }
    matmul_bwd_cpu(dx, dwr, NULL, dlogit, x, wr, T, C, E);
}

/* ---------------------------------------------------------------- experts */

/* out (O) += B (O, r) h (r) */
static void lowrank_add(float *out, const float *B, const float *h, int O, int r) {
    for (int o = 0; o < O; o++)
        for (int j = 0; j < r; j++) out[o] += B[(size_t)o * r + j] * h[j];
}

/* t (r) += B (O, r)^T v (O) */
static void lowrank_t(float *t, const float *B, const float *v, int O, int r) {
    for (int o = 0; o < O; o++)
        for (int j = 0; j < r; j++) t[j] += B[(size_t)o * r + j] * v[o];
}

/* expert e's adapter matrices (moe.h's layouts) */
#define AGU(lr, e, C) ((const float *)(lr)->agu + (size_t)(e) * (lr)->rg * (C))
#define BGU(lr, e, Fm) ((const float *)(lr)->bgu + (size_t)(e)*2 * (Fm) * (lr)->rg)
#define AD(lr, e, Fm) ((const float *)(lr)->ad + (size_t)(e) * (lr)->rd * (Fm))
#define BD(lr, e, C) ((const float *)(lr)->bd + (size_t)(e) * (C) * (lr)->rd)

void moe_experts_fwd_cpu(float *out, float *eg, float *eu, float *ey, const float *x, const float *res, const int *topi,
                         const float *topw, const float *wg, const float *wu, const float *wd, int T, int C, int E, int k, int Fm,
                         const moe_lora *lr) {
    const moe_lora *gu = lr && lr->agu ? lr : NULL, *dn = lr && lr->ad ? lr : NULL;
    int rmax = lr ? (lr->rg > lr->rd ? lr->rg : lr->rd) : 0;
#pragma omp parallel
    {
        float *a = malloc((size_t)(Fm + rmax) * sizeof(float)), *h = a + Fm; /* SwiGLU output; X A^T */
#pragma omp for schedule(static)
        for (long long ts = 0; ts < (long long)T * k; ts++) {
            const float *xt = x + (size_t)(ts / k) * C;
            size_t e = (size_t)topi[ts];
            float *g = eg + (size_t)ts * Fm, *u = eu + (size_t)ts * Fm, *y = ey + (size_t)ts * C;
            matmul_fwd_cpu(g, xt, wg + e * Fm * C, NULL, 1, C, Fm);
            matmul_fwd_cpu(u, xt, wu + e * Fm * C, NULL, 1, C, Fm);
            if (gu) {
                matmul_fwd_cpu(h, xt, AGU(gu, e, C), NULL, 1, C, gu->rg);
                lowrank_add(g, BGU(gu, e, Fm), h, Fm, gu->rg);
                lowrank_add(u, BGU(gu, e, Fm) + (size_t)Fm * gu->rg, h, Fm, gu->rg);
            }
            for (int f = 0; f < Fm; f++) a[f] = silu(g[f]) * u[f];
            matmul_fwd_cpu(y, a, wd + e * C * Fm, NULL, 1, Fm, C);
            if (dn) {
                matmul_fwd_cpu(h, a, AD(dn, e, Fm), NULL, 1, Fm, dn->rd);
                lowrank_add(y, BD(dn, e, C), h, C, dn->rd);
            }
        }
        free(a);
    }
    if (out) moe_combine_cpu(out, ey, res, topw, T, C, k);
}

void moe_combine_rows_cpu(float *out, float *ey, const float *rows, const int *inv, const float *res, const float *topw, int T,
                          int C, int k) {
    for (long long ts = 0; ts < (long long)T * k; ts++)
        memcpy(ey + ts * C, rows + (size_t)inv[ts] * C, (size_t)C * sizeof(float));
    if (out) moe_combine_cpu(out, ey, res, topw, T, C, k);
}

void moe_dtopw_cpu(float *dtopw, const float *dout, const float *ey, int T, int C, int k) {
    for (long long ts = 0; ts < (long long)T * k; ts++) {
        const float *d = dout + (size_t)(ts / k) * C, *y = ey + (size_t)ts * C;
        float dot = 0;
        for (int c = 0; c < C; c++) dot += d[c] * y[c];
        dtopw[ts] = dot;
    }
}

void moe_combine_cpu(float *out, const float *ey, const float *res, const float *topw, int T, int C, int k) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *o = out + (size_t)t * C;
        for (int c = 0; c < C; c++) o[c] = res ? res[(size_t)t * C + c] : 0.0f;
        for (int s = 0; s < k; s++) {
            const float *y = ey + ((size_t)t * k + s) * C;
            float w = topw[(size_t)t * k + s];
            for (int c = 0; c < C; c++) o[c] += w * y[c];
        }
    }
}

/* The adapters' gradients of one (token, slot) of expert e: wdy = w dy (C), a (Fm) the SwiGLU
 * output, dgs/dus (Fm) d gate/up, x (C); h, t scratch (max rank). */
static void lora_slot_grads(const moe_lora *lr, size_t e, const float *wdy, const float *a, const float *dgs, const float *dus,
                            const float *xt, float *h, float *t, int C, int Fm) {
    if (lr->ad && (lr->gad || lr->gbd)) { /* y += Bd (Ad a): dBd += wdy ⊗ h, dAd += (Bd^T wdy) ⊗ a */
        int r = lr->rd;
        matmul_fwd_cpu(h, a, AD(lr, e, Fm), NULL, 1, Fm, r);
        memset(t, 0, (size_t)r * sizeof(float));
        lowrank_t(t, BD(lr, e, C), wdy, C, r);
        if (lr->gbd) matmul_bwd_cpu(NULL, lr->gbd + e * C * r, NULL, wdy, h, NULL, 1, r, C);
        if (lr->gad) matmul_bwd_cpu(NULL, lr->gad + e * r * Fm, NULL, t, a, NULL, 1, Fm, r);
    }
    if (lr->agu && (lr->gagu || lr->gbgu)) { /* g, u += Bg h, Bu h with h = Agu x */
        int r = lr->rg;
        const float *B = BGU(lr, e, Fm);
        matmul_fwd_cpu(h, xt, AGU(lr, e, C), NULL, 1, C, r);
        memset(t, 0, (size_t)r * sizeof(float));
        lowrank_t(t, B, dgs, Fm, r);
        lowrank_t(t, B + (size_t)Fm * r, dus, Fm, r);
        if (lr->gbgu) {
            matmul_bwd_cpu(NULL, lr->gbgu + e * 2 * Fm * r, NULL, dgs, h, NULL, 1, r, Fm);
            matmul_bwd_cpu(NULL, lr->gbgu + e * 2 * Fm * r + (size_t)Fm * r, NULL, dus, h, NULL, 1, r, Fm);
        }
        if (lr->gagu) matmul_bwd_cpu(NULL, lr->gagu + e * r * C, NULL, t, xt, NULL, 1, C, r);
    }
}

void moe_experts_bwd_cpu(float *dx, float *dwg, float *dwu, float *dwd, float *dtopw, float *dg, float *du, const float *dout,
                         const float *x, const int *topi, const float *topw, const float *eg, const float *eu, const float *ey,
                         const float *wg, const float *wu, const float *wd, int T, int C, int E, int k, int Fm, const moe_lora *lr) {
    const moe_lora *gu = lr && lr->agu ? lr : NULL, *dn = lr && lr->ad ? lr : NULL;
    int rmax = lr ? (lr->rg > lr->rd ? lr->rg : lr->rd) : 0;
    /* per token: the routing weights' gradient, each slot's dg, du, and dx through them */
#pragma omp parallel
    {
        float *t = malloc((size_t)(rmax + 1) * sizeof(float)); /* B^T of a gradient (r) */
#pragma omp for schedule(static)
        for (int tk = 0; tk < T; tk++) {
            const float *dy = dout + (size_t)tk * C;
            for (int s = 0; s < k; s++) {
                size_t ts = (size_t)tk * k + s, e = (size_t)topi[ts];
                const float *y = ey + ts * C, *g = eg + ts * Fm, *u = eu + ts * Fm, *wdr = wd + e * C * Fm;
                float w = topw[ts], dot = 0, *dgs = dg + ts * Fm, *dus = du + ts * Fm;
                for (int c = 0; c < C; c++) dot += dy[c] * y[c];
                dtopw[ts] = dot;
                for (int f = 0; f < Fm; f++) dgs[f] = 0;
                for (int c = 0; c < C; c++) { /* da = w dy Wd */
                    float gy = w * dy[c];
                    const float *wrow = wdr + (size_t)c * Fm;
                    for (int f = 0; f < Fm; f++) dgs[f] += gy * wrow[f];
                }
                if (dn) { /* da += ((w dy) Bd) Ad */
                    memset(t, 0, (size_t)dn->rd * sizeof(float));
                    lowrank_t(t, BD(dn, e, C), dy, C, dn->rd);
                    for (int j = 0; j < dn->rd; j++) t[j] *= w;
                    matmul_bwd_cpu(dgs, NULL, NULL, t, NULL, AD(dn, e, Fm), 1, Fm, dn->rd);
                }
                for (int f = 0; f < Fm; f++) {
                    float z = g[f], sg = 1.0f / (1.0f + expf(-z)), da = dgs[f];
                    dus[f] = da * z * sg;
                    dgs[f] = da * u[f] * (sg + z * sg * (1.0f - sg));
                }
                matmul_bwd_cpu(dx + (size_t)tk * C, NULL, NULL, dgs, x + (size_t)tk * C, wg + e * Fm * C, 1, C, Fm);
                matmul_bwd_cpu(dx + (size_t)tk * C, NULL, NULL, dus, x + (size_t)tk * C, wu + e * Fm * C, 1, C, Fm);
                if (gu) { /* dx += (dg Bg + du Bu) Agu */
                    memset(t, 0, (size_t)gu->rg * sizeof(float));
                    lowrank_t(t, BGU(gu, e, Fm), dgs, Fm, gu->rg);
                    lowrank_t(t, BGU(gu, e, Fm) + (size_t)Fm * gu->rg, dus, Fm, gu->rg);
                    matmul_bwd_cpu(dx + (size_t)tk * C, NULL, NULL, t, NULL, AGU(gu, e, C), 1, C, gu->rg);
                }
            }
        }
        free(t);
    }
    int lgrad = lr && (lr->gagu || lr->gbgu || lr->gad || lr->gbd);
    if (!dwg && !dwu && !dwd && !lgrad) return;
        /* per expert, its tokens in order: dWd += (w dy)^T a, dWg += dg^T x, dWu += du^T x */
#pragma omp parallel
    {
        float *a = malloc((size_t)(Fm + C + 2 * rmax + 2) * sizeof(float)), *wdy = a + Fm, *h = wdy + C, *t = h + rmax + 1;
#pragma omp for schedule(static)
        for (int e = 0; e < E; e++) {
            for (long long ts = 0; ts < (long long)T * k; ts++) {
                if (topi[ts] != e) continue;
                const float *xt = x + (size_t)(ts / k) * C, *dy = dout + (size_t)(ts / k) * C;
                const float *g = eg + (size_t)ts * Fm, *u = eu + (size_t)ts * Fm;
                const float *dgs = dg + (size_t)ts * Fm, *dus = du + (size_t)ts * Fm;
                float w = topw[ts];
                for (int f = 0; f < Fm; f++) a[f] = silu(g[f]) * u[f];
                for (int c = 0; dwd && c < C; c++) {
                    float gy = w * dy[c], *row = dwd + ((size_t)e * C + c) * Fm;
                    for (int f = 0; f < Fm; f++) row[f] += gy * a[f];
                }
                for (int f = 0; (dwg || dwu) && f < Fm; f++) {
                    float *rg = dwg ? dwg + ((size_t)e * Fm + f) * C : NULL, *ru = dwu ? dwu + ((size_t)e * Fm + f) * C : NULL;
                    for (int c = 0; c < C; c++) {
                        if (rg) rg[c] += dgs[f] * xt[c];
                        if (ru) ru[c] += dus[f] * xt[c];
                    }
                }
                if (!lgrad) continue;
                for (int c = 0; c < C; c++) wdy[c] = w * dy[c];
                lora_slot_grads(lr, (size_t)e, wdy, a, dgs, dus, xt, h, t, C, Fm);
            }
        }
        free(a);
    }
}
