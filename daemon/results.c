/* results.c — the writer of results.h, then the rows of each job kind's result. */
#include "daemon/results.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/metrics.h"
#include "common/err.h"

/* ---------------------------------------------------------------- the writer */

#define AT_(type, base, off) (*(type const *)((const char *)(base) + (off)))

static double finite_or(double x, double d) { return isfinite(x) ? x : d; }

static json_object *ints_json(const int *x, int n) {
    json_object *a = json_object_new_array_ext(n);
    for (int i = 0; i < n; i++) json_object_array_add(a, json_object_new_int(x[i]));
    return a;
}
static json_object *floats_json(const float *x, int n) {
    json_object *a = json_object_new_array_ext(n);
    for (int i = 0; i < n; i++) json_object_array_add(a, json_object_new_double(finite_or(x[i], -1e30)));
    return a;
}

static json_object *choice_json(const char *choices, int i) {
    const char *c = choices;
    for (; i > 0 && c; i--)
        if ((c = strchr(c, '|'))) c++;
    return c ? json_object_new_string_len(c, (int)strcspn(c, "|")) : NULL;
}

/* Row r's value (n as a count, x as a number) into the /metrics counter it feeds. */
static void feed(const results_row *r, long long n, double x) {
    switch (r->feed) {
    case RM_NONE: break;
    case RM_TOKENS: metrics_tokens((metrics_token_phase)r->metric, n); break;
    case RM_SECONDS: metrics_seconds((metrics_seconds_phase)r->metric, x / 1e3); break;
    case RM_GROUPS_FILTERED: metrics_groups_filtered(n); break;
    case RM_POLICY_VERSION: metrics_policy_version(n); break;
    }
}

/* The value of row r of the struct at s (NULL: JSON null). */
static json_object *value_json(const results_row *r, const char *s) {
    switch (r->type) {
    case RT_INT: feed(r, AT_(int, s, r->off), AT_(int, s, r->off)); return json_object_new_int(AT_(int, s, r->off));
    case RT_I64: {
        long long n = AT_(long long, s, r->off);
        feed(r, n, (double)n);
        return json_object_new_int64(n);
    }
    case RT_NUM: {
        double v = AT_(double, s, r->off); /* the integer view only where it exists (not inf, nan, huge) */
        feed(r, isfinite(v) && fabs(v) < 9e18 ? (long long)v : 0, v);
        return json_object_new_double(v);
    }
    case RT_FINITE: return json_object_new_double(finite_or(AT_(double, s, r->off), 0));
    case RT_QUOT: {
        long long a = AT_(long long, s, r->off), b = AT_(long long, s, r->n_off);
        return json_object_new_double(b ? (double)a / (double)b : 0);
    }
    case RT_STR: return json_object_new_string(AT_(const char *, s, r->off));
    case RT_TEXT: return json_object_new_string_len(AT_(const char *, s, r->off), (int)AT_(size_t, s, r->n_off));
    case RT_CHOICE: return choice_json(r->choices, AT_(int, s, r->off));
    case RT_IDS: return ints_json(AT_(const int *, s, r->off), AT_(int, s, r->n_off));
    case RT_LPS: return floats_json(AT_(const float *, s, r->off), AT_(int, s, r->n_off));
    case RT_IDS_K:
    case RT_LPS_K: {
        int n = AT_(int, s, r->n_off), k = AT_(int, s, r->k_off);
        json_object *a = json_object_new_array();
        for (int t = 0; t < n; t++)
            json_object_array_add(a,
                                  r->type == RT_IDS_K ? ints_json(AT_(const int *, s, r->off) + (size_t)t * k, k)
                                                      : floats_json(AT_(const float *, s, r->off) + (size_t)t * k, k));
        return a;
    }
    case RT_OBJ: return results_json(r->sub, s);
    case RT_ARR: {
        const char *x = AT_(const char *, s, r->off);
        int n = AT_(int, s, r->n_off);
        json_object *a = json_object_new_array();
        for (int i = 0; i < n; i++) json_object_array_add(a, results_json(r->sub, x + (size_t)i * r->sub->size));
        return a;
    }
    case RT_JSON: {
        json_object *m = AT_(json_object *, s, r->off), *c = NULL;
        return m && !json_object_deep_copy(m, &c, NULL) ? c : NULL;
    }
    }
    return NULL;
}

json_object *results_json(const results_rows *t, const void *src) {
    json_object *o = json_object_new_object();
    if (!o) return NULL;
    for (int i = 0; i < t->n; i++) {
        const results_row *r = &t->rows[i];
        int on = !(r->flags & (RF_IF | RF_OR_NULL)) || AT_(int, src, r->when);
        if (!on && (r->flags & RF_IF)) continue;
        json_object *v = on ? value_json(r, src) : NULL;
        if (r->type == RT_JSON && !v) continue; /* none (or its copy failed): left out */
        json_object_object_add(o, r->name, v);
    }
    return o;
}

char *results_text(const results_rows *t, const void *src) {
    json_object *o = results_json(t, src);
    char *s = o ? strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN)) : NULL;
    json_object_put(o);
    if (!s) err_set(GE_NOMEM, "out of memory writing a result");
    return s;
}

/* ---------------------------------------------------------------- an update's */

#define N_(a) (int)(sizeof a / sizeof a[0])
#define U_(f) (int)offsetof(eng_update_result, f)
#define UM_(name_, f) \
    { .name = name_, .type = RT_FINITE, .off = U_(f) }
#define RC_(name_, f) \
    { .name = "rollout_corr/" name_, .type = RT_FINITE, .off = U_(rc.f), .flags = RF_IF, .when = U_(rollout_corr) }

static const results_row update_metric_rows[] = {
    UM_("loss", loss),
    UM_("pg_loss", pg_loss),
    UM_("kl", kl),
    UM_("entropy", entropy),
    UM_("clip_frac", clip_frac),
    UM_("clip_frac_low", clip_frac_low),
    UM_("clip_frac_high", clip_frac_high),
    UM_("ratio_mean", ratio_mean),
    UM_("ratio_max", ratio_max),
    UM_("grad_norm", grad_norm),
    UM_("lr", lr),
    /* veRL's names */
    UM_("actor/pg_clipfrac", pg_clipfrac),
    UM_("actor/pg_clipfrac_lower", pg_clipfrac_lower),
    UM_("actor/ppo_kl", ppo_kl),
    UM_("actor/kl_loss", kl_loss),
    UM_("actor/entropy", verl_entropy),
    /* veRL's rollout_corr/ metrics, and grpod's |old - rollout|, when a correction ran */
    RC_("kl", kl),
    RC_("k3_kl", k3_kl),
    RC_("chi2_token", chi2_token),
    RC_("log_ppl_diff", log_ppl_diff),
    RC_("training_log_ppl", training_log_ppl),
    RC_("rollout_log_ppl", rollout_log_ppl),
    RC_("logprob_abs_diff_mean", abs_diff_mean),
    RC_("logprob_abs_diff_max", abs_diff_max),
    RC_("rollout_is_mean", is_mean),
    RC_("rollout_is_max", is_max),
    RC_("rollout_is_ratio_fraction_high", is_ratio_fraction_high),
    RC_("rollout_is_ratio_fraction_low", is_ratio_fraction_low),
    RC_("rollout_is_oob_ratio", is_oob_ratio),
    RC_("rollout_rs_masked_fraction", rs_masked_fraction),
    RC_("rollout_rs_seq_masked_fraction", rs_seq_masked_fraction),
    {.name = "loss_scale_factor", .type = RT_INT, .off = U_(loss_scale_factor)},
    {.name = "groups_filtered", .type = RT_INT, .off = U_(groups_filtered), .feed = RM_GROUPS_FILTERED},
    {.name = "optimizer_steps", .type = RT_INT, .off = U_(optimizer_steps)},
    {.name = "micro_batches", .type = RT_INT, .off = U_(micro_batches)},
};
static const results_rows update_metrics = {update_metric_rows, N_(update_metric_rows), sizeof(eng_update_result)};

static const results_row update_token_rows[] = {
    {.name = "packed", .type = RT_I64, .off = U_(tokens_packed), .feed = RM_TOKENS, .metric = MT_UPDATE_PACKED},
    {.name = "standard", .type = RT_I64, .off = U_(tokens_standard), .feed = RM_TOKENS, .metric = MT_UPDATE_STANDARD},
    {.name = "ratio", .type = RT_QUOT, .off = U_(tokens_standard), .n_off = U_(tokens_packed)},
};
static const results_rows update_tokens = {update_token_rows, N_(update_token_rows), sizeof(eng_update_result)};

static const results_row update_timing_rows[] = {
    {.name = "old", .type = RT_NUM, .off = U_(ms_old), .feed = RM_SECONDS, .metric = MS_OLD},
    {.name = "ref", .type = RT_NUM, .off = U_(ms_ref), .feed = RM_SECONDS, .metric = MS_REF},
    {.name = "policy", .type = RT_NUM, .off = U_(ms_policy), .feed = RM_SECONDS, .metric = MS_POLICY},
    {.name = "optimizer", .type = RT_NUM, .off = U_(ms_optimizer), .feed = RM_SECONDS, .metric = MS_OPTIMIZER},
    {.name = "snapshot_wait", .type = RT_NUM, .off = U_(ms_snapshot_wait)},
    {.name = "total", .type = RT_NUM, .off = U_(ms_total)},
};
static const results_rows update_timings = {update_timing_rows, N_(update_timing_rows), sizeof(eng_update_result)};

static const results_row update_rows[] = {
    {.name = "policy_version_before", .type = RT_I64, .off = U_(policy_version_before)},
    {.name = "policy_version_after", .type = RT_I64, .off = U_(policy_version_after), .feed = RM_POLICY_VERSION},
    {.name = "metrics", .type = RT_OBJ, .sub = &update_metrics},
    {.name = "tokens", .type = RT_OBJ, .sub = &update_tokens},
    {.name = "timings_ms", .type = RT_OBJ, .sub = &update_timings},
};
const results_rows results_update_rows = {update_rows, N_(update_rows), sizeof(eng_update_result)};

/* ---------------------------------------------------------------- a rollout's */

#define RR_(f) (int)offsetof(results_response, f)
static const results_row response_rows[] = {
    {.name = "token_ids", .type = RT_IDS, .off = RR_(tokens), .n_off = RR_(n_tokens)},
    {.name = "text", .type = RT_TEXT, .off = RR_(text), .n_off = RR_(text_len)},
    {.name = "logprobs", .type = RT_LPS, .off = RR_(logprobs), .n_off = RR_(n_tokens)},
    {.name = "top_ids",
     .type = RT_IDS_K,
     .off = RR_(top_ids),
     .n_off = RR_(n_tokens),
     .k_off = RR_(top_k),
     .flags = RF_IF,
     .when = RR_(top_k)},
    {.name = "top_logprobs",
     .type = RT_LPS_K,
     .off = RR_(top_lps),
     .n_off = RR_(n_tokens),
     .k_off = RR_(top_k),
     .flags = RF_IF,
     .when = RR_(top_k)},
    {.name = "finish_reason", .type = RT_CHOICE, .off = RR_(finish), .choices = "stop|length"},
    {.name = "reward", .type = RT_NUM, .off = RR_(reward), .flags = RF_OR_NULL, .when = RR_(scored)},
};
static const results_rows responses = {response_rows, N_(response_rows), sizeof(results_response)};

#define RG_(f) (int)offsetof(results_group, f)
static const results_row group_rows[] = {
    {.name = "prompt_ids", .type = RT_IDS, .off = RG_(prompt), .n_off = RG_(P)},
    {.name = "cached_tokens", .type = RT_INT, .off = RG_(cached_tokens)},
    {.name = "reward_mean", .type = RT_NUM, .off = RG_(reward_mean), .flags = RF_OR_NULL, .when = RG_(scored)},
    {.name = "reward_std", .type = RT_NUM, .off = RG_(reward_std), .flags = RF_OR_NULL, .when = RG_(scored)},
    {.name = "metadata", .type = RT_JSON, .off = RG_(metadata)},
    {.name = "responses", .type = RT_ARR, .off = RG_(resp), .n_off = RG_(n), .sub = &responses},
};
static const results_rows groups = {group_rows, N_(group_rows), sizeof(results_group)};

#define RO_(f) (int)offsetof(results_rollout, f)
static const results_row cached_rows[] = {{.name = "cached_tokens", .type = RT_I64, .off = RO_(cached_tokens)}};
static const results_rows cached = {cached_rows, N_(cached_rows), sizeof(results_rollout)};
static const results_row usage_rows[] = {
    {.name = "prompt_tokens", .type = RT_I64, .off = RO_(prompt_tokens), .feed = RM_TOKENS, .metric = MT_ROLLOUT_PROMPT},
    {.name = "completion_tokens", .type = RT_I64, .off = RO_(completion_tokens), .feed = RM_TOKENS, .metric = MT_ROLLOUT_COMPLETION},
    {.name = "prompt_tokens_details", .type = RT_OBJ, .sub = &cached},
};
static const results_rows usage = {usage_rows, N_(usage_rows), sizeof(results_rollout)};
static const results_row rollout_timing_rows[] = {
    {.name = "total", .type = RT_NUM, .off = RO_(ms_total), .feed = RM_SECONDS, .metric = MS_ROLLOUT}};
static const results_rows rollout_timings = {rollout_timing_rows, N_(rollout_timing_rows), sizeof(results_rollout)};

static const results_row rollout_rows[] = {
    {.name = "policy_version", .type = RT_I64, .off = RO_(policy_version)},
    {.name = "groups", .type = RT_ARR, .off = RO_(groups), .n_off = RO_(n_groups), .sub = &groups},
    {.name = "usage", .type = RT_OBJ, .sub = &usage},
    {.name = "timings_ms", .type = RT_OBJ, .sub = &rollout_timings},
};
const results_rows results_rollout_rows = {rollout_rows, N_(rollout_rows), sizeof(results_rollout)};

/* ---------------------------------------------------------------- a logprobs job's */

#define LS_(f) (int)offsetof(results_scored, f)
static const results_row scored_rows[] = {
    {.name = "logprobs", .type = RT_LPS, .off = LS_(logprobs), .n_off = LS_(R)},
    {.name = "top_ids", .type = RT_IDS_K, .off = LS_(top_ids), .n_off = LS_(R), .k_off = LS_(top_k), .flags = RF_IF, .when = LS_(top_k)},
    {.name = "top_logprobs",
     .type = RT_LPS_K,
     .off = LS_(top_lps),
     .n_off = LS_(R),
     .k_off = LS_(top_k),
     .flags = RF_IF,
     .when = LS_(top_k)},
};
static const results_rows scored = {scored_rows, N_(scored_rows), sizeof(results_scored)};
static const results_row scored_group_rows[] = {
    {.name = "responses",
     .type = RT_ARR,
     .off = (int)offsetof(results_scored_group, resp),
     .n_off = (int)offsetof(results_scored_group, n),
     .sub = &scored},
};
static const results_rows scored_groups = {scored_group_rows, N_(scored_group_rows), sizeof(results_scored_group)};

#define LO_(f) (int)offsetof(results_logprobs, f)
static const results_row logprobs_rows[] = {
    {.name = "groups", .type = RT_ARR, .off = LO_(groups), .n_off = LO_(n_groups), .sub = &scored_groups},
    {.name = "model", .type = RT_CHOICE, .off = LO_(model), .choices = "policy|reference"},
    {.name = "policy_version", .type = RT_I64, .off = LO_(policy_version)},
};
const results_rows results_logprobs_rows = {logprobs_rows, N_(logprobs_rows), sizeof(results_logprobs)};

/* ---------------------------------------------------------------- a checkpoint's */

#define CK_(f) (int)offsetof(results_checkpoint, f)
static const results_row checkpoint_rows[] = {
    {.name = "id", .type = RT_STR, .off = CK_(id)},
    {.name = "path", .type = RT_STR, .off = CK_(path)},
    {.name = "policy_version", .type = RT_I64, .off = CK_(policy_version)},
};
const results_rows results_checkpoint_rows = {checkpoint_rows, N_(checkpoint_rows), sizeof(results_checkpoint)};
