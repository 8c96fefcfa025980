/* prefix.c — the prefix cache of the rollout KV pool (prefix.h). Entries sit in one array;
 * lookups scan it (a few thousand entries at most; the first id rejects most). */
#include "engine/rollout/prefix.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"

void pfx_unref(kvp *p, pfx_block *b) {
    if (!b || --b->refs > 0) return;
    kvp_release(p, b->start, b->len);
    free(b);
}

static void drop(pfx_cache *c, kvp *p, int i) {
    pfx_entry *e = &c->e[i];
    pfx_unref(p, e->seg[0]);
    pfx_unref(p, e->seg[1]);
    free(e->tok);
    c->e[i] = c->e[--c->n];
    c->evicted++;
}

/* Drops the least recently used entry; 0 when there was none. */
static int evict_one(pfx_cache *c, kvp *p) {
    if (!c->n) return 0;
    int lru = 0;
    for (int i = 1; i < c->n; i++)
        if (c->e[i].used < c->e[lru].used) lru = i;
    drop(c, p, lru);
    return 1;
}

pfx_block *pfx_alloc(pfx_cache *c, kvp *p, int n, int *rc) {
    for (;;) {
        int r = kvp_alloc(p, n);
        if (r >= 0) {
            pfx_block *b = malloc(sizeof *b);
            if (!b) {
                kvp_release(p, r, n);
                *rc = err_set(GE_NOMEM, "scheduler: out of memory");
                return NULL;
            }
            *b = (pfx_block){.start = r, .len = n, .refs = 1};
            *rc = 0;
            return b;
        }
        if (r < -1) {
            *rc = r;
            return NULL;
        }
        if (!evict_one(c, p)) {
            *rc = 0;
            return NULL;
        }
    }
}

/* Length of the common prefix of e's ids and tok (n). */
static int common(const pfx_entry *e, const int *tok, int n) {
    int m = e->n < n ? e->n : n, i = 0;
    while (i < m && e->tok[i] == tok[i]) i++;
    return i;
}

int pfx_keep(pfx_cache *c, kvp *p, const int *a, int na, pfx_block *pa, const int *b, int nb, pfx_block *pb) {
    for (int i = 0; i < c->n; i++) /* held already (a response equal to another) */
        if (c->e[i].n >= na + nb && common(&c->e[i], a, na) == na && (!nb || !memcmp(c->e[i].tok + na, b, (size_t)nb * sizeof(int))))
            return 0;
    if (c->n >= PFX_MAX_ENTRIES) evict_one(c, p);
    if (c->n == c->cap) {
        int nc = c->cap ? c->cap * 2 : 64;
        pfx_entry *x = realloc(c->e, (size_t)nc * sizeof *x);
        if (!x) return err_set(GE_NOMEM, "scheduler: out of memory");
        c->e = x;
        c->cap = nc;
    }
    int *tok = malloc((size_t)(na + nb) * sizeof(int));
    if (!tok) return err_set(GE_NOMEM, "scheduler: out of memory");
    memcpy(tok, a, (size_t)na * sizeof(int));
    if (nb) memcpy(tok + na, b, (size_t)nb * sizeof(int));
    pfx_ref(pa);
    if (nb) pfx_ref(pb);
    c->e[c->n++] = (pfx_entry){.tok = tok, .n = na + nb, .seg = {pa, nb ? pb : NULL}, .seg_n = {na, nb}, .used = ++c->clock};
    return 0;
}

int pfx_match(pfx_cache *c, const int *tok, int n, int max, pfx_src *src) {
    int best = 0, at = -1;
    memset(src, 0, sizeof *src);
    for (int i = 0; i < c->n && n > 0; i++) {
        if (c->e[i].tok[0] != tok[0]) continue;
        int m = common(&c->e[i], tok, n);
        if (m > best) best = m, at = i;
    }
    if (best > max) best = max;
    if (at < 0 || best <= 0) return 0;
    pfx_entry *e = &c->e[at];
    e->used = ++c->clock;
    for (int k = 0; k < 2; k++) {
        src->seg[k] = e->seg[k];
        src->seg_n[k] = e->seg_n[k];
        if (e->seg[k]) pfx_ref(e->seg[k]);
    }
    return best;
}

void pfx_src_release(kvp *p, pfx_src *src) {
    pfx_unref(p, src->seg[0]);
    pfx_unref(p, src->seg[1]);
    memset(src, 0, sizeof *src);
}

void pfx_clear(pfx_cache *c, kvp *p) {
    long long ev = c->evicted;
    while (c->n) drop(c, p, c->n - 1);
    c->evicted = ev; /* a clear is not pressure */
}

void pfx_destroy(pfx_cache *c, kvp *p) {
    pfx_clear(c, p);
    free(c->e);
    c->e = NULL;
    c->cap = 0;
}
