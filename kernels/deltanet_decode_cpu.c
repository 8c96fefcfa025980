/* deltanet_decode_cpu.c — fp32 reference of deltanet_decode.h: each run of tokens of one state
 * row walked in order, runs and channels / value heads in parallel (never a sum split). The
 * conv sums its taps in the order of deltanet_conv_fwd_cpu and the rule is deltanet_cpu.h's
 * dn_rule_step, so the bits are the training forward's. */
#include "kernels/deltanet_decode.h"

#include <string.h>

#include "kernels/deltanet_cpu.h"

void deltanet_conv_step_cpu(float *u, float *tail, const float *x, const float *w, const int *srow, int T, int Cc, int Kc) {
    int Kt = Kc - 1;
#pragma omp parallel for collapse(2)
    for (int t0 = 0; t0 < T; t0++)
        for (int c = 0; c < Cc; c++) {
            if (!deltanet_run_start(srow, t0) || srow[t0] < 0) continue;
            float *tl = tail + (size_t)srow[t0] * Kt * Cc + c; /* stride Cc */
            const float *wc = w + (size_t)c * Kc;
            for (int t = t0; t < T && srow[t] == srow[t0]; t++) {
                float xt = x[(size_t)t * Cc + c], s = 0;
                for (int j = 0; j < Kt; j++) s += wc[j] * tl[(size_t)j * Cc];
                s += wc[Kt] * xt;
                u[(size_t)t * Cc + c] = dn_silu(s);
                for (int j = 0; j + 1 < Kt; j++) tl[(size_t)j * Cc] = tl[(size_t)(j + 1) * Cc];
                if (Kt > 0) tl[(size_t)(Kt - 1) * Cc] = xt;
            }
        }
}

void deltanet_rule_step_cpu(float *o, float *state, const float *u, const float *a, const float *b, const float *A_log,
                            const float *dt_bias, const int *srow, int T, int Hk, int Hv, int Dk, int Dv) {
    dn_dims n = {Hk, Hv, Dk, Dv, 2 * Hk * Dk + Hv * Dv};
    size_t SZ = (size_t)Dk * Dv;
#pragma omp parallel for collapse(2)
    for (int t0 = 0; t0 < T; t0++)
        for (int h = 0; h < Hv; h++) {
            if (!deltanet_run_start(srow, t0) || srow[t0] < 0) continue;
            float q[1024], k[1024], eg, beta, g, bp;
            const float *v;
            float *S = state + ((size_t)srow[t0] * Hv + h) * SZ;
            for (int t = t0; t < T && srow[t] == srow[t0]; t++) {
                dn_rule_inputs(q, k, &v, &eg, &beta, &g, &bp, u, a, b, A_log, dt_bias, n, t, h);
                dn_rule_step(S, S, o + ((size_t)t * Hv + h) * Dv, q, k, v, eg, beta, Dk, Dv);
            }
        }
}
