/* test_reference.c — the CPU backend against Hugging Face transformers (fp32, eager attention)
 * on the tiny random models in tests/fixtures/data (made by tests/fixtures/make_reference.py):
 * per-token logprobs at T = 1 and T = 0.7 (max |Δ| ≤ 1e-4, the DESIGN.md contract), and the
 * gradient of L = Σ w·logprob for every parameter (relative L2 ≤ 1e-4 per tensor). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/err.h"
#include "engine/engine.h"
#include "engine/format/json.h"
#include "engine/model/model.h"
#include "engine/format/safetensors.h"

#define FIX "tests/fixtures/data"

static const char *models[] = {"qwen2_bias", "qwen3", "qwen3_tied", "llama3", "qwen3_bf16", "llama3_sharded"};

/* Sequences of a reference.json as groups: prompt = first id, one response = the rest. */
typedef struct {
    int n;
    int **ids;
    int *len;
} seqs;

static int load_seqs(const js *arr, seqs *s) {
    s->n = arr->n;
    s->ids = calloc((size_t)arr->n, sizeof(int *));
    s->len = calloc((size_t)arr->n, sizeof(int));
    for (int i = 0; i < arr->n; i++) {
        const js *a = &arr->items[i];
        s->len[i] = a->n;
        s->ids[i] = malloc((size_t)a->n * sizeof(int));
        for (int j = 0; j < a->n; j++) s->ids[i][j] = (int)a->items[j].num;
    }
    return 0;
}
static void free_seqs(seqs *s) {
    for (int i = 0; i < s->n; i++) free(s->ids[i]);
    free(s->ids);
    free(s->len);
}

static double max_abs_diff_lp(eng *e, const seqs *s, const js *ref, float temp, char *why) {
    double worst = 0;
    for (int i = 0; i < s->n; i++) {
        const int *resp[1] = {s->ids[i] + 1};
        int R = s->len[i] - 1;
        eng_update_group g = {.prompt = s->ids[i], .P = 1, .n = 1, .resp = resp, .R = &R};
        float **lp;
        if (eng_logprobs(e, &g, 1, 0, temp, 1 << 20, &lp)) {
            snprintf(why, 256, "%s", err_msg());
            return 1e9;
        }
        const js *r = &ref->items[i];
        if (r->n != R) {
            snprintf(why, 256, "reference has %d logprobs for %d tokens", r->n, R);
            return 1e9;
        }
        for (int t = 0; t < R; t++) {
            double d = fabs(lp[0][t] - r->items[t].num);
            if (d > worst) worst = d;
        }
        eng_logprobs_free(lp, &g, 1);
    }
    return worst;
}

TEST(logprobs_match_transformers) {
    for (size_t m = 0; m < sizeof models / sizeof models[0]; m++) {
        char dir[256], path[300], why[256] = "";
        snprintf(dir, sizeof dir, FIX "/%s", models[m]);
        snprintf(path, sizeof path, "%s/reference.json", dir);
        js_doc *doc;
        const js *root;
        CHECK_MSG(js_parse_file(path, &doc, &root) == 0, "%s", err_msg());
        seqs s;
        load_seqs(js_get(root, "sequences"), &s);
        eng *e;
        eng_open_opts o = {.model_dir = dir, .backend = "cpu"};
        CHECK_MSG(eng_open(&o, &e) == 0, "%s: %s", models[m], err_msg());
        double d1 = max_abs_diff_lp(e, &s, js_get(root, "logprobs"), 1.0f, why);
        double d07 = max_abs_diff_lp(e, &s, js_get(js_get(root, "temperature_0.7"), "logprobs"), 0.7f, why);
        printf("  %-16s max |Δ logprob| T=1: %.2e  T=0.7: %.2e\n", models[m], d1, d07);
        eng_close(e);
        free_seqs(&s);
        js_doc_free(doc);
        CHECK_MSG(d1 <= 1e-4 && d07 <= 1e-4, "%s: max |Δ| %.3g / %.3g > 1e-4 %s", models[m], d1, d07, why);
    }
}

/* Gradient of L = Σ_seq Σ_t w_t logprob_t at T = 1, through model_backward on the cpu backend. */
TEST(gradients_match_autograd) {
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        char dir[256], path[300];
        snprintf(dir, sizeof dir, FIX "/%s", models[mi]);
        snprintf(path, sizeof path, "%s/reference.json", dir);
        js_doc *doc;
        const js *root;
        CHECK_MSG(js_parse_file(path, &doc, &root) == 0, "%s", err_msg());
        seqs s;
        load_seqs(js_get(root, "sequences"), &s);
        const js *wts = js_get(root, "loss_weights");
        model_config cfg;
        CHECK_MSG(config_load(dir, &cfg) == 0, "%s", err_msg());
        eng_backend *be;
        backend_cpu_create(&be, 0);
        model m;
        CHECK(model_init(&m, &cfg, be) == 0);
        float *w = malloc((size_t)m.n_elems * 4), *g = calloc((size_t)m.n_elems, 4);
        CHECK_MSG(model_load_host(&m, dir, w) == 0, "%s", err_msg());
        model_views wv, gv;
        model_views_make(&m, w, 4, &wv);
        model_views_make(&m, g, 4, &gv);
        /* All sequences in one packed micro-batch: each its own group of one response. */
        pack_group *pg = calloc((size_t)s.n, sizeof *pg);
        const int **resp = calloc((size_t)s.n, sizeof(int *));
        int *R = calloc((size_t)s.n, sizeof(int));
        for (int i = 0; i < s.n; i++) {
            resp[i] = s.ids[i] + 1;
            R[i] = s.len[i] - 1;
            pg[i] = (pack_group){.prompt = s.ids[i], .P = 1, .N = 1, .resp = &resp[i], .R = &R[i]};
        }
        pack_batch b;
        CHECK(pack_build(&b, pg, 0, s.n, PACK_PACKED) == 0);
        float *dl = malloc((size_t)b.M * 4);
        for (int i = 0, k = 0; i < s.n; i++)
            for (int t = 0; t < R[i]; t++) dl[k++] = (float)wts->items[i].items[t].num;
        model_acts a;
        CHECK(model_acts_init(&m, &a, b.T, b.M, 1) == 0);
        model_input in;
        model_input_from_batch(&in, &b);
        CHECK(model_forward(&m, &wv, &a, NULL, &in, 1.0f, 0) == 0);
        double L = 0;
        for (int k = 0; k < b.M; k++) L += (double)dl[k] * a.logp[k];
        CHECK(model_backward(&m, &wv, &gv, &a, &in, dl, NULL, 1.0f) == 0);
        double Lref = js_get_num(root, "loss", 0);
        st_set gs = {0};
        const char *gf = js_get_str(root, "grads_file"); /* llama3_sharded shares llama3's */
        snprintf(path, sizeof path, "%s/%s", dir, gf ? gf : "grads.safetensors");
        CHECK_MSG(st_open_file(&gs, path) == 0, "%s", err_msg());
        double worst = 0;
        const char *worst_name = "";
        for (int p = 0; p < m.n_params; p++) {
            const st_tensor *t = st_find(&gs, m.params[p].name);
            CHECK_MSG(t, "%s: no gradient for %s", models[mi], m.params[p].name);
            float *ref = malloc((size_t)t->numel * 4);
            CHECK(st_read_f32(t, ref, m.params[p].ndim, m.params[p].shape) == 0);
            double e = rel_l2(g + m.params[p].off, ref, (size_t)t->numel);
            if (e > worst) {
                worst = e;
                worst_name = m.params[p].name;
            }
            free(ref);
        }
        printf("  %-16s loss %.6f (ref %.6f), worst grad rel L2 %.2e (%s)\n", models[mi], L, Lref, worst, worst_name);
        CHECK_CLOSE(L, Lref, 1e-4, 1e-5);
        CHECK_MSG(worst <= 1e-4, "%s: gradient of %s rel L2 %.3g > 1e-4", models[mi], worst_name, worst);
        st_close(&gs);
        model_acts_free(&m, &a);
        pack_batch_free(&b);
        free(pg);
        free(resp);
        free(R);
        free(dl);
        free(w);
        free(g);
        model_views_free(&wv);
        model_views_free(&gv);
        model_free(&m);
        be->destroy(be);
        free_seqs(&s);
        js_doc_free(doc);
    }
}

/* A corrupt or truncated checkpoint is one clear error, never a crash. */
TEST(corrupt_safetensors_are_errors) {
    char cmd[512];
    const char *tmp = TEST_TMP "/grpod_test_corrupt";
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s && cp " FIX "/qwen3/config.json %s/", tmp, tmp, tmp);
    CHECK(system(cmd) == 0);
    FILE *src = fopen(FIX "/qwen3/model.safetensors", "rb");
    CHECK(src);
    fseek(src, 0, SEEK_END);
    long n = ftell(src);
    fseek(src, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n);
    CHECK(fread(buf, 1, (size_t)n, src) == (size_t)n);
    fclose(src);
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    struct {
        const char *what;
        long len;
        int patch;
        const char *expect;
    } cases[] = {
        {"truncated data", n - 100, 0, "outside"},
        {"truncated header", 20, 0, "header length"},
        {"bad header length", n, 1, "header length"},
        {"bad JSON", n, 2, "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char *b = malloc((size_t)n);
        memcpy(b, buf, (size_t)n);
        if (cases[i].patch == 1) b[6] = 0x7f; /* absurd length */
        if (cases[i].patch == 2) b[8] = '['; /* header no longer an object */
        FILE *f = fopen(path, "wb");
        fwrite(b, 1, (size_t)cases[i].len, f);
        fclose(f);
        free(b);
        eng *e = NULL;
        eng_open_opts o = {.model_dir = tmp, .backend = "cpu"};
        int rc = eng_open(&o, &e);
        CHECK_MSG(rc != 0 && !e, "%s: opened", cases[i].what);
        CHECK_MSG(strstr(err_msg(), cases[i].expect) && strstr(err_msg(), "model.safetensors"), "%s: message \"%s\" lacks \"%s\"",
                  cases[i].what, err_msg(), cases[i].expect);
    }
    free(buf);
}

int main(void) {
    RUN(logprobs_match_transformers);
    RUN(gradients_match_autograd);
    RUN(corrupt_safetensors_are_errors);
    return CHECK_DONE();
}
