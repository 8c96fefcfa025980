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

/* What one scrape renders: the caller's values and, under the mutex, the counters above. */
typedef struct {
    const metrics_job_count *jobs;
    int n_jobs;
    long long queue_depth, store_bytes, ready, engine_failed, policy_version, replay_total, replay_done, ranks, groups_filtered;
    metrics_sched_gauges s;
} scrape;

typedef struct series series;
/* Appends a family's samples (the lines after its HELP and TYPE). */
typedef void put_samples(api_sbuf *b, const series *r, const scrape *x);
/* One metric family: grpod_NAME, its type and help, and where its value sits: a long long at
 * off in the scrape, unless put writes labelled samples or a number of another kind. */
struct series {
    const char *name, *type, *help;
    size_t off;
    put_samples *put;
    int omit_negative; /* the family is left out while its value is -1 (not read yet) */
};

static void put_jobs(api_sbuf *b, const series *r, const scrape *x) {
    for (int i = 0; i < x->n_jobs; i++)
        api_sb_printf(b, "grpod_jobs{kind=\"%s\",status=\"%s\"} %lld\n", x->jobs[i].kind, x->jobs[i].status, x->jobs[i].n);
}
/* a rank gauge: off is its member of metrics_sched_gauges */
static void put_rank(api_sbuf *b, const series *r, const scrape *x) {
    for (int k = 0; k < n_ranks; k++)
        api_sb_printf(b, "grpod_%s{rank=\"%d\"} %lld\n", r->name, k, *(const long long *)((const char *)&rank_sched[k] + r->off));
}
static void put_tokens(api_sbuf *b, const series *r, const scrape *x) {
    for (int i = 0; i < MT_N_TOKEN_PHASES; i++)
        api_sb_printf(b, "grpod_tokens_total{phase=\"%s\"} %lld\n", token_names[i], tokens[i]);
}
static void put_packed_ratio(api_sbuf *b, const series *r, const scrape *x) {
    double ratio = tokens[MT_UPDATE_PACKED] ? (double)tokens[MT_UPDATE_STANDARD] / (double)tokens[MT_UPDATE_PACKED] : 0;
    api_sb_printf(b, "grpod_packed_token_ratio %.4f\n", ratio);
}
static void put_seconds(api_sbuf *b, const series *r, const scrape *x) {
    for (int i = 0; i < MS_N_PHASES; i++)
        api_sb_printf(b, "grpod_seconds_total{phase=\"%s\"} %.6f\n", phase_names[i], seconds[i]);
}
static void put_http(api_sbuf *b, const series *r, const scrape *x) {
    for (int i = 0; i < n_http; i++)
        api_sb_printf(b, "grpod_http_requests_total{method=\"%s\",route=\"%s\",code=\"%d\"} %lld\n", http[i].method,
                      http[i].route, http[i].status, http[i].n);
}

#define X_(m) .off = offsetof(scrape, m)
#define G_(m) .off = offsetof(scrape, s.m)
#define R_(m) .off = offsetof(metrics_sched_gauges, m), .put = put_rank
/* The exposition, in the order it is written. */
static const series families[] = {
    {"jobs", "gauge", "Jobs in the store by kind and status.", .put = put_jobs},
    {"queue_depth", "gauge", "Jobs waiting to run.", X_(queue_depth)},
    {"store_bytes", "gauge", "Size of the job store (grpod.db) in bytes.", X_(store_bytes), .omit_negative = 1},
    {"ready", "gauge", "1 when the model is loaded and the engine healthy.", X_(ready)},
    {"engine_failed", "gauge", "1 when the engine hit a fatal error.", X_(engine_failed)},
    {"policy_version", "gauge", "Current policy version (updates applied).", X_(policy_version)},
    {"replay_updates_total", "gauge", "Completed updates to re-apply at start (after the newest valid checkpoint).",
     X_(replay_total)},
    {"replay_updates_done", "gauge", "Of those, re-applied so far.", X_(replay_done)},
    {"rollout_jobs_running", "gauge", "Rollout jobs in the continuous-batching scheduler.", G_(jobs)},
    {"rollout_running_groups", "gauge", "Prompt groups admitted and decoding.", G_(running_groups)},
    {"rollout_running_responses", "gauge", "Responses decoding in the batch.", G_(running_responses)},
    {"rollout_waiting_groups", "gauge", "Groups of running jobs waiting for KV rows.", G_(waiting_groups)},
    {"kv_rows_used", "gauge", "KV cache rows held by running groups.", G_(kv_rows_used)},
    {"kv_rows_capacity", "gauge", "Rows of the rollout KV pool.", G_(kv_rows_capacity)},
    {"kv_row_bytes", "gauge", "Device bytes of one KV row (all layers, K and V).", G_(kv_row_bytes)},
    {"state_rows_used", "gauge", "Recurrent-state rows (hybrid models) held by running groups: a prompt's and one per response.",
     G_(state_rows_used)},
    {"state_rows_capacity", "gauge", "Recurrent-state rows beside the KV pool (0: the model has no linear attention).",
     G_(state_rows_capacity)},
    {"state_row_bytes", "gauge", "Device bytes of one state row (every DeltaNet layer's state and conv tail).", G_(state_row_bytes)},
    {"rollout_steps_total", "counter", "Scheduler steps (one batched decode each).", G_(steps)},
    {"prefix_cache_entries", "gauge", "Finished responses whose KV rows the prefix cache keeps.", G_(prefix_entries)},
    {"prefix_cache_queries_total", "counter", "Prompt tokens of admitted groups, looked up in the prefix cache.",
     G_(prefix_query_tokens)},
    {"prefix_cache_hits_total", "counter", "Of those, tokens whose K/V were copied from it, not prefilled.", G_(prefix_hit_tokens)},
    {"ranks", "gauge", "Engines of this deployment (one per GPU, or --ranks on the CPU backend).", X_(ranks)},
    {"rank_kv_rows_used", "gauge", "KV cache rows held by running groups, per rank.", R_(kv_rows_used)},
    {"rank_kv_rows_capacity", "gauge", "Rows of each rank's rollout KV pool.", R_(kv_rows_capacity)},
    {"rank_running_groups", "gauge", "Prompt groups decoding on each rank.", R_(running_groups)},
    {"rank_waiting_groups", "gauge", "Groups waiting for KV rows on each rank.", R_(waiting_groups)},
    {"rank_steps", "gauge", "Scheduler steps each rank took (a counter).", R_(steps)},
    {"tokens_total", "counter", "Tokens processed by phase.", .put = put_tokens},
    {"packed_token_ratio", "gauge", "Standard N(P+R) over packed P+NR tokens, over all updates.", .put = put_packed_ratio},
    {"seconds_total", "counter", "Engine seconds by phase.", .put = put_seconds},
    {"groups_filtered_total", "counter", "Groups dropped by filter_groups (all rewards equal).", X_(groups_filtered)},
    {"http_requests_total", "counter", "HTTP requests by method, route and status code.", .put = put_http},
};

int metrics_render(const metrics_job_count *jobs, int n_jobs, long long queue_depth, int ready, int engine_failed, char **out,
                   size_t *len) {
    api_sbuf b = {0};
    pthread_mutex_lock(&mu);
    scrape x = {.jobs = jobs,
                .n_jobs = n_jobs,
                .queue_depth = queue_depth,
                .store_bytes = store_bytes,
                .ready = ready && !engine_failed,
                .engine_failed = engine_failed,
                .policy_version = policy_version,
                .replay_total = replay_total,
                .replay_done = replay_done,
                .ranks = n_ranks,
                .groups_filtered = groups_filtered,
                .s = sched};
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++) {
        const series *r = &families[i];
        long long v = r->put ? 0 : *(const long long *)((const char *)&x + r->off);
        if (r->omit_negative && v < 0) continue;
        api_sb_printf(&b, "# HELP grpod_%s %s\n# TYPE grpod_%s %s\n", r->name, r->help, r->name, r->type);
        if (r->put) r->put(&b, r, &x);
        else api_sb_printf(&b, "grpod_%s %lld\n", r->name, v);
    }
    pthread_mutex_unlock(&mu);
    if (b.oom) {
        free(b.p);
        return err_set(GE_NOMEM, "metrics: out of memory");
    }
    *out = b.p;
    *len = b.len;
    return 0;
}
