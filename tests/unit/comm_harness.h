/* comm_harness.h — what the comm tests share (tests/unit/test_comm.c, test_comm_tcp.c): random
 * inputs of each comm type (f32 and bf16 values with fractions that round when summed, i32 up to
 * ±1e6, any u8), and one rank's call of a collective, run on its own thread. */
#ifndef GRPOD_COMM_HARNESS_H
#define GRPOD_COMM_HARNESS_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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
#endif
