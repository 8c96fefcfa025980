/* config.h — a Hugging Face config.json as grpod understands it: Qwen2/Qwen2.5 (QKV bias),
 * Qwen3 dense (q/k RMSNorm), Llama 3 (rope_scaling type llama3). Anything else is refused with
 * a message naming the file and the setting. */
#ifndef GRPOD_CONFIG_H
#define GRPOD_CONFIG_H

typedef enum { ARCH_QWEN2, ARCH_QWEN3, ARCH_LLAMA } model_arch;

typedef struct {
    model_arch arch;
    char arch_name[16];         /* "qwen2" | "qwen3" | "llama" (config.json's model_type) */
    int L;                      /* layers */
    int C, H, K, D, F, V;       /* model dim, heads, kv heads, head dim, MLP dim, vocab */
    int max_pos;
    float eps, rope_theta;
    int tied;                   /* lm_head shares the embedding */
    int qkv_bias, o_bias;       /* biases on q/k/v projections, on o_proj */
    int qk_norm;                /* Qwen3 per-head RMSNorm of q and k */
    float rope_factor;          /* llama3 scaling; 0 = none */
    float rope_low, rope_high;
    int rope_orig_max;
    int bos_id;                 /* -1 if none */
    int eos_ids[8], n_eos;      /* config.json and generation_config.json, merged */
    char dtype[16];             /* torch_dtype as written */
} model_config;

int config_load(const char *dir, model_config *c);
/* Parameter count (tied embeddings counted once). */
long long config_n_params(const model_config *c);
/* Write config.json (and generation_config.json) describing c into dir. */
int config_write(const char *dir, const model_config *c);
#endif
