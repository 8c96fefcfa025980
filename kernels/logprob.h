/* logprob.h — the lm-head fused with log-softmax: for each predicted token m, the logprob of
 * its target and the entropy of the distribution, from the hidden state at out_pos[m], without
 * ever holding [M × V] logits (the CPU works one row at a time; CUDA in token chunks).
 *   z = (h · W^T) / temperature;  logp = z[target] - logsumexp(z);  H = logsumexp(z) - Σ p z
 * Backward recomputes the row's logits:
 *   dz_j = dlogp (1[j = target] - p_j) - dent p_j (z_j - Σ p z);  dlogits = dz / temperature
 * Legend: T tokens, C model dim, V vocab, M predicted tokens. */
#ifndef GRPOD_LOGPROB_H
#define GRPOD_LOGPROB_H
void logprob_fwd_cpu(float *logp, float *ent, const float *h, const int *out_pos, const int *out_tok, const float *w, int M,
                     int C, int V, float temperature);
/* logp (M); ent (M) or NULL; h (T,C) final-norm output; out_pos, out_tok (M); w (V,C) */
void logprob_bwd_cpu(float *dh, float *dw, const float *dlogp, const float *dent, const float *h, const int *out_pos,
                     const int *out_tok, const float *w, int M, int C, int V, float temperature);
/* dh (T,C) += (rows at out_pos; a row may be hit by several m); dw (V,C) += or NULL (frozen);
 * dlogp (M); dent (M) or NULL */

/* The K most likely tokens of each prediction m under the same distribution as logprob_fwd's:
 * ids (M,K) by logprob descending, the lowest id first on ties (-1 past V), lps (M,K) their
 * z_j - logsumexp(z), computed as logprob_fwd computes z and logsumexp, so a listed token's
 * logprob equals the one logprob_fwd gives it as the target (bit-equal on one backend).
 * h (T,C); out_pos (M); w (V,C). */
void logprob_top_cpu(int *ids, float *lps, const float *h, const int *out_pos, const float *w, int M, int C, int V,
                     float temperature, int K);

/* Sampling support: the full logits of a few rows (prefill's last token, decode steps).
 * logits (R,V) = h[pos[r]] · W^T;  h (T,C), pos (R). */
void lm_head_rows_cpu(float *logits, const float *h, const int *pos, const float *w, int R, int C, int V);
#endif
