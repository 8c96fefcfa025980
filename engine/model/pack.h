/* pack.h — packing prompt groups into micro-batches: grpod's P + NR layout.
 *
 * A micro-batch holds whole groups. Group g is laid out [P_g; R_g1; ...; R_gN] in packed order
 * (P + ΣR tokens, not N(P+R)). Positions: prompt 0..P-1, every response restarts at P.
 * Trees (PACK_TREE): the responses of a group form a token trie: the tokens several responses
 * share beyond the prompt (turns in common, then branches, at any depth) are laid out once. A
 * unit is laid out depth first: the root segment [P_g, trunk] (the tokens all responses share),
 * then each child in the order of its first response — a shared node (the tokens a subset
 * shares, then its own children) or a leaf (one response's own tokens, always at least its
 * last). Each response's prediction of token j reads the row of its token j - 1 wherever that
 * row sits (several predictions may read one row; the logprob head's backward adds them).
 * PACK_PACKED shares the trunk only (every child of the root a leaf: [P_g, trunk; R_g1[c:]; ...]),
 * the layout for models whose recurrent layers carry state along ranges a and b only.
 * The STANDARD layout is the same struct with each response in a group of its own that carries
 * a copy of the prompt (N(P+R) tokens): the equivalence tests run one code path on all three.
 *
 * Attention semantics, per packed token t: t attends to the keys in [kv_a0[t], kv_a1[t]), in
 * [kv_b0[t], kv_b1[t]) and in the nx extra ranges [kv_x0[x T + t], kv_x1[x T + t]) (packed
 * indices; any range may be empty): its ancestors' segments, consecutive ones merged into one
 * run (a first child follows its parent), and itself causally.
 *   root (prompt or trunk) token i of g:  a = [p0, p0 + i + 1),  b = empty, extras empty
 *   any other token at offset u of its segment s0:  a = the first run (from p0), b = [s0, s0 + u + 1),
 *                                                   extras = the further runs, in packed order
 * A shared node is made only where the runs below it fit in 1 + ATTN_XR_MAX; past that its
 * responses become leaves (less sharing, the same result).
 * Logits are needed only where they predict a response token: out_pos[m] is the packed token
 * whose hidden state predicts out_tok[m] (the last prompt token for a response's first token).
 *
 * Legend: T packed tokens, G groups, S response segments (all groups), M predicted tokens. */
#ifndef GRPOD_PACK_H
#define GRPOD_PACK_H
#include <stddef.h>

#include "kernels/attention.h"

/* One prompt group as the engine receives it (the caller owns the arrays). */
typedef struct {
    const int *prompt; /* (P) */
    int P;
    int N; /* responses */
    const int *const *resp; /* N arrays, resp[i] of length R[i] */
    const int *R; /* (N) */
    /* MoE routing replay (model.h model_input.routes), or NULL: each token's experts, W = rl·rk
     * ints a token (rl MoE layers of rk each), token-major; a token whose first is -1 (or in an
     * array that is NULL) takes the router's own top-k. A shared token takes its first response's. */
    const int *prompt_routes; /* (P, W) */
    const int *const *resp_routes; /* N arrays (R[i], W), an array NULL: none */
    int rl, rk;
} pack_group;

typedef enum { PACK_PACKED = 0, PACK_STANDARD = 1, PACK_TREE = 2 } pack_layout;

typedef struct {
    int T, G, S, M;
    int *tokens; /* (T) token ids */
    int *pos; /* (T) RoPE positions */
    int *kv_a0, *kv_a1; /* (T) first key range, packed indices [a0, a1) */
    int *kv_b0, *kv_b1; /* (T) second key range [b0, b1), empty when b0 == b1 */
    int nx; /* extra key ranges a token (PACK_TREE; 0 otherwise), at most ATTN_XR_MAX */
    int *kv_x0, *kv_x1; /* (nx, T) the extra ranges [x0, x1), NULL when nx == 0 */
    int *tok_count; /* (T) the tokens of the standard layout each one stands for: N for a prompt
                     * token of a packed group of N responses, else 1 (the MoE balance statistics) */
    int *cu_seqlens; /* (G + 1) packed start of each group, cu_seqlens[G] == T */
    int *grp_plen; /* (G) root segment of each group: its prompt and trunk (P + c) */
    int *grp_seg0, *grp_nseg; /* (G) first segment index and number of responses */
    int *seg_start, *seg_len; /* (S) packed start and length of each response's leaf (its own tokens) */
    int *seg_group; /* (S) source group index (into the caller's pack_group array) */
    int *seg_resp; /* (S) response index within that source group */
    int *seg_out0; /* (S) index of the segment's first predicted token in out_* */
    int *out_pos; /* (M) packed token whose logits predict out_tok */
    int *out_tok; /* (M) target token id */
    int *routes; /* (rl, T, rk) when a group has routes (pack_group), else NULL: model_input.routes */
} pack_batch;

/* Routing replay: the routes of response ri's token j (ri -1: the prompt's token j) of g, or NULL. */
static inline const int *pack_route_src(const pack_group *g, int ri, int j) {
    const int *a = ri < 0 ? g->prompt_routes : g->resp_routes ? g->resp_routes[ri] : NULL;
    return a ? a + (size_t)j * g->rl * g->rk : NULL;
}
/* Token t of dst (rl, T, rk) takes src's routes (W ints, token-major); src NULL: left as it is
 * (the -1s dst starts with: memset 0xff). */
static inline void pack_route_put(int *dst, int T, int t, const int *src, int rl, int rk) {
    for (int l = 0; src && l < rl; l++)
        for (int s = 0; s < rk; s++) dst[((size_t)l * T + t) * rk + s] = src[l * rk + s];
}
static inline int pack_has_routes(const pack_group *g) { return g->rl > 0 && (g->prompt_routes || g->resp_routes); }

/* Build one micro-batch from groups[first .. first + count) in the given layout.
 * Returns 0, or GE_NOMEM. The batch owns its arrays: pack_batch_free. */
int pack_build(pack_batch *b, const pack_group *groups, int first, int count, pack_layout layout);
void pack_batch_free(pack_batch *b);

/* Tokens a group occupies in a layout: P + ΣR - (N-1)·c (packed), P + the trie's segments (tree),
 * or N·P + ΣR (standard). */
long long pack_group_tokens(const pack_group *g, pack_layout layout);

/* Micro-batch plan: consecutive runs of whole groups whose tokens fit max_tokens.
 * mb_first[k], mb_count[k] for k < n_mb. A group larger than max_tokens is a micro-batch of its
 * own with mb_split[k] = 1 (packed and tree layouts): engine/model/split.h runs it as its prompt once and its
 * responses in micro-batches of at most max_tokens response tokens each, attending to the
 * prompt's cached keys (without sharing its responses' common tokens). A response longer than max_tokens (a response is never cut), or any
 * group over max_tokens in the standard layout, is GE_TOO_LARGE with a message naming the group
 * and its size. The plan owns its arrays: pack_plan_free. */
typedef struct {
    int n_mb;
    int *mb_first, *mb_count, *mb_split;
} pack_plan;
int pack_plan_make(pack_plan *p, const pack_group *groups, int n_groups, long long max_tokens, pack_layout layout);
void pack_plan_free(pack_plan *p);
#endif
