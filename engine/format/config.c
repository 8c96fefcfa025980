/* config.c — reads and writes config.json (see config.h). */
#include "engine/format/config.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "engine/format/json.h"

/* Token ids from config files: integers in 0..CFG_MAX_VOCAB-1; others are ignored (an id
 * that no vocabulary holds can never be sampled, and the vocab check below covers bos). */
static void add_eos(model_config *c, const js *v) {
    if (!v) return;
    if (v->type == JS_NUM) {
        if (!(v->num >= 0 && v->num < CFG_MAX_VOCAB) || v->num != floor(v->num)) return;
        int id = (int)v->num;
        for (int i = 0; i < c->n_eos; i++)
            if (c->eos_ids[i] == id) return;
        if (c->n_eos < 8) c->eos_ids[c->n_eos++] = id;
    } else if (v->type == JS_ARR) {
        for (int i = 0; i < v->n; i++) add_eos(c, &v->items[i]);
    }
}

/* An integer setting in lo..hi: absent takes dflt (NAN: required). The range is checked on
 * the double before the conversion, which is undefined for numbers an int cannot hold. */
static int get_int(const js *o, const char *key, const char *path, double dflt, long long lo, long long hi, int *out) {
    const js *e = js_get(o, key);
    double v = e && e->type != JS_NULL ? js_num(e, NAN) : dflt;
    if (isnan(dflt) && !e) return err_set(GE_FORMAT, "%s: %s is missing", path, key);
    if (!(v >= (double)lo && v <= (double)hi) || v != floor(v))
        return err_set(GE_FORMAT, "%s: %s must be an integer in %lld..%lld", path, key, lo, hi);
    *out = (int)v;
    return 0;
}

/* A real setting in (lo, hi], finite. */
static int get_real(const js *o, const char *key, const char *path, double dflt, double lo, double hi, float *out) {
    const js *e = js_get(o, key);
    double v = e && e->type != JS_NULL ? js_num(e, NAN) : dflt;
    /* the range holds for the float kept too: 1e-64 is > 0 as a double, 0 as a float */
    if (!(v > lo && v <= hi && (float)v > lo))
        return err_set(GE_FORMAT, "%s: %s must be a number in (%g, %g]", path, key, lo, hi);
    *out = (float)v;
    return 0;
}

/* The defaults of absent MoE keys: num_experts, num_experts_per_tok, moe_intermediate_size,
 * norm_topk_prob, as each model's transformers config has them. */
typedef struct {
    int E, k, Fm, norm;
} moe_defaults;
static const moe_defaults QWEN3_MOE = {128, 8, 768, 0}, QWEN3_NEXT = {512, 10, 512, 1};

/* The experts (dflt for absent keys) and which layers are sparse. */
static int moe_from_json(const js *r, const char *path, const moe_defaults *dflt, model_config *c) {
    int rc, step;
    /* transformers 5 writes num_local_experts (its attribute_map's name); Hub configs num_experts */
    const char *ne = js_get(r, "num_experts") || !js_get(r, "num_local_experts") ? "num_experts" : "num_local_experts";
    if ((rc = get_int(r, ne, path, dflt->E, 0, CFG_MAX_EXPERTS, &c->E)) ||
        (rc = get_int(r, "num_experts_per_tok", path, dflt->k, 1, c->E > 0 ? c->E : 1, &c->top_k)) ||
        (rc = get_int(r, "moe_intermediate_size", path, dflt->Fm, 1, CFG_MAX_FF, &c->Fm)) ||
        (rc = get_int(r, "decoder_sparse_step", path, 1, 1, CFG_MAX_LAYERS, &step)))
        return rc;
    c->norm_topk = js_get_bool(r, "norm_topk_prob", dflt->norm);
    c->router_logits = js_get_bool(r, "output_router_logits", 0);
    const js *coef = js_get(r, "router_aux_loss_coef");
    double v = coef && coef->type != JS_NULL ? js_num(coef, NAN) : 0.001;
    if (!(v >= 0 && v <= 1e6)) return err_set(GE_FORMAT, "%s: router_aux_loss_coef must be a number in [0, 1e6]", path);
    c->aux_coef = (float)v;
    for (int l = 0; l < c->L; l++) c->mlp[l] = c->E > 0 && (l + 1) % step == 0 ? MLP_MOE : MLP_DENSE;
    const js *only = js_get(r, "mlp_only_layers");
    if (only && only->type == JS_ARR)
        for (int i = 0; i < only->n; i++) {
            double x = js_num(&only->items[i], NAN);
            if (!(x >= 0 && x < c->L) || x != floor(x))
                return err_set(GE_FORMAT, "%s: mlp_only_layers holds %g, not a layer in 0..%d", path, x, c->L - 1);
            c->mlp[(int)x] = MLP_DENSE;
        }
    else if (only && only->type != JS_NULL) return err_set(GE_FORMAT, "%s: mlp_only_layers must be a list of layers", path);
    if (!config_n_moe(c)) c->E = c->top_k = 0; /* every layer dense: an ordinary decoder */
    return 0;
}

/* qwen3_5_moe (Qwen3_5MoeTextConfig): every layer sparse, the top-k weights always renormalised,
 * and a shared expert of width shared_expert_intermediate_size (kept as F: no layer is dense). */
static int shared_moe_from_json(const js *r, const char *path, model_config *c) {
    int rc;
    if ((rc = moe_from_json(r, path, &QWEN3_MOE, c)) ||
        (rc = get_int(r, "shared_expert_intermediate_size", path, 512, 1, CFG_MAX_FF, &c->F)))
        return rc;
    if (config_n_moe(c) != c->L) return err_set(GE_FORMAT, "%s: qwen3_5_moe has no dense layers (num_experts > 0)", path);
    c->norm_topk = 1;
    c->shared = 1;
    return 0;
}

/* qwen3_next (Qwen3NextConfig): dense and sparse layers as qwen3_moe decides them, a shared expert
 * of its own width in the sparse ones; the DeltaNet's fused projections. */
static int next_moe_from_json(const js *r, const char *path, model_config *c) {
    int rc;
    if ((rc = moe_from_json(r, path, &QWEN3_NEXT, c)) ||
        (rc = get_int(r, "shared_expert_intermediate_size", path, 512, 1, CFG_MAX_FF, &c->Fs)))
        return rc;
    c->shared = c->E > 0;
    if (!c->shared) c->Fs = 0;
    c->dn_fused = 1;
    return 0;
}

int config_shared_ff(const model_config *c) { return c->Fs ? c->Fs : c->F; }

int config_n_moe(const model_config *c) {
    int n = 0;
    for (int l = 0; l < c->L; l++) n += c->mlp[l] == MLP_MOE;
    return n;
}

/* Qwen3.5's layers (Qwen3_5TextConfig's defaults for absent keys): layer_types, or every
 * full_attention_interval-th layer full; the DeltaNet heads and conv; zero-centred norms. */
static int hybrid_from_json(const js *r, const char *path, model_config *c) {
    int rc, every;
    if ((rc = get_int(r, "linear_num_key_heads", path, 16, 1, CFG_MAX_HEADS, &c->lin_hk)) ||
        (rc = get_int(r, "linear_num_value_heads", path, 32, 1, CFG_MAX_HEADS, &c->lin_hv)) ||
        (rc = get_int(r, "linear_key_head_dim", path, 128, 1, CFG_MAX_LIN_HEAD_DIM, &c->lin_dk)) ||
        (rc = get_int(r, "linear_value_head_dim", path, 128, 1, CFG_MAX_LIN_HEAD_DIM, &c->lin_dv)) ||
        (rc = get_int(r, "linear_conv_kernel_dim", path, 4, 1, CFG_MAX_CONV, &c->conv_k)) ||
        (rc = get_int(r, "full_attention_interval", path, 4, 1, CFG_MAX_LAYERS, &every)))
        return rc;
    if (c->lin_hv % c->lin_hk)
        return err_set(GE_FORMAT, "%s: linear_num_value_heads %d is not a multiple of linear_num_key_heads %d", path, c->lin_hv,
                       c->lin_hk);
    const js *lt = js_get(r, "layer_types");
    if (lt && lt->type == JS_ARR && lt->n != c->L)
        return err_set(GE_FORMAT, "%s: layer_types has %d entries for %d layers", path, lt->n, c->L);
    else if (lt && lt->type != JS_ARR && lt->type != JS_NULL) return err_set(GE_FORMAT, "%s: layer_types must be a list", path);
    for (int l = 0; l < c->L; l++) {
        const char *t = lt && lt->type == JS_ARR ? js_str(&lt->items[l])
            : (l + 1) % every                    ? "linear_attention"
                                                 : "full_attention";
        if (t && !strcmp(t, "linear_attention")) c->attn[l] = ATTN_DELTANET;
        else if (t && !strcmp(t, "full_attention")) c->attn[l] = ATTN_GATED;
        else
            return err_set(GE_UNSUPPORTED, "%s: layer_types[%d] \"%s\" (linear_attention or full_attention)", path, l, t ? t : "?");
    }
    if (c->qkv_bias) return err_set(GE_UNSUPPORTED, "%s: attention_bias is not supported for qwen3_5", path);
    c->gain1 = 1;
    return 0;
}

int config_n_linear(const model_config *c) {
    int n = 0;
    for (int l = 0; l < c->L; l++) n += c->attn[l] == ATTN_DELTANET;
    return n;
}

int config_from_json(const js *r, const char *path, model_config *c) {
    int rc = 0;
    memset(c, 0, sizeof *c);
    const char *mt = js_get_str(r, "model_type");
    if (!mt) {
        rc = err_set(GE_FORMAT, "%s: no model_type", path);
        goto out;
    }
    int tied_top = -1; /* a vision-language config ties at its top level */
    int moe5 = !strcmp(mt, "qwen3_5_moe") || !strcmp(mt, "qwen3_5_moe_text"); /* Qwen3.5's MoE models */
    if (!strcmp(mt, "qwen3_5") || !strcmp(mt, "qwen3_5_moe")) { /* the text model of a vision-language checkpoint */
        const char *want = moe5 ? "qwen3_5_moe_text" : "qwen3_5_text";
        const js *tc = js_get(r, "text_config");
        if (!tc || tc->type != JS_OBJ) {
            rc = err_set(GE_FORMAT, "%s: a %s config needs a text_config object", path, mt);
            goto out;
        }
        if (js_get(r, "tie_word_embeddings")) tied_top = js_get_bool(r, "tie_word_embeddings", 0);
        r = tc;
        mt = js_get_str(r, "model_type");
        if (!mt) mt = want;
        if (strcmp(mt, want)) {
            rc = err_set(GE_UNSUPPORTED, "%s: text_config model_type \"%s\" (only %s)", path, mt, want);
            goto out;
        }
        c->vision = 1;
    }
    if (!strcmp(mt, "qwen2")) c->arch = ARCH_QWEN2;
    else if (!strcmp(mt, "qwen3")) c->arch = ARCH_QWEN3;
    else if (!strcmp(mt, "llama")) c->arch = ARCH_LLAMA;
    else if (!strcmp(mt, "qwen3_moe")) c->arch = ARCH_QWEN3_MOE;
    else if (!strcmp(mt, "qwen3_5_text") || !strcmp(mt, "qwen3_5_moe_text") || !strcmp(mt, "qwen3_next")) c->arch = ARCH_QWEN3_5;
    else {
        rc = err_set(GE_UNSUPPORTED,
                     "%s: unsupported architecture \"%s\" (grpod supports qwen2, qwen3, qwen3_moe, qwen3_5_text, qwen3_5, "
                     "qwen3_5_moe_text, qwen3_5_moe, qwen3_next, llama)",
                     path, mt);
        goto out;
    }
    snprintf(c->arch_name, sizeof c->arch_name, "%s", mt);
    if ((rc = get_int(r, "num_hidden_layers", path, NAN, 1, CFG_MAX_LAYERS, &c->L)) ||
        (rc = get_int(r, "hidden_size", path, NAN, 1, CFG_MAX_DIM, &c->C)) ||
        (rc = get_int(r, "num_attention_heads", path, NAN, 1, CFG_MAX_HEADS, &c->H)) ||
        (rc = get_int(r, "intermediate_size", path, moe5 ? 0 : NAN, moe5 ? -1 : 1, CFG_MAX_FF, &c->F)) ||
        (rc = get_int(r, "vocab_size", path, NAN, 1, CFG_MAX_VOCAB, &c->V)) ||
        (rc = get_int(r, "num_key_value_heads", path, c->H, 1, c->H, &c->K)) ||
        (rc = get_int(r, "head_dim", path, c->C / c->H, 2, CFG_MAX_HEAD_DIM, &c->D)) ||
        (rc = get_int(r, "max_position_embeddings", path, 4096, 1, CFG_MAX_POS, &c->max_pos)) ||
        (rc = get_real(r, "rms_norm_eps", path, 1e-6, 0, 1, &c->eps)) ||
        (rc = get_real(r, "rope_theta", path, 10000.0, 0, 1e12, &c->rope_theta)) ||
        (rc = get_int(r, "bos_token_id", path, -1, -1, c->V - 1, &c->bos_id)))
        goto out;
    c->tied = tied_top >= 0 ? tied_top : js_get_bool(r, "tie_word_embeddings", 0);
    c->qk_norm = c->arch == ARCH_QWEN3 || c->arch == ARCH_QWEN3_MOE || c->arch == ARCH_QWEN3_5;
    c->qkv_bias = c->arch == ARCH_QWEN2 ? 1 : js_get_bool(r, "attention_bias", 0);
    c->o_bias = c->arch == ARCH_QWEN2 ? 0 : c->qkv_bias;
    add_eos(c, js_get(r, "eos_token_id"));
    const char *dt = js_get_str(r, "torch_dtype");
    if (!dt) dt = js_get_str(r, "dtype");
    snprintf(c->dtype, sizeof c->dtype, "%s", dt ? dt : "float32");
    if (c->H % c->K) {
        rc = err_set(GE_FORMAT, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d", path, c->H, c->K);
        goto out;
    }
    if (c->D % 2) {
        rc = err_set(GE_FORMAT, "%s: head_dim %d must be even", path, c->D);
        goto out;
    }
    if (c->arch == ARCH_QWEN3_MOE && (rc = moe_from_json(r, path, &QWEN3_MOE, c))) goto out;
    if (c->arch == ARCH_QWEN3_5 && (rc = hybrid_from_json(r, path, c))) goto out;
    if (moe5 && (rc = shared_moe_from_json(r, path, c))) goto out;
    if (!strcmp(mt, "qwen3_next") && (rc = next_moe_from_json(r, path, c))) goto out;
    const char *act = js_get_str(r, "hidden_act");
    if (act && strcmp(act, "silu")) {
        rc = err_set(GE_UNSUPPORTED, "%s: hidden_act \"%s\" (only silu)", path, act);
        goto out;
    }
    if (js_get_bool(r, "mlp_bias", 0)) {
        rc = err_set(GE_UNSUPPORTED, "%s: mlp_bias is not supported", path);
        goto out;
    }
    if (js_get_bool(r, "use_sliding_window", 0)) {
        rc = err_set(GE_UNSUPPORTED, "%s: use_sliding_window is not supported", path);
        goto out;
    }
    const js *rpp = js_get(r, "rope_parameters");
    double prf = js_get_num(r, "partial_rotary_factor",
                            js_get_num(rpp, "partial_rotary_factor", c->arch == ARCH_QWEN3_5 ? 0.25 : 1.0));
    if (c->arch == ARCH_QWEN3_5) { /* transformers: int(head_dim * factor) rotary dims */
        c->R = (int)(c->D * prf);
        if (!(prf > 0 && prf <= 1) || c->R < 2 || c->R % 2) {
            rc = err_set(GE_FORMAT, "%s: partial_rotary_factor %g gives %d rotary dims of %d (an even number >= 2)", path, prf,
                         c->R, c->D);
            goto out;
        }
    } else if (prf != 1.0) {
        rc = err_set(GE_UNSUPPORTED, "%s: partial_rotary_factor %g is not supported", path, prf);
        goto out;
    }
    /* RoPE: older checkpoints have top-level rope_theta + rope_scaling; transformers >= 5
     * writes one "rope_parameters" object holding rope_type, rope_theta and the scaling keys. */
    const js *rs = js_get(r, "rope_scaling");
    const js *rp = js_get(r, "rope_parameters");
    if (rp && rp->type == JS_OBJ) {
        if ((rc = get_real(rp, "rope_theta", path, c->rope_theta, 0, 1e12, &c->rope_theta))) goto out;
        rs = rp;
    }
    if (rs && rs->type == JS_OBJ) {
        const char *t = js_get_str(rs, "rope_type");
        if (!t) t = js_get_str(rs, "type");
        if (t && !strcmp(t, "default")) {
        } else if (t && !strcmp(t, "llama3")) {
            if ((rc = get_real(rs, "factor", path, 8.0, 0, 1e6, &c->rope_factor)) ||
                (rc = get_real(rs, "low_freq_factor", path, 1.0, 0, 1e6, &c->rope_low)) ||
                (rc = get_real(rs, "high_freq_factor", path, 4.0, 0, 1e6, &c->rope_high)) ||
                (rc = get_int(rs, "original_max_position_embeddings", path, 8192, 1, CFG_MAX_POS, &c->rope_orig_max)))
                goto out;
            if (!(c->rope_high > c->rope_low)) {
                rc = err_set(GE_FORMAT, "%s: rope_scaling high_freq_factor must exceed low_freq_factor", path);
                goto out;
            }
        } else {
            rc = err_set(GE_UNSUPPORTED, "%s: rope_scaling type \"%s\" is not supported (only llama3)", path, t ? t : "?");
            goto out;
        }
    }
out:
    return rc;
}

int config_load(const char *dir, model_config *c) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    memset(c, 0, sizeof *c);
    js_doc *doc;
    const js *r;
    int rc = js_parse_file(path, &doc, &r);
    if (rc) return rc;
    rc = config_from_json(r, path, c);
    js_doc_free(doc);
    if (rc) return rc;
    /* generation_config.json may list more end-of-sequence ids (Qwen3 instruct models do). */
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (!js_parse_file(path, &doc, &r)) {
        add_eos(c, js_get(r, "eos_token_id"));
        js_doc_free(doc);
    }
    err_clear();
    return 0;
}

long long config_n_params(const model_config *c) {
    long long C = c->C, HD = (long long)c->H * c->D, KD = (long long)c->K * c->D, F = c->F;
    long long layer = 2 * C + C * HD + 2 * C * KD + HD * C;
    if (c->qkv_bias) layer += HD + 2 * KD;
    if (c->o_bias) layer += C;
    if (c->qk_norm) layer += 2 * c->D;
    if (c->arch == ARCH_QWEN3_5) layer += HD * C; /* the gate half of q_proj */
    long long n_moe = config_n_moe(c),
              moe = (long long)c->E * C + 3LL * c->E * C * c->Fm + (c->shared ? 3 * C * config_shared_ff(c) + C : 0);
    long long n_lin = config_n_linear(c), KL = (long long)c->lin_hk * c->lin_dk, VL = (long long)c->lin_hv * c->lin_dv;
    long long lin = 2 * C + (2 * KL + VL) * (C + c->conv_k) + 2 * VL * C + 2LL * c->lin_hv * (C + 1) + c->lin_dv;
    return (long long)c->V * C * (c->tied ? 1 : 2) + C + (c->L - n_lin) * layer + n_lin * lin + (c->L - n_moe) * 3 * C * F +
        n_moe * moe;
}

int config_write(const char *dir, const model_config *c) {
    static const char *arch_class[] = {"Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM", "Qwen3MoeForCausalLM",
                                       "Qwen3_5ForCausalLM"};
    const char *cls = !strcmp(c->arch_name, "qwen3_next") ? "Qwen3NextForCausalLM"
        : c->shared                                       ? "Qwen3_5MoeForCausalLM"
                                                          : arch_class[c->arch];
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return err_set(GE_IO, "%s: cannot create", path);
    fprintf(f, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n", cls, c->arch_name);
    fprintf(f, "  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n", c->C, c->F, c->L);
    fprintf(f, "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n  \"head_dim\": %d,\n", c->H, c->K, c->D);
    fprintf(f, "  \"vocab_size\": %d,\n  \"max_position_embeddings\": %d,\n", c->V, c->max_pos);
    fprintf(f, "  \"rms_norm_eps\": %g,\n  \"rope_theta\": %.9g,\n  \"hidden_act\": \"silu\",\n", c->eps, c->rope_theta);
    fprintf(f, "  \"attention_bias\": %s,\n  \"tie_word_embeddings\": %s,\n", c->qkv_bias ? "true" : "false",
            c->tied ? "true" : "false");
    if (c->rope_factor > 0)
        fprintf(f,
                "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %g, \"low_freq_factor\": %g, "
                "\"high_freq_factor\": %g, \"original_max_position_embeddings\": %d},\n",
                c->rope_factor, c->rope_low, c->rope_high, c->rope_orig_max);
    else fprintf(f, "  \"rope_scaling\": null,\n");
    if (c->shared) fprintf(f, "  \"shared_expert_intermediate_size\": %d,\n", config_shared_ff(c));
    if (c->E > 0) {
        fprintf(f, "  \"num_experts\": %d,\n  \"num_experts_per_tok\": %d,\n  \"moe_intermediate_size\": %d,\n", c->E, c->top_k,
                c->Fm);
        fprintf(f, "  \"output_router_logits\": %s,\n  \"router_aux_loss_coef\": %.9g,\n", c->router_logits ? "true" : "false",
                c->aux_coef);
    }
    if (c->arch == ARCH_QWEN3_MOE || c->dn_fused) { /* which layers are sparse, as mlp_only_layers over a step of 1 */
        fprintf(f, "  \"norm_topk_prob\": %s,\n", c->norm_topk ? "true" : "false");
        fprintf(f, "  \"decoder_sparse_step\": 1,\n  \"mlp_only_layers\": [");
        for (int l = 0, k = 0; l < c->L; l++)
            if (c->mlp[l] != MLP_MOE) fprintf(f, "%s%d", k++ ? ", " : "", l);
        fprintf(f, "],\n");
    }
    if (c->arch == ARCH_QWEN3_5) { /* always the text model, whichever form was loaded */
        fprintf(f, "  \"partial_rotary_factor\": %.9g,\n  \"linear_conv_kernel_dim\": %d,\n", (double)c->R / c->D, c->conv_k);
        fprintf(f, "  \"linear_num_key_heads\": %d,\n  \"linear_num_value_heads\": %d,\n", c->lin_hk, c->lin_hv);
        fprintf(f, "  \"linear_key_head_dim\": %d,\n  \"linear_value_head_dim\": %d,\n  \"layer_types\": [", c->lin_dk, c->lin_dv);
        for (int l = 0; l < c->L; l++)
            fprintf(f, "%s\"%s\"", l ? ", " : "", c->attn[l] == ATTN_DELTANET ? "linear_attention" : "full_attention");
        fprintf(f, "],\n");
    }
    if (c->bos_id >= 0) fprintf(f, "  \"bos_token_id\": %d,\n", c->bos_id);
    fprintf(f, "  \"eos_token_id\": %d,\n", c->n_eos ? c->eos_ids[0] : 0);
    fprintf(f, "  \"torch_dtype\": \"%s\"\n}\n", c->dtype);
    if (fclose(f)) return err_set(GE_IO, "%s: write failed", path);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    f = fopen(path, "w");
    if (!f) return err_set(GE_IO, "%s: cannot create", path);
    fprintf(f, "{\n  \"eos_token_id\": [");
    for (int i = 0; i < c->n_eos; i++) fprintf(f, "%s%d", i ? ", " : "", c->eos_ids[i]);
    fprintf(f, "]\n}\n");
    if (fclose(f)) return err_set(GE_IO, "%s: write failed", path);
    return 0;
}

/* transformers' _compute_default_rope_parameters and _compute_llama3_parameters, in fp32:
 * inv_freq = 1 / theta^(arange(0, D, 2) / D); llama3 divides low frequencies by factor and
 * blends the band between the two wavelength thresholds. */
void rope_inv_freq(float *inv_freq, int D, float theta, float factor, float low_freq_factor, float high_freq_factor,
                   int original_max_pos) {
    for (int i = 0; i < D / 2; i++) {
        float expo = (float)(2 * i) / (float)D;
        inv_freq[i] = 1.0f / powf(theta, expo);
    }
    if (factor <= 0) return;
    float low_wavelen = (float)original_max_pos / low_freq_factor;
    float high_wavelen = (float)original_max_pos / high_freq_factor;
    for (int i = 0; i < D / 2; i++) {
        float f = inv_freq[i];
        float wavelen = 2.0f * (float)M_PI / f;
        float scaled = wavelen > low_wavelen ? f / factor : f;
        float smooth = ((float)original_max_pos / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
        float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
        int medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
        inv_freq[i] = medium ? smoothed : scaled;
    }
}
