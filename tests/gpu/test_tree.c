/* test_tree.c — prefix trees deeper than one trunk on CUDA (engine/model/pack.h, PACK_TREE; the
 * extra key ranges of kernels/attention.h, which kernels/attention.cu runs as further two-range
 * launches merged by their softmax weights).
 *   (a) attention with extra ranges, forward and backward, CUDA vs the CPU reference on the same
 *       bf16 inputs: the wgmma path (D 128), mma.sync (D 64 and 256), the SIMT kernels (D 128
 *       forced), a few queries (the decode kernel's forward); rel L2 <= 1e-2 (lse 1e-4), dk/dv as
 *       increments (+=) — test_ops' attention tolerances;
 *   (b) the model on a tree of 8 trajectories x 4 turns (turn 1 shared by all, turn 2 by pairs,
 *       turns 3-4 each its own) beside random tries: CUDA tree vs CPU tree, and CUDA tree vs
 *       CUDA standard N(P+R), logprobs and every gradient, rel L2 <= 1e-2 (test_model's).
 * Usage: test_tree (rows for tests/gpu/run.sh). */
#include "engine/model/model.h"
#include "engine/model/pack.h"
#include "tests/gpu/gpu_check.h"

static eng_backend *cpu, *gpu;

/* ---------------------------------------------------------------- tree-shaped groups */

enum { TURNS = 4, MAXN = 8 };
typedef struct {
    int P, N, R[MAXN];
    int *prompt, *resp[MAXN];
    const int *rp[MAXN];
} tgroup;

/* N trajectories of TURNS turns of tl[k] ids; turn k of trajectory i is shared by the
 * trajectories i / share[k] picks (share[k] = N: all; 1: its own). */
static void tgroup_make(tgroup *t, int P, int N, const int *tl, const int *share, int V, unsigned long long *s, pack_group *pg) {
    memset(t, 0, sizeof *t);
    t->P = P;
    t->N = N;
    t->prompt = malloc((size_t)P * 4);
    for (int i = 0; i < P; i++) t->prompt[i] = (int)((check_randf(s, 0.5f) + 0.5f) * (V - 1));
    int len = 0;
    for (int k = 0; k < TURNS; k++) len += tl[k];
    for (int i = 0; i < N; i++) t->resp[i] = malloc((size_t)len * 4);
    for (int k = 0, off = 0; k < TURNS; off += tl[k], k++)
        for (int i = 0; i < N; i++) {
            if (i % share[k] == 0) /* the first of its sharers draws the turn, the others copy it */
                for (int j = 0; j < tl[k]; j++) t->resp[i][off + j] = (int)((check_randf(s, 0.5f) + 0.5f) * (V - 1));
            else memcpy(t->resp[i] + off, t->resp[i - i % share[k]] + off, (size_t)tl[k] * 4);
        }
    for (int i = 0; i < N; i++) {
        t->R[i] = len;
        t->rp[i] = t->resp[i];
    }
    *pg = (pack_group){.prompt = t->prompt, .P = P, .N = N, .resp = t->rp, .R = t->R};
}
static void tgroup_free(tgroup *t) {
    free(t->prompt);
    for (int i = 0; i < t->N; i++) free(t->resp[i]);
}

/* ---------------------------------------------------------------- (a) attention */

static attn_ranges host_ranges(const pack_batch *b) {
    return (attn_ranges){b->kv_a0, b->kv_a1, b->kv_b0, b->kv_b1, b->kv_x0, b->kv_x1, b->nx};
}
static attn_ranges dev_ranges(const pack_batch *b) {
    size_t n = (size_t)b->T * 4, nx = n * b->nx;
    return (attn_ranges){gc_dev(gpu, b->kv_a0, n),
                         gc_dev(gpu, b->kv_a1, n),
                         gc_dev(gpu, b->kv_b0, n),
                         gc_dev(gpu, b->kv_b1, n),
                         nx ? gc_dev(gpu, b->kv_x0, nx) : NULL,
                         nx ? gc_dev(gpu, b->kv_x1, nx) : NULL,
                         b->nx};
}
static void dev_ranges_free(attn_ranges r) {
    const int *p[6] = {r.a0, r.a1, r.b0, r.b1, r.x0, r.x1};
    for (int i = 0; i < 6; i++)
        if (p[i]) gpu->free(gpu, (void *)p[i]);
}

static void attn_case(const char *name, const pack_batch *b, int H, int K, int D) {
    char sh[128];
    int T = b->T;
    snprintf(sh, sizeof sh, "%s T=%d nx=%d H=%d K=%d D=%d", name, T, b->nx, H, K, D);
    size_t nq = (size_t)T * H * D, nk = (size_t)T * K * D, nl = (size_t)T * H;
    float *q = gc_rand(nq, 2.0f, 71), *k = gc_rand(nk, 2.0f, 72), *v = gc_rand(nk, 1.0f, 73), *dout = gc_rand(nq, 1.0f, 74);
    float *dk0 = gc_rand(nk, 0.1f, 75), *dv0 = gc_rand(nk, 0.1f, 76);
    float *o_c = malloc(nq * 4), *l_c = malloc(nl * 4), *dq_c = malloc(nq * 4), *dk_c = gc_copy(dk0, nk), *dv_c = gc_copy(dv0, nk);
    attn_ranges rc = host_ranges(b), rg = dev_ranges(b);
    cpu->attention_fwd(cpu, o_c, l_c, q, k, v, rc, T, H, K, D);
    for (size_t i = 0; i < nq; i++) o_c[i] = gc_bf16(o_c[i]); /* the backward reads bf16 storage */
    cpu->attention_bwd(cpu, dq_c, dk_c, dv_c, dout, q, k, v, o_c, l_c, rc, T, T, H, K, D);
    void *gq = gc_act(gpu, q, nq), *gk = gc_act(gpu, k, nk), *gv = gc_act(gpu, v, nk), *gdo = gc_act(gpu, dout, nq);
    void *go = gpu->alloc(gpu, nq * 2), *gdq = gpu->alloc(gpu, nq * 2), *gdk = gc_act(gpu, dk0, nk), *gdv = gc_act(gpu, dv0, nk);
    float *gl = gpu->alloc(gpu, nl * 4);
    gpu->attention_fwd(gpu, go, gl, gq, gk, gv, rg, T, H, K, D);
    gpu->attention_bwd(gpu, gdq, gdk, gdv, gdo, gq, gk, gv, go, gl, rg, T, T, H, K, D);
    if (gpu->sync(gpu)) gc_die(gpu, "attention");
    float *o_g = gc_get_act(gpu, go, nq), *l_g = gc_get_f32(gpu, gl, nl);
    float *dq_g = gc_get_act(gpu, gdq, nq), *dk_g = gc_get_act(gpu, gdk, nk), *dv_g = gc_get_act(gpu, gdv, nk);
    gc_row("tree attention_fwd out", sh, rel_l2(o_g, o_c, nq), 1e-2);
    gc_row("tree attention_fwd lse", sh, rel_l2(l_g, l_c, nl), 1e-4);
    gc_row("tree attention_bwd dq", sh, rel_l2(dq_g, dq_c, nq), 1e-2);
    gc_row("tree attention_bwd dk", sh, gc_rel_delta(dk_g, dk0, dk_c, dk0, nk), 1e-2);
    gc_row("tree attention_bwd dv", sh, gc_rel_delta(dv_g, dv0, dv_c, dv0, nk), 1e-2);
    void *dev[] = {gq, gk, gv, gdo, go, gdq, gdk, gdv, gl};
    for (int i = 0; i < 9; i++) gpu->free(gpu, dev[i]);
    dev_ranges_free(rg);
    float *host[] = {q, k, v, dout, dk0, dv0, o_c, l_c, dq_c, dk_c, dv_c, o_g, l_g, dq_g, dk_g, dv_g};
    for (int i = 0; i < 16; i++) free(host[i]);
}

/* A batch of `ng` tree-shaped groups: the shape first, then random shares and lengths. */
static void tree_batch(pack_batch *b, tgroup *tg, pack_group *pg, int ng, int P, int turn, int V, unsigned long long seed) {
    unsigned long long s = seed;
    for (int g = 0; g < ng; g++) {
        int tl[TURNS], share[TURNS] = {8, 2, 1, 1};
        for (int k = 0; k < TURNS; k++) tl[k] = g == 0 ? turn : 1 + (int)((check_randf(&s, 0.5f) + 0.5f) * turn);
        if (g > 0) share[1] = g % 2 ? 4 : 2, share[2] = g % 3 ? 1 : 2;
        tgroup_make(&tg[g], g == 0 ? P : 1 + (int)((check_randf(&s, 0.5f) + 0.5f) * P), MAXN, tl, share, V, &s, &pg[g]);
    }
    if (pack_build(b, pg, 0, ng, PACK_TREE)) gc_die(NULL, "pack_build");
}

static void attention_rows(void) {
    tgroup tg[3];
    pack_group pg[3];
    pack_batch b;
    tree_batch(&b, tg, pg, 3, 300, 90, 1000, 11);
    printf("  attention batch: T=%d nx=%d (standard %lld tokens)\n", b.T, b.nx,
           pack_group_tokens(&pg[0], PACK_STANDARD) + pack_group_tokens(&pg[1], PACK_STANDARD) +
               pack_group_tokens(&pg[2], PACK_STANDARD));
    attn_case("wgmma", &b, 16, 8, 128);
    attn_case("mma", &b, 8, 2, 64);
    attn_case("simt", &b, 4, 2, 256);
    gpu->tune.attn = TUNE_ATTN_SIMT;
    attn_case("simt forced", &b, 4, 2, 128);
    gpu->tune.attn = TUNE_ATTN_AUTO;
    pack_batch_free(&b);
    for (int g = 0; g < 3; g++) tgroup_free(&tg[g]);
    /* a few queries: the decode kernel takes the forward of each pair of ranges */
    tree_batch(&b, tg, pg, 1, 2, 1, 1000, 12);
    attn_case("few queries", &b, 16, 8, 128);
    pack_batch_free(&b);
    tgroup_free(&tg[0]);
}

/* ---------------------------------------------------------------- (b) the model */

typedef struct {
    eng_backend *be;
    model m;
    void *w;
    float *g;
    model_views wv, gv;
} mrun;

/* logp (M) and the gradient (n_elems) of sum(dlogp · logp) over a batch on one backend */
static void model_grads(const model_config *c, eng_backend *be, const float *hw, const pack_batch *b, const float *dlogp,
                        float *logp, float *grad) {
    mrun r = {.be = be};
    if (model_init(&r.m, c, be)) gc_die(be, "model_init");
    size_t n = (size_t)r.m.n_elems;
    r.w = be->alloc(be, n * be->act_bytes);
    r.g = be->alloc(be, n * 4);
    if (!r.w || !r.g || be->act_from_f32(be, r.w, hw, n)) gc_die(be, "weights");
    be->zero(be, r.g, n * 4);
    model_views_make(&r.m, r.w, (size_t)be->act_bytes, &r.wv);
    model_views_make(&r.m, r.g, 4, &r.gv);
    model_acts a;
    model_input in;
    model_input_from_batch(&in, b);
    if (model_acts_init(&r.m, &a, b->T, b->M, 1)) gc_die(be, "model_acts_init");
    if (model_forward(&r.m, &r.wv, &a, NULL, &in, 0.9f, 0)) gc_die(be, "model_forward");
    if (be->to_host(be, logp, a.logp, (size_t)b->M * 4)) gc_die(be, "logp");
    if (model_backward(&r.m, &r.wv, &r.gv, &a, &in, dlogp, NULL, 0.9f) || be->to_host(be, grad, r.g, n * 4))
        gc_die(be, "backward");
    model_acts_free(&r.m, &a);
    model_views_free(&r.wv);
    model_views_free(&r.gv);
    be->free(be, r.w);
    be->free(be, r.g);
    model_free(&r.m);
}

static void model_rows(const char *name, const model_config *c, unsigned long long seed) {
    tgroup tg[3];
    pack_group pg[3];
    pack_batch tr, st;
    tree_batch(&tr, tg, pg, 3, 96, 40, c->V, seed);
    if (pack_build(&st, pg, 0, 3, PACK_STANDARD)) gc_die(NULL, "pack_build");
    model tmp;
    model_init(&tmp, c, cpu);
    size_t n = (size_t)tmp.n_elems;
    model_free(&tmp);
    int M = tr.M;
    float *w = gc_rand(n, 0.15f, seed + 1), *dlogp = gc_rand((size_t)M, 1.0f / M, seed + 2);
    float *lp_c = malloc((size_t)M * 4), *lp_g = malloc((size_t)M * 4), *lp_s = malloc((size_t)M * 4);
    float *g_c = malloc(n * 4), *g_g = malloc(n * 4), *g_s = malloc(n * 4);
    model_grads(c, cpu, w, &tr, dlogp, lp_c, g_c);
    model_grads(c, gpu, w, &tr, dlogp, lp_g, g_g);
    model_grads(c, gpu, w, &st, dlogp, lp_s, g_s);
    char sh[128], sh2[128];
    snprintf(sh, sizeof sh, "%s L=%d C=%d D=%d tree T=%d nx=%d", name, c->L, c->C, c->D, tr.T, tr.nx);
    snprintf(sh2, sizeof sh2, "%s tree T=%d vs standard T=%d", name, tr.T, st.T);
    gc_row("tree logprobs cuda vs cpu", sh, rel_l2(lp_g, lp_c, (size_t)M), 1e-2);
    gc_row("tree gradients cuda vs cpu", sh, rel_l2(g_g, g_c, n), 1e-2);
    gc_row("gpu tree vs standard logp", sh2, rel_l2(lp_g, lp_s, (size_t)M), 1e-2);
    gc_row("gpu tree vs standard grads", sh2, rel_l2(g_g, g_s, n), 1e-2);
    float *f[] = {w, dlogp, lp_c, lp_g, lp_s, g_c, g_g, g_s};
    for (int i = 0; i < 8; i++) free(f[i]);
    pack_batch_free(&tr);
    pack_batch_free(&st);
    for (int g = 0; g < 3; g++) tgroup_free(&tg[g]);
}

int main(void) {
    backend_cpu_create(&cpu, 0);
    if (backend_cuda_create(&gpu, 0)) gc_die(NULL, "backend_cuda_create");
    attention_rows();
    /* small Qwen3s (q/k norm, GQA): the mma path (D 64), then the wgmma one (D 128) */
    model_config q3 = {.arch = ARCH_QWEN3, .L = 2, .C = 256, .H = 4, .K = 2, .D = 64, .F = 512, .V = 1000, .max_pos = 4096};
    q3.eps = 1e-6f, q3.rope_theta = 1e6f, q3.qk_norm = 1, q3.bos_id = -1;
    snprintf(q3.arch_name, sizeof q3.arch_name, "qwen3");
    model_rows("qwen3 D=64", &q3, 301);
    q3.D = 128;
    q3.C = 512;
    model_rows("qwen3 D=128", &q3, 302);
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    printf("test_tree: %d failed\n", gc_failures);
    return gc_failures ? 1 : 0;
}
