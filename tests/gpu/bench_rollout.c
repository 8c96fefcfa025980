/* bench_rollout.c — eng_rollout on the CUDA backend with random weights (no checkpoint, no
 * tokenizer): G groups of one P-token prompt each, N responses per group, `new` tokens each,
 * temperature 1, ignore_eos, Qwen3 dims with tied embeddings as ../shared/bench/peer_rollout.py
 * builds them. Times prefill (start to the first progress callback: prompt prefill + first
 * sample) and the decode steps (between consecutive progress callbacks, which rollout.c calls
 * after each step's sampling), after a short warm-up rollout. Prints ms per decode step
 * (median and mean), tokens/s, and the HBM floor per step: bf16 weights + KV (each prompt's KV
 * once, each response's own KV at its mean length) over the device-to-device copy bandwidth
 * measured here (bytes read + written by cudaMemcpy), and at the 3.0 TB/s.
 * Usage: bench_rollout [0.6b|1.7b] [G P N new] */
#include <cuda_runtime_api.h>

#include "engine/engine_internal.h"
#include "tests/gpu/gpu_check.h"

typedef struct { double *t; int n, cap; } stamps;
static void on_progress(void *ud, double frac) {
    stamps *s = ud;
    if (s->n < s->cap) s->t[s->n++] = eng_now_ms();
}
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }

/* Device-to-device copy bandwidth in bytes/s (read + write), median of 9 copies of 1 GiB. */
static double copy_bw(void) {
    size_t n = (size_t)1 << 30;
    void *a, *b;
    if (cudaMalloc(&a, n) || cudaMalloc(&b, n)) return 0;
    cudaMemset(a, 1, n);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    double t[9];
    cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
    for (int i = 0; i < 9; i++) {
        float ms;
        cudaEventRecord(e0, 0);
        cudaMemcpy(b, a, n, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1, 0);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        t[i] = ms;
    }
    qsort(t, 9, sizeof(double), cmpd);
    cudaFree(a); cudaFree(b);
    cudaEventDestroy(e0); cudaEventDestroy(e1);
    return 2.0 * n / (t[4] * 1e-3);
}

int main(int argc, char **argv) {
    const char *size = argc > 1 ? argv[1] : "1.7b";
    int G = argc > 5 ? atoi(argv[2]) : 1, P = argc > 5 ? atoi(argv[3]) : 1024, N = argc > 5 ? atoi(argv[4]) : 16,
        NEW = argc > 5 ? atoi(argv[5]) : 256;
    int C = 2048, F = 6144, L = 28, H = 16, K = 8, D = 128;
    if (!strcmp(size, "0.6b")) { C = 1024; F = 3072; }
    model_config c = { .arch = ARCH_QWEN3, .L = L, .C = C, .H = H, .K = K, .D = D, .F = F, .V = 151936,
                       .max_pos = 40960, .eps = 1e-6f, .rope_theta = 1000000.0f, .qk_norm = 1, .tied = 1, .bos_id = -1 };
    snprintf(c.arch_name, sizeof c.arch_name, "qwen3");
    snprintf(c.dtype, sizeof c.dtype, "bfloat16");
    double bw = copy_bw();

    eng *e = calloc(1, sizeof *e);
    if (backend_cuda_create(&e->be, 0)) gc_die(NULL, "backend_cuda_create");
    eng_backend *be = e->be;
    if (model_init(&e->m, &c, be)) gc_die(be, "model_init");
    size_t n = (size_t)e->m.n_elems;
    e->w_act = be->alloc(be, n * 2);
    if (!e->w_act) gc_die(be, "weights");
    /* random weights: one 16M-value random block tiled over the buffer */
    size_t blk = (size_t)1 << 24;
    float *hb = gc_rand(blk, 0.02f, 7);
    for (size_t off = 0; off < n; off += blk)
        if (be->act_from_f32(be, (char *)e->w_act + off * 2, hb, n - off < blk ? n - off : blk)) gc_die(be, "upload");
    free(hb);
    model_views_make(&e->m, e->w_act, 2, &e->wv);
    snprintf(e->model_dir, sizeof e->model_dir, "random");

    int **prompt = malloc((size_t)G * sizeof(int *));
    eng_rollout_group *groups = malloc((size_t)G * sizeof *groups);
    unsigned long long s = 5;
    for (int g = 0; g < G; g++) {
        prompt[g] = malloc((size_t)P * 4);
        for (int i = 0; i < P; i++) prompt[g][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * 150000);
        groups[g] = (eng_rollout_group){ prompt[g], P, N };
    }
    eng_sampling sp;
    eng_sampling_default(&sp);
    sp.temperature = 1.0f;
    sp.ignore_eos = 1;
    sp.seed = 1234;
    eng_group_result *res = calloc((size_t)G, sizeof *res);
    stamps st = { malloc((size_t)(NEW + 8) * sizeof(double)), 0, NEW + 8 };

    /* warm-up: allocations, GEMM plans */
    sp.max_tokens = 8;
    if (eng_rollout(e, groups, G, &sp, res, NULL, NULL)) gc_die(be, "warm-up rollout");
    for (int g = 0; g < G; g++) eng_group_result_free(&res[g]);

    sp.max_tokens = NEW;
    double t0 = eng_now_ms();
    if (eng_rollout(e, groups, G, &sp, res, on_progress, &st)) gc_die(be, "rollout");
    double t1 = eng_now_ms();
    long long gen = 0;
    double lp_sum = 0;
    for (int g = 0; g < G; g++)
        for (int r = 0; r < res[g].n; r++) {
            gen += res[g].resp[r].n_tokens;
            for (int i = 0; i < res[g].resp[r].n_tokens; i++) lp_sum += res[g].resp[r].logprobs[i];
        }
    int nd = st.n - 1;
    double *d = malloc((size_t)(nd > 0 ? nd : 1) * sizeof(double));
    for (int i = 0; i < nd; i++) d[i] = st.t[i + 1] - st.t[i];
    qsort(d, (size_t)nd, sizeof(double), cmpd);
    double prefill = st.t[0] - t0, dec_mean = nd > 0 ? (st.t[st.n - 1] - st.t[0]) / nd : 0, dec_med = nd > 0 ? d[nd / 2] : 0;

    double wbytes = 2.0 * n;
    double kvbytes = 2.0 * L * K * D * 2 * ((double)G * P + (double)G * N * NEW / 2);
    double floor_ms = (wbytes + kvbytes) / bw * 1e3, floor3 = (wbytes + kvbytes) / 3.0e12 * 1e3;
    const char *ng = getenv("GRPOD_NO_GRAPHS");
    printf("grpod-cuda rollout %s G=%d P=%d N=%d new=%d (%s): prefill %.1f ms, decode %.2f ms/step "
           "(median; mean %.2f over %d steps), total %.0f ms, %.0f tok/s (decode only %.0f tok/s), "
           "%lld tokens, mean logprob %.3f\n",
           size, G, P, N, NEW, ng && *ng ? "no graphs" : "graphs", prefill, dec_med, dec_mean, nd, t1 - t0,
           gen / ((t1 - t0) * 1e-3), (double)G * N / (dec_mean * 1e-3), gen, lp_sum / (gen ? gen : 1));
    printf("grpod-cuda rollout %s: HBM floor %.3f ms/step at the measured copy bandwidth %.2f TB/s "
           "(weights %.2f GB + KV %.2f GB), %.3f ms/step at 3.0 TB/s; decode/floor %.2fx\n",
           size, floor_ms, bw / 1e12, wbytes / 1e9, kvbytes / 1e9, floor3, dec_med / floor_ms);
    for (int g = 0; g < G; g++) eng_group_result_free(&res[g]);
    model_acts_free(&e->m, &e->acts_ng);
    be->destroy(be);
    return 0;
}
