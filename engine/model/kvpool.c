/* kvpool.c — first-fit row-range allocator with a coalescing free list; see kvpool.h. */
#include "engine/model/kvpool.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

int kvp_init(kvp *p, int cap) {
    memset(p, 0, sizeof *p);
    if (cap < 1) return err_set(GE_INVALID, "KV pool of %d rows", cap);
    p->cap_free = 16;
    if (!(p->free = malloc((size_t)p->cap_free * sizeof *p->free))) return err_set(GE_NOMEM, "KV pool: out of memory");
    p->cap = cap;
    p->free[0] = (kvp_range){0, cap};
    p->n_free = 1;
    return 0;
}

void kvp_destroy(kvp *p) {
    free(p->free);
    memset(p, 0, sizeof *p);
}

/* Each handed-out range can split one free range in two when it comes back, so the list
 * never needs more than n_alloc + 1 entries: growing here keeps kvp_release infallible. */
static int reserve(kvp *p) {
    if (p->cap_free >= p->n_alloc + 2) return 0;
    int nc = p->cap_free * 2;
    kvp_range *f = realloc(p->free, (size_t)nc * sizeof *f);
    if (!f) return err_set(GE_NOMEM, "KV pool: out of memory for %d free ranges", nc);
    p->free = f;
    p->cap_free = nc;
    return 0;
}

int kvp_alloc(kvp *p, int n) {
    assert(n >= 1);
    int rc = reserve(p);
    if (rc) return rc;
    for (int i = 0; i < p->n_free; i++) {
        kvp_range *f = &p->free[i];
        if (f->len < n) continue;
        int start = f->start;
        f->start += n;
        f->len -= n;
        if (!f->len) {
            memmove(f, f + 1, (size_t)(p->n_free - i - 1) * sizeof *f);
            p->n_free--;
        }
        p->used += n;
        p->n_alloc++;
        return start;
    }
    return -1;
}

void kvp_release(kvp *p, int start, int n) {
    assert(n >= 1 && start >= 0 && start + n <= p->cap && p->n_alloc > 0);
    int i = 0; /* first free range after this one */
    while (i < p->n_free && p->free[i].start < start) i++;
    assert(i == p->n_free || start + n <= p->free[i].start);
    assert(i == 0 || p->free[i - 1].start + p->free[i - 1].len <= start);
    int join_prev = i > 0 && p->free[i - 1].start + p->free[i - 1].len == start;
    int join_next = i < p->n_free && start + n == p->free[i].start;
    if (join_prev && join_next) {
        p->free[i - 1].len += n + p->free[i].len;
        memmove(&p->free[i], &p->free[i + 1], (size_t)(p->n_free - i - 1) * sizeof *p->free);
        p->n_free--;
    } else if (join_prev) {
        p->free[i - 1].len += n;
    } else if (join_next) {
        p->free[i].start = start;
        p->free[i].len += n;
    } else {
        memmove(&p->free[i + 1], &p->free[i], (size_t)(p->n_free - i) * sizeof *p->free);
        p->free[i] = (kvp_range){start, n};
        p->n_free++;
    }
    p->used -= n;
    p->n_alloc--;
}

int kvp_largest(const kvp *p) {
    int m = 0;
    for (int i = 0; i < p->n_free; i++)
        if (p->free[i].len > m) m = p->free[i].len;
    return m;
}
