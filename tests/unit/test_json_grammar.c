/* test_json_grammar.c — engine/text/json_grammar.h: the automaton accepts JSON texts and
 * rejects broken ones (json-c parses what it completes); random walks under a byte budget
 * always complete inside it and parse (the shortest completion is exact: some byte always
 * lowers it by one); the token mask on the default model's tokenizer equals trying every token
 * by hand, with the budget and the end ids. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
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

/* A random walk from g's start: each byte drawn among those that keep need(after) <= the bytes
 * left after it, within budget bytes; some byte must always lower the need by exactly one.
 * *n: the bytes written into text (budget + 1 long), NUL-terminated. */
static void walk(const jg_spec *g, jg_state *s, int budget, unsigned long long *seed, char *text, int *n, int w) {
    *n = 0;
    jg_start(g, s);
    while (!jg_complete(g, s)) {
        CHECK_MSG(jg_need(g, s) <= budget - *n, "walk %d: need %d with %d left", w, jg_need(g, s), budget - *n);
        unsigned char ok[256];
        int m = 0, lower = 0;
        for (int c = 1; c < 256; c++) {
            jg_state x = *s;
            char b = (char)c;
            if (jg_feed(g, &x, &b, 1)) continue;
            if (jg_need(g, &x) == jg_need(g, s) - 1) lower = 1;
            if (jg_need(g, &x) <= budget - *n - 1) ok[m++] = (unsigned char)c;
        }
        text[*n] = 0;
        CHECK_MSG(lower, "walk %d: no byte lowers need %d (mode %d) after %s", w, jg_need(g, s), s->mode, text);
        if (!m) break;
        text[(*n)++] = (char)ok[check_randu(seed) % (unsigned)m];
        jg_feed(g, s, &text[*n - 1], 1);
    }
    text[*n] = 0;
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
        walk(&g, &s, budget, &seed, text, &n, w);
        if (check_cur_failed_) return;
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

/* ---------------------------------------------------------------- schemas */

typedef struct {
    char *p;
    size_t n, cap;
} tbuf;
static void tput(tbuf *b, const char *s) {
    size_t k = strlen(s);
    if (b->n + k + 1 > b->cap) {
        b->cap = (b->n + k + 1) * 2;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, s, k + 1);
    b->n += k;
}

/* A random schema of the subset: types (one or a list), objects with properties (names with
 * escapes and UTF-8) and required ones, enums (prefixes of each other among numbers), const,
 * arrays, additionalProperties false / a schema, annotations. */
static void gen_schema(tbuf *b, unsigned long long *s, int depth) {
    static const char *const leaf[] = {"{\"type\": \"string\"}",
                                       "{\"type\": \"integer\", \"description\": \"n\"}",
                                       "{\"type\": \"number\"}",
                                       "{\"type\": \"boolean\"}",
                                       "{\"type\": \"null\"}",
                                       "{\"type\": [\"string\", \"null\"]}",
                                       "{\"enum\": [1, 12, 123, \"a\", null]}",
                                       "{\"enum\": [\"red\", \"green\", \"gr\\u00e9y\", \"r\"]}",
                                       "{\"const\": {\"k\": [1, \"x\"]}}",
                                       "{}",
                                       "{\"type\": \"object\", \"additionalProperties\": false}",
                                       "{\"type\": \"integer\", \"enum\": [7, -3]}",
                                       "true",
                                       "{\"anyOf\": [{\"type\": \"integer\", \"title\": \"I\"}, {\"type\": \"null\"}]}",
                                       "{\"type\": [\"string\", \"integer\"], \"anyOf\": [{\"type\": \"string\"}, "
                                       "{\"type\": \"boolean\"}]}"};
    unsigned k = check_randu(s) % (depth >= 3 ? 15u : 19u);
    if (k < 15) {
        tput(b, leaf[k]);
        return;
    }
    if (k == 15) {
        tput(b, "{\"type\": \"array\", \"items\": ");
        gen_schema(b, s, depth + 1);
        tput(b, "}");
        return;
    }
    if (k == 16) {
        tput(b, "{\"type\": \"object\", \"additionalProperties\": ");
        gen_schema(b, s, depth + 1);
        tput(b, "}");
        return;
    }
    static const char *const names[] = {"city", "ci", "n", "a\\\"b", "\\u00e9t\\u00e9", "unit", "c", "x y"};
    int n = 1 + (int)(check_randu(s) % 5), req[8], nreq = 0, used = 0;
    tput(b, "{\"type\": \"object\", \"title\": \"T\", \"properties\": {");
    for (int i = 0; i < n; i++) {
        int j;
        do j = (int)(check_randu(s) % 8);
        while (used >> j & 1);
        used |= 1 << j;
        if (i) tput(b, ", ");
        tput(b, "\"");
        tput(b, names[j]);
        tput(b, "\": ");
        gen_schema(b, s, depth + 1);
        if (check_randu(s) % 2) req[nreq++] = j;
    }
    tput(b, "}, \"required\": [");
    for (int i = 0; i < nreq; i++) {
        if (i) tput(b, ", ");
        tput(b, "\"");
        tput(b, names[req[i]]);
        tput(b, "\"");
    }
    tput(b, "]}");
}

/* JSON Schema validation of v (json-c) by the schema sc (json-c), for the subset, written apart
 * from the automaton: 1 valid. Properties must be the declared ones (the strict form). */
static int valid(json_object *sc, json_object *v) {
    if (json_object_is_type(sc, json_type_boolean)) return json_object_get_boolean(sc);
    json_object *t = json_object_object_get(sc, "type"), *x;
    if (t) {
        int ok = 0, n = json_object_is_type(t, json_type_array) ? (int)json_object_array_length(t) : 1;
        for (int i = 0; i < n; i++) {
            const char *name = json_object_get_string(
                json_object_is_type(t, json_type_array) ? json_object_array_get_idx(t, (size_t)i) : t);
            json_type vt = json_object_get_type(v);
            ok |= (!strcmp(name, "string") && vt == json_type_string) || (!strcmp(name, "integer") && vt == json_type_int) ||
                (!strcmp(name, "number") && (vt == json_type_int || vt == json_type_double)) ||
                (!strcmp(name, "boolean") && vt == json_type_boolean) || (!strcmp(name, "null") && vt == json_type_null) ||
                (!strcmp(name, "object") && vt == json_type_object) || (!strcmp(name, "array") && vt == json_type_array);
        }
        if (!ok) return 0;
    }
    if (json_object_object_get_ex(sc, "anyOf", &x)) {
        int ok = 0;
        for (size_t i = 0; i < json_object_array_length(x); i++) ok |= valid(json_object_array_get_idx(x, i), v);
        if (!ok) return 0;
    }
    if (json_object_object_get_ex(sc, "const", &x) && !json_object_equal(x, v)) return 0;
    if (json_object_object_get_ex(sc, "enum", &x)) {
        int ok = 0;
        for (size_t i = 0; i < json_object_array_length(x); i++) ok |= json_object_equal(json_object_array_get_idx(x, i), v);
        if (!ok) return 0;
    }
    json_object *props = json_object_object_get(sc, "properties"), *ap = json_object_object_get(sc, "additionalProperties");
    if (json_object_is_type(v, json_type_object)) {
        json_object_object_foreach(v, k, val) {
            json_object *ps = props ? json_object_object_get(props, k) : NULL;
            if (props && !ps) return 0;
            if (ps && !valid(ps, val)) return 0;
            if (!props && ap && json_object_is_type(ap, json_type_boolean) && !json_object_get_boolean(ap)) return 0;
            if (!props && ap && json_object_is_type(ap, json_type_object) && !valid(ap, val)) return 0;
        }
        json_object *req = json_object_object_get(sc, "required");
        for (size_t i = 0; req && i < json_object_array_length(req); i++)
            if (!json_object_object_get_ex(v, json_object_get_string(json_object_array_get_idx(req, i)), NULL)) return 0;
    }
    json_object *items = json_object_object_get(sc, "items");
    if (items && json_object_is_type(v, json_type_array))
        for (size_t i = 0; i < json_object_array_length(v); i++)
            if (!valid(items, json_object_array_get_idx(v, i))) return 0;
    return 1;
}

/* 300 random schemas, a random walk each (bytes drawn among those that keep the need within the
 * budget): the need is exact (some byte always lowers it by one), the walk completes within the
 * budget, and what it writes parses and validates against the schema. */
TEST(test_schema_walks_validate) {
    unsigned long long seed = 3;
    int validated = 0;
    for (int w = 0; w < 300; w++) {
        tbuf sb = {0};
        tput(&sb, "");
        gen_schema(&sb, &seed, w % 3 ? 0 : 1);
        jg_schema *sc = NULL;
        CHECK_MSG(jg_schema_compile(sb.p, sb.n, &sc) == 0, "walk %d: %s refused: %s", w, sb.p, err_msg());
        jg_spec g;
        jg_spec_init(&g, 0, w % 2 ? "}" : "");
        g.schema = sc;
        jg_state s;
        jg_start(&g, &s);
        int budget = jg_need(&g, &s) + (int)(check_randu(&seed) % 200), n = 0;
        char *text = malloc((size_t)budget + 1);
        walk(&g, &s, budget, &seed, text, &n, w);
        if (check_cur_failed_) return;
        CHECK_MSG(jg_complete(&g, &s), "walk %d: incomplete: %.*s", w, n, text);
        int body = n - g.suffix_len;
        text[body] = 0;
        json_tokener *tk = json_tokener_new();
        json_object *o = json_tokener_parse_ex(tk, text, body + 1), *schema = json_tokener_parse(sb.p);
        CHECK_MSG(json_tokener_get_error(tk) == json_tokener_success, "walk %d: json-c does not read %s", w, text);
        CHECK_MSG(valid(schema, o), "walk %d: %s does not validate against %s", w, text, sb.p);
        validated++;
        json_object_put(o);
        json_object_put(schema);
        json_tokener_free(tk);
        jg_schema_free(sc);
        free(text);
        free(sb.p);
    }
    CHECK_EQ_INT(validated, 300);
}

/* What the subset refuses is named by its path; annotations and unknown keywords pass. */
TEST(test_schema_refusals) {
    static const struct {
        const char *schema, *path;
    } bad[] = {
        {"{\"type\": \"object\", \"properties\": {\"a\": {\"anyOf\": [{\"type\": \"string\", \"minLength\": 1}]}}}",
         "properties.a.anyOf"},
        {"{\"oneOf\": [{\"type\": \"string\"}]}", "oneOf"},
        {"{\"type\": \"string\", \"anyOf\": [{\"type\": \"null\"}]}", "no type"},
        {"{\"$ref\": \"#/$defs/x\"}", "$ref"},
        {"{\"type\": \"array\", \"items\": {\"type\": \"string\", \"minLength\": 2}}", "items.minLength"},
        {"{\"type\": \"strin\"}", "type must be"},
        {"{\"type\": \"object\", \"properties\": {\"a\": {}}, \"required\": [\"b\"]}", "required names a property"},
        {"{\"enum\": []}", "enum is empty"},
        {"[1]", "a schema must be an object"},
        {"{\"type\": ", "not JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        jg_schema *sc = NULL;
        CHECK_MSG(jg_schema_compile(bad[i].schema, strlen(bad[i].schema), &sc) == GE_INVALID && !sc, "%s accepted", bad[i].schema);
        CHECK_MSG(strstr(err_msg(), bad[i].path), "%s: message %s", bad[i].schema, err_msg());
        err_clear();
    }
    const char *ok = "{\"type\": \"object\", \"description\": \"d\", \"x-vendor\": 1, \"properties\": {\"a\": {\"type\": "
                     "\"string\", \"format\": \"date\", \"default\": \"x\"}}, \"$schema\": \"s\"}";
    jg_schema *sc = NULL;
    CHECK(jg_schema_compile(ok, strlen(ok), &sc) == 0);
    jg_spec g;
    jg_spec_init(&g, 1, "");
    g.schema = sc;
    const char *good[] = {"{}", "{\"a\": \"x\"}", "{ \"a\" : \"\\u00e9\" }"},
               *no[] = {"{\"b\": 1}", "{\"a\": 1}", "{\"a\": \"x\", \"a\": \"y\"}"};
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(run(&g, good[i]) == 1, "rejected %s", good[i]);
        CHECK_MSG(run(&g, no[i]) == -1, "accepted %s", no[i]);
    }
    jg_schema_free(sc);
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
    RUN(test_schema_walks_validate);
    RUN(test_schema_refusals);
    RUN(test_mask_equals_trying_each_token);
    return CHECK_DONE();
}
