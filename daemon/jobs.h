/* jobs.h — running one stored job on the engine thread: the canonical payload (JSON text
 * written by api/validate.c) → engine calls → the result JSON text the store keeps.
 *
 * Threading: engine thread only (it calls eng_rollout / eng_update / ...). The payload was
 * validated at submit; a payload that still fails to parse fails the job, never asserts. */
#ifndef GRPOD_DAEMON_JOBS_H
#define GRPOD_DAEMON_JOBS_H
#include "engine/engine.h"
#include "store/store.h"

typedef struct {
    eng *e;
    store *st;                  /* the engine thread's own handle */
    const char *data_dir;
    eng_progress_cb progress;   /* heartbeat + store progress */
    void *progress_ud;
} jobs_env;

/* Runs j. Returns 0 with *result (malloc'd JSON text) or a negative GE_* code with err_msg()
 * saying why (the caller stores {"code","message"}). */
int jobs_run(const jobs_env *env, const store_job *j, char **result);
#endif
