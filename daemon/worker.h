/* worker.h — the engine thread: opens the model (eng_open must run on this thread), then
 * claims jobs from the store in FIFO order and runs them (daemon/jobs.c): consecutive rollouts
 * together in the continuous-batching scheduler, an update or checkpoint alone once the
 * rollouts before it finished; it wakes long-pollers after each change. It beats a heartbeat at least every 100 ms while idle and from the
 * engine's progress callback while busy, which the watchdog timer in serve.c reads.
 *
 * Lifecycle: worker_start → (worker_wake on every submit) → worker_stop (rollouts that have
 * started finish, the other claimed jobs go back to the queue; optionally checkpoint unsaved
 * updates; close the engine) → worker_join. */
#ifndef GRPOD_DAEMON_WORKER_H
#define GRPOD_DAEMON_WORKER_H
#include "api/http.h"

typedef struct worker worker;

typedef struct {
    const char *data_dir;
    const char *model_dir; /* NULL or "": the embedded default model in data_dir */
    const char *backend;
    const char *optimizer_offload; /* "auto" (NULL) | "on" | "off" (eng_open_opts) */
    int moments_bf16; /* eng_open_opts.optimizer_moments "bf16" (--optimizer-moments bf16) */
    int expert_parallel; /* eng_open_opts.expert_parallel (--expert-parallel) */
    int n_threads; /* CPU threads in all; each of the ranks gets an equal share */
    int ranks; /* W engines in this process (daemon/ranks.h); 0 or 1 = one */
    const int *devices; /* (ranks) CUDA device of each rank (--gpus), or NULL: device 0
                                     * with one rank, rank r on device r with several on cuda */
    int checkpoint_on_exit; /* save a checkpoint at stop when updates are unsaved */
    long long keep_checkpoints; /* > 0: after each checkpoint keep only the newest N */
    long long retain_jobs; /* > 0: finished jobs kept beyond what replay needs (store_retain) */
    long long kv_budget_mib; /* rollout KV pool; 0 = the engine's default (eng_sched_opts) */
    int lora_rank;
    float lora_alpha; /* LoRA (eng_open_opts); rank 0 = off */
    const char *lora_targets, *lora_init;
    api_server *api;
    struct cluster *cluster; /* --followers: the leader of ranks in other processes
                                     * (daemon/cluster.h); NULL: every rank is in this process */
    /* Called on the engine thread: model loaded (ready), engine failed, state changed
     * (policy version / queue). The callee must only signal (uv_async_send). */
    void (*notify)(void *ud);
    void *ud;
} worker_config;

int worker_start(const worker_config *c, worker **out);
void worker_wake(worker *w);
void worker_stop(worker *w);
void worker_join(worker *w); /* frees w */
int worker_finished(worker *w); /* the engine thread is done: worker_join will not block */

/* --engine-threads 0: the engine threads of a process on this machine (worker.c says why). */
int worker_default_threads(void);

/* Read from any thread. */
double worker_heartbeat_age(worker *w); /* seconds since the last beat */
int worker_ready(worker *w); /* 1 loaded, 0 loading, -1 failed */
long long worker_policy_version(worker *w);
#endif
