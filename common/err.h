/* err.h — grpod's error codes: one list generates the enum, the name and the message
 * (X-macro), as libuv does. Functions return 0 (GE_OK) or a negative code; the detail of the
 * last error on this thread is in err_msg(), set by err_set(). No HTTP here: api/status.c maps
 * each code to its HTTP status.
 *
 * Two tiers (STYLE.md): a broken invariant asserts; a recoverable problem (bad input, a corrupt
 * file, out of memory, a CUDA failure) returns a code with a message and the caller decides. */
#ifndef GRPOD_ERR_H
#define GRPOD_ERR_H

/*  X(NAME,            name string,          default message) */
#define GE_ERRORS(X) \
    X(OK, "ok", "ok") \
    X(INVALID, "invalid_field", "invalid request field") \
    X(BAD_JSON, "invalid_json", "request body is not valid JSON") \
    X(UNAUTHORIZED, "unauthorized", "missing or wrong API key") \
    X(FORBIDDEN, "forbidden", "origin or host not allowed") \
    X(NOT_FOUND, "not_found", "not found") \
    X(METHOD, "method_not_allowed", "method not allowed") \
    X(CONFLICT, "conflict", "conflict") \
    X(TOO_LARGE, "too_large", "request too large") \
    X(MEDIA_TYPE, "unsupported_media_type", "Content-Type must be application/json") \
    X(UNSUPPORTED, "unsupported", "unsupported") \
    X(BUSY, "queue_full", "too many queued jobs") \
    X(IO, "io_error", "i/o error") \
    X(FORMAT, "bad_format", "malformed file") \
    X(NOMEM, "out_of_memory", "out of memory") \
    X(CUDA, "cuda_error", "CUDA error") \
    X(STORE, "store_error", "database error") \
    X(INTERNAL, "internal", "internal error") \
    X(NON_FINITE, "non_finite", "non-finite loss, gradient or weights") \
    X(INTERRUPTED, "interrupted", "interrupted by daemon crashes too often") \
    X(UNAVAILABLE, "unavailable", "not ready") \
    X(COMM, "comm_error", "a rank of the deployment failed or left") \
    X(RANK_LOST, "rank_lost", "a follower of the deployment was lost") \
    X(STATE_LOST, "state_lost", "a failed update changed the training state and it could not be restored")

typedef enum {
#define GE_ENUM_(N, s, m) GE_##N##_I,
    GE_ERRORS(GE_ENUM_)
#undef GE_ENUM_
        GE_COUNT_
} ge_index;

/* Error codes are the negated indexes: GE_OK == 0, others < 0. */
enum {
#define GE_CODE_(N, s, m) GE_##N = -GE_##N##_I,
    GE_ERRORS(GE_CODE_)
#undef GE_CODE_
};

const char *err_name(int code); /* "invalid_field" */
const char *err_default(int code); /* "invalid request field" */

/* Record the detail of an error on this thread and return code, so callers write
 *   return err_set(GE_FORMAT, "%s: header length %llu beyond file size", path, n); */
int err_set(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *err_msg(void); /* detail of the last err_set on this thread, or "" */
int err_code(void); /* code of the last err_set on this thread */
void err_clear(void);
#endif
