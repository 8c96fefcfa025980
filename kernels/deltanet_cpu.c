/* deltanet_cpu.c — fp32 reference of deltanet.h: plain loops, one order of summation per output
 * whatever the thread count (threads split heads or channels, never a sum).
 *
 * The rule's backward, per value head, walks the tokens in reverse with dS the gradient of the
 * state after token t (from its output and from every token that continued it):
 *   dS += q do^T;  dq = S do
 *   S = S' + k δ^T:        dk += dS δ;   dδ = dS^T k;        (S' = e^g S_prev, m = S'^T k)
 *   δ = β (v - m):         dβ = dδ · (v - m);  dv = β dδ;  dm = -β dδ
 *   m = S'^T k:            dS' = dS + k dm^T;  dk += S' dm
 *   S' = e^g S_prev:       dg = e^g Σ dS' ⊙ S_prev;  dS_prev += e^g dS'
 * then through g = -exp(A_log) softplus(a + dt_bias), β = dn_sigmoid(b) and the l2 norms. A key
 * head's q/k gradient sums its value heads in head order.
 *
 * A carry (deltanet.h deltanet_carry) enters as one more kind of predecessor: a token whose
 * run continues a row before the call reads the carry's state, and its conv history the
 * carry's tail; their gradients go to the carry's ds_in / dtail_in as a predecessor token's
 * would go to its dstates / dx. */
#include "kernels/deltanet.h"
#include "kernels/deltanet_cpu.h"

#include <assert.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

/* ---------------------------------------------------------------- conv */

/* The predecessor of token t along deltanet_prev_row: a token of the call (>= 0), none (-1) or
 * the carry's row row0 - 1 (DN_CARRY). */
enum { DN_NONE = -1, DN_CARRY = -2 };
static int prev_tok(attn_ranges r, const deltanet_carry *cy, int t) {
    int row0 = cy ? cy->row0 : 0, p = deltanet_prev_row(r, t, row0);
    if (p < 0) return DN_NONE;
    if (p >= row0) return p - row0;
    assert(p == row0 - 1 && cy->s_in && cy->tail_in);
    return DN_CARRY;
}

/* A conv history entry: a token of the call (>= 0), none (-1), or the carry's tail entry i
 * (-2 - i, i in [0, Kc-1): oldest first). */
static int hist_prev(attn_ranges r, const deltanet_carry *cy, int e, int Kc) {
    if (e >= 0) {
        int p = prev_tok(r, cy, e);
        return p == DN_CARRY ? (Kc >= 2 ? -2 - (Kc - 2) : -1) : p;
    }
    return e <= -3 ? e + 1 : -1; /* the tail entry before, none before entry 0 */
}

/* hist[j] = the entry Kc-1-j steps back from token t (hist[Kc-1] = t) */
static void conv_history(int *hist, attn_ranges r, const deltanet_carry *cy, int t, int Kc) {
    int e = t;
    for (int j = Kc - 1; j >= 0; j--) {
        hist[j] = e;
        if (e != -1) e = hist_prev(r, cy, e, Kc);
    }
}

/* channel c's input at history entry e (not -1) */
static float conv_in(const float *x, const deltanet_carry *cy, int e, int c, int Cc) {
    return e >= 0 ? x[(size_t)e * Cc + c] : cy->tail_in[(size_t)(-2 - e) * Cc + c];
}

static float conv_pre(const float *x, const deltanet_carry *cy, const float *wc, const int *hist, int c, int Cc, int Kc) {
    float s = 0;
    for (int j = 0; j < Kc; j++)
        if (hist[j] != -1) s += wc[j] * conv_in(x, cy, hist[j], c, Cc);
    return s;
}

void deltanet_conv_fwd_cpu(float *u, const float *x, const float *w, attn_ranges r, const deltanet_carry *cy, int T, int Cc,
                           int Kc) {
#pragma omp parallel for
    for (int t = 0; t < T; t++) {
        int hist[64];
        conv_history(hist, r, cy, t, Kc);
        for (int c = 0; c < Cc; c++) u[(size_t)t * Cc + c] = dn_silu(conv_pre(x, cy, w + (size_t)c * Kc, hist, c, Cc, Kc));
    }
    if (cy && cy->tail_out && T > 0) { /* the inputs of T - 1 and the Kc - 2 before it */
        int hist[64];
        conv_history(hist, r, cy, T - 1, Kc);
        for (int j = 0; j + 1 < Kc; j++)
            for (int c = 0; c < Cc; c++)
                cy->tail_out[(size_t)j * Cc + c] = hist[j + 1] != -1 ? conv_in(x, cy, hist[j + 1], c, Cc) : 0;
    }
}

/* d (channel c's input at history entry e) += g: dx for a token, the carry's dtail_in for its tail */
static void conv_in_add(float *dx, const deltanet_carry *cy, int e, int c, int Cc, float g) {
    if (e >= 0) dx[(size_t)e * Cc + c] += g;
    else if (cy->dtail_in) cy->dtail_in[(size_t)(-2 - e) * Cc + c] += g;
}

/* Channels are independent: each thread owns whole channels, summing their tokens in order,
 * then the gradient from outside (dtail_out). */
void deltanet_conv_bwd_cpu(float *dx, float *dw, const float *du, const float *x, const float *w, attn_ranges r,
                           const deltanet_carry *cy, int T, int Cc, int Kc) {
    memset(dx, 0, (size_t)T * Cc * sizeof(float));
    int hout[64];
    if (cy && cy->dtail_out && T > 0) conv_history(hout, r, cy, T - 1, Kc);
#pragma omp parallel for
    for (int c = 0; c < Cc; c++) {
        const float *wc = w + (size_t)c * Kc;
        float dwc[64] = {0};
        int hist[64];
        for (int t = 0; t < T; t++) {
            conv_history(hist, r, cy, t, Kc);
            float p = conv_pre(x, cy, wc, hist, c, Cc, Kc), sg = dn_sigmoid(p);
            float dp = du[(size_t)t * Cc + c] * (sg * (1.0f + p * (1.0f - sg)));
            for (int j = 0; j < Kc; j++)
                if (hist[j] != -1) {
                    dwc[j] += dp * conv_in(x, cy, hist[j], c, Cc);
                    conv_in_add(dx, cy, hist[j], c, Cc, dp * wc[j]);
                }
        }
        for (int j = 0; j < Kc; j++) dw[(size_t)c * Kc + j] += dwc[j];
        if (cy && cy->dtail_out && T > 0)
            for (int j = 0; j + 1 < Kc; j++)
                if (hout[j + 1] != -1) conv_in_add(dx, cy, hout[j + 1], c, Cc, cy->dtail_out[(size_t)j * Cc + c]);
    }
}

/* ---------------------------------------------------------------- rule */

void deltanet_rule_fwd_cpu(float *o, float *states, const float *u, const float *a, const float *b, const float *A_log,
                           const float *dt_bias, attn_ranges r, const deltanet_carry *cy, int T, int Hk, int Hv, int Dk, int Dv) {
    dn_dims n = {Hk, Hv, Dk, Dv, 2 * Hk * Dk + Hv * Dv};
    size_t SZ = (size_t)Dk * Dv;
#pragma omp parallel for
    for (int h = 0; h < Hv; h++) {
        float q[1024], k[1024], eg, beta, g, bp;
        const float *v;
        for (int t = 0; t < T; t++) {
            dn_rule_inputs(q, k, &v, &eg, &beta, &g, &bp, u, a, b, A_log, dt_bias, n, t, h);
            int p = prev_tok(r, cy, t);
            const float *Sp = p >= 0 ? states + ((size_t)p * Hv + h) * SZ : p == DN_CARRY ? cy->s_in + (size_t)h * SZ : NULL;
            dn_rule_step(states + ((size_t)t * Hv + h) * SZ, Sp, o + ((size_t)t * Hv + h) * Dv, q, k, v, eg, beta, Dk, Dv);
        }
        if (cy && cy->s_out && T > 0)
            memcpy(cy->s_out + (size_t)h * SZ, states + ((size_t)(T - 1) * Hv + h) * SZ, SZ * sizeof(float));
    }
}

/* y = x / sqrt(Σx² + eps) backward: dx = inv (dy - y (y · dy)) */
static void l2n_bwd(float *dx, const float *x, const float *dy, int n) {
    float y[1024];
    float inv = dn_l2n(y, x, n);
    double yd = 0;
    for (int i = 0; i < n; i++) yd += (double)y[i] * dy[i];
    for (int i = 0; i < n; i++) dx[i] = inv * (dy[i] - y[i] * (float)yd);
}

/* The reverse walk of value head h: du's q/k slices of its key head += the gradients of the
 * scaled, normalised q and k; du's v slice, da, db written; dA_log[h], ddt_bias[h] +=. */
static void rule_bwd_head(float *du, float *da, float *db, float *dA_log, float *ddt_bias, const float *states, float *dstates,
                          const float *dout, const float *u, const float *a, const float *b, const float *A_log,
                          const float *dt_bias, attn_ranges r, const deltanet_carry *cy, int T, dn_dims n, int h) {
    int Dk = n.Dk, Dv = n.Dv, Hv = n.Hv;
    size_t SZ = (size_t)Dk * Dv;
    float q[1024], k[1024], m[1024], dd[1024], dm[1024], eg, beta, g, bp;
    const float *v;
    double dAl = 0, ddt = 0;
    for (int t = T - 1; t >= 0; t--) {
        dn_rule_inputs(q, k, &v, &eg, &beta, &g, &bp, u, a, b, A_log, dt_bias, n, t, h);
        int p = prev_tok(r, cy, t);
        const float *S = states + ((size_t)t * Hv + h) * SZ;
        const float *Sp = p >= 0 ? states + ((size_t)p * Hv + h) * SZ : p == DN_CARRY ? cy->s_in + (size_t)h * SZ : NULL;
        float *dS = dstates + ((size_t)t * Hv + h) * SZ;
        const float *dy = dout + ((size_t)t * Hv + h) * Dv;
        int kh = h / (Hv / n.Hk);
        float *dq = du + (size_t)t * n.Cc + (size_t)kh * Dk, *dk = du + (size_t)t * n.Cc + (size_t)(n.Hk + kh) * Dk;
        float *dv = du + (size_t)t * n.Cc + (size_t)2 * n.Hk * Dk + (size_t)h * Dv;
        for (int i = 0; i < Dk; i++) {
            float s = 0;
            for (int j = 0; j < Dv; j++) {
                dS[(size_t)i * Dv + j] += q[i] * dy[j];
                s += S[(size_t)i * Dv + j] * dy[j];
            }
            dq[i] += s;
        }
        /* m = S'^T k with S' = e^g S_prev; δ = β (v - m) */
        for (int j = 0; j < Dv; j++) m[j] = 0;
        if (Sp)
            for (int i = 0; i < Dk; i++)
                for (int j = 0; j < Dv; j++) m[j] += eg * Sp[(size_t)i * Dv + j] * k[i];
        for (int j = 0; j < Dv; j++) dd[j] = 0;
        for (int i = 0; i < Dk; i++) {
            float s = 0;
            for (int j = 0; j < Dv; j++) {
                s += dS[(size_t)i * Dv + j] * beta * (v[j] - m[j]);
                dd[j] += dS[(size_t)i * Dv + j] * k[i];
            }
            dk[i] += s;
        }
        float dbeta = 0;
        for (int j = 0; j < Dv; j++) {
            dbeta += dd[j] * (v[j] - m[j]);
            dv[j] = beta * dd[j];
            dm[j] = -beta * dd[j];
        }
        /* dS' = dS + k dm^T; dk += S' dm; dg, dS_prev */
        float dgs = 0;
        float *dSp = p >= 0              ? dstates + ((size_t)p * Hv + h) * SZ
            : p == DN_CARRY && cy->ds_in ? cy->ds_in + (size_t)h * SZ
                                         : NULL;
        for (int i = 0; i < Dk; i++) {
            float s = 0;
            for (int j = 0; j < Dv; j++) {
                float dsp = dS[(size_t)i * Dv + j] + k[i] * dm[j];
                if (Sp) {
                    float sp = Sp[(size_t)i * Dv + j];
                    s += eg * sp * dm[j];
                    dgs += dsp * sp;
                    if (dSp) dSp[(size_t)i * Dv + j] += eg * dsp;
                }
            }
            dk[i] += s;
        }
        float dg = eg * dgs, x = a[(size_t)t * Hv + h] + dt_bias[h];
        float dx = dg * -expf(A_log[h]) * dn_sigmoid(x);
        da[(size_t)t * Hv + h] = dx;
        ddt += dx;
        dAl += dg * g;
        db[(size_t)t * Hv + h] = dbeta * beta * (1.0f - beta);
    }
    *dA_log += (float)dAl;
    *ddt_bias += (float)ddt;
}

void deltanet_rule_bwd_cpu(float *du, float *da, float *db, float *dA_log, float *ddt_bias, float *states, float *dstates,
                           const float *dout, const float *u, const float *a, const float *b, const float *A_log,
                           const float *dt_bias, attn_ranges r, const deltanet_carry *cy, int T, int Hk, int Hv, int Dk, int Dv) {
    dn_dims n = {Hk, Hv, Dk, Dv, 2 * Hk * Dk + Hv * Dv};
    deltanet_carry in = cy ? *cy : (deltanet_carry){0};
    in.s_out = NULL; /* the recompute leaves the forward's outputs alone */
    deltanet_rule_fwd_cpu(dstates, states, u, a, b, A_log, dt_bias, r, cy ? &in : NULL, T, Hk, Hv, Dk, Dv); /* dstates: o, discarded */
    size_t SZ = (size_t)Hv * Dk * Dv;
    memset(dstates, 0, (size_t)T * SZ * sizeof(float));
    if (cy && cy->ds_out && T > 0) memcpy(dstates + (size_t)(T - 1) * SZ, cy->ds_out, SZ * sizeof(float)); /* from outside */
    int G = Hv / Hk;
    /* key head kh's value heads add their q/k gradients, in head order, into du's q/k slices
     * (pre-norm), then the l2 norms' backward runs in place */
#pragma omp parallel for
    for (int kh = 0; kh < Hk; kh++) {
        for (int t = 0; t < T; t++) {
            memset(du + (size_t)t * n.Cc + (size_t)kh * Dk, 0, (size_t)Dk * sizeof(float));
            memset(du + (size_t)t * n.Cc + (size_t)(Hk + kh) * Dk, 0, (size_t)Dk * sizeof(float));
        }
        for (int h = kh * G; h < (kh + 1) * G; h++)
            rule_bwd_head(du, da, db, dA_log + h, ddt_bias + h, states, dstates, dout, u, a, b, A_log, dt_bias, r, cy, T, n, h);
        float sc = 1.0f / sqrtf((float)Dk), y[1024];
        for (int t = 0; t < T; t++) {
            float *gq = du + (size_t)t * n.Cc + (size_t)kh * Dk, *gk = du + (size_t)t * n.Cc + (size_t)(Hk + kh) * Dk;
            const float *xq = u + (size_t)t * n.Cc + (size_t)kh * Dk, *xk = u + (size_t)t * n.Cc + (size_t)(Hk + kh) * Dk;
            for (int i = 0; i < Dk; i++) y[i] = gq[i] * sc;
            l2n_bwd(gq, xq, y, Dk);
            for (int i = 0; i < Dk; i++) y[i] = gk[i];
            l2n_bwd(gk, xk, y, Dk);
        }
    }
}

/* ---------------------------------------------------------------- gated norm
 * n = o r, r = rsqrt(mean(o²) + eps); y = w n dn_silu(z):
 *   dw += dy n dn_silu(z);  dz = dy w n silu'(z);  dn = dy w dn_silu(z);  do = r (dn - n mean(dn n)) */

void deltanet_norm_fwd_cpu(float *y, float *rstd, const float *o, const float *z, const float *w, int T, int Hv, int Dv, float eps) {
#pragma omp parallel for
    for (long long row = 0; row < (long long)T * Hv; row++) {
        const float *x = o + row * Dv, *zr = z + row * Dv;
        double ss = 0;
        for (int i = 0; i < Dv; i++) ss += (double)x[i] * x[i];
        float r = 1.0f / sqrtf((float)(ss / Dv) + eps);
        rstd[row] = r;
        for (int i = 0; i < Dv; i++) y[row * Dv + i] = w[i] * (x[i] * r) * dn_silu(zr[i]);
    }
}

void deltanet_norm_bwd_cpu(float *dout, float *dz, float *dw, const float *dy, const float *o, const float *z, const float *w,
                           const float *rstd, int T, int Hv, int Dv) {
    long long R = (long long)T * Hv;
#pragma omp parallel for
    for (long long row = 0; row < R; row++) {
        const float *x = o + row * Dv, *zr = z + row * Dv, *g = dy + row * Dv;
        float r = rstd[row], dn[1024];
        double s = 0;
        for (int i = 0; i < Dv; i++) {
            float n = x[i] * r, sg = dn_sigmoid(zr[i]), sl = zr[i] * sg;
            dn[i] = g[i] * w[i] * sl;
            dz[row * Dv + i] = g[i] * w[i] * n * (sg * (1.0f + zr[i] * (1.0f - sg)));
            s += (double)dn[i] * n;
        }
        float mean = (float)(s / Dv);
        for (int i = 0; i < Dv; i++) dout[row * Dv + i] = r * (dn[i] - x[i] * r * mean);
    }
    /* dw: each element sums its rows in order */
#pragma omp parallel for
    for (int i = 0; i < Dv; i++) {
        double s = 0;
        for (long long row = 0; row < R; row++)
            s += (double)dy[row * Dv + i] * (o[row * Dv + i] * rstd[row]) * dn_silu(z[row * Dv + i]);
        dw[i] += (float)s;
    }
}
