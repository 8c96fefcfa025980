/* test_engine.c — the engine end to end on the embedded default model (cpu): rollout
 * determinism and its logprobs against the training path, greedy decoding against argmax of
 * a teacher-forced forward, an update that moves logprobs the right way, a checkpoint that
 * reloads to identical logprobs, and a checkpoint save that is idempotent. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "default_engine.h"
#include "rollout_expect.h"
#include "common/err.h"
#include "engine/engine.h"

#define MODEL TEST_TMP "/grpod_test_engine_model"

static eng *open_default(void) { return default_engine(MODEL); }

static const int prompt[] = {72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100};
#define NP ((int)(sizeof prompt / sizeof prompt[0]))

TEST(rollout_is_seeded_and_matches_training_logprobs) {
    eng *e = open_default();
    CHECK_MSG(e, "%s", err_msg());
    eng_rollout_group g[2] = {{prompt, NP, 4}, {prompt + 3, NP - 3, 3}};
    eng_sampling s;
    eng_sampling_default(&s);
    s.max_tokens = 12;
    s.seed = 7;
    s.top_k = 50;
    s.top_p = 0.9f;
    eng_group_result a[2];
    int same = 0, differs = 0;
    CHECK(rollout_expect_seeded(e, g, 2, s, a, &same, &differs) == 0);
    double worst = 0;
    for (int k = 0; k < 2; k++)
        for (int r = 0; r < g[k].n; r++) { /* teacher-forced logprobs of the sampled tokens */
            eng_response *x = &a[k].resp[r];
            const int *resp[1] = {x->tokens};
            eng_update_group ug = {.prompt = g[k].prompt, .P = g[k].P, .n = 1, .resp = resp, .R = &x->n_tokens};
            float **lp;
            CHECK(eng_logprobs(e, &ug, 1, 0, 1.0f, 1 << 20, &lp) == 0);
            for (int t = 0; t < x->n_tokens; t++) worst = fmax(worst, fabs(lp[0][t] - x->logprobs[t]));
            eng_logprobs_free(lp, &ug, 1);
        }
    printf("  rollout vs training logprobs: max |Δ| %.2e\n", worst);
    for (int k = 0; k < 2; k++) eng_group_result_free(&a[k]);
    eng_close(e);
    CHECK_MSG(same, "the same seed gave different tokens");
    CHECK_MSG(differs, "another seed gave the same tokens");
    CHECK_MSG(worst <= 1e-5, "rollout logprobs differ from the training path by %.3g", worst);
}

/* rollout logprobs equal the training path's bit for bit (alone and packed), and group 0 decoded
 * beside two other groups gives the bits it gives alone (a stream's key is its request's seed,
 * group index and response index, so only group 0 is the same stream in both requests) */
TEST(rollout_logprobs_are_the_trainers_bit_for_bit) {
    eng *e = open_default();
    CHECK_MSG(e, "%s", err_msg());
    eng_rollout_group g[3] = {{prompt, NP, 5}, {prompt + 3, NP - 3, 3}, {prompt + 1, NP - 2, 2}};
    eng_sampling s;
    eng_sampling_default(&s);
    s.max_tokens = 14;
    s.seed = 11;
    s.temperature = 0.7f;
    s.top_p = 0.95f;
    eng_group_result all[3], one[1];
    CHECK(eng_rollout(e, g, 3, &s, all, NULL, NULL) == 0);
    CHECK(eng_rollout(e, g, 1, &s, one, NULL, NULL) == 0);
    int tok_same = 1, n = 0, lp_same = 0, packed_same = 0, n0 = 0, alone_same = 0;
    for (int k = 0; k < 3; k++) {
        const int *resp[8];
        int R[8];
        for (int r = 0; r < g[k].n; r++) resp[r] = all[k].resp[r].tokens, R[r] = all[k].resp[r].n_tokens;
        eng_update_group pg = {.prompt = g[k].prompt, .P = g[k].P, .n = g[k].n, .resp = resp, .R = R};
        float **lpp;
        CHECK(eng_logprobs(e, &pg, 1, 0, s.temperature, 1 << 20, &lpp) == 0);
        for (int r = 0; r < g[k].n; r++) {
            eng_response *x = &all[k].resp[r], *y = k ? NULL : &one[0].resp[r];
            if (y) tok_same &= x->n_tokens == y->n_tokens && !memcmp(x->tokens, y->tokens, (size_t)x->n_tokens * 4);
            eng_update_group ug = {.prompt = g[k].prompt, .P = g[k].P, .n = 1, .resp = &resp[r], .R = &R[r]};
            float **lp;
            CHECK(eng_logprobs(e, &ug, 1, 0, s.temperature, 1 << 20, &lp) == 0);
            for (int t = 0; t < x->n_tokens; t++, n++) {
                lp_same += lp[0][t] == x->logprobs[t];
                packed_same += lpp[r][t] == x->logprobs[t];
                if (y) n0++, alone_same += t < y->n_tokens && y->logprobs[t] == x->logprobs[t];
            }
            eng_logprobs_free(lp, &ug, 1);
        }
        eng_logprobs_free(lpp, &pg, 1);
    }
    printf("  %d tokens: equal to the trainer's %d, to the packed trainer's %d; group 0 alone %d of %d\n", n, lp_same,
           packed_same, alone_same, n0);
    for (int k = 0; k < 3; k++) eng_group_result_free(&all[k]);
    eng_group_result_free(&one[0]);
    eng_close(e);
    CHECK_MSG(tok_same, "decoding beside other groups changed the tokens");
    CHECK_MSG(lp_same == n && packed_same == n, "rollout logprobs differ from the trainer's");
    CHECK_MSG(alone_same == n0, "decoding beside other groups changed the logprobs");
}

TEST(greedy_equals_teacher_forced_argmax) {
    eng *e = open_default();
    CHECK(e);
    int ok = rollout_greedy_is_argmax(e, prompt, NP, 10, 0);
    eng_close(e);
    CHECK_MSG(ok, "greedy decode disagrees with the teacher-forced argmax");
}

TEST(update_moves_logprobs_by_advantage_and_checkpoint_reloads) {
    eng *e = open_default();
    CHECK(e);
    int good[6] = {65, 66, 67, 68, 69, 70}, bad[5] = {97, 98, 99, 100, 101}, mid[4] = {48, 49, 50, 51};
    const int *resp[3] = {good, bad, mid};
    int R[3] = {6, 5, 4};
    float rew[3] = {1.0f, 0.0f, 0.5f};
    eng_update_group g = {.prompt = prompt, .P = NP, .n = 3, .resp = resp, .R = R, .reward = rew};
    float **before, **after;
    CHECK(eng_logprobs(e, &g, 1, 0, 1.0f, 1 << 20, &before) == 0);
    loss_config a;
    loss_config_default(&a);
    eng_optim o;
    eng_optim_default(&o);
    o.lr = 3e-3f;
    eng_update_result u;
    for (int i = 0; i < 3; i++) CHECK_MSG(eng_update(e, &g, 1, &a, &o, 1 << 20, &u, NULL, NULL) == 0, "%s", err_msg());
    CHECK_EQ_INT(u.policy_version_after, 3);
    CHECK_EQ_INT(u.tokens_packed, NP + 15);
    CHECK_EQ_INT(u.tokens_standard, 3 * NP + 15);
    CHECK(eng_logprobs(e, &g, 1, 0, 1.0f, 1 << 20, &after) == 0);
    double d[3] = {0};
    for (int r = 0; r < 3; r++)
        for (int t = 0; t < R[r]; t++) d[r] += after[r][t] - before[r][t];
    printf("  Δ sum logprob: good %+.3f bad %+.3f mid %+.3f; kl %.4f grad_norm %.3f\n", d[0], d[1], d[2], u.kl, u.grad_norm);
    CHECK_MSG(d[0] > 0.5 && d[1] < -0.5, "good moved %+.3f, bad %+.3f", d[0], d[1]);
    /* checkpoint, reopen from it: identical logprobs */
    const char *ck = TEST_TMP "/grpod_test_engine_ckpt";
    CHECK(system("rm -rf " TEST_TMP "/grpod_test_engine_ckpt") == 0);
    CHECK_MSG(eng_checkpoint_save(e, ck) == 0, "%s", err_msg());
    eng *e2;
    eng_open_opts oo = {.model_dir = MODEL, .backend = "cpu", .resume_dir = ck};
    CHECK_MSG(eng_open(&oo, &e2) == 0, "%s", err_msg());
    float **re;
    CHECK(eng_logprobs(e2, &g, 1, 0, 1.0f, 1 << 20, &re) == 0);
    int identical = 1;
    for (int r = 0; r < 3; r++) identical &= !memcmp(re[r], after[r], (size_t)R[r] * 4);
    eng_info i2;
    eng_get_info(e2, &i2);
    CHECK_EQ_INT(i2.policy_version, 3);
    /* the reference stays the original weights */
    float **ref;
    CHECK(eng_logprobs(e2, &g, 1, 1, 1.0f, 1 << 20, &ref) == 0);
    int ref_same = !memcmp(ref[0], before[0], (size_t)R[0] * 4);
    eng_logprobs_free(before, &g, 1);
    eng_logprobs_free(after, &g, 1);
    eng_logprobs_free(re, &g, 1);
    eng_logprobs_free(ref, &g, 1);
    eng_close(e2);
    eng_close(e);
    CHECK_MSG(identical, "reloaded checkpoint gives different logprobs");
    CHECK_MSG(ref_same, "the reference model moved");
}

static long long file_mtime_ns(const char *path) {
    struct stat sb;
    return stat(path, &sb) ? -1 : (long long)sb.st_mtim.tv_sec * 1000000000LL + sb.st_mtim.tv_nsec;
}

/* A save that finds its directory: kept when it verifies and holds this state (the same save run
 * again after a crash before its caller recorded it), replaced when it is damaged or holds
 * another state; never the old GE_CONFLICT. */
TEST(checkpoint_save_is_idempotent) {
    eng *e = open_default();
    CHECK(e);
    int r0[5] = {65, 66, 67, 68, 69}, r1[3] = {97, 98, 99};
    const int *resp[2] = {r0, r1};
    int R[2] = {5, 3};
    float rew[2] = {0.8f, -0.3f};
    eng_update_group g = {.prompt = prompt, .P = NP, .n = 2, .resp = resp, .R = R, .reward = rew};
    loss_config a;
    loss_config_default(&a);
    eng_optim o;
    eng_optim_default(&o);
    o.lr = 2e-3f;
    eng_update_result u;
    CHECK_MSG(eng_update(e, &g, 1, &a, &o, 1 << 20, &u, NULL, NULL) == 0, "%s", err_msg());
    const char *ck = TEST_TMP "/grpod_test_engine_idem";
    CHECK(system("rm -rf " TEST_TMP "/grpod_test_engine_idem " TEST_TMP "/grpod_test_engine_idem.tmp") == 0);
    CHECK_MSG(eng_checkpoint_save(e, ck) == 0, "%s", err_msg());
    CHECK(eng_checkpoint_matches(e, ck, 0) == 0);
    long long m0 = file_mtime_ns(TEST_TMP "/grpod_test_engine_idem/manifest.json");
    /* the same save again: kept, not rewritten */
    CHECK_MSG(eng_checkpoint_save(e, ck) == 0, "%s", err_msg());
    CHECK(file_mtime_ns(TEST_TMP "/grpod_test_engine_idem/manifest.json") == m0);
    /* damaged (a flipped byte in the weights): replaced by a whole one */
    FILE *f = fopen(TEST_TMP "/grpod_test_engine_idem/model.safetensors", "r+b");
    CHECK(f);
    fseek(f, -7, SEEK_END);
    int c = fgetc(f);
    fseek(f, -7, SEEK_END);
    fputc(c ^ 0x5a, f);
    fclose(f);
    CHECK_EQ_INT(eng_checkpoint_matches(e, ck, 0), GE_FORMAT);
    CHECK_MSG(eng_checkpoint_save(e, ck) == 0, "%s", err_msg());
    CHECK(eng_checkpoint_verify(ck) == 0 && eng_checkpoint_matches(e, ck, 0) == 0);
    /* another state (an update since): not this save's result, replaced */
    CHECK_MSG(eng_update(e, &g, 1, &a, &o, 1 << 20, &u, NULL, NULL) == 0, "%s", err_msg());
    CHECK_EQ_INT(eng_checkpoint_matches(e, ck, 0), GE_CONFLICT);
    CHECK_MSG(eng_checkpoint_save(e, ck) == 0, "%s", err_msg());
    CHECK(eng_checkpoint_matches(e, ck, 0) == 0);
    CHECK(access(TEST_TMP "/grpod_test_engine_idem.tmp", F_OK) != 0);
    eng *e2;
    eng_open_opts oo = {.model_dir = MODEL, .backend = "cpu", .resume_dir = ck};
    CHECK_MSG(eng_open(&oo, &e2) == 0, "%s", err_msg());
    eng_info i2;
    eng_get_info(e2, &i2);
    CHECK_EQ_INT(i2.policy_version, 2);
    eng_close(e2);
    eng_close(e);
    CHECK(system("rm -rf " TEST_TMP "/grpod_test_engine_idem") == 0);
}

TEST(group_over_budget_is_a_clear_error) {
    eng *e = open_default();
    CHECK(e);
    int r0[40];
    for (int i = 0; i < 40; i++) r0[i] = 50 + i;
    const int *resp[1] = {r0};
    int R = 40;
    float rew = 1;
    float adv = 1;
    eng_update_group g = {.prompt = prompt, .P = NP, .n = 1, .resp = resp, .R = &R, .reward = &rew, .advantage = &adv};
    loss_config a;
    loss_config_default(&a);
    eng_optim o;
    eng_optim_default(&o);
    eng_update_result u;
    int rc = eng_update(e, &g, 1, &a, &o, 16, &u, NULL, NULL);
    eng_close(e);
    CHECK_EQ_INT(rc, GE_TOO_LARGE);
    CHECK_MSG(strstr(err_msg(), "max_tokens_per_micro_batch"), "message: %s", err_msg());
}

int main(void) {
    system("rm -rf " MODEL);
    RUN(rollout_is_seeded_and_matches_training_logprobs);
    RUN(rollout_logprobs_are_the_trainers_bit_for_bit);
    RUN(greedy_equals_teacher_forced_argmax);
    RUN(update_moves_logprobs_by_advantage_and_checkpoint_reloads);
    RUN(checkpoint_save_is_idempotent);
    RUN(group_over_budget_is_a_clear_error);
    return CHECK_DONE();
}
