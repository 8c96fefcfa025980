/* test_deltanet_decode.c — the gated DeltaNet decode steps (kernels/deltanet_decode.h) and the
 * row scatter on CUDA against the CPU backend, on random bf16-rounded inputs and random
 * (non-zero) state rows, one row zeroed as a fresh prompt's. One call mixes what the rollout
 * scheduler sends: a prefill run of several tokens on one row, a run shorter than the conv,
 * single decode tokens on other rows in scattered order, a padding token (row -1) that must
 * change nothing, and a row no token names. Twice in a row, so the second call reads the
 * first's updated rows. Also a long call: a 300-token prefill run and a 70-token run (the state
 * held in registers across the run) beside single tokens. Tolerances: 1e-2 relative L2 for the bf16 outputs u and o (tests/gpu/
 * test_ops.c's reasoning); 1e-4 for the fp32 state (the same fp32 operations from the same
 * bf16 inputs, only the l2 norm's sum in another order and precision); 0 for the conv tails
 * and the scatter (copies of bf16 values).
 * Usage: test_deltanet_decode   (Qwen3.5-9B's DeltaNet heads and a small odd shape) */
#include "tests/gpu/gpu_check.h"

static eng_backend *cpu, *gpu;

/* srow of the mixed call: rows 0 (5 tokens), 3 (2), 1, 5, 2, then padding; row 4 untouched.
 * The long call (a prompt's prefill beside a continued run): row 0 LONG0 tokens, row 3 LONG3,
 * then 1, 5, 2 and padding. */
static const int SHORT[] = {0, 0, 0, 0, 0, 3, 3, 1, 5, 2, -1};
enum { NS = 6, LONG0 = 300, LONG3 = 70, NLONG = LONG0 + LONG3 + 4 };
static int LONG[NLONG];

static double rel_l2_rows(const float *a, const float *b, int T, size_t row) {
    return rel_l2(a, b, (size_t)(T - 1) * row); /* the padding token's outputs are not defined */
}

static void t_steps(const int *SROW, int NT, int Hk, int Hv, int Dk, int Dv, int Kc) {
    char sh[96];
    snprintf(sh, sizeof sh, "Hk=%d Hv=%d Dk=%d Dv=%d Kc=%d T=%d", Hk, Hv, Dk, Dv, Kc, NT);
    int T = NT, Cc = 2 * Hk * Dk + Hv * Dv, Kt = Kc - 1;
    size_t nst = (size_t)NS * Hv * Dk * Dv, ntl = (size_t)NS * Kt * Cc, SZ = (size_t)Hv * Dk * Dv;
    float *x = gc_rand((size_t)T * Cc, 1.0f, 1), *w = gc_rand((size_t)Cc * Kc, 0.5f, 2), *u = gc_rand((size_t)T * Cc, 1.0f, 3);
    float *a = gc_rand((size_t)T * Hv, 1.0f, 4), *b = gc_rand((size_t)T * Hv, 2.0f, 5);
    float *al = gc_rand(Hv, 1.0f, 6), *dt = gc_rand(Hv, 1.0f, 7);
    float *st = gc_rand(nst, 0.3f, 8), *tl = gc_rand(ntl, 1.0f, 9);
    memset(st, 0, SZ * 4); /* row 0: a fresh prompt */
    memset(tl, 0, (size_t)Kt * Cc * 4);
    float *uc = malloc((size_t)T * Cc * 4), *oc = malloc((size_t)T * Hv * Dv * 4), *stc = gc_copy(st, nst), *tlc = gc_copy(tl, ntl);
    void *gx = gc_act(gpu, x, (size_t)T * Cc), *gw = gc_act(gpu, w, (size_t)Cc * Kc), *gu = gc_act(gpu, u, (size_t)T * Cc);
    void *ga = gc_act(gpu, a, (size_t)T * Hv), *gb = gc_act(gpu, b, (size_t)T * Hv), *gal = gc_act(gpu, al, Hv),
         *gdt = gc_act(gpu, dt, Hv);
    void *guo = gpu->alloc(gpu, (size_t)T * Cc * 2), *go = gpu->alloc(gpu, (size_t)T * Hv * Dv * 2);
    float *gst = gc_dev(gpu, st, nst * 4), *gtl = gc_dev(gpu, tl, ntl * 4);
    int *gsrow = gc_dev(gpu, SROW, (size_t)NT * sizeof *SROW);
    for (int pass = 0; pass < 2; pass++) {
        cpu->deltanet_conv_step(cpu, uc, tlc, x, w, SROW, T, Cc, Kc);
        cpu->deltanet_rule_step(cpu, oc, stc, u, a, b, al, dt, SROW, T, Hk, Hv, Dk, Dv);
        gpu->deltanet_conv_step(gpu, guo, gtl, gx, gw, gsrow, T, Cc, Kc);
        gpu->deltanet_rule_step(gpu, go, gst, gu, ga, gb, gal, gdt, gsrow, T, Hk, Hv, Dk, Dv);
        float *ug = gc_get_act(gpu, guo, (size_t)T * Cc), *og = gc_get_act(gpu, go, (size_t)T * Hv * Dv);
        float *stg = gc_get_f32(gpu, gst, nst), *tlg = gc_get_f32(gpu, gtl, ntl);
        char name[64];
        snprintf(name, sizeof name, "deltanet_conv_step u (call %d)", pass + 1);
        gc_row(name, sh, rel_l2_rows(ug, uc, T, Cc), 1e-2);
        snprintf(name, sizeof name, "deltanet_conv_step tail (call %d)", pass + 1);
        gc_row(name, sh, rel_l2(tlg, tlc, ntl), 0);
        snprintf(name, sizeof name, "deltanet_rule_step o (call %d)", pass + 1);
        gc_row(name, sh, rel_l2_rows(og, oc, T, (size_t)Hv * Dv), 1e-2);
        snprintf(name, sizeof name, "deltanet_rule_step state (call %d)", pass + 1);
        gc_row(name, sh, rel_l2(stg, stc, nst), 1e-4);
        snprintf(name, sizeof name, "deltanet_rule_step row 4 untouched (call %d)", pass + 1);
        gc_row(name, sh, rel_l2(stg + 4 * SZ, st + 4 * SZ, SZ), 0);
        free(ug);
        free(og);
        free(stg);
        free(tlg);
    }
    void *bufs[] = {gx, gw, gu, ga, gb, gal, gdt, guo, go, gst, gtl, gsrow};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gpu->free(gpu, bufs[i]);
    float *hs[] = {x, w, u, a, b, al, dt, st, tl, uc, oc, stc, tlc};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) free(hs[i]);
}

/* The gated attention layers' K/V rows to scattered cache slots. */
static void t_scatter_rows(int T, int row, int S) {
    char sh[64];
    snprintf(sh, sizeof sh, "T=%d row=%d S=%d", T, row, S);
    float *src = gc_rand((size_t)T * row, 1.0f, 21), *dst = gc_rand((size_t)S * row, 1.0f, 22);
    int *slot = malloc((size_t)T * 4);
    for (int t = 0; t < T; t++) slot[t] = (t * 7 + 3) % S; /* distinct while T <= S, 7 prime to S */
    float *dc = gc_copy(dst, (size_t)S * row);
    cpu->scatter_rows(cpu, dc, src, slot, T, row);
    void *gs = gc_act(gpu, src, (size_t)T * row), *gd = gc_act(gpu, dst, (size_t)S * row);
    int *gsl = gc_dev(gpu, slot, (size_t)T * 4);
    gpu->scatter_rows(gpu, gd, gs, gsl, T, row);
    float *dg = gc_get_act(gpu, gd, (size_t)S * row);
    gc_row("scatter_rows", sh, rel_l2(dg, dc, (size_t)S * row), 0);
    gpu->free(gpu, gs);
    gpu->free(gpu, gd);
    gpu->free(gpu, gsl);
    free(src);
    free(dst);
    free(slot);
    free(dc);
    free(dg);
}

int main(void) {
    backend_cpu_create(&cpu, 0);
    if (backend_cuda_create(&gpu, 0)) gc_die(NULL, "backend_cuda_create");
    int ns = sizeof SHORT / sizeof SHORT[0];
    for (int t = 0; t < NLONG; t++) LONG[t] = t < LONG0 ? 0 : t < LONG0 + LONG3 ? 3 : (int[]){1, 5, 2, -1}[t - LONG0 - LONG3];
    t_steps(SHORT, ns, 16, 32, 128, 128, 4); /* Qwen3.5-9B */
    t_steps(LONG, NLONG, 16, 32, 128, 128, 4);
    t_steps(SHORT, ns, 2, 6, 16, 40, 3); /* small, Dv not a warp multiple, 3 value heads a key head */
    t_steps(LONG, NLONG, 2, 6, 16, 40, 3);
    t_steps(SHORT, ns, 4, 8, 256, 128, 4); /* Dk 256: eight row groups of 32, 1024 threads */
    t_steps(SHORT, ns, 1, 2, 64, 1024, 2); /* Dv 1024: one row group of 64 */
    t_scatter_rows(13, 256, 50);
    cpu->destroy(cpu);
    gpu->destroy(gpu);
    return gc_failures ? 1 : 0;
}
