/* test_tune.c — engine/backend/tune.c: the GRPOD_TUNE_* environment over the defaults, every knob and
 * word, and the errors (an unknown knob, a bad value) naming the variable. */
#include "tests/unit/check.h"
#include "common/err.h"
#include "engine/backend/backend.h"

static void clear_env(void) {
    const char *names[] = {"GRAPHS", "PDL", "ATTN_DECODE", "ATTN", "SKINNY", "MOE", "EXACT", "DELTANET", "ATTN_SIMD", "BOGUS"};
    char n[64];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(n, sizeof n, "GRPOD_TUNE_%s", names[i]);
        unsetenv(n);
    }
}

TEST(tune_defaults_without_env) {
    clear_env();
    tune_opts t;
    memset(&t, 0x55, sizeof t);
    CHECK_EQ_INT(tune_from_env(&t), 0);
    CHECK_EQ_INT(t.graphs, 1);
    CHECK_EQ_INT(t.pdl, 1);
    CHECK_EQ_INT(t.attn_decode, 1);
    CHECK_EQ_INT(t.attn, TUNE_ATTN_AUTO);
    CHECK_EQ_INT(t.skinny, TUNE_SKINNY_AUTO);
    CHECK_EQ_INT(t.moe, TUNE_MOE_AUTO);
    CHECK_EQ_INT(t.exact, 0);
    CHECK_EQ_INT(t.deltanet, TUNE_DN_CHUNKED);
}

TEST(tune_every_knob) {
    clear_env();
    setenv("GRPOD_TUNE_GRAPHS", "0", 1);
    setenv("GRPOD_TUNE_PDL", "0", 1);
    setenv("GRPOD_TUNE_ATTN_DECODE", "0", 1);
    setenv("GRPOD_TUNE_ATTN", "simt", 1);
    setenv("GRPOD_TUNE_SKINNY", "1", 1);
    setenv("GRPOD_TUNE_MOE", "tiles", 1);
    setenv("GRPOD_TUNE_EXACT", "1", 1);
    setenv("GRPOD_TUNE_DELTANET", "recurrent", 1);
    tune_opts t;
    CHECK_EQ_INT(tune_from_env(&t), 0);
    CHECK_EQ_INT(t.exact, 1);
    CHECK_EQ_INT(t.graphs, 0);
    CHECK_EQ_INT(t.pdl, 0);
    CHECK_EQ_INT(t.attn_decode, 0);
    CHECK_EQ_INT(t.attn, TUNE_ATTN_SIMT);
    CHECK_EQ_INT(t.skinny, TUNE_SKINNY_FORCE);
    CHECK_EQ_INT(t.moe, TUNE_MOE_TILES);
    CHECK_EQ_INT(t.exact, 1);
    CHECK_EQ_INT(t.deltanet, TUNE_DN_RECURRENT);
    setenv("GRPOD_TUNE_MOE", "grouped", 1);
    CHECK_EQ_INT(tune_from_env(&t), 0);
    CHECK_EQ_INT(t.moe, TUNE_MOE_GROUPED);
    setenv("GRPOD_TUNE_MOE", "cublas", 1); /* the fourth word of a knob */
    CHECK_EQ_INT(tune_from_env(&t), 0);
    CHECK_EQ_INT(t.moe, TUNE_MOE_CUBLAS);
    setenv("GRPOD_TUNE_SKINNY", "0", 1);
    setenv("GRPOD_TUNE_ATTN", "auto", 1);
    CHECK_EQ_INT(tune_from_env(&t), 0);
    CHECK_EQ_INT(t.skinny, TUNE_SKINNY_OFF);
    CHECK_EQ_INT(t.attn, TUNE_ATTN_AUTO);
    CHECK_EQ_INT(t.graphs, 0);
    clear_env();
}

TEST(tune_errors_name_the_variable) {
    clear_env();
    tune_opts t;
    setenv("GRPOD_TUNE_SKINNY", "yes", 1);
    CHECK_EQ_INT(tune_from_env(&t), GE_INVALID);
    CHECK_MSG(strstr(err_msg(), "GRPOD_TUNE_SKINNY=yes") && strstr(err_msg(), "auto|0|1"), "%s", err_msg());
    unsetenv("GRPOD_TUNE_SKINNY");
    setenv("GRPOD_TUNE_ATTN_SIMD", "1", 1); /* a typo: not ATTN, not ATTN_DECODE */
    CHECK_EQ_INT(tune_from_env(&t), GE_INVALID);
    CHECK_MSG(strstr(err_msg(), "GRPOD_TUNE_ATTN_SIMD"), "%s", err_msg());
    unsetenv("GRPOD_TUNE_ATTN_SIMD");
    setenv("GRPOD_TUNE_ATTN", "", 1);
    CHECK_EQ_INT(tune_from_env(&t), GE_INVALID);
    clear_env();
    err_clear();
}

int main(void) {
    RUN(tune_defaults_without_env);
    RUN(tune_every_knob);
    RUN(tune_errors_name_the_variable);
    return CHECK_DONE();
}
