/* ranks.c — rank 0's view of the peer threads (ranks 1..W-1) and the group's communicator;
 * see ranks.h.
 *
 * Each peer has an inbox of commands (add a rollout part, release one, run an SPMD function)
 * and a snapshot of its scheduler (busy, can admit, stats, each part's state) that it writes
 * after each step; both under the peer's mutex. Rank 0 never touches a peer's engine or
 * scheduler: a part's result arrays are written by the peer and read by rank 0 only after the
 * snapshot (read under the mutex) says the part is done. A part that a reply streams
 * (ranks_job_peek) also has a tap in the snapshot: each response's tokens so far, copied by the
 * peer from its result arrays after each step and read by rank 0, both under the mutex. */
#include "daemon/ranks.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "daemon/test_hooks.h"

typedef enum { CMD_ADD, CMD_RELEASE, CMD_CALL, CMD_STOP } cmd_kind;

typedef struct cmd {
    cmd_kind kind;
    ranks_job *job; /* ADD, RELEASE */
    ranks_fn fn; /* CALL */
    void *arg;
    int rc, done; /* CALL, RELEASE: set by the peer (under its mutex) */
    char msg[512];
    struct cmd *next;
} cmd;

/* A streamed peer part's copy of one response's tokens so far. */
typedef struct {
    int *tok;
    float *lp;
    int *top_ids; /* (cap, k) with sampling.top_logprobs k */
    float *top_lps;
    int n, cap;
} tap_buf;

struct ranks_job {
    int rank;
    long long rows;
    long long remote_id; /* a part on a follower's rank (rank >= W) */
    eng_sched_job *j; /* on rank's scheduler: touched by that rank's thread only */
    const eng_rollout_group *g;
    int n;
    const eng_sampling *sp;
    eng_group_result *out;
    /* snapshot (peer parts; under the peer's mutex) */
    int state, started;
    double progress;
    char msg[512];
    tap_buf *tap; /* (responses) once rank 0 peeked; the peer fills it after each step */
    struct ranks_job *next; /* the peer's list of parts (peer thread only) */
};

typedef struct peer {
    ranks *rk;
    int rank;
    pthread_t th;
    int have_th;
    eng_open_opts o;
    eng_sched_opts so;
    eng *e;
    eng_sched *sched;
    ranks_job *parts; /* peer thread only */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* the peer waits for commands */
    pthread_cond_t done_cv; /* rank 0 waits for a command's completion, or the open */
    cmd *head, *tail;
    cmd stop; /* ranks_stop's command: it must outlive the post */
    int pending_adds; /* ADDs posted and not yet taken (counts as busy) */
    int open_rc, opened; /* opened: 1 once eng_open returned */
    comm *nccl; /* under mu: its engine's NCCL comm while open, for ranks_abort */
    char open_msg[512];
    int busy, can_admit; /* snapshot */
    eng_sched_stats st;
    _Atomic long long beat_ns;
} peer;

struct ranks {
    int W;
    eng *e0;
    eng_sched *sched0;
    long long load[RANKS_MAX]; /* KV rows placed and not released, per rank (rank 0's thread) */
    char model_dir[1024], backend[16], resume_dir[1024], lora_targets[128], lora_init[1024], offload[16];
    peer *peers; /* [W], 0 unused */
    /* the communicator (W > 1 only): cpu, rank r's comm is comms[r], ours to free after every
     * engine closed; cuda, the NCCL id every rank's eng_open joins (the engines own their
     * comms), kept here so it outlives the opens */
    comm **comms; /* [W] */
    unsigned char nccl_id[128];
    int nccl;
    int devices[RANKS_MAX], have_devices;
    /* the group's extent (ranks_world): base..base+W-1 of world; world == W, base 0 without one.
     * tcp: every local rank opens its comm to host:port (comm_tcp_open) on its own thread */
    int base, world, tcp, listen_fd;
    char host[256];
    int port;
    double timeout_s;
    ranks_remote remote;
    /* set (with __atomic) by the first rank whose open fails: the others' NCCL set-up waits for
     * every rank and would wait for it forever (eng_open_opts.nccl_cancel); cancel_by: that rank */
    int open_cancel, cancel_by;
    void (*notify)(void *ud);
    void *notify_ud;
    int diverged, stopped;
};

int ranks_size(const ranks *rk) { return rk->W; }

/* ---------------------------------------------------------------- the peer thread */

static void peer_beat(peer *p) { atomic_store(&p->beat_ns, clock_mono_ns()); }
static void peer_progress(void *ud, double f) {
    (void)f;
    peer_beat(ud);
}

/* The tokens job j's responses sampled since the last step into its tap (peer thread, under
 * the mutex): 1 when any arrived. A buffer that cannot grow keeps what it has (the stream gets
 * the rest from the result). */
static int tap_copy(ranks_job *j, int *most) {
    int got = 0;
    for (int k = 0, at = 0; k < j->n; at += j->g[k].n, k++)
        for (int m = 0; j->out[k].resp && m < j->out[k].n; m++) {
            const eng_response *o = &j->out[k].resp[m];
            tap_buf *b = &j->tap[at + m];
            size_t k = o->top_ids ? (size_t)j->sp->top_logprobs : 0, d = (size_t)(o->n_tokens - b->n);
            if (o->n_tokens <= b->n) continue;
            if (o->n_tokens > b->cap) {
                int cap = 2 * o->n_tokens;
                int *t = realloc(b->tok, sizeof *t * (size_t)cap);
                if (t) b->tok = t;
                float *l = t ? realloc(b->lp, sizeof *l * (size_t)cap) : NULL;
                if (l) b->lp = l;
                int *ti = l && k ? realloc(b->top_ids, sizeof *ti * cap * k) : NULL;
                if (ti) b->top_ids = ti;
                float *tl = ti ? realloc(b->top_lps, sizeof *tl * cap * k) : NULL;
                if (tl) b->top_lps = tl;
                if (!l || (k && !tl)) continue;
                b->cap = cap;
            }
            memcpy(b->tok + b->n, o->tokens + b->n, sizeof *b->tok * d);
            memcpy(b->lp + b->n, o->logprobs + b->n, sizeof *b->lp * d);
            if (k) {
                memcpy(b->top_ids + b->n * k, o->top_ids + b->n * k, sizeof(int) * d * k);
                memcpy(b->top_lps + b->n * k, o->top_lps + b->n * k, sizeof(float) * d * k);
            }
            b->n = o->n_tokens;
            got = 1;
            if (b->n > *most) *most = b->n;
        }
    return got;
}

static void peer_snapshot(peer *p) {
    eng_sched_stats st;
    int busy = 0, can = 0, changed = 0, most = 0;
    if (p->sched) {
        eng_sched_get_stats(p->sched, &st);
        busy = eng_sched_busy(p->sched);
        can = eng_sched_can_admit(p->sched);
    } else {
        memset(&st, 0, sizeof st);
    }
    pthread_mutex_lock(&p->mu);
    for (ranks_job *j = p->parts; j; j = j->next) {
        if (!j->j || j->state) continue; /* failed at add, or finished: final */
        if (j->tap) changed |= tap_copy(j, &most); /* a reply streams it: rank 0 wakes to send them */
        const char *msg = NULL;
        j->state = eng_sched_job_state(j->j, &j->progress, &j->started, &msg);
        if (j->state < 0) snprintf(j->msg, sizeof j->msg, "rank %d: %s", p->rank, msg ? msg : "");
        changed |= j->state != 0;
    }
    changed |= p->busy && !busy;
    p->st = st;
    p->busy = busy;
    p->can_admit = can;
    pthread_mutex_unlock(&p->mu);
    if (changed && p->rk->notify) p->rk->notify(p->rk->notify_ud);
    if (most >= 4) test_hook_hold("peer_stream_tokens");
}

static void peer_run(peer *p, cmd *c) {
    switch (c->kind) {
    case CMD_ADD: {
        ranks_job *j = c->job;
        err_clear();
        int rc = eng_sched_add(p->sched, j->g, j->n, j->sp, j->out, &j->j);
        pthread_mutex_lock(&p->mu);
        if (rc) {
            j->state = rc;
            snprintf(j->msg, sizeof j->msg, "rank %d: %s", p->rank, err_msg());
        }
        j->next = p->parts;
        p->parts = j;
        p->pending_adds--;
        pthread_mutex_unlock(&p->mu);
        free(c);
        return;
    }
    case CMD_RELEASE: {
        ranks_job **pp = &p->parts;
        while (*pp && *pp != c->job) pp = &(*pp)->next;
        if (*pp) *pp = c->job->next;
        if (c->job->j) eng_sched_job_release(p->sched, c->job->j);
        c->job->j = NULL;
        break;
    }
    case CMD_CALL:
        err_clear();
        c->rc = p->e ? c->fn(p->e, p->rank, peer_progress, p, c->arg) : err_set(GE_UNAVAILABLE, "rank %d has no engine", p->rank);
        snprintf(c->msg, sizeof c->msg, "%s", err_msg());
        break;
    case CMD_STOP: break;
    }
    pthread_mutex_lock(&p->mu);
    c->done = 1;
    pthread_cond_broadcast(&p->done_cv);
    pthread_mutex_unlock(&p->mu);
}

/* Rank r failed to open: release the ranks waiting in the communicator's set-up; the first
 * failure is the cause, the others' GE_COMM its echo. */
static void cancel_open(ranks *rk, int r) {
    int zero = 0;
    if (__atomic_compare_exchange_n(&rk->open_cancel, &zero, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        __atomic_store_n(&rk->cancel_by, r, __ATOMIC_RELEASE);
}

void ranks_cancel_open(ranks *rk) { cancel_open(rk, 0); }

static void *peer_main(void *arg) {
    peer *p = arg;
    peer_beat(p);
    err_clear();
    int rc = 0;
    if (p->rk->tcp) {
        ranks *rk = p->rk;
        rc = comm_tcp_open(rk->host, rk->port, rk->base + p->rank, rk->world, -1, &rk->open_cancel, rk->timeout_s,
                           &rk->comms[p->rank]);
        p->o.comm = rc ? NULL : rk->comms[p->rank];
    }
    if (!rc) rc = eng_open(&p->o, &p->e);
    if (!rc) rc = eng_sched_open(p->e, &p->so, &p->sched);
    if (rc) cancel_open(p->rk, p->rank);
    pthread_mutex_lock(&p->mu);
    p->open_rc = rc;
    p->opened = 1;
    p->nccl = !rc && p->rk->nccl ? eng_comm(p->e) : NULL;
    snprintf(p->open_msg, sizeof p->open_msg, "%s", rc ? (err_msg()[0] ? err_msg() : err_default(rc)) : "");
    pthread_cond_broadcast(&p->done_cv);
    pthread_mutex_unlock(&p->mu);
    peer_snapshot(p);
    for (int stop = 0; !stop;) {
        peer_beat(p);
        pthread_mutex_lock(&p->mu);
        cmd *c = p->head;
        p->head = p->tail = NULL;
        pthread_mutex_unlock(&p->mu);
        while (c) {
            cmd *next = c->next;
            if (c->kind == CMD_STOP) stop = 1;
            peer_run(p, c); /* an ADD frees c; the others are the poster's */
            c = next;
        }
        int busy = p->sched && eng_sched_busy(p->sched);
        if (busy) {
            eng_sched_step(p->sched);
            peer_beat(p);
        }
        peer_snapshot(p);
        if (busy || stop) continue;
        pthread_mutex_lock(&p->mu);
        if (!p->head) {
            struct timespec ts;
            clock_wall_after(0.1, &ts);
            pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        }
        pthread_mutex_unlock(&p->mu);
    }
    while (p->parts) { /* rank 0 released its parts; these are strays */
        ranks_job *j = p->parts;
        p->parts = j->next;
        if (j->j) eng_sched_job_release(p->sched, j->j);
        j->j = NULL;
    }
    eng_sched_close(p->sched);
    p->sched = NULL;
    pthread_mutex_lock(&p->mu);
    p->nccl = NULL; /* ranks_abort must not reach a comm eng_close frees */
    pthread_mutex_unlock(&p->mu);
    eng_close(p->e);
    p->e = NULL;
    return NULL;
}

/* Posts c to peer p; with wait, blocks until the peer ran it (c stays the caller's). */
static void post(peer *p, cmd *c, int wait) {
    c->next = NULL;
    c->done = 0;
    pthread_mutex_lock(&p->mu);
    if (p->tail) p->tail->next = c;
    else p->head = c;
    p->tail = c;
    if (c->kind == CMD_ADD) p->pending_adds++;
    pthread_cond_signal(&p->cv);
    while (wait && !c->done) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

static void wait_done(peer *p, cmd *c) {
    pthread_mutex_lock(&p->mu);
    while (!c->done) pthread_cond_wait(&p->done_cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

/* ---------------------------------------------------------------- the group */

/* The communicator of W > 1 ranks; W = 1 makes none, so one rank takes the engine's
 * single-rank path, byte-identical to a daemon without ranks. */
static int group_open(ranks *rk, const ranks_world *wd) {
    if (rk->world == 1) return 0;
    if (!strcmp(rk->backend, "cuda")) {
        rk->nccl = 1;
        if (wd) {
            memcpy(rk->nccl_id, wd->nccl_id, sizeof rk->nccl_id);
            return 0;
        }
        return comm_nccl_unique_id(rk->nccl_id);
    }
    if (!(rk->comms = calloc((size_t)rk->W, sizeof *rk->comms))) return err_set(GE_NOMEM, "ranks: out of memory");
    if (wd) { /* one tcp group for the whole world: opened on each rank's thread */
        rk->tcp = 1;
        return 0;
    }
    int rc = comm_cpu_group(rk->W, rk->comms);
    if (rc) memset(rk->comms, 0, (size_t)rk->W * sizeof *rk->comms); /* it freed what it made */
    return rc;
}

/* Rank r's device and communicator into o. */
static void rank_opts(const ranks *rk, int r, eng_open_opts *o) {
    if (rk->have_devices) o->device = rk->devices[r];
    else if (rk->nccl) o->device = r;
    if (rk->world == 1) return;
    o->backend = rk->backend;
    if (rk->comms) {
        o->comm = rk->comms[r];
    } else {
        o->nccl_id = rk->nccl_id;
        o->rank = rk->base + r;
        o->world = rk->world;
        o->nccl_cancel = &rk->open_cancel;
    }
}


const char *ranks_comm_name(const ranks *rk) { return rk->tcp ? "tcp" : rk->comms ? "cpu" : rk->nccl ? "nccl" : "none"; }

/* ---------------------------------------------------------------- lifecycle */

int ranks_start(int W, const eng_open_opts *o, const int *devices, const eng_sched_opts *so, void (*notify)(void *ud), void *ud,
                const ranks_world *wd, ranks **out) {
    *out = NULL;
    if (W < 1 || W > RANKS_MAX) return err_set(GE_INVALID, "ranks: %d ranks (1..%d)", W, RANKS_MAX);
    if (wd && (wd->base < 0 || wd->base + W > wd->world)) {
        if (wd->listen_fd >= 0) close(wd->listen_fd);
        return err_set(GE_INVALID, "ranks: ranks %d..%d of a world of %d", wd->base, wd->base + W - 1, wd->world);
    }
    ranks *rk = calloc(1, sizeof *rk);
    if (!rk || !(rk->peers = calloc((size_t)W, sizeof *rk->peers))) {
        free(rk);
        if (wd && wd->listen_fd >= 0) close(wd->listen_fd);
        return err_set(GE_NOMEM, "ranks: out of memory");
    }
    rk->W = W;
    rk->world = wd ? wd->world : W;
    rk->base = wd ? wd->base : 0;
    rk->listen_fd = wd ? wd->listen_fd : -1;
    rk->timeout_s = wd ? wd->timeout_s : 0;
    rk->port = wd ? wd->port : 0;
    snprintf(rk->host, sizeof rk->host, "%s", wd && wd->host ? wd->host : "");
    rk->notify = notify;
    rk->notify_ud = ud;
    snprintf(rk->model_dir, sizeof rk->model_dir, "%s", o->model_dir ? o->model_dir : "");
    snprintf(rk->backend, sizeof rk->backend, "%s", o->backend ? o->backend : "auto");
    snprintf(rk->resume_dir, sizeof rk->resume_dir, "%s", o->resume_dir ? o->resume_dir : "");
    snprintf(rk->lora_targets, sizeof rk->lora_targets, "%s", o->lora_targets ? o->lora_targets : "");
    snprintf(rk->lora_init, sizeof rk->lora_init, "%s", o->lora_init ? o->lora_init : "");
    snprintf(rk->offload, sizeof rk->offload, "%s", o->optimizer_offload ? o->optimizer_offload : "auto");
    /* every rank must make the same kind of communicator: "auto" as eng_open resolves it */
    if (rk->world > 1) snprintf(rk->backend, sizeof rk->backend, "%s", eng_backend_resolve(o->backend));
    if (devices) {
        memcpy(rk->devices, devices, (size_t)W * sizeof *devices);
        rk->have_devices = 1;
    }
    int rc = group_open(rk, wd);
    if (rc) {
        if (rk->listen_fd >= 0) close(rk->listen_fd);
        ranks_close(rk);
        return rc;
    }
    for (int r = 1; r < W; r++) {
        peer *p = &rk->peers[r];
        p->rk = rk;
        p->rank = r;
        p->o = *o;
        p->o.model_dir = rk->model_dir;
        p->o.backend = rk->backend;
        p->o.resume_dir = rk->resume_dir[0] ? rk->resume_dir : NULL;
        p->o.lora_targets = rk->lora_targets;
        p->o.lora_init = rk->lora_init;
        p->o.optimizer_offload = rk->offload;
        rank_opts(rk, r, &p->o);
        p->so = *so;
        pthread_mutex_init(&p->mu, NULL);
        pthread_cond_init(&p->cv, NULL);
        pthread_cond_init(&p->done_cv, NULL);
        peer_beat(p);
        if (pthread_create(&p->th, NULL, peer_main, p)) {
            ranks_close(rk);
            return err_set(GE_INTERNAL, "cannot start the thread of rank %d", r);
        }
        p->have_th = 1;
    }
    if (rk->tcp) { /* rank 0's end, here: blocks until the whole world connected */
        int fd = rk->listen_fd;
        rk->listen_fd = -1; /* comm_tcp_open's, whatever it returns */
        rc = comm_tcp_open(rk->host, rk->port, rk->base, rk->world, rk->base == 0 ? fd : -1, &rk->open_cancel, rk->timeout_s,
                           &rk->comms[0]);
        if (rk->base != 0 && fd >= 0) close(fd);
        if (rc) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", err_msg());
            cancel_open(rk, 0);
            ranks_close(rk);
            return err_set(rc, "rank 0's communicator: %s", msg);
        }
    }
    *out = rk;
    return 0;
}

static int wait_open(ranks *rk) {
    for (int r = 1; r < rk->W; r++) { /* all of them: none may still be opening when this returns */
        peer *p = &rk->peers[r];
        pthread_mutex_lock(&p->mu);
        while (!p->opened) pthread_cond_wait(&p->done_cv, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
    /* the rank that failed first is the cause (cancel_open); the others' GE_COMM is its echo */
    int rc = 0, first = __atomic_load_n(&rk->open_cancel, __ATOMIC_ACQUIRE) ? __atomic_load_n(&rk->cancel_by, __ATOMIC_ACQUIRE) : 0;
    for (int k = 0; k < rk->W && !rc; k++) {
        int r = k == 0 ? first : k;
        if (r > 0 && rk->peers[r].open_rc) rc = err_set(rk->peers[r].open_rc, "rank %d: %s", r, rk->peers[r].open_msg);
    }
    return rc;
}

int ranks_open_rank0(ranks *rk, eng_open_opts *o, eng **e) {
    rank_opts(rk, 0, o);
    int rc = eng_open(o, e);
    char msg[512];
    if (rc) {
        snprintf(msg, sizeof msg, "%s", err_msg()[0] ? err_msg() : err_default(rc));
        cancel_open(rk, 0);
    }
    int prc = wait_open(rk); /* none may still be opening when this returns */
    if (rc) return err_set(rc, "%s", msg); /* the cause, not a peer's echo of the cancel */
    return prc;
}

void ranks_set_rank0(ranks *rk, eng *e, eng_sched *sched) {
    rk->e0 = e;
    rk->sched0 = sched;
}

int ranks_diverged(const ranks *rk) { return rk->diverged; }

void ranks_stop(ranks *rk) {
    if (!rk || rk->stopped) return;
    rk->stopped = 1;
    for (int r = 1; r < rk->W; r++) {
        peer *p = &rk->peers[r];
        if (!p->have_th) continue;
        p->stop = (cmd){.kind = CMD_STOP};
        post(p, &p->stop, 0);
    }
}

void ranks_close(ranks *rk) {
    if (!rk) return;
    ranks_stop(rk);
    for (int r = 1; r < rk->W; r++) {
        peer *p = &rk->peers[r];
        if (p->have_th) pthread_join(p->th, NULL);
    }
    for (int r = 1; r < rk->W; r++) {
        peer *p = &rk->peers[r];
        if (!p->rk) continue;
        pthread_cond_destroy(&p->done_cv);
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
    }
    for (int r = 0; rk->comms && r < rk->W; r++) comm_free(rk->comms[r]); /* every engine is closed */
    free(rk->comms);
    free(rk->peers);
    free(rk);
}

/* ---------------------------------------------------------------- SPMD */

void ranks_set_remote(ranks *rk, const ranks_remote *r) { rk->remote = *r; }
int ranks_has_remote(const ranks *rk) { return rk && rk->remote.post != NULL; }

void ranks_abort(ranks *rk) {
    if (!rk) return;
    for (int r = 0; rk->comms && r < rk->W; r++)
        if (rk->comms[r]) comm_abort(rk->comms[r]);
    if (rk->nccl && rk->e0 && eng_comm(rk->e0)) comm_abort(eng_comm(rk->e0));
    /* every local rank waits in the collective: an NCCL abort does not reach the others */
    for (int r = 1; rk->nccl && r < rk->W; r++) {
        peer *p = &rk->peers[r];
        pthread_mutex_lock(&p->mu);
        if (p->nccl) comm_abort(p->nccl);
        pthread_mutex_unlock(&p->mu);
    }
}

int ranks_spmd(ranks *rk, ranks_fn fn, void *arg, eng_progress_cb cb0, void *ud0) {
    return ranks_spmd_call(rk, fn, arg, cb0, ud0, NULL);
}

int ranks_spmd_call(ranks *rk, ranks_fn fn, void *arg, eng_progress_cb cb0, void *ud0, const char *call) {
    long long seq = -1;
    if (rk->remote.post) {
        if (!call) return err_set(GE_INTERNAL, "ranks: an SPMD call without a description cannot run on the followers");
        int prc = rk->remote.post(rk->remote.ud, call, &seq);
        if (prc) return prc;
    }
    cmd *cs = rk->W > 1 ? calloc((size_t)rk->W, sizeof *cs) : NULL;
    if (rk->W > 1 && !cs) return err_set(GE_NOMEM, "ranks: out of memory");
    for (int r = 1; r < rk->W; r++) {
        cs[r] = (cmd){.kind = CMD_CALL, .fn = fn, .arg = arg};
        post(&rk->peers[r], &cs[r], 0);
    }
    err_clear();
    int rc0 = fn(rk->e0, 0, cb0, ud0, arg);
    char msg0[512];
    snprintf(msg0, sizeof msg0, "%s", err_msg());
    int bad = 0;
    for (int r = 1; r < rk->W; r++) {
        wait_done(&rk->peers[r], &cs[r]);
        if (cs[r].rc != rc0 && !bad) bad = r;
    }
    int rrc = 0;
    char rmsg[512] = "";
    if (rk->remote.wait) rrc = rk->remote.wait(rk->remote.ud, seq, rmsg, sizeof rmsg);
    int rc = rc0;
    if (rrc == GE_RANK_LOST) { /* the local ranks' GE_COMM is its echo (the comms were aborted) */
        free(cs);
        return err_set(rrc, "%s", rmsg);
    }
    if (!bad && rk->remote.wait && rrc != rc0) {
        rk->diverged = 1;
        rc = err_set(GE_INTERNAL, "the ranks disagree: rank 0 returned %s (%s), a follower %s (%s)", rc0 ? err_name(rc0) : "ok",
                     msg0, rrc ? err_name(rrc) : "ok", rmsg);
    } else if (bad) {
        rk->diverged = 1;
        rc = err_set(GE_INTERNAL, "the ranks disagree: rank 0 returned %s (%s), rank %d %s (%s)", rc0 ? err_name(rc0) : "ok",
                     msg0, bad, cs[bad].rc ? err_name(cs[bad].rc) : "ok", cs[bad].msg);
    } else if (rc0) {
        err_set(rc0, "%s", msg0);
    }
    free(cs);
    return rc;
}

/* ---------------------------------------------------------------- rollouts */

int ranks_placeable(const ranks *rk) { return rk->remote.part_add ? rk->world : rk->W; }
int ranks_is_remote(const ranks *rk, int r) { return r >= rk->W; }

void ranks_notify(ranks *rk) {
    if (rk && rk->notify) rk->notify(rk->notify_ud);
}

void ranks_place(ranks *rk, const long long *rows, int n, int *rank_of) {
    long long load[RANKS_MAX];
    memcpy(load, rk->load, sizeof load);
    const int R = ranks_placeable(rk);
    for (int i = 0; i < n; i++) {
        int best = 0;
        for (int r = 1; r < R; r++)
            if (load[r] < load[best]) best = r;
        rank_of[i] = best;
        load[best] += rows[i];
    }
}

int ranks_add(ranks *rk, int r, const eng_rollout_group *g, int n, const eng_sampling *sp, eng_group_result *out, long long rows,
              const char *desc, ranks_job **job) {
    *job = NULL;
    if (r < 0 || r >= ranks_placeable(rk)) return err_set(GE_INVALID, "ranks: no rank %d", r);
    ranks_job *j = calloc(1, sizeof *j);
    if (!j) return err_set(GE_NOMEM, "ranks: out of memory");
    *j = (ranks_job){.rank = r, .rows = rows, .g = g, .n = n, .sp = sp, .out = out};
    if (r >= rk->W) {
        int rc = rk->remote.part_add(rk->remote.ud, r, desc, sp->top_logprobs, out, n, &j->remote_id);
        if (rc) {
            free(j);
            return rc;
        }
    } else if (r == 0) {
        int rc = eng_sched_add(rk->sched0, g, n, sp, out, &j->j);
        if (rc) {
            free(j);
            return rc;
        }
    } else {
        cmd *c = calloc(1, sizeof *c);
        if (!c) {
            free(j);
            return err_set(GE_NOMEM, "ranks: out of memory");
        }
        c->kind = CMD_ADD;
        c->job = j;
        post(&rk->peers[r], c, 0); /* the peer frees c */
    }
    rk->load[r] += rows;
    *job = j;
    return 0;
}

int ranks_job_state(ranks *rk, ranks_job *j, double *progress, int *started, const char **msg) {
    if (j->rank == 0) return eng_sched_job_state(j->j, progress, started, msg);
    if (j->rank >= rk->W) { /* a follower's: handed out, so taken as started (it is not requeued) */
        int st = rk->remote.part_state(rk->remote.ud, j->remote_id, j->msg, sizeof j->msg);
        if (progress) *progress = st == 1;
        if (started) *started = 1;
        *msg = j->msg;
        return st;
    }
    peer *p = &rk->peers[j->rank];
    pthread_mutex_lock(&p->mu);
    int st = j->state;
    if (progress) *progress = j->progress;
    if (started) *started = j->started;
    *msg = j->msg; /* final once st != 0: the peer writes it no more */
    pthread_mutex_unlock(&p->mu);
    return st;
}

void ranks_job_peek(ranks *rk, ranks_job *j, ranks_peek_cb fn, void *ud) {
    if (j->rank >= rk->W) { /* a follower's: what it sent so far */
        if (rk->remote.part_peek) rk->remote.part_peek(rk->remote.ud, j->remote_id, fn, ud);
        return;
    }
    if (j->rank == 0) {
        for (int k = 0; j->j && k < j->n; k++)
            for (int m = 0; j->out[k].resp && m < j->out[k].n; m++) {
                const eng_response *o = &j->out[k].resp[m];
                if (o->n_tokens > 0) fn(ud, k, m, o, o->top_ids ? j->sp->top_logprobs : 0);
            }
        return;
    }
    peer *p = &rk->peers[j->rank];
    int total = 0;
    for (int k = 0; k < j->n; k++) total += j->g[k].n;
    pthread_mutex_lock(&p->mu);
    if (!j->tap) j->tap = calloc((size_t)(total ? total : 1), sizeof *j->tap); /* NULL: nothing streams */
    for (int k = 0, at = 0; j->tap && k < j->n; at += j->g[k].n, k++)
        for (int m = 0; m < j->g[k].n; m++) {
            const tap_buf *b = &j->tap[at + m];
            eng_response x = {.tokens = b->tok, .logprobs = b->lp, .n_tokens = b->n, .top_ids = b->top_ids, .top_lps = b->top_lps};
            if (b->n > 0) fn(ud, k, m, &x, b->top_ids ? j->sp->top_logprobs : 0);
        }
    pthread_mutex_unlock(&p->mu);
}

void ranks_job_release(ranks *rk, ranks_job *j) {
    if (!j) return;
    if (j->rank >= rk->W) {
        rk->remote.part_release(rk->remote.ud, j->remote_id);
    } else if (j->rank == 0) {
        if (j->j) eng_sched_job_release(rk->sched0, j->j);
    } else {
        cmd c = {.kind = CMD_RELEASE, .job = j};
        post(&rk->peers[j->rank], &c, 1);
    }
    rk->load[j->rank] -= j->rows;
    if (j->tap) { /* the release above waited for the peer: it touches j no more */
        int total = 0;
        for (int k = 0; k < j->n; k++) total += j->g[k].n;
        for (int i = 0; i < total; i++) free(j->tap[i].tok), free(j->tap[i].lp), free(j->tap[i].top_ids), free(j->tap[i].top_lps);
        free(j->tap);
    }
    free(j);
}

int ranks_step(ranks *rk) { return eng_sched_busy(rk->sched0) ? eng_sched_step(rk->sched0) : 0; }

int ranks_busy(ranks *rk) {
    int busy = eng_sched_busy(rk->sched0);
    /* a follower's part in flight: its rows count against its rank until released */
    for (int r = rk->W; r < ranks_placeable(rk) && !busy; r++) busy = rk->load[r] > 0;
    for (int r = 1; r < rk->W && !busy; r++) {
        peer *p = &rk->peers[r];
        pthread_mutex_lock(&p->mu);
        busy = p->busy || p->pending_adds > 0;
        pthread_mutex_unlock(&p->mu);
    }
    return busy;
}

int ranks_can_admit(ranks *rk) {
    int can = eng_sched_can_admit(rk->sched0);
    if (!can && rk->remote.part_add) {
        eng_sched_stats st;
        eng_sched_get_stats(rk->sched0, &st);
        for (int r = rk->W; r < rk->world && !can; r++) can = rk->load[r] < st.rows_cap;
    }
    for (int r = 1; r < rk->W && !can; r++) {
        peer *p = &rk->peers[r];
        pthread_mutex_lock(&p->mu);
        can = p->can_admit && p->pending_adds == 0;
        pthread_mutex_unlock(&p->mu);
    }
    return can;
}

int ranks_stats(ranks *rk, eng_sched_stats *st, int max) {
    if (max > 0) eng_sched_get_stats(rk->sched0, &st[0]);
    for (int r = 1; r < rk->W && r < max; r++) {
        peer *p = &rk->peers[r];
        pthread_mutex_lock(&p->mu);
        st[r] = p->st;
        pthread_mutex_unlock(&p->mu);
    }
    return rk->W;
}

double ranks_heartbeat_age(ranks *rk) {
    long long now = clock_mono_ns(), oldest = now;
    for (int r = 1; rk && r < rk->W; r++) {
        long long b = atomic_load(&rk->peers[r].beat_ns);
        if (b < oldest) oldest = b;
    }
    return (double)(now - oldest) * 1e-9;
}
