/* test_sched.c — the rollout scheduler on the cpu backend (embedded default model): the KV
 * row allocator against a bitmap, jobs joining a running batch at different steps giving the
 * tokens they give alone, admission waiting for rows and proceeding when they free, a group
 * that can never fit, cancellation giving rows back, and a request split into shares with
 * each group's original index (eng_sampling.group_index) drawing the whole request's tokens,
 * and sampling.top_logprobs listing eng_logprobs_top's alternatives. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "default_engine.h"
#include "common/err.h"
#include "engine/engine.h"
#include "engine/model/kvpool.h"

#define MODEL TEST_TMP "/grpod_test_sched_model"

static eng *open_default(void) { return default_engine(MODEL); }

/* ---------------------------------------------------------------- allocator */

TEST(kvpool_first_fit_coalesces) {
    enum { CAP = 1000, SLOTS = 64 };
    kvp p;
    CHECK(kvp_init(&p, CAP) == 0);
    unsigned char owner[CAP]; /* 0 free, else slot + 1 */
    int start[SLOTS], len[SLOTS];
    memset(owner, 0, sizeof owner);
    for (int i = 0; i < SLOTS; i++) start[i] = -1;
    unsigned long long rs = 12345;
    int fails = 0;
    for (int it = 0; it < 20000; it++) {
        rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
        int i = (int)((rs >> 33) % SLOTS);
        if (start[i] >= 0) {
            for (int r = start[i]; r < start[i] + len[i]; r++) owner[r] = 0;
            kvp_release(&p, start[i], len[i]);
            start[i] = -1;
            continue;
        }
        int n = 1 + (int)((rs >> 13) % 90);
        int got = kvp_alloc(&p, n);
        /* first fit: the lowest start of a free run of n rows in the bitmap */
        int want = -1;
        for (int r = 0, run = 0; r < CAP && want < 0; r++) {
            run = owner[r] ? 0 : run + 1;
            if (run == n) want = r - n + 1;
        }
        CHECK_MSG(got == want, "alloc %d rows: got %d, first fit is %d", n, got, want);
        if (got < 0) {
            fails++;
            continue;
        }
        for (int r = got; r < got + n; r++) owner[r] = (unsigned char)(i + 1);
        start[i] = got;
        len[i] = n;
        int used = 0;
        for (int r = 0; r < CAP; r++) used += owner[r] != 0;
        CHECK_EQ_INT(p.used, used);
    }
    for (int i = 0; i < SLOTS; i++)
        if (start[i] >= 0) kvp_release(&p, start[i], len[i]);
    CHECK_EQ_INT(p.used, 0);
    CHECK_EQ_INT(p.n_free, 1);
    CHECK_EQ_INT(kvp_largest(&p), CAP);
    CHECK_MSG(fails > 100, "the pool never filled (%d failed allocations)", fails);
    kvp_destroy(&p);
}

/* ---------------------------------------------------------------- scheduler */

static const int prompt_a[] = {72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100};
static const int prompt_b[] = {84, 104, 101, 32, 113, 117, 105, 99, 107, 32, 98, 114, 111, 119, 110, 33, 63};
static const int prompt_c[] = {65, 66, 67};

typedef struct {
    eng_rollout_group g[3];
    int n_groups;
    eng_sampling s;
    eng_group_result out[3];
} req;

/* Three requests with different sampling, prompts and stop conditions. */
static void make_reqs(req *r) {
    memset(r, 0, 3 * sizeof *r);
    static const char *stops[] = {"ll", "o w"};
    static const int stop_ids[] = {101};
    eng_sampling_default(&r[0].s);
    r[0].s.max_tokens = 14;
    r[0].s.seed = 7;
    r[0].s.top_k = 50;
    r[0].s.top_p = 0.9f;
    r[0].g[0] = (eng_rollout_group){prompt_a, 12, 4};
    r[0].g[1] = (eng_rollout_group){prompt_b, 17, 3};
    r[0].n_groups = 2;
    eng_sampling_default(&r[1].s);
    r[1].s.max_tokens = 20;
    r[1].s.seed = 11;
    r[1].s.temperature = 0.8f;
    r[1].s.min_tokens = 3;
    r[1].s.stop = stops;
    r[1].s.n_stop = 2;
    r[1].s.stop_token_ids = stop_ids;
    r[1].s.n_stop_token_ids = 1;
    r[1].g[0] = (eng_rollout_group){prompt_c, 3, 5};
    r[1].g[1] = (eng_rollout_group){prompt_a + 2, 10, 2};
    r[1].g[2] = (eng_rollout_group){prompt_b, 17, 1};
    r[1].n_groups = 3;
    eng_sampling_default(&r[2].s);
    r[2].s.max_tokens = 9;
    r[2].s.seed = 7;
    r[2].s.temperature = 0;
    r[2].s.ignore_eos = 1;
    r[2].g[0] = (eng_rollout_group){prompt_b + 4, 13, 2};
    r[2].n_groups = 1;
}

static void free_req(req *r) {
    for (int i = 0; i < r->n_groups; i++) eng_group_result_free(&r->out[i]);
}

/* Tokens equal, finish equal, logprobs within tol; returns the worst logprob gap or -1. */
static double compare(const eng_group_result *a, const eng_group_result *b, int n_groups) {
    double worst = 0;
    for (int g = 0; g < n_groups; g++) {
        if (a[g].n != b[g].n) return -1;
        for (int r = 0; r < a[g].n; r++) {
            const eng_response *x = &a[g].resp[r], *y = &b[g].resp[r];
            if (x->n_tokens != y->n_tokens || memcmp(x->tokens, y->tokens, (size_t)x->n_tokens * sizeof(int)) ||
                x->finish != y->finish || x->text_len != y->text_len || memcmp(x->text, y->text, x->text_len))
                return -1;
            for (int t = 0; t < x->n_tokens; t++) worst = fmax(worst, fabs(x->logprobs[t] - y->logprobs[t]));
        }
    }
    return worst;
}

static int run_until_done(eng_sched *s, eng_sched_job *j, int max_steps) {
    int st;
    while (!(st = eng_sched_job_state(j, NULL, NULL, NULL)) && max_steps-- > 0) eng_sched_step(s);
    return st;
}

TEST(jobs_joining_at_different_steps_match_alone) {
    eng *e = open_default();
    CHECK_MSG(e, "%s", err_msg());
    req alone[3], mixed[3];
    make_reqs(alone);
    make_reqs(mixed);
    for (int i = 0; i < 3; i++) CHECK(eng_rollout(e, alone[i].g, alone[i].n_groups, &alone[i].s, alone[i].out, NULL, NULL) == 0);
    eng_sched *s;
    eng_sched_opts o = {.kv_rows = 4096};
    CHECK(eng_sched_open(e, &o, &s) == 0);
    eng_sched_job *j[3] = {0};
    const int join_at[3] = {0, 2, 5};
    int max_running = 0, shared_steps = 0;
    for (int step = 0; step < 200; step++) {
        for (int i = 0; i < 3; i++)
            if (step == join_at[i]) CHECK(eng_sched_add(s, mixed[i].g, mixed[i].n_groups, &mixed[i].s, mixed[i].out, &j[i]) == 0);
        if (step > 5 && !eng_sched_busy(s)) break;
        eng_sched_step(s);
        eng_sched_stats st;
        eng_sched_get_stats(s, &st);
        if (st.running_responses > max_running) max_running = st.running_responses;
        int live = 0;
        for (int i = 0; i < 3; i++) live += j[i] && eng_sched_job_state(j[i], NULL, NULL, NULL) == 0;
        shared_steps += live > 1;
    }
    eng_sched_stats st;
    eng_sched_get_stats(s, &st);
    double worst = 0;
    int same = 1;
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(eng_sched_job_state(j[i], NULL, NULL, NULL), 1);
        double w = compare(alone[i].out, mixed[i].out, alone[i].n_groups);
        same &= w >= 0;
        worst = fmax(worst, w);
    }
    printf("  %lld steps, %lld dec_step calls, %d steps with >1 job live, peak %d responses; max |Δ logprob| vs alone %.2e\n",
           st.steps, st.dec_calls, shared_steps, max_running, worst);
    CHECK_EQ_INT(st.rows_used, 0);
    for (int i = 0; i < 3; i++) {
        eng_sched_job_release(s, j[i]);
        free_req(&alone[i]);
        free_req(&mixed[i]);
    }
    eng_sched_close(s);
    eng_close(e);
    CHECK_MSG(same, "a job's tokens, finish reasons or texts changed when it shared the batch");
    CHECK_MSG(worst <= 1e-5, "logprobs differ from alone by %.3g", worst);
    CHECK_MSG(shared_steps >= 5, "the jobs did not overlap (%d shared steps)", shared_steps);
}

TEST(admission_waits_for_rows_and_proceeds) {
    eng *e = open_default();
    CHECK(e);
    eng_rollout_group g1 = {prompt_a, 12, 4}, g2 = {prompt_b, 17, 3};
    eng_sampling s1, s2;
    eng_sampling_default(&s1);
    s1.max_tokens = 30;
    s1.seed = 3;
    s1.ignore_eos = 1;
    s2 = s1;
    s2.seed = 4;
    long long need1 = eng_sched_rows_needed(&g1, &s1), need2 = eng_sched_rows_needed(&g2, &s2);
    eng_group_result a1, a2, m1, m2;
    CHECK(eng_rollout(e, &g1, 1, &s1, &a1, NULL, NULL) == 0);
    CHECK(eng_rollout(e, &g2, 1, &s2, &a2, NULL, NULL) == 0);
    eng_sched *s;
    eng_sched_opts o = {.kv_rows = (int)(need1 > need2 ? need1 : need2) + 10}; /* one group at a time */
    CHECK(eng_sched_open(e, &o, &s) == 0);
    eng_sched_job *j1, *j2;
    CHECK(eng_sched_add(s, &g1, 1, &s1, &m1, &j1) == 0);
    CHECK(eng_sched_add(s, &g2, 1, &s2, &m2, &j2) == 0);
    eng_sched_step(s);
    eng_sched_stats st;
    eng_sched_get_stats(s, &st);
    int started2;
    eng_sched_job_state(j2, NULL, &started2, NULL);
    CHECK_EQ_INT(st.waiting_groups, 1);
    CHECK_EQ_INT(st.rows_used, need1);
    CHECK_EQ_INT(started2, 0);
    CHECK(!eng_sched_can_admit(s));
    int steps1 = 0;
    while (eng_sched_job_state(j1, NULL, NULL, NULL) == 0 && steps1 < 100) {
        eng_sched_step(s);
        steps1++;
        eng_sched_get_stats(s, &st);
        CHECK(st.rows_used <= st.rows_cap);
    }
    CHECK_EQ_INT(eng_sched_job_state(j1, NULL, NULL, NULL), 1);
    CHECK_EQ_INT(run_until_done(s, j2, 100), 1);
    eng_sched_get_stats(s, &st);
    CHECK_EQ_INT(st.rows_used, 0);
    double w1 = compare(&a1, &m1, 1), w2 = compare(&a2, &m2, 1);
    eng_sched_job_release(s, j1);
    eng_sched_job_release(s, j2);
    eng_sched_close(s);
    eng_group_result_free(&a1);
    eng_group_result_free(&a2);
    eng_group_result_free(&m1);
    eng_group_result_free(&m2);
    eng_close(e);
    CHECK_MSG(w1 >= 0 && w1 <= 1e-5 && w2 >= 0 && w2 <= 1e-5, "results differ from alone (%g, %g)", w1, w2);
}

TEST(group_that_never_fits_is_a_clear_error) {
    eng *e = open_default();
    CHECK(e);
    eng_sched *s;
    eng_sched_opts o = {.kv_rows = 100};
    CHECK(eng_sched_open(e, &o, &s) == 0);
    eng_rollout_group g[2] = {{prompt_c, 3, 2}, {prompt_a, 12, 8}};
    eng_sampling sp;
    eng_sampling_default(&sp);
    sp.max_tokens = 16; /* group 1 needs 12 + 8 x 16 = 140 rows */
    eng_group_result out[2];
    eng_sched_job *j = (eng_sched_job *)&o;
    int rc = eng_sched_add(s, g, 2, &sp, out, &j);
    eng_sched_stats st;
    eng_sched_get_stats(s, &st);
    eng_sched_close(s);
    eng_close(e);
    CHECK_EQ_INT(rc, GE_TOO_LARGE);
    CHECK(j == NULL);
    CHECK_EQ_INT(st.jobs, 0);
    CHECK_MSG(strstr(err_msg(), "group 1 needs 140 KV rows") && strstr(err_msg(), "holds 100 rows"), "message: %s", err_msg());
}

TEST(cancel_frees_rows_and_others_go_on) {
    eng *e = open_default();
    CHECK(e);
    eng_rollout_group g1 = {prompt_a, 12, 6}, g2 = {prompt_c, 3, 2};
    eng_sampling sp;
    eng_sampling_default(&sp);
    sp.max_tokens = 40;
    sp.seed = 5;
    sp.ignore_eos = 1;
    eng_group_result alone, m1, m2;
    CHECK(eng_rollout(e, &g2, 1, &sp, &alone, NULL, NULL) == 0);
    eng_sched *s;
    eng_sched_opts o = {.kv_rows = 2000};
    CHECK(eng_sched_open(e, &o, &s) == 0);
    eng_sched_job *j1, *j2;
    CHECK(eng_sched_add(s, &g1, 1, &sp, &m1, &j1) == 0);
    CHECK(eng_sched_add(s, &g2, 1, &sp, &m2, &j2) == 0);
    for (int i = 0; i < 5; i++) eng_sched_step(s);
    eng_sched_stats st;
    eng_sched_get_stats(s, &st);
    CHECK_EQ_INT(st.rows_used, eng_sched_rows_needed(&g1, &sp) + eng_sched_rows_needed(&g2, &sp));
    CHECK_EQ_INT(st.running_responses, 8);
    CHECK_EQ_INT(st.dec_calls, 6); /* same draw parameters: one prefill call, then one decode call a step */
    double p1;
    CHECK_EQ_INT(eng_sched_job_state(j1, &p1, NULL, NULL), 0);
    CHECK(p1 > 0.05 && p1 < 0.5);
    eng_sched_job_release(s, j1); /* DELETE while running */
    eng_sched_get_stats(s, &st);
    CHECK_EQ_INT(st.rows_used, eng_sched_rows_needed(&g2, &sp));
    CHECK_EQ_INT(st.running_responses, 2);
    CHECK(m1.resp == NULL);
    CHECK_EQ_INT(run_until_done(s, j2, 100), 1);
    eng_sched_get_stats(s, &st);
    CHECK_EQ_INT(st.rows_used, 0);
    CHECK(!eng_sched_busy(s));
    double w = compare(&alone, &m2, 1);
    eng_sched_job_release(s, j2);
    eng_sched_close(s);
    eng_group_result_free(&alone);
    eng_group_result_free(&m2);
    eng_close(e);
    CHECK_MSG(w >= 0 && w <= 1e-5, "the surviving job changed (%g)", w);
}

/* A request split into shares (as the daemon splits one across ranks), each share's sampling
 * naming its groups' indexes in the original request (group_index), gives the tokens of the
 * whole request. */
TEST(split_request_with_group_index_matches_whole) {
    eng *e = open_default();
    CHECK_MSG(e, "%s", err_msg());
    req whole[3], part[3];
    make_reqs(whole);
    make_reqs(part);
    req *w = &whole[1], *p = &part[1]; /* three groups, temperature 0.8 */
    CHECK(eng_rollout(e, w->g, w->n_groups, &w->s, w->out, NULL, NULL) == 0);
    eng_rollout_group a[2] = {p->g[0], p->g[2]}, b[1] = {p->g[1]};
    static const int ia[2] = {0, 2}, ib[1] = {1};
    eng_sampling sa = p->s, sb = p->s;
    sa.group_index = ia;
    sb.group_index = ib;
    eng_group_result oa[2], ob[1], moved[3];
    CHECK(eng_rollout(e, b, 1, &sb, ob, NULL, NULL) == 0);
    CHECK(eng_rollout(e, a, 2, &sa, oa, NULL, NULL) == 0);
    moved[0] = oa[0];
    moved[1] = ob[0];
    moved[2] = oa[1];
    double d = compare(w->out, moved, 3);
    /* without the index the moved group draws other tokens: the check above can fail */
    eng_group_result oc[1];
    CHECK(eng_rollout(e, b, 1, &p->s, oc, NULL, NULL) == 0);
    double d0 = compare(&w->out[1], oc, 1);
    for (int i = 0; i < 3; i++) eng_group_result_free(&moved[i]);
    eng_group_result_free(&oc[0]);
    free_req(w);
    eng_close(e);
    CHECK_MSG(d >= 0 && d <= 1e-5, "the split request's tokens differ from the whole one's (gap %g)", d);
    CHECK_MSG(d0 < 0, "a group moved without its group_index drew the same tokens: the check proves nothing");
}

/* sampling.top_logprobs: each sampled token's k alternatives come from the decode step; on the
 * cpu backend they are eng_logprobs_top's of the same response (prompt + tokens), bit for bit,
 * at the sampling temperature and greedy (temperature 1), with rows that do not ask beside them. */
TEST(rollout_top_logprobs_are_the_scorers) {
    eng *e = open_default();
    CHECK_MSG(e, "%s", err_msg());
    enum { K = 5, N = 3 };
    static const int prompt[] = {72, 101, 108, 108, 111, 44, 32};
    for (int greedy = 0; greedy < 2; greedy++) {
        eng_rollout_group g[2] = {{prompt, 7, N}, {prompt + 2, 5, N}};
        eng_sampling s;
        eng_sampling_default(&s);
        s.temperature = greedy ? 0 : 0.7f;
        s.max_tokens = 12;
        s.seed = 3;
        s.ignore_eos = 1;
        s.top_logprobs = K;
        eng_sampling plain = s;
        plain.top_logprobs = 0;
        plain.seed = 9;
        eng_group_result out[2], other[2];
        eng_sched *sc;
        eng_sched_opts o = {.kv_rows = 4096};
        eng_sched_job *j1, *j2;
        CHECK(eng_sched_open(e, &o, &sc) == 0);
        CHECK(eng_sched_add(sc, g, 2, &s, out, &j1) == 0);
        CHECK(eng_sched_add(sc, g, 2, &plain, other, &j2) == 0);
        while (eng_sched_busy(sc)) eng_sched_step(sc);
        CHECK_EQ_INT(eng_sched_job_state(j1, NULL, NULL, NULL), 1);
        for (int i = 0; i < 2; i++) {
            const int *resp[N];
            int R[N];
            for (int k = 0; k < N; k++) resp[k] = out[i].resp[k].tokens, R[k] = out[i].resp[k].n_tokens;
            eng_update_group ug = {.prompt = g[i].prompt, .P = g[i].P, .n = N, .resp = resp, .R = R};
            float **lp;
            int **ids;
            float **lps;
            CHECK_MSG(eng_logprobs_top(e, &ug, 1, 0, greedy ? 1.0f : s.temperature, 1 << 20, K, &lp, &ids, &lps) == 0, "%s",
                      err_msg());
            int diff = 0, chosen = 0;
            for (int k = 0; k < N; k++) {
                const eng_response *x = &out[i].resp[k];
                CHECK(x->top_ids && !other[i].resp[k].top_ids);
                diff += memcmp(x->top_ids, ids[k], sizeof(int) * K * R[k]) != 0;
                diff += memcmp(x->top_lps, lps[k], sizeof(float) * K * R[k]) != 0;
                for (int t = 0; greedy && t < R[k]; t++) chosen += x->top_ids[t * K] == x->tokens[t];
            }
            CHECK_MSG(diff == 0, "group %d: %d responses' top tokens differ from the scorer's", i, diff);
            if (greedy) CHECK_EQ_INT(chosen, N * 12); /* greedy draws the first alternative */
            eng_logprobs_free(lp, &ug, 1);
            eng_logprobs_top_free(ids, lps, &ug, 1);
        }
        eng_sched_job_release(sc, j1);
        eng_sched_job_release(sc, j2);
        eng_sched_close(sc);
        for (int i = 0; i < 2; i++) eng_group_result_free(&out[i]), eng_group_result_free(&other[i]);
    }
    eng_close(e);
}

int main(void) {
    system("rm -rf " MODEL);
    RUN(rollout_top_logprobs_are_the_scorers);
    RUN(kvpool_first_fit_coalesces);
    RUN(jobs_joining_at_different_steps_match_alone);
    RUN(admission_waits_for_rows_and_proceeds);
    RUN(group_that_never_fits_is_a_clear_error);
    RUN(cancel_frees_rows_and_others_go_on);
    RUN(split_request_with_group_index_matches_whole);
    RUN(rollout_top_logprobs_are_the_scorers);
    return CHECK_DONE();
}
