/* internal.h — what api/'s handlers see: the server and per-request state, the replies, the
 * store-handle pool, the long-poll wait and the engine as validation reaches it. The handlers
 * themselves are declared by their rows in routes.h (included below), so a handler whose type
 * differs from api_handler does not compile.
 *
 * Files: server.c (start, stop, the server's state, MHD's callbacks), router.c (a request to its
 * row), reply.c (replies and error bodies), wait.c (store handles, long-polls); the handlers in
 * handlers.c (jobs, checkpoints, logprobs, model, health, metrics), openai*.c (the OpenAI and
 * vLLM routes, the tokenizer's among them; openai.h), dashboard.c, cluster.c and openapi.c. Not a public header: callers outside api/ use http.h. */
#ifndef GRPOD_API_INTERNAL_H
#define GRPOD_API_INTERNAL_H
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "api/conns.h"
#include "api/http.h"
#include "api/routes.h"
#include "api/sbuf.h"
#include "store/store.h"

#define API_POOL_MAX 64
#define API_KEY_MAX 512
/* A request body above this is parsed one at a time (router.c) and its thread's malloc arena is
 * trimmed when it is done (server.c). */
#define API_BIG_BODY_BYTES (1 << 20)

struct api_waiter;

struct api_server {
    api_config cfg;
    char listen[256], data_dir[1024];
    char api_key[API_KEY_MAX]; /* under mu: SIGHUP replaces it (api_set_api_key) */
    char allowed_hosts[1024], allowed_origins[1024];
    struct MHD_Daemon *mhd;
    /* The listening socket MHD_quiesce_daemon gave back (MHD_INVALID_SOCKET before): shut at
     * once, so new connections are refused, but closed only after MHD_stop_daemon, since MHD's
     * own threads may still use it until then (its documented contract). */
    MHD_socket quiesced_fd;
    api_conns *conns; /* admission and request deadlines (conns.h) */
    int port;
    pthread_mutex_t mu; /* limits, pool, fail_msg */
    api_limits limits;
    eng *_Atomic engine;
    int vocab, max_pos; /* written once before engine is published */
    long long kv_rows; /* rollout KV pool rows (0 = unknown); set before the engine */
    long long state_rows; /* its recurrent-state rows (hybrid models; 0 = none or unknown) */
    long long mb_tokens, mb_tokens_max; /* the memory plan's micro-batch default and limit (0: none) */
    int moe_layers; /* the model's MoE layers (api_model) */
    _Atomic int failed, stopping;
    char fail_msg[256];
    char load_msg[256]; /* why /readyz is 503 before api_set_engine ("" = loading) */
    store *pool[API_POOL_MAX];
    int n_pool;
    api_cluster_fn _Atomic cluster_fn; /* api_set_cluster_hook */
    void *_Atomic cluster_ud;
    pthread_mutex_t wmu; /* waiters */
    struct api_waiter *waiters;
    pthread_mutex_t tmu; /* taps (tap.c) */
    struct api_tap *taps;
};

/* One request on a connection, from its head to its completion (server.c frees it). */
struct api_req {
    char *body;
    size_t len, cap;
    int too_large;
    int refused; /* the guard refused the request head: reply `refusal` */
    api_error refusal;
    int waiting; /* suspended at least once: a long-poll in progress */
    double deadline;
    char job_id[32]; /* POST /v1/logprobs: the job this request waits for */
    const char *route; /* template for metrics */
    char method[8];
    void *ext; /* a handler's state across suspends (openai.c); freed by ext_free */
    void (*ext_free)(void *ext);
};

/* ---------------------------------------------------------------- replies (reply.c) */

/* Each queues one response and counts it in the HTTP metrics under x->route. take: body is
 * malloc'd and the response frees it. api_reply_sb takes b->p (507 when b->oom); api_reply_obj
 * puts o. A 429 or 503 says Retry-After, a 401 WWW-Authenticate. */
enum MHD_Result api_reply_raw(struct MHD_Connection *c, api_req *x, int status, const char *ctype, char *body, size_t len,
                              int take);
enum MHD_Result api_reply_json(struct MHD_Connection *c, api_req *x, int status, const char *text);
enum MHD_Result api_reply_sb(struct MHD_Connection *c, api_req *x, int status, api_sbuf *b);
enum MHD_Result api_reply_obj(struct MHD_Connection *c, api_req *x, int status, json_object *o);
/* {"error": {"code", "message", "field"?, "type", "param"}} with e's status: grpod's code and
 * field, and OpenAI's type (by status) and param (the field, or null). */
enum MHD_Result api_reply_error(struct MHD_Connection *c, api_req *x, const api_error *e);
enum MHD_Result api_reply_fail(struct MHD_Connection *c, api_req *x, int code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* A failed or cancelled job: {"error": its stored error} with the status of the error's code
 * (409 when cancelled without one). */
enum MHD_Result api_reply_job_error(struct MHD_Connection *c, api_req *x, const store_job *j);

/* ---------------------------------------------------------------- store handles, long-polls (wait.c) */

/* A store handle for this request (NULL when none can be opened); give it back with api_pool_put. */
store *api_pool_get(api_server *s);
void api_pool_put(api_server *s, store *st);
/* 1: the connection is suspended until the job changes or x->deadline (reply nothing now);
 * 0: the job is already finished (or suspending failed): reply now. */
int api_wait_suspend(api_server *s, struct MHD_Connection *c, api_req *x, store *st, const char *id);
/* Resumes the suspended connections: all of them, or those whose deadline passed. */
void api_resume_waiters(api_server *s, int all);

/* ---------------------------------------------------------------- token taps (tap.c) */

typedef struct api_tap api_tap;
/* New tokens of choice c (group * n + response) arrived: x holds only them; called under the
 * tap's lock. */
typedef void (*api_tap_cb)(void *ud, int c, const api_tokens *x);
enum { API_TAP_TOKENS = 1, API_TAP_CHANGED = 2 };
/* Taps job_id's n_groups x n responses for connection c (NULL when out of memory). */
api_tap *api_tap_open(api_server *s, const char *job_id, int n_groups, int n, struct MHD_Connection *c);
void api_tap_close(api_server *s, api_tap *t);
/* From c's content reader only. 0: nothing new, c is suspended until the worker wakes it
 * (return 0 to MHD). Else cb got the new tokens, and API_TAP_CHANGED says that some job
 * changed state (or tokens were lost): read the job from the store. */
int api_tap_poll(api_server *s, api_tap *t, api_tap_cb cb, void *ud);
void api_taps_changed(api_server *s); /* every tap: look at the store; resumed */

/* ---------------------------------------------------------------- the server's state (server.c) */

api_limits api_limits_now(api_server *s); /* SIGHUP may replace them while requests run */
/* The engine when ready (m filled with its hooks when not NULL), else replies 503 into *r and returns NULL. */
eng *api_engine_or_reply(api_server *s, struct MHD_Connection *c, api_req *x, api_model *m, enum MHD_Result *r);
long long api_policy_version_now(api_server *s); /* -1 before the engine is set */
void api_wake_engine(api_server *s); /* a job was queued: the submit hook */

/* ---------------------------------------------------------------- jobs (handlers.c) */

/* Stores payload as a job of kind and wakes the engine thread. id_out NULL: replies 202
 * {"job_id","status"}; else copies the id there and replies nothing (only errors are replied,
 * leaving id_out[0] == 0). */
enum MHD_Result api_submit_and_reply(api_server *s, struct MHD_Connection *c, api_req *x, const char *kind, json_object *payload,
                                     char *id_out);
#endif
