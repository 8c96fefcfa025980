/* test_guided.c — constrained decoding through the scheduler on the cpu backend (embedded default
 * model, whose random weights write garbage unguided): 16 guided responses are each a JSON object
 * then the suffix then EOS within max_tokens, and an unguided job sharing the steps (and the
 * sampler calls) with them draws the tokens it draws alone (tests/unit/guided_run.h). */
#include <stdio.h>

#include "check.h"
#include "default_engine.h"
#include "tests/unit/guided_run.h"

#define MODEL TEST_TMP "/grpod_test_guided_model"

TEST(guided_responses_parse_and_unguided_unchanged) {
    eng *e = default_engine(MODEL);
    CHECK_MSG(e, "%s", err_msg());
    guided_result r;
    int rc = guided_run(e, &r);
    CHECK_MSG(rc == 0, "%s", err_msg());
    printf("  %d of %d guided responses complete; %d of %d unguided beside them as alone\n", r.complete, r.responses,
           r.beside_same, r.beside);
    CHECK_EQ_INT(r.responses, GR_GROUPS * GR_N);
    CHECK_EQ_INT(r.complete, r.responses);
    CHECK_EQ_INT(r.beside, GR_GROUPS * GR_N);
    CHECK_EQ_INT(r.beside_same, r.beside);
    eng_close(e);
}

int main(void) {
    RUN(guided_responses_parse_and_unguided_unchanged);
    return CHECK_DONE();
}
