/* chat.c — built-in renderers for the ChatML (Qwen) and Llama 3 / 3.1 chat templates; see chat.h.
 * Each renderer is the template's Jinja logic for plain {role, content} messages, line for line;
 * the string helpers reproduce Python's str.strip/lstrip/rstrip/split as Jinja calls them. */
#include "engine/text/chat.h"
#include "common/err.h"
#include "engine/text/tok_text.h"
#include "engine/text/unicode_data.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


/* A view of a string: [p, p + n). */
typedef struct {
    const char *p;
    size_t n;
} view;

/* Python's str.isspace(): White_Space plus U+001C..U+001F. */
static int py_space(uint32_t cp) { return (cp >= 0x1C && cp <= 0x1F) || uc_class(cp) == UC_WS; }

static view strip_ws(view v, int left, int right) {
    while (left && v.n) {
        uint32_t cp;
        int k = tt_utf8_decode((const unsigned char *)v.p, v.n, &cp);
        if (!k || !py_space(cp)) break;
        v.p += k;
        v.n -= (size_t)k;
    }
    while (right && v.n) {
        size_t j = v.n - 1;
        while (j > 0 && ((unsigned char)v.p[j] & 0xC0) == 0x80) j--;
        uint32_t cp;
        int k = tt_utf8_decode((const unsigned char *)v.p + j, v.n - j, &cp);
        if (!k || !py_space(cp)) break;
        v.n = j;
    }
    return v;
}

static view strip_nl(view v, int left, int right) {
    while (left && v.n && v.p[0] == '\n') {
        v.p++;
        v.n--;
    }
    while (right && v.n && v.p[v.n - 1] == '\n') v.n--;
    return v;
}

/* Position of the first / last occurrence of needle in v, or -1. */
static long find(view v, const char *needle, int last) {
    size_t k = strlen(needle);
    long at = -1;
    for (size_t i = 0; i + k <= v.n; i++)
        if (!memcmp(v.p + i, needle, k)) {
            at = (long)i;
            if (!last) break;
        }
    return at;
}

static int starts(view v, const char *s) {
    size_t k = strlen(s);
    return v.n >= k && !memcmp(v.p, s, k);
}
static int ends(view v, const char *s) {
    size_t k = strlen(s);
    return v.n >= k && !memcmp(v.p + v.n - k, s, k);
}
static view V(const char *s) { return (view){s, strlen(s)}; }
static int is(const char *a, const char *b) { return !strcmp(a, b); }

/* Qwen3's tools block: the system turn that offers the tools, with the first system message. */
static void qwen3_tools(tt_buf *b, const chat_msg *m, const chat_opts *o) {
    tt_str(b, "<|im_start|>system\n");
    if (is(m[0].role, "system")) {
        tt_str(b, m[0].content);
        tt_str(b, "\n\n");
    }
    tt_str(b,
           "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
           "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
    for (int i = 0; i < o->n_tools; i++) {
        tt_str(b, "\n");
        tt_str(b, o->tools[i]);
    }
    tt_str(b,
           "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
           "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
           "<args-json-object>}\n</tool_call><|im_end|>\n");
}

/* An assistant turn's calls, after its content (a newline between them when there is content). */
static void qwen3_calls(tt_buf *b, const chat_msg *m, view content) {
    for (int k = 0; k < m->n_tool_calls; k++) {
        if (k > 0 || content.n) tt_str(b, "\n");
        tt_str(b, "<tool_call>\n{\"name\": \"");
        tt_str(b, m->tool_calls[k].name);
        tt_str(b, "\", \"arguments\": ");
        tt_str(b, m->tool_calls[k].arguments);
        tt_str(b, "}\n</tool_call>");
    }
}

/* Qwen3: system first (inside the tools block when there are tools); assistant turns after the
 * last real user query get a <think> block (content split at </think> as the template does);
 * enable_thinking false closes an empty one after the generation prompt. Messages of other roles
 * render nothing. */
static void render_qwen3(tt_buf *b, const chat_msg *m, int n, int gen, const chat_opts *o) {
    if (o->n_tools) {
        qwen3_tools(b, m, o);
    } else if (is(m[0].role, "system")) {
        tt_str(b, "<|im_start|>system\n");
        tt_str(b, m[0].content);
        tt_str(b, "<|im_end|>\n");
    }
    int multi_step_tool = 1, last_query = n - 1;
    for (int i = n - 1; i >= 0; i--) {
        view c = V(m[i].content);
        if (multi_step_tool && is(m[i].role, "user") && !(starts(c, "<tool_response>") && ends(c, "</tool_response>"))) {
            multi_step_tool = 0;
            last_query = i;
        }
    }
    for (int i = 0; i < n; i++) {
        const char *role = m[i].role;
        view c = V(m[i].content);
        if (is(role, "user") || (is(role, "system") && i > 0)) {
            tt_str(b, "<|im_start|>");
            tt_str(b, role);
            tt_str(b, "\n");
            tt_put(b, c.p, c.n);
            tt_str(b, "<|im_end|>\n");
        } else if (is(role, "assistant")) {
            view content = c, reasoning = {"", 0};
            long end = find(c, "</think>", 1);
            if (end >= 0) {
                content = strip_nl((view){c.p + end + 8, c.n - (size_t)end - 8}, 1, 0);
                view before = strip_nl((view){c.p, (size_t)find(c, "</think>", 0)}, 0, 1);
                long st = find(before, "<think>", 1);
                reasoning = strip_nl(st >= 0 ? (view){before.p + st + 7, before.n - (size_t)st - 7} : before, 1, 0);
            }
            tt_str(b, "<|im_start|>assistant\n");
            if (i > last_query && (i == n - 1 || reasoning.n)) {
                view r = strip_nl(reasoning, 1, 1);
                tt_str(b, "<think>\n");
                tt_put(b, r.p, r.n);
                tt_str(b, "\n</think>\n\n");
                content = strip_nl(content, 1, 0);
            }
            tt_put(b, content.p, content.n);
            qwen3_calls(b, &m[i], content);
            tt_str(b, "<|im_end|>\n");
        } else if (is(role, "tool")) {
            if (i == 0 || !is(m[i - 1].role, "tool")) tt_str(b, "<|im_start|>user");
            tt_str(b, "\n<tool_response>\n");
            tt_put(b, c.p, c.n);
            tt_str(b, "\n</tool_response>");
            if (i == n - 1 || !is(m[i + 1].role, "tool")) tt_str(b, "<|im_end|>\n");
        }
    }
    if (gen) tt_str(b, o->thinking_off ? "<|im_start|>assistant\n<think>\n\n</think>\n\n" : "<|im_start|>assistant\n");
}

/* Plain ChatML, with the default system prompt of Qwen2 / Qwen2.5 when the template has one. */
static void render_chatml(tt_buf *b, const chat_msg *m, int n, int gen, const char *default_system) {
    if (default_system && !is(m[0].role, "system")) {
        tt_str(b, "<|im_start|>system\n");
        tt_str(b, default_system);
        tt_str(b, "<|im_end|>\n");
    }
    for (int i = 0; i < n; i++) {
        tt_str(b, "<|im_start|>");
        tt_str(b, m[i].role);
        tt_str(b, "\n");
        tt_str(b, m[i].content);
        tt_str(b, "<|im_end|>\n");
    }
    if (gen) tt_str(b, "<|im_start|>assistant\n");
}

/* Llama 3: bos before the first message; content trimmed (Jinja's trim = str.strip()). The
 * original Llama 3 template appends the assistant header unconditionally; templates that test
 * add_generation_prompt get it only when asked. */
static void render_llama3(tt_buf *b, const tok *t, const chat_msg *m, int n, int gen, int always_gen) {
    for (int i = 0; i < n; i++) {
        if (i == 0 && tok_bos(t)) tt_str(b, tok_bos(t));
        view c = strip_ws(V(m[i].content), 1, 1);
        tt_str(b, "<|start_header_id|>");
        tt_str(b, m[i].role);
        tt_str(b, "<|end_header_id|>\n\n");
        tt_put(b, c.p, c.n);
        tt_str(b, "<|eot_id|>");
    }
    if (gen || always_gen) tt_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* A string as the template's tojson writes it (Python's json.dumps, ensure_ascii=False). */
static void py_quote(tt_buf *b, view v) {
    tt_str(b, "\"");
    for (size_t i = 0; i < v.n; i++) {
        unsigned char c = (unsigned char)v.p[i];
        static const char *const esc[32] = {['\b'] = "\\b", ['\f'] = "\\f", ['\n'] = "\\n", ['\r'] = "\\r", ['\t'] = "\\t"};
        char u[8];
        if (c == '"' || c == '\\') tt_put(b, c == '"' ? "\\\"" : "\\\\", 2);
        else if (c >= 0x20) tt_put(b, v.p + i, 1);
        else if (esc[c]) tt_str(b, esc[c]);
        else snprintf(u, sizeof u, "\\u%04x", c), tt_str(b, u);
    }
    tt_str(b, "\"");
}

/* json.dumps(v, indent=4) of a JSON text: a newline and the depth's indent after each open and
 * comma, ": " after keys, empty containers kept as "{}" / "[]"; strings copied as they are. */
static void indent_json(tt_buf *b, view v) {
    int depth = 0;
    for (size_t i = 0; i < v.n; i++) {
        char c = v.p[i];
        if (c == '"') {
            size_t j = i + 1;
            while (j < v.n && v.p[j] != '"') j += v.p[j] == '\\' ? 2 : 1;
            tt_put(b, v.p + i, (j < v.n ? j + 1 : v.n) - i);
            i = j;
            continue;
        }
        if (c == ' ' || c == '\n' || c == '\t' || c == '\r') continue;
        size_t k = i + 1;
        while (k < v.n && strchr(" \n\t\r", v.p[k])) k++;
        int close = c == '}' || c == ']', open = c == '{' || c == '[';
        if (open && k < v.n && v.p[k] == (c == '{' ? '}' : ']')) { /* empty */
            tt_put(b, &c, 1);
            tt_put(b, v.p + k, 1);
            i = k;
            continue;
        }
        if (close) depth--;
        if (close) tt_str(b, "\n");
        for (int d = 0; close && d < depth; d++) tt_str(b, "    ");
        tt_put(b, &c, 1);
        if (c == ':') tt_str(b, " ");
        if (open) depth++;
        if (open || c == ',') {
            tt_str(b, "\n");
            for (int d = 0; d < depth; d++) tt_str(b, "    ");
        }
    }
}

/* Llama 3.1 / 3.2 (their "Cutting Knowledge Date" header): bos, a system turn with the date
 * header (and "Environment: ipython" with tools), the tools in the first user turn after the
 * system (the template's default tools_in_user_message), each message's content trimmed; an
 * assistant's call as {"name": NAME, "parameters": ARGS}, a tool's result as an ipython turn whose
 * content is a JSON string (the template's tojson of a string). The date is the template's
 * default, 26 Jul 2024, or today's with a template that asks strftime_now. The template renders
 * one call per assistant turn and drops the content beside it: both are refused (GE_UNSUPPORTED),
 * as is tools with no message after the system. */
static int render_llama31(tt_buf *b, const tok *t, const char *tpl, const chat_msg *m, int n, int gen, const chat_opts *o) {
    char date[32] = "26 Jul 2024";
    if (strstr(tpl, "strftime_now")) {
        time_t now = time(NULL);
        struct tm tm;
        strftime(date, sizeof date, "%d %b %Y", localtime_r(&now, &tm));
    }
    if (tok_bos(t)) tt_str(b, tok_bos(t));
    view sys = {"", 0};
    if (is(m[0].role, "system")) sys = strip_ws(V(m[0].content), 1, 1), m++, n--;
    tt_str(b, "<|start_header_id|>system<|end_header_id|>\n\n");
    if (o->n_tools) tt_str(b, "Environment: ipython\n");
    tt_str(b, "Cutting Knowledge Date: December 2023\nToday Date: ");
    tt_str(b, date);
    tt_str(b, "\n\n");
    tt_put(b, sys.p, sys.n);
    tt_str(b, "<|eot_id|>");
    if (o->n_tools) {
        if (n < 1)
            return err_set(GE_UNSUPPORTED, "chat: Llama 3.1's template puts the tools in the first user message: there is none");
        view first = strip_ws(V(m[0].content), 1, 1);
        tt_str(b,
               "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a "
               "function call with its proper arguments that best answers the given prompt.\n\nRespond in the format "
               "{\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n");
        for (int i = 0; i < o->n_tools; i++) {
            indent_json(b, V(o->tools[i]));
            tt_str(b, "\n\n");
        }
        tt_put(b, first.p, first.n);
        tt_str(b, "<|eot_id|>");
        m++, n--;
    }
    for (int i = 0; i < n; i++) {
        view c = V(m[i].content);
        if (m[i].n_tool_calls) {
            if (m[i].n_tool_calls > 1 || c.n)
                return err_set(GE_UNSUPPORTED,
                               "chat: Llama 3.1's template renders one tool call per assistant turn and no "
                               "content beside it");
            tt_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"");
            tt_str(b, m[i].tool_calls[0].name);
            tt_str(b, "\", \"parameters\": ");
            tt_str(b, m[i].tool_calls[0].arguments);
            tt_str(b, "}<|eot_id|>");
        } else if (is(m[i].role, "tool") || is(m[i].role, "ipython")) {
            tt_str(b, "<|start_header_id|>ipython<|end_header_id|>\n\n");
            py_quote(b, c);
            tt_str(b, "<|eot_id|>");
        } else {
            c = strip_ws(c, 1, 1);
            tt_str(b, "<|start_header_id|>");
            tt_str(b, m[i].role);
            tt_str(b, "<|end_header_id|>\n\n");
            tt_put(b, c.p, c.n);
            tt_str(b, "<|eot_id|>");
        }
    }
    if (gen) tt_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return 0;
}

int chat_tool_format(const tok *t) {
    const char *tpl = tok_chat_template(t);
    if (!tpl) return CHAT_TOOLS_NONE;
    if (strstr(tpl, "<|im_start|>") && strstr(tpl, "reasoning_content")) return CHAT_TOOLS_HERMES;
    if (strstr(tpl, "<|start_header_id|>") && strstr(tpl, "Cutting Knowledge Date")) return CHAT_TOOLS_LLAMA3;
    return CHAT_TOOLS_NONE;
}

int chat_render_opts(const tok *t, const chat_msg *msgs, int n, int add_generation_prompt, const chat_opts *o, char **out) {
    static const chat_opts none = {0};
    *out = NULL;
    const char *tpl = tok_chat_template(t);
    int calls = 0;
    if (!o) o = &none;
    if (n < 1) return err_set(GE_INVALID, "chat: messages is empty");
    for (int i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content) return err_set(GE_INVALID, "chat: message %d has no role or content", i);
        for (int k = 0; k < msgs[i].n_tool_calls; k++)
            if (!msgs[i].tool_calls[k].name || !msgs[i].tool_calls[k].arguments)
                return err_set(GE_INVALID, "chat: message %d's tool call %d has no name or arguments", i, k);
        calls += msgs[i].n_tool_calls;
    }
    for (int i = 0; i < o->n_tools; i++)
        if (!o->tools[i]) return err_set(GE_INVALID, "chat: tool %d is NULL", i);
    if (!tpl) return err_set(GE_UNSUPPORTED, "chat: the model has no chat_template in tokenizer_config.json");
    int format = chat_tool_format(t), qwen3 = format == CHAT_TOOLS_HERMES;
    if (format == CHAT_TOOLS_NONE && (o->n_tools || calls))
        return err_set(GE_UNSUPPORTED,
                       "chat: the model's chat template has no tool format built in (Qwen3's and Llama 3.1's have): "
                       "tools and tool calls cannot be rendered");
    tt_buf b = {0};
    if (strstr(tpl, "<|im_start|>")) {
        if (qwen3) render_qwen3(&b, msgs, n, add_generation_prompt, o);
        else if (strstr(tpl, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."))
            render_chatml(&b, msgs, n, add_generation_prompt,
                          "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
        else if (strstr(tpl, "You are a helpful assistant."))
            render_chatml(&b, msgs, n, add_generation_prompt, "You are a helpful assistant.");
        else render_chatml(&b, msgs, n, add_generation_prompt, NULL);
    } else if (format == CHAT_TOOLS_LLAMA3) {
        int rc = render_llama31(&b, t, tpl, msgs, n, add_generation_prompt, o);
        if (rc) {
            free(b.s);
            return rc;
        }
    } else if (strstr(tpl, "<|start_header_id|>")) {
        if (strstr(tpl, "tools"))
            return err_set(GE_UNSUPPORTED,
                           "chat: this Llama 3 chat template (tools without the 3.1 date header) is not "
                           "supported; only Llama 3's and 3.1's");
        render_llama3(&b, t, msgs, n, add_generation_prompt, !strstr(tpl, "add_generation_prompt"));
    } else {
        return err_set(GE_UNSUPPORTED,
                       "chat: the model's chat_template is neither ChatML (<|im_start|>) "
                       "nor Llama 3 (<|start_header_id|>); no other template is built in");
    }
    if (b.oom || !b.s) {
        free(b.s);
        return err_set(GE_NOMEM, "chat: out of memory");
    }
    *out = b.s;
    return 0;
}
