/* test_json_grammar.c — engine/text/json_grammar.h: the automaton accepts JSON texts and
 * rejects broken ones (json-c parses what it completes); random walks under a byte budget
 * always complete inside it and parse (the shortest completion is exact: some byte always
 * lowers it by one); the token mask on the default model's tokenizer equals trying every token
 * by hand, with the budget and the end ids. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/json_grammar.h"
#include "engine/text/tokenizer.h"
#include "kernels/sampling.h"
#include "tests/unit/check.h"

static unsigned check_randu(unsigned long long *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (unsigned)(*s >> 33);
}

/* 1: text is accepted and complete; 0: accepted, incomplete; -1: rejected. */
static int run(const jg_spec *g, const char *text) {
    jg_state s;
    jg_start(g, &s);
    if (jg_feed(g, &s, text, strlen(text))) return -1;
    return jg_complete(g, &s);
}

TEST(test_accepts_and_rejects) {
    jg_spec any, obj;
    CHECK(jg_spec_init(&any, 0, "") == 0);
    CHECK(jg_spec_init(&obj, 1, "}\n</tool_call>") == 0);
    const char *good[] = {"0",
                          "-12.5e+3",
                          "true",
                          "null",
                          "\"a\\u00e9\\n\xc3\xa9\"",
                          "[]",
                          "[1, [2, {}], \"x\"]",
                          "{\"a\": {\"b\": [true, false, null]}, \"c\": -0.0}",
                          "{ \t}",
                          "\"\xf0\x9f\x98\x80\""};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) CHECK_MSG(run(&any, good[i]) == 1, "rejected %s", good[i]);
    const char *bad[] = {"01",
                         "-",
                         "1.",
                         "1e",
                         "tru",
                         "[1,]",
                         "{\"a\" 1}",
                         "{,}",
                         "\"\x01\"",
                         "\"\\x\"",
                         "\"\\ud800\"",
                         "[}",
                         "{\"a\":1}}",
                         "\"\xc3(\"",
                         " 1",
                         "\"\xe0\x80\x80\"",
                         "\"\xed\xa0\x80\"",
                         "\"\xf4\x90\x80\x80\""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) CHECK_MSG(run(&any, bad[i]) <= 0, "accepted %s", bad[i]);
    CHECK(run(&obj, "{\"city\": \"Paris\"}}\n</tool_call>") == 1);
    CHECK(run(&obj, "{\"city\": \"Paris\"}}\n</tool_call>x") == -1);
    CHECK(run(&obj, "{\"city\": \"Paris\"} }") == -1); /* the suffix follows at once */
    CHECK(run(&obj, "[1]") == -1); /* the root must be an object */
    CHECK(run(&obj, "{\"a\": [1, 2]}") == 0);
    jg_spec deep;
    jg_spec_init(&deep, 0, "");
    char nest[2 * JG_DEPTH + 3];
    memset(nest, '[', JG_DEPTH + 1);
    nest[JG_DEPTH + 1] = 0;
    CHECK(run(&deep, nest) == -1);
    nest[JG_DEPTH] = 0;
    CHECK(run(&deep, nest) == 0);
}

/* Random walks: each byte drawn among those that keep need(after) <= bytes left after it. */
TEST(test_walks_complete_within_budget) {
    unsigned long long seed = 7;
    int complete = 0;
    for (int w = 0; w < 400; w++) {
        jg_spec g;
        jg_spec_init(&g, w % 2, w % 4 < 2 ? "" : "}\n</tool_call>");
        int budget = 20 + (int)(check_randu(&seed) % 120);
        char text[256];
        int n = 0;
        jg_state s;
        jg_start(&g, &s);
        while (!jg_complete(&g, &s)) {
            CHECK_MSG(jg_need(&g, &s) <= budget - n, "walk %d: need %d with %d left", w, jg_need(&g, &s), budget - n);
            unsigned char ok[256];
            int m = 0, lower = 0;
            for (int c = 1; c < 256; c++) {
                jg_state x = s;
                char b = (char)c;
                if (jg_feed(&g, &x, &b, 1)) continue;
                if (jg_need(&g, &x) == jg_need(&g, &s) - 1) lower = 1;
                if (jg_need(&g, &x) <= budget - n - 1) ok[m++] = (unsigned char)c;
            }
            CHECK_MSG(lower, "walk %d: no byte lowers need %d (mode %d)", w, jg_need(&g, &s), s.mode);
            if (!m) break;
            text[n++] = (char)ok[check_randu(&seed) % (unsigned)m];
            jg_feed(&g, &s, &text[n - 1], 1);
        }
        text[n] = 0;
        CHECK_MSG(jg_complete(&g, &s) && jg_need(&g, &s) == 0, "walk %d: incomplete after %d bytes: %s", w, n, text);
        size_t body = (size_t)n - (size_t)g.suffix_len;
        CHECK(!memcmp(text + body, g.suffix, (size_t)g.suffix_len));
        json_tokener *tk = json_tokener_new();
        text[body] = 0; /* the NUL ends a number at the root for json-c */
        json_object *o = json_tokener_parse_ex(tk, text, (int)body + 1);
        int ok = json_tokener_get_error(tk) == json_tokener_success && (!g.object || json_object_is_type(o, json_type_object));
        CHECK_MSG(ok, "walk %d: json-c does not read %.*s", w, (int)body, text);
        complete += ok;
        json_object_put(o);
        json_tokener_free(tk);
    }
    CHECK_EQ_INT(complete, 400);
}

TEST(test_mask_equals_trying_each_token) {
    char *js = tok_default_tokenizer_json();
    tok *t = NULL;
    CHECK(js && tok_load_json(js, strlen(js), &t) == 0);
    int V = tok_vocab_size(t) + 5; /* the model's vocabulary may be larger than the tokenizer's */
    jg_vocab *v = NULL;
    CHECK(jg_vocab_build(t, V, &v) == 0);
    jg_spec g;
    jg_spec_init(&g, 1, "}");
    int W = sampling_mask_words(V), end[] = {258, 256};
    uint32_t *m = malloc(sizeof *m * (size_t)W);
    const char *prefixes[] = {"",        "{ ",        "{",         "{\"k",        "{\"k\\",         "{\"k\\u0",   "{\"k\xe2\x82",
                              "{\"k\":", "{\"k\": -", "{\"k\": 1", "{\"k\": [tr", "{\"k\": [1, {}", "{\"k\": 2}", "{\"k\": 2}}"};
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        for (int left = 1; left < 12; left += 3) {
            jg_state s;
            jg_start(&g, &s);
            CHECK(jg_feed(&g, &s, prefixes[i], strlen(prefixes[i])) == 0);
            int n = jg_mask(&g, &s, v, left, end, 2, m), want = 0, strict = 0, diff = 0;
            uint32_t *by_hand = calloc((size_t)W, sizeof *by_hand), *loose = calloc((size_t)W, sizeof *loose);
            for (int id = 0; id < V; id++) {
                char *b = NULL;
                size_t len = 0;
                if (id >= 256) continue; /* the specials: only as ends */
                b = (char[]){(char)id};
                len = 1;
                jg_state x = s;
                if (jg_feed(&g, &x, b, len)) continue;
                loose[id >> 5] |= 1u << (id & 31);
                if (jg_need(&g, &x) + 1 <= left - 1) by_hand[id >> 5] |= 1u << (id & 31), strict++;
            }
            uint32_t *pick = strict ? by_hand : loose;
            for (int w = 0; w < W; w++) want += __builtin_popcount(pick[w]);
            if (jg_complete(&g, &s) || !want) {
                memset(pick, 0, sizeof *pick * (size_t)W);
                pick[258 >> 5] |= 1u << (258 & 31);
                pick[256 >> 5] |= 1u << (256 & 31);
                want = 2;
            }
            for (int w = 0; w < W; w++) diff += m[w] != pick[w];
            CHECK_MSG(!diff && n == want, "prefix '%s' left %d: %d allowed, %d by hand, %d words differ", prefixes[i], left, n,
                      want, diff);
            free(by_hand);
            free(loose);
        }
    free(m);
    jg_vocab_free(v);
    tok_free(t);
    free(js);
}

int main(void) {
    RUN(test_accepts_and_rejects);
    RUN(test_walks_complete_within_budget);
    RUN(test_mask_equals_trying_each_token);
    return CHECK_DONE();
}
