/* matmul.h — the linear layer y = x W^T + b with W stored (O, I) as Hugging Face stores it, and
 * the MLP's input side (mlp_in_fwd: the gate and up projections and SwiGLU, one launch on CUDA
 * at decode sizes, so it lives with the GEMMs).
 * Legend: T rows (tokens), I input features, O output features, F MLP dim. */
#ifndef GRPOD_MATMUL_H
#define GRPOD_MATMUL_H
void matmul_fwd_cpu(float *out, const float *inp, const float *w, const float *bias, int T, int I, int O);
/* out (T,O) = inp (T,I) · w (O,I)^T + bias (O) [bias may be NULL] */
void matmul_bwd_cpu(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w, int T, int I, int O);
/* dinp (T,I) += dout · w;  dw (O,I) += dout^T · inp;  dbias (O) += Σ_t dout. Any output may be
 * NULL (not needed: a frozen weight, or the embedding input). */
void mlp_in_fwd_cpu(float *act, float *gate, float *up, const float *inp, const float *wg, const float *wu, int T, int I, int F);
/* the MLP's input side: gate = inp wg^T, up = inp wu^T (matmul_fwd_cpu, no bias), act =
 * swiglu_fwd of them; inp (T,I), wg, wu (F,I), act, gate, up (T,F) */
#endif
