/* comm.h — collectives among the W ranks of one deployment. The engine sees ranks,
 * never NCCL: a comm is a small table with three implementations,
 *   cpu  (comm_cpu.c): W ranks as threads of one process, sharing host buffers; the reference,
 *        and what `make test` runs the multi-rank engine on;
 *   tcp  (comm_tcp.c): W ranks in separate processes or hosts (or threads), cpu backend, over
 *        TCP through rank 0, which sums exactly as the cpu comm does (the same bits);
 *   nccl (comm_nccl.cu, CUDA builds): one rank per GPU (and per process or host), collectives
 *        on the backend's op stream.
 *
 * Semantics (every rank calls the same collective with the same n, type and root, in the same
 * order; buffers are in the backend's memory: host on cpu, device on cuda):
 *   all_reduce_sum     buf (n) in place: the element-wise sum over ranks.
 *   reduce_scatter_sum in (W * n), out (n): out on rank r = sum over ranks of in[r*n .. r*n+n).
 *                      out may be in + r*n (in place).
 *   all_gather         in (n), out (W * n): out[q*n .. q*n+n) = in of rank q. in may be out + r*n.
 *   broadcast          buf (n): root's buf to every rank.
 *   all_to_all_v       in (Σ_q send[q]): rank r's parts for ranks 0..W-1, one after another;
 *                      out (Σ_q recv[q]): the parts from ranks 0..W-1, one after another.
 *                      Counts in elements of t, any of them 0; recv[q] on rank r must equal
 *                      send[r] on rank q (exchange the counts first: an all-gather); the cpu
 *                      and tcp comms check it (an error on every rank, naming the pair; the
 *                      tcp group is then aborted), NCCL trusts it. A
 *                      copy of bytes: every type, bit-exact on every comm. out must not
 *                      overlap in.
 *   barrier            returns when every rank has entered it.
 * Sums: the cpu and tcp comms add in rank order 0..W-1 with an fp32 accumulator (int32 for
 * COMM_I32), so the result is bit-identical on every rank, from run to run and between the two,
 * and rounded once for bf16.
 * COMM_U8 has no sum (copies only). NCCL sums in its own order (the ring), the same on every
 * rank of one call; see comm_nccl.cu.
 *
 * Errors: 0, or a negative GE_* code (GE_COMM once the group was aborted: every pending and later
 * call on every rank returns it; GE_INVALID for a bad argument). comm_abort may be called from
 * any thread, also while other ranks block in a collective; it is how one failed rank makes the
 * others fail together instead of waiting forever.
 *
 * Ownership: the caller owns a comm (the engine does not free the one in eng_open_opts); each
 * rank's comm is used from one thread at a time. comm_free after every rank is done with it. */
#ifndef GRPOD_COMM_H
#define GRPOD_COMM_H
#include <stddef.h>

typedef struct comm comm;
typedef enum { COMM_F32, COMM_BF16, COMM_I32, COMM_U8 } comm_type;

static inline size_t comm_type_bytes(comm_type t) { return t == COMM_BF16 ? 2 : t == COMM_U8 ? 1 : 4; }

int comm_rank(const comm *c);
int comm_size(const comm *c);
int comm_all_reduce_sum(comm *c, void *buf, size_t n, comm_type t);
int comm_reduce_scatter_sum(comm *c, const void *in, void *out, size_t n_per_rank, comm_type t);
int comm_all_gather(comm *c, const void *in, void *out, size_t n_per_rank, comm_type t);
int comm_broadcast(comm *c, void *buf, size_t n, comm_type t, int root);
int comm_all_to_all_v(comm *c, const void *in, const size_t *send, void *out, const size_t *recv, comm_type t);
int comm_barrier(comm *c);
void comm_abort(comm *c);
void comm_free(comm *c);

/* W in-process comms (out[0..W-1]) sharing one group, rank i = out[i]; each rank used from its own
 * thread. Free each with comm_free (the group goes with the last). 0 or GE_NOMEM / GE_INVALID. */
int comm_cpu_group(int W, comm **out);

/* TCP (cpu backend; buffers in host memory): rank 0 listens, ranks 1..W-1 connect to it.
 * comm_tcp_listen binds host:port (host NULL or "": every address; port 0: the kernel picks one)
 * so rank 0 can tell the others its port (*port_out) before the collective set-up; 0, or GE_IO
 * (bind, listen) / GE_COMM (host not resolved). comm_tcp_open makes rank `rank`'s comm: rank 0
 * passes the listening fd (it accepts W-1 connections, then closes it: the fd is the call's,
 * whatever it returns), the others -1 and connect to host:port (retrying until the timeout: rank
 * 0 may not listen yet). Every rank says its rank and W; rank 0 fails the set-up when a rank
 * connects twice or disagrees about W. Like comm_nccl_open it blocks until all W ranks joined;
 * set-up ends with GE_COMM when *cancel (may be NULL) becomes non-zero or timeout_s passes
 * (timeout_s <= 0: no limit). A collective whose ranks disagree (op, n, type, root, or the call
 * count) fails with GE_COMM naming them; a rank that dies or closes its comm fails rank 0's
 * collective, and rank 0 then aborts the group. Blocking sockets, 4 MiB chunks; rank 0 holds W
 * chunk buffers, not the ranks' buffers. Each group's ranks must share a byte order. */
int comm_tcp_listen(const char *host, int port, int *fd, int *port_out);
int comm_tcp_open(const char *host, int port, int rank, int W, int listen_fd, const int *cancel, double timeout_s, comm **out);

/* NCCL (CUDA builds; GE_UNSUPPORTED in a CPU-only build). The unique id is made once (rank 0,
 * or the leader) and handed to every rank out of band; comm_nccl_open blocks until all W ranks
 * joined, or until *cancel (when not NULL) becomes non-zero: the way another rank that failed
 * before joining releases the ranks waiting for it (GE_COMM). be is the rank's CUDA backend:
 * collectives run on its op stream; the open makes its device the calling thread's current one. */
struct eng_backend;
int comm_nccl_unique_id(unsigned char id[128]);
int comm_nccl_open(const unsigned char id[128], int rank, int W, struct eng_backend *be, const int *cancel, comm **out);

/* The table behind a comm, for its implementations (comm_cpu.c, comm_tcp.c, comm_nccl.cu);
 * callers use the functions above. */
typedef struct {
    int (*all_reduce_sum)(comm *c, void *buf, size_t n, comm_type t);
    int (*reduce_scatter_sum)(comm *c, const void *in, void *out, size_t n, comm_type t);
    int (*all_gather)(comm *c, const void *in, void *out, size_t n, comm_type t);
    int (*broadcast)(comm *c, void *buf, size_t n, comm_type t, int root);
    int (*all_to_all_v)(comm *c, const void *in, const size_t *send, void *out, const size_t *recv, comm_type t);
    int (*barrier)(comm *c);
    void (*abort)(comm *c);
    void (*free)(comm *c);
} comm_ops;
struct comm {
    const comm_ops *ops;
    int rank, size;
    void *impl;
};
#endif
