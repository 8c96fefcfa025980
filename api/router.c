/* router.c — a request whose head and body have arrived is matched against the route table
 * (openapi.h) in order, checked for its key and body size, its JSON body parsed when the route
 * takes one, and handed to its handler. No route for the path is 404, none for the method 405;
 * HEAD is served as GET (MHD leaves the body out). */
#include "api/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api/openapi.h"
#include "common/err.h"

/* Does path match the template tpl? id (n bytes) receives tpl's "{id}" segment. */
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

static enum MHD_Result dispatch_one(api_server *s, struct MHD_Connection *c, api_req *x, const char *url);

/* Bodies over API_BIG_BODY_BYTES are parsed and validated one at a time. Token ids and logprobs
 * are packed (api/packed.h: ~2.5x an 8 MiB body at the peak instead of ~25x), but the rest of a
 * body is json-c's, whose trees cost up to hundreds of times their text (an object: ~800 bytes
 * for "{}"); one at a time bounds the peak by one body's cost whatever the concurrency. */
static pthread_mutex_t big_body_mu = PTHREAD_MUTEX_INITIALIZER;

enum MHD_Result api_route_request(api_server *s, struct MHD_Connection *c, api_req *x, const char *url) {
    if (x->len <= API_BIG_BODY_BYTES) return dispatch_one(s, c, x, url);
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
