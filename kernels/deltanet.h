/* deltanet.h — the gated DeltaNet token mixer of Qwen3.5 / Qwen3-Next linear-attention layers, as
 * transformers computes it (Qwen3_5GatedDeltaNet with its torch fallbacks causal_conv1d_fn,
 * torch_chunk_gated_delta_rule, Qwen3_5RMSNormGated), in three ops:
 *
 *   conv:  u = silu(depthwise causal conv1d(x))       x = ln1 in_proj_qkv^T (T,Cc), Kc taps, no bias
 *   rule:  per value head h, key head h / (Hv/Hk) (transformers' repeat_interleave), token by token:
 *            q = l2norm(u_q) / sqrt(Dk), k = l2norm(u_k)       l2norm(x) = x / sqrt(Σx² + 1e-6)
 *            g = -exp(A_log) softplus(a + dt_bias), β = sigmoid(b)
 *            S = e^g S_prev;  S += k (β (v - S^T k))^T;  o = S^T q        S (Dk,Dv), fp32
 *   norm:  y = w ⊙ o rsqrt(mean(o²) + eps) ⊙ silu(z)   per value head (Dv)
 *
 * The rule is the recurrent form (one state update per token, what decode runs). transformers
 * trains with the chunked form (chunks of 64, a UT transform inside each); the two are the same
 * function, and tests/fixtures/make_hybrid_reference.py checks they agree to ~1e-7. The CUDA
 * forward is the chunked form (kernels/deltanet_chunk.cu), checked against this reference.
 *
 * Which state a token continues is read from the attention ranges (kernels/attention.h) of the
 * packed layout (engine/model/pack.h): a token whose own causal run [b0, b1) — or single range
 * [a0, a1) — starts before it continues token t - 1; the first token of a response (t == b0)
 * continues the last token of its prefix range (a1 - 1): the prompt's final state and conv tail,
 * so [P; R_1..R_N] packed once equals N sequences [P; R_i]. The backward sums every successor's
 * state and conv-input gradients into the token it continued (a prompt's last token collects
 * the N responses'). deltanet_prev is that rule; a range starting at the token itself and no
 * prefix means a fresh state (zeros) and a zero-padded conv.
 *
 * Legend: T tokens, Hk key heads, Hv value heads (a multiple of Hk), Dk key head dim, Dv value
 * head dim, Kc conv taps, Cc = 2 Hk Dk + Hv Dv conv channels (q, k, v back to back, each
 * head-major). Every backward writes its input gradients and ADDS its weight gradients. */
#ifndef GRPOD_DELTANET_H
#define GRPOD_DELTANET_H
#include "kernels/attention.h"

/* The row whose state (and conv history) token t continues when the ranges index rows and
 * token t is row row0 + t; -1: none. A row below row0 is outside the call (deltanet_carry). */
static inline int deltanet_prev_row(attn_ranges r, int t, int row0) {
    int row = row0 + t;
    if (r.b1[t] > r.b0[t]) return row > r.b0[t] ? row - 1 : (r.a1[t] > r.a0[t] ? r.a1[t] - 1 : -1);
    return row > r.a0[t] ? row - 1 : -1;
}
/* The token whose state (and conv history) token t continues; -1: none. */
static inline int deltanet_prev(attn_ranges r, int t) { return deltanet_prev_row(r, t, 0); }

/* A run that continues across calls (engine/model/split.c: a group's prompt in one call, its
 * responses in micro-batches after it). NULL: a call holds every token it continues.
 *
 * In: with row0 > 0 the ranges index rows and token t is row row0 + t; a token that continues a
 * row below row0 (deltanet_prev_row) continues row row0 - 1, whose state after it is s_in and
 * whose conv inputs, with the Kc - 2 before it along its own run, are tail_in. The backwards
 * ADD the gradients of s_in and tail_in into ds_in and dtail_in (each token's in token order).
 * Out (row0 == 0): the forwards write the state after token T - 1 to s_out and the conv inputs
 * of T - 1 and the Kc - 2 tokens before it along deltanet_prev to tail_out (zeros before the
 * run's start); the backwards take ds_out and dtail_out, the gradients of those, as gradient
 * from outside (a response micro-batch's ds_in, summed over the micro-batches).
 * state (Hv,Dk,Dv), tail (Kc-1,Cc) oldest first: deltanet_decode.h's row layout. A pointer
 * NULL: not read or written (a forward-only pass has no gradients; an op uses its half). */
typedef struct {
    int row0;
    const float *s_in, *tail_in;
    float *ds_in, *dtail_in;
    float *s_out, *tail_out;
    const float *ds_out, *dtail_out;
} deltanet_carry;

void deltanet_conv_fwd_cpu(float *u, const float *x, const float *w, attn_ranges r, const deltanet_carry *cy, int T, int Cc,
                           int Kc);
/* u, x (T,Cc); w (Cc,Kc) conv1d.weight (Cc,1,Kc): u_t = silu(Σ_j w_j x_{t-(Kc-1)+j}), the
 * earlier tokens found through deltanet_prev (zeros before the first); cy: tail_in, tail_out */
void deltanet_conv_bwd_cpu(float *dx, float *dw, const float *du, const float *x, const float *w, attn_ranges r,
                           const deltanet_carry *cy, int T, int Cc, int Kc);
/* dx (T,Cc) written; dw (Cc,Kc) +=; cy: tail_in, dtail_in +=, dtail_out */

void deltanet_rule_fwd_cpu(float *o, float *states, const float *u, const float *a, const float *b, const float *A_log,
                           const float *dt_bias, attn_ranges r, const deltanet_carry *cy, int T, int Hk, int Hv, int Dk, int Dv);
/* o (T,Hv,Dv) written; u (T,Cc) the conv's output; a, b (T,Hv) in_proj_a / in_proj_b outputs;
 * A_log, dt_bias (Hv); states (T,Hv,Dk,Dv) scratch: each token's state after it (written).
 * The states/dstates sizes here are the reference's; a backend's are eng_backend.deltanet_scratch
 * (CUDA keeps checkpoints every 64 tokens and the chunked forward's U, W, P instead:
 * kernels/deltanet.cu, kernels/deltanet_chunk.cu). cy: s_in, s_out. */
void deltanet_rule_bwd_cpu(float *du, float *da, float *db, float *dA_log, float *ddt_bias, float *states, float *dstates,
                           const float *dout, const float *u, const float *a, const float *b, const float *A_log,
                           const float *dt_bias, attn_ranges r, const deltanet_carry *cy, int T, int Hk, int Hv, int Dk, int Dv);
/* du (T,Cc), da, db (T,Hv) written; dA_log, ddt_bias (Hv) +=; states, dstates (T,Hv,Dk,Dv)
 * scratch (the forward's states are recomputed into states); cy: s_in, ds_in +=, ds_out */

void deltanet_norm_fwd_cpu(float *y, float *rstd, const float *o, const float *z, const float *w, int T, int Hv, int Dv, float eps);
/* y, o, z (T,Hv,Dv); rstd (T,Hv) written; w (Dv) */
void deltanet_norm_bwd_cpu(float *dout, float *dz, float *dw, const float *dy, const float *o, const float *z, const float *w,
                           const float *rstd, int T, int Hv, int Dv);
/* dout, dz (T,Hv,Dv) written; dw (Dv) += */
#endif
