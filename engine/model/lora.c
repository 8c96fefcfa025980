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

static const char *const short_name[LORA_N] = {"q", "k", "v", "o", "gate", "up", "down"};
static const char *const module[LORA_N] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                           "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

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

/* input and output width of target t */
static void dims(const model_config *c, int t, long long *I, long long *O) {
    long long C = c->C, HD = (long long)c->H * c->D, KD = (long long)c->K * c->D, F = c->F;
    static const int in_is[LORA_N] = {0, 0, 0, 1, 0, 0, 2}; /* 0 C, 1 HD, 2 F */
    *I = in_is[t] == 0 ? C : in_is[t] == 1 ? HD : F;
    *O = t == LORA_Q ? HD : t == LORA_K || t == LORA_V ? KD : t == LORA_O || t == LORA_DOWN ? C : F;
}

int lora_init(model *m, int r, float alpha, unsigned targets) {
    const model_config *c = &m->cfg;
    int nt = 0;
    for (int t = 0; t < LORA_N; t++) nt += targets >> t & 1;
    m->lparams = calloc((size_t)(2 * nt * c->L) + 1, sizeof *m->lparams);
    if (!m->lparams) return err_set(GE_NOMEM, "lora: out of memory");
    m->lora_r = r;
    m->lora_alpha = alpha;
    m->lora_targets = targets;
    m->n_lparams = 0;
    m->l_elems = 0;
    for (int ab = 0; ab < 2; ab++) {
        if (ab) m->l_elems_a = m->l_elems;
        for (int l = 0; l < c->L; l++)
            for (int t = 0; t < LORA_N; t++) {
                if (!(targets >> t & 1)) continue;
                long long I, O;
                dims(c, t, &I, &O);
                model_param *p = &m->lparams[m->n_lparams++];
                snprintf(p->name, sizeof p->name, "base_model.model.model.layers.%d.%s.lora_%c.weight", l, module[t],
                         ab ? 'B' : 'A');
                p->ndim = 2;
                p->shape[0] = ab ? O : r;
                p->shape[1] = ab ? r : I;
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
            for (int t = 0; t < LORA_N; t++) {
                if (!(m->lora_targets >> t & 1)) continue;
                void *p = (char *)base + (size_t)m->lparams[k++].off * esize;
                if (ab) v->layers[l].lb[t] = p;
                else v->layers[l].la[t] = p;
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
    else if ((js_get(root, "rank_pattern") && js_get(root, "rank_pattern")->type == JS_OBJ && js_get(root, "rank_pattern")->n) ||
             (js_get(root, "alpha_pattern") && js_get(root, "alpha_pattern")->type == JS_OBJ && js_get(root, "alpha_pattern")->n))
        rc = err_set(GE_FORMAT, "%s: per-module rank_pattern / alpha_pattern are not supported", path);
    else if (!tm || (tm->type != JS_ARR && tm->type != JS_STR))
        rc = err_set(GE_FORMAT, "%s: target_modules must be a list of module names", path);
    else if (tm->type == JS_STR) rc = lora_parse_targets(tm->str, targets);
    for (int i = 0; !rc && tm->type == JS_ARR && i < tm->n; i++) {
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
        const float *d = p->off >= m->l_elems_a ? b + (p->off - m->l_elems_a) : host + p->off;
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
    for (int t = 0, k = 0; t < LORA_N; t++)
        if (m->lora_targets >> t & 1) fprintf(f, "%s\"%s\"", k++ ? ", " : "", strchr(module[t], '.') + 1);
    fprintf(f,
            "],\n  \"bias\": \"none\",\n  \"fan_in_fan_out\": false,\n  \"inference_mode\": true,\n"
            "  \"init_lora_weights\": true,\n  \"use_rslora\": false,\n  \"use_dora\": false,\n"
            "  \"modules_to_save\": null,\n  \"layers_to_transform\": null,\n  \"layers_pattern\": null,\n"
            "  \"rank_pattern\": {},\n  \"alpha_pattern\": {}\n}\n");
    if (fclose(f)) return err_set(GE_IO, "%s: write failed", path);
    return 0;
}

void lora_merge_host(const model *m, float *base, const float *host) {
    char name[96];
    int na = (int)(m->n_lparams / 2);
    for (int i = 0; i < na; i++) {
        const model_param *pa = &m->lparams[i], *pb = &m->lparams[i + na];
        /* "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight" -> "model.layers.3.self_attn.q_proj.weight" */
        const char *s = pa->name + strlen("base_model.model.");
        snprintf(name, sizeof name, "%.*s.weight", (int)(strstr(s, ".lora_A") - s), s);
        const model_param *w = NULL;
        for (int j = 0; j < m->n_params && !w; j++)
            if (!strcmp(m->params[j].name, name)) w = &m->params[j];
        if (!w) continue;
        long long O = pb->shape[0], I = pa->shape[1], r = m->lora_r;
        const float *A = host + pa->off, *B = host + pb->off; /* B in stored form: s B */
        float *W = base + w->off;
#pragma omp parallel for schedule(static)
        for (long long o = 0; o < O; o++)
            for (long long k = 0; k < r; k++) {
                float b = B[o * r + k];
                for (long long x = 0; x < I; x++) W[o * I + x] += b * A[k * I + x];
            }
    }
}
