/* hybrid.h — the attention kinds of hybrid linear-attention models (Qwen3.5), composed from the
 * backend table's ops: rows ATTN_GATED and ATTN_DELTANET of model.c's attn_kinds. Internal to
 * engine/model/. Same contract as every attention kind there: the forward reads A->x (T,C) and
 * writes A->xm = A->x + attention(rmsnorm(A->x)); the backward takes d A->xm in a->dres and
 * leaves d A->x there, ADDING weight gradients into g. Neither kind reads or writes a KV cache
 * (model_forward refuses one for these models): the training and scoring passes only. */
#ifndef GRPOD_HYBRID_H
#define GRPOD_HYBRID_H
#include "engine/model/model.h"

void hybrid_gated_fwd(const model *m, const model_views *w, model_acts *a, int l, const model_dev_input *d, void *kv_k, void *kv_v);
void hybrid_gated_bwd(const model *m, const model_views *w, const model_views *g, model_acts *a, int l, const model_dev_input *d);
void hybrid_deltanet_fwd(const model *m, const model_views *w, model_acts *a, int l, const model_dev_input *d, void *kv_k,
                         void *kv_v);
void hybrid_deltanet_bwd(const model *m, const model_views *w, const model_views *g, model_acts *a, int l,
                         const model_dev_input *d);
#endif
