/* follow.h — `grpod serve --join URL`: a follower of a leader (daemon/cluster.h). It serves no
 * HTTP at all (it binds nothing): it joins the leader over the leader's authenticated API,
 * opens its ranks' engines in the leader's world (one communicator of every rank), then runs each
 * SPMD call the leader hands out (GET /v1/cluster/next) on its ranks with jobs_follow and posts
 * the outcome, beating a heartbeat every second meanwhile. When the leader goes away (its
 * requests fail for the leader's lost_s, or it answers 410) the follower closes its engines and
 * joins again, retrying each second until a leader answers; SIGTERM/SIGINT stop it. */
#ifndef GRPOD_DAEMON_FOLLOW_H
#define GRPOD_DAEMON_FOLLOW_H

typedef struct {
    const char *url; /* http://host:port of the leader */
    const char *api_key; /* the leader's key (NULL or "": none) */
    const char *data_dir; /* default-model/ when model_dir is empty */
    const char *model_dir;
    const char *backend; /* cpu | cuda (auto resolved by the caller) */
    const char *optimizer_offload;
    int moments_bf16; /* --optimizer-moments bf16 */
    int ranks; /* local ranks */
    const int *devices; /* cuda: the devices of the local ranks, or NULL */
    int n_threads; /* CPU threads in all (0: the default) */
    long long kv_budget_mib;
} follow_config;

/* Runs until SIGTERM/SIGINT; returns the process's exit status. */
int follow_main(const follow_config *c);
#endif
