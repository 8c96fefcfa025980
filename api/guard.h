/* guard.h — what a request must show before it is routed: web-origin protection for a daemon
 * that usually listens on loopback without a key, where any web page its operator opens could
 * otherwise reach it.
 *
 *   Host     its host part must be an IP literal, "localhost", or in allowed_hosts ("*": any).
 *            A DNS-rebinding page reaches the daemon under the attacker's own name, so a name
 *            that is not configured is refused. Behind a proxy: --allowed-hosts NAME.
 *            A request without Host (HTTP/1.0) passes.
 *   Origin   a request carrying Origin (browsers send it on cross-site POSTs and fetches) must
 *            name one of allowed_origins exactly ("*": any); by default none is allowed.
 *   Content-Type  a POST, and a DELETE with a body, must say application/json: a page can
 *            send text/plain or a form cross-site without a CORS preflight, never JSON.
 *
 * Pure: the caller passes the header values; no I/O, safe from any thread. */
#ifndef GRPOD_API_GUARD_H
#define GRPOD_API_GUARD_H
#include "api/validate.h"

typedef struct {
    const char *allowed_hosts; /* comma-separated host names (no port), "*" = any; NULL = "" */
    const char *allowed_origins; /* comma-separated origins ("https://app.example"), "*" = any */
} api_guard;

typedef struct {
    const char *method; /* "POST" */
    const char *host, *origin, *content_type; /* header values or NULL */
    int has_body; /* Content-Length > 0 or chunked */
} api_request_head;

/* 0 when the request may proceed; else GE_FORBIDDEN (403, field "Host" or "Origin") or
 * GE_MEDIA_TYPE (415, field "Content-Type") with the reason in e. */
int api_guard_or_reply(const api_guard *g, const api_request_head *h, api_error *e);
#endif
