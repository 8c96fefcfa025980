/* config.h — a Hugging Face config.json as grpod understands it: Qwen2/Qwen2.5 (QKV bias),
 * Qwen3 dense (q/k RMSNorm), Qwen3-MoE (Qwen3's attention, a mixture-of-experts MLP in the
 * layers transformers makes sparse), Qwen3.5 text (qwen3_5_text, or the text_config of a
 * qwen3_5 vision-language checkpoint: gated DeltaNet and gated full-attention layers as
 * layer_types says), Qwen3-Next (qwen3_next: Qwen3.5's layers, the DeltaNet's projections fused
 * per key head, dense and MoE MLPs mixed, a shared expert in the MoE ones), Llama 3 (rope_scaling type llama3). Anything else is refused with a
 * message naming the file and the setting. */
#ifndef GRPOD_CONFIG_H
#define GRPOD_CONFIG_H

/* Bounds config_load enforces (each value outside them is refused naming the field): far above
 * any supported model, and low enough that every size computed from them fits its type. */
#define CFG_MAX_LAYERS 1024
#define CFG_MAX_DIM (1 << 16) /* hidden_size */
#define CFG_MAX_HEADS 1024
#define CFG_MAX_HEAD_DIM 1024
#define CFG_MAX_FF (1 << 18) /* intermediate_size */
#define CFG_MAX_VOCAB (1 << 24) /* vocab_size; also the tokenizer's id bound */
#define CFG_MAX_POS (1 << 24) /* max_position_embeddings */
#define CFG_MAX_EXPERTS 1024 /* num_experts */
#define CFG_MAX_LIN_HEAD_DIM 1024 /* linear_key_head_dim, linear_value_head_dim (kernels/deltanet_cpu.c) */
#define CFG_MAX_CONV 64 /* linear_conv_kernel_dim */

typedef enum { ARCH_QWEN2, ARCH_QWEN3, ARCH_LLAMA, ARCH_QWEN3_MOE, ARCH_QWEN3_5 } model_arch;

/* A layer's MLP kind, one row per layer (model_config.mlp): dense SwiGLU of width F, or a
 * mixture of E SwiGLU experts of width Fm behind a softmax router that picks top_k of them
 * (kernels/moe.h). Zero is dense, so a config without experts needs no rows filled. */
typedef enum { MLP_DENSE = 0, MLP_MOE = 1 } mlp_kind;

/* A layer's attention kind, one row per layer (model_config.attn): softmax attention as Qwen3 /
 * Llama have it; the gated softmax attention of Qwen3.5 (an output gate from a doubled q_proj,
 * partial RoPE, kernels/gated_attn.h); or gated DeltaNet linear attention (kernels/deltanet.h).
 * Zero is full, so a config without layer_types needs no rows filled. */
typedef enum { ATTN_FULL = 0, ATTN_GATED = 1, ATTN_DELTANET = 2 } attn_kind;

typedef struct {
    model_arch arch;
    char arch_name[24]; /* "qwen2" | "qwen3" | "llama" | ... (config.json's model_type; the text model's for a vision-language one) */
    int L; /* layers */
    int C, H, K, D, F, V; /* model dim, heads, kv heads, head dim, MLP dim, vocab */
    int max_pos;
    float eps, rope_theta;
    int tied; /* lm_head shares the embedding */
    int qkv_bias, o_bias; /* biases on q/k/v projections, on o_proj */
    int qk_norm; /* Qwen3 per-head RMSNorm of q and k */
    float rope_factor; /* llama3 scaling; 0 = none */
    float rope_low, rope_high;
    int rope_orig_max;
    int bos_id; /* -1 if none */
    int eos_ids[8], n_eos; /* config.json and generation_config.json, merged */
    char dtype[16]; /* torch_dtype as written */
    /* Mixture of experts (qwen3_moe; E = 0: none). Layer l is MLP_MOE as transformers decides
     * it: l not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0. */
    int E, top_k; /* num_experts, num_experts_per_tok */
    int Fm; /* moe_intermediate_size: each expert's MLP dim */
    int norm_topk; /* norm_topk_prob: the top-k routing weights renormalised to sum 1 */
    int shared; /* a shared expert beside the routed ones (qwen3_5_moe, qwen3_next): a SwiGLU of
                 * width config_shared_ff on every token, scaled by sigmoid(x·g) */
    int Fs; /* shared_expert_intermediate_size (0: F; qwen3_5_moe keeps it as F, no layer is dense) */
    int router_logits; /* output_router_logits: the balance loss joins the training loss */
    float aux_coef; /* router_aux_loss_coef, its weight there */
    unsigned char mlp[CFG_MAX_LAYERS]; /* (L) mlp_kind of each layer */
    /* Qwen3.5 (hybrid): R rotary dims of the gated attention's D (partial_rotary_factor · D;
     * 0: all D); gain1: every RMSNorm except DeltaNet's gated one is zero-centred, its
     * checkpoint weight w applied as 1 + w; the DeltaNet layers' heads and conv taps. */
    int R;
    int gain1;
    int lin_hk, lin_hv, lin_dk, lin_dv; /* linear_num_key_heads, _value_heads, linear_key/value_head_dim */
    int conv_k; /* linear_conv_kernel_dim */
    int dn_fused; /* qwen3_next: the DeltaNet's in_proj_qkvz and in_proj_ba, rows interleaved per key
                   * head on disk, held as Qwen3.5's [q; k; v; z] and [b; a] (model.h, rows) */
    int vision; /* config.json was a qwen3_5 vision-language one: its tensors are model.language_model.* */
    unsigned char attn[CFG_MAX_LAYERS]; /* (L) attn_kind of each layer */
} model_config;

/* Layers whose MLP is MLP_MOE. */
int config_n_moe(const model_config *c);
/* The shared expert's width (cfg.shared). */
int config_shared_ff(const model_config *c);
/* Layers whose attention is ATTN_DELTANET (any: the model needs the hybrid ops). */
int config_n_linear(const model_config *c);

int config_load(const char *dir, model_config *c);
/* config_load's checks on a parsed config.json (path names it in messages); no other file. */
struct js;
int config_from_json(const struct js *root, const char *path, model_config *c);
/* Parameter count (tied embeddings counted once). */
long long config_n_params(const model_config *c);
/* Write config.json (and generation_config.json) describing c into dir. */
int config_write(const char *dir, const model_config *c);
/* inv_freq (D/2) for a model: theta^(-2i/D), then Llama 3 scaling when factor > 0
 * (low_freq_factor, high_freq_factor, original max positions), as transformers computes it.
 * The rope kernels (kernels/rope.h) take the table. */
void rope_inv_freq(float *inv_freq, int D, float theta, float factor, float low_freq_factor, float high_freq_factor,
                   int original_max_pos);
#endif
