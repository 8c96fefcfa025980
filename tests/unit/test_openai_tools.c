/* test_openai_tools.c — tool calling on the OpenAI routes (api/openai_tools.c): the model's
 * output parsed into tool_calls as vLLM's hermes parser parses it (calls after content, several
 * calls, an unclosed last call, a malformed call making all of it content, parallel_tool_calls
 * false keeping the first), JSON written as Python's json.dumps writes it (what the template's
 * tojson puts into the prompt), tool_choice read and refused where it cannot be kept, and ids. */
#include <json-c/json.h>
#include <string.h>

#include "api/openai.h"
#include "common/err.h"
#include "tests/unit/check.h"

static json_object *parse(const char *s) { return json_tokener_parse(s); }

TEST(test_parse_calls_after_content) {
    const char *out =
        "Let me look.\n<tool_call>\n{\"name\": \"get\", \"arguments\": {\"city\": \"Paris\", \"n\": 2}}\n</tool_call>"
        "\n<tool_call>{\"name\":\"noop\",\"arguments\":{}}</tool_call>";
    size_t clen = 0;
    json_object *calls = oa_parse_tool_calls(out, &clen, 0);
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
    calls = oa_parse_tool_calls(out, &clen, 1); /* parallel_tool_calls false */
    CHECK_EQ_INT((int)json_object_array_length(calls), 1);
    json_object_put(calls);
}

TEST(test_parse_unclosed_and_malformed) {
    size_t clen = 99;
    json_object *calls = oa_parse_tool_calls("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}\n", &clen, 0);
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
    for (int i = 0; bad[i]; i++) CHECK_MSG(oa_parse_tool_calls(bad[i], &clen, 0) == NULL, "%s", bad[i]);
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

/* A forced answer: the opening in Qwen3's format; the model's text parsed after it, or kept as
 * the arguments when it is not JSON (the call's closing brace and </tool_call> cut). */
TEST(test_forced_calls) {
    char *open = oa_call_opening("get \"w\"");
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
        {"", "", 1},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        json_object *calls = oa_forced_calls(open, "get \"w\"", rows[i].text, 0);
        CHECK_EQ_INT((int)json_object_array_length(calls), rows[i].n);
        json_object *f = json_object_object_get(json_object_array_get_idx(calls, 0), "function");
        CHECK_STR(json_object_get_string(json_object_object_get(f, "name")), "get \"w\"");
        const char *a = json_object_get_string(json_object_object_get(f, "arguments"));
        CHECK_MSG(!strcmp(a, rows[i].args), "%s -> %s (want %s)", rows[i].text, a, rows[i].args);
        json_object_put(calls);
    }
    json_object *one = oa_forced_calls(open, "get \"w\"", rows[1].text, 1); /* parallel_tool_calls false */
    CHECK_EQ_INT((int)json_object_array_length(one), 1);
    json_object_put(one);
    free(open);
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
    RUN(test_ids_unique);
    return CHECK_DONE();
}
