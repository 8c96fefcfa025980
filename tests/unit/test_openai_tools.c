/* test_openai_tools.c — tool calling on the OpenAI routes (api/openai_tools.c): the model's
 * output parsed into tool_calls as vLLM's hermes parser parses it (calls after content, several
 * calls, an unclosed last call, a malformed call making all of it content, parallel_tool_calls
 * false keeping the first), JSON written as Python's json.dumps writes it (what the template's
 * tojson puts into the prompt), tool_choice read and refused where it cannot be kept, and ids. */
#include <json-c/json.h>
#include <string.h>

#include "api/openai.h"
#include "api/sbuf.h"
#include "common/err.h"
#include "tests/unit/check.h"

static json_object *parse(const char *s) { return json_tokener_parse(s); }

TEST(test_parse_calls_after_content) {
    const char *out =
        "Let me look.\n<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": \"Paris\", \"n\": 2}}\n</tool_call>"
        "\n<tool_call>{\"name\":\"noop\",\"arguments\":{}}</tool_call>";
    size_t clen = 0;
    json_object *calls = oa_parse_tool_calls(ENG_TOOLS_HERMES, out, &clen, 0);
    CHECK(calls != NULL);
    CHECK_EQ_INT((int)clen, (int)strlen("Let me look.\n"));
    CHECK_EQ_INT((int)json_object_array_length(calls), 2);
    json_object *c0 = json_object_array_get_idx(calls, 0), *f0 = json_object_object_get(c0, "function");
    CHECK_STR(json_object_get_string(json_object_object_get(c0, "type")), "function");
    CHECK(!strncmp(json_object_get_string(json_object_object_get(c0, "id")), "chatcmpl-tool-", 14));
    CHECK_STR(json_object_get_string(json_object_object_get(f0, "name")), "get");
    CHECK_STR(json_object_get_string(json_object_object_get(f0, "arguments")), "{\"city\": \"Paris\", \"n\": 2}");
    json_object *f1 = json_object_object_get(json_object_array_get_idx(calls, 1), "function");
    CHECK_STR(json_object_get_string(json_object_object_get(f1, "arguments")), "{}");
    CHECK(strcmp(json_object_get_string(json_object_object_get(c0, "id")),
                 json_object_get_string(json_object_object_get(json_object_array_get_idx(calls, 1), "id"))));
    json_object_put(calls);
    calls = oa_parse_tool_calls(ENG_TOOLS_HERMES, out, &clen, 1); /* parallel_tool_calls false */
    CHECK_EQ_INT((int)json_object_array_length(calls), 1);
    json_object_put(calls);
}

TEST(test_parse_unclosed_and_malformed) {
    size_t clen = 99;
    json_object *calls = oa_parse_tool_calls(ENG_TOOLS_HERMES, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}\n",
                                             &clen, 0);
    CHECK(calls != NULL);
    CHECK_EQ_INT((int)clen, 0);
    CHECK_STR(json_object_get_string(
                  json_object_object_get(json_object_object_get(json_object_array_get_idx(calls, 0), "function"), "arguments")),
              "{\"a\": [1, 2]}");
    json_object_put(calls);
    static const char *const bad[] = {"plain text, no call",
                                      "<tool_call>{\"name\": \"f\", \"arguments\": {}</tool_call>",
                                      "<tool_call>{\"arguments\": {}}</tool_call>",
                                      "<tool_call>{\"name\": \"f\"}</tool_call>",
                                      "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call><tool_call>[1]</tool_call>",
                                      "<tool_call>{\"name\": \"f\", \"arguments\": {}} trailing</tool_call>",
                                      NULL};
    for (int i = 0; bad[i]; i++) CHECK_MSG(oa_parse_tool_calls(ENG_TOOLS_HERMES, bad[i], &clen, 0) == NULL, "%s", bad[i]);
}

TEST(test_pydumps_is_json_dumps) {
    static const struct {
        const char *in, *want;
    } rows[] = {
        {"{\"b\":1,\"a\":[true,null,\"x\"]}", "{\"b\": 1, \"a\": [true, null, \"x\"]}"}, /* key order kept */
        {"{\"s\":\"q\\\"\\\\\\n\\t\\u0001\\u00e9\\u2028\"}", "{\"s\": \"q\\\"\\\\\\n\\t\\u0001\xc3\xa9\xe2\x80\xa8\"}"},
        {"[1.5,-2,1e-05,{}]", "[1.5, -2, 1e-05, {}]"},
        {"\"/path\"", "\"/path\""}, /* json.dumps leaves / alone */
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        json_object *o = parse(rows[i].in);
        char *s = oa_pydumps(o);
        CHECK_MSG(s && !strcmp(s, rows[i].want), "%s -> %s (want %s)", rows[i].in, s ? s : "NULL", rows[i].want);
        free(s);
        json_object_put(o);
    }
}

TEST(test_tool_choice) {
    static const struct {
        const char *req;
        int rc;
        const char *field;
        oa_tool_choice choice;
    } rows[] = {
        {"{}", 0, "", OA_TOOLS_NONE},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}", 0, "", OA_TOOLS_AUTO},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": \"none\"}", 0, "",
         OA_TOOLS_NONE},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": \"required\"}", 0, "",
         OA_TOOLS_REQUIRED},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": {\"type\": \"function\", "
         "\"function\": {\"name\": \"f\"}}}",
         0, "", OA_TOOLS_NAMED},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": {\"type\": \"function\", "
         "\"function\": {\"name\": \"g\"}}}",
         GE_INVALID, "tool_choice", 0},
        {"{\"tool_choice\": \"auto\"}", GE_INVALID, "tool_choice", 0},
        {"{\"tool_choice\": \"sometimes\"}", GE_INVALID, "tool_choice", 0},
        {"{\"tools\": [{\"type\": \"function\", \"function\": {}}]}", GE_INVALID, "tools[0].function.name", 0},
        {"{\"tools\": [{\"type\": \"retrieval\", \"function\": {\"name\": \"f\"}}]}", GE_INVALID, "tools[0]", 0},
        {"{\"tools\": [], \"parallel_tool_calls\": 3}", GE_INVALID, "parallel_tool_calls", 0},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        json_object *req = parse(rows[i].req);
        oa_tools t;
        api_error e = {0};
        int rc = oa_tools_or_reply(req, &t, &e);
        CHECK_MSG(rc == rows[i].rc, "%s: rc %d (%s)", rows[i].req, rc, e.message);
        if (rc) CHECK_MSG(!strcmp(e.field, rows[i].field), "%s: field %s", rows[i].req, e.field);
        else CHECK_MSG(t.choice == rows[i].choice, "%s: choice %d", rows[i].req, (int)t.choice);
        if (!rc && t.n) CHECK_STR(t.json[0], "{\"type\": \"function\", \"function\": {\"name\": \"f\"}}");
        if (!rc) oa_tools_free(&t);
        json_object_put(req);
    }
}

/* A forced answer: the opening in Qwen3's format; the model's text parsed after it (a
 * "</tool_call>" inside a string is the string's), the form of a JSON prefix cut by max_tokens,
 * or kept as the arguments when it is not JSON (the call's closing brace and </tool_call> cut). */
TEST(test_forced_calls) {
    char *open = oa_call_opening(ENG_TOOLS_HERMES, "get \"w\"");
    CHECK_STR(open, "<tool_call>\n{\"name\": \"get \\\"w\\\"\", \"arguments\": ");
    static const struct {
        const char *text, *args;
        int n;
    } rows[] = {
        {"{\"city\": \"Paris\"}}\n</tool_call>", "{\"city\": \"Paris\"}", 1},
        {"{\"a\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"h\", \"arguments\": {}}\n</tool_call>", "{\"a\": 1}", 2},
        {"{city: Paris}}\n</tool_call>", "{city: Paris}", 1},
        {"{\"a\": \"x</tool_call>y\"}}\n</tool_call>", "{\"a\": \"x</tool_call>y\"}", 1}, /* the grammar's object */
        {"  unfinished {\"x", "unfinished {\"x", 1},
        {"{\"a\" :  [1,\n 2", "{\"a\": [1, 2", 1}, /* cut by max_tokens: what a stream sent */
        {"", "", 1},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        json_object *calls = oa_forced_calls(ENG_TOOLS_HERMES, open, "get \"w\"", rows[i].text, 0);
        CHECK_EQ_INT((int)json_object_array_length(calls), rows[i].n);
        json_object *f = json_object_object_get(json_object_array_get_idx(calls, 0), "function");
        CHECK_STR(json_object_get_string(json_object_object_get(f, "name")), "get \"w\"");
        const char *a = json_object_get_string(json_object_object_get(f, "arguments"));
        CHECK_MSG(!strcmp(a, rows[i].args), "%s -> %s (want %s)", rows[i].text, a, rows[i].args);
        json_object_put(calls);
    }
    json_object *one = oa_forced_calls(ENG_TOOLS_HERMES, open, "get \"w\"", rows[1].text, 1); /* parallel_tool_calls false */
    CHECK_EQ_INT((int)json_object_array_length(one), 1);
    json_object_put(one);
    free(open);
}

/* Llama 3.1's calls as vLLM's llama3_json parser reads them: a text that opens with a call (or
 * <|python_tag|>), "parameters" or "arguments", calls separated by ';', no content; anything else
 * is content. */
TEST(test_parse_llama3) {
    static const struct {
        const char *text;
        int n;
        const char *args0;
    } rows[] = {
        {"{\"name\": \"get\", \"parameters\": {\"city\" :\"Paris\",\"n\":2}}", 1, "{\"city\": \"Paris\", \"n\": 2}"},
        {"<|python_tag|>{\"name\": \"get\", \"arguments\": {}}", 1, "{}"},
        {"{\"name\": \"a\", \"parameters\": {\"x\": [1]}}; {\"name\": \"b\", \"parameters\": {}}\n", 2, "{\"x\": [1]}"},
        {"The weather: {\"name\": \"get\", \"parameters\": {}}", 0, NULL},
        {" {\"name\": \"get\", \"parameters\": {}}", 0, NULL},
        {"{\"name\": \"get\", \"parameters\": {}} and more", 0, NULL},
        {"{\"name\": \"get\"}", 0, NULL},
        {"{\"name\": \"get\", \"parameters\": {}};", 0, NULL},
        {"{\"name\": 3, \"parameters\": {}}", 0, NULL},
        {"{\"name\": \"get\", \"parameters\": {\"a\": }}", 0, NULL},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        size_t clen = 99;
        json_object *calls = oa_parse_tool_calls(ENG_TOOLS_LLAMA3, rows[i].text, &clen, 0);
        CHECK_MSG((calls ? (int)json_object_array_length(calls) : 0) == rows[i].n, "%s", rows[i].text);
        if (calls && rows[i].args0) {
            json_object *f = json_object_object_get(json_object_array_get_idx(calls, 0), "function");
            CHECK_STR(json_object_get_string(json_object_object_get(f, "arguments")), rows[i].args0);
            CHECK_EQ_INT((int)clen, 0);
        }
        json_object_put(calls);
    }
    char *open = oa_call_opening(ENG_TOOLS_LLAMA3, "get");
    CHECK_STR(open, "{\"name\": \"get\", \"parameters\": ");
    CHECK_STR(oa_call_closing(ENG_TOOLS_LLAMA3), "}");
    CHECK_STR(oa_call_closing(ENG_TOOLS_HERMES), "}\n</tool_call>");
    json_object *calls = oa_forced_calls(ENG_TOOLS_LLAMA3, open, "get", "{ \"city\": \"Paris\" }}", 0);
    CHECK_STR(json_object_get_string(
                  json_object_object_get(json_object_object_get(json_object_array_get_idx(calls, 0), "function"), "arguments")),
              "{\"city\": \"Paris\"}");
    json_object_put(calls);
    free(open);
}

/* ---------------------------------------------------------------- random JSON as a model writes it */

static unsigned rnd(unsigned long long *s, unsigned n) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (unsigned)(*s >> 33) % n;
}

static void put_ws(api_sbuf *b, unsigned long long *s) {
    static const char *const w[] = {"", "", "", " ", "\n", "  ", "\t"};
    api_sb_str(b, w[rnd(s, 7)]);
}

/* A JSON value with random whitespace, escapes (\uXXXX, a surrogate pair, \/), raw UTF-8,
 * integers (no -0: its json.dumps is 0) and literals. */
static void gen(api_sbuf *b, unsigned long long *s, int depth) {
    unsigned k = rnd(s, depth > 3 ? 4 : 6);
    static const char *const pieces[] = {"a",
                                         "Paris",
                                         " ",
                                         "\\n",
                                         "\\\"",
                                         "\\\\",
                                         "\\/",
                                         "\\u00e9",
                                         "\\ud83d\\ude00",
                                         "\xc3\xa9",
                                         "\xf0\x9f\x98\x80",
                                         "\\t",
                                         "\\u0001",
                                         "</tool_call>",
                                         "\\u2028",
                                         "{"};
    if (k == 0) {
        api_sb_str(b, "\"");
        for (unsigned i = rnd(s, 6); i; i--) api_sb_str(b, pieces[rnd(s, 16)]);
        api_sb_str(b, "\"");
    } else if (k == 1) {
        long long v = (long long)rnd(s, 200000) - 100000;
        api_sb_printf(b, "%lld", v ? v : 7);
    } else if (k == 2) {
        static const char *const lit[] = {"true", "false", "null"};
        api_sb_str(b, lit[rnd(s, 3)]);
    } else if (k == 3) {
        api_sb_printf(b, "%u", rnd(s, 10));
    } else {
        int obj = k == 4, n = (int)rnd(s, 4);
        api_sb_str(b, obj ? "{" : "[");
        for (int i = 0; i < n; i++) {
            put_ws(b, s);
            if (i) api_sb_str(b, ","), put_ws(b, s);
            if (obj) api_sb_printf(b, "\"k%d\\u00e9\"", i), put_ws(b, s), api_sb_str(b, ":"), put_ws(b, s);
            gen(b, s, depth + 1);
        }
        put_ws(b, s);
        api_sb_str(b, obj ? "}" : "]");
    }
}

static int is_prefix(const char *p, const char *of) { return !strncmp(p, of, strlen(p)); }

/* oa_canon_json is json.dumps(json.loads(text), ensure_ascii=False) (oa_pydumps, itself checked
 * against json.dumps above) on 300 random texts, and every prefix of a text (at a character's
 * boundary) gives a prefix of the whole one's form: what a stream sends adds up to the reply. */
TEST(test_canon_is_dumps_and_prefix_stable) {
    unsigned long long seed = 11;
    for (int it = 0; it < 300; it++) {
        api_sbuf b = {0};
        api_sb_str(&b, "{");
        put_ws(&b, &seed);
        api_sb_str(&b, "\"x\":");
        gen(&b, &seed, 0);
        api_sb_str(&b, "}");
        json_object *o = parse(b.p);
        CHECK_MSG(o != NULL, "generated text does not parse: %s", b.p);
        char *want = oa_pydumps(o), *got = oa_canon_json(b.p, strlen(b.p));
        CHECK_MSG(!strcmp(got, want), "%s\n  canon %s\n  dumps %s", b.p, got, want);
        for (size_t L = 0; L <= strlen(b.p); L++) {
            if (((unsigned char)b.p[L] & 0xC0) == 0x80) continue;
            char *pre = oa_canon_json(b.p, L);
            CHECK_MSG(is_prefix(pre, want), "prefix %zu of %s gives %s", L, b.p, pre);
            free(pre);
        }
        free(want), free(got), free(b.p);
        json_object_put(o);
        if (check_cur_failed_) return;
    }
}

/* A stream's view of calls being written (oa_calls_progress), both families, 200 random answers
 * of 1..3 calls: at every prefix each begun call's name is its own once written and its
 * arguments are a prefix of the parsed reply's; at the end they are the reply's. */
TEST(test_progress_adds_up_to_the_reply) {
    unsigned long long seed = 5;
    for (int it = 0; it < 200; it++) {
        int f = it % 2 ? ENG_TOOLS_LLAMA3 : ENG_TOOLS_HERMES, n = 1 + (int)rnd(&seed, 3);
        api_sbuf b = {0};
        if (f == ENG_TOOLS_HERMES) api_sb_str(&b, "Some content first.\n");
        for (int i = 0; i < n; i++) {
            if (f == ENG_TOOLS_HERMES) api_sb_str(&b, "<tool_call>\n");
            else if (i) api_sb_str(&b, ";"), put_ws(&b, &seed);
            api_sb_printf(&b, "{\"name\": \"f%d\",", i);
            put_ws(&b, &seed);
            api_sb_printf(&b, "\"%s\":", f == ENG_TOOLS_HERMES ? "arguments" : "parameters");
            put_ws(&b, &seed);
            api_sb_str(&b, "{\"x\":");
            gen(&b, &seed, 1);
            api_sb_str(&b, "}}");
            if (f == ENG_TOOLS_HERMES) api_sb_str(&b, "\n</tool_call>\n");
        }
        size_t clen;
        json_object *calls = oa_parse_tool_calls(f, b.p, &clen, 0);
        CHECK_MSG(calls && (int)json_object_array_length(calls) == n, "%s", b.p);
        if (!calls) {
            free(b.p);
            return;
        }
        const char *want[3];
        for (int i = 0; i < n; i++)
            want[i] = json_object_get_string(json_object_object_get(
                json_object_object_get(json_object_array_get_idx(calls, (size_t)i), "function"), "arguments"));
        size_t len = strlen(b.p);
        for (size_t L = 0; L <= len; L++) {
            if (((unsigned char)b.p[L] & 0xC0) == 0x80) continue;
            char save = b.p[L];
            b.p[L] = 0;
            oa_call_progress pr[4] = {{0}};
            int k = oa_calls_progress(f, b.p, pr, 4);
            b.p[L] = save;
            CHECK_MSG(k >= 0 && k <= n, "prefix %zu of %s: %d calls", L, b.p, k);
            for (int i = 0; i < k; i++) {
                char name[8];
                snprintf(name, sizeof name, "f%d", i);
                CHECK_MSG(!pr[i].name || !strcmp(pr[i].name, name), "prefix %zu: name %s", L, pr[i].name);
                CHECK_MSG(!pr[i].args || is_prefix(pr[i].args, want[i]), "prefix %zu of %s: args %s not a prefix of %s", L, b.p,
                          pr[i].args, want[i]);
                if (L == len) CHECK_MSG(pr[i].name && pr[i].args && !strcmp(pr[i].args, want[i]), "end: %s", pr[i].args);
                free(pr[i].name), free(pr[i].args);
            }
            if (L == len) CHECK_EQ_INT(k, n);
        }
        json_object_put(calls);
        free(b.p);
        if (check_cur_failed_) return;
    }
}

TEST(test_ids_unique) {
    char a[64], b[64];
    oa_new_id(a, sizeof a, "chatcmpl-");
    oa_new_id(b, sizeof b, "chatcmpl-");
    CHECK_EQ_INT((int)strlen(a), 9 + 32);
    CHECK(strcmp(a, b) != 0);
}

int main(void) {
    RUN(test_parse_calls_after_content);
    RUN(test_parse_unclosed_and_malformed);
    RUN(test_pydumps_is_json_dumps);
    RUN(test_tool_choice);
    RUN(test_forced_calls);
    RUN(test_parse_llama3);
    RUN(test_canon_is_dumps_and_prefix_stable);
    RUN(test_progress_adds_up_to_the_reply);
    RUN(test_ids_unique);
    return CHECK_DONE();
}
