/* lora.c — see lora.h: the adapter table, its views, fresh init, PEFT adapters in and out,
 * merging into the base. */
#include "engine/model/lora.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/format/json.h"
#include "engine/format/safetensors.h"
#include "kernels/sampling.h"

/* An adapter slot: the seven projections (LORA_Q..LORA_DOWN), then the experts' two
 * (LORA_N + LORA_EGU, LORA_N + LORA_EDOWN): PEFT's target_parameters gate_up_proj, down_proj. */
enum { N_SLOTS = LORA_N + LORA_EN, SLOT_EGU = LORA_N + LORA_EGU, SLOT_EDOWN = LORA_N + LORA_EDOWN };
static const char *const short_name[LORA_N] = {"q", "k", "v", "o", "gate", "up", "down"};
static const char *const module[N_SLOTS] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",         "self_attn.o_proj",     "mlp.gate_proj",
    "mlp.up_proj",      "mlp.down_proj",    "mlp.experts.gate_up_proj", "mlp.experts.down_proj"};
#define BIT(t) (1u << (t))

static int target_of(const char *s, size_t n) {
    for (int t = 0; t < LORA_N; t++) {
        const char *mod = strchr(module[t], '.') + 1; /* "q_proj" */
        if ((strlen(short_name[t]) == n && !strncmp(s, short_name[t], n)) || (strlen(mod) == n && !strncmp(s, mod, n))) return t;
    }
    return -1;
}

int lora_parse_targets(const char *s, unsigned *mask) {
    *mask = 0;
    if (!strcmp(s, "all")) {
        *mask = (1u << LORA_N) - 1;
        return 0;
    }
    while (*s) {
        size_t n = strcspn(s, ", ");
        if (n) {
            int t = target_of(s, n);
            if (t < 0) return err_set(GE_INVALID, "lora target \"%.*s\": use q,k,v,o,gate,up,down (or all)", (int)n, s);
            *mask |= 1u << t;
        }
        s += n;
        s += strspn(s, ", ");
    }
    return *mask ? 0 : err_set(GE_INVALID, "lora targets: none given (q,k,v,o,gate,up,down or all)");
}

void lora_targets_str(unsigned mask, char *out, size_t n) {
    size_t k = 0;
    out[0] = 0;
    for (int t = 0; t < LORA_N && k < n; t++)
        if (mask >> t & 1) k += (size_t)snprintf(out + k, n - k, "%s%s", k ? "," : "", strchr(module[t], '.') + 1);
}

/* input and output width of slot j, and its expert count (1: a plain projection) */
static void dims(const model_config *c, int j, long long *I, long long *O, long long *E) {
    long long C = c->C, HD = (long long)c->H * c->D, KD = (long long)c->K * c->D, F = c->F;
    static const int in_is[N_SLOTS] = {0, 0, 0, 1, 0, 0, 2, 0, 3}; /* 0 C, 1 HD, 2 F, 3 Fm */
    *I = in_is[j] == 0 ? C : in_is[j] == 1 ? HD : in_is[j] == 2 ? F : c->Fm;
    *O = j == LORA_Q                                       ? HD
        : j == LORA_K || j == LORA_V                       ? KD
        : j == LORA_O || j == LORA_DOWN || j == SLOT_EDOWN ? C
        : j == SLOT_EGU                                    ? 2LL * c->Fm
                                                           : F;
    *E = j >= LORA_N ? c->E : 1;
}

/* Whether layer l has slot j. A model with MoE layers adapts its MLPs as PEFT does on a
 * transformers-5 MoE: gate and up become the experts' fused gate_up_proj, down their down_proj,
 * and its dense layers (mlp_only_layers) get no MLP adapter. */
static int has_slot(const model *m, int l, int j) {
    unsigned t = m->lora_targets;
    int moe = config_n_moe(&m->cfg) > 0, sparse = m->cfg.mlp[l] == MLP_MOE;
    if (j < LORA_GATE) return t >> j & 1;
    if (j < LORA_N) return !moe && (t >> j & 1);
    if (j == SLOT_EGU) return sparse && (t & BIT(LORA_GATE));
    return sparse && (t & BIT(LORA_DOWN));
}

/* 1 when p is an expert adapter's B: (O, r·E) in PEFT's files, (E, O, r) in the buffer */
static int expert_b(const model *m, const model_param *p) { return p->off >= m->l_elems_a && strstr(p->name, ".mlp.experts."); }

/* PEFT's (O, r·E), column k·E + e, <-> the buffer's (E, O, r); to_peft picks the direction */
static void expert_b_permute(float *dst, const float *src, long long O, int r, long long E, int to_peft, float s) {
    for (long long e = 0; e < E; e++)
        for (long long o = 0; o < O; o++)
            for (int k = 0; k < r; k++) {
                size_t buf = ((size_t)e * O + o) * r + k, file = (size_t)o * r * E + k * E + e;
                if (to_peft) dst[file] = s * src[buf];
                else dst[buf] = s * src[file];
            }
}

int lora_init(model *m, int r, float alpha, unsigned targets) {
    const model_config *c = &m->cfg;
    if (config_n_moe(c) && !(targets & BIT(LORA_GATE)) != !(targets & BIT(LORA_UP)))
        return err_set(GE_INVALID,
                       "lora targets: gate and up go together on a mixture-of-experts model (one fused "
                       "gate_up_proj per layer's experts, as PEFT adapts them)");
    m->lparams = calloc((size_t)(2 * N_SLOTS * c->L) + 1, sizeof *m->lparams);
    if (!m->lparams) return err_set(GE_NOMEM, "lora: out of memory");
    m->lora_r = r;
    m->lora_alpha = alpha;
    m->lora_targets = targets;
    m->n_lparams = 0;
    m->l_elems = 0;
    for (int ab = 0; ab < 2; ab++) {
        if (ab) m->l_elems_a = m->l_elems;
        for (int l = 0; l < c->L; l++)
            for (int j = 0; j < N_SLOTS; j++) {
                if (!has_slot(m, l, j)) continue;
                long long I, O, E;
                dims(c, j, &I, &O, &E);
                long long rE = lora_rank_of(m, j) * E;
                /* two wrappers nest on the experts module when both are adapted: gate_up_proj's inside */
                const char *mod = j == SLOT_EGU && (targets & BIT(LORA_DOWN)) ? "mlp.experts.base_layer"
                    : j >= LORA_N                                             ? "mlp.experts"
                                                                              : module[j];
                model_param *p = &m->lparams[m->n_lparams++];
                snprintf(p->name, sizeof p->name, "base_model.model.model.layers.%d.%s.lora_%c.weight", l, mod, ab ? 'B' : 'A');
                p->ndim = 2;
                p->shape[0] = ab ? O : rE;
                p->shape[1] = ab ? rE : I;
                p->numel = p->shape[0] * p->shape[1];
                p->off = m->l_elems;
                m->l_elems += (p->numel + 15) & ~15LL;
            }
    }
    return 0;
}

void lora_views(const model *m, void *base, size_t esize, model_views *v) {
    int k = 0;
    for (int ab = 0; ab < 2; ab++)
        for (int l = 0; l < m->cfg.L; l++)
            for (int j = 0; j < N_SLOTS; j++) {
                if (!has_slot(m, l, j)) continue;
                void *p = (char *)base + (size_t)m->lparams[k++].off * esize;
                model_layer_views *L = &v->layers[l];
                void **slot = j < LORA_N ? (ab ? &L->lb[j] : &L->la[j]) : ab ? &L->leb[j - LORA_N] : &L->lea[j - LORA_N];
                *slot = p;
            }
}

int lora_grad_views(const model *m, float *grad, float *sink, model_views *g) {
    memset(g, 0, sizeof *g);
    g->layers = calloc((size_t)m->cfg.L, sizeof *g->layers);
    if (!g->layers) return err_set(GE_NOMEM, "lora: out of memory");
    g->final_norm = sink;
    for (int l = 0; l < m->cfg.L; l++) {
        model_layer_views *L = &g->layers[l];
        L->attn_norm = L->mlp_norm = sink;
        if (m->cfg.qk_norm) L->q_norm = L->k_norm = sink;
    }
    lora_views(m, grad, 4, g);
    return 0;
}

static uint64_t splitmix(uint64_t *s) { return sampling_mix(*s += 0x9e3779b97f4a7c15ULL); }

void lora_init_host(const model *m, float *host, uint64_t seed) {
    memset(host, 0, (size_t)m->l_elems * sizeof(float));
    uint64_t s = seed;
    for (int i = 0; i < m->n_lparams; i++) {
        const model_param *p = &m->lparams[i];
        if (p->off >= m->l_elems_a) break; /* B stays 0 */
        float bound = 1.0f / sqrtf((float)p->shape[1]);
        for (long long j = 0; j < p->numel; j++)
            host[p->off + j] = bound * (float)(2.0 * (double)(splitmix(&s) >> 11) / 9007199254740992.0 - 1.0);
    }
}

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail) && (n == k || s[n - k - 1] == '.');
}

/* rank_pattern / alpha_pattern: empty, or (when the experts' gate_up_proj is adapted) the one
 * entry PEFT writes for it, rank 2r and alpha 2·alpha (the fused gate and up, lora.h) */
static int check_pattern(const char *path, const js *pat, const char *field, double want, int gu) {
    if (!pat || pat->type == JS_NULL || (pat->type == JS_OBJ && !pat->n && !gu)) return 0;
    if (gu && pat->type == JS_OBJ && pat->n == 1 && ends_with(pat->keys[0], "gate_up_proj") && js_num(&pat->items[0], 0) == want)
        return 0;
    if (gu)
        return err_set(GE_FORMAT,
                       "%s: %s must be {\".*\\\\.gate_up_proj\": %g} alone, as PEFT writes it for the experts' fused "
                       "gate_up_proj (other per-module ranks and alphas are not supported)",
                       path, field, want);
    return err_set(GE_FORMAT, "%s: per-module %s is not supported", path, field);
}

/* target_parameters (PEFT's adapters on 3-D expert parameters): gate_up_proj -> gate and up,
 * down_proj -> down; *gu = 1 when gate_up_proj is one */
static int read_target_parameters(const char *path, const js *tp, unsigned *targets, int *gu) {
    *gu = 0;
    if (!tp || tp->type == JS_NULL) return 0;
    if (tp->type != JS_ARR) return err_set(GE_FORMAT, "%s: target_parameters must be a list of parameter names", path);
    for (int i = 0; i < tp->n; i++) {
        const char *s = js_str(&tp->items[i]);
        if (s && ends_with(s, "gate_up_proj")) *targets |= BIT(LORA_GATE) | BIT(LORA_UP), *gu = 1;
        else if (s && ends_with(s, "down_proj")) *targets |= BIT(LORA_DOWN);
        else
            return err_set(GE_FORMAT, "%s: target parameter %s is not the experts' gate_up_proj or down_proj", path, s ? s : "?");
    }
    return 0;
}

int lora_read_config(const char *dir, int *r, float *alpha, unsigned *targets) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    js_doc *doc;
    const js *root;
    int rc = js_parse_file(path, &doc, &root);
    if (rc) return rc;
    const char *type = js_get_str(root, "peft_type");
    const js *tm = js_get(root, "target_modules");
    *r = (int)js_get_num(root, "r", 0);
    *alpha = (float)js_get_num(root, "lora_alpha", *r);
    *targets = 0;
    if (type && strcmp(type, "LORA")) rc = err_set(GE_FORMAT, "%s: peft_type %s (only LORA adapters load)", path, type);
    else if (*r <= 0) rc = err_set(GE_FORMAT, "%s: r must be a positive integer", path);
    else if (js_get_bool(root, "use_rslora", 0) || js_get_bool(root, "use_dora", 0))
        rc = err_set(GE_FORMAT, "%s: use_rslora / use_dora adapters are not supported (plain LoRA only)", path);
    else if (js_get_str(root, "bias") && strcmp(js_get_str(root, "bias"), "none"))
        rc = err_set(GE_FORMAT, "%s: bias \"%s\" is not supported (\"none\" only)", path, js_get_str(root, "bias"));
    int gu = 0;
    if (!rc) rc = read_target_parameters(path, js_get(root, "target_parameters"), targets, &gu);
    if (!rc) rc = check_pattern(path, js_get(root, "rank_pattern"), "rank_pattern", 2.0 * *r, gu);
    if (!rc) rc = check_pattern(path, js_get(root, "alpha_pattern"), "alpha_pattern", 2.0 * *alpha, gu);
    if (tm && tm->type == JS_NULL) tm = NULL; /* target_parameters alone */
    if (!rc && ((!tm && !*targets) || (tm && tm->type != JS_ARR && tm->type != JS_STR)))
        rc = err_set(GE_FORMAT, "%s: target_modules must be a list of module names", path);
    else if (!rc && tm && tm->type == JS_STR) {
        unsigned t;
        rc = lora_parse_targets(tm->str, &t);
        *targets |= t;
    }
    for (int i = 0; !rc && tm && tm->type == JS_ARR && i < tm->n; i++) {
        const char *s = js_str(&tm->items[i]);
        int t = s ? target_of(s, strlen(s)) : -1;
        if (t < 0) rc = err_set(GE_FORMAT, "%s: target module %s is not one of q,k,v,o,gate,up,down_proj", path, s ? s : "?");
        else *targets |= 1u << t;
    }
    if (!rc && !*targets) rc = err_set(GE_FORMAT, "%s: target_modules is empty", path);
    js_doc_free(doc);
    return rc;
}

static float scale(const model *m) { return m->lora_alpha / (float)m->lora_r; }

int lora_load_peft(const model *m, const char *dir, float *host) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    st_set s = {0};
    int rc = st_open_file(&s, path);
    if (rc) return rc;
    memset(host, 0, (size_t)m->l_elems * sizeof(float));
    char alt[112];
    for (int i = 0; i < m->n_lparams && !rc; i++) {
        const model_param *p = &m->lparams[i];
        const st_tensor *t = st_find(&s, p->name);
        if (!t) { /* PEFT writes without the adapter name; some tools keep ".default" */
            snprintf(alt, sizeof alt, "%.*s.default.weight", (int)(strlen(p->name) - 7), p->name);
            t = st_find(&s, alt);
        }
        if (!t) {
            rc = err_set(GE_FORMAT, "%s: missing tensor %s", path, p->name);
            break;
        }
        if (expert_b(m, p)) { /* PEFT's (O, r·E) into the buffer's (E, O, r) */
            float *tmp = malloc((size_t)p->numel * sizeof(float));
            long long E = m->cfg.E;
            rc = tmp ? st_read_f32(t, tmp, p->ndim, p->shape) : err_set(GE_NOMEM, "lora: out of memory");
            if (!rc) expert_b_permute(host + p->off, tmp, p->shape[0], (int)(p->shape[1] / E), E, 0, scale(m));
            free(tmp);
            continue;
        }
        rc = st_read_f32(t, host + p->off, p->ndim, p->shape);
        if (!rc && p->off >= m->l_elems_a)
            for (long long j = 0; j < p->numel; j++) host[p->off + j] *= scale(m);
    }
    st_close(&s);
    return rc;
}

int lora_save_peft(const model *m, const char *dir, const float *host, const char *base_model) {
    st_out *o = calloc((size_t)m->n_lparams, sizeof *o);
    float *b = malloc((size_t)(m->l_elems - m->l_elems_a + 1) * sizeof(float));
    if (!o || !b) {
        free(o);
        free(b);
        return err_set(GE_NOMEM, "lora: out of memory");
    }
    for (long long j = m->l_elems_a; j < m->l_elems; j++) b[j - m->l_elems_a] = host[j] / scale(m);
    for (int i = 0; i < m->n_lparams; i++) {
        const model_param *p = &m->lparams[i];
        float *d = p->off >= m->l_elems_a ? b + (p->off - m->l_elems_a) : (float *)host + p->off;
        if (expert_b(m, p)) { /* the buffer's (E, O, r) as PEFT's (O, r·E), in place through a copy */
            float *tmp = malloc((size_t)p->numel * sizeof(float));
            if (!tmp) {
                free(o);
                free(b);
                return err_set(GE_NOMEM, "lora: out of memory");
            }
            memcpy(tmp, d, (size_t)p->numel * sizeof(float));
            expert_b_permute(d, tmp, p->shape[0], (int)(p->shape[1] / m->cfg.E), m->cfg.E, 1, 1.0f);
            free(tmp);
        }
        o[i] = (st_out){.name = p->name, .data = d, .ndim = 2, .shape = {p->shape[0], p->shape[1]}};
    }
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    int rc = st_write(path, o, m->n_lparams, ST_F32);
    free(o);
    free(b);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    FILE *f = fopen(path, "w");
    if (!f) return err_set(GE_IO, "%s: cannot create: %s", path, strerror(errno));
    fprintf(f, "{\n  \"peft_type\": \"LORA\",\n  \"task_type\": \"CAUSAL_LM\",\n  \"base_model_name_or_path\": ");
    js_write_str(f, base_model, strlen(base_model));
    fprintf(f, ",\n  \"r\": %d,\n  \"lora_alpha\": %.9g,\n  \"lora_dropout\": 0.0,\n  \"target_modules\": [", m->lora_r,
            m->lora_alpha);
    unsigned used = 0; /* the slots some layer has */
    for (int l = 0; l < m->cfg.L; l++)
        for (int j = 0; j < N_SLOTS; j++) used |= (unsigned)has_slot(m, l, j) << j;
    for (int j = 0, k = 0; j < LORA_N; j++)
        if (used >> j & 1) fprintf(f, "%s\"%s\"", k++ ? ", " : "", strchr(module[j], '.') + 1);
    fprintf(f, "],\n  \"target_parameters\": ");
    if (used >> LORA_N) { /* PEFT's names for the experts' 3-D parameters */
        fprintf(f, "[");
        for (int j = LORA_N, k = 0; j < N_SLOTS; j++)
            if (used >> j & 1) fprintf(f, "%s\"%s\"", k++ ? ", " : "", strrchr(module[j], '.') + 1);
        fprintf(f, "]");
    } else {
        fprintf(f, "null");
    }
    if (used >> SLOT_EGU & 1)
        fprintf(f, ",\n  \"rank_pattern\": {\".*\\\\.gate_up_proj\": %d},\n  \"alpha_pattern\": {\".*\\\\.gate_up_proj\": %.9g}",
                lora_rank_of(m, SLOT_EGU), 2 * m->lora_alpha);
    else fprintf(f, ",\n  \"rank_pattern\": {},\n  \"alpha_pattern\": {}");
    fprintf(f,
            ",\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": false,\n  \"inference_mode\": true,\n"
            "  \"init_lora_weights\": true,\n  \"use_rslora\": false,\n  \"use_dora\": false,\n"
            "  \"modules_to_save\": null,\n  \"layers_to_transform\": null,\n  \"layers_pattern\": null\n}\n");
    if (fclose(f)) return err_set(GE_IO, "%s: write failed", path);
    return 0;
}

static const model_param *param_named(const model *m, const char *name) {
    for (int j = 0; j < m->n_params; j++)
        if (!strcmp(m->params[j].name, name)) return &m->params[j];
    return NULL;
}

/* W (O, I) += B (O, r) A (r, I) */
static void merge_one(float *W, const float *B, const float *A, long long O, long long I, long long r) {
#pragma omp parallel for schedule(static)
    for (long long o = 0; o < O; o++)
        for (long long k = 0; k < r; k++) {
            float b = B[o * r + k];
            for (long long x = 0; x < I; x++) W[o * I + x] += b * A[k * I + x];
        }
}

/* An experts' adapter (pa, pb) of layer l into the stacked expert weights: gate_up's B rows go
 * to gate_proj then up_proj, down's to down_proj */
static void merge_experts(const model *m, float *base, const float *host, const model_param *pa, const model_param *pb) {
    const model_config *c = &m->cfg;
    int l = atoi(pa->name + strlen("base_model.model.model.layers."));
    int gu = strstr(pa->name, ".base_layer.") || !(m->lora_targets & BIT(LORA_DOWN));
    long long E = c->E, r = pa->shape[0] / E, I = pa->shape[1], O = gu ? c->Fm : c->C;
    char name[96];
    for (int half = 0; half < (gu ? 2 : 1); half++) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.0.%s.weight", l,
                 gu ? (half ? "up_proj" : "gate_proj") : "down_proj");
        const model_param *w = param_named(m, name);
        if (!w) continue;
        for (long long e = 0; e < E; e++)
            merge_one(base + w->off + e * O * I, host + pb->off + (e * (gu ? 2 : 1) * O + half * O) * r,
                      host + pa->off + e * r * I, O, I, r);
    }
}

void lora_merge_host(const model *m, float *base, const float *host) {
    char name[96];
    int na = (int)(m->n_lparams / 2);
    for (int i = 0; i < na; i++) {
        const model_param *pa = &m->lparams[i], *pb = &m->lparams[i + na];
        if (strstr(pa->name, ".mlp.experts.")) {
            merge_experts(m, base, host, pa, pb);
            continue;
        }
        /* "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight" -> "model.layers.3.self_attn.q_proj.weight" */
        const char *s = pa->name + strlen("base_model.model.");
        snprintf(name, sizeof name, "%.*s.weight", (int)(strstr(s, ".lora_A") - s), s);
        const model_param *w = param_named(m, name);
        if (w) merge_one(base + w->off, host + pb->off, host + pa->off, pb->shape[0], pa->shape[1], m->lora_r); /* B: s B */
    }
}
