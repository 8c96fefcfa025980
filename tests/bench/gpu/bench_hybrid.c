/* bench_hybrid.c — one Qwen3.5 layer pair, a gated DeltaNet layer then a gated attention layer,
 * forward+backward on the CUDA backend at the HF default text config's dims (Qwen3.5-9B class:
 * C=4096, F=12288; DeltaNet 16 key heads, 32 value heads, Dk = Dv = 128, 4 conv taps) on one
 * packed group [P; R_1..R_N]; the gated attention layer at the config's H=16, K=4, D=256 (the
 * mma.sync kernels of kernels/attention_mma.cu). As bench_layer.c:
 * engine/model/model.c's model_layer_fwd / model_layer_bwd on a 2-layer model (bench_layer.h's
 * set-up): a random bf16 input and upstream gradient, no embedding and no lm-head; fp32 weight
 * gradients accumulate. Prints ms per layer and pass (median of REPS after a warm-up) and the
 * peak device memory in use, and the projection to Qwen3.5-9B's 32 layers (24 DeltaNet, 8 gated:
 * the config's 3:1 layer_types). tests/gpu/peer_hybrid_step.py is the PyTorch peer at the same dims.
 * Usage: bench_hybrid [P N R ...]   (default: 4096 16 512 and 1024 16 256) */
#include <cuda_runtime_api.h>
#include <time.h>

#include "tests/bench/gpu/bench_layer.h"

enum { REPS = 5 };

static void bench(eng_backend *be, size_t free0, int P, int N, int R) {
    model_config c;
    gc_qwen3_5_9b(&c, 2, 0); /* the V of a layer-only run does not matter: no embedding or lm head */
    c.V = 256;
    c.attn[0] = ATTN_DELTANET;
    c.attn[1] = ATTN_GATED;
    bench_layer_run r;
    bench_layer_open(&r, be, &c, P, N, R);
    int T = r.b.T, C = c.C;
    double t[4][REPS + 1]; /* DeltaNet fwd, gated fwd, gated bwd, DeltaNet bwd */
    size_t used_peak = 0, total;
    for (int rep = 0; rep <= REPS; rep++) {
        if (cudaMemcpy(r.a.l[0].x, r.x, (size_t)T * C * 2, cudaMemcpyDeviceToDevice) ||
            cudaMemcpy(r.a.dres, r.dy, (size_t)T * C * 2, cudaMemcpyDeviceToDevice) || be->sync(be))
            gc_die(be, "setup");
        double t0 = gc_now();
        model_layer_fwd(&r.m, &r.wv, &r.a, 0, r.a.l[1].x, &r.d, NULL, NULL);
        if (be->sync(be)) gc_die(be, "deltanet forward");
        double t1 = gc_now();
        model_layer_fwd(&r.m, &r.wv, &r.a, 1, r.a.xL, &r.d, NULL, NULL);
        if (be->sync(be)) gc_die(be, "gated forward");
        double t2 = gc_now();
        model_layer_bwd(&r.m, &r.wv, &r.gv, &r.a, 1, &r.d);
        if (be->sync(be)) gc_die(be, "gated backward");
        double t3 = gc_now();
        model_layer_bwd(&r.m, &r.wv, &r.gv, &r.a, 0, &r.d);
        if (be->sync(be)) gc_die(be, "deltanet backward");
        double t4 = gc_now();
        t[0][rep] = t1 - t0;
        t[1][rep] = t2 - t1;
        t[2][rep] = t3 - t2;
        t[3][rep] = t4 - t3;
        size_t fr;
        cudaMemGetInfo(&fr, &total);
        if (free0 - fr > used_peak) used_peak = free0 - fr;
    }
    double med[4], sum = 0;
    for (int k = 0; k < 4; k++) {
        qsort(t[k] + 1, REPS, sizeof(double), gc_cmpd);
        med[k] = t[k][1 + REPS / 2] * 1e3;
        sum += med[k];
    }
    printf("grpod-cuda qwen3.5 layer pair P=%d N=%d R=%d T=%d: fwd+bwd %.2f ms (deltanet fwd %.2f bwd %.2f; gated attn fwd "
           "%.2f bwd %.2f); peak %.2f GiB; |dx| %.3g\n",
           P, N, R, T, sum, med[0], med[3], med[1], med[2], used_peak / 1073741824.0, bench_layer_dx_norm(&r, be));
    printf("grpod-cuda qwen3.5-9B projection P=%d N=%d R=%d: 24 DeltaNet + 8 gated attention layers fwd+bwd %.0f ms "
           "(layers only: no embedding, lm head, loss or optimizer)\n",
           P, N, R, 24 * (med[0] + med[3]) + 8 * (med[1] + med[2]));
    fflush(stdout);
    bench_layer_close(&r, be);
}

int main(int argc, char **argv) {
    int cfg[2][3] = {{4096, 16, 512}, {1024, 16, 256}};
    eng_backend *be;
    if (backend_cuda_create(&be, 0)) gc_die(NULL, "backend_cuda_create");
    size_t free0, total;
    cudaMemGetInfo(&free0, &total);
    if (argc > 3)
        for (int i = 1; i + 2 < argc; i += 3) bench(be, free0, atoi(argv[i]), atoi(argv[i + 1]), atoi(argv[i + 2]));
    else
        for (int i = 0; i < 2; i++) bench(be, free0, cfg[i][0], cfg[i][1], cfg[i][2]);
    be->destroy(be);
    return 0;
}
