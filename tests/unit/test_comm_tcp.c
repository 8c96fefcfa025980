/* test_comm_tcp.c — the tcp comm (engine/dist/comm_tcp.c) against the cpu comm (engine/dist/comm_cpu.c),
 * the reference: the same inputs through both, the outputs compared bit for bit.
 *   - W = 1..4 ranks as threads over loopback: every collective, each type (f32, bf16, i32; u8
 *     for the copies), odd sizes (1, 7, 4099) and in-place forms; at W = 3 buffers of ~10 M
 *     elements, which cross the 4 MiB chunks;
 *   - all-to-all-v: W = 1..4, uneven random counts (zeros included), each type, and at W = 3
 *     parts of ~12 MB relayed through rank 0 across its chunks: each rank gets exactly its parts;
 *     counts that disagree fail on every rank, naming the pair;
 *   - abort: a rank blocked in a collective (another never calls) returns GE_COMM after
 *     comm_abort from another thread, also when the aborted comm is the blocked rank's own or
 *     rank 0's; a rank that closes its comm makes the others' next collective fail, naming it;
 *     ranks that disagree about a call fail it, naming the ranks;
 *   - set-up: a rank that connects twice, or says another W, fails it; a timeout and the cancel
 *     flag end it;
 *   - two processes (fork): reduce-scatter, all-gather and broadcast against sums computed here;
 *   - the engine over tcp: two ranks, one eng_update, bit-equal to the same on the cpu comm.
 * Every wait is bounded by alarm(): a hang prints FAIL and exits. The short sleeps only let a
 * thread reach its blocking call; no assertion depends on time. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "comm_harness.h"
#include "run_config.h"
#include "common/err.h"
#include "engine/dist/comm.h"
#include "engine/engine.h"
#include "engine/engine_testing.h"

#define WMAX 4
#define HOST "127.0.0.1"
#define BIG 10000019 /* elements of the large buffers: ~40 MB in f32, ten chunks */
static const size_t sizes[] = {1, 7, 4099};

/* ---------------------------------------------------------------- watchdog */

static const char *cur_test = "";
static void on_alarm(int sig) {
    (void)sig;
    char m[160];
    int k = snprintf(m, sizeof m, "FAIL %s: timed out (a collective or the set-up hung)\n", cur_test);
    if (write(1, m, (size_t)k) < 0) _exit(2);
    _exit(1);
}
#define GUARD(name, s) \
    do { \
        cur_test = #name; \
        alarm(s); \
        RUN(name); \
        alarm(0); \
    } while (0)

static void nap_ms(int ms) {
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------------- a tcp group as threads */

typedef struct {
    int rank, W, port, lfd;
    const int *cancel;
    double timeout;
    comm *c;
    int rc;
    char msg[256];
} open_job;

static void *open_main(void *p) {
    open_job *j = p;
    j->rc = comm_tcp_open(HOST, j->port, j->rank, j->W, j->lfd, j->cancel, j->timeout, &j->c);
    snprintf(j->msg, sizeof j->msg, "%s", j->rc ? err_msg() : "");
    return NULL;
}

/* W tcp comms over loopback, every rank opened on its own thread; 0 or the first failure. */
static int tcp_group(int W, comm **cs) {
    int lfd, port;
    int rc = comm_tcp_listen(HOST, 0, &lfd, &port);
    if (rc) return rc;
    open_job j[WMAX];
    pthread_t th[WMAX];
    for (int q = 0; q < W; q++) {
        j[q] = (open_job){.rank = q, .W = W, .port = port, .lfd = q ? -1 : lfd, .timeout = 20};
        pthread_create(&th[q], NULL, open_main, &j[q]);
    }
    for (int q = 0; q < W; q++) pthread_join(th[q], NULL);
    for (int q = 0; q < W; q++) {
        if (j[q].rc) {
            rc = j[q].rc;
            printf("  open rank %d: %s\n", q, j[q].msg);
        }
        cs[q] = j[q].c;
    }
    if (rc)
        for (int q = 0; q < W; q++) comm_free(cs[q]);
    return rc;
}

/* ---------------------------------------------------------------- one collective on W ranks */

/* Elements of rank q's input (orig) and output for op with n. */
static size_t n_in(int op, int W, size_t n) { return op == OP_RS ? (size_t)W * n : n; }
static size_t n_out(int op, int W, size_t n) { return op == OP_AG ? (size_t)W * n : n; }

/* Runs op on the W ranks cs from the inputs orig[q]; res[q] (malloc'd) gets each rank's output
 * (n_out elements). 0, or -1 with why. */
static int run_op(comm **cs, int W, int op, comm_type t, size_t n, int root, int in_place, char *const *orig, char **res,
                  char *why, size_t whylen) {
    size_t eb = comm_type_bytes(t), ni = n_in(op, W, n), no = n_out(op, W, n);
    job j[WMAX];
    pthread_t th[WMAX];
    for (int q = 0; q < W; q++) {
        j[q] = (job){.c = cs[q], .op = op, .t = t, .n = n, .root = root, .in_place = in_place};
        j[q].in = malloc(ni * eb + 1);
        j[q].out = malloc(no * eb + 1);
        if (op == OP_AR || op == OP_BC) memcpy(j[q].out, orig[q], n * eb);
        else if (op == OP_AG && in_place) memcpy(j[q].out + (size_t)q * n * eb, orig[q], n * eb);
        else memcpy(j[q].in, orig[q], ni * eb);
    }
    for (int q = 0; q < W; q++) pthread_create(&th[q], NULL, rank_main, &j[q]);
    for (int q = 0; q < W; q++) pthread_join(th[q], NULL);
    int bad = 0;
    for (int q = 0; q < W; q++) {
        if (j[q].rc && !bad) {
            snprintf(why, whylen, "%s rank %d: rc %d (%s)", op_name[op], q, j[q].rc, j[q].msg);
            bad = 1;
        }
        res[q] = malloc(no * eb + 1);
        memcpy(res[q], op == OP_RS && in_place ? j[q].in + (size_t)q * n * eb : j[q].out, no * eb);
        free(j[q].in);
        free(j[q].out);
    }
    return -bad;
}

/* op on the cpu group and on the tcp group from the same random inputs: 0 when every rank's
 * output is the same bytes. */
static int same_as_cpu(comm **cpu, comm **tcp, int W, int op, comm_type t, size_t n, int in_place, char *why, size_t whylen) {
    size_t eb = comm_type_bytes(t), ni = n_in(op, W, n), no = n_out(op, W, n);
    char *orig[WMAX] = {0}, *a[WMAX] = {0}, *b[WMAX] = {0};
    int root = (int)(rnd() % (unsigned)W);
    for (int q = 0; q < W; q++) {
        orig[q] = malloc(ni * eb + 1);
        fill(orig[q], ni, t);
    }
    int bad = run_op(cpu, W, op, t, n, root, in_place, orig, a, why, whylen);
    if (!bad) bad = run_op(tcp, W, op, t, n, root, in_place, orig, b, why, whylen);
    for (int q = 0; q < W && !bad; q++)
        if (op != OP_BAR && memcmp(a[q], b[q], no * eb)) {
            size_t i = 0;
            while (!memcmp(a[q] + i * eb, b[q] + i * eb, eb)) i++;
            snprintf(why, whylen, "%s W=%d type %d n=%zu in_place %d: rank %d differs from the cpu comm at element %zu",
                     op_name[op], W, (int)t, n, in_place, q, i);
            bad = 1;
        }
    for (int q = 0; q < W; q++) {
        free(orig[q]);
        free(a[q]);
        free(b[q]);
    }
    return bad;
}

/* ---------------------------------------------------------------- tests */

TEST(collectives_equal_the_cpu_comm) {
    rng_state = 7;
    char why[320] = "";
    for (int W = 1; W <= WMAX; W++) {
        comm *cpu[WMAX], *tcp[WMAX];
        CHECK_EQ_INT(comm_cpu_group(W, cpu), 0);
        CHECK_MSG(tcp_group(W, tcp) == 0, "W=%d: %s", W, err_msg());
        for (int q = 0; q < W; q++) {
            CHECK_EQ_INT(comm_rank(tcp[q]), q);
            CHECK_EQ_INT(comm_size(tcp[q]), W);
        }
        int bad = 0, calls = 0;
        for (int op = OP_AR; op <= OP_BAR && !bad; op++)
            for (int t = COMM_F32; t <= COMM_U8 && !bad; t++) {
                if ((op == OP_AR || op == OP_RS) && t == COMM_U8) continue;
                if (op == OP_BAR && t != COMM_F32) continue;
                for (size_t k = 0; k < sizeof sizes / sizeof sizes[0] && !bad; k++)
                    for (int ip = 0; ip <= (op == OP_RS || op == OP_AG) && !bad; ip++, calls++)
                        bad = same_as_cpu(cpu, tcp, W, op, (comm_type)t, sizes[k], ip, why, sizeof why);
                /* the large buffers: at W = 3 (ragged chunks and shards), every op, f32 and bf16 sums,
                 * u8 and i32 copies */
                if (W == 3 && !bad && op != OP_BAR &&
                    (t == COMM_F32 || t == COMM_BF16 || (op == OP_AG && t == COMM_U8) || (op == OP_BC && t == COMM_I32))) {
                    size_t n = op == OP_RS || op == OP_AG ? BIG / W : BIG;
                    bad = same_as_cpu(cpu, tcp, W, op, (comm_type)t, n, op == OP_RS, why, sizeof why);
                    calls++;
                }
            }
        for (int q = 0; q < W; q++) {
            comm_free(cpu[q]);
            comm_free(tcp[q]);
        }
        CHECK_MSG(!bad, "%s", why);
        printf("  W=%d: %d collectives bit-equal to the cpu comm\n", W, calls);
    }
}

TEST(all_to_all_v_moves_each_part) {
    rng_state = 99;
    char why[320] = "";
    for (int W = 1; W <= WMAX; W++) {
        comm *cs[WMAX];
        CHECK_MSG(tcp_group(W, cs) == 0, "W=%d: %s", W, err_msg());
        int bad = a2a_sweep(cs, W, why, sizeof why);
        for (int q = 0; q < W; q++) comm_free(cs[q]);
        CHECK_MSG(!bad, "%s", why);
    }
}

/* An all-reduce on ranks 0..k-1 of a tcp group of W, in threads; the others never call. */
typedef struct {
    comm *c;
    float buf[5];
    int rc, rc2;
    char msg[256];
} blk_job;
static void *blk_main(void *p) {
    blk_job *j = p;
    j->rc = comm_all_reduce_sum(j->c, j->buf, 5, COMM_F32);
    snprintf(j->msg, sizeof j->msg, "%s", err_msg());
    j->rc2 = comm_barrier(j->c);
    return NULL;
}

/* Ranks in `calls` block in an all-reduce (the others never call) until comm_abort(cs[victim])
 * from this thread; every caller returns GE_COMM, and so does every later call on every rank. */
static int blocked_then_abort(int W, const int *calls, int nc, int victim, char *why, size_t whylen) {
    comm *cs[WMAX];
    if (tcp_group(W, cs)) {
        snprintf(why, whylen, "open: %s", err_msg());
        return 1;
    }
    blk_job j[WMAX] = {0};
    pthread_t th[WMAX];
    for (int i = 0; i < nc; i++) {
        j[i].c = cs[calls[i]];
        pthread_create(&th[i], NULL, blk_main, &j[i]);
    }
    nap_ms(100); /* let them block (the test holds whenever the abort comes) */
    comm_abort(cs[victim]);
    for (int i = 0; i < nc; i++) pthread_join(th[i], NULL);
    int bad = 0;
    for (int i = 0; i < nc && !bad; i++)
        if (j[i].rc != GE_COMM || j[i].rc2 != GE_COMM) {
            snprintf(why, whylen, "W=%d abort of rank %d: rank %d returned %d then %d (%s)", W, victim, calls[i], j[i].rc,
                     j[i].rc2, j[i].msg);
            bad = 1;
        }
    float y[WMAX] = {0};
    for (int q = 0; q < W && !bad; q++) /* those that never called: rank 0 aborted the group */
        if (comm_all_gather(cs[q], y, y, 1, COMM_F32) != GE_COMM) {
            snprintf(why, whylen, "rank %d: a call after the abort did not fail", q);
            bad = 1;
        }
    for (int q = 0; q < W; q++) comm_free(cs[q]);
    return bad;
}

TEST(abort_wakes_blocked_ranks) {
    char why[320];
    const int r01[] = {0, 1}, r12[] = {1, 2}, r0[] = {0}, r1[] = {1};
    CHECK_MSG(!blocked_then_abort(3, r01, 2, 2, why, sizeof why), "%s", why); /* the rank that never calls aborts */
    CHECK_MSG(!blocked_then_abort(3, r01, 2, 1, why, sizeof why), "%s", why); /* a blocked rank's own comm */
    CHECK_MSG(!blocked_then_abort(3, r12, 2, 0, why, sizeof why), "%s", why); /* rank 0, which never calls */
    CHECK_MSG(!blocked_then_abort(2, r0, 1, 0, why, sizeof why), "%s", why); /* rank 0 blocked, its own comm */
    CHECK_MSG(!blocked_then_abort(2, r1, 1, 1, why, sizeof why), "%s", why);
}

TEST(a_rank_that_leaves_fails_the_next_call) {
    for (int leaver = 0; leaver < 3; leaver++) {
        comm *cs[3];
        CHECK_MSG(tcp_group(3, cs) == 0, "%s", err_msg());
        blk_job j[3] = {0};
        pthread_t th[3];
        for (int q = 0; q < 3; q++) {
            j[q].c = cs[q];
            pthread_create(&th[q], NULL, blk_main, &j[q]);
        }
        for (int q = 0; q < 3; q++) pthread_join(th[q], NULL);
        for (int q = 0; q < 3; q++) CHECK_MSG(j[q].rc == 0 && j[q].rc2 == 0, "rank %d: %s", q, j[q].msg);
        comm_free(cs[leaver]); /* it closes its comm mid-group */
        int n = 0;
        for (int q = 0; q < 3; q++)
            if (q != leaver) {
                j[n] = (blk_job){.c = cs[q]};
                pthread_create(&th[n], NULL, blk_main, &j[n]);
                n++;
            }
        for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
        char want[32];
        snprintf(want, sizeof want, "rank %d", leaver);
        for (int i = 0; i < n; i++) {
            CHECK_MSG(j[i].rc == GE_COMM && j[i].rc2 == GE_COMM, "rank %d left: the next call returned %d, %d", leaver, j[i].rc,
                      j[i].rc2);
            CHECK_MSG(strstr(j[i].msg, want), "rank %d left: \"%s\" does not name it", leaver, j[i].msg);
        }
        printf("  rank %d left: \"%s\"\n", leaver, j[n - 1].msg);
        for (int q = 0; q < 3; q++)
            if (q != leaver) comm_free(cs[q]);
    }
}

TEST(ranks_that_disagree_fail_the_call) {
    comm *cs[3];
    CHECK_MSG(tcp_group(3, cs) == 0, "%s", err_msg());
    job j[3];
    pthread_t th[3];
    float buf[3][3 * 7] = {{0}};
    for (int q = 0; q < 3; q++) {
        j[q] = (job){.c = cs[q], .op = q == 2 ? OP_BC : OP_AG, .t = COMM_F32, .n = 7, .in = (char *)buf[q], .out = (char *)buf[q]};
        pthread_create(&th[q], NULL, rank_main, &j[q]);
    }
    for (int q = 0; q < 3; q++) pthread_join(th[q], NULL);
    for (int q = 0; q < 3; q++) {
        CHECK_MSG(j[q].rc == GE_COMM, "rank %d: rc %d", q, j[q].rc);
        CHECK_MSG(strstr(j[q].msg, "ranks disagree: rank 0 all_gather n=7") && strstr(j[q].msg, "rank 2 broadcast n=7"),
                  "rank %d: %s", q, j[q].msg);
    }
    printf("  \"%s\"\n", j[0].msg);
    for (int q = 0; q < 3; q++) comm_free(cs[q]);
}

TEST(setup_checks_every_rank) {
    /* a rank that connects twice: rank 0 fails the set-up, and the others see it close */
    int lfd, port;
    CHECK_EQ_INT(comm_tcp_listen(HOST, 0, &lfd, &port), 0);
    CHECK(port > 0);
    open_job j[3] = {{.rank = 0, .W = 3, .port = port, .lfd = lfd, .timeout = 20},
                     {.rank = 1, .W = 3, .port = port, .lfd = -1, .timeout = 20},
                     {.rank = 1, .W = 3, .port = port, .lfd = -1, .timeout = 20}};
    pthread_t th[3];
    for (int q = 0; q < 3; q++) pthread_create(&th[q], NULL, open_main, &j[q]);
    for (int q = 0; q < 3; q++) pthread_join(th[q], NULL);
    for (int q = 0; q < 3; q++) {
        CHECK_MSG(j[q].rc == GE_COMM, "rank %d: rc %d", q, j[q].rc);
        CHECK(!j[q].c);
    }
    CHECK_MSG(strstr(j[0].msg, "rank 1 connected twice"), "%s", j[0].msg);
    /* a rank that says another W */
    CHECK_EQ_INT(comm_tcp_listen(HOST, 0, &lfd, &port), 0);
    j[0] = (open_job){.rank = 0, .W = 2, .port = port, .lfd = lfd, .timeout = 20};
    j[1] = (open_job){.rank = 1, .W = 3, .port = port, .lfd = -1, .timeout = 20};
    for (int q = 0; q < 2; q++) pthread_create(&th[q], NULL, open_main, &j[q]);
    for (int q = 0; q < 2; q++) pthread_join(th[q], NULL);
    CHECK_MSG(j[0].rc == GE_COMM && strstr(j[0].msg, "rank 1 says the group has 3 ranks"), "%s", j[0].msg);
    CHECK_EQ_INT(j[1].rc, GE_COMM);
    /* nobody comes: the timeout */
    CHECK_EQ_INT(comm_tcp_listen(HOST, 0, &lfd, &port), 0);
    comm *c;
    CHECK_EQ_INT(comm_tcp_open(HOST, port, 0, 2, lfd, NULL, 0.2, &c), GE_COMM);
    CHECK_MSG(strstr(err_msg(), "timed out"), "%s", err_msg());
    /* rank 1 connecting to a port nobody listens on (that one, now closed): the timeout */
    CHECK_EQ_INT(comm_tcp_open(HOST, port, 1, 2, -1, NULL, 0.3, &c), GE_COMM);
    CHECK_MSG(strstr(err_msg(), "timed out while connecting"), "%s", err_msg());
    /* the cancel flag, set from another thread while rank 0 waits (no timeout) */
    CHECK_EQ_INT(comm_tcp_listen(HOST, 0, &lfd, &port), 0);
    int cancel = 0;
    j[0] = (open_job){.rank = 0, .W = 3, .port = port, .lfd = lfd, .cancel = &cancel, .timeout = 0};
    j[1] = (open_job){.rank = 1, .W = 3, .port = port, .lfd = -1, .cancel = &cancel, .timeout = 0};
    for (int q = 0; q < 2; q++) pthread_create(&th[q], NULL, open_main, &j[q]);
    nap_ms(100);
    __atomic_store_n(&cancel, 1, __ATOMIC_RELEASE);
    for (int q = 0; q < 2; q++) pthread_join(th[q], NULL);
    for (int q = 0; q < 2; q++) CHECK_MSG(j[q].rc == GE_COMM, "rank %d: rc %d (%s)", q, j[q].rc, j[q].msg);
    CHECK_MSG(strstr(j[0].msg, "cancelled"), "%s", j[0].msg);
    /* bad arguments */
    CHECK_EQ_INT(comm_tcp_open(HOST, port, 0, 2, -1, NULL, 1, &c), GE_INVALID);
    CHECK_EQ_INT(comm_tcp_open(HOST, port, 2, 2, -1, NULL, 1, &c), GE_INVALID);
}

/* ---------------------------------------------------------------- two processes */

#define FN 1500007 /* elements a rank's shard: reduce-scatter input 12 MB, three chunks */

/* Rank q's inputs, the same in both processes: in (2 FN) for the reduce-scatter, bc (FN). */
static void proc_inputs(int q, float *in, float *bc) {
    rng_state = 1000 + (uint64_t)q;
    fill(in, 2 * FN, COMM_F32);
    fill(bc, FN, COMM_F32);
}

/* One rank of the two-process group: reduce-scatter, all-gather of the shards, broadcast from
 * rank 1; each output checked against the sums in rank order computed here. 0 or a line in why. */
static int proc_rank(comm *c, char *why, size_t whylen) {
    int r = comm_rank(c);
    float *in[2], *bc[2], *shard = malloc(FN * 4), *all = malloc(2 * FN * 4), *buf = malloc(FN * 4);
    for (int q = 0; q < 2; q++) {
        in[q] = malloc(2 * FN * 4);
        bc[q] = malloc(FN * 4);
        proc_inputs(q, in[q], bc[q]);
    }
    int rc = comm_reduce_scatter_sum(c, in[r], shard, FN, COMM_F32);
    if (!rc) rc = comm_all_gather(c, shard, all, FN, COMM_F32);
    memcpy(buf, bc[r], FN * 4);
    if (!rc) rc = comm_broadcast(c, buf, FN, COMM_F32, 1);
    int bad = 0;
    if (rc) {
        snprintf(why, whylen, "rank %d: rc %d (%s)", r, rc, err_msg());
        bad = 1;
    }
    for (size_t i = 0; i < 2 * FN && !bad; i++) {
        float s = 0;
        s += in[0][i];
        s += in[1][i];
        if (memcmp(&s, &all[i], 4)) {
            snprintf(why, whylen, "rank %d: element %zu: %g, expected %g", r, i, all[i], s);
            bad = 1;
        }
    }
    if (!bad && memcmp(all + (size_t)r * FN, shard, FN * 4)) {
        snprintf(why, whylen, "rank %d: its shard differs", r);
        bad = 1;
    }
    if (!bad && memcmp(buf, bc[1], FN * 4)) {
        snprintf(why, whylen, "rank %d: the broadcast differs from rank 1's", r);
        bad = 1;
    }
    for (int q = 0; q < 2; q++) {
        free(in[q]);
        free(bc[q]);
    }
    free(shard);
    free(all);
    free(buf);
    return bad;
}

TEST(two_processes) {
    int lfd, port;
    CHECK_EQ_INT(comm_tcp_listen(HOST, 0, &lfd, &port), 0);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) { /* rank 1 */
        alarm(60);
        close(lfd);
        comm *c;
        char why[256] = "";
        int bad = comm_tcp_open(HOST, port, 1, 2, -1, NULL, 20, &c);
        if (bad) printf("  child: open: %s\n", err_msg());
        else if ((bad = proc_rank(c, why, sizeof why))) printf("  child: %s\n", why);
        if (!bad) comm_free(c);
        fflush(stdout);
        _exit(bad ? 1 : 0);
    }
    comm *c;
    char why[256] = "";
    int rc = comm_tcp_open(HOST, port, 0, 2, lfd, NULL, 20, &c);
    int bad = rc ? 1 : proc_rank(c, why, sizeof why);
    if (rc) snprintf(why, sizeof why, "open: %s", err_msg());
    if (!rc) comm_free(c);
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK_MSG(!bad, "rank 0: %s", why);
    CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child (rank 1) failed: status %d", st);
}

/* ---------------------------------------------------------------- the engine over tcp */

#define MODEL TEST_TMP "/grpod_test_comm_tcp_model"
#define NG 5
static int V;
static int P_[NG] = {5, 9, 3, 12, 7}, N_[NG] = {2, 3, 1, 4, 2};
static int prompt_[NG][12], resp_[NG][4][9], R_[NG][4], trunc_[NG][4];
static const int *respp_[NG][4];
static float reward_[NG][4], old_[NG][4][9];
static const float *oldp_[NG][4];

static void make_inputs(void) {
    rng_state = 12345;
    for (int i = 0; i < NG; i++) {
        for (int t = 0; t < P_[i]; t++) prompt_[i][t] = 3 + (int)(rnd() % (unsigned)(V - 3));
        for (int r = 0; r < N_[i]; r++) {
            R_[i][r] = 1 + (int)(rnd() % 9);
            for (int t = 0; t < R_[i][r]; t++) {
                resp_[i][r][t] = 3 + (int)(rnd() % (unsigned)(V - 3));
                old_[i][r][t] = -5.5f - 0.6f * (float)(rnd() % 100000) / 100000.0f;
            }
            respp_[i][r] = resp_[i][r];
            oldp_[i][r] = old_[i][r];
            reward_[i][r] = (float)(rnd() % 100000) / 100000.0f;
            trunc_[i][r] = rnd() % 4 == 0;
        }
    }
}

/* test_dp.c's configuration 0: GRPO with kl and entropy, mini-batches of 3 groups, 2 epochs,
 * the grad-norm clip active: every collective the update uses. */
static int run_update(eng *e, eng_update_result *u) {
    loss_config a;
    eng_optim o;
    grpo_update_config(&a, &o, 2e-3f, 0.05f, 0.05f);
    a.ppo_epochs = 2;
    a.use_rollout_logprobs = 1;
    eng_update_group g[NG];
    for (int i = 0; i < NG; i++)
        g[i] = (eng_update_group){.prompt = prompt_[i],
                                  .P = P_[i],
                                  .n = N_[i],
                                  .resp = respp_[i],
                                  .R = R_[i],
                                  .reward = reward_[i],
                                  .old_logprobs = oldp_[i],
                                  .truncated = trunc_[i]};
    return eng_update(e, g, NG, &a, &o, 24, u, NULL, NULL);
}

typedef struct {
    comm *c;
    eng *e;
    int rc;
    char msg[256];
    eng_update_result u;
} eng_job;
static void *eng_main(void *p) {
    eng_job *j = p;
    eng_open_opts o = {.model_dir = MODEL, .backend = "cpu", .n_threads = 1, .comm = j->c};
    j->rc = eng_open(&o, &j->e);
    if (!j->rc) j->rc = run_update(j->e, &j->u);
    snprintf(j->msg, sizeof j->msg, "%s", j->rc ? err_msg() : "");
    j->u.ms_old = j->u.ms_ref = j->u.ms_policy = j->u.ms_optimizer = j->u.ms_total = j->u.ms_snapshot_wait = j->u.ms_prepare =
        0; /* timings differ */
    return NULL;
}

/* Two ranks on comms cs, each opening an engine and updating it on its own thread. */
static int eng_ranks(comm **cs, eng_job *j) {
    pthread_t th[2];
    for (int q = 0; q < 2; q++) {
        j[q] = (eng_job){.c = cs[q]};
        pthread_create(&th[q], NULL, eng_main, &j[q]);
    }
    int bad = 0;
    for (int q = 0; q < 2; q++) {
        pthread_join(th[q], NULL);
        if (j[q].rc) {
            printf("  rank %d: rc %d: %s\n", q, j[q].rc, j[q].msg);
            bad = 1;
        }
    }
    return bad;
}

TEST(engine_update_over_tcp_equals_cpu_comm) {
    CHECK_MSG(eng_ensure_default_model(MODEL) == 0, "%s", err_msg());
    {
        eng *e;
        eng_open_opts o = {.model_dir = MODEL, .backend = "cpu", .n_threads = 1};
        CHECK_MSG(eng_open(&o, &e) == 0, "%s", err_msg());
        eng_info i;
        eng_get_info(e, &i);
        V = i.vocab;
        eng_close(e);
    }
    make_inputs();
    comm *cpu[2], *tcp[2];
    eng_job a[2] = {0}, b[2] = {0};
    CHECK_EQ_INT(comm_cpu_group(2, cpu), 0);
    CHECK_MSG(tcp_group(2, tcp) == 0, "%s", err_msg());
    int bad = eng_ranks(cpu, a) || eng_ranks(tcp, b);
    eng_testing_info ti = {0};
    if (!bad) eng_testing_get(a[0].e, &ti);
    long long n = ti.n_params;
    float *wa = malloc((size_t)n * 4 + 4), *wb = malloc((size_t)n * 4 + 4);
    for (int q = 0; q < 2 && !bad; q++) {
        if (eng_testing_weights(a[q].e, wa) || eng_testing_weights(b[q].e, wb)) {
            printf("  rank %d: %s\n", q, err_msg());
            bad = 1;
        }
        if (!bad && memcmp(wa, wb, (size_t)n * 4)) {
            printf("  rank %d: weights differ from the cpu comm's\n", q);
            bad = 1;
        }
        if (memcmp(&a[q].u, &b[q].u, sizeof a[q].u)) {
            printf("  rank %d: result differs from the cpu comm's\n", q);
            bad = 1;
        }
        if (memcmp(&b[q].u, &b[0].u, sizeof b[q].u)) {
            printf("  rank %d: result differs from rank 0's\n", q);
            bad = 1;
        }
    }
    if (!bad)
        printf("  loss %.6f grad_norm %.4f steps %d: weights (%lld) and results bit-equal\n", b[0].u.loss, b[0].u.grad_norm,
               b[0].u.optimizer_steps, n);
    free(wa);
    free(wb);
    for (int q = 0; q < 2; q++) {
        eng_close(a[q].e);
        eng_close(b[q].e);
        comm_free(cpu[q]);
        comm_free(tcp[q]);
    }
    CHECK(!bad);
    CHECK(b[0].u.optimizer_steps > 0);
}

int main(void) {
    signal(SIGALRM, on_alarm);
    GUARD(collectives_equal_the_cpu_comm, 120);
    GUARD(all_to_all_v_moves_each_part, 120);
    GUARD(abort_wakes_blocked_ranks, 30);
    GUARD(a_rank_that_leaves_fails_the_next_call, 30);
    GUARD(ranks_that_disagree_fail_the_call, 30);
    GUARD(setup_checks_every_rank, 30);
    GUARD(two_processes, 60);
    GUARD(engine_update_over_tcp_equals_cpu_comm, 120);
    return CHECK_DONE();
}
