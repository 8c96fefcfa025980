/* fuzz_reward.c — libFuzzer target over the built-in verifiers (api/reward.c): every reward type's
 * spec check, its score of a response, and the math answer extraction. Input: byte 0 picks the
 * type (and case sensitivity), then answer NUL response. Each call must end within the
 * verifiers' bounds (nesting depth, PCRE2 match limits) and return a score of 0 or 1 plus
 * shaping; never crash or overflow. Built by `make fuzz` (ASan + UBSan). */
#include <assert.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/reward.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    char *buf = malloc(size + 1);
    memcpy(buf, data + 1, size - 1);
    buf[size - 1] = 0;
    const char *answer = buf, *text = buf + strlen(buf);
    if (text < buf + size - 1) text++; /* the part after the first NUL */
    reward_spec r = {.type = (reward_type)(data[0] % 5),
                     .answer = answer,
                     .case_sensitive = (data[0] >> 3) & 1,
                     .overlong_len = (data[0] >> 4) & 1 ? 4.0f : 0.0f,
                     .overlong_penalty = 1.0f,
                     .max_tokens = 16};
    char why[256];
    int rc = reward_check_spec(&r, why, sizeof why);
    assert(rc == 0 || why[0]);
    float sc = reward_score(&r, text, (int)(size % 32));
    assert(isfinite(sc) && sc <= 1.0f);
    char out[256];
    if (math_extract_answer(text, out, sizeof out)) assert(strlen(out) < sizeof out);
    double v;
    math_parse_number(answer, &v);
    free(buf);
    return 0;
}
