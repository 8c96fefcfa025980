/* test_reward.c — built-in verifiers: type names, spec checks, exact/contains/regex/math scores,
 * GSM8K answer extraction (hand-written cases and the real GSM8K test split from
 * ../shared/data/gsm8k/test.jsonl), numeric parsing, and DAPO overlong shaping. */
#include "api/reward.h"
#include "common/err.h"
#include "engine/format/json.h"
#include "tests/unit/check.h"

#include <sys/resource.h>
#include <time.h>

#define GSM8K_PATH "../shared/data/gsm8k/test.jsonl"

static reward_spec spec(reward_type t, const char *answer) {
    reward_spec r = {t, answer, 1, 0, 0, 0};
    return r;
}

TEST(test_parse_type) {
    const char *names[] = {"exact", "math", "regex", "contains", "none"};
    reward_type want[] = {REWARD_EXACT, REWARD_MATH, REWARD_REGEX, REWARD_CONTAINS, REWARD_NONE};
    for (int i = 0; i < 5; i++) {
        reward_type t = REWARD_NONE;
        CHECK_EQ_INT(reward_parse_type(names[i], &t), 0);
        CHECK_EQ_INT(t, want[i]);
        CHECK_STR(reward_type_name(t), names[i]);
    }
    reward_type t;
    CHECK_EQ_INT(reward_parse_type("Exact", &t), GE_INVALID);
    CHECK_EQ_INT(reward_parse_type("", &t), GE_INVALID);
    CHECK_EQ_INT(reward_parse_type("llm_judge", &t), GE_INVALID);
    CHECK_EQ_INT(reward_parse_type(NULL, &t), GE_INVALID);
}

TEST(test_check_spec) {
    char why[256];
    reward_spec r = spec(REWARD_NONE, NULL);
    CHECK_EQ_INT(reward_check_spec(&r, why, sizeof why), 0);
    r = spec(REWARD_EXACT, NULL);
    CHECK_EQ_INT(reward_check_spec(&r, why, sizeof why), GE_INVALID);
    CHECK_MSG(strstr(why, "answer") != NULL, "why: %s", why);
    r = spec(REWARD_EXACT, ""); /* expecting an empty response is legitimate */
    CHECK_EQ_INT(reward_check_spec(&r, why, sizeof why), 0);
    r = spec(REWARD_CONTAINS, "");
    CHECK_EQ_INT(reward_check_spec(&r, why, sizeof why), GE_INVALID);
    r = spec(REWARD_REGEX, "^[0-9]+$");
    CHECK_EQ_INT(reward_check_spec(&r, why, sizeof why), 0);
    r = spec(REWARD_REGEX, "([a-z]");
    CHECK_EQ_INT(reward_check_spec(&r, why, sizeof why), GE_INVALID);
    CHECK_MSG(strstr(why, "regex") != NULL, "why: %s", why);
    CHECK_MSG(strstr(err_msg(), "regex") != NULL, "err_msg: %s", err_msg());
    const char *good_math[] = {
        "42",   "-2", "1,234", "3.50", "3/4", "$18", "\\frac{1}{3}", "Janet sells 9 eggs.\n#### 18", "so \\boxed{7}",
        " 12 ", "1e3"};
    for (size_t i = 0; i < sizeof good_math / sizeof *good_math; i++) {
        r = spec(REWARD_MATH, good_math[i]);
        CHECK_MSG(reward_check_spec(&r, why, sizeof why) == 0, "'%s' refused: %s", good_math[i], why);
    }
    const char *bad_math[] = {"", "forty-two", "x = 3 and y = 4", "1/0", "inf", "nan", "0x10", "--3"};
    for (size_t i = 0; i < sizeof bad_math / sizeof *bad_math; i++) {
        r = spec(REWARD_MATH, bad_math[i]);
        CHECK_MSG(reward_check_spec(&r, why, sizeof why) == GE_INVALID, "'%s' accepted", bad_math[i]);
    }
    r = spec(REWARD_EXACT, "a");
    r.overlong_len = 64;
    r.overlong_penalty = 1;
    r.max_tokens = 256;
    CHECK_EQ_INT(reward_check_spec(&r, why, sizeof why), 0);
    r.max_tokens = 32; /* buffer longer than the whole response */
    CHECK_EQ_INT(reward_check_spec(&r, why, sizeof why), GE_INVALID);
    CHECK_MSG(strstr(why, "max_tokens") != NULL, "why: %s", why);
    r.max_tokens = 256;
    r.overlong_len = -1;
    CHECK_EQ_INT(reward_check_spec(&r, why, sizeof why), GE_INVALID);
    r.overlong_len = 64;
    r.overlong_penalty = -0.5f;
    CHECK_EQ_INT(reward_check_spec(&r, why, sizeof why), GE_INVALID);
    CHECK_EQ_INT(reward_check_spec(&r, NULL, 0), GE_INVALID); /* why is optional */
}

TEST(test_exact_contains_regex) {
    reward_spec r = spec(REWARD_EXACT, "  Paris\n");
    CHECK_EQ_INT(reward_score(&r, "Paris", 3), 1);
    CHECK_EQ_INT(reward_score(&r, "\t Paris  \n", 3), 1);
    CHECK_EQ_INT(reward_score(&r, "paris", 3), 0);
    CHECK_EQ_INT(reward_score(&r, "Paris.", 3), 0);
    CHECK_EQ_INT(reward_score(&r, "The answer is Paris", 3), 0);
    CHECK_EQ_INT(reward_score(&r, "", 0), 0);
    CHECK_EQ_INT(reward_score(&r, NULL, 0), 0);
    r.case_sensitive = 0;
    CHECK_EQ_INT(reward_score(&r, "PARIS ", 3), 1);
    CHECK_EQ_INT(reward_score(&r, "Pari", 3), 0);
    r = spec(REWARD_EXACT, "");
    CHECK_EQ_INT(reward_score(&r, "  \n", 1), 1);

    r = spec(REWARD_CONTAINS, "Paris");
    CHECK_EQ_INT(reward_score(&r, "I think it is Paris, France.", 9), 1);
    CHECK_EQ_INT(reward_score(&r, "I think it is paris", 9), 0);
    CHECK_EQ_INT(reward_score(&r, "Pari", 9), 0);
    r.case_sensitive = 0;
    CHECK_EQ_INT(reward_score(&r, "I think it is PARIS", 9), 1);

    r = spec(REWARD_REGEX, "^[A-Z][a-z]+ [0-9]{4}$");
    CHECK_EQ_INT(reward_score(&r, "March 2024", 3), 1);
    CHECK_EQ_INT(reward_score(&r, "march 2024", 3), 0);
    CHECK_EQ_INT(reward_score(&r, "March 24", 3), 0);
    r.case_sensitive = 0;
    CHECK_EQ_INT(reward_score(&r, "march 2024", 3), 1);
    r = spec(REWARD_REGEX, "answer: (yes|no)"); /* search semantics: matches anywhere */
    CHECK_EQ_INT(reward_score(&r, "Reasoning... final answer: no.", 8), 1);
    CHECK_EQ_INT(reward_score(&r, "final answer: maybe", 8), 0);
    r = spec(REWARD_REGEX, "([bad"); /* unchecked bad spec scores 0, no crash */
    CHECK_EQ_INT(reward_score(&r, "([bad", 2), 0);

    r = spec(REWARD_NONE, NULL);
    CHECK_EQ_INT(reward_score(&r, "anything", 2), 0);
}

TEST(test_parse_number) {
    struct {
        const char *s;
        double v;
    } ok[] = {
        {"42", 42},
        {"-2", -2},
        {"+7", 7},
        {"1,234", 1234},
        {"1,234,567.5", 1234567.5},
        {"3.50", 3.5},
        {"3/4", 0.75},
        {"-3/4", -0.75},
        {"$18", 18},
        {"\\$18.00", 18},
        {"42.", 42},
        {"  12 \n", 12},
        {".5", 0.5},
        {"50%", 50},
        {"\\frac{3}{4}", 0.75},
        {"-\\dfrac{1}{8}", -0.125},
        {"{12}", 12},
        {"1e3", 1000},
        {"2.5e-1", 0.25},
        {"0", 0},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        double v = -999;
        CHECK_MSG(math_parse_number(ok[i].s, &v), "'%s' not parsed", ok[i].s);
        CHECK_MSG(math_numbers_equal(v, ok[i].v), "'%s' -> %.17g, expected %.17g", ok[i].s, v, ok[i].v);
    }
    const char *bad[] = {"",      " ",   "abc", "12abc", "1/0", "inf", "nan", "0x1A",
                         "1.2.3", "--1", ".",   "3/",    "/4",  "1 2", "e5",  NULL};
    for (int i = 0; bad[i]; i++) {
        double v;
        CHECK_MSG(!math_parse_number(bad[i], &v), "'%s' parsed as %g", bad[i], v);
    }
    CHECK(!math_parse_number(NULL, &(double){0}));
    CHECK(!math_numbers_equal(1450000, 1450001)); /* integers exactly (a GSM8K answer) */
    CHECK(math_numbers_equal(1.0 / 3, 0.333333)); /* others within 1e-6 relative */
    CHECK(!math_numbers_equal(1.0 / 3, 0.33333));
    CHECK(math_numbers_equal(1e9 + 0.5, 1e9 + 1.5));
    CHECK(!math_numbers_equal(1000, 1000.01));
    CHECK(!math_numbers_equal(0, 1e-9));
    CHECK(math_numbers_equal(0.1 + 0.2, 0.3));
}

TEST(test_extract) {
    struct {
        const char *text, *want;
    } cases[] = {
        {"Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs.\n#### 18", "18"},
        {"#### 1,234", "1234"},
        {"#### $5.50.", "5.50"},
        {"#### -3", "-3"},
        {"first #### 3 then #### 4", "4"}, /* the last marker */
        {"#### 18\nThe answer is 20.", "18"}, /* #### wins over later text */
        {"So the total is \\boxed{42}.", "42"},
        {"\\boxed{1} and then \\boxed{\\frac{3}{4}}", "3/4"},
        {"\\boxed{\\$1,000}", "1000"},
        {"\\boxed{x = 12}", "12"}, /* non-numeric box: its last number */
        {"\\boxed{12 \\text{ apples}}", "12"},
        {"We get \\boxed{7 but it never closes", "7"}, /* unclosed box: falls back */
        {"The answer is 7, not 8.", "7"},
        {"THE ANSWER IS: $2,500.", "2500"},
        {"the answer is -4 apples", "-4"},
        {"I computed 3 and 4 so 12.", "12"}, /* last number */
        {"16-3-4=9", "9"},
        {"x-5 = 10", "10"},
        {"total: 3/4 of the cake", "3/4"},
        {"It costs .5 dollars", ".5"},
        {"a 3.14159 value", "3.14159"},
        {"no numbers here", NULL},
        {"", NULL},
        {"#### none", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char out[64];
        int found = math_extract_answer(cases[i].text, out, sizeof out);
        if (!cases[i].want) {
            CHECK_MSG(!found && out[0] == 0, "'%s' -> '%s', expected none", cases[i].text, out);
        } else {
            CHECK_MSG(found, "'%s': nothing found", cases[i].text);
            CHECK_MSG(!strcmp(out, cases[i].want), "'%s' -> '%s', expected '%s'", cases[i].text, out, cases[i].want);
        }
    }
    char small[3];
    CHECK(!math_extract_answer("#### 123456", small, sizeof small) || strlen(small) < 3);
}

TEST(test_math_score) {
    reward_spec r = spec(REWARD_MATH, "1234");
    CHECK_EQ_INT(reward_score(&r, "so #### 1,234", 5), 1);
    CHECK_EQ_INT(reward_score(&r, "The answer is $1234.00.", 5), 1);
    CHECK_EQ_INT(reward_score(&r, "\\boxed{1234}", 5), 1);
    CHECK_EQ_INT(reward_score(&r, "#### 1235", 5), 0);
    CHECK_EQ_INT(reward_score(&r, "1234 is wrong, it is 1243", 5), 0);
    CHECK_EQ_INT(reward_score(&r, "", 0), 0);
    r = spec(REWARD_MATH, "0.75");
    CHECK_EQ_INT(reward_score(&r, "#### 3/4", 5), 1);
    CHECK_EQ_INT(reward_score(&r, "\\boxed{\\frac{3}{4}}", 5), 1);
    r = spec(REWARD_MATH, "3.50");
    CHECK_EQ_INT(reward_score(&r, "the answer is 3.5", 5), 1);
    r = spec(REWARD_MATH, "-2");
    CHECK_EQ_INT(reward_score(&r, "#### -2", 5), 1);
    CHECK_EQ_INT(reward_score(&r, "#### 2", 5), 0);
    /* a whole GSM8K solution as the expected answer */
    r = spec(REWARD_MATH, "She makes 9 * 2 = $<<9*2=18>>18 every day.\n#### 18");
    CHECK_EQ_INT(reward_score(&r, "The answer is 18.", 5), 1);
    CHECK_EQ_INT(reward_score(&r, "The answer is 9.", 5), 0);
}

TEST(test_overlong) {
    /* DAPO: max 20 tokens, buffer 4, factor 1: expected_len 16; 18 tokens -> -(2/4) */
    reward_spec r = spec(REWARD_MATH, "5");
    r.overlong_len = 4;
    r.overlong_penalty = 1.0f;
    r.max_tokens = 20;
    CHECK_CLOSE(reward_score(&r, "#### 5", 10), 1.0, 1e-6, 0);
    CHECK_CLOSE(reward_score(&r, "#### 5", 16), 1.0, 1e-6, 0);
    CHECK_CLOSE(reward_score(&r, "#### 5", 17), 0.75, 1e-6, 0);
    CHECK_CLOSE(reward_score(&r, "#### 5", 18), 0.5, 1e-6, 0);
    CHECK_CLOSE(reward_score(&r, "#### 5", 20), 0.0, 1e-6, 0);
    CHECK_CLOSE(reward_score(&r, "#### 6", 18), -0.5, 1e-6, 0);
    r.overlong_penalty = 0.5f;
    CHECK_CLOSE(reward_score(&r, "#### 5", 20), 0.5, 1e-6, 0);
    CHECK_CLOSE(reward_overlong_penalty(&r, 19), -0.375, 1e-6, 0);
    /* veRL's numbers: max_response_length 4096, buffer 512, factor 1.0, 3840 tokens -> -0.5 */
    r.max_tokens = 4096;
    r.overlong_len = 512;
    r.overlong_penalty = 1.0f;
    CHECK_CLOSE(reward_overlong_penalty(&r, 3840), -0.5, 1e-6, 0);
    CHECK_CLOSE(reward_overlong_penalty(&r, 3584), 0.0, 1e-6, 0);
    CHECK_CLOSE(reward_overlong_penalty(&r, 100), 0.0, 1e-6, 0);
    r.overlong_len = 0; /* off */
    CHECK_CLOSE(reward_overlong_penalty(&r, 5000), 0.0, 0, 0);
}

/* ---------------------------------------------------------------- real GSM8K answers */

TEST(test_gsm8k) {
    FILE *f = fopen(GSM8K_PATH, "r");
    CHECK_MSG(f != NULL, "cannot open %s (tests run from the repo root)", GSM8K_PATH);
    static char line[1 << 16];
    int n = 0, with_commas = 0;
    while (fgets(line, sizeof line, f)) {
        js_doc *doc;
        const js *root;
        if (js_parse(line, strlen(line), &doc, &root)) {
            fclose(f);
            FAILF("line %d: %s", n + 1, err_msg());
        }
        char answer[4096], gold[64], got[64], plus1[64];
        snprintf(answer, sizeof answer, "%s", js_get_str(root, "answer") ? js_get_str(root, "answer") : "");
        js_doc_free(doc);
        n++;
        /* the gold number, read independently: the text after "#### " without commas */
        const char *m = strstr(answer, "#### ");
        if (!m) {
            fclose(f);
            FAILF("line %d: no ####", n);
        }
        int k = 0;
        for (const char *p = m + 5; *p && *p != '\n' && k < 63; p++)
            if (*p != ',') gold[k++] = *p;
        gold[k] = 0;
        with_commas += strchr(m, ',') != NULL;
        int found = math_extract_answer(answer, got, sizeof got);
        if (!found || strcmp(got, gold)) {
            fclose(f);
            FAILF("line %d: extracted '%s', gold '%s'", n, got, gold);
        }
        double g;
        if (!math_parse_number(gold, &g)) {
            fclose(f);
            FAILF("line %d: gold '%s' not a number", n, gold);
        }
        snprintf(plus1, sizeof plus1, "%.17g", g + 1);
        reward_spec self = spec(REWARD_MATH, gold), off = spec(REWARD_MATH, plus1), whole = spec(REWARD_MATH, answer);
        float s1 = reward_score(&self, answer, 100), s0 = reward_score(&off, answer, 100), sw = reward_score(&whole, answer, 100);
        if (s1 != 1.0f || s0 != 0.0f || sw != 1.0f) {
            fclose(f);
            FAILF("line %d (gold %s): score %g vs itself, %g vs %s, %g as a whole", n, gold, s1, s0, plus1, sw);
        }
        if (reward_check_spec(&whole, NULL, 0)) {
            fclose(f);
            FAILF("line %d: %s", n, err_msg());
        }
    }
    fclose(f);
    CHECK_MSG(n >= 1000, "only %d lines in %s", n, GSM8K_PATH);
    printf("# %d GSM8K answers extracted and scored (%d with thousands separators)\n", n, with_commas);
}

/* Hostile input: a 1 MB math answer nesting \frac (or braces) 100,000 deep crashed the HTTP thread
 * (unbounded recursion in normalize and a quadratic brace scan). Now fractions nest at most 16
 * deep and each input is scanned a bounded number of times: the spec is refused, not crashed. */
static char *nested(const char *open, const char *mid, const char *close, int depth) {
    size_t lo = strlen(open), lm = strlen(mid), lc = strlen(close);
    char *s = malloc(lo * depth + lm + lc * depth + 1), *p = s;
    for (int i = 0; i < depth; i++, p += lo) memcpy(p, open, lo);
    memcpy(p, mid, lm);
    p += lm;
    for (int i = 0; i < depth; i++, p += lc) memcpy(p, close, lc);
    *p = 0;
    return s;
}

TEST(test_math_nesting) {
    double v;
    CHECK(math_parse_number("\\frac{{1}}{4}", &v) && v == 0.25);
    char *ok = nested("{", "3", "}", 100000); /* braces alone are dropped: still 3 */
    CHECK_MSG(math_parse_number(ok, &v) && v == 3, "3 in 100000 braces: %g", v);
    free(ok);
    struct {
        const char *open, *mid, *close;
        int depth;
    } bombs[] = {
        {"\\frac{", "1", "}{2}", 100000},     {"\\frac{", "1", "}", 100000},
        {"\\frac{", "", "", 170000},          {"{", "1", "}", 500000},
        {"\\boxed{", "1", "}", 100000},       {"\\boxed{\\frac{", "1", "}{2}}", 50000},
        {"#### \\frac{", "1", "}{2}", 90000},
    };
    for (size_t i = 0; i < sizeof bombs / sizeof bombs[0]; i++) {
        char *s = nested(bombs[i].open, bombs[i].mid, bombs[i].close, bombs[i].depth);
        reward_spec r = spec(REWARD_MATH, s);
        char why[256];
        int rc = reward_check_spec(&r, why, sizeof why);
        CHECK_MSG(rc == 0 || rc == GE_INVALID, "bomb %zu: rc %d", i, rc);
        float sc = reward_score(&r, s, 10);
        CHECK_MSG(sc == 0.0f || sc == 1.0f, "bomb %zu: score %g", i, sc);
        char got[256];
        math_extract_answer(s, got, sizeof got);
        free(s);
    }
    /* found by fuzz_reward: \boxed{ with 17+ nested \frac (or 256+ bytes of content) stopped
     * normalising and returned an unterminated answer, which strlen then read past */
    char *in = nested("\\frac{", "1", "}{2}", 40), *deep = nested("\\boxed{", in, "}", 1);
    free(in);
    char got[64];
    memset(got, 'x', sizeof got);
    CHECK_EQ_INT(math_extract_answer(deep, got, sizeof got) ? (int)strlen(got) < (int)sizeof got : 1, 1);
    reward_spec r = spec(REWARD_MATH, deep);
    int rc = reward_check_spec(&r, NULL, 0); /* falls back to the last number inside */
    CHECK(rc == 0 || rc == GE_INVALID);
    free(deep);
}

/* Hostile input: 25-37-byte patterns drove glibc regcomp to 4-7 GB; exponential backtracking is the
 * other classic. With PCRE2 and its limits each pattern compiles or is refused, and each match
 * ends (as a match or a 0 score) within the match/heap limits. Time and memory are printed
 * (a benchmark figure for the notes, not asserted); the peak RSS is bounded loosely. */
TEST(test_regex_bombs) {
    static const char *const bombs[] = {
        "((a{1,100}){1,100}){1,100}",
        "(((a{100}){100}){100}){100}",
        "((((((((((a*)*)*)*)*)*)*)*)*)*)*$",
        "(a+)+$",
        "(a|aa)+$",
        "(.*a){20}",
        "(a|a?)+b",
        "(\\w+\\s?)+$",
        "^(a+)+b",
        "(x+x+)+y",
        "(?:a|b|ab|ba)*c",
        "(a*)*b",
        "((a+)+)+c",
        "a{65535}",
        "(?R)",
        "(a(?1)?b)",
        "\\1(a)",
    };
    size_t tl = 16384;
    char *text = malloc(tl + 2);
    memset(text, 'a', tl);
    text[tl] = '!';
    text[tl + 1] = 0;
    struct rusage u0, u1;
    getrusage(RUSAGE_SELF, &u0);
    double worst = 0;
    int refused = 0;
    for (size_t i = 0; i < sizeof bombs / sizeof *bombs; i++) {
        reward_spec r = spec(REWARD_REGEX, bombs[i]);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        char why[256];
        if (reward_check_spec(&r, why, sizeof why)) refused++;
        float sc = reward_score(&r, text, 10);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6;
        if (ms > worst) worst = ms;
        CHECK_MSG(sc == 0.0f || sc == 1.0f, "pattern %s: score %g", bombs[i], sc);
    }
    free(text);
    getrusage(RUSAGE_SELF, &u1);
    printf("# %zu regex bombs (%d refused at compile) on a 16 KiB text: worst %.1f ms, max RSS %ld MiB\n",
           sizeof bombs / sizeof *bombs, refused, worst, u1.ru_maxrss >> 10);
    CHECK_MSG(u1.ru_maxrss < 512 * 1024, "max RSS %ld KiB", u1.ru_maxrss);
    (void)u0;
    reward_spec big = spec(REWARD_REGEX, NULL); /* longer than the pattern limit: refused */
    char *p = malloc(5000);
    memset(p, 'a', 4999);
    p[4999] = 0;
    big.answer = p;
    CHECK_EQ_INT(reward_check_spec(&big, NULL, 0), GE_INVALID);
    free(p);
}

int main(void) {
    RUN(test_parse_type);
    RUN(test_check_spec);
    RUN(test_exact_contains_regex);
    RUN(test_parse_number);
    RUN(test_extract);
    RUN(test_math_score);
    RUN(test_overlong);
    RUN(test_gsm8k);
    RUN(test_math_nesting);
    RUN(test_regex_bombs);
    return CHECK_DONE();
}
