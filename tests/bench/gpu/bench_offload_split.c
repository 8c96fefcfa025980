/* bench_offload_split.c — one AdamW step of a split optimizer state (engine/train/state.h) as
 * state_step runs it: elements [0, d) by the device's fused AdamW, [d, n) by the offload
 * (engine/train/offload.h: gradients down, host AdamW, bf16 weights up), for several fractions
 * f = (n - d) / n in host memory. A benchmark (indicative on a shared GPU), never a test: prints
 * the median of REPS steps for each f and the host part's ns an element, from which a model's
 * step is predicted (the host part dominates: ~18 bytes an element on the device, ~30 through
 * host memory).
 * Usage: bench_offload_split [N_MILLIONS (512)] [REPS (3)] */
#include <cuda_runtime_api.h>

#include "engine/train/offload.h"
#include "tests/gpu/gpu_check.h"

int main(int argc, char **argv) {
    long long n = (argc > 1 ? atoll(argv[1]) : 512) * 1000000LL;
    int reps = argc > 2 ? atoi(argv[2]) : 3;
    if (n <= 0 || reps < 1 || reps > 15) gc_die(NULL, "usage: bench_offload_split [N_MILLIONS] [REPS <= 15]");
    eng_backend *be;
    if (backend_cuda_create(&be, 0)) gc_die(NULL, "backend_cuda_create");
    /* the device holds all n (the largest d), the host all n (the largest host part) */
    float *master_d = be->alloc(be, n * 4), *m_d = be->alloc(be, n * 4), *v_d = be->alloc(be, n * 4), *g_d = be->alloc(be, n * 4);
    void *act = be->alloc(be, n * 2);
    float *master_h = offload_host_alloc(n), *m_h = offload_host_alloc(n), *v_h = offload_host_alloc(n);
    float *g = malloc((size_t)1 << 26);
    if (!master_d || !m_d || !v_d || !g_d || !act || !master_h || !m_h || !v_h || !g) gc_die(be, "alloc");
    for (long long i = 0; i < (1LL << 24); i++)
        g[i] = (float)((i * 2654435761LL) % 2001 - 1000) * 1e-5f; /* a pattern, not zeros */
    for (long long o = 0; o < n; o += 1LL << 24) {
        size_t k = (size_t)(n - o < (1LL << 24) ? n - o : 1LL << 24) * 4;
        if (be->to_dev(be, g_d + o, g, k) || be->to_dev(be, master_d + o, g, k)) gc_die(be, "upload");
        memcpy(master_h + o, g, k);
    }
    be->zero(be, m_d, n * 4);
    be->zero(be, v_d, n * 4);
    eng_offload off;
    if (offload_init(&off, be, n, 0)) gc_die(be, "offload_init");
    static const double fr[] = {0, 0.25, 0.5, 0.82, 1};
    int step = 0;
    printf("bench_offload_split: n=%lld, median of %d steps (indicative: shared GPU)\n", n, reps);
    printf("%-8s %12s %12s %10s %14s\n", "f_host", "d_device", "host_n", "ms_step", "ns/host_elem");
    for (size_t k = 0; k < sizeof fr / sizeof fr[0]; k++) {
        long long hn = (long long)(fr[k] * (double)n + 0.5), d = n - hn;
        double t[15];
        for (int r = 0; r < reps; r++) {
            if (be->sync(be)) gc_die(be, "sync");
            double t0 = gc_now();
            ++step;
            if (d) be->adamw(be, master_d, act, g_d, m_d, v_d, d, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.01f, step);
            if (hn &&
                offload_adamw(&off, hn, master_h + d, m_h + d, v_h + d, (char *)act + (size_t)d * 2, g_d + d, 1e-4f, 0.9f, 0.999f,
                              1e-8f, 0.01f, step))
                gc_die(be, "offload_adamw");
            if (be->sync(be)) gc_die(be, "sync");
            t[r] = (gc_now() - t0) * 1e3;
        }
        qsort(t, (size_t)reps, sizeof t[0], gc_cmpd);
        double ms = t[reps / 2];
        printf("%-8.2f %12lld %12lld %10.1f %14.3f\n", fr[k], d, hn, ms, hn ? ms * 1e6 / (double)hn : 0);
    }
    offload_free(&off);
    void *bufs[] = {master_d, m_d, v_d, g_d, act};
    for (int i = 0; i < 5; i++) be->free(be, bufs[i]);
    free(master_h);
    free(m_h);
    free(v_h);
    free(g);
    be->destroy(be);
    return 0;
}
