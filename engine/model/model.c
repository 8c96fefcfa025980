/* model.c — see model.h. The layer is written once against the backend table:
 *
 *   ln1 = rmsnorm(x)            q = ln1 Wq^T + bq, k = .., v = ..   (Qwen3: q, k per-head rmsnorm)
 *   q, k = rope(q, k)           att = attention(q, k, v)            xm = x + att Wo^T
 *   ln2 = rmsnorm(xm)           a = silu(ln2 Wg^T) * (ln2 Wu^T)     x' = xm + a Wd^T
 *
 * and backward walks it in reverse, carrying the residual-stream gradient dres. Fused ops
 * (backend.h): each norm runs in front of the projections that read it (mm_norm), each
 * residual add in the projection that closes its sub-layer (mm_part.res), q/k norm, RoPE and
 * the KV-cache writes in one op, SwiGLU with the gate/up projections: at decode sizes the CUDA
 * backend makes each of these one launch. model_layer_fwd/_bwd are one layer each;
 * tests/bench/gpu/bench_layer.c times them as training runs them. */
#include "engine/model/model.h"

#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/format/safetensors.h"
#include "engine/model/hybrid.h"
#include "engine/model/lora.h"
#include "engine/model/moe_ep.h"
#include "kernels/moe.h"
#include "kernels/rope.h"

/* ---------------------------------------------------------------- parameters */

/* pad: the next parameter starts 64-byte aligned; else right after this one (an expert's
 * matrix followed by the next expert's, so the E of them are one stacked tensor) */
static void add_param_at(model *m, const char *name, int ndim, long long d0, long long d1, int pad) {
    model_param *p = &m->params[m->n_params++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = d1;
    p->shape[2] = 0;
    p->gain1 = 0;
    p->rows = PARAM_ROWS_SAME;
    p->numel = ndim == 1 ? d0 : d0 * d1;
    p->off = m->n_elems;
    m->n_elems += pad ? (p->numel + 15) & ~15LL : p->numel;
}
static void add_param(model *m, const char *name, int ndim, long long d0, long long d1) {
    add_param_at(m, name, ndim, d0, d1, 1);
}

/* An MLP_MOE layer's parameters as HF checkpoints name them: the router (add_router), each of
 * the three projections of this rank's experts e0..e0+E-1 stacked (add_experts:
 * mlp.experts.{e}.gate_proj.weight, ...), then the shared expert's when the model has one
 * (add_shared). With expert parallelism the experts of every layer come after all the
 * replicated parameters instead (model.ep_n0). */
static void add_router(model *m, int l) {
    char n[96];
    snprintf(n, sizeof n, "model.layers.%d.mlp.gate.weight", l);
    add_param(m, n, 2, m->cfg.E, m->cfg.C);
}
static void add_experts(model *m, int l) {
    const model_config *c = &m->cfg;
    static const char *proj[3] = {"gate_proj", "up_proj", "down_proj"};
    char n[96];
    for (int j = 0; j < 3; j++)
        for (int e = m->ep_e0; e < m->ep_e0 + m->ep_E; e++) {
            snprintf(n, sizeof n, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, proj[j]);
            add_param_at(m, n, 2, j < 2 ? c->Fm : c->C, j < 2 ? c->C : c->Fm, e == m->ep_e0 + m->ep_E - 1);
        }
}
static void add_shared(model *m, int l) {
    const model_config *c = &m->cfg;
    static const char *proj[3] = {"gate_proj", "up_proj", "down_proj"};
    char n[96];
    long long Fs = config_shared_ff(c);
    for (int j = 0; c->shared && j < 3; j++) { /* the shared expert (width Fs) and its gate */
        snprintf(n, sizeof n, "model.layers.%d.mlp.shared_expert.%s.weight", l, proj[j]);
        add_param(m, n, 2, j < 2 ? Fs : c->C, j < 2 ? c->C : Fs);
    }
    if (c->shared) {
        snprintf(n, sizeof n, "model.layers.%d.mlp.shared_expert_gate.weight", l);
        add_param(m, n, 2, 1, c->C);
    }
}

/* A gated DeltaNet layer's token mixer as HF checkpoints name it (kernels/deltanet.h). */
static void add_lin_params(model *m, int l) {
    const model_config *c = &m->cfg;
    long long C = c->C, KL = (long long)c->lin_hk * c->lin_dk, VL = (long long)c->lin_hv * c->lin_dv, Cc = 2 * KL + VL;
    char n[96];
#define P(suffix, nd, a, b) (snprintf(n, sizeof n, "model.layers.%d.linear_attn.%s", l, suffix), add_param(m, n, nd, a, b))
    if (c->dn_fused) { /* qwen3_next: [q; k; v; z] and [b; a] in the buffers (model.h) */
        P("in_proj_qkvz.weight", 2, Cc + VL, C);
        m->params[m->n_params - 1].rows = PARAM_ROWS_QKVZ;
        P("in_proj_ba.weight", 2, 2LL * c->lin_hv, C);
        m->params[m->n_params - 1].rows = PARAM_ROWS_BA;
    } else {
        P("in_proj_qkv.weight", 2, Cc, C);
        P("in_proj_z.weight", 2, VL, C);
        P("in_proj_b.weight", 2, c->lin_hv, C);
        P("in_proj_a.weight", 2, c->lin_hv, C);
    }
    P("conv1d.weight", 2, Cc, c->conv_k);
    m->params[m->n_params - 1].ndim = 3; /* (Cc, 1, Kc) on disk, (Cc, Kc) in memory */
    m->params[m->n_params - 1].shape[1] = 1;
    m->params[m->n_params - 1].shape[2] = c->conv_k;
    P("dt_bias", 1, c->lin_hv, 0);
    P("A_log", 1, c->lin_hv, 0);
    P("norm.weight", 1, c->lin_dv, 0);
    P("out_proj.weight", 2, C, VL);
#undef P
}

/* the zero-centred norms (cfg.gain1): every RMSNorm weight but the DeltaNet's gated norm */
static int is_gain1(const model_config *c, const char *name) {
    size_t n = strlen(name);
#define ENDS(s) (n >= sizeof(s) - 1 && !strcmp(name + n - (sizeof(s) - 1), s))
    return c->gain1 &&
        (ENDS("layernorm.weight") || ENDS("q_norm.weight") || ENDS("k_norm.weight") || !strcmp(name, "model.norm.weight"));
#undef ENDS
}

int model_init(model *m, const model_config *c, eng_backend *be) { return model_init_ep(m, c, be, NULL); }

int model_init_ep(model *m, const model_config *c, eng_backend *be, const model_ep *ep) {
    memset(m, 0, sizeof *m);
    m->cfg = *c;
    m->be = be;
    m->ep_E = c->E;
    if (ep && config_n_moe(c) > 0) {
        if (ep->W < 1 || c->E % ep->W)
            return err_set(GE_UNSUPPORTED, "model: %d experts do not split evenly over %d ranks (expert parallelism)", c->E, ep->W);
        m->ep = *ep;
        m->ep_E = c->E / ep->W;
        m->ep_e0 = ep->rank * m->ep_E;
        if (!(m->ep_ws = calloc(1, sizeof *m->ep_ws))) return err_set(GE_NOMEM, "model: out of memory");
    }
    m->params = calloc((size_t)(4 + 16 * c->L + (long long)config_n_moe(c) * (5 + 3 * c->E)), sizeof *m->params);
    if (!m->params) return err_set(GE_NOMEM, "model: out of memory");
    long long C = c->C, HD = (long long)c->H * c->D, KD = (long long)c->K * c->D;
    add_param(m, "model.embed_tokens.weight", 2, c->V, C);
    char n[96];
    for (int l = 0; l < c->L; l++) {
#define P(suffix, nd, a, b) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), add_param(m, n, nd, a, b))
        P("input_layernorm.weight", 1, C, 0);
        if (c->attn[l] == ATTN_DELTANET) add_lin_params(m, l);
        else { /* softmax attention; ATTN_GATED's q_proj holds each head's query and gate */
            P("self_attn.q_proj.weight", 2, c->attn[l] == ATTN_GATED ? 2 * HD : HD, C);
            if (c->qkv_bias) P("self_attn.q_proj.bias", 1, HD, 0);
            P("self_attn.k_proj.weight", 2, KD, C);
            if (c->qkv_bias) P("self_attn.k_proj.bias", 1, KD, 0);
            P("self_attn.v_proj.weight", 2, KD, C);
            if (c->qkv_bias) P("self_attn.v_proj.bias", 1, KD, 0);
            if (c->qk_norm) {
                P("self_attn.q_norm.weight", 1, c->D, 0);
                P("self_attn.k_norm.weight", 1, c->D, 0);
            }
            P("self_attn.o_proj.weight", 2, C, HD);
            if (c->o_bias) P("self_attn.o_proj.bias", 1, C, 0);
        }
        P("post_attention_layernorm.weight", 1, C, 0);
        if (c->mlp[l] == MLP_MOE) {
            add_router(m, l);
            if (!m->ep.W) add_experts(m, l);
            add_shared(m, l);
            continue;
        }
        P("mlp.gate_proj.weight", 2, c->F, C);
        P("mlp.up_proj.weight", 2, c->F, C);
        P("mlp.down_proj.weight", 2, C, c->F);
#undef P
    }
    add_param(m, "model.norm.weight", 1, C, 0);
    if (!c->tied) add_param(m, "lm_head.weight", 2, c->V, C);
    if (m->ep.W) { /* the replicated part splits into W shards of whole 16-element blocks */
        long long blk = 16LL * m->ep.W;
        m->n_elems = m->ep_n0 = (m->n_elems + blk - 1) / blk * blk;
        for (int l = 0; l < c->L; l++)
            if (c->mlp[l] == MLP_MOE) add_experts(m, l);
    }
    for (int i = 0; i < m->n_params; i++) m->params[i].gain1 = is_gain1(c, m->params[i].name);

    /* partial rotary (R < D): the first R/2 frequencies of an R-dim rotation, the rest unused */
    float *f = calloc((size_t)(c->D / 2), sizeof(float));
    if (!f) return err_set(GE_NOMEM, "model: out of memory");
    rope_inv_freq(f, c->R ? c->R : c->D, c->rope_theta, c->rope_factor, c->rope_low, c->rope_high, c->rope_orig_max);
    m->inv_freq = be->alloc(be, (size_t)(c->D / 2) * sizeof(float));
    int rc = m->inv_freq ? be->to_dev(be, m->inv_freq, f, (size_t)(c->D / 2) * sizeof(float)) : GE_NOMEM;
    free(f);
    return rc;
}

void model_free(model *m) {
    moe_ep_ws_free(m);
    if (m->inv_freq) m->be->free(m->be, m->inv_freq);
    free(m->params);
    free(m->lparams);
    memset(m, 0, sizeof *m);
}

static void *find_view(const model *m, void *base, size_t esize, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) return (char *)base + (size_t)m->params[i].off * esize;
    return NULL;
}

int model_views_make(const model *m, void *base, size_t esize, model_views *v) {
    const model_config *c = &m->cfg;
    memset(v, 0, sizeof *v);
    v->layers = calloc((size_t)c->L, sizeof *v->layers);
    if (!v->layers) return err_set(GE_NOMEM, "model: out of memory");
    v->embed = find_view(m, base, esize, "model.embed_tokens.weight");
    v->final_norm = find_view(m, base, esize, "model.norm.weight");
    v->lm_head = c->tied ? v->embed : find_view(m, base, esize, "lm_head.weight");
    char n[96];
    for (int l = 0; l < c->L; l++) {
        model_layer_views *L = &v->layers[l];
#define V(suffix) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), find_view(m, base, esize, n))
        L->attn_norm = V("input_layernorm.weight");
        L->wq = V("self_attn.q_proj.weight");
        L->bq = V("self_attn.q_proj.bias");
        L->wk = V("self_attn.k_proj.weight");
        L->bk = V("self_attn.k_proj.bias");
        L->wv = V("self_attn.v_proj.weight");
        L->bv = V("self_attn.v_proj.bias");
        L->q_norm = V("self_attn.q_norm.weight");
        L->k_norm = V("self_attn.k_norm.weight");
        L->wo = V("self_attn.o_proj.weight");
        L->bo = V("self_attn.o_proj.bias");
        L->mlp_norm = V("post_attention_layernorm.weight");
        L->w_gate = V("mlp.gate_proj.weight");
        L->w_up = V("mlp.up_proj.weight");
        L->w_down = V("mlp.down_proj.weight");
        L->router = V("mlp.gate.weight");
        char ex[64];
#define X(proj) (snprintf(ex, sizeof ex, "mlp.experts.%d.%s.weight", m->ep_e0, proj), V(ex))
        L->we_gate = X("gate_proj");
        L->we_up = X("up_proj");
        L->we_down = X("down_proj");
#undef X
        L->ws_gate = V("mlp.shared_expert.gate_proj.weight");
        L->ws_up = V("mlp.shared_expert.up_proj.weight");
        L->ws_down = V("mlp.shared_expert.down_proj.weight");
        L->ws_g = V("mlp.shared_expert_gate.weight");
        L->dn_qkv = V("linear_attn.in_proj_qkv.weight");
        L->dn_z = V("linear_attn.in_proj_z.weight");
        L->dn_b = V("linear_attn.in_proj_b.weight");
        L->dn_a = V("linear_attn.in_proj_a.weight");
        if (c->dn_fused && c->attn[l] == ATTN_DELTANET) { /* the fused rows split as Qwen3.5's */
            size_t Cc = 2 * (size_t)c->lin_hk * c->lin_dk + (size_t)c->lin_hv * c->lin_dv;
            L->dn_qkv = V("linear_attn.in_proj_qkvz.weight");
            L->dn_z = (char *)L->dn_qkv + Cc * (size_t)c->C * esize;
            L->dn_b = V("linear_attn.in_proj_ba.weight");
            L->dn_a = (char *)L->dn_b + (size_t)c->lin_hv * (size_t)c->C * esize;
        }
        L->dn_conv = V("linear_attn.conv1d.weight");
        L->dn_dt = V("linear_attn.dt_bias");
        L->dn_alog = V("linear_attn.A_log");
        L->dn_norm = V("linear_attn.norm.weight");
        L->dn_out = V("linear_attn.out_proj.weight");
#undef V
    }
    return 0;
}

void model_views_free(model_views *v) {
    free(v->layers);
    v->layers = NULL;
}

/* p's tensor in s: the name as model.c spells it, or (a qwen3_5 vision-language checkpoint) its
 * text model's model.language_model.* name */
static const st_tensor *find_tensor(const model_config *c, const st_set *s, const model_param *p) {
    const st_tensor *t = st_find(s, p->name);
    if (t || !c->vision || strncmp(p->name, "model.", 6)) return t;
    char n[128];
    snprintf(n, sizeof n, "model.language_model.%s", p->name + 6);
    return st_find(s, n);
}

static int missing_tensor(const model_param *p, const st_set *s, const char *dir) {
    return err_set(GE_FORMAT, "%s: missing tensor %s in %s", dir, p->name,
                   s->nfiles == 1 ? s->paths[0] : "the shards of model.safetensors.index.json");
}

/* Every parameter present with its shape, before anything is allocated for them: a config.json
 * that describes more than the files hold is refused here, not by a huge allocation. */
int model_check_files(const model *m, const char *dir) {
    st_set s;
    int rc = st_open_dir(dir, &s);
    for (int i = 0; i < m->n_params && !rc; i++) {
        const model_param *p = &m->params[i];
        const st_tensor *t = find_tensor(&m->cfg, &s, p);
        rc = t ? st_check_shape(t, p->ndim, p->shape) : missing_tensor(p, &s, dir);
    }
    st_close(&s); /* safe after a failed open too: st_open_dir leaves the set empty */
    return rc;
}

/* The buffers' row of the checkpoint's row r of a fused qwen3_next projection (model.h): key head
 * g's group on disk holds q_g (Dk rows), k_g (Dk), v_g (n·Dv), z_g (n·Dv), or b_g (n), a_g (n),
 * n = value heads per key head; the buffers hold all q, all k, all v, all z (all b, all a). */
static long long fused_row(const model_config *c, int kind, long long r) {
    long long Dk = c->lin_dk, n = c->lin_hv / c->lin_hk, Dv = c->lin_dv, KL = c->lin_hk * Dk, VL = (long long)c->lin_hv * Dv;
    if (kind == PARAM_ROWS_BA) {
        long long g = r / (2 * n), o = r % (2 * n);
        return o < n ? g * n + o : c->lin_hv + g * n + (o - n);
    }
    long long w = 2 * Dk + 2 * n * Dv, g = r / w, o = r % w;
    if (o < Dk) return g * Dk + o;
    if (o < 2 * Dk) return KL + g * Dk + (o - Dk);
    if (o < 2 * Dk + n * Dv) return 2 * KL + g * n * Dv + (o - 2 * Dk);
    return 2 * KL + VL + g * n * Dv + (o - 2 * Dk - n * Dv);
}

void model_param_reorder(const model *m, const model_param *p, const float *src, float *dst, int to_file) {
    if (p->rows == PARAM_ROWS_SAME) {
        memcpy(dst, src, (size_t)p->numel * sizeof(float));
        return;
    }
    size_t cols = (size_t)p->shape[1];
    for (long long r = 0; r < p->shape[0]; r++) {
        long long b = fused_row(&m->cfg, p->rows, r);
        memcpy(dst + (size_t)(to_file ? r : b) * cols, src + (size_t)(to_file ? b : r) * cols, cols * sizeof(float));
    }
}

/* One pass over a converted tensor: NaN or Inf in weights makes every logprob -1e30 later. */
static int check_finite(const float *x, long long n, const char *dir, const char *name) {
    long long bad = 0, first = -1;
    for (long long i = 0; i < n; i++)
        if (!isfinite(x[i])) {
            if (!bad++) first = i;
        }
    return bad ? err_set(GE_FORMAT, "%s: tensor %s has %lld non-finite values (the first at element %lld)", dir, name, bad, first)
               : 0;
}

/* One parameter of DIR's set into dst (fp32): a missing or misshapen tensor is an error naming it.
 * A zero-centred norm weight becomes its gain 1 + w (model.h). */
static int read_param(const model *m, const model_param *p, const st_set *s, const char *dir, float *dst) {
    const st_tensor *t = find_tensor(&m->cfg, s, p);
    if (!t) return missing_tensor(p, s, dir);
    int rc = st_read_f32(t, dst, p->ndim, p->shape);
    if (rc || (rc = check_finite(dst, p->numel, dir, p->name))) return rc;
    if (p->rows != PARAM_ROWS_SAME) { /* the checkpoint's row order into the buffers' */
        float *tmp = malloc((size_t)p->numel * sizeof(float));
        if (!tmp) return err_set(GE_NOMEM, "model: out of memory");
        memcpy(tmp, dst, (size_t)p->numel * sizeof(float));
        model_param_reorder(m, p, tmp, dst, 0);
        free(tmp);
    }
    for (long long i = 0; p->gain1 && i < p->numel; i++) dst[i] += 1.0f;
    return 0;
}

int model_load_host(const model *m, const char *dir, float *host) {
    st_set s;
    int rc = st_open_dir(dir, &s);
    if (rc) return rc;
        /* the padding between tensors zeroed (over the threads: 33 GB at 8B dims) */
#pragma omp parallel for schedule(static)
    for (long long c = 0; c < (m->n_elems + (1 << 20) - 1) >> 20; c++) {
        long long a = c << 20, b = a + (1 << 20) < m->n_elems ? a + (1 << 20) : m->n_elems;
        memset(host + a, 0, (size_t)(b - a) * sizeof(float));
    }
    for (int i = 0; i < m->n_params && !rc; i++) rc = read_param(m, &m->params[i], &s, dir, host + m->params[i].off);
    st_close(&s);
    return rc;
}

int model_load_act(const model *m, const char *dir, void *dst) {
    eng_backend *be = m->be;
    st_set s;
    int rc = st_open_dir(dir, &s);
    if (rc) return rc;
    long long most = 0;
    for (int i = 0; i < m->n_params; i++) most = m->params[i].numel > most ? m->params[i].numel : most;
    float *buf = malloc((size_t)(most ? most : 1) * sizeof(float));
    if (!buf) rc = err_set(GE_NOMEM, "model: %lld MiB host buffer for one tensor", most * 4 >> 20);
    if (!rc) be->zero(be, dst, (size_t)m->n_elems * (size_t)be->act_bytes); /* the padding between tensors */
    for (int i = 0; i < m->n_params && !rc; i++) {
        const model_param *p = &m->params[i];
        rc = read_param(m, p, &s, dir, buf);
        if (!rc) rc = be->act_from_f32(be, (char *)dst + (size_t)p->off * be->act_bytes, buf, (size_t)p->numel);
    }
    free(buf);
    st_close(&s);
    return rc;
}

int model_save_host(const model *m, const char *dir, const float *host, int bf16) {
    st_out *o = calloc((size_t)m->n_params, sizeof *o);
    /* zero-centred norms written back as w = gain - 1, fused projections in the checkpoint's rows */
    float **back = calloc((size_t)m->n_params, sizeof *back);
    int rc = o && back ? 0 : err_set(GE_NOMEM, "model: out of memory");
    for (int i = 0; i < m->n_params && !rc; i++) {
        const model_param *p = &m->params[i];
        const float *d = host + p->off;
        if (p->gain1) {
            if (!(back[i] = malloc((size_t)p->numel * sizeof(float)))) rc = err_set(GE_NOMEM, "model: out of memory");
            for (long long j = 0; !rc && j < p->numel; j++) back[i][j] = d[j] - 1.0f;
            d = back[i];
        } else if (p->rows != PARAM_ROWS_SAME) {
            if (!(back[i] = malloc((size_t)p->numel * sizeof(float)))) rc = err_set(GE_NOMEM, "model: out of memory");
            else model_param_reorder(m, p, d, back[i], 1);
            d = back[i];
        }
        o[i] = (st_out){.name = p->name, .data = d, .ndim = p->ndim, .shape = {p->shape[0], p->shape[1], p->shape[2]}};
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (!rc) rc = st_write(path, o, m->n_params, bf16 ? ST_BF16 : ST_F32);
    for (int i = 0; back && i < m->n_params; i++) free(back[i]);
    free(back);
    free(o);
    return rc;
}

/* ---------------------------------------------------------------- activations */

/* Carves a->* out of one allocation; with base == NULL only counts the bytes.
 * Without grad the layers share one set (l[l] = l[0]). With grad every layer keeps what its
 * backward reads, except ln1, ln2 and the SwiGLU output a, which cost a cheap pass to recompute
 * (model_layer_bwd does): the forward writes them into backward scratch that is free then
 * (ln1, ln2 -> dlnf, a -> du). The backward scratch is shared the same way where lifetimes
 * allow: dg over da (swiglu_bwd reads its dout before it writes dgate), dq0 over datt (read by
 * attention_bwd before dq0 is written), dk0 over dq (read for dq0 before dk0 is written). */
static size_t carve(const model *m, model_acts *a, char *base) {
    const model_config *c = &m->cfg;
    size_t off = 0, eb = (size_t)m->be->act_bytes;
    long long T = a->cap_T, M = a->cap_M, C = c->C, HD = (long long)c->H * c->D, KD = (long long)c->K * c->D, F = c->F;
    if (c->shared && config_shared_ff(c) > F) F = config_shared_ff(c); /* its g, u, a and scratch are the dense MLP's */
    /* every layer's block holds what each MLP kind in the model needs, so blocks are alike
     * (ring, the checkpointed layers' shared set) */
    long long E = c->E, k = c->top_k, Fm = c->Fm;
    int has_moe = config_n_moe(c) > 0, has_dense = config_n_moe(c) < c->L || c->shared; /* shared: a dense MLP too */
    /* the hybrid kinds (kernels/deltanet.h, kernels/gated_attn.h) */
    int has_lin = config_n_linear(c) > 0, has_gated = 0;
    for (int l = 0; l < c->L; l++) has_gated |= c->attn[l] == ATTN_GATED;
    long long Cc = 2LL * c->lin_hk * c->lin_dk + (long long)c->lin_hv * c->lin_dv, VL = (long long)c->lin_hv * c->lin_dv,
              Hv = c->lin_hv, ST = 0, DST = 0;
    if (has_lin) m->be->deltanet_scratch(m->be, &ST, &DST, (int)T, c->lin_hk, c->lin_hv, c->lin_dk, c->lin_dv);
#define TAKE(ptr, n, es) \
    do { \
        (ptr) = base ? (void *)(base + off) : NULL; \
        off += (((size_t)(n) * (es)) + 255) & ~(size_t)255; \
    } while (0)
    void *kv_k = NULL, *kv_v = NULL; /* with a->kv: the projections' k, v scratch, shared by every layer */
    if (a->grad) {
        TAKE(a->dres, T * C, eb);
        TAKE(a->dlnf, T * C, eb);
        TAKE(a->dln, T * C, eb);
        TAKE(a->dq, T * HD, eb);
        TAKE(a->datt, T * HD, eb);
        if (a->kv) {
            TAKE(kv_k, T * KD, eb);
            TAKE(kv_v, T * KD, eb);
        } else {
            TAKE(a->dk, T * KD, eb);
            TAKE(a->dv, T * KD, eb);
        }
        if (has_dense) {
            TAKE(a->da, T * F, eb);
            TAKE(a->du, T * F, eb);
        }
        if (has_moe) {
            TAKE(a->dtopw, T * k, 4);
            TAKE(a->dlogit, T * E, 4);
            TAKE(a->edg, T * k * Fm, eb);
            TAKE(a->edu, T * k * Fm, eb);
        }
        if (has_gated) {
            TAKE(a->dqg, T * 2 * HD, eb);
            TAKE(a->dkg, T * KD, eb);
        }
        if (has_lin) {
            TAKE(a->dx_qkv, T * Cc, eb);
            TAKE(a->du_lin, T * Cc, eb);
            TAKE(a->dz, T * VL, eb);
            TAKE(a->dy_lin, T * VL, eb);
            TAKE(a->do_lin, T * VL, eb);
            TAKE(a->ddn_a, T * Hv, eb);
            TAKE(a->ddn_b, T * Hv, eb);
            TAKE(a->dstates, DST, 4);
        }
        a->dg = a->da;
        a->dq0 = a->datt;
        a->dk0 = a->dq;
    }
    if (has_lin) TAKE(a->states, ST, 4);
    int nl = a->grad == 1 ? (a->ring > 0 && a->ring < c->L ? a->ring : c->L) : 1;
    struct model_layer_acts shared = {0}; /* the set the checkpointed layers share (n_ckpt) */
    for (int l = 0; l < c->L; l++) {
        struct model_layer_acts *L = &a->l[l];
        if (l >= nl) {
            *L = a->l[l % nl];
            if (a->grad == MODEL_ACTS_RECOMPUTE) TAKE(L->x, T * C, eb); /* recompute: each layer keeps its input */
            continue;
        }
        if (l < a->n_ckpt && l > 0) {
            *L = shared;
            TAKE(L->x, T * C, eb);
            continue;
        }
        size_t off0 = off;
        TAKE(L->x, T * C, eb);
        if (a->grad) {
            L->ln1 = L->ln2 = a->dlnf;
            L->a = a->du;
        } else {
            TAKE(L->ln1, T * C, eb);
            TAKE(L->ln2, T * C, eb);
            if (has_dense) TAKE(L->a, T * F, eb);
        }
        if (c->qk_norm) {
            TAKE(L->q0, T * HD, eb);
            TAKE(L->k0, T * KD, eb);
        }
        TAKE(L->q, T * HD, eb);
        if (a->kv) {
            L->k = kv_k;
            L->v = kv_v;
        } else {
            TAKE(L->k, T * KD, eb);
            TAKE(L->v, T * KD, eb);
        }
        TAKE(L->att, T * HD, eb);
        TAKE(L->xm, T * C, eb);
        if (has_dense) {
            TAKE(L->g, T * F, eb);
            TAKE(L->u, T * F, eb);
        }
        if (has_moe) {
            TAKE(L->probs, T * E, 4);
            TAKE(L->topw, T * k, 4);
            TAKE(L->topi, T * k, 4);
            TAKE(L->eg, T * k * Fm, eb);
            TAKE(L->eu, T * k * Fm, eb);
            TAKE(L->ey, T * k * C, eb);
            if (c->shared) {
                TAKE(L->sy, T * C, eb);
                TAKE(L->sz, T, eb);
            }
        }
        if (has_gated) {
            TAKE(L->qg, T * 2 * HD, eb);
            TAKE(L->ag, T * HD, eb);
        }
        if (has_lin) {
            TAKE(L->x_qkv, T * Cc, eb);
            TAKE(L->dn_u, T * Cc, eb);
            TAKE(L->z, T * VL, eb);
            TAKE(L->dn_a, T * Hv, eb);
            TAKE(L->dn_b, T * Hv, eb);
            TAKE(L->o, T * VL, eb);
            TAKE(L->y, T * VL, eb);
            TAKE(L->rstdn, T * Hv, 4);
        }
        TAKE(L->rstd1, T, 4);
        TAKE(L->rstdq, T * c->H, 4);
        TAKE(L->rstdk, T * c->K, 4);
        TAKE(L->lse, T * c->H, 4);
        TAKE(L->rstd2, T, 4);
        a->layer_bytes = off - off0;
        if (l < a->n_ckpt) shared = *L; /* layer 0 carves the shared set */
    }
    TAKE(a->xL, T * C, eb);
    TAKE(a->lnf, T * C, eb);
    TAKE(a->rstdf, T, 4);
    TAKE(a->logp, M, 4);
    TAKE(a->ent, M, 4);
    TAKE(a->dlogp, M, 4);
    TAKE(a->dent, M, 4);
    TAKE(a->ints, (9 + 2 * ATTN_XR_MAX) * T + 2 * M, 4);
    if (has_moe) {
        TAKE(a->routes, (long long)config_n_moe(c) * T * k, 4);
        TAKE(a->moe_stats, MOE_STATS(E), 4);
        TAKE(a->aux_g, E, 4);
    }
    if (m->lora_r) {
        TAKE(a->lu, T * 3 * m->lora_r, eb);
        TAKE(a->ldu, T * m->lora_r, eb);
    }
#undef TAKE
    return off;
}

static int acts_alloc(const model *m, model_acts *a, int cap_T, int cap_M);

size_t model_acts_bytes(const model *m, int cap_T, int cap_M, int grad, int n_ckpt) {
    model_acts a = {.cap_T = cap_T > 0 ? cap_T : 1, .cap_M = cap_M > 0 ? cap_M : 1, .grad = grad, .n_ckpt = grad ? n_ckpt : 0};
    a.l = calloc((size_t)m->cfg.L, sizeof *a.l);
    size_t bytes = a.l ? carve(m, &a, NULL) : (size_t)-1;
    free(a.l);
    return bytes;
}

size_t model_acts_update_bytes(const model *m, int T) {
    size_t g = model_acts_bytes(m, T, T, 1, m->cfg.L), ng = model_acts_bytes(m, T, T, 0, 0);
    return ng <= g ? g : g + ng;
}

int model_acts_init_in(const model *m, model_acts *a, int cap_T, int cap_M, const model_acts *owner) {
    memset(a, 0, sizeof *a);
    size_t bytes = model_acts_bytes(m, cap_T, cap_M, 0, 0);
    if (!owner->mem || bytes > owner->bytes || !(a->l = calloc((size_t)m->cfg.L, sizeof *a->l))) return 1;
    a->cap_T = cap_T > 0 ? cap_T : 1;
    a->cap_M = cap_M > 0 ? cap_M : 1;
    a->mem = owner->mem;
    a->bytes = bytes;
    a->borrowed = 1;
    carve(m, a, a->mem);
    return 0;
}

static int acts_init(const model *m, model_acts *a, int cap_T, int cap_M, int grad, int n_ckpt);

int model_acts_init(const model *m, model_acts *a, int cap_T, int cap_M, int grad) {
    return acts_init(m, a, cap_T, cap_M, grad, grad == MODEL_ACTS_RECOMPUTE ? m->cfg.L : 0);
}

int model_acts_init_budget(const model *m, model_acts *a, int cap_T, int cap_M, size_t budget) {
    int L = m->cfg.L, k = 0;
    if (budget) {
        /* bytes fall with each checkpointed layer: the fewest that fit */
        while (k <= L && model_acts_bytes(m, cap_T, cap_M, 1, k) > budget) k++;
        if (k > L) {
            memset(a, 0, sizeof *a);
            return err_set(GE_NOMEM,
                           "activations for %d tokens need %.1f MiB even with every layer recomputed, over the "
                           "%.1f MiB left on %s: lower max_tokens_per_micro_batch",
                           cap_T, model_acts_bytes(m, cap_T, cap_M, 1, L) / 1048576.0, budget / 1048576.0, m->be->name);
        }
    }
    return acts_init(m, a, cap_T, cap_M, 1, k);
}

int model_acts_init_ckpt(const model *m, model_acts *a, int cap_T, int cap_M, int n_ckpt) {
    return acts_init(m, a, cap_T, cap_M, 1, n_ckpt);
}

static int acts_init(const model *m, model_acts *a, int cap_T, int cap_M, int grad, int n_ckpt) {
    memset(a, 0, sizeof *a);
    a->grad = grad;
    a->n_ckpt = grad ? n_ckpt : 0;
    return acts_alloc(m, a, cap_T, cap_M);
}

int model_acts_init_kv(const model *m, model_acts *a, int cap_T, int cap_M, const model_kv *kv, model_kv *dkv, int row0, int ring,
                       int recompute) {
    *a = (model_acts){.grad = 1, .kv = kv, .dkv = dkv, .kv_row0 = row0, .ring = ring, .n_ckpt = recompute ? m->cfg.L : 0};
    int rc = acts_alloc(m, a, cap_T, cap_M);
    if (!rc && ring && recompute) a->layer_bytes = (size_t)a->cap_T * m->cfg.C * (size_t)m->be->act_bytes; /* the input alone */
    return rc;
}

/* carve() with a->grad, kv, ring set */
static int acts_alloc(const model *m, model_acts *a, int cap_T, int cap_M) {
    a->cap_T = cap_T > 0 ? cap_T : 1;
    a->cap_M = cap_M > 0 ? cap_M : 1;
    a->l = calloc((size_t)m->cfg.L, sizeof *a->l);
    if (!a->l) return err_set(GE_NOMEM, "model: out of memory");
    size_t bytes = carve(m, a, NULL);
    a->mem = m->be->alloc(m->be, bytes);
    a->bytes = bytes;
    if (!a->mem) {
        free(a->l);
        a->l = NULL;
        return err_set(GE_NOMEM, "activations for %d tokens need %.1f MiB on %s: lower max_tokens_per_micro_batch", cap_T,
                       bytes / 1048576.0, m->be->name);
    }
    carve(m, a, a->mem);
    return 0;
}

void model_acts_free(const model *m, model_acts *a) {
    if (a->mem && !a->borrowed) m->be->free(m->be, a->mem);
    free(a->l);
    memset(a, 0, sizeof *a);
}

static int keeps_kv(const model_config *c, int l) { return c->attn[l] != ATTN_DELTANET; }

long long model_kv_row_bytes(const model *m) {
    const model_config *c = &m->cfg;
    long long n = 0;
    for (int l = 0; l < c->L; l++) n += keeps_kv(c, l);
    return 2LL * n * c->K * c->D * m->be->act_bytes;
}

/* one DeltaNet layer's state row: (Hv,Dk,Dv) then (Kc-1,Cc) floats */
static size_t state_floats(const model_config *c) {
    return (size_t)c->lin_hv * c->lin_dk * c->lin_dv +
        (size_t)(c->conv_k - 1) * (2 * c->lin_hk * c->lin_dk + c->lin_hv * c->lin_dv);
}

long long model_state_row_bytes(const model *m) {
    const model_config *c = &m->cfg;
    long long n = 0;
    for (int l = 0; l < c->L; l++) n += !keeps_kv(c, l);
    return n * (long long)state_floats(c) * 4;
}

int model_kv_init(const model *m, model_kv *kv, int cap_S) {
    const model_config *c = &m->cfg;
    memset(kv, 0, sizeof *kv);
    size_t per = (size_t)cap_S * c->K * c->D * (size_t)m->be->act_bytes, n = 0;
    kv->cap_S = cap_S;
    kv->k = calloc((size_t)c->L, sizeof(void *));
    kv->v = calloc((size_t)c->L, sizeof(void *));
    for (int l = 0; l < c->L; l++) n += keeps_kv(c, l);
    kv->mem = kv->k && kv->v && n ? m->be->alloc(m->be, per * 2 * n) : NULL;
    if (!kv->k || !kv->v || (n && !kv->mem)) {
        free(kv->k);
        free(kv->v);
        memset(kv, 0, sizeof *kv);
        return err_set(GE_NOMEM, "KV cache of %d rows needs %.1f MiB on %s", cap_S, per * 2.0 * n / 1048576.0, m->be->name);
    }
    for (int l = 0, i = 0; l < c->L; l++)
        if (keeps_kv(c, l)) {
            kv->k[l] = (char *)kv->mem + per * (size_t)(2 * i);
            kv->v[l] = (char *)kv->mem + per * (size_t)(2 * i + 1);
            i++;
        }
    return 0;
}

int model_kv_states_init(const model *m, model_kv *kv, int cap) {
    const model_config *c = &m->cfg;
    size_t row = (size_t)model_state_row_bytes(m), sf = state_floats(c);
    if (!row || cap < 1) return 0;
    kv->state = calloc((size_t)c->L, sizeof(float *));
    kv->tail = calloc((size_t)c->L, sizeof(float *));
    kv->st_mem = kv->state && kv->tail ? m->be->alloc(m->be, row * (size_t)cap) : NULL;
    if (!kv->st_mem) {
        free(kv->state);
        free(kv->tail);
        kv->state = kv->tail = NULL;
        return err_set(GE_NOMEM, "recurrent state of %d sequences needs %.1f MiB on %s", cap, row * (double)cap / 1048576.0,
                       m->be->name);
    }
    kv->cap_st = cap;
    float *p = kv->st_mem;
    for (int l = 0; l < c->L; l++)
        if (!keeps_kv(c, l)) {
            kv->state[l] = p;
            kv->tail[l] = p + (size_t)cap * c->lin_hv * c->lin_dk * c->lin_dv;
            p += (size_t)cap * sf;
        }
    return 0;
}

void model_kv_state_set(const model *m, model_kv *kv, int dst, int src) {
    const model_config *c = &m->cfg;
    size_t ns = (size_t)c->lin_hv * c->lin_dk * c->lin_dv * 4, nt = state_floats(c) * 4 - ns;
    for (int l = 0; l < c->L && kv->cap_st; l++) {
        if (!kv->state[l]) continue;
        char *s = (char *)kv->state[l], *t = (char *)kv->tail[l];
        if (src < 0) {
            m->be->zero(m->be, s + ns * (size_t)dst, ns);
            m->be->zero(m->be, t + nt * (size_t)dst, nt);
        } else if (src != dst) {
            m->be->copy(m->be, s + ns * (size_t)dst, s + ns * (size_t)src, ns);
            m->be->copy(m->be, t + nt * (size_t)dst, t + nt * (size_t)src, nt);
        }
    }
}

void model_kv_copy_rows(const model *m, model_kv *kv, int dst, int src, int n) {
    const model_config *c = &m->cfg;
    size_t row = (size_t)c->K * c->D * (size_t)m->be->act_bytes;
    if (n <= 0 || dst == src) return;
    for (int l = 0; l < c->L; l++) {
        if (!kv->k[l]) continue;
        m->be->copy(m->be, (char *)kv->k[l] + row * (size_t)dst, (char *)kv->k[l] + row * (size_t)src, row * (size_t)n);
        m->be->copy(m->be, (char *)kv->v[l] + row * (size_t)dst, (char *)kv->v[l] + row * (size_t)src, row * (size_t)n);
    }
}

void model_kv_clean_to(const model *m, model_kv *kv, int end) {
    const model_config *c = &m->cfg;
    size_t row = (size_t)c->K * c->D * (size_t)m->be->act_bytes;
    if (end > kv->cap_S) end = kv->cap_S;
    if (end <= kv->clean) return;
    for (int l = 0; l < c->L; l++) {
        if (!kv->k[l]) continue;
        m->be->zero(m->be, (char *)kv->k[l] + row * (size_t)kv->clean, row * (size_t)(end - kv->clean));
        m->be->zero(m->be, (char *)kv->v[l] + row * (size_t)kv->clean, row * (size_t)(end - kv->clean));
    }
    kv->clean = end;
}

void model_kv_free(const model *m, model_kv *kv) {
    if (kv->mem) m->be->free(m->be, kv->mem);
    if (kv->st_mem) m->be->free(m->be, kv->st_mem);
    free(kv->k);
    free(kv->v);
    free(kv->state);
    free(kv->tail);
    memset(kv, 0, sizeof *kv);
}

/* ---------------------------------------------------------------- forward */

pack_layout model_pack_layout(const model *m) {
    return config_n_linear(&m->cfg) > 0 || m->be->tune.exact ? PACK_PACKED : PACK_TREE;
}

void model_input_from_batch(model_input *in, const pack_batch *b) {
    *in = (model_input){.T = b->T,
                        .tokens = b->tokens,
                        .pos = b->pos,
                        .a0 = b->kv_a0,
                        .a1 = b->kv_a1,
                        .b0 = b->kv_b0,
                        .b1 = b->kv_b1,
                        .x0 = b->kv_x0,
                        .x1 = b->kv_x1,
                        .nx = b->nx,
                        .slot = NULL,
                        .M = b->M,
                        .out_pos = b->out_pos,
                        .out_tok = b->out_tok,
                        .count = b->tok_count,
                        .routes = b->routes};
}

int model_input_upload(const model *m, model_acts *a, const model_input *in, model_dev_input *d) {
    eng_backend *be = m->be;
    if (in->T > a->cap_T || in->M > a->cap_M)
        return err_set(GE_INTERNAL, "model: %d tokens / %d predictions exceed the activations' %d / %d", in->T, in->M, a->cap_T,
                       a->cap_M);
    int T = in->T, *p = a->ints, rc = 0;
    const int *src[9] = {in->tokens, in->pos, in->a0, in->a1, in->b0, in->b1, in->slot, in->count, in->srow};
    int *dst[9];
    for (int i = 0; i < 9; i++, p += a->cap_T) {
        dst[i] = p;
        if (src[i] && T && !rc) rc = be->to_dev(be, p, src[i], (size_t)T * sizeof(int));
    }
    int *op = p, *ot = p + a->cap_M, *x0 = ot + a->cap_M, *x1 = x0 + (size_t)ATTN_XR_MAX * a->cap_T;
    if (in->M && !rc) rc = be->to_dev(be, op, in->out_pos, (size_t)in->M * sizeof(int));
    if (in->M && !rc) rc = be->to_dev(be, ot, in->out_tok, (size_t)in->M * sizeof(int));
    if (in->nx > ATTN_XR_MAX) return err_set(GE_INTERNAL, "model: %d extra key ranges > %d", in->nx, (int)ATTN_XR_MAX);
    if (in->nx && !rc) rc = be->to_dev(be, x0, in->x0, (size_t)in->nx * T * sizeof(int));
    if (in->nx && !rc) rc = be->to_dev(be, x1, in->x1, (size_t)in->nx * T * sizeof(int));
    size_t nr = (size_t)config_n_moe(&m->cfg) * T * m->cfg.top_k;
    if (in->routes && nr && !rc) rc = be->to_dev(be, a->routes, in->routes, nr * sizeof(int));
    *d = (model_dev_input){.T = T,
                           .M = in->M,
                           .tokens = dst[0],
                           .pos = dst[1],
                           .slot = in->slot ? dst[6] : NULL,
                           .srow = in->srow ? dst[8] : NULL,
                           .out_pos = op,
                           .out_tok = ot,
                           .r = {dst[2], dst[3], dst[4], dst[5], in->nx ? x0 : NULL, in->nx ? x1 : NULL, in->nx},
                           .count = in->count ? dst[7] : NULL,
                           .routes = a->routes,
                           .replay = in->routes != NULL};
    return rc;
}

int model_routes_get(const model *m, const model_acts *a, int T_fwd, int T, int *out) {
    int Lm = config_n_moe(&m->cfg), k = m->cfg.top_k;
    if (!Lm || !T) return 0;
    int *h = malloc((size_t)Lm * T_fwd * k * sizeof(int)), rc;
    if (!h) return err_set(GE_NOMEM, "model: out of memory for %d tokens' routes", T_fwd);
    if (!(rc = m->be->sync(m->be)) && !(rc = m->be->to_host(m->be, h, a->routes, (size_t)Lm * T_fwd * k * sizeof(int))))
        for (int t = 0; t < T; t++)
            for (int l = 0; l < Lm; l++)
                memcpy(out + ((size_t)t * Lm + l) * k, h + ((size_t)l * T_fwd + t) * k, (size_t)k * sizeof(int));
    free(h);
    return rc;
}

int model_forward(const model *m, const model_views *w, model_acts *a, model_kv *kv, const model_input *in, float temperature,
                  int want_entropy) {
    model_dev_input d;
    int rc = model_input_upload(m, a, in, &d);
    if (rc) return rc;
    if (kv && !in->slot) return err_set(GE_INTERNAL, "model_forward: a KV cache needs slots");
    if (kv && m->cfg.arch == ARCH_QWEN3_5 && !a->carry && (!in->srow || !kv->cap_st))
        return err_set(GE_INTERNAL, "model_forward: a hybrid model's KV cache needs its state rows and srow (or a carry)");
    a->ep_rc = 0;
    model_forward_dev(m, w, a, kv, &d, temperature, want_entropy);
    rc = m->be->sync(m->be);
    return rc ? rc : a->ep_rc;
}

void model_forward_dev(const model *m, const model_views *w, model_acts *a, model_kv *kv, const model_dev_input *d,
                       float temperature, int want_entropy) {
    const model_config *c = &m->cfg;
    eng_backend *be = m->be;
    int T = d->T, C = c->C;
    /* Layer l reads the residual stream from l[l].x and writes it, its two residual adds done,
     * to the next layer's x (with grad every layer keeps its own; without, all share l[0]). */
    be->embedding_fwd(be, a->l[0].x, d->tokens, w->embed, T, C);
    if (a->moe_stats) be->zero(be, a->moe_stats, MOE_STATS(c->E) * sizeof(float));
    for (int l = 0; l < c->L; l++) {
        void *out = l + 1 < c->L ? a->l[l + 1].x : a->xL;
        void *c0 = NULL, *c1 = NULL; /* this layer's cache: K/V rows, or a DeltaNet layer's state and tail rows */
        if (kv) c0 = kv->k[l] ? kv->k[l] : kv->cap_st ? (void *)kv->state[l] : NULL;
        if (kv) c1 = kv->v[l] ? kv->v[l] : kv->cap_st ? (void *)kv->tail[l] : NULL;
        model_layer_fwd(m, w, a, l, out, d, c0, c1);
    }
    be->rmsnorm_fwd(be, a->lnf, a->rstdf, a->xL, w->final_norm, T, C, c->eps);
    if (d->M)
        be->logprob_fwd(be, a->logp, want_entropy ? a->ent : NULL, a->lnf, d->out_pos, d->out_tok, w->lm_head, d->M, C, c->V,
                        temperature);
}

/* Target t's adapter term for its base projection (a NULL: none, as in the reference's views):
 * the op writes X A^T to the i-th of the three (T, r) slots of the scratch lu. */
static mm_lowrank lora_term(const model *m, const model_acts *a, const model_layer_views *W, int t, int i, int T) {
    if (!m->lora_r || !W->la[t]) return (mm_lowrank){0};
    void *u = (char *)a->lu + (size_t)i * T * m->lora_r * m->be->act_bytes;
    return (mm_lowrank){W->la[t], W->lb[t], u, m->lora_r};
}

/* ---------------------------------------------------------------- MLP kinds
 * Each kind's forward takes A->xm (T,C) and writes out = A->xm + MLP(rmsnorm(A->xm)) (out NULL:
 * stop where the backward's recompute may, with what its backward reads made); its backward
 * takes d out in a->dres and adds the MLP branch's d A->xm to it. */

/* Dense SwiGLU: out = xm + (silu(ln2 Wg^T) * (ln2 Wu^T)) Wd^T, the norm fused into the gate/up
 * projections, the residual add into the down projection. */
static void mlp_dense_fwd(const model *m, const model_views *w, model_acts *a, int l, void *out, const model_dev_input *d) {
    const model_config *c = &m->cfg;
    eng_backend *be = m->be;
    int T = d->T, C = c->C, F = c->F;
    struct model_layer_acts *A = &a->l[l];
    const model_layer_views *W = &w->layers[l];
    mm_norm n2 = {W->mlp_norm, c->eps, A->ln2};
    mm_lowrank lg[2] = {lora_term(m, a, W, LORA_GATE, 0, T), lora_term(m, a, W, LORA_UP, 1, T)};
    be->mlp_in_fwd(be, A->a, A->g, A->u, A->xm, &n2, W->w_gate, W->w_up, T, C, F, lg[0].a || lg[1].a ? lg : NULL);
    if (!out) return; /* a backward's recompute: the layer's output is not needed */
    mm_part dn = {out, W->w_down, NULL, C, A->xm, lora_term(m, a, W, LORA_DOWN, 0, T)};
    be->matmul_fwd_n(be, &dn, 1, A->a, NULL, T, F);
}

/* The shared expert (cfg.shared, kernels/moe_shared.h) on ln2: g, u = ln2 Ws^T, a = swiglu,
 * sy = a Wsd^T, sz = ln2 g^T; out += sigmoid(sz) sy (out NULL, a backward's recompute: g, u, sy,
 * sz made, nothing added). Its backward takes d out in a->dres and adds d ln2 into a->dln; as the
 * dense MLP's, it reads the kept g, u, sy, sz, recomputes only a (backward scratch, carve()), and
 * reuses the dense MLP's scratch (carve() sizes it for the wider of the two). */
static void shared_fwd(const model *m, const model_layer_views *W, struct model_layer_acts *A, void *out, int T) {
    eng_backend *be = m->be;
    int C = m->cfg.C, F = config_shared_ff(&m->cfg);
    be->matmul_fwd(be, A->g, A->ln2, W->ws_gate, NULL, T, C, F);
    be->matmul_fwd(be, A->u, A->ln2, W->ws_up, NULL, T, C, F);
    be->swiglu_fwd(be, A->a, A->g, A->u, (long long)T * F);
    be->matmul_fwd(be, A->sy, A->a, W->ws_down, NULL, T, F, C);
    be->matmul_fwd(be, A->sz, A->ln2, W->ws_g, NULL, T, C, 1);
    if (out) be->moe_shared_gate_fwd(be, out, A->sy, A->sz, T, C);
}

static void shared_bwd(const model *m, const model_layer_views *W, const model_layer_views *G, struct model_layer_acts *A,
                       model_acts *a, int T) {
    eng_backend *be = m->be;
    int C = m->cfg.C, F = config_shared_ff(&m->cfg);
    size_t eb = (size_t)be->act_bytes;
    be->swiglu_fwd(be, A->a, A->g, A->u, (long long)T * F); /* a is backward scratch (carve()): recomputed */
    be->moe_shared_gate_bwd(be, A->sy, A->sz, a->dres, T, C); /* sy := d sy, sz := d sz */
    be->zero(be, a->da, (size_t)T * F * eb);
    be->matmul_bwd(be, a->da, G->ws_down, NULL, A->sy, A->a, W->ws_down, T, F, C);
    be->swiglu_bwd(be, a->dg, a->du, a->da, A->g, A->u, (long long)T * F);
    be->matmul_bwd(be, a->dln, G->ws_gate, NULL, a->dg, A->ln2, W->ws_gate, T, C, F);
    be->matmul_bwd(be, a->dln, G->ws_up, NULL, a->du, A->ln2, W->ws_up, T, C, F);
    be->matmul_bwd(be, a->dln, G->ws_g, NULL, A->sz, A->ln2, W->ws_g, T, C, 1);
}

/* The experts' adapters of a layer (none: both pairs NULL), their gradients from G (NULL: none) */
static moe_lora moe_lora_of(const model *m, const model_layer_views *W, const model_layer_views *G) {
    moe_lora lr = {.agu = W->lea[LORA_EGU],
                   .bgu = W->leb[LORA_EGU],
                   .ad = W->lea[LORA_EDOWN],
                   .bd = W->leb[LORA_EDOWN],
                   .rg = lora_rank_of(m, LORA_N + LORA_EGU),
                   .rd = lora_rank_of(m, LORA_N + LORA_EDOWN)};
    if (G) {
        lr.gagu = G->lea[LORA_EGU], lr.gbgu = G->leb[LORA_EGU];
        lr.gad = G->lea[LORA_EDOWN], lr.gbd = G->leb[LORA_EDOWN];
    }
    return lr;
}

/* Layer l's place among the MoE layers: its slice of the routes (model_input.routes). */
static int moe_index(const model_config *c, int l) {
    int n = 0;
    for (int j = 0; j < l; j++) n += c->mlp[j] == MLP_MOE;
    return n;
}

/* Mixture of experts (kernels/moe.h) on ln2 = rmsnorm(xm). The experts always run (the backward
 * reads their outputs); the balance statistics are summed only by a forward that makes the
 * layer's output, so a recompute does not count its tokens twice. With d->routes the router
 * replays the given experts (d->replay) or the chosen ones are copied there (a record). */
static void mlp_moe_fwd(const model *m, const model_views *w, model_acts *a, int l, void *out, const model_dev_input *d) {
    const model_config *c = &m->cfg;
    eng_backend *be = m->be;
    int T = d->T, C = c->C;
    struct model_layer_acts *A = &a->l[l];
    const model_layer_views *W = &w->layers[l];
    size_t nk = (size_t)T * c->top_k;
    int *rt = d->routes ? d->routes + (size_t)moe_index(c, l) * nk : NULL;
    be->rmsnorm_fwd(be, A->ln2, A->rstd2, A->xm, W->mlp_norm, T, C, c->eps);
    be->moe_router_fwd(be, A->probs, A->topi, A->topw, out ? a->moe_stats : NULL, A->ln2, W->router, d->replay ? rt : NULL,
                       d->count, T, C, c->E, c->top_k, c->norm_topk);
    if (rt && !d->replay) be->copy(be, rt, A->topi, nk * sizeof(int));
    if (m->ep.W > 1) { /* expert parallelism: no adapters on the experts (LoRA refuses a comm); one rank holds them all */
        int rc = moe_ep_fwd(m, W, A, out, T);
        a->ep_rc = a->ep_rc ? a->ep_rc : rc;
    } else {
        moe_lora lr = moe_lora_of(m, W, NULL);
        be->moe_experts_fwd(be, out, A->eg, A->eu, A->ey, A->ln2, A->xm, A->topi, A->topw, W->we_gate, W->we_up, W->we_down, T, C,
                            c->E, c->top_k, c->Fm, lr.agu || lr.ad ? &lr : NULL);
    }
    if (c->shared) shared_fwd(m, W, A, out, T);
}

static void lora_bwd(const model *m, model_acts *a, const model_layer_views *W, const model_layer_views *G, int t, const void *dY,
                     const void *X, void *dX, int T, int I, int O);

/* MLP: dres is d x' = d xm (residual) + the MLP branch's contribution. ln2 and a are
 * recomputed (carve()): the same kernels on the same inputs give the forward's values. */
static void mlp_dense_bwd(const model *m, const model_views *w, const model_views *g, model_acts *a, int l,
                          const model_dev_input *d) {
    const model_config *c = &m->cfg;
    eng_backend *be = m->be;
    int T = d->T, C = c->C, F = c->F;
    size_t eb = (size_t)be->act_bytes;
    struct model_layer_acts *A = &a->l[l];
    const model_layer_views *W = &w->layers[l], *G = &g->layers[l];
    be->rmsnorm_fwd(be, A->ln2, A->rstd2, A->xm, W->mlp_norm, T, C, c->eps);
    be->swiglu_fwd(be, A->a, A->g, A->u, (long long)T * F);
    be->zero(be, a->da, (size_t)T * F * eb);
    be->matmul_bwd(be, a->da, G->w_down, NULL, a->dres, A->a, W->w_down, T, F, C);
    lora_bwd(m, a, W, G, LORA_DOWN, a->dres, A->a, a->da, T, F, C); /* before swiglu_bwd writes du = A->a */
    be->swiglu_bwd(be, a->dg, a->du, a->da, A->g, A->u, (long long)T * F);
    be->zero(be, a->dln, (size_t)T * C * eb);
    be->matmul_bwd(be, a->dln, G->w_gate, NULL, a->dg, A->ln2, W->w_gate, T, C, F);
    be->matmul_bwd(be, a->dln, G->w_up, NULL, a->du, A->ln2, W->w_up, T, C, F);
    lora_bwd(m, a, W, G, LORA_GATE, a->dg, A->ln2, a->dln, T, C, F);
    lora_bwd(m, a, W, G, LORA_UP, a->du, A->ln2, a->dln, T, C, F);
    be->rmsnorm_bwd(be, a->dres, G->mlp_norm, a->dln, A->xm, W->mlp_norm, A->rstd2, T, C);
}

/* The experts' backward gives d ln2 and the routing weights' gradient, which the router's
 * backward carries (with the balance loss's term, d->aux_g) into d ln2 and the router. */
static void mlp_moe_bwd(const model *m, const model_views *w, const model_views *g, model_acts *a, int l, const model_dev_input *d) {
    const model_config *c = &m->cfg;
    eng_backend *be = m->be;
    int T = d->T, C = c->C;
    struct model_layer_acts *A = &a->l[l];
    const model_layer_views *W = &w->layers[l], *G = &g->layers[l];
    be->rmsnorm_fwd(be, A->ln2, A->rstd2, A->xm, W->mlp_norm, T, C, c->eps);
    be->zero(be, a->dln, (size_t)T * C * (size_t)be->act_bytes);
    if (m->ep.W > 1) {
        int rc = moe_ep_bwd(m, W, G, A, a->dres, a->dln, a->dtopw, T);
        a->ep_rc = a->ep_rc ? a->ep_rc : rc;
    } else {
        moe_lora lr = moe_lora_of(m, W, G);
        be->moe_experts_bwd(be, a->dln, G->we_gate, G->we_up, G->we_down, a->dtopw, a->edg, a->edu, a->dres, A->ln2, A->topi,
                            A->topw, A->eg, A->eu, A->ey, W->we_gate, W->we_up, W->we_down, T, C, c->E, c->top_k, c->Fm,
                            lr.agu || lr.ad ? &lr : NULL);
    }
    be->moe_router_bwd(be, a->dln, G->router, a->dlogit, a->dtopw, A->probs, A->topi, A->ln2, W->router, d->aux_g, d->count, T, C,
                       c->E, c->top_k, c->norm_topk);
    if (c->shared) shared_bwd(m, W, G, A, a, T);
    be->rmsnorm_bwd(be, a->dres, G->mlp_norm, a->dln, A->xm, W->mlp_norm, A->rstd2, T, C);
}

/* One row per mlp_kind (config.h). */
static const struct {
    void (*fwd)(const model *m, const model_views *w, model_acts *a, int l, void *out, const model_dev_input *d);
    void (*bwd)(const model *m, const model_views *w, const model_views *g, model_acts *a, int l, const model_dev_input *d);
} mlp_kinds[] = {
    [MLP_DENSE] = {mlp_dense_fwd, mlp_dense_bwd},
    [MLP_MOE] = {mlp_moe_fwd, mlp_moe_bwd},
};

/* ---------------------------------------------------------------- attention kinds
 * Each kind's forward takes A->x (T,C) and writes A->xm = A->x + attention(rmsnorm(A->x)); its
 * backward takes d A->xm in a->dres and leaves d A->x there (the residual and the branch). */

/* Softmax attention: q, k, v = rmsnorm(x) W^T (the norm fused into the projections), q/k norm
 * and RoPE, attention, xm = x + att Wo^T. kv_k, kv_v: this layer's cache (d->slot set) or NULL. */
static void attn_full_fwd(const model *m, const model_views *w, model_acts *a, int l, const model_dev_input *d, void *kv_k,
                          void *kv_v) {
    const model_config *c = &m->cfg;
    eng_backend *be = m->be;
    int T = d->T, C = c->C, H = c->H, K = c->K, D = c->D, HD = H * D, KD = K * D;
    struct model_layer_acts *A = &a->l[l];
    const model_layer_views *W = &w->layers[l];
    /* the norms ride in front of the projections (their ln1 / ln2 are scratch: the backward
     * recomputes them), the residual adds in the o and down projections; adapters add both
     * halves of their terms inside the base projections (mm_part.lr, lora_term) */
    mm_norm n1 = {W->attn_norm, c->eps, A->ln1};
    mm_part qkv[3] = {{c->qk_norm ? A->q0 : A->q, W->wq, W->bq, HD, NULL, lora_term(m, a, W, LORA_Q, 0, T)},
                      {c->qk_norm ? A->k0 : A->k, W->wk, W->bk, KD, NULL, lora_term(m, a, W, LORA_K, 1, T)},
                      {A->v, W->wv, W->bv, KD, NULL, lora_term(m, a, W, LORA_V, 2, T)}};
    be->matmul_fwd_n(be, qkv, 3, A->x, &n1, T, C);
    /* with a KV cache (no grad) k and v go straight to their cache rows; A->k, A->v stay unwritten */
    qkv_rope_io io = {.q_out = A->q,
                      .k_out = kv_k ? kv_k : A->k,
                      .v_out = kv_v ? kv_v : A->v,
                      .rstd_q = A->rstdq,
                      .rstd_k = A->rstdk,
                      .q = c->qk_norm ? A->q0 : A->q,
                      .k = c->qk_norm ? A->k0 : A->k,
                      .v = A->v,
                      .qw = c->qk_norm ? W->q_norm : NULL,
                      .kw = c->qk_norm ? W->k_norm : NULL,
                      .rows = kv_k ? d->slot : NULL};
    be->qkv_rope_fwd(be, &io, d->pos, m->inv_freq, T, H, K, D, c->eps);
    const void *keys = io.k_out, *vals = io.v_out;
    be->attention_fwd(be, A->att, A->lse, A->q, keys, vals, d->r, T, H, K, D);
    mm_part o = {A->xm, W->wo, W->bo, C, A->x, lora_term(m, a, W, LORA_O, 0, T)};
    be->matmul_fwd_n(be, &o, 1, A->att, NULL, T, HD);
}

static void attn_full_bwd(const model *m, const model_views *w, const model_views *g, model_acts *a, int l,
                          const model_dev_input *d);

/* One row per attn_kind (config.h); the hybrid kinds are hybrid.c's. */
static const struct {
    void (*fwd)(const model *m, const model_views *w, model_acts *a, int l, const model_dev_input *d, void *kv_k, void *kv_v);
    void (*bwd)(const model *m, const model_views *w, const model_views *g, model_acts *a, int l, const model_dev_input *d);
} attn_kinds[] = {
    [ATTN_FULL] = {attn_full_fwd, attn_full_bwd},
    [ATTN_GATED] = {hybrid_gated_fwd, hybrid_gated_bwd},
    [ATTN_DELTANET] = {hybrid_deltanet_fwd, hybrid_deltanet_bwd},
};

void model_layer_fwd(const model *m, const model_views *w, model_acts *a, int l, void *out, const model_dev_input *d, void *kv_k,
                     void *kv_v) {
    const model_config *c = &m->cfg;
    attn_kinds[c->attn[l]].fwd(m, w, a, l, d, kv_k, kv_v);
    mlp_kinds[c->mlp[l]].fwd(m, w, a, l, out, d);
}

/* ---------------------------------------------------------------- backward */

/* ---------------------------------------------------------------- the balance loss
 * transformers' load_balancing_loss_func over the routers of every MoE layer, rows weighted by
 * their counts: with n = Σ_layers Σ_t count_t, f_e = Σ count_t [e chosen] / n (summed over the k
 * slots) and P_e = Σ count_t p_te / n, aux = E Σ_e f_e P_e. f is not differentiated (topk's
 * indices), so d aux / d p_te = E f_e count_t / n. */

static int read_stats(const model *m, const model_acts *a, float *st) {
    return m->be->to_host(m->be, st, a->moe_stats, MOE_STATS(m->cfg.E) * sizeof(float));
}

int model_aux_loss(const model *m, const model_acts *a, double *aux) {
    int E = m->cfg.E;
    *aux = 0;
    if (!a->moe_stats) return 0;
    float *st = malloc(MOE_STATS(E) * sizeof(float));
    if (!st) return err_set(GE_NOMEM, "model: out of memory");
    int rc = read_stats(m, a, st);
    double n = st[2 * E], s = 0;
    for (int e = 0; !rc && n > 0 && e < E; e++) s += ((double)st[e] / n) * ((double)st[E + e] / n);
    if (!rc) *aux = (double)E * s;
    free(st);
    return rc;
}

/* a->aux_g = coef · d aux / d p per unit count, from the last forward's statistics */
static int aux_grad(const model *m, model_acts *a, float coef) {
    int E = m->cfg.E;
    float *st = malloc(MOE_STATS(E) * sizeof(float)), *gh = malloc((size_t)E * sizeof(float));
    int rc = st && gh ? read_stats(m, a, st) : err_set(GE_NOMEM, "model: out of memory");
    double n = rc ? 0 : st[2 * E];
    for (int e = 0; !rc && e < E; e++) gh[e] = n > 0 ? (float)(coef * (double)E * ((double)st[e] / n) / n) : 0.0f;
    if (!rc) rc = m->be->to_dev(m->be, a->aux_g, gh, (size_t)E * sizeof(float));
    free(st);
    free(gh);
    return rc;
}

int model_backward(const model *m, const model_views *w, const model_views *g, model_acts *a, const model_input *in,
                   const float *dlogp, const float *dent, float temperature) {
    const model_config *c = &m->cfg;
    eng_backend *be = m->be;
    if (!a->grad) return err_set(GE_INTERNAL, "model_backward: activations were made without grad");
    a->ep_rc = 0;
    int T = in->T, M = in->M, C = c->C;
    size_t eb = (size_t)be->act_bytes;
    model_dev_input d;
    int rc = model_input_upload(m, a, in, &d);
    if (!rc && M) rc = be->to_dev(be, a->dlogp, dlogp, (size_t)M * 4);
    if (!rc && M && dent) rc = be->to_dev(be, a->dent, dent, (size_t)M * 4);
    if (!rc && in->aux_coef != 0 && a->aux_g) {
        rc = aux_grad(m, a, in->aux_coef);
        d.aux_g = a->aux_g;
    }
    if (rc) return rc;
    be->zero(be, a->dlnf, (size_t)T * C * eb);
    be->zero(be, a->dres, (size_t)T * C * eb);
    if (M)
        be->logprob_bwd(be, a->dlnf, g->lm_head, a->dlogp, dent ? a->dent : NULL, a->lnf, d.out_pos, d.out_tok, w->lm_head, M, C,
                        c->V, temperature);
    be->rmsnorm_bwd(be, a->dres, g->final_norm, a->dlnf, a->xL, w->final_norm, a->rstdf, T, C);
    for (int l = c->L - 1; l >= 0; l--) {
        if (l < a->n_ckpt) model_layer_fwd(m, w, a, l, NULL, &d, NULL, NULL); /* refill the shared set */
        model_layer_bwd(m, w, g, a, l, &d);
    }
    if (g->embed) be->embedding_bwd(be, g->embed, a->dres, d.tokens, T, C);
    rc = be->sync(be);
    return rc ? rc : a->ep_rc;
}

/* Backward of an adapter term (mm_part.lr) given dY (T, O): gA, gB += their
 * gradients, dX (T, I) += the input gradient through the adapter. X A^T is recomputed into lu. */
static void lora_bwd(const model *m, model_acts *a, const model_layer_views *W, const model_layer_views *G, int t, const void *dY,
                     const void *X, void *dX, int T, int I, int O) {
    if (!W->la[t]) return;
    eng_backend *be = m->be;
    int r = m->lora_r;
    be->matmul_fwd(be, a->lu, X, W->la[t], NULL, T, I, r);
    be->zero(be, a->ldu, (size_t)T * r * be->act_bytes);
    be->matmul_bwd(be, a->ldu, G->lb[t], NULL, dY, a->lu, W->lb[t], T, r, O);
    be->matmul_bwd(be, dX, G->la[t], NULL, a->ldu, X, W->la[t], T, I, r);
}

/* dkv's layer-l rows before the attention backward when a->acc keeps the sums (model.h): zero
 * for queries after the accumulated rows, the sums cast once for the accumulated rows' own. */
static void acc_begin(const model *m, const model_acts *a, int l, int T) {
    eng_backend *be = m->be;
    const model_kv_acc *acc = a->acc;
    size_t KD = (size_t)m->cfg.K * m->cfg.D, eb = (size_t)be->act_bytes;
    assert(a->kv_row0 == acc->S || (a->kv_row0 == 0 && T == acc->S));
    if (a->kv_row0 > 0) {
        be->zero(be, a->dkv->k[l], (size_t)(a->kv_row0 + T) * KD * eb);
        be->zero(be, a->dkv->v[l], (size_t)(a->kv_row0 + T) * KD * eb);
    } else {
        be->f32_to_act(be, a->dkv->k[l], acc->k[l], (size_t)acc->S * KD);
        be->f32_to_act(be, a->dkv->v[l], acc->v[l], (size_t)acc->S * KD);
    }
}

void model_attn_keys_begin(const model *m, model_acts *a, int l, int T, model_attn_keys *o) {
    eng_backend *be = m->be;
    size_t KD = (size_t)m->cfg.K * m->cfg.D, eb = (size_t)be->act_bytes;
    if (a->kv) {
        *o = (model_attn_keys){a->kv->k[l], a->kv->v[l], a->dkv->k[l], a->dkv->v[l], NULL, NULL, a->kv_row0 + T};
        if (a->acc) acc_begin(m, a, l, T);
    } else {
        *o = (model_attn_keys){a->l[l].k, a->l[l].v, a->dk, a->dv, NULL, NULL, T};
        be->zero(be, a->dk, (size_t)T * KD * eb);
        be->zero(be, a->dv, (size_t)T * KD * eb);
    }
    o->dk_own = (char *)o->dk + (size_t)a->kv_row0 * KD * eb;
    o->dv_own = (char *)o->dv + (size_t)a->kv_row0 * KD * eb;
}

void model_attn_keys_end(const model *m, model_acts *a, int l, const model_attn_keys *o) {
    size_t KD = (size_t)m->cfg.K * m->cfg.D;
    if (a->acc && a->kv_row0 > 0) {
        m->be->acc_f32(m->be, a->acc->k[l], o->dk, (long long)a->acc->S * KD);
        m->be->acc_f32(m->be, a->acc->v[l], o->dv, (long long)a->acc->S * KD);
    }
}

void model_layer_bwd(const model *m, const model_views *w, const model_views *g, model_acts *a, int l, const model_dev_input *d) {
    const model_config *c = &m->cfg;
    mlp_kinds[c->mlp[l]].bwd(m, w, g, a, l, d);
    attn_kinds[c->attn[l]].bwd(m, w, g, a, l, d);
}

static void attn_full_bwd(const model *m, const model_views *w, const model_views *g, model_acts *a, int l,
                          const model_dev_input *d) {
    const model_config *c = &m->cfg;
    eng_backend *be = m->be;
    int T = d->T, C = c->C, H = c->H, K = c->K, D = c->D, HD = H * D, KD = K * D;
    size_t eb = (size_t)be->act_bytes;
    struct model_layer_acts *A = &a->l[l];
    const model_layer_views *W = &w->layers[l], *G = &g->layers[l];
    /* dres is d xm = d x (residual) + the attention branch's contribution. */
    be->zero(be, a->datt, (size_t)T * HD * eb);
    be->matmul_bwd(be, a->datt, G->wo, G->bo, a->dres, A->att, W->wo, T, HD, C);
    lora_bwd(m, a, W, G, LORA_O, a->dres, A->att, a->datt, T, HD, C);
    /* keys: the T tokens' own, or KV-cache rows (model_attn_keys_begin) */
    model_attn_keys ks;
    model_attn_keys_begin(m, a, l, T, &ks);
    be->attention_bwd(be, a->dq, ks.dk, ks.dv, a->datt, A->q, ks.k, ks.v, A->att, A->lse, d->r, T, ks.S, H, K, D);
    model_attn_keys_end(m, a, l, &ks);
    void *dq = a->dq, *dk = ks.dk_own, *dv = ks.dv_own;
    if (c->qk_norm) {
        be->qk_norm_rope_bwd(be, a->dq0, G->q_norm, a->dq, A->q0, W->q_norm, A->rstdq, d->pos, m->inv_freq, T, H, D);
        be->qk_norm_rope_bwd(be, a->dk0, G->k_norm, dk, A->k0, W->k_norm, A->rstdk, d->pos, m->inv_freq, T, K, D);
        dq = a->dq0;
        dk = a->dk0;
    } else {
        be->rope_bwd(be, a->dq, d->pos, m->inv_freq, T, H, D);
        be->rope_bwd(be, dk, d->pos, m->inv_freq, T, K, D);
    }
    be->rmsnorm_fwd(be, A->ln1, A->rstd1, A->x, W->attn_norm, T, C, c->eps);
    be->zero(be, a->dln, (size_t)T * C * eb);
    be->matmul_bwd(be, a->dln, G->wq, G->bq, dq, A->ln1, W->wq, T, C, HD);
    be->matmul_bwd(be, a->dln, G->wk, G->bk, dk, A->ln1, W->wk, T, C, KD);
    be->matmul_bwd(be, a->dln, G->wv, G->bv, dv, A->ln1, W->wv, T, C, KD);
    lora_bwd(m, a, W, G, LORA_Q, dq, A->ln1, a->dln, T, C, HD);
    lora_bwd(m, a, W, G, LORA_K, dk, A->ln1, a->dln, T, C, KD);
    lora_bwd(m, a, W, G, LORA_V, dv, A->ln1, a->dln, T, C, KD);
    be->rmsnorm_bwd(be, a->dres, G->attn_norm, a->dln, A->x, W->attn_norm, A->rstd1, T, C);
}
