/* pack.c — the P + NR packing of prompt groups into micro-batches (contract in pack.h).
 *
 * One layout builder serves both layouts: the STANDARD layout is the packed layout applied to
 * "groups" of one response each, every one carrying its own copy of the prompt. Everything the
 * model needs to run a micro-batch (token ids, RoPE positions, the two key ranges of every
 * query, the positions whose logits predict response tokens) is computed here once, on the host.
 *
 * Legend: T packed tokens, G groups (packed units), S response segments, M predicted tokens. */
#include "engine/model/pack.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

/* ---------- sizes ---------- */

static long long group_resp_tokens(const pack_group *g) {
    long long r = 0;
    for (int i = 0; i < g->N; i++) r += g->R[i];
    return r;
}

/* The leading tokens every response of a group has in common (the trunk of a tree of turns),
 * at most the shortest response less one token, so each response keeps a segment of its own;
 * 0 for a group of one. */
static int group_trunk(const pack_group *g) {
    if (g->N < 2) return 0;
    int c = g->R[0];
    for (int i = 1; i < g->N; i++)
        if (g->R[i] < c) c = g->R[i];
    for (int j = 0; j < c - 1; j++)
        for (int i = 1; i < g->N; i++)
            if (g->resp[i][j] != g->resp[0][j]) return j;
    return c > 0 ? c - 1 : 0;
}

long long pack_group_tokens(const pack_group *g, pack_layout layout) {
    long long r = group_resp_tokens(g);
    return layout == PACK_PACKED ? (long long)g->P + r - (long long)(g->N - 1) * group_trunk(g) : (long long)g->N * g->P + r;
}

/* ---------- building one micro-batch ---------- */

/* Writes the prompt of a packed unit at packed index p0, and after it the first c tokens of its
 * responses (the trunk, c = 0 in the standard layout): causal self-attention, positions
 * 0..P+c-1. */
static void put_prompt(pack_batch *b, const pack_group *g, int c, int p0, int count) {
    for (int i = 0; i < g->P + c; i++) {
        int t = p0 + i;
        b->tokens[t] = i < g->P ? g->prompt[i] : g->resp[0][i - g->P];
        if (b->routes)
            pack_route_put(b->routes, b->T, t, i < g->P ? pack_route_src(g, -1, i) : pack_route_src(g, 0, i - g->P), g->rl, g->rk);
        b->tok_count[t] = count;
        b->pos[t] = i;
        b->kv_a0[t] = p0;
        b->kv_a1[t] = p0 + i + 1;
        b->kv_b0[t] = b->kv_b1[t] = p0 + i + 1; /* empty */
    }
}

/* Writes response `ri` of group `gi` past its first c tokens (the trunk, written with the prompt)
 * as segment `s` starting at packed index s0, attending to the prompt and trunk at
 * [p0, p0 + P + c) and causally to itself; positions go on from P + c. All its R predictions go
 * to out_*[m0 ..): token j is predicted by its predecessor, in the prompt and trunk for j <= c,
 * else in the segment. */
static void put_response(pack_batch *b, const pack_group *g, int c, int gi, int ri, int s, int p0, int s0, int m0) {
    int P = g->P, R = g->R[ri];
    const int *r = g->resp[ri];
    for (int j = c; j < R; j++) {
        int t = s0 + j - c;
        b->tokens[t] = r[j];
        if (b->routes) pack_route_put(b->routes, b->T, t, pack_route_src(g, ri, j), g->rl, g->rk);
        b->tok_count[t] = 1;
        b->pos[t] = P + j;
        b->kv_a0[t] = p0;
        b->kv_a1[t] = p0 + P + c;
        b->kv_b0[t] = s0;
        b->kv_b1[t] = t + 1;
    }
    for (int j = 0; j < R; j++) {
        b->out_pos[m0 + j] = j <= c ? p0 + P + j - 1 : s0 + j - c - 1;
        b->out_tok[m0 + j] = r[j];
    }
    b->seg_start[s] = s0;
    b->seg_len[s] = R - c;
    b->seg_group[s] = gi;
    b->seg_resp[s] = ri;
    b->seg_out0[s] = m0;
}

int pack_build(pack_batch *b, const pack_group *groups, int first, int count, pack_layout layout) {
    memset(b, 0, sizeof *b);
    long long T = 0, M = 0, rl = 0, rk = 0;
    int G = 0, S = 0;
    for (int k = 0; k < count; k++) {
        const pack_group *g = &groups[first + k];
        assert(g->P >= 1 && g->N >= 1);
        if (pack_has_routes(g)) rl = g->rl, rk = g->rk;
        T += pack_group_tokens(g, layout);
        M += group_resp_tokens(g);
        S += g->N;
        G += layout == PACK_PACKED ? 1 : g->N;
    }
    if (T > 0x7fffffffLL) return err_set(GE_TOO_LARGE, "micro-batch of %lld tokens exceeds the int index range", T);

    /* One block holds every array; tokens is its start, so pack_batch_free frees it. */
    size_t n_int = (size_t)7 * T + (size_t)(G + 1) + (size_t)4 * G + (size_t)6 * S + (size_t)2 * M;
    int *blk = calloc(n_int ? n_int : 1, sizeof(int));
    if (!blk) return err_set(GE_NOMEM, "pack_build: %zu ints for %lld tokens", n_int, T);
    int *q = blk;
#define TAKE_(field, n) \
    do { \
        b->field = q; \
        q += (n); \
    } while (0)
    TAKE_(tokens, T);
    TAKE_(pos, T);
    TAKE_(kv_a0, T);
    TAKE_(kv_a1, T);
    TAKE_(kv_b0, T);
    TAKE_(kv_b1, T);
    TAKE_(tok_count, T);
    TAKE_(cu_seqlens, G + 1);
    TAKE_(grp_plen, G);
    TAKE_(grp_seg0, G);
    TAKE_(grp_nseg, G);
    TAKE_(seg_start, S);
    TAKE_(seg_len, S);
    TAKE_(seg_group, S);
    TAKE_(seg_resp, S);
    TAKE_(seg_out0, S);
    TAKE_(out_pos, M);
    TAKE_(out_tok, M);
#undef TAKE_
    assert(q <= blk + (n_int ? n_int : 1));
    b->T = (int)T;
    if (rl && !(b->routes = malloc((size_t)(rl * T * rk) * sizeof(int)))) {
        free(blk);
        return err_set(GE_NOMEM, "pack_build: routes for %lld tokens", T);
    }
    if (b->routes) memset(b->routes, 0xff, (size_t)(rl * T * rk) * sizeof(int)); /* -1: a group without routes routes freely */
    for (int k = 0; b->routes && k < count; k++)
        assert(!pack_has_routes(&groups[first + k]) || (groups[first + k].rl == rl && groups[first + k].rk == rk));
    b->G = G;
    b->S = S;
    b->M = (int)M;

    int t = 0, gu = 0, s = 0, m = 0;
    for (int k = 0; k < count; k++) {
        int gi = first + k;
        const pack_group *g = &groups[gi];
        if (layout == PACK_PACKED) {
            int p0 = t, c = group_trunk(g);
            b->cu_seqlens[gu] = p0;
            b->grp_plen[gu] = g->P + c;
            b->grp_seg0[gu] = s;
            b->grp_nseg[gu] = g->N;
            put_prompt(b, g, c, p0, g->N);
            t += g->P + c;
            for (int i = 0; i < g->N; i++) {
                put_response(b, g, c, gi, i, s, p0, t, m);
                t += g->R[i] - c;
                m += g->R[i];
                s++;
            }
            gu++;
        } else {
            for (int i = 0; i < g->N; i++) {
                int p0 = t;
                b->cu_seqlens[gu] = p0;
                b->grp_plen[gu] = g->P;
                b->grp_seg0[gu] = s;
                b->grp_nseg[gu] = 1;
                put_prompt(b, g, 0, p0, 1);
                t += g->P;
                put_response(b, g, 0, gi, i, s, p0, t, m);
                t += g->R[i];
                m += g->R[i];
                s++;
                gu++;
            }
        }
    }
    b->cu_seqlens[G] = t;
    assert(t == b->T && gu == G && s == S && m == b->M);
    return 0;
}

void pack_batch_free(pack_batch *b) {
    if (!b) return;
    free(b->tokens);
    free(b->routes);
    memset(b, 0, sizeof *b);
}

/* ---------- the micro-batch planner ---------- */

int pack_plan_make(pack_plan *p, const pack_group *groups, int n_groups, long long max_tokens, pack_layout layout) {
    memset(p, 0, sizeof *p);
    for (int i = 0; i < n_groups; i++) {
        const pack_group *g = &groups[i];
        long long need = pack_group_tokens(g, layout);
        if (need <= max_tokens) continue;
        if (layout != PACK_PACKED)
            return err_set(GE_TOO_LARGE,
                           "group %d needs %lld tokens (P=%d, N=%d, R total %lld) > "
                           "max_tokens_per_micro_batch %lld",
                           i, need, g->P, g->N, group_resp_tokens(g), max_tokens);
        for (int r = 0; r < g->N; r++)
            if (g->R[r] > max_tokens)
                return err_set(GE_TOO_LARGE,
                               "group %d response %d has %d tokens > max_tokens_per_micro_batch %lld "
                               "(a response is never split across micro-batches)",
                               i, r, g->R[r], max_tokens);
    }
    int cap = n_groups > 0 ? n_groups : 1; /* at most one micro-batch per group */
    p->mb_first = malloc(sizeof(int) * cap);
    p->mb_count = malloc(sizeof(int) * cap);
    p->mb_split = malloc(sizeof(int) * cap);
    if (!p->mb_first || !p->mb_count || !p->mb_split) {
        pack_plan_free(p);
        return err_set(GE_NOMEM, "pack_plan_make: %d groups", n_groups);
    }
    long long used = 0;
    for (int i = 0; i < n_groups; i++) {
        long long need = pack_group_tokens(&groups[i], layout);
        int split = need > max_tokens;
        if (p->n_mb == 0 || split || p->mb_split[p->n_mb - 1] || used + need > max_tokens) {
            p->mb_first[p->n_mb] = i;
            p->mb_count[p->n_mb] = 0;
            p->mb_split[p->n_mb] = split;
            p->n_mb++;
            used = 0;
        }
        p->mb_count[p->n_mb - 1]++;
        used += need;
    }
    return 0;
}

void pack_plan_free(pack_plan *p) {
    if (!p) return;
    free(p->mb_first);
    free(p->mb_count);
    free(p->mb_split);
    memset(p, 0, sizeof *p);
}
