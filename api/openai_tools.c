/* openai_tools.c — tool calling on the OpenAI routes: the request's tools and tool_choice, JSON
 * written as the chat template's tojson writes it, and the model's output parsed into tool_calls
 * as vLLM's hermes parser does (the <tool_call> format of Qwen2.5 and Qwen3). See openai.h.
 *
 * tool_choice "required" and a named function promise a call whatever the model would write:
 * the answer starts with the call's opening (<tool_call>, the name, "arguments": ), appended to
 * the prompt, and the model writes the arguments under a JSON grammar (sampling.guided, set by
 * openai_request.c), so they parse. Required with several tools first draws the name from the
 * policy's own probabilities of the openings (openai.c). The arguments are not checked against
 * the tool's parameters schema. */
#include "api/openai.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "api/fields.h"
#include "api/sbuf.h"
#include "common/err.h"

/* ---------------------------------------------------------------- ids */

void oa_new_id(char *out, size_t n, const char *prefix) {
    unsigned char r[16];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) { /* no entropy source: time and address */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        unsigned long long v = (unsigned long long)ts.tv_nsec ^ ((unsigned long long)ts.tv_sec << 30) ^ (uintptr_t)out;
        for (size_t i = 0; i < sizeof r; i++) r[i] = (unsigned char)(v >> (8 * (i % 8))) ^ (unsigned char)(i * 131);
    }
    int at = snprintf(out, n, "%s", prefix);
    for (size_t i = 0; i < sizeof r && at > 0 && (size_t)at + 2 < n; i++) at += snprintf(out + at, n - (size_t)at, "%02x", r[i]);
}

/* ---------------------------------------------------------------- Python's json.dumps */

static void py_string(api_sbuf *b, const char *s, size_t len) {
    api_sb_str(b, "\"");
    static const char *const esc[32] = {['\b'] = "\\b", ['\f'] = "\\f", ['\n'] = "\\n", ['\r'] = "\\r", ['\t'] = "\\t"};
    for (size_t i = 0; i < len;) {
        size_t run = 0; /* characters written as they are (UTF-8 included: ensure_ascii=False) */
        while (i + run < len && (unsigned char)s[i + run] >= 0x20 && s[i + run] != '"' && s[i + run] != '\\') run++;
        if (run) {
            api_sb_printf(b, "%.*s", (int)run, s + i);
            i += run;
            continue;
        }
        unsigned char ch = (unsigned char)s[i++];
        if (ch == '"') api_sb_str(b, "\\\"");
        else if (ch == '\\') api_sb_str(b, "\\\\");
        else if (esc[ch]) api_sb_str(b, esc[ch]);
        else api_sb_printf(b, "\\u%04x", ch);
    }
    api_sb_str(b, "\"");
}

static void py_dump(api_sbuf *b, json_object *v) {
    switch (json_object_get_type(v)) {
    case json_type_null: api_sb_str(b, "null"); break;
    case json_type_boolean: api_sb_str(b, json_object_get_boolean(v) ? "true" : "false"); break;
    case json_type_int: api_sb_printf(b, "%lld", (long long)json_object_get_int64(v)); break;
    case json_type_double: api_sb_str(b, json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN)); break;
    case json_type_string: py_string(b, json_object_get_string(v), (size_t)json_object_get_string_len(v)); break;
    case json_type_array:
        api_sb_str(b, "[");
        for (size_t i = 0; i < json_object_array_length(v); i++) {
            if (i) api_sb_str(b, ", ");
            py_dump(b, json_object_array_get_idx(v, i));
        }
        api_sb_str(b, "]");
        break;
    case json_type_object: {
        int first = 1;
        api_sb_str(b, "{");
        json_object_object_foreach(v, k, x) {
            if (!first) api_sb_str(b, ", ");
            first = 0;
            py_string(b, k, strlen(k));
            api_sb_str(b, ": ");
            py_dump(b, x);
        }
        api_sb_str(b, "}");
        break;
    }
    }
}

char *oa_pydumps(json_object *v) {
    api_sbuf b = {0};
    py_dump(&b, v);
    api_sb_str(&b, "");
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* ---------------------------------------------------------------- the request's tools */

void oa_tools_free(oa_tools *t) {
    for (int i = 0; i < t->n; i++) free(t->json[i]), free(t->names[i]);
    free(t->json);
    free(t->names);
    memset(t, 0, sizeof *t);
}

/* tools[i]: {"type": "function", "function": {"name", "description"?, "parameters"?, ...}}. */
static int tool_or_reply(json_object *tool, int i, api_error *err) {
    char p[48], pf[64];
    const char *type, *name;
    json_object *fn;
    snprintf(p, sizeof p, "tools[%d]", i);
    snprintf(pf, sizeof pf, "tools[%d].function", i);
    int rc;
    if (!json_object_is_type(tool, json_type_object)) return api_fail(err, GE_INVALID, p, "%s must be an object", p);
    if ((rc = api_get_str(tool, p, "type", 0, &type, err)) || (rc = api_get_obj(tool, p, "function", &fn, err))) return rc;
    if (type && strcmp(type, "function"))
        return api_fail(err, GE_INVALID, p, "%s.type must be \"function\" (the only kind of tool)", p);
    if (!fn) return api_fail(err, GE_INVALID, pf, "%s is required", pf);
    if ((rc = api_get_str(fn, pf, "name", 1, &name, err))) return rc;
    json_object *params;
    if ((rc = api_get_obj(fn, pf, "parameters", &params, err))) return rc;
    return 0;
}

int oa_tools_or_reply(json_object *req, oa_tools *t, api_error *err) {
    json_object *tools, *choice;
    int rc;
    memset(t, 0, sizeof *t);
    t->parallel = 1;
    if ((rc = api_get_arr(req, "", "tools", 0, 0, 1024, &tools, err)) ||
        (rc = api_get_bool(req, "", "parallel_tool_calls", 1, &t->parallel, err)))
        return rc;
    int n = tools ? (int)json_object_array_length(tools) : 0;
    t->named = -1;
    if (n && (!(t->json = calloc((size_t)n, sizeof *t->json)) || !(t->names = calloc((size_t)n, sizeof *t->names)))) {
        free(t->json);
        return api_fail(err, GE_NOMEM, "tools", "out of memory");
    }
    for (int i = 0; i < n; i++) {
        json_object *tool = json_object_array_get_idx(tools, (size_t)i);
        if ((rc = tool_or_reply(tool, i, err))) goto fail;
        const char *name = json_object_get_string(json_object_object_get(json_object_object_get(tool, "function"), "name"));
        t->json[i] = oa_pydumps(tool);
        t->names[i] = strdup(name);
        t->n++;
        if (!t->json[i] || !t->names[i]) {
            rc = api_fail(err, GE_NOMEM, "tools", "out of memory");
            goto fail;
        }
    }
    t->choice = n ? OA_TOOLS_AUTO : OA_TOOLS_NONE;
    if (!json_object_object_get_ex(req, "tool_choice", &choice) || !choice) return 0;
    static const struct {
        const char *name;
        oa_tool_choice choice;
    } modes[] = {{"none", OA_TOOLS_NONE}, {"auto", OA_TOOLS_AUTO}, {"required", OA_TOOLS_REQUIRED}};
    int known = 0;
    if (json_object_is_type(choice, json_type_string)) {
        for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
            if (!strcmp(json_object_get_string(choice), modes[i].name)) {
                t->choice = modes[i].choice;
                known = 1;
            }
    } else if (json_object_is_type(choice, json_type_object)) {
        json_object *fn = json_object_object_get(choice, "function"), *name = json_object_object_get(fn, "name");
        known = json_object_is_type(name, json_type_string);
        t->choice = OA_TOOLS_NAMED;
        for (int i = 0; known && i < n; i++)
            if (!strcmp(t->names[i], json_object_get_string(name))) t->named = i;
        if (known && n && t->named < 0) {
            rc = api_fail(err, GE_INVALID, "tool_choice", "tool_choice names function \"%s\", which is not in tools",
                          json_object_get_string(name));
            goto fail;
        }
    }
    if (!known) {
        rc = api_fail(
            err, GE_INVALID, "tool_choice",
            "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\"}}");
        goto fail;
    }
    if (t->choice != OA_TOOLS_NONE && !n) {
        rc = api_fail(err, GE_INVALID, "tool_choice", "tool_choice other than \"none\" needs tools");
        goto fail;
    }
    return 0;
fail:
    oa_tools_free(t);
    return rc;
}

/* ---------------------------------------------------------------- the model's output */

#define CALL_OPEN "<tool_call>"
#define CALL_CLOSE "</tool_call>"

/* {id, type: "function", function: {name, arguments: args[0, len)}} */
static json_object *new_call(const char *name, const char *args, size_t len) {
    char id[64];
    json_object *call = json_object_new_object(), *fn = json_object_new_object();
    oa_new_id(id, sizeof id, "chatcmpl-tool-");
    json_object_object_add(call, "id", json_object_new_string(id));
    json_object_object_add(call, "type", json_object_new_string("function"));
    json_object_object_add(fn, "name", json_object_new_string(name));
    json_object_object_add(fn, "arguments", json_object_new_string_len(args, (int)len));
    json_object_object_add(call, "function", fn);
    return call;
}

/* One call's body: {"name": string, "arguments": any} (whitespace around it allowed). */
static json_object *call_of(const char *p, size_t len) {
    json_tokener *tk = json_tokener_new();
    if (!tk) return NULL;
    while (len && strchr(" \t\r\n", p[0])) p++, len--;
    while (len && strchr(" \t\r\n", p[len - 1])) len--;
    json_object *o = len ? json_tokener_parse_ex(tk, p, (int)len) : NULL;
    int whole = o && json_tokener_get_error(tk) == json_tokener_success && (size_t)json_tokener_get_parse_end(tk) == len;
    json_tokener_free(tk);
    json_object *name = json_object_object_get(o, "name"), *args;
    if (!whole || !json_object_is_type(o, json_type_object) || !json_object_is_type(name, json_type_string) ||
        !json_object_object_get_ex(o, "arguments", &args)) {
        json_object_put(o);
        return NULL;
    }
    char *a = oa_pydumps(args);
    json_object *call = new_call(json_object_get_string(name), a ? a : "{}", a ? strlen(a) : 2);
    free(a);
    json_object_put(o);
    return call;
}

json_object *oa_parse_tool_calls(const char *text, size_t *content_len, int max) {
    const char *first = strstr(text, CALL_OPEN);
    if (!first) return NULL;
    json_object *calls = json_object_new_array();
    for (const char *at = first; at;) {
        const char *body = at + strlen(CALL_OPEN), *end = strstr(body, CALL_CLOSE);
        size_t len = end ? (size_t)(end - body) : strlen(body);
        json_object *call = call_of(body, len);
        if (!call) { /* as vLLM: one malformed call and the whole text is content */
            json_object_put(calls);
            return NULL;
        }
        if (max <= 0 || (int)json_object_array_length(calls) < max) json_object_array_add(calls, call);
        else json_object_put(call);
        at = end ? strstr(end + strlen(CALL_CLOSE), CALL_OPEN) : NULL;
    }
    *content_len = (size_t)(first - text);
    return calls;
}

char *oa_call_opening(const char *name) {
    api_sbuf b = {0};
    api_sb_str(&b, CALL_OPEN "\n{\"name\": ");
    py_string(&b, name, strlen(name));
    api_sb_str(&b, ", \"arguments\": ");
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

json_object *oa_forced_calls(const char *opening, const char *name, const char *text, int max) {
    api_sbuf b = {0};
    api_sb_str(&b, opening);
    api_sb_str(&b, text);
    size_t clen;
    json_object *calls = b.oom ? NULL : oa_parse_tool_calls(b.p, &clen, max);
    free(b.p);
    if (calls) return calls;
    /* the arguments as a JSON object at the start, closed by the call's brace (what the grammar
     * writes), when a string in them holds "</tool_call>" and cut the hermes parse short */
    json_tokener *tk = json_tokener_new();
    json_object *args = tk ? json_tokener_parse_ex(tk, text, (int)strlen(text)) : NULL;
    int whole = args && json_tokener_get_error(tk) == json_tokener_success && json_object_is_type(args, json_type_object) &&
        text[json_tokener_get_parse_end(tk)] == '}';
    char *dumped = whole ? oa_pydumps(args) : NULL;
    json_tokener_free(tk);
    json_object_put(args);
    if (dumped) {
        calls = json_object_new_array();
        json_object_array_add(calls, new_call(name, dumped, strlen(dumped)));
        free(dumped);
        return calls;
    }
    while (*text && strchr(" \t\r\n", *text)) text++;
    const char *end = strstr(text, CALL_CLOSE);
    size_t len = end ? (size_t)(end - text) : strlen(text);
    while (len && strchr(" \t\r\n", text[len - 1])) len--;
    if (len && text[len - 1] == '}') len--; /* the call object's own closing brace */
    while (len && strchr(" \t\r\n", text[len - 1])) len--;
    calls = json_object_new_array();
    json_object_array_add(calls, new_call(name, text, len));
    return calls;
}
