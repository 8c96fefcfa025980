/* openai_tools.c — tool calling on the OpenAI routes: the request's tools and tool_choice, JSON
 * written as the chat template's tojson writes it, and the model's output parsed into tool_calls
 * as vLLM's hermes parser does (the <tool_call> format of Qwen2.5 and Qwen3). See openai.h.
 *
 * tool_choice "required" and a named function promise a call whatever the model would write:
 * the answer starts with the call's opening (<tool_call>, the name, "arguments": ), appended to
 * the prompt, and the model writes the arguments under a JSON grammar (sampling.guided, set by
 * openai_request.c), so they parse. Required with several tools first draws the name from the
 * policy's own probabilities of the openings (openai.c). Two families: Qwen3's <tool_call>
 * (vLLM's hermes parser) and Llama 3.1's {"name", "parameters"} JSON (vLLM's llama3_json, calls
 * separated by ';'). A call's arguments are the JSON as written, in json.dumps's form (canon), so
 * that a stream sends them piece by piece and the pieces add up to the reply's. */
#include "api/openai.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "api/fields.h"
#include "api/sbuf.h"
#include "common/err.h"
#include "engine/engine.h"

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

static void py_string_body(api_sbuf *b, const char *s, size_t len) {
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
}

static void py_string(api_sbuf *b, const char *s, size_t len) {
    api_sb_str(b, "\"");
    py_string_body(b, s, len);
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
    for (int i = 0; i < t->n; i++) free(t->json[i]), free(t->names[i]), free(t->params[i]);
    free(t->json);
    free(t->names);
    free(t->params);
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
    if (n &&
        (!(t->json = calloc((size_t)n, sizeof *t->json)) || !(t->names = calloc((size_t)n, sizeof *t->names)) ||
         !(t->params = calloc((size_t)n, sizeof *t->params)))) {
        free(t->json);
        free(t->names);
        return api_fail(err, GE_NOMEM, "tools", "out of memory");
    }
    for (int i = 0; i < n; i++) {
        json_object *tool = json_object_array_get_idx(tools, (size_t)i);
        if ((rc = tool_or_reply(tool, i, err))) goto fail;
        const char *name = json_object_get_string(json_object_object_get(json_object_object_get(tool, "function"), "name"));
        json_object *params = json_object_object_get(json_object_object_get(tool, "function"), "parameters");
        t->json[i] = oa_pydumps(tool);
        t->names[i] = strdup(name);
        t->params[i] = params ? oa_pydumps(params) : NULL;
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
#define PYTHON_TAG "<|python_tag|>"

/* Each template family's call: its opening up to the name, the key of its arguments, and what
 * closes it after the arguments (the guided suffix of a forced call). */
static const struct {
    const char *open, *args_key, *close;
} fmts[] = {
    [ENG_TOOLS_HERMES] = {CALL_OPEN "\n{\"name\": ", "arguments", "}\n" CALL_CLOSE},
    [ENG_TOOLS_LLAMA3] = {"{\"name\": ", "parameters", "}"},
};
static int fmt_of(int f) { return f == ENG_TOOLS_LLAMA3 ? f : ENG_TOOLS_HERMES; }
const char *oa_call_closing(int format) { return fmts[fmt_of(format)].close; }

static int ws(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/* One JSON value's end from p[0, n): 1 with *end past it, 0 when the text ends inside it (a
 * prefix that may still be one), -1 when it cannot be one. Checks the brackets and strings'
 * ends, not the details (json-c checks a finished call). */
static int value_end(const char *p, size_t n, size_t *end) {
    char stack[64];
    int depth = 0;
    size_t i = 0;
    do {
        if (i >= n) return 0;
        char c = p[i];
        if (ws(c) || c == ',' || c == ':') {
            if (!depth) return -1;
            i++;
            continue;
        }
        if (c == '"') {
            for (i++; i < n && p[i] != '"'; i += p[i] == '\\' ? 2 : 1) {}
            if (i >= n) return 0;
            i++;
        } else if (c == '{' || c == '[') {
            if (depth == (int)sizeof stack) return -1;
            stack[depth++] = c == '{' ? '}' : ']';
            i++;
        } else if (c == '}' || c == ']') {
            if (!depth || stack[depth - 1] != c) return -1;
            depth--, i++;
        } else if (strchr("-0123456789tfn", c)) {
            while (i < n && strchr("-+.0123456789eEtruefalsn", p[i])) i++;
            if (i >= n && !depth) return 0; /* a number may go on */
        } else {
            return -1;
        }
    } while (depth);
    *end = i;
    return 1;
}

/* A string's content decoded from its JSON text p[0, n) (without quotes): malloc'd, NULL when
 * it is not one. */
static char *string_of(const char *p, size_t n) {
    api_sbuf b = {0};
    api_sb_str(&b, "\"");
    api_sb_printf(&b, "%.*s", (int)n, p);
    api_sb_str(&b, "\"");
    json_object *o = b.oom ? NULL : json_tokener_parse(b.p);
    free(b.p);
    char *s = json_object_is_type(o, json_type_string) ? strdup(json_object_get_string(o)) : NULL;
    json_object_put(o);
    return s;
}

/* One call object {"name": string, args_key: value} from p[0, n) (whitespace first): status 1
 * closed (*end past its '}'), 0 open (the text ends inside it), -1 not one. name / args: their
 * spans (args_end = n while it is open); name_len -1 until the name's string is closed. */
typedef struct {
    int status;
    size_t end, name_at, args_at, args_end;
    long name_len;
    int has_args, args_done, args_key_llama; /* args_key_llama: Llama's calls named them "arguments" */
} call_scan;

static void scan_call(int f, const char *p, size_t n, call_scan *c) {
    memset(c, 0, sizeof *c);
    c->name_len = -1;
    size_t i = 0;
    while (i < n && ws(p[i])) i++;
    if (i >= n) return;
    if (p[i++] != '{') {
        c->status = -1;
        return;
    }
    for (int first = 1;; first = 0) {
        while (i < n && ws(p[i])) i++;
        if (i >= n) return;
        if (p[i] == '}') {
            c->status = 1, c->end = i + 1;
            return;
        }
        if (!first && p[i++] != ',') break;
        while (i < n && ws(p[i])) i++;
        if (i >= n) return;
        if (p[i] != '"') break;
        size_t k0 = ++i;
        while (i < n && p[i] != '"') i += p[i] == '\\' ? 2 : 1;
        if (i >= n) return;
        size_t klen = i++ - k0;
        while (i < n && ws(p[i])) i++;
        if (i >= n) return;
        if (p[i++] != ':') break;
        while (i < n && ws(p[i])) i++;
        int is_name = klen == 4 && !memcmp(p + k0, "name", 4);
        const char *ak = fmts[f].args_key;
        int is_args = (klen == strlen(ak) && !memcmp(p + k0, ak, klen)) ||
            (f == ENG_TOOLS_LLAMA3 && klen == 9 && !memcmp(p + k0, "arguments", 9)); /* as vLLM's llama3_json */
        if (is_args) c->has_args = 1, c->args_at = i, c->args_end = n, c->args_key_llama = klen == 9 && f == ENG_TOOLS_LLAMA3;
        size_t end;
        int r = value_end(p + i, n - i, &end);
        if (r < 0) break;
        if (is_name && i < n && p[i] != '"') break;
        if (r == 0) return;
        if (is_name) c->name_at = i + 1, c->name_len = (long)end - 2;
        if (is_args) c->args_end = i + end, c->args_done = 1;
        i += end;
    }
    c->status = -1;
}

/* JSON text p[0, n) as Python's json.dumps writes what json.loads reads from it: no whitespace
 * outside strings, ", " and ": " between members, strings' escapes decoded and written as
 * json.dumps(ensure_ascii=False) escapes; numbers and literals as written. The same prefix of
 * the text always gives a prefix of the whole one's form, so a stream sends it piece by piece:
 * partial text stops before an escape that is not finished. */
static void canon(api_sbuf *b, const char *p, size_t n) {
    int in_str = 0;
    for (size_t i = 0; i < n;) {
        char c = p[i];
        if (!in_str) {
            if (c == '"') in_str = 1, api_sb_str(b, "\"");
            else if (c == ',') api_sb_str(b, ", ");
            else if (c == ':') api_sb_str(b, ": ");
            else if (!ws(c)) api_sb_printf(b, "%c", c);
            i++;
            continue;
        }
        if (c == '"') {
            in_str = 0, i++;
            api_sb_str(b, "\"");
            continue;
        }
        size_t run = 0;
        while (i + run < n && p[i + run] != '"' && p[i + run] != '\\') run++;
        if (run) {
            py_string_body(b, p + i, run);
            i += run;
            continue;
        }
        /* an escape: \x, or \uXXXX (a surrogate pair \uD8xx\uDCxx as one) */
        size_t len = i + 1 < n && p[i + 1] == 'u' ? 6 : 2;
        if (len == 6 && i + 6 <= n && (p[i + 2] | 0x20) == 'd' && strchr("89abAB", p[i + 3])) len = 12;
        if (i + len > n) return; /* not finished */
        char *d = string_of(p + i, len);
        if (d) py_string_body(b, d, strlen(d));
        else api_sb_printf(b, "%.*s", (int)len, p + i);
        free(d);
        i += len;
    }
}

char *oa_canon_json(const char *text, size_t n) {
    api_sbuf b = {0};
    canon(&b, text, n);
    api_sb_str(&b, "");
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* {id, type: "function", function: {name, arguments}} */
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

/* The calls' region of text: hermes from the first <tool_call>; Llama 3 all of it when it opens
 * with a call (a '{', or <|python_tag|> when special tokens are kept); -1: none. */
static long region_at(int f, const char *text) {
    if (f == ENG_TOOLS_LLAMA3) return text[0] == '{' || !strncmp(text, PYTHON_TAG, strlen(PYTHON_TAG)) ? 0 : -1;
    const char *first = strstr(text, CALL_OPEN);
    return first ? (long)(first - text) : -1;
}

/* Walks the calls of a region r[0, n) (its start: region_at), each scanned (scan_call) at body
 * offset *at. Returns the count of calls found, -1 when one is malformed (then the text is
 * content), stopping at an open one (*open set). */
static int walk_calls(int f, const char *r, size_t n, call_scan *cs, size_t *at, int cap, int *open) {
    size_t i = 0;
    int k = 0;
    *open = 0;
    if (f == ENG_TOOLS_LLAMA3 && !strncmp(r, PYTHON_TAG, strlen(PYTHON_TAG))) i = strlen(PYTHON_TAG);
    for (;;) {
        if (f == ENG_TOOLS_HERMES) {
            const char *o = strstr(r + i, CALL_OPEN);
            if (!o || (size_t)(o - r) >= n) return k;
            i = (size_t)(o - r) + strlen(CALL_OPEN);
        }
        call_scan c;
        scan_call(f, r + i, n - i, &c);
        if (c.status < 0) return -1;
        if (k < cap) cs[k] = c, at[k] = i;
        k++;
        if (c.status == 0) {
            *open = 1;
            return k;
        }
        i += c.end;
        while (i < n && ws(r[i])) i++;
        if (f == ENG_TOOLS_HERMES) {
            if (i >= n) return k; /* an unclosed last call */
            if (strncmp(r + i, CALL_CLOSE, n - i < strlen(CALL_CLOSE) ? n - i : strlen(CALL_CLOSE))) return -1;
            if (n - i < strlen(CALL_CLOSE)) {
                *open = 1;
                return k;
            }
            i += strlen(CALL_CLOSE);
        } else {
            if (i >= n) return k;
            if (r[i++] != ';') return -1; /* Llama's calls: separated by ';' */
            while (i < n && ws(r[i])) i++;
            if (i >= n) {
                *open = 1;
                return k;
            }
        }
    }
}

/* A finished call: json-c reads the object, which has a string name and the arguments. */
static json_object *call_of(int f, const char *body, const call_scan *c) {
    json_tokener *tk = json_tokener_new();
    json_object *o = tk ? json_tokener_parse_ex(tk, body, (int)c->end) : NULL;
    int whole = o && json_tokener_get_error(tk) == json_tokener_success && (size_t)json_tokener_get_parse_end(tk) == c->end;
    json_tokener_free(tk);
    json_object *name = json_object_object_get(o, "name");
    int ok = whole && json_object_is_type(o, json_type_object) && json_object_is_type(name, json_type_string) &&
        json_object_object_get_ex(o, c->args_key_llama ? "arguments" : fmts[f].args_key, NULL) && c->args_done;
    json_object *call = NULL;
    if (ok) {
        char *a = oa_canon_json(body + c->args_at, c->args_end - c->args_at);
        call = new_call(json_object_get_string(name), a ? a : "{}", a ? strlen(a) : 2);
        free(a);
    }
    json_object_put(o);
    return call;
}

enum { MAX_CALLS = 256 };

json_object *oa_parse_tool_calls(int format, const char *text, size_t *content_len, int max) {
    int f = fmt_of(format), open;
    long at = region_at(f, text);
    if (at < 0) return NULL;
    const char *r = text + at;
    call_scan cs[MAX_CALLS];
    size_t off[MAX_CALLS];
    int k = walk_calls(f, r, strlen(r), cs, off, MAX_CALLS, &open);
    if (k <= 0 || k > MAX_CALLS || open) return NULL;
    json_object *calls = json_object_new_array();
    for (int i = 0; i < k; i++) {
        json_object *call = call_of(f, r + off[i], &cs[i]);
        if (!call) { /* as vLLM: one malformed call and the whole text is content */
            json_object_put(calls);
            return NULL;
        }
        if (max <= 0 || (int)json_object_array_length(calls) < max) json_object_array_add(calls, call);
        else json_object_put(call);
    }
    *content_len = (size_t)at;
    return calls;
}

int oa_calls_progress(int format, const char *text, oa_call_progress *out, int cap) {
    int f = fmt_of(format), open;
    long at = region_at(f, text);
    if (at < 0) return 0;
    const char *r = text + at;
    call_scan cs[MAX_CALLS];
    size_t off[MAX_CALLS];
    int k = walk_calls(f, r, strlen(r), cs, off, MAX_CALLS, &open);
    if (k < 0) return -1;
    if (k > cap) k = cap;
    if (k > MAX_CALLS) k = MAX_CALLS;
    for (int i = 0; i < k; i++) {
        const char *body = r + off[i];
        out[i].name = cs[i].name_len >= 0 ? string_of(body + cs[i].name_at, (size_t)cs[i].name_len) : NULL;
        out[i].args = cs[i].has_args ? oa_canon_json(body + cs[i].args_at, cs[i].args_end - cs[i].args_at) : NULL;
    }
    return k;
}

char *oa_call_opening(int format, const char *name) {
    api_sbuf b = {0};
    api_sb_str(&b, fmts[fmt_of(format)].open);
    py_string(&b, name, strlen(name));
    api_sb_printf(&b, ", \"%s\": ", fmts[fmt_of(format)].args_key);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

json_object *oa_forced_calls(int format, const char *opening, const char *name, const char *text, int max) {
    api_sbuf b = {0};
    api_sb_str(&b, opening);
    api_sb_str(&b, text);
    size_t clen;
    json_object *calls = b.oom ? NULL : oa_parse_tool_calls(format, b.p, &clen, max);
    if (calls) {
        free(b.p);
        return calls;
    }
    /* not well-formed (max_tokens cut it): what a stream sent, the arguments' form so far when
     * they are a JSON prefix, else the text as written less the call's closing */
    oa_call_progress pr[1] = {{0}};
    int k = b.oom ? 0 : oa_calls_progress(format, b.p, pr, 1);
    free(b.p);
    calls = json_object_new_array();
    if (k == 1 && pr[0].args) {
        json_object_array_add(calls, new_call(name, pr[0].args, strlen(pr[0].args)));
    } else {
        while (*text && strchr(" \t\r\n", *text)) text++;
        const char *end = strstr(text, CALL_CLOSE);
        size_t len = end ? (size_t)(end - text) : strlen(text);
        while (len && strchr(" \t\r\n", text[len - 1])) len--;
        if (len && text[len - 1] == '}') len--; /* the call object's own closing brace */
        while (len && strchr(" \t\r\n", text[len - 1])) len--;
        json_object_array_add(calls, new_call(name, text, len));
    }
    for (int i = 0; i < k; i++) free(pr[i].name), free(pr[i].args);
    return calls;
}
