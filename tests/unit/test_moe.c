/* test_moe.c — mixture-of-experts layers (qwen3_moe) on the CPU backend, the fp32 reference.
 *
 * Against transformers (tests/fixtures/make_moe_reference.py, data/qwen3_moe*): per-token
 * logprobs (max |Δ| ≤ 1e-4, the DESIGN.md contract), the balance loss of each sequence
 * (|Δ| ≤ 1e-5: a sum of E products of means, each ~0.1, so fp32 rounding stays near 1e-7),
 * the gradient of Σ w·logprob and, apart, the gradient of Σ aux (relative L2 ≤ 1e-4 per tensor:
 * the router's and every expert's included).
 *
 * Packed ≡ standard: [P; R_1..R_N] and N copies of [P; R_i] give the same logprobs, the same
 * balance loss and the same gradient of Σ w·logprob + c·aux (1e-5 relative: the layouts sum the
 * same terms in other orders). A prompt token stands for N tokens in the balance statistics;
 * the control shows that counting it once gives another balance loss, so the equivalence check
 * fails if the counts are lost. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "reference_seq.h"
#include "common/err.h"
#include "engine/engine.h"
#include "engine/format/json.h"
#include "engine/format/safetensors.h"
#include "engine/model/model.h"
#include "engine/model/pack.h"
#include "moe_config.h"

#define FIX "tests/fixtures/data"

static const char *models[] = {"qwen3_moe", "qwen3_moe_step2"};

/* *worst = the worst per-tensor relative L2 of g against the gradients in file */
static void worst_grad(const model *m, const float *g, const char *file, double *worst_out, const char **worst_name) {
    st_set gs = {0};
    CHECK_MSG(st_open_file(&gs, file) == 0, "%s", err_msg());
    double worst = 0;
    for (int p = 0; p < m->n_params; p++) {
        const st_tensor *t = st_find(&gs, m->params[p].name);
        CHECK_MSG(t, "%s: no gradient for %s", file, m->params[p].name);
        float *ref = malloc((size_t)t->numel * 4);
        CHECK(st_read_f32(t, ref, m->params[p].ndim, m->params[p].shape) == 0);
        double e = rel_l2(g + m->params[p].off, ref, (size_t)t->numel);
        if (e > worst) {
            worst = e;
            *worst_name = m->params[p].name;
        }
        free(ref);
    }
    st_close(&gs);
    *worst_out = worst;
}

TEST(moe_matches_transformers) {
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        char dir[256], path[512];
        snprintf(dir, sizeof dir, FIX "/%s", models[mi]);
        snprintf(path, sizeof path, "%s/reference.json", dir);
        js_doc *doc;
        const js *root;
        CHECK_MSG(js_parse_file(path, &doc, &root) == 0, "%s", err_msg());
        const js *seqs = js_get(root, "sequences"), *lps = js_get(root, "logprobs"), *wts = js_get(root, "loss_weights");
        const js *auxs = js_get(root, "aux_losses"), *sparse = js_get(root, "sparse_layers");
        model_config cfg;
        CHECK_MSG(config_load(dir, &cfg) == 0, "%s", err_msg());
        CHECK(cfg.arch == ARCH_QWEN3_MOE && cfg.E == 8 && cfg.top_k == 2 && cfg.router_logits);
        CHECK(config_n_moe(&cfg) == sparse->n);
        for (int i = 0; i < sparse->n; i++) CHECK(cfg.mlp[(int)sparse->items[i].num] == MLP_MOE);
        eng_backend *be;
        backend_cpu_create(&be, 0);
        model m;
        CHECK(model_init(&m, &cfg, be) == 0);
        float *w = malloc((size_t)m.n_elems * 4), *g = calloc((size_t)m.n_elems, 4), *ga = calloc((size_t)m.n_elems, 4);
        CHECK_MSG(model_load_host(&m, dir, w) == 0, "%s", err_msg());
        model_views wv, gv, gav;
        model_views_make(&m, w, 4, &wv);
        model_views_make(&m, g, 4, &gv);
        model_views_make(&m, ga, 4, &gav);
        double worst_lp = 0, worst_aux = 0, L = 0;
        for (int s = 0; s < seqs->n; s++) { /* each sequence alone, as transformers ran it */
            pack_batch b;
            CHECK(reference_seq_pack(&seqs->items[s], &b) == 0);
            model_acts a;
            CHECK(model_acts_init(&m, &a, b.T, b.M, 1) == 0);
            model_input in;
            model_input_from_batch(&in, &b);
            float *dl = malloc((size_t)b.M * 4), *zero = calloc((size_t)b.M, 4);
            for (int t = 0; t < b.M; t++) dl[t] = (float)wts->items[s].items[t].num;
            CHECK(model_forward(&m, &wv, &a, NULL, &in, 1.0f, 0) == 0);
            for (int t = 0; t < b.M; t++) {
                double d = fabs(a.logp[t] - lps->items[s].items[t].num);
                worst_lp = d > worst_lp ? d : worst_lp;
                L += (double)dl[t] * a.logp[t];
            }
            double aux;
            CHECK(model_aux_loss(&m, &a, &aux) == 0);
            double da = fabs(aux - auxs->items[s].num);
            worst_aux = da > worst_aux ? da : worst_aux;
            CHECK(model_backward(&m, &wv, &gv, &a, &in, dl, NULL, 1.0f) == 0);
            in.aux_coef = 1.0f; /* the balance loss alone */
            CHECK(model_forward(&m, &wv, &a, NULL, &in, 1.0f, 0) == 0);
            CHECK(model_backward(&m, &wv, &gav, &a, &in, zero, NULL, 1.0f) == 0);
            free(dl);
            free(zero);
            model_acts_free(&m, &a);
            pack_batch_free(&b);
        }
        snprintf(path, sizeof path, "%s/grads.safetensors", dir);
        const char *wn = "", *wan = "";
        double wg, wa;
        worst_grad(&m, g, path, &wg, &wn);
        snprintf(path, sizeof path, "%s/aux_grads.safetensors", dir);
        worst_grad(&m, ga, path, &wa, &wan);
        printf("  %-16s max |Δ logprob| %.2e, max |Δ aux| %.2e, loss %.6f (ref %.6f), worst grad rel L2 %.2e (%s), "
               "aux grad %.2e (%s)\n",
               models[mi], worst_lp, worst_aux, L, js_get_num(root, "loss", 0), wg, wn, wa, wan);
        CHECK_MSG(worst_lp <= 1e-4, "%s: max |Δ logprob| %.3g > 1e-4", models[mi], worst_lp);
        CHECK_MSG(worst_aux <= 1e-5, "%s: max |Δ aux| %.3g > 1e-5", models[mi], worst_aux);
        CHECK_MSG(wg <= 1e-4, "%s: gradient of %s rel L2 %.3g > 1e-4", models[mi], wn, wg);
        CHECK_MSG(wa <= 1e-4, "%s: aux gradient of %s rel L2 %.3g > 1e-4", models[mi], wan, wa);
        free(w);
        free(g);
        free(ga);
        model_views_free(&wv);
        model_views_free(&gv);
        model_views_free(&gav);
        model_free(&m);
        be->destroy(be);
        js_doc_free(doc);
    }
}

/* ---------------------------------------------------------------- packed ≡ standard */

enum { NG = 3 };

typedef struct {
    float *logp, *grad;
    double aux;
    long long T;
} run_out;

/* Forward and backward of groups in a layout: logprobs, balance loss, the gradient of
 * Σ wl·logp + coef·aux. no_counts drops the tokens' counts (every token counted once). */
static void run_layout(model *m, const model_views *wv, const pack_group *pg, pack_layout lay, const float *wl, float coef,
                       int no_counts, run_out *o) {
    pack_batch b;
    CHECK(pack_build(&b, pg, 0, NG, lay) == 0);
    model_acts a;
    CHECK(model_acts_init(m, &a, b.T, b.M, 1) == 0);
    model_input in;
    model_input_from_batch(&in, &b);
    if (no_counts) in.count = NULL;
    in.aux_coef = coef;
    o->grad = calloc((size_t)m->n_elems, 4);
    o->logp = malloc((size_t)b.M * 4);
    model_views gv;
    model_views_make(m, o->grad, 4, &gv);
    CHECK(model_forward(m, wv, &a, NULL, &in, 1.0f, 0) == 0);
    memcpy(o->logp, a.logp, (size_t)b.M * 4);
    CHECK(model_aux_loss(m, &a, &o->aux) == 0);
    CHECK(model_backward(m, wv, &gv, &a, &in, wl, NULL, 1.0f) == 0);
    o->T = b.T;
    model_views_free(&gv);
    model_acts_free(m, &a);
    pack_batch_free(&b);
}

static void packed_equals_standard(int norm, unsigned long long seed) {
    model_config c = moe_test_config(8, norm);
    eng_backend *be;
    backend_cpu_create(&be, 0);
    model m;
    CHECK(model_init(&m, &c, be) == 0);
    float *w = malloc((size_t)m.n_elems * 4);
    check_fill(w, (size_t)m.n_elems, seed, 0.3f);
    model_views wv;
    model_views_make(&m, w, 4, &wv);
    /* groups: P 9 with N 4 (ragged, R = 1 included), P 1 with N 1, P 5 with N 3 */
    static const int P[NG] = {9, 1, 5}, N[NG] = {4, 1, 3}, Rs[NG][4] = {{1, 6, 3, 8}, {5}, {4, 2, 7}};
    unsigned long long s = seed + 7;
    int *prompts[NG], *resp[NG][4], M = 0;
    const int *rp[NG][4];
    pack_group pg[NG];
    for (int g = 0; g < NG; g++) {
        prompts[g] = malloc((size_t)P[g] * sizeof(int));
        for (int i = 0; i < P[g]; i++) prompts[g][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (c.V - 1));
        for (int r = 0; r < N[g]; r++) {
            resp[g][r] = malloc((size_t)Rs[g][r] * sizeof(int));
            for (int i = 0; i < Rs[g][r]; i++) resp[g][r][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (c.V - 1));
            rp[g][r] = resp[g][r];
            M += Rs[g][r];
        }
        pg[g] = (pack_group){.prompt = prompts[g], .P = P[g], .N = N[g], .resp = rp[g], .R = Rs[g]};
    }
    float *wl = malloc((size_t)M * 4);
    check_fill(wl, (size_t)M, seed + 1, 1.0f);
    run_out pk, st, once;
    run_layout(&m, &wv, pg, PACK_PACKED, wl, 0.5f, 0, &pk);
    run_layout(&m, &wv, pg, PACK_STANDARD, wl, 0.5f, 0, &st);
    run_layout(&m, &wv, pg, PACK_PACKED, wl, 0.5f, 1, &once);
    double e_lp = rel_l2(pk.logp, st.logp, (size_t)M), e_g = rel_l2(pk.grad, st.grad, (size_t)m.n_elems);
    double e_aux = fabs(pk.aux - st.aux) / fabs(st.aux), e_once = fabs(once.aux - st.aux) / fabs(st.aux);
    double e_once_g = rel_l2(once.grad, st.grad, (size_t)m.n_elems);
    printf("  norm_topk %d: T %lld vs %lld, logprobs rel L2 %.2e, aux %.6f vs %.6f (rel %.2e; prompts counted once: "
           "%.6f, rel %.2e), grads rel L2 %.2e (counted once: %.2e)\n",
           norm, pk.T, st.T, e_lp, pk.aux, st.aux, e_aux, once.aux, e_once, e_g, e_once_g);
    CHECK(pk.T < st.T);
    CHECK_MSG(e_lp <= 1e-5, "logprobs rel L2 %.3g", e_lp);
    CHECK_MSG(e_aux <= 1e-5, "aux packed %.8f standard %.8f", pk.aux, st.aux);
    CHECK_MSG(e_g <= 1e-5, "gradients rel L2 %.3g", e_g);
    /* the control: counting prompt tokens once is visibly another loss */
    CHECK_MSG(e_once > 1e-3 && e_once_g > 1e-4, "counting prompts once changes aux by %.3g only", e_once);
    free(pk.logp), free(pk.grad), free(st.logp), free(st.grad), free(once.logp), free(once.grad);
    free(wl);
    for (int g = 0; g < NG; g++) {
        for (int r = 0; r < N[g]; r++) free(resp[g][r]);
        free(prompts[g]);
    }
    free(w);
    model_views_free(&wv);
    model_free(&m);
    be->destroy(be);
}

TEST(moe_packed_equals_standard) {
    packed_equals_standard(1, 3301);
    packed_equals_standard(0, 3302);
}

/* An update on a MoE model whose config asks for the balance loss (output_router_logits,
 * router_aux_loss_coef 0.01) reports a loss larger by coef × aux than the same model without
 * it, aux being the balance loss of the group's N(P+R) sequences (the model API's, on the
 * standard layout): one micro-batch, so transformers' loss over the batch. With LoRA the model
 * opens on the cpu backend. */
TEST(moe_update_adds_the_balance_loss) {
    const char *dir = TEST_TMP "/grpod_test_moe_noaux";
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && cp -r " FIX
             "/qwen3_moe %s && sed -i 's/\"output_router_logits\": true/\"output_router_logits\": false/' "
             "%s/config.json && grep -q '\"output_router_logits\": false' %s/config.json",
             dir, dir, dir, dir);
    CHECK(system(cmd) == 0);
    int prompt[5] = {11, 200, 37, 5, 150}, r0[4] = {65, 66, 67, 68}, r1[2] = {97, 98}, r2[6] = {48, 49, 50, 51, 300, 7};
    const int *resp[3] = {r0, r1, r2};
    int R[3] = {4, 2, 6};
    float rew[3] = {1.0f, 0.0f, 0.5f};
    eng_update_group g = {.prompt = prompt, .P = 5, .n = 3, .resp = resp, .R = R, .reward = rew};
    loss_config a;
    loss_config_default(&a);
    eng_optim o;
    eng_optim_default(&o);
    double loss[2];
    for (int i = 0; i < 2; i++) {
        eng *e;
        eng_open_opts oo = {.model_dir = i ? dir : FIX "/qwen3_moe", .backend = "cpu"};
        CHECK_MSG(eng_open(&oo, &e) == 0, "%s", err_msg());
        eng_update_result u;
        CHECK_MSG(eng_update(e, &g, 1, &a, &o, 1 << 20, &u, NULL, NULL) == 0, "%s", err_msg());
        loss[i] = u.loss;
        eng_close(e);
    }
    /* the balance loss of the standard layout, from the model API */
    model_config cfg;
    CHECK(config_load(FIX "/qwen3_moe", &cfg) == 0);
    eng_backend *be;
    backend_cpu_create(&be, 0);
    model m;
    CHECK(model_init(&m, &cfg, be) == 0);
    float *w = malloc((size_t)m.n_elems * 4);
    CHECK(model_load_host(&m, FIX "/qwen3_moe", w) == 0);
    model_views wv;
    model_views_make(&m, w, 4, &wv);
    pack_group pg = {.prompt = prompt, .P = 5, .N = 3, .resp = resp, .R = R};
    pack_batch b;
    CHECK(pack_build(&b, &pg, 0, 1, PACK_STANDARD) == 0);
    model_acts ac;
    CHECK(model_acts_init(&m, &ac, b.T, b.M, 0) == 0);
    model_input in;
    model_input_from_batch(&in, &b);
    CHECK(model_forward(&m, &wv, &ac, NULL, &in, 1.0f, 0) == 0);
    double aux;
    CHECK(model_aux_loss(&m, &ac, &aux) == 0);
    printf("  loss with the balance loss %.7f, without %.7f, coef x aux %.7f\n", loss[0], loss[1], cfg.aux_coef * aux);
    CHECK_CLOSE(loss[0] - loss[1], cfg.aux_coef * aux, 1e-6, 1e-4);
    model_acts_free(&m, &ac);
    pack_batch_free(&b);
    model_views_free(&wv);
    model_free(&m);
    free(w);
    be->destroy(be);
    eng *e; /* LoRA on the experts runs on the cpu backend (test_lora_moe.c) */
    eng_open_opts lo = {.model_dir = FIX "/qwen3_moe", .backend = "cpu", .lora_rank = 4};
    CHECK_MSG(eng_open(&lo, &e) == 0, "%s", err_msg());
    eng_info info;
    eng_get_info(e, &info);
    CHECK_STR(info.lora_targets, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
    eng_close(e);
}

/* ---------------------------------------------------------------- routing replay
 * One packed group (P 6, N 3, R 5/1/4) through a model whose layers 0 and 2 are MoE. Replaying
 * the routes the router chose gives the same bits as routing freely (logprobs and every
 * gradient), also when some tokens replay nothing (-1: their own top-k). Replaying other experts
 * changes the logprobs, and with the experts fixed the loss is smooth in the weights: its
 * gradient (the router's through the replayed experts' weights included) matches central
 * differences. */
typedef struct {
    model m;
    eng_backend *be;
    float *w, *wl;
    model_views wv;
    pack_batch b;
    size_t nr; /* Lm T k */
} replay_fix;

static void replay_open(replay_fix *f, int norm, unsigned long long seed) {
    model_config c = moe_test_config(8, norm);
    backend_cpu_create(&f->be, 0);
    CHECK(model_init(&f->m, &c, f->be) == 0);
    f->w = malloc((size_t)f->m.n_elems * 4);
    check_fill(f->w, (size_t)f->m.n_elems, seed, 0.3f);
    model_views_make(&f->m, f->w, 4, &f->wv);
    static int prompt[6], r[3][5];
    static const int R[3] = {5, 1, 4};
    unsigned long long s = seed + 1;
    for (int i = 0; i < 6; i++) prompt[i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (c.V - 1));
    for (int j = 0; j < 3; j++)
        for (int i = 0; i < R[j]; i++) r[j][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (c.V - 1));
    static const int *resp[3] = {r[0], r[1], r[2]};
    pack_group pg = {.prompt = prompt, .P = 6, .N = 3, .resp = resp, .R = R};
    CHECK(pack_build(&f->b, &pg, 0, 1, PACK_PACKED) == 0);
    f->wl = malloc((size_t)f->b.M * 4);
    check_fill(f->wl, (size_t)f->b.M, seed + 2, 1.0f);
    f->nr = (size_t)config_n_moe(&c) * f->b.T * c.top_k;
}

static void replay_close(replay_fix *f) {
    pack_batch_free(&f->b);
    model_views_free(&f->wv);
    model_free(&f->m);
    f->be->destroy(f->be);
    free(f->w), free(f->wl);
}

/* *sum_out = Σ wl·logp of f's batch with routes (NULL: free); logp (M), the routes the forward used
 * (rec, nr; recorded when free), the gradient (grad, n_elems) when not NULL. */
static void replay_run(replay_fix *f, const int *routes, float *logp, int *rec, float *grad, double *sum_out) {
    model_acts a;
    CHECK(model_acts_init(&f->m, &a, f->b.T, f->b.M, 1) == 0);
    model_input in;
    model_input_from_batch(&in, &f->b);
    in.routes = routes;
    CHECK(model_forward(&f->m, &f->wv, &a, NULL, &in, 1.0f, 0) == 0);
    double sum = 0;
    for (int i = 0; i < f->b.M; i++) sum += (double)f->wl[i] * a.logp[i];
    if (logp) memcpy(logp, a.logp, (size_t)f->b.M * 4);
    if (rec) memcpy(rec, a.routes, f->nr * sizeof(int));
    if (grad) {
        model_views gv;
        memset(grad, 0, (size_t)f->m.n_elems * 4);
        model_views_make(&f->m, grad, 4, &gv);
        CHECK(model_backward(&f->m, &f->wv, &gv, &a, &in, f->wl, NULL, 1.0f) == 0);
        model_views_free(&gv);
    }
    model_acts_free(&f->m, &a);
    if (sum_out) *sum_out = sum;
}

TEST(moe_replay_own_routes_is_bit_equal) {
    for (int norm = 0; norm < 2; norm++) {
        replay_fix f;
        replay_open(&f, norm, 3401 + norm);
        size_t M = (size_t)f.b.M, n = (size_t)f.m.n_elems;
        float *lp0 = malloc(M * 4), *lp1 = malloc(M * 4), *g0 = malloc(n * 4), *g1 = malloc(n * 4);
        int *rec = malloc(f.nr * sizeof(int)), *rec1 = malloc(f.nr * sizeof(int));
        replay_run(&f, NULL, lp0, rec, g0, NULL);
        replay_run(&f, rec, lp1, rec1, g1, NULL);
        CHECK(!memcmp(lp0, lp1, M * 4) && !memcmp(g0, g1, n * 4) && !memcmp(rec, rec1, f.nr * sizeof(int)));
        int k = f.m.cfg.top_k, T = f.b.T, mixed = 0;
        for (size_t i = 0; i < f.nr; i += (size_t)k) /* every third token of each layer routes freely */
            if ((i / (size_t)k) % 3 == 1) rec[i] = -1, mixed++;
        replay_run(&f, rec, lp1, NULL, g1, NULL);
        CHECK(!memcmp(lp0, lp1, M * 4) && !memcmp(g0, g1, n * 4));
        printf("  norm_topk %d: T %d, %zu routes replayed: logprobs and gradients bit-equal (also with %d tokens free)\n", norm,
               T, f.nr / (size_t)k, mixed);
        free(lp0), free(lp1), free(g0), free(g1), free(rec), free(rec1);
        replay_close(&f);
    }
}

/* The index of the largest |g| among the parameters whose name holds `part` */
static long long largest_grad(const model *m, const float *g, const char *part) {
    long long best = -1;
    for (int p = 0; p < m->n_params; p++) {
        if (!strstr(m->params[p].name, part)) continue;
        for (long long i = m->params[p].off; i < m->params[p].off + m->params[p].numel; i++)
            if (best < 0 || fabsf(g[i]) > fabsf(g[best])) best = i;
    }
    return best;
}

TEST(moe_replay_forces_other_routes) {
    for (int norm = 0; norm < 2; norm++) {
        replay_fix f;
        replay_open(&f, norm, 3501 + norm);
        size_t M = (size_t)f.b.M, n = (size_t)f.m.n_elems;
        int k = f.m.cfg.top_k, E = f.m.cfg.E;
        float *lp0 = malloc(M * 4), *lp1 = malloc(M * 4), *g = malloc(n * 4);
        int *rec = malloc(f.nr * sizeof(int)), *other = malloc(f.nr * sizeof(int));
        replay_run(&f, NULL, lp0, rec, NULL, NULL);
        for (size_t i = 0; i < f.nr; i++) /* a shift mod E per token: still k distinct experts, none the same */
            other[i] = (rec[i] + 1 + (int)(i / (size_t)k) % (E - 1)) % E;
        int *used = malloc(f.nr * sizeof(int));
        replay_run(&f, other, lp1, used, g, NULL);
        double d_lp = rel_l2(lp1, lp0, M);
        CHECK(!memcmp(used, other, f.nr * sizeof(int)));
        CHECK_MSG(d_lp > 5e-4, "replaying other experts changed the logprobs by %.3g only", d_lp);
        /* central differences of Σ wl·logp with the routes fixed, at the largest gradient of each
         * kind; h = 1e-2 on weights of 0.3: fp32 rounding of the sum (~1e-6) over 2h is ~1e-4,
         * the truncation h² f''' about as much, hence 2e-3 absolute + 2e-2 relative */
        static const char *kinds[] = {"layers.0.mlp.gate.weight", "layers.2.mlp.gate.weight", "layers.0.mlp.experts",
                                      "layers.2.mlp.experts",     "layers.1.mlp.up_proj",     "self_attn.q_proj"};
        double worst = 0;
        for (int j = 0; j < (int)(sizeof kinds / sizeof *kinds); j++) {
            long long i = largest_grad(&f.m, g, kinds[j]);
            CHECK(i >= 0);
            float w0 = f.w[i], h = 1e-2f;
            f.w[i] = w0 + h;
            double up, dn;
            replay_run(&f, other, NULL, NULL, NULL, &up);
            f.w[i] = w0 - h;
            replay_run(&f, other, NULL, NULL, NULL, &dn);
            f.w[i] = w0;
            double fd = (up - dn) / (2.0 * h), err = fabs(fd - g[i]) / (2e-3 + 2e-2 * fabs(g[i]));
            if (err > worst) worst = err;
            CHECK_MSG(err <= 1, "%s: gradient %.6g, central difference %.6g", kinds[j], g[i], fd);
        }
        printf("  norm_topk %d: other experts change the logprobs (rel L2 %.2e); gradient vs central differences: worst "
               "%.2f of the tolerance\n",
               norm, d_lp, worst);
        free(lp0), free(lp1), free(g), free(rec), free(other), free(used);
        replay_close(&f);
    }
}

/* config.json round trip: what config_write writes for a MoE model reads back the same rows. */
TEST(moe_config_round_trip) {
    model_config c;
    CHECK_MSG(config_load(FIX "/qwen3_moe_step2", &c) == 0, "%s", err_msg());
    CHECK(c.E == 8 && c.top_k == 2 && c.Fm == 48 && !c.norm_topk && c.L == 4);
    CHECK(c.mlp[0] == MLP_DENSE && c.mlp[1] == MLP_MOE && c.mlp[2] == MLP_DENSE && c.mlp[3] == MLP_MOE);
    const char *dir = TEST_TMP "/grpod_test_moe_cfg";
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", dir, dir);
    CHECK(system(cmd) == 0);
    CHECK(config_write(dir, &c) == 0);
    model_config r;
    CHECK_MSG(config_load(dir, &r) == 0, "%s", err_msg());
    CHECK(r.arch == ARCH_QWEN3_MOE && r.E == c.E && r.top_k == c.top_k && r.Fm == c.Fm && r.norm_topk == c.norm_topk &&
          r.router_logits == c.router_logits && r.aux_coef == c.aux_coef && !memcmp(r.mlp, c.mlp, (size_t)c.L));
    CHECK(config_n_params(&r) == config_n_params(&c));
}

int main(void) {
    RUN(moe_config_round_trip);
    RUN(moe_matches_transformers);
    RUN(moe_packed_equals_standard);
    RUN(moe_update_adds_the_balance_loss);
    RUN(moe_replay_own_routes_is_bit_equal);
    RUN(moe_replay_forces_other_routes);
    return CHECK_DONE();
}
