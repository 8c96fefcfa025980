/* embedding.h — token embedding lookup and its backward (scatter-add into the table).
 * Legend: T tokens, C model dim, V vocab. */
#ifndef GRPOD_EMBEDDING_H
#define GRPOD_EMBEDDING_H
void embedding_fwd_cpu(float *out, const int *tokens, const float *wte, int T, int C);
/* out (T,C) = wte[tokens[t]]; tokens (T) in [0, V); wte (V,C) */
void embedding_bwd_cpu(float *dwte, const float *dout, const int *tokens, int T, int C);
/* dwte (V,C) += scatter of dout (T,C) by token; tokens may repeat */
#endif
