/* cluster.h — the leader of a deployment whose ranks span processes (`grpod serve
 * --followers K`; docs/data-parallel.md "Several hosts"). Followers (daemon/follow.c, `grpod
 * serve --join URL`) join over the leader's authenticated HTTP API (the cluster routes of
 * api/http.h); once K joined the leader hands out the world (each process's first rank, the
 * world size, the communicator's rendezvous: the tcp address its rank 0 listens on, or NCCL's
 * unique id) and every rank, the leader's own included, opens one communicator of that world.
 * From then on the leader drives every SPMD call (daemon/ranks.h ranks_remote): it queues the
 * call's description, each follower long-polls it (GET /v1/cluster/next), runs it on its ranks
 * and posts its code (POST /v1/cluster/done).
 *
 * A follower is lost when no request of it (a heartbeat each second) came for lost_s: the
 * leader aborts its local ranks' communicators (the collective they wait in returns GE_COMM),
 * the call waiting for the followers returns GE_RANK_LOST (the running job fails rank_lost),
 * /readyz says 503 naming the follower and new calls fail at once. Recovery is crash-only: the
 * next join (the lost follower back, restarted by systemd) makes the leader stop and execute
 * itself again (serve.h SERVE_REEXEC; exit CLUSTER_EXIT_RESTART when that fails, and on a stop
 * while a follower is lost), and the new image opens a new epoch: every rank a fresh
 * communicator, the engines from the newest checkpoint plus replay (worker.c's open_engine),
 * the follower's join retried until the leader answers again.
 *
 * Threads: the hook runs on HTTP threads, cluster_form / cluster_attach on the engine thread,
 * the ranks_remote calls on the engine thread, cluster_tick on the main loop; all under one mutex. */
#ifndef GRPOD_DAEMON_CLUSTER_H
#define GRPOD_DAEMON_CLUSTER_H
#include <stddef.h>

#include "api/http.h"
#include "daemon/ranks.h"

#define CLUSTER_EXIT_RESTART 75 /* EX_TEMPFAIL: a follower was lost; restart for a new epoch */

typedef struct cluster cluster;

typedef struct {
    int followers; /* K >= 1 */
    const char *host; /* the address the tcp rendezvous binds and advertises */
    double lost_s; /* a follower silent this long is lost */
    api_server *api; /* /readyz's reason while waiting, and when a follower is lost */
    void (*on_restart)(void *ud); /* a join after a loss: the process should exit (any thread; only signal) */
    void *ud;
} cluster_config;

int cluster_open(const cluster_config *c, cluster **out);
void cluster_close(cluster *cl);
/* The api_cluster_fn of api/http.h (ud = the cluster). */
int cluster_hook(void *ud, int route, long long follower, long long after, const char *body, size_t len, char **reply);

/* Engine thread: waits until every follower joined (GE_UNAVAILABLE when *stop became non-zero),
 * makes the rendezvous (cpu: comm_tcp_listen; cuda: an NCCL unique id) and the world: this
 * process's W0 ranks are 0..W0-1, the followers' next in join order. resume: the checkpoint the
 * engines open from (the followers open it too: it must be readable at that path on their hosts).
 * expert_parallel: the leader's --expert-parallel, which the world hands to every follower (its
 * engines must split the experts as the leader's do). */
int cluster_form(cluster *cl, int W0, const char *backend, const char *resume, int expert_parallel, const _Atomic int *stop,
                 ranks_world *wd);
/* rk's SPMD calls from now on reach the followers (ranks_set_remote); detach before ranks_close. */
void cluster_attach(cluster *cl, ranks *rk);
void cluster_detach(cluster *cl);
/* Main loop, every 200 ms: declares a silent follower lost. */
void cluster_tick(cluster *cl);
int cluster_lost(cluster *cl);
int cluster_restart_wanted(cluster *cl);
#endif
