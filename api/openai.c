/* openai.c — OpenAI-compatible serving of the live policy: GET /v1/models, POST /v1/completions
 * and POST /v1/chat/completions, for eval harnesses and SDK clients pointed at the policy being
 * trained.
 *
 * A request becomes ordinary jobs, so it runs in the same continuous-batching scheduler as the
 * rollouts and in FIFO order with the updates (it samples one policy version, reported as
 * policy_version): the OpenAI fields are checked here, rewritten as a native rollout request and
 * validated by api_rollout_or_reply (tokenizing, the chat template, the context and KV checks);
 * the connection is suspended until the job ends (as POST /v1/logprobs does). echo with logprobs
 * (how harnesses score a text's likelihood, max_tokens 0 or 1) adds a logprobs job over prompt +
 * completion, so those numbers are exactly POST /v1/logprobs's; the first token has none.
 * logprobs also carry token_ids (a token's text can be part of a character). top_logprobs hold
 * the chosen token only (grpod does not compute alternatives). stream: true
 * answers as server-sent events once the choices are sampled (one chunk per choice, then
 * [DONE]): the engine does not hand out tokens as it draws them.
 *
 * Not here: the native routes (handlers.c), the router (router.c) and replies (reply.c). */
#include "api/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/fields.h"
#include "api/params.h"
#include "common/clock.h"
#include "common/err.h"

#define OA_MAX_LOGPROBS 20

/* One request's state across suspends (api_req.ext). */
typedef struct {
    int chat, stream, include_usage, echo, logprobs; /* logprobs: -1 off, else top-n asked */
    int n, n_prompts, max_tokens;
    char model[128];
    long long created, policy_version;
    json_object *rollout; /* the canonical rollout payload (groups[].prompt_ids) */
    json_object *sampled; /* the rollout job's result, or NULL (max_tokens 0) */
    json_object *scored; /* the logprobs job's result (echo + logprobs) */
    int stage; /* 0 rollout, 1 logprobs, 2 done */
} oa_req;

static void oa_free(void *p) {
    oa_req *q = p;
    if (!q) return;
    json_object_put(q->rollout);
    json_object_put(q->sampled);
    json_object_put(q->scored);
    free(q);
}

/* The name /v1/models serves: the model directory's last component. */
static void model_name(eng *e, char *out, size_t n) {
    eng_info in;
    eng_get_info(e, &in);
    const char *d = in.model_dir;
    size_t l = strlen(d);
    while (l > 1 && d[l - 1] == '/') l--;
    const char *b = d + l;
    while (b > d && b[-1] != '/') b--;
    snprintf(out, n, "%.*s", (int)(d + l - b), b);
    if (!out[0]) snprintf(out, n, "policy");
}

enum MHD_Result api_oa_models_get(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    enum MHD_Result r;
    eng *e = api_engine_or_reply(s, c, x, NULL, &r);
    if (!e) return r;
    eng_info in;
    eng_get_info(e, &in);
    char name[128];
    model_name(e, name, sizeof name);
    json_object *o = json_object_new_object(), *a = json_object_new_array(), *m = json_object_new_object();
    api_put_str(m, "id", name);
    api_put_str(m, "object", "model");
    api_put_int(m, "created", (long long)time(NULL));
    api_put_str(m, "owned_by", "grpod");
    api_put_int(m, "max_model_len", in.max_pos);
    api_put_int(m, "policy_version", in.policy_version);
    json_object_array_add(a, m);
    api_put_str(o, "object", "list");
    json_object_object_add(o, "data", a);
    return api_reply_obj(c, x, 200, o);
}

/* ---------------------------------------------------------------- request → rollout request */

/* Fields a client may send that grpod does not implement: accepted only at their neutral value. */
static int neutral_or_reply(json_object *req, api_error *e) {
    static const char *const zero_nums[] = {"presence_penalty", "frequency_penalty", NULL};
    json_object *v;
    for (int i = 0; zero_nums[i]; i++)
        if (json_object_object_get_ex(req, zero_nums[i], &v) && v && (!api_is_num(v) || json_object_get_double(v) != 0))
            return api_fail(e, GE_INVALID, zero_nums[i], "%s is not supported (only 0)", zero_nums[i]);
    if (json_object_object_get_ex(req, "logit_bias", &v) && v &&
        !(json_object_is_type(v, json_type_object) && json_object_object_length(v) == 0))
        return api_fail(e, GE_INVALID, "logit_bias", "logit_bias is not supported");
    if (json_object_object_get_ex(req, "suffix", &v) && v) return api_fail(e, GE_INVALID, "suffix", "suffix is not supported");
    if (json_object_object_get_ex(req, "tools", &v) && v) return api_fail(e, GE_INVALID, "tools", "tools are not supported");
    if (json_object_object_get_ex(req, "response_format", &v) && v) {
        json_object *t;
        if (!json_object_is_type(v, json_type_object) || !json_object_object_get_ex(v, "type", &t) ||
            strcmp(json_object_get_string(t), "text"))
            return api_fail(e, GE_INVALID, "response_format", "response_format must be {\"type\": \"text\"}");
    }
    return 0;
}

/* prompt: "text" | [ids] | ["text", ...] | [[ids], ...] → groups (each {"prompt"|"prompt_ids", "n"}). */
static int prompts_or_reply(json_object *p, int n, int max_groups, json_object *groups, api_error *e) {
    if (!p) return api_fail(e, GE_INVALID, "prompt", "prompt is required");
    json_object *one[1] = {p};
    json_object **items = one;
    int cnt = 1, batch = 0;
    if (json_object_is_type(p, json_type_array) && json_object_array_length(p) > 0) {
        json_object *first = json_object_array_get_idx(p, 0);
        batch = json_object_is_type(first, json_type_string) || json_object_is_type(first, json_type_array);
    }
    if (batch) cnt = (int)json_object_array_length(p);
    if (cnt > max_groups) return api_fail(e, GE_TOO_LARGE, "prompt", "prompt holds %d prompts; at most %d", cnt, max_groups);
    for (int i = 0; i < cnt; i++) {
        json_object *v = batch ? json_object_array_get_idx(p, (size_t)i) : items[0];
        char f[48];
        snprintf(f, sizeof f, batch ? "prompt[%d]" : "prompt", i);
        json_object *g = json_object_new_object();
        json_object_array_add(groups, g);
        if (json_object_is_type(v, json_type_string)) {
            api_put_copy(g, "prompt", v);
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

/* messages: [{"role", "content": "text" | [{"type": "text", "text"}]}] → native messages. */
static int messages_or_reply(json_object *m, json_object **out, api_error *e) {
    if (!m || !json_object_is_type(m, json_type_array) || json_object_array_length(m) == 0)
        return api_fail(e, GE_INVALID, "messages", "messages must be a non-empty array");
    json_object *a = json_object_new_array();
    *out = a;
    for (size_t i = 0; i < json_object_array_length(m); i++) {
        json_object *msg = json_object_array_get_idx(m, i), *role, *content;
        char f[48];
        snprintf(f, sizeof f, "messages[%zu]", i);
        if (!json_object_is_type(msg, json_type_object) || !json_object_object_get_ex(msg, "role", &role) ||
            !json_object_is_type(role, json_type_string))
            return api_fail(e, GE_INVALID, f, "%s must be an object with a role", f);
        const char *rs = json_object_get_string(role);
        if (!strcmp(rs, "developer")) rs = "system";
        api_sbuf b = {0};
        api_sb_str(&b, "");
        if (json_object_object_get_ex(msg, "content", &content) && json_object_is_type(content, json_type_array)) {
            for (size_t k = 0; k < json_object_array_length(content); k++) {
                json_object *part = json_object_array_get_idx(content, k), *t;
                if (!json_object_is_type(part, json_type_object) || !json_object_object_get_ex(part, "text", &t) ||
                    !json_object_is_type(t, json_type_string)) {
                    free(b.p);
                    return api_fail(e, GE_INVALID, f, "%s.content parts must be {\"type\": \"text\", \"text\"}", f);
                }
                api_sb_str(&b, json_object_get_string(t));
            }
        } else if (content && json_object_is_type(content, json_type_string)) {
            api_sb_str(&b, json_object_get_string(content));
        } else if (content && !json_object_is_type(content, json_type_null)) {
            free(b.p);
            return api_fail(e, GE_INVALID, f, "%s.content must be a string or an array of text parts", f);
        }
        json_object *nm = json_object_new_object();
        api_put_str(nm, "role", rs);
        api_put_str(nm, "content", b.p ? b.p : "");
        free(b.p);
        json_object_array_add(a, nm);
    }
    return 0;
}

/* The native validator names its own fields (groups[0].prompt, sampling.max_tokens): say them
 * as the OpenAI request does. */
static void rename_field(api_error *e, int chat) {
    const char *f = e->field;
    char nf[128];
    if (!strncmp(f, "sampling.", 9)) snprintf(nf, sizeof nf, "%s", f + 9);
    else if (!strncmp(f, "groups", 6)) snprintf(nf, sizeof nf, "%s", chat ? "messages" : "prompt");
    else return;
    snprintf(e->field, sizeof e->field, "%s", nf);
}

static int parse_or_reply(api_server *s, json_object *req, int chat, const api_limits *l, const api_model *m, oa_req *q,
                          api_error *e) {
    /* the route's own members; the sampling rows (engine/params.c) are allowed besides */
    static const char *const ckeys[] = {
        "model",   "prompt",           "max_tokens",        "n",          "logprobs", "echo", "stream", "stream_options", "user",
        "best_of", "presence_penalty", "frequency_penalty", "logit_bias", "suffix",   NULL};
    static const char *const hkeys[] = {"model",
                                        "messages",
                                        "max_tokens",
                                        "max_completion_tokens",
                                        "n",
                                        "logprobs",
                                        "top_logprobs",
                                        "stream",
                                        "stream_options",
                                        "user",
                                        "presence_penalty",
                                        "frequency_penalty",
                                        "logit_bias",
                                        "response_format",
                                        "tools",
                                        NULL};
    const char *keys[64];
    int nk = 0;
    for (const char *const *k = chat ? hkeys : ckeys; *k; k++) keys[nk++] = *k;
    for (int i = 0; i < eng_sampling_params.n && nk < 63; i++) keys[nk++] = eng_sampling_params.rows[i].name;
    keys[nk] = NULL;
    const char *model;
    long long n, max_tokens, best_of, lp = -1;
    int echo = 0, stream, rc;
    json_object *so, *v;
    if ((rc = api_check_keys(req, "", keys, e)) || (rc = neutral_or_reply(req, e)) ||
        (rc = api_get_str(req, "", "model", 0, &model, e)) || (rc = api_get_int(req, "", "n", 1, l->max_n, 1, &n, e)) ||
        (rc = api_get_bool(req, "", "stream", 0, &stream, e)) || (rc = api_get_obj(req, "", "stream_options", &so, e)))
        return rc;
    if (chat) {
        long long mct;
        if ((rc = api_get_int(req, "", "max_completion_tokens", 1, l->max_tokens, -1, &mct, e)) ||
            (rc = api_get_int(req, "", "max_tokens", 1, l->max_tokens,
                              mct > 0 ? mct : (l->max_tokens < 256 ? l->max_tokens : 256), &max_tokens, e)))
            return rc;
        int want;
        if ((rc = api_get_bool(req, "", "logprobs", 0, &want, e)) ||
            (rc = api_get_int(req, "", "top_logprobs", 0, OA_MAX_LOGPROBS, 0, &lp, e)))
            return rc;
        if (!want) lp = -1;
    } else {
        if ((rc = api_get_int(req, "", "max_tokens", 0, l->max_tokens, l->max_tokens < 16 ? l->max_tokens : 16, &max_tokens, e)) ||
            (rc = api_get_bool(req, "", "echo", 0, &echo, e)) || (rc = api_get_int(req, "", "best_of", n, n, n, &best_of, e)) ||
            (rc = api_get_int(req, "", "logprobs", 0, OA_MAX_LOGPROBS, -1, &lp, e)))
            return rc;
        if (max_tokens == 0 && !echo) return api_fail(e, GE_INVALID, "max_tokens", "max_tokens 0 needs echo: true");
    }
    q->include_usage = 0;
    if (so && json_object_object_get_ex(so, "include_usage", &v)) q->include_usage = json_object_get_boolean(v);
    q->chat = chat;
    q->stream = stream;
    q->echo = echo;
    q->logprobs = (int)lp;
    q->n = (int)n;
    q->max_tokens = (int)max_tokens;
    q->created = (long long)time(NULL);
    if (model) snprintf(q->model, sizeof q->model, "%s", model);
    else model_name(atomic_load(&s->engine), q->model, sizeof q->model);

    /* the native rollout request: sampling from the top-level members that are sampling rows
     * (max_tokens and logprobs are OpenAI's own, read above) */
    json_object *nat = json_object_new_object(), *groups = json_object_new_array(), *samp = json_object_new_object();
    json_object_object_add(nat, "groups", groups);
    json_object_object_add(nat, "sampling", samp);
    for (int i = 0; i < eng_sampling_params.n; i++) {
        const char *k = eng_sampling_params.rows[i].name;
        if (strcmp(k, "max_tokens") && strcmp(k, "logprobs") && json_object_object_get_ex(req, k, &v) && v)
            api_put_copy(samp, k, v);
    }
    api_put_int(samp, "max_tokens", max_tokens > 0 ? max_tokens : 1);
    json_object *meta = json_object_new_object();
    api_put_str(meta, "openai", chat ? "chat.completions" : "completions");
    json_object_object_add(nat, "metadata", meta);
    if (chat) {
        json_object *msgs = NULL, *g = json_object_new_object();
        json_object_array_add(groups, g);
        json_object_object_get_ex(req, "messages", &v);
        rc = messages_or_reply(v, &msgs, e);
        if (msgs) json_object_object_add(g, "messages", msgs);
        api_put_int(g, "n", n);
    } else {
        json_object_object_get_ex(req, "prompt", &v);
        rc = prompts_or_reply(v, (int)n, l->max_groups, groups, e);
    }
    if (!rc) rc = api_rollout_or_reply(nat, l, m, &q->rollout, e);
    if (rc) rename_field(e, chat);
    json_object_put(nat);
    if (rc) return rc;
    q->n_prompts = (int)json_object_array_length(json_object_object_get(q->rollout, "groups"));
    return 0;
}

/* ---------------------------------------------------------------- jobs */

static json_object *prompt_ids_of(const oa_req *q, int i) {
    return json_object_object_get(json_object_array_get_idx(json_object_object_get(q->rollout, "groups"), (size_t)i), "prompt_ids");
}
static json_object *response_of(const oa_req *q, int i, int k) {
    if (!q->sampled) return NULL;
    json_object *g = json_object_array_get_idx(json_object_object_get(q->sampled, "groups"), (size_t)i);
    return json_object_array_get_idx(json_object_object_get(g, "responses"), (size_t)k);
}

/* echo + logprobs: one logprobs group per prompt, prompt = its first token, responses = the rest
 * followed by each completion. NULL when there is nothing to score (one token, nothing sampled). */
static json_object *scoring_request(const oa_req *q) {
    json_object *req = json_object_new_object(), *gs = json_object_new_array();
    json_object_object_add(req, "groups", gs);
    int any = 0;
    for (int i = 0; i < q->n_prompts; i++) {
        json_object *pid = prompt_ids_of(q, i), *g = json_object_new_object(), *rs = json_object_new_array();
        int P = (int)json_object_array_length(pid);
        json_object *first = json_object_new_array();
        json_object_array_add(first, json_object_new_int(json_object_get_int(json_object_array_get_idx(pid, 0))));
        json_object_object_add(g, "prompt_ids", first);
        json_object_object_add(g, "responses", rs);
        for (int k = 0; k < q->n; k++) {
            json_object *ids = json_object_new_array(), *r = json_object_new_object(), *resp = response_of(q, i, k);
            for (int t = 1; t < P; t++) json_object_array_add(ids, json_object_get(json_object_array_get_idx(pid, (size_t)t)));
            json_object *gen = resp ? json_object_object_get(resp, "token_ids") : NULL;
            for (size_t t = 0; gen && t < json_object_array_length(gen); t++)
                json_object_array_add(ids, json_object_get(json_object_array_get_idx(gen, t)));
            if (json_object_array_length(ids) == 0) json_object_array_add(ids, json_object_new_int(0)); /* unused */
            else any = 1;
            json_object_object_add(r, "token_ids", ids);
            json_object_array_add(rs, r);
        }
        json_object_array_add(gs, g);
    }
    if (!any) {
        json_object_put(req);
        return NULL;
    }
    return req;
}

/* The job x->job_id ended (or is still pending: 1 with the connection suspended). 0 with *result
 * (the job's result object) or a reply sent (*r, returns -1). */
static int job_result(api_server *s, struct MHD_Connection *c, api_req *x, json_object **result, long long *pv, enum MHD_Result *r) {
    store *st = api_pool_get(s);
    if (!st) {
        *r = api_reply_fail(c, x, GE_STORE, "", "cannot open the store");
        return -1;
    }
    store_job j = {0};
    int rc = store_get(st, x->job_id, &j);
    int pending = !rc && (j.status == JOB_QUEUED || j.status == JOB_RUNNING);
    store_job_clear(&j);
    if (pending && api_wait_suspend(s, c, x, st, x->job_id)) {
        api_pool_put(s, st);
        *r = MHD_YES;
        return 1;
    }
    rc = store_get(st, x->job_id, &j);
    api_pool_put(s, st);
    if (rc) {
        *r = api_reply_fail(c, x, GE_STORE, "", "cannot read job: %s", err_msg());
        return -1;
    }
    int ret = -1;
    if (j.status == JOB_DONE && j.result) {
        *result = json_tokener_parse(j.result);
        *pv = j.policy_version;
        ret = *result ? 0 : -1;
        if (ret) *r = api_reply_fail(c, x, GE_INTERNAL, "", "job %s has an unreadable result", j.id);
    } else if (j.status == JOB_FAILED || j.status == JOB_CANCELLED) {
        *r = api_reply_job_error(c, x, &j);
    } else {
        *r = api_reply_fail(c, x, GE_UNAVAILABLE, "", "job %s did not finish in time (it goes on; GET /v1/jobs/%s)", j.id, j.id);
    }
    store_job_clear(&j);
    return ret;
}

/* ---------------------------------------------------------------- reply */

/* The text of one token (invalid UTF-8 of a cut character becomes U+FFFD). */
static char *token_text(eng *e, int id) {
    char *t = NULL;
    size_t len = 0;
    if (eng_detokenize(e, &id, 1, 0, &t, &len)) {
        err_clear();
        return strdup("");
    }
    size_t sl;
    char *clean = api_utf8_sanitize(t ? t : "", t ? len : 0, &sl);
    free(t);
    return clean ? clean : strdup("");
}

static char *ids_text(eng *e, json_object *ids) {
    int n = (int)json_object_array_length(ids);
    int *v = malloc(sizeof *v * (size_t)(n ? n : 1));
    char *t = NULL, *clean = NULL;
    size_t len = 0, sl;
    if (!v) return strdup("");
    for (int i = 0; i < n; i++) v[i] = json_object_get_int(json_object_array_get_idx(ids, (size_t)i));
    if (!eng_detokenize(e, v, n, 0, &t, &len)) clean = api_utf8_sanitize(t ? t : "", t ? len : 0, &sl);
    else err_clear();
    free(t);
    free(v);
    return clean ? clean : strdup("");
}

/* Completions logprobs {tokens, token_logprobs, top_logprobs, text_offset} over ids with their
 * logprobs (lps may be shorter at the front: the echoed first token has none). */
static json_object *completion_logprobs(eng *e, json_object *ids, json_object *lps, int lp_offset, size_t offset0) {
    json_object *o = json_object_new_object(), *tk = json_object_new_array(), *tl = json_object_new_array(),
                *top = json_object_new_array(), *off = json_object_new_array();
    size_t at = offset0;
    for (size_t t = 0; t < json_object_array_length(ids); t++) {
        char *s = token_text(e, json_object_get_int(json_object_array_get_idx(ids, t)));
        json_object_array_add(tk, json_object_new_string(s));
        long li = (long)t - lp_offset;
        json_object *v = li >= 0 ? json_object_array_get_idx(lps, (size_t)li) : NULL;
        if (v) {
            json_object_array_add(tl, json_object_new_double(json_object_get_double(v)));
            json_object *one = json_object_new_object();
            json_object_object_add(one, s, json_object_new_double(json_object_get_double(v)));
            json_object_array_add(top, one);
        } else {
            json_object_array_add(tl, NULL);
            json_object_array_add(top, NULL);
        }
        json_object_array_add(off, json_object_new_int64((long long)at));
        at += strlen(s);
        free(s);
    }
    json_object_object_add(o, "tokens", tk);
    json_object_object_add(o, "token_logprobs", tl);
    json_object_object_add(o, "top_logprobs", top);
    json_object_object_add(o, "text_offset", off);
    api_put_copy(o, "token_ids", ids); /* grpod's addition: token strings can be cut UTF-8 */
    return o;
}

/* Chat logprobs {"content": [{token, logprob, bytes, top_logprobs}]} of the sampled tokens. */
static json_object *chat_logprobs(eng *e, json_object *ids, json_object *lps) {
    json_object *o = json_object_new_object(), *a = json_object_new_array();
    for (size_t t = 0; t < json_object_array_length(ids); t++) {
        char *s = token_text(e, json_object_get_int(json_object_array_get_idx(ids, t)));
        double lp = json_object_get_double(json_object_array_get_idx(lps, t));
        json_object *c = json_object_new_object(), *bytes = json_object_new_array(), *top = json_object_new_array();
        for (const unsigned char *p = (const unsigned char *)s; *p; p++) json_object_array_add(bytes, json_object_new_int(*p));
        api_put_str(c, "token", s);
        json_object_object_add(c, "logprob", json_object_new_double(lp));
        json_object_object_add(c, "bytes", bytes);
        json_object *t1 = json_object_new_object();
        api_put_str(t1, "token", s);
        json_object_object_add(t1, "logprob", json_object_new_double(lp));
        json_object_object_add(t1, "bytes", json_object_get(bytes));
        json_object_array_add(top, t1);
        json_object_object_add(c, "top_logprobs", top);
        json_object_array_add(a, c);
        free(s);
    }
    json_object_object_add(o, "content", a);
    return o;
}

/* One choice: {"index", "text" | "message", "logprobs", "finish_reason"}; counts tokens into *ct. */
static json_object *choice(eng *e, const oa_req *q, int i, int k, long long *ct) {
    json_object *ch = json_object_new_object(), *resp = response_of(q, i, k);
    json_object *gen = resp ? json_object_object_get(resp, "token_ids") : NULL;
    const char *gen_text = resp ? json_object_get_string(json_object_object_get(resp, "text")) : "";
    const char *fin = resp ? json_object_get_string(json_object_object_get(resp, "finish_reason")) : "length";
    *ct += gen ? (long long)json_object_array_length(gen) : 0;
    api_put_int(ch, "index", (long long)i * q->n + k);
    if (q->chat) {
        json_object *m = json_object_new_object();
        api_put_str(m, "role", "assistant");
        api_put_str(m, "content", gen_text);
        json_object_object_add(ch, "message", m);
        json_object_object_add(ch, "logprobs",
                               q->logprobs >= 0 && gen ? chat_logprobs(e, gen, json_object_object_get(resp, "logprobs")) : NULL);
    } else {
        json_object *pid = prompt_ids_of(q, i);
        char *ptext = q->echo ? ids_text(e, pid) : strdup("");
        api_sbuf b = {0};
        api_sb_str(&b, ptext ? ptext : "");
        api_sb_str(&b, gen_text);
        api_put_str(ch, "text", b.p ? b.p : "");
        free(b.p);
        json_object *lp = NULL;
        if (q->logprobs >= 0 && q->echo) {
            json_object *all = json_object_new_array();
            for (size_t t = 0; t < json_object_array_length(pid); t++)
                json_object_array_add(all, json_object_get(json_object_array_get_idx(pid, t)));
            for (size_t t = 0; gen && t < json_object_array_length(gen); t++)
                json_object_array_add(all, json_object_get(json_object_array_get_idx(gen, t)));
            json_object *lps = NULL;
            if (q->scored) {
                json_object *sg = json_object_array_get_idx(json_object_object_get(q->scored, "groups"), (size_t)i);
                lps = json_object_object_get(json_object_array_get_idx(json_object_object_get(sg, "responses"), (size_t)k),
                                             "logprobs");
            }
            lp = completion_logprobs(e, all, lps, 1, 0);
            json_object_put(all);
        } else if (q->logprobs >= 0 && gen) {
            lp = completion_logprobs(e, gen, json_object_object_get(resp, "logprobs"), 0, 0);
        }
        json_object_object_add(ch, "logprobs", lp);
        free(ptext);
    }
    api_put_str(ch, "finish_reason", fin && *fin ? fin : "length");
    return ch;
}

static json_object *usage(const oa_req *q, long long completion) {
    long long p = 0;
    for (int i = 0; i < q->n_prompts; i++) p += (long long)json_object_array_length(prompt_ids_of(q, i));
    json_object *u = json_object_new_object();
    api_put_int(u, "prompt_tokens", p);
    api_put_int(u, "completion_tokens", completion);
    api_put_int(u, "total_tokens", p + completion);
    return u;
}

static json_object *envelope(const oa_req *q, const char *id, const char *object) {
    json_object *o = json_object_new_object();
    api_put_str(o, "id", id);
    api_put_str(o, "object", object);
    api_put_int(o, "created", q->created);
    api_put_str(o, "model", q->model);
    api_put_int(o, "policy_version", q->policy_version);
    return o;
}

static void sse(api_sbuf *b, json_object *o) {
    api_sb_str(b, "data: ");
    api_sb_str(b, json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    api_sb_str(b, "\n\n");
    json_object_put(o);
}

static enum MHD_Result reply_choices(api_server *s, struct MHD_Connection *c, api_req *x, const oa_req *q) {
    eng *e = atomic_load(&s->engine);
    char id[64];
    snprintf(id, sizeof id, "%s-%s", q->chat ? "chatcmpl" : "cmpl", x->job_id);
    long long ct = 0;
    json_object *choices = json_object_new_array();
    for (int i = 0; i < q->n_prompts; i++)
        for (int k = 0; k < q->n; k++) json_object_array_add(choices, choice(e, q, i, k, &ct));
    if (!q->stream) {
        json_object *o = envelope(q, id, q->chat ? "chat.completion" : "text_completion");
        json_object_object_add(o, "choices", choices);
        json_object_object_add(o, "usage", usage(q, ct));
        return api_reply_obj(c, x, 200, o);
    }
    /* server-sent events: per choice its content, then its finish_reason; usage; [DONE] */
    api_sbuf b = {0};
    const char *obj = q->chat ? "chat.completion.chunk" : "text_completion";
    for (size_t i = 0; i < json_object_array_length(choices); i++) {
        json_object *ch = json_object_array_get_idx(choices, i), *o = envelope(q, id, obj), *a = json_object_new_array();
        json_object *d = json_object_new_object();
        api_put_copy(d, "index", json_object_object_get(ch, "index"));
        if (q->chat) {
            json_object *delta = json_object_new_object();
            api_put_str(delta, "role", "assistant");
            api_put_copy(delta, "content", json_object_object_get(json_object_object_get(ch, "message"), "content"));
            json_object_object_add(d, "delta", delta);
        } else {
            api_put_copy(d, "text", json_object_object_get(ch, "text"));
        }
        json_object_object_add(d, "logprobs", json_object_get(json_object_object_get(ch, "logprobs")));
        json_object_object_add(d, "finish_reason", NULL);
        json_object_array_add(a, d);
        json_object_object_add(o, "choices", a);
        sse(&b, o);
        o = envelope(q, id, obj);
        a = json_object_new_array();
        d = json_object_new_object();
        api_put_copy(d, "index", json_object_object_get(ch, "index"));
        if (q->chat) json_object_object_add(d, "delta", json_object_new_object());
        else api_put_str(d, "text", "");
        json_object_object_add(d, "logprobs", NULL);
        api_put_copy(d, "finish_reason", json_object_object_get(ch, "finish_reason"));
        json_object_array_add(a, d);
        json_object_object_add(o, "choices", a);
        sse(&b, o);
    }
    if (q->include_usage) {
        json_object *o = envelope(q, id, obj);
        json_object_object_add(o, "choices", json_object_new_array());
        json_object_object_add(o, "usage", usage(q, ct));
        sse(&b, o);
    }
    api_sb_str(&b, "data: [DONE]\n\n");
    json_object_put(choices);
    if (b.oom) {
        free(b.p);
        return api_reply_fail(c, x, GE_NOMEM, "", "out of memory");
    }
    return api_reply_raw(c, x, 200, "text/event-stream", b.p, b.len, 1);
}

/* ---------------------------------------------------------------- handler */

/* Submits the next job of q (rollout, then the scoring) or moves to done. Replies only errors. */
static enum MHD_Result next_job(api_server *s, struct MHD_Connection *c, api_req *x, oa_req *q, int *submitted) {
    *submitted = 0;
    x->job_id[0] = 0;
    x->deadline = clock_mono_s() + 600;
    char id[32] = "";
    enum MHD_Result r = MHD_YES;
    if (q->stage == 0 && q->max_tokens > 0) {
        r = api_submit_and_reply(s, c, x, "rollout", q->rollout, id);
    } else if (q->stage <= 1 && q->echo && q->logprobs >= 0) {
        q->stage = 1;
        json_object *sreq = scoring_request(q), *payload = NULL;
        if (sreq) {
            api_model m;
            api_error e;
            if (!api_engine_or_reply(s, c, x, &m, &r)) {
                json_object_put(sreq);
                return r;
            }
            api_limits l = api_limits_now(s);
            if (api_logprobs_or_reply(sreq, &l, &m, &payload, &e)) {
                json_object_put(sreq);
                rename_field(&e, q->chat);
                return api_reply_error(c, x, &e);
            }
            json_object_put(sreq);
            r = api_submit_and_reply(s, c, x, "logprobs", payload, id);
            json_object_put(payload);
        } else {
            q->stage = 2;
        }
    } else {
        q->stage = 2;
    }
    if (id[0]) {
        memcpy(x->job_id, id, sizeof id);
        *submitted = 1;
    }
    return r;
}

static enum MHD_Result completions(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, int chat) {
    oa_req *q = x->ext;
    enum MHD_Result r;
    int submitted;
    if (!q) {
        api_model m;
        api_error e;
        if (!api_engine_or_reply(s, c, x, &m, &r)) return r;
        if (!(q = calloc(1, sizeof *q))) return api_reply_fail(c, x, GE_NOMEM, "", "out of memory");
        x->ext = q;
        x->ext_free = oa_free;
        api_limits l = api_limits_now(s);
        if (parse_or_reply(s, req, chat, &l, &m, q, &e)) return api_reply_error(c, x, &e);
        q->policy_version = api_policy_version_now(s);
        r = next_job(s, c, x, q, &submitted);
        if (!submitted && q->stage != 2) return r; /* the error was replied */
    }
    while (q->stage < 2) {
        json_object *res = NULL;
        long long pv = -1;
        int st = job_result(s, c, x, &res, &pv, &r);
        if (st != 0) return r; /* suspended (1) or an error replied (-1) */
        if (q->stage == 0) {
            q->sampled = res;
            q->policy_version = pv;
        } else q->scored = res;
        if (q->stage == 1 && !q->sampled) q->policy_version = pv;
        q->stage++;
        r = next_job(s, c, x, q, &submitted);
        if (!submitted && q->stage != 2) return r;
    }
    return reply_choices(s, c, x, q);
}

enum MHD_Result api_oa_completions_post(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    return completions(s, c, x, req, 0);
}
enum MHD_Result api_oa_chat_post(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    return completions(s, c, x, req, 1);
}
