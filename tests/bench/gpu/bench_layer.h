/* bench_layer.h — what the layer benchmarks (bench_layer.c, bench_hybrid.c) share: a model on the
 * CUDA backend with random bf16 weights (norm gains near 1, the rest small) and fp32 gradients,
 * and one packed group [P; R_1..R_N] with its activations, device inputs, a random layer input
 * x and upstream gradient dy. Header-only (static inline), one benchmark per program. */
#ifndef GRPOD_BENCH_LAYER_H
#define GRPOD_BENCH_LAYER_H
#include "engine/model/model.h"
#include "engine/model/pack.h"
#include "tests/gpu/gpu_check.h"

typedef struct {
    model m;
    void *w; /* act-typed weights */
    float *gw; /* fp32 gradients, zeroed */
    model_views wv, gv;
    int *prompt, **resp, *Rs, N;
    pack_batch b;
    model_acts a; /* grad mode, T = P + NR tokens, M = 1 */
    model_dev_input d;
    void *x, *dy; /* (T, C) */
} bench_layer_run;

static inline void bench_layer_open(bench_layer_run *r, eng_backend *be, const model_config *c, int P, int N, int R) {
    if (model_init(&r->m, c, be)) gc_die(be, "model_init");
    size_t n = (size_t)r->m.n_elems;
    r->w = be->alloc(be, n * 2);
    r->gw = be->alloc(be, n * 4);
    float *tmp = be->alloc(be, n * 4), *hw = gc_rand(n, 0.02f, 7);
    for (int i = 0; i < r->m.n_params; i++) /* norm weights near 1, the rest small */
        if (r->m.params[i].ndim == 1)
            for (long long j = 0; j < r->m.params[i].numel; j++) hw[r->m.params[i].off + j] += 1.0f;
    if (!r->w || !r->gw || !tmp || be->to_dev(be, tmp, hw, n * 4)) gc_die(be, "weights");
    be->f32_to_act(be, r->w, tmp, n);
    be->zero(be, r->gw, n * 4);
    be->free(be, tmp);
    free(hw);
    model_views_make(&r->m, r->w, 2, &r->wv);
    model_views_make(&r->m, r->gw, 4, &r->gv);
    /* random ids: equal responses would share their tokens in the packed layout (a prefix tree,
     * pack.h), and the layer would run on far fewer than P + NR tokens */
    unsigned long long s = 17;
    r->N = N;
    r->prompt = malloc((size_t)P * 4);
    gc_random_ids(r->prompt, P, &s);
    r->resp = malloc((size_t)N * sizeof(int *));
    r->Rs = malloc((size_t)N * 4);
    for (int i = 0; i < N; i++) {
        r->Rs[i] = R;
        r->resp[i] = malloc((size_t)R * 4);
        gc_random_ids(r->resp[i], R, &s);
    }
    pack_group pg = {.prompt = r->prompt, .P = P, .N = N, .resp = (const int *const *)r->resp, .R = r->Rs};
    if (pack_build(&r->b, &pg, 0, 1, PACK_PACKED)) gc_die(NULL, "pack_build");
    if (r->b.T != P + N * R) gc_die(NULL, "bench_layer_open: the packed group is not P + NR tokens");
    int T = r->b.T, C = c->C;
    if (model_acts_init(&r->m, &r->a, T, 1, 1)) gc_die(be, "model_acts_init");
    /* positions and key ranges in a->ints, as model_forward uploads them */
    model_input in;
    model_input_from_batch(&in, &r->b);
    in.M = 0;
    if (model_input_upload(&r->m, &r->a, &in, &r->d)) gc_die(be, "model_input_upload");
    float *hx = gc_rand((size_t)T * C, 1.0f, 11), *hdy = gc_rand((size_t)T * C, 1e-3f, 13);
    r->x = gc_act(be, hx, (size_t)T * C);
    r->dy = gc_act(be, hdy, (size_t)T * C);
    free(hx);
    free(hdy);
}

/* |dx| of the last backward (left in a.dres) */
static inline double bench_layer_dx_norm(bench_layer_run *r, eng_backend *be) {
    size_t n = (size_t)r->b.T * r->m.cfg.C;
    float *dx = gc_get_act(be, r->a.dres, n);
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)dx[i] * dx[i];
    free(dx);
    return sqrt(s);
}

static inline void bench_layer_close(bench_layer_run *r, eng_backend *be) {
    be->free(be, r->x);
    be->free(be, r->dy);
    be->free(be, r->w);
    be->free(be, r->gw);
    model_acts_free(&r->m, &r->a);
    model_views_free(&r->wv);
    model_views_free(&r->gv);
    model_free(&r->m);
    pack_batch_free(&r->b);
    for (int i = 0; i < r->N; i++) free(r->resp[i]);
    free(r->resp);
    free(r->Rs);
    free(r->prompt);
}
#endif
