/* guard.c — Host, Origin and Content-Type checks before routing; see guard.h. */
#include "api/guard.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <string.h>
#include <strings.h>

#include "common/err.h"

/* Is list (comma-separated, spaces around items ignored) holding item, or "*"? ASCII case-folded
 * when fold is set. */
static int list_has(const char *list, const char *item, size_t len, int fold) {
    for (const char *p = list ? list : ""; *p;) {
        while (*p == ' ' || *p == ',') p++;
        const char *e = p;
        while (*e && *e != ',') e++;
        const char *t = e;
        while (t > p && t[-1] == ' ') t--;
        size_t n = (size_t)(t - p);
        if ((n == 1 && *p == '*') || (n == len && n && (fold ? strncasecmp(p, item, n) == 0 : memcmp(p, item, n) == 0))) return 1;
        p = e;
    }
    return 0;
}

/* The host part of a Host header is an IPv4/IPv6 literal or localhost. */
static int host_ok(const api_guard *g, const char *host) {
    char h[256];
    size_t n;
    if (host[0] == '[') { /* [v6]:port */
        const char *close = strchr(host, ']');
        if (!close || (close[1] && close[1] != ':')) return 0;
        n = (size_t)(close - host - 1);
        if (n >= sizeof h) return 0;
        memcpy(h, host + 1, n);
        h[n] = 0;
        struct in6_addr a6;
        return inet_pton(AF_INET6, h, &a6) == 1 || list_has(g->allowed_hosts, host, (size_t)(close - host + 1), 1);
    }
    const char *colon = strchr(host, ':');
    n = colon ? (size_t)(colon - host) : strlen(host);
    if (n == 0 || n >= sizeof h) return 0;
    memcpy(h, host, n);
    h[n] = 0;
    if (h[n - 1] == '.') h[--n] = 0; /* "localhost." is "localhost" */
    struct in_addr a4;
    return inet_pton(AF_INET, h, &a4) == 1 || strcasecmp(h, "localhost") == 0 || list_has(g->allowed_hosts, h, n, 1);
}

/* "application/json", any case, optionally followed by parameters ("; charset=utf-8"). */
static int is_json_type(const char *ct) {
    static const char want[] = "application/json";
    size_t n = sizeof want - 1;
    if (!ct) return 0;
    while (*ct == ' ' || *ct == '\t') ct++;
    if (strncasecmp(ct, want, n)) return 0;
    ct += n;
    while (*ct == ' ' || *ct == '\t') ct++;
    return *ct == 0 || *ct == ';';
}

int api_guard_or_reply(const api_guard *g, const api_request_head *h, api_error *e) {
    if (h->host && !host_ok(g, h->host))
        return api_fail(e, GE_FORBIDDEN, "Host",
                        "Host '%.100s' is not allowed: use an IP address or localhost, "
                        "or list the name in --allowed-hosts",
                        h->host);
    if (h->origin && !list_has(g->allowed_origins, h->origin, strlen(h->origin), 0))
        return api_fail(e, GE_FORBIDDEN, "Origin", "Origin '%.100s' is not allowed (--allowed-origins)", h->origin);
    int post = strcmp(h->method, "POST") == 0, del = strcmp(h->method, "DELETE") == 0;
    if ((post || (del && h->has_body)) && !is_json_type(h->content_type))
        return api_fail(e, GE_MEDIA_TYPE, "Content-Type", "%s needs Content-Type: application/json (got '%.60s')", h->method,
                        h->content_type ? h->content_type : "none");
    return 0;
}
