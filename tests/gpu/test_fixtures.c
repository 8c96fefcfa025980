/* test_fixtures.c — the CUDA backend against Hugging Face transformers on the committed tiny
 * random checkpoints (tests/fixtures/data, made by tests/fixtures/make_reference.py): the
 * engine opens each directory with --backend cuda (bf16 weights), scores the reference
 * sequences and back-propagates L = Σ w·logprob. Two comparisons per model:
 *   - against the CPU backend run on the same bf16-rounded weights: the error of bf16 compute
 *     alone. Logprobs ≤ 1e-2 (DESIGN.md's contract). Gradients ≤ 2e-2, not 1e-2: these
 *     fixtures' weights are 5-10x larger than an initialised or trained model's (std 0.1-0.2,
 *     chosen so that a wrong op shows in fp32), and bf16 activations and activation gradients
 *     lose proportionally more; measured 0.9-1.3e-2 on the H100 (2026-11-22), while
 *     tests/gpu/test_model.c's model at init scale holds 1e-2 with 5e-3.
 *   - against transformers' fp32 numbers (fp32 weights): logprobs ≤ 1e-2; gradients ≤ 3e-2,
 *     because rounding these fixtures' large random weights (std 0.1-0.2) to bf16 already
 *     moves the gradient by about 1e-2 before any kernel runs (the cpu-on-bf16-weights vs
 *     autograd row prints how much).
 * The Qwen3-MoE fixtures compare logprobs only: their routes were generated with top-k margins
 * of 5.6e-4 and 4e-3 (reference.json min_topk_gap), safe in fp32 but within bf16's noise, so a
 * token may go to another expert on the GPU and move that expert's gradient by the whole token
 * (measured on the H200: gradients 4.0e-2 and 2.5e-2 against the CPU, max |Δ logprob| 0.45 on the
 * first); their gradient errors are printed. tests/gpu/test_model.c checks MoE gradients on
 * routes that cannot flip; so do the Qwen3.5 MoE and Qwen3-Next fixtures (qwen3_5_moe_text,
 * qwen3_next, qwen3_next_b: logprob rows,
 * gradients printed; its logprobs against transformers are held to twice what rounding the weights
 * to bf16 alone moves them by, at least 1e-2: measured 1.28e-2 on the H200, a route flipped; the
 * Qwen3-Next ones 7.5e-3 and 1.12e-2, cuda vs cpu 6.4e-3 and 7.4e-3, H200 2026-11-28). The Qwen3.5 fixtures (gated DeltaNet and gated attention layers,
 * tests/fixtures/make_hybrid_reference.py) hold the logprob tolerances; their gradients move by
 * 5.4e-2 and 8.0e-2 when the weights alone are rounded to bf16 (the recurrence compounds the
 * large random weights' rounding: the "weight rounding alone" line), and bf16 activations cost
 * about as much again (measured on the H200, 2026-11-28: cuda vs cpu 4.9e-2 and 8.7e-2, vs
 * autograd 7.5e-2 and 1.2e-1). So their gradient rows are held to that measured rounding r:
 * cuda vs cpu <= 2r, cuda vs autograd <= 3r; tests/gpu/test_model.c holds a hybrid model at
 * init scale to the dense 1e-2.
 * Prints ROW lines for tests/gpu/run.sh. */
#include "tests/gpu/gpu_check.h"

#include "engine/engine.h"
#include "engine/format/json.h"
#include "engine/model/model.h"
#include "engine/format/safetensors.h"

#define FIX "tests/fixtures/data"

static const char *models[] = {"qwen2_bias",       "qwen3",      "qwen3_tied",      "llama3",       "qwen3_bf16",
                               "llama3_sharded",   "qwen3_moe",  "qwen3_moe_step2", "qwen3_5_text", "qwen3_5_text_b",
                               "qwen3_5_moe_text", "qwen3_next", "qwen3_next_b"};

/* logprobs (M) and gradients (n) of L on backend b with weights host (fp32 values). */
static int run_on(eng_backend *b, const model_config *cfg, const float *host, const pack_batch *pb, const float *dl, float *lp,
                  float *grad) {
    model m;
    if (model_init(&m, cfg, b)) return -1;
    size_t n = (size_t)m.n_elems, eb = (size_t)b->act_bytes;
    void *w = b->alloc(b, n * eb);
    float *g = b->alloc(b, n * 4);
    if (!w || !g || b->act_from_f32(b, w, host, n)) return -1;
    b->zero(b, g, n * 4);
    model_views wv, gv;
    model_views_make(&m, w, eb, &wv);
    model_views_make(&m, g, 4, &gv);
    model_acts a;
    model_input in;
    model_input_from_batch(&in, pb);
    int rc = model_acts_init(&m, &a, pb->T, pb->M, 1);
    if (!rc) rc = model_forward(&m, &wv, &a, NULL, &in, 1.0f, 0);
    if (!rc) rc = b->to_host(b, lp, a.logp, (size_t)pb->M * 4);
    if (!rc) rc = model_backward(&m, &wv, &gv, &a, &in, dl, NULL, 1.0f);
    if (!rc) rc = b->to_host(b, grad, g, n * 4);
    model_acts_free(&m, &a);
    b->free(b, w);
    b->free(b, g);
    model_views_free(&wv);
    model_views_free(&gv);
    model_free(&m);
    return rc;
}

int main(void) {
    eng_backend *be, *cpu;
    if (backend_cuda_create(&be, 0)) {
        printf("FATAL cuda: %s\n", err_msg());
        return 2;
    }
    backend_cpu_create(&cpu, 0);
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        char dir[256], path[512];
        snprintf(dir, sizeof dir, FIX "/%s", models[mi]);
        snprintf(path, sizeof path, "%s/reference.json", dir);
        js_doc *doc;
        const js *root;
        if (js_parse_file(path, &doc, &root)) {
            printf("FATAL %s\n", err_msg());
            return 2;
        }
        const js *seqs = js_get(root, "sequences"), *ref = js_get(root, "logprobs"), *wts = js_get(root, "loss_weights");
        model_config cfg;
        model m;
        if (config_load(dir, &cfg) || model_init(&m, &cfg, be)) {
            printf("FATAL %s\n", err_msg());
            return 2;
        }
        size_t n = (size_t)m.n_elems;
        float *host = malloc(n * 4), *grad = malloc(n * 4);
        if (model_load_host(&m, dir, host)) {
            printf("FATAL %s\n", err_msg());
            return 2;
        }
        void *w = gc_act(be, host, n);
        float *g = be->alloc(be, n * 4);
        be->zero(be, g, n * 4);
        model_views wv, gv;
        model_views_make(&m, w, 2, &wv);
        model_views_make(&m, g, 4, &gv);
        /* every sequence its own group (prompt = first id), one packed micro-batch */
        int S = seqs->n;
        pack_group *pg = calloc((size_t)S, sizeof *pg);
        int **ids = calloc((size_t)S, sizeof(int *)), *R = calloc((size_t)S, sizeof(int));
        const int **resp = calloc((size_t)S, sizeof(int *));
        long long M = 0;
        for (int i = 0; i < S; i++) {
            const js *a = &seqs->items[i];
            ids[i] = malloc((size_t)a->n * sizeof(int));
            for (int j = 0; j < a->n; j++) ids[i][j] = (int)a->items[j].num;
            resp[i] = ids[i] + 1;
            R[i] = a->n - 1;
            M += R[i];
            pg[i] = (pack_group){.prompt = ids[i], .P = 1, .N = 1, .resp = &resp[i], .R = &R[i]};
        }
        pack_batch b;
        pack_build(&b, pg, 0, S, PACK_PACKED);
        float *lp = malloc((size_t)M * 4), *lref = malloc((size_t)M * 4), *dl = malloc((size_t)M * 4);
        for (int i = 0, k = 0; i < S; i++)
            for (int t = 0; t < R[i]; t++, k++) {
                lref[k] = (float)ref->items[i].items[t].num;
                dl[k] = (float)wts->items[i].items[t].num;
            }
        model_acts a;
        model_input in;
        model_input_from_batch(&in, &b);
        int rc = model_acts_init(&m, &a, b.T, b.M, 1);
        if (!rc) rc = model_forward(&m, &wv, &a, NULL, &in, 1.0f, 0);
        if (!rc) rc = be->to_host(be, lp, a.logp, (size_t)M * 4);
        if (!rc) rc = model_backward(&m, &wv, &gv, &a, &in, dl, NULL, 1.0f);
        if (!rc) rc = be->to_host(be, grad, g, n * 4);
        char shape[96];
        snprintf(shape, sizeof shape, "%s D=%d M=%lld", models[mi], cfg.D, M);
        if (rc) {
            printf("ROW|hf fixture %s|%s|nan|1e-02|FAIL\n", models[mi], err_msg());
            err_clear();
            continue;
        }
        /* the CPU backend on the same bf16-rounded weights */
        float *hb = malloc(n * 4), *lp_c = malloc((size_t)M * 4), *g_c = malloc(n * 4);
        for (size_t i = 0; i < n; i++) hb[i] = gc_bf16(host[i]);
        if (run_on(cpu, &cfg, hb, &b, dl, lp_c, g_c)) {
            printf("FATAL cpu: %s\n", err_msg());
            return 2;
        }
        gc_row("hf model logprobs cuda vs cpu (bf16 w)", shape, rel_l2(lp, lp_c, (size_t)M), 1e-2);
        int flips = config_n_moe(&cfg) > 0; /* routes may differ (the header says why): printed */
        double worst = 0;
        for (long long k = 0; k < M; k++) worst = fmax(worst, fabs(lp[k] - lref[k]));
        /* a hybrid MoE's weights rounded to bf16 already flip routes: held to twice what the rounding
         * alone moves them by (the cpu on bf16 weights vs transformers), at least 1e-2 */
        double lp_rounding = rel_l2(lp_c, lref, (size_t)M);
        printf("# %s logprobs: cpu on bf16 weights vs transformers %.3e (weight rounding alone)\n", models[mi], lp_rounding);
        gc_row("hf logprobs cuda vs transformers", shape, rel_l2(lp, lref, (size_t)M),
               flips && cfg.arch == ARCH_QWEN3_5 ? fmax(1e-2, 2 * lp_rounding) : 1e-2);
        printf("# %s max |dlogprob| cuda vs transformers %.3e\n", models[mi], worst);
        /* gradients against autograd, all parameters together */
        const char *gf = js_get_str(root, "grads_file");
        snprintf(path, sizeof path, "%s/%s", dir, gf ? gf : "grads.safetensors");
        st_set gs = {0};
        if (st_open_file(&gs, path)) {
            printf("FATAL %s\n", err_msg());
            return 2;
        }
        float *gref = calloc(n, 4), *tmp = malloc(n * 4);
        for (int p = 0; p < m.n_params; p++) { /* a fused qwen3_next projection: into the buffers' rows */
            const model_param *pp = &m.params[p];
            const st_tensor *t = st_find(&gs, pp->name);
            if (t && !st_read_f32(t, tmp, pp->ndim, pp->shape)) model_param_reorder(&m, pp, tmp, gref + pp->off, 0);
        }
        free(tmp);
        double rounding = rel_l2(g_c, gref, n);
        printf("# %s gradients: cpu on bf16 weights vs autograd %.3e (weight rounding alone)\n", models[mi], rounding);
        int hybrid = cfg.arch == ARCH_QWEN3_5; /* tolerances scaled by the rounding (the header says why) */
        if (flips) {
            printf("# %s gradients cuda vs cpu (bf16 w) %.3e\n", models[mi], rel_l2(grad, g_c, n));
            printf("# %s gradients cuda vs autograd %.3e\n", models[mi], rel_l2(grad, gref, n));
        } else {
            gc_row("hf model gradients cuda vs cpu (bf16 w)", shape, rel_l2(grad, g_c, n), hybrid ? 2 * rounding : 2e-2);
            gc_row("hf gradients cuda vs autograd", shape, rel_l2(grad, gref, n), hybrid ? 3 * rounding : 3e-2);
        }
        free(hb);
        free(lp_c);
        free(g_c);
        st_close(&gs);
        free(gref);
        model_acts_free(&m, &a);
        pack_batch_free(&b);
        be->free(be, w);
        be->free(be, g);
        model_views_free(&wv);
        model_views_free(&gv);
        model_free(&m);
        for (int i = 0; i < S; i++) free(ids[i]);
        free(ids);
        free(R);
        free(resp);
        free(pg);
        free(lp);
        free(lref);
        free(dl);
        free(host);
        free(grad);
        js_doc_free(doc);
    }
    be->destroy(be);
    cpu->destroy(cpu);
    return gc_failures ? 1 : 0;
}
