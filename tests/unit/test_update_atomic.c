/* test_update_atomic.c — eng_update is all or nothing (engine/train/update.c), and the same update
 * gives the same bits (what replay after a crash relies on):
 *   - a non-finite advantage in the second mini-batch fails the update with GE_NON_FINITE after
 *     its first optimizer step ran; the weights, AdamW state, optimizer step and policy_version
 *     are restored bit for bit (the next update equals the one on an untouched engine);
 *   - eng_update_undo takes back a successful update exactly;
 *   - the same two updates on 1 and on 3 CPU threads give bit-identical weights;
 *   - without a safety copy (snapshot "none", the plan's choice when no memory holds one) a
 *     failure before the first step leaves the state as it was, and one after it, or a take-back,
 *     says GE_STATE_LOST (the daemon then halts and recovers by replay). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/engine.h"
#include "common/err.h"

#define MODEL TEST_TMP "/grpod_test_atomic_model"

static eng *open_snap(int threads, const char *snapshot) {
    if (eng_ensure_default_model(MODEL)) {
        printf("default model: %s\n", err_msg());
        return NULL;
    }
    eng *e;
    eng_open_opts o = {.model_dir = MODEL, .backend = "cpu", .n_threads = threads, .snapshot = snapshot};
    return eng_open(&o, &e) ? NULL : e;
}
static eng *open_default(int threads) { return open_snap(threads, NULL); }

static const int p0[] = {84, 104, 101, 32, 97, 110}, p1[] = {115, 119, 101, 114};
static int r0[7] = {52, 50, 46, 10, 258, 33, 63}, r1[5] = {120, 121, 122, 32, 49}, r2[6] = {55, 55, 55, 56, 57, 48},
           r3[3] = {65, 66, 67};
static const int *resp0[2] = {r0, r1}, *resp1[2] = {r2, r3};
static int R0[2] = {7, 5}, R1[2] = {6, 3};

/* Two groups, one mini-batch each: two optimizer steps per update. */
static int update(eng *e, float adv1, eng_update_result *u) {
    float a0[2] = {0.8f, -0.8f}, a1[2] = {adv1, -0.5f};
    eng_update_group g[2] = {{.prompt = p0, .P = 6, .n = 2, .resp = resp0, .R = R0, .advantage = a0},
                             {.prompt = p1, .P = 4, .n = 2, .resp = resp1, .R = R1, .advantage = a1}};
    loss_config a;
    loss_config_default(&a);
    a.adv = ADV_GIVEN;
    a.kl_coef = 0.01f;
    a.ppo_mini_batch_size = 1;
    eng_optim o;
    eng_optim_default(&o);
    o.lr = 5e-3f;
    return eng_update(e, g, 2, &a, &o, 1 << 20, u, NULL, NULL);
}

/* Logprobs of a fixed probe (n floats into out). */
static int probe(eng *e, float *out) {
    eng_update_group g[2] = {{.prompt = p0, .P = 6, .n = 2, .resp = resp0, .R = R0},
                             {.prompt = p1, .P = 4, .n = 2, .resp = resp1, .R = R1}};
    float **lp;
    if (eng_logprobs(e, g, 2, 0, 1.0f, 1 << 20, &lp)) return -1;
    int k = 0;
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < R0[i]; t++) out[k++] = lp[i][t];
    for (int i = 0; i < 2; i++)
        for (int t = 0; t < R1[i]; t++) out[k++] = lp[2 + i][t];
    eng_logprobs_free(lp, g, 2);
    return k;
}
#define NPROBE 21

static long long version(eng *e) {
    eng_info i;
    eng_get_info(e, &i);
    return i.policy_version;
}

TEST(failure_after_a_step_restores_everything) {
    eng *e = open_default(2), *ref = open_default(2);
    CHECK(e && ref);
    eng_update_result u;
    CHECK(update(e, 0.5f, &u) == 0 && update(ref, 0.5f, &u) == 0);
    float before[NPROBE], after[NPROBE];
    CHECK(probe(e, before) == NPROBE);
    int rc = update(e, NAN, &u);
    CHECK_EQ_INT(rc, GE_NON_FINITE);
    printf("  failed as expected: %s\n", err_msg());
    CHECK(strstr(err_msg(), "step 2 of 2")); /* the first step had been applied */
    CHECK_EQ_INT(version(e), 1);
    CHECK(probe(e, after) == NPROBE);
    CHECK(memcmp(before, after, sizeof before) == 0);
    /* the optimizer state and step came back too: the next update lands where the untouched one does */
    float a[NPROBE], b[NPROBE];
    CHECK(update(e, 0.3f, &u) == 0 && update(ref, 0.3f, &u) == 0);
    CHECK(probe(e, a) == NPROBE && probe(ref, b) == NPROBE);
    CHECK(memcmp(a, b, sizeof a) == 0);
    CHECK_EQ_INT(version(e), 2);
    eng_close(e);
    eng_close(ref);
}

/* A step that overflows the weights (lr x weight_decay huge) or the second moments (advantages of
 * 1e30, no clip: g^2 past fp32) fails naming which, and leaves the state as it was, with the
 * optimizer on the device and in host memory (whose step counts what it made not finite as it
 * goes, adamw.h adamw_bad, rather than reading the state again). */
TEST(an_overflowing_step_is_named_and_undone) {
    static const char *offload[2] = {"off", "on"};
    for (int o = 0; o < 2; o++)
        for (int k = 0; k < 2; k++) {
            eng *e;
            eng_open_opts oo = {.model_dir = MODEL, .backend = "cpu", .n_threads = 2, .optimizer_offload = offload[o]};
            CHECK(eng_open(&oo, &e) == 0);
            float a0[2] = {0.8f, -0.8f}, big[2] = {1e30f, -1e30f};
            eng_update_group g = {.prompt = p0, .P = 6, .n = 2, .resp = resp0, .R = R0, .advantage = k ? big : a0};
            loss_config a;
            loss_config_default(&a);
            a.adv = ADV_GIVEN;
            eng_optim opt;
            eng_optim_default(&opt);
            opt.lr = k ? 1e-3f : 1e38f;
            opt.weight_decay = k ? 0.0f : 1e10f;
            opt.grad_clip = 0;
            float before[NPROBE], after[NPROBE];
            CHECK(probe(e, before) == NPROBE);
            eng_update_result u;
            CHECK_EQ_INT(eng_update(e, &g, 1, &a, &opt, 1 << 20, &u, NULL, NULL), GE_NON_FINITE);
            printf("  offload %s: %s\n", offload[o], err_msg());
            CHECK_MSG(strstr(err_msg(), k ? "made the second moments non-finite" : "made the weights non-finite"), "%s", err_msg());
            CHECK_EQ_INT(version(e), 0);
            CHECK(probe(e, after) == NPROBE);
            CHECK(memcmp(before, after, sizeof before) == 0);
            eng_close(e);
        }
}

TEST(undo_takes_back_an_update) {
    eng *e = open_default(2), *ref = open_default(2);
    CHECK(e && ref);
    eng_update_result u;
    CHECK(update(e, 0.5f, &u) == 0 && update(ref, 0.5f, &u) == 0);
    float before[NPROBE], after[NPROBE];
    CHECK(probe(e, before) == NPROBE);
    CHECK(update(e, 0.9f, &u) == 0);
    CHECK(probe(e, after) == NPROBE && memcmp(before, after, sizeof before) != 0);
    CHECK(eng_update_undo(e) == 0);
    CHECK_EQ_INT(version(e), 1);
    CHECK(probe(e, after) == NPROBE && memcmp(before, after, sizeof before) == 0);
    CHECK(eng_update_undo(e) == 0); /* once: nothing more to take back */
    CHECK_EQ_INT(version(e), 1);
    float a[NPROBE], b[NPROBE];
    CHECK(update(e, 0.3f, &u) == 0 && update(ref, 0.3f, &u) == 0);
    CHECK(probe(e, a) == NPROBE && probe(ref, b) == NPROBE && memcmp(a, b, sizeof a) == 0);
    eng_close(e);
    eng_close(ref);
}

TEST(same_bits_on_any_thread_count) {
    float lp[2][NPROBE];
    int threads[2] = {1, 3};
    for (int k = 0; k < 2; k++) {
        eng *e = open_default(threads[k]);
        CHECK(e);
        eng_update_result u;
        CHECK(update(e, 0.5f, &u) == 0 && update(e, -0.2f, &u) == 0);
        CHECK(probe(e, lp[k]) == NPROBE);
        eng_close(e);
    }
    omp_set_num_threads(2);
    CHECK(memcmp(lp[0], lp[1], sizeof lp[0]) == 0);
}

TEST(without_a_snapshot_a_changed_state_is_lost) {
    eng *e = open_snap(2, "none"), *ref = open_default(2);
    CHECK(e && ref);
    eng_info in;
    eng_get_info(e, &in);
    CHECK(!strcmp(in.plan.snapshot_at, "none") && in.plan.snapshot == 0);
    eng_get_info(ref, &in);
    CHECK(!strcmp(in.plan.snapshot_at, "host") && in.plan.snapshot > 0);
    eng_update_result u;
    CHECK(update(e, 0.5f, &u) == 0 && update(ref, 0.5f, &u) == 0);
    float a[NPROBE], b[NPROBE];
    CHECK(probe(e, a) == NPROBE && probe(ref, b) == NPROBE && memcmp(a, b, sizeof a) == 0); /* no copy, same bits */
    /* a non-finite first mini-batch fails before any step: nothing changed, nothing lost */
    float a0[2] = {NAN, -0.8f};
    eng_update_group g = {.prompt = p0, .P = 6, .n = 2, .resp = resp0, .R = R0, .advantage = a0};
    loss_config lc;
    loss_config_default(&lc);
    lc.adv = ADV_GIVEN;
    eng_optim o;
    eng_optim_default(&o);
    CHECK_EQ_INT(eng_update(e, &g, 1, &lc, &o, 1 << 20, &u, NULL, NULL), GE_NON_FINITE);
    CHECK(probe(e, a) == NPROBE && memcmp(a, b, sizeof a) == 0);
    CHECK_EQ_INT(version(e), 1);
    /* after a step: the state changed and cannot come back */
    CHECK_EQ_INT(update(e, NAN, &u), GE_STATE_LOST);
    printf("  lost as expected: %s\n", err_msg());
    CHECK(strstr(err_msg(), "step 2 of 2") && strstr(err_msg(), "replay"));
    eng_close(e);
    /* a successful update taken back: lost too */
    e = open_snap(2, "none");
    CHECK(e);
    CHECK(update(e, 0.5f, &u) == 0);
    CHECK_EQ_INT(eng_update_undo(e), GE_STATE_LOST);
    /* places that do not hold host state are refused at open */
    eng *bad = open_snap(2, "pinned");
    CHECK(!bad && err_code() == GE_INVALID && strstr(err_msg(), "snapshot"));
    eng_close(e);
    eng_close(ref);
}

int main(void) {
    RUN(failure_after_a_step_restores_everything);
    RUN(an_overflowing_step_is_named_and_undone);
    RUN(undo_takes_back_an_update);
    RUN(same_bits_on_any_thread_count);
    RUN(without_a_snapshot_a_changed_state_is_lost);
    return CHECK_DONE();
}
