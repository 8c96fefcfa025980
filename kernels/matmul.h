/* matmul.h — the linear layer y = x W^T + b with W stored (O, I) as Hugging Face stores it.
 * Legend: T rows (tokens), I input features, O output features. */
#ifndef GRPOD_MATMUL_H
#define GRPOD_MATMUL_H
void matmul_fwd_cpu(float *out, const float *inp, const float *w, const float *bias, int T, int I, int O);
/* out (T,O) = inp (T,I) · w (O,I)^T + bias (O) [bias may be NULL] */
void matmul_bwd_cpu(float *dinp, float *dw, float *dbias, const float *dout, const float *inp,
                    const float *w, int T, int I, int O);
/* dinp (T,I) += dout · w;  dw (O,I) += dout^T · inp;  dbias (O) += Σ_t dout. Any output may be
 * NULL (not needed: a frozen weight, or the embedding input). */
#endif
