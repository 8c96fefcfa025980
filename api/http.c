/* http.c — libmicrohttpd glue, routes and handlers; see http.h.
 * Layers: small buffers and replies, the store-handle pool, long-poll waiters, handlers (one
 * per route), the router and MHD callbacks, then start/stop. */
#include "api/http.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "api/metrics.h"
#include "api/openapi.h"
#include "daemon/log.h"
#include "engine/err.h"
#include "store/store.h"

#define POOL_MAX 64

typedef struct waiter { struct MHD_Connection *conn; double deadline; struct waiter *next; } waiter;

struct api_server {
    api_config cfg;
    char listen[256], data_dir[1024], api_key[512];
    struct MHD_Daemon *mhd;
    int port;
    pthread_mutex_t mu;             /* limits, pool, fail_msg */
    api_limits limits;
    eng *_Atomic engine;
    int vocab, max_pos;             /* written once before engine is published */
    long long kv_rows;              /* rollout KV pool rows (0 = unknown); set before the engine */
    _Atomic int failed, stopping;
    char fail_msg[256];
    store *pool[POOL_MAX];
    int n_pool;
    pthread_mutex_t wmu;            /* waiters */
    waiter *waiters;
};

typedef struct {
    char *body;
    size_t len, cap;
    int too_large;
    int waiting;                    /* suspended at least once: a long-poll in progress */
    double deadline;
    char job_id[32];                /* POST /v1/logprobs: the job this request waits for */
    const char *route;              /* template for metrics */
    char method[8];
} conn_ctx;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------- growable string */

typedef struct { char *p; size_t len, cap; int oom; } sbuf;
static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t nc = (b->cap + n + 1) * 2;
        char *np = realloc(b->p, nc);
        if (!np) { b->oom = 1; return; }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}
static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[1024];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k >= 0) sb_add(b, tmp, (size_t)(k < (int)sizeof tmp ? k : (int)sizeof tmp - 1));
}
static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }
static void sb_num_or_null(sbuf *b, double v) { if (v > 0) sb_printf(b, "%.3f", v); else sb_str(b, "null"); }

/* ---------------------------------------------------------------- replies */

static enum MHD_Result reply_raw(struct MHD_Connection *c, conn_ctx *x, int status, const char *ctype,
                                 char *body, size_t len, int take) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, take ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_MUST_COPY);
    if (!r) { if (take) free(body); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", ctype);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    metrics_http(x->method, x->route ? x->route : "other", status);
    return ok;
}

static enum MHD_Result reply_json(struct MHD_Connection *c, conn_ctx *x, int status, const char *text) {
    return reply_raw(c, x, status, "application/json", (char *)text, strlen(text), 0);
}
static enum MHD_Result reply_sb(struct MHD_Connection *c, conn_ctx *x, int status, sbuf *b) {
    if (b->oom) { free(b->p); return reply_json(c, x, 507, "{\"error\":{\"code\":\"out_of_memory\",\"message\":\"out of memory\"}}"); }
    return reply_raw(c, x, status, "application/json", b->p, b->len, 1);
}
static enum MHD_Result reply_obj(struct MHD_Connection *c, conn_ctx *x, int status, json_object *o) {
    enum MHD_Result r = reply_json(c, x, status, json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
    return r;
}
static enum MHD_Result reply_error(struct MHD_Connection *c, conn_ctx *x, const api_error *e) {
    json_object *o = json_object_new_object(), *er = json_object_new_object();
    json_object_object_add(er, "code", json_object_new_string(err_name(e->code)));
    json_object_object_add(er, "message", json_object_new_string(e->message[0] ? e->message : err_default(e->code)));
    if (e->field[0]) json_object_object_add(er, "field", json_object_new_string(e->field));
    json_object_object_add(o, "error", er);
    if (e->status >= 500) log_event(LOG_WARN, "http_error", "\"route\":\"%s\",\"status\":%d,\"code\":\"%s\"", x->route ? x->route : "other", e->status, err_name(e->code));
    return reply_obj(c, x, e->status ? e->status : err_http_status(e->code), o);
}
static enum MHD_Result reply_fail(struct MHD_Connection *c, conn_ctx *x, int code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static enum MHD_Result reply_fail(struct MHD_Connection *c, conn_ctx *x, int code, const char *field, const char *fmt, ...) {
    api_error e;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    api_fail(&e, code, field, "%s", msg);
    return reply_error(c, x, &e);
}

/* ---------------------------------------------------------------- store-handle pool */

static store *pool_get(api_server *s) {
    store *st = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->n_pool > 0) st = s->pool[--s->n_pool];
    pthread_mutex_unlock(&s->mu);
    if (!st && store_open(s->data_dir, 0, &st)) {
        log_event(LOG_ERROR, "store_open_failed", "\"error\":\"%s\"", err_name(err_code()));
        return NULL;
    }
    return st;
}
static void pool_put(api_server *s, store *st) {
    if (!st) return;
    pthread_mutex_lock(&s->mu);
    if (s->n_pool < POOL_MAX) { s->pool[s->n_pool++] = st; st = NULL; }
    pthread_mutex_unlock(&s->mu);
    store_close(st);
}

/* ---------------------------------------------------------------- long-poll waiters */

/* Called with the job not finished: suspend until api_jobs_changed or the deadline. The
 * status is re-read under wmu so that a change between the caller's read and the suspend
 * cannot be missed (api_jobs_changed takes wmu after the store commit). */
static int wait_suspend(api_server *s, struct MHD_Connection *c, conn_ctx *x, store *st, const char *id) {
    pthread_mutex_lock(&s->wmu);
    store_job j = {0};
    int rc = store_get(st, id, &j);
    int terminal = rc || (j.status != JOB_QUEUED && j.status != JOB_RUNNING);
    store_job_clear(&j);
    if (terminal || atomic_load(&s->stopping) || now_s() >= x->deadline) { pthread_mutex_unlock(&s->wmu); return 0; }
    waiter *w = malloc(sizeof *w);
    if (!w) { pthread_mutex_unlock(&s->wmu); return 0; }
    w->conn = c;
    w->deadline = x->deadline;
    w->next = s->waiters;
    s->waiters = w;
    x->waiting = 1;
    MHD_suspend_connection(c);
    pthread_mutex_unlock(&s->wmu);
    return 1;
}

static void resume_where(api_server *s, int all) {
    double t = now_s();
    pthread_mutex_lock(&s->wmu);
    for (waiter **pw = &s->waiters; *pw;) {
        waiter *w = *pw;
        if (all || t >= w->deadline) {
            MHD_resume_connection(w->conn);
            *pw = w->next;
            free(w);
        } else {
            pw = &w->next;
        }
    }
    pthread_mutex_unlock(&s->wmu);
}
void api_jobs_changed(api_server *s) { if (s) resume_where(s, 1); }
void api_tick(api_server *s) { if (s) resume_where(s, 0); }

/* ---------------------------------------------------------------- model hooks for validation */

static int hook_tokenize(void *ud, const char *text, size_t len, int add_special, int **ids, int *n) {
    return eng_tokenize((eng *)ud, text, len, add_special, ids, n);
}
static int hook_chat(void *ud, const char *const *roles, const char *const *contents, int n, int agp, char **text) {
    eng_message *m = calloc((size_t)n + 1, sizeof *m);
    if (!m) return err_set(GE_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) { m[i].role = roles[i]; m[i].content = contents[i]; }
    int rc = eng_render_chat((eng *)ud, m, n, agp, text);
    free(m);
    return rc;
}

/* The engine when ready, else replies 503 and returns NULL. */
/* The current limits (SIGHUP may replace them while requests run). */
static api_limits limits_now(api_server *s) {
    pthread_mutex_lock(&s->mu);
    api_limits l = s->limits;
    pthread_mutex_unlock(&s->mu);
    return l;
}

static eng *engine_or_reply(api_server *s, struct MHD_Connection *c, conn_ctx *x, api_model *m, enum MHD_Result *r) {
    eng *e = atomic_load(&s->engine);
    if (atomic_load(&s->failed)) {
        *r = reply_fail(c, x, GE_UNAVAILABLE, "", "engine failed: %s", s->fail_msg);
        return NULL;
    }
    if (!e) { *r = reply_fail(c, x, GE_UNAVAILABLE, "", "model is still loading; retry when GET /readyz says 200"); return NULL; }
    if (m) {
        m->vocab = s->vocab;
        m->max_pos = s->max_pos;
        m->kv_rows = s->kv_rows;
        m->tokenize = hook_tokenize;
        m->render_chat = hook_chat;
        m->ud = e;
    }
    return e;
}

static long long policy_version_now(api_server *s) {
    eng *e = atomic_load(&s->engine);
    if (!e) return -1;
    eng_info info;
    eng_get_info(e, &info);
    return info.policy_version;
}

/* ---------------------------------------------------------------- jobs */

static void job_json(sbuf *b, const store_job *j, int full) {
    sb_printf(b, "{\"id\":\"%s\",\"kind\":\"%s\",\"status\":\"%s\",\"created_at\":", j->id, j->kind, store_status_name(j->status));
    sb_num_or_null(b, j->created_at);
    sb_str(b, ",\"started_at\":");
    sb_num_or_null(b, j->started_at);
    sb_str(b, ",\"finished_at\":");
    sb_num_or_null(b, j->finished_at);
    sb_printf(b, ",\"progress\":%.4f,\"attempts\":%d,\"policy_version\":", j->progress, j->attempts);
    if (j->policy_version >= 0) sb_printf(b, "%lld", j->policy_version); else sb_str(b, "null");
    sb_printf(b, ",\"cancel_requested\":%s,\"error\":", j->cancel_requested ? "true" : "false");
    sb_str(b, j->error ? j->error : "null");
    if (full) {
        sb_str(b, ",\"result\":");
        sb_str(b, j->result ? j->result : "null");
    }
    sb_str(b, "}");
}

/* Submits payload as a job of kind and replies 202 {"job_id","status"} (or the error). */
static enum MHD_Result submit_and_reply(api_server *s, struct MHD_Connection *c, conn_ctx *x, const char *kind,
                                        json_object *payload, char *id_out) {
    if (atomic_load(&s->stopping)) return reply_fail(c, x, GE_UNAVAILABLE, "", "grpod is shutting down");
    store *st = pool_get(s);
    if (!st) return reply_fail(c, x, GE_STORE, "", "cannot open the store");
    int max_q = limits_now(s).max_queued_jobs;
    char id[32];
    int rc = store_submit(st, kind, json_object_to_json_string_ext(payload, JSON_C_TO_STRING_PLAIN), max_q, id);
    pool_put(s, st);
    if (rc == GE_BUSY) return reply_fail(c, x, GE_BUSY, "", "the queue holds %d jobs (--max-queued-jobs); retry later", max_q);
    if (rc) return reply_fail(c, x, rc, "", "cannot store the job: %s", err_msg());
    log_event(LOG_INFO, "job_submitted", "\"id\":\"%s\",\"kind\":\"%s\"", id, kind);
    pthread_mutex_lock(&s->mu);
    void (*hook)(void *) = s->cfg.job_submitted;
    void *hook_ud = s->cfg.ud;
    pthread_mutex_unlock(&s->mu);
    if (hook) hook(hook_ud);
    if (id_out) { memcpy(id_out, id, sizeof id); return MHD_YES; }
    char body[128];
    snprintf(body, sizeof body, "{\"job_id\":\"%s\",\"status\":\"queued\"}", id);
    return reply_json(c, x, 202, body);
}

static enum MHD_Result h_rollouts(api_server *s, struct MHD_Connection *c, conn_ctx *x, json_object *req) {
    api_model m;
    api_error e;
    enum MHD_Result r;
    json_object *payload;
    if (!engine_or_reply(s, c, x, &m, &r)) return r;
    api_limits l = limits_now(s);
    if (api_rollout_or_reply(req, &l, &m, &payload, &e)) return reply_error(c, x, &e);
    r = submit_and_reply(s, c, x, "rollout", payload, NULL);
    json_object_put(payload);
    return r;
}

static enum MHD_Result h_updates(api_server *s, struct MHD_Connection *c, conn_ctx *x, json_object *req) {
    api_model m;
    api_error e;
    enum MHD_Result r;
    json_object *payload;
    const char *rid;
    long long expected;
    if (!engine_or_reply(s, c, x, &m, &r)) return r;
    api_limits l = limits_now(s);
    if (api_update_or_reply(req, &l, &m, &payload, &rid, &expected, &e)) return reply_error(c, x, &e);
    long long pv = policy_version_now(s);
    if (expected >= 0 && expected != pv) {
        json_object_put(payload);
        return reply_fail(c, x, GE_CONFLICT, "expected_policy_version",
                          "expected_policy_version %lld does not match the current policy_version %lld", expected, pv);
    }
    if (rid) {
        store *st = pool_get(s);
        store_job j = {0};
        int rc = st ? store_get(st, rid, &j) : GE_STORE;
        pool_put(s, st);
        const char *why = NULL;
        int code = GE_CONFLICT;
        if (rc == GE_NOT_FOUND) { why = "no such job"; code = GE_NOT_FOUND; }
        else if (rc) { why = "cannot read the store"; code = GE_STORE; }
        else if (strcmp(j.kind, "rollout")) { why = "is not a rollout job"; code = GE_INVALID; }
        else if (j.status != JOB_DONE) why = "has not finished successfully";
        char id[32];
        snprintf(id, sizeof id, "%s", rid);
        store_job_clear(&j);
        if (why) {
            json_object_put(payload);
            return reply_fail(c, x, code, "rollout_job_id", "rollout_job_id %s %s", id, why);
        }
    }
    r = submit_and_reply(s, c, x, "update", payload, NULL);
    json_object_put(payload);
    return r;
}

static enum MHD_Result h_checkpoint_post(api_server *s, struct MHD_Connection *c, conn_ctx *x, json_object *req) {
    api_error e;
    enum MHD_Result r;
    json_object *payload;
    if (!engine_or_reply(s, c, x, NULL, &r)) return r;
    if (api_checkpoint_or_reply(req, &payload, &e)) return reply_error(c, x, &e);
    r = submit_and_reply(s, c, x, "checkpoint", payload, NULL);
    json_object_put(payload);
    return r;
}

static enum MHD_Result h_checkpoints_get(api_server *s, struct MHD_Connection *c, conn_ctx *x) {
    store *st = pool_get(s);
    store_ckpt *cks = NULL;
    int n = 0;
    int rc = st ? store_checkpoint_list(st, &cks, &n) : GE_STORE;
    pool_put(s, st);
    if (rc) return reply_fail(c, x, GE_STORE, "", "cannot list checkpoints: %s", err_msg());
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
    return reply_obj(c, x, 200, o);
}

static const char *query(struct MHD_Connection *c, const char *k) {
    return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, k);
}

static enum MHD_Result h_jobs_list(api_server *s, struct MHD_Connection *c, conn_ctx *x) {
    static const char *const kinds[] = {"rollout", "update", "checkpoint", "logprobs", NULL};
    static const char *const statuses[] = {"queued", "running", "done", "failed", "cancelled", NULL};
    const char *kind = query(c, "kind"), *status = query(c, "status"), *lim = query(c, "limit");
    int ok = !kind;
    for (int i = 0; kind && kinds[i]; i++) ok |= !strcmp(kind, kinds[i]);
    if (!ok) return reply_fail(c, x, GE_INVALID, "kind", "kind must be rollout|update|checkpoint|logprobs");
    ok = !status;
    for (int i = 0; status && statuses[i]; i++) ok |= !strcmp(status, statuses[i]);
    if (!ok) return reply_fail(c, x, GE_INVALID, "status", "status must be queued|running|done|failed|cancelled");
    int limit = 100;
    if (lim) {
        char *end;
        long v = strtol(lim, &end, 10);
        if (*end || end == lim || v < 1 || v > 1000) return reply_fail(c, x, GE_INVALID, "limit", "limit must be 1..1000");
        limit = (int)v;
    }
    store *st = pool_get(s);
    store_job *jobs = NULL;
    int n = 0;
    int rc = st ? store_list(st, kind, status, limit, &jobs, &n) : GE_STORE;
    pool_put(s, st);
    if (rc) return reply_fail(c, x, GE_STORE, "", "cannot list jobs: %s", err_msg());
    sbuf b = {0};
    sb_str(&b, "{\"jobs\":[");
    for (int i = 0; i < n; i++) {
        if (i) sb_str(&b, ",");
        job_json(&b, &jobs[i], 0);
    }
    sb_str(&b, "]}");
    store_jobs_free(jobs, n);
    return reply_sb(c, x, 200, &b);
}

/* GET /v1/jobs/{id}[?wait=S]: replies now, or suspends and is called again on resume. */
static enum MHD_Result h_job_get(api_server *s, struct MHD_Connection *c, conn_ctx *x, const char *id) {
    if (!x->waiting) {
        const char *w = query(c, "wait");
        double wait = 0;
        if (w) {
            char *end;
            wait = strtod(w, &end);
            if (*end || end == w || !(wait >= 0)) return reply_fail(c, x, GE_INVALID, "wait", "wait must be a number of seconds >= 0");
            if (wait > s->cfg.max_wait_s) wait = s->cfg.max_wait_s;
        }
        x->deadline = now_s() + wait;
    }
    store *st = pool_get(s);
    if (!st) return reply_fail(c, x, GE_STORE, "", "cannot open the store");
    store_job j = {0};
    int rc = store_get(st, id, &j);
    if (rc == GE_NOT_FOUND) { pool_put(s, st); return reply_fail(c, x, GE_NOT_FOUND, "id", "no job %s", id); }
    if (rc) { pool_put(s, st); return reply_fail(c, x, GE_STORE, "", "cannot read job: %s", err_msg()); }
    if ((j.status == JOB_QUEUED || j.status == JOB_RUNNING) && wait_suspend(s, c, x, st, id)) {
        store_job_clear(&j);
        pool_put(s, st);
        return MHD_YES;
    }
    /* the state may have moved on while suspending was refused: reply with the newest */
    store_job_clear(&j);
    rc = store_get(st, id, &j);
    pool_put(s, st);
    if (rc) return reply_fail(c, x, GE_STORE, "", "cannot read job: %s", err_msg());
    sbuf b = {0};
    job_json(&b, &j, 1);
    store_job_clear(&j);
    return reply_sb(c, x, 200, &b);
}

static enum MHD_Result h_job_delete(api_server *s, struct MHD_Connection *c, conn_ctx *x, const char *id) {
    store *st = pool_get(s);
    if (!st) return reply_fail(c, x, GE_STORE, "", "cannot open the store");
    int rc = store_cancel(st, id);
    store_job j = {0};
    int rc2 = rc ? rc : store_get(st, id, &j);
    pool_put(s, st);
    if (rc == GE_NOT_FOUND) return reply_fail(c, x, GE_NOT_FOUND, "id", "no job %s", id);
    if (rc == GE_CONFLICT) return reply_fail(c, x, GE_CONFLICT, "id", "job %s has already finished", id);
    if (rc || rc2) return reply_fail(c, x, GE_STORE, "", "cannot cancel: %s", err_msg());
    log_event(LOG_INFO, "job_cancel", "\"id\":\"%s\",\"status\":\"%s\"", id, store_status_name(j.status));
    api_jobs_changed(s);
    sbuf b = {0};
    job_json(&b, &j, 0);
    store_job_clear(&j);
    /* 200 when cancelled now; 202 when the running job was asked to stop */
    return reply_sb(c, x, j.status == JOB_CANCELLED ? 200 : 202, &b);
}

/* ---------------------------------------------------------------- logprobs (synchronous) */

/* {"code":"conflict",...} → the HTTP status of that code (500 when unknown). */
static int status_of_error_json(const char *err) {
    json_object *o = err ? json_tokener_parse(err) : NULL, *code;
    int st = 500;
    if (o && json_object_object_get_ex(o, "code", &code))
        for (int i = 0; i < GE_COUNT_; i++)
            if (!strcmp(err_name(-i), json_object_get_string(code))) { st = err_http_status(-i); break; }
    json_object_put(o);
    return st;
}

/* POST /v1/logprobs runs as a "logprobs" job on the engine thread (FIFO with the other jobs);
 * the request waits up to 600 s for it, then replies 202 {"job_id"} for polling instead. */
static enum MHD_Result h_logprobs(api_server *s, struct MHD_Connection *c, conn_ctx *x, json_object *req) {
    if (!x->waiting) {
        api_model m;
        api_error e;
        enum MHD_Result r;
        json_object *payload;
        if (!engine_or_reply(s, c, x, &m, &r)) return r;
        api_limits l = limits_now(s);
        if (api_logprobs_or_reply(req, &l, &m, &payload, &e)) return reply_error(c, x, &e);
        x->job_id[0] = 0;
        char id[32] = "";
        r = submit_and_reply(s, c, x, "logprobs", payload, id);
        json_object_put(payload);
        if (!id[0]) return r;           /* the error was replied */
        memcpy(x->job_id, id, sizeof id);
        x->deadline = now_s() + 600;
    }
    store *st = pool_get(s);
    if (!st) return reply_fail(c, x, GE_STORE, "", "cannot open the store");
    store_job j = {0};
    int rc = store_get(st, x->job_id, &j);
    int pending = !rc && (j.status == JOB_QUEUED || j.status == JOB_RUNNING);
    store_job_clear(&j);
    if (pending && wait_suspend(s, c, x, st, x->job_id)) { pool_put(s, st); return MHD_YES; }
    rc = store_get(st, x->job_id, &j);
    pool_put(s, st);
    if (rc) return reply_fail(c, x, GE_STORE, "", "cannot read job: %s", err_msg());
    enum MHD_Result r;
    if (j.status == JOB_DONE && j.result) {
        r = reply_json(c, x, 200, j.result);
    } else if (j.status == JOB_FAILED || j.status == JOB_CANCELLED) {
        sbuf b = {0};
        sb_str(&b, "{\"error\":");
        sb_str(&b, j.error ? j.error : "{\"code\":\"conflict\",\"message\":\"cancelled\"}");
        sb_str(&b, "}");
        r = reply_sb(c, x, j.error ? status_of_error_json(j.error) : 409, &b);
    } else {
        char body[160];
        snprintf(body, sizeof body, "{\"job_id\":\"%s\",\"status\":\"%s\"}", j.id, store_status_name(j.status));
        r = reply_json(c, x, 202, body);
    }
    store_job_clear(&j);
    return r;
}

/* ---------------------------------------------------------------- tokenizer, model, health */

static enum MHD_Result h_tokenize(api_server *s, struct MHD_Connection *c, conn_ctx *x, json_object *req) {
    api_model m;
    api_error e;
    enum MHD_Result r;
    int *ids, n;
    if (!engine_or_reply(s, c, x, &m, &r)) return r;
    if (api_tokenize_or_reply(req, &m, &ids, &n, &e)) return reply_error(c, x, &e);
    sbuf b = {0};
    sb_str(&b, "{\"tokens\":[");
    for (int i = 0; i < n; i++) sb_printf(&b, i ? ",%d" : "%d", ids[i]);
    sb_printf(&b, "],\"count\":%d,\"max_model_len\":%d}", n, m.max_pos);
    free(ids);
    return reply_sb(c, x, 200, &b);
}

static enum MHD_Result h_detokenize(api_server *s, struct MHD_Connection *c, conn_ctx *x, json_object *req) {
    api_model m;
    api_error e;
    enum MHD_Result r;
    int *ids, n, skip;
    eng *en = engine_or_reply(s, c, x, &m, &r);
    if (!en) return r;
    if (api_detokenize_or_reply(req, &m, &ids, &n, &skip, &e)) return reply_error(c, x, &e);
    char *text = NULL;
    size_t len = 0;
    int rc = eng_detokenize(en, ids, n, skip, &text, &len);
    free(ids);
    if (rc) return reply_fail(c, x, GE_INVALID, "tokens", "cannot detokenize: %s", err_msg());
    json_object *o = json_object_new_object();
    size_t sl = 0;
    char *clean = api_utf8_sanitize(text ? text : "", text ? len : 0, &sl);
    free(text);
    if (!clean) return reply_fail(c, x, GE_NOMEM, "", "out of memory");
    json_object_object_add(o, "prompt", json_object_new_string_len(clean, (int)sl));
    free(clean);
    return reply_obj(c, x, 200, o);
}

static enum MHD_Result h_model(api_server *s, struct MHD_Connection *c, conn_ctx *x) {
    enum MHD_Result r;
    eng *e = engine_or_reply(s, c, x, NULL, &r);
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
    return reply_obj(c, x, 200, o);
}

static enum MHD_Result h_readyz(api_server *s, struct MHD_Connection *c, conn_ctx *x) {
    if (atomic_load(&s->failed)) return reply_fail(c, x, GE_UNAVAILABLE, "", "engine failed: %s", s->fail_msg);
    if (atomic_load(&s->stopping)) return reply_fail(c, x, GE_UNAVAILABLE, "", "shutting down");
    if (!atomic_load(&s->engine)) return reply_fail(c, x, GE_UNAVAILABLE, "", "model is loading");
    char body[96];
    snprintf(body, sizeof body, "{\"status\":\"ready\",\"policy_version\":%lld}", policy_version_now(s));
    return reply_json(c, x, 200, body);
}

typedef struct { metrics_job_count *a; int n, cap; } counts_acc;
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

static enum MHD_Result h_metrics(api_server *s, struct MHD_Connection *c, conn_ctx *x) {
    store *st = pool_get(s);
    counts_acc acc = {0};
    long long depth = 0;
    if (st) { store_counts(st, count_cb, &acc); depth = store_queue_depth(st); }
    pool_put(s, st);
    if (atomic_load(&s->engine)) metrics_policy_version(policy_version_now(s));
    char *text;
    size_t len;
    int rc = metrics_render(acc.a, acc.n, depth < 0 ? 0 : depth, atomic_load(&s->engine) != NULL, atomic_load(&s->failed), &text, &len);
    for (int i = 0; i < acc.n; i++) { free((char *)acc.a[i].kind); free((char *)acc.a[i].status); }
    free(acc.a);
    if (rc) return reply_fail(c, x, rc, "", "%s", err_msg());
    return reply_raw(c, x, 200, "text/plain; version=0.0.4", text, len, 1);
}

/* ---------------------------------------------------------------- router */

/* Matches path against a template; *id_out points into path for "{id}". */
static int route_match(const char *tpl, const char *path, const char **id_out) {
    const char *brace = strstr(tpl, "{id}");
    if (!brace) return strcmp(tpl, path) == 0;
    size_t pre = (size_t)(brace - tpl);
    if (strncmp(tpl, path, pre) != 0) return 0;
    const char *id = path + pre;
    if (!*id || strchr(id, '/')) return 0;
    *id_out = id;
    return 1;
}

static int auth_ok(api_server *s, struct MHD_Connection *c) {
    if (!s->api_key[0]) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    h += 7;
    size_t a = strlen(h), b = strlen(s->api_key);
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned char)(h[i] ^ s->api_key[i]);
    return diff == 0;
}

static enum MHD_Result dispatch(api_server *s, struct MHD_Connection *c, conn_ctx *x, const char *url) {
    const api_route *rt = NULL;
    const char *id = NULL;
    int path_known = 0;
    for (int i = 0; i < R_COUNT; i++) {
        const char *tid = NULL;
        if (!route_match(api_routes[i].path, url, &tid)) continue;
        path_known = 1;
        if (strcmp(api_routes[i].method, x->method) == 0) { rt = &api_routes[i]; id = tid; break; }
    }
    if (!rt) {
        x->route = "other";
        if (path_known) return reply_fail(c, x, GE_METHOD, "", "%s is not allowed on %s", x->method, url);
        return reply_fail(c, x, GE_NOT_FOUND, "", "no route %s %s", x->method, url);
    }
    x->route = rt->path;
    if (!strncmp(url, "/v1/", 4) && !auth_ok(s, c))
        return reply_fail(c, x, GE_UNAUTHORIZED, "Authorization", "missing or wrong API key: send Authorization: Bearer <key>");
    if (x->too_large)
        return reply_fail(c, x, GE_TOO_LARGE, "", "request body over the limit of %lld bytes (--max-body-bytes)", limits_now(s).max_body_bytes);
    json_object *req = NULL;
    if (rt->request_schema && !x->waiting) {
        api_error e;
        if (rt->id == R_CKPT_POST && x->len == 0) req = json_object_new_object();
        else if (api_parse_json_or_reply(x->body, x->len, &req, &e)) return reply_error(c, x, &e);
    }
    enum MHD_Result r;
    switch (rt->id) {
    case R_HEALTHZ: r = reply_json(c, x, 200, "{\"status\":\"ok\"}"); break;
    case R_READYZ: r = h_readyz(s, c, x); break;
    case R_METRICS: r = h_metrics(s, c, x); break;
    case R_OPENAPI: r = reply_json(c, x, 200, api_openapi_json()); break;
    case R_ROLLOUTS: r = h_rollouts(s, c, x, req); break;
    case R_UPDATES: r = h_updates(s, c, x, req); break;
    case R_JOBS: r = h_jobs_list(s, c, x); break;
    case R_JOB_GET: r = h_job_get(s, c, x, id); break;
    case R_JOB_DELETE: r = h_job_delete(s, c, x, id); break;
    case R_MODEL: r = h_model(s, c, x); break;
    case R_CKPT_POST: r = h_checkpoint_post(s, c, x, req); break;
    case R_CKPT_GET: r = h_checkpoints_get(s, c, x); break;
    case R_LOGPROBS: r = h_logprobs(s, c, x, req); break;
    case R_TOKENIZE: r = h_tokenize(s, c, x, req); break;
    case R_DETOKENIZE: r = h_detokenize(s, c, x, req); break;
    default: r = reply_fail(c, x, GE_INTERNAL, "", "unrouted"); break;
    }
    json_object_put(req);
    return r;
}

/* ---------------------------------------------------------------- MHD callbacks */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    api_server *s = cls;
    conn_ctx *x = *con_cls;
    if (!x) {
        if (!(x = calloc(1, sizeof *x))) return MHD_NO;
        *con_cls = x;
        snprintf(x->method, sizeof x->method, "%s", method);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoll(cl, NULL, 10) > limits_now(s).max_body_bytes) x->too_large = 1;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (x->too_large) return MHD_YES;       /* drain, reply 413 at the end */
        if ((long long)(x->len + n) > limits_now(s).max_body_bytes) {
            x->too_large = 1;
            free(x->body);
            x->body = NULL;
            x->len = x->cap = 0;
            return MHD_YES;
        }
        if (x->len + n + 1 > x->cap) {
            size_t nc = (x->len + n + 1) * 2;
            char *nb = realloc(x->body, nc);
            if (!nb) { x->too_large = 1; return MHD_YES; }
            x->body = nb;
            x->cap = nc;
        }
        memcpy(x->body + x->len, upload, n);
        x->len += n;
        x->body[x->len] = 0;
        return MHD_YES;
    }
    return dispatch(s, c, x, url);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t) {
    conn_ctx *x = *con_cls;
    if (!x) return;
    free(x->body);
    free(x);
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    char msg[512], esc[600];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    log_event(LOG_DEBUG, "mhd", "\"msg\":%s", log_str(esc, sizeof esc, msg));
}

/* ---------------------------------------------------------------- start / stop */

int api_parse_listen(const char *listen, void *ss_out, int *len_out, int *is_loopback) {
    char host[256], port[16];
    const char *colon = strrchr(listen, ':');
    if (!colon) return err_set(GE_INVALID, "--listen '%s' must be HOST:PORT", listen);
    size_t hl = (size_t)(colon - listen);
    if (hl >= sizeof host || strlen(colon + 1) >= sizeof port || !colon[1])
        return err_set(GE_INVALID, "--listen '%s' must be HOST:PORT", listen);
    memcpy(host, listen, hl);
    host[hl] = 0;
    snprintf(port, sizeof port, "%s", colon + 1);
    char *h = host;
    if (h[0] == '[') {
        size_t l = strlen(h);
        if (l < 2 || h[l - 1] != ']') return err_set(GE_INVALID, "--listen '%s': unbalanced [ ]", listen);
        h[l - 1] = 0;
        h++;
    }
    char *end;
    long p = strtol(port, &end, 10);
    if (*end || p < 0 || p > 65535) return err_set(GE_INVALID, "--listen '%s': port must be 0..65535", listen);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int g = getaddrinfo(*h ? h : NULL, port, &hints, &res);
    if (g || !res) return err_set(GE_INVALID, "--listen '%s': %s", listen, gai_strerror(g));
    memcpy(ss_out, res->ai_addr, res->ai_addrlen);
    *len_out = (int)res->ai_addrlen;
    *is_loopback = 0;
    if (res->ai_family == AF_INET)
        *is_loopback = (ntohl(((struct sockaddr_in *)res->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    else if (res->ai_family == AF_INET6)
        *is_loopback = IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)res->ai_addr)->sin6_addr);
    freeaddrinfo(res);
    return 0;
}

int api_start(const api_config *cfg, api_server **out) {
    *out = NULL;
    api_server *s = calloc(1, sizeof *s);
    if (!s) return err_set(GE_NOMEM, "api: out of memory");
    s->cfg = *cfg;
    snprintf(s->listen, sizeof s->listen, "%s", cfg->listen);
    snprintf(s->data_dir, sizeof s->data_dir, "%s", cfg->data_dir);
    snprintf(s->api_key, sizeof s->api_key, "%s", cfg->api_key ? cfg->api_key : "");
    s->limits = cfg->limits;
    if (s->cfg.max_wait_s <= 0) s->cfg.max_wait_s = 60;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->wmu, NULL);
    struct sockaddr_storage ss;
    int sl, loop;
    int rc = api_parse_listen(cfg->listen, &ss, &sl, &loop);
    if (rc) goto fail;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_AUTO | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s,
                              MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                              MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(cfg->threads > 0 ? cfg->threads : 4),
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
                              MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
                              MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
                              MHD_OPTION_END);
    if (!s->mhd) { rc = err_set(GE_IO, "cannot listen on %s (address in use or not permitted?)", cfg->listen); goto fail; }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : 0;
    *out = s;
    return 0;
fail:
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->wmu);
    free(s);
    return rc;
}

int api_port(api_server *s) { return s->port; }

void api_set_kv_rows(api_server *s, long long rows) { s->kv_rows = rows; }

void api_set_engine(api_server *s, eng *e) {
    eng_info in;
    eng_get_info(e, &in);
    s->vocab = in.vocab;
    s->max_pos = in.max_pos;
    metrics_policy_version(in.policy_version);
    atomic_store(&s->engine, e);
}

void api_set_failed(api_server *s, const char *why) {
    pthread_mutex_lock(&s->mu);
    snprintf(s->fail_msg, sizeof s->fail_msg, "%s", why);
    pthread_mutex_unlock(&s->mu);
    atomic_store(&s->failed, 1);
}

void api_set_limits(api_server *s, const api_limits *l) {
    pthread_mutex_lock(&s->mu);
    s->limits = *l;
    pthread_mutex_unlock(&s->mu);
}

void api_set_submit_hook(api_server *s, void (*job_submitted)(void *ud), void *ud) {
    pthread_mutex_lock(&s->mu);
    s->cfg.job_submitted = job_submitted;
    s->cfg.ud = ud;
    pthread_mutex_unlock(&s->mu);
}

void api_quiesce(api_server *s) {
    if (!s) return;
    atomic_store(&s->stopping, 1);
    MHD_socket fd = MHD_quiesce_daemon(s->mhd);
    if (fd != MHD_INVALID_SOCKET) close(fd);
    resume_where(s, 1);
}

void api_stop(api_server *s) {
    if (!s) return;
    atomic_store(&s->stopping, 1);
    resume_where(s, 1);
    /* let resumed long-pollers get their reply before the threads go */
    for (int i = 0; i < 20; i++) {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
        if (!di || di->num_connections == 0) break;
        usleep(50 * 1000);
    }
    MHD_stop_daemon(s->mhd);
    for (int i = 0; i < s->n_pool; i++) store_close(s->pool[i]);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->wmu);
    free(s);
}
