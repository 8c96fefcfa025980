/* rmsnorm.h — RMSNorm as Llama/Qwen define it: y = w * x / sqrt(mean(x^2) + eps), with the
 * statistics in fp32. Also serves the per-head q/k norm of Qwen3 (rows = T*H, C = D).
 * Two fused neighbours save whole passes over the activations on the GPU; here they are the
 * plain composition of the ops they replace:
 *   qk_norm_rope_*    Qwen3's per-head q/k norm, then RoPE (rope.h), and its backward
 *   qkv_rope_fwd      what runs between the q/k/v projections and attention: q/k norm (if any)
 *                     and RoPE of q and k, k and v written to their (KV-cache) rows
 * Legend: T rows (tokens for the q/k ops), C normalised width, H heads, D head dim. */
#ifndef GRPOD_RMSNORM_H
#define GRPOD_RMSNORM_H
void rmsnorm_fwd_cpu(float *out, float *rstd, const float *inp, const float *w, int T, int C, float eps);
/* out (T,C), rstd (T) saved for backward = 1/sqrt(mean(x^2)+eps), inp (T,C), w (C) */
void rmsnorm_bwd_cpu(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd, int T, int C);
/* dinp (T,C) += d/dx; dw (C) += d/dw. dinp may not alias dout. */

void qk_norm_rope_fwd_cpu(float *out, float *rstd, const float *inp, const float *w, const int *pos, const float *inv_freq, int T,
                          int H, int D, float eps);
/* out (T,H,D) = rope(rmsnorm over each head's D of inp (T,H,D), w (D)); rstd (T*H); pos (T) */
void qk_norm_rope_bwd_cpu(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd,
                          const int *pos, const float *inv_freq, int T, int H, int D);
/* dinp (T,H,D) = d/d inp (written, not added), dw (D) += d/dw, given dout (T,H,D) the gradient
 * of the rotated output; dinp may not alias dout */

/* The pointers of qkv_rope_fwd: element type float here, bf16 on CUDA. */
typedef struct {
    void *q_out; /* (T,H,D); may alias q when qw is NULL */
    void *k_out, *v_out; /* (S,K,D): row rows[t] gets token t (rows NULL: row t) */
    float *rstd_q, *rstd_k; /* (T*H), (T*K) saved for backward; NULL: not kept */
    const void *q, *k, *v; /* (T,H,D), (T,K,D), (T,K,D) from the projections */
    const void *qw, *kw; /* (D) q/k norm weights; NULL: no norm (Llama), RoPE only */
    const int *rows; /* (T) or NULL */
} qkv_rope_io;
void qkv_rope_fwd_cpu(const qkv_rope_io *io, const int *pos, const float *inv_freq, int T, int H, int K, int D, float eps);
/* q_out = rope(qk-norm(q)); k_out[rows[t]] = rope(qk-norm(k[t])); v_out[rows[t]] = v[t] (nothing
 * moves when v_out == v and rows is NULL); norms as qk_norm_rope_fwd_cpu when qw / kw are set */
#endif
