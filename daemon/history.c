/* history.c — one history row per finished rollout or update (the dashboard's data, kept in
 * the store so it survives restarts): the job's result reduced to what is plotted per policy
 * version. Called on the engine thread right after the job's outcome is stored; a failure to
 * record is logged, never fails the job. Not here: serving it (api/dashboard.c). */
#include "daemon/history.h"

#include <math.h>
#include <string.h>

#include <json-c/json.h>

#include "common/err.h"
#include "common/log.h"

static double num(json_object *o, const char *k1, const char *k2) {
    json_object *v = NULL;
    if (!json_object_object_get_ex(o, k1, &v)) return 0;
    if (k2 && !json_object_object_get_ex(v, k2, &v)) return 0;
    return json_object_get_double(v);
}

static void put(json_object *o, const char *k, double v) {
    json_object_object_add(o, k, json_object_new_double(isfinite(v) ? v : 0));
}

/* rollout: the mean and spread (std over responses) of the rewards it scored, its size and speed */
static json_object *rollout_stats(json_object *res) {
    json_object *groups, *st = json_object_new_object();
    double sum = 0, sq = 0, tokens = 0;
    long long scored = 0, responses = 0;
    if (json_object_object_get_ex(res, "groups", &groups))
        for (size_t i = 0; i < json_object_array_length(groups); i++) {
            json_object *rs = json_object_object_get(json_object_array_get_idx(groups, i), "responses");
            for (size_t k = 0; k < json_object_array_length(rs); k++) {
                json_object *r = json_object_array_get_idx(rs, k), *rw = json_object_object_get(r, "reward");
                responses++;
                if (!rw) continue;
                double x = json_object_get_double(rw);
                sum += x;
                sq += x * x;
                scored++;
            }
        }
    tokens = num(res, "usage", "completion_tokens");
    double ms = num(res, "timings_ms", "total");
    if (scored) {
        double mean = sum / (double)scored, var = sq / (double)scored - mean * mean;
        put(st, "reward_mean", mean);
        put(st, "reward_std", var > 0 ? sqrt(var) : 0);
    }
    json_object_object_add(st, "responses", json_object_new_int64(responses));
    put(st, "completion_tokens", tokens);
    put(st, "ms", ms);
    put(st, "tokens_per_s", ms > 0 ? tokens / (ms / 1e3) : 0);
    return st;
}

static json_object *update_stats(json_object *res) {
    json_object *st = json_object_new_object();
    static const char *const m[] = {"loss", "kl", "entropy", "clip_frac", "grad_norm", "lr", NULL};
    for (int i = 0; m[i]; i++) put(st, m[i], num(res, "metrics", m[i]));
    double packed = num(res, "tokens", "packed"), standard = num(res, "tokens", "standard"), ms = num(res, "timings_ms", "total");
    put(st, "tokens_packed", packed);
    put(st, "tokens_standard", standard);
    put(st, "ms", ms);
    put(st, "tokens_per_s", ms > 0 ? standard / (ms / 1e3) : 0);
    return st;
}

void history_record(store *st, const char *kind, const char *result, long long policy_version) {
    int update = !strcmp(kind, "update");
    if (!result || (!update && strcmp(kind, "rollout"))) return;
    json_object *res = json_tokener_parse(result);
    if (!res) return;
    json_object *stats = update ? update_stats(res) : rollout_stats(res);
    /* an update is plotted at the version it produced; a rollout at the one it sampled */
    long long v = update ? (long long)num(res, "policy_version_after", NULL) : policy_version;
    if (store_history_add(st, kind, v, json_object_to_json_string_ext(stats, JSON_C_TO_STRING_PLAIN)))
        log_event(LOG_WARN, "history_write_failed", "\"code\":\"%s\"", err_name(err_code()));
    json_object_put(stats);
    json_object_put(res);
}
