/* bench_exact_mm.c — the linear layers' many-row GEMM y = x W^T in exact mode (tune.exact:
 * kernels/matmul_exact.cu, the few-row kernel's reduction order) against the default
 * (cuBLASLt's tuned algorithm), at Qwen3-1.7B and Qwen3-8B projection shapes and the row counts
 * of a training micro-batch and a prefill: us per call (median of 5 replays of a graph of 20
 * calls; W 16 MiB to 200 MiB, mostly past L2 at the larger shapes) and TFLOP/s.
 * Usage: bench_exact_mm [T ...]   (default T = 1024 4096 12288) */
#include "tests/gpu/gpu_check.h"

static double mm_us(eng_backend *be, void *y, const void *x, const void *w, int T, int I, int O) {
    be->matmul_fwd(be, y, x, w, NULL, T, I, O); /* plans: uncaptured */
    void *g = NULL;
    if (be->sync(be) || be->graph_begin(be)) gc_die(be, "capture");
    for (int i = 0; i < 20; i++) be->matmul_fwd(be, y, x, w, NULL, T, I, O);
    if (be->graph_end(be, &g)) gc_die(be, "capture end");
    double t[5];
    for (int r = 0; r < 6; r++) {
        double t0 = gc_now();
        if (be->graph_launch(be, g) || be->sync(be)) gc_die(be, "replay");
        if (r) t[r - 1] = (gc_now() - t0) * 1e6 / 20;
    }
    be->graph_free(be, g);
    qsort(t, 5, sizeof(double), gc_cmpd);
    return t[2];
}

int main(int argc, char **argv) {
    static const int SH[][2] = {{2048, 2048}, {2048, 6144},  {6144, 2048}, {4096, 4096},
                                {4096, 1024}, {4096, 12288}, {12288, 4096}};
    int Ts[8] = {1024, 4096, 12288}, nT = 3;
    if (argc > 1) {
        nT = 0;
        for (int i = 1; i < argc && nT < 8; i++) Ts[nT++] = atoi(argv[i]);
    }
    int Tmax = 0;
    for (int i = 0; i < nT; i++) Tmax = Ts[i] > Tmax ? Ts[i] : Tmax;
    eng_backend *be;
    if (backend_cuda_create(&be, 0)) gc_die(NULL, "backend_cuda_create");
    const size_t nx = (size_t)Tmax * 12288, nw = (size_t)12288 * 4096;
    float *h = gc_rand(nx > nw ? nx : nw, 1.0f, 5);
    void *x = gc_act(be, h, nx), *w = gc_act(be, h, nw), *y = be->alloc(be, (size_t)Tmax * 12288 * 2);
    free(h);
    if (!x || !w || !y) gc_die(be, "alloc");
    printf("%-6s %-6s %-6s %12s %9s %12s %9s %7s\n", "T", "I", "O", "exact us", "TFLOP/s", "default us", "TFLOP/s", "ratio");
    for (int i = 0; i < nT; i++)
        for (size_t j = 0; j < sizeof SH / sizeof SH[0]; j++) {
            const int T = Ts[i], I = SH[j][0], O = SH[j][1];
            be->tune.exact = 1;
            const double ex = mm_us(be, y, x, w, T, I, O);
            be->tune.exact = 0;
            const double df = mm_us(be, y, x, w, T, I, O);
            const double tf = 2.0 * T * I * O / 1e6;
            printf("%-6d %-6d %-6d %12.1f %9.0f %12.1f %9.0f %7.2f\n", T, I, O, ex, tf / ex, df, tf / df, ex / df);
        }
    be->destroy(be);
    return 0;
}
