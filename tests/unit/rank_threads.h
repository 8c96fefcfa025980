/* rank_threads.h — W engine ranks as threads of one process over a cpu comm group, for the unit
 * tests of several ranks (test_dp.c, test_ep.c). A test's job type begins with a rank_head; the
 * test's op function runs head.op (RANK_OPEN, or its own codes from RANK_OPS on) on head.e and
 * returns 0 or an error code; RANK_SAVE and RANK_CLOSE are run here. head.msg keeps the error
 * text of a failed op.
 * The wait for an op is bounded: a rank left waiting in a collective that another rank never
 * enters (a code path taken on some ranks only) would wait forever, as the cpu comm's barrier
 * does by design (comm.h: comm_abort is its only way out). Past rank_bound_s the group is
 * aborted, so such a rank returns GE_COMM and the op fails naming it; a rank that does not end
 * even then (not in a collective) ends the binary with a FAIL line. After one such op, later ops
 * wait RANK_BOUND_AFTER_S (a run that already failed, ended sooner). */
#ifndef GRPOD_RANK_THREADS_H
#define GRPOD_RANK_THREADS_H
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "engine/dist/comm.h"
#include "engine/engine.h"

enum { RANK_WMAX = 8, RANK_OPEN = 0, RANK_SAVE, RANK_CLOSE, RANK_OPS };
/* seconds an op may take on every rank (an op here takes well under one; the sanitizers' runs
 * tens of times that), then after an abort of the group */
#ifndef RANK_BOUND_S
#define RANK_BOUND_S 120
#endif
enum { RANK_BOUND_AFTER_S = 15, RANK_ABORT_S = 30 };
static int rank_bound_s = RANK_BOUND_S; /* a test may lower it (its own hang, on purpose) */
static int rank_hung; /* an op outlived its bound in this binary */

typedef struct rank_head rank_head;
struct rank_head {
    comm *c;
    eng *e;
    int op, k;
    const char *dir; /* RANK_OPEN: the checkpoint to resume (or NULL); RANK_SAVE: where */
    int (*fn)(rank_head *h); /* the test's ops */
    int rc, done; /* done: set (atomically) once rc and msg are */
    char msg[256];
};

static inline void *rank_thread(void *p) {
    rank_head *h = (rank_head *)p;
    switch (h->op) {
    case RANK_SAVE: h->rc = eng_checkpoint_save(h->e, h->dir); break;
    case RANK_CLOSE:
        eng_close(h->e);
        h->e = NULL;
        h->rc = 0;
        break;
    default: h->rc = h->fn(h);
    }
    snprintf(h->msg, sizeof h->msg, "%s", h->rc ? err_msg() : "");
    __atomic_store_n(&h->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* The W jobs `size` bytes apart, each a rank_head first. */
static inline rank_head *rank_at(void *jobs, size_t size, int q) { return (rank_head *)((char *)jobs + (size_t)q * size); }

/* Waits up to s seconds for every rank's op to end; the count of those still running. */
static inline int rank_wait(void *jobs, size_t size, int W, int s) {
    int left = W;
    for (long t = 0; left && t <= 100L * s; t++) {
        left = 0;
        for (int q = 0; q < W; q++) left += !__atomic_load_n(&rank_at(jobs, size, q)->done, __ATOMIC_ACQUIRE);
        if (left) usleep(10000);
    }
    return left;
}

/* Runs fn on every rank at once with op, k and dir in its head; 0 when all left rc 0 (each
 * failing rank printed), 1 when not, also when the op outlived the bound (the group aborted). */
static inline int rank_all(void *jobs, size_t size, int W, int op, int k, const char *dir) {
    pthread_t th[RANK_WMAX];
    for (int q = 0; q < W; q++) {
        rank_head *h = rank_at(jobs, size, q);
        h->op = op;
        h->k = k;
        h->dir = dir;
        h->done = 0;
        pthread_create(&th[q], NULL, rank_thread, h);
    }
    int bound = rank_hung ? RANK_BOUND_AFTER_S : rank_bound_s, bad = 0;
    if (rank_wait(jobs, size, W, bound)) {
        rank_hung = bad = 1;
        for (int q = 0; q < W; q++)
            if (!__atomic_load_n(&rank_at(jobs, size, q)->done, __ATOMIC_ACQUIRE))
                printf("  rank %d op %d: still running after %d s: the group is aborted (a collective the other ranks "
                       "never entered?)\n",
                       q, op, bound);
        for (int q = 0; q < W; q++)
            if (rank_at(jobs, size, q)->c) comm_abort(rank_at(jobs, size, q)->c); /* one group: the first aborts it */
        if (rank_wait(jobs, size, W, RANK_ABORT_S)) {
            printf("FAIL rank_all: op %d did not end %d s after its group was aborted: the binary stops here\n", op, RANK_ABORT_S);
            fflush(stdout);
            _exit(1);
        }
    }
    for (int q = 0; q < W; q++) {
        pthread_join(th[q], NULL);
        rank_head *h = rank_at(jobs, size, q);
        if (h->rc) {
            printf("  rank %d op %d: rc %d: %s\n", q, op, h->rc, h->msg);
            bad = 1;
        }
    }
    return bad;
}

/* W ranks: a cpu comm group in cs and RANK_OPEN on each with the test's op function fn (resume:
 * a checkpoint or NULL); 0 or -1. */
static inline int rank_open_world(void *jobs, size_t size, int W, int (*fn)(rank_head *), comm **cs, const char *resume) {
    memset(jobs, 0, (size_t)W * size);
    if (W > RANK_WMAX || comm_cpu_group(W, cs)) return -1;
    for (int q = 0; q < W; q++) {
        rank_at(jobs, size, q)->c = cs[q];
        rank_at(jobs, size, q)->fn = fn;
    }
    return rank_all(jobs, size, W, RANK_OPEN, 0, resume) ? -1 : 0;
}

static inline void rank_close_world(void *jobs, size_t size, int W, comm **cs) {
    rank_all(jobs, size, W, RANK_CLOSE, 0, NULL);
    for (int q = 0; q < W; q++) comm_free(cs[q]);
}
#endif
