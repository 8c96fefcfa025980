/* openai_vllm.c — the routes vLLM's OpenAI server has beside OpenAI's, which eval harnesses and
 * deployments written for vLLM call: GET /health (Kubernetes probes), GET /version,
 * POST /tokenize and /detokenize (also served as grpod's /v1/tokenize and /v1/detokenize),
 * GET /tokenizer_info (lm-evaluation-harness's remote tokenizer), GET /v1/models and
 * GET /v1/models/{id}; and the check that a request names the served model.
 *
 * As in vLLM, the key of --api-key-file guards the /v1 paths only. Not here: completions and
 * chat completions (openai.c). */
#include "api/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/fields.h"
#include "api/openai.h"
#include "common/err.h"
#include "common/version.h"

/* ---------------------------------------------------------------- the served model */

void oa_model_name(eng *e, char *out, size_t n) {
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

int oa_model_or_reply(eng *e, const char *name, api_error *err) {
    char served[128];
    eng_info in;
    if (!name) return 0;
    oa_model_name(e, served, sizeof served);
    eng_get_info(e, &in);
    if (!strcmp(name, served) || !strcmp(name, in.model_dir)) return 0;
    return api_fail(err, GE_NOT_FOUND, "model", "The model `%s` does not exist (this server serves `%s`).", name, served);
}

static json_object *model_card(eng *e) {
    eng_info in;
    char name[128];
    eng_get_info(e, &in);
    oa_model_name(e, name, sizeof name);
    json_object *m = json_object_new_object();
    api_put_str(m, "id", name);
    api_put_str(m, "object", "model");
    api_put_int(m, "created", (long long)time(NULL));
    api_put_str(m, "owned_by", "grpod");
    api_put_str(m, "root", in.model_dir);
    json_object_object_add(m, "parent", NULL);
    api_put_int(m, "max_model_len", in.max_pos);
    api_put_int(m, "policy_version", in.policy_version);
    return m;
}

enum MHD_Result api_oa_models_get(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    enum MHD_Result r;
    eng *e = api_engine_or_reply(s, c, x, NULL, &r);
    if (!e) return r;
    json_object *o = json_object_new_object(), *a = json_object_new_array();
    json_object_array_add(a, model_card(e));
    api_put_str(o, "object", "list");
    json_object_object_add(o, "data", a);
    return api_reply_obj(c, x, 200, o);
}

enum MHD_Result api_oa_model_get(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    enum MHD_Result r;
    api_error err;
    eng *e = api_engine_or_reply(s, c, x, NULL, &r);
    if (!e) return r;
    if (oa_model_or_reply(e, id, &err)) return api_reply_error(c, x, &err);
    return api_reply_obj(c, x, 200, model_card(e));
}

/* ---------------------------------------------------------------- health, version */

/* vLLM's probe: 200 with an empty body while the engine serves; 503 loading, failed or draining. */
enum MHD_Result api_vllm_health_get(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    enum MHD_Result r;
    if (atomic_load(&s->stopping)) return api_reply_fail(c, x, GE_UNAVAILABLE, "", "shutting down");
    if (!api_engine_or_reply(s, c, x, NULL, &r)) return r;
    return api_reply_raw(c, x, 200, "text/plain", "", 0, 0);
}

enum MHD_Result api_vllm_version_get(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    return api_reply_json(c, x, 200, "{\"version\":\"" GRPOD_VERSION "\"}");
}

/* ---------------------------------------------------------------- tokenizer */

/* The tokenizer's settings as vLLM's /tokenizer_info gives them: tokenizer_config.json less its
 * file paths and added_tokens_decoder, special tokens as their text, tokenizer_class. */
enum MHD_Result api_vllm_tokenizer_info_get(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    enum MHD_Result r;
    eng *e = api_engine_or_reply(s, c, x, NULL, &r);
    if (!e) return r;
    eng_info in;
    eng_get_info(e, &in);
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", in.model_dir);
    json_object *o = json_object_from_file(path);
    if (!json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        o = json_object_new_object();
    }
    static const char *const dropped[] = {"vocab_file", "merges_file", "tokenizer_file", "added_tokens_decoder", NULL};
    for (int i = 0; dropped[i]; i++) json_object_object_del(o, dropped[i]);
    static const char *const specials[] = {"bos_token", "eos_token", "pad_token", "unk_token", NULL};
    for (int i = 0; specials[i]; i++) {
        json_object *v = json_object_object_get(o, specials[i]), *content;
        if (json_object_object_get_ex(v, "content", &content)) /* an AddedToken: its text */
            json_object_object_add(o, specials[i], json_object_get(content));
        else if (!v) json_object_object_add(o, specials[i], NULL);
    }
    if (!json_object_object_get_ex(o, "tokenizer_class", NULL)) api_put_str(o, "tokenizer_class", "PreTrainedTokenizerFast");
    return api_reply_obj(c, x, 200, o);
}

/* {"tokens", "count", "max_model_len", "token_strs"} (token_strs: each token's text when asked). */
static enum MHD_Result reply_tokens(struct MHD_Connection *c, api_req *x, eng *e, const int *ids, int n, int max_pos, int strs) {
    json_object *o = json_object_new_object(), *a = json_object_new_array_ext(n), *ts = strs ? json_object_new_array_ext(n) : NULL;
    for (int i = 0; i < n; i++) {
        json_object_array_add(a, json_object_new_int(ids[i]));
        char *t = NULL, *clean = NULL;
        size_t len = 0, sl = 0;
        if (!ts) continue;
        if (!eng_detokenize(e, &ids[i], 1, 0, &t, &len)) clean = api_utf8_sanitize(t ? t : "", t ? len : 0, &sl);
        err_clear();
        json_object_array_add(ts, json_object_new_string(clean ? clean : ""));
        free(t);
        free(clean);
    }
    json_object_object_add(o, "tokens", a);
    api_put_int(o, "count", n);
    api_put_int(o, "max_model_len", max_pos);
    json_object_object_add(o, "token_strs", ts);
    return api_reply_obj(c, x, 200, o);
}

/* vLLM's two forms: {"prompt", "add_special_tokens": true} or {"messages", "tools"?,
 * "add_generation_prompt": true, "continue_final_message", "chat_template_kwargs",
 * "add_special_tokens": false} (the prompt chat completions would sample from). */
static enum MHD_Result tokenize(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req) {
    static const char *const own_keys[] = {"model", "prompt", "return_token_strs", NULL};
    const char *keys[24], *model, *text;
    int nk = 0, strs, rc, add_special, *ids = NULL, n = 0;
    for (const char *const *k = own_keys; *k; k++) keys[nk++] = *k;
    for (const char *const *k = oa_chat_prompt_keys; *k; k++)
        if (strcmp(*k, "tool_choice") && strcmp(*k, "parallel_tool_calls")) keys[nk++] = *k;
    keys[nk] = NULL;
    api_model m;
    api_error err;
    enum MHD_Result r;
    eng *e = api_engine_or_reply(s, c, x, &m, &r);
    if (!e) return r;
    if ((rc = api_check_keys(req, "", keys, &err)) || (rc = api_get_str(req, "", "model", 0, &model, &err)) ||
        (rc = oa_model_or_reply(e, model, &err)) || (rc = api_get_bool(req, "", "return_token_strs", 0, &strs, &err)) ||
        (rc = api_get_str(req, "", "prompt", 0, &text, &err)))
        return api_reply_error(c, x, &err);
    int chat = json_object_object_get_ex(req, "messages", NULL);
    if ((text != NULL) == chat) return api_reply_fail(c, x, GE_INVALID, "prompt", "give exactly one of prompt, messages");
    if (chat) {
        oa_tools t;
        if ((rc = oa_tools_or_reply(req, &t, &err))) return api_reply_error(c, x, &err);
        rc = oa_chat_prompt_or_reply(e, req, &t, &ids, &n, &err);
        oa_tools_free(&t);
        if (rc) return api_reply_error(c, x, &err);
    } else {
        static const char *const prompt_only[] = {"add_generation_prompt", "continue_final_message", "chat_template_kwargs",
                                                  "tools", NULL};
        for (int i = 0; prompt_only[i]; i++)
            if (json_object_object_get_ex(req, prompt_only[i], NULL))
                return api_reply_fail(c, x, GE_INVALID, prompt_only[i], "%s goes with messages, not prompt", prompt_only[i]);
        if ((rc = api_get_bool(req, "", "add_special_tokens", 1, &add_special, &err))) return api_reply_error(c, x, &err);
        if (eng_tokenize(e, text, strlen(text), add_special, &ids, &n)) {
            r = api_reply_fail(c, x, GE_INVALID, "prompt", "prompt cannot be tokenized: %s", err_msg());
            err_clear();
            return r;
        }
    }
    r = reply_tokens(c, x, e, ids, n, m.max_pos, strs);
    free(ids);
    return r;
}

enum MHD_Result api_tokenize_post(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    return tokenize(s, c, x, req);
}
enum MHD_Result api_vllm_tokenize_post(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    return tokenize(s, c, x, req);
}

/* {"tokens", "skip_special_tokens": false, "model"} → {"prompt"}. */
static enum MHD_Result detokenize(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req) {
    api_model m;
    api_error err;
    enum MHD_Result r;
    const char *model;
    int *ids, n, skip;
    eng *e = api_engine_or_reply(s, c, x, &m, &r);
    if (!e) return r;
    if (api_get_str(req, "", "model", 0, &model, &err) || oa_model_or_reply(e, model, &err)) return api_reply_error(c, x, &err);
    json_object_object_del(req, "model"); /* checked: the rest is the native validator's */
    if (api_detokenize_or_reply(req, &m, &ids, &n, &skip, &err)) return api_reply_error(c, x, &err);
    char *text = NULL;
    size_t len = 0;
    int rc = eng_detokenize(e, ids, n, skip, &text, &len);
    free(ids);
    if (rc) {
        r = api_reply_fail(c, x, GE_INVALID, "tokens", "cannot detokenize: %s", err_msg());
        err_clear();
        return r;
    }
    json_object *o = json_object_new_object();
    size_t sl = 0;
    char *clean = api_utf8_sanitize(text ? text : "", text ? len : 0, &sl);
    free(text);
    if (!clean) return api_reply_fail(c, x, GE_NOMEM, "", "out of memory");
    json_object_object_add(o, "prompt", json_object_new_string_len(clean, (int)sl));
    free(clean);
    return api_reply_obj(c, x, 200, o);
}

enum MHD_Result api_detokenize_post(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    return detokenize(s, c, x, req);
}
enum MHD_Result api_vllm_detokenize_post(api_server *s, struct MHD_Connection *c, api_req *x, json_object *req, const char *id) {
    return detokenize(s, c, x, req);
}
