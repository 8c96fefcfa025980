/* openai_chat.c — an OpenAI chat request's messages as prompt ids: each message read in OpenAI's
 * shapes (content as text or text parts; an assistant's tool_calls; a tool's result with its
 * tool_call_id), the tools and chat_template_kwargs handed to the model's chat template
 * (engine/text/chat.h), the text tokenized. See openai.h.
 *
 * As vLLM does, a call's arguments (a JSON string in OpenAI's messages) are parsed and written
 * back as the template's tojson writes them, and chat_template_kwargs keys the template does not
 * read are ignored, as a Jinja template ignores them. Nothing of a message is dropped: a part or
 * member the template cannot render is refused, named. */
#include "api/openai.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/fields.h"
#include "api/sbuf.h"
#include "common/err.h"

const char *const oa_chat_prompt_keys[] = {"messages",
                                           "tools",
                                           "tool_choice",
                                           "parallel_tool_calls",
                                           "chat_template_kwargs",
                                           "add_generation_prompt",
                                           "continue_final_message",
                                           "add_special_tokens",
                                           NULL};

/* What the rendering borrows: the messages point into the request and into these buffers. */
typedef struct {
    eng_message *msgs;
    eng_tool_call *calls;
    char **owned; /* texts made here (joined parts, arguments): freed at the end */
    int n_owned, cap_owned;
} chat_parts;

static void parts_free(chat_parts *p) {
    for (int i = 0; i < p->n_owned; i++) free(p->owned[i]);
    free(p->owned);
    free(p->msgs);
    free(p->calls);
}

/* Keeps s (malloc'd) until parts_free; NULL when s is NULL or out of memory. */
static char *own(chat_parts *p, char *s) {
    if (!s) return NULL;
    if (p->n_owned == p->cap_owned) {
        int nc = p->cap_owned ? 2 * p->cap_owned : 16;
        char **na = realloc(p->owned, sizeof *na * (size_t)nc);
        if (!na) {
            free(s);
            return NULL;
        }
        p->owned = na;
        p->cap_owned = nc;
    }
    return p->owned[p->n_owned++] = s;
}

/* content: a string, null, or [{"type": "text", "text"}, ...] (joined). */
static int content_or_reply(json_object *msg, const char *f, chat_parts *p, const char **out, api_error *err) {
    json_object *c = json_object_object_get(msg, "content");
    char cf[80];
    snprintf(cf, sizeof cf, "%s.content", f);
    *out = "";
    if (!c) return 0;
    if (json_object_is_type(c, json_type_string)) {
        *out = json_object_get_string(c);
        return 0;
    }
    if (!json_object_is_type(c, json_type_array))
        return api_fail(err, GE_INVALID, cf, "%s must be a string, null or an array of text parts", cf);
    api_sbuf b = {0};
    api_sb_str(&b, "");
    for (size_t k = 0; k < json_object_array_length(c); k++) {
        json_object *part = json_object_array_get_idx(c, k), *t = json_object_object_get(part, "text"),
                    *type = json_object_object_get(part, "type");
        if (!json_object_is_type(t, json_type_string) ||
            (type && strcmp(json_object_get_string(type), "text") && strcmp(json_object_get_string(type), "input_text"))) {
            free(b.p);
            return api_fail(err, GE_INVALID, cf, "%s[%zu] must be {\"type\": \"text\", \"text\"}: grpod serves text only", cf, k);
        }
        api_sb_str(&b, json_object_get_string(t));
    }
    if (b.oom || !(*out = own(p, b.p))) return api_fail(err, GE_NOMEM, cf, "out of memory");
    return 0;
}

/* An assistant's tool_calls: [{"id"?, "type"?: "function", "function": {"name", "arguments"}}]. */
static int calls_or_reply(json_object *msg, const char *f, chat_parts *p, eng_message *m, int *used, int cap, api_error *err) {
    json_object *calls = json_object_object_get(msg, "tool_calls");
    char cf[96];
    snprintf(cf, sizeof cf, "%s.tool_calls", f);
    if (!calls || json_object_is_type(calls, json_type_null)) return 0;
    if (!json_object_is_type(calls, json_type_array)) return api_fail(err, GE_INVALID, cf, "%s must be an array", cf);
    int n = (int)json_object_array_length(calls);
    if (*used + n > cap) return api_fail(err, GE_TOO_LARGE, cf, "%s: too many tool calls in the request", cf);
    m->tool_calls = p->calls + *used;
    m->n_tool_calls = n;
    for (int k = 0; k < n; k++) {
        json_object *call = json_object_array_get_idx(calls, (size_t)k), *fn = json_object_object_get(call, "function");
        json_object *name = json_object_object_get(fn, "name"), *args = json_object_object_get(fn, "arguments");
        char kf[128];
        snprintf(kf, sizeof kf, "%s[%d].function", cf, k);
        if (!json_object_is_type(name, json_type_string))
            return api_fail(err, GE_INVALID, kf, "%s must be an object with a name and arguments", kf);
        json_object *parsed = args;
        int mine = 0;
        if (json_object_is_type(args, json_type_string)) { /* OpenAI's form: JSON text */
            parsed = json_tokener_parse(json_object_get_string(args));
            mine = 1;
            if (!parsed && strcmp(json_object_get_string(args), "null")) {
                snprintf(kf, sizeof kf, "%s[%d].function.arguments", cf, k);
                return api_fail(err, GE_INVALID, kf, "%s must be JSON text", kf);
            }
        }
        char *text = args ? oa_pydumps(parsed) : strdup("{}");
        if (mine) json_object_put(parsed);
        if (!own(p, text)) return api_fail(err, GE_NOMEM, kf, "out of memory");
        p->calls[*used + k] = (eng_tool_call){json_object_get_string(name), text};
    }
    *used += n;
    return 0;
}

/* One message: role (developer reads as system), content, an assistant's tool_calls. */
static int message_or_reply(json_object *msg, int i, chat_parts *p, int *used_calls, int cap_calls, api_error *err) {
    static const char *const roles[] = {"system", "user", "assistant", "tool", NULL};
    char f[48];
    snprintf(f, sizeof f, "messages[%d]", i);
    eng_message *m = &p->msgs[i];
    json_object *role = json_object_object_get(msg, "role");
    if (!json_object_is_type(msg, json_type_object) || !json_object_is_type(role, json_type_string))
        return api_fail(err, GE_INVALID, f, "%s must be an object with a role", f);
    m->role = json_object_get_string(role);
    if (!strcmp(m->role, "developer")) m->role = "system";
    int known = 0;
    for (const char *const *r = roles; *r; r++) known |= !strcmp(*r, m->role);
    if (!known) {
        char rf[64];
        snprintf(rf, sizeof rf, "%s.role", f);
        return api_fail(err, GE_INVALID, rf, "%s must be system, developer, user, assistant or tool", rf);
    }
    int rc = content_or_reply(msg, f, p, &m->content, err);
    if (rc) return rc;
    json_object *calls = json_object_object_get(msg, "tool_calls");
    if (calls && strcmp(m->role, "assistant")) {
        char cf[80];
        snprintf(cf, sizeof cf, "%s.tool_calls", f);
        return api_fail(err, GE_INVALID, cf, "%s: only an assistant message has tool_calls", cf);
    }
    return calls_or_reply(msg, f, p, m, used_calls, cap_calls, err);
}

/* continue_final_message: the text cut right after the last message's content, so the model
 * continues it (HF's and vLLM's rule: the content's last occurrence, its whitespace stripped). */
static int cut_after_final(char *text, const eng_message *last, api_error *err) {
    const char *c = last->content;
    size_t n = strlen(c);
    while (n && strchr(" \t\r\n", c[n - 1])) n--;
    while (n && strchr(" \t\r\n", c[0])) c++, n--;
    char *at = NULL;
    for (char *q = text; n && *q; q++)
        if (!strncmp(q, c, n)) at = q;
    if (!at)
        return api_fail(err, GE_INVALID, "continue_final_message",
                        "continue_final_message: the final message's content is not in the rendered prompt");
    at[n] = 0;
    return 0;
}

int oa_chat_prompt_or_reply(eng *e, json_object *req, const oa_tools *t, int **ids, int *n, api_error *err) {
    json_object *msgs, *kw, *v;
    int agp, cont, add_special, rc;
    *ids = NULL;
    *n = 0;
    if ((rc = api_get_arr(req, "", "messages", 1, 1, 4096, &msgs, err)) ||
        (rc = api_get_bool(req, "", "add_generation_prompt", 1, &agp, err)) ||
        (rc = api_get_bool(req, "", "continue_final_message", 0, &cont, err)) ||
        (rc = api_get_bool(req, "", "add_special_tokens", 0, &add_special, err)) ||
        (rc = api_get_obj(req, "", "chat_template_kwargs", &kw, err)))
        return rc;
    eng_chat_opts o = {.tools = (const char *const *)t->json, .n_tools = t->n};
    if (kw && json_object_object_get_ex(kw, "enable_thinking", &v)) {
        if (!json_object_is_type(v, json_type_boolean))
            return api_fail(err, GE_INVALID, "chat_template_kwargs.enable_thinking",
                            "chat_template_kwargs.enable_thinking must be a boolean");
        o.thinking_off = !json_object_get_boolean(v);
    }
    if (cont && agp && json_object_object_get_ex(req, "add_generation_prompt", NULL))
        return api_fail(err, GE_INVALID, "continue_final_message",
                        "continue_final_message and add_generation_prompt cannot both be true");
    if (cont) agp = 0;
    int cnt = (int)json_object_array_length(msgs), cap_calls = 4096, used = 0;
    chat_parts p = {0};
    p.msgs = calloc((size_t)cnt, sizeof *p.msgs);
    p.calls = calloc((size_t)cap_calls, sizeof *p.calls);
    char *text = NULL;
    if (!p.msgs || !p.calls) {
        rc = api_fail(err, GE_NOMEM, "messages", "out of memory");
        goto done;
    }
    for (int i = 0; i < cnt; i++)
        if ((rc = message_or_reply(json_object_array_get_idx(msgs, (size_t)i), i, &p, &used, cap_calls, err))) goto done;
    if (cont && strcmp(p.msgs[cnt - 1].role, "assistant")) {
        rc = api_fail(err, GE_INVALID, "continue_final_message", "continue_final_message needs an assistant message last");
        goto done;
    }
    if (eng_render_chat(e, p.msgs, cnt, agp, &o, &text)) {
        rc = api_fail(err, GE_INVALID, t->n ? "tools" : "messages", "cannot apply the chat template: %s", err_msg());
        err_clear();
        goto done;
    }
    if (cont && (rc = cut_after_final(text, &p.msgs[cnt - 1], err))) goto done;
    if (eng_tokenize(e, text, strlen(text), add_special, ids, n)) {
        rc = api_fail(err, GE_INVALID, "messages", "the chat prompt cannot be tokenized: %s", err_msg());
        err_clear();
    }
done:
    free(text);
    parts_free(&p);
    return rc;
}
