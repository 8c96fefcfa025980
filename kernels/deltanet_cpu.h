/* deltanet_cpu.h — the fp32 pieces of the gated delta rule that the training reference
 * (deltanet_cpu.c) and the decode steps (deltanet_decode_cpu.c) share, so that both run the
 * same operations in the same order and a rollout's logprobs are the trainer's bit for bit.
 * Static inline helpers only; legend as deltanet.h. Not a public op: include it from those two. */
#ifndef GRPOD_DELTANET_CPU_H
#define GRPOD_DELTANET_CPU_H
#include <math.h>
#include <stddef.h>

static inline float dn_silu(float x) { return x / (1.0f + expf(-x)); }
static inline float dn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float dn_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); } /* torch's threshold 20 */

/* l2norm(x) into y, returning 1 / sqrt(Σx² + 1e-6) */
static inline float dn_l2n(float *y, const float *x, int n) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = 1.0f / sqrtf((float)ss + 1e-6f);
    for (int i = 0; i < n; i++) y[i] = x[i] * inv;
    return inv;
}

typedef struct {
    int Hk, Hv, Dk, Dv, Cc;
} dn_dims;

/* token t's q (scaled), k, v, e^g and β of value head h; g and b's input too (the backward's) */
static inline void dn_rule_inputs(float *q, float *k, const float **v, float *eg, float *beta, float *gout, float *bpre,
                                  const float *u, const float *a, const float *b, const float *A_log, const float *dt_bias,
                                  dn_dims n, int t, int h) {
    int kh = h / (n.Hv / n.Hk);
    const float *ut = u + (size_t)t * n.Cc;
    dn_l2n(q, ut + (size_t)kh * n.Dk, n.Dk);
    float sc = 1.0f / sqrtf((float)n.Dk);
    for (int i = 0; i < n.Dk; i++) q[i] *= sc;
    dn_l2n(k, ut + (size_t)n.Hk * n.Dk + (size_t)kh * n.Dk, n.Dk);
    *v = ut + (size_t)2 * n.Hk * n.Dk + (size_t)h * n.Dv;
    float g = -expf(A_log[h]) * dn_softplus(a[(size_t)t * n.Hv + h] + dt_bias[h]);
    *gout = g;
    *eg = expf(g);
    *bpre = b[(size_t)t * n.Hv + h];
    *beta = dn_sigmoid(*bpre);
}

/* One token of value head h: S = e^g S_prev (zeros when Sp is NULL), the delta update, o = S^T q.
 * S may be Sp (an update in place): each element is read before it is written. A zero Sp gives
 * the bits of a NULL one (e^g · 0 = +0, and adding ±0 to a sum that starts at +0 changes no bit). */
static inline void dn_rule_step(float *S, const float *Sp, float *o, const float *q, const float *k, const float *v, float eg,
                                float beta, int Dk, int Dv) {
    float d[1024];
    for (int j = 0; j < Dv; j++) d[j] = 0;
    for (int i = 0; i < Dk; i++)
        for (int j = 0; j < Dv; j++) {
            float s = Sp ? eg * Sp[(size_t)i * Dv + j] : 0.0f;
            S[(size_t)i * Dv + j] = s;
            d[j] += s * k[i];
        }
    for (int j = 0; j < Dv; j++) d[j] = beta * (v[j] - d[j]);
    for (int i = 0; i < Dk; i++)
        for (int j = 0; j < Dv; j++) S[(size_t)i * Dv + j] += k[i] * d[j];
    for (int j = 0; j < Dv; j++) o[j] = 0;
    for (int i = 0; i < Dk; i++)
        for (int j = 0; j < Dv; j++) o[j] += S[(size_t)i * Dv + j] * q[i];
}
#endif
