/* store.h — grpod's durable job queue and history in SQLite (WAL, synchronous=FULL).
 *
 * A job is committed before the client sees 202; at open, jobs left 'running' by a crash return
 * to 'queued' (attempts counts how often a job was started). Payloads and results are JSON text
 * (the api layer builds them); the store never parses them.
 *
 * Threading: one store handle per thread (each opens its own SQLite connection to the same
 * file); SQLite serialises writers. Job ids are text ("j_" + 16 hex digits), unique. */
#ifndef GRPOD_STORE_H
#define GRPOD_STORE_H
#include <stddef.h>
#include <stdint.h>

typedef struct store store;

typedef enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE, JOB_FAILED, JOB_CANCELLED } store_status;
const char *store_status_name(store_status s); /* "queued" ... */

typedef struct {
    char id[32];
    char kind[16]; /* "rollout" | "update" | "checkpoint" | "logprobs" */
    store_status status;
    char *payload; /* JSON text (malloc'd) */
    char *result; /* JSON text or NULL */
    char *error; /* JSON text {"code","message"} or NULL */
    double created_at, started_at, finished_at; /* unix seconds, 0 = not yet */
    int attempts;
    long long policy_version; /* version the job ran against (or -1) */
    double progress; /* 0..1 */
    int cancel_requested; /* DELETE arrived while it ran: the engine should stop it */
    long long seq; /* insertion order (SQLite's rowid): store_list's cursor */
} store_job;
void store_job_clear(store_job *j); /* frees payload/result/error */

/* Opens (creating) DIR/grpod.db, migrates the schema to the current PRAGMA user_version, and
 * when recover != 0 returns 'running' jobs to 'queued'. Errors: GE_STORE with the SQLite message. */
int store_open(const char *path, int recover, store **out);
void store_close(store *s);

/* Inserts a queued job and commits durably; writes the new id into id_out (32 bytes).
 * GE_BUSY when max_queued > 0 and that many jobs are already queued. */
int store_submit(store *s, const char *kind, const char *payload, int max_queued, char *id_out);
/* Claims the oldest queued job (FIFO): status running, started_at, attempts + 1.
 * Returns 1 with *j filled, 0 when none is queued, or a negative error. */
int store_claim(store *s, store_job *j);
int store_finish(store *s, const char *id, const char *result, long long policy_version);
/* An update's completion and the policy version it made, in one transaction: GE_CONFLICT
 * (nothing written) when it advanced the version (after > before) and a done update already
 * holds version_after or a later one — a version names one set of weights. */
int store_finish_update(store *s, const char *id, const char *result, long long version_before, long long version_after);
/* Done updates with policy_version > version (those a checkpoint at version lacks), in the
 * order they were applied. Caller frees with store_jobs_free. */
int store_updates_after(store *s, long long version, store_job **jobs, int *n);
/* GE_UNAVAILABLE when DIR/grpod.db is no longer the file this handle opened (deleted, or replaced by
 * another file): writes would go nowhere the next start reads. submit, claim and
 * store_finish_update check it first. */
int store_check_file(store *s);
int store_fail(store *s, const char *id, const char *error_json);
/* running: started_at = now (a claimed job held until its turn, then run) */
int store_mark_started(store *s, const char *id);
int store_requeue(store *s, const char *id); /* running -> queued (shutdown) */
/* failed -> queued with attempts 0 (a job failed by the crash-loop guard, run again on
 * request); GE_CONFLICT when the job is not failed. */
int store_requeue_failed(store *s, const char *id);
/* Crash-loop guard, for after store_open(recover=1): queued jobs already started max_attempts
 * times (each start ended in a crash or a requeue) become failed with an "interrupted" error
 * code
 * instead of running again. Returns how many, or a negative error. */
int store_fail_exhausted(store *s, int max_attempts);
#define STORE_MAX_ATTEMPTS 3 /* the daemon's max_attempts: a job that crashed it this often fails */
int store_progress(store *s, const char *id, double progress);
/* Cancels a queued job (-> cancelled, returns 0); a running one is flagged and
 * store_cancel_requested reports it; GE_CONFLICT when already finished; GE_NOT_FOUND. */
int store_cancel(store *s, const char *id);
int store_cancel_requested(store *s, const char *id); /* 1 flagged, 0 not, <0 error */
/* The engine stopped a flagged running job: running -> cancelled. GE_CONFLICT if not running. */
int store_mark_cancelled(store *s, const char *id);
int store_get(store *s, const char *id, store_job *j); /* GE_NOT_FOUND */
/* A rollout's MoE routes (routing replay): an opaque blob (daemon/jobs.c's format), replaced
 * when put again, deleted with the job. get: malloc'd copy (free it), GE_NOT_FOUND when none. */
int store_routes_put(store *s, const char *id, const void *data, size_t n);
int store_routes_get(store *s, const char *id, void **data, size_t *n);
/* Lists newest first (insertion order); kind/status filters may be NULL; before > 0: only jobs
 * inserted before the one whose seq it is (the next page after a page ending there). Caller
 * frees with store_jobs_free. */
int store_list(store *s, const char *kind, const char *status, int limit, long long before, store_job **jobs, int *n);
void store_jobs_free(store_job *jobs, int n);
/* Counts by kind and status for /metrics: calls cb for each (kind, status, count). */
typedef void (*store_count_cb)(void *ud, const char *kind, const char *status, long long n);
int store_counts(store *s, store_count_cb cb, void *ud);
long long store_queue_depth(store *s);

/* Checkpoints index: (id, path, policy_version, created_at). Adding an id already there
 * updates its path and version and keeps its created_at. */
int store_checkpoint_add(store *s, const char *id, const char *path, long long policy_version);
typedef struct {
    char id[64];
    char path[512];
    long long policy_version;
    double created_at;
} store_ckpt;
int store_checkpoint_list(store *s, store_ckpt **out, int *n); /* newest first; free() */
int store_checkpoint_delete(store *s, const char *id); /* the index row; GE_NOT_FOUND */
/* Drops the stored inputs (payload, to "{}") of done updates with policy_version <= version:
 * replay from a checkpoint at that version or newer never reads them, and the API never
 * returns a payload (results stay). Returns how many, or a negative GE_* code. */
int store_prune_inputs(store *s, long long version);
/* Deletes finished jobs (done, failed, cancelled) beyond the newest keep (by finished_at), except
 * what replay still needs: done updates whose inputs are kept, and the rollouts such updates or
 * queued and running ones name. A database made by this version gives the freed pages back
 * (incremental vacuum); an older one reuses them for later rows: either way the file stops growing.
 * Returns how many, or a negative GE_* code. */
int store_retain(store *s, long long keep);
long long store_size_bytes(store *s); /* the database's pages in bytes; -1 when unknown */
/* Training history (the dashboard's data): one row per finished rollout or update, stats a
 * JSON object of its summary. list calls cb for the newest limit rows with id > after_id,
 * oldest first; the strings are valid during the call only. */
int store_history_add(store *s, const char *kind, long long policy_version, const char *stats);
typedef void (*store_history_cb)(void *ud, long long id, double at, const char *kind, long long policy_version, const char *stats);
int store_history_list(store *s, long long after_id, int limit, store_history_cb cb, void *ud);
#endif
