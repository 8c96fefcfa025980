/* test_sampling.c — kernels/sampling.h on the CPU: per-row draws follow the kept distribution
 * (chi-square over 20k keys for plain temperature, top_k, top_p, min_p, a combination and a ban
 * list, against probabilities computed here by sorting), nothing outside the kept set is drawn,
 * the logprob is that of the untruncated softmax(logits/T), greedy is the argmax of the eligible
 * ids, and draws are a function of (logits, key) alone. Allow masks (constrained decoding): a
 * mask is a ban of its complement, draw for draw; masked rows draw inside their mask, greedy
 * is the masked argmax, and rows without a mask draw what they draw when no row has one. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/sampling.h"
#include "tests/unit/check.h"
#include "tests/unit/sampling_expect.h"

enum { V = 10, NS = 20000 };

static uint64_t mix(uint64_t i) { return sampling_mix(i * 0x9E3779B97F4A7C15ULL + 12345); }

TEST(test_distributions) {
    float x[V];
    unsigned long long s = 11;
    for (int j = 0; j < V; j++) x[j] = check_randf(&s, 2.0f);
    float *rows = malloc(sizeof(float) * V * NS), *lp = malloc(sizeof(float) * NS);
    int *tok = malloc(sizeof(int) * NS);
    sample_params *pr = malloc(sizeof *pr * NS);
    for (int i = 0; i < NS; i++) memcpy(rows + (size_t)i * V, x, sizeof x);
    int ban[] = {2, 3, 7};
    struct {
        float t, top_p, min_p;
        int top_k, ban;
    } cases[] = {
        {1.0f, 1, 0, 0, 0},    {0.6f, 1, 0, 0, 0},        {1.0f, 1, 0, 3, 0}, {1.0f, 0.7f, 0, 0, 0},
        {1.0f, 1, 0.2f, 0, 0}, {0.8f, 0.8f, 0.05f, 6, 0}, {1.0f, 1, 0, 0, 1}, {1.3f, 0.9f, 0, 4, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int i = 0; i < NS; i++)
            pr[i] = (sample_params){.key = mix(i + 1000 * c),
                                    .temperature = cases[c].t,
                                    .top_p = cases[c].top_p,
                                    .min_p = cases[c].min_p,
                                    .top_k = cases[c].top_k,
                                    .ban = cases[c].ban};
        sample_cpu(tok, lp, rows, pr, ban, NULL, NS, V);
        double p[V];
        sampling_expected(x, V, &pr[0], ban, p);
        int out, df;
        double c2 = sampling_chi2(tok, NS, p, V, &out, &df);
        CHECK_MSG(out == 0, "case %zu: %d draws outside the kept set", c, out);
        CHECK_MSG(c2 < sampling_chi2_q4(df), "case %zu: chi-square %.2f (df %d) over 20k draws", c, c2, df);
        double mx = -INFINITY, sum = 0, err = 0;
        float T = cases[c].t;
        for (int j = 0; j < V; j++) mx = fmax(mx, x[j] / T);
        for (int j = 0; j < V; j++) sum += exp(x[j] / T - mx);
        for (int i = 0; i < NS; i++) err = fmax(err, fabs(lp[i] - (x[tok[i]] / T - mx - log(sum))));
        CHECK_MSG(err < 1e-5, "case %zu: logprob (untruncated) error %.3g", c, err);
    }
    free(rows);
    free(lp);
    free(tok);
    free(pr);
}

TEST(test_greedy_and_determinism) {
    enum { R = 16, VB = 5000 };
    float *x = malloc(sizeof(float) * R * VB), lp[R], lp2[R];
    check_fill(x, (size_t)R * VB, 21, 4.0f);
    sample_params pr[R];
    int tok[R], tok2[R];
    for (int r = 0; r < R; r++) pr[r] = (sample_params){.key = mix(r), .temperature = 0, .top_p = 1};
    int ban[3] = {2, 0, 0};
    for (int r = 0; r < 4; r++) { /* rows 0..3 ban their own argmax */
        int am = 0;
        for (int j = 1; j < VB; j++)
            if (x[(size_t)r * VB + j] > x[(size_t)r * VB + am]) am = j;
        if (r < 2) ban[1 + r] = am;
    }
    pr[0].ban = pr[1].ban = 1;
    sample_cpu(tok, lp, x, pr, ban, NULL, R, VB);
    for (int r = 0; r < R; r++) {
        int am = -1;
        for (int j = 0; j < VB; j++) {
            if (pr[r].ban && (j == ban[1] || j == ban[2])) continue;
            if (am < 0 || x[(size_t)r * VB + j] > x[(size_t)r * VB + am]) am = j;
        }
        CHECK_EQ_INT(tok[r], am);
        CHECK(lp[r] <= 0 && lp[r] > -20);
    }
    for (int r = 0; r < R; r++) pr[r].temperature = 1.0f, pr[r].top_k = r % 3 ? 0 : 50, pr[r].top_p = r % 2 ? 0.9f : 1;
    sample_cpu(tok, lp, x, pr, ban, NULL, R, VB);
    sample_cpu(tok2, lp2, x, pr, ban, NULL, R, VB);
    for (int r = 0; r < R; r++) {
        CHECK_EQ_INT(tok[r], tok2[r]);
        CHECK(lp[r] == lp2[r]);
    }
    /* a row's draw does not depend on the other rows: row 5 alone gives the same token */
    sample_cpu(tok2, lp2, x + 5 * VB, pr + 5, ban, NULL, 1, VB);
    CHECK_EQ_INT(tok2[0], tok[5]);
    /* other keys draw differently somewhere */
    int diff = 0;
    for (int r = 0; r < R; r++) pr[r].key = mix(r + 100);
    sample_cpu(tok2, lp2, x, pr, ban, NULL, R, VB);
    for (int r = 0; r < R; r++) diff += tok[r] != tok2[r];
    CHECK_MSG(diff > 0, "new keys drew the same %d tokens", R);
    free(x);
}

/* masks (R, W) with bit j set where keep(r, j); random density per row */
static uint32_t *random_masks(int R, int VB, unsigned long long seed, int per_mille) {
    int W = sampling_mask_words(VB);
    uint32_t *m = calloc((size_t)R * W, 4);
    for (int r = 0; r < R; r++)
        for (int j = 0; j < VB; j++)
            if ((int)(sampling_mix(seed + (unsigned long long)r * VB + j) % 1000) < per_mille)
                m[(size_t)r * W + (j >> 5)] |= 1u << (j & 31);
    return m;
}

TEST(test_allow_masks) {
    enum { R = 16, VB = 5000 };
    /* (1) the mask of every id but the ban list draws what the ban list draws, 20k keys over V */
    float x[V];
    unsigned long long s = 29;
    for (int j = 0; j < V; j++) x[j] = check_randf(&s, 2.0f);
    int ban[] = {3, 2, 3, 7};
    uint32_t keep = 0;
    for (int j = 0; j < V; j++) keep |= (j == 2 || j == 3 || j == 7 ? 0u : 1u) << j;
    int *t1 = malloc(sizeof(int) * NS), *t2 = malloc(sizeof(int) * NS);
    float *l1 = malloc(sizeof(float) * NS), *l2 = malloc(sizeof(float) * NS), *rows = malloc(sizeof(float) * V * NS);
    sample_params *pb = malloc(sizeof *pb * NS), *pm = malloc(sizeof *pm * NS);
    for (int i = 0; i < NS; i++) {
        memcpy(rows + (size_t)i * V, x, sizeof x);
        pb[i] = (sample_params){
            .key = mix(i + 777), .temperature = 0.9f, .top_p = i % 2 ? 0.8f : 1, .top_k = i % 3 ? 0 : 4, .ban = 1};
        pm[i] = pb[i];
        pm[i].ban = 0;
        pm[i].allow = 1;
    }
    sample_cpu(t1, l1, rows, pb, ban, NULL, NS, V);
    sample_cpu(t2, l2, rows, pm, NULL, &keep, NS, V);
    int same = 0;
    for (int i = 0; i < NS; i++) same += t1[i] == t2[i] && l1[i] == l2[i];
    CHECK_MSG(same == NS, "mask vs ban: %d of %d draws equal", same, NS);
    for (int i = 0; i < NS; i++) pm[i].top_p = 1, pm[i].top_k = 0;
    sample_cpu(t2, l2, rows, pm, NULL, &keep, NS, V);
    double p[V];
    sample_params one = pb[0];
    one.top_p = 1, one.top_k = 0;
    sampling_expected(x, V, &one, ban, p);
    int out, df;
    double c2 = sampling_chi2(t2, NS, p, V, &out, &df);
    CHECK_MSG(out == 0, "%d draws outside the mask", out);
    CHECK_MSG(c2 < sampling_chi2_q4(df), "masked draws: chi-square %.2f (df %d)", c2, df);
    /* (2) R rows of VB: even rows masked (8% of ids), odd rows not */
    float *xb = malloc(sizeof(float) * R * VB), lp[R], lp0[R];
    check_fill(xb, (size_t)R * VB, 31, 4.0f);
    uint32_t *m = random_masks(R / 2, VB, 5, 80);
    int W = sampling_mask_words(VB), tok[R], tok0[R];
    sample_params pr[R], p0[R];
    for (int pass = 0; pass < 2; pass++) {
        for (int r = 0; r < R; r++) {
            pr[r] = (sample_params){
                .key = mix(r + 50), .temperature = pass ? 1.0f : 0, .top_p = r % 4 == 1 ? 0.9f : 1, .top_k = r % 4 == 3 ? 40 : 0};
            p0[r] = pr[r];
            if (r % 2 == 0) pr[r].allow = r / 2 + 1;
        }
        sample_cpu(tok, lp, xb, pr, NULL, m, R, VB);
        sample_cpu(tok0, lp0, xb, p0, NULL, NULL, R, VB);
        for (int r = 0; r < R; r++) {
            if (r % 2) {
                CHECK_MSG(tok[r] == tok0[r] && lp[r] == lp0[r], "row %d without a mask drew %d, alone %d", r, tok[r], tok0[r]);
                continue;
            }
            const uint32_t *mr = m + (size_t)(r / 2) * W;
            CHECK_MSG(!sampling_masked(mr, tok[r]), "row %d drew %d outside its mask", r, tok[r]);
            if (pass) continue;
            int am = -1;
            for (int j = 0; j < VB; j++)
                if (!sampling_masked(mr, j) && (am < 0 || xb[(size_t)r * VB + j] > xb[(size_t)r * VB + am])) am = j;
            CHECK_EQ_INT(tok[r], am);
            CHECK(fabsf(lp[r] - lp0[r] - (xb[(size_t)r * VB + am] - xb[(size_t)r * VB + tok0[r]])) < 1e-4f); /* untruncated */
        }
    }
    free(t1), free(t2), free(l1), free(l2), free(rows), free(pb), free(pm), free(xb), free(m);
}

int main(void) {
    RUN(test_distributions);
    RUN(test_allow_masks);
    RUN(test_greedy_and_determinism);
    return CHECK_DONE();
}
