/* router.c — the route table (the rows of routes.h) and the router: a request whose head and body
 * have arrived is matched against the rows in order, checked for its key and body size, its JSON
 * body parsed when the row names one, and handed to the row's handler. No row for the path is
 * 404, none for the method 405; HEAD is served as GET (MHD leaves the body out). */
#include "api/internal.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common/err.h"

#define API_ROW_(method, path, handler, auth, ...) {method, path, handler, auth, {__VA_ARGS__}},
const api_route api_routes[] = {API_ROUTES(API_ROW_)};
#undef API_ROW_
const int api_n_routes = sizeof api_routes / sizeof api_routes[0];

/* Does path match the template tpl? id (n bytes) receives tpl's "{id}" segment. */
static int route_match(const char *tpl, const char *path, char *id, size_t n) {
    const char *brace = strstr(tpl, "{id}");
    if (!brace) return strcmp(tpl, path) == 0;
    size_t pre = (size_t)(brace - tpl);
    if (strncmp(tpl, path, pre) != 0) return 0;
    const char *seg = path + pre, *slash = strchr(seg, '/');
    size_t len = slash ? (size_t)(slash - seg) : strlen(seg);
    if (!len || len >= n || strcmp(seg + len, brace + 4) != 0) return 0;
    memcpy(id, seg, len);
    id[len] = 0;
    return 1;
}

/* Authorization: Bearer KEY (the scheme in any case, RFC 7235). The compare always runs over
 * API_KEY_MAX bytes of both, zero-padded, so its time says nothing of the key or its length. */
static int auth_ok(api_server *s, struct MHD_Connection *c) {
    char key[API_KEY_MAX] = {0}, got[API_KEY_MAX] = {0};
    pthread_mutex_lock(&s->mu);
    memcpy(key, s->api_key, sizeof key);
    pthread_mutex_unlock(&s->mu);
    if (!key[0]) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return 0;
    h += 7;
    while (*h == ' ') h++;
    size_t n = strlen(h);
    if (n >= sizeof got) return 0;
    memcpy(got, h, n);
    volatile unsigned char diff = 0;
    for (size_t i = 0; i < sizeof key; i++) diff |= (unsigned char)(got[i] ^ key[i]);
    return diff == 0;
}

static enum MHD_Result route_one(api_server *s, struct MHD_Connection *c, api_req *x, const char *url) {
    const api_route *rt = NULL;
    char id[128] = "";
    int path_known = 0;
    api_conns_set_busy(s->conns, c, 1); /* the whole request is here: no deadline now */
    if (x->refused) {
        x->route = "other";
        return api_reply_error(c, x, &x->refusal);
    }
    const char *m = strcmp(x->method, "HEAD") ? x->method : "GET";
    for (int i = 0; i < api_n_routes; i++) {
        if (!route_match(api_routes[i].path, url, id, sizeof id)) continue;
        path_known = 1;
        if (strcmp(api_routes[i].method, m) == 0) {
            rt = &api_routes[i];
            break;
        }
    }
    if (!rt) {
        x->route = "other";
        if (path_known) return api_reply_fail(c, x, GE_METHOD, "", "%s is not allowed on %s", x->method, url);
        return api_reply_fail(c, x, GE_NOT_FOUND, "", "no route %s %s", x->method, url);
    }
    x->route = rt->path;
    if (rt->auth == API_KEY && !auth_ok(s, c))
        return api_reply_fail(c, x, GE_UNAUTHORIZED, "Authorization", "missing or wrong API key: send Authorization: Bearer <key>");
    if (x->too_large)
        return api_reply_fail(c, x, GE_TOO_LARGE, "", "request body over the limit of %lld bytes (--max-body-bytes)",
                              api_limits_now(s).max_body_bytes);
    json_object *req = NULL;
    if (rt->doc.body && !x->waiting) {
        api_error e;
        if (rt->doc.body_optional && x->len == 0) {
            req = json_object_new_object();
        } else {
            api_limits l = api_limits_now(s);
            if (api_parse_json_or_reply(x->body, x->len, &l, &req, &e)) return api_reply_error(c, x, &e);
        }
    }
    enum MHD_Result r = rt->handler(s, c, x, req, id);
    json_object_put(req);
    return r;
}

/* Bodies over API_BIG_BODY_BYTES are parsed and validated one at a time. Token ids and logprobs
 * are packed (api/packed.h: ~2.5x an 8 MiB body at the peak instead of ~25x), but the rest of a
 * body is json-c's, whose trees cost up to hundreds of times their text (an object: ~800 bytes
 * for "{}"); one at a time bounds the peak by one body's cost whatever the concurrency. */
static pthread_mutex_t big_body_mu = PTHREAD_MUTEX_INITIALIZER;

enum MHD_Result api_route_request(api_server *s, struct MHD_Connection *c, api_req *x, const char *url) {
    if (x->len <= API_BIG_BODY_BYTES) return route_one(s, c, x, url);
    pthread_mutex_lock(&big_body_mu);
    enum MHD_Result r = route_one(s, c, x, url);
    pthread_mutex_unlock(&big_body_mu);
    return r;
}
