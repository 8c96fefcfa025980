/* comm_harness.h — what the comm tests share (tests/unit/test_comm.c, test_comm_tcp.c): random
 * inputs of each comm type (f32 and bf16 values with fractions that round when summed, i32 up to
 * ±1e6, any u8), one rank's call of a collective, run on its own thread, and an all-to-all-v on
 * W ranks checked against the parts it must move. */
#ifndef GRPOD_COMM_HARNESS_H
#define GRPOD_COMM_HARNESS_H
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

#include "engine/dist/comm.h"
#include "common/bf16.h"
#include "kernels/adamw.h"

static uint64_t rng_state; /* the tests seed it */
static inline uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng_state >> 33);
}

/* p (n elements of t) = random values. */
static inline void fill(void *p, size_t n, comm_type t) {
    for (size_t j = 0; j < n; j++) {
        float f = (float)((int)(rnd() % 20001) - 10000) / 997.0f;
        if (t == COMM_F32) ((float *)p)[j] = f;
        else if (t == COMM_BF16) ((uint16_t *)p)[j] = bf16_from_f32(f);
        else if (t == COMM_I32) ((int32_t *)p)[j] = (int32_t)(rnd() % 2000001) - 1000000;
        else ((uint8_t *)p)[j] = (uint8_t)rnd();
    }
}

enum { OP_AR, OP_RS, OP_AG, OP_BC, OP_BAR };
static const char *const op_name[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier"};

/* One rank's call: op on c with n elements of t (in: W n for a reduce-scatter; out: W n for an
 * all-gather; in place: the rank's slice of in, resp. out, is the other buffer). */
typedef struct {
    comm *c;
    int op;
    comm_type t;
    size_t n;
    int root, in_place;
    char *in, *out;
    int rc;
    char msg[256];
} job;

static inline void *rank_main(void *p) {
    job *j = p;
    size_t eb = comm_type_bytes(j->t);
    int r = comm_rank(j->c);
    switch (j->op) {
    case OP_AR: j->rc = comm_all_reduce_sum(j->c, j->out, j->n, j->t); break;
    case OP_RS:
        j->rc = comm_reduce_scatter_sum(j->c, j->in, j->in_place ? j->in + (size_t)r * j->n * eb : j->out, j->n, j->t);
        break;
    case OP_AG: j->rc = comm_all_gather(j->c, j->in_place ? j->out + (size_t)r * j->n * eb : j->in, j->out, j->n, j->t); break;
    case OP_BC: j->rc = comm_broadcast(j->c, j->out, j->n, j->t, j->root); break;
    default: j->rc = comm_barrier(j->c);
    }
    snprintf(j->msg, sizeof j->msg, "%s", j->rc ? err_msg() : "");
    return NULL;
}

/* ---------------------------------------------------------------- all-to-all-v */

#define A2A_WMAX 4
typedef struct {
    comm *c;
    comm_type t;
    size_t send[A2A_WMAX], recv[A2A_WMAX];
    char *in, *out;
    int rc;
    char msg[256];
} a2a_job;

static inline void *a2a_main(void *p) {
    a2a_job *j = p;
    j->rc = comm_all_to_all_v(j->c, j->in, j->send, j->out, j->recv, j->t);
    snprintf(j->msg, sizeof j->msg, "%s", j->rc ? err_msg() : "");
    return NULL;
}

/* cnt (W, W): cnt[s W + d] elements from rank s to rank d, each part random, rank q's input its
 * parts for d = 0..W-1 in order. Runs the all-to-all-v on cs, every rank on its own thread
 * (skew: rank d expects cnt + 1 from rank 0, a disagreement); 0 when each rank's output is the
 * parts addressed to it, sources in rank order, byte for byte; else 1 with why. With skew: 0 when
 * every rank fails. */
static inline int a2a_check(comm **cs, int W, comm_type t, const size_t *cnt, int skew, char *why, size_t whylen) {
    size_t eb = comm_type_bytes(t);
    a2a_job j[A2A_WMAX];
    pthread_t th[A2A_WMAX];
    for (int q = 0; q < W; q++) {
        size_t ns = 0, nr = 0;
        j[q] = (a2a_job){.c = cs[q], .t = t};
        for (int d = 0; d < W; d++) {
            ns += j[q].send[d] = cnt[q * W + d];
            nr += j[q].recv[d] = cnt[d * W + q] + (skew && d == 0 && q == W - 1);
        }
        j[q].in = malloc(ns * eb + 1);
        j[q].out = malloc(nr * eb + 1);
        fill(j[q].in, ns, t);
        memset(j[q].out, 0xA5, nr * eb);
    }
    for (int q = 0; q < W; q++) pthread_create(&th[q], NULL, a2a_main, &j[q]);
    for (int q = 0; q < W; q++) pthread_join(th[q], NULL);
    int bad = 0;
    for (int d = 0; d < W && !bad; d++) {
        if (skew) {
            if (!j[d].rc || !strstr(j[d].msg, "all-to-all-v: rank 0 sends rank")) {
                snprintf(why, whylen, "W=%d: rank %d with counts that disagree: rc %d \"%s\"", W, d, j[d].rc, j[d].msg);
                bad = 1;
            }
            continue;
        }
        if (j[d].rc) {
            snprintf(why, whylen, "W=%d rank %d: rc %d (%s)", W, d, j[d].rc, j[d].msg);
            bad = 1;
            break;
        }
        const char *got = j[d].out;
        for (int s = 0; s < W && !bad; s++) { /* the part s -> d: after s's parts for ranks < d */
            size_t off = 0, n = cnt[s * W + d];
            for (int k = 0; k < d; k++) off += cnt[s * W + k];
            if (n && memcmp(got, j[s].in + off * eb, n * eb)) {
                snprintf(why, whylen, "W=%d type %d: rank %d's part from rank %d (%zu elements) differs", W, (int)t, d, s, n);
                bad = 1;
            }
            got += n * eb;
        }
    }
    for (int q = 0; q < W; q++) {
        free(j[q].in);
        free(j[q].out);
    }
    return bad;
}

/* cnt (W, W) random uneven counts up to max, about one in four 0 (and the diagonal 0 in every
 * third matrix: a rank that keeps nothing). */
static inline void a2a_random_counts(size_t *cnt, int W, size_t max, int k) {
    for (int s = 0; s < W; s++)
        for (int d = 0; d < W; d++) cnt[s * W + d] = rnd() % 4 == 0 || (k % 3 == 2 && s == d) ? 0 : 1 + rnd() % max;
}

/* The all-to-all-v cases both comm tests run on a group of W: each type with six random
 * matrices (maxima 1, 9, 3000), at W = 3 parts of up to ~12 MB (1 -> 2 and 2 -> 1 cross the tcp
 * comm's chunks through rank 0), then (W > 1) counts that disagree, which must fail every rank
 * (the tcp group is aborted by it: the last case). 0, or 1 with why. */
static inline int a2a_sweep(comm **cs, int W, char *why, size_t whylen) {
    static const size_t maxes[] = {1, 9, 3000};
    size_t cnt[A2A_WMAX * A2A_WMAX];
    int bad = 0;
    for (int t = COMM_F32; t <= COMM_U8 && !bad; t++)
        for (int k = 0; k < 6 && !bad; k++) {
            a2a_random_counts(cnt, W, maxes[k % 3], k);
            bad = a2a_check(cs, W, (comm_type)t, cnt, 0, why, whylen);
        }
    if (!bad && W == 3) {
        size_t big[9] = {5, 0, 7, 1 << 20, 11, 3 << 20, 0, (3 << 20) + 17, 2};
        bad = a2a_check(cs, W, COMM_F32, big, 0, why, whylen);
    }
    if (!bad && W > 1) { /* rank W-1 expects one element more from rank 0 than it sends */
        a2a_random_counts(cnt, W, 5, 0);
        bad = a2a_check(cs, W, COMM_F32, cnt, 1, why, whylen);
    }
    return bad;
}
#endif
