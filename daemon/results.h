/* results.h — the JSON a finished job stores as its result, written by rows: the mirror of the
 * payload rows (engine/params.h). A row names a member, its type and where its value sits in a
 * plain struct (offsetof), and the writer (results_json) walks the rows; objects and arrays are
 * rows whose sub-rows read the same struct or each element of an array. A job fills one struct
 * per result (results_update is the engine's own eng_update_result; rollouts, logprobs and
 * checkpoints have the views below) and writes it with its table (results_*_rows).
 *
 * A row that writes a value GET /metrics counts also adds it there (.feed), so the result and
 * the counters are one pass over the same numbers.
 *
 * Threading: any thread; /metrics' counters take their own lock (api/metrics.h). */
#ifndef GRPOD_DAEMON_RESULTS_H
#define GRPOD_DAEMON_RESULTS_H
#include <stddef.h>

#include <json-c/json.h>

#include "engine/engine.h"

typedef enum {
    RT_INT, /* int at off */
    RT_I64, /* long long at off */
    RT_NUM, /* double at off */
    RT_FINITE, /* double at off; not finite: 0 */
    RT_QUOT, /* long long at off / long long at n_off, as a number; 0 when the divisor is 0 */
    RT_STR, /* const char * at off */
    RT_TEXT, /* const char * at off, size_t length at n_off (may hold NULs) */
    RT_CHOICE, /* int at off: the name of choice off in choices "a|b|…" */
    RT_IDS, /* const int * at off, int count at n_off: [ids] */
    RT_LPS, /* const float * at off, int count at n_off: [numbers], not finite: -1e30 */
    RT_IDS_K, /* const int * at off, (count, k): int count at n_off, int k at k_off: [[k ids], …] */
    RT_LPS_K, /* the same of floats, not finite: -1e30 */
    RT_OBJ, /* {sub's rows}, over the same struct */
    RT_ARR, /* [{sub's rows}, …]: int count at n_off structs of sub->size at the pointer at off */
    RT_JSON, /* json_object * at off: a deep copy; NULL: left out */
} results_type;

enum {
    RF_IF = 1, /* left out unless the int at when is nonzero */
    RF_OR_NULL = 2, /* null unless the int at when is nonzero */
};

/* The /metrics counter a row's value adds to (api/metrics.h); RT_INT, RT_I64 and RT_NUM rows. */
typedef enum {
    RM_NONE,
    RM_TOKENS, /* metrics_tokens(metric, value) */
    RM_SECONDS, /* metrics_seconds(metric, value / 1e3): the row holds milliseconds */
    RM_GROUPS_FILTERED, /* metrics_groups_filtered(value) */
    RM_POLICY_VERSION, /* metrics_policy_version(value) */
} results_feed;

struct results_rows;
typedef struct {
    const char *name; /* the JSON member */
    results_type type;
    int off, n_off, k_off; /* offsetof in the struct */
    const struct results_rows *sub; /* RT_OBJ, RT_ARR */
    const char *choices; /* RT_CHOICE */
    int flags, when; /* RF_*; when: offsetof an int */
    results_feed feed;
    int metric; /* the feed's metrics_token_phase or metrics_seconds_phase */
} results_row;

typedef struct results_rows {
    const results_row *rows;
    int n;
    size_t size; /* sizeof the struct (an RT_ARR's element) */
} results_rows;

/* The rows' object for the struct at src (NULL on out of memory), its counters added to /metrics. */
json_object *results_json(const results_rows *t, const void *src);
/* The same as JSON text (malloc'd; NULL with err_set on out of memory). */
char *results_text(const results_rows *t, const void *src);

/* ---------------------------------------------------------------- the results */

/* An update's: eng_update_result itself. */
extern const results_rows results_update_rows;

/* A rollout's, view of the scheduler's responses with their rewards (daemon/jobs.c fills it). */
typedef struct {
    const int *tokens;
    int n_tokens;
    const char *text; /* valid UTF-8 (api_utf8_sanitize) */
    size_t text_len;
    const float *logprobs; /* (n_tokens) */
    const int *top_ids; /* (n_tokens, top_k), as eng_response */
    const float *top_lps;
    int top_k; /* 0: no top_ids and top_logprobs */
    int finish; /* eng_finish */
    int scored; /* the group has a reward spec: reward is a number, else null */
    double reward;
} results_response;
typedef struct {
    const int *prompt;
    int P;
    int cached_tokens;
    int scored; /* scored and n > 0: reward_mean and reward_std are numbers, else null */
    double reward_mean, reward_std;
    json_object *metadata; /* the request's, copied; NULL: none */
    const results_response *resp;
    int n;
} results_group;
typedef struct {
    long long policy_version;
    const results_group *groups;
    int n_groups;
    long long prompt_tokens, completion_tokens, cached_tokens;
    double ms_total;
} results_rollout;
extern const results_rows results_rollout_rows;

/* A logprobs job's. */
typedef struct {
    const float *logprobs; /* (R) */
    const int *top_ids; /* (R, top_k) */
    const float *top_lps;
    int R, top_k; /* top_k 0: no top_ids and top_logprobs */
} results_scored;
typedef struct {
    const results_scored *resp;
    int n;
} results_scored_group;
typedef struct {
    const results_scored_group *groups;
    int n_groups;
    int model; /* ENG_LP_POLICY | ENG_LP_REFERENCE */
    long long policy_version;
} results_logprobs;
extern const results_rows results_logprobs_rows;

/* A checkpoint's. */
typedef struct {
    const char *id, *path;
    long long policy_version;
} results_checkpoint;
extern const results_rows results_checkpoint_rows;
#endif
