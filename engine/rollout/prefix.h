/* prefix.h — the rollout KV pool's prefix cache (automatic prefix caching, as vLLM's and
 * SGLang's): the rows of finished responses are kept, keyed by the token ids whose keys and values
 * they hold, so a later group whose prompt begins with those ids — an agent's next turn: prompt,
 * response, tool output — copies their K/V instead of prefilling them.
 *
 * Rows come in blocks, kvp ranges with a reference count: a group holds its prompt's block and
 * each response its own; an entry holds its prompt's block and one response's. A block goes back
 * to the pool when its last holder lets go. Entries go least recently used first when the pool
 * has no room (pfx_alloc) or when there are more than PFX_MAX_ENTRIES, and all at once when the
 * weights change (pfx_clear: keys and values of other weights are not these).
 *
 * Arithmetic on row numbers only, like kvpool.h: rollout.c copies the rows. Engine thread only. */
#ifndef GRPOD_PREFIX_H
#define GRPOD_PREFIX_H

#include "engine/model/kvpool.h"

#define PFX_MAX_ENTRIES 4096

typedef struct {
    int start, len, refs;
} pfx_block;

typedef struct {
    int *tok; /* (n) the ids whose K/V the rows hold: seg_n[0] rows of seg[0], then seg_n[1] of seg[1] */
    int n;
    pfx_block *seg[2];
    int seg_n[2];
    unsigned long long used; /* the cache's clock at its last hit or insertion */
} pfx_entry;

typedef struct {
    pfx_entry *e;
    int n, cap;
    unsigned long long clock;
    long long epoch; /* the weights its keys and values were computed with (rollout.c) */
    long long hits, hit_tokens, query_tokens, evicted; /* since the scheduler opened */
} pfx_cache;

/* A block of n rows held once; evicts entries (least recently used first) until the pool has
 * room. NULL with *rc 0 when it has none even then, or *rc < 0 (GE_NOMEM). */
pfx_block *pfx_alloc(pfx_cache *c, kvp *p, int n, int *rc);
static inline void pfx_ref(pfx_block *b) { b->refs++; }
void pfx_unref(kvp *p, pfx_block *b); /* the last reference gives the rows back (NULL: nothing) */

/* Keeps ids a (na: a's K/V in the first na rows of block pa) then b (nb, block pb) as an entry,
 * taking a reference to each block; nothing when an entry already holds them all. 0 or
 * GE_NOMEM (nothing kept). */
int pfx_keep(pfx_cache *c, kvp *p, const int *a, int na, pfx_block *pa, const int *b, int nb, pfx_block *pb);
/* Where a match's keys and values are: its entry's blocks, held by the match (so an eviction
 * meanwhile cannot give them back) until pfx_src_release. */
typedef struct {
    pfx_block *seg[2];
    int seg_n[2];
} pfx_src;
/* The longest prefix of tok (n) an entry holds, at most max ids: that length (0: none, src
 * empty). The entry counts as used; the caller counts hits (a group may not fit yet). */
int pfx_match(pfx_cache *c, const int *tok, int n, int max, pfx_src *src);
void pfx_src_release(kvp *p, pfx_src *src);
/* Row of the i-th id of a match. */
static inline int pfx_row(const pfx_src *s, int i) {
    return i < s->seg_n[0] ? s->seg[0]->start + i : s->seg[1]->start + (i - s->seg_n[0]);
}
void pfx_clear(pfx_cache *c, kvp *p); /* every entry dropped */
void pfx_destroy(pfx_cache *c, kvp *p);
#endif
