/* bench_layer.c — one Qwen3-8B-shaped decoder layer (C=4096, H=32, K=8, D=128, F=12288, q/k
 * norm, RoPE) forward+backward on the CUDA backend, as ../shared/bench/peer_layer.py times its
 * PyTorch layer: one packed group [P; R_1..R_N] (P + NR tokens), a random bf16 input x and a
 * random upstream gradient dy, no embedding and no lm-head. The layer is the backend-table op
 * sequence of engine/model.c's model_forward/model_backward for one layer, called directly (a
 * 1-layer model with M = 0 would back-propagate an all-zero gradient from the final norm);
 * the parameter layout, activations and RoPE table come from a 1-layer model_init. Weight
 * gradients accumulate in fp32, as in training; dx is written like the peer's x.grad.
 * Prints ms (median of REPS after a warm-up) and the peak device memory in use (cudaMemGetInfo
 * against the free memory after backend creation: weights, fp32 grads, activations, scratch).
 * Usage: bench_layer [P N R ...]   (default: the four configurations of issue 7) */
#include <cuda_runtime_api.h>
#include <time.h>

#include "engine/model.h"
#include "engine/pack.h"
#include "tests/gpu/gpu_check.h"

enum { REPS = 7 };

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }

/* Forward of layer 0: x (T,C) -> y (T,C); activations saved in a->l[0]. */
static void layer_fwd(const model *m, const model_views *w, model_acts *a, attn_ranges r, const int *pos,
                      const void *x, void *y, int T) {
    const model_config *c = &m->cfg;
    eng_backend *be = m->be;
    int C = c->C, H = c->H, K = c->K, D = c->D, F = c->F, HD = H * D, KD = K * D;
    struct model_layer_acts *A = &a->l[0];
    const model_layer_views *W = &w->layers[0];
    be->rmsnorm_fwd(be, A->ln1, A->rstd1, x, W->attn_norm, T, C, c->eps);
    be->matmul_fwd(be, A->q0, A->ln1, W->wq, W->bq, T, C, HD);
    be->matmul_fwd(be, A->k0, A->ln1, W->wk, W->bk, T, C, KD);
    be->rmsnorm_fwd(be, A->q, A->rstdq, A->q0, W->q_norm, T * H, D, c->eps);
    be->rmsnorm_fwd(be, A->k, A->rstdk, A->k0, W->k_norm, T * K, D, c->eps);
    be->matmul_fwd(be, A->v, A->ln1, W->wv, W->bv, T, C, KD);
    be->rope_fwd(be, A->q, pos, m->inv_freq, T, H, D);
    be->rope_fwd(be, A->k, pos, m->inv_freq, T, K, D);
    be->attention_fwd(be, A->att, A->lse, A->q, A->k, A->v, r, T, H, K, D);
    be->matmul_fwd(be, A->xm, A->att, W->wo, W->bo, T, HD, C);
    be->add(be, A->xm, A->xm, x, (long long)T * C);
    be->rmsnorm_fwd(be, A->ln2, A->rstd2, A->xm, W->mlp_norm, T, C, c->eps);
    be->matmul_fwd(be, A->g, A->ln2, W->w_gate, NULL, T, C, F);
    be->matmul_fwd(be, A->u, A->ln2, W->w_up, NULL, T, C, F);
    be->swiglu_fwd(be, A->a, A->g, A->u, (long long)T * F);
    be->matmul_fwd(be, y, A->a, W->w_down, NULL, T, F, C);
    be->add(be, y, y, A->xm, (long long)T * C);
}

/* Backward of layer 0 given dy (T,C) in a->dres: on return a->dres holds dx; weight gradients
 * are added into g. */
static void layer_bwd(const model *m, const model_views *w, const model_views *g, model_acts *a, attn_ranges r,
                      const int *pos, const void *x, int T) {
    const model_config *c = &m->cfg;
    eng_backend *be = m->be;
    int C = c->C, H = c->H, K = c->K, D = c->D, F = c->F, HD = H * D, KD = K * D;
    size_t eb = (size_t)be->act_bytes;
    struct model_layer_acts *A = &a->l[0];
    const model_layer_views *W = &w->layers[0], *G = &g->layers[0];
    be->zero(be, a->da, (size_t)T * F * eb);
    be->matmul_bwd(be, a->da, G->w_down, NULL, a->dres, A->a, W->w_down, T, F, C);
    be->swiglu_bwd(be, a->dg, a->du, a->da, A->g, A->u, (long long)T * F);
    be->zero(be, a->dln, (size_t)T * C * eb);
    be->matmul_bwd(be, a->dln, G->w_gate, NULL, a->dg, A->ln2, W->w_gate, T, C, F);
    be->matmul_bwd(be, a->dln, G->w_up, NULL, a->du, A->ln2, W->w_up, T, C, F);
    be->rmsnorm_bwd(be, a->dres, G->mlp_norm, a->dln, A->xm, W->mlp_norm, A->rstd2, T, C);
    be->zero(be, a->datt, (size_t)T * HD * eb);
    be->matmul_bwd(be, a->datt, G->wo, G->bo, a->dres, A->att, W->wo, T, HD, C);
    be->zero(be, a->dk, (size_t)T * KD * eb);
    be->zero(be, a->dv, (size_t)T * KD * eb);
    be->attention_bwd(be, a->dq, a->dk, a->dv, a->datt, A->q, A->k, A->v, A->att, A->lse, r, T, H, K, D);
    be->rope_bwd(be, a->dq, pos, m->inv_freq, T, H, D);
    be->rope_bwd(be, a->dk, pos, m->inv_freq, T, K, D);
    be->zero(be, a->dq0, (size_t)T * HD * eb);
    be->zero(be, a->dk0, (size_t)T * KD * eb);
    be->rmsnorm_bwd(be, a->dq0, G->q_norm, a->dq, A->q0, W->q_norm, A->rstdq, T * H, D);
    be->rmsnorm_bwd(be, a->dk0, G->k_norm, a->dk, A->k0, W->k_norm, A->rstdk, T * K, D);
    be->zero(be, a->dln, (size_t)T * C * eb);
    be->matmul_bwd(be, a->dln, G->wq, G->bq, a->dq0, A->ln1, W->wq, T, C, HD);
    be->matmul_bwd(be, a->dln, G->wk, G->bk, a->dk0, A->ln1, W->wk, T, C, KD);
    be->matmul_bwd(be, a->dln, G->wv, G->bv, a->dv, A->ln1, W->wv, T, C, KD);
    be->rmsnorm_bwd(be, a->dres, G->attn_norm, a->dln, x, W->attn_norm, A->rstd1, T, C);
}

static void bench(eng_backend *be, size_t free0, int P, int N, int R) {
    model_config c = { .arch = ARCH_QWEN3, .L = 1, .C = 4096, .H = 32, .K = 8, .D = 128, .F = 12288, .V = 256,
                       .max_pos = 65536, .eps = 1e-6f, .rope_theta = 1000000.0f, .qk_norm = 1, .tied = 1, .bos_id = -1 };
    snprintf(c.arch_name, sizeof c.arch_name, "qwen3");
    model m;
    if (model_init(&m, &c, be)) gc_die(be, "model_init");
    size_t n = (size_t)m.n_elems;
    void *w = be->alloc(be, n * 2);
    float *gw = be->alloc(be, n * 4), *tmp = be->alloc(be, n * 4);
    float *hw = gc_rand(n, 0.02f, 7);
    for (int i = 0; i < m.n_params; i++)     /* norm weights near 1, the rest small */
        if (m.params[i].ndim == 1)
            for (long long j = 0; j < m.params[i].numel; j++) hw[m.params[i].off + j] += 1.0f;
    if (!w || !gw || !tmp || be->to_dev(be, tmp, hw, n * 4)) gc_die(be, "weights");
    be->f32_to_act(be, w, tmp, n);
    be->zero(be, gw, n * 4);
    be->free(be, tmp);
    free(hw);
    model_views wv, gv;
    model_views_make(&m, w, 2, &wv);
    model_views_make(&m, gw, 4, &gv);

    int *prompt = calloc((size_t)P, 4), **resp = malloc((size_t)N * sizeof(int *)), *Rs = malloc((size_t)N * 4);
    for (int r = 0; r < N; r++) { Rs[r] = R; resp[r] = calloc((size_t)R, 4); }
    pack_group pg = { prompt, P, N, (const int *const *)resp, Rs };
    pack_batch b;
    if (pack_build(&b, &pg, 0, 1, PACK_PACKED)) gc_die(NULL, "pack_build");
    int T = b.T, C = c.C;
    model_acts a;
    if (model_acts_init(&m, &a, T, 1, 1)) gc_die(be, "model_acts_init");
    /* positions and key ranges at model_forward's places in a->ints */
    int *pos = a.ints + a.cap_T;
    attn_ranges rg = { a.ints + 2 * a.cap_T, a.ints + 3 * a.cap_T, a.ints + 4 * a.cap_T, a.ints + 5 * a.cap_T };
    const int *src[5] = { b.pos, b.kv_a0, b.kv_a1, b.kv_b0, b.kv_b1 };
    for (int i = 0; i < 5; i++)
        if (be->to_dev(be, a.ints + (size_t)(i + 1) * a.cap_T, src[i], (size_t)T * 4)) gc_die(be, "ints");
    float *hx = gc_rand((size_t)T * C, 1.0f, 11), *hdy = gc_rand((size_t)T * C, 1e-3f, 13);
    void *x = gc_act(be, hx, (size_t)T * C), *dy = gc_act(be, hdy, (size_t)T * C), *y = a.xL;
    free(hx); free(hdy);

    double t[REPS + 1], tf[REPS + 1];
    size_t used_peak = 0, total;
    for (int rep = 0; rep <= REPS; rep++) {
        /* the upstream gradient, restored each rep (backward leaves dx in dres) */
        if (cudaMemcpy(a.dres, dy, (size_t)T * C * 2, cudaMemcpyDeviceToDevice) || be->sync(be)) gc_die(be, "setup");
        double t0 = now();
        layer_fwd(&m, &wv, &a, rg, pos, x, y, T);
        if (be->sync(be)) gc_die(be, "forward");
        double t1 = now();
        layer_bwd(&m, &wv, &gv, &a, rg, pos, x, T);
        if (be->sync(be)) gc_die(be, "backward");
        double t2 = now();
        t[rep] = t2 - t0;
        tf[rep] = t1 - t0;
        size_t fr;
        cudaMemGetInfo(&fr, &total);
        if (free0 - fr > used_peak) used_peak = free0 - fr;
    }
    qsort(t + 1, REPS, sizeof(double), cmpd);
    qsort(tf + 1, REPS, sizeof(double), cmpd);
    float *dx = gc_get_act(be, a.dres, (size_t)T * C);
    double s = 0;
    for (size_t i = 0; i < (size_t)T * C; i++) s += (double)dx[i] * dx[i];
    free(dx);
    double lin = 6.0 * T * ((double)C * 32 * 128 + 2.0 * C * 8 * 128 + 32.0 * 128 * C + 3.0 * C * c.F);
    double att_f = 2.0 * P * P * 32 * 128 + 4.0 * N * R * (P + R / 2.0) * 32 * 128;
    double flop = lin + 3.5 * att_f;
    printf("grpod-cuda layer P=%d N=%d R=%d T=%d: fwd+bwd %.2f ms (min %.2f max %.2f; fwd %.2f) useful %.1f TFLOP "
           "-> %.0f TFLOP/s; peak %.2f GiB (device memory in use); |dx| %.3g\n",
           P, N, R, T, t[1 + REPS / 2] * 1e3, t[1] * 1e3, t[REPS] * 1e3, tf[1 + REPS / 2] * 1e3, flop / 1e12,
           flop / t[1 + REPS / 2] / 1e12, used_peak / 1073741824.0, sqrt(s));
    fflush(stdout);
    be->free(be, x); be->free(be, dy); be->free(be, w); be->free(be, gw);
    model_acts_free(&m, &a);
    model_views_free(&wv);
    model_views_free(&gv);
    model_free(&m);
    pack_batch_free(&b);
    for (int r = 0; r < N; r++) free(resp[r]);
    free(resp); free(Rs); free(prompt);
}

int main(int argc, char **argv) {
    int cfg[4][3] = { { 8192, 8, 1024 }, { 16384, 8, 1024 }, { 32768, 4, 1024 }, { 4096, 16, 512 } }, nc = 4;
    eng_backend *be;
    if (backend_cuda_create(&be, 0)) gc_die(NULL, "backend_cuda_create");
    size_t free0, total;
    cudaMemGetInfo(&free0, &total);
    if (argc > 3) {
        for (int i = 1; i + 2 < argc; i += 3) bench(be, free0, atoi(argv[i]), atoi(argv[i + 1]), atoi(argv[i + 2]));
    } else {
        for (int i = 0; i < nc; i++) bench(be, free0, cfg[i][0], cfg[i][1], cfg[i][2]);
    }
    be->destroy(be);
    return 0;
}
