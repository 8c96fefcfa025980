/* tiny_model.h — what the layout-equivalence tests (test_equivalence.c, test_tree.c) share: the
 * small random dense model (L layers, C 48, 4 heads over 2 kv heads of 16, F 64, V 97; Qwen3
 * with q/k norm or Qwen2 with QKV bias) and one forward + backward of groups in a layout. */
#ifndef GRPOD_TINY_MODEL_H
#define GRPOD_TINY_MODEL_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/format/config.h"
#include "engine/model/model.h"
#include "engine/model/pack.h"

static inline model_config tiny_model_config(model_arch arch, int L) {
    model_config c = {.arch = arch,
                      .L = L,
                      .C = 48,
                      .H = 4,
                      .K = 2,
                      .D = 16,
                      .F = 64,
                      .V = 97,
                      .max_pos = 512,
                      .eps = 1e-6f,
                      .rope_theta = 10000.0f,
                      .bos_id = -1};
    snprintf(c.arch_name, sizeof c.arch_name, arch == ARCH_QWEN3 ? "qwen3" : "qwen2");
    c.qk_norm = arch == ARCH_QWEN3;
    c.qkv_bias = arch == ARCH_QWEN2;
    return c;
}
typedef struct {
    float *logp, *ent, *grad;
    long long T;
} run_out;

/* One-graph run of groups [0, n) in a layout: logprobs (entropies when we != NULL) and the
 * gradient of sum(wl·logp + we·ent). */
static int run_layout(model *m, const model_views *wv, const pack_group *pg, int n, pack_layout lay, const float *wl,
                      const float *we, run_out *o) {
    pack_batch b;
    if (pack_build(&b, pg, 0, n, lay)) return -1;
    model_acts a;
    if (model_acts_init(m, &a, b.T, b.M, 1)) return -1;
    model_input in;
    model_input_from_batch(&in, &b);
    o->grad = calloc((size_t)m->n_elems, 4);
    o->logp = malloc((size_t)b.M * 4);
    o->ent = malloc((size_t)b.M * 4);
    model_views gv;
    model_views_make(m, o->grad, 4, &gv);
    int rc = model_forward(m, wv, &a, NULL, &in, 0.8f, we != NULL);
    memcpy(o->logp, a.logp, (size_t)b.M * 4);
    if (we) memcpy(o->ent, a.ent, (size_t)b.M * 4);
    /* out_* are in response order in both layouts, so the same weights apply. */
    if (!rc) rc = model_backward(m, wv, &gv, &a, &in, wl, we, 0.8f);
    o->T = b.T;
    model_views_free(&gv);
    model_acts_free(m, &a);
    pack_batch_free(&b);
    return rc;
}

static void run_free(run_out *o) {
    free(o->logp);
    free(o->ent);
    free(o->grad);
}
#endif
