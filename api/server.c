/* server.c — the HTTP server's lifecycle and state: api_start (MHD listening, its thread pool and
 * connection limits) → api_set_engine → api_quiesce → api_stop, the setters SIGHUP and the engine
 * thread call, the readers handlers use (limits, engine, policy version), and MHD's callbacks
 * for a request: its head is checked by the guard (guard.h), its body gathered up to
 * --max-body-bytes, then it goes to the router (router.c); its state is freed on completion.
 * See http.h for the contract. */
#include "api/internal.h"

#include <arpa/inet.h>
#include <malloc.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "api/guard.h"
#include "api/metrics.h"
#include "common/err.h"
#include "common/log.h"

/* ---------------------------------------------------------------- the state handlers read */

static int hook_tokenize(void *ud, const char *text, size_t len, int add_special, int **ids, int *n) {
    return eng_tokenize((eng *)ud, text, len, add_special, ids, n);
}
static int hook_chat(void *ud, const char *const *roles, const char *const *contents, int n, int agp, char **text) {
    eng_message *m = calloc((size_t)n + 1, sizeof *m);
    if (!m) return err_set(GE_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        m[i].role = roles[i];
        m[i].content = contents[i];
    }
    int rc = eng_render_chat((eng *)ud, m, n, agp, NULL, text);
    free(m);
    return rc;
}

api_limits api_limits_now(api_server *s) {
    pthread_mutex_lock(&s->mu);
    api_limits l = s->limits;
    pthread_mutex_unlock(&s->mu);
    return l;
}

eng *api_engine_or_reply(api_server *s, struct MHD_Connection *c, api_req *x, api_model *m, enum MHD_Result *r) {
    eng *e = atomic_load(&s->engine);
    if (atomic_load(&s->failed)) {
        *r = api_reply_fail(c, x, GE_UNAVAILABLE, "", "engine failed: %s", s->fail_msg);
        return NULL;
    }
    if (!e) {
        *r = api_reply_fail(c, x, GE_UNAVAILABLE, "", "model is still loading; retry when GET /readyz says 200");
        return NULL;
    }
    if (m) {
        m->vocab = s->vocab;
        m->max_pos = s->max_pos;
        m->kv_rows = s->kv_rows;
        m->state_rows = s->state_rows;
        m->mb_tokens = s->mb_tokens;
        m->mb_tokens_max = s->mb_tokens_max;
        m->moe_layers = s->moe_layers;
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

void api_wake_engine(api_server *s) {
    pthread_mutex_lock(&s->mu);
    void (*hook)(void *) = s->cfg.job_submitted;
    void *hook_ud = s->cfg.ud;
    pthread_mutex_unlock(&s->mu);
    if (hook) hook(hook_ud);
}

/* ---------------------------------------------------------------- MHD callbacks */

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls) {
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
        if (x->too_large || x->refused) return MHD_YES; /* drain, reply 413/403/415 at the end */
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
            if (!nb) {
                x->too_large = 1;
                return MHD_YES;
            }
            x->body = nb;
            x->cap = nc;
        }
        memcpy(x->body + x->len, upload, n);
        x->len += n;
        x->body[x->len] = 0;
        return MHD_YES;
    }
    return api_route_request(s, c, x, url);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t) {
    api_server *s = cls;
    api_conns_set_busy(s->conns, c, 0); /* the next request's deadline runs from now */
    api_req *x = *con_cls;
    if (!x) return;
    if (x->ext_free) x->ext_free(x->ext);
    /* A large body leaves its JSON trees' many small blocks in this thread's malloc arena; give
     * the pages back, or each HTTP thread keeps its peak (an 8 MiB body held ~600 MB). */
    int big = x->cap > API_BIG_BODY_BYTES;
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

/* libmicrohttpd's unrecoverable errors: logged with where MHD found them, then abort() as its
 * default handler does (an abort at shutdown then says why). */
static void on_mhd_panic(void *cls, const char *file, unsigned int line, const char *reason) {
    (void)cls;
    char esc[600];
    log_event(LOG_ERROR, "mhd_panic", "\"file\":\"%s\",\"line\":%u,\"reason\":%s", file ? file : "", line,
              log_str(esc, sizeof esc, reason ? reason : ""));
    abort();
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
    if (res->ai_family == AF_INET) *is_loopback = (ntohl(((struct sockaddr_in *)res->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    else if (res->ai_family == AF_INET6) *is_loopback = IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6 *)res->ai_addr)->sin6_addr);
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
    s->quiesced_fd = MHD_INVALID_SOCKET;
    snprintf(s->listen, sizeof s->listen, "%s", cfg->listen);
    snprintf(s->data_dir, sizeof s->data_dir, "%s", cfg->data_dir);
    snprintf(s->api_key, sizeof s->api_key, "%s", cfg->api_key ? cfg->api_key : "");
    snprintf(s->allowed_hosts, sizeof s->allowed_hosts, "%s", cfg->allowed_hosts ? cfg->allowed_hosts : "");
    snprintf(s->allowed_origins, sizeof s->allowed_origins, "%s", cfg->allowed_origins ? cfg->allowed_origins : "");
    s->cfg.api_key = s->cfg.allowed_hosts = s->cfg.allowed_origins = NULL; /* copied: the caller's may go */
    s->limits = cfg->limits;
    if (s->cfg.max_wait_s <= 0) s->cfg.max_wait_s = 60;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->wmu, NULL);
    pthread_mutex_init(&s->tmu, NULL);
    struct sockaddr_storage ss;
    int sl, loop;
    int rc = api_parse_listen(cfg->listen, &ss, &sl, &loop);
    if (rc) goto fail;
    int max_conn = cfg->max_connections > 0 ? cfg->max_connections : 2048;
    api_conn_limits cl = {.max_waiting = max_conn / 2,
                          .max_per_client = cfg->max_per_client > 0 ? cfg->max_per_client : 256,
                          .request_timeout_s = cfg->request_timeout_s > 0 ? cfg->request_timeout_s : 30};
    if ((rc = api_conns_create(&cl, &s->conns))) goto fail;
    raise_fd_limit((rlim_t)max_conn + 256);
    /* poll(), not epoll: libmicrohttpd 0.9.75's MHD_quiesce_daemon removes the listening socket
     * from each pool thread's epoll set while that thread may remove it too, and panics on the
     * loser's ENOENT (an abort at SIGTERM, seen once in make test); with poll it only wakes them */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6) flags |= MHD_USE_IPv6;
    MHD_set_panic_func(on_mhd_panic, NULL);
    s->mhd = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                              MHD_OPTION_THREAD_POOL_SIZE, (unsigned)(cfg->threads > 0 ? cfg->threads : 4),
                              MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_NOTIFY_CONNECTION, api_conns_notify,
                              s->conns, MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_conn, MHD_OPTION_CONNECTION_TIMEOUT,
                              (unsigned)300, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, s, MHD_OPTION_END);
    if (!s->mhd) {
        rc = err_set(GE_IO, "cannot listen on %s (address in use or not permitted?)", cfg->listen);
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : 0;
    *out = s;
    return 0;
fail:
    api_conns_free(s->conns);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->wmu);
    pthread_mutex_destroy(&s->tmu);
    free(s);
    return rc;
}

int api_port(api_server *s) { return s->port; }

void api_set_kv_rows(api_server *s, long long rows, long long state_rows) {
    s->kv_rows = rows;
    s->state_rows = state_rows;
}

void api_set_engine(api_server *s, eng *e) {
    eng_info in;
    eng_get_info(e, &in);
    s->vocab = in.vocab;
    s->max_pos = in.max_pos;
    s->mb_tokens = in.plan.micro_batch_tokens;
    s->mb_tokens_max = in.plan.micro_batch_tokens_max;
    s->moe_layers = in.moe_layers;
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
    s->quiesced_fd = MHD_quiesce_daemon(s->mhd);
    if (s->quiesced_fd != MHD_INVALID_SOCKET) shutdown(s->quiesced_fd, SHUT_RDWR);
    api_resume_waiters(s, 1);
}

void api_quiesce_work(api_server *s) {
    if (!s) return;
    atomic_store(&s->stopping, 1);
    api_resume_waiters(s, 1);
}

void api_stop(api_server *s) {
    if (!s) return;
    atomic_store(&s->stopping, 1);
    api_resume_waiters(s, 1);
    /* let resumed long-pollers get their reply before the threads go */
    for (int i = 0; i < 20; i++) {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->mhd, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
        if (!di || di->num_connections == 0) break;
        usleep(50 * 1000);
    }
    MHD_stop_daemon(s->mhd);
    if (s->quiesced_fd != MHD_INVALID_SOCKET) close(s->quiesced_fd);
    api_conns_free(s->conns);
    for (int i = 0; i < s->n_pool; i++) store_close(s->pool[i]);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->wmu);
    pthread_mutex_destroy(&s->tmu);
    free(s);
}
