/* http.c — the server side of the HTTP layer: replies, the store-handle pool, long-poll
 * waiters, the model hooks handed to validation, the router and MHD callbacks, then
 * start/stop; see http.h. The endpoint handlers are in handlers.c, what the two share in
 * http_internal.h. */
#include "api/http_internal.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "api/guard.h"
#include "api/metrics.h"
#include "api/openapi.h"
#include "api/status.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

/* ---------------------------------------------------------------- replies */

enum MHD_Result api_reply_raw(struct MHD_Connection *c, api_req *x, int status, const char *ctype,
                              char *body, size_t len, int take) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, take ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_MUST_COPY);
    if (!r) { if (take) free(body); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", ctype);
    /* RFC 9110: tell clients when to come back and how to authenticate */
    if (status == 429) MHD_add_response_header(r, "Retry-After", "1");
    else if (status == 503) MHD_add_response_header(r, "Retry-After", "2");
    else if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"grpod\"");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    metrics_http(x->method, x->route ? x->route : "other", status);
    return ok;
}

enum MHD_Result api_reply_json(struct MHD_Connection *c, api_req *x, int status, const char *text) {
    return api_reply_raw(c, x, status, "application/json", (char *)text, strlen(text), 0);
}
enum MHD_Result api_reply_sb(struct MHD_Connection *c, api_req *x, int status, api_sbuf *b) {
    if (b->oom) { free(b->p); return api_reply_json(c, x, 507, "{\"error\":{\"code\":\"out_of_memory\",\"message\":\"out of memory\"}}"); }
    return api_reply_raw(c, x, status, "application/json", b->p, b->len, 1);
}
enum MHD_Result api_reply_obj(struct MHD_Connection *c, api_req *x, int status, json_object *o) {
    enum MHD_Result r = api_reply_json(c, x, status, json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
    return r;
}
enum MHD_Result api_reply_error(struct MHD_Connection *c, api_req *x, const api_error *e) {
    json_object *o = json_object_new_object(), *er = json_object_new_object();
    json_object_object_add(er, "code", json_object_new_string(err_name(e->code)));
    json_object_object_add(er, "message", json_object_new_string(e->message[0] ? e->message : err_default(e->code)));
    if (e->field[0]) json_object_object_add(er, "field", json_object_new_string(e->field));
    json_object_object_add(o, "error", er);
    if (e->status >= 500) log_event(LOG_WARN, "http_error", "\"route\":\"%s\",\"status\":%d,\"code\":\"%s\"", x->route ? x->route : "other", e->status, err_name(e->code));
    return api_reply_obj(c, x, e->status ? e->status : api_http_status(e->code), o);
}
enum MHD_Result api_reply_fail(struct MHD_Connection *c, api_req *x, int code, const char *field, const char *fmt, ...) {
    api_error e;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    api_fail(&e, code, field, "%s", msg);
    return api_reply_error(c, x, &e);
}

/* ---------------------------------------------------------------- store-handle pool */

store *api_pool_get(api_server *s) {
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
void api_pool_put(api_server *s, store *st) {
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
int api_wait_suspend(api_server *s, struct MHD_Connection *c, api_req *x, store *st, const char *id) {
    pthread_mutex_lock(&s->wmu);
    store_job j = {0};
    int rc = store_get(st, id, &j);
    int terminal = rc || (j.status != JOB_QUEUED && j.status != JOB_RUNNING);
    store_job_clear(&j);
    if (terminal || atomic_load(&s->stopping) || clock_mono_s() >= x->deadline) { pthread_mutex_unlock(&s->wmu); return 0; }
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
    double t = clock_mono_s();
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
void api_tick(api_server *s) {
    if (!s) return;
    resume_where(s, 0);
    api_conns_sweep(s->conns, 0);
}

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

/* The current limits (SIGHUP may replace them while requests run). */
api_limits api_limits_now(api_server *s) {
    pthread_mutex_lock(&s->mu);
    api_limits l = s->limits;
    pthread_mutex_unlock(&s->mu);
    return l;
}

/* The engine when ready, else replies 503 and returns NULL. */
eng *api_engine_or_reply(api_server *s, struct MHD_Connection *c, api_req *x, api_model *m, enum MHD_Result *r) {
    eng *e = atomic_load(&s->engine);
    if (atomic_load(&s->failed)) {
        *r = api_reply_fail(c, x, GE_UNAVAILABLE, "", "engine failed: %s", s->fail_msg);
        return NULL;
    }
    if (!e) { *r = api_reply_fail(c, x, GE_UNAVAILABLE, "", "model is still loading; retry when GET /readyz says 200"); return NULL; }
    if (m) {
        m->vocab = s->vocab;
        m->max_pos = s->max_pos;
        m->kv_rows = s->kv_rows;
        m->mb_tokens = s->mb_tokens;
        m->mb_tokens_max = s->mb_tokens_max;
        m->tokenize = hook_tokenize;
        m->render_chat = hook_chat;
        m->ud = e;
    }
    return e;
}

long long api_policy_version_now(api_server *s) {
    eng *e = atomic_load(&s->engine);
    if (!e) return -1;
    eng_info info;
    eng_get_info(e, &info);
    return info.policy_version;
}

/* ---------------------------------------------------------------- router */

/* Matches path against a template; *id_out points into path for "{id}". */
/* id (n bytes) receives the {id} segment. */
static int route_match(const char *tpl, const char *path, char *id, size_t n) {
    const char *brace = strstr(tpl, "{id}");
    if (!brace) return strcmp(tpl, path) == 0;
    size_t pre = (size_t)(brace - tpl);
    if (strncmp(tpl, path, pre) != 0) return 0;
    const char *seg = path + pre, *slash = strchr(seg, '/');
    size_t len = slash ? (size_t)(slash - seg) : strlen(seg);
    if (!len || len >= n || strcmp(seg + len, brace + 4) != 0) return 0;
    memcpy(id, seg, len);
    id[len] = 0;
    return 1;
}

/* Authorization: Bearer KEY (the scheme in any case, RFC 7235). The compare always runs over
 * API_KEY_MAX bytes of both, zero-padded, so its time says nothing of the key or its length. */
static int auth_ok(api_server *s, struct MHD_Connection *c) {
    char key[API_KEY_MAX] = {0}, got[API_KEY_MAX] = {0};
    pthread_mutex_lock(&s->mu);
    memcpy(key, s->api_key, sizeof key);
    pthread_mutex_unlock(&s->mu);
    if (!key[0]) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return 0;
    h += 7;
    while (*h == ' ') h++;
    size_t n = strlen(h);
    if (n >= sizeof got) return 0;
    memcpy(got, h, n);
    volatile unsigned char diff = 0;
    for (size_t i = 0; i < sizeof key; i++) diff |= (unsigned char)(got[i] ^ key[i]);
    return diff == 0;
}

#define BIG_BODY_BYTES (1 << 20)

static enum MHD_Result dispatch_one(api_server *s, struct MHD_Connection *c, api_req *x, const char *url);

/* Bodies over BIG_BODY_BYTES are parsed and validated one at a time. Token ids and logprobs are
 * packed (api/packed.h: ~2.5x an 8 MiB body at the peak instead of ~25x), but the rest of a body
 * is json-c's, whose trees cost up to hundreds of times their text (an object: ~800 bytes for
 * "{}"); one at a time bounds the peak by one body's cost whatever the concurrency. */
static pthread_mutex_t big_body_mu = PTHREAD_MUTEX_INITIALIZER;

static enum MHD_Result dispatch(api_server *s, struct MHD_Connection *c, api_req *x, const char *url) {
    if (x->len <= BIG_BODY_BYTES) return dispatch_one(s, c, x, url);
    pthread_mutex_lock(&big_body_mu);
    enum MHD_Result r = dispatch_one(s, c, x, url);
    pthread_mutex_unlock(&big_body_mu);
    return r;
}

/* The cluster routes: the leader's hook (api_set_cluster_hook) answers them. */
void api_set_cluster_hook(api_server *s, api_cluster_fn fn, void *ud) {
    atomic_store(&s->cluster_ud, ud);
    atomic_store(&s->cluster_fn, fn);
}

static long long query_int(struct MHD_Connection *c, const char *k) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, k);
    char *end;
    long long x = v && *v ? strtoll(v, &end, 10) : -1;
    return v && *v && !*end && x >= 0 ? x : -1;
}

static enum MHD_Result h_cluster(api_server *s, struct MHD_Connection *c, api_req *x, int route) {
    api_cluster_fn fn = atomic_load(&s->cluster_fn);
    if (!fn) return api_reply_fail(c, x, GE_UNSUPPORTED, "", "this grpod is not a leader (grpod serve --followers K)");
    char *reply = NULL;
    int st = fn(atomic_load(&s->cluster_ud), route, query_int(c, "follower"), query_int(c, "after"), x->body ? x->body : "",
                x->len, &reply);
    if (!reply) return api_reply_raw(c, x, st, "application/json", (char *)"", 0, 0);
    return api_reply_raw(c, x, st, "application/json", reply, strlen(reply), 1);
}

static enum MHD_Result dispatch_one(api_server *s, struct MHD_Connection *c, api_req *x, const char *url) {
    const api_route *rt = NULL;
    char id[128] = "";
    int path_known = 0;
    api_conns_set_busy(s->conns, c, 1);     /* the whole request is here: no deadline now */
    if (x->refused) {
        x->route = "other";
        return api_reply_error(c, x, &x->refusal);
    }
    for (int i = 0; i < R_COUNT; i++) {
        if (!route_match(api_routes[i].path, url, id, sizeof id)) continue;
        path_known = 1;
        /* HEAD is GET without the body (MHD leaves the body out) */
        const char *m = strcmp(x->method, "HEAD") ? x->method : "GET";
        if (strcmp(api_routes[i].method, m) == 0) { rt = &api_routes[i]; break; }
    }
    if (!rt) {
        x->route = "other";
        if (path_known) return api_reply_fail(c, x, GE_METHOD, "", "%s is not allowed on %s", x->method, url);
        return api_reply_fail(c, x, GE_NOT_FOUND, "", "no route %s %s", x->method, url);
    }
    x->route = rt->path;
    if (!strncmp(url, "/v1/", 4) && !auth_ok(s, c))
        return api_reply_fail(c, x, GE_UNAUTHORIZED, "Authorization", "missing or wrong API key: send Authorization: Bearer <key>");
    if (x->too_large)
        return api_reply_fail(c, x, GE_TOO_LARGE, "", "request body over the limit of %lld bytes (--max-body-bytes)", api_limits_now(s).max_body_bytes);
    json_object *req = NULL;
    if (rt->request_schema && !x->waiting) {
        api_error e;
        if (rt->id == R_CKPT_POST && x->len == 0) req = json_object_new_object();
        else {
            api_limits l = api_limits_now(s);
            if (api_parse_json_or_reply(x->body, x->len, &l, &req, &e)) return api_reply_error(c, x, &e);
        }
    }
    enum MHD_Result r;
    switch (rt->id) {
    case R_HEALTHZ:
        /* deploy.md: open connections get 503 once the drain began */
        r = atomic_load(&s->stopping) ? api_reply_fail(c, x, GE_UNAVAILABLE, "", "shutting down")
                                      : api_reply_json(c, x, 200, "{\"status\":\"ok\"}");
        break;
    case R_READYZ: r = h_readyz(s, c, x); break;
    case R_METRICS: r = h_metrics(s, c, x); break;
    case R_OPENAPI: r = api_reply_json(c, x, 200, api_openapi_json()); break;
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
    case R_OA_MODELS: r = h_oa_models(s, c, x); break;
    case R_OA_COMPLETIONS: r = h_oa_completions(s, c, x, req, 0); break;
    case R_OA_CHAT: r = h_oa_completions(s, c, x, req, 1); break;
    case R_DASHBOARD: r = h_dashboard_page(s, c, x); break;
    case R_DASHBOARD_DATA: r = h_dashboard_data(s, c, x); break;
    case R_JOB_REQUEUE: r = h_job_requeue(s, c, x, id); break;
    case R_CKPT_DELETE: r = h_checkpoint_delete(s, c, x, id); break;
    case R_CLUSTER_JOIN: r = h_cluster(s, c, x, API_CLUSTER_JOIN); break;
    case R_CLUSTER_NEXT: r = h_cluster(s, c, x, API_CLUSTER_NEXT); break;
    case R_CLUSTER_DONE: r = h_cluster(s, c, x, API_CLUSTER_DONE); break;
    case R_CLUSTER_BEAT: r = h_cluster(s, c, x, API_CLUSTER_BEAT); break;
    default: r = api_reply_fail(c, x, GE_INTERNAL, "", "unrouted"); break;
    }
    json_object_put(req);
    return r;
}

/* ---------------------------------------------------------------- MHD callbacks */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    api_server *s = cls;
    api_req *x = *con_cls;
    if (!x) {
        if (!(x = calloc(1, sizeof *x))) return MHD_NO;
        *con_cls = x;
        snprintf(x->method, sizeof x->method, "%s", method);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoll(cl, NULL, 10) > api_limits_now(s).max_body_bytes) x->too_large = 1;
        api_guard g = {s->allowed_hosts, s->allowed_origins};
        api_request_head h = {
            .method = method,
            .host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST),
            .origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin"),
            .content_type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE),
            .has_body = (cl && strtoll(cl, NULL, 10) > 0) ||
                        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING) != NULL,
        };
        x->refused = api_guard_or_reply(&g, &h, &x->refusal) != 0;
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (x->too_large || x->refused) return MHD_YES;       /* drain, reply 413/403/415 at the end */
        if ((long long)(x->len + n) > api_limits_now(s).max_body_bytes) {
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
    api_server *s = cls;
    api_conns_set_busy(s->conns, c, 0);     /* the next request's deadline runs from now */
    api_req *x = *con_cls;
    if (!x) return;
    if (x->ext_free) x->ext_free(x->ext);
    /* A large body leaves its JSON trees' many small blocks in this thread's malloc arena; give
     * the pages back, or each HTTP thread keeps its peak (an 8 MiB body held ~600 MB). */
    int big = x->cap > BIG_BODY_BYTES;
    free(x->body);
    free(x);
    *con_cls = NULL;
    if (big) malloc_trim(0);
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

/* Each connection is a descriptor: lift the soft limit (often 1024) toward the hard one. */
static void raise_fd_limit(rlim_t want) {
    struct rlimit r;
    if (getrlimit(RLIMIT_NOFILE, &r) || r.rlim_cur >= want) return;
    r.rlim_cur = r.rlim_max == RLIM_INFINITY || r.rlim_max > want ? want : r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
}

int api_start(const api_config *cfg, api_server **out) {
    *out = NULL;
    api_server *s = calloc(1, sizeof *s);
    if (!s) return err_set(GE_NOMEM, "api: out of memory");
    s->cfg = *cfg;
    snprintf(s->listen, sizeof s->listen, "%s", cfg->listen);
    snprintf(s->data_dir, sizeof s->data_dir, "%s", cfg->data_dir);
    snprintf(s->api_key, sizeof s->api_key, "%s", cfg->api_key ? cfg->api_key : "");
    snprintf(s->allowed_hosts, sizeof s->allowed_hosts, "%s", cfg->allowed_hosts ? cfg->allowed_hosts : "");
    snprintf(s->allowed_origins, sizeof s->allowed_origins, "%s", cfg->allowed_origins ? cfg->allowed_origins : "");
    s->cfg.api_key = s->cfg.allowed_hosts = s->cfg.allowed_origins = NULL;   /* copied: the caller's may go */
    s->limits = cfg->limits;
    if (s->cfg.max_wait_s <= 0) s->cfg.max_wait_s = 60;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->wmu, NULL);
    struct sockaddr_storage ss;
    int sl, loop;
    int rc = api_parse_listen(cfg->listen, &ss, &sl, &loop);
    if (rc) goto fail;
    int max_conn = cfg->max_connections > 0 ? cfg->max_connections : 2048;
    api_conn_limits cl = {.max_waiting = max_conn / 2, .max_per_client = cfg->max_per_client > 0 ? cfg->max_per_client : 256,
                          .request_timeout_s = cfg->request_timeout_s > 0 ? cfg->request_timeout_s : 30};
    if ((rc = api_conns_create(&cl, &s->conns))) goto fail;
    raise_fd_limit((rlim_t)max_conn + 256);
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_AUTO | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    s->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s,
                              MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                              MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(cfg->threads > 0 ? cfg->threads : 4),
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                              MHD_OPTION_NOTIFY_CONNECTION, api_conns_notify, s->conns,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_conn,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
                              MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s,
                              MHD_OPTION_END);
    if (!s->mhd) { rc = err_set(GE_IO, "cannot listen on %s (address in use or not permitted?)", cfg->listen); goto fail; }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : 0;
    *out = s;
    return 0;
fail:
    api_conns_free(s->conns);
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
    s->mb_tokens = in.plan.micro_batch_tokens;
    s->mb_tokens_max = in.plan.micro_batch_tokens_max;
    metrics_policy_version(in.policy_version);
    atomic_store(&s->engine, e);
}

void api_set_loading(api_server *s, const char *why) {
    pthread_mutex_lock(&s->mu);
    snprintf(s->load_msg, sizeof s->load_msg, "%s", why ? why : "");
    pthread_mutex_unlock(&s->mu);
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

void api_set_api_key(api_server *s, const char *key) {
    pthread_mutex_lock(&s->mu);
    snprintf(s->api_key, sizeof s->api_key, "%s", key ? key : "");
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

void api_quiesce_work(api_server *s) {
    if (!s) return;
    atomic_store(&s->stopping, 1);
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
    api_conns_free(s->conns);
    for (int i = 0; i < s->n_pool; i++) store_close(s->pool[i]);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->wmu);
    free(s);
}
