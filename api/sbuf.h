/* sbuf.h — a growable string for the replies built by hand (job lists, the dashboard's data, the
 * Prometheus text). Start from {0}; every add keeps p NUL-terminated (an add of "" makes p
 * non-NULL). When an allocation fails, oom is set and every later add is dropped: the caller
 * checks oom once at the end (api_reply_sb answers 507). The caller frees p. */
#ifndef GRPOD_API_SBUF_H
#define GRPOD_API_SBUF_H
#include <stddef.h>

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} api_sbuf;

void api_sb_printf(api_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void api_sb_str(api_sbuf *b, const char *s);
void api_sb_num_or_null(api_sbuf *b, double v); /* "%.3f", or null when v <= 0 */
#endif
