/* jobs.c — one job kind per function: rollout, update, logprobs, checkpoint; see jobs.h.
 * Layers: payload → engine structs (owned by a seqs set), the four runners; each fills its result's
 * struct and daemon/results.h writes it by rows. */
#include "daemon/jobs.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <json-c/json.h>

#include "api/metrics.h"
#include "api/packed.h"
#include "api/params.h"
#include "api/validate.h"
#include "api/reward.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "daemon/json_read.h"
#include "daemon/moe_routes.h"
#include "daemon/results.h"
#include "daemon/test_hooks.h"
#include "engine/dist/comm.h"

/* Token ids: a json array, or a packed one (api_packed_parse). */
static int *int_array(json_object *a, int *n) {
    int len = api_packed_len(a);
    int *out = malloc(sizeof(int) * (size_t)(len ? len : 1));
    if (!out) return NULL;
    for (int i = 0; i < len; i++) out[i] = api_packed_int(a, i);
    *n = len;
    return out;
}

static json_object *ints_json(const int *x, int n) {
    json_object *a = json_object_new_array_ext(n);
    for (int i = 0; i < n; i++) json_object_array_add(a, json_object_new_int(x[i]));
    return a;
}

static char *to_text(json_object *o) {
    char *s = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
    if (!s) err_set(GE_NOMEM, "out of memory writing a result");
    return s;
}

/* ---------------------------------------------------------------- scored sequences */

/* Engine-side view of a groups array [{prompt_ids, responses:[{token_ids, reward|advantage,
 * logprobs?, truncated? | finish_reason?, loss_mask?}]}] — one allocation set, freed by seqs_free. */
typedef struct {
    eng_update_group *g;
    int n;
} seqs;

static void seqs_free(seqs *s) {
    for (int i = 0; s->g && i < s->n; i++) {
        eng_update_group *g = &s->g[i];
        for (int k = 0; k < g->n; k++) {
            if (g->resp) free((void *)g->resp[k]);
            if (g->old_logprobs) free((void *)g->old_logprobs[k]);
            if (g->loss_mask) free((void *)g->loss_mask[k]);
        }
        free((void *)g->prompt);
        free((void *)g->resp);
        free((void *)g->R);
        free((void *)g->reward);
        free((void *)g->advantage);
        free((void *)g->old_logprobs);
        free((void *)g->truncated);
        free((void *)g->loss_mask);
    }
    free(s->g);
    s->g = NULL;
}

/* Response k's loss_mask (validated: R[k] 0/1 values) into g->loss_mask[k]; the array of n is
 * made on the first response that has one. 0 or GE_NOMEM. */
static int seqs_loss_mask(eng_update_group *g, int k, json_object *lm) {
    if (!g->loss_mask && !(g->loss_mask = calloc((size_t)g->n + 1, sizeof *g->loss_mask))) return GE_NOMEM;
    int R = g->R[k];
    unsigned char *m = malloc((size_t)(R ? R : 1));
    if (!m) return GE_NOMEM;
    for (int t = 0; t < R; t++) m[t] = t < api_packed_len(lm) && api_packed_int(lm, t) != 0;
    ((const unsigned char **)g->loss_mask)[k] = m;
    return 0;
}

/* with_scores: rewards/advantages required (updates); use_lp: old logprobs wanted. */
static int seqs_from_json(json_object *groups, int with_scores, int use_lp, seqs *s) {
    s->n = groups ? (int)json_object_array_length(groups) : 0;
    s->g = calloc((size_t)(s->n ? s->n : 1), sizeof *s->g);
    if (!s->g) return err_set(GE_NOMEM, "out of memory");
    for (int i = 0; i < s->n; i++) {
        json_object *jg = json_object_array_get_idx(groups, (size_t)i), *rs = field_get(jg, "responses");
        eng_update_group *g = &s->g[i];
        int n = rs ? (int)json_object_array_length(rs) : 0;
        int **resp = calloc((size_t)n + 1, sizeof *resp), *R = calloc((size_t)n + 1, sizeof *R);
        int *trunc = calloc((size_t)n + 1, sizeof *trunc);
        float *score = calloc((size_t)n + 1, sizeof *score), **old = use_lp ? calloc((size_t)n + 1, sizeof *old) : NULL;
        g->resp = (const int *const *)resp;
        g->R = R;
        g->truncated = trunc;
        g->old_logprobs = (const float *const *)old;
        g->n = n;
        g->prompt = int_array(field_get(jg, "prompt_ids"), &g->P);
        if (!resp || !R || !trunc || !score || (use_lp && !old) || !g->prompt) {
            free(score);
            return err_set(GE_NOMEM, "out of memory");
        }
        int adv = 0;
        for (int k = 0; k < n; k++) {
            json_object *r = json_object_array_get_idx(rs, (size_t)k), *lp = field_get(r, "logprobs");
            if (!(resp[k] = int_array(field_get(r, "token_ids"), &R[k]))) {
                free(score);
                return err_set(GE_NOMEM, "out of memory");
            }
            json_object *rw = field_get(r, "reward"), *ad = field_get(r, "advantage");
            if (with_scores && !rw && !ad) {
                free(score);
                return err_set(GE_INVALID, "groups[%d].responses[%d] has no reward (the rollout had no reward spec?)", i, k);
            }
            adv = ad != NULL;
            score[k] = (float)json_object_get_double(ad ? ad : rw);
            trunc[k] = field_bool(r, "truncated", 0) || !strcmp(field_str(r, "finish_reason", ""), "length");
            json_object *lm = field_get(r, "loss_mask");
            if (lm && seqs_loss_mask(g, k, lm)) {
                free(score);
                return err_set(GE_NOMEM, "out of memory");
            }
            if (use_lp) {
                if (!lp || api_packed_len(lp) != R[k]) {
                    free(score);
                    return err_set(GE_INVALID,
                                   "groups[%d].responses[%d] has no logprobs for old_logprobs=rollout or a rollout correction", i,
                                   k);
                }
                float *o = malloc(sizeof(float) * (size_t)(R[k] ? R[k] : 1));
                if (!o) {
                    free(score);
                    return err_set(GE_NOMEM, "out of memory");
                }
                for (int t = 0; t < R[k]; t++) o[t] = (float)api_packed_num(lp, t);
                old[k] = o;
            }
        }
        if (!with_scores) free(score);
        else if (adv) g->advantage = score;
        else g->reward = score;
    }
    return 0;
}

/* ---------------------------------------------------------------- rollout */

/* A rollout between its payload and its result: the engine structs it owns (and that the
 * schedulers read while the job runs), and its parts, one per rank it was placed on. */
typedef struct {
    int rank, n;
    int *idx; /* (n) the groups' indices in the payload */
    int *gi; /* (n) their indices in the request (the sampling's group_index) */
    eng_sampling s; /* the job's, with group_index = gi: the same streams as on one rank */
    eng_rollout_group *g; /* (n) copies of rg[idx[k]] (the same prompt arrays) */
    eng_group_result *out; /* (n) filled by the rank's scheduler */
    ranks_job *job;
} rollout_part;

struct jobs_rollout {
    json_object *p; /* the parsed payload: groups, sampling, rewards, metadata */
    int ng;
    eng_sampling s; /* from the payload's sampling (api_params_to_struct) */
    eng_rollout_group *rg;
    eng_group_result *out; /* (ng) the merged result, in the request's order */
    int *gi; /* (ng) a follower's part: its groups' indices in the leader's
                                 * request (the payload's group_index); NULL: 0..ng-1 */
    long long prompt_tokens, policy_version;
    int moe_layers, top_k; /* the model's (eng_info): a token's routes */
    double t0;
    ranks *rk;
    rollout_part *parts;
    int n_parts;
};

/* Releases the parts (cancelling running ones) and frees what they still hold. */
static void parts_free(jobs_rollout *r) {
    for (int i = 0; r->parts && i < r->n_parts; i++) {
        rollout_part *pt = &r->parts[i];
        ranks_job_release(r->rk, pt->job);
        for (int k = 0; pt->out && k < pt->n; k++) eng_group_result_free(&pt->out[k]);
        free(pt->idx);
        free(pt->gi);
        free(pt->g);
        free(pt->out);
    }
    free(r->parts);
    r->parts = NULL;
    r->n_parts = 0;
}

void jobs_rollout_free(jobs_rollout *r) {
    if (!r) return;
    parts_free(r);
    for (int i = 0; r->out && i < r->ng; i++) eng_group_result_free(&r->out[i]);
    for (int i = 0; r->rg && i < r->ng; i++) free((void *)r->rg[i].prompt);
    free(r->out);
    free(r->rg);
    free(r->gi);
    api_params_free(&eng_sampling_params, &r->s);
    json_object_put(r->p);
    free(r);
}

/* Payload → engine structs (no engine call). */
static int rollout_parse(const store_job *j, jobs_rollout **out) {
    *out = NULL;
    json_object *p = j->payload ? api_packed_parse(j->payload) : NULL; /* ids packed: see int_array */
    if (!p) return err_set(GE_INVALID, "job %s: payload is not valid JSON", j->id);
    jobs_rollout *r = calloc(1, sizeof *r);
    if (!r) {
        json_object_put(p);
        return err_set(GE_NOMEM, "out of memory");
    }
    r->p = p;
    json_object *groups = field_get(p, "groups"), *sp = field_get(p, "sampling");
    int ng = r->ng = groups ? (int)json_object_array_length(groups) : 0;
    int rc = 0;
    if (ng < 1 || !sp) {
        rc = err_set(GE_INVALID, "rollout payload without groups or sampling");
        goto fail;
    }
    if ((rc = api_params_to_struct(&eng_sampling_params, sp, &r->s))) goto fail;
    r->rg = calloc((size_t)ng, sizeof *r->rg);
    r->out = calloc((size_t)ng, sizeof *r->out);
    if (!r->rg || !r->out) {
        rc = err_set(GE_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < ng; i++) {
        json_object *g = json_object_array_get_idx(groups, (size_t)i);
        if (!(r->rg[i].prompt = int_array(field_get(g, "prompt_ids"), &r->rg[i].P))) {
            rc = err_set(GE_NOMEM, "out of memory");
            goto fail;
        }
        eng_group_job gj;
        api_params_to_struct(&eng_group_job_params, g, &gj); /* no enums: cannot fail */
        r->rg[i].n = gj.n;
        r->prompt_tokens += r->rg[i].P;
    }
    json_object *gi = field_get(p, "group_index"); /* a follower's part (part_desc) */
    if (gi) {
        int n = 0;
        if (!(r->gi = int_array(gi, &n))) {
            rc = err_set(GE_NOMEM, "out of memory");
            goto fail;
        }
        if (n != ng) {
            rc = err_set(GE_INVALID, "rollout part: %d group indices for %d groups", n, ng);
            goto fail;
        }
    }
    *out = r;
    return 0;
fail:
    jobs_rollout_free(r);
    return rc;
}

/* The result of a finished rollout: its responses scored here (the group's reward spec), then
 * written by the rows (daemon/results.h). */
static const char no_text[] = ""; /* a response's text when sanitizing it ran out of memory */
static int rollout_result(jobs_rollout *r, char **result) {
    json_object *groups = field_get(r->p, "groups"), *ol = field_get(r->p, "overlong_buffer");
    results_rollout v = {.policy_version = r->policy_version,
                         .n_groups = r->ng,
                         .prompt_tokens = r->prompt_tokens,
                         .ms_total = clock_mono_ms() - r->t0};
    results_group *gs = calloc((size_t)r->ng, sizeof *gs);
    int rc = gs ? 0 : err_set(GE_NOMEM, "out of memory");
    eng_overlong ov;
    api_params_to_struct(&eng_overlong_params, ol, &ov); /* absent: len 0, shaping off */
    for (int i = 0; !rc && i < r->ng; i++) {
        json_object *g = json_object_array_get_idx(groups, (size_t)i), *rw = field_get(g, "reward");
        const eng_group_result *out = &r->out[i];
        results_group *vg = &gs[i];
        results_response *rs = calloc((size_t)out->n + 1, sizeof *rs);
        if (!rs) {
            rc = err_set(GE_NOMEM, "out of memory");
            break;
        }
        *vg = (results_group){.prompt = r->rg[i].prompt,
                              .P = r->rg[i].P,
                              .cached_tokens = out->cached_tokens,
                              .scored = rw && out->n > 0,
                              .metadata = field_get(g, "metadata"),
                              .resp = rs,
                              .n = out->n};
        reward_spec spec = {0};
        if (rw) {
            reward_parse_type(field_str(rw, "type", "none"), &spec.type);
            spec.answer = field_str(rw, "answer", NULL);
            spec.case_sensitive = field_bool(rw, "case_sensitive", 1);
            spec.overlong_len = ov.len;
            spec.overlong_penalty = ov.penalty_factor;
            spec.max_tokens = r->s.max_tokens;
        }
        double sum = 0, sq = 0;
        for (int k = 0; k < out->n; k++) {
            const eng_response *x = &out->resp[k];
            results_response *o = &rs[k];
            size_t tl = 0;
            char *txt = api_utf8_sanitize(x->text ? x->text : "", x->text ? x->text_len : 0, &tl);
            *o = (results_response){.tokens = x->tokens,
                                    .n_tokens = x->n_tokens,
                                    .text = txt ? txt : no_text,
                                    .text_len = tl,
                                    .logprobs = x->logprobs,
                                    .top_ids = x->top_ids,
                                    .top_lps = x->top_lps,
                                    .top_k = x->top_ids ? r->s.top_logprobs : 0,
                                    .finish = x->finish,
                                    .scored = rw != NULL};
            if (rw) {
                float sc = reward_score(&spec, x->text ? x->text : "", x->n_tokens);
                sum += sc;
                sq += (double)sc * sc;
                o->reward = sc;
            }
            v.completion_tokens += x->n_tokens;
        }
        int n = out->n;
        if (vg->scored) {
            double mean = sum / n, var = n > 1 ? (sq - n * mean * mean) / (n - 1) : 0;
            vg->reward_mean = mean;
            vg->reward_std = var > 0 ? sqrt(var) : 0;
        }
        v.cached_tokens += out->cached_tokens;
    }
    v.groups = gs;
    if (!rc && !(*result = results_text(&results_rollout_rows, &v))) rc = GE_NOMEM;
    for (int i = 0; gs && i < r->ng; i++) {
        for (int k = 0; gs[i].resp && k < gs[i].n; k++)
            if (gs[i].resp[k].text != no_text) free((void *)gs[i].resp[k].text);
        free((void *)gs[i].resp);
    }
    free(gs);
    return rc;
}

/* Parses job j into *r and stamps the policy version it runs under and its start time. A
 * follower's part names the leader's version: another one here fails it (the ranks diverged). */
static int rollout_open(const jobs_env *env, const store_job *j, jobs_rollout **r) {
    int rc = rollout_parse(j, r);
    if (rc) return rc;
    eng_info info;
    eng_get_info(env->e, &info);
    (*r)->policy_version = info.policy_version;
    (*r)->moe_layers = info.moe_layers;
    (*r)->top_k = info.top_k;
    (*r)->t0 = clock_mono_ms();
    long long want = field_int((*r)->p, "policy_version", -1);
    if (want >= 0 && want != info.policy_version) {
        rc = err_set(GE_INTERNAL, "rollout part: this follower's policy is version %lld, the leader's %lld", info.policy_version,
                     want);
        jobs_rollout_free(*r);
        *r = NULL;
    }
    return rc;
}

/* A part for a follower's rank: a rollout payload of its groups (prompt and n), the job's
 * sampling, their indices in the request and the policy version (rollout_open checks it). */
static char *part_desc(const jobs_rollout *r, const rollout_part *pt) {
    json_object *d = json_object_new_object(), *gs = json_object_new_array_ext(pt->n), *gi = json_object_new_array_ext(pt->n);
    for (int k = 0; k < pt->n; k++) {
        json_object *g = json_object_new_object();
        json_object_object_add(g, "prompt_ids", ints_json(pt->g[k].prompt, pt->g[k].P));
        json_object_object_add(g, "n", json_object_new_int(pt->g[k].n));
        json_object_array_add(gs, g);
        json_object_array_add(gi, json_object_new_int(pt->gi[k]));
    }
    json_object_object_add(d, "groups", gs);
    json_object_object_add(d, "sampling", json_object_get(field_get(r->p, "sampling")));
    json_object_object_add(d, "group_index", gi);
    json_object_object_add(d, "policy_version", json_object_new_int64(r->policy_version));
    return to_text(d);
}

/* Places the groups on ranks, each whole on the rank with the fewest KV rows placed
 * (ranks_place; all on rank `only` when it is >= 0), and queues each rank's part. A part's sampling numbers its groups by their
 * index in the request (eng_sampling.group_index), so every response draws from the stream it
 * has on one rank. */
static int rollout_start(const jobs_env *env, const store_job *j, int only, jobs_rollout **out) {
    jobs_rollout *r;
    int rc = rollout_open(env, j, &r);
    if (rc) return rc;
    r->rk = env->rk;
    int W = ranks_placeable(r->rk), *rank_of = calloc((size_t)r->ng, sizeof *rank_of);
    long long *rows = calloc((size_t)r->ng, sizeof *rows);
    r->parts = calloc((size_t)W, sizeof *r->parts);
    if (!rank_of || !rows || !r->parts) {
        rc = err_set(GE_NOMEM, "out of memory");
        goto fail;
    }
    for (int i = 0; i < r->ng; i++) rows[i] = eng_sched_rows_needed(&r->rg[i], &r->s);
    if (only >= 0) /* a follower's part: on the rank the leader placed it on */
        for (int i = 0; i < r->ng; i++) rank_of[i] = only;
    else ranks_place(r->rk, rows, r->ng, rank_of);
    for (int rank = 0; rank < W; rank++) {
        int n = 0;
        long long part_rows = 0;
        for (int i = 0; i < r->ng; i++) n += rank_of[i] == rank;
        if (!n) continue;
        rollout_part *pt = &r->parts[r->n_parts++];
        pt->rank = rank;
        pt->idx = calloc((size_t)n, sizeof *pt->idx);
        pt->gi = calloc((size_t)n, sizeof *pt->gi);
        pt->g = calloc((size_t)n, sizeof *pt->g);
        pt->out = calloc((size_t)n, sizeof *pt->out);
        if (!pt->idx || !pt->gi || !pt->g || !pt->out) {
            rc = err_set(GE_NOMEM, "out of memory");
            goto fail;
        }
        for (int i = 0; i < r->ng; i++) {
            if (rank_of[i] != rank) continue;
            pt->idx[pt->n] = i;
            pt->gi[pt->n] = r->gi ? r->gi[i] : i;
            pt->g[pt->n++] = r->rg[i];
            part_rows += rows[i];
        }
        pt->s = r->s;
        pt->s.group_index = pt->gi;
        char *desc = NULL;
        if (ranks_is_remote(r->rk, rank) && !(desc = part_desc(r, pt))) {
            rc = GE_NOMEM;
            goto fail;
        }
        rc = ranks_add(r->rk, rank, pt->g, pt->n, &pt->s, pt->out, part_rows, desc, &pt->job);
        free(desc);
        if (rc) goto fail;
    }
    free(rank_of);
    free(rows);
    *out = r;
    return 0;
fail:
    free(rank_of);
    free(rows);
    jobs_rollout_free(r);
    return rc;
}

int jobs_rollout_start(const jobs_env *env, const store_job *j, jobs_rollout **out) { return rollout_start(env, j, -1, out); }

int jobs_part_start(const jobs_env *env, const char *desc, int rank, jobs_rollout **out) {
    *out = NULL;
    if (rank < 0 || rank >= ranks_size(env->rk)) return err_set(GE_INVALID, "rollout part: no local rank %d", rank);
    store_job j = {.payload = (char *)desc};
    snprintf(j.id, sizeof j.id, "part");
    snprintf(j.kind, sizeof j.kind, "rollout");
    return rollout_start(env, &j, rank, out);
}

/* 0 while some part runs, 1 when all are done (merged into r->out, in the request's order),
 * or the first part's error. */
/* A part's group k is the request's group idx[k]. */
typedef struct {
    const rollout_part *pt;
    jobs_peek_cb fn;
    void *ud;
} peek_ctx;
static void peek_part(void *ud, int k, int m, const eng_response *x, int top_k) {
    peek_ctx *c = ud;
    c->fn(c->ud, c->pt->idx[k], m, x, top_k);
}

void jobs_rollout_peek(const jobs_rollout *r, jobs_peek_cb fn, void *ud) {
    for (int i = 0; i < r->n_parts; i++) {
        peek_ctx c = {&r->parts[i], fn, ud};
        if (r->parts[i].job) ranks_job_peek(r->rk, r->parts[i].job, peek_part, &c);
    }
}

int jobs_rollout_poll(jobs_rollout *r, double *progress, int *started, char **result) {
    const char *msg;
    *result = NULL;
    double sum = 0;
    int done = 1, any = 0;
    for (int i = 0; i < r->n_parts; i++) {
        double pr = 0;
        int st_i = 0;
        int st = ranks_job_state(r->rk, r->parts[i].job, &pr, &st_i, &msg);
        if (st < 0) return err_set(st, "%s", msg);
        done &= st == 1;
        any |= st_i;
        sum += pr * r->parts[i].n;
    }
    if (progress) *progress = r->ng ? sum / r->ng : 0;
    if (started) *started = any;
    if (!done) return 0;
    for (int i = 0; i < r->n_parts; i++) {
        rollout_part *pt = &r->parts[i];
        ranks_job_release(r->rk, pt->job); /* done: its results stay ours */
        pt->job = NULL;
        for (int k = 0; k < pt->n; k++) {
            r->out[pt->idx[k]] = pt->out[k];
            memset(&pt->out[k], 0, sizeof pt->out[k]);
        }
    }
    parts_free(r);
    int rc = rollout_result(r, result);
    return rc ? rc : 1;
}

int jobs_rollout_keep_routes(const jobs_rollout *r, store *st, const char *id) {
    void *blob;
    size_t len;
    int rc = moe_routes_encode(r->rg, r->out, r->ng, r->moe_layers, r->top_k, &blob, &len);
    if (!rc && blob) rc = store_routes_put(st, id, blob, len);
    free(blob);
    return rc;
}

/* The one-job path (jobs_run): the same parse and result around eng_rollout. */
static int run_rollout(const jobs_env *env, const store_job *j, char **result) {
    jobs_rollout *r;
    int rc = rollout_open(env, j, &r);
    if (rc) return rc;
    r->s.group_index = r->gi;
    if (!(rc = eng_rollout(env->e, r->rg, r->ng, &r->s, r->out, env->progress, env->progress_ud)) &&
        !(rc = jobs_rollout_keep_routes(r, env->st, j->id)))
        rc = rollout_result(r, result);
    jobs_rollout_free(r);
    return rc;
}

/* ---------------------------------------------------------------- SPMD calls
 *
 * Every rank's engine runs the same call with the same inputs (daemon/ranks.h); the result
 * the job stores is rank 0's (the contract makes them the same on every rank). */

/* call: the call's description for the ranks of other processes (ranks_spmd_call; NULL without
 * them: see call_text). */
static int spmd(const jobs_env *env, ranks_fn fn, void *arg, const char *call) {
    if (!env->rk) return fn(env->e, 0, env->progress, env->progress_ud, arg);
    return ranks_spmd_call(env->rk, fn, arg, env->progress, env->progress_ud, call);
}

/* What a follower needs to run the same call (jobs_follow), as JSON text, or NULL when no rank is
 * in another process (no text is made then: the single-process path is unchanged). The payload
 * and the rollout result travel as the stored text, which the follower parses with the same
 * parsers as here, so both sides convert the same bytes. *oom set when it could not be made. */
static char *call_text(const jobs_env *env, const char *op, const char *payload, const char *rollout, const char *dir, int merged,
                       int *oom) {
    *oom = 0;
    if (!ranks_has_remote(env->rk)) return NULL;
    json_object *o = json_object_new_object();
    json_object_object_add(o, "op", json_object_new_string(op));
    if (payload) json_object_object_add(o, "payload", json_object_new_string(payload));
    if (rollout) json_object_object_add(o, "rollout", json_object_new_string(rollout));
    if (dir) json_object_object_add(o, "dir", json_object_new_string(dir));
    if (merged) json_object_object_add(o, "merged", json_object_new_boolean(1));
    char *t = to_text(o);
    *oom = !t;
    return t;
}

typedef struct {
    const eng_update_group *g;
    int n;
    const loss_config *algo;
    const eng_optim *opt;
    long long max_tokens;
    eng_update_result *out; /* rank 0's */
} spmd_update_args;

static int spmd_update(eng *e, int rank, eng_progress_cb cb, void *ud, void *arg) {
    spmd_update_args *a = arg;
    eng_update_result mine;
    if (rank && test_hook_once("GRPOD_TEST_COMM_DOWN_AT", "update")) {
        test_hook_hold("comm_down");
        comm_abort(eng_comm(e));
    }
    return eng_update(e, a->g, a->n, a->algo, a->opt, a->max_tokens, rank ? &mine : a->out, cb, ud);
}

static int spmd_undo(eng *e, int rank, eng_progress_cb cb, void *ud, void *arg) {
    (void)rank;
    (void)cb;
    (void)ud;
    (void)arg;
    return eng_update_undo(e);
}

int jobs_update_undo(const jobs_env *env) {
    int oom;
    char *call = call_text(env, "undo", NULL, NULL, NULL, 0, &oom);
    int rc = oom ? err_set(GE_NOMEM, "out of memory") : spmd(env, spmd_undo, NULL, call);
    free(call);
    return rc;
}

/* The k most likely tokens of each scored position (eng_logprobs_top): per response (R * k). */
typedef struct {
    int **ids;
    float **lps;
} jobs_top;

typedef struct {
    const eng_update_group *g;
    int n, use_reference;
    float temperature;
    long long max_tokens;
    float ***out; /* rank 0's */
    int top_k; /* the payload's top_logprobs: 0 none */
    jobs_top *top; /* rank 0's */
} spmd_logprobs_args;

static int spmd_logprobs(eng *e, int rank, eng_progress_cb cb, void *ud, void *arg) {
    (void)cb;
    (void)ud;
    spmd_logprobs_args *a = arg;
    float **mine = NULL;
    jobs_top t = {0}, *top = rank ? &t : a->top;
    int rc = eng_logprobs_top(e, a->g, a->n, a->use_reference, a->temperature, a->max_tokens, a->top_k, rank ? &mine : a->out,
                              &top->ids, &top->lps);
    if (mine) eng_logprobs_free(mine, a->g, a->n);
    if (rank) eng_logprobs_top_free(t.ids, t.lps, a->g, a->n);
    return rc;
}

/* With a communicator (W > 1, daemon/ranks.h) the capture is collective: every rank calls it,
 * the shards of the optimizer state are gathered to rank 0, whose capture (*out) alone is kept
 * and written (engine/train/checkpoint.c). Without one (one rank) only rank 0 calls. */
typedef struct {
    int merged;
    eng_ckpt **out; /* rank 0's; NULL: a follower's, freed at once */
} spmd_checkpoint_args;

static int spmd_checkpoint(eng *e, int rank, eng_progress_cb cb, void *ud, void *arg) {
    (void)cb;
    (void)ud;
    spmd_checkpoint_args *a = arg;
    if (rank && !eng_comm(e)) return 0;
    eng_ckpt *c = NULL;
    int rc = eng_checkpoint_capture(e, a->merged, &c);
    if (rank == 0 && a->out) *a->out = c;
    else eng_checkpoint_capture_free(c);
    return rc;
}

/* ---------------------------------------------------------------- update */

/* A stored update's sections and members, by the rows that validated them (engine/params.c). */
static int update_params(json_object *p, loss_config *algo, eng_optim *opt, eng_update_job *job) {
    int rc;
    if ((rc = api_params_to_struct(&eng_loss_params, field_get(p, "algorithm"), algo)) ||
        (rc = api_params_to_struct(&eng_optim_params, field_get(p, "optimizer"), opt)) ||
        (rc = api_params_to_struct(&eng_update_job_params, p, job)))
        return err_set(rc, "job payload: %s", err_msg());
    return 0;
}

/* The update's engine call on every rank: groups (the payload's, or the named rollout's) → the
 * engine's structs → eng_update. The leader (run_update) and a follower (jobs_follow) both.
 * routes (len bytes, routes.h; NULL: none): the named rollout's, replayed (routing_replay). */
static int update_exec(const jobs_env *env, const eng_update_job *job, json_object *groups, const loss_config *algo,
                       const eng_optim *opt, const char *call, const void *routes, size_t len, eng_update_result *u) {
    seqs s = {0};
    moe_routes rs = {0};
    int rc;
    if ((rc = seqs_from_json(groups, 1, algo->use_rollout_logprobs || rcorr_enabled(algo), &s))) goto done;
    if (algo->routing_replay && !routes) {
        rc = err_set(GE_UNSUPPORTED, "algorithm.routing_replay: the routes of the rollout are not here (a follower process)");
        goto done;
    }
    if (routes) {
        eng_info info;
        eng_get_info(env->e, &info);
        if ((rc = moe_routes_attach(routes, len, info.moe_layers, info.n_experts, info.top_k, s.g, s.n, &rs))) goto done;
    }
    if (algo->adv == ADV_GIVEN)
        for (int i = 0; i < s.n; i++)
            if (!s.g[i].advantage) {
                rc = err_set(GE_INVALID, "adv_estimator given needs advantages in groups[%d]", i);
                goto done;
            }
    rc = spmd(env, spmd_update, &(spmd_update_args){s.g, s.n, algo, opt, job->max_tokens_per_micro_batch, u}, call);
done:
    seqs_free(&s);
    moe_routes_free(&rs);
    return rc;
}

static int run_update(const jobs_env *env, json_object *p, const char *payload, char **result) {
    loss_config algo;
    eng_optim opt;
    eng_update_job job;
    int rc;
    if ((rc = update_params(p, &algo, &opt, &job))) return rc;
    eng_info info;
    eng_get_info(env->e, &info);
    long long expected = job.expected_policy_version;
    if (expected >= 0 && expected != info.policy_version)
        return err_set(GE_CONFLICT, "expected_policy_version %lld does not match the policy_version %lld when the job ran",
                       expected, info.policy_version);
    json_object *src = NULL, *groups = field_get(p, "groups");
    char *call = NULL;
    void *routes = NULL;
    size_t rlen = 0;
    int oom = 0;
    const char *rid = job.rollout_job_id;
    if (rid && algo.routing_replay && (rc = store_routes_get(env->st, rid, &routes, &rlen)))
        return rc == GE_NOT_FOUND ? err_set(GE_CONFLICT,
                                            "algorithm.routing_replay: rollout_job_id %s has no recorded routes (a rollout of "
                                            "a mixture-of-experts model, run in this process, records them)",
                                            rid)
                                  : rc;
    if (rid) {
        store_job rj = {0};
        if ((rc = store_get(env->st, rid, &rj))) return err_set(rc, "rollout_job_id %s: %s", rid, err_msg());
        src = rj.result && rj.status == JOB_DONE ? api_packed_parse(rj.result) : NULL;
        if (src) call = call_text(env, "update", payload, rj.result, NULL, 0, &oom); /* the rollout inlined */
        store_job_clear(&rj);
        if (!src) {
            free(routes);
            return err_set(GE_CONFLICT, "rollout_job_id %s has no result", rid);
        }
        groups = field_get(src, "groups");
    } else {
        call = call_text(env, "update", payload, NULL, NULL, 0, &oom);
    }
    eng_update_result u = {0};
    if (oom) {
        rc = err_set(GE_NOMEM, "out of memory");
        goto done;
    }
    if (routes && call) {
        rc = err_set(GE_UNSUPPORTED,
                     "algorithm.routing_replay rollout: the ranks of other processes (a cluster) do not get "
                     "the routes yet; run the update without it");
        goto done;
    }
    if ((rc = update_exec(env, &job, groups, &algo, &opt, call, routes, rlen, &u))) goto done;
    if (!(*result = results_text(&results_update_rows, &u))) rc = GE_NOMEM;
done:
    free(call);
    free(routes);
    json_object_put(src);
    return rc;
}

/* ---------------------------------------------------------------- logprobs, checkpoint */

/* The logprobs call on every rank (the leader's run_logprobs and a follower's jobs_follow). */
static int logprobs_exec(const jobs_env *env, json_object *p, const char *call, seqs *s, float ***lp, jobs_top *top, double *t0) {
    eng_logprobs_job job;
    int rc;
    if ((rc = api_params_to_struct(&eng_logprobs_job_params, p, &job)) || (rc = seqs_from_json(field_get(p, "groups"), 0, 0, s)))
        return rc;
    *t0 = clock_mono_ms();
    return spmd(env, spmd_logprobs,
                &(spmd_logprobs_args){s->g, s->n, job.model == ENG_LP_REFERENCE, job.temperature, job.max_tokens_per_micro_batch,
                                      lp, job.top_logprobs, top},
                call);
}

static int run_logprobs(const jobs_env *env, json_object *p, const char *payload, char **result) {
    seqs s = {0};
    float **lp = NULL;
    int rc, oom;
    char *call = call_text(env, "logprobs", payload, NULL, NULL, 0, &oom);
    if (oom) return err_set(GE_NOMEM, "out of memory");
    eng_logprobs_job job;
    if ((rc = api_params_to_struct(&eng_logprobs_job_params, p, &job))) {
        free(call);
        return rc;
    }
    int top_k = job.top_logprobs;
    double t0 = 0;
    jobs_top top = {0};
    rc = logprobs_exec(env, p, call, &s, &lp, &top, &t0);
    free(call);
    if (rc) goto done;
    metrics_seconds(MS_LOGPROBS, (clock_mono_ms() - t0) / 1e3);
    eng_info info;
    eng_get_info(env->e, &info);
    results_logprobs v = {.n_groups = s.n, .model = job.model, .policy_version = info.policy_version};
    int n_resp = 0;
    for (int i = 0; i < s.n; i++) n_resp += s.g[i].n;
    results_scored_group *gs = calloc((size_t)s.n + 1, sizeof *gs);
    results_scored *rs = calloc((size_t)n_resp + 1, sizeof *rs);
    long long toks = 0;
    if (!gs || !rs) rc = err_set(GE_NOMEM, "out of memory");
    for (int i = 0, idx = 0; !rc && i < s.n; i++) {
        gs[i] = (results_scored_group){rs + idx, s.g[i].n};
        for (int k = 0; k < s.g[i].n; k++, idx++) {
            rs[idx] = (results_scored){lp[idx], top_k ? top.ids[idx] : NULL, top_k ? top.lps[idx] : NULL, s.g[i].R[k], top_k};
            toks += s.g[i].R[k];
        }
    }
    v.groups = gs;
    if (!rc) metrics_tokens(MT_LOGPROBS, toks);
    if (!rc && !(*result = results_text(&results_logprobs_rows, &v))) rc = GE_NOMEM;
    free(gs);
    free(rs);
done:
    if (lp) eng_logprobs_free(lp, s.g, s.n);
    eng_logprobs_top_free(top.ids, top.lps, s.g, s.n);
    seqs_free(&s);
    return rc;
}

/* ---------------------------------------------------------------- checkpoint */

struct jobs_ckpt {
    eng_ckpt *cap; /* NULL: the job's own checkpoint was there already (kept) */
    char dir[1200], id[96], msg[600];
    int merged, rc, thread;
    long long version;
    double t0;
    pthread_t th;
    _Atomic int done;
    void (*wake)(void *);
    void *wake_ud;
};

/* The writer thread: files only (eng_checkpoint_write makes no backend call). */
static void *ckpt_write_main(void *arg) {
    jobs_ckpt *c = arg;
    err_clear();
    test_hook_hold("checkpoint_write");
    c->rc = eng_checkpoint_write(c->cap, c->dir);
    if (c->rc) snprintf(c->msg, sizeof c->msg, "%s", err_msg());
    atomic_store(&c->done, 1);
    if (c->wake) c->wake(c->wake_ud);
    return NULL;
}

/* merged (LoRA only): an HF directory with the adapters merged into the base, for export; it is
 * not a resume point (the run resumes from its adapter checkpoints), so the store does not list it. */
int jobs_checkpoint_start(const jobs_env *env, const store_job *j, void (*wake)(void *), void *wake_ud, jobs_ckpt **out) {
    *out = NULL;
    json_object *p = j->payload ? json_tokener_parse(j->payload) : NULL;
    if (!p) return err_set(GE_INVALID, "job %s: payload is not valid JSON", j->id);
    eng_info info;
    eng_get_info(env->e, &info);
    eng_checkpoint_job cj;
    api_params_to_struct(&eng_checkpoint_job_params, p, &cj); /* no enums: cannot fail */
    int merged = cj.merged && info.lora_rank;
    json_object_put(p);
    jobs_ckpt *c = calloc(1, sizeof *c);
    if (!c) return err_set(GE_NOMEM, "out of memory");
    c->merged = merged;
    c->version = info.policy_version;
    c->wake = wake;
    c->wake_ud = wake_ud;
    c->t0 = clock_mono_ms();
    snprintf(c->dir, sizeof c->dir, "%s/checkpoints", env->data_dir);
    if (mkdir(c->dir, 0755) && errno != EEXIST) {
        int rc = err_set(GE_IO, "mkdir %s: %s", c->dir, strerror(errno));
        free(c);
        return rc;
    }
    snprintf(c->id, sizeof c->id, "ckpt-%lld-%s%s", info.policy_version, j->id, merged ? "-merged" : "");
    snprintf(c->dir, sizeof c->dir, "%s/checkpoints/%s", env->data_dir, c->id);
    struct stat sb;
    if (stat(c->dir, &sb) == 0 && eng_checkpoint_matches(env->e, c->dir, merged) == 0) {
        /* this job's own checkpoint: an earlier run of it stopped after the rename (a crash
         * before the job's done-write); keep it (docs/api.md "Checkpoints") */
        log_event(LOG_INFO, "checkpoint_kept", "\"id\":\"%s\",\"policy_version\":%lld", c->id, info.policy_version);
        atomic_store(&c->done, 1);
        *out = c;
        return 0;
    }
    int oom;
    char *call = call_text(env, "checkpoint", NULL, NULL, c->dir, merged, &oom);
    int rc = oom ? err_set(GE_NOMEM, "out of memory") : spmd(env, spmd_checkpoint, &(spmd_checkpoint_args){merged, &c->cap}, call);
    free(call);
    if (!rc && !c->cap) rc = err_set(GE_INTERNAL, "checkpoint: rank 0 captured nothing");
    if (!rc && (c->thread = !pthread_create(&c->th, NULL, ckpt_write_main, c)) == 0) ckpt_write_main(c); /* no thread: here */
    if (rc) {
        eng_checkpoint_capture_free(c->cap);
        free(c);
        return rc;
    }
    log_event(LOG_INFO, "checkpoint_captured", "\"id\":\"%s\",\"policy_version\":%lld,\"ms\":%.1f", c->id, c->version,
              clock_mono_ms() - c->t0);
    *out = c;
    return 0;
}

/* Waits for the writer thread, if one runs. */
static void ckpt_join(jobs_ckpt *c) {
    if (c->thread) pthread_join(c->th, NULL);
    c->thread = 0;
}

int jobs_checkpoint_poll(const jobs_env *env, jobs_ckpt *c, char **result) {
    *result = NULL;
    if (!atomic_load(&c->done)) return 0;
    ckpt_join(c);
    if (c->rc) return err_set(c->rc, "%s", c->msg);
    if (c->cap) {
        metrics_seconds(MS_CHECKPOINT, (clock_mono_ms() - c->t0) / 1e3);
        eng_checkpoint_capture_free(c->cap);
        c->cap = NULL;
    }
    test_hook_kill("checkpoint_renamed");
    int rc;
    if (!c->merged && (rc = store_checkpoint_add(env->st, c->id, c->dir, c->version))) return rc;
    results_checkpoint res = {c->id, c->dir, c->version};
    log_event(LOG_INFO, "checkpoint_saved", "\"id\":\"%s\",\"policy_version\":%lld,\"ms\":%.1f", c->id, c->version,
              clock_mono_ms() - c->t0);
    return (*result = results_text(&results_checkpoint_rows, &res)) ? 1 : GE_NOMEM;
}

void jobs_checkpoint_free(jobs_ckpt *c) {
    if (!c) return;
    ckpt_join(c);
    eng_checkpoint_capture_free(c->cap);
    free(c);
}

/* The checkpoint at once: capture, write, index. */
static int run_checkpoint(const jobs_env *env, const store_job *j, char **result) {
    jobs_ckpt *c;
    int rc = jobs_checkpoint_start(env, j, NULL, NULL, &c);
    if (rc) return rc;
    ckpt_join(c);
    rc = jobs_checkpoint_poll(env, c, result);
    jobs_checkpoint_free(c);
    return rc == 1 ? 0 : rc;
}

int jobs_run(const jobs_env *env, const store_job *j, char **result) {
    *result = NULL;
    json_object *p = j->payload ? json_tokener_parse(j->payload) : NULL;
    if (!p) return err_set(GE_INVALID, "job %s: payload is not valid JSON", j->id);
    int rc;
    if (!strcmp(j->kind, "rollout")) rc = run_rollout(env, j, result);
    else if (!strcmp(j->kind, "update")) rc = run_update(env, p, j->payload, result);
    else if (!strcmp(j->kind, "logprobs")) rc = run_logprobs(env, p, j->payload, result);
    else if (!strcmp(j->kind, "checkpoint")) rc = run_checkpoint(env, j, result);
    else rc = err_set(GE_INVALID, "job %s: unknown kind %s", j->id, j->kind);
    json_object_put(p);
    return rc;
}

/* ---------------------------------------------------------------- a follower's calls */

int jobs_follow(const jobs_env *env, const char *call) {
    json_object *c = call ? json_tokener_parse(call) : NULL, *p = NULL, *src = NULL;
    if (!c) return err_set(GE_INVALID, "cluster call: not valid JSON");
    const char *op = field_str(c, "op", ""), *payload = field_str(c, "payload", NULL), *rollout = field_str(c, "rollout", NULL);
    int rc;
    if (!strcmp(op, "undo")) {
        rc = spmd(env, spmd_undo, NULL, NULL);
    } else if (!strcmp(op, "checkpoint")) {
        rc = spmd(env, spmd_checkpoint, &(spmd_checkpoint_args){field_bool(c, "merged", 0), NULL}, NULL);
    } else if (!strcmp(op, "update") || !strcmp(op, "logprobs")) {
        /* the parsers of jobs_run (payload) and run_update (the rollout's result) */
        if (!payload || !(p = json_tokener_parse(payload))) {
            rc = err_set(GE_INVALID, "cluster call %s: no payload", op);
            goto done;
        }
        if (rollout && !(src = api_packed_parse(rollout))) {
            rc = err_set(GE_INVALID, "cluster call %s: bad rollout", op);
            goto done;
        }
        if (!strcmp(op, "update")) {
            loss_config algo;
            eng_optim opt;
            eng_update_job job;
            eng_update_result u = {0};
            if (!(rc = update_params(p, &algo, &opt, &job)))
                rc = update_exec(env, &job, src ? field_get(src, "groups") : field_get(p, "groups"), &algo, &opt, NULL, NULL, 0,
                                 &u);
        } else {
            seqs s = {0};
            float **lp = NULL;
            double t0;
            jobs_top top = {0};
            rc = logprobs_exec(env, p, NULL, &s, &lp, &top, &t0);
            if (lp) eng_logprobs_free(lp, s.g, s.n);
            eng_logprobs_top_free(top.ids, top.lps, s.g, s.n);
            seqs_free(&s);
        }
    } else {
        rc = err_set(GE_INVALID, "cluster call: unknown op '%s'", op);
    }
done:
    json_object_put(src);
    json_object_put(p);
    json_object_put(c);
    return rc;
}
