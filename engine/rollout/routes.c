/* routes.c — staging of a rollout step's MoE routes (contract in routes.h). */
#include "engine/rollout/routes.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"

int rt_reserve(rt_rec *r, int T) {
    if (!r->W || T <= r->cap_T) return 0;
    int *b = realloc(r->buf, (size_t)T * r->W * sizeof(int));
    if (b) r->buf = b;
    int **d = b ? realloc(r->dst, (size_t)T * sizeof(int *)) : NULL;
    if (!d) return err_set(GE_NOMEM, "scheduler: out of memory for the routes of %d tokens", T);
    r->dst = d;
    r->cap_T = T;
    return 0;
}

void rt_free(rt_rec *r) {
    free(r->buf);
    free(r->dst);
    r->buf = NULL;
    r->dst = NULL;
    r->cap_T = 0;
}

int *rt_rows(int W, int n) {
    if (!W) return NULL;
    size_t bytes = (size_t)W * (n > 0 ? n : 1) * sizeof(int);
    int *p = malloc(bytes);
    if (!p) err_set(GE_NOMEM, "scheduler: out of memory for the routes of %d tokens", n);
    else memset(p, 0xff, bytes); /* -1 */
    return p;
}

/* *rows resized to n rows of W, the rows past *cap set to -1; 0 or GE_NOMEM (*rows as it was). */
static int resize(int **rows, int *cap, int n, int W) {
    int *p = realloc(*rows, (size_t)(n > 0 ? n : 1) * W * sizeof(int));
    if (!p) return err_set(GE_NOMEM, "scheduler: out of memory for the routes of %d tokens", n);
    if (n > *cap) memset(p + (size_t)*cap * W, 0xff, (size_t)(n - *cap) * W * sizeof(int));
    *rows = p;
    *cap = n;
    return 0;
}

int *rt_row(int **rows, int *cap, int i, int W) {
    if (i >= *cap && resize(rows, cap, i + 1 > 2 * *cap ? (i + 1 > 16 ? i + 1 : 16) : 2 * *cap, W)) {
        err_clear(); /* not recorded: the trainer routes the token itself */
        return NULL;
    }
    return *rows + (size_t)i * W;
}

void rt_fit(int **rows, int *cap, int n, int W) {
    if (!*rows && !n) return;
    if (resize(rows, cap, n, W)) {
        err_clear();
        free(*rows);
        *rows = NULL;
        *cap = 0;
    }
}

void rt_scatter(const rt_rec *r, int T) {
    for (int t = 0; r->W && t < T; t++)
        if (r->dst[t]) memcpy(r->dst[t], r->buf + (size_t)t * r->W, (size_t)r->W * sizeof(int));
}
