/* test_update_split.c — eng_update and eng_logprobs choose the three-phase schedule
 * (engine/model/split.h) for a group larger than max_tokens_per_micro_batch, and land where the
 * one-graph layout does: two updates of two epochs each (a real old pass and a reference pass,
 * both forward-only split; an entropy bonus; seq-mean-token-mean, whose per-response
 * normalisers span the mini-batch) at a budget that splits every group vs one that packs both
 * groups into one micro-batch: the same loss and gradient norm, and the same logprobs after.
 * Tolerances 1e-4: after the first AdamW step the two runs' weights differ by fp32 rounding,
 * which the second step's lr 2e-3 carries into the metrics. (The model-level equality, 1e-5, is
 * tests/unit/test_equivalence.c.) The same with loss masks (context tokens inside responses, one
 * response all context); and a mask of all ones gives the unmasked updates bit for bit. The same
 * on hybrid models (qwen3_5_text; qwen3_next with masks and MoE layers), whose response
 * micro-batches start from the prompt's recurrent states (tests/unit/test_hybrid_split.c: the
 * model-level equality, 1e-5). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "default_engine.h"
#include "engine/engine.h"
#include "common/err.h"

#define MODEL TEST_TMP "/grpod_test_split_model"

/* dir NULL: the default model */
static eng *open_model(const char *dir) {
    if (!dir) return default_engine(MODEL);
    eng *e;
    eng_open_opts o = {.model_dir = dir, .backend = "cpu"};
    if (!eng_open(&o, &e)) return e;
    printf("%s: %s\n", dir, err_msg());
    return NULL;
}
static eng *open_default(void) { return open_model(NULL); }

static const int prompt[] = {84, 104, 101, 32, 97, 110, 115, 119, 101, 114, 32, 105, 115, 58, 32, 116, 104, 101};
#define NP ((int)(sizeof prompt / sizeof prompt[0]))
static int r0[7] = {52, 50, 46, 10, 258, 33, 63}, r1[5] = {120, 121, 122, 32, 49}, r2[6] = {55, 55, 55, 56, 57, 48}, r3[1] = {65},
           r4[4] = {70, 71, 72, 73}, r5[2] = {97, 98};
static const int *resp_a[4] = {r0, r1, r2, r3}, *resp_b[3] = {r4, r5, r1};
static int R_a[4] = {7, 5, 6, 1}, R_b[3] = {4, 2, 5};
static float rew_a[4] = {1.0f, 0.0f, 0.7f, 0.2f}, rew_b[3] = {0.1f, 0.9f, 0.4f};
/* loss masks: context tokens (0) inside responses; r3's only token is context (dropped) */
static const unsigned char m0[7] = {1, 1, 0, 0, 1, 0, 1}, m1[5] = {0, 1, 1, 1, 1}, m2[6] = {1, 0, 0, 0, 1, 1}, m3[1] = {0},
                           m4[4] = {1, 1, 0, 1}, m5[2] = {1, 0}, ones[7] = {1, 1, 1, 1, 1, 1, 1};
static const unsigned char *mask_a[4] = {m0, m1, m2, m3}, *mask_b[3] = {m4, m5, m1}, *ones_a[4] = {ones, ones, ones, ones},
                           *ones_b[3] = {ones, ones, ones};
enum { NO_MASK, MASKED, ALL_ONES };

/* Two updates (two epochs each: a real old pass; kl: a reference pass; entropy bonus;
 * seq-mean-token-mean: per-response normalisers over the mini-batch) at budget mt, then the
 * logprobs at the same budget. */
static float **train(eng *e, long long mt, int masks, eng_update_result *u) {
    eng_update_group g[2] = {{.prompt = prompt, .P = NP, .n = 4, .resp = resp_a, .R = R_a, .reward = rew_a},
                             {.prompt = prompt + 3, .P = NP - 3, .n = 3, .resp = resp_b, .R = R_b, .reward = rew_b}};
    if (masks != NO_MASK) {
        g[0].loss_mask = masks == MASKED ? mask_a : ones_a;
        g[1].loss_mask = masks == MASKED ? mask_b : ones_b;
    }
    loss_config a;
    loss_config_default(&a);
    a.kl_coef = 0.01f;
    a.entropy_coeff = 0.01f;
    a.ppo_epochs = 2;
    a.agg = AGG_SEQ_MEAN_TOKEN_MEAN;
    eng_optim o;
    eng_optim_default(&o);
    o.lr = 2e-3f;
    for (int step = 0; step < 2; step++)
        if (eng_update(e, g, 2, &a, &o, mt, u, NULL, NULL)) {
            printf("update: %s\n", err_msg());
            return NULL;
        }
    float **lp;
    return eng_logprobs(e, g, 2, 0, 1.0f, mt, &lp) ? NULL : lp;
}

static void split_case(const char *dir, int masks) {
    eng *e1 = open_model(dir), *e2 = open_model(dir);
    CHECK(e1 && e2);
    if (!e1 || !e2) return;
    eng_update_result u1, u2;
    float **a = train(e1, 1 << 20, masks, &u1), **b = train(e2, 8, masks, &u2); /* 8: every group split */
    CHECK(a && b);
    if (a && b) {
        double d = 0;
        int lens[7] = {7, 5, 6, 1, 4, 2, 5};
        for (int i = 0; i < 7; i++)
            for (int t = 0; t < lens[i]; t++) d = fmax(d, fabs((double)a[i][t] - b[i][t]));
        printf("  %s: micro-batches %d vs %d; loss %.9g vs %.9g; grad norm %.9g vs %.9g; logprobs after max |d| %.2e\n",
               dir ? dir : "default model", u1.micro_batches, u2.micro_batches, u1.loss, u2.loss, u1.grad_norm, u2.grad_norm, d);
        CHECK_EQ_INT(u1.micro_batches, 2); /* both groups in one micro-batch per epoch */
        CHECK(u2.micro_batches > 4);
        CHECK_CLOSE(u1.loss, u2.loss, 1e-6, 1e-4);
        CHECK_CLOSE(u1.grad_norm, u2.grad_norm, 1e-6, 1e-4);
        CHECK_MSG(d <= 1e-4, "logprobs after the updates differ by %.3g", d);
    }
    eng_update_group g[2] = {{.prompt = prompt, .P = NP, .n = 4, .resp = resp_a, .R = R_a},
                             {.prompt = prompt + 3, .P = NP - 3, .n = 3, .resp = resp_b, .R = R_b}};
    if (a) eng_logprobs_free(a, g, 2);
    if (b) eng_logprobs_free(b, g, 2);
    eng_close(e1);
    eng_close(e2);
}

TEST(update_split_by_the_budget_equals_one_graph) { split_case(NULL, NO_MASK); }
TEST(update_split_with_loss_masks) { split_case(NULL, MASKED); }
/* hybrid models: each response micro-batch starts from the prompt's DeltaNet states (model/split.h) */
TEST(update_split_hybrid) {
    split_case("tests/fixtures/data/qwen3_5_text", NO_MASK);
    split_case("tests/fixtures/data/qwen3_next", MASKED);
}

/* A loss mask of all ones trains exactly what no mask does: the same loss, gradient norm and
 * weights (the logprobs after), bit for bit, packed and split; and a real mask changes them. */
TEST(update_all_ones_mask_is_no_mask) {
    for (int k = 0; k < 2; k++) {
        long long mt = k ? 8 : 1 << 20;
        eng *e[3] = {open_default(), open_default(), open_default()};
        CHECK(e[0] && e[1] && e[2]);
        if (!e[0] || !e[1] || !e[2]) return;
        eng_update_result u[3];
        float **lp[3];
        for (int i = 0; i < 3; i++) lp[i] = train(e[i], mt, i, &u[i]);
        CHECK(lp[0] && lp[1] && lp[2]);
        int lens[7] = {7, 5, 6, 1, 4, 2, 5}, same = 1, moved = 0;
        for (int i = 0; lp[0] && lp[1] && lp[2] && i < 7; i++) {
            same &= !memcmp(lp[0][i], lp[2][i], (size_t)lens[i] * sizeof(float));
            moved |= !!memcmp(lp[0][i], lp[1][i], (size_t)lens[i] * sizeof(float));
        }
        printf("  budget %lld: loss no mask %.9g, all ones %.9g, masked %.9g\n", mt, u[0].loss, u[2].loss, u[1].loss);
        CHECK(same && moved);
        CHECK(!memcmp(&u[0].loss, &u[2].loss, sizeof u[0].loss) && !memcmp(&u[0].grad_norm, &u[2].grad_norm, sizeof(double)));
        CHECK(!memcmp(&u[0].kl, &u[2].kl, sizeof(double)) && !memcmp(&u[0].entropy, &u[2].entropy, sizeof(double)));
        eng_update_group g[2] = {{.prompt = prompt, .P = NP, .n = 4, .resp = resp_a, .R = R_a},
                                 {.prompt = prompt + 3, .P = NP - 3, .n = 3, .resp = resp_b, .R = R_b}};
        for (int i = 0; i < 3; i++) {
            if (lp[i]) eng_logprobs_free(lp[i], g, 2);
            eng_close(e[i]);
        }
    }
}

int main(void) {
    system("rm -rf " MODEL);
    RUN(update_split_by_the_budget_equals_one_graph);
    RUN(update_split_with_loss_masks);
    RUN(update_split_hybrid);
    RUN(update_all_ones_mask_is_no_mask);
    return CHECK_DONE();
}
