/* reward.c — built-in verifiers (exact, contains, regex, math) and DAPO overlong shaping.
 *
 * The math verifier follows the GSM8K convention ("#### N" ends a solution) and the common
 * fallbacks of math RL recipes (\boxed{}, "the answer is N", the last number), then compares
 * numerically, so "1,234", "1234.0" and "$1234." all equal 1234. Everything here is plain
 * byte-level C over NUL-terminated strings; no allocation. */
#include "api/reward.h"
#include "common/err.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REWARD_MAX_PATTERN 4096
#define MATH_BUF 256
/* \frac nesting a math answer may use: each level rescans its braces, so the bound keeps
 * normalisation linear in the text (at most MATH_MAX_NEST passes) and the recursion shallow. */
#define MATH_MAX_NEST 16

/* ---------------------------------------------------------------- small string helpers */

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Trims surrounding whitespace: [*b, *e). */
static void trim(const char *s, const char **b, const char **e) {
    const char *p = s, *q = s + strlen(s);
    while (p < q && is_space(*p)) p++;
    while (q > p && is_space(q[-1])) q--;
    *b = p;
    *e = q;
}

static int bytes_equal(const char *a, const char *b, size_t n, int case_sensitive) {
    if (case_sensitive) return memcmp(a, b, n) == 0;
    for (size_t i = 0; i < n; i++)
        if (tolower((unsigned char)a[i]) != tolower((unsigned char)b[i])) return 0;
    return 1;
}

/* First occurrence of needle[0..nn) in hay[0..nh), or NULL. */
static const char *find_bytes(const char *hay, size_t nh, const char *needle, size_t nn, int cs) {
    if (nn == 0) return hay;
    for (size_t i = 0; i + nn <= nh; i++)
        if (bytes_equal(hay + i, needle, nn, cs)) return hay + i;
    return NULL;
}

/* Last occurrence of needle in s (case-insensitive when cs = 0), or NULL. */
static const char *find_last(const char *s, const char *needle, int cs) {
    size_t ns = strlen(s), nn = strlen(needle);
    for (size_t i = ns >= nn ? ns - nn + 1 : 0; i-- > 0;)
        if (bytes_equal(s + i, needle, nn, cs)) return s + i;
    return NULL;
}

static void set_why(char *why, int whylen, const char *msg) {
    if (why && whylen > 0) snprintf(why, (size_t)whylen, "%s", msg);
}

/* ---------------------------------------------------------------- numbers in text */

/* Finds the next number token in [p, end) of a text starting at base: an optional sign (only
 * where a minus cannot be an operator: not after a letter, digit or closing bracket), digits
 * with commas between digit groups, a decimal part, a fraction "/digits". A trailing '.' is not
 * part of it. Returns the token's start and sets *tok_end, or returns NULL. */
static const char *next_number(const char *base, const char *p, const char *end, const char **tok_end) {
    for (; p < end; p++) {
        const char *s = p, *q = p;
        char prev = p > base ? p[-1] : ' ';
        if (*q == '-' && q + 1 < end && (is_digit(q[1]) || (q[1] == '.' && q + 2 < end && is_digit(q[2]))) &&
            !isalnum((unsigned char)prev) && prev != ')' && prev != ']' && prev != '}' && prev != '.') {
            q++;
        } else if (!(is_digit(*q) || (*q == '.' && q + 1 < end && is_digit(q[1]) && !is_digit(prev)))) {
            continue;
        }
        while (q < end && (is_digit(*q) || (*q == ',' && q > s && is_digit(q[-1]) && q + 1 < end && is_digit(q[1])))) q++;
        if (q + 1 < end && *q == '.' && is_digit(q[1])) {
            q++;
            while (q < end && is_digit(*q)) q++;
        }
        if (q + 1 < end && *q == '/' && is_digit(q[1])) {
            q++;
            while (q < end && is_digit(*q)) q++;
        }
        *tok_end = q;
        return s;
    }
    return NULL;
}

/* Copies [b, e) to out without commas. Returns 1 if it fit. */
static int copy_number(const char *b, const char *e, char *out, int outlen) {
    int n = 0;
    for (const char *p = b; p < e; p++) {
        if (*p == ',') continue;
        if (n + 1 >= outlen) return 0;
        out[n++] = *p;
    }
    out[n] = 0;
    return 1;
}

static int first_number(const char *base, const char *p, const char *end, char *out, int outlen) {
    const char *te, *t = next_number(base, p, end, &te);
    return t && copy_number(t, te, out, outlen);
}

static int last_number(const char *base, const char *p, const char *end, char *out, int outlen) {
    const char *te, *t, *lb = NULL, *le = NULL;
    while ((t = next_number(base, p, end, &te))) {
        lb = t;
        le = te;
        p = te;
    }
    return lb && copy_number(lb, le, out, outlen);
}

/* ---------------------------------------------------------------- LaTeX-ish normalisation */

/* Matches the brace group starting at p ('{'); returns the position after its '}' or NULL. */
static const char *brace_end(const char *p, const char *end) {
    int depth = 0;
    for (; p < end; p++) {
        if (*p == '{') depth++;
        else if (*p == '}' && --depth == 0) return p + 1;
    }
    return NULL;
}

static int starts(const char *p, const char *end, const char *lit) {
    size_t n = strlen(lit);
    return (size_t)(end - p) >= n && memcmp(p, lit, n) == 0;
}

/* Writes [p, end) to out[*n..] without whitespace (but one space between digits), '$', "\$", "\%", '%', thin spaces, \left,
 * \right, braces and commas between digits, turning \frac{a}{b} (and \dfrac, \tfrac) into a/b.
 * Returns 0 if out would overflow or fractions nest deeper than MATH_MAX_NEST. */
static int normalize_at(const char *p, const char *end, char *out, int outlen, int *n, int depth) {
    static const char *const drop[] = {"\\left", "\\right", "\\$", "\\%", "\\!", "\\,", "\\;", "\\ ", NULL};
    static const char *const fracs[] = {"\\frac", "\\dfrac", "\\tfrac", NULL};
    while (p < end) {
        int skipped = 0;
        for (int i = 0; fracs[i]; i++) {
            size_t k = strlen(fracs[i]);
            if (!starts(p, end, fracs[i]) || p + k >= end || p[k] != '{') continue;
            const char *a = p + k, *ae = brace_end(a, end);
            if (!ae || ae >= end || *ae != '{') break;
            const char *be = brace_end(ae, end);
            if (!be) break;
            if (depth >= MATH_MAX_NEST || !normalize_at(a + 1, ae - 1, out, outlen, n, depth + 1)) return 0;
            if (*n + 1 >= outlen) return 0;
            out[(*n)++] = '/';
            if (!normalize_at(ae + 1, be - 1, out, outlen, n, depth + 1)) return 0;
            p = be;
            skipped = 1;
            break;
        }
        for (int i = 0; !skipped && drop[i]; i++)
            if (starts(p, end, drop[i])) {
                p += strlen(drop[i]);
                skipped = 1;
            }
        if (skipped) continue;
        char c = *p;
        if (is_space(c) && *n > 0 && is_digit(out[*n - 1])) {
            /* "1 2" is two numbers, not 12: keep one space between digits so parsing fails */
            const char *q = p;
            while (q < end && is_space(*q)) q++;
            if (q < end && is_digit(*q)) {
                if (*n + 1 >= outlen) return 0;
                out[(*n)++] = ' ';
            }
            p = q;
            continue;
        }
        if (is_space(c) || c == '$' || c == '%' || c == '{' || c == '}' ||
            (c == ',' && *n > 0 && is_digit(out[*n - 1]) && p + 1 < end && is_digit(p[1]))) {
            p++;
            continue;
        }
        if (*n + 1 >= outlen) return 0;
        out[(*n)++] = c;
        p++;
    }
    out[*n] = 0;
    return 1;
}

static int normalize(const char *p, const char *end, char *out, int outlen, int *n) {
    int ok = normalize_at(p, end, out, outlen, n, 0);
    out[*n] = 0; /* terminated on failure too (*n < outlen always) */
    return ok;
}

/* digits [. digits] | . digits, then [e[+-]digits]; returns the end or NULL. */
static const char *scan_unsigned(const char *p) {
    const char *s = p;
    while (is_digit(*p)) p++;
    if (*p == '.') {
        p++;
        while (is_digit(*p)) p++;
    }
    if (p == s || (p == s + 1 && *s == '.')) return NULL;
    if ((*p == 'e' || *p == 'E') && (is_digit(p[1]) || ((p[1] == '+' || p[1] == '-') && is_digit(p[2])))) {
        p += 2;
        while (is_digit(*p)) p++;
    }
    return p;
}

int math_parse_number(const char *s, double *out) {
    char buf[MATH_BUF];
    int n = 0;
    if (!s || !normalize(s, s + strlen(s), buf, sizeof buf, &n)) return 0;
    while (n > 0 && buf[n - 1] == '.') buf[--n] = 0; /* "42." ends a sentence */
    const char *p = buf;
    double sign = 1;
    if (*p == '+' || *p == '-') sign = *p++ == '-' ? -1 : 1;
    const char *e = scan_unsigned(p);
    if (!e) return 0;
    double v = strtod(p, NULL);
    if (*e == '/') {
        const char *d = e + 1, *de = scan_unsigned(d);
        if (!de || *de) return 0;
        double den = strtod(d, NULL);
        if (den == 0) return 0;
        v /= den;
    } else if (*e) {
        return 0;
    }
    if (!isfinite(v)) return 0;
    *out = sign * v;
    return 1;
}

/* Integers compare exactly: GSM8K answers reach millions, where 1e-6 relative is more than 1
 * (1450000 vs 1450001). Otherwise a relative tolerance lets "0.333333" equal 1/3. */
int math_numbers_equal(double a, double b) {
    if (a == b) return 1;
    if (a == floor(a) && b == floor(b)) return 0;
    return fabs(a - b) <= 1e-6 * fmax(fabs(a), fabs(b));
}

/* ---------------------------------------------------------------- answer extraction */

/* The content of the last \boxed{...} (or \fbox{...}), normalised; a non-numeric content
 * falls back to its last number. */
static int boxed_answer(const char *text, char *out, int outlen) {
    const char *b = find_last(text, "\\boxed", 1), *f = find_last(text, "\\fbox", 1);
    const char *m = !b ? f : !f ? b : (b > f ? b : f);
    if (!m) return 0;
    const char *p = m + (m == b ? 6 : 5), *end = text + strlen(text);
    while (p < end && *p == ' ') p++;
    if (p >= end || *p != '{') return 0;
    const char *be = brace_end(p, end);
    if (!be) return 0; /* truncated: \boxed{ never closed */
    int n = 0;
    double v;
    int whole = normalize(p + 1, be - 1, out, outlen, &n);
    if (whole) {
        while (n > 0 && out[n - 1] == '.') out[--n] = 0;
        if (n > 0 && math_parse_number(out, &v)) return 1;
    }
    if (last_number(text, p + 1, be - 1, out, outlen)) return 1;
    /* non-numeric content, normalised whole; a normalisation that stopped (too long, nested
     * too deep) leaves a prefix that is no answer, not always NUL-terminated: out is emptied */
    if (whole && n > 0) return 1;
    out[0] = 0;
    return 0;
}

/* strict: only the explicit markers (####, \boxed) — used for expected answers */
static int extract(const char *text, char *out, int outlen, int strict) {
    if (!text || !out || outlen <= 0) return 0;
    out[0] = 0;
    const char *end = text + strlen(text), *m;
    if ((m = find_last(text, "####", 1)) && first_number(text, m + 4, end, out, outlen)) return 1;
    if (boxed_answer(text, out, outlen)) return 1;
    out[0] = 0;
    if (strict) return 0;
    if ((m = find_last(text, "answer is", 0)) && first_number(text, m + 9, end, out, outlen)) return 1;
    if (last_number(text, text, end, out, outlen)) return 1;
    out[0] = 0;
    return 0;
}

int math_extract_answer(const char *text, char *out, int outlen) { return extract(text, out, outlen, 0); }

/* The expected value of a math spec: a number, or a solution with "#### N" or \boxed{N}. */
static int math_expected(const char *answer, double *v) {
    char buf[MATH_BUF];
    if (!answer) return 0;
    if (math_parse_number(answer, v)) return 1;
    return extract(answer, buf, sizeof buf, 1) && math_parse_number(buf, v);
}

/* ---------------------------------------------------------------- regular expressions */

/* PCRE2 without JIT, on bytes (no UTF), with limits that bound any pattern of at most
 * REWARD_MAX_PATTERN bytes against any response: compiled code is at most 64 KiB (link size 2),
 * parentheses nest at most REGEX_NEST deep, and a match stops (as no match) after
 * REGEX_MATCH_LIMIT backtracking steps or REGEX_HEAP_LIMIT_KIB of backtracking memory.
 * glibc regcomp, used before, took 4-7 GB for some 30-byte patterns. */
#define REGEX_NEST 64
#define REGEX_MATCH_LIMIT 1000000
#define REGEX_DEPTH_LIMIT 10000
#define REGEX_HEAP_LIMIT_KIB 8192

static pcre2_code *regex_compile(const reward_spec *r, char *why, int whylen) {
    pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
    if (!cc) {
        set_why(why, whylen, "out of memory");
        return NULL;
    }
    pcre2_set_max_pattern_length(cc, REWARD_MAX_PATTERN);
    pcre2_set_parens_nest_limit(cc, REGEX_NEST);
    int ec;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)r->answer, PCRE2_ZERO_TERMINATED,
                                   PCRE2_NEVER_UTF | PCRE2_NEVER_UCP | (r->case_sensitive ? 0 : PCRE2_CASELESS), &ec, &off, cc);
    pcre2_compile_context_free(cc);
    if (!re && why && whylen > 0) {
        PCRE2_UCHAR e[160];
        pcre2_get_error_message(ec, e, sizeof e);
        snprintf(why, (size_t)whylen, "%s at offset %zu", (const char *)e, (size_t)off);
    }
    return re;
}

/* ---------------------------------------------------------------- specs and scores */

static const char *const type_names[] = {"none", "exact", "math", "regex", "contains"};

int reward_parse_type(const char *s, reward_type *out) {
    for (int i = 0; s && i < 5; i++)
        if (!strcmp(s, type_names[i])) {
            *out = (reward_type)i;
            return 0;
        }
    return err_set(GE_INVALID, "unknown reward type '%.64s' (exact|math|regex|contains|none)", s ? s : "(null)");
}

const char *reward_type_name(reward_type t) { return (unsigned)t < 5 ? type_names[t] : "unknown"; }

int reward_check_spec(const reward_spec *r, char *why, int whylen) {
    char msg[320];
    msg[0] = 0;
    if ((unsigned)r->type > REWARD_CONTAINS) {
        snprintf(msg, sizeof msg, "unknown reward type %d", (int)r->type);
    } else if (r->type != REWARD_NONE && !r->answer) {
        snprintf(msg, sizeof msg, "reward type %s needs an answer", type_names[r->type]);
    } else if (r->type == REWARD_CONTAINS && !r->answer[0]) {
        snprintf(msg, sizeof msg, "the answer of a contains reward must not be empty");
    } else if (r->type == REWARD_REGEX) {
        if (strlen(r->answer) > REWARD_MAX_PATTERN) {
            snprintf(msg, sizeof msg, "regex is longer than %d bytes", REWARD_MAX_PATTERN);
        } else {
            char e[200];
            pcre2_code *re = regex_compile(r, e, sizeof e);
            if (!re) snprintf(msg, sizeof msg, "regex does not compile: %s", e);
            pcre2_code_free(re);
        }
    } else if (r->type == REWARD_MATH) {
        double v;
        if (!math_expected(r->answer, &v))
            snprintf(msg, sizeof msg,
                     "math answer '%.64s' is not a number (nor a solution ending in "
                     "\"#### N\" or \\boxed{N})",
                     r->answer);
    }
    if (!msg[0]) {
        if (!(r->overlong_len >= 0) || !isfinite(r->overlong_len)) snprintf(msg, sizeof msg, "overlong_buffer.len must be >= 0");
        else if (!(r->overlong_penalty >= 0) || !isfinite(r->overlong_penalty))
            snprintf(msg, sizeof msg, "overlong_buffer.penalty_factor must be >= 0");
        else if (r->overlong_len > 0 && r->max_tokens <= 0) snprintf(msg, sizeof msg, "overlong shaping needs max_tokens > 0");
        else if (r->overlong_len > (float)r->max_tokens && r->overlong_len > 0)
            snprintf(msg, sizeof msg, "overlong_buffer.len (%g) exceeds max_tokens (%d)", (double)r->overlong_len, r->max_tokens);
    }
    if (!msg[0]) {
        set_why(why, whylen, "");
        return 0;
    }
    set_why(why, whylen, msg);
    return err_set(GE_INVALID, "%s", msg);
}

float reward_overlong_penalty(const reward_spec *r, int n_tokens) {
    if (!(r->overlong_len > 0) || r->max_tokens <= 0) return 0.0f;
    double expected_len = (double)r->max_tokens - r->overlong_len;
    double exceed = (double)n_tokens - expected_len;
    double pen = -exceed / r->overlong_len * r->overlong_penalty;
    return pen < 0 ? (float)pen : 0.0f;
}

static int score_exact(const reward_spec *r, const char *text) {
    const char *tb, *te, *ab, *ae;
    trim(text, &tb, &te);
    trim(r->answer, &ab, &ae);
    return te - tb == ae - ab && bytes_equal(tb, ab, (size_t)(te - tb), r->case_sensitive);
}

static int score_regex(const reward_spec *r, const char *text) {
    pcre2_code *re = regex_compile(r, NULL, 0);
    pcre2_match_context *mc = re ? pcre2_match_context_create(NULL) : NULL;
    pcre2_match_data *md = mc ? pcre2_match_data_create(1, NULL) : NULL;
    int rc = -1;
    if (md) {
        pcre2_set_match_limit(mc, REGEX_MATCH_LIMIT);
        pcre2_set_depth_limit(mc, REGEX_DEPTH_LIMIT);
        pcre2_set_heap_limit(mc, REGEX_HEAP_LIMIT_KIB);
        rc = pcre2_match(re, (PCRE2_SPTR)text, strlen(text), 0, 0, md, mc);
    }
    pcre2_match_data_free(md);
    pcre2_match_context_free(mc);
    pcre2_code_free(re);
    return rc >= 0; /* no match, and a match over its limits, score 0 */
}

static int score_math(const reward_spec *r, const char *text) {
    char got[MATH_BUF];
    double want, v;
    return math_expected(r->answer, &want) && math_extract_answer(text, got, sizeof got) && math_parse_number(got, &v) &&
        math_numbers_equal(v, want);
}

float reward_score(const reward_spec *r, const char *text, int n_tokens) {
    if (!text) text = "";
    int ok = 0;
    if (r->answer) {
        switch (r->type) {
        case REWARD_EXACT: ok = score_exact(r, text); break;
        case REWARD_CONTAINS:
            ok = r->answer[0] && find_bytes(text, strlen(text), r->answer, strlen(r->answer), r->case_sensitive);
            break;
        case REWARD_REGEX: ok = score_regex(r, text); break;
        case REWARD_MATH: ok = score_math(r, text); break;
        case REWARD_NONE: break;
        }
    }
    return (ok ? 1.0f : 0.0f) + reward_overlong_penalty(r, n_tokens);
}
