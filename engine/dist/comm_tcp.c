/* comm_tcp.c — the tcp comm (comm.h): W ranks in separate processes (or hosts, or threads) over
 * TCP, for the cpu backend (buffers in host memory). Not for cuda: there the comm is NCCL.
 *
 * A star through rank 0. Each rank r > 0 keeps one socket to rank 0 and sends its part of every
 * collective there; rank 0 computes and sends each rank its result. Rank 0 sums with
 * comm_sum_ranks (comm_internal.h), the cpu comm's own arithmetic (rank order 0..W-1, an fp32
 * accumulator, bf16 rounded once), so W ranks over TCP give the bits W threads give.
 *
 * Wire (host byte order for data: every rank of a group is assumed to share it; headers are
 * little-endian): a 32-byte header per message,
 *   magic "GRPC", op, type, root, seq (u64), n (u64)
 * Set-up: rank r connects and sends HELLO (type = protocol version, root = r, n = W); rank 0
 * accepts W-1 of them, each rank once, then sends every rank WELCOME, so comm_tcp_open returns on
 * a rank only once the whole group has joined (as NCCL's set-up does).
 * A collective: every rank r > 0 sends its header (op, type, n, root, seq); rank 0 waits for all
 * of them (poll, so a rank that leaves meanwhile is seen at once), checks them against its own
 * and answers each a REPLY (type 0: go; else the error text follows, n bytes). After "go" the
 * data moves in chunks of TCP_CHUNK bytes, lock-step: each rank sends its chunk k, then reads its
 * result chunk k, while rank 0 reads chunk k from every rank in rank order, computes, and sends
 * the results. Rank 0 holds W chunk buffers (O(chunk × W)), never W copies of a buffer; ranks
 * r > 0 stream straight from and into the caller's buffers. A barrier is the header round alone.
 * An all-to-all-v (header n = W) has a second round after "go": every rank r > 0 sends its send
 * and recv counts (2 W u64, little-endian), rank 0 checks the matrix and answers again. Then the
 * parts move in one order that every rank walks, source s = 0..W-1, destination d = 0..W-1
 * (empty parts skipped): s = d copies locally; s or d = 0 is a direct transfer; else rank 0
 * relays the part chunk by chunk. Rank 0 works through the parts in that order, and every other
 * rank waits only on a part rank 0 will reach, so no cycle of waits can form.
 *
 * Failures: any failed call aborts its comm (the stream is out of step after it). Rank 0 aborts
 * the group when a rank leaves or the headers disagree (after telling the ranks that wait for
 * "go" why), which ends the others' pending and next calls with GE_COMM. Abort = a flag and
 * shutdown(SHUT_RDWR) of every socket, which wakes a blocked send/recv/poll in another thread;
 * the sockets are closed only by comm_free.
 * Threading: each rank's comm from one thread at a time; comm_abort from any thread. */
#define _GNU_SOURCE /* POLLRDHUP, accept4 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"
#include "engine/dist/comm.h"
#include "engine/dist/comm_internal.h"

#ifndef POLLRDHUP
#define POLLRDHUP 0 /* not Linux: a rank that leaves is seen by POLLHUP or at its next read */
#endif

#define TCP_MAGIC 0x43505247u /* "GRPC" */
#define TCP_VERSION 2 /* 2: all_to_all_v */
#define TCP_CHUNK ((size_t)4 << 20) /* bytes a rank sends before it reads its result */
#define TCP_HDR 32
#define TCP_MSG_MAX 512 /* longest error text in a REPLY */

enum { OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_BROADCAST, OP_ALL_TO_ALL, OP_BARRIER, OP_HELLO, OP_WELCOME, OP_REPLY };
static const char *op_names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all_v",
                                 "barrier",    "hello",          "welcome",    "reply"};
static const char *type_names[] = {"f32", "bf16", "i32", "u8"};

typedef struct {
    uint32_t magic, op, type;
    int32_t root;
    uint64_t seq, n;
} hdr;

typedef struct {
    int W, rank;
    int *fd; /* (W) the socket to rank q: rank 0 has fd[1..W-1], rank r > 0 only fd[0]; -1 else */
    int aborted; /* atomic: set by tcp_abort from any thread */
    uint64_t seq; /* collectives started on this rank */
    hdr *got; /* (W) rank 0: the headers of the current collective */
    unsigned char *have; /* (W) rank 0: got[q] arrived */
    struct pollfd *pfd; /* (W) rank 0: the header round's poll set */
    const void **in; /* (W) rank 0: the chunk of each rank to sum */
    char *chunks; /* rank 0: (W) chunk buffers, TCP_CHUNK bytes each: 1..W-1 receive, 0 the result */
} tgroup;

/* ---------------------------------------------------------------- header encoding */

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint64_t get64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void hdr_encode(const hdr *h, unsigned char b[TCP_HDR]) {
    put32(b, h->magic);
    put32(b + 4, h->op);
    put32(b + 8, h->type);
    put32(b + 12, (uint32_t)h->root);
    put64(b + 16, h->seq);
    put64(b + 24, h->n);
}
static hdr hdr_decode(const unsigned char b[TCP_HDR]) {
    return (hdr){get32(b), get32(b + 4), get32(b + 8), (int32_t)get32(b + 12), get64(b + 16), get64(b + 24)};
}

/* "broadcast n=7 f32 root 1 (call 3)": what a rank said it calls, for the disagreement message. */
static void hdr_describe(const hdr *h, char *s, size_t len) {
    if (h->magic != TCP_MAGIC || h->op > OP_BARRIER || h->type > COMM_U8) {
        snprintf(s, len, "an unknown message (magic %08x op %u)", (unsigned)h->magic, (unsigned)h->op);
        return;
    }
    int k = snprintf(s, len, "%s", op_names[h->op]);
    if (h->op != OP_BARRIER) k += snprintf(s + k, len - (size_t)k, " n=%llu %s", (unsigned long long)h->n, type_names[h->type]);
    if (h->op == OP_BROADCAST) k += snprintf(s + k, len - (size_t)k, " root %d", (int)h->root);
    snprintf(s + k, len - (size_t)k, " (call %llu)", (unsigned long long)h->seq);
}

/* ---------------------------------------------------------------- sockets */

static int is_aborted(tgroup *g) { return __atomic_load_n(&g->aborted, __ATOMIC_ACQUIRE); }

static void tcp_abort_group(tgroup *g) {
    __atomic_store_n(&g->aborted, 1, __ATOMIC_RELEASE);
    for (int q = 0; q < g->W; q++)
        if (g->fd[q] >= 0) shutdown(g->fd[q], SHUT_RDWR);
}

/* The error of a failed read or write on the socket to rank q (eof: it closed; else errno e). */
static int lost(tgroup *g, int q, int eof, int e) {
    if (is_aborted(g)) return err_set(GE_COMM, "comm: the group was aborted");
    if (g->rank == 0)
        return eof ? err_set(GE_COMM, "comm: rank %d closed its connection (it failed, left or aborted)", q)
                   : err_set(GE_COMM, "comm: the connection to rank %d: %s", q, strerror(e));
    return eof ? err_set(GE_COMM, "comm: rank 0 closed the connection (a rank failed or left, or the group was aborted)")
               : err_set(GE_COMM, "comm: the connection to rank 0: %s", strerror(e));
}

static int send_all(tgroup *g, int q, const void *p, size_t len) {
    const char *c = p;
    while (len) {
        ssize_t k = send(g->fd[q], c, len, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return lost(g, q, 0, errno);
        c += k;
        len -= (size_t)k;
    }
    return 0;
}

static int recv_all(tgroup *g, int q, void *p, size_t len) {
    char *c = p;
    while (len) {
        ssize_t k = recv(g->fd[q], c, len, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return lost(g, q, k == 0, errno);
        c += k;
        len -= (size_t)k;
    }
    return 0;
}

static int send_hdr(tgroup *g, int q, const hdr *h) {
    unsigned char b[TCP_HDR];
    hdr_encode(h, b);
    return send_all(g, q, b, TCP_HDR);
}

static int recv_hdr(tgroup *g, int q, hdr *h) {
    unsigned char b[TCP_HDR];
    int rc = recv_all(g, q, b, TCP_HDR);
    if (!rc) *h = hdr_decode(b);
    return rc;
}

/* ---------------------------------------------------------------- set-up */

static void no_delay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Waits until fd has ev (poll in slices of 50 ms), *cancel or the deadline: 0 or GE_COMM. */
static int wait_fd(int fd, short ev, const int *cancel, double deadline, const char *what) {
    for (;;) {
        if (cancel && __atomic_load_n(cancel, __ATOMIC_ACQUIRE)) return err_set(GE_COMM, "comm: cancelled while %s", what);
        double left = deadline - clock_mono_s();
        if (left <= 0) return err_set(GE_COMM, "comm: timed out while %s", what);
        struct pollfd p = {fd, ev, 0};
        int k = poll(&p, 1, left < 0.05 ? (int)(left * 1000) + 1 : 50);
        if (k > 0) return 0;
        if (k < 0 && errno != EINTR) return err_set(GE_COMM, "comm: poll while %s: %s", what, strerror(errno));
    }
}

/* Reads a header from a socket of the set-up, bounded by the deadline and *cancel. */
static int setup_recv_hdr(int fd, hdr *h, const int *cancel, double deadline, const char *what) {
    unsigned char b[TCP_HDR];
    for (size_t got = 0; got < TCP_HDR;) {
        int rc = wait_fd(fd, POLLIN, cancel, deadline, what);
        if (rc) return rc;
        ssize_t k = recv(fd, b + got, TCP_HDR - got, 0);
        if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (k == 0) return err_set(GE_COMM, "comm: the connection closed while %s", what);
        if (k < 0) return err_set(GE_COMM, "comm: %s: %s", what, strerror(errno));
        got += (size_t)k;
    }
    *h = hdr_decode(b);
    return 0;
}

static int setup_send_hdr(int fd, const hdr *h) {
    unsigned char b[TCP_HDR];
    hdr_encode(h, b);
    for (size_t sent = 0; sent < TCP_HDR;) { /* 32 bytes into an empty socket: does not block for long */
        ssize_t k = send(fd, b + sent, TCP_HDR - sent, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return err_set(GE_COMM, "comm: set-up: %s", strerror(errno));
        sent += (size_t)k;
    }
    return 0;
}

static int resolve(const char *host, int port, int passive, struct addrinfo **ai) {
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = passive ? AI_PASSIVE : 0};
    int e = getaddrinfo(host && *host ? host : NULL, ps, &hints, ai);
    return e ? err_set(GE_COMM, "comm: %s:%d: %s", host ? host : "*", port, gai_strerror(e)) : 0;
}

int comm_tcp_listen(const char *host, int port, int *fd, int *port_out) {
    *fd = -1;
    if (port < 0 || port > 65535) return err_set(GE_INVALID, "comm: port %d", port);
    struct addrinfo *ai;
    int rc = resolve(host, port, 1, &ai), s = -1, e = 0;
    if (rc) return rc;
    for (struct addrinfo *a = ai; a && s < 0; a = a->ai_next) {
        s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (s < 0) {
            e = errno;
            continue;
        }
        int one = 1;
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(s, a->ai_addr, a->ai_addrlen) || listen(s, SOMAXCONN)) {
            e = errno;
            close(s);
            s = -1;
        }
    }
    freeaddrinfo(ai);
    if (s < 0) return err_set(GE_IO, "comm: listen on %s:%d: %s", host ? host : "*", port, strerror(e));
    struct sockaddr_storage sa;
    socklen_t len = sizeof sa;
    if (getsockname(s, (struct sockaddr *)&sa, &len)) {
        e = errno;
        close(s);
        return err_set(GE_IO, "comm: getsockname: %s", strerror(e));
    }
    if (port_out)
        *port_out = ntohs(sa.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&sa)->sin6_port
                                                   : ((struct sockaddr_in *)&sa)->sin_port);
    *fd = s;
    return 0;
}

/* Rank 0: accepts W-1 ranks, each with a good HELLO, once. */
static int setup_accept(tgroup *g, int listen_fd, const int *cancel, double deadline) {
    int flags = fcntl(listen_fd, F_GETFL);
    if (flags < 0 || fcntl(listen_fd, F_SETFL, flags | O_NONBLOCK))
        return err_set(GE_COMM, "comm: the listening socket: %s", strerror(errno));
    char what[96];
    for (int joined = 0; joined < g->W - 1;) {
        snprintf(what, sizeof what, "waiting for ranks to connect (%d of %d joined)", joined, g->W - 1);
        int rc = wait_fd(listen_fd, POLLIN, cancel, deadline, what);
        if (rc) return rc;
        int s = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (s < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED) continue;
            return err_set(GE_COMM, "comm: accept: %s", strerror(errno));
        }
        no_delay(s);
        hdr h = {0};
        rc = setup_recv_hdr(s, &h, cancel, deadline, "reading a rank's hello");
        int r = h.root;
        if (!rc && (h.magic != TCP_MAGIC || h.op != OP_HELLO || h.type != TCP_VERSION))
            rc = err_set(GE_COMM, "comm: a connection that is not a grpod rank of protocol %d (magic %08x op %u version %u)",
                         TCP_VERSION, (unsigned)h.magic, (unsigned)h.op, (unsigned)h.type);
        else if (!rc && h.n != (uint64_t)g->W)
            rc = err_set(GE_COMM, "comm: rank %d says the group has %llu ranks, rank 0 %d", r, (unsigned long long)h.n, g->W);
        else if (!rc && (r < 1 || r >= g->W)) rc = err_set(GE_COMM, "comm: a hello from rank %d of a group of %d", r, g->W);
        else if (!rc && g->fd[r] >= 0) rc = err_set(GE_COMM, "comm: rank %d connected twice", r);
        if (rc) {
            close(s);
            return rc;
        }
        g->fd[r] = s;
        joined++;
    }
    hdr w = {TCP_MAGIC, OP_WELCOME, TCP_VERSION, 0, 0, (uint64_t)g->W};
    for (int q = 1; q < g->W; q++) {
        int rc = setup_send_hdr(g->fd[q], &w);
        if (rc) return err_set(rc, "comm: welcoming rank %d: %s", q, err_msg());
    }
    return 0;
}

/* Connects to host:port, retrying every 50 ms (rank 0 may not listen yet) until the deadline. */
static int setup_connect(const char *host, int port, const int *cancel, double deadline, int *out) {
    struct addrinfo *ai;
    int rc = resolve(host, port, 0, &ai), e = 0;
    if (rc) return rc;
    char what[160];
    snprintf(what, sizeof what, "connecting to rank 0 at %s:%d", host, port);
    for (;;) {
        for (struct addrinfo *a = ai; a; a = a->ai_next) {
            int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
            if (s < 0) {
                e = errno;
                continue;
            }
            int k = connect(s, a->ai_addr, a->ai_addrlen);
            if (k && errno == EINPROGRESS) {
                rc = wait_fd(s, POLLOUT, cancel, deadline, what);
                if (rc) {
                    close(s);
                    freeaddrinfo(ai);
                    return rc;
                }
                socklen_t len = sizeof e;
                if (getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &len)) e = errno;
                k = e ? -1 : 0;
            } else if (k) {
                e = errno;
            }
            if (k) {
                close(s);
                continue;
            }
            int flags = fcntl(s, F_GETFL);
            fcntl(s, F_SETFL, flags & ~O_NONBLOCK);
            no_delay(s);
            freeaddrinfo(ai);
            *out = s;
            return 0;
        }
        if (cancel && __atomic_load_n(cancel, __ATOMIC_ACQUIRE)) rc = err_set(GE_COMM, "comm: cancelled while %s", what);
        else if (clock_mono_s() + 0.05 > deadline)
            rc = err_set(GE_COMM, "comm: timed out while %s (last: %s)", what, strerror(e));
        if (rc) {
            freeaddrinfo(ai);
            return rc;
        }
        poll(NULL, 0, 50);
    }
}

/* ---------------------------------------------------------------- the collectives */

/* The header round on a rank r > 0: its header to rank 0, then rank 0's answer ("go", or why
 * not). 0 or GE_COMM. */
static int read_answer(tgroup *g, uint64_t seq);
static int ask_root(tgroup *g, const hdr *me) {
    int rc = send_hdr(g, 0, me);
    return rc ? rc : read_answer(g, me->seq);
}

/* A rank r > 0 reads rank 0's answer to call seq: 0 for "go", else GE_COMM with rank 0's reason. */
static int read_answer(tgroup *g, uint64_t seq) {
    hdr a;
    int rc = recv_hdr(g, 0, &a);
    if (rc) return rc;
    if (a.magic != TCP_MAGIC || a.op != OP_REPLY || a.seq != seq)
        return err_set(GE_COMM, "comm: rank 0 answered call %llu with op %u call %llu", (unsigned long long)seq, (unsigned)a.op,
                       (unsigned long long)a.seq);
    if (a.type == 0) return 0;
    char msg[TCP_MSG_MAX + 1] = "";
    size_t len = a.n < TCP_MSG_MAX ? (size_t)a.n : TCP_MSG_MAX;
    if ((rc = recv_all(g, 0, msg, len))) return rc;
    msg[len] = 0;
    return err_set(GE_COMM, "comm: rank 0 says %s", strncmp(msg, "comm: ", 6) ? msg : msg + 6);
}

/* Rank 0: every rank's header into got[] (poll: a rank that leaves meanwhile is seen at once, also
 * one that already sent its header and waits for the answer), each checked against me. */
static int gather_headers(tgroup *g, const hdr *me) {
    int W = g->W, left = W - 1, rc = 0;
    memset(g->have, 0, (size_t)W);
    while (left && !rc) {
        for (int q = 1; q < W; q++)
            g->pfd[q - 1] = (struct pollfd){g->fd[q], (short)(g->have[q] ? POLLRDHUP : POLLIN | POLLRDHUP), 0};
        int k = poll(g->pfd, (nfds_t)(W - 1), -1);
        if (k < 0 && errno != EINTR) rc = err_set(GE_COMM, "comm: poll: %s", strerror(errno));
        for (int q = 1; q < W && k > 0 && !rc; q++) {
            if (!g->pfd[q - 1].revents) continue;
            if (g->have[q]) return lost(g, q, 1, 0); /* it sent its header, then left */
            rc = recv_hdr(g, q, &g->got[q]);
            g->have[q] = !rc;
            left -= !rc;
        }
    }
    for (int q = 1; q < W && !rc; q++) {
        const hdr *h = &g->got[q];
        if (h->magic != me->magic || h->op != me->op || h->type != me->type || h->n != me->n || h->seq != me->seq ||
            (me->op == OP_BROADCAST && h->root != me->root)) {
            char a[96], b[96];
            hdr_describe(me, a, sizeof a);
            hdr_describe(h, b, sizeof b);
            rc = err_set(GE_COMM, "comm: ranks disagree: rank 0 %s, rank %d %s", a, q, b);
        }
    }
    return rc;
}

/* Rank 0 answers every rank "go" (rc 0) for call seq, or the error (rc, err_msg()) to every rank
 * still there (one yet to call reads it at its call; best effort: the abort follows). Returns
 * rc, or the error of a failed "go". */
static int answer(tgroup *g, uint64_t seq, int rc) {
    hdr a = {TCP_MAGIC, OP_REPLY, rc != 0, 0, seq, 0};
    char msg[TCP_MSG_MAX];
    if (rc) {
        snprintf(msg, sizeof msg, "%s", err_msg());
        a.n = strlen(msg);
    }
    for (int q = 1; q < g->W; q++) {
        if (!rc) {
            if ((rc = send_hdr(g, q, &a))) break;
        } else if (!is_aborted(g)) {
            unsigned char b[TCP_HDR];
            hdr_encode(&a, b);
            send(g->fd[q], b, TCP_HDR, MSG_NOSIGNAL | MSG_DONTWAIT);
            send(g->fd[q], msg, (size_t)a.n, MSG_NOSIGNAL | MSG_DONTWAIT);
        }
    }
    return rc;
}

/* The header round: rank 0 gathers and checks the headers, then answers every rank "go", or the
 * error (rc, err_msg()) to every rank still there (one yet to call reads it at its call; best
 * effort: the abort follows). 0 or GE_COMM. */
static int start(tgroup *g, int op, comm_type t, size_t n, int root) {
    if (is_aborted(g)) return err_set(GE_COMM, "comm: the group was aborted");
    hdr me = {TCP_MAGIC, (uint32_t)op, (uint32_t)t, root, ++g->seq, n};
    if (g->rank) return ask_root(g, &me);
    return answer(g, me.seq, gather_headers(g, &me));
}

/* Every failed collective aborts its comm (and on rank 0 the group): the stream is out of step. */
static int finish(tgroup *g, int rc) {
    if (rc) tcp_abort_group(g);
    return rc;
}

static size_t chunk_elems(comm_type t) { return TCP_CHUNK / comm_type_bytes(t); }

/* Rank 0: reads chunk (m elements) of every rank q > 0 into its buffer, and points in[q] at it;
 * in[0] is the caller's. */
static int gather_chunk(tgroup *g, const void *mine, size_t bytes) {
    g->in[0] = mine;
    for (int q = 1; q < g->W; q++) {
        char *b = g->chunks + (size_t)q * TCP_CHUNK;
        int rc = recv_all(g, q, b, bytes);
        if (rc) return rc;
        g->in[q] = b;
    }
    return 0;
}

static int tcp_all_reduce(comm *c, void *buf, size_t n, comm_type t) {
    tgroup *g = c->impl;
    int rc = start(g, OP_ALL_REDUCE, t, n, 0);
    size_t eb = comm_type_bytes(t), ce = chunk_elems(t);
    for (size_t off = 0; off < n && !rc; off += ce) {
        size_t m = n - off < ce ? n - off : ce;
        char *p = (char *)buf + off * eb;
        if (g->rank) {
            rc = send_all(g, 0, p, m * eb);
            if (!rc) rc = recv_all(g, 0, p, m * eb);
            continue;
        }
        rc = gather_chunk(g, p, m * eb);
        if (rc) break;
        comm_sum_ranks(p, g->in, g->W, 0, m, t); /* into rank 0's own chunk: element for element */
        for (int q = 1; q < g->W && !rc; q++) rc = send_all(g, q, p, m * eb);
    }
    return finish(g, rc);
}

static int tcp_reduce_scatter(comm *c, const void *in, void *out, size_t n, comm_type t) {
    tgroup *g = c->impl;
    int rc = start(g, OP_REDUCE_SCATTER, t, n, 0);
    size_t eb = comm_type_bytes(t), ce = chunk_elems(t);
    for (int d = 0; d < g->W && !rc; d++) /* rank d's shard, chunk by chunk */
        for (size_t off = 0; off < n && !rc; off += ce) {
            size_t m = n - off < ce ? n - off : ce;
            const char *p = (const char *)in + ((size_t)d * n + off) * eb;
            char *o = (char *)out + off * eb;
            if (g->rank) {
                rc = send_all(g, 0, p, m * eb); /* out may be in + rank * n: read before written */
                if (!rc && d == g->rank) rc = recv_all(g, 0, o, m * eb);
                continue;
            }
            rc = gather_chunk(g, p, m * eb);
            if (rc) break;
            if (d == 0) {
                comm_sum_ranks(o, g->in, g->W, 0, m, t); /* o may be p: element for element */
            } else {
                comm_sum_ranks(g->chunks, g->in, g->W, 0, m, t);
                rc = send_all(g, d, g->chunks, m * eb);
            }
        }
    return finish(g, rc);
}

static int tcp_all_gather(comm *c, const void *in, void *out, size_t n, comm_type t) {
    tgroup *g = c->impl;
    int rc = start(g, OP_ALL_GATHER, t, n, 0), r = g->rank, W = g->W;
    size_t eb = comm_type_bytes(t), ce = chunk_elems(t);
    char *o = out;
    for (size_t off = 0; off < n && !rc; off += ce) {
        size_t m = n - off < ce ? n - off : ce, bytes = m * eb;
        const char *p = (const char *)in + off * eb;
        char *own = o + ((size_t)r * n + off) * eb;
        if (r) rc = send_all(g, 0, p, bytes);
        if (!rc && own != p) memcpy(own, p, bytes); /* in may be out + rank * n */
        if (r) {
            for (int s = 0; s < W && !rc; s++)
                if (s != r) rc = recv_all(g, 0, o + ((size_t)s * n + off) * eb, bytes);
            continue;
        }
        for (int q = 1; q < W && !rc; q++) rc = recv_all(g, q, o + ((size_t)q * n + off) * eb, bytes);
        for (int q = 1; q < W && !rc; q++)
            for (int s = 0; s < W && !rc; s++)
                if (s != q) rc = send_all(g, q, o + ((size_t)s * n + off) * eb, bytes);
    }
    return finish(g, rc);
}

static int tcp_broadcast(comm *c, void *buf, size_t n, comm_type t, int root) {
    tgroup *g = c->impl;
    int rc = start(g, OP_BROADCAST, t, n, root), r = g->rank;
    size_t eb = comm_type_bytes(t), ce = chunk_elems(t);
    for (size_t off = 0; off < n && !rc; off += ce) {
        size_t m = n - off < ce ? n - off : ce;
        char *p = (char *)buf + off * eb;
        if (r) {
            rc = r == root ? send_all(g, 0, p, m * eb) : recv_all(g, 0, p, m * eb);
            continue;
        }
        if (root) rc = recv_all(g, root, p, m * eb);
        for (int q = 1; q < g->W && !rc; q++)
            if (q != root) rc = send_all(g, q, p, m * eb);
    }
    return finish(g, rc);
}

/* The counts round of an all-to-all-v (after "go"): rank 0 gathers every rank's 2 W counts into
 * cnt (W rows of send[W], recv[W]), checks the matrix and answers; ranks r > 0 send theirs and
 * read the answer. A bad matrix fails every rank with GE_COMM carrying rank 0's reason. */
static int a2a_counts(tgroup *g, const size_t *send, const size_t *recv, size_t *cnt) {
    int W = g->W, rc = 0;
    unsigned char *b = malloc((size_t)W * 16);
    if (!b) return err_set(GE_NOMEM, "comm: out of memory");
    if (g->rank) {
        for (int q = 0; q < W; q++) {
            put64(b + 8 * q, send[q]);
            put64(b + 8 * (W + q), recv[q]);
        }
        rc = send_all(g, 0, b, (size_t)W * 16);
        if (!rc) rc = read_answer(g, g->seq);
        free(b);
        return rc;
    }
    for (int q = 0; q < W; q++) {
        cnt[q] = send[q];
        cnt[W + q] = recv[q];
    }
    for (int q = 1; q < W && !rc; q++) {
        rc = recv_all(g, q, b, (size_t)W * 16);
        for (int j = 0; !rc && j < 2 * W; j++) cnt[(size_t)q * 2 * W + j] = (size_t)get64(b + 8 * j);
    }
    free(b);
    if (rc) return rc;
    const size_t **sp = malloc((size_t)W * sizeof *sp), **rp = malloc((size_t)W * sizeof *rp);
    if (!sp || !rp) rc = err_set(GE_NOMEM, "comm: out of memory");
    for (int q = 0; !rc && q < W; q++) {
        sp[q] = cnt + (size_t)q * 2 * W;
        rp[q] = cnt + (size_t)q * 2 * W + W;
    }
    if (!rc) rc = comm_check_a2a_counts(sp, rp, W);
    free(sp);
    free(rp);
    return answer(g, g->seq, rc);
}

/* Rank 0 passes part s -> d (bytes) from rank s to rank d through its first chunk buffer. */
static int relay(tgroup *g, int s, int d, size_t bytes) {
    int rc = 0;
    for (size_t off = 0; off < bytes && !rc; off += TCP_CHUNK) {
        size_t m = bytes - off < TCP_CHUNK ? bytes - off : TCP_CHUNK;
        rc = recv_all(g, s, g->chunks, m);
        if (!rc) rc = send_all(g, d, g->chunks, m);
    }
    return rc;
}

static int tcp_all_to_all_v(comm *c, const void *in, const size_t *send, void *out, const size_t *recv, comm_type t) {
    tgroup *g = c->impl;
    int W = g->W, r = g->rank;
    size_t eb = comm_type_bytes(t), *cnt = r ? NULL : malloc((size_t)W * 2 * W * sizeof *cnt);
    int rc = start(g, OP_ALL_TO_ALL, t, (size_t)W, 0);
    if (!rc && !r && !cnt) rc = err_set(GE_NOMEM, "comm: out of memory");
    if (!rc) rc = a2a_counts(g, send, recv, cnt);
    /* a part's place: s's input after its parts for ranks < d; d's output after its parts from ranks < s */
    size_t in_off = 0, out_off = 0;
    for (int s = 0; s < W && !rc; s++) {
        for (int d = 0; d < W && !rc; d++) {
            size_t n = r ? (s == r ? send[d] : d == r ? recv[s] : 0) : cnt[(size_t)s * 2 * W + d], bytes = n * eb;
            size_t io = in_off * eb, oo = out_off * eb;
            if (s == r) in_off += n;
            if (d == r) out_off += n;
            if (!bytes) continue; /* in or out is touched only for a part of this rank's (either may be NULL) */
            if (s == d) {
                if (s == r) memcpy((char *)out + oo, (const char *)in + io, bytes);
            } else if (s == r) {
                rc = send_all(g, r ? 0 : d, (const char *)in + io, bytes);
            } else if (d == r) {
                rc = recv_all(g, r ? 0 : s, (char *)out + oo, bytes);
            } else if (!r) {
                rc = relay(g, s, d, bytes);
            }
        }
    }
    free(cnt);
    return finish(g, rc);
}

static int tcp_barrier(comm *c) {
    tgroup *g = c->impl;
    return finish(g, start(g, OP_BARRIER, COMM_U8, 0, 0));
}

static void tcp_abort(comm *c) { tcp_abort_group(c->impl); }

static void group_free(tgroup *g) {
    if (!g) return;
    for (int q = 0; g->fd && q < g->W; q++)
        if (g->fd[q] >= 0) close(g->fd[q]);
    free(g->fd);
    free(g->got);
    free(g->have);
    free(g->pfd);
    free(g->in);
    free(g->chunks);
    free(g);
}

static void tcp_free(comm *c) {
    group_free(c->impl);
    free(c);
}

static const comm_ops tcp_ops = {tcp_all_reduce,   tcp_reduce_scatter, tcp_all_gather, tcp_broadcast,
                                 tcp_all_to_all_v, tcp_barrier,        tcp_abort,      tcp_free};

int comm_tcp_open(const char *host, int port, int rank, int W, int listen_fd, const int *cancel, double timeout_s, comm **out) {
    *out = NULL;
    tgroup *g = NULL;
    comm *c = NULL;
    int rc = 0;
    if (W < 1 || rank < 0 || rank >= W) rc = err_set(GE_INVALID, "comm: rank %d of %d", rank, W);
    else if (rank == 0 && W > 1 && listen_fd < 0)
        rc = err_set(GE_INVALID, "comm: rank 0 of %d ranks needs a listening socket", W);
    else if (rank > 0 && (!host || port <= 0 || port > 65535))
        rc = err_set(GE_INVALID, "comm: rank %d needs rank 0's host and port", rank);
    if (rc) goto fail;
    double deadline = timeout_s > 0 ? clock_mono_s() + timeout_s : 1e300;
    g = calloc(1, sizeof *g);
    c = calloc(1, sizeof *c);
    if (!g || !c || !(g->fd = malloc((size_t)W * sizeof *g->fd))) goto fail_nomem;
    g->W = W;
    g->rank = rank;
    for (int q = 0; q < W; q++) g->fd[q] = -1;
    if (rank == 0) {
        g->got = calloc((size_t)W, sizeof *g->got);
        g->have = calloc((size_t)W, 1);
        g->pfd = calloc((size_t)W, sizeof *g->pfd);
        g->in = calloc((size_t)W, sizeof *g->in);
        g->chunks = malloc((size_t)W * TCP_CHUNK);
        if (!g->got || !g->have || !g->pfd || !g->in || !g->chunks) goto fail_nomem;
        if (W > 1 && (rc = setup_accept(g, listen_fd, cancel, deadline))) goto fail;
        if (listen_fd >= 0) close(listen_fd);
    } else {
        hdr hello = {TCP_MAGIC, OP_HELLO, TCP_VERSION, rank, 0, (uint64_t)W}, w;
        if ((rc = setup_connect(host, port, cancel, deadline, &g->fd[0]))) goto fail;
        if ((rc = setup_send_hdr(g->fd[0], &hello))) goto fail;
        if ((rc = setup_recv_hdr(g->fd[0], &w, cancel, deadline, "waiting for every rank to join"))) goto fail;
        if (w.magic != TCP_MAGIC || w.op != OP_WELCOME || w.n != (uint64_t)W) {
            rc = err_set(GE_COMM, "comm: rank 0 did not welcome rank %d (op %u)", rank, (unsigned)w.op);
            goto fail;
        }
    }
    *c = (comm){.ops = &tcp_ops, .rank = rank, .size = W, .impl = g};
    *out = c;
    return 0;

fail_nomem:
    rc = err_set(GE_NOMEM, "comm: out of memory");
fail:
    group_free(g);
    free(c);
    if (rank == 0 && listen_fd >= 0) close(listen_fd);
    return rc;
}
