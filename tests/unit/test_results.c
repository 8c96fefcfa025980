/* test_results.c — the results a job stores, written by rows (daemon/results.h), against the
 * writers they replace.
 *
 * The old_* functions below are daemon/jobs.c's hand-built results as they were (main at
 * 61826ff), each reading the same struct the rows read: random results of every kind (updates
 * with and without a rollout correction, non-finite metrics, rollouts with and without rewards,
 * top logprobs, metadata, empty groups, texts with NULs; logprobs of either model) go through
 * both, and their texts must be equal byte for byte. Then GET /metrics: a child process writes
 * a batch of results with the old writers, another with the rows, and each renders /metrics;
 * the two texts must be equal (the rows feed the counters the old writers fed by hand). Last,
 * the dashboard's history points (daemon/history.c, also rows now) read from those results. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api/metrics.h"
#include "daemon/history.h"
#include "daemon/results.h"
#include "engine/params.h"
#include "tests/unit/check.h"

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(uint32_t n) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33) % n;
}
static double urand(void) { return (double)rnd(1u << 30) / (double)(1u << 30); }

/* A number, now and then not finite or an edge. */
static double rnum(void) {
    switch (rnd(16)) {
    case 0: return NAN;
    case 1: return rnd(2) ? INFINITY : -INFINITY;
    case 2: return 0.0;
    case 3: return (double)(float)(urand() * 1e-30);
    case 4: return (double)rnd(1000000);
    default: return (urand() - 0.5) * pow(10, (int)rnd(12) - 6);
    }
}

/* ---------------------------------------------------------------- the old writers */

static json_object *ints_json(const int *x, int n) {
    json_object *a = json_object_new_array_ext(n);
    for (int i = 0; i < n; i++) json_object_array_add(a, json_object_new_int(x[i]));
    return a;
}
static json_object *floats_json(const float *x, int n) {
    json_object *a = json_object_new_array_ext(n);
    for (int i = 0; i < n; i++) json_object_array_add(a, json_object_new_double(isfinite(x[i]) ? x[i] : -1e30));
    return a;
}
static char *to_text(json_object *o) {
    char *s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
    return s;
}

static char *old_update(const eng_update_result *up) {
    eng_update_result u = *up;
    json_object *res = json_object_new_object(), *m = json_object_new_object(), *t = json_object_new_object(),
                *tm = json_object_new_object();
    json_object_object_add(res, "policy_version_before", json_object_new_int64(u.policy_version_before));
    json_object_object_add(res, "policy_version_after", json_object_new_int64(u.policy_version_after));
#define M_(k) json_object_object_add(m, #k, json_object_new_double(isfinite(u.k) ? u.k : 0))
    M_(loss);
    M_(pg_loss);
    M_(kl);
    M_(entropy);
    M_(clip_frac);
    M_(clip_frac_low);
    M_(clip_frac_high);
    M_(ratio_mean);
    M_(ratio_max);
    M_(grad_norm);
    M_(lr);
#undef M_
#define V_(name, k) json_object_object_add(m, name, json_object_new_double(isfinite(u.k) ? u.k : 0))
    V_("actor/pg_clipfrac", pg_clipfrac);
    V_("actor/pg_clipfrac_lower", pg_clipfrac_lower);
    V_("actor/ppo_kl", ppo_kl);
    V_("actor/kl_loss", kl_loss);
    V_("actor/entropy", verl_entropy);
    if (u.rollout_corr) {
        V_("rollout_corr/kl", rc.kl);
        V_("rollout_corr/k3_kl", rc.k3_kl);
        V_("rollout_corr/chi2_token", rc.chi2_token);
        V_("rollout_corr/log_ppl_diff", rc.log_ppl_diff);
        V_("rollout_corr/training_log_ppl", rc.training_log_ppl);
        V_("rollout_corr/rollout_log_ppl", rc.rollout_log_ppl);
        V_("rollout_corr/logprob_abs_diff_mean", rc.abs_diff_mean);
        V_("rollout_corr/logprob_abs_diff_max", rc.abs_diff_max);
        V_("rollout_corr/rollout_is_mean", rc.is_mean);
        V_("rollout_corr/rollout_is_max", rc.is_max);
        V_("rollout_corr/rollout_is_ratio_fraction_high", rc.is_ratio_fraction_high);
        V_("rollout_corr/rollout_is_ratio_fraction_low", rc.is_ratio_fraction_low);
        V_("rollout_corr/rollout_is_oob_ratio", rc.is_oob_ratio);
        V_("rollout_corr/rollout_rs_masked_fraction", rc.rs_masked_fraction);
        V_("rollout_corr/rollout_rs_seq_masked_fraction", rc.rs_seq_masked_fraction);
    }
#undef V_
    json_object_object_add(m, "loss_scale_factor", json_object_new_int(u.loss_scale_factor));
    json_object_object_add(m, "groups_filtered", json_object_new_int(u.groups_filtered));
    json_object_object_add(m, "optimizer_steps", json_object_new_int(u.optimizer_steps));
    json_object_object_add(m, "micro_batches", json_object_new_int(u.micro_batches));
    json_object_object_add(res, "metrics", m);
    json_object_object_add(t, "packed", json_object_new_int64(u.tokens_packed));
    json_object_object_add(t, "standard", json_object_new_int64(u.tokens_standard));
    json_object_object_add(t, "ratio",
                           json_object_new_double(u.tokens_packed ? (double)u.tokens_standard / (double)u.tokens_packed : 0));
    json_object_object_add(res, "tokens", t);
    json_object_object_add(tm, "old", json_object_new_double(u.ms_old));
    json_object_object_add(tm, "ref", json_object_new_double(u.ms_ref));
    json_object_object_add(tm, "policy", json_object_new_double(u.ms_policy));
    json_object_object_add(tm, "optimizer", json_object_new_double(u.ms_optimizer));
    json_object_object_add(tm, "snapshot_wait", json_object_new_double(u.ms_snapshot_wait));
    json_object_object_add(tm, "total", json_object_new_double(u.ms_total));
    json_object_object_add(res, "timings_ms", tm);
    metrics_tokens(MT_UPDATE_PACKED, u.tokens_packed);
    metrics_tokens(MT_UPDATE_STANDARD, u.tokens_standard);
    metrics_seconds(MS_OLD, u.ms_old / 1e3);
    metrics_seconds(MS_REF, u.ms_ref / 1e3);
    metrics_seconds(MS_POLICY, u.ms_policy / 1e3);
    metrics_seconds(MS_OPTIMIZER, u.ms_optimizer / 1e3);
    metrics_groups_filtered(u.groups_filtered);
    metrics_policy_version(u.policy_version_after);
    return to_text(res);
}

static char *old_rollout(const results_rollout *r) {
    json_object *res = json_object_new_object(), *rgs = json_object_new_array();
    for (int i = 0; i < r->n_groups; i++) {
        const results_group *g = &r->groups[i];
        json_object *og = json_object_new_object(), *rs = json_object_new_array();
        for (int k = 0; k < g->n; k++) {
            const results_response *x = &g->resp[k];
            json_object *o = json_object_new_object();
            json_object_object_add(o, "token_ids", ints_json(x->tokens, x->n_tokens));
            json_object_object_add(o, "text", json_object_new_string_len(x->text, (int)x->text_len));
            json_object_object_add(o, "logprobs", floats_json(x->logprobs, x->n_tokens));
            if (x->top_ids) {
                json_object *ti = json_object_new_array(), *tl = json_object_new_array();
                for (int t = 0; t < x->n_tokens; t++) {
                    json_object_array_add(ti, ints_json(x->top_ids + (size_t)t * x->top_k, x->top_k));
                    json_object_array_add(tl, floats_json(x->top_lps + (size_t)t * x->top_k, x->top_k));
                }
                json_object_object_add(o, "top_ids", ti);
                json_object_object_add(o, "top_logprobs", tl);
            }
            json_object_object_add(o, "finish_reason", json_object_new_string(x->finish == FINISH_LENGTH ? "length" : "stop"));
            if (x->scored) json_object_object_add(o, "reward", json_object_new_double((float)x->reward));
            else json_object_object_add(o, "reward", NULL);
            json_object_array_add(rs, o);
        }
        json_object_object_add(og, "prompt_ids", ints_json(g->prompt, g->P));
        json_object_object_add(og, "cached_tokens", json_object_new_int(g->cached_tokens));
        if (g->scored) {
            json_object_object_add(og, "reward_mean", json_object_new_double(g->reward_mean));
            json_object_object_add(og, "reward_std", json_object_new_double(g->reward_std));
        } else {
            json_object_object_add(og, "reward_mean", NULL);
            json_object_object_add(og, "reward_std", NULL);
        }
        if (g->metadata) {
            json_object *c = NULL;
            if (!json_object_deep_copy(g->metadata, &c, NULL)) json_object_object_add(og, "metadata", c);
        }
        json_object_object_add(og, "responses", rs);
        json_object_array_add(rgs, og);
    }
    json_object *usage = json_object_new_object(), *tm = json_object_new_object();
    json_object_object_add(usage, "prompt_tokens", json_object_new_int64(r->prompt_tokens));
    json_object_object_add(usage, "completion_tokens", json_object_new_int64(r->completion_tokens));
    json_object *ptd = json_object_new_object();
    json_object_object_add(ptd, "cached_tokens", json_object_new_int64(r->cached_tokens));
    json_object_object_add(usage, "prompt_tokens_details", ptd);
    json_object_object_add(tm, "total", json_object_new_double(r->ms_total));
    json_object_object_add(res, "policy_version", json_object_new_int64(r->policy_version));
    json_object_object_add(res, "groups", rgs);
    json_object_object_add(res, "usage", usage);
    json_object_object_add(res, "timings_ms", tm);
    metrics_tokens(MT_ROLLOUT_PROMPT, r->prompt_tokens);
    metrics_tokens(MT_ROLLOUT_COMPLETION, r->completion_tokens);
    metrics_seconds(MS_ROLLOUT, r->ms_total / 1e3);
    return to_text(res);
}

static char *old_logprobs(const results_logprobs *l) {
    json_object *res = json_object_new_object(), *gs = json_object_new_array();
    for (int i = 0; i < l->n_groups; i++) {
        json_object *g = json_object_new_object(), *rs = json_object_new_array();
        for (int k = 0; k < l->groups[i].n; k++) {
            const results_scored *x = &l->groups[i].resp[k];
            int top_k = x->top_k;
            json_object *r = json_object_new_object();
            json_object_object_add(r, "logprobs", floats_json(x->logprobs, x->R));
            if (top_k > 0) {
                json_object *ti = json_object_new_array(), *tl = json_object_new_array();
                for (int t = 0; t < x->R; t++) {
                    json_object_array_add(ti, ints_json(x->top_ids + (size_t)t * top_k, top_k));
                    json_object_array_add(tl, floats_json(x->top_lps + (size_t)t * top_k, top_k));
                }
                json_object_object_add(r, "top_ids", ti);
                json_object_object_add(r, "top_logprobs", tl);
            }
            json_object_array_add(rs, r);
        }
        json_object_object_add(g, "responses", rs);
        json_object_array_add(gs, g);
    }
    json_object_object_add(res, "groups", gs);
    json_object_object_add(res, "model", json_object_new_string(l->model == ENG_LP_REFERENCE ? "reference" : "policy"));
    json_object_object_add(res, "policy_version", json_object_new_int64(l->policy_version));
    return to_text(res);
}

static char *old_checkpoint(const results_checkpoint *c) {
    json_object *res = json_object_new_object();
    json_object_object_add(res, "id", json_object_new_string(c->id));
    json_object_object_add(res, "path", json_object_new_string(c->path));
    json_object_object_add(res, "policy_version", json_object_new_int64(c->policy_version));
    return to_text(res);
}


/* daemon/history.c's points as they were: the result JSON read back, its stats put by hand. */
static double num(json_object *o, const char *k1, const char *k2) {
    json_object *v = NULL;
    if (!json_object_object_get_ex(o, k1, &v)) return 0;
    if (k2 && !json_object_object_get_ex(v, k2, &v)) return 0;
    return json_object_get_double(v);
}
static void put(json_object *o, const char *k, double v) {
    json_object_object_add(o, k, json_object_new_double(isfinite(v) ? v : 0));
}
static json_object *old_rollout_stats(json_object *res) {
    json_object *groups, *st = json_object_new_object();
    double sum = 0, sq = 0, tokens = 0;
    long long scored = 0, responses = 0;
    if (json_object_object_get_ex(res, "groups", &groups))
        for (size_t i = 0; i < json_object_array_length(groups); i++) {
            json_object *rs = json_object_object_get(json_object_array_get_idx(groups, i), "responses");
            for (size_t k = 0; k < json_object_array_length(rs); k++) {
                json_object *r = json_object_array_get_idx(rs, k), *rw = json_object_object_get(r, "reward");
                responses++;
                if (!rw) continue;
                double x = json_object_get_double(rw);
                sum += x;
                sq += x * x;
                scored++;
            }
        }
    tokens = num(res, "usage", "completion_tokens");
    double ms = num(res, "timings_ms", "total");
    if (scored) {
        double mean = sum / (double)scored, var = sq / (double)scored - mean * mean;
        put(st, "reward_mean", mean);
        put(st, "reward_std", var > 0 ? sqrt(var) : 0);
    }
    json_object_object_add(st, "responses", json_object_new_int64(responses));
    put(st, "completion_tokens", tokens);
    put(st, "ms", ms);
    put(st, "tokens_per_s", ms > 0 ? tokens / (ms / 1e3) : 0);
    return st;
}
static json_object *old_update_stats(json_object *res) {
    json_object *st = json_object_new_object();
    static const char *const m[] = {"loss", "kl", "entropy", "clip_frac", "grad_norm", "lr", NULL};
    for (int i = 0; m[i]; i++) put(st, m[i], num(res, "metrics", m[i]));
    double packed = num(res, "tokens", "packed"), standard = num(res, "tokens", "standard"), ms = num(res, "timings_ms", "total");
    put(st, "tokens_packed", packed);
    put(st, "tokens_standard", standard);
    put(st, "ms", ms);
    put(st, "tokens_per_s", ms > 0 ? standard / (ms / 1e3) : 0);
    return st;
}
static char *old_history_point(const char *kind, const char *result, long long policy_version, long long *v) {
    int update = !strcmp(kind, "update");
    json_object *res = json_tokener_parse(result);
    if (!res) return NULL;
    json_object *stats = update ? old_update_stats(res) : old_rollout_stats(res);
    *v = update ? (long long)num(res, "policy_version_after", NULL) : policy_version;
    json_object_put(res);
    return to_text(stats);
}

/* ---------------------------------------------------------------- random results */

/* Everything a random result points to, freed at once. */
typedef struct {
    void *p[4096];
    int n;
    json_object *j[256];
    int nj;
} arena;
static void *take(arena *a, size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (a->n < 4096) a->p[a->n++] = p;
    return p;
}
static void arena_free(arena *a) {
    for (int i = 0; i < a->n; i++) free(a->p[i]);
    for (int i = 0; i < a->nj; i++) json_object_put(a->j[i]);
    a->n = a->nj = 0;
}
static int *rints(arena *a, int n) {
    int *x = take(a, sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++) x[i] = rnd(8) ? (int)rnd(152064) : -(int)rnd(3);
    return x;
}
static float *rfloats(arena *a, int n) {
    float *x = take(a, sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++) x[i] = (float)(rnd(20) ? -urand() * 30 : rnum());
    return x;
}
static char *rtext(arena *a, size_t *len) {
    static const char *bits[] = {"a", " ", "\"", "\\", "\n", "\xc3\xa9", "\xe2\x82\xac", "{", "<|im_end|>", "\t", "7", "/"};
    size_t n = rnd(40), cap = n * 12 + 2, l = 0;
    char *s = take(a, cap);
    for (size_t i = 0; i < n; i++) {
        if (!rnd(30)) s[l++] = 0; /* a NUL inside the text */
        else {
            const char *b = bits[rnd(12)];
            memcpy(s + l, b, strlen(b));
            l += strlen(b);
        }
    }
    *len = l;
    return s;
}

static void random_update(eng_update_result *u) {
    memset(u, 0, sizeof *u);
    u->policy_version_before = rnd(1000);
    u->policy_version_after = u->policy_version_before + rnd(2);
    double *d[] = {&u->loss,
                   &u->pg_loss,
                   &u->kl,
                   &u->entropy,
                   &u->clip_frac,
                   &u->clip_frac_low,
                   &u->clip_frac_high,
                   &u->ratio_mean,
                   &u->ratio_max,
                   &u->grad_norm,
                   &u->lr,
                   &u->pg_clipfrac,
                   &u->pg_clipfrac_lower,
                   &u->ppo_kl,
                   &u->kl_loss,
                   &u->verl_entropy,
                   &u->ms_old,
                   &u->ms_ref,
                   &u->ms_policy,
                   &u->ms_optimizer,
                   &u->ms_snapshot_wait,
                   &u->ms_total};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) *d[i] = i >= 16 ? urand() * 1e4 : rnum();
    u->rollout_corr = rnd(2);
    double *rc = &u->rc.kl;
    for (size_t i = 0; i < sizeof u->rc / sizeof(double); i++) rc[i] = rnum();
    u->loss_scale_factor = rnd(4096);
    u->tokens_packed = rnd(4) ? rnd(1 << 20) : 0;
    u->tokens_standard = rnd(1 << 21);
    u->groups_filtered = rnd(8);
    u->optimizer_steps = rnd(8);
    u->micro_batches = rnd(64);
}

static void random_rollout(arena *a, results_rollout *r) {
    memset(r, 0, sizeof *r);
    r->policy_version = rnd(100000);
    r->n_groups = rnd(5);
    results_group *gs = take(a, sizeof *gs * (size_t)r->n_groups);
    for (int i = 0; i < r->n_groups; i++) {
        results_group *g = &gs[i];
        int scored = rnd(2), top_k = rnd(3) ? 0 : 1 + rnd(5);
        g->P = rnd(12);
        g->prompt = rints(a, g->P);
        g->cached_tokens = rnd(g->P + 1);
        g->n = rnd(4);
        g->scored = scored && g->n > 0;
        g->reward_mean = rnum();
        g->reward_std = urand();
        if (rnd(3) == 0 && a->nj < 256) {
            json_object *m = json_object_new_object();
            json_object_object_add(m, "task", json_object_new_string(rnd(2) ? "math" : "code\n\"x\""));
            json_object_object_add(m, "step", json_object_new_int(rnd(100)));
            json_object_object_add(m, "w", json_object_new_double(urand()));
            g->metadata = a->j[a->nj++] = m;
        }
        results_response *rs = take(a, sizeof *rs * (size_t)g->n);
        for (int k = 0; k < g->n; k++) {
            results_response *x = &rs[k];
            x->n_tokens = rnd(10);
            x->tokens = rints(a, x->n_tokens);
            x->text = rtext(a, &x->text_len);
            x->logprobs = rfloats(a, x->n_tokens);
            if (top_k) {
                x->top_k = top_k;
                x->top_ids = rints(a, x->n_tokens * top_k);
                x->top_lps = rfloats(a, x->n_tokens * top_k);
            }
            x->finish = rnd(2) ? FINISH_LENGTH : FINISH_STOP;
            x->scored = scored;
            x->reward = (float)(rnd(3) ? (double)rnd(2) : rnum()); /* a reward is a float */
            r->completion_tokens += x->n_tokens;
        }
        g->resp = rs;
        r->prompt_tokens += g->P;
        r->cached_tokens += g->cached_tokens;
    }
    r->groups = gs;
    r->ms_total = urand() * 1e5;
}

static void random_logprobs(arena *a, results_logprobs *l) {
    memset(l, 0, sizeof *l);
    l->model = rnd(2) ? ENG_LP_REFERENCE : ENG_LP_POLICY;
    l->policy_version = rnd(1 << 20);
    l->n_groups = 1 + rnd(4);
    int top_k = rnd(2) ? 0 : 1 + rnd(ENG_TOP_MAX);
    results_scored_group *gs = take(a, sizeof *gs * (size_t)l->n_groups);
    for (int i = 0; i < l->n_groups; i++) {
        gs[i].n = 1 + rnd(3);
        results_scored *rs = take(a, sizeof *rs * (size_t)gs[i].n);
        for (int k = 0; k < gs[i].n; k++) {
            rs[k].R = rnd(9);
            rs[k].logprobs = rfloats(a, rs[k].R);
            rs[k].top_k = top_k;
            rs[k].top_ids = rints(a, rs[k].R * top_k);
            rs[k].top_lps = rfloats(a, rs[k].R * top_k);
        }
        gs[i].resp = rs;
    }
    l->groups = gs;
}

static void random_checkpoint(arena *a, results_checkpoint *c) {
    char *id = take(a, 96), *path = take(a, 256);
    c->policy_version = rnd(1000);
    snprintf(id, 96, "ckpt-%lld-%08x%s", c->policy_version, rnd(1u << 30), rnd(2) ? "-merged" : "");
    snprintf(path, 256, "/var/lib/grpod \"x\"/checkpoints/%s", id);
    c->id = id;
    c->path = path;
}

/* ---------------------------------------------------------------- the tests */

#define JOBS 400

/* Job i of each kind through both writers; *differ counts the texts that are not equal. */
static void one_of_each(arena *a, int rows, int *differ, char *first, size_t cap) {
    eng_update_result u;
    results_rollout r;
    results_logprobs l;
    results_checkpoint c;
    random_update(&u);
    random_rollout(a, &r);
    random_logprobs(a, &l);
    random_checkpoint(a, &c);
    const results_rows *t[] = {&results_update_rows, &results_rollout_rows, &results_logprobs_rows, &results_checkpoint_rows};
    const void *src[] = {&u, &r, &l, &c};
    for (int k = 0; k < 4; k++) {
        char *old = k == 0 ? old_update(&u) : k == 1 ? old_rollout(&r) : k == 2 ? old_logprobs(&l) : old_checkpoint(&c);
        char *now = rows ? results_text(t[k], src[k]) : NULL;
        if (rows && (!old || !now || strcmp(old, now))) {
            if (!(*differ)++ && first) snprintf(first, cap, "old %s\nnow %s", old ? old : "(null)", now ? now : "(null)");
        }
        free(old);
        free(now);
    }
}

TEST(test_result_bytes_unchanged) {
    arena a = {0};
    int differ = 0;
    char first[8192] = "";
    for (int i = 0; i < JOBS; i++) {
        one_of_each(&a, 1, &differ, first, sizeof first);
        arena_free(&a);
    }
    if (differ) printf("%s\n", first);
    CHECK_MSG(!differ, "%d of %d results differ from the old writers'", differ, 4 * JOBS);
}

/* The /metrics text after a batch of results, written in a child: both children start from the
 * parent's counters, so the texts differ only by what their writers fed. */
static char *metrics_after(int rows) {
    int fd[2];
    if (pipe(fd)) return NULL;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        arena a = {0};
        rng = 0x2545F4914F6CDD1Dull;
        for (int i = 0; i < JOBS / 4; i++) {
            eng_update_result u;
            results_rollout r;
            random_update(&u);
            random_rollout(&a, &r);
            free(rows ? results_text(&results_update_rows, &u) : old_update(&u));
            free(rows ? results_text(&results_rollout_rows, &r) : old_rollout(&r));
            arena_free(&a);
        }
        char *out = NULL;
        size_t len = 0;
        if (!metrics_render(NULL, 0, 0, 1, 0, &out, &len) && write(fd[1], out, len) != (ssize_t)len) _exit(2);
        _exit(out ? 0 : 1);
    }
    close(fd[1]);
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    ssize_t got;
    while (s && (got = read(fd[0], s + n, cap - n - 1)) > 0)
        if ((n += (size_t)got) + 1 == cap) s = realloc(s, cap *= 2);
    close(fd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    if (s) s[n] = 0;
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
        free(s);
        return NULL;
    }
    return s;
}

TEST(test_metrics_unchanged) {
    char *old = metrics_after(0), *now = metrics_after(1);
    CHECK(old && now);
    CHECK_MSG(strstr(old, "grpod_tokens_total"), "no token counters in /metrics:\n%s", old);
    int same = !strcmp(old, now);
    if (!same) printf("old:\n%s\nnow:\n%s\n", old, now);
    free(old);
    free(now);
    CHECK_MSG(same, "/metrics after the same results differs between the old writers and the rows");
}

/* The dashboard's history points (daemon/history.c), read from the results the old writers
 * wrote, by the rows and by hand. */
TEST(test_history_points_unchanged) {
    arena a = {0};
    int differ = 0;
    for (int i = 0; i < JOBS; i++) {
        eng_update_result u;
        results_rollout r;
        random_update(&u);
        random_rollout(&a, &r);
        char *res[2] = {old_update(&u), old_rollout(&r)};
        const char *kind[2] = {"update", "rollout"};
        for (int k = 0; k < 2; k++) {
            long long v0 = -7, v1 = -7, pv = rnd(100);
            char *old = old_history_point(kind[k], res[k], pv, &v0), *now = history_point(kind[k], res[k], pv, &v1);
            if (!old || !now || strcmp(old, now) || v0 != v1) {
                if (!differ++) printf("old %s %lld\nnow %s %lld\n", old ? old : "(null)", v0, now ? now : "(null)", v1);
            }
            free(old);
            free(now);
            free(res[k]);
        }
        arena_free(&a);
    }
    long long v;
    CHECK(!history_point("logprobs", "{}", 1, &v) && !history_point("update", "not json", 1, &v));
    CHECK_MSG(!differ, "%d of %d history points differ from the old ones", differ, 2 * JOBS);
}

int main(void) {
    RUN(test_result_bytes_unchanged);
    RUN(test_metrics_unchanged);
    RUN(test_history_points_unchanged);
    return CHECK_DONE();
}
