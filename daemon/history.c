/* history.c — one history row per finished rollout or update (the dashboard's data, kept in
 * the store so it survives restarts): the job's result reduced to what is plotted per policy
 * version, written by rows (daemon/results.h). Called on the engine thread right after the job's
 * outcome is stored; a failure to record is logged, never fails the job. Not here: serving it
 * (api/dashboard.c). */
#include "daemon/history.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "common/err.h"
#include "common/log.h"
#include "daemon/results.h"

static double num(json_object *o, const char *k1, const char *k2) {
    json_object *v = NULL;
    if (!json_object_object_get_ex(o, k1, &v)) return 0;
    if (k2 && !json_object_object_get_ex(v, k2, &v)) return 0;
    return json_object_get_double(v);
}

/* ---------------------------------------------------------------- the points, by rows */

/* rollout: the mean and spread (std over responses) of the rewards it scored, its size and speed */
typedef struct {
    int scored; /* responses with a reward: reward_mean and reward_std are written */
    double reward_mean, reward_std;
    long long responses;
    double completion_tokens, ms, tokens_per_s;
} rollout_point;
#define RP_(f) (int)offsetof(rollout_point, f)
static const results_row rollout_rows[] = {
    {.name = "reward_mean", .type = RT_FINITE, .off = RP_(reward_mean), .flags = RF_IF, .when = RP_(scored)},
    {.name = "reward_std", .type = RT_FINITE, .off = RP_(reward_std), .flags = RF_IF, .when = RP_(scored)},
    {.name = "responses", .type = RT_I64, .off = RP_(responses)},
    {.name = "completion_tokens", .type = RT_FINITE, .off = RP_(completion_tokens)},
    {.name = "ms", .type = RT_FINITE, .off = RP_(ms)},
    {.name = "tokens_per_s", .type = RT_FINITE, .off = RP_(tokens_per_s)},
};
static const results_rows rollout_table = {rollout_rows, sizeof rollout_rows / sizeof rollout_rows[0], sizeof(rollout_point)};

static void rollout_stats(json_object *res, rollout_point *p) {
    json_object *groups;
    double sum = 0, sq = 0;
    long long scored = 0;
    if (json_object_object_get_ex(res, "groups", &groups))
        for (size_t i = 0; i < json_object_array_length(groups); i++) {
            json_object *rs = json_object_object_get(json_object_array_get_idx(groups, i), "responses");
            for (size_t k = 0; k < json_object_array_length(rs); k++) {
                json_object *r = json_object_array_get_idx(rs, k), *rw = json_object_object_get(r, "reward");
                p->responses++;
                if (!rw) continue;
                double x = json_object_get_double(rw);
                sum += x;
                sq += x * x;
                scored++;
            }
        }
    p->completion_tokens = num(res, "usage", "completion_tokens");
    p->ms = num(res, "timings_ms", "total");
    if ((p->scored = scored > 0)) {
        double mean = sum / (double)scored, var = sq / (double)scored - mean * mean;
        p->reward_mean = mean;
        p->reward_std = var > 0 ? sqrt(var) : 0;
    }
    p->tokens_per_s = p->ms > 0 ? p->completion_tokens / (p->ms / 1e3) : 0;
}

/* update: its metrics, its tokens (packed and as the standard layout would have them), speed */
typedef struct {
    double loss, kl, entropy, clip_frac, grad_norm, lr, tokens_packed, tokens_standard, ms, tokens_per_s;
} update_point;
#define UP_(f) \
    { .name = #f, .type = RT_FINITE, .off = (int)offsetof(update_point, f) }
static const results_row update_rows[] = {UP_(loss),      UP_(kl),          UP_(entropy),       UP_(clip_frac),
                                          UP_(grad_norm), UP_(lr),          UP_(tokens_packed), UP_(tokens_standard),
                                          UP_(ms),        UP_(tokens_per_s)};
static const results_rows update_table = {update_rows, sizeof update_rows / sizeof update_rows[0], sizeof(update_point)};

static void update_stats(json_object *res, update_point *p) {
    static const char *const m[] = {"loss", "kl", "entropy", "clip_frac", "grad_norm", "lr"};
    double *to[] = {&p->loss, &p->kl, &p->entropy, &p->clip_frac, &p->grad_norm, &p->lr};
    for (int i = 0; i < 6; i++) *to[i] = num(res, "metrics", m[i]);
    p->tokens_packed = num(res, "tokens", "packed");
    p->tokens_standard = num(res, "tokens", "standard");
    p->ms = num(res, "timings_ms", "total");
    p->tokens_per_s = p->ms > 0 ? p->tokens_standard / (p->ms / 1e3) : 0;
}

char *history_point(const char *kind, const char *result, long long policy_version, long long *v) {
    int update = !strcmp(kind, "update");
    if (!result || (!update && strcmp(kind, "rollout"))) return NULL;
    json_object *res = json_tokener_parse(result);
    if (!res) return NULL;
    rollout_point rp = {0};
    update_point up = {0};
    if (update) update_stats(res, &up);
    else rollout_stats(res, &rp);
    /* an update is plotted at the version it produced; a rollout at the one it sampled */
    *v = update ? (long long)num(res, "policy_version_after", NULL) : policy_version;
    json_object_put(res);
    return update ? results_text(&update_table, &up) : results_text(&rollout_table, &rp);
}

void history_record(store *st, const char *kind, const char *result, long long policy_version) {
    long long v;
    char *point = history_point(kind, result, policy_version, &v);
    if (point && store_history_add(st, kind, v, point))
        log_event(LOG_WARN, "history_write_failed", "\"code\":\"%s\"", err_name(err_code()));
    free(point);
}
