/* attention.h — grouped-query attention over packed micro-batches with two key ranges per query.
 *
 * Query t attends to keys [a0[t], a1[t]) and [b0[t], b1[t]) (packed token indices), and to nx
 * extra ranges (below; a token of a prefix tree sees its ancestors' runs), which
 * expresses causal attention, prefix self-attention and the shared-prefix two-region pattern
 * alike (engine/model/pack.h builds the ranges): a response token sees its group's prompt (range a)
 * and its own response causally (range b), never another response. Scale 1/sqrt(D); query
 * head h reads kv head h / (H/K). The forward saves lse = logsumexp of the scaled scores.
 * In backward every query adds into dk/dv of the keys it saw, so a prompt's dK/dV collects the
 * sum over all N responses — exactly what N copies of the prompt would receive in total.
 * The ranges index the rows of k and v, which may be a KV cache with more rows than q has
 * (decode: one query per response, keys in the cache); in training k/v rows are the tokens.
 * Legend: T queries, S key rows, H query heads, K kv heads, D head dim. */
#ifndef GRPOD_ATTENTION_H
#define GRPOD_ATTENTION_H

/* Extra ranges (prefix trees, engine/model/pack.h): nx more per query, [x0[i T + t], x1[i T + t])
 * for i < nx, nx <= ATTN_XR_MAX. Callers that leave them out (nx 0, x0 x1 NULL) get two. */
enum { ATTN_XR_MAX = 4 };
typedef struct {
    const int *a0, *a1, *b0, *b1; /* each (T) */
    const int *x0, *x1; /* each (nx, T), or NULL */
    int nx;
} attn_ranges;

void attention_fwd_cpu(float *out, float *lse, const float *q, const float *k, const float *v, attn_ranges r, int T, int H, int K,
                       int D);
/* out (T,H,D), lse (T,H), q (T,H,D), k (S,K,D), v (S,K,D) */
void attention_bwd_cpu(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k, const float *v,
                       const float *out, const float *lse, attn_ranges r, int T, int H, int K, int D);
/* dq (T,H,D) overwritten; dk, dv (S,K,D) += */
#endif
