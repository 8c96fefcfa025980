/* bench_layer.c — one Qwen3-8B-shaped decoder layer (C=4096, H=32, K=8, D=128, F=12288, q/k
 * norm, RoPE) forward+backward on the CUDA backend, as ../shared/bench/peer_layer.py times its
 * PyTorch layer: one packed group [P; R_1..R_N] (P + NR tokens), a random bf16 input x and a
 * random upstream gradient dy, no embedding and no lm-head. The layer is engine/model/model.c's
 * model_layer_fwd / model_layer_bwd, the functions model_forward / model_backward run for every
 * layer (a 1-layer model with M = 0 would back-propagate an all-zero gradient from the final
 * norm); the parameter layout, activations and RoPE table come from a 1-layer model_init.
 * As in training, the layer opens with the residual add that closes the previous layer (fused
 * with its first norm: x += res, res a stand-in for the previous layer's xm: the dy tensor) and ends
 * with its MLP branch, whose residual add the next layer opens with: one add per layer, as in
 * the peer. Weight gradients accumulate in fp32, as in training; dx is written like the peer's
 * x.grad.
 * Prints ms (median of REPS after a warm-up) and the peak device memory in use (cudaMemGetInfo
 * against the free memory after backend creation: weights, fp32 grads, activations, scratch).
 * `moe` first: a Qwen3-30B-A3B-shaped layer instead (C=2048, H=32, K=4, 128 experts of
 * Fm=768, top-8 renormalised), its useful FLOP counted on the active parameters (the router and
 * the eight routed experts a token).
 * Usage: bench_layer [moe] [P N R ...]   (default: four (P, N, R) configurations; with moe,
 * one group P=1024 N=16 R=512) */
#include <cuda_runtime_api.h>
#include <time.h>

#include "tests/bench/gpu/bench_layer.h"

enum { REPS = 7 };


static void bench(eng_backend *be, size_t free0, int moe, int P, int N, int R) {
    model_config c = {.arch = ARCH_QWEN3,
                      .L = 1,
                      .C = 4096,
                      .H = 32,
                      .K = 8,
                      .D = 128,
                      .F = 12288,
                      .V = 256,
                      .max_pos = 65536,
                      .eps = 1e-6f,
                      .rope_theta = 1000000.0f,
                      .qk_norm = 1,
                      .tied = 1,
                      .bos_id = -1};
    snprintf(c.arch_name, sizeof c.arch_name, "qwen3");
    if (moe) gc_moe_30b_a3b(&c, 1);
    bench_layer_run r;
    bench_layer_open(&r, be, &c, P, N, R);
    int T = r.b.T, C = c.C;
    double t[REPS + 1], tf[REPS + 1];
    size_t used_peak = 0, total;
    for (int rep = 0; rep <= REPS; rep++) {
        /* the layer input and the upstream gradient, restored each rep (backward leaves dx in
         * dres) */
        if (cudaMemcpy(r.a.l[0].x, r.x, (size_t)T * C * 2, cudaMemcpyDeviceToDevice) ||
            cudaMemcpy(r.a.dres, r.dy, (size_t)T * C * 2, cudaMemcpyDeviceToDevice) || be->sync(be))
            gc_die(be, "setup");
        double t0 = gc_now();
        model_layer_fwd(&r.m, &r.wv, &r.a, 0, r.a.xL, &r.d, NULL, NULL);
        if (be->sync(be)) gc_die(be, "forward");
        double t1 = gc_now();
        model_layer_bwd(&r.m, &r.wv, &r.gv, &r.a, 0, &r.d);
        if (be->sync(be)) gc_die(be, "backward");
        double t2 = gc_now();
        t[rep] = t2 - t0;
        tf[rep] = t1 - t0;
        size_t fr;
        cudaMemGetInfo(&fr, &total);
        if (free0 - fr > used_peak) used_peak = free0 - fr;
    }
    qsort(t + 1, REPS, sizeof(double), gc_cmpd);
    qsort(tf + 1, REPS, sizeof(double), gc_cmpd);
    double mlp = moe ? 3.0 * C * c.Fm * c.top_k + (double)C * c.E : 3.0 * C * c.F;
    double lin = 6.0 * T * ((double)C * 32 * 128 + 2.0 * C * c.K * 128 + 32.0 * 128 * C + mlp);
    double att_f = 2.0 * P * P * 32 * 128 + 4.0 * N * R * (P + R / 2.0) * 32 * 128;
    double flop = lin + 3.5 * att_f;
    printf("grpod-cuda %slayer P=%d N=%d R=%d T=%d: fwd+bwd %.2f ms (min %.2f max %.2f; fwd %.2f) useful %.1f TFLOP "
           "-> %.0f TFLOP/s; peak %.2f GiB (device memory in use); |dx| %.3g\n",
           moe ? "moe " : "", P, N, R, T, t[1 + REPS / 2] * 1e3, t[1] * 1e3, t[REPS] * 1e3, tf[1 + REPS / 2] * 1e3, flop / 1e12,
           flop / t[1 + REPS / 2] / 1e12, used_peak / 1073741824.0, bench_layer_dx_norm(&r, be));
    fflush(stdout);
    bench_layer_close(&r, be);
}

int main(int argc, char **argv) {
    int cfg[4][3] = {{8192, 8, 1024}, {16384, 8, 1024}, {32768, 4, 1024}, {4096, 16, 512}}, nc = 4;
    eng_backend *be;
    if (backend_cuda_create(&be, 0)) gc_die(NULL, "backend_cuda_create");
    size_t free0, total;
    cudaMemGetInfo(&free0, &total);
    int moe = argc > 1 && !strcmp(argv[1], "moe"), a0 = 1 + moe;
    if (argc > a0 + 2) {
        for (int i = a0; i + 2 < argc; i += 3) bench(be, free0, moe, atoi(argv[i]), atoi(argv[i + 1]), atoi(argv[i + 2]));
    } else if (moe) {
        bench(be, free0, 1, 1024, 16, 512);
    } else {
        for (int i = 0; i < nc; i++) bench(be, free0, 0, cfg[i][0], cfg[i][1], cfg[i][2]);
    }
    be->destroy(be);
    return 0;
}
