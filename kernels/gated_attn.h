/* gated_attn.h — what Qwen3.5's / Qwen3-Next's full-attention layers add around the ordinary
 * attention op (kernels/attention.h), as transformers computes it (Qwen3_5Attention):
 *
 *   qg = ln1 q_proj^T (T,H,2D): per head the query, then its output gate (torch.chunk on 2D)
 *   q = rope_R(rmsnorm(qg's query) w_q), k = rope_R(rmsnorm(k0) w_k)   per head, over D
 *   out = attention(q, k, v) ⊙ sigmoid(qg's gate)                          before o_proj
 *
 * rope_R rotates the first R of D dims only (partial_rotary_factor = R/D): pairs (i, i + R/2)
 * for i < R/2 with inv_freq (R/2); dims R..D-1 pass through. The norm weights are the gains as
 * applied (engine/model/model.h: a zero-centred checkpoint weight w is held as 1 + w).
 * Legend: T tokens, H heads, K kv heads, D head dim, R rotary dims. Backwards write their input
 * gradients (dqg only the half they own) and ADD the weight gradients. */
#ifndef GRPOD_GATED_ATTN_H
#define GRPOD_GATED_ATTN_H

void gated_attn_qk_fwd_cpu(float *q, float *k, float *rstdq, float *rstdk, const float *qg, const float *k0, const float *wq,
                           const float *wk, const int *pos, const float *inv_freq, int T, int H, int K, int D, int R, float eps);
/* q (T,H,D), k (T,K,D), rstdq (T,H), rstdk (T,K) written; qg (T,H,2D), k0 (T,K,D); wq, wk (D) */
void gated_attn_qk_bwd_cpu(float *dqg, float *dk0, float *dwq, float *dwk, const float *dq, const float *dk, const float *qg,
                           const float *k0, const float *wq, const float *wk, const float *rstdq, const float *rstdk,
                           const int *pos, const float *inv_freq, int T, int H, int K, int D, int R);
/* dqg's query halves (T,H,2D) and dk0 (T,K,D) written; dwq, dwk (D) += */

void gated_attn_gate_fwd_cpu(float *y, const float *att, const float *qg, int T, int H, int D);
/* y, att (T,H,D) */
void gated_attn_gate_bwd_cpu(float *datt, float *dqg, const float *dy, const float *att, const float *qg, int T, int H, int D);
/* datt (T,H,D) and dqg's gate halves written */
#endif
