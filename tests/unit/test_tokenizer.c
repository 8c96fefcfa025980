/* test_tokenizer.c — engine/text/tokenizer.h and engine/text/chat.h on the shared Qwen3 and Llama 3
 * tokenizer files (../shared/data/tokenizers, cwd = repo root): known ids (taken from HF
 * tokenizers 0.23), round trips, special-token switches, invalid UTF-8 in decode, the default
 * model's tokenizer, chat rendering, and refusal of what is not supported (WordPiece, Unigram,
 * unknown regexes). The full HF parity run is tests/tokenizer/test_parity.py. */
#include <stdio.h>

#include "common/err.h"
#include "engine/format/json.h"
#include "engine/text/chat.h"
#include "engine/text/tokenizer.h"
#include "tests/unit/check.h"

#define QWEN "../shared/data/tokenizers/qwen3"
#define LLAMA "../shared/data/tokenizers/llama3"

static tok *qwen, *llama;

static int ids_eq(const tok *t, const char *text, int parse_special, const int *want, int nwant) {
    int *ids, n;
    if (tok_encode(t, text, strlen(text), 1, parse_special, &ids, &n)) return 0;
    int ok = n == nwant && (n == 0 || !memcmp(ids, want, (size_t)n * sizeof *ids));
    if (!ok) {
        printf("  got [");
        for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
        printf("] for \"%s\"\n", text);
    }
    free(ids);
    return ok;
}

TEST(loads_both) {
    CHECK_EQ_INT(tok_load(QWEN, &qwen), 0);
    CHECK_EQ_INT(tok_load(LLAMA, &llama), 0);
    CHECK_EQ_INT(tok_vocab_size(qwen), 151669);
    CHECK_EQ_INT(tok_vocab_size(llama), 128256);
    CHECK_EQ_INT(tok_token_id(qwen, "<|im_end|>"), 151645);
    CHECK_EQ_INT(tok_token_id(llama, "<|eot_id|>"), 128009);
    CHECK_EQ_INT(tok_token_id(qwen, "<|no_such|>"), -1);
    CHECK_STR(tok_eos(qwen), "<|im_end|>");
    CHECK(tok_bos(qwen) == NULL);
    CHECK_STR(tok_bos(llama), "<|begin_of_text|>");
    CHECK(tok_is_special(qwen, 151645) && !tok_is_special(qwen, 151667) && !tok_is_special(qwen, 9707));
}

TEST(known_ids) {
    CHECK(qwen && llama);
    static const int q1[] = {9707, 1879, 0, 1084, 594, 220, 16, 17, 18, 19, 20, 220, 151645, 305, 18503, 385, 220, 108386};
    CHECK(ids_eq(qwen, "Hello world! It's 12345 <|im_end|> h\xc3\xa9llo \xe4\xbd\xa0\xe5\xa5\xbd", 1, q1, 18));
    static const int l1[] = {9906, 1917, 0, 1102, 596, 220, 4513, 1774, 220, 128009, 305, 19010, 385, 118195, 53901};
    CHECK(ids_eq(llama, "Hello world! It's 12345 <|eot_id|> h\xc3\xa9llo \xe4\xbd\xa0\xe5\xa5\xbd", 1, l1, 15));
    static const int q2[] = {27, 91, 318, 6213, 91, 29}; /* special token as plain text */
    CHECK(ids_eq(qwen, "<|im_end|>", 0, q2, 6));
    static const int q3[] = {151667}; /* <think> is added, not special */
    CHECK(ids_eq(qwen, "<think>", 0, q3, 1));
    CHECK(ids_eq(qwen, "", 1, NULL, 0));
}

TEST(nfc_applies_to_qwen_only) {
    CHECK(qwen && llama);
    int *a, *b, na, nb;
    CHECK_EQ_INT(tok_encode(qwen, "cafe\xcc\x81", 6, 1, 1, &a, &na), 0); /* e + U+0301 */
    CHECK_EQ_INT(tok_encode(qwen, "caf\xc3\xa9", 5, 1, 1, &b, &nb), 0); /* U+00E9 */
    int same = na == nb && !memcmp(a, b, (size_t)na * sizeof *a);
    free(a);
    free(b);
    CHECK(same);
    CHECK_EQ_INT(tok_encode(llama, "cafe\xcc\x81", 6, 1, 1, &a, &na), 0);
    CHECK_EQ_INT(tok_encode(llama, "caf\xc3\xa9", 5, 1, 1, &b, &nb), 0);
    same = na == nb && !memcmp(a, b, (size_t)na * sizeof *a);
    free(a);
    free(b);
    CHECK(!same);
}

TEST(round_trip) {
    CHECK(qwen && llama);
    static const char *texts[] = {
        "def f(x):\n    return x ** 2\n\n\n",
        "  lots   of\t\tspace \n\n ",
        "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 family",
        "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7 \xd7\xa9\xd7\x9c\xd7\x95\xd7\x9d",
        "I'LL we'Re 12345678901234567890",
        "<|im_start|>user\nhi<|im_end|>\n",
    };
    const tok *ts[] = {qwen, llama};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
            int *ids, n;
            char *back;
            size_t len;
            CHECK_EQ_INT(tok_encode(ts[k], texts[i], strlen(texts[i]), 1, 1, &ids, &n), 0);
            CHECK_EQ_INT(tok_decode(ts[k], ids, n, 0, &back, &len), 0);
            free(ids);
            int ok = len == strlen(texts[i]) && !strcmp(back, texts[i]);
            free(back);
            CHECK_MSG(ok, "model %d text %zu does not round-trip", k, i);
        }
}

TEST(decode_invalid_utf8_and_skip_special) {
    CHECK(qwen);
    /* 151645 <|im_end|>; 8519 "ä½" = bytes E4 BD (a cut 3-byte sequence); 0 "!" */
    int ids[] = {151645, 8519, 0, 999999};
    char *s;
    size_t n;
    CHECK_EQ_INT(tok_decode(qwen, ids, 4, 0, &s, &n), 0);
    CHECK_STR(s, "<|im_end|>\xef\xbf\xbd!");
    free(s);
    CHECK_EQ_INT(tok_decode(qwen, ids, 4, 1, &s, &n), 0);
    CHECK_STR(s, "\xef\xbf\xbd!");
    free(s);
}

TEST(invalid_utf8_input_refused) {
    CHECK(qwen);
    int *ids, n;
    CHECK_EQ_INT(tok_encode(qwen, "ab\xff", 3, 1, 1, &ids, &n), GE_INVALID);
}

TEST(default_tokenizer) {
    char *j = tok_default_tokenizer_json(), *c = tok_default_tokenizer_config_json();
    tok *t = NULL;
    CHECK(j && c);
    int rc = tok_load_json_cfg(j, strlen(j), c, strlen(c), &t);
    free(j);
    free(c);
    CHECK_MSG(rc == 0, "%s", err_msg());
    CHECK_EQ_INT(tok_vocab_size(t), 259);
    CHECK_EQ_INT(tok_token_id(t, "<|im_end|>"), 258);
    CHECK_STR(tok_eos(t), "<|im_end|>");
    static const int want[] = {257, 'h', 'i', ' ', 0xc3, 0xa9, 258};
    int ok = ids_eq(t, "<|im_start|>hi \xc3\xa9<|im_end|>", 1, want, 7);
    chat_msg m[] = {{.role = "user", .content = "hi"}};
    char *p = NULL;
    int crc = chat_render(t, m, 1, 1, &p);
    tok_free(t);
    CHECK(ok);
    CHECK_EQ_INT(crc, 0);
    CHECK_STR(p, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    free(p);
}

TEST(chat_qwen3_and_llama3) {
    CHECK(qwen && llama);
    chat_msg m[] = {{.role = "system", .content = "S"}, {.role = "user", .content = "Q"}, {.role = "assistant", .content = "A"}};
    char *p;
    CHECK_EQ_INT(chat_render(qwen, m, 3, 0, &p), 0);
    CHECK_STR(p,
              "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
              "<|im_start|>assistant\n<think>\n\n</think>\n\nA<|im_end|>\n");
    free(p);
    CHECK_EQ_INT(chat_render(llama, m, 2, 1, &p), 0);
    CHECK_STR(p,
              "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    free(p);
}

/* Qwen3's tool format: the tools block holds the system message, an assistant's calls follow its
 * content, tool results are user turns; enable_thinking false closes an empty think block. The
 * other templates have no tool format and refuse tools. */
TEST(chat_qwen3_tools) {
    CHECK(qwen && llama);
    static const chat_tool_call calls[] = {{"get", "{\"city\": \"Paris\"}"}, {"noop", "{}"}};
    chat_msg m[] = {{.role = "system", .content = "S"},
                    {.role = "user", .content = "Q"},
                    {.role = "assistant", .content = "", .tool_calls = calls, .n_tool_calls = 2},
                    {.role = "tool", .content = "sunny"},
                    {.role = "tool", .content = "ok"}};
    const char *tools[] = {"{\"type\": \"function\", \"function\": {\"name\": \"get\"}}"};
    chat_opts o = {.tools = tools, .n_tools = 1, .thinking_off = 1};
    char *p = NULL;
    CHECK_EQ_INT(chat_render_opts(qwen, m, 5, 1, &o, &p), 0);
    CHECK_STR(p,
              "<|im_start|>system\nS\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
              "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
              "{\"type\": \"function\", \"function\": {\"name\": \"get\"}}\n</tools>\n\nFor each function call, return a "
              "json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
              "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
              "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get\", \"arguments\": "
              "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>"
              "<|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nok\n"
              "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    free(p);
    p = NULL;
    CHECK_EQ_INT(chat_render_opts(llama, m + 1, 2, 1, &o, &p), GE_UNSUPPORTED);
    CHECK(p == NULL);
    err_clear();
}

/* Llama 3.1's tool format (the date header, tools as json.dumps(indent=4) in the first user
 * message, a call as {"name", "parameters"}, a result as an ipython turn holding a JSON string),
 * on the Llama 3 tokenizer with tests/integration/llama31_tools.jinja as its template; the
 * expected text is jinja2's rendering of that template (test_openai_llama3.py renders it live). */
TEST(chat_llama31_tools) {
    FILE *f = fopen(LLAMA "/tokenizer.json", "rb"), *j = fopen("tests/integration/llama31_tools.jinja", "rb");
    CHECK(f && j);
    if (!f || !j) return;
    char *tj = NULL, *tpl = NULL, *cfg = NULL;
    size_t tn = 0, pn = 0, cn = 0;
    FILE *m = open_memstream(&tj, &tn), *c;
    for (int ch; (ch = fgetc(f)) != EOF;) fputc(ch, m);
    fclose(m);
    m = open_memstream(&tpl, &pn);
    for (int ch; (ch = fgetc(j)) != EOF;) fputc(ch, m);
    fclose(m);
    fclose(f);
    fclose(j);
    c = open_memstream(&cfg, &cn);
    fputs("{\"bos_token\": \"<|begin_of_text|>\", \"chat_template\": ", c);
    js_write_str(c, tpl, pn);
    fputs("}", c);
    fclose(c);
    tok *t = NULL;
    CHECK_EQ_INT(tok_load_json_cfg(tj, tn, cfg, cn, &t), 0);
    free(tj), free(tpl), free(cfg);
    if (!t) return;
    CHECK_EQ_INT(chat_tool_format(t), CHAT_TOOLS_LLAMA3);
    CHECK_EQ_INT(chat_tool_format(llama), CHAT_TOOLS_NONE);
    CHECK_EQ_INT(chat_tool_format(qwen), CHAT_TOOLS_HERMES);
    static const chat_tool_call call[] = {{"get", "{\"city\": \"Paris\", \"n\": 2}"}};
    chat_msg msgs[] = {{.role = "system", .content = " S "},
                       {.role = "user", .content = "Q\n"},
                       {.role = "assistant", .content = "", .tool_calls = call, .n_tool_calls = 1},
                       {.role = "tool", .content = "sunny \"22\"\n"},
                       {.role = "assistant", .content = " ok "},
                       {.role = "user", .content = "again"}};
    const char *tools[] = {"{\"type\": \"function\", \"function\": {\"name\": \"get\", \"description\": \"Weather \xc3\xa9\", "
                           "\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"n\": "
                           "{\"type\": \"integer\"}}, \"required\": [\"city\"], \"x\": [], \"y\": {}}}}",
                           "{\"type\": \"function\", \"function\": {\"name\": \"noop\"}}"};
    chat_opts o = {.tools = tools, .n_tools = 2};
    char *p = NULL;
    CHECK_EQ_INT(chat_render_opts(t, msgs, 6, 1, &o, &p), 0);
    CHECK_STR(p,
              "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: "
              "December 2023\nToday Date: 26 Jul 2024\n\nS<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nGiven the "
              "following functions, please respond with a JSON for a function call with its proper arguments that best "
              "answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": dictionary of "
              "argument name and its value}.Do not use variables.\n\n{\n    \"type\": \"function\",\n    \"function\": {\n"
              "        \"name\": \"get\",\n        \"description\": \"Weather \xc3\xa9\",\n        \"parameters\": {\n"
              "            \"type\": \"object\",\n            \"properties\": {\n                \"city\": {\n"
              "                    \"type\": \"string\"\n                },\n                \"n\": {\n"
              "                    \"type\": \"integer\"\n                }\n            },\n            \"required\": [\n"
              "                \"city\"\n            ],\n            \"x\": [],\n            \"y\": {}\n        }\n    }\n}\n\n"
              "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"noop\"\n    }\n}\n\nQ<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get\", \"parameters\": {\"city\": \"Paris\", "
              "\"n\": 2}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n\"sunny \\\"22\\\"\\n\"<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\nok<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
              "again<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n");
    free(p);
    p = NULL;
    CHECK_EQ_INT(chat_render_opts(t, msgs + 1, 1, 1, NULL, &p), 0); /* no tools: no Environment line, no system text */
    CHECK_STR(p,
              "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday "
              "Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nQ<|eot_id|>"
              "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(p);
    p = NULL;
    static const chat_tool_call two[] = {{"get", "{}"}, {"noop", "{}"}};
    chat_msg bad[] = {{.role = "user", .content = "Q"}, {.role = "assistant", .content = "", .tool_calls = two, .n_tool_calls = 2}};
    CHECK_EQ_INT(chat_render_opts(t, bad, 2, 1, &o, &p), GE_UNSUPPORTED); /* one call per turn */
    bad[1].n_tool_calls = 1, bad[1].content = "text";
    CHECK_EQ_INT(chat_render_opts(t, bad, 2, 1, &o, &p), GE_UNSUPPORTED); /* content beside it would be dropped */
    CHECK_EQ_INT(chat_render_opts(t, msgs, 1, 1, &o, &p), GE_UNSUPPORTED); /* tools and no user message */
    CHECK(p == NULL);
    err_clear();
    tok_free(t);
}

static int load_text(const char *json) {
    tok *t = NULL;
    int rc = tok_load_json(json, strlen(json), &t);
    tok_free(t);
    return rc;
}

TEST(unsupported_refused) {
    static const char wp[] =
        "{\"model\": {\"type\": \"WordPiece\", \"unk_token\": \"[UNK]\", \"vocab\": {\"[UNK]\": 0, \"a\": 1}}}";
    CHECK_EQ_INT(load_text(wp), GE_UNSUPPORTED);
    CHECK_MSG(strstr(err_msg(), "model type WordPiece is not supported (only BPE)"), "message: %s", err_msg());
    static const char ug[] = "{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", -1.0]]}}";
    CHECK_EQ_INT(load_text(ug), GE_UNSUPPORTED);
    CHECK_MSG(strstr(err_msg(), "Unigram"), "message: %s", err_msg());
    /* a BPE file whose Split regex is not one of the implemented ones */
    char *j = tok_default_tokenizer_json();
    CHECK(j);
    char *at = strstr(j, "\\\\p{N}|");
    CHECK(at);
    memcpy(at, "\\\\p{N}+", 7);
    int rc = load_text(j);
    free(j);
    CHECK_EQ_INT(rc, GE_UNSUPPORTED);
    CHECK_MSG(strstr(err_msg(), "not one of the supported regexes"), "message: %s", err_msg());
    /* and from a directory on disk, as tok_load reads it */
    FILE *f = fopen(TEST_TMP "/grpod_test_tok_wp/tokenizer.json", "w");
    if (!f) {
        CHECK(system("mkdir -p " TEST_TMP "/grpod_test_tok_wp") == 0);
        f = fopen(TEST_TMP "/grpod_test_tok_wp/tokenizer.json", "w");
    }
    CHECK(f);
    fputs(wp, f);
    fclose(f);
    tok *t = NULL;
    CHECK_EQ_INT(tok_load(TEST_TMP "/grpod_test_tok_wp", &t), GE_UNSUPPORTED);
    CHECK_MSG(strstr(err_msg(), "WordPiece") && strstr(err_msg(), TEST_TMP "/grpod_test_tok_wp"), "message: %s", err_msg());
}

/* Hostile input: a vocab key or merge over 64 KiB overflowed a fixed scratch buffer at load, and a
 * message wrapping err_msg() ("%s: %s", dir, err_msg()) came out garbled. */
TEST(long_keys_and_wrapped_messages) {
    char *j = tok_default_tokenizer_json();
    CHECK(j);
    const char *v = strstr(j, "\"vocab\": {"), *m = strstr(j, "\"merges\": [");
    CHECK(v && m && v < m);
    size_t L = 100000, jl = strlen(j), vo = (size_t)(v - j) + 10, mo = (size_t)(m - j) + 11;
    char *big = malloc(jl + 4 * L + 64), *p = big;
    memcpy(p, j, vo);
    p += vo;
    *p++ = '"';
    memset(p, 'a', L);
    p += L;
    p += sprintf(p, "\": 300, ");
    memcpy(p, j + vo, mo - vo);
    p += mo - vo;
    *p++ = '"';
    memset(p, 'b', L);
    p += L;
    *p++ = ' ';
    memset(p, 'c', L);
    p += L;
    *p++ = '"'; /* merges is [] there */
    strcpy(p, j + mo);
    free(j);
    int rc = load_text(big);
    free(big);
    CHECK_EQ_INT(rc, GE_FORMAT); /* the merge's tokens are not in the vocab: refused, no overflow */
    CHECK_MSG(strstr(err_msg(), "missing from the vocab"), "message: %s", err_msg());
    err_set(GE_FORMAT, "inner %d", 7);
    err_set(GE_FORMAT, "outer %s: %s", "dir", err_msg());
    CHECK_STR(err_msg(), "outer dir: inner 7");
    CHECK(load_text("{\"model\": ") != 0);
    CHECK_MSG(!strncmp(err_msg(), "tokenizer.json: ", 16) && !strstr(err_msg() + 16, "tokenizer.json"), "message: %s", err_msg());
}

int main(void) {
    RUN(loads_both);
    RUN(known_ids);
    RUN(nfc_applies_to_qwen_only);
    RUN(round_trip);
    RUN(decode_invalid_utf8_and_skip_special);
    RUN(invalid_utf8_input_refused);
    RUN(default_tokenizer);
    RUN(chat_qwen3_and_llama3);
    RUN(chat_qwen3_tools);
    RUN(chat_llama31_tools);
    RUN(unsupported_refused);
    RUN(long_keys_and_wrapped_messages);
    tok_free(qwen);
    tok_free(llama);
    return CHECK_DONE();
}
