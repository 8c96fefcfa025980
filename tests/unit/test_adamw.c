/* test_adamw.c — the optimizer step, gradient norm, clipping and lr schedule (kernels/adamw_cpu.c).
 *
 * adamw_cpu against a double-precision transcription of torch.optim.AdamW's documented
 * algorithm over 5 steps with weight decay; against PyTorch itself when
 * tests/fixtures/adamw_reference.json exists (made by tests/fixtures/make_adamw_reference.py on a
 * machine with torch; skipped with a note otherwise). Tolerances: fp32 element math against a
 * double reference drifts by a few ulp per step, so 1e-6 relative (plus 1e-9 absolute for
 * moments that start at 0). */
#include "tests/unit/check.h"

#include <omp.h>

#include "common/err.h"
#include "engine/format/json.h"
#include "engine/train/optim.h"
#include "kernels/adamw.h"

#define FIXTURE "tests/fixtures/adamw_reference.json"

/* torch.optim.AdamW, as its documentation writes the algorithm (amsgrad off), in double. */
static void adamw_ref(double *p, const double *g, double *m, double *v, long n, double lr, double b1, double b2, double eps,
                      double wd, int t) {
    for (long i = 0; i < n; i++) {
        p[i] -= lr * wd * p[i];
        m[i] = b1 * m[i] + (1 - b1) * g[i];
        v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
        double mh = m[i] / (1 - pow(b1, t)), vh = v[i] / (1 - pow(b2, t));
        p[i] -= lr * mh / (sqrt(vh) + eps);
    }
}

TEST(test_adamw_vs_double) {
    enum { N = 1001, STEPS = 5 };
    static float p[N], g[N], m[N], v[N];
    static double pd[N], gd[N], md[N], vd[N];
    check_fill(p, N, 1, 1.0f);
    for (int i = 0; i < N; i++) {
        pd[i] = p[i];
        m[i] = v[i] = 0;
        md[i] = vd[i] = 0;
    }
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f;
    /* the reference gets the decimals, as torch from Python */
    const double lr_d = 1e-2, b1_d = 0.9, b2_d = 0.999, eps_d = 1e-8, wd_d = 0.1;
    for (int t = 1; t <= STEPS; t++) {
        check_fill(g, N, 100 + t, 0.05f * t);
        for (int i = 0; i < N; i++) gd[i] = g[i];
        adamw_cpu(p, g, m, v, N, lr, b1, b2, eps, wd, t);
        adamw_ref(pd, gd, md, vd, N, lr_d, b1_d, b2_d, eps_d, wd_d, t);
        for (int i = 0; i < N; i++) {
            /* |p| <= 1: a few ulp of 1 absolute where p - lr * step cancels */
            CHECK_MSG(fabs(p[i] - pd[i]) <= 3e-7 + 1e-6 * fabs(pd[i]), "step %d p[%d] %.9g vs %.9g", t, i, p[i], pd[i]);
            /* m = m + (1 - b1)(g - m) cancels when m << g: an ulp of g, not of m */
            CHECK_MSG(fabs(m[i] - md[i]) <= 1e-7 * 0.05 * t + 1e-6 * fabs(md[i]), "step %d m[%d] %.9g vs %.9g", t, i, m[i], md[i]);
            CHECK_MSG(fabs(v[i] - vd[i]) <= 1e-12 + 1e-6 * fabs(vd[i]), "step %d v[%d] %.9g vs %.9g", t, i, v[i], vd[i]);
        }
    }
    /* the step moved the parameters by about lr each (Adam's normalised step), not by nothing */
    double moved = 0;
    for (int i = 0; i < N; i++) moved += fabs(pd[i]);
    CHECK(moved > 0);
}

/* Decoupled weight decay alone: zero gradient and moments leave p * (1 - lr wd). lr 0: nothing. */
TEST(test_weight_decay_only) {
    float p[4] = {1.0f, -2.0f, 0.5f, 3.0f}, g[4] = {0}, m[4] = {0}, v[4] = {0};
    adamw_cpu(p, g, m, v, 4, 0.1f, 0.9f, 0.999f, 1e-8f, 0.5f, 1);
    const float want[4] = {0.95f, -1.9f, 0.475f, 2.85f};
    for (int i = 0; i < 4; i++) CHECK_CLOSE(p[i], want[i], 0, 1e-7);
    float q[2] = {1.5f, -0.25f}, gq[2] = {0.3f, -0.7f}, mq[2] = {0}, vq[2] = {0};
    adamw_cpu(q, gq, mq, vq, 2, 0.0f, 0.9f, 0.999f, 1e-8f, 0.5f, 1);
    CHECK(q[0] == 1.5f && q[1] == -0.25f);
    CHECK_CLOSE(mq[0], 0.03, 0, 1e-6); /* the moments still move */
    CHECK_CLOSE(vq[1], 0.001 * (0.7f * 0.7f), 0, 1e-6); /* 1 - beta2 = 0.001, not 1 - 0.999f */
    CHECK(adamw_scalar(0.999f) == 0.999 && adamw_scalar(1e-8f) == 1e-8 && adamw_scalar(0.9f) == 0.9);
    CHECK(adamw_scalar(0.1f + 1e-9f) == (double)(0.1f + 1e-9f) || (float)adamw_scalar(0.1f + 1e-9f) == 0.1f + 1e-9f);
    /* first step, no decay: p moves by lr * g / (|g| + eps') = lr * sign(g) */
    float r[2] = {0.0f, 0.0f}, gr[2] = {0.25f, -4.0f}, mr[2] = {0}, vr[2] = {0};
    adamw_cpu(r, gr, mr, vr, 2, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1);
    CHECK_CLOSE(r[0], -1e-3, 1e-12, 1e-6);
    CHECK_CLOSE(r[1], 1e-3, 1e-12, 1e-6);
}

TEST(test_sumsq_scale) {
    enum { N = 100003 };
    static float x[N];
    check_fill(x, N, 7, 2.0f);
    double want = 0;
    for (int i = 0; i < N; i++) want += (double)x[i] * x[i];
    omp_set_num_threads(1);
    double s1 = sumsq_cpu(x, N);
    omp_set_num_threads(2);
    double s2 = sumsq_cpu(x, N);
    omp_set_num_threads(3);
    double s3 = sumsq_cpu(x, N);
    CHECK_CLOSE(s1, want, 0, 1e-12);
    CHECK_MSG(s1 == s2 && s2 == s3, "not deterministic across thread counts: %.17g %.17g %.17g", s1, s2, s3);
    CHECK(sumsq_cpu(x, 0) == 0.0);
    float y[3] = {3.0f, -4.0f, 12.0f};
    CHECK(sumsq_cpu(y, 3) == 169.0);
    scale_cpu(y, 3, 0.5f);
    CHECK(y[0] == 1.5f && y[1] == -2.0f && y[2] == 6.0f);
    /* clip_grad_norm_: min(1, max / (norm + 1e-6)); no clipping when max <= 0 */
    CHECK_CLOSE(grad_clip_coef(13.0, 1.0), 1.0 / (13.0 + 1e-6), 0, 1e-15);
    CHECK(grad_clip_coef(0.5, 1.0) == 1.0);
    CHECK(grad_clip_coef(100.0, 0.0) == 1.0);
}

/* The schedule's shape by hand; test_loss.c checks it step by step against verl's schedulers. */
TEST(test_lr_schedule) {
    /* warm-up: step k at lr (k - 1) / warmup, the first at 0, base from step warmup + 1 */
    CHECK(lr_schedule(1e-3f, 1, 4, 0, 10, 0.0f) == 0.0f);
    CHECK_CLOSE(lr_schedule(1e-3f, 2, 4, 0, 10, 0.0f), 0.25e-3, 0, 1e-6);
    CHECK_CLOSE(lr_schedule(1e-3f, 4, 4, 0, 10, 0.0f), 0.75e-3, 0, 1e-6);
    CHECK_CLOSE(lr_schedule(1e-3f, 5, 4, 0, 10, 0.0f), 1e-3, 0, 1e-6);
    CHECK_CLOSE(lr_schedule(1e-3f, 50, 4, 0, 10, 0.0f), 1e-3, 0, 1e-6);
    CHECK_CLOSE(lr_schedule(1e-3f, 1, 0, 0, 0, 0.0f), 1e-3, 0, 1e-6);
    /* cosine after 2 warm-up steps over total 10: progress (step - 3) / 8 */
    CHECK_CLOSE(lr_schedule(1e-3f, 2, 2, 1, 10, 0.1f), 0.5e-3, 0, 1e-6);
    CHECK_CLOSE(lr_schedule(1e-3f, 3, 2, 1, 10, 0.1f), 1e-3, 0, 1e-6);
    /* step 7: progress 0.5 -> 0.1 + 0.9 * 0.5 = 0.55 */
    CHECK_CLOSE(lr_schedule(1e-3f, 7, 2, 1, 10, 0.1f), 0.55e-3, 0, 1e-6);
    /* step 5: progress 0.25 -> 0.1 + 0.9 * 0.5 * (1 + cos(pi/4)) = 0.868198052... */
    CHECK_CLOSE(lr_schedule(1e-3f, 5, 2, 1, 10, 0.1f), 0.868198051533946e-3, 0, 1e-6);
    /* past the horizon: the floor */
    CHECK_CLOSE(lr_schedule(1e-3f, 11, 2, 1, 10, 0.1f), 0.1e-3, 0, 1e-6);
    CHECK_CLOSE(lr_schedule(1e-3f, 99, 2, 1, 10, 0.0f), 0.0, 1e-12, 0);
    /* no warm-up, total 1: the single step at base */
    CHECK_CLOSE(lr_schedule(1e-3f, 1, 0, 1, 1, 0.0f), 1e-3, 0, 1e-6);
}

/* ---------- the PyTorch fixture ---------- */

static int js_floats(const js *a, float *out, int n) {
    if (!a || a->type != JS_ARR || a->n != n) return -1;
    for (int i = 0; i < n; i++) out[i] = (float)js_num(&a->items[i], NAN);
    return 0;
}

TEST(test_torch_fixture) {
    js_doc *doc;
    const js *root;
    CHECK_MSG(js_parse_file(FIXTURE, &doc, &root) == 0, "%s", err_msg());
    CHECK_EQ_INT((int)js_get_num(root, "version", 0), 1);
    int n = (int)js_get_num(root, "n", 0), steps = (int)js_get_num(root, "steps", 0);
    CHECK(n > 0 && n <= 4096 && steps > 0);
    float lr = (float)js_get_num(root, "lr", 0), b1 = (float)js_get_num(root, "beta1", 0);
    float b2 = (float)js_get_num(root, "beta2", 0), eps = (float)js_get_num(root, "eps", 0);
    float wd = (float)js_get_num(root, "weight_decay", 0);
    double max_norm = js_get_num(root, "max_norm", 0);
    static float p[4096], g[4096], m[4096], v[4096], want[4096];
    CHECK(js_floats(js_get(root, "p0"), p, n) == 0);
    memset(m, 0, sizeof m);
    memset(v, 0, sizeof v);
    const js *grads = js_get(root, "grads"), *norms = js_get(root, "norms"), *cg = js_get(root, "clipped_grads");
    const js *ps = js_get(root, "params"), *ms = js_get(root, "exp_avg"), *vs = js_get(root, "exp_avg_sq");
    int clipped_steps = 0;
    for (int t = 1; t <= steps; t++) {
        CHECK(js_floats(&grads->items[t - 1], g, n) == 0);
        double norm = sqrt(sumsq_cpu(g, n));
        CHECK_CLOSE(norm, js_num(&norms->items[t - 1], -1), 0, 1e-6);
        double coef = grad_clip_coef(norm, max_norm);
        if (coef < 1) {
            scale_cpu(g, n, (float)coef);
            clipped_steps++;
        }
        CHECK(js_floats(&cg->items[t - 1], want, n) == 0);
        for (int i = 0; i < n; i++)
            CHECK_MSG(fabs(g[i] - want[i]) <= 1e-6 * fabs(want[i]) + 1e-12, "step %d clipped g[%d] %.9g vs torch %.9g", t, i,
                      g[i], want[i]);
        adamw_cpu(p, g, m, v, n, lr, b1, b2, eps, wd, t);
        const js *ref[3] = {&ps->items[t - 1], &ms->items[t - 1], &vs->items[t - 1]};
        float *got[3] = {p, m, v};
        const char *name[3] = {"param", "exp_avg", "exp_avg_sq"};
        /* absolute slack: exp_avg = m + (1 - b1)(g - m) cancels when m << g, so an ulp of the
         * gradient (torch's clip factor is an fp32 tensor, ours a double: 1 ulp apart) shows
         * there; params are O(1). */
        double gmax = 0;
        for (int i = 0; i < n; i++) gmax = fmax(gmax, fabs(g[i]));
        const double slack[3] = {2e-7, 2e-7 * gmax, 1e-12};
        for (int k = 0; k < 3; k++) {
            CHECK(js_floats(ref[k], want, n) == 0);
            for (int i = 0; i < n; i++)
                CHECK_MSG(fabs(got[k][i] - want[i]) <= 1e-6 * fabs(want[i]) + slack[k], "step %d %s[%d] %.9g vs torch %.9g", t,
                          name[k], i, got[k][i], want[i]);
        }
    }
    CHECK_MSG(clipped_steps > 0 && clipped_steps < steps, "the fixture should clip some steps, not all: %d", clipped_steps);
    printf("# torch fixture (%s): %d steps, %d clipped, params/moments within 1e-6\n",
           js_get_str(root, "torch") ? js_get_str(root, "torch") : "?", steps, clipped_steps);
    js_doc_free(doc);
}

int main(void) {
    RUN(test_adamw_vs_double);
    RUN(test_weight_decay_only);
    RUN(test_sumsq_scale);
    RUN(test_lr_schedule);
    FILE *f = fopen(FIXTURE, "r");
    if (f) {
        fclose(f);
        RUN(test_torch_fixture);
    } else {
        printf("# skip test_torch_fixture: %s not found; make it with "
               "python3 tests/fixtures/make_adamw_reference.py OUTDIR on a machine with torch\n",
               FIXTURE);
    }
    return CHECK_DONE();
}
