/* bench_moe.c — the MoE experts' GEMMs alone (kernels/moe.h) at Qwen3-30B-A3B dims (C=2048,
 * Fm=768, E=128, top-8), each variant of kernels/tune.h's `moe` on the same routes:
 *   training: moe_experts_fwd and moe_experts_bwd (every weight gradient) at T tokens, tiles vs
 *             grouped (gemm_grouped.cu) vs cublas (cuBLAS's grouped GEMM), then the base frozen
 *             (no weight gradients, both grouped forms) and with LoRA r=16 on the experts (the
 *             adapters' rows: FLOPs counted as the base's); useful TFLOP/s (6·S·C·Fm forward,
 *             12·S·C·Fm backward, S = T·k) beside a dense cuBLASLt GEMM of the gate
 *             projection's shape (S×C by C×Fm): the ceiling;
 *   decode:   moe_experts_fwd at T rows, tiles vs few; the routed experts' weight bytes (3·Fm·C·2
 *             each touched expert) over the time, beside the device's copy bandwidth (read+write).
 * Routes from the router op on random x and router weights (about uniform over the experts, as
 * a random-weight model routes). Random bf16 inputs; host clock around a device sync, median of
 * 5 after a warm-up (decode: of 20 calls, each on another layer's weights so that L2 holds none).
 * Before the training rows, ROW lines: grouped vs cublas outputs on the same inputs (exit 1 when
 * one fails).
 * Usage: bench_moe [T_train ...]   (default 9216 24576) */
#include <cuda_runtime_api.h>

#include "tests/gpu/gpu_check.h"

enum { C = 2048, FM = 768, E = 128, K = 8, DEC_LAYERS = 8 };

typedef struct {
    eng_backend *be;
    void *wg[DEC_LAYERS], *wu[DEC_LAYERS], *wd[DEC_LAYERS], *wr;
} moe_w;

static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof(double), gc_cmpd);
    return t[n / 2];
}

/* routes of T random tokens: topi, topw on the device; touched = experts with a slot */
static void routes(moe_w *w, int T, void **x, int **ti, float **tw, int *touched) {
    eng_backend *be = w->be;
    float *h = gc_rand((size_t)T * C, 1.0f, 100 + T);
    *x = gc_act(be, h, (size_t)T * C);
    free(h);
    float *p = be->alloc(be, (size_t)T * E * 4);
    *ti = be->alloc(be, (size_t)T * K * 4);
    *tw = be->alloc(be, (size_t)T * K * 4);
    be->moe_router_fwd(be, p, *ti, *tw, NULL, *x, w->wr, NULL, NULL, T, C, E, K, 1);
    int *hi = (int *)gc_get_f32(be, *ti, (size_t)T * K), used[E] = {0};
    *touched = 0;
    for (int i = 0; i < T * K; i++) *touched += !used[hi[i]]++;
    free(hi);
    be->free(be, p);
}

/* one training variant's row: fwd and bwd at T tokens on the buffers of b (dw NULL: frozen) */
typedef struct {
    void *x, *out, *dout, *dx, *eg, *eu, *ey, *dg, *du;
    int *ti;
    float *tw, *dtw;
} train_bufs;

static void train_row(moe_w *w, const train_bufs *b, const char *name, int T, int touched, float *dwg, float *dwu, float *dwd,
                      const moe_lora *lr) {
    eng_backend *be = w->be;
    size_t S = (size_t)T * K;
    double fl = 6.0 * S * C * FM, tf[5], tb[5], hf[5], hb[5]; /* h: until the call returns (its host work) */
    for (int i = 0; i < 6; i++) {
        double t0 = gc_now();
        be->moe_experts_fwd(be, b->out, b->eg, b->eu, b->ey, b->x, b->x, b->ti, b->tw, w->wg[0], w->wu[0], w->wd[0], T, C, E, K,
                            FM, lr);
        double th = gc_now();
        if (be->sync(be)) gc_die(be, "fwd");
        double t1 = gc_now();
        be->moe_experts_bwd(be, b->dx, dwg, dwu, dwd, b->dtw, b->dg, b->du, b->dout, b->x, b->ti, b->tw, b->eg, b->eu, b->ey,
                            w->wg[0], w->wu[0], w->wd[0], T, C, E, K, FM, lr);
        double th1 = gc_now();
        if (be->sync(be)) gc_die(be, "bwd");
        if (i) tf[i - 1] = t1 - t0, tb[i - 1] = gc_now() - t1, hf[i - 1] = th - t0, hb[i - 1] = th1 - t1;
    }
    double f = median(tf, 5), bw = median(tb, 5);
    printf("moe experts T=%d (S=%zu, %d experts touched) %-13s fwd %8.2f ms %6.1f TFLOP/s   bwd %8.2f ms %6.1f TFLOP/s   "
           "fwd+bwd %8.2f ms  (host %.2f + %.2f ms)\n",
           T, S, touched, name, f * 1e3, fl / f / 1e12, bw * 1e3, 2 * fl / bw / 1e12, (f + bw) * 1e3, median(hf, 5) * 1e3,
           median(hb, 5) * 1e3);
}

/* The in-house grouped GEMMs against cuBLAS's grouped GEMM on the same inputs at these dims
 * (fwd, then bwd with every weight gradient; "+=" outputs from the same random start): out,
 * dx, dWg, dWu, dWd within 1e-2 (relative L2; the bf16 activations' rounding between two sum
 * orders). test_ops' moe rows hold both against the CPU backend at small dims. */
static void grouped_rows(moe_w *w, const train_bufs *b, int T, float *dwg, float *dwu, float *dwd) {
    eng_backend *be = w->be;
    size_t S = (size_t)T * K, nw = (size_t)E * FM * C, nx = (size_t)T * C;
    float *h = gc_rand(nx, 1.0f, 7), *w0 = gc_rand(nw, 0.01f, 21);
    float *got[2][5];
    for (int f = 0; f < 2; f++) {
        be->tune.moe = f ? TUNE_MOE_CUBLAS : TUNE_MOE_GROUPED;
        if (be->act_from_f32(be, b->dx, h, nx) || be->to_dev(be, dwg, w0, nw * 4) || be->to_dev(be, dwu, w0, nw * 4) ||
            be->to_dev(be, dwd, w0, nw * 4))
            gc_die(be, "reset");
        be->moe_experts_fwd(be, b->out, b->eg, b->eu, b->ey, b->x, b->x, b->ti, b->tw, w->wg[0], w->wu[0], w->wd[0], T, C, E, K,
                            FM, NULL);
        be->moe_experts_bwd(be, b->dx, dwg, dwu, dwd, b->dtw, b->dg, b->du, b->dout, b->x, b->ti, b->tw, b->eg, b->eu, b->ey,
                            w->wg[0], w->wu[0], w->wd[0], T, C, E, K, FM, NULL);
        got[f][0] = gc_get_act(be, b->out, nx), got[f][1] = gc_get_act(be, b->dx, nx);
        got[f][2] = gc_get_f32(be, dwg, nw), got[f][3] = gc_get_f32(be, dwu, nw), got[f][4] = gc_get_f32(be, dwd, nw);
    }
    be->tune.moe = TUNE_MOE_AUTO;
    static const char *on[5] = {"out", "dx", "dWg", "dWu", "dWd"};
    size_t nn[5] = {nx, nx, nw, nw, nw};
    char sh[64];
    snprintf(sh, sizeof sh, "T=%d S=%zu C=%d Fm=%d E=%d", T, S, C, FM, E);
    for (int o = 0; o < 5; o++) {
        char t[64];
        snprintf(t, sizeof t, "moe grouped vs cublas %s", on[o]);
        gc_row(t, sh, rel_l2(got[0][o], got[1][o], nn[o]), 1e-2);
    }
    for (int f = 0; f < 2; f++)
        for (int o = 0; o < 5; o++) free(got[f][o]);
    free(h);
    free(w0);
}

static void bench_train(moe_w *w, int T) {
    eng_backend *be = w->be;
    size_t S = (size_t)T * K, nw = (size_t)E * FM * C;
    void *x;
    int *ti, touched;
    float *tw;
    routes(w, T, &x, &ti, &tw, &touched);
    float *h = gc_rand((size_t)T * C, 1.0f, 7);
    void *out = be->alloc(be, (size_t)T * C * 2), *dout = gc_act(be, h, (size_t)T * C), *dx = gc_act(be, h, (size_t)T * C);
    free(h);
    void *eg = be->alloc(be, S * FM * 2), *eu = be->alloc(be, S * FM * 2), *ey = be->alloc(be, S * C * 2);
    void *dg = be->alloc(be, S * FM * 2), *du = be->alloc(be, S * FM * 2);
    float *dtw = be->alloc(be, S * 4), *dwg = be->alloc(be, nw * 4), *dwu = be->alloc(be, nw * 4), *dwd = be->alloc(be, nw * 4);
    if (!dwd || !dx || !ey) gc_die(be, "alloc");
    train_bufs b = {x, out, dout, dx, eg, eu, ey, dg, du, ti, tw, dtw};
    grouped_rows(w, &b, T, dwg, dwu, dwd);
    static const int vs[] = {TUNE_MOE_TILES, TUNE_MOE_GROUPED, TUNE_MOE_CUBLAS};
    static const char *vn[] = {"tiles", "grouped", "cublas"};
    for (int v = 0; v < 3; v++) {
        be->tune.moe = vs[v];
        train_row(w, &b, vn[v], T, touched, dwg, dwu, dwd, NULL);
    }
    /* LoRA r=16 on the experts as PEFT targets them (gate_up rank 2r, down rank r), the base
     * frozen as LoRA trains it: beside the frozen base without adapters (the floor) */
    enum { R = 16 };
    moe_lora lr = {0};
    float *hl = gc_rand((size_t)E * 2 * R * (C + 2 * FM) + 64, 0.02f, 11);
    lr.rg = 2 * R, lr.rd = R;
    size_t na = (size_t)E * 2 * R * C, nb = (size_t)E * 2 * FM * 2 * R, nad = (size_t)E * R * FM, nbd = (size_t)E * C * R;
    lr.agu = gc_act(be, hl, na), lr.bgu = gc_act(be, hl + 1, nb), lr.ad = gc_act(be, hl + 2, nad), lr.bd = gc_act(be, hl + 3, nbd);
    free(hl);
    lr.gagu = be->alloc(be, na * 4), lr.gbgu = be->alloc(be, nb * 4), lr.gad = be->alloc(be, nad * 4),
    lr.gbd = be->alloc(be, nbd * 4);
    if (!lr.gbd) gc_die(be, "alloc lora");
    be->tune.moe = TUNE_MOE_GROUPED;
    train_row(w, &b, "frozen", T, touched, NULL, NULL, NULL, NULL);
    be->tune.moe = TUNE_MOE_CUBLAS;
    train_row(w, &b, "frozen-cublas", T, touched, NULL, NULL, NULL, NULL);
    be->tune.moe = TUNE_MOE_AUTO;
    train_row(w, &b, "lora16", T, touched, NULL, NULL, NULL, &lr);
    be->tune.moe = TUNE_MOE_TILES;
    train_row(w, &b, "lora16-tiles", T, touched, NULL, NULL, NULL, &lr);
    void *lb[] = {(void *)lr.agu, (void *)lr.bgu, (void *)lr.ad, (void *)lr.bd, lr.gagu, lr.gbgu, lr.gad, lr.gbd};
    for (size_t i = 0; i < sizeof lb / sizeof lb[0]; i++) be->free(be, lb[i]);
    be->tune.moe = TUNE_MOE_AUTO;
    /* the ceiling: one dense GEMM of the gate projection's shape, (S, C) x (C, Fm) */
    double tg[5];
    for (int i = 0; i < 6; i++) {
        double t0 = gc_now();
        be->matmul_fwd(be, ey, x, w->wg[0], NULL, (int)(S / 8), C, FM * 8); /* S/8 rows x 8 Fm outputs: same FLOPs */
        if (be->sync(be)) gc_die(be, "dense");
        if (i) tg[i - 1] = gc_now() - t0;
    }
    double g = median(tg, 5);
    printf("dense cuBLASLt GEMM %zu x %d x %d (the ceiling): %.2f ms %.1f TFLOP/s\n", S / 8, FM * 8, C, g * 1e3,
           2.0 * S * C * FM / g / 1e12);
    void *bufs[] = {x, ti, tw, out, dout, dx, eg, eu, ey, dg, du, dtw, dwg, dwu, dwd};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
}

static void bench_decode(moe_w *w, int T, double bw) {
    eng_backend *be = w->be;
    size_t S = (size_t)T * K;
    void *x;
    int *ti, touched;
    float *tw;
    routes(w, T, &x, &ti, &tw, &touched);
    void *out = be->alloc(be, (size_t)T * C * 2), *eg = be->alloc(be, S * FM * 2), *eu = be->alloc(be, S * FM * 2);
    void *ey = be->alloc(be, S * C * 2);
    double bytes = (double)touched * 3 * FM * C * 2;
    static const int vs[] = {TUNE_MOE_TILES, TUNE_MOE_FEW};
    static const char *vn[] = {"tiles", "few"};
    for (int v = 0; v < 2; v++) {
        be->tune.moe = vs[v];
        double t[20];
        for (int i = 0; i < 21; i++) {
            int l = i % DEC_LAYERS;
            double t0 = gc_now();
            be->moe_experts_fwd(be, out, eg, eu, ey, x, x, ti, tw, w->wg[l], w->wu[l], w->wd[l], T, C, E, K, FM, NULL);
            if (be->sync(be)) gc_die(be, "decode");
            if (i) t[i - 1] = gc_now() - t0;
        }
        double m = median(t, 20);
        printf("moe decode T=%d (%d experts touched, %.0f MB) %-6s %7.1f us  %6.0f GB/s = %.2f of the copy bandwidth\n", T,
               touched, bytes / 1e6, vn[v], m * 1e6, bytes / m / 1e9, bytes / m / bw);
    }
    be->tune.moe = TUNE_MOE_AUTO;
    void *bufs[] = {x, ti, tw, out, eg, eu, ey};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
}

int main(int argc, char **argv) {
    moe_w w;
    if (backend_cuda_create(&w.be, 0)) gc_die(NULL, "backend_cuda_create");
    size_t nw = (size_t)E * FM * C;
    float *h = gc_rand(nw + 64, 0.02f, 1);
    for (int l = 0; l < DEC_LAYERS; l++) {
        w.wg[l] = gc_act(w.be, h + l, nw);
        w.wu[l] = gc_act(w.be, h + 17 + l, nw);
        w.wd[l] = gc_act(w.be, h + 33 + l, nw);
    }
    w.wr = gc_act(w.be, h + 50, (size_t)E * C);
    free(h);
    double bw = copy_bw();
    printf("bench_moe: C=%d Fm=%d E=%d top-%d, copy bandwidth %.0f GB/s (read+write)\n", C, FM, E, K, bw / 1e9);
    int dec[] = {16, 128};
    for (int i = 0; i < 2; i++) bench_decode(&w, dec[i], bw);
    if (argc > 1)
        for (int i = 1; i < argc; i++) bench_train(&w, atoi(argv[i]));
    else {
        bench_train(&w, 9216);
        bench_train(&w, 24576);
    }
    w.be->destroy(w.be);
    return gc_failures != 0;
}
