/* test_replay.c — routing replay (R3) through the engine on the CPU backend: the routes a rollout
 * records for a MoE model (eng_response.routes, eng_group_result.prompt_routes) and their replay
 * by the update and scoring passes (eng_update_group's routes).
 *
 * The fixture (tests/fixtures/data/qwen3_moe: layers 0 and 2 MoE, 8 experts, top-2) has weights
 * of scale 0.02, so its router logits are nearly tied: a small change of the weights changes
 * some tokens' top-k, as bf16 rounding or another batch does between a sampler and a trainer.
 *
 * On one backend the rollout and the trainer route alike, so replaying the recorded routes gives
 * the rollout's logprobs bit for bit, and so does routing freely (the control that the routes
 * were recorded where the trainer reads them: a route at the wrong token changes the logprobs).
 * After the policy moves, replay keeps the rollout's experts: its logprobs differ from free
 * routing's, and the update's old pass with replay differs from the one without. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/err.h"
#include "engine/engine.h"

#define FIX "tests/fixtures/data"

enum { NGR = 2 };
static const int prompt0[] = {11, 200, 37, 5, 150, 42, 7}, prompt1[] = {64, 3, 99};

typedef struct {
    eng *e;
    eng_info info;
    eng_rollout_group rg[NGR];
    eng_group_result res[NGR];
    eng_update_group ug[NGR];
    const int *resp[NGR][4], *rroutes[NGR][4];
    const float *lps[NGR][4];
    int R[NGR][4];
    float reward[NGR][4];
} replay_env;

static void env_open(replay_env *v) {
    memset(v, 0, sizeof *v);
    eng_open_opts o = {.model_dir = FIX "/qwen3_moe", .backend = "cpu"};
    CHECK_MSG(eng_open(&o, &v->e) == 0, "%s", err_msg());
    eng_get_info(v->e, &v->info);
    CHECK(v->info.moe_layers == 2 && v->info.top_k == 2);
    v->rg[0] = (eng_rollout_group){prompt0, 7, 3};
    v->rg[1] = (eng_rollout_group){prompt1, 3, 2};
    eng_sampling s;
    eng_sampling_default(&s);
    s.max_tokens = 9;
    s.seed = 21;
    CHECK(eng_rollout(v->e, v->rg, NGR, &s, v->res, NULL, NULL) == 0);
    for (int g = 0; g < NGR; g++) {
        for (int r = 0; r < v->res[g].n; r++) {
            v->resp[g][r] = v->res[g].resp[r].tokens;
            v->rroutes[g][r] = v->res[g].resp[r].routes;
            v->lps[g][r] = v->res[g].resp[r].logprobs;
            v->R[g][r] = v->res[g].resp[r].n_tokens;
            v->reward[g][r] = (float)((r * 7 + g * 3) % 5) / 4.0f;
        }
        v->ug[g] = (eng_update_group){.prompt = v->rg[g].prompt,
                                      .P = v->rg[g].P,
                                      .n = v->rg[g].n,
                                      .resp = v->resp[g],
                                      .R = v->R[g],
                                      .reward = v->reward[g],
                                      .old_logprobs = v->lps[g],
                                      .prompt_routes = v->res[g].prompt_routes,
                                      .resp_routes = v->rroutes[g]};
    }
}

static void env_close(replay_env *v) {
    for (int g = 0; g < NGR; g++) eng_group_result_free(&v->res[g]);
    eng_close(v->e);
}

/* The groups with their routes (replay) or without. */
static void with_routes(replay_env *v, eng_update_group *out, int replay) {
    for (int g = 0; g < NGR; g++) {
        out[g] = v->ug[g];
        if (!replay) out[g].prompt_routes = NULL, out[g].resp_routes = NULL;
    }
}

/* One optimizer step at lr 1e-4 on the groups without replay: the policy moves (at lr 1e-5 no
 * top-k changes and the checks after it fail). */
static void move_policy(replay_env *v) {
    eng_update_group g[NGR];
    with_routes(v, g, 0);
    loss_config a;
    loss_config_default(&a);
    eng_optim o;
    eng_optim_default(&o);
    o.lr = 1e-4f;
    eng_update_result u;
    CHECK_MSG(eng_update(v->e, g, NGR, &a, &o, 1 << 20, &u, NULL, NULL) == 0, "%s", err_msg());
}

/* Largest |a - b| over the groups' responses (a, b from eng_logprobs); *bits: all equal bits. */
static double worst_gap(const replay_env *v, float **a, const float *const *const *b, int *bits) {
    double w = 0;
    int i = 0;
    *bits = 1;
    for (int g = 0; g < NGR; g++)
        for (int r = 0; r < v->ug[g].n; r++, i++)
            for (int t = 0; t < v->R[g][r]; t++) {
                double d = fabs((double)a[i][t] - b[g][r][t]);
                w = d > w ? d : w;
                *bits &= !memcmp(&a[i][t], &b[g][r][t], 4);
            }
    return w;
}

TEST(rollout_records_every_fed_token) {
    replay_env v;
    env_open(&v);
    int W = v.info.moe_layers * v.info.top_k, E = 8;
    for (int g = 0; g < NGR; g++) {
        CHECK(v.res[g].prompt_routes && v.res[g].cached_tokens == 0);
        for (int t = 0; t < v.rg[g].P * W; t++) CHECK(v.res[g].prompt_routes[t] >= 0 && v.res[g].prompt_routes[t] < E);
        for (int r = 0; r < v.res[g].n; r++) {
            const eng_response *o = &v.res[g].resp[r];
            CHECK(o->routes && o->n_tokens >= 1);
            for (int t = 0; t < (o->n_tokens - 1) * W; t++) CHECK(o->routes[t] >= 0 && o->routes[t] < E);
            for (int j = 0; j < W; j++) CHECK(o->routes[(o->n_tokens - 1) * W + j] == -1); /* never fed */
            for (int t = 0; t + 1 < o->n_tokens; t++) /* k distinct experts per layer */
                for (int l = 0; l < v.info.moe_layers; l++) CHECK(o->routes[t * W + l * 2] != o->routes[t * W + l * 2 + 1]);
        }
    }
    /* a longer response: its rows grow as it decodes (16, 32, 64), every fed token recorded */
    eng_sampling sp;
    eng_sampling_default(&sp);
    sp.max_tokens = 37;
    eng_group_result res;
    CHECK(eng_rollout(v.e, &v.rg[1], 1, &sp, &res, NULL, NULL) == 0);
    for (int r = 0; r < res.n; r++) {
        const eng_response *o = &res.resp[r];
        CHECK(o->n_tokens == 37 && o->routes);
        for (int t = 0; t < 37 * W; t++) CHECK(t < 36 * W ? o->routes[t] >= 0 && o->routes[t] < E : o->routes[t] == -1);
    }
    eng_group_result_free(&res);
    env_close(&v);
}

TEST(replay_gives_the_rollout_logprobs) {
    replay_env v;
    env_open(&v);
    eng_update_group g[NGR];
    const float *const *want[NGR] = {v.lps[0], v.lps[1]};
    float **lp;
    int bits;
    with_routes(&v, g, 1);
    CHECK_MSG(eng_logprobs(v.e, g, NGR, 0, 1.0f, 1 << 20, &lp) == 0, "%s", err_msg());
    double replay = worst_gap(&v, lp, want, &bits);
    CHECK_MSG(bits, "replayed logprobs differ from the rollout's by %.3g", replay);
    eng_logprobs_free(lp, g, NGR);
    with_routes(&v, g, 0);
    CHECK(eng_logprobs(v.e, g, NGR, 0, 1.0f, 1 << 20, &lp) == 0);
    double free_gap = worst_gap(&v, lp, want, &bits);
    CHECK(bits);
    eng_logprobs_free(lp, g, NGR);
    /* the control: one prompt token's routes given to its neighbour change the logprobs */
    with_routes(&v, g, 1);
    int W = v.info.moe_layers * v.info.top_k, *moved = malloc((size_t)v.rg[0].P * W * sizeof(int));
    memcpy(moved, v.res[0].prompt_routes, (size_t)v.rg[0].P * W * sizeof(int));
    for (int t = 0; t + 1 < v.rg[0].P; t++) memcpy(moved + t * W, v.res[0].prompt_routes + (t + 1) * W, (size_t)W * sizeof(int));
    g[0].prompt_routes = moved;
    CHECK(eng_logprobs(v.e, g, NGR, 0, 1.0f, 1 << 20, &lp) == 0);
    double shifted = worst_gap(&v, lp, want, &bits);
    eng_logprobs_free(lp, g, NGR);
    free(moved);
    printf("  max |logprob - rollout's|: replayed %.3g, free %.3g, routes shifted by a token %.3g\n", replay, free_gap, shifted);
    CHECK_MSG(shifted > 1e-6, "routes shifted by one token change nothing (%.3g)", shifted);
    /* the update's old pass: with veRL's rollout correction metrics, old vs rollout logprobs */
    with_routes(&v, g, 1);
    loss_config a;
    loss_config_default(&a);
    a.rollout_is = RIS_TOKEN;
    eng_optim o;
    eng_optim_default(&o);
    eng_update_result u;
    CHECK_MSG(eng_update(v.e, g, NGR, &a, &o, 1 << 20, &u, NULL, NULL) == 0, "%s", err_msg());
    printf("  update's old pass vs the rollout: max |diff| %.3g (mean %.3g)\n", u.rc.abs_diff_max, u.rc.abs_diff_mean);
    CHECK(u.rollout_corr && u.rc.abs_diff_max == 0.0);
    env_close(&v);
}

TEST(replay_keeps_the_rollout_experts_after_the_policy_moves) {
    replay_env v;
    env_open(&v);
    move_policy(&v);
    eng_update_group g[NGR];
    float **lr_, **lf;
    int bits;
    with_routes(&v, g, 1);
    CHECK(eng_logprobs(v.e, g, NGR, 0, 1.0f, 1 << 20, &lr_) == 0);
    with_routes(&v, g, 0);
    CHECK(eng_logprobs(v.e, g, NGR, 0, 1.0f, 1 << 20, &lf) == 0);
    const float *const *free_lp[NGR];
    int i = 0;
    const float *rows[NGR][4];
    for (int k = 0; k < NGR; k++) {
        for (int r = 0; r < v.ug[k].n; r++) rows[k][r] = lf[i++];
        free_lp[k] = rows[k];
    }
    double d = worst_gap(&v, lr_, free_lp, &bits);
    printf("  after one step at lr 1e-4: max |replayed - free| logprob %.3g\n", d);
    CHECK_MSG(!bits && d > 1e-6, "replay and free routing agree after the policy moved (%.3g): no top-k changed", d);
    eng_logprobs_free(lr_, g, NGR);
    eng_logprobs_free(lf, g, NGR);
    /* the old pass with replay against the rollout is another number than without */
    loss_config a;
    loss_config_default(&a);
    a.rollout_is = RIS_TOKEN;
    eng_optim o;
    eng_optim_default(&o);
    o.lr = 0;
    eng_update_result u;
    double gap[2];
    for (int rp = 0; rp < 2; rp++) {
        with_routes(&v, g, rp);
        CHECK(eng_update(v.e, g, NGR, &a, &o, 1 << 20, &u, NULL, NULL) == 0);
        gap[rp] = u.rc.abs_diff_mean;
    }
    printf("  old pass vs rollout, mean |diff|: free %.4g, replayed %.4g\n", gap[0], gap[1]);
    CHECK(gap[0] != gap[1]);
    env_close(&v);
}

/* A prompt that begins with a finished response's ids (an agent's next turn) copies their keys
 * and values from the prefix cache; their routes are not kept there, so they are -1 (the
 * trainer routes them itself, which on one backend is what the sampler did) and the rest are
 * recorded: replaying gives the rollout's logprobs bit for bit. */
/* Runs groups through scheduler s to the end. */
static void sched_run(eng_sched *s, const eng_rollout_group *g, int n, const eng_sampling *sp, eng_group_result *out) {
    eng_sched_job *j;
    CHECK(eng_sched_add(s, g, n, sp, out, &j) == 0);
    while (eng_sched_job_state(j, NULL, NULL, NULL) == 0) CHECK(eng_sched_step(s) == 0);
    CHECK(eng_sched_job_state(j, NULL, NULL, NULL) == 1);
    eng_sched_job_release(s, j);
}

TEST(prefix_cache_hits_leave_their_tokens_free) {
    replay_env v;
    env_open(&v);
    eng_sched *sc;
    CHECK(eng_sched_open(v.e, NULL, &sc) == 0);
    eng_sampling s;
    eng_sampling_default(&s);
    s.max_tokens = 5;
    eng_rollout_group rg0 = {prompt0, 7, 1};
    eng_group_result first;
    sched_run(sc, &rg0, 1, &s, &first);
    const eng_response *o = &first.resp[0];
    int P2 = 7 + o->n_tokens + 2, *p2 = malloc((size_t)P2 * sizeof(int));
    memcpy(p2, prompt0, 7 * sizeof(int));
    memcpy(p2 + 7, o->tokens, (size_t)o->n_tokens * sizeof(int));
    p2[P2 - 2] = 5, p2[P2 - 1] = 77;
    eng_rollout_group rg = {p2, P2, 2};
    eng_group_result res;
    sched_run(sc, &rg, 1, &s, &res);
    int W = v.info.moe_layers * v.info.top_k, c = res.cached_tokens;
    CHECK_MSG(c > 0 && c < P2, "cached %d of %d", c, P2);
    for (int t = 0; t < P2 * W; t++) CHECK(t < c * W ? res.prompt_routes[t] == -1 : res.prompt_routes[t] >= 0);
    const int *resp[2] = {res.resp[0].tokens, res.resp[1].tokens}, *rr[2] = {res.resp[0].routes, res.resp[1].routes};
    int R[2] = {res.resp[0].n_tokens, res.resp[1].n_tokens};
    eng_update_group g = {
        .prompt = p2, .P = P2, .n = 2, .resp = resp, .R = R, .prompt_routes = res.prompt_routes, .resp_routes = rr};
    float **lp;
    CHECK(eng_logprobs(v.e, &g, 1, 0, 1.0f, 1 << 20, &lp) == 0);
    for (int r = 0; r < 2; r++) CHECK(!memcmp(lp[r], res.resp[r].logprobs, (size_t)R[r] * sizeof(float)));
    printf("  %d of %d prompt ids from the prefix cache: their routes -1, the rest recorded; replay bit-equal\n", c, P2);
    eng_logprobs_free(lp, &g, 1);
    eng_group_result_free(&res);
    eng_group_result_free(&first);
    eng_sched_close(sc);
    free(p2);
    env_close(&v);
}

/* The split schedule (a group larger than a micro-batch: its prompt once, its responses in
 * micro-batches reading the cached prompt, engine/model/split.h) replays the same routes: its
 * logprobs equal the one-micro-batch ones with replay, after the policy moved (so replay and free
 * routing differ, and a split that dropped the routes would show). */
TEST(split_schedule_replays_the_routes) {
    replay_env v;
    env_open(&v);
    move_policy(&v);
    eng_update_group g[NGR];
    float **one, **split, **split_free;
    with_routes(&v, g, 1);
    CHECK(eng_logprobs(v.e, g, NGR, 0, 1.0f, 1 << 20, &one) == 0);
    CHECK_MSG(eng_logprobs(v.e, g, NGR, 0, 1.0f, 12, &split) == 0, "%s", err_msg()); /* group 0: P 7 + 3 responses > 12 */
    with_routes(&v, g, 0);
    CHECK(eng_logprobs(v.e, g, NGR, 0, 1.0f, 12, &split_free) == 0);
    const float *rows[NGR][4], *const *want[NGR];
    for (int k = 0, i = 0; k < NGR; k++) {
        for (int r = 0; r < v.ug[k].n; r++) rows[k][r] = one[i++];
        want[k] = rows[k];
    }
    int bits, bits_free;
    double d = worst_gap(&v, split, want, &bits), d_free = worst_gap(&v, split_free, want, &bits_free);
    printf("  split vs one micro-batch, replayed: max |diff| %.3g; split free vs one replayed: %.3g\n", d, d_free);
    CHECK_MSG(d <= 1e-5, "split replay differs by %.3g", d); /* the same sums in another order (split.c's prompt dK/dV) */
    CHECK_MSG(d_free > 1e-3, "free routing agrees with replay (%.3g): the check above shows nothing", d_free);
    eng_logprobs_free(one, g, NGR);
    eng_logprobs_free(split, g, NGR);
    eng_logprobs_free(split_free, g, NGR);
    env_close(&v);
}

int main(void) {
    RUN(rollout_records_every_fed_token);
    RUN(replay_gives_the_rollout_logprobs);
    RUN(replay_keeps_the_rollout_experts_after_the_policy_moves);
    RUN(split_schedule_replays_the_routes);
    RUN(prefix_cache_hits_leave_their_tokens_free);
    return CHECK_DONE();
}
