/* metrics.h — process-wide counters for GET /metrics (Prometheus text format 0.0.4).
 *
 * Counters live here; gauges that the store knows (jobs by kind/status, queue depth) are read
 * at scrape time by the caller and passed to metrics_render. Any thread may add (one mutex;
 * a handful of adds per request or job, never per token). */
#ifndef GRPOD_API_METRICS_H
#define GRPOD_API_METRICS_H
#include <stddef.h>

typedef enum {
    MT_ROLLOUT_PROMPT,
    MT_ROLLOUT_COMPLETION,
    MT_UPDATE_PACKED,
    MT_UPDATE_STANDARD,
    MT_LOGPROBS,
    MT_N_TOKEN_PHASES
} metrics_token_phase;
typedef enum {
    MS_ROLLOUT,
    MS_OLD,
    MS_REF,
    MS_POLICY,
    MS_OPTIMIZER,
    MS_LOGPROBS,
    MS_CHECKPOINT,
    MS_N_PHASES
} metrics_seconds_phase;

void metrics_http(const char *method, const char *route, int status);
void metrics_tokens(metrics_token_phase p, long long n);
void metrics_seconds(metrics_seconds_phase p, double s);
void metrics_groups_filtered(long long n);
void metrics_policy_version(long long v);
void metrics_store_bytes(long long n); /* the job store's size, read at each scrape */
/* Start-up replay (daemon/worker.c): updates re-applied so far of those to re-apply. */
void metrics_replay(long long done, long long total);

/* Rollout scheduler state, set by the engine thread after each scheduler step (and when a
 * job joins or leaves); rendered as grpod_rollout_* / grpod_kv_rows_* gauges. */
typedef struct {
    long long jobs; /* rollout jobs in the scheduler */
    long long running_groups, running_responses, waiting_groups;
    long long kv_rows_used, kv_rows_capacity, kv_row_bytes;
    long long state_rows_used, state_rows_capacity, state_row_bytes; /* hybrid models' recurrent state; else 0 */
    long long steps; /* scheduler steps so far (a counter) */
    /* the prefix cache (engine.h eng_sched_stats): entries now; prompt ids looked up and ids
     * copied from it since start (counters) */
    long long prefix_entries, prefix_query_tokens, prefix_hit_tokens;
} metrics_sched_gauges;
void metrics_sched(const metrics_sched_gauges *g);
void metrics_sched_get(metrics_sched_gauges *g); /* the last values set (the dashboard) */
/* The same per rank (daemon/ranks.h: one engine and scheduler each), set with the sums above;
 * rendered as grpod_ranks and grpod_rank_* {rank="r"} gauges. get: copies up to max, returns
 * the number of ranks (0 before the engine is up). */
#define METRICS_RANKS_MAX 64
void metrics_ranks(const metrics_sched_gauges *per_rank, int W);
int metrics_ranks_get(metrics_sched_gauges *per_rank, int max);

/* Caller-supplied gauges from the store, plus engine state. */
typedef struct {
    const char *kind, *status;
    long long n;
} metrics_job_count;
/* Appends the whole exposition to a malloc'd string (*out, *len). */
int metrics_render(const metrics_job_count *jobs, int n_jobs, long long queue_depth, int ready, int engine_failed, char **out,
                   size_t *len);
#endif
