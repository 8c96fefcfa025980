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
 * Legend: L layers, r rank, I/O a projection's input/output width. */
#ifndef GRPOD_LORA_H
#define GRPOD_LORA_H
#include <stdint.h>

#include "engine/model/model.h"

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
