/* test_update_onpolicy.c — the on-policy shortcut of eng_update (engine/train/update.c): with one
 * epoch of one mini-batch and no client-given old logprobs, the old pass is skipped and the
 * policy pass's own logprobs stand in for it. Checked against the long way round — the same
 * updates on a second engine given old logprobs computed by eng_logprobs — which must land on
 * the same weights; and against a run whose given old logprobs are off, which must not. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "default_engine.h"
#include "common/err.h"
#include "engine/engine.h"

#define MODEL TEST_TMP "/grpod_test_onpolicy_model"

static eng *open_default(void) { return default_engine(MODEL); }

static const int prompt[] = {84, 104, 101, 32, 97, 110, 115, 119, 101, 114, 32, 105, 115, 58};
#define NP ((int)(sizeof prompt / sizeof prompt[0]))
static int r0[7] = {52, 50, 46, 10, 258, 33, 63}, r1[5] = {120, 121, 122, 32, 49}, r2[6] = {55, 55, 55, 56, 57, 48},
           r3[3] = {65, 66, 67};
static const int *resp[4] = {r0, r1, r2, r3};
static int R[4] = {7, 5, 6, 3};
static float rew[4] = {1.0f, 0.0f, 0.7f, 0.2f};

/* Runs 3 updates on e; old logprobs given by eng_logprobs (+ bias) when given != 0. Returns
 * the logprobs afterwards (caller frees) and the last update's ratio_mean / ms_old. */
static float **train(eng *e, int given, float bias, double *ratio_mean) {
    eng_update_group g = {.prompt = prompt, .P = NP, .n = 4, .resp = resp, .R = R, .reward = rew};
    loss_config a;
    loss_config_default(&a);
    a.kl_coef = 0.01f;
    a.use_rollout_logprobs = given;
    eng_optim o;
    eng_optim_default(&o);
    o.lr = 2e-3f;
    for (int step = 0; step < 3; step++) {
        float **old = NULL;
        if (given) {
            if (eng_logprobs(e, &g, 1, 0, 1.0f, 1 << 20, &old)) return NULL;
            for (int i = 0; i < 4; i++)
                for (int t = 0; t < R[i]; t++) old[i][t] += bias;
            g.old_logprobs = (const float *const *)old;
        }
        eng_update_result u;
        int rc = eng_update(e, &g, 1, &a, &o, 1 << 20, &u, NULL, NULL);
        if (old) eng_logprobs_free(old, &g, 1);
        if (rc) {
            printf("update: %s\n", err_msg());
            return NULL;
        }
        *ratio_mean = u.ratio_mean;
    }
    float **lp;
    return eng_logprobs(e, &g, 1, 0, 1.0f, 1 << 20, &lp) ? NULL : lp;
}

static double max_diff(float **a, float **b) {
    double m = 0;
    for (int i = 0; i < 4; i++)
        for (int t = 0; t < R[i]; t++) m = fmax(m, fabs((double)a[i][t] - b[i][t]));
    return m;
}

TEST(shortcut_equals_the_old_pass) {
    eng *e1 = open_default(), *e2 = open_default(), *e3 = open_default();
    CHECK(e1 && e2 && e3);
    eng_update_group g = {.prompt = prompt, .P = NP, .n = 4, .resp = resp, .R = R};
    float **before;
    CHECK(eng_logprobs(e1, &g, 1, 0, 1.0f, 1 << 20, &before) == 0);
    double rm1 = 0, rm2 = 0, rm3 = 0;
    float **short_way = train(e1, 0, 0, &rm1), **long_way = train(e2, 1, 0, &rm2), **off = train(e3, 1, 0.05f, &rm3);
    CHECK(short_way && long_way && off);
    double moved = max_diff(before, short_way), same = max_diff(short_way, long_way), differs = max_diff(short_way, off);
    printf("  logprobs moved by %.3g; shortcut vs old pass %.3g; vs biased old logprobs %.3g; ratio_mean %.9f %.9f\n", moved,
           same, differs, rm1, rm2);
    CHECK(moved > 1e-2);
    CHECK(same == 0);
    CHECK(differs > 1e-4);
    CHECK(fabs(rm1 - 1.0) < 1e-6);
    CHECK(rm2 == 1.0);
    eng_logprobs_free(before, &g, 1);
    eng_logprobs_free(short_way, &g, 1);
    eng_logprobs_free(long_way, &g, 1);
    eng_logprobs_free(off, &g, 1);
    eng_close(e1);
    eng_close(e2);
    eng_close(e3);
}

int main(void) {
    system("rm -rf " MODEL);
    RUN(shortcut_equals_the_old_pass);
    return CHECK_DONE();
}
