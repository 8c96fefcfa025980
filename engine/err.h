/* err.h — grpod's error codes: one list generates the enum, the name, the message and the
 * HTTP status (X-macro), as libuv does. Functions return 0 (GE_OK) or a negative code; the
 * detail of the last error on this thread is in err_msg(), set by err_set().
 *
 * Two tiers (STYLE.md): a broken invariant asserts; a recoverable problem (bad input, a corrupt
 * file, out of memory, a CUDA failure) returns a code with a message and the caller decides. */
#ifndef GRPOD_ERR_H
#define GRPOD_ERR_H

/*  X(NAME,            name string,        HTTP, default message) */
#define GE_ERRORS(X) \
    X(OK,              "ok",               200, "ok") \
    X(INVALID,         "invalid_field",    400, "invalid request field") \
    X(BAD_JSON,        "invalid_json",     400, "request body is not valid JSON") \
    X(UNAUTHORIZED,    "unauthorized",     401, "missing or wrong API key") \
    X(NOT_FOUND,       "not_found",        404, "not found") \
    X(METHOD,          "method_not_allowed", 405, "method not allowed") \
    X(CONFLICT,        "conflict",         409, "conflict") \
    X(TOO_LARGE,       "too_large",        413, "request too large") \
    X(UNSUPPORTED,     "unsupported",      422, "unsupported") \
    X(BUSY,            "queue_full",       429, "too many queued jobs") \
    X(IO,              "io_error",         500, "i/o error") \
    X(FORMAT,          "bad_format",       500, "malformed file") \
    X(NOMEM,           "out_of_memory",    507, "out of memory") \
    X(CUDA,            "cuda_error",       500, "CUDA error") \
    X(STORE,           "store_error",      500, "database error") \
    X(INTERNAL,        "internal",         500, "internal error") \
    X(UNAVAILABLE,     "unavailable",      503, "not ready")

typedef enum {
#define GE_ENUM_(N, s, h, m) GE_##N##_I,
    GE_ERRORS(GE_ENUM_)
#undef GE_ENUM_
    GE_COUNT_
} ge_index;

/* Error codes are the negated indexes: GE_OK == 0, others < 0. */
enum {
#define GE_CODE_(N, s, h, m) GE_##N = -GE_##N##_I,
    GE_ERRORS(GE_CODE_)
#undef GE_CODE_
};

const char *err_name(int code);     /* "invalid_field" */
const char *err_default(int code);  /* "invalid request field" */
int err_http_status(int code);      /* 400 */

/* Record the detail of an error on this thread and return code, so callers write
 *   return err_set(GE_FORMAT, "%s: header length %llu beyond file size", path, n); */
int err_set(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *err_msg(void);          /* detail of the last err_set on this thread, or "" */
int err_code(void);                 /* code of the last err_set on this thread */
void err_clear(void);
#endif
