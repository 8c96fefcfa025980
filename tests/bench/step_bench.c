/* step_bench.c — CPU benchmark of grpod's one idea: a forward+backward pass over a group in
 * the packed P + NR layout against the standard N(P+R) layout, on the same random model.
 * Prints tokens, ms per pass and the ratios; the floor is the matmul FLOPs of the pass
 * (6 × matmul parameters × tokens, attention excluded) at the matmul rate measured here.
 * Usage: build/bench/step_bench [P N R] (defaults 512 8 64). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/model/model.h"
#include "kernels/matmul.h"
#include <omp.h>
static int omp_threads(void) { return omp_get_max_threads(); }

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double run(model *m, model_views *wv, model_views *gv, pack_group *g, pack_layout lay, int *T, int reps) {
    pack_batch b;
    pack_build(&b, g, 0, 1, lay);
    model_acts a;
    if (model_acts_init(m, &a, b.T, b.M, 1)) {
        fprintf(stderr, "no memory\n");
        exit(1);
    }
    model_input in;
    model_input_from_batch(&in, &b);
    float *dl = malloc((size_t)b.M * 4);
    for (int i = 0; i < b.M; i++) dl[i] = 1.0f / b.M;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        model_forward(m, wv, &a, NULL, &in, 1.0f, 0);
        model_backward(m, wv, gv, &a, &in, dl, NULL, 1.0f);
        double t = now() - t0;
        if (t < best) best = t;
    }
    *T = b.T;
    free(dl);
    model_acts_free(m, &a);
    pack_batch_free(&b);
    return best * 1e3;
}

int main(int argc, char **argv) {
    int P = argc > 3 ? atoi(argv[1]) : 512, N = argc > 3 ? atoi(argv[2]) : 8, R = argc > 3 ? atoi(argv[3]) : 64;
    model_config c = {.arch = ARCH_QWEN3,
                      .arch_name = "qwen3",
                      .L = 4,
                      .C = 256,
                      .H = 4,
                      .K = 2,
                      .D = 64,
                      .F = 768,
                      .V = 259,
                      .max_pos = 8192,
                      .eps = 1e-6f,
                      .rope_theta = 1e6f,
                      .tied = 1,
                      .qk_norm = 1,
                      .bos_id = -1};
    eng_backend *be;
    backend_cpu_create(&be, 0);
    model m;
    model_init(&m, &c, be);
    float *w = malloc((size_t)m.n_elems * 4), *g = calloc((size_t)m.n_elems, 4);
    unsigned long long s = 1;
    for (long long i = 0; i < m.n_elems; i++) {
        s = s * 6364136223846793005ULL + 1;
        w[i] = ((s >> 40) / 16777216.0f - 0.5f) * 0.1f;
    }
    model_views wv, gv;
    model_views_make(&m, w, 4, &wv);
    model_views_make(&m, g, 4, &gv);
    int *prompt = malloc((size_t)P * 4), **resp = malloc((size_t)N * sizeof(int *)), *Rs = malloc((size_t)N * 4);
    for (int i = 0; i < P; i++) prompt[i] = (i * 7) % c.V;
    for (int n = 0; n < N; n++) {
        Rs[n] = R;
        resp[n] = malloc((size_t)R * 4);
        for (int i = 0; i < R; i++) resp[n][i] = (i * 13 + n) % c.V;
    }
    pack_group grp = {.prompt = prompt, .P = P, .N = N, .resp = (const int *const *)resp, .R = Rs};
    /* matmul rate: a square-ish fp32 GEMM with the same kernel */
    int MT = 512, MI = 768, MO = 768;
    float *x = calloc((size_t)MT * MI, 4), *y = malloc((size_t)MT * MO * 4), *mw = calloc((size_t)MO * MI, 4);
    double t0 = now();
    for (int r = 0; r < 5; r++) matmul_fwd_cpu(y, x, mw, NULL, MT, MI, MO);
    double gflops = 5 * 2.0 * MT * MI * MO / (now() - t0) / 1e9;
    int Tp, Ts;
    double tp = run(&m, &wv, &gv, &grp, PACK_PACKED, &Tp, 3);
    double ts = run(&m, &wv, &gv, &grp, PACK_STANDARD, &Ts, 3);
    long long mm = (long long)c.L * ((long long)c.C * (c.H + 2 * c.K) * c.D + (long long)c.H * c.D * c.C + 3LL * c.C * c.F);
    double floor_p = 6.0 * mm * Tp / (gflops * 1e9) * 1e3;
    printf("model: qwen3-shaped L=%d C=%d F=%d, %lld params; group P=%d N=%d R=%d; %d threads; fp32 matmul %.1f GFLOP/s\n", c.L,
           c.C, c.F, config_n_params(&c), P, N, R, omp_threads(), gflops);
    printf("%-10s %8s %12s %14s\n", "layout", "tokens", "fwd+bwd ms", "matmul floor ms");
    printf("%-10s %8d %12.1f %14.1f\n", "packed", Tp, tp, floor_p);
    printf("%-10s %8d %12.1f %14.1f\n", "standard", Ts, ts, floor_p * Ts / Tp);
    printf("token ratio %.2fx, time ratio standard/packed %.2fx, packed vs its floor %.2fx\n", (double)Ts / Tp, ts / tp,
           tp / floor_p);
    return 0;
}
