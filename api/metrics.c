/* metrics.c — counters and the Prometheus text exposition; see metrics.h. */
#include "api/metrics.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/sbuf.h"
#include "common/err.h"

#define MAX_HTTP_SERIES 256

typedef struct {
    char method[8];
    char route[40];
    int status;
    long long n;
} http_series;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static http_series http[MAX_HTTP_SERIES];
static int n_http;
static long long tokens[MT_N_TOKEN_PHASES];
static double seconds[MS_N_PHASES];
static long long groups_filtered;
static long long policy_version;
static long long store_bytes = -1; /* -1: not read yet */
static long long replay_done, replay_total;
static metrics_sched_gauges sched;
static metrics_sched_gauges rank_sched[METRICS_RANKS_MAX];
static int n_ranks;

static const char *const token_names[] = {"rollout_prompt", "rollout_completion", "update_packed", "update_standard", "logprobs"};
static const char *const phase_names[] = {"rollout",          "update_old", "update_ref", "update_policy",
                                          "update_optimizer", "logprobs",   "checkpoint"};

void metrics_http(const char *method, const char *route, int status) {
    pthread_mutex_lock(&mu);
    int i;
    for (i = 0; i < n_http; i++)
        if (http[i].status == status && !strcmp(http[i].route, route) && !strcmp(http[i].method, method)) break;
    if (i == n_http && n_http < MAX_HTTP_SERIES) {
        snprintf(http[i].method, sizeof http[i].method, "%s", method);
        snprintf(http[i].route, sizeof http[i].route, "%s", route);
        http[i].status = status;
        n_http++;
    }
    if (i < n_http) http[i].n++;
    pthread_mutex_unlock(&mu);
}
void metrics_tokens(metrics_token_phase p, long long n) {
    pthread_mutex_lock(&mu);
    tokens[p] += n;
    pthread_mutex_unlock(&mu);
}
void metrics_seconds(metrics_seconds_phase p, double s) {
    pthread_mutex_lock(&mu);
    seconds[p] += s;
    pthread_mutex_unlock(&mu);
}
void metrics_groups_filtered(long long n) {
    pthread_mutex_lock(&mu);
    groups_filtered += n;
    pthread_mutex_unlock(&mu);
}
void metrics_policy_version(long long v) {
    pthread_mutex_lock(&mu);
    policy_version = v;
    pthread_mutex_unlock(&mu);
}
void metrics_store_bytes(long long n) {
    pthread_mutex_lock(&mu);
    store_bytes = n;
    pthread_mutex_unlock(&mu);
}
void metrics_replay(long long done, long long total) {
    pthread_mutex_lock(&mu);
    replay_done = done;
    replay_total = total;
    pthread_mutex_unlock(&mu);
}
void metrics_sched(const metrics_sched_gauges *g) {
    pthread_mutex_lock(&mu);
    sched = *g;
    pthread_mutex_unlock(&mu);
}
void metrics_sched_get(metrics_sched_gauges *g) {
    pthread_mutex_lock(&mu);
    *g = sched;
    pthread_mutex_unlock(&mu);
}
void metrics_ranks(const metrics_sched_gauges *per_rank, int W) {
    pthread_mutex_lock(&mu);
    n_ranks = W < METRICS_RANKS_MAX ? W : METRICS_RANKS_MAX;
    memcpy(rank_sched, per_rank, sizeof *per_rank * (size_t)n_ranks);
    pthread_mutex_unlock(&mu);
}
int metrics_ranks_get(metrics_sched_gauges *per_rank, int max) {
    pthread_mutex_lock(&mu);
    int n = n_ranks;
    memcpy(per_rank, rank_sched, sizeof *per_rank * (size_t)(n < max ? n : max));
    pthread_mutex_unlock(&mu);
    return n;
}

int metrics_render(const metrics_job_count *jobs, int n_jobs, long long queue_depth, int ready, int engine_failed, char **out,
                   size_t *len) {
    api_sbuf b = {0};
    api_sb_printf(&b, "# HELP grpod_jobs Jobs in the store by kind and status.\n# TYPE grpod_jobs gauge\n");
    for (int i = 0; i < n_jobs; i++)
        api_sb_printf(&b, "grpod_jobs{kind=\"%s\",status=\"%s\"} %lld\n", jobs[i].kind, jobs[i].status, jobs[i].n);
    api_sb_printf(&b,
                  "# HELP grpod_queue_depth Jobs waiting to run.\n# TYPE grpod_queue_depth gauge\n"
                  "grpod_queue_depth %lld\n",
                  queue_depth);
    pthread_mutex_lock(&mu);
    long long sbytes = store_bytes;
    pthread_mutex_unlock(&mu);
    if (sbytes >= 0)
        api_sb_printf(&b,
                      "# HELP grpod_store_bytes Size of the job store (grpod.db) in bytes.\n# TYPE grpod_store_bytes gauge\n"
                      "grpod_store_bytes %lld\n",
                      sbytes);
    api_sb_printf(&b,
                  "# HELP grpod_ready 1 when the model is loaded and the engine healthy.\n# TYPE grpod_ready gauge\n"
                  "grpod_ready %d\n",
                  ready && !engine_failed);
    api_sb_printf(&b,
                  "# HELP grpod_engine_failed 1 when the engine hit a fatal error.\n# TYPE grpod_engine_failed gauge\n"
                  "grpod_engine_failed %d\n",
                  engine_failed);
    pthread_mutex_lock(&mu);
    api_sb_printf(&b,
                  "# HELP grpod_policy_version Current policy version (updates applied).\n"
                  "# TYPE grpod_policy_version gauge\ngrpod_policy_version %lld\n",
                  policy_version);
    api_sb_printf(
        &b,
        "# HELP grpod_replay_updates_total Completed updates to re-apply at start (after the newest valid checkpoint).\n"
        "# TYPE grpod_replay_updates_total gauge\ngrpod_replay_updates_total %lld\n"
        "# HELP grpod_replay_updates_done Of those, re-applied so far.\n"
        "# TYPE grpod_replay_updates_done gauge\ngrpod_replay_updates_done %lld\n",
        replay_total, replay_done);
    api_sb_printf(&b,
                  "# HELP grpod_rollout_jobs_running Rollout jobs in the continuous-batching scheduler.\n"
                  "# TYPE grpod_rollout_jobs_running gauge\ngrpod_rollout_jobs_running %lld\n",
                  sched.jobs);
    api_sb_printf(&b,
                  "# HELP grpod_rollout_running_groups Prompt groups admitted and decoding.\n"
                  "# TYPE grpod_rollout_running_groups gauge\ngrpod_rollout_running_groups %lld\n",
                  sched.running_groups);
    api_sb_printf(&b,
                  "# HELP grpod_rollout_running_responses Responses decoding in the batch.\n"
                  "# TYPE grpod_rollout_running_responses gauge\ngrpod_rollout_running_responses %lld\n",
                  sched.running_responses);
    api_sb_printf(&b,
                  "# HELP grpod_rollout_waiting_groups Groups of running jobs waiting for KV rows.\n"
                  "# TYPE grpod_rollout_waiting_groups gauge\ngrpod_rollout_waiting_groups %lld\n",
                  sched.waiting_groups);
    api_sb_printf(&b,
                  "# HELP grpod_kv_rows_used KV cache rows held by running groups.\n"
                  "# TYPE grpod_kv_rows_used gauge\ngrpod_kv_rows_used %lld\n",
                  sched.kv_rows_used);
    api_sb_printf(&b,
                  "# HELP grpod_kv_rows_capacity Rows of the rollout KV pool.\n"
                  "# TYPE grpod_kv_rows_capacity gauge\ngrpod_kv_rows_capacity %lld\n",
                  sched.kv_rows_capacity);
    api_sb_printf(&b,
                  "# HELP grpod_kv_row_bytes Device bytes of one KV row (all layers, K and V).\n"
                  "# TYPE grpod_kv_row_bytes gauge\ngrpod_kv_row_bytes %lld\n",
                  sched.kv_row_bytes);
    api_sb_printf(&b,
                  "# HELP grpod_state_rows_used Recurrent-state rows (hybrid models) held by running groups: a prompt's and "
                  "one per response.\n"
                  "# TYPE grpod_state_rows_used gauge\ngrpod_state_rows_used %lld\n"
                  "# HELP grpod_state_rows_capacity Recurrent-state rows beside the KV pool (0: the model has no linear "
                  "attention).\n"
                  "# TYPE grpod_state_rows_capacity gauge\ngrpod_state_rows_capacity %lld\n"
                  "# HELP grpod_state_row_bytes Device bytes of one state row (every DeltaNet layer's state and conv tail).\n"
                  "# TYPE grpod_state_row_bytes gauge\ngrpod_state_row_bytes %lld\n",
                  sched.state_rows_used, sched.state_rows_capacity, sched.state_row_bytes);
    api_sb_printf(&b,
                  "# HELP grpod_rollout_steps_total Scheduler steps (one batched decode each).\n"
                  "# TYPE grpod_rollout_steps_total counter\ngrpod_rollout_steps_total %lld\n",
                  sched.steps);
    api_sb_printf(&b,
                  "# HELP grpod_prefix_cache_entries Finished responses whose KV rows the prefix cache keeps.\n"
                  "# TYPE grpod_prefix_cache_entries gauge\ngrpod_prefix_cache_entries %lld\n"
                  "# HELP grpod_prefix_cache_queries_total Prompt tokens of admitted groups, looked up in the prefix cache.\n"
                  "# TYPE grpod_prefix_cache_queries_total counter\ngrpod_prefix_cache_queries_total %lld\n"
                  "# HELP grpod_prefix_cache_hits_total Of those, tokens whose K/V were copied from it, not prefilled.\n"
                  "# TYPE grpod_prefix_cache_hits_total counter\ngrpod_prefix_cache_hits_total %lld\n",
                  sched.prefix_entries, sched.prefix_query_tokens, sched.prefix_hit_tokens);
    api_sb_printf(&b,
                  "# HELP grpod_ranks Engines of this deployment (one per GPU, or --ranks on the CPU backend).\n"
                  "# TYPE grpod_ranks gauge\ngrpod_ranks %d\n",
                  n_ranks);
    static const struct {
        const char *name, *help;
        size_t off;
    } rank_gauges[] = {
        {"kv_rows_used", "KV cache rows held by running groups, per rank.", offsetof(metrics_sched_gauges, kv_rows_used)},
        {"kv_rows_capacity", "Rows of each rank's rollout KV pool.", offsetof(metrics_sched_gauges, kv_rows_capacity)},
        {"running_groups", "Prompt groups decoding on each rank.", offsetof(metrics_sched_gauges, running_groups)},
        {"waiting_groups", "Groups waiting for KV rows on each rank.", offsetof(metrics_sched_gauges, waiting_groups)},
        {"steps", "Scheduler steps each rank took (a counter).", offsetof(metrics_sched_gauges, steps)},
    };
    for (size_t k = 0; k < sizeof rank_gauges / sizeof rank_gauges[0]; k++) {
        api_sb_printf(&b, "# HELP grpod_rank_%s %s\n# TYPE grpod_rank_%s gauge\n", rank_gauges[k].name, rank_gauges[k].help,
                      rank_gauges[k].name);
        for (int r = 0; r < n_ranks; r++)
            api_sb_printf(&b, "grpod_rank_%s{rank=\"%d\"} %lld\n", rank_gauges[k].name, r,
                          *(const long long *)((const char *)&rank_sched[r] + rank_gauges[k].off));
    }
    api_sb_printf(&b, "# HELP grpod_tokens_total Tokens processed by phase.\n# TYPE grpod_tokens_total counter\n");
    for (int i = 0; i < MT_N_TOKEN_PHASES; i++)
        api_sb_printf(&b, "grpod_tokens_total{phase=\"%s\"} %lld\n", token_names[i], tokens[i]);
    double ratio = tokens[MT_UPDATE_PACKED] ? (double)tokens[MT_UPDATE_STANDARD] / (double)tokens[MT_UPDATE_PACKED] : 0;
    api_sb_printf(&b,
                  "# HELP grpod_packed_token_ratio Standard N(P+R) over packed P+NR tokens, over all updates.\n"
                  "# TYPE grpod_packed_token_ratio gauge\ngrpod_packed_token_ratio %.4f\n",
                  ratio);
    api_sb_printf(&b, "# HELP grpod_seconds_total Engine seconds by phase.\n# TYPE grpod_seconds_total counter\n");
    for (int i = 0; i < MS_N_PHASES; i++)
        api_sb_printf(&b, "grpod_seconds_total{phase=\"%s\"} %.6f\n", phase_names[i], seconds[i]);
    api_sb_printf(&b,
                  "# HELP grpod_groups_filtered_total Groups dropped by filter_groups (all rewards equal).\n"
                  "# TYPE grpod_groups_filtered_total counter\ngrpod_groups_filtered_total %lld\n",
                  groups_filtered);
    api_sb_printf(&b,
                  "# HELP grpod_http_requests_total HTTP requests by method, route and status code.\n"
                  "# TYPE grpod_http_requests_total counter\n");
    for (int i = 0; i < n_http; i++)
        api_sb_printf(&b, "grpod_http_requests_total{method=\"%s\",route=\"%s\",code=\"%d\"} %lld\n", http[i].method,
                      http[i].route, http[i].status, http[i].n);
    pthread_mutex_unlock(&mu);
    if (b.oom) {
        free(b.p);
        return err_set(GE_NOMEM, "metrics: out of memory");
    }
    *out = b.p;
    *len = b.len;
    return 0;
}
