/* logprob_cpu.c — fp32 reference of logprob.h: one predicted token per iteration, its V logits
 * in a private buffer. Forward is parallel over m; backward computes dlogits per m in parallel
 * (M × V floats in blocks of 64 rows), then accumulates dh and dW by row ownership so the sums
 * are independent of the thread count. */
#include "kernels/logprob.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dot_cpu.h"

/* z (V) for one hidden row; returns logsumexp(z) and writes E[z] under softmax(z). */
static float row_logits(float *z, const float *hrow, const float *w, int C, int V, float inv_t, float *ez) {
    float mx = -INFINITY;
    for (int j = 0; j < V; j++) {
        z[j] = dot_cpu(hrow, w + (size_t)j * C, C) * inv_t;
        if (z[j] > mx) mx = z[j];
    }
    double sum = 0, sz = 0;
    for (int j = 0; j < V; j++) {
        double e = exp((double)(z[j] - mx));
        sum += e;
        sz += e * z[j];
    }
    if (ez) *ez = (float)(sz / sum);
    return mx + (float)log(sum);
}

void logprob_fwd_cpu(float *logp, float *ent, const float *h, const int *out_pos, const int *out_tok, const float *w, int M,
                     int C, int V, float temperature) {
    float inv_t = 1.0f / temperature;
#pragma omp parallel
    {
        float *z = malloc((size_t)V * sizeof(float));
#pragma omp for schedule(dynamic, 4)
        for (int m = 0; m < M; m++) {
            float ez;
            float lse = row_logits(z, h + (size_t)out_pos[m] * C, w, C, V, inv_t, &ez);
            logp[m] = z[out_tok[m]] - lse;
            if (ent) ent[m] = lse - ez;
        }
        free(z);
    }
}

/* The best id after (prev_z, prev_id) in the order (z desc, id asc); -1 when none is left. */
static int next_best(const float *z, int V, float prev_z, int prev_id) {
    int best = -1;
    for (int j = 0; j < V; j++) {
        int after = z[j] < prev_z || (z[j] == prev_z && j > prev_id);
        if (after && (best < 0 || z[j] > z[best])) best = j;
    }
    return best;
}

void logprob_top_cpu(int *ids, float *lps, const float *h, const int *out_pos, const float *w, int M, int C, int V,
                     float temperature, int K) {
    float inv_t = 1.0f / temperature;
#pragma omp parallel
    {
        float *z = malloc((size_t)V * sizeof(float));
#pragma omp for schedule(dynamic, 4)
        for (int m = 0; m < M; m++) {
            float ez, pz = INFINITY;
            float lse = row_logits(z, h + (size_t)out_pos[m] * C, w, C, V, inv_t, &ez);
            int pj = -1;
            for (int k = 0; k < K; k++) {
                int j = pj == -2 ? -1 : next_best(z, V, pz, pj);
                ids[(size_t)m * K + k] = j;
                lps[(size_t)m * K + k] = j >= 0 ? z[j] - lse : -INFINITY;
                if (j < 0) pj = -2;
                else {
                    pz = z[j];
                    pj = j;
                }
            }
        }
        free(z);
    }
}

void logprob_bwd_cpu(float *dh, float *dw, const float *dlogp, const float *dent, const float *h, const int *out_pos,
                     const int *out_tok, const float *w, int M, int C, int V, float temperature) {
    float inv_t = 1.0f / temperature;
    enum { BLK = 64 };
    float *dz = malloc((size_t)BLK * V * sizeof(float));
    for (int m0 = 0; m0 < M; m0 += BLK) {
        int mb = M - m0 < BLK ? M - m0 : BLK;
#pragma omp parallel for schedule(dynamic, 1)
        for (int i = 0; i < mb; i++) {
            int m = m0 + i;
            float *z = dz + (size_t)i * V, ez;
            float lse = row_logits(z, h + (size_t)out_pos[m] * C, w, C, V, inv_t, &ez);
            float gl = dlogp[m], ge = dent ? dent[m] : 0.0f;
            for (int j = 0; j < V; j++) {
                float p = expf(z[j] - lse);
                z[j] = (-gl * p - ge * p * (z[j] - ez)) * inv_t;
            }
            z[out_tok[m]] += gl * inv_t;
        }
/* dh rows: a hidden row may be the source of several m (never in grpod's packing, but
         * allowed), so rows are accumulated sequentially per m, each row's C-loop vectorised. */
#pragma omp parallel for schedule(static)
        for (int c0 = 0; c0 < C; c0 += 16) {
            int c1 = c0 + 16 < C ? c0 + 16 : C;
            for (int i = 0; i < mb; i++) {
                const float *zi = dz + (size_t)i * V;
                float *dhr = dh + (size_t)out_pos[m0 + i] * C;
                for (int j = 0; j < V; j++) {
                    float g = zi[j];
                    const float *wr = w + (size_t)j * C;
                    for (int c = c0; c < c1; c++) dhr[c] += g * wr[c];
                }
            }
        }
        if (dw) {
#pragma omp parallel for schedule(static)
            for (int j = 0; j < V; j++) {
                float *dwr = dw + (size_t)j * C;
                for (int i = 0; i < mb; i++) {
                    float g = dz[(size_t)i * V + j];
                    const float *hr = h + (size_t)out_pos[m0 + i] * C;
#pragma omp simd
                    for (int c = 0; c < C; c++) dwr[c] += g * hr[c];
                }
            }
        }
    }
    free(dz);
}

void lm_head_rows_cpu(float *logits, const float *h, const int *pos, const float *w, int R, int C, int V) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int r = 0; r < R; r++)
        for (int j = 0; j < V; j++) logits[(size_t)r * V + j] = dot_cpu(h + (size_t)pos[r] * C, w + (size_t)j * C, C);
}
