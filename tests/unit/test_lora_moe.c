/* test_lora_moe.c — LoRA on a Qwen3-MoE model's attention and experts, CPU backend, against PEFT
 * (tests/fixtures/make_lora_moe_reference.py, data/qwen3_moe_lora over data/qwen3_moe).
 *
 * The adapter loads from PEFT's own files (adapter_config.json: target_parameters, rank_pattern),
 * every tensor random; each sequence runs alone from position 0 as PEFT ran it. Checked: the
 * logprobs (max |Δ| ≤ 1e-4, the DESIGN.md contract), the balance loss of each sequence (≤ 1e-5, as
 * test_moe.c), and the adapters' gradients of Σ w·logprob and, apart, of Σ aux (relative L2 ≤ 1e-4
 * per tensor, the experts' included, compared in PEFT's layout: B's (out, r·E) columns). The base
 * is frozen: no base gradient is computed (lora_grad_views). Then the adapter saved by grpod
 * equals PEFT's file tensor for tensor (and its config reads back), the same through a merge:
 * base + s·B·A run without adapters gives the adapter's logprobs; and an adapter with B = 0 gives
 * the base's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "reference_seq.h"
#include "common/err.h"
#include "engine/engine_testing.h"
#include "engine/format/json.h"
#include "engine/format/safetensors.h"
#include "engine/model/lora.h"
#include "engine/model/model.h"
#include "engine/model/pack.h"

#define BASE "tests/fixtures/data/qwen3_moe"
#define ADAPTER "tests/fixtures/data/qwen3_moe_lora"
#define OUTDIR TEST_TMP "/grpod_test_lora_moe"

typedef struct {
    eng_backend *be;
    model m;
    float *w, *lw; /* base (n_elems), adapters (l_elems, stored form) */
    model_views wv;
    js_doc *doc;
    const js *ref;
} fixture;

static void fixture_open(fixture *f) {
    model_config cfg;
    CHECK_MSG(config_load(BASE, &cfg) == 0, "%s", err_msg());
    backend_cpu_create(&f->be, 0);
    CHECK(model_init(&f->m, &cfg, f->be) == 0);
    int r;
    float alpha;
    unsigned targets;
    CHECK_MSG(lora_read_config(ADAPTER, &r, &alpha, &targets) == 0, "%s", err_msg());
    CHECK(r == 4 && alpha == 6.0f && targets == (1u << LORA_N) - 1); /* q,k,v,o + gate_up + down */
    CHECK(lora_init(&f->m, r, alpha, targets) == 0);
    f->w = malloc((size_t)f->m.n_elems * 4);
    f->lw = malloc((size_t)f->m.l_elems * 4);
    CHECK_MSG(model_load_host(&f->m, BASE, f->w) == 0, "%s", err_msg());
    CHECK_MSG(lora_load_peft(&f->m, ADAPTER, f->lw) == 0, "%s", err_msg());
    model_views_make(&f->m, f->w, 4, &f->wv);
    lora_views(&f->m, f->lw, 4, &f->wv);
    CHECK_MSG(js_parse_file(ADAPTER "/reference.json", &f->doc, &f->ref) == 0, "%s", err_msg());
}

static void fixture_close(fixture *f) {
    model_views_free(&f->wv);
    model_free(&f->m);
    free(f->w);
    free(f->lw);
    js_doc_free(f->doc);
    f->be->destroy(f->be);
}

/* Sequence s of the reference, alone: forward (logprobs into lp, M of them), the balance loss,
 * and, with g, the backward of Σ dl·logprob + aux_coef·aux into g's adapters. */
static void run_seq(fixture *f, const model_views *wv, int s, float *lp, double *aux, model_views *g, int aux_only) {
    const js *wts = &js_get(f->ref, "loss_weights")->items[s];
    pack_batch b;
    CHECK(reference_seq_pack(&js_get(f->ref, "sequences")->items[s], &b) == 0);
    model_acts a;
    CHECK(model_acts_init(&f->m, &a, b.T, b.M, g ? 1 : 0) == 0);
    model_input in;
    model_input_from_batch(&in, &b);
    if (aux_only) in.aux_coef = 1.0f;
    CHECK(model_forward(&f->m, wv, &a, NULL, &in, 1.0f, 0) == 0);
    memcpy(lp, a.logp, (size_t)b.M * sizeof(float));
    if (aux) CHECK(model_aux_loss(&f->m, &a, aux) == 0);
    if (g) {
        float *dl = calloc((size_t)b.M, 4);
        for (int t = 0; t < b.M && !aux_only; t++) dl[t] = (float)wts->items[t].num;
        CHECK(model_backward(&f->m, wv, g, &a, &in, dl, NULL, 1.0f) == 0);
        free(dl);
    }
    model_acts_free(&f->m, &a);
    pack_batch_free(&b);
}

/* *worst = max |Δ| of logprobs of every sequence against ref (a reference.json "logprobs") */
static void worst_logprob(fixture *f, const model_views *wv, const js *ref, double *worst_out) {
    double worst = 0;
    for (int s = 0; s < ref->n; s++) {
        float lp[256];
        CHECK(ref->items[s].n <= 256);
        run_seq(f, wv, s, lp, NULL, NULL, 0);
        for (int t = 0; t < ref->items[s].n; t++) {
            double d = fabs(lp[t] - ref->items[s].items[t].num);
            worst = d > worst ? d : worst;
        }
    }
    *worst_out = worst;
}

/* The adapters' true gradients (dL/dB = s dL/dB', lora.h) in PEFT's layout, through
 * lora_save_peft (which writes B / s in PEFT's layout: so hand it s²·dL/dB'). */
static void save_grads_as_peft(const model *m, const float *g, const char *dir) {
    float s = m->lora_alpha / (float)m->lora_r, *t = malloc((size_t)m->l_elems * 4);
    for (long long j = 0; j < m->l_elems; j++) t[j] = j >= m->l_elems_a ? g[j] * s * s : g[j];
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
    CHECK(system(cmd) == 0);
    CHECK_MSG(lora_save_peft(m, dir, t, "base") == 0, "%s", err_msg());
    free(t);
}

/* *worst_out = the worst per-tensor relative L2 of file a's tensors against file b's (same names
 * and shapes) */
static void worst_tensor(const model *m, const char *fa, const char *fb, const char **name, double *worst_out) {
    st_set A = {0}, B = {0};
    CHECK_MSG(st_open_file(&A, fa) == 0 && st_open_file(&B, fb) == 0, "%s", err_msg());
    double worst = 0;
    for (int i = 0; i < m->n_lparams; i++) {
        const model_param *p = &m->lparams[i];
        const st_tensor *ta = st_find(&A, p->name), *tb = st_find(&B, p->name);
        CHECK_MSG(ta && tb, "%s: missing in %s or %s", p->name, fa, fb);
        float *x = malloc((size_t)p->numel * 4), *y = malloc((size_t)p->numel * 4);
        CHECK(st_read_f32(ta, x, 2, p->shape) == 0 && st_read_f32(tb, y, 2, p->shape) == 0);
        double e = rel_l2(x, y, (size_t)p->numel);
        if (e > worst) worst = e, *name = p->name;
        free(x);
        free(y);
    }
    st_close(&A);
    st_close(&B);
    *worst_out = worst;
}

TEST(lora_moe_matches_peft) {
    fixture f;
    fixture_open(&f);
    const js *lps = js_get(f.ref, "logprobs"), *auxs = js_get(f.ref, "aux_losses");
    float *g = calloc((size_t)f.m.l_elems, 4), *ga = calloc((size_t)f.m.l_elems, 4);
    float *sink = malloc((size_t)(f.m.cfg.C > f.m.cfg.D ? f.m.cfg.C : f.m.cfg.D) * 4);
    model_views gv, gav;
    CHECK(lora_grad_views(&f.m, g, sink, &gv) == 0 && lora_grad_views(&f.m, ga, sink, &gav) == 0);
    double worst_lp = 0, worst_aux = 0;
    for (int s = 0; s < lps->n; s++) {
        float lp[256];
        double aux;
        run_seq(&f, &f.wv, s, lp, &aux, &gv, 0);
        for (int t = 0; t < lps->items[s].n; t++) {
            double d = fabs(lp[t] - lps->items[s].items[t].num);
            worst_lp = d > worst_lp ? d : worst_lp;
        }
        worst_aux = fmax(worst_aux, fabs(aux - auxs->items[s].num));
        run_seq(&f, &f.wv, s, lp, NULL, &gav, 1);
    }
    const char *wn = "", *wan = "";
    save_grads_as_peft(&f.m, g, OUTDIR "/g");
    double wg, wa;
    worst_tensor(&f.m, OUTDIR "/g/adapter_model.safetensors", ADAPTER "/grads.safetensors", &wn, &wg);
    save_grads_as_peft(&f.m, ga, OUTDIR "/ga");
    worst_tensor(&f.m, OUTDIR "/ga/adapter_model.safetensors", ADAPTER "/aux_grads.safetensors", &wan, &wa);
    printf("  max |Δ logprob| %.2e, max |Δ aux| %.2e, worst adapter grad rel L2 %.2e (%s), aux grad %.2e (%s)\n", worst_lp,
           worst_aux, wg, wn, wa, wan);
    CHECK_MSG(worst_lp <= 1e-4, "max |Δ logprob| %.3g > 1e-4", worst_lp);
    CHECK_MSG(worst_aux <= 1e-5, "max |Δ aux| %.3g > 1e-5", worst_aux);
    CHECK_MSG(wg <= 1e-4, "gradient of %s rel L2 %.3g > 1e-4", wn, wg);
    CHECK_MSG(wa <= 1e-4, "aux gradient of %s rel L2 %.3g > 1e-4", wan, wa);
    model_views_free(&gv);
    model_views_free(&gav);
    free(g);
    free(ga);
    free(sink);
    fixture_close(&f);
}

/* grpod's save of PEFT's adapter is PEFT's file again, and its config reads back the same; the
 * merged base without adapters gives the adapter's logprobs; B = 0 gives the base's. */
TEST(lora_moe_peft_files_merge_and_zero_b) {
    fixture f;
    fixture_open(&f);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s/rt && mkdir -p %s/rt", OUTDIR, OUTDIR);
    CHECK(system(cmd) == 0);
    CHECK_MSG(lora_save_peft(&f.m, OUTDIR "/rt", f.lw, BASE) == 0, "%s", err_msg());
    const char *wn = "";
    double rt, wm, wz;
    worst_tensor(&f.m, OUTDIR "/rt/adapter_model.safetensors", ADAPTER "/adapter_model.safetensors", &wn, &rt);
    CHECK_MSG(rt < 1e-7, "saved adapter differs from PEFT's in %s: %.3g", wn, rt);
    int r;
    float alpha;
    unsigned targets;
    CHECK_MSG(lora_read_config(OUTDIR "/rt", &r, &alpha, &targets) == 0, "%s", err_msg());
    CHECK(r == f.m.lora_r && alpha == f.m.lora_alpha && targets == f.m.lora_targets);

    model_views bare; /* the base alone: no adapter views */
    float *merged = malloc((size_t)f.m.n_elems * 4);
    memcpy(merged, f.w, (size_t)f.m.n_elems * 4);
    lora_merge_host(&f.m, merged, f.lw);
    model_views_make(&f.m, merged, 4, &bare);
    worst_logprob(&f, &bare, js_get(f.ref, "logprobs"), &wm);
    model_views_free(&bare);
    free(merged);

    js_doc *bdoc;
    const js *bref;
    CHECK_MSG(js_parse_file(BASE "/reference.json", &bdoc, &bref) == 0, "%s", err_msg());
    for (long long j = f.m.l_elems_a; j < f.m.l_elems; j++) f.lw[j] = 0;
    worst_logprob(&f, &f.wv, js_get(bref, "logprobs"), &wz);
    js_doc_free(bdoc);
    printf("  round trip %.2e, merged vs adapter max |Δ logprob| %.2e, B = 0 vs base %.2e\n", rt, wm, wz);
    CHECK_MSG(wm <= 1e-4, "merged weights: max |Δ logprob| %.3g > 1e-4", wm);
    CHECK_MSG(wz <= 1e-4, "B = 0: max |Δ logprob| vs the base %.3g > 1e-4", wz);
    fixture_close(&f);
}

/* gate alone on a MoE model is refused (PEFT fuses gate and up); a rank_pattern other than
 * PEFT's for gate_up_proj is refused naming the field. */
TEST(lora_moe_refusals) {
    model_config cfg;
    CHECK(config_load(BASE, &cfg) == 0);
    eng_backend *be;
    backend_cpu_create(&be, 0);
    model m;
    CHECK(model_init(&m, &cfg, be) == 0);
    CHECK(lora_init(&m, 4, 8, 1u << LORA_GATE) == GE_INVALID);
    CHECK_MSG(strstr(err_msg(), "gate and up"), "%s", err_msg());
    model_free(&m);
    be->destroy(be);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "rm -rf %s/bad && mkdir -p %s/bad && sed 's/\"\\.\\*\\\\\\\\\\.gate_up_proj\": 8/\".*gate_up_proj\": 4/' "
             "%s/adapter_config.json > "
             "%s/bad/adapter_config.json",
             OUTDIR, OUTDIR, ADAPTER, OUTDIR);
    CHECK(system(cmd) == 0);
    int r;
    float alpha;
    unsigned targets;
    CHECK(lora_read_config(OUTDIR "/bad", &r, &alpha, &targets) == GE_FORMAT);
    CHECK_MSG(strstr(err_msg(), "rank_pattern"), "%s", err_msg());
}

/* Qwen3-30B-A3B's dims on one H200 (139 GiB as the device reports it), without the weights: full
 * parameters are refused at open naming the bytes and the way out (plan_full_fits); with LoRA
 * r = 16 on attention and experts the plan's pieces fit: the frozen bf16 base (the reference
 * too), the adapters' bf16 copy, fp32 master, gradients, moments and safety copy, one default
 * micro-batch of 32768 tokens with every layer recomputed beside the no-grad passes'
 * activations, the headroom, and the KV of 8 groups P = 1024, N = 16, R = 512 (P + NR rows each). */
TEST(qwen3_30b_a3b_memory_plan) {
    model_config c = {.arch = ARCH_QWEN3_MOE,
                      .L = 48,
                      .C = 2048,
                      .H = 32,
                      .K = 4,
                      .D = 128,
                      .F = 6144,
                      .V = 151936,
                      .max_pos = 40960,
                      .eps = 1e-6f,
                      .rope_theta = 1e6f,
                      .qk_norm = 1,
                      .bos_id = -1,
                      .E = 128,
                      .top_k = 8,
                      .Fm = 768,
                      .norm_topk = 1};
    for (int l = 0; l < c.L; l++) c.mlp[l] = MLP_MOE;
    snprintf(c.arch_name, sizeof c.arch_name, "qwen3_moe");
    eng_backend *be;
    backend_cpu_create(&be, 0);
    be->act_bytes = 2; /* sized as on cuda */
    model m;
    CHECK(model_init(&m, &c, be) == 0);
    long long n = m.n_elems, gib = 1LL << 30, dev = 139 * gib;
    CHECK(eng_testing_full_fits(n, 2, dev, "cuda") == GE_NOMEM);
    CHECK_MSG(strstr(err_msg(), "--lora-rank") && strstr(err_msg(), "GiB"), "%s", err_msg());
    printf("  %s\n", err_msg());
    CHECK(eng_testing_full_fits(3000000000LL, 2, dev, "cuda") == 0); /* a 3B model fits full-parameter */
    CHECK(lora_init(&m, 16, 32, (1u << LORA_N) - 1) == 0);
    long long a = m.l_elems, T = 32768, kv = 8LL * (1024 + 16 * 512) * c.L * 2 * c.K * c.D * 2;
    long long base = 2 * n, adapters = 2 * a + 4 * a + 4 * a + 8 * a + 12 * a; /* act, master, grads, moments, snapshot */
    long long acts = (long long)model_acts_update_bytes(&m, (int)T);
    long long total = base + adapters + acts + 4 * gib + kv;
    printf("  30B-A3B: %.2fB params, base %.1f GB; LoRA r=16 %.3fB adapters, state + snapshot %.1f GB; micro-batch of %lld "
           "tokens %.1f GB; headroom 4.3 GB; KV of 8 groups %.1f GB: %.1f of %.1f GB\n",
           n / 1e9, base / 1e9, a / 1e9, adapters / 1e9, T, acts / 1e9, kv / 1e9, total / 1e9, dev / 1e9);
    CHECK_MSG(total <= dev, "the LoRA plan needs %.1f GB of %.1f", total / 1e9, dev / 1e9);
    model_free(&m);
    be->destroy(be);
}

int main(void) {
    RUN(lora_moe_matches_peft);
    RUN(lora_moe_peft_files_merge_and_zero_b);
    RUN(lora_moe_refusals);
    RUN(qwen3_30b_a3b_memory_plan);
    return CHECK_DONE();
}
