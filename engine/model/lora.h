/* lora.h — LoRA adapters over a frozen base (the policy is base + adapters, the reference the
 * base alone: the same weights with the adapters' views left NULL).
 *
 * Target t (LORA_Q .. LORA_DOWN, model.h) of every layer gets A (r, I) and B (O, r); its
 * projection becomes y = x W^T + s (x A^T) B^T with s = alpha / r. The adapters live in one flat
 * buffer of their own (m->lparams: every A first, then every B; PEFT's key names), so AdamW,
 * the gradient norm and the checkpoint see only them. The buffer holds B in its stored form
 * B' = s B: the forward is then two plain matmuls (model.c lora_a, then the term inside the
 * base projection: mm_part.lr), and the optimizer is exact on B' by stepping the B part with
 * lr·s, weight decay wd/s on the true gradient s·dL/dB' (eng_update). Host conversions here (init, PEFT load/save, merge) handle s; the
 * model never sees it.
 *
 * Mixture-of-experts models are adapted as PEFT (0.18+) adapts them on transformers 5, where each
 * MoE layer's experts are two 3-D parameters, gate_up_proj (E, 2Fm, C) and down_proj (E, C, Fm):
 * the targets gate+up (together) and down become PEFT's target_parameters ["gate_up_proj",
 * "down_proj"], lora.ParamWrapper adapters of rank 2r (alpha 2·alpha: rank_pattern and
 * alpha_pattern, the scale still alpha / r) and r, one A (E·r_t, in) and one B (out, E·r_t) per
 * layer in PEFT's files, expert e's term s Σ_k B[:, k·E + e] A[e·r_t + k, :]. The buffer keeps A
 * as the file does (E, r_t, in) and B expert-major (E, out, r_t) for the expert op
 * (kernels/moe.h moe_lora); PEFT load/save permute B. The dense layers of such a model
 * (mlp_only_layers) get no MLP adapter, as under PEFT. File names: gate_up's adapter is
 * layers.L.mlp.experts.base_layer.lora_{A,B}.weight when down is adapted too (the two wrappers
 * nest, gate_up inside), down's layers.L.mlp.experts.lora_{A,B}.weight.
 * Legend: L layers, r rank, I/O a projection's input/output width, E experts, Fm expert MLP dim. */
#ifndef GRPOD_LORA_H
#define GRPOD_LORA_H
#include <stdint.h>

#include "engine/model/model.h"

/* The rank of adapter slot j: the seven projections' (LORA_Q..LORA_DOWN) r, the experts'
 * (LORA_N + LORA_EGU / LORA_EDOWN) 2r for the fused gate_up_proj and r for down_proj. */
static inline int lora_rank_of(const model *m, int j) { return j == LORA_N + LORA_EGU ? 2 * m->lora_r : m->lora_r; }

/* "q,k,v,o,gate,up,down" (or PEFT's "q_proj", ..., or "all") -> a bit per target. GE_INVALID
 * naming the bad name. */
int lora_parse_targets(const char *s, unsigned *mask);
/* The targets as PEFT module names, comma-separated, into out. */
void lora_targets_str(unsigned mask, char *out, size_t n);
/* Adds the adapter table to m (after model_init): r > 0, targets != 0. */
int lora_init(model *m, int r, float alpha, unsigned targets);
/* Fills v->layers[*].la/lb from an adapter buffer laid out as m->lparams (esize bytes an element). */
void lora_views(const model *m, void *base, size_t esize, model_views *v);
/* Gradient views for training the adapters alone: the base's weight gradients NULL (no
 * weight-gradient GEMMs), the norms' into sink (max(C, D) floats, discarded: the norm backward
 * kernels always write one), the adapters' into grad (laid out as m->lparams, fp32). */
int lora_grad_views(const model *m, float *grad, float *sink, model_views *g);
/* Fresh adapters in stored form into host (m->l_elems floats): A ~ U(-1/sqrt(I), 1/sqrt(I))
 * (PEFT's kaiming_uniform_(a=sqrt(5))) from seed, B = 0. */
void lora_init_host(const model *m, float *host, uint64_t seed);
/* r, lora_alpha and target_modules of DIR/adapter_config.json (a PEFT LoRA adapter). */
int lora_read_config(const char *dir, int *r, float *alpha, unsigned *targets);
/* DIR/adapter_model.safetensors into host (stored form). Missing or misshapen tensors are
 * errors naming the file and tensor. */
int lora_load_peft(const model *m, const char *dir, float *host);
/* Writes DIR/adapter_model.safetensors (fp32, true B) and DIR/adapter_config.json. */
int lora_save_peft(const model *m, const char *dir, const float *host, const char *base_model);
/* base (m->n_elems, host fp32) += s B A for every adapter: the merged weights. */
void lora_merge_host(const model *m, float *base, const float *host);
#endif
