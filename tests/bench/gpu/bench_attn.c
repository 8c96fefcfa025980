/* bench_attn.c — attention alone on the CUDA backend, packed shared-prefix layout: one group
 * [P; R_1 .. R_N] (the prompt causal on itself, each response over the prompt and causally over
 * itself), Qwen3-8B heads by default (H=32, K=8, D=128). Times the forward and forward+backward
 * (median of 10 after 3 warm-ups, host clock around a device sync) and prints useful TFLOP/s as
 * ../shared/bench/peer_attention.py counts them: 4·D·H per unmasked query-key pair forward,
 * forward+backward 3.5x that. Random bf16 inputs (never zeros).
 * Usage: bench_attn [P N R [H K D]]
 *        bench_attn decode G P N own [H K D]: the decode forward (attention_decode.cu) for G groups
 *        of N responses over a P-row prompt and `own` rows each, Qwen3-1.7B heads by default; 28
 *        calls (one per layer, each on its own KV cache: together more than L2) captured in one
 *        CUDA graph, us per call (median of 20 replays) and the KV bytes it must read.
 * GRPOD_TUNE_EXACT=1 times the batch-invariant kernel (attention_exact.cu) instead. */
#include <time.h>

#include "engine/model/pack.h"
#include "tests/gpu/gpu_check.h"


static int bench_decode(int argc, char **argv) {
    int G = atoi(argv[2]), P = atoi(argv[3]), N = atoi(argv[4]), own = atoi(argv[5]);
    int H = argc > 8 ? atoi(argv[6]) : 16, K = argc > 8 ? atoi(argv[7]) : 8, D = argc > 8 ? atoi(argv[8]) : 128;
    enum { LAYERS = 28 };
    int T = G * N, S = G * P + T * own;
    ranges rh = {T, malloc((size_t)T * 4), malloc((size_t)T * 4), malloc((size_t)T * 4), malloc((size_t)T * 4)};
    for (int t = 0; t < T; t++) {
        int g = t / N;
        rh.a0[t] = g * P;
        rh.a1[t] = g * P + P;
        rh.b0[t] = G * P + t * own;
        rh.b1[t] = rh.b0[t] + own;
    }
    eng_backend *be;
    if (backend_cuda_create(&be, 0)) gc_die(NULL, "backend_cuda_create");
    size_t nq = (size_t)T * H * D, nkv = (size_t)S * K * D;
    float *h = gc_rand(nkv + 16, 1.0f, 1);
    void *q = gc_act(be, h, nq), *kv[LAYERS][2];
    for (int l = 0; l < LAYERS; l++) {
        kv[l][0] = gc_act(be, h + l % 7, nkv);
        kv[l][1] = gc_act(be, h + 9 + l % 5, nkv);
    }
    free(h);
    void *o = be->alloc(be, nq * 2);
    float *lse = be->alloc(be, (size_t)T * H * 4);
    attn_ranges rg = gc_dev_ranges(be, rh);
    be->attention_fwd(be, o, lse, q, kv[0][0], kv[0][1], rg, T, H, K, D);
    void *gr = NULL;
    if (be->sync(be) || be->graph_begin(be)) gc_die(be, "capture");
    for (int l = 0; l < LAYERS; l++) be->attention_fwd(be, o, lse, q, kv[l][0], kv[l][1], rg, T, H, K, D);
    if (be->graph_end(be, &gr)) gc_die(be, "capture end");
    double t[20];
    for (int i = 0; i < 22; i++) {
        double t0 = gc_now();
        if (be->graph_launch(be, gr) || be->sync(be)) gc_die(be, "replay");
        if (i >= 2) t[i - 2] = (gc_now() - t0) * 1e6 / LAYERS;
    }
    qsort(t, 20, sizeof(double), gc_cmpd);
    double mb = (double)S * K * D * 2 * 2 / 1e6;
    printf("decode attention%s G=%d P=%d N=%d own=%d H=%d K=%d D=%d: %.2f us per call, KV %.2f MB (%.0f GB/s)\n",
           be->tune.exact ? " (exact)" : "", G, P, N, own, H, K, D, t[10], mb, mb * 1e3 / t[10]);
    be->graph_free(be, gr);
    be->destroy(be);
    free_ranges(rh);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 5 && !strcmp(argv[1], "decode")) return bench_decode(argc, argv);
    int P = argc > 3 ? atoi(argv[1]) : 8192, N = argc > 3 ? atoi(argv[2]) : 8, R = argc > 3 ? atoi(argv[3]) : 1024;
    int H = argc > 6 ? atoi(argv[4]) : 32, K = argc > 6 ? atoi(argv[5]) : 8, D = argc > 6 ? atoi(argv[6]) : 128;
    int T = P + N * R;
    int Rs[N > 0 ? N : 1];
    for (int s = 0; s < N; s++) Rs[s] = R;
    const int *Rp[] = {Rs};
    ranges rh = make_ranges(1, &P, &N, Rp);
    eng_backend *be;
    if (backend_cuda_create(&be, 0)) gc_die(NULL, "backend_cuda_create");
    size_t nq = (size_t)T * H * D, nk = (size_t)T * K * D;
    float *h = gc_rand(nq + 16, 1.0f, 1);
    void *q = gc_act(be, h, nq), *dout = gc_act(be, h + 7, nq), *k = gc_act(be, h + 11, nk), *v = gc_act(be, h + 13, nk);
    free(h);
    void *o = be->alloc(be, nq * 2), *dq = be->alloc(be, nq * 2), *dk = be->alloc(be, nk * 2), *dv = be->alloc(be, nk * 2);
    float *lse = be->alloc(be, (size_t)T * H * 4);
    attn_ranges rg = gc_dev_ranges(be, rh);
    if (!o || !dq || !dk || !dv || !lse) gc_die(be, "alloc");
    be->zero(be, dk, nk * 2);
    be->zero(be, dv, nk * 2);
    enum { WARM = 3, REPS = 10 };
    double tf[REPS], tb[REPS];
    for (int i = 0; i < WARM + REPS; i++) {
        if (be->sync(be)) gc_die(be, "attention");
        double t0 = gc_now();
        be->attention_fwd(be, o, lse, q, k, v, rg, T, H, K, D);
        if (be->sync(be)) gc_die(be, "attention_fwd");
        double t1 = gc_now();
        be->attention_fwd(be, o, lse, q, k, v, rg, T, H, K, D);
        be->attention_bwd(be, dq, dk, dv, dout, q, k, v, o, lse, rg, T, T, H, K, D);
        if (be->sync(be)) gc_die(be, "attention_bwd");
        double t2 = gc_now();
        if (i >= WARM) {
            tf[i - WARM] = t1 - t0;
            tb[i - WARM] = t2 - t1;
        }
    }
    qsort(tf, REPS, sizeof(double), gc_cmpd);
    qsort(tb, REPS, sizeof(double), gc_cmpd);
    double pairs = (double)P * (P + 1) / 2 + (double)N * ((double)R * P + (double)R * (R + 1) / 2);
    double f = 4.0 * D * H * pairs, mf = tf[REPS / 2] * 1e3, mb = tb[REPS / 2] * 1e3;
    float *oh = gc_get_act(be, o, nq);
    double sum = 0;
    for (size_t i = 0; i < nq; i += 997) sum += oh[i];
    printf("grpod-%s P=%d N=%d R=%d H=%d K=%d D=%d: fwd %.2f ms %.0f TFLOP/s | fwd+bwd %.2f ms %.0f TFLOP/s "
           "(useful fwd %.2f TFLOP; checksum %.4g)\n",
           be->tune.exact ? "exact" : "flash", P, N, R, H, K, D, mf, f / mf / 1e9, mb, 3.5 * f / mb / 1e9, f / 1e12, sum);
    free(oh);
    be->destroy(be);
    free_ranges(rh);
    return isfinite(sum) ? 0 : 1;
}
