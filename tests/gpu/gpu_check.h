/* gpu_check.h — helpers the GPU test programs share: bf16 rounding on the host, uploads and
 * downloads through a backend table, and the result rows tests/gpu/run.sh turns into its
 * final table ("ROW|test|shape|value|tolerance|PASS or FAIL"). Comparisons are relative L2
 * errors (tests/unit/check.h rel_l2) of the CUDA result, converted to fp32, against the CPU
 * backend on the same bf16-rounded inputs. */
#ifndef GRPOD_GPU_CHECK_H
#define GRPOD_GPU_CHECK_H
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "engine/backend/backend.h"
#include "engine/format/config.h"
#include "tests/unit/check.h"

static int gc_failures;
static inline void gc_unused_(void) {
    (void)check_failed_;
    (void)check_cur_failed_;
}

/* Seconds on the monotonic clock (benchmarks). */
static inline double gc_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}
/* fn on each of n jobs (size bytes apart, at most 8) at once, one thread each; returns when all end. */
static inline void gc_threads(void *(*fn)(void *), void *jobs, size_t size, int n) {
    pthread_t th[8];
    for (int q = 0; q < n && q < 8; q++) pthread_create(&th[q], NULL, fn, (char *)jobs + (size_t)q * size);
    for (int q = 0; q < n && q < 8; q++) pthread_join(th[q], NULL);
}
/* qsort comparator for doubles, ascending (medians). */
static inline int gc_cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One result row; a NaN value fails. */
static inline void gc_row(const char *test, const char *shape, double value, double tol) {
    int ok = value <= tol;
    if (!ok) gc_failures++;
    printf("ROW|%s|%s|%.3e|%.0e|%s\n", test, shape, value, tol, ok ? "PASS" : "FAIL");
    fflush(stdout);
}

/* Round to the nearest bf16 (ties to even), as __float2bfloat16 does. */
static inline float gc_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) return x;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* n random values in [-scale, scale), rounded to bf16 (so both backends see the same numbers). */
static inline float *gc_rand(size_t n, float scale, unsigned long long seed) {
    float *x = (float *)malloc(n * sizeof(float) + 4);
    check_fill(x, n, seed, scale);
    for (size_t i = 0; i < n; i++) x[i] = gc_bf16(x[i]);
    return x;
}
/* n token ids drawn uniformly from [0, 150000) (inside every Qwen3 vocabulary), advancing *s */
static inline void gc_random_ids(int *ids, int n, unsigned long long *s) {
    for (int i = 0; i < n; i++) ids[i] = (int)((check_randf(s, 0.5f) + 0.5f) * 150000);
}
static inline float *gc_copy(const float *x, size_t n) {
    float *y = (float *)malloc(n * sizeof(float) + 4);
    memcpy(y, x, n * sizeof(float));
    return y;
}

static inline void gc_die(eng_backend *b, const char *what) {
    fprintf(stderr, "FATAL %s: %s\n", what, err_msg());
    exit(2);
}
static inline void *gc_act(eng_backend *g, const float *h, size_t n) {
    void *p = g->alloc(g, n * 2 + 16);
    if (!p || g->act_from_f32(g, p, h, n)) gc_die(g, "upload act");
    return p;
}
static inline void *gc_dev(eng_backend *g, const void *h, size_t bytes) {
    void *p = g->alloc(g, bytes + 16);
    if (!p || g->to_dev(g, p, h, bytes)) gc_die(g, "upload");
    return p;
}
static inline float *gc_get_act(eng_backend *g, const void *p, size_t n) {
    float *h = (float *)malloc(n * sizeof(float) + 4);
    if (g->sync(g) || g->act_to_f32(g, h, p, n)) gc_die(g, "download act");
    return h;
}
static inline float *gc_get_f32(eng_backend *g, const void *p, size_t n) {
    float *h = (float *)malloc(n * sizeof(float) + 4);
    if (g->sync(g) || g->to_host(g, h, p, n * 4)) gc_die(g, "download");
    return h;
}
/* Key ranges of packed groups (engine/model/pack.h's layout, built here independently of it): group
 * g = [P; R_1 .. R_N], the prompt causal on itself, each response over its group's prompt and
 * causally over itself. */
typedef struct {
    int T;
    int *a0, *a1, *b0, *b1;
} ranges;
static inline ranges make_ranges(int G, const int *P, const int *N, const int *const *R) {
    int T = 0;
    for (int g = 0; g < G; g++) {
        T += P[g];
        for (int i = 0; i < N[g]; i++) T += R[g][i];
    }
    ranges r = {T, (int *)malloc((size_t)T * 4 + 4), (int *)malloc((size_t)T * 4 + 4), (int *)malloc((size_t)T * 4 + 4),
                (int *)malloc((size_t)T * 4 + 4)};
    int t = 0;
    for (int g = 0; g < G; g++) {
        int p0 = t;
        for (int i = 0; i < P[g]; i++, t++) {
            r.a0[t] = p0;
            r.a1[t] = p0 + i + 1;
            r.b0[t] = r.b1[t] = 0;
        }
        for (int s = 0; s < N[g]; s++) {
            int s0 = t;
            for (int j = 0; j < R[g][s]; j++, t++) {
                r.a0[t] = p0;
                r.a1[t] = p0 + P[g];
                r.b0[t] = s0;
                r.b1[t] = s0 + j + 1;
            }
        }
    }
    return r;
}
static inline void free_ranges(ranges r) {
    free(r.a0);
    free(r.a1);
    free(r.b0);
    free(r.b1);
}
/* the ranges uploaded for a backend's attention ops */
static inline attn_ranges gc_dev_ranges(eng_backend *g, ranges r) {
    attn_ranges d = {(const int *)gc_dev(g, r.a0, (size_t)r.T * 4),
                     (const int *)gc_dev(g, r.a1, (size_t)r.T * 4),
                     (const int *)gc_dev(g, r.b0, (size_t)r.T * 4),
                     (const int *)gc_dev(g, r.b1, (size_t)r.T * 4),
                     NULL,
                     NULL,
                     0};
    return d;
}
/* Relative L2 error of the increments (a - a0) against (b - b0): for "+=" outputs, so that an
 * op that overwrote instead of adding fails. */
static inline double gc_rel_delta(const float *a, const float *a0, const float *b, const float *b0, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double da = (double)a[i] - a0[i], db = (double)b[i] - b0[i];
        num += (da - db) * (da - db);
        den += db * db;
    }
    return sqrt(num) / (den > 1e-30 ? sqrt(den) : 1e-15);
}
/* Qwen3-30B-A3B's mixture-of-experts shape on layers [0, L) of c (the benchmarks' "30b-a3b"):
 * hidden 2048, 32 query / 4 KV heads of 128, 128 experts of width 768, top-8 renormalised. The
 * caller keeps the rest (L, V, tied, F of a dense layer). */
static inline void gc_moe_30b_a3b(model_config *c, int L) {
    c->arch = ARCH_QWEN3_MOE;
    c->C = 2048;
    c->H = 32;
    c->K = 4;
    c->D = 128;
    c->E = 128;
    c->top_k = 8;
    c->Fm = 768;
    c->norm_topk = 1;
    for (int l = 0; l < L; l++) c->mlp[l] = MLP_MOE;
    snprintf(c->arch_name, sizeof c->arch_name, "qwen3_moe");
}
/* The HF default Qwen3.5 text config (Qwen3.5-9B; transformers' Qwen3_5TextConfig) on L layers of
 * c (the benchmarks' "qwen3.5-9b"): hidden 4096, MLP 12288, vocabulary 248,320 untied; gated
 * DeltaNet 16 key / 32 value heads of 128, 4 conv taps; every fourth layer gated attention (the
 * config's layer_types), 16 query / 4 KV heads of 256, a quarter rotary. d128: the gated layers
 * run 32 / 8 heads of 128 (the same q, k and v widths and attention FLOPs; D 128 runs the wgmma
 * attention kernels, D 256 the mma.sync ones). */
static inline void gc_qwen3_5_9b(model_config *c, int L, int d128) {
    if (L < 1 || L > 32) gc_die(NULL, "qwen3.5-9b: L in 1..32");
    *c = (model_config){.arch = ARCH_QWEN3_5,
                        .L = L,
                        .C = 4096,
                        .H = d128 ? 32 : 16,
                        .K = d128 ? 8 : 4,
                        .D = d128 ? 128 : 256,
                        .R = d128 ? 32 : 64,
                        .F = 12288,
                        .V = 248320,
                        .max_pos = 262144,
                        .eps = 1e-6f,
                        .rope_theta = 1e7f,
                        .qk_norm = 1,
                        .gain1 = 1,
                        .lin_hk = 16,
                        .lin_hv = 32,
                        .lin_dk = 128,
                        .lin_dv = 128,
                        .conv_k = 4,
                        .bos_id = -1};
    for (int l = 0; l < L; l++) c->attn[l] = l % 4 == 3 ? ATTN_GATED : ATTN_DELTANET;
    snprintf(c->arch_name, sizeof c->arch_name, "qwen3_5_text");
}
/* The expert op's forward (kernels/moe.h) on the device against the CPU's: each slot's gate, up
 * and expert output and the combined out, rel L2 <= 1e-2 each (through bf16 activations). */
static inline void gc_moe_fwd_rows(eng_backend *g, const char *op, const char *sh, void *const dev[4], const float *const cpu[4],
                                   size_t nk, int Fm, int C, size_t nx) {
    static const char *what[4] = {"gate", "up", "expert out", "out (+res)"};
    size_t n[4] = {nk * Fm, nk * Fm, nk * C, nx};
    char name[96];
    for (int i = 0; i < 4; i++) {
        float *h = gc_get_act(g, dev[i], n[i]);
        snprintf(name, sizeof name, "%s %s", op, what[i]);
        gc_row(name, sh, rel_l2(h, cpu[i], n[i]), 1e-2);
        free(h);
    }
}

#ifdef CUDART_VERSION /* programs that include cuda_runtime_api.h before this header */
/* Device-to-device copy bandwidth in bytes/s (read + write), median of 9 copies of 1 GiB. */
static inline double copy_bw(void) {
    size_t n = (size_t)1 << 30;
    void *a, *b;
    if (cudaMalloc(&a, n) || cudaMalloc(&b, n)) return 0;
    cudaMemset(a, 1, n);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
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
    qsort(t, 9, sizeof(double), gc_cmpd);
    cudaFree(a);
    cudaFree(b);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 2.0 * n / (t[4] * 1e-3);
}
#endif
#endif
