/* test_equivalence.c — grpod's core claim on the fp32 reference: training on [P; R_1 .. R_N]
 * (P + ΣR tokens) gives the same per-token logprobs and the same parameter gradients of the
 * same loss as N copies of [P; R_i] (NP + ΣR tokens). Random groups: different P per group,
 * N from 1 to 16, ragged R_i (R = 1 included), several groups per micro-batch, on a random
 * Qwen3-shaped model (q/k norm, GQA) and a Qwen2-shaped one (QKV bias).
 * Tolerance 1e-5 relative (L2 over all logprobs / all gradients): the two layouts sum the same
 * terms in different orders, so they differ by fp32 rounding only. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/err.h"
#include "engine/model.h"
#include "engine/pack.h"

typedef struct { float *logp, *grad; long long T; } run_out;

static int run_layout(model *m, const model_views *wv, const pack_group *pg, int n, pack_layout lay,
                      const float *weights, run_out *o) {
    pack_batch b;
    if (pack_build(&b, pg, 0, n, lay)) return -1;
    model_acts a;
    if (model_acts_init(m, &a, b.T, b.M, 1)) return -1;
    model_input in;
    model_input_from_batch(&in, &b);
    o->grad = calloc((size_t)m->n_elems, 4);
    o->logp = malloc((size_t)b.M * 4);
    model_views gv;
    model_views_make(m, o->grad, 4, &gv);
    int rc = model_forward(m, wv, &a, NULL, &in, 0.8f, 0);
    memcpy(o->logp, a.logp, (size_t)b.M * 4);
    /* out_* are in response order in both layouts, so the same weights apply. */
    if (!rc) rc = model_backward(m, wv, &gv, &a, &in, weights, NULL, 0.8f);
    o->T = b.T;
    model_views_free(&gv);
    model_acts_free(m, &a);
    pack_batch_free(&b);
    return rc;
}

static void equivalence(model_arch arch, unsigned long long seed) {
    model_config c = { .arch = arch, .L = 2, .C = 48, .H = 4, .K = 2, .D = 16, .F = 64, .V = 97, .max_pos = 512,
                       .eps = 1e-6f, .rope_theta = 10000.0f, .bos_id = -1 };
    snprintf(c.arch_name, sizeof c.arch_name, arch == ARCH_QWEN3 ? "qwen3" : "qwen2");
    c.qk_norm = arch == ARCH_QWEN3;
    c.qkv_bias = arch == ARCH_QWEN2;
    eng_backend *be;
    backend_cpu_create(&be, 0);
    model m;
    CHECK(model_init(&m, &c, be) == 0);
    float *w = malloc((size_t)m.n_elems * 4);
    check_fill(w, (size_t)m.n_elems, seed, 0.2f);
    model_views wv;
    model_views_make(&m, w, 4, &wv);

    /* Random groups. */
    enum { G = 5 };
    unsigned long long s = seed;
    pack_group pg[G];
    int *prompts[G], **resp[G], *R[G];
    long long M = 0;
    for (int g = 0; g < G; g++) {
        int P = 1 + (int)((check_randf(&s, 0.5f) + 0.5f) * 20);
        int N = g == 0 ? 16 : g == 1 ? 1 : 1 + (int)((check_randf(&s, 0.5f) + 0.5f) * 8);
        prompts[g] = malloc((size_t)P * sizeof(int));
        for (int i = 0; i < P; i++) prompts[g][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (c.V - 1));
        resp[g] = malloc((size_t)N * sizeof(int *));
        R[g] = malloc((size_t)N * sizeof(int));
        for (int r = 0; r < N; r++) {
            R[g][r] = r == 0 ? 1 : 1 + (int)((check_randf(&s, 0.5f) + 0.5f) * 12);
            resp[g][r] = malloc((size_t)R[g][r] * sizeof(int));
            for (int i = 0; i < R[g][r]; i++) resp[g][r][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (c.V - 1));
            M += R[g][r];
        }
        pg[g] = (pack_group){ prompts[g], P, N, (const int *const *)resp[g], R[g] };
    }
    float *weights = malloc((size_t)M * 4);
    check_fill(weights, (size_t)M, seed + 1, 1.0f);
    run_out pk = {0}, st = {0};
    CHECK(run_layout(&m, &wv, pg, G, PACK_PACKED, weights, &pk) == 0);
    CHECK(run_layout(&m, &wv, pg, G, PACK_STANDARD, weights, &st) == 0);
    double el = rel_l2(pk.logp, st.logp, (size_t)M), eg = rel_l2(pk.grad, st.grad, (size_t)m.n_elems);
    printf("  %s: %lld packed vs %lld standard tokens (%.2fx); logprobs rel L2 %.2e, gradients rel L2 %.2e\n",
           c.arch_name, pk.T, st.T, (double)st.T / pk.T, el, eg);
    CHECK_MSG(pk.T < st.T, "packing saved nothing");
    CHECK_MSG(el <= 1e-5 && eg <= 1e-5, "logprobs %.3g gradients %.3g > 1e-5", el, eg);
    /* Each parameter tensor on its own too: no tensor hides behind a large one. */
    for (int i = 0; i < m.n_params; i++) {
        double e = rel_l2(pk.grad + m.params[i].off, st.grad + m.params[i].off, (size_t)m.params[i].numel);
        CHECK_MSG(e <= 1e-5, "%s: %s rel L2 %.3g", c.arch_name, m.params[i].name, e);
    }
    for (int g = 0; g < G; g++) {
        for (int r = 0; r < pg[g].N; r++) free(resp[g][r]);
        free(resp[g]); free(R[g]); free(prompts[g]);
    }
    free(pk.logp); free(pk.grad); free(st.logp); free(st.grad); free(weights); free(w);
    model_views_free(&wv);
    model_free(&m);
    be->destroy(be);
}

TEST(packed_equals_standard_qwen3) { equivalence(ARCH_QWEN3, 101); }
TEST(packed_equals_standard_qwen2) { equivalence(ARCH_QWEN2, 202); }

int main(void) {
    RUN(packed_equals_standard_qwen3);
    RUN(packed_equals_standard_qwen2);
    return CHECK_DONE();
}
