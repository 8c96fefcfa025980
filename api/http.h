/* http.h — grpod's HTTP server: libmicrohttpd glue, routing, auth, the handlers of every
 * endpoint, and long-polling (GET /v1/jobs/{id}?wait=S, POST /v1/logprobs) by suspending the
 * connection until the engine thread reports a job change or the deadline passes.
 *
 * Lifecycle: api_start (listening; /healthz answers, /readyz says 503) → api_set_engine once the
 * engine thread has opened the model → api_quiesce (stop accepting; SIGTERM) → api_stop.
 * Threads: MHD's pool runs the handlers; each borrows a store handle from a small pool (one
 * SQLite connection per handle). api_jobs_changed / api_tick / api_set_* may be called from any
 * thread. Not here: request validation (validate.c), the engine loop (daemon/worker.c). */
#ifndef GRPOD_API_HTTP_H
#define GRPOD_API_HTTP_H
#include "api/validate.h"
#include "engine/engine.h"

typedef struct api_server api_server;

typedef struct {
    const char *listen; /* "127.0.0.1:8780", "[::1]:8780", "0.0.0.0:8780" */
    const char *data_dir; /* where grpod.db lives (store_open) */
    const char *api_key; /* NULL: no auth; else every /v1 request needs Bearer <key> */
    const char *allowed_hosts; /* Host names besides IP literals and localhost (guard.h) */
    const char *allowed_origins; /* Origins allowed to call (guard.h); NULL: none */
    api_limits limits;
    int threads; /* MHD thread pool size */
    int max_connections; /* open connections in all (MHD's limit); 0 = 2048 */
    int max_per_client; /* from one client address (conns.h); 0 = 256 */
    double request_timeout_s; /* head + body of a request, not reset per byte; 0 = 30 */
    int max_wait_s; /* cap of ?wait= (60) */
    void (*job_submitted)(void *ud); /* wakes the engine thread */
    void *ud;
} api_config;

/* Parses "host:port" into a socket address; GE_INVALID naming the problem. is_loopback set. */
int api_parse_listen(const char *listen, void *sockaddr_storage_out, int *len_out, int *is_loopback);

int api_start(const api_config *c, api_server **out);
int api_port(api_server *s); /* the bound port (listen ":0" picks one) */
void api_set_engine(api_server *s, eng *e); /* model loaded: /readyz 200, /v1 open */
/* The rollout KV pool's rows and (hybrid models; else 0) its recurrent-state rows: a group
 * needing more (P + n x max_tokens; n + 1) gets 413 at submit. Call before api_set_engine
 * (which publishes them). */
void api_set_kv_rows(api_server *s, long long rows, long long state_rows);
/* Before api_set_engine: what /readyz's 503 says instead of "model is loading" (replay progress). */
void api_set_loading(api_server *s, const char *why);
void api_set_failed(api_server *s, const char *why); /* engine failed: /readyz 503 */
void api_set_limits(api_server *s, const api_limits *l); /* SIGHUP reload */
void api_set_api_key(api_server *s, const char *key); /* SIGHUP reload; NULL or "": no auth */
void api_set_submit_hook(api_server *s, void (*job_submitted)(void *ud), void *ud);
/* The leader of a deployment over several processes (daemon/cluster.c, --followers): the
 * cluster routes (/v1/cluster/join, next, done, beat) (authenticated like every /v1 route) call fn with the route (API_CLUSTER_*),
 * the ?follower= and ?after= query values (-1 when absent) and the request body; fn returns the
 * HTTP status and sets *reply to malloc'd JSON text (NULL: an empty body). fn runs on an HTTP
 * thread and may block up to about a second (GET /v1/cluster/next long-polls). Without a hook
 * the routes answer 422 (unsupported: not a leader). Call before followers can reach the server (right after api_start). */
enum { API_CLUSTER_JOIN, API_CLUSTER_NEXT, API_CLUSTER_DONE, API_CLUSTER_BEAT };
typedef int (*api_cluster_fn)(void *ud, int route, long long follower, long long after, const char *body, size_t len, char **reply);
void api_set_cluster_hook(api_server *s, api_cluster_fn fn, void *ud);
void api_jobs_changed(api_server *s); /* a job changed state: wake long-pollers */
void api_tick(api_server *s); /* resume long-pollers whose wait ran out */
/* A response's tokens: n ids and their logprobs, and with k > 0 each one's k most likely
 * tokens (top_ids, top_lps: (n, k); sampling.top_logprobs). */
typedef struct {
    const int *tok;
    const float *lp;
    const int *top_ids;
    const float *top_lps;
    int n, k;
} api_tokens;
/* Token taps (tap.c), from the worker: 1 when a streaming reply waits on job_id's tokens;
 * api_tap_put gives response resp of group its first x->n tokens (those past what the tap holds
 * are copied); api_tap_wake resumes the reply when something new was put. */
int api_tap_wanted(api_server *s, const char *job_id);
void api_tap_put(api_server *s, const char *job_id, int group, int resp, const api_tokens *x);
void api_tap_wake(api_server *s, const char *job_id);
void api_quiesce(api_server *s); /* stop accepting; new /v1 posts get 503 */
/* As api_quiesce but the server keeps accepting connections (a leader's followers must reach the
 * cluster routes while the engine thread drains: its exit checkpoint runs on their ranks too). */
void api_quiesce_work(api_server *s);
void api_stop(api_server *s); /* resumes waiters, stops MHD, frees */
#endif
