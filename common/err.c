/* err.c — names and messages of the error list, and the per-thread detail. */
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const names[] = {
#define X_(N, s, m) s,
    GE_ERRORS(X_)
#undef X_
};
static const char *const msgs[] = {
#define X_(N, s, m) m,
    GE_ERRORS(X_)
#undef X_
};

static _Thread_local char last_msg[1024];
static _Thread_local int last_code;

static int idx(int code) { return (code <= 0 && -code < GE_COUNT_) ? -code : GE_INTERNAL_I; }
const char *err_name(int code) { return names[idx(code)]; }
const char *err_default(int code) { return msgs[idx(code)]; }

/* Formats into a local buffer first: callers often wrap the last message,
 * err_set(rc, "%s: %s", path, err_msg()), whose argument is last_msg itself. */
int err_set(int code, const char *fmt, ...) {
    char msg[sizeof last_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_msg, msg, sizeof msg);
    last_code = code;
    return code;
}
const char *err_msg(void) { return last_code ? last_msg : ""; }
int err_code(void) { return last_code; }
void err_clear(void) {
    last_code = 0;
    last_msg[0] = 0;
}
