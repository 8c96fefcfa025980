/* bench_step.c — one full GRPO update step on the CUDA backend with random weights, timed per
 * phase: old pass (policy, no grad), ref pass (reference bf16 weights), policy forward+backward,
 * optimizer (grad norm, clip, fused AdamW on the fp32 master). One group [P; R_1..R_N] packed
 * (P + NR tokens), Qwen3 dims with tied embeddings as ../shared/bench/peer_step.py builds them.
 * Prints ms per phase (median of 3 after a warm-up), tokens/s, useful TFLOP/s with the peer's
 * FLOP count and its "% of 793" (measured bf16 GEMM rate), and device memory in use.
 * Usage: bench_step [0.6b|1.7b|4b] [P N R] */
#include <cuda_runtime_api.h>
#include <time.h>

#include "engine/model.h"
#include "engine/pack.h"
#include "tests/gpu/gpu_check.h"


int main(int argc, char **argv) {
    const char *size = argc > 1 ? argv[1] : "1.7b";
    int P = argc > 4 ? atoi(argv[2]) : 4096, N = argc > 4 ? atoi(argv[3]) : 16, R = argc > 4 ? atoi(argv[4]) : 512;
    int C = 2048, F = 6144, L = 28, H = 16, K = 8;
    if (!strcmp(size, "0.6b")) { C = 1024; F = 3072; }
    if (!strcmp(size, "4b")) { C = 2560; F = 9728; L = 36; H = 32; }
    model_config c = { .arch = ARCH_QWEN3, .L = L, .C = C, .H = H, .K = K, .D = 128, .F = F, .V = 151936,
                       .max_pos = 40960, .eps = 1e-6f, .rope_theta = 1000000.0f, .qk_norm = 1, .tied = 1, .bos_id = -1 };
    snprintf(c.arch_name, sizeof c.arch_name, "qwen3");
    eng_backend *be;
    if (backend_cuda_create(&be, 0)) gc_die(NULL, "backend_cuda_create");
    size_t free0, total;
    cudaMemGetInfo(&free0, &total);
    model m;
    if (model_init(&m, &c, be)) gc_die(be, "model_init");
    size_t n = (size_t)m.n_elems;
    void *w = be->alloc(be, n * 2), *wref = be->alloc(be, n * 2);
    float *master = be->alloc(be, n * 4), *g = be->alloc(be, n * 4), *mo = be->alloc(be, n * 4), *ve = be->alloc(be, n * 4);
    if (!w || !wref || !master || !g || !mo || !ve) gc_die(be, "weights");
    /* random weights: one 16M-value random block tiled over the buffer */
    size_t blk = (size_t)1 << 24;
    float *hb = gc_rand(blk, 0.02f, 7);
    for (size_t off = 0; off < n; off += blk)
        if (be->to_dev(be, master + off, hb, (n - off < blk ? n - off : blk) * 4)) gc_die(be, "upload");
    free(hb);
    be->f32_to_act(be, w, master, n);
    be->f32_to_act(be, wref, master, n);
    be->zero(be, mo, n * 4);
    be->zero(be, ve, n * 4);
    model_views wv, rv, gv;
    model_views_make(&m, w, 2, &wv);
    model_views_make(&m, wref, 2, &rv);
    model_views_make(&m, g, 4, &gv);

    int *prompt = malloc((size_t)P * 4), **resp = malloc((size_t)N * sizeof(int *)), *Rs = malloc((size_t)N * 4);
    unsigned long long s = 5;
    for (int i = 0; i < P; i++) prompt[i] = (int)((check_randf(&s, 0.5f) + 0.5f) * 150000);
    for (int r = 0; r < N; r++) {
        Rs[r] = R;
        resp[r] = malloc((size_t)R * 4);
        for (int i = 0; i < R; i++) resp[r][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * 150000);
    }
    pack_group pg = { prompt, P, N, (const int *const *)resp, Rs };
    pack_batch b;
    if (pack_build(&b, &pg, 0, 1, PACK_PACKED)) gc_die(NULL, "pack_build");
    model_acts a;
    if (model_acts_init(&m, &a, b.T, b.M, 1)) gc_die(be, "model_acts_init");
    model_input in;
    model_input_from_batch(&in, &b);
    float *old = malloc((size_t)b.M * 4), *dlogp = malloc((size_t)b.M * 4);
    for (int i = 0; i < b.M; i++) dlogp[i] = (i % 3 - 1) * 1.0f / b.M;   /* a PPO-like advantage-weighted mean */

    enum { REPS = 3 };
    double t[REPS + 1][4];
    size_t used_peak = 0;
    for (int rep = 0; rep <= REPS; rep++) {
        double t0 = gc_now();
        if (model_forward(&m, &wv, &a, NULL, &in, 1.0f, 0) || be->to_host(be, old, a.logp, (size_t)b.M * 4)) gc_die(be, "old");
        double t1 = gc_now();
        if (model_forward(&m, &rv, &a, NULL, &in, 1.0f, 0)) gc_die(be, "ref");
        double t2 = gc_now();
        be->zero(be, g, n * 4);
        if (model_forward(&m, &wv, &a, NULL, &in, 1.0f, 0)) gc_die(be, "policy fwd");
        if (model_backward(&m, &wv, &gv, &a, &in, dlogp, NULL, 1.0f)) gc_die(be, "policy bwd");
        double t3 = gc_now();
        double norm = sqrt(be->sumsq(be, g, (long long)n));
        if (norm > 1.0) be->scale(be, g, (long long)n, (float)(1.0 / (norm + 1e-6)));
        be->adamw(be, master, w, g, mo, ve, (long long)n, 1e-6f, 0.9f, 0.999f, 1e-8f, 0.01f, rep + 1);
        if (be->sync(be)) gc_die(be, "adamw");
        double t4 = gc_now();
        t[rep][0] = t1 - t0; t[rep][1] = t2 - t1; t[rep][2] = t3 - t2; t[rep][3] = t4 - t3;
        size_t fr;
        cudaMemGetInfo(&fr, &total);
        if (free0 - fr > used_peak) used_peak = free0 - fr;
        fprintf(stderr, "rep %d: old %.0f ref %.0f policy %.0f optim %.0f ms (grad norm %.3g)\n", rep, t[rep][0] * 1e3,
                t[rep][1] * 1e3, t[rep][2] * 1e3, t[rep][3] * 1e3, norm);
    }
    double med[4], tot = 0;
    for (int k = 0; k < 4; k++) {
        double v[REPS];
        for (int r = 0; r < REPS; r++) v[r] = t[r + 1][k];
        qsort(v, REPS, sizeof(double), gc_cmpd);
        med[k] = v[REPS / 2];
        tot += med[k];
    }
    double nonemb = (double)L * ((double)C * H * 128 + 2.0 * C * K * 128 + (double)H * 128 * C + 3.0 * C * F);
    double att = 2.0 * P * P * H * 128 + 4.0 * N * R * (P + R / 2.0) * H * 128;
    double fwd = 2 * nonemb * (P + (double)N * R) + 2.0 * C * c.V * N * R + L * att;
    double flops = 5 * fwd;
    printf("grpod-cuda %s P=%d N=%d R=%d T=%d: total %.0f ms  old %.0f  ref %.0f  policy %.0f  optim %.0f  "
           "peak %.1f GiB (device memory in use)\n", size, P, N, R, b.T, tot * 1e3, med[0] * 1e3, med[1] * 1e3,
           med[2] * 1e3, med[3] * 1e3, used_peak / 1073741824.0);
    printf("grpod-cuda %s: %.0f packed tokens/s per pass-set; useful %.0f TFLOP -> %.0f TFLOP/s (%.0f%% of 793)\n",
           size, b.T / tot, flops / 1e12, flops / tot / 1e12, flops / tot / 793e12 * 100);
    /* where the time goes: one layer's attention forward and backward on this batch */
    {
        int T = b.T;
        struct model_layer_acts *A = &a.l[0];
        attn_ranges rg;
        int *ints = a.ints;
        rg.a0 = ints + 2 * a.cap_T; rg.a1 = ints + 3 * a.cap_T; rg.b0 = ints + 4 * a.cap_T; rg.b1 = ints + 5 * a.cap_T;
        double f0 = gc_now();
        for (int i = 0; i < 3; i++) be->attention_fwd(be, A->att, A->lse, A->q, A->k, A->v, rg, T, H, K, 128);
        be->sync(be);
        double f1 = gc_now();
        for (int i = 0; i < 3; i++)
            be->attention_bwd(be, a.dq, a.dk, a.dv, a.datt, A->q, A->k, A->v, A->att, A->lse, rg, T, H, K, 128);
        if (be->sync(be)) gc_die(be, "attention");
        double f2 = gc_now();
        double pairs = (double)P * (P + 1) / 2 + (double)N * R * P + (double)N * R * (R + 1) / 2;
        printf("grpod-cuda %s: attention per layer: fwd %.1f ms, bwd %.1f ms (%.0f M query-key pairs x %d heads; "
               "x%d layers = %.0f ms fwd, %.0f ms bwd)\n", size, (f1 - f0) / 3 * 1e3, (f2 - f1) / 3 * 1e3, pairs / 1e6, H,
               L, (f1 - f0) / 3 * 1e3 * L, (f2 - f1) / 3 * 1e3 * L);
    }
    model_acts_free(&m, &a);
    pack_batch_free(&b);
    be->destroy(be);
    return 0;
}
