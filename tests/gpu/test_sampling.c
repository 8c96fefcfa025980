/* test_sampling.c (GPU) — the CUDA sample op (kernels/sampling.cu) against the distribution and
 * the CPU reference: chi-square of 20k draws from a small logits vector against softmax(x/T),
 * greedy = argmax over a Qwen-sized vocabulary, logprob and token agreement with sample_cpu on
 * the same fp32 logits (same hash; only double-log rounding could split a near tie).
 * Prints ROW lines for tests/gpu/run.sh. */
#include "kernels/sampling.h"
#include "tests/gpu/gpu_check.h"


static void run(eng_backend *g, int *tok, float *lp, const float *x, const uint64_t *keys, uint64_t ctr, int R, int V,
                float T) {
    float *dx = g->alloc(g, (size_t)R * V * 4);
    uint64_t *dk = g->alloc(g, (size_t)R * 8);
    int *dt = g->alloc(g, (size_t)R * 4);
    float *dl = g->alloc(g, (size_t)R * 4);
    if (!dx || !dk || !dt || !dl || g->to_dev(g, dx, x, (size_t)R * V * 4) || g->to_dev(g, dk, keys, (size_t)R * 8))
        gc_die(g, "upload");
    for (int i = 0; i < R; i++) tok[i] = -1;
    g->sample(g, dt, dl, dx, dk, ctr, R, V, T);
    if (g->to_host(g, tok, dt, (size_t)R * 4) || g->to_host(g, lp, dl, (size_t)R * 4) || g->sync(g)) gc_die(g, "sample");
    g->free(g, dx); g->free(g, dk); g->free(g, dt); g->free(g, dl);
}

int main(void) {
    eng_backend *g;
    if (backend_cuda_create(&g, 0)) gc_die(NULL, "backend_cuda_create");
    enum { V = 8, NS = 20000, R = 64, VB = 151936 };
    /* (1) distribution: 20k streams of one small logits row */
    float x[V];
    unsigned long long s = 11;
    for (int j = 0; j < V; j++) x[j] = check_randf(&s, 2.0f);
    float *rows = malloc(sizeof(float) * V * NS), *lp = malloc(sizeof(float) * NS);
    int *tok = malloc(sizeof(int) * NS);
    uint64_t *keys = malloc(sizeof(uint64_t) * NS);
    for (int i = 0; i < NS; i++) { memcpy(rows + (size_t)i * V, x, sizeof x); keys[i] = sampling_mix(i * 7919ULL + 1); }
    const float temps[] = { 1.0f, 0.6f };
    for (int t = 0; t < 2; t++) {
        float T = temps[t];
        run(g, tok, lp, rows, keys, 3, NS, V, T);
        double p[V], mx = -INFINITY, sum = 0, c = 0, lerr = 0;
        int cnt[V] = { 0 }, bad = 0;
        for (int j = 0; j < V; j++) mx = fmax(mx, x[j] / T);
        for (int j = 0; j < V; j++) sum += p[j] = exp(x[j] / T - mx);
        for (int i = 0; i < NS; i++) {
            if (tok[i] < 0 || tok[i] >= V) { bad++; continue; }
            cnt[tok[i]]++;
            lerr = fmax(lerr, fabs(lp[i] - (x[tok[i]] / T - mx - log(sum))));
        }
        for (int j = 0; j < V; j++) c += (cnt[j] - NS * p[j] / sum) * (cnt[j] - NS * p[j] / sum) / (NS * p[j] / sum);
        char name[64];
        snprintf(name, sizeof name, "sample chi2 T=%.1f (df 7)", T);
        gc_row(name, "20000 draws, V=8", bad ? NAN : c, 30);
        snprintf(name, sizeof name, "sample logprob T=%.1f", T);
        gc_row(name, "20000 draws, V=8", lerr, 1e-5);
    }
    /* (2) Qwen-sized vocabulary: greedy = argmax; T=1 agreement with sample_cpu */
    float *big = gc_rand((size_t)R * VB, 8.0f, 5);
    int tc[R], tg[R];
    float lc[R], lg[R];
    run(g, tg, lg, big, keys, 0, R, VB, 0.0f);
    int miss = 0;
    for (int r = 0; r < R; r++) {
        int am = 0;
        for (int j = 1; j < VB; j++) if (big[(size_t)r * VB + j] > big[(size_t)r * VB + am]) am = j;
        miss += tg[r] != am;
    }
    gc_row("sample greedy == argmax (mismatches)", "R=64 V=151936", miss, 0);
    run(g, tg, lg, big, keys, 17, R, VB, 1.0f);
    sample_cpu(tc, lc, big, keys, 17, R, VB, 1.0f);
    double lerr = 0;
    miss = 0;
    for (int r = 0; r < R; r++) {
        miss += tg[r] != tc[r];
        if (tg[r] == tc[r]) lerr = fmax(lerr, fabs(lg[r] - lc[r]));
    }
    gc_row("sample T=1 tokens != sample_cpu (fraction)", "R=64 V=151936", (double)miss / R, 0.02);
    gc_row("sample T=1 logprob vs sample_cpu", "R=64 V=151936", lerr, 1e-4);
    g->destroy(g);
    free(rows); free(lp); free(tok); free(keys); free(big);
    return gc_failures ? 1 : 0;
}
