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

void moe_router_fwd_cpu(float *probs, int *topi, float *topw, float *stats, const float *x, const float *wr, const int *count,
                        int T, int C, int E, int k, int norm) {
    matmul_fwd_cpu(probs, x, wr, NULL, T, C, E);
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        float *p = probs + (size_t)t * E, mx = p[0], sum = 0;
        for (int e = 1; e < E; e++) mx = p[e] > mx ? p[e] : mx;
        for (int e = 0; e < E; e++) sum += p[e] = expf(p[e] - mx);
        for (int e = 0; e < E; e++) p[e] /= sum;
        int *ti = topi + (size_t)t * k;
        float *tw = topw + (size_t)t * k, sel = 0;
        for (int s = 0; s < k; s++) { /* the largest not yet taken; the lower index on a tie */
            int best = -1;
            for (int e = 0; e < E; e++) {
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

void moe_experts_fwd_cpu(float *out, float *eg, float *eu, float *ey, const float *x, const float *res, const int *topi,
                         const float *topw, const float *wg, const float *wu, const float *wd, int T, int C, int E, int k, int Fm) {
#pragma omp parallel
    {
        float *a = malloc((size_t)Fm * sizeof(float)); /* this thread's SwiGLU output */
#pragma omp for schedule(static)
        for (long long ts = 0; ts < (long long)T * k; ts++) {
            const float *xt = x + (size_t)(ts / k) * C;
            size_t e = (size_t)topi[ts];
            float *g = eg + (size_t)ts * Fm, *u = eu + (size_t)ts * Fm, *y = ey + (size_t)ts * C;
            matmul_fwd_cpu(g, xt, wg + e * Fm * C, NULL, 1, C, Fm);
            matmul_fwd_cpu(u, xt, wu + e * Fm * C, NULL, 1, C, Fm);
            for (int f = 0; f < Fm; f++) a[f] = silu(g[f]) * u[f];
            matmul_fwd_cpu(y, a, wd + e * C * Fm, NULL, 1, Fm, C);
        }
        free(a);
    }
    if (!out) return;
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

void moe_experts_bwd_cpu(float *dx, float *dwg, float *dwu, float *dwd, float *dtopw, float *dg, float *du, const float *dout,
                         const float *x, const int *topi, const float *topw, const float *eg, const float *eu, const float *ey,
                         const float *wg, const float *wu, const float *wd, int T, int C, int E, int k, int Fm) {
    /* per token: the routing weights' gradient, each slot's dg, du, and dx through them */
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const float *dy = dout + (size_t)t * C;
        for (int s = 0; s < k; s++) {
            size_t ts = (size_t)t * k + s, e = (size_t)topi[ts];
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
            for (int f = 0; f < Fm; f++) {
                float z = g[f], sg = 1.0f / (1.0f + expf(-z)), da = dgs[f];
                dus[f] = da * z * sg;
                dgs[f] = da * u[f] * (sg + z * sg * (1.0f - sg));
            }
            matmul_bwd_cpu(dx + (size_t)t * C, NULL, NULL, dgs, x + (size_t)t * C, wg + e * Fm * C, 1, C, Fm);
            matmul_bwd_cpu(dx + (size_t)t * C, NULL, NULL, dus, x + (size_t)t * C, wu + e * Fm * C, 1, C, Fm);
        }
    }
    if (!dwg && !dwu && !dwd) return;
        /* per expert, its tokens in order: dWd += (w dy)^T a, dWg += dg^T x, dWu += du^T x */
#pragma omp parallel
    {
        float *a = malloc((size_t)Fm * sizeof(float));
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
                for (int f = 0; f < Fm; f++) {
                    float *rg = dwg ? dwg + ((size_t)e * Fm + f) * C : NULL, *ru = dwu ? dwu + ((size_t)e * Fm + f) * C : NULL;
                    for (int c = 0; c < C; c++) {
                        if (rg) rg[c] += dgs[f] * xt[c];
                        if (ru) ru[c] += dus[f] * xt[c];
                    }
                }
            }
        }
        free(a);
    }
}
