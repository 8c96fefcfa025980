/* reply.c — every response grpod sends goes through here: one MHD response with its
 * Content-Type and the headers its status calls for, counted in the HTTP metrics; JSON text,
 * objects and built strings; error bodies {"error": {"code", "message", "field"}} from an
 * api_error or a job's stored error. See internal.h. */
#include "api/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/metrics.h"
#include "api/status.h"
#include "common/err.h"
#include "common/log.h"

/* ---------------------------------------------------------------- responses */

enum MHD_Result api_reply_raw(struct MHD_Connection *c, api_req *x, int status, const char *ctype, char *body, size_t len,
                              int take) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, take ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_MUST_COPY);
    if (!r) {
        if (take) free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    /* RFC 9110: tell clients when to come back and how to authenticate */
    if (status == 429) MHD_add_response_header(r, "Retry-After", "1");
    else if (status == 503) MHD_add_response_header(r, "Retry-After", "2");
    else if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"grpod\"");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    metrics_http(x->method, x->route ? x->route : "other", status);
    return ok;
}

enum MHD_Result api_reply_json(struct MHD_Connection *c, api_req *x, int status, const char *text) {
    return api_reply_raw(c, x, status, "application/json", (char *)text, strlen(text), 0);
}

enum MHD_Result api_reply_sb(struct MHD_Connection *c, api_req *x, int status, api_sbuf *b) {
    if (b->oom) {
        free(b->p);
        return api_reply_json(c, x, 507, "{\"error\":{\"code\":\"out_of_memory\",\"message\":\"out of memory\"}}");
    }
    return api_reply_raw(c, x, status, "application/json", b->p, b->len, 1);
}

enum MHD_Result api_reply_obj(struct MHD_Connection *c, api_req *x, int status, json_object *o) {
    enum MHD_Result r = api_reply_json(c, x, status, json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
    return r;
}

/* ---------------------------------------------------------------- error bodies */

/* OpenAI's error type for a status (what its SDKs and the clients written for them read). */
static const char *openai_type(int status) {
    static const struct {
        int status;
        const char *type;
    } rows[] = {{401, "authentication_error"}, {403, "permission_error"}, {404, "not_found_error"}, {429, "rate_limit_error"}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (rows[i].status == status) return rows[i].type;
    return status >= 500 ? "server_error" : "invalid_request_error";
}

enum MHD_Result api_reply_error(struct MHD_Connection *c, api_req *x, const api_error *e) {
    json_object *o = json_object_new_object(), *er = json_object_new_object();
    int status = e->status ? e->status : api_http_status(e->code);
    json_object_object_add(er, "code", json_object_new_string(err_name(e->code)));
    json_object_object_add(er, "message", json_object_new_string(e->message[0] ? e->message : err_default(e->code)));
    if (e->field[0]) json_object_object_add(er, "field", json_object_new_string(e->field));
    json_object_object_add(er, "type", json_object_new_string(openai_type(status)));
    json_object_object_add(er, "param", e->field[0] ? json_object_new_string(e->field) : NULL);
    json_object_object_add(o, "error", er);
    if (status >= 500)
        log_event(LOG_WARN, "http_error", "\"route\":\"%s\",\"status\":%d,\"code\":\"%s\"", x->route ? x->route : "other", status,
                  err_name(e->code));
    return api_reply_obj(c, x, status, o);
}

enum MHD_Result api_reply_fail(struct MHD_Connection *c, api_req *x, int code, const char *field, const char *fmt, ...) {
    api_error e;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    api_fail(&e, code, field, "%s", msg);
    return api_reply_error(c, x, &e);
}

/* {"code":"conflict",...} → the HTTP status of that code (500 when unknown). */
static int status_of_error_json(const char *err) {
    json_object *o = err ? json_tokener_parse(err) : NULL, *code;
    int st = 500;
    if (o && json_object_object_get_ex(o, "code", &code))
        for (int i = 0; i < GE_COUNT_; i++)
            if (!strcmp(err_name(-i), json_object_get_string(code))) {
                st = api_http_status(-i);
                break;
            }
    json_object_put(o);
    return st;
}

enum MHD_Result api_reply_job_error(struct MHD_Connection *c, api_req *x, const store_job *j) {
    api_sbuf b = {0};
    api_sb_str(&b, "{\"error\":");
    api_sb_str(&b, j->error ? j->error : "{\"code\":\"conflict\",\"message\":\"cancelled\"}");
    api_sb_str(&b, "}");
    return api_reply_sb(c, x, j->error ? status_of_error_json(j->error) : 409, &b);
}
