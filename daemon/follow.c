/* follow.c — a follower's life: join, open, run the leader's calls, beat; see follow.h. The HTTP
 * client is the smallest that the leader's server needs: one request per connection
 * (Connection: close), the body read to the end. */
#include "daemon/follow.h"

#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "daemon/jobs.h"
#include "daemon/json_read.h"
#include "daemon/ranks.h"
#include "daemon/test_hooks.h"
#include "daemon/sdnotify.h"
#include "daemon/worker.h"
#include "engine/engine.h"

/* Set by SIGTERM/SIGINT on the main thread, read there and by the poller thread: an atomic (lock
 * free, so the handler may store it), where a volatile sig_atomic_t is only for the thread that
 * the signal interrupts. */
static atomic_int g_stop;
static void on_signal(int sig) {
    (void)sig;
    atomic_store(&g_stop, 1);
}

/* ---------------------------------------------------------------- HTTP client */

typedef struct {
    char host[256], port[16], hostport[300];
    const char *key;
} leader;

static int parse_url(const char *url, leader *L) {
    const char *p = url;
    if (strncmp(p, "http://", 7)) return err_set(GE_INVALID, "--join %s: expected http://HOST:PORT", url);
    p += 7;
    const char *h = p, *he;
    if (*p == '[') {
        h = p + 1;
        if (!(he = strchr(h, ']'))) return err_set(GE_INVALID, "--join %s: unclosed [", url);
        p = he + 1;
    } else {
        he = p + strcspn(p, ":/");
        p = he;
    }
    if ((size_t)(he - h) >= sizeof L->host || he == h) return err_set(GE_INVALID, "--join %s: no host", url);
    memcpy(L->host, h, (size_t)(he - h));
    L->host[he - h] = 0;
    snprintf(L->port, sizeof L->port, "80");
    if (*p == ':') {
        size_t n = strcspn(p + 1, "/");
        if (!n || n >= sizeof L->port) return err_set(GE_INVALID, "--join %s: bad port", url);
        memcpy(L->port, p + 1, n);
        L->port[n] = 0;
        p += 1 + n;
    }
    if (*p && strcmp(p, "/")) return err_set(GE_INVALID, "--join %s: expected http://HOST:PORT without a path", url);
    snprintf(L->hostport, sizeof L->hostport, strchr(L->host, ':') ? "[%s]:%s" : "%s:%s", L->host, L->port);
    return 0;
}

/* One request; the HTTP status, or -1 when the leader could not be reached (*body NULL). */
static int http(const leader *L, const char *method, const char *path, const char *body, double timeout_s, char **resp) {
    *resp = NULL;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (getaddrinfo(L->host, L->port, &hints, &ai) || !ai) return -1;
    int fd = -1;
    struct timeval tv = {.tv_sec = (time_t)timeout_s, .tv_usec = (suseconds_t)((timeout_s - (double)(time_t)timeout_s) * 1e6)};
    for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv); /* connect's limit too (Linux) */
        if (connect(fd, a->ai_addr, a->ai_addrlen)) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0) return -1;
    size_t blen = body ? strlen(body) : 0;
    char head[1200];
    int hl = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: %s\r\n%s%s%sContent-Type: application/json\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n",
                      method, path, L->hostport, L->key ? "Authorization: Bearer " : "", L->key ? L->key : "",
                      L->key ? "\r\n" : "", blen);
    int ok = hl > 0 && hl < (int)sizeof head;
    for (size_t off = 0; ok && off < (size_t)hl;) {
        ssize_t k = send(fd, head + off, (size_t)hl - off, MSG_NOSIGNAL);
        if (k <= 0) ok = 0;
        else off += (size_t)k;
    }
    for (size_t off = 0; ok && off < blen;) {
        ssize_t k = send(fd, body + off, blen - off, MSG_NOSIGNAL);
        if (k <= 0) ok = 0;
        else off += (size_t)k;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    while (ok) {
        if (len + 65536 + 1 > cap) {
            size_t nc = cap ? cap * 2 : 131072;
            char *nb = realloc(buf, nc);
            if (!nb) {
                ok = 0;
                break;
            }
            buf = nb;
            cap = nc;
        }
        ssize_t k = recv(fd, buf + len, cap - len - 1, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) ok = 0;
        if (k <= 0) break;
        len += (size_t)k;
    }
    close(fd);
    int status = -1;
    if (ok && buf) {
        buf[len] = 0;
        char *sep = strstr(buf, "\r\n\r\n");
        if (sep && sscanf(buf, "HTTP/%*s %d", &status) == 1) {
            size_t bl = len - (size_t)(sep + 4 - buf);
            memmove(buf, sep + 4, bl);
            buf[bl] = 0;
            *resp = buf;
            buf = NULL;
        }
    }
    free(buf);
    return status;
}

/* ---------------------------------------------------------------- the world */

typedef struct {
    long long id;
    int rank0, world;
    char kind[8], host[256];
    int port;
    unsigned char nccl_id[128];
    char resume[1200];
    double lost_s;
    int expert_parallel; /* the leader's --expert-parallel: this process's engines follow it */
} world_info;

static int unbase64(const char *s, unsigned char *out, size_t n) {
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    unsigned v = 0;
    int bits = 0;
    for (; *s && *s != '='; s++) {
        const char *p = strchr(t, *s);
        if (!p) return -1;
        v = v << 6 | (unsigned)(p - t);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o < n) out[o] = (unsigned char)(v >> bits & 255);
            o++;
        }
    }
    return o == n ? 0 : -1;
}

static int parse_world(const char *body, world_info *w) {
    json_object *o = json_tokener_parse(body), *c = field_get(o, "comm");
    memset(w, 0, sizeof *w);
    int rc = 0;
    if (!o || !c) {
        rc = err_set(GE_FORMAT, "join: the leader's answer has no comm");
        goto done;
    }
    w->id = field_int(o, "follower", 0);
    w->rank0 = (int)field_int(o, "rank0", 0);
    w->world = (int)field_int(o, "world", 0);
    w->lost_s = field_num(o, "lost_s", 10);
    w->expert_parallel = field_bool(o, "expert_parallel", 0);
    snprintf(w->resume, sizeof w->resume, "%s", field_str(o, "resume", ""));
    snprintf(w->kind, sizeof w->kind, "%s", field_str(c, "kind", ""));
    if (!strcmp(w->kind, "tcp")) {
        snprintf(w->host, sizeof w->host, "%s", field_str(c, "host", ""));
        w->port = (int)field_int(c, "port", 0);
    } else if (!strcmp(w->kind, "nccl")) {
        const char *id = field_str(c, "id", NULL);
        if (!id || unbase64(id, w->nccl_id, sizeof w->nccl_id)) rc = err_set(GE_FORMAT, "join: bad NCCL id");
    } else {
        rc = err_set(GE_FORMAT, "join: unknown comm kind '%s'", w->kind);
    }
done:
    json_object_put(o);
    return rc;
}

/* Joins (retrying each second until a leader answers with the world) or returns 1 on a stop. */
static int join(const leader *L, const follow_config *c, const char *backend, world_info *w) {
    long long id = -1;
    int last_st = 0;
    while (!atomic_load(&g_stop)) {
        char body[160], *resp = NULL;
        if (id >= 0) snprintf(body, sizeof body, "{\"ranks\":%d,\"backend\":\"%s\",\"follower\":%lld}", c->ranks, backend, id);
        else snprintf(body, sizeof body, "{\"ranks\":%d,\"backend\":\"%s\"}", c->ranks, backend);
        int st = http(L, "POST", "/v1/cluster/join", body, 10, &resp);
        if (st == 200 && !parse_world(resp, w)) {
            free(resp);
            return 0;
        }
        if (st == 202) {
            json_object *o = json_tokener_parse(resp ? resp : "");
            id = field_int(o, "follower", id);
            json_object_put(o);
        } else {
            id = -1;
        }
        if (st != last_st) {
            char esc[600];
            log_event(st == 202 ? LOG_INFO : LOG_WARN, "join_waiting", "\"leader\":\"%s\",\"status\":%d,\"answer\":%s",
                      L->hostport, st, log_str(esc, sizeof esc, resp ? resp : (st < 0 ? "unreachable" : "")));
            last_st = st;
        }
        free(resp);
        if (st != 202) sleep(1);
    }
    return 1;
}

/* ---------------------------------------------------------------- the epoch */

/* A rollout part the leader placed on one of our ranks (daemon/cluster.c). */
typedef struct fpart {
    long long id;
    int rank;
    char *desc; /* until started */
    jobs_rollout *r; /* once started (main thread) */
    int stream; /* the leader streams it: post its tokens as they are sampled */
    long long posted; /* tokens in the last progress posted */
    double next_post;
    struct fpart *next;
} fpart;

typedef struct {
    const leader *L;
    long long id;
    double lost_s;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the main thread waits for the poller or a peer */
    ranks *rk; /* under mu: aborted when the leader is gone */
    _Atomic int gone, quit;
    double last_ok;
    /* the inbox (under mu): filled by the poller thread (GET /v1/cluster/next), taken by the
     * main thread */
    char *call; /* the pending SPMD call's description */
    long long call_seq;
    fpart *parts; /* parts to start */
    long long *cancel; /* parts released by the leader (n_cancel of them, room for cap) */
    int n_cancel, cap_cancel, wake;
    long long *stream; /* parts the leader streams (n_stream, room for cap_stream) */
    int n_stream, cap_stream;
} epoch;

/* Appends v to a[n] (room for *cap): 0, or -1 when out of memory. */
static int ids_add(long long **a, int *n, int *cap, long long v) {
    if (*n == *cap) {
        int c = *cap ? 2 * *cap : 16;
        long long *q = realloc(*a, sizeof *q * (size_t)c);
        if (!q) return -1;
        *a = q, *cap = c;
    }
    (*a)[(*n)++] = v;
    return 0;
}

static void gone(epoch *ep, const char *why) {
    if (atomic_exchange(&ep->gone, 1)) return;
    log_event(LOG_WARN, "leader_gone", "\"why\":\"%s\"", why);
    pthread_mutex_lock(&ep->mu);
    if (ep->rk) ranks_abort(ep->rk); /* a collective our ranks wait in returns */
    pthread_mutex_unlock(&ep->mu);
}

static void *beat_main(void *arg) {
    epoch *ep = arg;
    char path[96];
    snprintf(path, sizeof path, "/v1/cluster/beat?follower=%lld", ep->id);
    while (!atomic_load(&ep->quit) && !atomic_load(&ep->gone)) {
        char *resp = NULL;
        int st = http(ep->L, "GET", path, NULL, 5, &resp);
        free(resp);
        double now = clock_mono_s();
        if (st == 200) ep->last_ok = now;
        else if (st == 410 || st == 404) gone(ep, "the leader no longer knows this follower");
        else if (now - ep->last_ok > ep->lost_s) gone(ep, "no answer from the leader");
        for (int i = 0; i < 10 && !atomic_load(&ep->quit); i++) usleep(100000);
    }
    return NULL;
}

static void no_progress(void *ud, double f) {
    (void)ud;
    (void)f;
}

static void wake(void *ud) {
    epoch *ep = ud;
    pthread_mutex_lock(&ep->mu);
    ep->wake = 1;
    pthread_cond_signal(&ep->cv);
    pthread_mutex_unlock(&ep->mu);
}

/* The poller: GET /v1/cluster/next (a long-poll) into the inbox, so the main thread decodes
 * while it waits. */
static void *poll_main(void *arg) {
    epoch *ep = arg;
    long long after = 0;
    char path[128];
    while (!atomic_load(&ep->quit) && !atomic_load(&ep->gone) && !atomic_load(&g_stop)) {
        char *resp = NULL;
        snprintf(path, sizeof path, "/v1/cluster/next?follower=%lld&after=%lld", ep->id, after);
        int st = http(ep->L, "GET", path, NULL, 10, &resp);
        if (st == 200) {
            json_object *o = json_tokener_parse(resp ? resp : ""), *co = field_get(o, "call"), *ps = field_get(o, "parts"),
                        *cs = field_get(o, "cancel"), *ss = field_get(o, "stream");
            long long seq = field_int(o, "seq", -1);
            pthread_mutex_lock(&ep->mu);
            if (co && seq > after) {
                free(ep->call);
                ep->call = strdup(json_object_to_json_string_ext(co, JSON_C_TO_STRING_PLAIN));
                ep->call_seq = seq;
                after = seq;
            }
            for (size_t i = 0; ps && i < json_object_array_length(ps); i++) {
                json_object *x = json_object_array_get_idx(ps, i);
                fpart *p = calloc(1, sizeof *p);
                if (!p) break;
                p->id = field_int(x, "id", -1);
                p->rank = (int)field_int(x, "rank", -1);
                p->desc = strdup(json_object_to_json_string_ext(field_get(x, "desc"), JSON_C_TO_STRING_PLAIN));
                fpart **pp = &ep->parts; /* in the leader's order */
                while (*pp) pp = &(*pp)->next;
                *pp = p;
            }
            for (size_t i = 0; cs && i < json_object_array_length(cs); i++)
                if (ids_add(&ep->cancel, &ep->n_cancel, &ep->cap_cancel, json_object_get_int64(json_object_array_get_idx(cs, i))))
                    break;
            for (size_t i = 0; ss && i < json_object_array_length(ss); i++)
                if (ids_add(&ep->stream, &ep->n_stream, &ep->cap_stream, json_object_get_int64(json_object_array_get_idx(ss, i))))
                    break;
            ep->wake = 1;
            pthread_cond_signal(&ep->cv);
            pthread_mutex_unlock(&ep->mu);
            json_object_put(o);
        } else if (st == 410 || st == 404) {
            gone(ep, "the leader no longer knows this follower");
        } else if (st != 204) {
            usleep(200000); /* unreachable: the beat thread decides when it is gone */
        }
        free(resp);
    }
    wake(ep);
    return NULL;
}

/* POST /v1/cluster/done with body: the HTTP status (-1 unreachable). */
static int post_done(epoch *ep, const char *body, double timeout_s) {
    char path[96], *resp = NULL;
    snprintf(path, sizeof path, "/v1/cluster/done?follower=%lld", ep->id);
    int st = http(ep->L, "POST", path, body, timeout_s, &resp);
    free(resp);
    return st;
}

/* A part's outcome: its result (rc 0; the rollout result's JSON text, spliced in) or its error. */
static void post_part(epoch *ep, long long id, int rc, const char *result) {
    json_object *m = json_object_new_string(rc ? err_msg() : "");
    const char *ms = json_object_to_json_string(m);
    size_t n = strlen(ms) + (result ? strlen(result) : 0) + 128;
    char *body = malloc(n);
    if (body) {
        snprintf(body, n, "{\"part\":%lld,\"rc\":%d,\"msg\":%s%s%s}", id, rc, ms, result ? ",\"result\":" : "",
                 result ? result : "");
        int st = post_done(ep, body, 30);
        log_event(rc ? LOG_WARN : LOG_INFO, "part_done", "\"part\":%lld,\"code\":\"%s\",\"posted\":%d", id,
                  rc ? err_name(rc) : "ok", st);
    }
    free(body);
    json_object_put(m);
}

/* A streamed part's responses so far as done {"part", "progress": [[group, response, [token
 * ids], [logprobs], k, [top ids], [top logprobs]], ...]} (jobs_rollout_peek: those with tokens,
 * each whole; the last three with sampling.top_logprobs k > 0: (n, k) each, row by row). */
typedef struct {
    FILE *m;
    int n;
    long long tokens;
} progress_ctx;
static void progress_put(void *ud, int group, int resp, const eng_response *x, int k) {
    progress_ctx *c = ud;
    fprintf(c->m, "%s[%d,%d,[", c->n++ ? "," : "", group, resp);
    for (int i = 0; i < x->n_tokens; i++) fprintf(c->m, i ? ",%d" : "%d", x->tokens[i]);
    fputs("],[", c->m);
    for (int i = 0; i < x->n_tokens; i++) fprintf(c->m, i ? ",%.9g" : "%.9g", (double)x->logprobs[i]);
    if (k && x->top_ids) {
        size_t m = (size_t)x->n_tokens * k;
        fprintf(c->m, "],%d,[", k);
        for (size_t i = 0; i < m; i++) fprintf(c->m, i ? ",%d" : "%d", x->top_ids[i]);
        fputs("],[", c->m);
        for (size_t i = 0; i < m; i++) fprintf(c->m, i ? ",%.9g" : "%.9g", (double)x->top_lps[i]);
    }
    fputs("]]", c->m);
    c->tokens += x->n_tokens;
}

/* Posts p's new tokens when the leader streams it, at most every 20 ms (the main thread's
 * steps wait for the post). */
static void post_progress(epoch *ep, fpart *p) {
    double now = clock_mono_s();
    if (!p->stream || now < p->next_post) return;
    char *body = NULL;
    size_t len = 0;
    progress_ctx c = {open_memstream(&body, &len), 0, 0};
    if (!c.m) return;
    fprintf(c.m, "{\"part\":%lld,\"progress\":[", p->id);
    jobs_rollout_peek(p->r, progress_put, &c);
    fputs("]}", c.m);
    fclose(c.m);
    if (c.tokens > p->posted) {
        post_done(ep, body, 10);
        p->posted = c.tokens;
        p->next_post = now + 0.02;
        if (c.tokens >= 4) test_hook_hold("follower_stream_tokens");
    }
    free(body);
}

/* Runs one SPMD call (jobs_follow) and posts its outcome. */
static void run_call(epoch *ep, const jobs_env *env, const char *call, long long seq) {
    err_clear();
    double t0 = clock_mono_ms();
    int crc = jobs_follow(env, call);
    json_object *d = json_object_new_object();
    json_object_object_add(d, "seq", json_object_new_int64(seq));
    json_object_object_add(d, "rc", json_object_new_int(crc));
    json_object_object_add(d, "msg", json_object_new_string(crc ? err_msg() : ""));
    int dst = post_done(ep, json_object_to_json_string_ext(d, JSON_C_TO_STRING_PLAIN), 10);
    json_object_put(d);
    log_event(crc ? LOG_WARN : LOG_INFO, "call_done", "\"seq\":%lld,\"code\":\"%s\",\"ms\":%.1f,\"posted\":%d", seq,
              crc ? err_name(crc) : "ok", clock_mono_ms() - t0, dst);
}

/* The main thread's loop: calls, parts to start or cancel, rank 0's scheduler steps, finished
 * parts posted; it sleeps when none of them has work. */
static void serve_epoch(epoch *ep, const jobs_env *env, eng_sched *sched0) {
    fpart *run = NULL; /* started parts */
    while (!atomic_load(&g_stop) && !atomic_load(&ep->gone)) {
        pthread_mutex_lock(&ep->mu);
        char *call = ep->call;
        long long seq = ep->call_seq;
        fpart *fresh = ep->parts;
        long long *cancel = ep->cancel, *stream = ep->stream;
        int nc = ep->n_cancel, ns = ep->n_stream;
        ep->call = NULL;
        ep->parts = NULL;
        ep->cancel = ep->stream = NULL;
        ep->n_cancel = ep->cap_cancel = ep->n_stream = ep->cap_stream = 0;
        ep->wake = 0;
        pthread_mutex_unlock(&ep->mu);
        int did = call || fresh || nc;
        while (fresh) {
            fpart *p = fresh;
            fresh = p->next;
            err_clear();
            int rc = jobs_part_start(env, p->desc, p->rank, &p->r);
            free(p->desc);
            p->desc = NULL;
            if (rc) {
                post_part(ep, p->id, rc, NULL);
                free(p);
                continue;
            }
            p->next = run;
            run = p;
        }
        for (int i = 0; i < nc; i++)
            for (fpart **pp = &run; *pp; pp = &(*pp)->next)
                if ((*pp)->id == cancel[i]) {
                    fpart *p = *pp;
                    *pp = p->next;
                    jobs_rollout_free(p->r);
                    log_event(LOG_INFO, "part_cancelled", "\"part\":%lld", p->id);
                    free(p);
                    break;
                }
        free(cancel);
        for (int i = 0; i < ns; i++)
            for (fpart *p = run; p; p = p->next) p->stream |= p->id == stream[i];
        free(stream);
        if (call) {
            run_call(ep, env, call, seq);
            free(call);
        }
        if (eng_sched_busy(sched0)) {
            ranks_step(env->rk);
            did = 1;
        }
        for (fpart *p = run; p; p = p->next) post_progress(ep, p);
        for (fpart **pp = &run; *pp;) {
            fpart *p = *pp;
            char *result = NULL;
            int st = jobs_rollout_poll(p->r, NULL, NULL, &result);
            if (!st) {
                pp = &p->next;
                continue;
            }
            post_part(ep, p->id, st < 0 ? st : 0, result);
            free(result);
            jobs_rollout_free(p->r);
            *pp = p->next;
            free(p);
            did = 1;
        }
        if (did) continue;
        pthread_mutex_lock(&ep->mu);
        if (!ep->wake && !atomic_load(&ep->gone) && !atomic_load(&g_stop)) {
            struct timespec ts;
            clock_wall_after(0.1, &ts);
            pthread_cond_timedwait(&ep->cv, &ep->mu, &ts);
        }
        pthread_mutex_unlock(&ep->mu);
    }
    while (run) { /* the leader is gone or we stop: cancel what runs */
        fpart *p = run;
        run = p->next;
        jobs_rollout_free(p->r);
        free(p);
    }
}


/* One epoch: open the ranks in the world, run the calls and rollout parts until the leader is
 * gone or a stop. */
static void run_epoch(const leader *L, const follow_config *c, const char *backend, const world_info *w) {
    char model[1200];
    int rc, W = c->ranks;
    if (c->model_dir && c->model_dir[0]) snprintf(model, sizeof model, "%s", c->model_dir);
    else {
        snprintf(model, sizeof model, "%s/default-model", c->data_dir);
        if ((rc = eng_ensure_default_model(model))) {
            log_event(LOG_ERROR, "follower_open_failed", "\"message\":\"%s\"", err_msg());
            sleep(1);
            return;
        }
    }
    int threads = c->n_threads > 0 ? c->n_threads : worker_default_threads();
    eng_open_opts o = {.model_dir = model,
                       .backend = backend,
                       .resume_dir = w->resume[0] ? w->resume : NULL,
                       .n_threads = threads / W > 0 ? threads / W : 1,
                       .optimizer_offload = c->optimizer_offload,
                       .optimizer_moments = c->moments_bf16 ? "bf16" : NULL,
                       .expert_parallel = w->expert_parallel};
    eng_sched_opts so = {.kv_bytes = c->kv_budget_mib << 20};
    ranks_world wd = {.base = w->rank0,
                      .world = w->world,
                      .host = w->host,
                      .port = w->port,
                      .listen_fd = -1,
                      .nccl_id = w->nccl_id,
                      .timeout_s = 120};
    log_event(LOG_INFO, "follower_opening",
              "\"follower\":%lld,\"ranks\":\"%d..%d\",\"world\":%d,\"comm\":\"%s\",\"resume\":\"%s\",\"expert_parallel\":%s",
              w->id, w->rank0, w->rank0 + W - 1, w->world, w->kind, w->resume, w->expert_parallel ? "true" : "false");
    epoch ep = {.L = L, .id = w->id, .lost_s = w->lost_s > 0 ? w->lost_s : 10, .last_ok = clock_mono_s()};
    pthread_mutex_init(&ep.mu, NULL);
    pthread_cond_init(&ep.cv, NULL);
    pthread_t bt;
    int have_bt = !pthread_create(&bt, NULL, beat_main, &ep); /* beats while the engines open too */
    ranks *rk = NULL;
    eng *e = NULL;
    eng_sched *sched0 = NULL;
    rc = ranks_start(W, &o, c->devices, &so, wake, &ep, &wd, &rk);
    if (!rc) {
        pthread_mutex_lock(&ep.mu);
        ep.rk = rk;
        pthread_mutex_unlock(&ep.mu);
        rc = ranks_open_rank0(rk, &o, &e);
    }
    if (!rc) rc = eng_sched_open(e, &so, &sched0);
    if (rc) {
        char esc[700];
        log_event(LOG_ERROR, "follower_open_failed", "\"code\":\"%s\",\"message\":%s", err_name(rc),
                  log_str(esc, sizeof esc, err_msg()));
    } else {
        ranks_set_rank0(rk, e, sched0);
        log_event(LOG_INFO, "follower_ready", "\"follower\":%lld,\"comm\":\"%s\"", w->id, ranks_comm_name(rk));
        sdn_notify("READY=1");
        jobs_env env = {e, rk, NULL, c->data_dir, no_progress, NULL};
        pthread_t pt;
        int have_pt = !pthread_create(&pt, NULL, poll_main, &ep);
        if (have_pt) {
            serve_epoch(&ep, &env, sched0);
            atomic_store(&ep.quit, 1);
            pthread_join(pt, NULL);
        }
        pthread_mutex_lock(&ep.mu);
        free(ep.call);
        ep.call = NULL;
        free(ep.cancel);
        free(ep.stream);
        ep.cancel = ep.stream = NULL;
        while (ep.parts) {
            fpart *p = ep.parts;
            ep.parts = p->next;
            free(p->desc);
            free(p);
        }
        pthread_mutex_unlock(&ep.mu);
    }
    atomic_store(&ep.quit, 1);
    if (have_bt) pthread_join(bt, NULL);
    pthread_mutex_lock(&ep.mu);
    ep.rk = NULL;
    pthread_mutex_unlock(&ep.mu);
    ranks_abort(rk); /* the leader's gone: nothing may wait in a collective while closing */
    ranks_stop(rk);
    eng_sched_close(sched0);
    eng_close(e);
    ranks_close(rk);
    pthread_cond_destroy(&ep.cv);
    pthread_mutex_destroy(&ep.mu);
    log_event(LOG_INFO, "follower_closed", "\"follower\":%lld", w->id);
    if (rc && !atomic_load(&g_stop)) sleep(1);
}

int follow_main(const follow_config *c) {
    leader L = {.key = c->api_key && c->api_key[0] ? c->api_key : NULL};
    if (parse_url(c->url, &L)) {
        fprintf(stderr, "grpod serve: %s\n", err_msg());
        return 2;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    const char *backend = eng_backend_resolve(c->backend);
    log_event(LOG_INFO, "follower_starting", "\"leader\":\"%s\",\"ranks\":%d,\"backend\":\"%s\"", L.hostport, c->ranks, backend);
    while (!atomic_load(&g_stop)) {
        world_info w;
        if (join(&L, c, backend, &w)) break;
        log_event(LOG_INFO, "joined", "\"follower\":%lld,\"rank0\":%d,\"world\":%d", w.id, w.rank0, w.world);
        run_epoch(&L, c, backend, &w);
    }
    sdn_notify("STOPPING=1");
    log_event(LOG_INFO, "stopped", "\"status\":0");
    return 0;
}
