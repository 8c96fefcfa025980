/* http_internal.h — what http.c (server, replies, router) and handlers.c (the endpoint
 * handlers) share inside api/: the server and per-connection state, the reply helpers, the
 * store-handle pool and long-poll waiters, and the handlers the router calls.
 * Not a public header: callers outside api/ use http.h. */
#ifndef GRPOD_API_HTTP_INTERNAL_H
#define GRPOD_API_HTTP_INTERNAL_H
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "api/http.h"
#include "api/sbuf.h"
#include "store/store.h"

#define POOL_MAX 64

typedef struct waiter { struct MHD_Connection *conn; double deadline; struct waiter *next; } waiter;

#include "api/conns.h"

#define API_KEY_MAX 512

struct api_server {
    api_config cfg;
    char listen[256], data_dir[1024];
    char api_key[API_KEY_MAX];      /* under mu: SIGHUP replaces it (api_set_api_key) */
    char allowed_hosts[1024], allowed_origins[1024];
    struct MHD_Daemon *mhd;
    api_conns *conns;               /* admission and request deadlines (conns.h) */
    int port;
    pthread_mutex_t mu;             /* limits, pool, fail_msg */
    api_limits limits;
    eng *_Atomic engine;
    int vocab, max_pos;             /* written once before engine is published */
    long long kv_rows;              /* rollout KV pool rows (0 = unknown); set before the engine */
    long long mb_tokens, mb_tokens_max;   /* the memory plan's micro-batch default and limit (0: none) */
    _Atomic int failed, stopping;
    char fail_msg[256];
    char load_msg[256];             /* why /readyz is 503 before api_set_engine ("" = loading) */
    store *pool[POOL_MAX];
    int n_pool;
    api_cluster_fn _Atomic cluster_fn;  /* api_set_cluster_hook */
    void *_Atomic cluster_ud;
    pthread_mutex_t wmu;            /* waiters */
    waiter *waiters;
};

typedef struct {
    char *body;
    size_t len, cap;
    int too_large;
    int refused;                    /* the guard refused the request head: reply `refusal` */
    api_error refusal;
    int waiting;                    /* suspended at least once: a long-poll in progress */
    double deadline;
    char job_id[32];                /* POST /v1/logprobs: the job this request waits for */
    const char *route;              /* template for metrics */
    char method[8];
    void *ext;                      /* a handler's state across suspends (openai.c); freed by ext_free */
    void (*ext_free)(void *ext);
} api_req;


/* ---------------------------------------------------------------- replies */

/* Each queues one response and counts it in the HTTP metrics under x->route. take: body is
 * malloc'd and the response frees it. api_reply_sb takes b->p; api_reply_obj puts o. */
enum MHD_Result api_reply_raw(struct MHD_Connection *c, api_req *x, int status, const char *ctype,
                              char *body, size_t len, int take);
enum MHD_Result api_reply_json(struct MHD_Connection *c, api_req *x, int status, const char *text);
enum MHD_Result api_reply_sb(struct MHD_Connection *c, api_req *x, int status, api_sbuf *b);
enum MHD_Result api_reply_obj(struct MHD_Connection *c, api_req *x, int status, json_object *o);
enum MHD_Result api_reply_error(struct MHD_Connection *c, api_req *x, const api_error *e);
enum MHD_Result api_reply_fail(struct MHD_Connection *c, api_req *x, int code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* ---------------------------------------------------------------- store handles, waiters, engine */

/* A store handle for this request (NULL when none can be opened); give it back with api_pool_put. */
store *api_pool_get(api_server *s);
void api_pool_put(api_server *s, store *st);
/* 1: the connection is suspended until the job changes or x->deadline (reply nothing now);
 * 0: the job is already finished (or suspending failed): reply now. */
int api_wait_suspend(api_server *s, struct MHD_Connection *c, api_req *x, store *st, const char *id);
api_limits api_limits_now(api_server *s);
/* The engine when ready (m filled with its hooks when not NULL), else replies 503 into *r and returns NULL. */
eng *api_engine_or_reply(api_server *s, struct MHD_Connection *c, api_req *x, api_model *m, enum MHD_Result *r);
long long api_policy_version_now(api_server *s);     /* -1 before the engine is set */
/* Stores payload as a job of kind and wakes the engine thread. id_out NULL: replies 202
 * {"job_id","status"}; else copies the id there and replies nothing (only errors are replied,
 * leaving id_out[0] == 0). */
enum MHD_Result api_submit_and_reply(api_server *s, struct MHD_Connection *c, api_req *x, const char *kind,
                                     json_object *payload, char *id_out);
/* A stored job error {"code",...} → the HTTP status of that code (500 when unknown). */
int api_status_of_error_json(const char *err);

/* ---------------------------------------------------------------- handlers (handlers.c) */

enum MHD_Result h_rollouts(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req);
enum MHD_Result h_updates(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req);
enum MHD_Result h_checkpoint_post(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req);
enum MHD_Result h_checkpoints_get(api_server *s, struct MHD_Connection *c, api_req *x);
enum MHD_Result h_jobs_list(api_server *s, struct MHD_Connection *c, api_req *x);
enum MHD_Result h_job_get(api_server *s, struct MHD_Connection *c, api_req *x, const char *id);
enum MHD_Result h_job_delete(api_server *s, struct MHD_Connection *c, api_req *x, const char *id);
enum MHD_Result h_job_requeue(api_server *s, struct MHD_Connection *c, api_req *x, const char *id);
enum MHD_Result h_checkpoint_delete(api_server *s, struct MHD_Connection *c, api_req *x, const char *id);
enum MHD_Result h_logprobs(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req);
enum MHD_Result h_tokenize(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req);
enum MHD_Result h_detokenize(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req);
enum MHD_Result h_model(api_server *s, struct MHD_Connection *c, api_req *x);
enum MHD_Result h_readyz(api_server *s, struct MHD_Connection *c, api_req *x);
enum MHD_Result h_metrics(api_server *s, struct MHD_Connection *c, api_req *x);

/* ---------------------------------------------------------------- OpenAI-compatible (openai.c) */

enum MHD_Result h_oa_models(api_server *s, struct MHD_Connection *c, api_req *x);
enum MHD_Result h_oa_completions(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, int chat);

/* ---------------------------------------------------------------- dashboard (dashboard.c) */

enum MHD_Result h_dashboard_page(api_server *s, struct MHD_Connection *c, api_req *x);
enum MHD_Result h_dashboard_data(api_server *s, struct MHD_Connection *c, api_req *x);
#endif
