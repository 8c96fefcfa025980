/* sampling_expect.h — the kept distribution of kernels/sampling.h computed independently (by
 * sorting), and a chi-square of draws against it, for the CPU (tests/unit/test_sampling.c) and
 * CUDA (tests/gpu/test_sampling.c) sampling tests. Small vocabularies only (V <= 64). */
#ifndef GRPOD_SAMPLING_EXPECT_H
#define GRPOD_SAMPLING_EXPECT_H
#include <math.h>
#include <string.h>

#include "kernels/sampling.h"

enum { SE_VMAX = 64 };

/* p (V): the probability of each id under pr (temperature, bans, top_k, then min_p relative to
 * the max, then top_p of the remaining mass); zero outside the kept set. ban = { n, ids... }. */
static inline void sampling_expected(const float *x, int V, const sample_params *pr, const int *ban, double *p) {
    double z[SE_VMAX], w[SE_VMAX], mx = -INFINITY;
    int ord[SE_VMAX], n = 0;
    for (int j = 0; j < V; j++) {
        z[j] = x[j] / pr->temperature;
        int b = 0;
        for (int i = 1; pr->ban && ban && i <= ban[0]; i++) b |= ban[i] == j;
        if (b) continue;
        ord[n++] = j;
        if (z[j] > mx) mx = z[j];
    }
    for (int a = 0; a < n; a++) /* insertion sort, descending */
        for (int b = a; b > 0 && z[ord[b]] > z[ord[b - 1]]; b--) {
            int t = ord[b];
            ord[b] = ord[b - 1];
            ord[b - 1] = t;
        }
    if (pr->top_k > 0 && pr->top_k < n) n = pr->top_k;
    for (int i = 0; i < n; i++) w[i] = exp(z[ord[i]] - mx);
    if (pr->min_p > 0) {
        int k = 0;
        while (k < n && w[k] >= pr->min_p) k++;
        n = k;
    }
    if (pr->top_p < 1.0f) {
        double tot = 0, acc = 0;
        for (int i = 0; i < n; i++) tot += w[i];
        int k = 0;
        while (k < n) {
            acc += w[k++];
            if (acc >= pr->top_p * tot) break;
        }
        n = k;
    }
    double s = 0;
    memset(p, 0, sizeof(double) * V);
    for (int i = 0; i < n; i++) s += w[i];
    for (int i = 0; i < n; i++) p[ord[i]] = w[i] / s;
}

/* Chi-square of n draws tok against p (V); *outside counts draws where p == 0; *df kept ids - 1. */
static inline double sampling_chi2(const int *tok, int n, const double *p, int V, int *outside, int *df) {
    int cnt[SE_VMAX] = {0};
    double c = 0;
    *outside = 0;
    *df = -1;
    for (int i = 0; i < n; i++) {
        if (tok[i] < 0 || tok[i] >= V || p[tok[i]] == 0) (*outside)++;
        else cnt[tok[i]]++;
    }
    for (int j = 0; j < V; j++) {
        if (p[j] == 0) continue;
        (*df)++;
        double e = n * p[j];
        c += (cnt[j] - e) * (cnt[j] - e) / e;
    }
    return c;
}

/* The p = 1e-4 quantile of chi-square with df degrees of freedom (df 1..9). */
static inline double sampling_chi2_q4(int df) {
    static const double q[] = {0, 15.1, 18.4, 21.1, 23.5, 25.7, 27.9, 29.9, 31.8, 33.7};
    return df >= 1 && df <= 9 ? q[df] : NAN;
}
#endif
