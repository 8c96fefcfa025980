/* matmul_cpu.c — fp32 reference of matmul.h: plain loops, blocked so that it is not slow.
 *
 * Forward works on 4x4 tiles of (row of x, row of W) dot products so each loaded vector feeds
 * four accumulators; each dot product sums in kernels/dot_cpu.h's order, the same in a tile or
 * alone, so a row's result does not depend on the batch around it. Rows are split across threads.
 * Backward: dinp rows are axpy sums over O (contiguous in I); dW rows over T. Each output row is
 * owned by one thread, so results do not depend on the thread count. */
#include "kernels/matmul.h"

#include <stddef.h>

#include "kernels/dot_cpu.h"
#include "kernels/swiglu.h"

void matmul_fwd_cpu(float *out, const float *inp, const float *w, const float *bias, int T, int I, int O) {
    int tb = (T + 3) / 4;
#pragma omp parallel for collapse(2) schedule(static)
    for (int tt = 0; tt < tb; tt++) {
        for (int ob = 0; ob < (O + 63) / 64; ob++) {
            int t0 = tt * 4, t1 = t0 + 4 < T ? t0 + 4 : T;
            int o0 = ob * 64, o1 = o0 + 64 < O ? o0 + 64 : O;
            for (int o = o0; o < o1; o += 4) {
                int on = o1 - o < 4 ? o1 - o : 4;
                if (t1 - t0 == 4 && on == 4) {
                    const float *x0 = inp + (size_t)t0 * I, *x1 = x0 + I, *x2 = x1 + I, *x3 = x2 + I;
                    const float *w0 = w + (size_t)o * I, *w1 = w0 + I, *w2 = w1 + I, *w3 = w2 + I;
                    float acc[4][4][DOT_LANES] = {{{0}}};
                    int i = 0;
                    for (; i + DOT_LANES <= I; i += DOT_LANES)
                        for (int l = 0; l < DOT_LANES; l++) {
                            float a0 = x0[i + l], a1 = x1[i + l], a2 = x2[i + l], a3 = x3[i + l];
                            float b0 = w0[i + l], b1 = w1[i + l], b2 = w2[i + l], b3 = w3[i + l];
                            acc[0][0][l] += a0 * b0;
                            acc[0][1][l] += a0 * b1;
                            acc[0][2][l] += a0 * b2;
                            acc[0][3][l] += a0 * b3;
                            acc[1][0][l] += a1 * b0;
                            acc[1][1][l] += a1 * b1;
                            acc[1][2][l] += a1 * b2;
                            acc[1][3][l] += a1 * b3;
                            acc[2][0][l] += a2 * b0;
                            acc[2][1][l] += a2 * b1;
                            acc[2][2][l] += a2 * b2;
                            acc[2][3][l] += a2 * b3;
                            acc[3][0][l] += a3 * b0;
                            acc[3][1][l] += a3 * b1;
                            acc[3][2][l] += a3 * b2;
                            acc[3][3][l] += a3 * b3;
                        }
                    const float *xs[4] = {x0, x1, x2, x3}, *ws[4] = {w0, w1, w2, w3};
                    for (int a = 0; a < 4; a++)
                        for (int b = 0; b < 4; b++) {
                            float r = dot_lanes_join(acc[a][b]);
                            for (int j = i; j < I; j++) r += xs[a][j] * ws[b][j];
                            out[(size_t)(t0 + a) * O + o + b] = r + (bias ? bias[o + b] : 0.0f);
                        }
                } else {
                    for (int t = t0; t < t1; t++)
                        for (int k = 0; k < on; k++)
                            out[(size_t)t * O + o + k] = dot_cpu(inp + (size_t)t * I, w + (size_t)(o + k) * I, I) +
                                (bias ? bias[o + k] : 0.0f);
                }
            }
        }
    }
}

void matmul_bwd_cpu(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w, int T, int I, int O) {
    if (dinp) {
#pragma omp parallel for schedule(static)
        for (int t = 0; t < T; t++) {
            float *dx = dinp + (size_t)t * I;
            const float *dy = dout + (size_t)t * O;
            for (int o = 0; o < O; o++) {
                float g = dy[o];
                const float *wr = w + (size_t)o * I;
#pragma omp simd
                for (int i = 0; i < I; i++) dx[i] += g * wr[i];
            }
        }
    }
    if (dw || dbias) {
#pragma omp parallel for schedule(static)
        for (int o = 0; o < O; o++) {
            float *dwr = dw ? dw + (size_t)o * I : NULL;
            float db = 0;
            for (int t = 0; t < T; t++) {
                float g = dout[(size_t)t * O + o];
                db += g;
                if (!dwr || g == 0.0f) continue;
                const float *x = inp + (size_t)t * I;
#pragma omp simd
                for (int i = 0; i < I; i++) dwr[i] += g * x[i];
            }
            if (dbias) dbias[o] += db;
        }
    }
}

void mlp_in_fwd_cpu(float *act, float *gate, float *up, const float *inp, const float *wg, const float *wu, int T, int I, int F) {
    matmul_fwd_cpu(gate, inp, wg, NULL, T, I, F);
    matmul_fwd_cpu(up, inp, wu, NULL, T, I, F);
    swiglu_fwd_cpu(act, gate, up, (long long)T * F);
}
