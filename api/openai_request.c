/* openai_request.c — a completions or chat completions request read into an oa_req and rewritten
 * as a native rollout request (validated by api_rollout_or_reply: the context and KV checks, the
 * sampling rows' ranges). See openai.h.
 *
 * Fields, with vLLM's meaning: OpenAI's (model: 404 unless the served one; max_completion_tokens
 * over max_tokens; top_logprobs needs logprobs), the sampling rows of engine/params.c at the top
 * level (top_k, min_p, min_tokens, ignore_eos, stop_token_ids, seed), and vLLM's extras that grpod
 * honours (skip_special_tokens, include_stop_str_in_output, add_special_tokens, the chat
 * template's switches). Fields grpod cannot honour are accepted at their neutral value only
 * (the penalties, beam search) and refused, named, otherwise. */
#include "api/openai.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/fields.h"
#include "api/params.h"
#include "common/err.h"

/* ---------------------------------------------------------------- fields grpod does not implement */

/* Accepted at the value that changes nothing, refused at any other. */
static const struct {
    const char *name;
    json_type type; /* json_type_double: any number; json_type_boolean */
    double neutral;
} neutral_rows[] = {
    {"presence_penalty", json_type_double, 0},   {"frequency_penalty", json_type_double, 0},
    {"repetition_penalty", json_type_double, 1}, {"length_penalty", json_type_double, 1},
    {"use_beam_search", json_type_boolean, 0},   {"spaces_between_special_tokens", json_type_boolean, 1},
    {"priority", json_type_double, 0},
};
#define N_NEUTRAL (sizeof neutral_rows / sizeof neutral_rows[0])

static int neutral_or_reply(json_object *req, api_error *e) {
    json_object *v;
    for (size_t i = 0; i < N_NEUTRAL; i++) {
        const char *k = neutral_rows[i].name;
        if (!json_object_object_get_ex(req, k, &v) || !v) continue;
        int num = neutral_rows[i].type == json_type_double;
        int ok = num ? api_is_num(v) && json_object_get_double(v) == neutral_rows[i].neutral
                     : json_object_is_type(v, json_type_boolean) && json_object_get_boolean(v) == (int)neutral_rows[i].neutral;
        if (!ok)
            return num
                ? api_fail(e, GE_INVALID, k, "%s is not supported by grpod's sampler (only %g)", k, neutral_rows[i].neutral)
                : api_fail(e, GE_INVALID, k, "%s is not supported (only %s)", k, neutral_rows[i].neutral ? "true" : "false");
    }
    if (json_object_object_get_ex(req, "logit_bias", &v) && v &&
        !(json_object_is_type(v, json_type_object) && json_object_object_length(v) == 0))
        return api_fail(e, GE_INVALID, "logit_bias", "logit_bias is not supported");
    if (json_object_object_get_ex(req, "suffix", &v) && v) return api_fail(e, GE_INVALID, "suffix", "suffix is not supported");
    if (json_object_object_get_ex(req, "prompt_logprobs", &v) && v)
        return api_fail(e, GE_INVALID, "prompt_logprobs",
                        "prompt_logprobs is not supported: POST /v1/completions with echo and logprobs scores the prompt");
    if (json_object_object_get_ex(req, "response_format", &v) && v) {
        json_object *t;
        const char *type = json_object_is_type(v, json_type_object) && json_object_object_get_ex(v, "type", &t)
            ? json_object_get_string(t)
            : "";
        if (strcmp(type, "text") && strcmp(type, "json_object") && strcmp(type, "json_schema"))
            return api_fail(e, GE_INVALID, "response_format",
                            "response_format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": "
                            "\"json_schema\", \"json_schema\": {\"name\", \"schema\"}}");
        json_object *js = json_object_object_get(v, "json_schema"), *sc = json_object_object_get(js, "schema");
        if (!strcmp(type, "json_schema") && !json_object_is_type(js, json_type_object))
            return api_fail(e, GE_INVALID, "response_format.json_schema", "response_format.json_schema must be an object");
        if (sc) {
            char *text = oa_pydumps(sc);
            int bad = !text || eng_guided_schema_check(text);
            free(text);
            if (bad) {
                int rc = api_fail(e, GE_INVALID, "response_format.json_schema.schema", "response_format.json_schema.schema: %s",
                                  err_msg());
                err_clear();
                return rc;
            }
        }
    }
    return 0;
}

/* Constrained decoding (sampling.guided): response_format json_object makes the answer a JSON
 * object (OpenAI's JSON mode), json_schema a JSON value that keeps to its schema (the grammar's
 * subset: sampling.guided_schema); tool_choice required or a named function makes the arguments
 * an object (the call's opening is in the prompt) that keeps to the tool's parameters (oa_force),
 * closed by the call's end, so the answer always parses. */
static void guided_of(json_object *req, const oa_req *q, json_object *samp) {
    json_object *rf = json_object_object_get(req, "response_format");
    const char *type = json_object_get_string(json_object_object_get(rf, "type"));
    if (q->tool_choice == OA_TOOLS_REQUIRED || q->tool_choice == OA_TOOLS_NAMED) {
        api_put_str(samp, "guided", "json_object");
        api_put_str(samp, "guided_suffix", oa_call_closing(q->tool_format));
    } else if (type && !strcmp(type, "json_object")) {
        api_put_str(samp, "guided", "json_object");
        json_object_object_del(samp, "guided_suffix");
    } else if (type && !strcmp(type, "json_schema")) { /* a JSON value that keeps to the schema (none: any) */
        json_object *sc = json_object_object_get(json_object_object_get(rf, "json_schema"), "schema");
        char *text = sc ? oa_pydumps(sc) : NULL;
        api_put_str(samp, "guided", "json");
        json_object_object_del(samp, "guided_suffix");
        if (text) api_put_str(samp, "guided_schema", text);
        free(text);
    }
}

/* ---------------------------------------------------------------- prompts */

/* prompt: "text" | [ids] | ["text", ...] | [[ids], ...] → groups (each {"prompt_ids", "n"}); text
 * tokenized with add_special_tokens. */
static int prompts_or_reply(json_object *p, int n, int add_special, int max_groups, const api_model *m, json_object *groups,
                            api_error *e) {
    if (!p) return api_fail(e, GE_INVALID, "prompt", "prompt is required");
    int cnt = 1, batch = 0;
    if (json_object_is_type(p, json_type_array) && json_object_array_length(p) > 0) {
        json_object *first = json_object_array_get_idx(p, 0);
        batch = json_object_is_type(first, json_type_string) || json_object_is_type(first, json_type_array);
    }
    if (batch) cnt = (int)json_object_array_length(p);
    if (cnt > max_groups) return api_fail(e, GE_TOO_LARGE, "prompt", "prompt holds %d prompts; at most %d", cnt, max_groups);
    for (int i = 0; i < cnt; i++) {
        json_object *v = batch ? json_object_array_get_idx(p, (size_t)i) : p;
        char f[48];
        snprintf(f, sizeof f, batch ? "prompt[%d]" : "prompt", i);
        json_object *g = json_object_new_object();
        json_object_array_add(groups, g);
        if (json_object_is_type(v, json_type_string) && json_object_get_string_len(v) > 0) {
            int *ids = NULL, nid = 0;
            const char *t = json_object_get_string(v);
            if (m->tokenize(m->ud, t, strlen(t), add_special, &ids, &nid)) {
                err_clear();
                return api_fail(e, GE_INVALID, f, "%s cannot be tokenized", f);
            }
            json_object *a = json_object_new_array_ext(nid);
            for (int k = 0; k < nid; k++) json_object_array_add(a, json_object_new_int(ids[k]));
            free(ids);
            json_object_object_add(g, "prompt_ids", a);
        } else if (json_object_is_type(v, json_type_array) && json_object_array_length(v) > 0) {
            for (size_t k = 0; k < json_object_array_length(v); k++)
                if (!json_object_is_type(json_object_array_get_idx(v, k), json_type_int))
                    return api_fail(e, GE_INVALID, f, "%s must be a string or an array of token ids", f);
            api_put_copy(g, "prompt_ids", v);
        } else {
            return api_fail(e, GE_INVALID, f, "%s must be a non-empty string or array of token ids", f);
        }
        api_put_int(g, "n", n);
    }
    return 0;
}

/* The chat prompt as one group of prompt ids; *P its length. */
static int chat_group_or_reply(eng *en, json_object *req, const oa_tools *t, int n, json_object *groups, int *P, api_error *e) {
    int *ids = NULL, rc = oa_chat_prompt_or_reply(en, req, t, &ids, P, e);
    if (rc) return rc;
    json_object *g = json_object_new_object(), *a = json_object_new_array_ext(*P);
    for (int k = 0; k < *P; k++) json_object_array_add(a, json_object_new_int(ids[k]));
    free(ids);
    json_object_object_add(g, "prompt_ids", a);
    api_put_int(g, "n", n);
    json_object_array_add(groups, g);
    return 0;
}

int oa_force(oa_req *q, json_object *rollout, int i) {
    json_object *c = json_object_array_get_idx(q->cands, (size_t)i), *ids = json_object_object_get(c, "ids"), *schema;
    json_object *pid = json_object_object_get(json_object_array_get_idx(json_object_object_get(rollout, "groups"), 0),
                                              "prompt_ids");
    for (size_t k = 0; k < json_object_array_length(ids); k++)
        json_object_array_add(pid, json_object_get(json_object_array_get_idx(ids, k)));
    if (json_object_object_get_ex(c, "schema", &schema)) /* the arguments keep to the tool's parameters */
        api_put_copy(json_object_object_get(rollout, "sampling"), "guided_schema", schema);
    free(q->forced_name);
    free(q->forced);
    q->forced_name = strdup(json_object_get_string(json_object_object_get(c, "name")));
    q->forced = q->forced_name ? oa_call_opening(q->tool_format, q->forced_name) : NULL;
    q->choosing = 0;
    return q->forced ? 0 : err_set(GE_NOMEM, "out of memory");
}

/* tool_choice required / named: each candidate call's opening as ids in q->cands; with one
 * candidate (named, or one tool) it joins the prompt now, with several q->choosing is set and
 * openai.c picks one first. *P grows by the longest opening, so max_tokens leaves room for it. */
static int forced_or_reply(eng *en, const oa_tools *t, oa_req *q, json_object *nat, int *P, api_error *e) {
    if (t->choice != OA_TOOLS_REQUIRED && t->choice != OA_TOOLS_NAMED) return 0;
    int one = t->named >= 0 ? t->named : t->n == 1 ? 0 : -1, longest = 0;
    q->cands = json_object_new_array();
    for (int i = 0; i < t->n; i++) {
        if (one >= 0 && i != one) continue;
        char *open = oa_call_opening(q->tool_format, t->names[i]);
        int *ids = NULL, n = 0;
        if (!open || eng_tokenize(en, open, strlen(open), 0, &ids, &n)) {
            free(open);
            return api_fail(e, GE_INTERNAL, "tool_choice", "cannot tokenize the call's opening: %s", err_msg());
        }
        free(open);
        if (t->params[i] && eng_guided_schema_check(t->params[i])) { /* the arguments are decoded under it */
            char f[64];
            snprintf(f, sizeof f, "tools[%d].function.parameters", i);
            free(ids);
            int rc = api_fail(e, GE_INVALID, f, "%s: %s", f, err_msg());
            err_clear();
            return rc;
        }
        json_object *c = json_object_new_object(), *a = json_object_new_array_ext(n);
        for (int k = 0; k < n; k++) json_object_array_add(a, json_object_new_int(ids[k]));
        api_put_str(c, "name", t->names[i]);
        json_object_object_add(c, "ids", a);
        if (t->params[i]) api_put_str(c, "schema", t->params[i]);
        json_object_array_add(q->cands, c);
        longest = n > longest ? n : longest;
        free(ids);
    }
    *P += longest;
    if (one < 0) {
        q->choosing = 1;
        return 0;
    }
    return oa_force(q, nat, 0) ? api_fail(e, GE_NOMEM, "tool_choice", "out of memory") : 0;
}

/* The length of a native name at s: "sampling." (a prefix, renamed to nothing) or
 * "groups[N]" with ".prompt_ids" or ".prompt" after it (renamed to the request's prompt); 0 when
 * s starts neither. */
static size_t native_name(const char *s, int *is_group) {
    *is_group = 0;
    if (!strncmp(s, "sampling.", 9)) return 9;
    if (strncmp(s, "groups[", 7)) return 0;
    const char *p = s + 7;
    while (*p >= '0' && *p <= '9') p++;
    if (*p != ']') return 0;
    p++;
    if (!strncmp(p, ".prompt_ids", 11)) p += 11;
    else if (!strncmp(p, ".prompt", 7)) p += 7;
    *is_group = 1;
    return (size_t)(p - s);
}

/* s with every native name said the request's way. */
static void rename_in(char *s, size_t cap, const char *prompt) {
    char out[512];
    size_t o = 0;
    for (const char *p = s; *p && o + 1 < sizeof out;) {
        int grp;
        size_t k = native_name(p, &grp);
        if (!k) {
            out[o++] = *p++;
            continue;
        }
        if (grp) o += (size_t)snprintf(out + o, sizeof out - o, "%s", prompt);
        if (o >= sizeof out) o = sizeof out - 1;
        p += k;
    }
    out[o] = 0;
    snprintf(s, cap, "%s", out);
}

void oa_rename_field(api_error *e, int chat) {
    const char *prompt = chat ? "messages" : "prompt";
    rename_in(e->field, sizeof e->field, prompt);
    rename_in(e->message, sizeof e->message, prompt);
}

/* ---------------------------------------------------------------- the request */

/* The route's own members; the sampling rows (engine/params.c) and the neutral rows are allowed
 * besides, and chat takes the chat prompt's members (openai_chat.c). */
static const char *const completion_keys[] = {"model",
                                              "prompt",
                                              "max_tokens",
                                              "n",
                                              "logprobs",
                                              "echo",
                                              "stream",
                                              "stream_options",
                                              "user",
                                              "best_of",
                                              "logit_bias",
                                              "suffix",
                                              "add_special_tokens",
                                              "skip_special_tokens",
                                              "include_stop_str_in_output",
                                              "return_token_ids",
                                              "prompt_logprobs",
                                              "response_format",
                                              NULL};
static const char *const chat_keys[] = {"model",
                                        "max_tokens",
                                        "max_completion_tokens",
                                        "n",
                                        "logprobs",
                                        "top_logprobs",
                                        "stream",
                                        "stream_options",
                                        "user",
                                        "logit_bias",
                                        "response_format",
                                        "skip_special_tokens",
                                        "include_stop_str_in_output",
                                        "return_token_ids",
                                        "prompt_logprobs",
                                        NULL};

static int keys_or_reply(json_object *req, int chat, api_error *e) {
    const char *keys[96];
    int nk = 0;
    for (const char *const *k = chat ? chat_keys : completion_keys; *k; k++) keys[nk++] = *k;
    for (const char *const *k = oa_chat_prompt_keys; chat && *k; k++) keys[nk++] = *k;
    for (size_t i = 0; i < N_NEUTRAL; i++) keys[nk++] = neutral_rows[i].name;
    for (int i = 0; i < eng_sampling_params.n && nk < 95; i++)
        if (chat || strcmp(eng_sampling_params.rows[i].name, "top_logprobs")) keys[nk++] = eng_sampling_params.rows[i].name;
    keys[nk] = NULL;
    return api_check_keys(req, "", keys, e);
}

/* max_tokens: chat's max_completion_tokens wins over max_tokens; chat's default is the rest of
 * the context (P: the prompt's length), the completions' 16 (vLLM's defaults), both capped by
 * --max-tokens. */
static int max_tokens_or_reply(json_object *req, int chat, int P, const api_limits *l, const api_model *m, long long *out,
                               api_error *e) {
    long long cap = l->max_tokens, mct, rest = m->max_pos - P;
    if (!chat) return api_get_int(req, "", "max_tokens", 0, cap, cap < 16 ? cap : 16, out, e);
    int rc;
    if ((rc = api_get_int(req, "", "max_completion_tokens", 1, cap, -1, &mct, e)) ||
        (rc = api_get_int(req, "", "max_tokens", 1, cap,
                          rest < 1         ? 1
                              : rest < cap ? rest
                                           : cap,
                          out, e)))
        return rc;
    if (mct > 0) *out = mct;
    return 0;
}

static int logprobs_or_reply(json_object *req, int chat, long long *lp, api_error *e) {
    int rc, want;
    json_object *top;
    *lp = -1;
    if (!chat) return api_get_int(req, "", "logprobs", 0, OA_MAX_LOGPROBS, -1, lp, e);
    if ((rc = api_get_bool(req, "", "logprobs", 0, &want, e)) ||
        (rc = api_get_int(req, "", "top_logprobs", 0, OA_MAX_LOGPROBS, 0, lp, e)))
        return rc;
    if (!want && json_object_object_get_ex(req, "top_logprobs", &top) && top)
        return api_fail(e, GE_INVALID, "top_logprobs", "top_logprobs needs logprobs: true");
    if (!want) *lp = -1;
    return 0;
}

int oa_parse_or_reply(eng *en, json_object *req, int chat, const api_limits *l, const api_model *m, oa_req *q, api_error *e) {
    const char *model;
    long long n, max_tokens, best_of, lp;
    int echo = 0, stream, add_special = 1, P = 0, rc;
    json_object *so, *v;
    oa_tools t = {0};
    if ((rc = keys_or_reply(req, chat, e)) || (rc = neutral_or_reply(req, e)) ||
        (rc = api_get_str(req, "", "model", 0, &model, e)) || (rc = oa_model_or_reply(en, model, e)) ||
        (rc = api_get_int(req, "", "n", 1, l->max_n, 1, &n, e)) || (rc = api_get_bool(req, "", "stream", 0, &stream, e)) ||
        (rc = api_get_obj(req, "", "stream_options", &so, e)) || (rc = logprobs_or_reply(req, chat, &lp, e)) ||
        (rc = api_get_bool(req, "", "skip_special_tokens", 1, &q->skip_special, e)) ||
        (rc = api_get_bool(req, "", "include_stop_str_in_output", 0, &q->include_stop, e)) ||
        (rc = api_get_bool(req, "", "return_token_ids", 0, &q->return_ids, e)))
        return rc;
    if (!chat &&
        ((rc = api_get_bool(req, "", "echo", 0, &echo, e)) || (rc = api_get_int(req, "", "best_of", n, n, n, &best_of, e)) ||
         (rc = api_get_bool(req, "", "add_special_tokens", 1, &add_special, e))))
        return rc;
    if (chat && (rc = oa_tools_or_reply(req, &t, e))) return rc;
    q->tool_choice = t.choice;
    q->parallel_tool_calls = t.parallel;
    q->tool_format = eng_tool_format(en);

    /* the native rollout request: the prompts as ids, sampling from the top-level members that
     * are sampling rows (max_tokens and logprobs are OpenAI's own) */
    json_object *nat = json_object_new_object(), *groups = json_object_new_array(), *samp = json_object_new_object();
    json_object_object_add(nat, "groups", groups);
    json_object_object_add(nat, "sampling", samp);
    json_object *meta = json_object_new_object();
    api_put_str(meta, "openai", chat ? "chat.completions" : "completions");
    json_object_object_add(nat, "metadata", meta);
    if (chat) rc = chat_group_or_reply(en, req, &t, (int)n, groups, &P, e);
    else rc = prompts_or_reply(json_object_object_get(req, "prompt"), (int)n, add_special, l->max_groups, m, groups, e);
    if (!rc && chat) rc = forced_or_reply(en, &t, q, nat, &P, e);
    oa_tools_free(&t);
    if (!rc) rc = max_tokens_or_reply(req, chat, P, l, m, &max_tokens, e);
    if (!rc && !chat && max_tokens == 0 && !echo) rc = api_fail(e, GE_INVALID, "max_tokens", "max_tokens 0 needs echo: true");
    if (!rc) {
        for (int i = 0; i < eng_sampling_params.n; i++) {
            const char *k = eng_sampling_params.rows[i].name;
            if (strcmp(k, "max_tokens") && strcmp(k, "logprobs") && json_object_object_get_ex(req, k, &v) && v)
                api_put_copy(samp, k, v);
        }
        api_put_int(samp, "max_tokens", max_tokens > 0 ? max_tokens : 1);
        json_object_object_del(samp, "top_logprobs"); /* OpenAI's own (chat), or not a completions field */
        if (stream && lp > 0 && !echo) api_put_int(samp, "top_logprobs", lp); /* each chunk's alternatives, as they are sampled */
        guided_of(req, q, samp);
        rc = api_rollout_or_reply(nat, l, m, &q->rollout, e);
        if (rc) oa_rename_field(e, chat);
    }
    json_object_put(nat);
    if (rc) return rc;

    q->include_usage = 0;
    if (so && json_object_object_get_ex(so, "include_usage", &v)) q->include_usage = json_object_get_boolean(v);
    q->chat = chat;
    q->stream = stream;
    q->echo = echo;
    q->logprobs = (int)lp;
    q->n = (int)n;
    q->max_tokens = (int)max_tokens;
    q->created = (long long)time(NULL);
    oa_new_id(q->id, sizeof q->id, chat ? "chatcmpl-" : "cmpl-");
    if (model) snprintf(q->model, sizeof q->model, "%s", model);
    else oa_model_name(en, q->model, sizeof q->model);
    q->n_prompts = (int)json_object_array_length(json_object_object_get(q->rollout, "groups"));
    return 0;
}
