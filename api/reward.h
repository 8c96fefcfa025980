/* reward.h — grpod's built-in verifiers: score one response text against a group's reward spec.
 * In api/, not engine/: the regex verifier links PCRE2, which the engine library must not need.
 *
 * Pure text functions: no JSON (the api layer passes parsed fields), no model, no allocation
 * that outlives a call; safe from any thread.
 *
 *   exact     the response, stripped of surrounding whitespace, equals the answer (also stripped)
 *   contains  the answer occurs in the response
 *   regex     the PCRE2 (Perl-compatible) pattern `answer` matches somewhere in the response's
 *             bytes; a pattern is at most 4096 bytes, nests parentheses at most 64 deep, and a
 *             match that passes PCRE2's match/depth/heap limits counts as no match
 *   math      GSM8K-style: math_extract_answer(response) compared numerically with the answer
 *             ("1,234" = 1234, "3.50" = 3.5, "3/4" = 0.75; integers exactly, others
 *             within a relative 1e-6)
 *   none      no verifier: the score is 0 (plus overlong shaping, if configured)
 *
 * case_sensitive applies to exact, contains and regex (PCRE2_CASELESS); ASCII letters only. A
 * zero-initialised spec is case-insensitive: callers set it (the API's default is 1).
 *
 * Overlong shaping as DAPO / veRL's overlong_buffer: expected_len = max_tokens - overlong_len,
 * exceed = n_tokens - expected_len, score += min(-exceed / overlong_len * overlong_penalty, 0).
 * Off when overlong_len is 0. */
#ifndef GRPOD_API_REWARD_H
#define GRPOD_API_REWARD_H

typedef enum { REWARD_NONE, REWARD_EXACT, REWARD_MATH, REWARD_REGEX, REWARD_CONTAINS } reward_type;

typedef struct {
    reward_type type;
    const char *answer; /* exact/math/contains: expected text/number; regex: the pattern */
    int case_sensitive; /* exact/contains/regex; the API defaults it to 1 */
    float overlong_len; /* DAPO overlong_buffer.len (0 = off) */
    float overlong_penalty; /* DAPO overlong_buffer.penalty_factor */
    int max_tokens; /* the rollout's max_tokens (for overlong shaping) */
} reward_spec;

/* "exact" | "math" | "regex" | "contains" | "none" -> *out; GE_INVALID otherwise. */
int reward_parse_type(const char *s, reward_type *out);
const char *reward_type_name(reward_type t);

/* 0 when the spec can be scored; else GE_INVALID with the reason in why (and err_msg()):
 * a missing answer, a regex that does not compile, a math answer that is not a number
 * (a bare number, or text with "#### N" or \boxed{N}, such as a GSM8K solution), overlong
 * settings out of range. */
int reward_check_spec(const reward_spec *r, char *why, int whylen);

/* 1.0 (correct) or 0.0, plus overlong shaping for a response of n_tokens tokens.
 * A spec that fails reward_check_spec scores 0 (plus shaping). */
float reward_score(const reward_spec *r, const char *text, int n_tokens);

/* The overlong shaping term alone (<= 0). */
float reward_overlong_penalty(const reward_spec *r, int n_tokens);

/* GSM8K-style final answer of a response: the first number after the last "####", else the
 * content of the last \boxed{...}, else the first number after the last "answer is", else the
 * last number in the text. Commas, '$' and a trailing '.' are stripped; \frac{a}{b} becomes
 * a/b. Writes a NUL-terminated string to out and returns 1, or returns 0 (out = "") if the
 * text has none. */
int math_extract_answer(const char *text, char *out, int outlen);

/* Parses a number as math answers write it: optional sign, '$', commas between digits, a
 * decimal part, an exponent, a trailing '.' or '%', a fraction a/b or \frac{a}{b}, surrounding
 * whitespace. Returns 1 and *out, or 0 if s is not one number. */
int math_parse_number(const char *s, double *out);

/* Integers: a == b. Otherwise |a - b| <= 1e-6 * max(|a|, |b|) (so 0.333333 equals 1/3). */
int math_numbers_equal(double a, double b);
#endif
