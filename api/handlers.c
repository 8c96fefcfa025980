/* handlers.c — the native routes' handlers (jobs, checkpoints, logprobs, model, health,
 * metrics; the tokenizer's are vLLM's too, in openai_vllm.c): each validates through validate.h, talks to the store or the engine, and
 * replies. The router (router.c) calls them from their rows in routes.h, on MHD's threads; the
 * replies, store pool and waiters they use are declared in internal.h. */
#include "api/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/metrics.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

/* ---------------------------------------------------------------- jobs */

static void job_json(api_sbuf *b, const store_job *j, int full) {
    api_sb_printf(b, "{\"id\":\"%s\",\"kind\":\"%s\",\"status\":\"%s\",\"created_at\":", j->id, j->kind,
                  store_status_name(j->status));
    api_sb_num_or_null(b, j->created_at);
    api_sb_str(b, ",\"started_at\":");
    api_sb_num_or_null(b, j->started_at);
    api_sb_str(b, ",\"finished_at\":");
    api_sb_num_or_null(b, j->finished_at);
    api_sb_printf(b, ",\"progress\":%.4f,\"attempts\":%d,\"policy_version\":", j->progress, j->attempts);
    if (j->policy_version >= 0) api_sb_printf(b, "%lld", j->policy_version);
    else api_sb_str(b, "null");
    api_sb_printf(b, ",\"cancel_requested\":%s,\"error\":", j->cancel_requested ? "true" : "false");
    api_sb_str(b, j->error ? j->error : "null");
    if (full) {
        api_sb_str(b, ",\"result\":");
        api_sb_str(b, j->result ? j->result : "null");
    }
    api_sb_str(b, "}");
}

enum MHD_Result api_submit_and_reply(api_server *s, struct MHD_Connection *c, api_req *x, const char *kind, json_object *payload,
                                     char *id_out) {
    if (atomic_load(&s->stopping)) return api_reply_fail(c, x, GE_UNAVAILABLE, "", "grpod is shutting down");
    store *st = api_pool_get(s);
    if (!st) return api_reply_fail(c, x, GE_STORE, "", "cannot open the store");
    int max_q = api_limits_now(s).max_queued_jobs;
    char id[32];
    int rc = store_submit(st, kind, json_object_to_json_string_ext(payload, JSON_C_TO_STRING_PLAIN), max_q, id);
    api_pool_put(s, st);
    if (rc == GE_BUSY)
        return api_reply_fail(c, x, GE_BUSY, "", "the queue holds %d jobs (--max-queued-jobs); retry later", max_q);
    if (rc) return api_reply_fail(c, x, rc, "", "cannot store the job: %s", err_msg());
    log_event(LOG_INFO, "job_submitted", "\"id\":\"%s\",\"kind\":\"%s\"", id, kind);
    api_wake_engine(s);
    if (id_out) {
        memcpy(id_out, id, sizeof id);
        return MHD_YES;
    }
    char body[128];
    snprintf(body, sizeof body, "{\"job_id\":\"%s\",\"status\":\"queued\"}", id);
    return api_reply_json(c, x, 202, body);
}

enum MHD_Result api_rollouts_post(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    api_model m;
    api_error e;
    enum MHD_Result r;
    json_object *payload;
    if (!api_engine_or_reply(s, c, x, &m, &r)) return r;
    api_limits l = api_limits_now(s);
    if (api_rollout_or_reply(req, &l, &m, &payload, &e)) return api_reply_error(c, x, &e);
    r = api_submit_and_reply(s, c, x, "rollout", payload, NULL);
    json_object_put(payload);
    return r;
}

/* An update that names a rollout job and leaves algorithm.loss_scale_factor at 0 (absent or null)
 * gets the rollout's sampling.max_tokens: veRL's default, the padded response width, the same
 * for every update of a run. Stored with the job, so its replay uses the same constant. */
static void loss_scale_from_rollout(json_object *payload, const char *rollout_payload) {
    json_object *algo = NULL, *f = NULL, *rp = rollout_payload ? json_tokener_parse(rollout_payload) : NULL, *smp = NULL,
                *mt = NULL;
    if (json_object_object_get_ex(payload, "algorithm", &algo) && json_object_object_get_ex(algo, "loss_scale_factor", &f) &&
        json_object_get_int64(f) == 0 && json_object_object_get_ex(rp, "sampling", &smp) &&
        json_object_object_get_ex(smp, "max_tokens", &mt) && json_object_is_type(mt, json_type_int))
        json_object_object_add(algo, "loss_scale_factor", json_object_new_int64(json_object_get_int64(mt)));
    json_object_put(rp);
}

enum MHD_Result api_updates_post(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    api_model m;
    api_error e;
    enum MHD_Result r;
    json_object *payload;
    const char *rid;
    long long expected;
    if (!api_engine_or_reply(s, c, x, &m, &r)) return r;
    api_limits l = api_limits_now(s);
    if (api_update_or_reply(req, &l, &m, &payload, &rid, &expected, &e)) return api_reply_error(c, x, &e);
    long long pv = api_policy_version_now(s);
    if (expected >= 0 && expected != pv) {
        json_object_put(payload);
        return api_reply_fail(c, x, GE_CONFLICT, "expected_policy_version",
                              "expected_policy_version %lld does not match the current policy_version %lld", expected, pv);
    }
    if (rid) {
        store *st = api_pool_get(s);
        store_job j = {0};
        int rc = st ? store_get(st, rid, &j) : GE_STORE;
        api_pool_put(s, st);
        const char *why = NULL;
        int code = GE_CONFLICT;
        if (rc == GE_NOT_FOUND) {
            why = "no such job";
            code = GE_NOT_FOUND;
        } else if (rc) {
            why = "cannot read the store";
            code = GE_STORE;
        } else if (strcmp(j.kind, "rollout")) {
            why = "is not a rollout job";
            code = GE_INVALID;
        } else if (j.status != JOB_DONE) why = "has not finished successfully";
        else loss_scale_from_rollout(payload, j.payload);
        char id[32];
        snprintf(id, sizeof id, "%s", rid);
        store_job_clear(&j);
        if (why) {
            json_object_put(payload);
            return api_reply_fail(c, x, code, "rollout_job_id", "rollout_job_id %s %s", id, why);
        }
    }
    r = api_submit_and_reply(s, c, x, "update", payload, NULL);
    json_object_put(payload);
    return r;
}

enum MHD_Result api_checkpoints_post(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    api_error e;
    enum MHD_Result r;
    json_object *payload;
    if (!api_engine_or_reply(s, c, x, NULL, &r)) return r;
    if (api_checkpoint_or_reply(req, &payload, &e)) return api_reply_error(c, x, &e);
    r = api_submit_and_reply(s, c, x, "checkpoint", payload, NULL);
    json_object_put(payload);
    return r;
}

enum MHD_Result api_checkpoints_get(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    store *st = api_pool_get(s);
    store_ckpt *cks = NULL;
    int n = 0;
    int rc = st ? store_checkpoint_list(st, &cks, &n) : GE_STORE;
    api_pool_put(s, st);
    if (rc) return api_reply_fail(c, x, GE_STORE, "", "cannot list checkpoints: %s", err_msg());
    json_object *o = json_object_new_object(), *a = json_object_new_array();
    for (int i = 0; i < n; i++) {
        json_object *k = json_object_new_object();
        json_object_object_add(k, "id", json_object_new_string(cks[i].id));
        json_object_object_add(k, "path", json_object_new_string(cks[i].path));
        json_object_object_add(k, "policy_version", json_object_new_int64(cks[i].policy_version));
        char ts[32];
        snprintf(ts, sizeof ts, "%.3f", cks[i].created_at);
        json_object_object_add(k, "created_at", json_object_new_double_s(cks[i].created_at, ts));
        json_object_array_add(a, k);
    }
    free(cks);
    json_object_object_add(o, "checkpoints", a);
    return api_reply_obj(c, x, 200, o);
}

/* The index entry, then the directory. Replay never needs it: every update's inputs stay in
 * the store, so a start without it resumes from an older checkpoint and replays more. */
enum MHD_Result api_checkpoint_delete(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    store *st = api_pool_get(s);
    store_ckpt *cks = NULL;
    int n = 0, rc = st ? store_checkpoint_list(st, &cks, &n) : GE_STORE;
    char path[512] = "";
    for (int i = 0; !rc && i < n; i++)
        if (!strcmp(cks[i].id, id)) snprintf(path, sizeof path, "%s", cks[i].path);
    free(cks);
    if (!rc && path[0]) rc = store_checkpoint_delete(st, id);
    api_pool_put(s, st);
    if (rc) return api_reply_fail(c, x, GE_STORE, "", "cannot delete checkpoint: %s", err_msg());
    if (!path[0]) return api_reply_fail(c, x, GE_NOT_FOUND, "id", "no checkpoint %s", id);
    if ((rc = eng_remove_tree(path)))
        return api_reply_fail(c, x, GE_IO, "", "checkpoint %s unlisted, but its directory stays: %s", id, err_msg());
    log_event(LOG_INFO, "checkpoint_deleted", "\"id\":\"%s\"", id);
    json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(id));
    json_object_object_add(o, "deleted", json_object_new_boolean(1));
    return api_reply_obj(c, x, 200, o);
}

static const char *query(struct MHD_Connection *c, const char *k) {
    return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, k);
}

enum MHD_Result api_jobs_get(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    static const char *const kinds[] = {"rollout", "update", "checkpoint", "logprobs", NULL};
    static const char *const statuses[] = {"queued", "running", "done", "failed", "cancelled", NULL};
    const char *kind = query(c, "kind"), *status = query(c, "status"), *lim = query(c, "limit"), *after = query(c, "after");
    int ok = !kind;
    for (int i = 0; kind && kinds[i]; i++) ok |= !strcmp(kind, kinds[i]);
    if (!ok) return api_reply_fail(c, x, GE_INVALID, "kind", "kind must be rollout|update|checkpoint|logprobs");
    ok = !status;
    for (int i = 0; status && statuses[i]; i++) ok |= !strcmp(status, statuses[i]);
    if (!ok) return api_reply_fail(c, x, GE_INVALID, "status", "status must be queued|running|done|failed|cancelled");
    int limit = 100;
    if (lim) {
        char *end;
        long v = strtol(lim, &end, 10);
        if (*end || end == lim || v < 1 || v > 1000) return api_reply_fail(c, x, GE_INVALID, "limit", "limit must be 1..1000");
        limit = (int)v;
    }
    long long before = 0; /* the cursor: a page's "next" */
    if (after) {
        char *end;
        before = strtoll(after, &end, 10);
        if (*end || end == after || before < 1)
            return api_reply_fail(c, x, GE_INVALID, "after", "after must be a page's \"next\"");
    }
    store *st = api_pool_get(s);
    store_job *jobs = NULL;
    int n = 0;
    int rc = st ? store_list(st, kind, status, limit, before, &jobs, &n) : GE_STORE;
    api_pool_put(s, st);
    if (rc) return api_reply_fail(c, x, GE_STORE, "", "cannot list jobs: %s", err_msg());
    api_sbuf b = {0};
    api_sb_str(&b, "{\"jobs\":[");
    for (int i = 0; i < n; i++) {
        if (i) api_sb_str(&b, ",");
        job_json(&b, &jobs[i], 0);
    }
    api_sb_str(&b, "],\"next\":");
    if (n == limit) api_sb_printf(&b, "\"%lld\"}", jobs[n - 1].seq); /* null: the last page */
    else api_sb_str(&b, "null}");
    store_jobs_free(jobs, n);
    return api_reply_sb(c, x, 200, &b);
}

/* GET /v1/jobs/{id}[?wait=S]: replies now, or suspends and is called again on resume. */
enum MHD_Result api_job_get(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    if (!x->waiting) {
        const char *w = query(c, "wait");
        double wait = 0;
        if (w) {
            char *end;
            wait = strtod(w, &end);
            if (*end || end == w || !(wait >= 0))
                return api_reply_fail(c, x, GE_INVALID, "wait", "wait must be a number of seconds >= 0");
            if (wait > s->cfg.max_wait_s) wait = s->cfg.max_wait_s;
        }
        x->deadline = clock_mono_s() + wait;
    }
    store *st = api_pool_get(s);
    if (!st) return api_reply_fail(c, x, GE_STORE, "", "cannot open the store");
    store_job j = {0};
    int rc = store_get(st, id, &j);
    if (rc == GE_NOT_FOUND) {
        api_pool_put(s, st);
        return api_reply_fail(c, x, GE_NOT_FOUND, "id", "no job %s", id);
    }
    if (rc) {
        api_pool_put(s, st);
        return api_reply_fail(c, x, GE_STORE, "", "cannot read job: %s", err_msg());
    }
    if ((j.status == JOB_QUEUED || j.status == JOB_RUNNING) && api_wait_suspend(s, c, x, st, id)) {
        store_job_clear(&j);
        api_pool_put(s, st);
        return MHD_YES;
    }
    /* the state may have moved on while suspending was refused: reply with the newest */
    store_job_clear(&j);
    rc = store_get(st, id, &j);
    api_pool_put(s, st);
    if (rc) return api_reply_fail(c, x, GE_STORE, "", "cannot read job: %s", err_msg());
    api_sbuf b = {0};
    job_json(&b, &j, 1);
    store_job_clear(&j);
    return api_reply_sb(c, x, 200, &b);
}

enum MHD_Result api_job_delete(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    store *st = api_pool_get(s);
    if (!st) return api_reply_fail(c, x, GE_STORE, "", "cannot open the store");
    int rc = store_cancel(st, id);
    store_job j = {0};
    int rc2 = rc ? rc : store_get(st, id, &j);
    api_pool_put(s, st);
    if (rc == GE_NOT_FOUND) return api_reply_fail(c, x, GE_NOT_FOUND, "id", "no job %s", id);
    if (rc == GE_CONFLICT) return api_reply_fail(c, x, GE_CONFLICT, "id", "job %s has already finished", id);
    if (rc || rc2) return api_reply_fail(c, x, GE_STORE, "", "cannot cancel: %s", err_msg());
    log_event(LOG_INFO, "job_cancel", "\"id\":\"%s\",\"status\":\"%s\"", id, store_status_name(j.status));
    api_jobs_changed(s);
    api_sbuf b = {0};
    job_json(&b, &j, 0);
    store_job_clear(&j);
    /* 200 when cancelled now; 202 when the running job was asked to stop */
    return api_reply_sb(c, x, j.status == JOB_CANCELLED ? 200 : 202, &b);
}

/* A failed job back to the queue (attempts reset): 200 with the job; 409 unless failed. */
enum MHD_Result api_job_requeue_post(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    store *st = api_pool_get(s);
    if (!st) return api_reply_fail(c, x, GE_STORE, "", "cannot open the store");
    int rc = store_requeue_failed(st, id);
    store_job j = {0};
    int rc2 = rc ? rc : store_get(st, id, &j);
    api_pool_put(s, st);
    if (rc == GE_NOT_FOUND) return api_reply_fail(c, x, GE_NOT_FOUND, "id", "no job %s", id);
    if (rc == GE_CONFLICT)
        return api_reply_fail(c, x, GE_CONFLICT, "id", "job %s is not failed; only failed jobs are requeued", id);
    if (rc || rc2) return api_reply_fail(c, x, GE_STORE, "", "cannot requeue: %s", err_msg());
    log_event(LOG_INFO, "job_requeued_by_request", "\"id\":\"%s\"", id);
    api_jobs_changed(s);
    api_wake_engine(s);
    api_sbuf b = {0};
    job_json(&b, &j, 0);
    store_job_clear(&j);
    return api_reply_sb(c, x, 200, &b);
}

/* ---------------------------------------------------------------- logprobs (synchronous) */

/* POST /v1/logprobs runs as a "logprobs" job on the engine thread (FIFO with the other jobs);
 * the request waits up to 600 s for it, then replies 202 {"job_id"} for polling instead. */
enum MHD_Result api_logprobs_post(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    if (!x->waiting) {
        api_model m;
        api_error e;
        enum MHD_Result r;
        json_object *payload;
        if (!api_engine_or_reply(s, c, x, &m, &r)) return r;
        api_limits l = api_limits_now(s);
        if (api_logprobs_or_reply(req, &l, &m, &payload, &e)) return api_reply_error(c, x, &e);
        x->job_id[0] = 0;
        char id[32] = "";
        r = api_submit_and_reply(s, c, x, "logprobs", payload, id);
        json_object_put(payload);
        if (!id[0]) return r; /* the error was replied */
        memcpy(x->job_id, id, sizeof id);
        x->deadline = clock_mono_s() + 600;
    }
    store *st = api_pool_get(s);
    if (!st) return api_reply_fail(c, x, GE_STORE, "", "cannot open the store");
    store_job j = {0};
    int rc = store_get(st, x->job_id, &j);
    int pending = !rc && (j.status == JOB_QUEUED || j.status == JOB_RUNNING);
    store_job_clear(&j);
    if (pending && api_wait_suspend(s, c, x, st, x->job_id)) {
        api_pool_put(s, st);
        return MHD_YES;
    }
    rc = store_get(st, x->job_id, &j);
    api_pool_put(s, st);
    if (rc) return api_reply_fail(c, x, GE_STORE, "", "cannot read job: %s", err_msg());
    enum MHD_Result r;
    if (j.status == JOB_DONE && j.result) {
        r = api_reply_json(c, x, 200, j.result);
    } else if (j.status == JOB_FAILED || j.status == JOB_CANCELLED) {
        r = api_reply_job_error(c, x, &j);
    } else {
        char body[160];
        snprintf(body, sizeof body, "{\"job_id\":\"%s\",\"status\":\"%s\"}", j.id, store_status_name(j.status));
        r = api_reply_json(c, x, 202, body);
    }
    store_job_clear(&j);
    return r;
}

/* ---------------------------------------------------------------- model, health */

enum MHD_Result api_model_get(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    enum MHD_Result r;
    eng *e = api_engine_or_reply(s, c, x, NULL, &r);
    if (!e) return r;
    eng_info in;
    eng_get_info(e, &in);
    json_object *o = json_object_new_object(), *eos = json_object_new_array();
    json_object_object_add(o, "arch", json_object_new_string(in.arch));
    json_object_object_add(o, "backend", json_object_new_string(in.backend));
    json_object_object_add(o, "model_dir", json_object_new_string(in.model_dir));
    json_object_object_add(o, "dtype", json_object_new_string(in.dtype));
    json_object_object_add(o, "n_layers", json_object_new_int(in.n_layers));
    json_object_object_add(o, "d_model", json_object_new_int(in.d_model));
    json_object_object_add(o, "n_heads", json_object_new_int(in.n_heads));
    json_object_object_add(o, "n_kv_heads", json_object_new_int(in.n_kv_heads));
    json_object_object_add(o, "head_dim", json_object_new_int(in.head_dim));
    json_object_object_add(o, "d_ff", json_object_new_int(in.d_ff));
    json_object_object_add(o, "vocab", json_object_new_int(in.vocab));
    json_object_object_add(o, "max_model_len", json_object_new_int(in.max_pos));
    json_object_object_add(o, "n_params", json_object_new_int64(in.n_params));
    json_object_object_add(o, "policy_version", json_object_new_int64(in.policy_version));
    for (int i = 0; i < in.n_eos && i < 8; i++) json_object_array_add(eos, json_object_new_int(in.eos_ids[i]));
    json_object_object_add(o, "eos_token_ids", eos);
    json_object *lo = NULL; /* null: full fine-tuning */
    if (in.lora_rank) {
        lo = json_object_new_object();
        json_object *t = json_object_new_array();
        char buf[sizeof in.lora_targets], *save = NULL;
        snprintf(buf, sizeof buf, "%s", in.lora_targets);
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
            json_object_array_add(t, json_object_new_string(tok));
        json_object_object_add(lo, "r", json_object_new_int(in.lora_rank));
        json_object_object_add(lo, "lora_alpha", json_object_new_double(in.lora_alpha));
        json_object_object_add(lo, "target_modules", t);
        json_object_object_add(lo, "trainable_params", json_object_new_int64(in.lora_params));
    }
    json_object_object_add(o, "lora", lo);
    /* the memory plan (engine.h eng_plan): where the state lives, the budgets it set */
    const eng_plan *pl = &in.plan;
    json_object *mp = json_object_new_object();
    const struct {
        const char *k;
        long long v;
    } rows[] = {
        {"device_total_bytes", pl->device_total},
        {"weights_bytes", pl->weights},
        {"reference_bytes", pl->reference},
        {"master_bytes", pl->master},
        {"gradients_bytes", pl->gradients},
        {"moments_bytes", pl->moments},
        {"snapshot_bytes", pl->snapshot},
        {"host_state_bytes", pl->host_state},
        {"headroom_bytes", pl->headroom},
        {"kv_budget_bytes", pl->kv_bytes},
        {"activations_bytes", pl->acts_bytes},
        {"max_tokens_per_micro_batch", pl->micro_batch_tokens},
        {"max_tokens_per_micro_batch_limit", pl->micro_batch_tokens_max},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        json_object_object_add(mp, rows[i].k, json_object_new_int64(rows[i].v));
    json_object_object_add(mp, "optimizer", json_object_new_string(pl->optimizer));
    json_object_object_add(mp, "snapshot", json_object_new_string(pl->snapshot_at));
    json_object_object_add(o, "memory_plan", mp);
    /* one entry per engine (daemon/ranks.h), with its rollout KV pool in use */
    metrics_sched_gauges per[METRICS_RANKS_MAX];
    int W = metrics_ranks_get(per, METRICS_RANKS_MAX);
    json_object *ranks = json_object_new_array();
    for (int r = 0; r < W && r < METRICS_RANKS_MAX; r++) {
        json_object *ro = json_object_new_object();
        json_object_object_add(ro, "rank", json_object_new_int(r));
        json_object_object_add(ro, "kv_rows_used", json_object_new_int64(per[r].kv_rows_used));
        json_object_object_add(ro, "kv_rows_capacity", json_object_new_int64(per[r].kv_rows_capacity));
        json_object_object_add(ro, "state_rows_used", json_object_new_int64(per[r].state_rows_used));
        json_object_object_add(ro, "state_rows_capacity", json_object_new_int64(per[r].state_rows_capacity));
        json_object_object_add(ro, "running_groups", json_object_new_int64(per[r].running_groups));
        json_object_object_add(ro, "waiting_groups", json_object_new_int64(per[r].waiting_groups));
        json_object_array_add(ranks, ro);
    }
    json_object_object_add(o, "ranks", ranks);
    return api_reply_obj(c, x, 200, o);
}

/* deploy.md: open connections get 503 once the drain began */
enum MHD_Result api_healthz_get(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    if (atomic_load(&s->stopping)) return api_reply_fail(c, x, GE_UNAVAILABLE, "", "shutting down");
    return api_reply_json(c, x, 200, "{\"status\":\"ok\"}");
}

enum MHD_Result api_readyz_get(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    if (atomic_load(&s->failed)) return api_reply_fail(c, x, GE_UNAVAILABLE, "", "engine failed: %s", s->fail_msg);
    if (atomic_load(&s->stopping)) return api_reply_fail(c, x, GE_UNAVAILABLE, "", "shutting down");
    if (!atomic_load(&s->engine)) {
        char why[256];
        pthread_mutex_lock(&s->mu);
        snprintf(why, sizeof why, "%s", s->load_msg[0] ? s->load_msg : "model is loading");
        pthread_mutex_unlock(&s->mu);
        return api_reply_fail(c, x, GE_UNAVAILABLE, "", "%s", why);
    }
    char body[128];
    metrics_sched_gauges per[1];
    snprintf(body, sizeof body, "{\"status\":\"ready\",\"policy_version\":%lld,\"ranks\":%d}", api_policy_version_now(s),
             metrics_ranks_get(per, 1));
    return api_reply_json(c, x, 200, body);
}

typedef struct {
    metrics_job_count *a;
    int n, cap;
} counts_acc;
static void count_cb(void *ud, const char *kind, const char *status, long long n) {
    counts_acc *c = ud;
    if (c->n == c->cap) {
        int nc = c->cap ? c->cap * 2 : 32;
        metrics_job_count *na = realloc(c->a, sizeof *na * (size_t)nc);
        if (!na) return;
        c->a = na;
        c->cap = nc;
    }
    c->a[c->n].kind = strdup(kind);
    c->a[c->n].status = strdup(status);
    c->a[c->n].n = n;
    c->n++;
}

enum MHD_Result api_metrics_get(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    store *st = api_pool_get(s);
    counts_acc acc = {0};
    long long depth = 0;
    if (st) {
        store_counts(st, count_cb, &acc);
        depth = store_queue_depth(st);
        metrics_store_bytes(store_size_bytes(st));
    }
    api_pool_put(s, st);
    if (atomic_load(&s->engine)) metrics_policy_version(api_policy_version_now(s));
    char *text;
    size_t len;
    int rc = metrics_render(acc.a, acc.n, depth < 0 ? 0 : depth, atomic_load(&s->engine) != NULL, atomic_load(&s->failed), &text,
                            &len);
    for (int i = 0; i < acc.n; i++) {
        free((char *)acc.a[i].kind);
        free((char *)acc.a[i].status);
    }
    free(acc.a);
    if (rc) return api_reply_fail(c, x, rc, "", "%s", err_msg());
    return api_reply_raw(c, x, 200, "text/plain; version=0.0.4", text, len, 1);
}
