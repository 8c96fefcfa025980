/* test_backward.c — every CPU op's backward against central finite differences of its own
 * forward, and the whole model's parameter gradient likewise.
 *
 * For L = Σ w ⊙ f(x) with random w, the directional derivative along a random direction u is
 * estimated by central differences with Richardson extrapolation,
 *   D = (4 D(h/2) - D(h)) / 3,  D(h) = (L(x + h u) - L(x - h u)) / 2h,
 * whose truncation error is O(h^4), and compared with <grad, u> from the backward. Three random
 * directions per input; inputs random, never zero.
 * Tolerance FD_TOL = 1e-3 relative, not 1e-4: the forward runs in fp32, and its rounding puts a
 * floor of about 1e-4 under any finite difference (measured: the attention gradient moves
 * between 1e-4 and 7e-4 as h goes from 6e-2 to 1e-2, while a double-precision build of the
 * same attention code agrees with finite differences to 2e-10). The fp32 gradients are held
 * to 1e-4 against PyTorch autograd in test_reference.c. LoRA adapters (engine/model/lora.h) are
 * checked the same way, with the base's gradient through them. */
#define FD_TOL 1e-3
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "common/err.h"
#include "engine/model/lora.h"
#include "engine/model/model.h"
#include "engine/model/pack.h"
#include "kernels/attention.h"
#include "kernels/logprob.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

/* An op under test: computes L = Σ w·f(inputs) for the current inputs. */
typedef double (*loss_fn)(void *ctx);

/* Checks <grad, u> against finite differences of fn along u for the buffer x (n). */
static double fd_rel_err(loss_fn fn, void *ctx, float *x, const float *grad, long long n, unsigned long long seed) {
    double worst = 0;
    float *x0 = malloc((size_t)n * 4), *u = malloc((size_t)n * 4);
    memcpy(x0, x, (size_t)n * 4);
    for (int dir = 0; dir < 3; dir++) {
        check_fill(u, (size_t)n, seed * 31 + dir, 1.0f);
        double an = 0;
        for (long long i = 0; i < n; i++) an += (double)grad[i] * u[i];
        double D[2];
        for (int k = 0; k < 2; k++) {
            double h = k ? 5e-3 : 1e-2, Lp, Lm;
            for (long long i = 0; i < n; i++) x[i] = x0[i] + (float)h * u[i];
            Lp = fn(ctx);
            for (long long i = 0; i < n; i++) x[i] = x0[i] - (float)h * u[i];
            Lm = fn(ctx);
            D[k] = (Lp - Lm) / (2 * h);
        }
        memcpy(x, x0, (size_t)n * 4);
        double fd = (4 * D[1] - D[0]) / 3;
        double err = fabs(fd - an) / (fabs(an) > 1e-6 ? fabs(an) : 1e-6);
        if (err > worst) worst = err;
    }
    free(x0);
    free(u);
    return worst;
}

static double wsum(const float *w, const float *y, long long n) {
    double s = 0;
    for (long long i = 0; i < n; i++) s += (double)w[i] * y[i];
    return s;
}

/* ---------------------------------------------------------------- rmsnorm */

typedef struct {
    float *x, *w, *y, *r, *wy;
    int T, C;
} rms_ctx;
static double rms_loss(void *p) {
    rms_ctx *c = p;
    rmsnorm_fwd_cpu(c->y, c->r, c->x, c->w, c->T, c->C, 1e-6f);
    return wsum(c->wy, c->y, (long long)c->T * c->C);
}
TEST(rmsnorm_backward) {
    int T = 5, C = 24;
    rms_ctx c = {malloc(T * C * 4), malloc(C * 4), malloc(T * C * 4), malloc(T * 4), malloc(T * C * 4), T, C};
    check_fill(c.x, T * C, 1, 1.0f);
    check_fill(c.w, C, 2, 1.0f);
    check_fill(c.wy, T * C, 3, 1.0f);
    float *dx = calloc(T * C, 4), *dw = calloc(C, 4);
    rms_loss(&c);
    rmsnorm_bwd_cpu(dx, dw, c.wy, c.x, c.w, c.r, T, C);
    double ex = fd_rel_err(rms_loss, &c, c.x, dx, T * C, 4), ew = fd_rel_err(rms_loss, &c, c.w, dw, C, 5);
    printf("  rmsnorm: dx %.2e dw %.2e\n", ex, ew);
    CHECK_MSG(ex < FD_TOL && ew < FD_TOL, "rel err dx %.3g dw %.3g", ex, ew);
    free(c.x);
    free(c.w);
    free(c.y);
    free(c.r);
    free(c.wy);
    free(dx);
    free(dw);
}

/* ---------------------------------------------------------------- matmul */

typedef struct {
    float *x, *w, *b, *y, *wy;
    int T, I, O;
} mm_ctx;
static double mm_loss(void *p) {
    mm_ctx *c = p;
    matmul_fwd_cpu(c->y, c->x, c->w, c->b, c->T, c->I, c->O);
    return wsum(c->wy, c->y, (long long)c->T * c->O);
}
TEST(matmul_backward) {
    int T = 7, I = 19, O = 13; /* not multiples of the 4x4 tiles */
    mm_ctx c = {malloc(T * I * 4), malloc(O * I * 4), malloc(O * 4), malloc(T * O * 4), malloc(T * O * 4), T, I, O};
    check_fill(c.x, T * I, 6, 1.0f);
    check_fill(c.w, O * I, 7, 0.5f);
    check_fill(c.b, O, 8, 0.5f);
    check_fill(c.wy, T * O, 9, 1.0f);
    float *dx = calloc(T * I, 4), *dw = calloc(O * I, 4), *db = calloc(O, 4);
    matmul_bwd_cpu(dx, dw, db, c.wy, c.x, c.w, T, I, O);
    double ex = fd_rel_err(mm_loss, &c, c.x, dx, T * I, 10), ew = fd_rel_err(mm_loss, &c, c.w, dw, O * I, 11),
           eb = fd_rel_err(mm_loss, &c, c.b, db, O, 12);
    printf("  matmul: dx %.2e dw %.2e db %.2e\n", ex, ew, eb);
    CHECK_MSG(ex < FD_TOL && ew < FD_TOL && eb < FD_TOL, "rel err %.3g %.3g %.3g", ex, ew, eb);
    free(c.x);
    free(c.w);
    free(c.b);
    free(c.y);
    free(c.wy);
    free(dx);
    free(dw);
    free(db);
}

/* ---------------------------------------------------------------- rope */

typedef struct {
    float *x, *y, *wy, *f;
    int *pos;
    int T, H, D;
} rope_ctx;
static double rope_loss(void *p) {
    rope_ctx *c = p;
    long long n = (long long)c->T * c->H * c->D;
    memcpy(c->y, c->x, (size_t)n * 4);
    rope_fwd_cpu(c->y, c->pos, c->f, c->T, c->H, c->D);
    return wsum(c->wy, c->y, n);
}
TEST(rope_backward) {
    int T = 6, H = 3, D = 16, n = T * H * D;
    rope_ctx c = {malloc(n * 4), malloc(n * 4), malloc(n * 4), malloc(D / 2 * 4), malloc(T * 4), T, H, D};
    int pos[6] = {0, 1, 2, 7, 7, 130};
    memcpy(c.pos, pos, sizeof pos);
    rope_inv_freq(c.f, D, 500000.0f, 8.0f, 1.0f, 4.0f, 64);
    check_fill(c.x, n, 13, 1.0f);
    check_fill(c.wy, n, 14, 1.0f);
    float *dx = malloc(n * 4);
    memcpy(dx, c.wy, n * 4);
    rope_bwd_cpu(dx, c.pos, c.f, T, H, D);
    double e = fd_rel_err(rope_loss, &c, c.x, dx, n, 15);
    printf("  rope: dx %.2e\n", e);
    CHECK_MSG(e < FD_TOL, "rel err %.3g", e);
    free(c.x);
    free(c.y);
    free(c.wy);
    free(c.f);
    free(c.pos);
    free(dx);
}

/* ---------------------------------------------------------------- attention (two ranges) */

typedef struct {
    float *q, *k, *v, *o, *lse, *wy;
    attn_ranges r;
    int T, H, K, D;
} att_ctx;
static double att_loss(void *p) {
    att_ctx *c = p;
    attention_fwd_cpu(c->o, c->lse, c->q, c->k, c->v, c->r, c->T, c->H, c->K, c->D);
    return wsum(c->wy, c->o, (long long)c->T * c->H * c->D);
}
TEST(attention_backward_shared_prefix) {
    /* One group: prompt of 3, responses of 2 and 3, packed [P; R1; R2]. */
    static const int P = 3;
    const int grp[2] = {2, 3};
    int T = P + grp[0] + grp[1], H = 4, K = 2, D = 8;
    int *a0 = malloc(T * 4), *a1 = malloc(T * 4), *b0 = malloc(T * 4), *b1 = malloc(T * 4);
    for (int i = 0; i < P; i++) {
        a0[i] = 0;
        a1[i] = i + 1;
        b0[i] = b1[i] = 0;
    }
    for (int s = 0, t = P; s < 2; s++) {
        int s0 = t;
        for (int j = 0; j < grp[s]; j++, t++) {
            a0[t] = 0;
            a1[t] = P;
            b0[t] = s0;
            b1[t] = s0 + j + 1;
        }
    }
    int nq = T * H * D, nk = T * K * D;
    att_ctx c = {malloc(nq * 4),
                 malloc(nk * 4),
                 malloc(nk * 4),
                 malloc(nq * 4),
                 malloc(T * H * 4),
                 malloc(nq * 4),
                 {a0, a1, b0, b1, NULL, NULL, 0},
                 T,
                 H,
                 K,
                 D};
    check_fill(c.q, nq, 16, 1.0f);
    check_fill(c.k, nk, 17, 1.0f);
    check_fill(c.v, nk, 18, 1.0f);
    check_fill(c.wy, nq, 19, 1.0f);
    att_loss(&c);
    float *dq = calloc(nq, 4), *dk = calloc(nk, 4), *dv = calloc(nk, 4);
    attention_bwd_cpu(dq, dk, dv, c.wy, c.q, c.k, c.v, c.o, c.lse, c.r, T, H, K, D);
    double eq = fd_rel_err(att_loss, &c, c.q, dq, nq, 20), ek = fd_rel_err(att_loss, &c, c.k, dk, nk, 21),
           ev = fd_rel_err(att_loss, &c, c.v, dv, nk, 22);
    printf("  attention: dq %.2e dk %.2e dv %.2e\n", eq, ek, ev);
    CHECK_MSG(eq < FD_TOL && ek < FD_TOL && ev < FD_TOL, "rel err %.3g %.3g %.3g", eq, ek, ev);
    free(c.q);
    free(c.k);
    free(c.v);
    free(c.o);
    free(c.lse);
    free(c.wy);
    free(a0);
    free(a1);
    free(b0);
    free(b1);
    free(dq);
    free(dk);
    free(dv);
}

/* ---------------------------------------------------------------- swiglu */

typedef struct {
    float *g, *u, *y, *wy;
    long long n;
} swi_ctx;
static double swi_loss(void *p) {
    swi_ctx *c = p;
    swiglu_fwd_cpu(c->y, c->g, c->u, c->n);
    return wsum(c->wy, c->y, c->n);
}
TEST(swiglu_backward) {
    long long n = 50;
    swi_ctx c = {malloc(n * 4), malloc(n * 4), malloc(n * 4), malloc(n * 4), n};
    check_fill(c.g, n, 23, 3.0f);
    check_fill(c.u, n, 24, 1.0f);
    check_fill(c.wy, n, 25, 1.0f);
    float *dg = malloc(n * 4), *du = malloc(n * 4);
    swiglu_bwd_cpu(dg, du, c.wy, c.g, c.u, n);
    double eg = fd_rel_err(swi_loss, &c, c.g, dg, n, 26), eu = fd_rel_err(swi_loss, &c, c.u, du, n, 27);
    printf("  swiglu: dgate %.2e dup %.2e\n", eg, eu);
    CHECK_MSG(eg < FD_TOL && eu < FD_TOL, "rel err %.3g %.3g", eg, eu);
    free(c.g);
    free(c.u);
    free(c.y);
    free(c.wy);
    free(dg);
    free(du);
}

/* ---------------------------------------------------------------- logprob head (+ entropy) */

typedef struct {
    float *h, *w, *lp, *ent, *wl, *we;
    int *pos, *tok;
    int M, C, V;
    float temp;
} lp_ctx;
static double lp_loss(void *p) {
    lp_ctx *c = p;
    logprob_fwd_cpu(c->lp, c->ent, c->h, c->pos, c->tok, c->w, c->M, c->C, c->V, c->temp);
    return wsum(c->wl, c->lp, c->M) + wsum(c->we, c->ent, c->M);
}
TEST(logprob_head_backward) {
    int T = 6, M = 5, C = 12, V = 37;
    int pos[5] = {0, 2, 3, 3, 5}, tok[5] = {1, 36, 0, 7, 7}; /* a row feeding two predictions */
    lp_ctx c = {malloc(T * C * 4),
                malloc(V * C * 4),
                malloc(M * 4),
                malloc(M * 4),
                malloc(M * 4),
                malloc(M * 4),
                pos,
                tok,
                M,
                C,
                V,
                0.7f};
    check_fill(c.h, T * C, 28, 1.0f);
    check_fill(c.w, V * C, 29, 0.5f);
    check_fill(c.wl, M, 30, 1.0f);
    check_fill(c.we, M, 31, 1.0f);
    float *dh = calloc(T * C, 4), *dw = calloc(V * C, 4);
    logprob_bwd_cpu(dh, dw, c.wl, c.we, c.h, pos, tok, c.w, M, C, V, c.temp);
    double eh = fd_rel_err(lp_loss, &c, c.h, dh, T * C, 32), ew = fd_rel_err(lp_loss, &c, c.w, dw, V * C, 33);
    printf("  logprob head: dh %.2e dW %.2e\n", eh, ew);
    CHECK_MSG(eh < FD_TOL && ew < FD_TOL, "rel err %.3g %.3g", eh, ew);
    free(c.h);
    free(c.w);
    free(c.lp);
    free(c.ent);
    free(c.wl);
    free(c.we);
    free(dh);
    free(dw);
}

/* logprob_top lists every id (K > V: -1 after them) in the order (logprob desc, id asc), each
 * with exactly the logprob logprob_fwd reports for it as the target: no tolerance, the same
 * row logits and logsumexp. */
TEST(logprob_top_lists_fwd_logprobs) {
    enum { T = 4, M = 3, C = 8, V = 11, K = V + 2 };
    int pos[M] = {0, 3, 3}, ids[M * K], tok[M];
    float h[T * C], w[V * C], lps[M * K], lp[M];
    check_fill(h, T * C, 41, 1.0f);
    check_fill(w, V * C, 42, 0.5f);
    memcpy(w + 5 * C, w + 2 * C, C * sizeof(float)); /* ids 2 and 5 tie: 2 comes first */
    logprob_top_cpu(ids, lps, h, pos, w, M, C, V, 0.7f, K);
    for (int k = 0; k < V; k++) {
        for (int m = 0; m < M; m++) tok[m] = ids[m * K + k];
        logprob_fwd_cpu(lp, NULL, h, pos, tok, w, M, C, V, 0.7f);
        for (int m = 0; m < M; m++) {
            CHECK(tok[m] >= 0 && lp[m] == lps[m * K + k]);
            if (k)
                CHECK(lps[m * K + k - 1] > lps[m * K + k] || (lps[m * K + k - 1] == lps[m * K + k] && ids[m * K + k - 1] < tok[m]));
            if (tok[m] == 5) CHECK(ids[m * K + k - 1] == 2);
        }
    }
    for (int m = 0; m < M; m++) CHECK(ids[m * K + V] == -1 && ids[m * K + V + 1] == -1);
}

/* ---------------------------------------------------------------- the whole model */

static model_config tiny(model_arch arch) {
    model_config c = {.arch = arch,
                      .L = 2,
                      .C = 32,
                      .H = 4,
                      .K = 2,
                      .D = 12,
                      .F = 48,
                      .V = 41,
                      .max_pos = 512,
                      .eps = 1e-6f,
                      .rope_theta = 10000.0f,
                      .bos_id = -1};
    snprintf(c.arch_name, sizeof c.arch_name, "%s", arch == ARCH_QWEN2 ? "qwen2" : arch == ARCH_QWEN3 ? "qwen3" : "llama");
    c.qkv_bias = arch == ARCH_QWEN2;
    c.qk_norm = arch == ARCH_QWEN3;
    c.tied = arch == ARCH_QWEN3;
    if (arch == ARCH_LLAMA) {
        c.rope_factor = 8;
        c.rope_low = 1;
        c.rope_high = 4;
        c.rope_orig_max = 8;
    }
    return c;
}

/* two groups: P=3 with N=2, P=2 with N=1 */
static void two_groups(pack_group pg[2]) {
    static int p0[3] = {1, 5, 9}, p1[2] = {40, 3}, r00[2] = {7, 8}, r01[3] = {2, 2, 30}, r10[2] = {11, 0};
    static const int *rs0[2] = {r00, r01}, *rs1[1] = {r10};
    static int R0[2] = {2, 3}, R1[1] = {2};
    pg[0] = (pack_group){.prompt = p0, .P = 3, .N = 2, .resp = rs0, .R = R0};
    pg[1] = (pack_group){.prompt = p1, .P = 2, .N = 1, .resp = rs1, .R = R1};
}

typedef struct {
    model *m;
    model_views *wv;
    model_acts *a;
    model_input *in;
    float *wl;
} full_ctx;
static double full_loss(void *p) {
    full_ctx *c = p;
    model_forward(c->m, c->wv, c->a, NULL, c->in, 0.9f, 0);
    return wsum(c->wl, c->a->logp, c->in->M);
}

TEST(model_backward_all_architectures) {
    for (int arch = 0; arch < 3; arch++) {
        model_config cfg = tiny((model_arch)arch);
        eng_backend *be;
        backend_cpu_create(&be, 0);
        model m;
        CHECK(model_init(&m, &cfg, be) == 0);
        float *w = malloc((size_t)m.n_elems * 4), *g = calloc((size_t)m.n_elems, 4);
        check_fill(w, (size_t)m.n_elems, 40 + arch, 0.3f);
        for (int i = 0; i < m.n_params; i++) /* norm weights near 1 */
            if (m.params[i].ndim == 1 && strstr(m.params[i].name, "norm"))
                for (long long j = 0; j < m.params[i].numel; j++) w[m.params[i].off + j] += 1.0f;
        model_views wv, gv;
        model_views_make(&m, w, 4, &wv);
        model_views_make(&m, g, 4, &gv);
        pack_group pg[2];
        two_groups(pg);
        pack_batch b;
        CHECK(pack_build(&b, pg, 0, 2, PACK_PACKED) == 0);
        model_acts a;
        CHECK(model_acts_init(&m, &a, b.T, b.M, 1) == 0);
        model_input in;
        model_input_from_batch(&in, &b);
        float *wl = malloc((size_t)b.M * 4);
        check_fill(wl, (size_t)b.M, 50 + arch, 1.0f);
        full_ctx c = {&m, &wv, &a, &in, wl};
        full_loss(&c);
        CHECK(model_backward(&m, &wv, &gv, &a, &in, wl, NULL, 0.9f) == 0);
        double e = fd_rel_err(full_loss, &c, w, g, m.n_elems, 60 + arch);
        printf("  full model %s: d params %.2e\n", cfg.arch_name, e);
        CHECK_MSG(e < FD_TOL, "%s: rel err %.3g", cfg.arch_name, e);
        model_acts_free(&m, &a);
        pack_batch_free(&b);
        model_views_free(&wv);
        model_views_free(&gv);
        model_free(&m);
        be->destroy(be);
        free(w);
        free(g);
        free(wl);
    }
}

/* d adapters and d base (the input gradients through the adapters reach the base's weights
 * below them) against finite differences; then the frozen-base views (lora_grad_views) give
 * the same adapter gradients with no base gradient at all. */
TEST(lora_adapter_backward) {
    for (int arch = 0; arch < 3; arch++) {
        model_config cfg = tiny((model_arch)arch);
        eng_backend *be;
        backend_cpu_create(&be, 0);
        model mm, *m = &mm;
        CHECK(model_init(m, &cfg, be) == 0 && lora_init(m, 3, 6.0f, (1u << LORA_N) - 1) == 0);
        float *w = malloc((size_t)m->n_elems * 4), *lw = malloc((size_t)m->l_elems * 4);
        check_fill(w, (size_t)m->n_elems, 70 + arch, 0.3f);
        for (int i = 0; i < m->n_params; i++) /* norm weights near 1 */
            if (m->params[i].ndim == 1 && strstr(m->params[i].name, "norm"))
                for (long long j = 0; j < m->params[i].numel; j++) w[m->params[i].off + j] += 1.0f;
        check_fill(lw, (size_t)m->l_elems, 77 + arch, 0.2f); /* B nonzero */
        model_views wv;
        model_views_make(m, w, 4, &wv);
        lora_views(m, lw, 4, &wv);
        pack_group pg[2];
        two_groups(pg);
        pack_batch b;
        CHECK(pack_build(&b, pg, 0, 2, PACK_PACKED) == 0);
        model_acts a;
        CHECK(model_acts_init(m, &a, b.T, b.M, 1) == 0);
        model_input in;
        model_input_from_batch(&in, &b);
        float *wl = malloc((size_t)b.M * 4), *g = calloc((size_t)m->n_elems, 4), *lg = calloc((size_t)m->l_elems, 4);
        float *lg2 = calloc((size_t)m->l_elems, 4), sink[64];
        check_fill(wl, (size_t)b.M, 80 + arch, 1.0f);
        model_views gv, fv;
        model_views_make(m, g, 4, &gv);
        lora_views(m, lg, 4, &gv);
        full_ctx c = {m, &wv, &a, &in, wl};
        full_loss(&c);
        CHECK(model_backward(m, &wv, &gv, &a, &in, wl, NULL, 0.9f) == 0);
        double ea = fd_rel_err(full_loss, &c, lw, lg, m->l_elems, 90 + arch);
        double ew = fd_rel_err(full_loss, &c, w, g, m->n_elems, 95 + arch);
        printf("  %s: d adapters %.2e, d base %.2e\n", m->cfg.arch_name, ea, ew);
        CHECK_MSG(ea < FD_TOL && ew < FD_TOL, "%s: rel err %.3g %.3g", m->cfg.arch_name, ea, ew);
        CHECK(lora_grad_views(m, lg2, sink, &fv) == 0);
        full_loss(&c);
        CHECK(model_backward(m, &wv, &fv, &a, &in, wl, NULL, 0.9f) == 0);
        double e2 = rel_l2(lg2, lg, (size_t)m->l_elems);
        CHECK_MSG(e2 < 1e-6, "frozen-base adapter gradients differ: rel L2 %.3g", e2);
        model_views_free(&gv);
        model_views_free(&fv);
        model_acts_free(m, &a);
        pack_batch_free(&b);
        model_views_free(&wv);
        model_free(m);
        be->destroy(be);
        free(wl);
        free(g);
        free(lg);
        free(lg2);
        free(w);
        free(lw);
    }
}

/* Activations by budget (model.h): checkpointed layers keep only their input and the backward
 * recomputes the rest with the same kernels, so gradients and logprobs are bit-equal to those
 * of the full set, whatever the number of checkpointed layers; the budget picks the fewest that
 * fit, and a budget below "all checkpointed" is GE_NOMEM. */
TEST(recompute_equals_full) {
    for (int arch = 0; arch < 3; arch++) {
        model_config cfg = tiny((model_arch)arch);
        cfg.L = 4;
        eng_backend *be;
        backend_cpu_create(&be, 0);
        model m;
        CHECK(model_init(&m, &cfg, be) == 0);
        float *w = malloc((size_t)m.n_elems * 4), *g[3];
        check_fill(w, (size_t)m.n_elems, 70 + arch, 0.3f);
        model_views wv, gv[3];
        model_views_make(&m, w, 4, &wv);
        int p0[4] = {1, 5, 9, 2}, r00[3] = {7, 8, 3}, r01[2] = {2, 30};
        const int *rs0[2] = {r00, r01};
        int R0[2] = {3, 2};
        pack_group pg = {.prompt = p0, .P = 4, .N = 2, .resp = rs0, .R = R0};
        pack_batch b;
        CHECK(pack_build(&b, &pg, 0, 1, PACK_PACKED) == 0);
        model_input in;
        model_input_from_batch(&in, &b);
        float *wl = malloc((size_t)b.M * 4), *we = malloc((size_t)b.M * 4), *lp[3];
        check_fill(wl, (size_t)b.M, 80 + arch, 1.0f);
        check_fill(we, (size_t)b.M, 90 + arch, 0.1f);
        const int ckpt[3] = {0, 2, 4};
        for (int k = 0; k < 3; k++) {
            g[k] = calloc((size_t)m.n_elems, 4);
            lp[k] = malloc((size_t)b.M * 4);
            model_views_make(&m, g[k], 4, &gv[k]);
            size_t budget = k ? model_acts_bytes(&m, b.T, b.M, 1, ckpt[k]) : 0;
            model_acts a;
            CHECK(model_acts_init_budget(&m, &a, b.T, b.M, budget) == 0);
            CHECK_EQ_INT(a.n_ckpt, ckpt[k]);
            CHECK(model_forward(&m, &wv, &a, NULL, &in, 0.9f, 1) == 0);
            memcpy(lp[k], a.logp, (size_t)b.M * 4);
            CHECK(model_backward(&m, &wv, &gv[k], &a, &in, wl, we, 0.9f) == 0);
            model_acts_free(&m, &a);
        }
        for (int k = 1; k < 3; k++) {
            CHECK_MSG(!memcmp(lp[0], lp[k], (size_t)b.M * 4), "%s: logprobs with %d layers recomputed", cfg.arch_name, ckpt[k]);
            CHECK_MSG(!memcmp(g[0], g[k], (size_t)m.n_elems * 4), "%s: gradients with %d layers recomputed", cfg.arch_name,
                      ckpt[k]);
        }
        CHECK(model_acts_bytes(&m, b.T, b.M, 1, 4) < model_acts_bytes(&m, b.T, b.M, 1, 2));
        model_acts a;
        CHECK(model_acts_init_budget(&m, &a, b.T, b.M, model_acts_bytes(&m, b.T, b.M, 1, 4) - 1) == GE_NOMEM);
        /* An update's no-grad passes carve their activations in its gradient ones' memory
         * (model_acts_init_in): a forward there gives the bits of its own allocation, though the
         * memory holds a backward's leftovers; freeing it leaves the owner's memory (ASan: the
         * owner's next pass and free), which still trains to the same gradients; an owner too
         * small refuses. */
        model_acts own, ng, mine, small;
        float *gq = calloc((size_t)m.n_elems, 4), *lq[2] = {malloc((size_t)b.M * 4), malloc((size_t)b.M * 4)};
        model_views qv;
        model_views_make(&m, gq, 4, &qv);
        CHECK(model_acts_init_budget(&m, &own, b.T, b.M, model_acts_bytes(&m, b.T, b.M, 1, 4)) == 0);
        CHECK(model_acts_update_bytes(&m, b.T) == model_acts_bytes(&m, b.T, b.T, 1, 4));
        CHECK(model_forward(&m, &wv, &own, NULL, &in, 0.9f, 1) == 0);
        CHECK(model_backward(&m, &wv, &qv, &own, &in, wl, we, 0.9f) == 0);
        CHECK(model_acts_init(&m, &mine, b.T, b.M, 0) == 0);
        CHECK(model_acts_init_in(&m, &ng, b.T, b.M, &own) == 0);
        CHECK(ng.borrowed && ng.mem == own.mem && !ng.grad);
        for (int j = 0; j < 2; j++) {
            model_acts *x = j ? &ng : &mine;
            CHECK(model_forward(&m, &wv, x, NULL, &in, 0.9f, 1) == 0);
            memcpy(lq[j], x->logp, (size_t)b.M * 4);
        }
        CHECK_MSG(!memcmp(lq[0], lq[1], (size_t)b.M * 4), "%s: no-grad logprobs in the owner's memory", cfg.arch_name);
        model_acts_free(&m, &ng);
        model_acts_free(&m, &mine);
        memset(gq, 0, (size_t)m.n_elems * 4);
        CHECK(model_forward(&m, &wv, &own, NULL, &in, 0.9f, 1) == 0);
        CHECK(model_backward(&m, &wv, &qv, &own, &in, wl, we, 0.9f) == 0);
        CHECK_MSG(!memcmp(g[0], gq, (size_t)m.n_elems * 4), "%s: gradients after a borrower", cfg.arch_name);
        CHECK(model_acts_init(&m, &small, 1, 1, 0) == 0);
        CHECK(model_acts_init_in(&m, &ng, b.T, b.M, &small) == 1 && !ng.mem && !ng.l);
        model_acts_free(&m, &small);
        model_acts_free(&m, &own);
        model_views_free(&qv);
        free(gq);
        free(lq[0]);
        free(lq[1]);
        for (int k = 0; k < 3; k++) {
            model_views_free(&gv[k]);
            free(g[k]);
            free(lp[k]);
        }
        pack_batch_free(&b);
        model_views_free(&wv);
        model_free(&m);
        be->destroy(be);
        free(w);
        free(wl);
        free(we);
    }
}

int main(void) {
    RUN(rmsnorm_backward);
    RUN(matmul_backward);
    RUN(rope_backward);
    RUN(attention_backward_shared_prefix);
    RUN(swiglu_backward);
    RUN(logprob_head_backward);
    RUN(logprob_top_lists_fwd_logprobs);
    RUN(model_backward_all_architectures);
    RUN(lora_adapter_backward);
    RUN(recompute_equals_full);
    return CHECK_DONE();
}
