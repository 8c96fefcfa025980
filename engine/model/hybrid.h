/* hybrid.h — the attention kinds of hybrid linear-attention models (Qwen3.5), composed from the
 * backend table's ops: rows ATTN_GATED and ATTN_DELTANET of model.c's attn_kinds. Internal to
 * engine/model/. Same contract as every attention kind there: the forward reads A->x (T,C) and
 * writes A->xm = A->x + attention(rmsnorm(A->x)); the backward takes d A->xm in a->dres and
 * leaves d A->x there, ADDING weight gradients into g. With a cache (decode, no grad) the gated
 * kind writes and reads K/V rows as full attention does, the DeltaNet kind its state rows
 * (kv_k the recurrent states, kv_v the conv tails: model.h's model_kv); the backwards are the
 * training pass's only. In a split group's passes (engine/model/split.h) the gated kind reads and
 * writes the KV cache as full attention does (model_attn_keys_begin), and the DeltaNet kind hands
 * its prompt's end to the responses through a->carry (model.h model_dn_carry). */
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
