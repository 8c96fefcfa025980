/* test_hybrid.c — hybrid linear-attention models (Qwen3.5: gated DeltaNet and gated softmax
 * attention layers) on the CPU backend, the fp32 reference.
 *
 * Against transformers (tests/fixtures/make_hybrid_reference.py, data/qwen3_5_*): per-token
 * logprobs (max |Δ| ≤ 1e-4, the DESIGN.md contract) over sequences of 2 and 3 tokens (shorter
 * than the conv), 64 (one whole chunk of transformers' chunked rule), 65 and 150 (across chunk
 * boundaries); the gradient of Σ w·logprob (relative L2 ≤ 1e-4 per tensor, every DeltaNet and
 * gated-attention weight included: A_log, dt_bias, the conv taps, the zero-centred norms). The
 * qwen3_5 vision-language form loads its text model and gives its logprobs. qwen3_5_moe_text: the
 * same layers with a mixture of experts and a sigmoid-gated shared expert in every MLP. qwen3_next,
 * qwen3_next_b (Qwen3-Next): the DeltaNet's fused per-key-head projections in_proj_qkvz and
 * in_proj_ba, dense and MoE MLPs mixed, the shared expert of its own width, 2 and 3 value heads
 * per key head, 2 and 4 query heads per KV head; gradients compared in the checkpoint's rows. Their
 * balance loss per sequence (|Δ| ≤ 1e-5) and its gradient (≤ 1e-4) against transformers' aux_loss.
 *
 * Packed ≡ standard: [P; R_1..R_N] — each response starting from the prompt's final recurrent
 * state and conv tail — and N copies of [P; R_i] give the same logprobs and gradients (1e-5
 * relative: the layouts sum the same terms in other orders; the prompt's state gradient is the
 * sum of its responses'), and with every layer recomputed before its backward the same bits. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "loaded_model.h"
#include "reference_seq.h"
#include "common/err.h"
#include "engine/engine.h"
#include "engine/engine_testing.h"
#include "engine/format/json.h"
#include "engine/format/safetensors.h"
#include "engine/model/model.h"
#include "engine/model/pack.h"

#define FIX "tests/fixtures/data"

/* Each sequence of reference.json alone, as transformers ran it: *worst = the worst |Δ logprob|,
 * and with g the gradient of Σ w·logprob added into g. */
static void run_reference(loaded *x, const js *root, float *g, double *worst_out) {
    const js *seqs = js_get(root, "sequences"), *lps = js_get(root, "logprobs"), *wts = js_get(root, "loss_weights");
    model_views gv;
    if (g) model_views_make(&x->m, g, 4, &gv);
    double worst = 0;
    for (int s = 0; s < seqs->n; s++) {
        pack_batch b;
        CHECK(reference_seq_pack(&seqs->items[s], &b) == 0);
        model_acts a;
        CHECK(model_acts_init(&x->m, &a, b.T, b.M, g ? 1 : 0) == 0);
        model_input in;
        model_input_from_batch(&in, &b);
        CHECK_MSG(model_forward(&x->m, &x->wv, &a, NULL, &in, 1.0f, 0) == 0, "%s", err_msg());
        float *dl = malloc((size_t)b.M * 4);
        for (int t = 0; t < b.M; t++) {
            double d = fabs(a.logp[t] - lps->items[s].items[t].num);
            worst = d > worst ? d : worst;
            dl[t] = (float)wts->items[s].items[t].num;
        }
        if (g) CHECK(model_backward(&x->m, &x->wv, &gv, &a, &in, dl, NULL, 1.0f) == 0);
        free(dl);
        model_acts_free(&x->m, &a);
        pack_batch_free(&b);
    }
    if (g) model_views_free(&gv);
    *worst_out = worst;
}

/* *worst = the worst per-tensor relative L2 of g against the gradients in file (checkpoint names) */
static void worst_grad(const loaded *x, const float *g, const char *file, double *worst_out, const char **worst_name) {
    st_set gs = {0};
    CHECK_MSG(st_open_file(&gs, file) == 0, "%s", err_msg());
    double worst = 0;
    for (int p = 0; p < x->m.n_params; p++) {
        const model_param *pp = &x->m.params[p];
        const st_tensor *t = st_find(&gs, pp->name);
        CHECK_MSG(t, "%s: no gradient for %s", file, pp->name);
        float *ref = malloc((size_t)t->numel * 4), *mine = malloc((size_t)t->numel * 4);
        CHECK(st_read_f32(t, ref, pp->ndim, pp->shape) == 0);
        model_param_reorder(&x->m, pp, g + pp->off, mine, 1); /* into the checkpoint's rows */
        double e = rel_l2(mine, ref, (size_t)t->numel);
        free(mine);
        if (e > worst) worst = e, *worst_name = pp->name;
        free(ref);
    }
    st_close(&gs);
    *worst_out = worst;
}

/* dir (256 bytes) = the fixture's folder; its reference.json parsed into *doc, *root */
static void open_reference(const char *name, char *dir, js_doc **doc, const js **root) {
    char path[512];
    snprintf(dir, 256, FIX "/%s", name);
    snprintf(path, sizeof path, "%s/reference.json", dir);
    CHECK_MSG(js_parse_file(path, doc, root) == 0, "%s", err_msg());
}

TEST(hybrid_matches_transformers) {
    static const char *models[] = {"qwen3_5_text", "qwen3_5_text_b", "qwen3_5_moe_text", "qwen3_next", "qwen3_next_b"};
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        char dir[256], path[512];
        js_doc *doc;
        const js *root;
        open_reference(models[mi], dir, &doc, &root);
        loaded x;
        loaded_open(&x, dir);
        const js *lt = js_get(root, "layer_types");
        CHECK(x.cfg.arch == ARCH_QWEN3_5 && lt->n == x.cfg.L);
        for (int l = 0; l < lt->n; l++)
            CHECK(x.cfg.attn[l] == (strcmp(js_str(&lt->items[l]), "linear_attention") ? ATTN_GATED : ATTN_DELTANET));
        float *g = calloc((size_t)x.m.n_elems, 4);
        double worst_lp;
        run_reference(&x, root, g, &worst_lp);
        snprintf(path, sizeof path, "%s/grads.safetensors", dir);
        double worst;
        const char *wn = "";
        worst_grad(&x, g, path, &worst, &wn);
        printf("  %-16s max |Δ logprob| %.2e, worst grad rel L2 %.2e (%s)\n", models[mi], worst_lp, worst, wn);
        CHECK_MSG(worst_lp <= 1e-4, "%s: max |Δ logprob| %.3g > 1e-4", models[mi], worst_lp);
        CHECK_MSG(worst <= 1e-4, "%s: gradient of %s rel L2 %.3g > 1e-4", models[mi], wn, worst);
        free(g);
        loaded_close(&x);
        js_doc_free(doc);
    }
}

/* The balance loss of the Qwen3-Next models (hybrid + MoE) against transformers' aux_loss with
 * output_router_logits (reference.json aux_losses, aux_grads.safetensors): each sequence alone,
 * |Δ aux| <= 1e-5 as test_moe.c asks of qwen3_moe, and the gradient of Σ aux (the loss weights
 * zero, aux_coef 1: the balance loss alone) within 1e-4 relative L2 per tensor, the routers' and
 * every expert's included; a control shows the aux gradient is not the zero tensor. */
TEST(next_aux_matches_transformers) {
    static const char *models[] = {"qwen3_next", "qwen3_next_b"};
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        char dir[256], path[512];
        js_doc *doc;
        const js *root;
        open_reference(models[mi], dir, &doc, &root);
        const js *seqs = js_get(root, "sequences"), *auxs = js_get(root, "aux_losses");
        CHECK_MSG(auxs && auxs->n == seqs->n, "%s: no aux_losses", path);
        loaded x;
        loaded_open(&x, dir);
        CHECK(x.cfg.E > 1 && config_n_moe(&x.cfg) > 0);
        float *g = calloc((size_t)x.m.n_elems, 4);
        model_views gv;
        model_views_make(&x.m, g, 4, &gv);
        double worst_aux = 0, aux_sum = 0;
        for (int s = 0; s < seqs->n; s++) {
            pack_batch b;
            CHECK(reference_seq_pack(&seqs->items[s], &b) == 0);
            model_acts a;
            CHECK(model_acts_init(&x.m, &a, b.T, b.M, 1) == 0);
            model_input in;
            model_input_from_batch(&in, &b);
            in.aux_coef = 1.0f;
            float *zero = calloc((size_t)b.M, 4);
            CHECK_MSG(model_forward(&x.m, &x.wv, &a, NULL, &in, 1.0f, 0) == 0, "%s", err_msg());
            double aux;
            CHECK(model_aux_loss(&x.m, &a, &aux) == 0);
            double d = fabs(aux - auxs->items[s].num);
            worst_aux = d > worst_aux ? d : worst_aux;
            aux_sum += aux;
            CHECK(model_backward(&x.m, &x.wv, &gv, &a, &in, zero, NULL, 1.0f) == 0);
            free(zero);
            model_acts_free(&x.m, &a);
            pack_batch_free(&b);
        }
        double gn = 0;
        for (long long i = 0; i < x.m.n_elems; i++) gn += (double)g[i] * g[i];
        snprintf(path, sizeof path, "%s/aux_grads.safetensors", dir);
        double worst;
        const char *wn = "";
        worst_grad(&x, g, path, &worst, &wn);
        printf("  %-16s Σ aux %.6f, max |Δ aux| %.2e, |aux grad| %.3g, worst aux grad rel L2 %.2e (%s)\n", models[mi], aux_sum,
               worst_aux, sqrt(gn), worst, wn);
        CHECK_MSG(worst_aux <= 1e-5, "%s: max |Δ aux| %.3g > 1e-5", models[mi], worst_aux);
        CHECK_MSG(gn > 1e-8, "%s: the aux gradient is zero", models[mi]);
        CHECK_MSG(worst <= 1e-4, "%s: aux gradient of %s rel L2 %.3g > 1e-4", models[mi], wn, worst);
        free(g);
        model_views_free(&gv);
        loaded_close(&x);
        js_doc_free(doc);
    }
}

/* The text model of a qwen3_5 vision-language checkpoint (model.language_model.* names; the
 * vision tower's tensors are left in the file). */
TEST(hybrid_vision_language_checkpoint) {
    js_doc *doc;
    const js *root;
    CHECK(js_parse_file(FIX "/qwen3_5_vl/reference.json", &doc, &root) == 0);
    loaded x;
    loaded_open(&x, FIX "/qwen3_5_vl");
    CHECK(x.cfg.vision && x.cfg.arch == ARCH_QWEN3_5 && !strcmp(x.cfg.arch_name, "qwen3_5_text"));
    double worst;
    run_reference(&x, root, NULL, &worst);
    printf("  qwen3_5_vl       max |Δ logprob| %.2e\n", worst);
    CHECK_MSG(worst <= 1e-4, "max |Δ logprob| %.3g > 1e-4", worst);
    loaded_close(&x);
    js_doc_free(doc);
}

/* ---------------------------------------------------------------- packed ≡ standard */

enum { NG = 3 };

/* grad: 1, or MODEL_ACTS_RECOMPUTE (every layer's forward run again before its backward) */
static void run_layout(loaded *x, const pack_group *pg, pack_layout lay, int grad, const float *wl, float **logp,
                       float **grad_buf, long long *T) {
    pack_batch b;
    CHECK(pack_build(&b, pg, 0, NG, lay) == 0);
    model_acts a;
    CHECK(model_acts_init(&x->m, &a, b.T, b.M, grad) == 0);
    model_input in;
    model_input_from_batch(&in, &b);
    *grad_buf = calloc((size_t)x->m.n_elems, 4);
    *logp = malloc((size_t)b.M * 4);
    model_views gv;
    model_views_make(&x->m, *grad_buf, 4, &gv);
    CHECK(model_forward(&x->m, &x->wv, &a, NULL, &in, 1.0f, 0) == 0);
    memcpy(*logp, a.logp, (size_t)b.M * 4);
    CHECK(model_backward(&x->m, &x->wv, &gv, &a, &in, wl, NULL, 1.0f) == 0);
    *T = b.T;
    model_views_free(&gv);
    model_acts_free(&x->m, &a);
    pack_batch_free(&b);
}

/* groups: P 9 with N 4 (ragged, R = 1 and R < the conv included), P 1 with N 1, P 5 with N 3 */
TEST(hybrid_packed_equals_standard) {
    static const char *models[] = {"qwen3_5_text", "qwen3_5_text_b", "qwen3_5_moe_text", "qwen3_next", "qwen3_next_b"};
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        char dir[256];
        snprintf(dir, sizeof dir, FIX "/%s", models[mi]);
        loaded x;
        loaded_open(&x, dir);
        CHECK(model_pack_layout(&x.m) == PACK_PACKED); /* DeltaNet state runs along ranges a and b: the trunk only */
        static const int P[NG] = {9, 1, 5}, N[NG] = {4, 1, 3}, Rs[NG][4] = {{1, 6, 3, 8}, {5}, {4, 2, 7}};
        unsigned long long s = 3401 + mi;
        int *prompts[NG], *resp[NG][4], M = 0;
        const int *rp[NG][4];
        pack_group pg[NG];
        for (int g = 0; g < NG; g++) {
            prompts[g] = malloc((size_t)P[g] * sizeof(int));
            for (int i = 0; i < P[g]; i++) prompts[g][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (x.cfg.V - 1));
            for (int r = 0; r < N[g]; r++) {
                resp[g][r] = malloc((size_t)Rs[g][r] * sizeof(int));
                for (int i = 0; i < Rs[g][r]; i++) resp[g][r][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (x.cfg.V - 1));
                rp[g][r] = resp[g][r];
                M += Rs[g][r];
            }
            pg[g] = (pack_group){.prompt = prompts[g], .P = P[g], .N = N[g], .resp = rp[g], .R = Rs[g]};
        }
        float *wl = malloc((size_t)M * 4), *lp_p, *g_p, *lp_s, *g_s;
        check_fill(wl, (size_t)M, 3501 + mi, 1.0f);
        long long Tp, Ts;
        run_layout(&x, pg, PACK_PACKED, 1, wl, &lp_p, &g_p, &Tp);
        run_layout(&x, pg, PACK_STANDARD, 1, wl, &lp_s, &g_s, &Ts);
        float *lp_r, *g_r; /* every layer recomputed before its backward: the same kernels on the same inputs */
        long long Tr;
        run_layout(&x, pg, PACK_PACKED, MODEL_ACTS_RECOMPUTE, wl, &lp_r, &g_r, &Tr);
        CHECK(!memcmp(lp_r, lp_p, (size_t)M * 4) && !memcmp(g_r, g_p, (size_t)x.m.n_elems * 4));
        free(lp_r), free(g_r);
        double dlp = 0;
        for (int t = 0; t < M; t++) dlp = fmax(dlp, fabs(lp_p[t] - lp_s[t]));
        double e_g = rel_l2(g_p, g_s, (size_t)x.m.n_elems);
        printf("  %-16s T %lld vs %lld, max |Δ logprob| %.2e, grads rel L2 %.2e\n", models[mi], Tp, Ts, dlp, e_g);
        CHECK(Tp < Ts);
        CHECK_MSG(dlp <= 1e-5, "max |Δ logprob| %.3g", dlp);
        CHECK_MSG(e_g <= 1e-5, "gradients rel L2 %.3g", e_g);
        free(lp_p), free(g_p), free(lp_s), free(g_s), free(wl);
        for (int g = 0; g < NG; g++) {
            for (int r = 0; r < N[g]; r++) free(resp[g][r]);
            free(prompts[g]);
        }
        loaded_close(&x);
    }
}

/* ---------------------------------------------------------------- checkpoints and the optimizer */

/* config.json and model.safetensors written by grpod read back the same rows and bits, the
 * zero-centred norms written as the checkpoint's w (not the gain 1 + w held in memory: w comes
 * back to within half an ulp of 1, 6e-8); the qwen3_5 vision-language form is written as its
 * text model; qwen3_5_moe_text keeps its experts and shared expert; qwen3_next writes its fused
 * projections in the checkpoint's interleaved rows. Every tensor but the zero-centred norms is
 * the source checkpoint's, bit for bit, under its HF name. */
TEST(hybrid_checkpoint_round_trip) {
    static const char *models[] = {"qwen3_5_text_b", "qwen3_5_vl", "qwen3_5_moe_text", "qwen3_next", "qwen3_next_b"};
    for (int mi = 0; mi < 5; mi++) {
        char src[256], cmd[512], dir[64];
        snprintf(src, sizeof src, FIX "/%s", models[mi]);
        snprintf(dir, sizeof dir, TEST_TMP "/grpod_test_hybrid_ckpt.%d", (int)getpid()); /* runs beside another's */
        snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
        CHECK(system(cmd) == 0);
        loaded x;
        loaded_open(&x, src);
        CHECK(config_write(dir, &x.cfg) == 0);
        CHECK(model_save_host(&x.m, dir, x.w, 0) == 0);
        loaded y;
        loaded_open(&y, dir);
        CHECK(!y.cfg.vision && y.cfg.R == x.cfg.R && y.cfg.gain1 && y.cfg.conv_k == x.cfg.conv_k &&
              y.cfg.lin_hk == x.cfg.lin_hk && y.cfg.lin_hv == x.cfg.lin_hv && y.cfg.lin_dk == x.cfg.lin_dk &&
              y.cfg.lin_dv == x.cfg.lin_dv && y.cfg.tied == x.cfg.tied && !memcmp(y.cfg.attn, x.cfg.attn, (size_t)x.cfg.L));
        CHECK(y.cfg.E == x.cfg.E && y.cfg.top_k == x.cfg.top_k && y.cfg.Fm == x.cfg.Fm && y.cfg.norm_topk == x.cfg.norm_topk &&
              y.cfg.shared == x.cfg.shared && y.cfg.F == x.cfg.F && !memcmp(y.cfg.mlp, x.cfg.mlp, (size_t)x.cfg.L) &&
              !strcmp(y.cfg.arch_name, x.cfg.arch_name) && config_shared_ff(&y.cfg) == config_shared_ff(&x.cfg) &&
              y.cfg.dn_fused == x.cfg.dn_fused);
        long long np = 0;
        for (int i = 0; i < x.m.n_params; i++) np += x.m.params[i].numel;
        CHECK_MSG(config_n_params(&y.cfg) == np && config_n_params(&x.cfg) == np, "config_n_params %lld, the tensors %lld",
                  config_n_params(&x.cfg), np);
        CHECK(y.m.n_elems == x.m.n_elems && !memcmp(y.w, x.w, (size_t)x.m.n_elems * 4));
        /* the file holds w: the fixture's own value */
        st_set a = {0}, b = {0};
        char path[512];
        snprintf(path, sizeof path, "%s/model.safetensors", dir);
        CHECK(st_open_file(&a, path) == 0);
        CHECK(st_open_dir(src, &b) == 0);
        const char *nm = "model.norm.weight", *src_nm = mi == 1 ? "model.language_model.norm.weight" : nm;
        const st_tensor *ta = st_find(&a, nm), *tb = st_find(&b, src_nm);
        CHECK(ta && tb);
        long long C = x.cfg.C;
        float *va = malloc((size_t)C * 4), *vb = malloc((size_t)C * 4);
        CHECK(st_read_f32(ta, va, 1, &C) == 0 && st_read_f32(tb, vb, 1, &C) == 0);
        double dn = 0; /* w went through 1 + w in fp32: kept to half an ulp of 1 */
        for (long long i = 0; i < C; i++) dn = fmax(dn, fabs(va[i] - vb[i]));
        CHECK_MSG(dn <= 6e-8, "model.norm.weight written back off by %.3g", dn);
        free(va), free(vb);
        int fused = 0;
        for (int i = 0; i < x.m.n_params; i++) { /* the other tensors: the source's bits */
            const model_param *p = &x.m.params[i];
            if (p->gain1) continue;
            char sn[128];
            snprintf(sn, sizeof sn, "model.language_model.%s", p->name + 6);
            const st_tensor *t1 = st_find(&a, p->name), *t0 = st_find(&b, mi == 1 && !strncmp(p->name, "model.", 6) ? sn : p->name);
            CHECK_MSG(t1 && t0, "%s: %s missing", models[mi], p->name);
            float *v1 = malloc((size_t)p->numel * 4), *v0 = malloc((size_t)p->numel * 4);
            CHECK(st_read_f32(t1, v1, p->ndim, p->shape) == 0 && st_read_f32(t0, v0, p->ndim, p->shape) == 0);
            CHECK_MSG(!memcmp(v1, v0, (size_t)p->numel * 4), "%s: %s written back differs", models[mi], p->name);
            fused += p->rows != PARAM_ROWS_SAME;
            free(v1), free(v0);
        }
        CHECK(fused == (x.cfg.dn_fused ? 2 * config_n_linear(&x.cfg) : 0));
        st_close(&a), st_close(&b);
        loaded_close(&x);
        loaded_close(&y);
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        CHECK(system(cmd) == 0);
    }
}

/* One update with weight decay wd against the same without: AdamW's decoupled decay moves every
 * weight by -lr·wd·w, w the checkpoint's value, so a zero-centred norm (held as 1 + w) moves by
 * -lr·wd·(gain - 1), not -lr·wd·gain. */
TEST(hybrid_update_decays_w) {
    int prompt[5] = {11, 200, 37, 5, 150}, r0[4] = {65, 66, 67, 68}, r1[2] = {97, 98}, r2[6] = {48, 49, 50, 51, 300, 7};
    const int *resp[3] = {r0, r1, r2};
    int R[3] = {4, 2, 6};
    float rew[3] = {1.0f, 0.0f, 0.5f};
    eng_update_group g = {.prompt = prompt, .P = 5, .n = 3, .resp = resp, .R = R, .reward = rew};
    loss_config a;
    loss_config_default(&a);
    float *w[3] = {0};
    long long n = 0;
    eng_optim o;
    for (int i = 0; i < 3; i++) { /* the weights before, after wd = 0, after wd = 0.5 */
        eng *e;
        eng_open_opts oo = {.model_dir = FIX "/qwen3_5_text", .backend = "cpu"};
        CHECK_MSG(eng_open(&oo, &e) == 0, "%s", err_msg());
        eng_testing_info info;
        eng_testing_get(e, &info);
        n = info.n_params;
        w[i] = malloc((size_t)n * 4);
        eng_optim_default(&o);
        o.lr = 1e-3f;
        o.weight_decay = i == 2 ? 0.5f : 0.0f;
        eng_update_result u;
        if (i) CHECK_MSG(eng_update(e, &g, 1, &a, &o, 1 << 20, &u, NULL, NULL) == 0, "%s", err_msg());
        CHECK(eng_testing_weights(e, w[i]) == 0);
        eng_close(e);
    }
    model_config cfg;
    CHECK(config_load(FIX "/qwen3_5_text", &cfg) == 0);
    eng_backend *be;
    backend_cpu_create(&be, 0);
    model m;
    CHECK(model_init(&m, &cfg, be) == 0);
    double worst[2] = {0, 0}; /* gains, other weights: |Δ - (-lr wd w)| */
    int seen[2] = {0, 0};
    for (int p = 0; p < m.n_params; p++) {
        const model_param *pp = &m.params[p];
        for (long long j = pp->off; j < pp->off + pp->numel; j++) {
            double w0 = w[0][j] - (pp->gain1 ? 1.0 : 0.0), d = (double)w[2][j] - w[1][j], want = -1e-3 * 0.5 * w0;
            worst[pp->gain1] = fmax(worst[pp->gain1], fabs(d - want));
            seen[pp->gain1] = 1;
        }
    }
    printf("  decay with wd 0.5, lr 1e-3: worst |Δ - (-lr wd w)| %.2e (zero-centred gains), %.2e (other weights)\n", worst[1],
           worst[0]);
    CHECK(seen[0] && seen[1]);
    CHECK_MSG(worst[1] <= 2e-7 && worst[0] <= 2e-7, "decay off by %.3g / %.3g", worst[1], worst[0]);
    model_free(&m);
    be->destroy(be);
    for (int i = 0; i < 3; i++) free(w[i]);
}

/* qwen3_next's config.json as Qwen3NextConfig reads it: absent MoE keys take its defaults (512
 * experts, top 10, width 512, norm_topk_prob true), the shared expert its own width beside the
 * dense layers' intermediate_size; no experts: every layer dense, no shared expert; the value
 * heads a multiple of the key heads, or one line naming them. */
TEST(next_config) {
    static const char *base = "{\"model_type\": \"qwen3_next\", \"num_hidden_layers\": 4, \"hidden_size\": 64, "
                              "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 16, "
                              "\"intermediate_size\": 96, \"vocab_size\": 320, \"linear_num_key_heads\": 2, %s}";
    static const struct {
        const char *extra;
        int E, k, Fm, norm, Fs, n_moe;
        const char *err;
    } rows[] = {
        {"\"linear_num_value_heads\": 4, \"shared_expert_intermediate_size\": 40, \"decoder_sparse_step\": 2", 512, 10, 512, 1,
         40, 2, NULL},
        {"\"linear_num_value_heads\": 4, \"num_experts\": 8, \"num_experts_per_tok\": 2, \"norm_topk_prob\": false, "
         "\"mlp_only_layers\": [0, 3]",
         8, 2, 512, 0, 512, 2, NULL},
        {"\"linear_num_value_heads\": 4, \"num_experts\": 0, \"num_experts_per_tok\": 1", 0, 0, 512, 1, 0, 0, NULL},
        {"\"linear_num_value_heads\": 5", 0, 0, 0, 0, 0, 0, "linear_num_value_heads 5 is not a multiple"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text, base, rows[i].extra);
        js_doc *doc;
        const js *root;
        CHECK(js_parse(text, strlen(text), &doc, &root) == 0);
        model_config c;
        int rc = config_from_json(root, "config.json", &c);
        js_doc_free(doc);
        if (rows[i].err) {
            CHECK_MSG(rc && strstr(err_msg(), rows[i].err), "row %zu: %s", i, rc ? err_msg() : "accepted");
            continue;
        }
        CHECK_MSG(rc == 0, "row %zu: %s", i, err_msg());
        CHECK_MSG(c.arch == ARCH_QWEN3_5 && c.dn_fused && c.gain1 && c.F == 96 && c.E == rows[i].E && c.top_k == rows[i].k &&
                      c.Fm == rows[i].Fm && c.norm_topk == rows[i].norm && c.shared == (rows[i].E > 0) &&
                      (!c.shared || config_shared_ff(&c) == rows[i].Fs) && config_n_moe(&c) == rows[i].n_moe && c.R == 4,
                  "row %zu: E %d k %d Fm %d norm %d shared %d Fs %d n_moe %d R %d", i, c.E, c.top_k, c.Fm, c.norm_topk, c.shared,
                  config_shared_ff(&c), config_n_moe(&c), c.R);
    }
}

/* What is not built yet says so in one line: LoRA. (Rollouts: test_hybrid_decode.c; a group split over
 * micro-batches: test_hybrid_split.c.) */
TEST(hybrid_refuses_what_is_not_built) {
    eng *e;
    eng_open_opts lo = {.model_dir = FIX "/qwen3_5_text", .backend = "cpu", .lora_rank = 4};
    CHECK(eng_open(&lo, &e) == GE_UNSUPPORTED);
    CHECK_MSG(strstr(err_msg(), "linear-attention"), "%s", err_msg());
}

int main(void) {
    RUN(hybrid_matches_transformers);
    RUN(next_aux_matches_transformers);
    RUN(hybrid_vision_language_checkpoint);
    RUN(hybrid_packed_equals_standard);
    RUN(hybrid_checkpoint_round_trip);
    RUN(hybrid_update_decays_w);
    RUN(hybrid_refuses_what_is_not_built);
    RUN(next_config);
    return CHECK_DONE();
}
