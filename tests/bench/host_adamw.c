/* host_adamw.c — the offloaded optimizer's host step (kernels/adamw.h) against the host's memory
 * bandwidth, measured in the same call: a triad in place (b = b + s c: two arrays read, one
 * written back, 12 bytes an element, no write-allocate traffic, as the optimizer's in-place
 * updates have none) is the floor. For each thread count T, one "rank" (one team of T threads) and two ranks at once (two
 * engine threads, each a team of T / 2 on its own arrays: how the daemon's ranks of one host step
 * together), over n elements a rank:
 *   adamw_m16_cpu   bf16 moments, the bf16 weight copy: 22 bytes an element (p, g, m, v read; p,
 *                   m, v, act written)
 *   adamw_bf16_cpu  fp32 moments, the bf16 weight copy: 30 bytes an element
 * Best of REPS passes each; figures only. Usage: host_adamw [n_millions] [T ...] (default 256 and
 * the machine's cores). */
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/adamw.h"

enum { REPS = 5 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

typedef struct {
    long long n;
    int threads, step;
    float *p, *g, *m, *v, *b, *c;
    uint16_t *act, *m16, *v16;
    double best[3]; /* triad, m16, fp32 moments: seconds */
} rank_arrays;

static void *alloc_or_die(size_t bytes) {
    void *x = malloc(bytes);
    if (!x) {
        fprintf(stderr, "host_adamw: out of memory (%zu MiB)\n", bytes >> 20);
        exit(1);
    }
    return x;
}

/* first touch by the team that will use them */
static void fill(rank_arrays *r) {
    long long n = r->n;
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < n; i++) {
        float x = (float)((i * 2654435761u) % 1000003) * 1e-6f - 0.5f;
        r->p[i] = x, r->g[i] = 0.01f * x, r->m[i] = 1e-3f * x, r->v[i] = 1e-6f * (x * x + 0.1f);
        r->b[i] = x, r->c[i] = -1e-9f * x;
        r->act[i] = 0, r->m16[i] = 0x3a83, r->v16[i] = 0x3583;
    }
}

static void *run_rank(void *arg) {
    rank_arrays *r = arg;
    omp_set_num_threads(r->threads);
    fill(r);
    long long n = r->n;
    for (int k = 0; k < 3; k++) r->best[k] = 1e30;
    for (int rep = 0; rep < REPS; rep++) {
        double t = now();
        const float s = 1.0001f;
        float *b = r->b, *c = r->c;
#pragma omp parallel for simd schedule(static)
        for (long long i = 0; i < n; i++) b[i] = b[i] + s * c[i];
        double d = now() - t;
        if (d < r->best[0]) r->best[0] = d;
        t = now();
        adamw_m16_cpu(r->p, r->act, r->g, r->m16, r->v16, n, 1e-6f, 0.9f, 0.999f, 1e-8f, 0.01f, ++r->step);
        d = now() - t;
        if (d < r->best[1]) r->best[1] = d;
        t = now();
        adamw_bf16_cpu(r->p, r->act, r->g, r->m, r->v, n, 1e-6f, 0.9f, 0.999f, 1e-8f, 0.01f, r->step);
        d = now() - t;
        if (d < r->best[2]) r->best[2] = d;
    }
    return NULL;
}

static void make(rank_arrays *r, long long n, int threads) {
    *r = (rank_arrays){.n = n, .threads = threads};
    float **f[] = {&r->p, &r->g, &r->m, &r->v, &r->b, &r->c};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) *f[i] = alloc_or_die((size_t)n * 4);
    uint16_t **h[] = {&r->act, &r->m16, &r->v16};
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++) *h[i] = alloc_or_die((size_t)n * 2);
}

static void unmake(rank_arrays *r) {
    void *x[] = {r->p, r->g, r->m, r->v, r->b, r->c, r->act, r->m16, r->v16};
    for (size_t i = 0; i < sizeof x / sizeof x[0]; i++) free(x[i]);
}

/* ranks at once, each a team of threads / ranks: GB/s over all ranks per figure */
static void measure(long long n, int threads, int ranks) {
    rank_arrays r[2];
    pthread_t th[2];
    for (int q = 0; q < ranks; q++) make(&r[q], n, threads / ranks > 0 ? threads / ranks : 1);
    for (int q = 0; q < ranks; q++) pthread_create(&th[q], NULL, run_rank, &r[q]);
    for (int q = 0; q < ranks; q++) pthread_join(th[q], NULL);
    const double bytes[3] = {12, 22, 30};
    double gbs[3];
    for (int k = 0; k < 3; k++) {
        double worst = 0; /* the ranks end together only as fast as the slowest */
        for (int q = 0; q < ranks; q++) worst = r[q].best[k] > worst ? r[q].best[k] : worst;
        gbs[k] = bytes[k] * (double)n * ranks / worst / 1e9;
    }
    printf("| %d | %d x %d | %.0f | %.0f (%.0f %%) | %.0f (%.0f %%) | %.2f s |\n", threads, ranks, r[0].threads, gbs[0], gbs[1],
           100 * gbs[1] / gbs[0], gbs[2], 100 * gbs[2] / gbs[0], 15.27e9 * 2 * 22 / (gbs[1] * 1e9));
    for (int q = 0; q < ranks; q++) unmake(&r[q]);
}

int main(int argc, char **argv) {
    long long n = (argc > 1 ? atoll(argv[1]) : 256) * 1000000LL;
    printf("host AdamW, %lld M elements a rank; GB/s over all ranks, best of %d; last column: the 48-layer "
           "Qwen3-30B-A3B step's host AdamW (2 ranks x 15.27 B elements, bf16 moments) at that rate\n",
           n / 1000000, REPS);
    printf("| threads | ranks x team | triad in place (floor) | adamw_m16_cpu, 22 B/elem | adamw_bf16_cpu, 30 B/elem | 30B-A3B "
           "step |\n");
    printf("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
    int nt = argc > 2 ? argc - 2 : 1;
    for (int i = 0; i < nt; i++) {
        int T = argc > 2 ? atoi(argv[2 + i]) : omp_get_num_procs();
        measure(n, T, 1);
        if (T >= 2) measure(n, T, 2);
    }
    return 0;
}
