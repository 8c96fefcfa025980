/* pack.c — the P + NR packing of prompt groups into micro-batches (contract in pack.h).
 *
 * One layout builder serves every layout: a unit's token trie (below) laid out depth first. The
 * STANDARD layout is it applied to "groups" of one response each, every one carrying its own
 * copy of the prompt; PACKED shares the trunk only, TREE every shared segment. Everything the
 * model needs to run a micro-batch (token ids, RoPE positions, the key ranges of every query,
 * the positions whose logits predict response tokens) is computed here once, on the host.
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

/* ---------- the layout of one unit: a token trie ----------
 *
 * A unit (a packed group, or one response with its copy of the prompt) is laid out depth first:
 * the root segment (prompt, then the leading tokens the unit's responses all share), then each
 * child in the order of its first response. A child is either a shared node (the responses that
 * go on with the same token: their common tokens past that point, then its own children) or a
 * leaf (one response's tokens past its parent). Every response keeps at least its last token in
 * a leaf of its own (a shared node never holds a response's last token), so a group whose trie
 * is one trunk is laid out as the one-trunk layout was, bit for bit.
 *
 * Attention: a token sees the runs of its ancestors' segments (consecutive ones merged: a first
 * child follows its parent) and its own segment causally. The first run is range a, its own
 * segment range b (empty for root tokens, whose own segment is range a), further runs the
 * extras. A shared node is made only where its descendants' runs fit in 1 + ATTN_XR_MAX; past
 * that its responses become leaves (less sharing, the same result). */

typedef struct {
    int lo, hi;
} run;

typedef struct {
    const pack_group *g;
    pack_batch *b; /* NULL: count tokens and runs only */
    int tree; /* 0: the root's trunk only (every child a leaf) */
    int gi, p0, t; /* source group, packed start of the unit, next free packed index */
    int s_base; /* the unit's first segment index */
    const int *m0; /* (N) out_* index of each response's first prediction */
    int *tmp, *tmp2; /* (N) scratch for the grouping */
    int nx; /* the most extra runs a token of the unit needs */
    int root_len; /* tokens of the last unit's root segment (prompt and trunk) */
} lay;

/* Rows [t, t + n) of a segment holding tokens d .. d + n - 1 of responses S (root: prompt first,
 * root_p = P, else 0) with ancestor runs `anc`. */
static void put_rows(lay *L, const int *S, int nS, int d, int n, int root_p, const run *anc, int na) {
    const pack_group *g = L->g;
    pack_batch *b = L->b;
    int s0 = L->t;
    if (na - 1 > L->nx) L->nx = na - 1;
    L->t += root_p + n;
    if (!b) return;
    const int *r0 = g->resp[S[0]];
    for (int u = 0; u < root_p + n; u++) {
        int t = s0 + u, j = d + u - root_p; /* j < 0: prompt token P + j */
        b->tokens[t] = j < 0 ? g->prompt[root_p + j] : r0[j];
        if (b->routes)
            pack_route_put(b->routes, b->T, t, j < 0 ? pack_route_src(g, -1, root_p + j) : pack_route_src(g, S[0], j), g->rl,
                           g->rk);
        b->tok_count[t] = nS;
        b->pos[t] = g->P + j;
        if (na) {
            b->kv_a0[t] = anc[0].lo;
            b->kv_a1[t] = anc[0].hi;
            b->kv_b0[t] = s0;
        } else { /* a root token: causal in range a, b empty */
            b->kv_a0[t] = s0;
            b->kv_a1[t] = t + 1;
            b->kv_b0[t] = t + 1;
        }
        b->kv_b1[t] = t + 1;
        for (int x = 0; x < b->nx; x++) {
            b->kv_x0[(size_t)x * b->T + t] = x + 1 < na ? anc[x + 1].lo : t + 1;
            b->kv_x1[(size_t)x * b->T + t] = x + 1 < na ? anc[x + 1].hi : t + 1;
        }
        /* this row predicts token j + 1 of each response it stands for */
        for (int k = 0; j >= -1 && k < nS; k++)
            if (j + 1 < g->R[S[k]]) b->out_pos[L->m0[S[k]] + j + 1] = t;
    }
}

/* anc ⊕ [lo, hi): the runs below a segment at [lo, hi); returns their number (out holds them). */
static int runs_after(const run *anc, int na, int lo, int hi, run *out) {
    for (int i = 0; i < na; i++) out[i] = anc[i];
    if (na && out[na - 1].hi == lo) {
        out[na - 1].hi = hi;
        return na;
    }
    out[na] = (run){lo, hi};
    return na + 1;
}

/* Leaf: response i's tokens d .. R - 1 under ancestors anc. */
static void put_leaf(lay *L, int i, int d, const run *anc, int na) {
    int s = L->s_base + i, n = L->g->R[i] - d;
    if (L->b) {
        L->b->seg_start[s] = L->t;
        L->b->seg_len[s] = n;
        L->b->seg_group[s] = L->gi;
        L->b->seg_resp[s] = i;
        L->b->seg_out0[s] = L->m0[i];
    }
    put_rows(L, &i, 1, d, n, 0, anc, na);
}

/* The key that groups response i under a node whose children start at token e: its token at e,
 * or -1 when it must be a leaf there (its last token is at e, or the layout shares no deeper). */
static int child_key(const lay *L, int i, int e) { return L->tree && e < L->g->R[i] - 1 ? L->g->resp[i][e] : -1; }

/* The node of responses S (nS >= 1, ascending) whose tokens before d its ancestors hold; root:
 * the unit's prompt goes first. The node takes the tokens all of S share from d on, short of
 * each one's last; its children follow. S is reordered in place: children become consecutive
 * slices (in order of their first response), which the recursion reorders within themselves. */
static void put_node(lay *L, int *S, int nS, int d, int root, const run *anc, int na) {
    const pack_group *g = L->g;
    int n = 0;
    if (nS > 1)
        for (;; n++) {
            int ok = 1;
            for (int k = 0; ok && k < nS; k++) ok = d + n < g->R[S[k]] - 1 && g->resp[S[k]][d + n] == g->resp[S[0]][d + n];
            if (!ok) break;
        }
    int lo = L->t, e = d + n;
    if (root) L->root_len = g->P + n;
    put_rows(L, S, nS, d, n, root ? g->P : 0, anc, na);
    run below[ATTN_XR_MAX + 3];
    int nb = runs_after(anc, na, lo, L->t, below);
    /* stable partition by child_key (a -1 alone), scratch only before any recursion */
    int *out = L->tmp, *taken = L->tmp2, no = 0;
    for (int k = 0; k < nS; k++) taken[k] = 0;
    for (int k = 0; L->tree && k < nS; k++) {
        if (taken[k]) continue;
        int key = child_key(L, S[k], e);
        for (int q = k; q < nS; q++)
            if (!taken[q] && (q == k || (key >= 0 && child_key(L, S[q], e) == key))) {
                out[no++] = S[q];
                taken[q] = 1;
            }
    }
    if (L->tree) memcpy(S, out, (size_t)nS * sizeof(int));
    for (int k = 0; k < nS;) {
        int key = child_key(L, S[k], e), c = 1;
        while (key >= 0 && k + c < nS && child_key(L, S[k + c], e) == key) c++;
        run tmp[ATTN_XR_MAX + 3];
        if (c > 1 && runs_after(below, nb, L->t, L->t + 1, tmp) <= 1 + ATTN_XR_MAX) {
            put_node(L, S + k, c, e, 0, below, nb);
        } else {
            for (int q = k; q < k + c; q++) put_leaf(L, S[q], e, below, nb);
        }
        k += c;
    }
}

/* Lays out responses [r0, r0 + n) of g as one unit at packed index L->t (scratch: 3n ints). */
static void put_unit(lay *L, int r0, int n, int *scratch) {
    int *S = scratch;
    L->tmp = scratch + n;
    L->tmp2 = scratch + 2 * n;
    for (int k = 0; k < n; k++) S[k] = r0 + k;
    L->p0 = L->t;
    put_node(L, S, n, 0, 1, NULL, 0);
}

/* The tokens of g's units in a layout and the extra runs they need (*nx); -1 when out of memory. */
static long long group_count(const pack_group *g, pack_layout layout, int *nx) {
    int *scratch = malloc((size_t)3 * (g->N > 0 ? g->N : 1) * sizeof(int));
    if (!scratch) return -1;
    lay L = {.g = g, .tree = layout == PACK_TREE};
    if (layout == PACK_STANDARD)
        for (int i = 0; i < g->N; i++) put_unit(&L, i, 1, scratch);
    else put_unit(&L, 0, g->N, scratch);
    free(scratch);
    if (nx) *nx = L.nx;
    return L.t;
}

long long pack_group_tokens(const pack_group *g, pack_layout layout) {
    if (layout == PACK_STANDARD) return (long long)g->N * g->P + group_resp_tokens(g);
    long long t = group_count(g, layout, NULL);
    return t >= 0 ? t : (long long)g->N * g->P + group_resp_tokens(g); /* out of memory: the most it can be */
}

/* ---------- building one micro-batch ---------- */

int pack_build(pack_batch *b, const pack_group *groups, int first, int count, pack_layout layout) {
    memset(b, 0, sizeof *b);
    long long T = 0, M = 0, rl = 0, rk = 0;
    int G = 0, S = 0, nx = 0, maxN = 1;
    for (int k = 0; k < count; k++) {
        const pack_group *g = &groups[first + k];
        assert(g->P >= 1 && g->N >= 1);
        if (pack_has_routes(g)) rl = g->rl, rk = g->rk;
        int gx = 0;
        long long t = group_count(g, layout, &gx);
        if (t < 0) return err_set(GE_NOMEM, "pack_build: the trie of a group of %d responses", g->N);
        T += t;
        nx = gx > nx ? gx : nx;
        M += group_resp_tokens(g);
        S += g->N;
        G += layout == PACK_STANDARD ? g->N : 1;
        maxN = g->N > maxN ? g->N : maxN;
    }
    if (T > 0x7fffffffLL) return err_set(GE_TOO_LARGE, "micro-batch of %lld tokens exceeds the int index range", T);

    /* One block holds every array; tokens is its start, so pack_batch_free frees it. */
    size_t n_int = (size_t)(7 + 2 * nx) * T + (size_t)(G + 1) + (size_t)4 * G + (size_t)6 * S + (size_t)2 * M + (size_t)4 * maxN;
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
    TAKE_(kv_x0, (size_t)nx * T);
    TAKE_(kv_x1, (size_t)nx * T);
#undef TAKE_
    int *m0 = q, *scratch = q + maxN; /* (maxN) each response's first prediction; (3 maxN) trie scratch */
    assert(scratch + 3 * maxN <= blk + (n_int ? n_int : 1));
    if (!nx) b->kv_x0 = b->kv_x1 = NULL;
    b->T = (int)T;
    b->nx = nx;
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
        for (int i = 0; i < g->N; i++) {
            m0[i] = m;
            for (int j = 0; j < g->R[i]; j++) b->out_tok[m + j] = g->resp[i][j];
            m += g->R[i];
        }
        lay L = {.g = g, .b = b, .tree = layout == PACK_TREE, .gi = gi, .t = t, .s_base = s, .m0 = m0};
        int units = layout == PACK_STANDARD ? g->N : 1, per = layout == PACK_STANDARD ? 1 : g->N;
        for (int u = 0; u < units; u++, gu++) {
            b->cu_seqlens[gu] = L.t;
            b->grp_seg0[gu] = s + u * per;
            b->grp_nseg[gu] = per;
            put_unit(&L, u * per, per, scratch);
            b->grp_plen[gu] = L.root_len;
        }
        t = L.t;
        s += g->N;
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
        if (layout == PACK_STANDARD)
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
