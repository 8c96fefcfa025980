/* jobs.h — running one stored job on the engine thread: the canonical payload (JSON text
 * written by api/validate.c) → engine calls → the result JSON text the store keeps.
 *
 * Threading: engine thread only (it calls eng_rollout / eng_sched_* / eng_update / ...). The payload was
 * validated at submit; a payload that still fails to parse fails the job, never asserts. */
#ifndef GRPOD_DAEMON_JOBS_H
#define GRPOD_DAEMON_JOBS_H
#include "daemon/ranks.h"
#include "engine/engine.h"
#include "store/store.h"

typedef struct {
    eng *e; /* rank 0's engine */
    ranks *rk; /* every rank (daemon/ranks.h): updates, logprobs and checkpoints
                                 * run on all of them (SPMD), rollouts are placed on them */
    store *st; /* the engine thread's own handle */
    const char *data_dir;
    eng_progress_cb progress; /* heartbeat + store progress */
    void *progress_ud;
} jobs_env;

/* Runs j. Returns 0 with *result (malloc'd JSON text) or a negative GE_* code with err_msg()
 * saying why (the caller stores {"code","message"}). */
int jobs_run(const jobs_env *env, const store_job *j, char **result);
/* eng_update_undo on every rank (worker.c: an update whose completion could not be stored). */
int jobs_update_undo(const jobs_env *env);

/* A checkpoint job whose files are written beside the engine's next work (worker.c): start
 * (engine thread) captures the state on every rank (the engine stalls only for that copy) and
 * starts rank 0's file writer on a thread of its own; poll (engine thread) returns 0 while it
 * writes, 1 when the checkpoint is written and indexed in the store with *result (malloc'd
 * JSON), or a negative GE_* code with err_msg(); wake(wake_ud) is called from the writer when it
 * ends. Until poll returned nonzero no update, undo or other checkpoint may run
 * (eng_checkpoint_capture's contract); rollouts and logprobs may. free joins the writer. */
typedef struct jobs_ckpt jobs_ckpt;
int jobs_checkpoint_start(const jobs_env *env, const store_job *j, void (*wake)(void *), void *wake_ud, jobs_ckpt **out);
int jobs_checkpoint_poll(const jobs_env *env, jobs_ckpt *c, char **result);
void jobs_checkpoint_free(jobs_ckpt *c);

/* A follower (daemon/follow.c) runs one SPMD call the leader described (daemon/ranks.h
 * ranks_spmd_call: {"op": update|logprobs|checkpoint|undo, "payload", "rollout", "dir",
 * "merged"}) on its local ranks, converted by the same code as jobs_run; env->st is not used.
 * 0 or the call's GE_* code (the ranks' outcome, which the leader compares with its own). */
int jobs_follow(const jobs_env *env, const char *call);

/* A rollout job running in the continuous-batching schedulers next to others (worker.c):
 * start parses the payload and queues its groups on the ranks' schedulers (ranks_place; the
 * parts are merged in the request's order when all are done) (GE_TOO_LARGE when a group can
 * never fit the KV pool: the job fails at once); poll returns 0 while it runs, 1 when done with
 * *result (malloc'd JSON), or a negative GE_* code with err_msg() saying why; free releases
 * it (a running one is cancelled: its streams stop and their KV rows are freed). */
typedef struct jobs_rollout jobs_rollout;
int jobs_rollout_start(const jobs_env *env, const store_job *j, jobs_rollout **out);
int jobs_rollout_poll(jobs_rollout *r, double *progress, int *started, char **result);
/* After poll returned 1: stores the rollout's MoE routes under its job id (daemon/moe_routes.h), for
 * an update's routing replay; nothing for a dense model or when a part has none (a remote
 * rank's). 0 or the store's error. */
int jobs_rollout_keep_routes(const jobs_rollout *r, store *st, const char *id);
void jobs_rollout_free(jobs_rollout *r);
/* The responses sampled so far, for a streaming reply: fn(ud, group in the request, response,
 * its tokens so far, k: sampling.top_logprobs). Rank 0's parts from its scheduler (the one this thread steps), a peer
 * rank's from the copy it makes after each step once peeked (ranks_job_peek: fn runs under that
 * peer's mutex), a follower's from what it posted so far. */
typedef void (*jobs_peek_cb)(void *ud, int group, int resp, const eng_response *x, int k);
void jobs_rollout_peek(const jobs_rollout *r, jobs_peek_cb fn, void *ud);
/* A follower's share of a leader's rollout (daemon/cluster.c): desc, a rollout payload with
 * the groups' indices in the leader's request ("group_index") and its policy version (another
 * one here fails it), queued whole on local rank `rank`; then as a rollout job (poll, free). */
int jobs_part_start(const jobs_env *env, const char *desc, int rank, jobs_rollout **out);
#endif
