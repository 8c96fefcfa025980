/* test_invariant.c (GPU) — batch invariance of the forward ops in exact mode (tune.exact, issue
 * 36): one fixed input row computed inside batches of M = 1 .. 4096 random rows (MS below), at
 * the first, middle and last position, must give the bits it gives alone — for the GEMMs
 * (matmul_fwd at two Qwen3-1.7B shapes, an odd O and I = 192 (3 of the 8 K segments non-empty),
 * matmul_fwd_n with the norm in front, and with a bias and the residual, mlp_in_fwd), RMSNorm,
 * the logprob head (T = 1 and 0.7), the sampler (its token and reported logprob) and a MoE layer
 * (router + experts). A row per op and mode: exact on asserts 0 differing cases; exact off prints
 * its count (non-zero for the GEMMs: what the test would catch). Last, the sampler's reported
 * logprob against logprob_fwd on the same hidden row and token: equal bits in exact mode.
 * Prints ROW lines for tests/gpu/run.sh. `test_invariant gemm`: the GEMM rows alone. */
#include "kernels/sampling.h"
#include "tests/gpu/gpu_check.h"

enum { C = 2048, F = 6144, V = 151936, MC = 1024, ME = 16, MK = 4, MF = 512 };
/* 1-16: the few-row kernel; 24, 64, 128, 200: exact_few_cuda's split over K (2, 4, 8, 16 m16
 * tiles); 257: exact_mm_cuda's 32-row tile; 4096: its 128 x 256 tile (every GEMM here, the odd O
 * and I = 192 too) */
static const int MS[] = {1, 3, 7, 16, 24, 64, 128, 200, 257, 4096};

typedef struct {
    void *w1, *w2, *wq, *wk, *wv, *nw, *wg, *wu, *lm, *wr, *eg, *eu, *ed;
} weights;
static weights W;

/* M rows of I inputs: random neighbours (seeded by M and pos), the fixed row (seed 77 + fix) at pos */
static void *batch_fix(eng_backend *g, int M, int pos, int I, float scale, unsigned fix) {
    float *h = gc_rand((size_t)M * I, scale, 1000 + (unsigned long long)M * 7 + pos + 31ULL * fix);
    float *x = gc_rand((size_t)I, scale, 77 + fix);
    memcpy(h + (size_t)pos * I, x, (size_t)I * 4);
    void *d = gc_act(g, h, (size_t)M * I);
    free(h);
    free(x);
    return d;
}
static void *batch(eng_backend *g, int M, int pos, int I, float scale) { return batch_fix(g, M, pos, I, scale, 0); }

/* one op: the output row at pos of a batch of M rows (n values, malloc'd) */
typedef float *(*op_fn)(eng_backend *g, int M, int pos, int *n);

static float *row_of(eng_backend *g, void *out, int M, int pos, int O, int *n) {
    float *all = gc_get_act(g, out, (size_t)M * O), *r = malloc((size_t)O * 4);
    memcpy(r, all + (size_t)pos * O, (size_t)O * 4);
    free(all);
    *n = O;
    return r;
}

static float *op_matmul(eng_backend *g, int M, int pos, int *n, int I, int O, const void *w) {
    void *x = batch(g, M, pos, I, 1.0f), *y = g->alloc(g, (size_t)M * O * 2);
    g->matmul_fwd(g, y, x, w, NULL, M, I, O);
    float *r = row_of(g, y, M, pos, O, n);
    g->free(g, x);
    g->free(g, y);
    return r;
}
static float *op_up(eng_backend *g, int M, int pos, int *n) { return op_matmul(g, M, pos, n, C, F, W.w1); }
static float *op_down(eng_backend *g, int M, int pos, int *n) { return op_matmul(g, M, pos, n, F, C, W.w2); }
static float *op_odd(eng_backend *g, int M, int pos, int *n) { return op_matmul(g, M, pos, n, C, 1001, W.w1); } /* 2-byte rows */
static float *op_small(eng_backend *g, int M, int pos, int *n) { return op_matmul(g, M, pos, n, 192, 1001, W.w1); }

static float *op_res(eng_backend *g, int M, int pos, int *n) { /* o_proj-like: + bias + the residual, in place */
    void *x = batch(g, M, pos, C, 1.0f), *y = batch_fix(g, M, pos, C, 2.0f, 1);
    mm_part p = {.out = y, .w = W.wq, .bias = W.nw, .res = y, .O = C};
    g->matmul_fwd_n(g, &p, 1, x, NULL, M, C);
    float *r = row_of(g, y, M, pos, C, n);
    g->free(g, x), g->free(g, y);
    return r;
}

static float *op_qkv(eng_backend *g, int M, int pos, int *n) { /* q/k/v with the norm in front; k's row */
    void *x = batch(g, M, pos, C, 1.0f), *ln = g->alloc(g, (size_t)M * C * 2);
    void *q = g->alloc(g, (size_t)M * C * 2), *k = g->alloc(g, (size_t)M * 1024 * 2), *v = g->alloc(g, (size_t)M * 1024 * 2);
    mm_part p[3] = {{.out = q, .w = W.wq, .O = C}, {.out = k, .w = W.wk, .O = 1024}, {.out = v, .w = W.wv, .O = 1024}};
    mm_norm nm = {W.nw, 1e-6f, ln};
    g->matmul_fwd_n(g, p, 3, x, &nm, M, C);
    float *r = row_of(g, k, M, pos, 1024, n);
    g->free(g, x), g->free(g, ln), g->free(g, q), g->free(g, k), g->free(g, v);
    return r;
}

static float *op_mlp(eng_backend *g, int M, int pos, int *n) { /* SwiGLU in with the norm in front */
    void *x = batch(g, M, pos, C, 1.0f), *ln = g->alloc(g, (size_t)M * C * 2);
    void *a = g->alloc(g, (size_t)M * F * 2), *gt = g->alloc(g, (size_t)M * F * 2), *u = g->alloc(g, (size_t)M * F * 2);
    mm_norm nm = {W.nw, 1e-6f, ln};
    g->mlp_in_fwd(g, a, gt, u, x, &nm, W.wg, W.wu, M, C, F, NULL);
    float *r = row_of(g, a, M, pos, F, n);
    g->free(g, x), g->free(g, ln), g->free(g, a), g->free(g, gt), g->free(g, u);
    return r;
}

static float *op_rmsnorm(eng_backend *g, int M, int pos, int *n) {
    void *x = batch(g, M, pos, C, 3.0f), *y = g->alloc(g, (size_t)M * C * 2);
    g->rmsnorm_fwd(g, y, NULL, x, W.nw, M, C, 1e-6f);
    float *r = row_of(g, y, M, pos, C, n);
    g->free(g, x), g->free(g, y);
    return r;
}

static int *seq_dev(eng_backend *g, int M, int tok_at_pos, int pos) { /* 0..M-1, or token ids */
    int *h = malloc((size_t)M * 4);
    for (int i = 0; i < M; i++) h[i] = tok_at_pos < 0 ? i : (i * 7919 + 13) % V;
    if (tok_at_pos >= 0) h[pos] = tok_at_pos;
    int *d = gc_dev(g, h, (size_t)M * 4);
    free(h);
    return d;
}

static float op_temp = 1.0f;
static float *op_logprob(eng_backend *g, int M, int pos, int *n) { /* logprob and entropy of the row */
    void *h = batch(g, M, pos, C, 1.0f);
    int *p = seq_dev(g, M, -1, 0), *t = seq_dev(g, M, 4242, pos);
    float *lp = g->alloc(g, (size_t)M * 4), *en = g->alloc(g, (size_t)M * 4);
    g->logprob_fwd(g, lp, en, h, p, t, W.lm, M, C, V, op_temp);
    float *a = gc_get_f32(g, lp, M), *b = gc_get_f32(g, en, M), *r = malloc(8);
    r[0] = a[pos], r[1] = b[pos], *n = 2;
    free(a), free(b), g->free(g, h), g->free(g, p), g->free(g, t), g->free(g, lp), g->free(g, en);
    return r;
}

/* the sampler at T = 0.7 on lm_head_rows' logits: (token, logprob) of the row; the row's key is
 * fixed, the others' depend on the batch */
static void sample_rows(eng_backend *g, const void *h, int M, int pos, float temp, int *tok, float *lp) {
    int *p = seq_dev(g, M, -1, 0), *dt = g->alloc(g, (size_t)M * 4);
    float *lg = g->alloc(g, (size_t)M * V * 4), *dl = g->alloc(g, (size_t)M * 4);
    sample_params *sp = malloc(sizeof *sp * (size_t)M);
    for (int i = 0; i < M; i++)
        sp[i] = (sample_params){.key = sampling_mix(i == pos ? 99 : 1000 + (unsigned long long)i), .temperature = temp, .top_p = 1};
    sample_params *dp = gc_dev(g, sp, sizeof *sp * (size_t)M);
    g->lm_head_rows(g, lg, h, p, W.lm, M, C, V);
    g->sample(g, dt, dl, lg, dp, NULL, NULL, M, V);
    int *ht = malloc((size_t)M * 4);
    float *hl = gc_get_f32(g, dl, M);
    if (g->to_host(g, ht, dt, (size_t)M * 4) || g->sync(g)) gc_die(g, "sample");
    *tok = ht[pos], *lp = hl[pos];
    free(ht), free(hl), free(sp), g->free(g, p), g->free(g, dt), g->free(g, lg), g->free(g, dl), g->free(g, dp);
}
static float *op_sample(eng_backend *g, int M, int pos, int *n) {
    if (M > 1024) M = 1024; /* M rows of fp32 logits: 4096 would be 2.5 GB */
    if (pos >= M) pos = M - 1;
    void *h = batch(g, M, pos, C, 1.0f);
    int tok;
    float *r = malloc(8);
    sample_rows(g, h, M, pos, 0.7f, &tok, &r[1]);
    r[0] = (float)tok, *n = 2;
    g->free(g, h);
    return r;
}

static float *op_moe(eng_backend *g, int M, int pos, int *n) { /* router (top-4 of 16) + experts + combine */
    void *x = batch(g, M, pos, MC, 1.0f), *out = g->alloc(g, (size_t)M * MC * 2);
    int S = M * MK;
    float *probs = g->alloc(g, (size_t)M * ME * 4), *topw = g->alloc(g, (size_t)S * 4);
    int *topi = g->alloc(g, (size_t)S * 4);
    void *eg = g->alloc(g, (size_t)S * MF * 2), *eu = g->alloc(g, (size_t)S * MF * 2), *ey = g->alloc(g, (size_t)S * MC * 2);
    g->moe_router_fwd(g, probs, topi, topw, NULL, x, W.wr, NULL, NULL, M, MC, ME, MK, 1);
    g->moe_experts_fwd(g, out, eg, eu, ey, x, x, topi, topw, W.eg, W.eu, W.ed, M, MC, ME, MK, MF, NULL);
    float *r = row_of(g, out, M, pos, MC, n);
    g->free(g, x), g->free(g, out), g->free(g, probs), g->free(g, topw), g->free(g, topi);
    g->free(g, eg), g->free(g, eu), g->free(g, ey);
    return r;
}

/* cases (M, pos) whose row differs from the row alone, and the largest |difference| */
static int differing(eng_backend *g, op_fn f, double *maxd) {
    int n0, n, bad = 0;
    float *ref = f(g, 1, 0, &n0);
    *maxd = 0;
    for (size_t i = 0; i < sizeof MS / sizeof MS[0]; i++)
        for (int q = 0; q < 3; q++) {
            int M = MS[i], pos = q == 0 ? 0 : q == 1 ? M / 2 : M - 1;
            if (q && pos == (q == 1 ? 0 : M / 2)) continue; /* the same position again */
            float *r = f(g, M, pos, &n);
            if (n != n0 || memcmp(r, ref, (size_t)n * 4)) bad++;
            for (int j = 0; j < n && n == n0; j++) *maxd = fmax(*maxd, fabs((double)r[j] - ref[j]));
            free(r);
        }
    free(ref);
    return bad;
}

static void *dev_w(eng_backend *g, size_t n, float scale, unsigned long long seed) {
    float *h = gc_rand(n, scale, seed);
    void *d = gc_act(g, h, n);
    free(h);
    return d;
}

int main(int argc, char **argv) {
    const int gemm_only = argc > 1 && !strcmp(argv[1], "gemm"); /* the GEMM rows alone */
    eng_backend *g;
    if (backend_cuda_create(&g, 0)) gc_die(NULL, "backend_cuda_create");
    g->tune.graphs = 0;
    W.w1 = dev_w(g, (size_t)F * C, 0.03f, 1), W.w2 = dev_w(g, (size_t)C * F, 0.02f, 2);
    W.wq = dev_w(g, (size_t)C * C, 0.03f, 3), W.wk = dev_w(g, (size_t)1024 * C, 0.03f, 4);
    W.wv = dev_w(g, (size_t)1024 * C, 0.03f, 5), W.nw = dev_w(g, C, 1.0f, 6);
    W.wg = dev_w(g, (size_t)F * C, 0.03f, 7), W.wu = dev_w(g, (size_t)F * C, 0.03f, 8);
    W.lm = dev_w(g, (size_t)V * C, 0.05f, 9), W.wr = dev_w(g, (size_t)ME * MC, 0.05f, 10);
    W.eg = dev_w(g, (size_t)ME * MF * MC, 0.04f, 11), W.eu = dev_w(g, (size_t)ME * MF * MC, 0.04f, 12);
    W.ed = dev_w(g, (size_t)ME * MC * MF, 0.04f, 13);
    struct {
        const char *name, *shape;
        op_fn f;
        float temp;
    } ops[] = {
        {"matmul_fwd up", "I=2048 O=6144", op_up, 1},
        {"matmul_fwd down", "I=6144 O=2048", op_down, 1},
        {"matmul_fwd odd O", "I=2048 O=1001", op_odd, 1},
        {"matmul_fwd small I", "I=192 O=1001", op_small, 1},
        {"matmul_fwd_n + bias + residual", "I=2048 O=2048", op_res, 1},
        {"matmul_fwd_n q/k/v + norm", "I=2048 O=2048,1024,1024", op_qkv, 1},
        {"mlp_in_fwd + norm", "I=2048 F=6144", op_mlp, 1},
        {"rmsnorm_fwd", "C=2048", op_rmsnorm, 1},
        {"logprob_fwd T=1", "C=2048 V=151936", op_logprob, 1},
        {"logprob_fwd T=0.7", "C=2048 V=151936", op_logprob, 0.7f},
        {"sample T=0.7 (token, logprob)", "C=2048 V=151936 M<=1024", op_sample, 1},
        {"moe router + experts", "C=1024 E=16 k=4 Fm=512", op_moe, 1},
    };
    for (int exact = 1; exact >= 0; exact--) {
        g->tune.exact = exact;
        for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
            if (gemm_only && strncmp(ops[i].name, "matmul", 6) && strncmp(ops[i].name, "mlp", 3)) continue;
            op_temp = ops[i].temp;
            double maxd;
            int bad = differing(g, ops[i].f, &maxd);
            char name[128], shape[128];
            snprintf(name, sizeof name, "invariant exact=%d %s", exact, ops[i].name);
            snprintf(shape, sizeof shape, "%s, cases differing (max |d| %.2e)", ops[i].shape, maxd);
            gc_row(name, shape, bad, exact ? 0 : INFINITY);
        }
    }
    /* the sampler's reported logprob = logprob_fwd's for the same row and token (16 rows) */
    for (int exact = 1; exact >= 0 && !gemm_only; exact--) {
        g->tune.exact = exact;
        int bad = 0;
        double maxd = 0;
        for (int M = 1; M <= 64; M *= 4) {
            void *h = batch(g, M, M - 1, C, 1.0f);
            int tok, *p = seq_dev(g, 1, M - 1, 0), *t;
            float lp;
            sample_rows(g, h, M, M - 1, 0.7f, &tok, &lp);
            t = gc_dev(g, &tok, 4);
            float *dl = g->alloc(g, 4);
            g->logprob_fwd(g, dl, NULL, h, p, t, W.lm, 1, C, V, 0.7f);
            float *tl = gc_get_f32(g, dl, 1);
            bad += memcmp(tl, &lp, 4) != 0;
            maxd = fmax(maxd, fabs((double)tl[0] - lp));
            free(tl), g->free(g, h), g->free(g, p), g->free(g, t), g->free(g, dl);
        }
        char name[96], shape[96];
        snprintf(name, sizeof name, "sample lp == logprob_fwd exact=%d", exact);
        snprintf(shape, sizeof shape, "T=0.7 M=1,4,16,64, rows differing (max |d| %.2e)", maxd);
        gc_row(name, shape, bad, exact ? 0 : INFINITY);
    }
    g->destroy(g);
    printf("test_invariant: %d failed\n", gc_failures);
    return gc_failures ? 1 : 0;
}
