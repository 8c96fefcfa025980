/* test_prefix.c — the rollout scheduler's prefix cache (engine/rollout/prefix.h) on the embedded
 * model (cpu): an agent's three turns — each prompt the previous prompt, one of its responses
 * and a tool's output ids — copy the cached keys and values of all they share and prefill only
 * the rest, and give the tokens and logprobs that fresh schedulers give the same prompts, bit for
 * bit; an update empties the cache; a pool with no room evicts entries rather than stall. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "default_engine.h"
#include "common/err.h"
#include "engine/engine.h"

#define MODEL TEST_TMP "/grpod_test_prefix_model"

static eng *open_default(void) { return default_engine(MODEL); }

/* One job on s, stepped until it ends; 0 when done. */
static int run(eng_sched *s, const eng_rollout_group *g, const eng_sampling *sp, eng_group_result *out) {
    eng_sched_job *j;
    if (eng_sched_add(s, g, 1, sp, out, &j)) return -1;
    int st;
    while (!(st = eng_sched_job_state(j, NULL, NULL, NULL))) eng_sched_step(s);
    eng_sched_job_release(s, j);
    return st == 1 ? 0 : -1;
}

/* The same job on a scheduler of its own (an empty cache). */
static int fresh(eng *e, const eng_rollout_group *g, const eng_sampling *sp, eng_group_result *out) {
    eng_sched *s;
    eng_sched_opts o = {0};
    if (eng_sched_open(e, &o, &s)) return -1;
    int rc = run(s, g, sp, out);
    eng_sched_close(s);
    return rc;
}

static int same(const eng_group_result *a, const eng_group_result *b) {
    if (a->n != b->n) return 0;
    for (int r = 0; r < a->n; r++) {
        const eng_response *x = &a->resp[r], *y = &b->resp[r];
        if (x->n_tokens != y->n_tokens || memcmp(x->tokens, y->tokens, (size_t)x->n_tokens * sizeof(int)) ||
            memcmp(x->logprobs, y->logprobs, (size_t)x->n_tokens * sizeof(float)))
            return 0;
    }
    return 1;
}

/* prompt + a response's ids + tool ids, into buf; returns the length. */
static int next_turn(int *buf, const int *prompt, int P, const eng_response *r, const int *tool, int nt) {
    memcpy(buf, prompt, (size_t)P * sizeof(int));
    memcpy(buf + P, r->tokens, (size_t)r->n_tokens * sizeof(int));
    memcpy(buf + P + r->n_tokens, tool, (size_t)nt * sizeof(int));
    return P + r->n_tokens + nt;
}

static const int p0[] = {72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 32};
static const int tool1[] = {60, 116, 111, 111, 108, 62, 52, 50}, tool2[] = {60, 47, 116, 62, 55};

TEST(three_turns_copy_the_cache_and_equal_fresh_prefills) {
    eng *e = open_default();
    CHECK_MSG(e, "%s", err_msg());
    eng_sched *s;
    eng_sched_opts o = {0};
    CHECK(eng_sched_open(e, &o, &s) == 0);
    eng_sampling sp;
    eng_sampling_default(&sp);
    sp.max_tokens = 10;
    sp.temperature = 0.8f;
    sp.ignore_eos = 1;
    int b2[64], b3[96];
    eng_rollout_group g1 = {p0, (int)(sizeof p0 / sizeof p0[0]), 3}, g2, g3;
    eng_group_result t1, t2, t3, f2, f3;
    sp.seed = 5;
    CHECK(run(s, &g1, &sp, &t1) == 0);
    g2 = (eng_rollout_group){b2, next_turn(b2, g1.prompt, g1.P, &t1.resp[1], tool1, 8), 2};
    sp.seed = 6;
    CHECK(run(s, &g2, &sp, &t2) == 0);
    g3 = (eng_rollout_group){b3, next_turn(b3, g2.prompt, g2.P, &t2.resp[0], tool2, 5), 2};
    sp.seed = 7;
    CHECK(run(s, &g3, &sp, &t3) == 0);
    eng_sched_stats st;
    eng_sched_get_stats(s, &st);
    printf("  turns of %d, %d, %d prompt ids: %d, %d, %d copied; %lld entries, %lld hits, %lld of %lld ids\n", g1.P, g2.P, g3.P,
           t1.cached_tokens, t2.cached_tokens, t3.cached_tokens, st.prefix_entries, st.prefix_hits, st.prefix_hit_tokens,
           st.prefix_query_tokens);
    /* every id but the response's last (never fed back) was cached */
    CHECK(t1.cached_tokens == 0);
    CHECK(t2.cached_tokens == g1.P + t1.resp[1].n_tokens - 1);
    CHECK(t3.cached_tokens == g2.P + t2.resp[0].n_tokens - 1);
    CHECK(st.prefix_hits == 2 && st.prefix_hit_tokens == t2.cached_tokens + t3.cached_tokens);
    sp.seed = 6;
    CHECK(fresh(e, &g2, &sp, &f2) == 0);
    sp.seed = 7;
    CHECK(fresh(e, &g3, &sp, &f3) == 0);
    CHECK(f2.cached_tokens == 0 && f3.cached_tokens == 0);
    CHECK_MSG(same(&t2, &f2), "turn 2 from the cache differs from its full prefill");
    CHECK_MSG(same(&t3, &f3), "turn 3 from the cache differs from its full prefill");

    /* an update changes the weights: nothing cached is used after it */
    const int *resp[3] = {t1.resp[0].tokens, t1.resp[1].tokens, t1.resp[2].tokens};
    int R[3] = {t1.resp[0].n_tokens, t1.resp[1].n_tokens, t1.resp[2].n_tokens};
    float rew[3] = {1, 0, 0.5f};
    eng_update_group ug = {.prompt = g1.prompt, .P = g1.P, .n = 3, .resp = resp, .R = R, .reward = rew};
    loss_config a;
    loss_config_default(&a);
    eng_optim opt;
    eng_optim_default(&opt);
    eng_update_result u;
    CHECK(eng_update(e, &ug, 1, &a, &opt, 1 << 20, &u, NULL, NULL) == 0);
    eng_sched_get_stats(s, &st);
    CHECK(st.prefix_entries == 0);
    eng_group_result again;
    CHECK(run(s, &g3, &sp, &again) == 0);
    CHECK(again.cached_tokens == 0);
    eng_group_result_free(&again);

    eng_group_result *all[] = {&t1, &t2, &t3, &f2, &f3};
    for (int i = 0; i < 5; i++) eng_group_result_free(all[i]);
    eng_sched_close(s);
    eng_close(e);
}

TEST(a_full_pool_evicts_entries) {
    eng *e = open_default();
    CHECK(e);
    eng_sampling sp;
    eng_sampling_default(&sp);
    sp.max_tokens = 8;
    sp.ignore_eos = 1;
    sp.seed = 3;
    int P = (int)(sizeof p0 / sizeof p0[0]), other[14];
    for (int i = 0; i < P; i++) other[i] = p0[P - 1 - i] + 1;
    eng_rollout_group a = {p0, P, 4}, b = {other, P, 4};
    eng_sched *s;
    eng_sched_opts o = {.kv_rows = P + 4 * 8}; /* one group at a time */
    CHECK(eng_sched_open(e, &o, &s) == 0);
    eng_group_result ra, rb, ra2;
    CHECK(run(s, &a, &sp, &ra) == 0);
    CHECK(run(s, &b, &sp, &rb) == 0); /* needs the rows a's entries hold */
    CHECK(run(s, &a, &sp, &ra2) == 0);
    eng_sched_stats st;
    eng_sched_get_stats(s, &st);
    printf("  %lld entries evicted, %lld kept, rows used %lld of %lld\n", st.prefix_evicted, st.prefix_entries, st.rows_used,
           st.rows_cap);
    CHECK(st.prefix_evicted >= 4);
    CHECK(rb.cached_tokens == 0 && ra2.cached_tokens == 0);
    CHECK(same(&ra, &ra2));
    eng_group_result_free(&ra);
    eng_group_result_free(&rb);
    eng_group_result_free(&ra2);
    eng_sched_close(s);
    eng_close(e);
}

int main(void) {
    system("rm -rf " MODEL);
    RUN(three_turns_copy_the_cache_and_equal_fresh_prefills);
    RUN(a_full_pool_evicts_entries);
    return CHECK_DONE();
}
