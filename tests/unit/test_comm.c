/* test_comm.c — the cpu comm (engine/dist/comm.h): W = 1..4 ranks as threads.
 *   - every collective on random data of odd sizes (1, 7, 1000, 4099) and each type (f32, bf16,
 *     i32; u8 for the copies) against a reference computed here in rank order: bit-equal (the
 *     comm promises sums in rank order with an fp32 accumulator, rounded once for bf16);
 *   - in-place reduce-scatter and all-gather give the same bits;
 *   - all-to-all-v: W = 1..4, uneven random counts (zeros included, also a rank that keeps
 *     nothing), each type: every rank gets exactly the parts addressed to it, in source order;
 *     counts that disagree fail on every rank;
 *   - abort: ranks blocked in a collective wake with GE_COMM, and every later call fails. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "comm_harness.h"
#include "common/err.h"
#include "engine/dist/comm.h"
#include "common/bf16.h"
#include "kernels/adamw.h"

#define WMAX 4
static const size_t sizes[] = {1, 7, 1000, 4099};

static float bf(uint16_t b) {
    union {
        uint32_t u;
        float f;
    } x = {(uint32_t)b << 16};
    return x.f;
}

/* Sum over ranks in rank order of element j of in[q] (the comm's contract), into dst[i]. */
static void ref_sum(void *const *in, int W, size_t j, void *dst, size_t i, comm_type t) {
    if (t == COMM_I32) {
        int32_t s = 0;
        for (int q = 0; q < W; q++) s += ((int32_t *)in[q])[j];
        ((int32_t *)dst)[i] = s;
    } else {
        float s = 0;
        for (int q = 0; q < W; q++) s += t == COMM_F32 ? ((float *)in[q])[j] : bf(((uint16_t *)in[q])[j]);
        if (t == COMM_F32) ((float *)dst)[i] = s;
        else ((uint16_t *)dst)[i] = bf16_from_f32(s);
    }
}

/* One collective on W ranks; 0 when every rank's output equals the reference bit for bit. */
static int one(comm **cs, int W, int op, comm_type t, size_t n, int in_place, char *why, size_t whylen) {
    size_t eb = comm_type_bytes(t), n_in = op == 1 ? W * n : n, n_out = op == 2 ? W * n : n;
    job jobs[WMAX];
    void *orig[WMAX];
    pthread_t th[WMAX];
    int root = (int)(rnd() % (unsigned)W);
    for (int q = 0; q < W; q++) {
        jobs[q] = (job){.c = cs[q], .op = op, .t = t, .n = n, .root = root, .in_place = in_place};
        jobs[q].in = malloc(n_in * eb + 1);
        jobs[q].out = malloc((op == 1 ? W * n : n_out) * eb + 1);
        orig[q] = malloc((op == 1 ? W * n : n_in) * eb + 1);
        fill(orig[q], op == 1 ? W * n : n_in, t);
        if (op == 0 || op == 3) memcpy(jobs[q].out, orig[q], n * eb);
        else memcpy(jobs[q].in, orig[q], n_in * eb);
        if (op == 2 && in_place) memcpy((char *)jobs[q].out + (size_t)q * n * eb, orig[q], n * eb);
    }
    for (int q = 0; q < W; q++) pthread_create(&th[q], NULL, rank_main, &jobs[q]);
    for (int q = 0; q < W; q++) pthread_join(th[q], NULL);
    int bad = 0;
    void *want = malloc(n_out * eb + 1);
    for (int q = 0; q < W && !bad; q++) {
        if (jobs[q].rc) {
            snprintf(why, whylen, "rank %d: rc %d (%s)", q, jobs[q].rc, err_msg());
            bad = 1;
            break;
        }
        if (op == 0)
            for (size_t i = 0; i < n; i++) ref_sum(orig, W, i, want, i, t);
        else if (op == 1)
            for (size_t i = 0; i < n; i++) ref_sum(orig, W, (size_t)q * n + i, want, i, t);
        else if (op == 2)
            for (int s = 0; s < W; s++) memcpy((char *)want + (size_t)s * n * eb, orig[s], n * eb);
        else if (op == 3) memcpy(want, orig[root], n * eb);
        const void *got = op == 1 && in_place ? (char *)jobs[q].in + (size_t)q * n * eb : jobs[q].out;
        if (op <= 3 && memcmp(got, want, n_out * eb)) {
            snprintf(why, whylen, "%s W=%d type %d n=%zu in_place %d: rank %d differs from the rank-order reference", op_name[op],
                     W, (int)t, n, in_place, q);
            bad = 1;
        }
    }
    free(want);
    for (int q = 0; q < W; q++) {
        free(jobs[q].in);
        free(jobs[q].out);
        free(orig[q]);
    }
    return bad;
}

TEST(collectives_match_rank_order_reference) {
    rng_state = 42;
    char why[256];
    for (int W = 1; W <= WMAX; W++) {
        comm *cs[WMAX];
        CHECK_EQ_INT(comm_cpu_group(W, cs), 0);
        for (int q = 0; q < W; q++) {
            CHECK_EQ_INT(comm_rank(cs[q]), q);
            CHECK_EQ_INT(comm_size(cs[q]), W);
        }
        int bad = 0;
        for (int op = 0; op <= 4 && !bad; op++)
            for (int t = COMM_F32; t <= COMM_U8 && !bad; t++) {
                if (op <= 1 && t == COMM_U8) continue;
                for (size_t k = 0; k < sizeof sizes / sizeof sizes[0] && !bad; k++)
                    for (int ip = 0; ip <= (op == 1 || op == 2) && !bad; ip++)
                        bad = one(cs, W, op, (comm_type)t, sizes[k], ip, why, sizeof why);
            }
        for (int q = 0; q < W; q++) comm_free(cs[q]);
        CHECK_MSG(!bad, "%s", why);
    }
}

TEST(all_to_all_v_moves_each_part) {
    rng_state = 4242;
    char why[320] = "";
    for (int W = 1; W <= WMAX; W++) {
        comm *cs[WMAX];
        CHECK_EQ_INT(comm_cpu_group(W, cs), 0);
        int bad = a2a_sweep(cs, W, why, sizeof why);
        for (int q = 0; q < W; q++) comm_free(cs[q]);
        CHECK_MSG(!bad, "%s", why);
    }
}

TEST(sums_differ_from_another_order) {
    /* the reference above could pass by accident if order never mattered: show it does for
     * these inputs (fp32 addition is not associative), so bit-equality is a real check */
    float a = 1e8f, b = 1.0f, c = -1e8f;
    CHECK((a + b) + c != (c + a) + b);
}

TEST(u8_has_no_sum) {
    comm *cs[1];
    CHECK_EQ_INT(comm_cpu_group(1, cs), 0);
    unsigned char x[3] = {1, 2, 3};
    CHECK_EQ_INT(comm_all_reduce_sum(cs[0], x, 3, COMM_U8), GE_INVALID);
    CHECK_EQ_INT(comm_broadcast(cs[0], x, 3, COMM_U8, 1), GE_INVALID);
    comm_free(cs[0]);
    CHECK_EQ_INT(comm_cpu_group(0, cs), GE_INVALID);
}

typedef struct {
    comm *c;
    float *buf;
    int rc, rc2;
} ab_job;
static void *ab_main(void *p) {
    ab_job *j = p;
    j->rc = comm_all_reduce_sum(j->c, j->buf, 5, COMM_F32);
    j->rc2 = comm_barrier(j->c);
    return NULL;
}

TEST(abort_wakes_waiters) {
    comm *cs[3];
    CHECK_EQ_INT(comm_cpu_group(3, cs), 0);
    float bufs[2][5] = {{1, 2, 3, 4, 5}, {1, 2, 3, 4, 5}};
    ab_job j[2] = {{cs[0], bufs[0], 1, 1}, {cs[1], bufs[1], 1, 1}};
    pthread_t th[2];
    for (int q = 0; q < 2; q++) pthread_create(&th[q], NULL, ab_main, &j[q]);
    /* rank 2 never joins: it fails and aborts (from this thread) while 0 and 1 wait */
    comm_abort(cs[2]);
    for (int q = 0; q < 2; q++) pthread_join(th[q], NULL);
    for (int q = 0; q < 2; q++) {
        CHECK_EQ_INT(j[q].rc, GE_COMM);
        CHECK_EQ_INT(j[q].rc2, GE_COMM);
    }
    float y[4] = {0};
    CHECK_EQ_INT(comm_all_gather(cs[2], y, y, 1, COMM_F32), GE_COMM);
    for (int q = 0; q < 3; q++) comm_free(cs[q]);
}

TEST(nccl_absent_or_checked) {
#ifndef GRPOD_NCCL
    unsigned char id[128];
    CHECK_EQ_INT(comm_nccl_unique_id(id), GE_UNSUPPORTED);
#endif
}

int main(void) {
    RUN(collectives_match_rank_order_reference);
    RUN(all_to_all_v_moves_each_part);
    RUN(sums_differ_from_another_order);
    RUN(u8_has_no_sum);
    RUN(abort_wakes_waiters);
    RUN(nccl_absent_or_checked);
    return CHECK_DONE();
}
