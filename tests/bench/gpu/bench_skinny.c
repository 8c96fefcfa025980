/* bench_skinny.c — the few-row decode GEMM (skinny_kernel, kernels/matmul.cu) alone, at the
 * linear layers of a decode step: Qwen3-1.7B, Qwen3-8B and Qwen3.5-9B dims, T = 1, 4, 16, 64 rows
 * (64: tune.skinny forced; the default takes it up to 16). Each op as the model calls it: q/k/v
 * with the norm in front (Qwen3.5's DeltaNet in-projection after its norm apart), o_proj and down with the
 * residual, gate/up in SwiGLU mode with the norm. Time: a CUDA graph of 40 calls, each on another
 * copy of the weights (the copies together well past L2, as a decode step's layers are), median
 * of 5 replays, us per call; TB/s of the bytes a call must read (W, x, the residual) and the HBM
 * floor of W at 4.2 TB/s. Last on each line the FNV-1a hash of the outputs' bf16 bits on copy 0
 * (random inputs, fixed seeds): the same on every build whose reduction order is the same.
 * Usage: bench_skinny [model|all] [T ...]   (model: 1.7b, 8b, qwen3.5-9b) */
#include <cuda_runtime_api.h>

#include "common/clock.h"
#include "tests/gpu/gpu_check.h"

enum { K_PROJ, K_PLAIN, K_RES, K_MLP }; /* parts with the norm in front; without; one part + residual; gate/up SwiGLU */
typedef struct {
    const char *model, *op;
    int kind, I, n, O[3];
} shape;
static const shape SH[] = {
    {"1.7b", "qkv", K_PROJ, 2048, 3, {2048, 1024, 1024}},
    {"1.7b", "o_proj", K_RES, 2048, 1, {2048}},
    {"1.7b", "gate/up", K_MLP, 2048, 1, {6144}},
    {"1.7b", "down", K_RES, 6144, 1, {2048}},
    {"8b", "qkv", K_PROJ, 4096, 3, {4096, 1024, 1024}},
    {"8b", "o_proj", K_RES, 4096, 1, {4096}},
    {"8b", "gate/up", K_MLP, 4096, 1, {12288}},
    {"8b", "down", K_RES, 12288, 1, {4096}},
    {"qwen3.5-9b", "dn_in", K_PLAIN, 4096, 2, {8192, 4096}},
    {"qwen3.5-9b", "attn_qkv", K_PROJ, 4096, 3, {8192, 1024, 1024}},
    {"qwen3.5-9b", "out", K_RES, 4096, 1, {4096}},
    {"qwen3.5-9b", "gate/up", K_MLP, 4096, 1, {12288}},
    {"qwen3.5-9b", "down", K_RES, 12288, 1, {4096}},
};

static size_t w_elems(const shape *s) { /* one copy's weights */
    size_t n = 0;
    for (int i = 0; i < (s->kind == K_MLP ? 2 : s->n); i++) n += (size_t)(s->kind == K_MLP ? s->O[0] : s->O[i]) * s->I;
    return n;
}

typedef struct {
    char *w; /* the weight pool */
    size_t wcap;
    void *x, *nw, *ln, *res, *out[3], *act;
} bufs;

/* one call on weight copy c (the pool holds copies back to back) */
static void call(eng_backend *be, const shape *s, bufs *b, int c, int T) {
    size_t off = (size_t)c * w_elems(s) * 2;
    mm_norm nm = {b->nw, 1e-6f, b->ln};
    if (s->kind == K_MLP) {
        size_t wo = (size_t)s->O[0] * s->I * 2;
        be->mlp_in_fwd(be, b->act, b->out[0], b->out[1], b->x, &nm, b->w + off, b->w + off + wo, T, s->I, s->O[0], NULL);
        return;
    }
    mm_part p[3];
    memset(p, 0, sizeof p);
    for (int i = 0; i < s->n; i++) {
        p[i].out = b->out[i];
        p[i].w = b->w + off;
        p[i].O = s->O[i];
        p[i].res = s->kind == K_RES ? b->res : NULL;
        off += (size_t)s->O[i] * s->I * 2;
    }
    be->matmul_fwd_n(be, p, s->n, b->x, s->kind == K_PROJ ? &nm : NULL, T, s->I);
}

static unsigned long long fnv(unsigned long long h, const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

static void one(eng_backend *be, const shape *s, bufs *b, int T) {
    size_t wb = w_elems(s) * 2;
    int ncopy = (int)(b->wcap / wb);
    if (ncopy > 40) ncopy = 40;
    if (ncopy < 2) gc_die(be, "weight pool too small");
    call(be, s, b, 0, T); /* plans, smem attributes: uncaptured */
    void *g = NULL;
    if (be->sync(be) || be->graph_begin(be)) gc_die(be, "capture");
    for (int i = 0; i < 40; i++) call(be, s, b, i % ncopy, T);
    if (be->graph_end(be, &g)) gc_die(be, "capture end");
    double t[5];
    for (int r = 0; r < 6; r++) {
        double t0 = clock_mono_ms();
        if (be->graph_launch(be, g) || be->sync(be)) gc_die(be, "replay");
        if (r) t[r - 1] = (clock_mono_ms() - t0) * 1e3 / 40;
    }
    be->graph_free(be, g);
    qsort(t, 5, sizeof(double), gc_cmpd);
    /* the outputs' bits on copy 0 */
    call(be, s, b, 0, T);
    unsigned long long h = 14695981039346656037ULL;
    int no = s->kind == K_MLP ? 3 : s->n;
    for (int i = 0; i < no; i++) {
        size_t n = (size_t)T * (s->kind == K_MLP ? s->O[0] : s->O[i]) * 2;
        unsigned char *hb = malloc(n);
        if (be->to_host(be, hb, i < 2 || s->kind != K_MLP ? b->out[i] : b->act, n) || be->sync(be)) gc_die(be, "to_host");
        h = fnv(h, hb, n);
        free(hb);
    }
    double rd = (double)wb + (double)T * s->I * 2, Osum = 0;
    for (int i = 0; i < s->n; i++) Osum += s->O[i];
    if (s->kind == K_RES) rd += (double)T * Osum * 2;
    char os[48];
    if (s->kind == K_MLP) snprintf(os, sizeof os, "2x%d", s->O[0]);
    else if (s->n == 1) snprintf(os, sizeof os, "%d", s->O[0]);
    else if (s->n == 2) snprintf(os, sizeof os, "%d+%d", s->O[0], s->O[1]);
    else snprintf(os, sizeof os, "%d+%d+%d", s->O[0], s->O[1], s->O[2]);
    printf("SK %-10s %-8s T=%-2d I=%-5d O=%-15s %8.2f us %5.2f TB/s  floor %6.2f us  x%.2f  hash %016llx\n", s->model, s->op, T,
           s->I, os, t[2], rd / t[2] / 1e6, wb / 4.2e6, t[2] / (wb / 4.2e6), h);
}

int main(int argc, char **argv) {
    const char *want = argc > 1 ? argv[1] : "all";
    int Ts[8] = {1, 4, 16, 64}, nT = 4;
    if (argc > 2) {
        nT = 0;
        for (int i = 2; i < argc && nT < 8; i++) Ts[nT++] = atoi(argv[i]);
    }
    eng_backend *be;
    if (backend_cuda_create(&be, 0)) gc_die(NULL, "backend_cuda_create");
    be->tune.skinny = TUNE_SKINNY_FORCE;
    bufs b = {0};
    b.wcap = (size_t)1200 << 20;
    b.w = be->alloc(be, b.wcap);
    size_t big = (size_t)64 * 12288 * 2;
    b.x = be->alloc(be, big), b.nw = be->alloc(be, 12288 * 2), b.ln = be->alloc(be, big), b.res = be->alloc(be, big);
    b.out[0] = be->alloc(be, (size_t)64 * 8192 * 2 * 2), b.out[1] = be->alloc(be, big), b.out[2] = be->alloc(be, big);
    b.act = be->alloc(be, big);
    if (!b.w || !b.x || !b.nw || !b.ln || !b.res || !b.out[0] || !b.out[1] || !b.out[2] || !b.act) gc_die(be, "alloc");
    size_t blk = (size_t)1 << 24;
    float *hb = gc_rand(blk, 0.02f, 3);
    for (size_t off = 0; off < b.wcap / 2; off += blk)
        be->act_from_f32(be, b.w + off * 2, hb, b.wcap / 2 - off < blk ? b.wcap / 2 - off : blk);
    free(hb);
    float *hx = gc_rand((size_t)64 * 12288, 1.0f, 5), *hn = gc_rand(12288, 0.1f, 6);
    for (int i = 0; i < 12288; i++) hn[i] += 1.0f;
    be->act_from_f32(be, b.x, hx, (size_t)64 * 12288);
    be->act_from_f32(be, b.nw, hn, 12288);
    free(hx), free(hn);
    hx = gc_rand((size_t)64 * 12288, 0.5f, 8);
    be->act_from_f32(be, b.res, hx, (size_t)64 * 12288);
    free(hx);
    for (size_t i = 0; i < sizeof SH / sizeof SH[0]; i++) {
        if (strcmp(want, "all") && strcmp(want, SH[i].model)) continue;
        for (int j = 0; j < nT; j++) one(be, &SH[i], &b, Ts[j]);
    }
    be->destroy(be);
    return 0;
}
