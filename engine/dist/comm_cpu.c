/* comm_cpu.c — the cpu comm (comm.h): W ranks as threads of one process.
 *
 * A collective is two phases around a barrier: every rank posts its buffer pointers and waits
 * until all have; each rank then computes its own output reading the others' inputs (sums in
 * rank order 0..W-1, fp32 accumulator, so every rank and every run gets the same bits); a
 * second barrier keeps the inputs alive until everyone has read them. In-place forms are safe:
 * a rank writes only its own output, and where that aliases its input (all-reduce) it sums into
 * a private buffer first and copies after the second barrier.
 *
 * An all-to-all-v posts its counts beside its buffers; every rank checks the whole matrix (the
 * same verdict on every rank) and copies the parts addressed to it.
 *
 * Abort: a flag under the group's mutex; the barrier wakes every waiter and returns GE_COMM, and
 * every later call returns it at once. A rank that aborts mid-collective may leave the others'
 * outputs half-written; they return GE_COMM and the caller must not use them.
 * Threading: each rank's comm from one thread at a time; comm_abort from any thread. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/dist/comm.h"
#include "engine/dist/comm_internal.h"
#include "common/bf16.h"

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int W, arrived, aborted, refs;
    unsigned gen;
    const void **in; /* (W) posted input pointers */
    void **out; /* (W) posted output pointers */
    const size_t **send, **recv; /* (W) posted all-to-all-v counts */
} cgroup;

static int bar(cgroup *g) {
    pthread_mutex_lock(&g->mu);
    if (g->aborted) {
        pthread_mutex_unlock(&g->mu);
        return err_set(GE_COMM, "comm: the group was aborted");
    }
    unsigned gen = g->gen;
    if (++g->arrived == g->W) {
        g->arrived = 0;
        g->gen++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (g->gen == gen && !g->aborted) pthread_cond_wait(&g->cv, &g->mu);
    }
    int ab = g->gen == gen && g->aborted; /* released by the abort, not by the last arrival */
    pthread_mutex_unlock(&g->mu);
    return ab ? err_set(GE_COMM, "comm: the group was aborted") : 0;
}

static int post(comm *c, const void *in, void *out) {
    cgroup *g = c->impl;
    g->in[c->rank] = in;
    g->out[c->rank] = out;
    return bar(g);
}


/* The rank-order sum (comm_internal.h): the cpu comm's arithmetic, which comm_tcp.c shares. */
void comm_sum_ranks(void *dst, const void *const *in, int W, size_t off, size_t n, comm_type t) {
    if (t == COMM_I32) {
        for (size_t i = 0; i < n; i++) {
            int32_t s = 0;
            for (int q = 0; q < W; q++) s += ((const int32_t *)in[q])[off + i];
            ((int32_t *)dst)[i] = s;
        }
    } else if (t == COMM_F32) {
        for (size_t i = 0; i < n; i++) {
            float s = 0;
            for (int q = 0; q < W; q++) s += ((const float *)in[q])[off + i];
            ((float *)dst)[i] = s;
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float s = 0;
            for (int q = 0; q < W; q++) s += f32_from_bf16(((const uint16_t *)in[q])[off + i]);
            ((uint16_t *)dst)[i] = bf16_from_f32(s);
        }
    }
}

static int cpu_all_reduce(comm *c, void *buf, size_t n, comm_type t) {
    cgroup *g = c->impl;
    size_t eb = comm_type_bytes(t);
    void *tmp = malloc(n * eb + 1);
    if (!tmp) return err_set(GE_NOMEM, "comm: all-reduce of %zu elements: out of memory", n);
    int rc = post(c, buf, buf);
    if (!rc) comm_sum_ranks(tmp, g->in, g->W, 0, n, t);
    if (!rc) rc = bar(g);
    if (!rc) memcpy(buf, tmp, n * eb);
    free(tmp);
    return rc;
}

static int cpu_reduce_scatter(comm *c, const void *in, void *out, size_t n, comm_type t) {
    cgroup *g = c->impl;
    int rc = post(c, in, out);
    if (!rc) comm_sum_ranks(out, g->in, g->W, (size_t)c->rank * n, n, t); /* aliasing: element i read then written */
    return rc ? rc : bar(g);
}

static int cpu_all_gather(comm *c, const void *in, void *out, size_t n, comm_type t) {
    cgroup *g = c->impl;
    size_t eb = comm_type_bytes(t);
    int rc = post(c, in, out);
    for (int q = 0; !rc && q < g->W; q++) {
        char *dst = (char *)out + (size_t)q * n * eb;
        if (dst != g->in[q]) memcpy(dst, g->in[q], n * eb);
    }
    return rc ? rc : bar(g);
}

static int cpu_broadcast(comm *c, void *buf, size_t n, comm_type t, int root) {
    cgroup *g = c->impl;
    int rc = post(c, buf, buf);
    if (!rc && c->rank != root) memcpy(buf, g->in[root], n * comm_type_bytes(t));
    return rc ? rc : bar(g);
}

int comm_check_a2a_counts(const size_t *const *send, const size_t *const *recv, int W) {
    for (int r = 0; r < W; r++)
        for (int q = 0; q < W; q++)
            if (recv[r][q] != send[q][r])
                return err_set(GE_INVALID, "comm: all-to-all-v: rank %d sends rank %d %zu elements, which expects %zu", q, r,
                               send[q][r], recv[r][q]);
    return 0;
}

/* Every rank checks the whole matrix of counts (the same verdict everywhere), then copies its
 * part from each rank's input: rank q's part for r starts after q's parts for ranks < r. */
static int cpu_all_to_all_v(comm *c, const void *in, const size_t *send, void *out, const size_t *recv, comm_type t) {
    cgroup *g = c->impl;
    size_t eb = comm_type_bytes(t);
    g->send[c->rank] = send;
    g->recv[c->rank] = recv;
    int rc = post(c, in, out), bad = rc ? 0 : comm_check_a2a_counts(g->send, g->recv, g->W);
    size_t at = 0; /* bytes of out written; pointers formed only for parts that exist (out may be NULL) */
    for (int q = 0; !rc && !bad && q < g->W; q++) {
        size_t off = 0;
        for (int j = 0; j < c->rank; j++) off += g->send[q][j];
        if (recv[q]) memcpy((char *)out + at, (const char *)g->in[q] + off * eb, recv[q] * eb);
        at += recv[q] * eb;
    }
    if (!rc) rc = bar(g);
    return rc ? rc : bad;
}

static int cpu_barrier(comm *c) { return bar(c->impl); }

static void cpu_abort(comm *c) {
    cgroup *g = c->impl;
    pthread_mutex_lock(&g->mu);
    g->aborted = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void group_unref(cgroup *g) {
    pthread_mutex_lock(&g->mu);
    int last = --g->refs == 0;
    pthread_mutex_unlock(&g->mu);
    if (!last) return;
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g->in);
    free(g->out);
    free(g->send);
    free(g->recv);
    free(g);
}

static void cpu_free(comm *c) {
    group_unref(c->impl);
    free(c);
}

static const comm_ops cpu_ops = {cpu_all_reduce,   cpu_reduce_scatter, cpu_all_gather, cpu_broadcast,
                                 cpu_all_to_all_v, cpu_barrier,        cpu_abort,      cpu_free};

int comm_cpu_group(int W, comm **out) {
    if (W < 1) return err_set(GE_INVALID, "comm: %d ranks", W);
    cgroup *g = calloc(1, sizeof *g);
    if (!g) return err_set(GE_NOMEM, "comm: out of memory");
    g->W = W;
    g->in = calloc((size_t)W, sizeof *g->in);
    g->out = calloc((size_t)W, sizeof *g->out);
    g->send = calloc((size_t)W, sizeof *g->send);
    g->recv = calloc((size_t)W, sizeof *g->recv);
    if (!g->in || !g->out || !g->send || !g->recv) {
        free(g->in);
        free(g->out);
        free(g->send);
        free(g->recv);
        free(g);
        return err_set(GE_NOMEM, "comm: out of memory");
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    for (int r = 0; r < W; r++) {
        comm *c = calloc(1, sizeof *c);
        if (!c) {
            for (int q = 0; q < r; q++) comm_free(out[q]);
            if (!r) {
                pthread_cond_destroy(&g->cv);
                pthread_mutex_destroy(&g->mu);
                free(g->in);
                free(g->out);
                free(g->send);
                free(g->recv);
                free(g);
            }
            return err_set(GE_NOMEM, "comm: out of memory");
        }
        *c = (comm){.ops = &cpu_ops, .rank = r, .size = W, .impl = g};
        g->refs++;
        out[r] = c;
    }
    return 0;
}
