/* test_sampling.c (GPU) — the CUDA sample op (kernels/sampling.cu) against the kept distribution
 * and the CPU reference: chi-square of 20k draws of a small logits row for plain temperature,
 * top_k, top_p, min_p, a combination and a ban list (no draw outside the kept set; logprob of
 * the untruncated softmax); on a Qwen-sized vocabulary, greedy = argmax of the eligible ids, and
 * tokens / logprobs of plain and truncated rows against sample_cpu on the same fp32 logits;
 * allow masks (constrained decoding): the mask of all but the ban list draws what the ban list
 * draws, masked rows draw inside their masks (greedy: the masked argmax) and as sample_cpu does,
 * and rows without a mask draw what they draw in a call without masks.
 * Prints ROW lines for tests/gpu/run.sh. */
#include "kernels/sampling.h"
#include "tests/gpu/gpu_check.h"
#include "tests/unit/sampling_expect.h"

enum { V = 10, NS = 20000, R = 64, VB = 151936 };

static void run_masked(eng_backend *g, int *tok, float *lp, const float *x, const sample_params *p, const int *ban,
                       const uint32_t *allow, int n_allow, int n, int nv) {
    float *dx = gc_dev(g, x, (size_t)n * nv * 4);
    sample_params *dp = gc_dev(g, p, (size_t)n * sizeof *p);
    int *db = ban ? gc_dev(g, ban, (size_t)(ban[0] + 1) * 4) : NULL;
    uint32_t *da = allow ? gc_dev(g, allow, (size_t)n_allow * sampling_mask_words(nv) * 4) : NULL;
    int *dt = g->alloc(g, (size_t)n * 4);
    float *dl = g->alloc(g, (size_t)n * 4);
    if (!dt || !dl) gc_die(g, "alloc");
    g->sample(g, dt, dl, dx, dp, db, da, n, nv);
    if (g->to_host(g, tok, dt, (size_t)n * 4) || g->to_host(g, lp, dl, (size_t)n * 4) || g->sync(g)) gc_die(g, "sample");
    g->free(g, dx);
    g->free(g, dp);
    g->free(g, dt);
    g->free(g, dl);
    if (db) g->free(g, db);
    if (da) g->free(g, da);
}
static void run(eng_backend *g, int *tok, float *lp, const float *x, const sample_params *p, const int *ban, int n, int nv) {
    run_masked(g, tok, lp, x, p, ban, NULL, 0, n, nv);
}

int main(void) {
    eng_backend *g;
    if (backend_cuda_create(&g, 0)) gc_die(NULL, "backend_cuda_create");
    /* (1) distributions: 20k keys over one small logits row */
    float x[V];
    unsigned long long s = 11;
    for (int j = 0; j < V; j++) x[j] = check_randf(&s, 2.0f);
    float *rows = malloc(sizeof(float) * V * NS), *lp = malloc(sizeof(float) * NS);
    int *tok = malloc(sizeof(int) * NS);
    sample_params *pr = malloc(sizeof *pr * NS);
    for (int i = 0; i < NS; i++) memcpy(rows + (size_t)i * V, x, sizeof x);
    int ban[] = {2, 3, 7};
    struct {
        const char *name;
        float t, top_p, min_p;
        int top_k, ban;
    } cases[] = {
        {"T=1", 1.0f, 1, 0, 0, 0},          {"T=0.6", 0.6f, 1, 0, 0, 0},
        {"top_k=3", 1.0f, 1, 0, 3, 0},      {"top_p=0.7", 1.0f, 0.7f, 0, 0, 0},
        {"min_p=0.2", 1.0f, 1, 0.2f, 0, 0}, {"k=6 p=0.8 min_p=0.05 T=0.8", 0.8f, 0.8f, 0.05f, 6, 0},
        {"ban 2 ids", 1.0f, 1, 0, 0, 1},    {"ban, k=4 p=0.9 T=1.3", 1.3f, 0.9f, 0, 4, 1},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        for (int i = 0; i < NS; i++)
            pr[i] = (sample_params){.key = sampling_mix(i * 7919ULL + 1 + 100000 * c),
                                    .temperature = cases[c].t,
                                    .top_p = cases[c].top_p,
                                    .min_p = cases[c].min_p,
                                    .top_k = cases[c].top_k,
                                    .ban = cases[c].ban};
        run(g, tok, lp, rows, pr, ban, NS, V);
        double p[V], mx = -INFINITY, sum = 0, lerr = 0;
        sampling_expected(x, V, &pr[0], ban, p);
        int out, df;
        double c2 = sampling_chi2(tok, NS, p, V, &out, &df);
        float T = cases[c].t;
        for (int j = 0; j < V; j++) mx = fmax(mx, x[j] / T);
        for (int j = 0; j < V; j++) sum += exp(x[j] / T - mx);
        for (int i = 0; i < NS; i++)
            if (tok[i] >= 0 && tok[i] < V) lerr = fmax(lerr, fabs(lp[i] - (x[tok[i]] / T - mx - log(sum))));
        char name[96];
        snprintf(name, sizeof name, "sample chi2/quantile(1e-4) %s", cases[c].name);
        gc_row(name, "20000 draws, V=10", out ? NAN : c2 / sampling_chi2_q4(df), 1);
        snprintf(name, sizeof name, "sample logprob %s", cases[c].name);
        gc_row(name, "20000 draws, V=10", lerr, 1e-5);
    }
    /* (2) Qwen-sized vocabulary: greedy (with bans) = argmax; rows vs sample_cpu */
    float *big = gc_rand((size_t)R * VB, 8.0f, 5);
    int tc[R], tg[R], bb[3] = {2, 0, 0};
    float lc[R], lg[R];
    sample_params bp[R];
    for (int r = 0; r < 2; r++) {
        int am = 0;
        for (int j = 1; j < VB; j++)
            if (big[(size_t)r * VB + j] > big[(size_t)r * VB + am]) am = j;
        bb[1 + r] = am;
    }
    for (int r = 0; r < R; r++) bp[r] = (sample_params){.key = sampling_mix(r + 17), .temperature = 0, .top_p = 1, .ban = r < 4};
    run(g, tg, lg, big, bp, bb, R, VB);
    int miss = 0;
    for (int r = 0; r < R; r++) {
        int am = -1;
        for (int j = 0; j < VB; j++) {
            if (bp[r].ban && (j == bb[1] || j == bb[2])) continue;
            if (am < 0 || big[(size_t)r * VB + j] > big[(size_t)r * VB + am]) am = j;
        }
        miss += tg[r] != am;
    }
    gc_row("sample greedy == argmax, bans (mismatches)", "R=64 V=151936", miss, 0);
    struct {
        const char *name;
        float top_p, min_p;
        int top_k;
    } mix[] = {
        {"T=1", 1, 0, 0},
        {"top_k=50", 1, 0, 50},
        {"top_p=0.9", 0.9f, 0, 0},
        {"min_p=0.05", 1, 0.05f, 0},
        {"k=1000 p=0.95 min_p=0.01", 0.95f, 0.01f, 1000},
    };
    for (size_t c = 0; c < sizeof mix / sizeof mix[0]; c++) {
        for (int r = 0; r < R; r++)
            bp[r] = (sample_params){.key = sampling_mix(r + 1000 * c),
                                    .temperature = 1.0f,
                                    .top_p = mix[c].top_p,
                                    .min_p = mix[c].min_p,
                                    .top_k = mix[c].top_k,
                                    .ban = r % 5 == 0};
        run(g, tg, lg, big, bp, bb, R, VB);
        sample_cpu(tc, lc, big, bp, bb, NULL, R, VB);
        double lerr = 0;
        miss = 0;
        for (int r = 0; r < R; r++) {
            miss += tg[r] != tc[r];
            if (tg[r] == tc[r]) lerr = fmax(lerr, fabs(lg[r] - lc[r]));
        }
        char name[96];
        snprintf(name, sizeof name, "sample %s tokens != sample_cpu (fraction)", mix[c].name);
        gc_row(name, "R=64 V=151936", (double)miss / R, 0.05);
        snprintf(name, sizeof name, "sample %s logprob vs sample_cpu", mix[c].name);
        gc_row(name, "R=64 V=151936", lerr, 1e-4);
    }
    /* (3) allow masks on the Qwen-sized rows: even rows masked (5% of ids each), odd rows not */
    int W = sampling_mask_words(VB);
    uint32_t *am = calloc((size_t)R / 2 * W, 4), *cm = malloc((size_t)W * 4);
    for (int m = 0; m < R / 2; m++)
        for (int j = 0; j < VB; j++)
            if (sampling_mix(0xa11c + (unsigned long long)m * VB + j) % 100 < 5) am[(size_t)m * W + (j >> 5)] |= 1u << (j & 31);
    for (int w = 0; w < W; w++) cm[w] = 0xffffffffu; /* all ids but the ban list's */
    cm[bb[1] >> 5] &= ~(1u << (bb[1] & 31));
    cm[bb[2] >> 5] &= ~(1u << (bb[2] & 31));
    int t0[R];
    float l0[R];
    for (size_t c = 0; c < 3; c++) {
        float temp = c == 0 ? 0 : 1.0f;
        int k = c == 2 ? 50 : 0;
        for (int r = 0; r < R; r++)
            bp[r] = (sample_params){.key = sampling_mix(r + 77 * c), .temperature = temp, .top_p = 1, .top_k = k};
        run(g, t0, l0, big, bp, NULL, R, VB);
        for (int r = 0; r < R; r += 2) bp[r].allow = r / 2 + 1;
        run_masked(g, tg, lg, big, bp, NULL, am, R / 2, R, VB);
        sample_cpu(tc, lc, big, bp, NULL, am, R, VB);
        int out = 0, odd = 0, greedy = 0, cpu = 0;
        for (int r = 0; r < R; r++) {
            if (r % 2) {
                odd += tg[r] != t0[r] || lg[r] != l0[r];
                continue;
            }
            const uint32_t *mr = am + (size_t)(r / 2) * W;
            out += sampling_masked(mr, tg[r]);
            cpu += tg[r] != tc[r];
            if (c) continue;
            int a = -1;
            for (int j = 0; j < VB; j++)
                if (!sampling_masked(mr, j) && (a < 0 || big[(size_t)r * VB + j] > big[(size_t)r * VB + a])) a = j;
            greedy += tg[r] != a;
        }
        const char *cn[] = {"greedy", "T=1", "T=1 top_k=50"};
        char name[96];
        snprintf(name, sizeof name, "sample mask %s draws outside the mask", cn[c]);
        gc_row(name, "R=64 V=151936, 5% allowed", out, 0);
        snprintf(name, sizeof name, "sample mask %s unmasked rows != no-mask call", cn[c]);
        gc_row(name, "R=64 V=151936", odd, 0);
        snprintf(name, sizeof name, "sample mask %s tokens != sample_cpu (fraction)", cn[c]);
        gc_row(name, "R=64 V=151936", (double)cpu / (R / 2), 0.05);
        if (!c) gc_row("sample mask greedy != masked argmax", "R=64 V=151936", greedy, 0);
        /* the mask of every id but the ban list = the ban list, draw for draw */
        for (int r = 0; r < R; r++) bp[r].allow = 0, bp[r].ban = 1;
        run(g, t0, l0, big, bp, bb, R, VB);
        for (int r = 0; r < R; r++) bp[r].allow = 1, bp[r].ban = 0;
        run_masked(g, tg, lg, big, bp, NULL, cm, 1, R, VB);
        int diff = 0;
        for (int r = 0; r < R; r++) diff += tg[r] != t0[r] || lg[r] != l0[r];
        snprintf(name, sizeof name, "sample mask %s complement of bans != bans", cn[c]);
        gc_row(name, "R=64 V=151936", diff, 0);
    }
    free(am);
    free(cm);
    g->destroy(g);
    free(rows);
    free(lp);
    free(tok);
    free(pr);
    free(big);
    return gc_failures ? 1 : 0;
}
