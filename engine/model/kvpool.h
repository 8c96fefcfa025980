/* kvpool.h — the row allocator of the rollout KV pool: contiguous ranges of rows [0, cap) of
 * one model_kv, handed out first-fit from a free list kept sorted by start and coalesced on
 * release, so freeing every range always gives back one free range of cap rows.
 *
 * It only does arithmetic on row numbers (no device memory, no engine): the scheduler in
 * rollout.c owns the model_kv these rows index. Not thread-safe: the engine thread only. */
#ifndef GRPOD_KVPOOL_H
#define GRPOD_KVPOOL_H

typedef struct {
    int start, len;
} kvp_range;

typedef struct {
    int cap; /* rows in the pool */
    int used; /* rows handed out */
    int n_alloc; /* ranges handed out */
    kvp_range *free; /* (n_free) sorted by start, none adjacent */
    int n_free, cap_free;
} kvp;

/* A pool of cap rows, all free. GE_NOMEM, or GE_INVALID when cap < 1. */
int kvp_init(kvp *p, int cap);
void kvp_destroy(kvp *p);
/* First row of a free range of n rows (n >= 1), first fit by address; -1 when no free range
 * holds n rows; GE_NOMEM (< -1) when the free list cannot grow. */
int kvp_alloc(kvp *p, int n);
/* Gives back rows [start, start + n) that kvp_alloc handed out (asserted). */
void kvp_release(kvp *p, int start, int n);
/* The largest free range (0 when full). */
int kvp_largest(const kvp *p);
#endif
