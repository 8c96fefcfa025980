/* status.c — see status.h. One row per error code of common/err.h; a code missing here is 500. */
#include "api/status.h"

#include "common/err.h"

static const short statuses[GE_COUNT_] = {
    [GE_OK_I] = 200,          [GE_INVALID_I] = 400,    [GE_BAD_JSON_I] = 400,    [GE_UNAUTHORIZED_I] = 401,
    [GE_FORBIDDEN_I] = 403,   [GE_NOT_FOUND_I] = 404,  [GE_METHOD_I] = 405,      [GE_CONFLICT_I] = 409,
    [GE_TOO_LARGE_I] = 413,   [GE_MEDIA_TYPE_I] = 415, [GE_UNSUPPORTED_I] = 422, [GE_BUSY_I] = 429,
    [GE_IO_I] = 500,          [GE_FORMAT_I] = 500,     [GE_NOMEM_I] = 507,       [GE_CUDA_I] = 500,
    [GE_STORE_I] = 500,       [GE_INTERNAL_I] = 500,   [GE_NON_FINITE_I] = 422,  [GE_INTERRUPTED_I] = 500,
    [GE_UNAVAILABLE_I] = 503, [GE_RANK_LOST_I] = 503,  [GE_STATE_LOST_I] = 503,
};

int api_http_status(int code) {
    if (code > 0 || -code >= GE_COUNT_ || !statuses[-code]) return 500;
    return statuses[-code];
}
