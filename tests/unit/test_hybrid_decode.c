/* test_hybrid_decode.c — rollouts of a hybrid linear-attention model (Qwen3.5: gated DeltaNet
 * and gated attention layers; the tiny random tests/fixtures/data/qwen3_5_text) on the CPU
 * backend: the recurrent decode (one prefill per group into its prompt's state row, each
 * response from a copy of it, one state update per token) against the training pass.
 *
 * - every sampled token's logprob equals eng_logprobs' (the update's old pass) bit for bit, for
 *   each response scored alone and for the group packed [P; R_1..R_N]; prompts shorter than the
 *   conv (P = 1, 2), N = 1, R = 1 and ragged stops included, on the three Qwen3.5 text fixtures
 *   (one MoE) and the two Qwen3-Next ones (fused DeltaNet projections, dense and MoE MLPs mixed);
 * - a group decoded beside other groups gives the tokens and bits it gives alone;
 * - the same seed gives the same tokens, another seed others;
 * - greedy decoding picks the teacher-forced argmax at every step;
 * - a second turn (prompt = the first prompt, a response, more ids) is right: the prefix cache is
 *   skipped for these models, so it prefills, and its logprobs are the trainer's;
 * - with room for one group's state rows at a time, groups queue and give the same bits, and a
 *   group that can never fit is a clear error;
 * - an update given the rollout's logprobs as its old logprobs lands on the weights of one that
 *   runs its old pass, bit for bit (and one given logprobs 1e-3 off does not). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/err.h"
#include "engine/engine.h"
#include "engine/engine_testing.h"
#include "rollout_expect.h"

#define FIX "tests/fixtures/data/"
#define MODEL FIX "qwen3_5_text"

static eng *open_model(const char *dir) {
    eng *e = NULL;
    eng_open_opts oo = {.model_dir = dir, .backend = "cpu"};
    if (eng_open(&oo, &e)) return NULL;
    return e;
}
static eng *open_hybrid(void) { return open_model(MODEL); }

static const int prompt[] = {11, 200, 37, 5, 150, 64, 3, 290, 77, 18, 250, 9};
#define NP ((int)(sizeof prompt / sizeof prompt[0]))

/* Counts the tokens of res (n_groups groups of g) whose logprob equals the trainer's, each
 * response alone (*alone) and each group packed (*packed), and the tokens seen (*n). */
static void score(eng *e, const eng_rollout_group *g, int n_groups, const eng_group_result *res, float temp, int *n, int *alone,
                  int *packed) {
    *n = *alone = *packed = 0;
    for (int k = 0; k < n_groups; k++) {
        const int *resp[16];
        int R[16];
        for (int r = 0; r < g[k].n; r++) resp[r] = res[k].resp[r].tokens, R[r] = res[k].resp[r].n_tokens;
        eng_update_group pg = {.prompt = g[k].prompt, .P = g[k].P, .n = g[k].n, .resp = resp, .R = R};
        float **lpp;
        CHECK_MSG(eng_logprobs(e, &pg, 1, 0, temp, 1 << 20, &lpp) == 0, "%s", err_msg());
        for (int r = 0; r < g[k].n; r++) {
            eng_update_group ug = {.prompt = g[k].prompt, .P = g[k].P, .n = 1, .resp = &resp[r], .R = &R[r]};
            float **lp;
            CHECK(eng_logprobs(e, &ug, 1, 0, temp, 1 << 20, &lp) == 0);
            for (int t = 0; t < R[r]; t++, (*n)++) {
                *alone += lp[0][t] == res[k].resp[r].logprobs[t];
                *packed += lpp[r][t] == res[k].resp[r].logprobs[t];
            }
            eng_logprobs_free(lp, &ug, 1);
        }
        eng_logprobs_free(lpp, &pg, 1);
    }
}

static int same_bits(const eng_response *x, const eng_response *y) {
    return rollout_same_tokens(x, y) && !memcmp(x->logprobs, y->logprobs, (size_t)x->n_tokens * 4);
}

/* One fixture's rollouts against its trainer. */
static void rollout_vs_trainer(const char *dir) {
    eng *e = open_model(dir);
    CHECK_MSG(e, "%s", err_msg());
    /* P 12 (beyond the conv), 1 and 2 (shorter than it); N 5, 1, 3 */
    eng_rollout_group g[3] = {{prompt, NP, 5}, {prompt + 4, 1, 1}, {prompt + 7, 2, 3}};
    eng_sampling s;
    eng_sampling_default(&s);
    s.max_tokens = 14;
    s.seed = 11;
    s.temperature = 0.7f;
    s.top_p = 0.95f;
    eng_group_result all[3], one[1];
    CHECK_MSG(eng_rollout(e, g, 3, &s, all, NULL, NULL) == 0, "%s", err_msg());
    /* ragged lengths: tokens drawn once stop some responses early */
    int stop[2] = {all[0].resp[0].tokens[4], all[2].resp[1].tokens[1]};
    for (int k = 0; k < 3; k++) eng_group_result_free(&all[k]);
    s.stop_token_ids = stop;
    s.n_stop_token_ids = 2;
    CHECK(eng_rollout(e, g, 3, &s, all, NULL, NULL) == 0);
    CHECK(eng_rollout(e, g, 1, &s, one, NULL, NULL) == 0);
    int n, alone, packed, beside = 1, lens = 0;
    score(e, g, 3, all, s.temperature, &n, &alone, &packed);
    for (int r = 0; r < g[0].n; r++) beside &= same_bits(&all[0].resp[r], &one[0].resp[r]);
    for (int k = 0; k < 3; k++)
        for (int r = 0; r < g[k].n; r++) lens |= 1 << (all[k].resp[r].n_tokens == s.max_tokens);
    printf("  %s: %d tokens: equal to the trainer's %d (alone), %d (packed); group 0 beside others = alone: %s\n",
           dir + strlen(FIX), n, alone, packed, beside ? "yes" : "no");
    for (int k = 0; k < 3; k++) eng_group_result_free(&all[k]);
    eng_group_result_free(&one[0]);
    s.max_tokens = 1; /* R = 1: every response ends at the prefill, no state copied */
    int n1, alone1, packed1;
    CHECK(eng_rollout(e, g, 3, &s, all, NULL, NULL) == 0);
    score(e, g, 3, all, s.temperature, &n1, &alone1, &packed1);
    for (int k = 0; k < 3; k++) eng_group_result_free(&all[k]);
    eng_close(e);
    CHECK(n > 20 && n1 == 9);
    CHECK_MSG(alone1 == n1 && packed1 == n1, "R = 1 logprobs differ from the trainer's");
    CHECK_MSG(alone == n && packed == n, "rollout logprobs differ from the trainer's");
    CHECK_MSG(beside, "decoding beside other groups changed the tokens or their logprobs");
    CHECK_MSG(lens == 3, "want both stopped and full-length responses (lengths mask %d)", lens);
}

/* qwen3_5_text: a 4-tap conv, 2 key heads of 4 value heads, untied; qwen3_5_text_b: a 3-tap
 * conv, 3 and 3, tied, two attention layers, a DeltaNet layer last; qwen3_5_moe_text: the first's
 * layers with 8 experts (top 2) and a gated shared expert in every MLP; qwen3_next: the first's
 * layers, dense and MoE MLPs alternating; qwen3_next_b: 3 value heads per key head, 4 query heads
 * per KV head, two of five MLPs dense */
TEST(hybrid_rollout_logprobs_are_the_trainers_bit_for_bit) {
    rollout_vs_trainer(FIX "qwen3_5_text");
    rollout_vs_trainer(FIX "qwen3_5_text_b");
    rollout_vs_trainer(FIX "qwen3_5_moe_text");
    rollout_vs_trainer(FIX "qwen3_next");
    rollout_vs_trainer(FIX "qwen3_next_b");
}

TEST(hybrid_rollout_is_seeded) {
    eng *e = open_hybrid();
    CHECK_MSG(e, "%s", err_msg());
    eng_rollout_group g[2] = {{prompt, NP, 4}, {prompt + 3, NP - 3, 3}};
    eng_sampling s;
    eng_sampling_default(&s);
    s.max_tokens = 10;
    s.seed = 7;
    s.top_k = 50;
    eng_group_result a[2];
    int same = 0, differs = 0;
    CHECK(rollout_expect_seeded(e, g, 2, s, a, &same, &differs) == 0);
    for (int k = 0; k < 2; k++) eng_group_result_free(&a[k]);
    eng_close(e);
    CHECK_MSG(same, "the same seed gave different tokens");
    CHECK_MSG(differs, "another seed gave the same tokens");
}

TEST(hybrid_greedy_equals_teacher_forced_argmax) {
    eng *e = open_hybrid();
    CHECK_MSG(e, "%s", err_msg());
    int ok = rollout_greedy_is_argmax(e, prompt, NP, 10, 1);
    eng_close(e);
    CHECK_MSG(ok, "greedy decode disagrees with the teacher-forced argmax");
}

/* An agent's second turn through one scheduler (the prefix cache would serve it for a dense
 * model): the first prompt, a response and more ids. */
TEST(hybrid_second_turn_prefills_and_matches) {
    eng *e = open_hybrid();
    CHECK_MSG(e, "%s", err_msg());
    eng_sched_opts o = {0};
    eng_sched *s;
    CHECK(eng_sched_open(e, &o, &s) == 0);
    eng_sampling sp;
    eng_sampling_default(&sp);
    sp.max_tokens = 8;
    sp.seed = 3;
    sp.ignore_eos = 1;
    eng_rollout_group g1 = {prompt, NP, 2};
    eng_group_result r1, r2;
    eng_sched_job *j;
    CHECK(eng_sched_add(s, &g1, 1, &sp, &r1, &j) == 0);
    while (!eng_sched_job_state(j, NULL, NULL, NULL)) eng_sched_step(s);
    CHECK(eng_sched_job_state(j, NULL, NULL, NULL) == 1);
    eng_sched_job_release(s, j);
    int turn[64], P2 = 0;
    for (int i = 0; i < NP; i++) turn[P2++] = prompt[i];
    for (int i = 0; i < r1.resp[0].n_tokens; i++) turn[P2++] = r1.resp[0].tokens[i];
    turn[P2++] = 42; /* the tool's output */
    turn[P2++] = 43;
    eng_rollout_group g2 = {turn, P2, 3};
    CHECK(eng_sched_add(s, &g2, 1, &sp, &r2, &j) == 0);
    while (!eng_sched_job_state(j, NULL, NULL, NULL)) eng_sched_step(s);
    CHECK(eng_sched_job_state(j, NULL, NULL, NULL) == 1);
    eng_sched_job_release(s, j);
    eng_sched_stats st;
    eng_sched_get_stats(s, &st);
    eng_sched_close(s);
    int n, alone, packed;
    score(e, &g2, 1, &r2, 1.0f, &n, &alone, &packed);
    printf("  second turn P %d: cached %d, %d tokens equal to the trainer's %d / %d; prefix entries %lld\n", P2, r2.cached_tokens,
           n, alone, packed, st.prefix_entries);
    CHECK(r2.cached_tokens == 0 && st.prefix_entries == 0 && st.prefix_hits == 0);
    CHECK_MSG(alone == n && packed == n, "second-turn logprobs differ from the trainer's");
    eng_group_result_free(&r1);
    eng_group_result_free(&r2);
    eng_close(e);
}

/* State rows for one group of n = 3 at a time (4 rows): two such groups queue and decode one
 * after the other with the bits each gives alone; a group of n = 4 can never fit. */
TEST(hybrid_state_rows_queue_groups) {
    eng *e = open_hybrid();
    CHECK_MSG(e, "%s", err_msg());
    eng_rollout_group g[2] = {{prompt, NP, 3}, {prompt + 2, NP - 2, 3}};
    eng_sampling sp;
    eng_sampling_default(&sp);
    sp.max_tokens = 6;
    sp.seed = 5;
    eng_group_result ref[2], out[2];
    CHECK(eng_rollout(e, g, 2, &sp, ref, NULL, NULL) == 0);
    eng_sched_opts o0 = {0};
    eng_sched *s;
    CHECK(eng_sched_open(e, &o0, &s) == 0);
    eng_sched_stats st;
    eng_sched_get_stats(s, &st);
    eng_sched_close(s);
    CHECK(st.state_row_bytes > 0 && st.state_rows_cap == 1024 + 64);
    eng_sched_opts o = {.kv_bytes = 2 * 4 * st.state_row_bytes}; /* half for the state rows */
    CHECK(eng_sched_open(e, &o, &s) == 0);
    eng_sched_get_stats(s, &st);
    CHECK_EQ_INT((int)st.state_rows_cap, 4);
    eng_sched_job *j;
    CHECK(eng_sched_add(s, g, 2, &sp, out, &j) == 0);
    int most = 0;
    while (!eng_sched_job_state(j, NULL, NULL, NULL)) {
        eng_sched_step(s);
        eng_sched_get_stats(s, &st);
        most = st.running_groups > most ? (int)st.running_groups : most;
    }
    CHECK(eng_sched_job_state(j, NULL, NULL, NULL) == 1);
    eng_sched_job_release(s, j);
    int same = 1;
    for (int k = 0; k < 2; k++)
        for (int r = 0; r < 3; r++) same &= same_bits(&out[k].resp[r], &ref[k].resp[r]);
    eng_rollout_group big = {prompt, NP, 4};
    eng_group_result bo;
    CHECK(eng_sched_add(s, &big, 1, &sp, &bo, &j) == GE_TOO_LARGE);
    CHECK_MSG(strstr(err_msg(), "recurrent-state rows"), "%s", err_msg());
    eng_sched_close(s);
    for (int k = 0; k < 2; k++) {
        eng_group_result_free(&ref[k]);
        eng_group_result_free(&out[k]);
    }
    eng_close(e);
    CHECK_MSG(most == 1, "%d groups ran at once in room for one", most);
    CHECK_MSG(same, "queued groups decoded other bits");
}

/* Two PPO epochs, so the old pass runs unless old logprobs are given: given the rollout's (off by
 * `bias` on one token), the weights after the update. */
static float *update_after(const eng_rollout_group *rg, const eng_group_result *res, int given, float bias, long long *n) {
    eng *e = open_hybrid();
    if (!e) return NULL;
    const int *resp[8];
    int R[8];
    float rew[8];
    const float *old[8];
    float *moved = malloc((size_t)res->resp[0].n_tokens * 4);
    for (int r = 0; r < rg->n; r++) {
        resp[r] = res->resp[r].tokens, R[r] = res->resp[r].n_tokens, old[r] = res->resp[r].logprobs;
        rew[r] = (float)(r % 3) * 0.5f;
    }
    memcpy(moved, old[0], (size_t)R[0] * 4);
    moved[R[0] - 1] += bias;
    old[0] = moved;
    eng_update_group g = {.prompt = rg->prompt, .P = rg->P, .n = rg->n, .resp = resp, .R = R, .reward = rew};
    if (given) g.old_logprobs = old;
    loss_config a;
    loss_config_default(&a);
    a.ppo_epochs = 2;
    a.use_rollout_logprobs = given;
    eng_optim o;
    eng_optim_default(&o);
    o.lr = 1e-3f;
    eng_update_result u;
    eng_testing_info info;
    eng_testing_get(e, &info);
    *n = info.n_params;
    float *w = malloc((size_t)*n * 4);
    int rc = eng_update(e, &g, 1, &a, &o, 1 << 20, &u, NULL, NULL);
    if (rc) printf("  update: %s\n", err_msg());
    if (rc || eng_testing_weights(e, w)) {
        free(w);
        w = NULL;
    }
    free(moved);
    eng_close(e);
    return w;
}

TEST(hybrid_rollout_logprobs_are_the_old_pass) {
    eng *e = open_hybrid();
    CHECK_MSG(e, "%s", err_msg());
    eng_rollout_group g = {prompt, NP, 4};
    eng_sampling s;
    eng_sampling_default(&s);
    s.max_tokens = 8;
    s.seed = 21;
    s.ignore_eos = 1;
    eng_group_result r;
    CHECK(eng_rollout(e, &g, 1, &s, &r, NULL, NULL) == 0);
    eng_close(e);
    long long n = 0;
    float *recomputed = update_after(&g, &r, 0, 0, &n), *given = update_after(&g, &r, 1, 0, &n),
          *off = update_after(&g, &r, 1, 1e-3f, &n);
    CHECK(recomputed && given && off);
    int same = !memcmp(recomputed, given, (size_t)n * 4), differs = memcmp(recomputed, off, (size_t)n * 4) != 0;
    printf("  weights after the update: given the rollout's logprobs = the old pass's: %s; 1e-3 off: %s\n", same ? "yes" : "no",
           differs ? "differs" : "same");
    free(recomputed);
    free(given);
    free(off);
    eng_group_result_free(&r);
    CHECK_MSG(same, "the rollout's logprobs are not the old pass's");
    CHECK_MSG(differs, "old logprobs 1e-3 off changed nothing: the test cannot fail");
}

int main(void) {
    RUN(hybrid_rollout_logprobs_are_the_trainers_bit_for_bit);
    RUN(hybrid_rollout_is_seeded);
    RUN(hybrid_greedy_equals_teacher_forced_argmax);
    RUN(hybrid_second_turn_prefills_and_matches);
    RUN(hybrid_state_rows_queue_groups);
    RUN(hybrid_rollout_logprobs_are_the_old_pass);
    return CHECK_DONE();
}
