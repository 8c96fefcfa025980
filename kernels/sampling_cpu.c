/* sampling_cpu.c — the reference of kernels/sampling.h, written plainly: per row, the
 * untruncated logsumexp of the logits times 1/temperature (the trainer's scaling, so a sampled
 * token's logprob is the trainer's bits), the eligible ids (not banned, inside the allow mask), the kept set by sorting (top_k,
 * min_p, top_p in that order), then Gumbel-max over the kept set. Rows in parallel. */
#include <stdlib.h>

#include "kernels/sampling.h"

static int desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int banned(const int *ban, int j) {
    for (int i = 1; ban && i <= ban[0]; i++)
        if (ban[i] == j) return 1;
    return 0;
}

/* One row; z (V) scratch for the scaled logits, s (V) scratch for sorting. */
static int draw_row(const float *x, const sample_params *p, const int *ban, const uint32_t *mask, int V, float *z, float *s,
                    float *lp) {
    float inv_t = 1.0f / (p->temperature > 0 ? p->temperature : 1.0f), mx = -INFINITY, mx_e = -INFINITY;
    for (int j = 0; j < V; j++) {
        z[j] = x[j] * inv_t;
        mx = fmaxf(mx, z[j]);
    }
    double sum = 0;
    for (int j = 0; j < V; j++) sum += exp((double)(z[j] - mx));
    float lse = mx + (float)log(sum);
    /* eligible: banned and masked ids become -inf in z (their logprob is never reported) */
    const int *bl = p->ban ? ban : NULL;
    int pick = -1;
    for (int j = 0; j < V; j++) {
        if ((bl && banned(bl, j)) || sampling_masked(mask, j)) {
            z[j] = -INFINITY;
            continue;
        }
        if (pick < 0 || z[j] > mx_e) {
            mx_e = z[j];
            pick = j;
        }
    }
    if (pick < 0) pick = 0; /* everything banned */
    if (p->temperature > 0) {
        float lo = -INFINITY; /* kept: z >= lo and (min_p) w >= min_p */
        int n = 0;
        for (int j = 0; j < V; j++)
            if (z[j] > -INFINITY) s[n++] = z[j];
        if (p->top_k > 0 && p->top_k < V && p->top_k < n) {
            qsort(s, (size_t)n, sizeof *s, desc);
            lo = s[p->top_k - 1];
        }
        if (p->top_p < 1.0f) {
            n = 0;
            double tot = 0;
            for (int j = 0; j < V; j++) {
                if (z[j] == -INFINITY || z[j] < lo) continue;
                float w = expf(z[j] - mx_e);
                if (p->min_p > 0 && w < p->min_p) continue;
                s[n++] = z[j];
                tot += w;
            }
            qsort(s, (size_t)n, sizeof *s, desc);
            double acc = 0, target = p->top_p * tot;
            for (int i = 0; i < n; i++) {
                acc += expf(s[i] - mx_e);
                if (acc >= target || i == n - 1) {
                    lo = s[i];
                    break;
                }
            }
        }
        float best = -INFINITY;
        for (int j = 0; j < V; j++) {
            if (z[j] == -INFINITY || z[j] < lo) continue;
            if (p->min_p > 0 && expf(z[j] - mx_e) < p->min_p) continue;
            float sc = z[j] + sampling_gumbel(p->key, j);
            if (sc > best) {
                best = sc;
                pick = j;
            }
        }
    }
    *lp = x[pick] * inv_t - lse;
    return pick;
}

void sample_cpu(int *tok, float *logprob, const float *logits, const sample_params *p, const int *ban, const uint32_t *allow,
                int R, int V) {
#pragma omp parallel
    {
        float *z = malloc((size_t)V * 2 * sizeof(float));
#pragma omp for schedule(static)
        for (int r = 0; r < R; r++) {
            if (!z) {
                tok[r] = 0;
                logprob[r] = 0;
                continue;
            }
            const uint32_t *mask = allow && p[r].allow > 0 ? allow + (size_t)(p[r].allow - 1) * sampling_mask_words(V) : NULL;
            tok[r] = draw_row(logits + (size_t)r * V, &p[r], ban, mask, V, z, z + V, &logprob[r]);
        }
        free(z);
    }
}
