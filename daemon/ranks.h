/* ranks.h — the W ranks of one deployment inside one process: rank 0 is the worker's engine
 * thread (daemon/worker.c: it claims jobs and owns the store), ranks 1..W-1 are peer threads
 * started here, each with its own engine (eng_open on that thread: its backend, its CUDA
 * device, its communicator) and its own rollout scheduler. W = 1 has no peers and no
 * communicator: every call below then goes straight to rank 0's scheduler, exactly as the
 * worker did before ranks.
 *
 * W > 1 ranks share one communicator (engine/dist/comm.h), made here: on the cpu backend a
 * comm_cpu_group of W (ranks_close frees it), on cuda an NCCL unique id that each rank's
 * eng_open joins (the engine owns its NCCL comm). With it the engines are data-parallel
 * (engine/train/dp.c): each holds 1/W of the optimizer state and trains on its share of an update's
 * groups; the weights stay whole on every rank, so any rank can decode any rollout.
 *
 * Two kinds of work reach the peers:
 *  - rollouts (no collectives): the worker places whole groups on ranks (ranks_place, by KV
 *    rows) and adds them to that rank's scheduler (ranks_add); each rank steps its own
 *    scheduler, and the worker reads each part's state (ranks_job_state) and merges the parts;
 *  - SPMD calls (eng_update, eng_update_undo, eng_logprobs, eng_checkpoint_save, replay):
 *    ranks_spmd runs one function on every rank's thread with that rank's engine, the same
 *    inputs on each, rank 0's share on the calling thread, and waits for all of them
 *    (engine/dist/comm.h's contract: every rank makes the same collective calls in the same order,
 *    so a function must not skip a collective call on some ranks).
 *
 * Threading: every ranks_* call except ranks_heartbeat_age comes from rank 0's
 * thread (the worker). Peers never touch the store or the HTTP side. */
#ifndef GRPOD_DAEMON_RANKS_H
#define GRPOD_DAEMON_RANKS_H
#include "engine/engine.h"

#define RANKS_MAX 64

typedef struct ranks ranks;
typedef struct ranks_job ranks_job;

/* Makes the group's communicator (W > 1) and starts ranks 1..W-1: each thread opens an engine
 * with o (its n_threads as given; backend "auto" resolved as eng_open resolves it), rank r's
 * communicator and device devices[r] (NULL: 0 with one rank, r on cuda with W), and a
 * scheduler with so. Rank 0's own engine is the caller's: it opens it with ranks_open_rank0
 * while the peers open theirs (a communicator's set-up is collective: NCCL's blocks until all
 * W ranks joined), then ranks_set_rank0. Returns at once. notify (may be NULL) is called on a peer's thread when one of its parts
 * finished or failed, or it ran out of work: the callee must only signal (worker_wake). */
/* world (NULL: this process's W ranks are the whole group) puts them into a larger group that
 * spans processes (daemon/cluster.c, docs/data-parallel.md "Several hosts"): they are ranks
 * base..base+W-1 of world, every one (rank 0's too) with one communicator of that group: cpu,
 * a comm_tcp_open to host:port (the process whose base is 0 passes listen_fd, from
 * comm_tcp_listen; the others -1), made on each rank's thread, rank 0's inside ranks_start,
 * which then blocks until the whole world connected (or timeout_s, or ranks_cancel_open); cuda,
 * the leader's NCCL id with rank base + r. */
typedef struct {
    int base, world;
    const char *host;
    int port, listen_fd;
    const unsigned char *nccl_id; /* [128] */
    double timeout_s;
} ranks_world;
int ranks_start(int W, const eng_open_opts *o, const int *devices, const eng_sched_opts *so, void (*notify)(void *ud), void *ud,
                const ranks_world *world, ranks **out);
/* Opens rank 0's engine into *e on the caller's thread: o gets rank 0's share of ranks_start's
 * settings (its communicator when W > 1, its device when devices were given; the pointers set
 * stay valid until ranks_close). A failure releases the peers waiting in the communicator's
 * set-up; returns when every peer opened too: 0, rank 0's own error, or the error of the peer
 * that failed first (err_msg() naming the rank). */
int ranks_open_rank0(ranks *rk, eng_open_opts *o, eng **e);
/* The communicator's kind, for logs: "none" (one rank), "cpu" or "nccl". */
const char *ranks_comm_name(const ranks *rk);
/* Rank 0's own open failed, or the daemon is stopping: every rank still waiting in the
 * communicator's set-up gives up (a peer whose open fails does the same by itself). Any thread;
 * no effect once the set-up is done. */
void ranks_cancel_open(ranks *rk);
void ranks_set_rank0(ranks *rk, eng *e, eng_sched *sched);

/* Closing, in this order: ranks_stop (the peers release their jobs and close their schedulers
 * and engines, on their threads), the caller closes rank 0's engine meanwhile (NCCL's
 * finalize waits for every rank), then ranks_close joins the peers, frees the communicator
 * (no engine uses it any more) and rk. ranks_close alone stops the peers first; both take
 * NULL. */
void ranks_stop(ranks *rk);
void ranks_close(ranks *rk);
int ranks_size(const ranks *rk);

/* ---------------------------------------------------------------- SPMD */

/* fn runs on every rank's thread with its engine and a progress callback that beats that
 * rank's heartbeat (rank 0: cb0/ud0); it returns 0 or a GE_* code (err_set). Returns rank 0's
 * code when every rank returned the same; when they differ, GE_INTERNAL naming the ranks, and
 * ranks_diverged says 1 from then on (their states may differ: the caller stops taking work). */
typedef int (*ranks_fn)(eng *e, int rank, eng_progress_cb cb, void *ud, void *arg);
int ranks_spmd(ranks *rk, ranks_fn fn, void *arg, eng_progress_cb cb0, void *ud0);
int ranks_diverged(const ranks *rk);

/* Ranks in other processes (the leader of daemon/cluster.c): with a remote set, every SPMD call
 * must come with its description (ranks_spmd_call's call: JSON text the followers run through
 * jobs_follow), which post queues for every follower before the local ranks start; the call
 * ends when the local ranks and wait (the followers' outcome: 0, their code with msg, or
 * GE_RANK_LOST when one was lost) are done. A follower's code unlike rank 0's is "the ranks
 * disagree" (ranks_diverged); GE_RANK_LOST wins over the local ranks' GE_COMM (its echo). */
/* Rollouts on the followers' ranks (W..world-1 of the leader's world): part_add hands a part
 * (desc: a rollout payload of its groups, daemon/jobs.c) to the follower that holds rank, which
 * decodes it on its own ranks and sends the groups back into out (n of them); part_state is 0
 * while it runs, 1 once out is filled, or a negative GE_* code with msg (GE_RANK_LOST when the
 * follower was lost); part_release forgets it (a running one is cancelled on the follower);
 * part_peek hands fn the tokens the follower sent so far (its first call asks the follower to
 * send them as it samples: a streaming reply taps the job). */
typedef void (*ranks_peek_cb)(void *ud, int group, int resp, const eng_response *x, int k);
typedef struct {
    int (*post)(void *ud, const char *call, long long *seq);
    int (*wait)(void *ud, long long seq, char *msg, size_t n);
    int (*part_add)(void *ud, int rank, const char *desc, int top, eng_group_result *out, int n, long long *id);
    int (*part_state)(void *ud, long long id, char *msg, size_t n);
    void (*part_release)(void *ud, long long id);
    void (*part_peek)(void *ud, long long id, ranks_peek_cb fn, void *fn_ud);
    void *ud;
} ranks_remote;
void ranks_set_remote(ranks *rk, const ranks_remote *r);
int ranks_has_remote(const ranks *rk);
int ranks_spmd_call(ranks *rk, ranks_fn fn, void *arg, eng_progress_cb cb0, void *ud0, const char *call);
/* comm_abort on every local rank's communicator (cpu and tcp comms; on cuda each open engine's
 * NCCL comm): a collective they wait in returns GE_COMM. Any thread, while rk is open. */
void ranks_abort(ranks *rk);

/* ---------------------------------------------------------------- rollouts */

/* Picks a rank for each of n groups (rows[i] = eng_sched_rows_needed of group i) in order:
 * the rank with the fewest rows placed and not yet released, lowest rank on ties; with remote
 * parts (a leader), over every rank of the world. Deterministic given the rows in flight. */
void ranks_place(ranks *rk, const long long *rows, int n, int *rank_of);
/* The ranks ranks_place picks from (W, or the world with remote parts), and whether rank r is
 * in another process (its part goes as a description: ranks_add's desc). */
int ranks_placeable(const ranks *rk);
int ranks_is_remote(const ranks *rk, int r);
/* Queues groups on rank r's scheduler (as eng_sched_add; the arrays stay the caller's until
 * ranks_job_release). rows: their KV rows, counted against r until the release. On a peer the
 * add happens on its thread: its error (GE_TOO_LARGE) shows in ranks_job_state. A remote rank
 * takes desc (the part as a rollout payload) instead of g and sp, and fills out when done. */
int ranks_add(ranks *rk, int r, const eng_rollout_group *g, int n, const eng_sampling *sp, eng_group_result *out, long long rows,
              const char *desc, ranks_job **job);
/* The remote side says a part changed (any thread): wakes the worker (ranks_start's notify). */
void ranks_notify(ranks *rk);
/* As eng_sched_job_state, for a part on any rank (a peer's state as of its last step). */
int ranks_job_state(ranks *rk, ranks_job *j, double *progress, int *started, const char **msg);
/* As eng_sched_job_release; on a peer it waits until the peer released it. */
/* The tokens j's responses sampled so far, for a streaming reply: fn(ud, group in j, response,
 * x: its tokens, logprobs and n_tokens, and with sampling.top_logprobs k > 0 its top_ids and
 * top_lps) for each response with any, on the caller's thread. Rank 0's are read
 * from its scheduler; a peer's from the copy the peer makes after each step once a part was
 * peeked (so the first peek may see none), fn then running under the peer's mutex (it must not
 * call ranks_*); a follower's from what it posted so far (ranks_remote.part_peek: the first
 * peek asks it to post them as it samples; fn then runs under the cluster's mutex). */
void ranks_job_peek(ranks *rk, ranks_job *j, ranks_peek_cb fn, void *ud);
void ranks_job_release(ranks *rk, ranks_job *j);

/* Rank 0 steps its scheduler when busy (peers step theirs on their own threads). */
int ranks_step(ranks *rk);
int ranks_busy(ranks *rk); /* some rank has a group waiting or running (or one on its way) */
/* some rank would start a group queued now (a remote rank: fewer rows placed on it than rank
 * 0's pool holds, the followers' GPUs taken to be like the leader's) */
int ranks_can_admit(ranks *rk);
/* Scheduler stats: st[r] for each rank (peers as of their last step); returns W. */
int ranks_stats(ranks *rk, eng_sched_stats *st, int max);

/* Seconds since the stalest peer's beat (0 without peers). Any thread. */
double ranks_heartbeat_age(ranks *rk);
#endif
