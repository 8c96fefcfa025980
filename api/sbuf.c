/* sbuf.c — see sbuf.h. */
#include "api/sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Room for n more bytes and the NUL; 0 (oom set) when it cannot be had. */
static int reserve(api_sbuf *b, size_t n) {
    if (b->oom) return 0;
    if (b->len + n + 1 <= b->cap) return 1;
    size_t nc = (b->cap + n + 1) * 2;
    char *np = realloc(b->p, nc);
    if (!np) {
        b->oom = 1;
        return 0;
    }
    b->p = np;
    b->cap = nc;
    return 1;
}

void api_sb_printf(api_sbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
        b->oom = 1;
        return;
    }
    if (!reserve(b, (size_t)k)) return;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    b->len += (size_t)k;
}

void api_sb_str(api_sbuf *b, const char *s) {
    size_t n = strlen(s);
    if (!reserve(b, n)) return;
    memcpy(b->p + b->len, s, n + 1);
    b->len += n;
}

void api_sb_num_or_null(api_sbuf *b, double v) {
    if (v > 0) api_sb_printf(b, "%.3f", v);
    else api_sb_str(b, "null");
}
