/* cluster.c — the leader's side of a deployment over several processes; see cluster.h.
 *
 * One call is in flight at a time (the engine thread runs SPMD calls one after another), so the
 * state is: the followers (slot i: its id, ranks, last request, the last call it finished and
 * that call's code), the current call (seq and its description) and the phase. */
#define _GNU_SOURCE /* vasprintf */
#include "daemon/cluster.h"
#include "daemon/json_read.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "engine/dist/comm.h"

#define MAX_FOLLOWERS RANKS_MAX

typedef enum { PH_WAITING, PH_FORMED, PH_LOST } phase;

/* One response of a streamed part as the follower last posted it. */
typedef struct {
    int group, resp, n, k;
    int *tok;
    float *lp;
    int *top_ids; /* (n, k) with k > 0, else NULL */
    float *top_lps;
} cprog;

/* A rollout part on a follower's rank (ranks_remote.part_add): handed out once by `next`, its
 * groups back by `done` {"part", "rc", "msg", "result"} into out. */
typedef struct cpart {
    long long id, follower;
    int rank; /* the follower's local rank */
    char *desc; /* the part's payload until handed out */
    int state; /* 0 running, 1 done (out filled), < 0 failed */
    int cancel; /* released while the follower holds it: `next` tells it, then frees it */
    char msg[512];
    eng_group_result *out;
    int n;
    int top; /* the request's sampling.top_logprobs: what a response's rows must hold (0: none) */
    /* a tapped part (part_peek): 1 until `next` asks the follower to stream it, then 2; its
     * responses so far as the follower last posted them (done {"part", "progress"}) */
    int stream;
    cprog *prog;
    int n_prog;
    struct cpart *next;
} cpart;

typedef struct {
    long long id;
    int ranks, base;
    char backend[16];
    double last_seen;
    long long done_seq;
    int done_rc;
    char done_msg[512];
} follower;

struct cluster {
    cluster_config cfg;
    char host[256];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    phase ph;
    int n; /* followers joined */
    follower f[MAX_FOLLOWERS];
    long long epoch, next_id;
    int formed; /* cluster_form made the world: joins get it */
    char world_json[2048]; /* the world's common part (a resume path of up to 1200 bytes, the comm) */
    int world, W0;
    char backend[16];
    long long seq; /* the current (or last) call */
    char *call; /* its description; NULL when none is pending */
    ranks *rk; /* attached: aborted when a follower is lost */
    char lost_msg[512];
    int restart;
    cpart *parts; /* rollout parts on the followers' ranks */
    long long next_part;
};

static void set_waiting_msg(cluster *cl) {
    char why[200];
    snprintf(why, sizeof why, "waiting for %d of %d followers to join (grpod serve --join)", cl->cfg.followers - cl->n,
             cl->cfg.followers);
    api_set_loading(cl->cfg.api, why);
}

int cluster_open(const cluster_config *c, cluster **out) {
    *out = NULL;
    if (c->followers < 1 || c->followers > MAX_FOLLOWERS)
        return err_set(GE_INVALID, "cluster: %d followers (1..%d)", c->followers, MAX_FOLLOWERS);
    cluster *cl = calloc(1, sizeof *cl);
    if (!cl) return err_set(GE_NOMEM, "cluster: out of memory");
    cl->cfg = *c;
    snprintf(cl->host, sizeof cl->host, "%s", c->host ? c->host : "127.0.0.1");
    cl->cfg.host = cl->host;
    if (cl->cfg.lost_s <= 0) cl->cfg.lost_s = 10;
    pthread_mutex_init(&cl->mu, NULL);
    pthread_cond_init(&cl->cv, NULL);
    /* ids differ from one leader start to the next, so a follower of the previous epoch is not
     * taken for one of this (it gets 410 and joins again) */
    cl->epoch = (long long)time(NULL);
    cl->next_id = (cl->epoch % 1000000) * 100 + 1;
    set_waiting_msg(cl);
    *out = cl;
    return 0;
}

static void prog_free(cprog *g, int n) {
    for (int i = 0; i < n; i++) free(g[i].tok), free(g[i].lp), free(g[i].top_ids), free(g[i].top_lps);
    free(g);
}

static void part_free(cpart *p) {
    free(p->desc);
    prog_free(p->prog, p->n_prog);
    free(p);
}

void cluster_close(cluster *cl) {
    if (!cl) return;
    while (cl->parts) {
        cpart *p = cl->parts;
        cl->parts = p->next;
        part_free(p);
    }
    pthread_cond_destroy(&cl->cv);
    pthread_mutex_destroy(&cl->mu);
    free(cl->call);
    free(cl);
}

static follower *find(cluster *cl, long long id) {
    for (int i = 0; i < cl->n; i++)
        if (cl->f[i].id == id) return &cl->f[i];
    return NULL;
}

/* Under mu: a follower is lost; everything waiting for it gives up. */
static void lose(cluster *cl, follower *f, const char *why) {
    if (cl->ph == PH_LOST) return;
    cl->ph = PH_LOST;
    snprintf(cl->lost_msg, sizeof cl->lost_msg, "follower %lld (ranks %d..%d) lost: %s; waiting for it to join again", f->id,
             f->base, f->base + f->ranks - 1, why);
    log_event(LOG_ERROR, "follower_lost", "\"follower\":%lld,\"message\":\"%s\"", f->id, why);
    if (cl->rk) ranks_abort(cl->rk); /* a collective the local ranks wait in returns */
    for (cpart *p = cl->parts; p; p = p->next) /* and every rollout part on a follower fails */
        if (!p->state) {
            p->state = GE_RANK_LOST;
            snprintf(p->msg, sizeof p->msg, "%s", cl->lost_msg);
        }
    ranks_notify(cl->rk);
    api_set_failed(cl->cfg.api, cl->lost_msg);
    pthread_cond_broadcast(&cl->cv);
}

/* Under mu: any follower silent for lost_s is lost once the world formed; before, it only
 * gives its place back (a waiting follower repeats its join each second), so one that restarted
 * while the others were still coming is not counted twice. */
static void check(cluster *cl) {
    double now = clock_mono_s();
    if (cl->ph == PH_WAITING && !cl->formed) {
        int k = 0;
        for (int i = 0; i < cl->n; i++) {
            if (now - cl->f[i].last_seen > cl->cfg.lost_s) {
                log_event(LOG_WARN, "follower_left", "\"follower\":%lld,\"note\":\"no join for %.0f s before the world formed\"",
                          cl->f[i].id, cl->cfg.lost_s);
                continue;
            }
            cl->f[k++] = cl->f[i];
        }
        if (k != cl->n) {
            cl->n = k;
            set_waiting_msg(cl);
        }
        return;
    }
    if (cl->ph != PH_FORMED) return;
    for (int i = 0; i < cl->n; i++)
        if (now - cl->f[i].last_seen > cl->cfg.lost_s) {
            char why[96];
            snprintf(why, sizeof why, "no request for %.0f s", cl->cfg.lost_s);
            lose(cl, &cl->f[i], why);
            return;
        }
}

void cluster_tick(cluster *cl) {
    if (!cl) return;
    pthread_mutex_lock(&cl->mu);
    check(cl);
    pthread_mutex_unlock(&cl->mu);
}

int cluster_lost(cluster *cl) {
    pthread_mutex_lock(&cl->mu);
    int l = cl->ph == PH_LOST;
    pthread_mutex_unlock(&cl->mu);
    return l;
}

int cluster_restart_wanted(cluster *cl) {
    pthread_mutex_lock(&cl->mu);
    int r = cl->restart;
    pthread_mutex_unlock(&cl->mu);
    return r;
}

/* Waits on cv (mu held) for a change, secs at most. */
static void wait_for(cluster *cl, double secs) {
    struct timespec ts;
    clock_wall_after(secs, &ts);
    pthread_cond_timedwait(&cl->cv, &cl->mu, &ts);
}

/* ---------------------------------------------------------------- forming the world */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void base64(const unsigned char *in, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)in[i] << 16 | (i + 1 < n ? (unsigned)in[i + 1] << 8 : 0) | (i + 2 < n ? in[i + 2] : 0);
        out[o++] = b64[v >> 18 & 63];
        out[o++] = b64[v >> 12 & 63];
        out[o++] = i + 1 < n ? b64[v >> 6 & 63] : '=';
        out[o++] = i + 2 < n ? b64[v & 63] : '=';
    }
    out[o] = 0;
}

int cluster_form(cluster *cl, int W0, const char *backend, const char *resume, int expert_parallel, const _Atomic int *stop,
                 ranks_world *wd) {
    memset(wd, 0, sizeof *wd);
    wd->listen_fd = -1;
    pthread_mutex_lock(&cl->mu);
    snprintf(cl->backend, sizeof cl->backend, "%s", backend);
    cl->W0 = W0;
    while (cl->n < cl->cfg.followers && !atomic_load(stop)) {
        wait_for(cl, 0.2);
        if (cl->n < cl->cfg.followers) check(cl);
    }
    if (atomic_load(stop)) {
        pthread_mutex_unlock(&cl->mu);
        return err_set(GE_UNAVAILABLE, "stopped while waiting for the followers to join");
    }
    int world = W0;
    for (int i = 0; i < cl->n; i++) {
        cl->f[i].base = world;
        world += cl->f[i].ranks;
        cl->f[i].last_seen = clock_mono_s(); /* the deadline starts now */
    }
    if (world > RANKS_MAX) {
        pthread_mutex_unlock(&cl->mu);
        return err_set(GE_INVALID, "the world of %d ranks is over %d", world, RANKS_MAX);
    }
    int rc;
    char comm[300];
    static unsigned char nccl_id[128]; /* one leader per process: kept until the engines opened */
    if (!strcmp(backend, "cuda")) {
        if ((rc = comm_nccl_unique_id(nccl_id))) {
            pthread_mutex_unlock(&cl->mu);
            return rc;
        }
        char b[200];
        base64(nccl_id, sizeof nccl_id, b);
        snprintf(comm, sizeof comm, "{\"kind\":\"nccl\",\"id\":\"%s\"}", b);
        wd->nccl_id = nccl_id;
    } else {
        int fd, port;
        if ((rc = comm_tcp_listen(cl->host, 0, &fd, &port))) {
            pthread_mutex_unlock(&cl->mu);
            return rc;
        }
        snprintf(comm, sizeof comm, "{\"kind\":\"tcp\",\"host\":\"%s\",\"port\":%d}", cl->host, port);
        wd->host = cl->host;
        wd->port = port;
        wd->listen_fd = fd;
    }
    json_object *r = json_object_new_string(resume ? resume : "");
    snprintf(cl->world_json, sizeof cl->world_json,
             "\"epoch\":%lld,\"world\":%d,\"comm\":%s,\"resume\":%s,\"lost_s\":%g,\"expert_parallel\":%s", cl->epoch, world, comm,
             json_object_to_json_string(r), cl->cfg.lost_s, expert_parallel ? "true" : "false");
    json_object_put(r);
    wd->base = 0;
    wd->world = cl->world = world;
    wd->timeout_s = 120;
    cl->formed = 1;
    cl->ph = PH_FORMED;
    api_set_loading(cl->cfg.api, "opening the engines of every rank");
    log_event(LOG_INFO, "cluster_formed", "\"epoch\":%lld,\"world\":%d,\"followers\":%d,\"comm\":%s", cl->epoch, world, cl->n,
              comm);
    pthread_cond_broadcast(&cl->cv);
    pthread_mutex_unlock(&cl->mu);
    return 0;
}

/* ---------------------------------------------------------------- driving the calls */

static int remote_post(void *ud, const char *call, long long *seq) {
    cluster *cl = ud;
    pthread_mutex_lock(&cl->mu);
    if (cl->ph == PH_LOST) {
        int rc = err_set(GE_RANK_LOST, "%s", cl->lost_msg);
        pthread_mutex_unlock(&cl->mu);
        return rc;
    }
    char *c = strdup(call);
    if (!c) {
        pthread_mutex_unlock(&cl->mu);
        return err_set(GE_NOMEM, "out of memory");
    }
    free(cl->call);
    cl->call = c;
    *seq = ++cl->seq;
    pthread_cond_broadcast(&cl->cv);
    pthread_mutex_unlock(&cl->mu);
    return 0;
}

static int remote_wait(void *ud, long long seq, char *msg, size_t n) {
    cluster *cl = ud;
    int rc = 0;
    pthread_mutex_lock(&cl->mu);
    for (;;) {
        check(cl);
        if (cl->ph == PH_LOST) {
            snprintf(msg, n, "%s", cl->lost_msg);
            rc = GE_RANK_LOST;
            break;
        }
        int all = 1;
        for (int i = 0; i < cl->n; i++) all &= cl->f[i].done_seq >= seq;
        if (all) {
            for (int i = 0; i < cl->n && !rc; i++)
                if (cl->f[i].done_rc) {
                    rc = cl->f[i].done_rc;
                    snprintf(msg, n, "follower %lld: %s", cl->f[i].id, cl->f[i].done_msg);
                }
            break;
        }
        wait_for(cl, 0.2);
    }
    free(cl->call);
    cl->call = NULL;
    pthread_mutex_unlock(&cl->mu);
    return rc;
}

/* ---------------------------------------------------------------- rollout parts */

static int reply(char **out, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static cpart *part_find(cluster *cl, long long id, cpart ***link) {
    for (cpart **pp = &cl->parts; *pp; pp = &(*pp)->next)
        if ((*pp)->id == id) {
            if (link) *link = pp;
            return *pp;
        }
    return NULL;
}

static int part_add(void *ud, int rank, const char *desc, int top, eng_group_result *out, int n, long long *id) {
    cluster *cl = ud;
    pthread_mutex_lock(&cl->mu);
    int rc = 0;
    follower *f = NULL;
    for (int i = 0; i < cl->n && !f; i++)
        if (rank >= cl->f[i].base && rank < cl->f[i].base + cl->f[i].ranks) f = &cl->f[i];
    cpart *p = NULL;
    if (cl->ph == PH_LOST) rc = err_set(GE_RANK_LOST, "%s", cl->lost_msg);
    else if (!f) rc = err_set(GE_INTERNAL, "cluster: no follower holds rank %d", rank);
    else if (!(p = calloc(1, sizeof *p)) || !(p->desc = strdup(desc ? desc : "{}"))) rc = err_set(GE_NOMEM, "out of memory");
    if (rc) {
        if (p) part_free(p);
        pthread_mutex_unlock(&cl->mu);
        return rc;
    }
    p->id = *id = ++cl->next_part;
    p->follower = f->id;
    p->rank = rank - f->base;
    p->out = out;
    p->n = n;
    p->top = top;
    p->next = cl->parts;
    cl->parts = p;
    pthread_cond_broadcast(&cl->cv);
    pthread_mutex_unlock(&cl->mu);
    return 0;
}

static int part_state(void *ud, long long id, char *msg, size_t n) {
    cluster *cl = ud;
    pthread_mutex_lock(&cl->mu);
    cpart *p = part_find(cl, id, NULL);
    int st = p ? p->state : err_set(GE_INTERNAL, "cluster: no rollout part %lld", id);
    if (st < 0) snprintf(msg, n, "%s", p ? p->msg : err_msg());
    pthread_mutex_unlock(&cl->mu);
    return st;
}

static void part_release(void *ud, long long id) {
    cluster *cl = ud;
    pthread_mutex_lock(&cl->mu);
    cpart **link, *p = part_find(cl, id, &link);
    if (p && !p->state && !p->desc && cl->ph != PH_LOST) {
        p->cancel = 1; /* the follower runs it: `next` tells it to stop */
        p->out = NULL;
        pthread_cond_broadcast(&cl->cv);
    } else if (p) {
        *link = p->next;
        part_free(p);
    }
    pthread_mutex_unlock(&cl->mu);
}

/* A tapped part: what the follower posted so far; the first call asks it to stream (`next`). */
static void part_peek(void *ud, long long id, ranks_peek_cb fn, void *fn_ud) {
    cluster *cl = ud;
    pthread_mutex_lock(&cl->mu);
    cpart *p = part_find(cl, id, NULL);
    if (p && !p->stream) {
        p->stream = 1;
        pthread_cond_broadcast(&cl->cv);
    }
    for (int i = 0; p && i < p->n_prog; i++) {
        const cprog *g = &p->prog[i];
        eng_response x = {.tokens = g->tok, .logprobs = g->lp, .n_tokens = g->n, .top_ids = g->top_ids, .top_lps = g->top_lps};
        if (x.n_tokens > 0) fn(fn_ud, g->group, g->resp, &x, g->k);
    }
    pthread_mutex_unlock(&cl->mu);
}

/* Under mu: a part for f to take, to cancel or to stream. */
static int parts_for(cluster *cl, const follower *f) {
    for (cpart *p = cl->parts; p; p = p->next)
        if (p->follower == f->id && (p->desc || p->cancel || p->stream == 1)) return 1;
    return 0;
}

/* Under mu: `next`'s "parts", "stream" and "cancel" members for f (hands the parts out, asks
 * for the tapped ones' tokens as they are sampled, forgets the cancelled ones); "" when none. */
static char *parts_json(cluster *cl, const follower *f) {
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m) return NULL;
    int np = 0, nc = 0;
    for (cpart *p = cl->parts; p; p = p->next)
        if (p->follower == f->id && p->desc) {
            fprintf(m, "%s{\"id\":%lld,\"rank\":%d,\"desc\":%s}", np++ ? "," : ",\"parts\":[", p->id, p->rank, p->desc);
            free(p->desc);
            p->desc = NULL;
        }
    if (np) fputc(']', m);
    int ns = 0;
    for (cpart *p = cl->parts; p; p = p->next)
        if (p->follower == f->id && p->stream == 1 && !p->desc) {
            fprintf(m, "%s%lld", ns++ ? "," : ",\"stream\":[", p->id);
            p->stream = 2;
        }
    if (ns) fputc(']', m);
    for (cpart **pp = &cl->parts; *pp;) {
        cpart *p = *pp;
        if (p->follower == f->id && p->cancel) {
            fprintf(m, "%s%lld", nc++ ? "," : ",\"cancel\":[", p->id);
            *pp = p->next;
            part_free(p);
        } else {
            pp = &p->next;
        }
    }
    if (nc) fputc(']', m);
    fclose(m);
    return buf;
}

/* Response x's "top_ids" and "top_logprobs" ((nt, k) arrays of arrays, as jobs.c writes them
 * with sampling.top_logprobs k) into r, flat: 0, also when x has none or nt is 0; -1 when they do
 * not parse or memory ran out. */
static int part_tops(json_object *x, int nt, int top, eng_response *r) {
    json_object *ti = field_get(x, "top_ids"), *tl = field_get(x, "top_logprobs");
    if ((!ti && !tl) || !nt) return 0; /* none, or [] for no tokens */
    if (!json_object_is_type(ti, json_type_array) || !json_object_is_type(tl, json_type_array) ||
        (int)json_object_array_length(ti) != nt || (int)json_object_array_length(tl) != nt)
        return -1;
    json_object *r0 = json_object_array_get_idx(ti, 0);
    int k = json_object_is_type(r0, json_type_array) ? (int)json_object_array_length(r0) : 0;
    if (k != top) return -1; /* the job's readers take the request's count */
    r->top_ids = malloc(sizeof(int) * (size_t)nt * k);
    r->top_lps = malloc(sizeof(float) * (size_t)nt * k);
    if (!r->top_ids || !r->top_lps) return -1;
    for (int q = 0; q < nt; q++) {
        json_object *a = json_object_array_get_idx(ti, (size_t)q), *b = json_object_array_get_idx(tl, (size_t)q);
        if (!json_object_is_type(a, json_type_array) || !json_object_is_type(b, json_type_array) ||
            (int)json_object_array_length(a) != k || (int)json_object_array_length(b) != k)
            return -1;
        for (int c = 0; c < k; c++) {
            r->top_ids[(size_t)q * k + c] = json_object_get_int(json_object_array_get_idx(a, (size_t)c));
            r->top_lps[(size_t)q * k + c] = (float)json_object_get_double(json_object_array_get_idx(b, (size_t)c));
        }
    }
    return 0;
}

/* A part's groups from the follower's rollout result ({"groups": [{"responses": [{"token_ids",
 * "logprobs", "top_ids"?, "top_logprobs"?, "text", "finish_reason"}]}]}, as jobs.c writes it)
 * into out[n]. */
static int part_groups(json_object *res, int top, eng_group_result *out, int n) {
    int rc = 0;
    json_object *gs = field_get(res, "groups");
    if (!gs || !json_object_is_type(gs, json_type_array) || (int)json_object_array_length(gs) != n)
        return err_set(GE_FORMAT, "rollout part: the follower's result has not %d groups", n);
    for (int i = 0; i < n; i++) {
        json_object *rs = field_get(json_object_array_get_idx(gs, (size_t)i), "responses");
        int m = rs && json_object_is_type(rs, json_type_array) ? (int)json_object_array_length(rs) : 0;
        if (!(out[i].resp = calloc((size_t)(m ? m : 1), sizeof *out[i].resp))) goto nomem;
        out[i].n = m;
        for (int k = 0; k < m; k++) {
            json_object *x = json_object_array_get_idx(rs, (size_t)k), *t = field_get(x, "token_ids"),
                        *l = field_get(x, "logprobs"), *tx = field_get(x, "text");
            eng_response *r = &out[i].resp[k];
            int nt = t && json_object_is_type(t, json_type_array) ? (int)json_object_array_length(t) : -1;
            if (nt < 0 || !l || !json_object_is_type(l, json_type_array) || (int)json_object_array_length(l) != nt) {
                rc = err_set(GE_FORMAT, "rollout part: group %d response %d has no token_ids and logprobs alike", i, k);
                goto fail;
            }
            r->tokens = malloc(sizeof(int) * (size_t)(nt ? nt : 1));
            r->logprobs = malloc(sizeof(float) * (size_t)(nt ? nt : 1));
            size_t tl = tx ? (size_t)json_object_get_string_len(tx) : 0;
            r->text = malloc(tl + 1);
            if (!r->tokens || !r->logprobs || !r->text) goto nomem;
            for (int q = 0; q < nt; q++) {
                r->tokens[q] = json_object_get_int(json_object_array_get_idx(t, (size_t)q));
                r->logprobs[q] = (float)json_object_get_double(json_object_array_get_idx(l, (size_t)q));
            }
            r->n_tokens = nt;
            if (part_tops(x, nt, top, r)) {
                rc = err_set(GE_FORMAT, "rollout part: group %d response %d: top_ids and top_logprobs not (%d, %d)", i, k, nt, top);
                goto fail;
            }
            if (tl) memcpy(r->text, json_object_get_string(tx), tl);
            r->text[tl] = 0;
            r->text_len = tl;
            r->finish = !strcmp(field_str(x, "finish_reason", "stop"), "length") ? FINISH_LENGTH : FINISH_STOP;
        }
    }
    return 0;
nomem:
    rc = err_set(GE_NOMEM, "out of memory");
fail: /* out[i] of the groups not reached are still empty */
    for (int q = 0; q < n; q++) eng_group_result_free(&out[q]);
    return rc;
}

/* A follower's code in a done body: 0 or a negative GE_* code (anything else: GE_INTERNAL). */
static int done_code(json_object *b) {
    long long rc = field_int(b, "rc", GE_INTERNAL);
    return rc > 0 || rc <= -GE_COUNT_ ? GE_INTERNAL : (int)rc;
}

/* Entry e's array at i of n numbers into *out (n > 0, malloc'd; ints or floats): 0, or -1 when it
 * is not such an array or memory ran out. */
static int prog_array(json_object *e, int i, size_t n, int floats, void **out) {
    json_object *a = json_object_array_get_idx(e, (size_t)i);
    if (!json_object_is_type(a, json_type_array) || json_object_array_length(a) != n) return -1;
    int *ip = floats ? NULL : malloc(sizeof *ip * n);
    float *fp = floats ? malloc(sizeof *fp * n) : NULL;
    if (!ip && !fp) return -1;
    for (size_t q = 0; q < n; q++) {
        json_object *v = json_object_array_get_idx(a, q);
        if (fp) fp[q] = (float)json_object_get_double(v);
        else ip[q] = json_object_get_int(v);
    }
    *out = fp ? (void *)fp : (void *)ip;
    return 0;
}

/* POST /v1/cluster/done {"part", "rc", "msg", "result"} (b parsed, mu not held): the groups are
 * read before the lock, then moved into the part's out unless it was released meanwhile. */
/* done {"part", "progress": [[group, response, [token ids], [logprobs], k?, [top ids]?, [top
 * logprobs]?], ...]} (daemon/follow.c progress_put): a streamed part's responses so far (each
 * with all its tokens), kept for part_peek; an entry that does not parse counts no tokens. */
static int part_progress(cluster *cl, long long fid, long long id, json_object *pg, char **out) {
    int n = json_object_is_type(pg, json_type_array) ? (int)json_object_array_length(pg) : 0;
    cprog *g = calloc((size_t)(n ? n : 1), sizeof *g);
    for (int i = 0; g && i < n; i++) {
        json_object *e = json_object_array_get_idx(pg, (size_t)i), *t = json_object_array_get_idx(e, 2);
        size_t nt = json_object_is_type(t, json_type_array) ? json_object_array_length(t) : 0;
        int k = json_object_get_int(json_object_array_get_idx(e, 4));
        g[i].group = json_object_get_int(json_object_array_get_idx(e, 0));
        g[i].resp = json_object_get_int(json_object_array_get_idx(e, 1));
        if (!nt || k < 0 || k > ENG_TOP_MAX || prog_array(e, 2, nt, 0, (void **)&g[i].tok) ||
            prog_array(e, 3, nt, 1, (void **)&g[i].lp) ||
            (k && (prog_array(e, 5, nt * k, 0, (void **)&g[i].top_ids) || prog_array(e, 6, nt * k, 1, (void **)&g[i].top_lps))))
            continue; /* n stays 0: part_peek skips it */
        g[i].n = (int)nt;
        g[i].k = k;
    }
    pthread_mutex_lock(&cl->mu);
    cpart *p = part_find(cl, id, NULL);
    int taken = g && p && p->follower == fid && !p->cancel && !p->state;
    for (int i = 0; taken && i < n; i++)
        if (g[i].group < 0 || g[i].group >= p->n || g[i].resp < 0 || (g[i].k && g[i].k != p->top))
            taken = 0; /* not this part's */
    if (taken) {
        prog_free(p->prog, p->n_prog);
        p->prog = g, p->n_prog = n;
        if (cl->rk) ranks_notify(cl->rk); /* the worker peeks at its next poll */
    }
    pthread_mutex_unlock(&cl->mu);
    if (!taken) prog_free(g, g ? n : 0);
    return reply(out, 200, "{\"status\":\"%s\"}", taken ? "ok" : "ignored");
}

static int part_done(cluster *cl, long long fid, json_object *b, char **out) {
    long long id = field_int(b, "part", -1);
    json_object *pg = field_get(b, "progress");
    if (pg) return part_progress(cl, fid, id, pg, out);
    int rc = done_code(b);
    int n = 0, top = 0;
    pthread_mutex_lock(&cl->mu);
    cpart *p = part_find(cl, id, NULL);
    if (p && p->follower == fid && !p->cancel && !p->state) n = p->n, top = p->top;
    pthread_mutex_unlock(&cl->mu);
    if (!n) return reply(out, 200, "{\"status\":\"ignored\"}"); /* released, or not this follower's */
    eng_group_result *g = calloc((size_t)n, sizeof *g);
    char msg[400] = "out of memory";
    if (!g) rc = GE_NOMEM;
    else if (!rc && (rc = part_groups(field_get(b, "result"), top, g, n))) snprintf(msg, sizeof msg, "%s", err_msg());
    else if (rc) snprintf(msg, sizeof msg, "%s", field_str(b, "msg", ""));
    pthread_mutex_lock(&cl->mu);
    p = part_find(cl, id, NULL);
    int taken = p && !p->cancel && !p->state && p->out;
    if (taken) {
        p->state = rc ? rc : 1;
        if (rc) snprintf(p->msg, sizeof p->msg, "follower %lld: %s", fid, msg);
        else memcpy(p->out, g, sizeof *g * (size_t)n);
        ranks_notify(cl->rk);
    }
    pthread_mutex_unlock(&cl->mu);
    if (!taken && !rc)
        for (int i = 0; i < n; i++) eng_group_result_free(&g[i]);
    free(g);
    return reply(out, 200, "{\"status\":\"%s\"}", taken ? "ok" : "ignored");
}

void cluster_attach(cluster *cl, ranks *rk) {
    pthread_mutex_lock(&cl->mu);
    cl->rk = rk;
    ranks_set_remote(rk, &(ranks_remote){remote_post, remote_wait, part_add, part_state, part_release, part_peek, cl});
    if (cl->ph == PH_LOST) ranks_abort(rk);
    pthread_mutex_unlock(&cl->mu);
}

void cluster_detach(cluster *cl) {
    if (!cl) return;
    pthread_mutex_lock(&cl->mu);
    cl->rk = NULL;
    pthread_mutex_unlock(&cl->mu);
}

/* ---------------------------------------------------------------- the routes */

static int reply(char **out, int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(out, fmt, ap) < 0) *out = NULL;
    va_end(ap);
    return status;
}

static int cl_error(char **out, int status, const char *code, const char *msg) {
    json_object *m = json_object_new_string(msg);
    int st = reply(out, status, "{\"error\":{\"code\":\"%s\",\"message\":%s}}", code, json_object_to_json_string(m));
    json_object_put(m);
    return st;
}

static int world_reply(cluster *cl, follower *f, char **out) {
    return reply(out, 200, "{\"follower\":%lld,\"rank0\":%d,\"ranks\":%d,%s}", f->id, f->base, f->ranks, cl->world_json);
}

/* POST /v1/cluster/join {"ranks": n, "backend": "cpu"|"cuda", "follower": id (a retry)} */
static int h_join(cluster *cl, const char *body, char **out) {
    json_object *b = json_tokener_parse(body);
    long long ranks = field_int(b, "ranks", 0), id = field_int(b, "follower", -1);
    char backend[16];
    snprintf(backend, sizeof backend, "%s", field_str(b, "backend", ""));
    json_object_put(b);
    if (ranks < 1 || ranks > RANKS_MAX) return cl_error(out, 400, "invalid_field", "ranks must be 1..64");
    if (strcmp(backend, "cpu") && strcmp(backend, "cuda"))
        return cl_error(out, 400, "invalid_field", "backend must be cpu or cuda");
    if (cl->ph == PH_LOST) {
        /* crash-only recovery: the follower is back, the leader restarts into a new epoch */
        if (!cl->restart) {
            cl->restart = 1;
            log_event(LOG_WARN, "cluster_restart", "\"reason\":\"a follower joins after a loss\"");
            if (cl->cfg.on_restart) cl->cfg.on_restart(cl->cfg.ud);
        }
        return cl_error(out, 503, "rank_lost", "the leader restarts for a new epoch after losing a follower; join again");
    }
    follower *f = id >= 0 ? find(cl, id) : NULL;
    if (!f) {
        if (cl->ph == PH_FORMED || cl->n == cl->cfg.followers)
            return cl_error(
                out, 409, "conflict",
                "the leader has all its followers (--followers); a follower that restarted joins the leader's next epoch");
        f = &cl->f[cl->n++];
        memset(f, 0, sizeof *f);
        f->id = cl->next_id++;
        f->done_seq = cl->seq; /* calls made before it joined are not its */
        log_event(LOG_INFO, "follower_joined", "\"follower\":%lld,\"ranks\":%lld,\"backend\":\"%s\",\"joined\":%d,\"of\":%d",
                  f->id, ranks, backend, cl->n, cl->cfg.followers);
        if (cl->ph == PH_WAITING) set_waiting_msg(cl);
        pthread_cond_broadcast(&cl->cv);
    }
    f->ranks = (int)ranks;
    snprintf(f->backend, sizeof f->backend, "%s", backend);
    f->last_seen = clock_mono_s();
    if (!cl->formed) {
        long long fid = f->id;
        wait_for(cl, 1.0); /* a long-poll: the world may form meanwhile */
        if (!(f = find(cl, fid))) /* check() gave its place back meanwhile (mu was free) */
            return cl_error(out, 503, "unavailable", "the join timed out; join again");
    }
    if (cl->formed) {
        if (strcmp(f->backend, cl->backend))
            return cl_error(out, 400, "invalid_field", "the follower's backend differs from the leader's");
        return world_reply(cl, f, out);
    }
    return reply(out, 202, "{\"follower\":%lld,\"status\":\"waiting\",\"joined\":%d,\"of\":%d}", f->id, cl->n, cl->cfg.followers);
}

int cluster_hook(void *ud, int route, long long id, long long after, const char *body, size_t len, char **out) {
    cluster *cl = ud;
    (void)len;
    *out = NULL;
    json_object *b = route == API_CLUSTER_DONE ? json_tokener_parse(body) : NULL; /* before the lock */
    pthread_mutex_lock(&cl->mu);
    int st, part = 0;
    follower *f = NULL;
    if (route == API_CLUSTER_JOIN) {
        st = h_join(cl, body, out);
    } else if (!(f = find(cl, id))) {
        st = cl_error(out, 410, "not_found", "no such follower in this epoch: join again");
    } else if (cl->ph == PH_LOST) {
        st = cl_error(out, 410, "rank_lost", cl->lost_msg);
    } else {
        f->last_seen = clock_mono_s();
        if (route == API_CLUSTER_BEAT) {
            st = reply(out, 200, "{\"status\":\"ok\",\"seq\":%lld}", cl->seq);
        } else if (route == API_CLUSTER_NEXT) {
            /* {"seq", "call"} when a call is pending for it, "parts" [{"id", "rank", "desc"}]
             * handed out, "stream" [ids] tapped and "cancel" [ids] released; 204 when none of
             * them came within a second */
            if (!(cl->call && cl->seq > after && f->done_seq < cl->seq) && !parts_for(cl, f)) {
                wait_for(cl, 1.0);
                if (!(f = find(cl, id))) { /* check() may compact the table while mu is free */
                    pthread_mutex_unlock(&cl->mu);
                    return cl_error(out, 410, "not_found", "no such follower in this epoch: join again");
                }
            }
            int call = cl->ph == PH_FORMED && cl->call && cl->seq > after && f->done_seq < cl->seq;
            char *parts = cl->ph == PH_FORMED && parts_for(cl, f) ? parts_json(cl, f) : NULL;
            if (call || (parts && parts[0]))
                st = call ? reply(out, 200, "{\"seq\":%lld,\"call\":%s%s}", cl->seq, cl->call, parts ? parts : "")
                          : reply(out, 200, "{\"seq\":%lld%s}", after, parts);
            else st = 204;
            free(parts);
            f->last_seen = clock_mono_s();
        } else if (field_get(b, "part")) { /* a rollout part's groups: part_done moves them in, unlocked */
            part = 1;
            st = 0;
        } else { /* done {"seq", "rc", "msg"} */
            long long seq = field_int(b, "seq", -1);
            if (seq == cl->seq && f->done_seq < seq) {
                f->done_seq = seq;
                f->done_rc = done_code(b);
                snprintf(f->done_msg, sizeof f->done_msg, "%s", field_str(b, "msg", ""));
                pthread_cond_broadcast(&cl->cv);
                st = reply(out, 200, "{\"status\":\"ok\"}");
            } else {
                st = cl_error(out, 409, "conflict", "not the pending call");
            }
        }
    }
    pthread_mutex_unlock(&cl->mu);
    if (part) st = part_done(cl, id, b, out);
    json_object_put(b);
    return st;
}
