/* test_ops.c — every op of the backend table on CUDA against the CPU backend, on random
 * bf16-rounded inputs, odd shapes included (T not a multiple of any tile, GQA, D 64 and 128,
 * two-range attention over several groups, a logprob head with several chunks, a vocabulary
 * that is not a multiple of 8). "+=" outputs start from random values and their increments
 * are compared. Tolerances: 1e-2 relative L2 for results that pass through bf16 activations
 * (bf16 has 8 bits of mantissa: one rounding is up to 2^-9 = 2e-3 relative, a few in a row
 * stay under 1e-2); 1e-4 for fp32 results of fp32 math (logprobs, statistics); 0 for copies.
 * The mixture-of-experts ops (t_moe) explain their own tolerances.
 * The hybrid model's ops (t_deltanet, t_gated_attn) explain theirs.
 * Usage: test_ops [small | attention | decode | exact | moe | hybrid | hybrid-small]   (small: the compute-sanitizer subset; the
 * others: their cases alone) */
#include "engine/format/config.h"
#include "kernels/moe.h"
#include "kernels/rope.h"
#include "tests/gpu/gpu_check.h"

static eng_backend *cpu, *gpu;
static int small_run;

static int *rand_ints(int n, int lo, int hi, unsigned long long seed) {
    int *x = malloc((size_t)n * sizeof(int) + 4);
    unsigned long long s = seed;
    for (int i = 0; i < n; i++) x[i] = lo + (int)((check_randf(&s, 0.5f) + 0.5f) * (hi - lo)) % (hi - lo);
    return x;
}

/* ---------------------------------------------------------------- simple ops */

static void t_embedding(int T, int C, int V) {
    char sh[64];
    snprintf(sh, sizeof sh, "T=%d C=%d V=%d", T, C, V);
    float *wte = gc_rand((size_t)V * C, 1.0f, 1), *dout = gc_rand((size_t)T * C, 1.0f, 2);
    float *dw0 = gc_rand((size_t)V * C, 1.0f, 3);
    int *tok = rand_ints(T, 0, V / 4 + 1, 4); /* repeats */
    float *o_c = malloc((size_t)T * C * 4), *dw_c = gc_copy(dw0, (size_t)V * C);
    cpu->embedding_fwd(cpu, o_c, tok, wte, T, C);
    cpu->embedding_bwd(cpu, dw_c, dout, tok, T, C);
    void *g_wte = gc_act(gpu, wte, (size_t)V * C), *g_out = gpu->alloc(gpu, (size_t)T * C * 2);
    void *g_dout = gc_act(gpu, dout, (size_t)T * C);
    float *g_dw = gc_dev(gpu, dw0, (size_t)V * C * 4);
    int *g_tok = gc_dev(gpu, tok, (size_t)T * 4);
    gpu->embedding_fwd(gpu, g_out, g_tok, g_wte, T, C);
    gpu->embedding_bwd(gpu, g_dw, g_dout, g_tok, T, C);
    float *o_g = gc_get_act(gpu, g_out, (size_t)T * C), *dw_g = gc_get_f32(gpu, g_dw, (size_t)V * C);
    gc_row("embedding_fwd", sh, rel_l2(o_g, o_c, (size_t)T * C), 0);
    gc_row("embedding_bwd", sh, gc_rel_delta(dw_g, dw0, dw_c, dw0, (size_t)V * C), 1e-5);
    gpu->free(gpu, g_wte);
    gpu->free(gpu, g_out);
    gpu->free(gpu, g_dout);
    gpu->free(gpu, g_dw);
    gpu->free(gpu, g_tok);
    free(wte);
    free(dout);
    free(dw0);
    free(tok);
    free(o_c);
    free(dw_c);
    free(o_g);
    free(dw_g);
}

static void t_rmsnorm(int T, int C) {
    char sh[64];
    snprintf(sh, sizeof sh, "rows=%d C=%d", T, C);
    size_t n = (size_t)T * C;
    float *x = gc_rand(n, 2.0f, 11), *w = gc_rand((size_t)C, 1.0f, 12), *dy = gc_rand(n, 1.0f, 13);
    float *dx0 = gc_rand(n, 0.3f, 14), *dw0 = gc_rand((size_t)C, 1.0f, 15);
    float *y_c = malloc(n * 4), *r_c = malloc((size_t)T * 4), *dx_c = gc_copy(dx0, n), *dw_c = gc_copy(dw0, (size_t)C);
    cpu->rmsnorm_fwd(cpu, y_c, r_c, x, w, T, C, 1e-6f);
    cpu->rmsnorm_bwd(cpu, dx_c, dw_c, dy, x, w, r_c, T, C);
    void *gx = gc_act(gpu, x, n), *gw = gc_act(gpu, w, (size_t)C), *gdy = gc_act(gpu, dy, n), *gdx = gc_act(gpu, dx0, n);
    void *gy = gpu->alloc(gpu, n * 2);
    float *gr = gpu->alloc(gpu, (size_t)T * 4), *gdw = gc_dev(gpu, dw0, (size_t)C * 4);
    gpu->rmsnorm_fwd(gpu, gy, gr, gx, gw, T, C, 1e-6f);
    gpu->rmsnorm_bwd(gpu, gdx, gdw, gdy, gx, gw, gr, T, C);
    float *y_g = gc_get_act(gpu, gy, n), *r_g = gc_get_f32(gpu, gr, (size_t)T), *dx_g = gc_get_act(gpu, gdx, n);
    float *dw_g = gc_get_f32(gpu, gdw, (size_t)C);
    gc_row("rmsnorm_fwd", sh, rel_l2(y_g, y_c, n), 1e-2);
    gc_row("rmsnorm_fwd rstd", sh, rel_l2(r_g, r_c, (size_t)T), 1e-4);
    gc_row("rmsnorm_bwd dinp", sh, gc_rel_delta(dx_g, dx0, dx_c, dx0, n), 1e-2);
    gc_row("rmsnorm_bwd dw", sh, gc_rel_delta(dw_g, dw0, dw_c, dw0, (size_t)C), 1e-2);
    gpu->free(gpu, gx);
    gpu->free(gpu, gw);
    gpu->free(gpu, gdy);
    gpu->free(gpu, gdx);
    gpu->free(gpu, gy);
    gpu->free(gpu, gr);
    gpu->free(gpu, gdw);
    free(x);
    free(w);
    free(dy);
    free(dx0);
    free(dw0);
    free(y_c);
    free(r_c);
    free(dx_c);
    free(dw_c);
    free(y_g);
    free(r_g);
    free(dx_g);
    free(dw_g);
}

/* residual add + norm, in place over x as the model runs it; the CPU sum is rounded to bf16
 * before its norm, as the GPU stores it */
/* rmsnorm_bwd twice on the same inputs: dinp and dw bit-identical (the dw reduction has a
 * fixed order) */
static void t_rmsnorm_determinism(int T, int C) {
    char sh[64];
    snprintf(sh, sizeof sh, "rows=%d C=%d", T, C);
    size_t n = (size_t)T * C;
    float *x = gc_rand(n, 2.0f, 19), *w = gc_rand((size_t)C, 1.0f, 20), *dy = gc_rand(n, 1.0f, 21);
    void *gx = gc_act(gpu, x, n), *gw = gc_act(gpu, w, (size_t)C), *gdy = gc_act(gpu, dy, n), *gy = gpu->alloc(gpu, n * 2);
    void *d1 = gpu->alloc(gpu, n * 2), *d2 = gpu->alloc(gpu, n * 2);
    float *gr = gpu->alloc(gpu, (size_t)T * 4), *w1 = gpu->alloc(gpu, (size_t)C * 4), *w2 = gpu->alloc(gpu, (size_t)C * 4);
    gpu->zero(gpu, d1, n * 2);
    gpu->zero(gpu, d2, n * 2);
    gpu->zero(gpu, w1, (size_t)C * 4);
    gpu->zero(gpu, w2, (size_t)C * 4);
    gpu->rmsnorm_fwd(gpu, gy, gr, gx, gw, T, C, 1e-6f);
    gpu->rmsnorm_bwd(gpu, d1, w1, gdy, gx, gw, gr, T, C);
    gpu->rmsnorm_bwd(gpu, d2, w2, gdy, gx, gw, gr, T, C);
    float *a1 = gc_get_act(gpu, d1, n), *a2 = gc_get_act(gpu, d2, n);
    float *b1 = gc_get_f32(gpu, w1, (size_t)C), *b2 = gc_get_f32(gpu, w2, (size_t)C);
    double diff = 0;
    for (size_t i = 0; i < n; i++) diff += a1[i] != a2[i];
    for (int i = 0; i < C; i++) diff += b1[i] != b2[i];
    gc_row("rmsnorm_bwd deterministic (diffs)", sh, diff, 0);
    gpu->free(gpu, gx);
    gpu->free(gpu, gw);
    gpu->free(gpu, gdy);
    gpu->free(gpu, gy);
    gpu->free(gpu, d1);
    gpu->free(gpu, d2);
    gpu->free(gpu, gr);
    gpu->free(gpu, w1);
    gpu->free(gpu, w2);
    free(x);
    free(w);
    free(dy);
    free(a1);
    free(a2);
    free(b1);
    free(b2);
}

/* Qwen3's q/k norm + RoPE, forward and backward (dinp written over random contents) */
static void t_qk_norm_rope(int T, int H, int D) {
    char sh[64];
    snprintf(sh, sizeof sh, "T=%d H=%d D=%d", T, H, D);
    size_t n = (size_t)T * H * D;
    float *x = gc_rand(n, 2.0f, 33), *w = gc_rand((size_t)D, 1.0f, 34), *dy = gc_rand(n, 1.0f, 35);
    float *dx0 = gc_rand(n, 1.0f, 36), *dw0 = gc_rand((size_t)D, 1.0f, 37), *f = malloc((size_t)D / 2 * 4);
    rope_inv_freq(f, D, 1000000.0f, 0, 0, 0, 0);
    int *pos = rand_ints(T, 0, 40000, 38);
    float *y_c = malloc(n * 4), *r_c = malloc((size_t)T * H * 4), *dx_c = malloc(n * 4), *dw_c = gc_copy(dw0, (size_t)D);
    /* forward through qkv_rope_fwd with k = v = q (only q's outputs checked here) */
    float *k_c = malloc(n * 4);
    qkv_rope_io io = {.q_out = y_c, .k_out = k_c, .v_out = (void *)x, .rstd_q = r_c, .q = x, .k = x, .v = x, .qw = w, .kw = w};
    cpu->qkv_rope_fwd(cpu, &io, pos, f, T, H, H, D, 1e-6f);
    free(k_c);
    cpu->qk_norm_rope_bwd(cpu, dx_c, dw_c, dy, x, w, r_c, pos, f, T, H, D);
    void *gx = gc_act(gpu, x, n), *gw = gc_act(gpu, w, (size_t)D), *gdy = gc_act(gpu, dy, n), *gdx = gc_act(gpu, dx0, n);
    void *gy = gpu->alloc(gpu, n * 2);
    float *gr = gpu->alloc(gpu, (size_t)T * H * 4), *gdw = gc_dev(gpu, dw0, (size_t)D * 4), *gf = gc_dev(gpu, f, (size_t)D / 2 * 4);
    int *gp = gc_dev(gpu, pos, (size_t)T * 4);
    void *gk = gpu->alloc(gpu, n * 2);
    qkv_rope_io gio = {.q_out = gy, .k_out = gk, .v_out = gx, .rstd_q = gr, .q = gx, .k = gx, .v = gx, .qw = gw, .kw = gw};
    gpu->qkv_rope_fwd(gpu, &gio, gp, gf, T, H, H, D, 1e-6f);
    gpu->free(gpu, gk);
    gpu->qk_norm_rope_bwd(gpu, gdx, gdw, gdy, gx, gw, gr, gp, gf, T, H, D);
    float *y_g = gc_get_act(gpu, gy, n), *r_g = gc_get_f32(gpu, gr, (size_t)T * H), *dx_g = gc_get_act(gpu, gdx, n);
    float *dw_g = gc_get_f32(gpu, gdw, (size_t)D);
    gc_row("qk_norm_rope_fwd", sh, rel_l2(y_g, y_c, n), 1e-2);
    gc_row("qk_norm_rope_fwd rstd", sh, rel_l2(r_g, r_c, (size_t)T * H), 1e-4);
    gc_row("qk_norm_rope_bwd dinp", sh, rel_l2(dx_g, dx_c, n), 1e-2);
    gc_row("qk_norm_rope_bwd dw", sh, gc_rel_delta(dw_g, dw0, dw_c, dw0, (size_t)D), 1e-2);
    gpu->free(gpu, gx);
    gpu->free(gpu, gw);
    gpu->free(gpu, gdy);
    gpu->free(gpu, gdx);
    gpu->free(gpu, gy);
    gpu->free(gpu, gr);
    gpu->free(gpu, gdw);
    gpu->free(gpu, gf);
    gpu->free(gpu, gp);
    free(x);
    free(w);
    free(dy);
    free(dx0);
    free(dw0);
    free(f);
    free(pos);
    free(y_c);
    free(r_c);
    free(dx_c);
    free(dw_c);
    free(y_g);
    free(r_g);
    free(dx_g);
    free(dw_g);
}

static void t_matmul(int T, int I, int O, int bias) {
    char sh[64];
    snprintf(sh, sizeof sh, "T=%d I=%d O=%d%s", T, I, O, bias ? " +bias" : "");
    float *x = gc_rand((size_t)T * I, 1.0f, 21), *w = gc_rand((size_t)O * I, 0.1f, 22), *b = gc_rand((size_t)O, 1.0f, 23);
    float *dy = gc_rand((size_t)T * O, 1.0f, 24), *dx0 = gc_rand((size_t)T * I, 0.5f, 25);
    float *dw0 = gc_rand((size_t)O * I, 5.0f, 26), *db0 = gc_rand((size_t)O, 5.0f, 27);
    float *y_c = malloc((size_t)T * O * 4), *dx_c = gc_copy(dx0, (size_t)T * I), *dw_c = gc_copy(dw0, (size_t)O * I);
    float *db_c = gc_copy(db0, (size_t)O);
    cpu->matmul_fwd(cpu, y_c, x, w, bias ? b : NULL, T, I, O);
    cpu->matmul_bwd(cpu, dx_c, dw_c, bias ? db_c : NULL, dy, x, w, T, I, O);
    void *gx = gc_act(gpu, x, (size_t)T * I), *gw = gc_act(gpu, w, (size_t)O * I), *gb = gc_act(gpu, b, (size_t)O);
    void *gdy = gc_act(gpu, dy, (size_t)T * O), *gdx = gc_act(gpu, dx0, (size_t)T * I), *gy = gpu->alloc(gpu, (size_t)T * O * 2);
    float *gdw = gc_dev(gpu, dw0, (size_t)O * I * 4), *gdb = gc_dev(gpu, db0, (size_t)O * 4);
    gpu->matmul_fwd(gpu, gy, gx, gw, bias ? gb : NULL, T, I, O);
    gpu->matmul_bwd(gpu, gdx, gdw, bias ? gdb : NULL, gdy, gx, gw, T, I, O);
    float *y_g = gc_get_act(gpu, gy, (size_t)T * O), *dx_g = gc_get_act(gpu, gdx, (size_t)T * I);
    float *dw_g = gc_get_f32(gpu, gdw, (size_t)O * I), *db_g = gc_get_f32(gpu, gdb, (size_t)O);
    gc_row("matmul_fwd", sh, rel_l2(y_g, y_c, (size_t)T * O), 1e-2);
    gc_row("matmul_bwd dinp", sh, gc_rel_delta(dx_g, dx0, dx_c, dx0, (size_t)T * I), 1e-2);
    gc_row("matmul_bwd dw", sh, gc_rel_delta(dw_g, dw0, dw_c, dw0, (size_t)O * I), 1e-2);
    if (bias) gc_row("matmul_bwd dbias", sh, gc_rel_delta(db_g, db0, db_c, db0, (size_t)O), 1e-2);
    gpu->free(gpu, gx);
    gpu->free(gpu, gw);
    gpu->free(gpu, gb);
    gpu->free(gpu, gdy);
    gpu->free(gpu, gdx);
    gpu->free(gpu, gy);
    gpu->free(gpu, gdw);
    gpu->free(gpu, gdb);
    free(x);
    free(w);
    free(b);
    free(dy);
    free(dx0);
    free(dw0);
    free(db0);
    free(y_c);
    free(dx_c);
    free(dw_c);
    free(db_c);
    free(y_g);
    free(dx_g);
    free(dw_g);
    free(db_g);
}

/* Forward only, the few-row (decode) GEMM: the skinny kernel of matmul.cu, forced up to T = 64. */
static void t_matmul_fwd(int T, int I, int O, int bias) {
    char sh[64];
    snprintf(sh, sizeof sh, "T=%d I=%d O=%d%s", T, I, O, bias ? " +bias" : "");
    float *x = gc_rand((size_t)T * I, 1.0f, 31 + T), *w = gc_rand((size_t)O * I, 0.1f, 32 + O);
    float *b = gc_rand((size_t)O, 1.0f, 33), *y_c = malloc((size_t)T * O * 4);
    cpu->matmul_fwd(cpu, y_c, x, w, bias ? b : NULL, T, I, O);
    void *gx = gc_act(gpu, x, (size_t)T * I), *gw = gc_act(gpu, w, (size_t)O * I), *gb = gc_act(gpu, b, (size_t)O);
    void *gy = gpu->alloc(gpu, (size_t)T * O * 2);
    gpu->tune.skinny = TUNE_SKINNY_FORCE; /* the kernel up to T = 64 (by default T <= 16) */
    gpu->matmul_fwd(gpu, gy, gx, gw, bias ? gb : NULL, T, I, O);
    gpu->tune.skinny = TUNE_SKINNY_AUTO;
    float *y_g = gc_get_act(gpu, gy, (size_t)T * O);
    gc_row("matmul_fwd few rows", sh, rel_l2(y_g, y_c, (size_t)T * O), 3e-3);
    gpu->free(gpu, gx);
    gpu->free(gpu, gw);
    gpu->free(gpu, gb);
    gpu->free(gpu, gy);
    free(x);
    free(w);
    free(b);
    free(y_c);
    free(y_g);
}

/* matmul_fwd_n: up to three layers sharing their input in one launch (q/k/v, gate/up), each
 * part against the CPU backend; parts with odd O (a partial block at every part's end); with
 * MM_NORM the RMSNorm in front (x at scale 3, so the norm matters), with MM_RES each part's
 * residual added, with MM_LORA each part's low-rank term (rank 32, A and B random, the term
 * about the base's size; the second part of three has none): both halves in the op, x A^T in
 * the few-row launch's adapter tiles. The LoRA calls run three times: bit-identical outputs
 * (the launch's grid-wide counters are back at 0 after each). */
enum { MM_BIAS = 1, MM_NORM = 2, MM_RES = 4, MM_LORA = 8 };
static void t_matmul_fwd_n(int T, int I, int n, const int *O, int flags) {
    char sh[112];
    snprintf(sh, sizeof sh, "T=%d I=%d O=%d,%d,%d%s%s%s%s", T, I, O[0], n > 1 ? O[1] : 0, n > 2 ? O[2] : 0,
             flags & MM_BIAS ? " +bias" : "", flags & MM_NORM ? " +norm" : "", flags & MM_RES ? " +res" : "",
             flags & MM_LORA ? " +lora" : "");
    enum { LR = 32 };
    float *la[3] = {0}, *lu[3] = {0}, *lb[3] = {0};
    void *gla[3] = {0}, *glu[3] = {0}, *glb[3] = {0};
    float *x = gc_rand((size_t)T * I, 3.0f, 41 + T), *nw = gc_rand((size_t)I, 1.0f, 49), *lnc = malloc((size_t)T * I * 4);
    mm_part pc[3], pg[3];
    float *w[3], *b[3], *r[3], *yc[3];
    void *gw[3], *gb[3], *gr[3];
    for (int i = 0; i < n; i++) {
        w[i] = gc_rand((size_t)O[i] * I, 0.1f, 42 + i);
        b[i] = gc_rand((size_t)O[i], 1.0f, 45 + i);
        r[i] = gc_rand((size_t)T * O[i], 2.0f, 52 + i);
        yc[i] = malloc((size_t)T * O[i] * 4);
        mm_lowrank lc = {0}, lg = {0};
        if ((flags & MM_LORA) && (i != 1 || n < 3)) {
            la[i] = gc_rand((size_t)LR * I, 0.1f, 61 + i);
            lb[i] = gc_rand((size_t)O[i] * LR, 0.1f, 64 + i);
            lu[i] = malloc((size_t)T * LR * 4);
            gla[i] = gc_act(gpu, la[i], (size_t)LR * I);
            glb[i] = gc_act(gpu, lb[i], (size_t)O[i] * LR);
            glu[i] = gpu->alloc(gpu, (size_t)T * LR * 2);
            lc = (mm_lowrank){la[i], lb[i], lu[i], LR};
            lg = (mm_lowrank){gla[i], glb[i], glu[i], LR};
        }
        pc[i] = (mm_part){yc[i], w[i], flags & MM_BIAS ? b[i] : NULL, O[i], flags & MM_RES ? r[i] : NULL, lc};
        gw[i] = gc_act(gpu, w[i], (size_t)O[i] * I);
        gb[i] = gc_act(gpu, b[i], (size_t)O[i]);
        gr[i] = gc_act(gpu, r[i], (size_t)T * O[i]);
        pg[i] = (mm_part){gpu->alloc(gpu, (size_t)T * O[i] * 2), gw[i], flags & MM_BIAS ? gb[i] : NULL, O[i],
                          flags & MM_RES ? gr[i] : NULL,         lg};
    }
    void *gx = gc_act(gpu, x, (size_t)T * I), *gnw = gc_act(gpu, nw, (size_t)I), *gln = gpu->alloc(gpu, (size_t)T * I * 2);
    mm_norm nc = {nw, 1e-6f, lnc}, ng = {gnw, 1e-6f, gln};
    cpu->matmul_fwd_n(cpu, pc, n, x, flags & MM_NORM ? &nc : NULL, T, I);
    gpu->matmul_fwd_n(gpu, pg, n, gx, flags & MM_NORM ? &ng : NULL, T, I);
    double worst = 0, differ = 0;
    float *y1[3] = {0};
    for (int i = 0; i < n; i++) {
        float *yg = gc_get_act(gpu, pg[i].out, (size_t)T * O[i]);
        double e = rel_l2(yg, yc[i], (size_t)T * O[i]);
        if (!(e <= worst)) worst = e; /* NaN sticks */
        y1[i] = yg;
    }
    for (int rep = 0; (flags & MM_LORA) && rep < 2; rep++) {
        gpu->matmul_fwd_n(gpu, pg, n, gx, flags & MM_NORM ? &ng : NULL, T, I);
        for (int i = 0; i < n; i++) {
            float *yg = gc_get_act(gpu, pg[i].out, (size_t)T * O[i]);
            differ += memcmp(yg, y1[i], (size_t)T * O[i] * 4) != 0;
            free(yg);
        }
    }
    for (int i = 0; i < n; i++) {
        free(y1[i]);
        gpu->free(gpu, pg[i].out);
        gpu->free(gpu, gw[i]);
        gpu->free(gpu, gb[i]);
        gpu->free(gpu, gr[i]);
        free(w[i]);
        free(b[i]);
        free(r[i]);
        free(yc[i]);
        if (gla[i]) {
            gpu->free(gpu, gla[i]);
            gpu->free(gpu, glb[i]);
            gpu->free(gpu, glu[i]);
            free(la[i]);
            free(lb[i]);
            free(lu[i]);
        }
    }
    gc_row("matmul_fwd_n", sh, worst, 3e-3);
    if (flags & MM_LORA) gc_row("matmul_fwd_n +lora repeated: outputs differ", sh, differ, 0);
    gpu->free(gpu, gx);
    gpu->free(gpu, gnw);
    gpu->free(gpu, gln);
    free(x);
    free(nw);
    free(lnc);
}

/* qkv_rope_fwd into a KV cache: q/k norm (or none) and RoPE, k and v to distinct random rows of
 * an S-row cache of random contents (the rows not written must come back unchanged) */
static void t_qkv_rope(int T, int H, int K, int D, int norm, int cached) {
    char sh[96];
    snprintf(sh, sizeof sh, "T=%d H=%d K=%d D=%d %s %s", T, H, K, D, norm ? "qk-norm" : "no norm",
             cached ? "cache rows" : "in place");
    int S = cached ? 2 * T + 3 : T;
    size_t nq = (size_t)T * H * D, nk = (size_t)T * K * D, ns = (size_t)S * K * D;
    float *q = gc_rand(nq, 2.0f, 51), *k = gc_rand(nk, 2.0f, 52), *v = gc_rand(nk, 1.0f, 53);
    float *qw = gc_rand((size_t)D, 1.0f, 54), *kw = gc_rand((size_t)D, 1.0f, 55), *f = malloc((size_t)D / 2 * 4);
    float *kc = cached ? gc_rand(ns, 1.0f, 56) : gc_copy(k, nk), *vc = cached ? gc_rand(ns, 1.0f, 57) : gc_copy(v, nk);
    rope_inv_freq(f, D, 1000000.0f, 0, 0, 0, 0);
    int *pos = rand_ints(T, 0, 40000, 58), *rows = NULL;
    if (cached) { /* a random permutation of [0, S), its first T entries */
        int *perm = malloc((size_t)S * 4);
        unsigned long long sd = 59;
        for (int i = 0; i < S; i++) perm[i] = i;
        for (int i = S - 1; i > 0; i--) {
            int j = (int)((check_randf(&sd, 0.5f) + 0.5f) * (i + 1));
            j = j > i ? i : j;
            int x = perm[i];
            perm[i] = perm[j];
            perm[j] = x;
        }
        rows = perm;
    }
    float *q_c = malloc(nq * 4), *k_c = gc_copy(kc, cached ? ns : nk), *v_c = gc_copy(vc, cached ? ns : nk);
    float *rq_c = malloc((size_t)T * H * 4), *rk_c = malloc((size_t)T * K * 4);
    /* in place (no cache): k_out = k, v_out = v as the training forward without qk-norm */
    qkv_rope_io io = {.q_out = q_c,
                      .k_out = k_c,
                      .v_out = v_c,
                      .rstd_q = rq_c,
                      .rstd_k = rk_c,
                      .q = q,
                      .k = cached ? (const void *)k : k_c,
                      .v = cached ? (const void *)v : v_c,
                      .qw = norm ? qw : NULL,
                      .kw = norm ? kw : NULL,
                      .rows = rows};
    cpu->qkv_rope_fwd(cpu, &io, pos, f, T, H, K, D, 1e-6f);
    size_t nkv = cached ? ns : nk;
    void *gq = gc_act(gpu, q, nq), *gk = gc_act(gpu, k, nk), *gv = gc_act(gpu, v, nk), *gqo = gpu->alloc(gpu, nq * 2);
    void *gkc = gc_act(gpu, kc, nkv), *gvc = gc_act(gpu, vc, nkv), *gqw = gc_act(gpu, qw, (size_t)D),
         *gkw = gc_act(gpu, kw, (size_t)D);
    float *grq = gpu->alloc(gpu, (size_t)T * H * 4), *grk = gpu->alloc(gpu, (size_t)T * K * 4),
          *gf = gc_dev(gpu, f, (size_t)D / 2 * 4);
    int *gp = gc_dev(gpu, pos, (size_t)T * 4), *gr = cached ? gc_dev(gpu, rows, (size_t)T * 4) : NULL;
    qkv_rope_io gio = {.q_out = gqo,
                       .k_out = gkc,
                       .v_out = gvc,
                       .rstd_q = grq,
                       .rstd_k = grk,
                       .q = gq,
                       .k = cached ? gk : gkc,
                       .v = cached ? gv : gvc,
                       .qw = norm ? gqw : NULL,
                       .kw = norm ? gkw : NULL,
                       .rows = gr};
    gpu->qkv_rope_fwd(gpu, &gio, gp, gf, T, H, K, D, 1e-6f);
    float *q_g = gc_get_act(gpu, gqo, nq), *k_g = gc_get_act(gpu, gkc, nkv), *v_g = gc_get_act(gpu, gvc, nkv);
    gc_row("qkv_rope_fwd q", sh, rel_l2(q_g, q_c, nq), 1e-2);
    gc_row("qkv_rope_fwd k (whole cache)", sh, rel_l2(k_g, k_c, nkv), 1e-2);
    gc_row("qkv_rope_fwd v (whole cache)", sh, rel_l2(v_g, v_c, nkv), 1e-2);
    if (norm) {
        float *rq_g = gc_get_f32(gpu, grq, (size_t)T * H), *rk_g = gc_get_f32(gpu, grk, (size_t)T * K);
        gc_row("qkv_rope_fwd rstd q, k", sh, fmax(rel_l2(rq_g, rq_c, (size_t)T * H), rel_l2(rk_g, rk_c, (size_t)T * K)), 1e-4);
        free(rq_g);
        free(rk_g);
    }
    gpu->free(gpu, gq);
    gpu->free(gpu, gk);
    gpu->free(gpu, gv);
    gpu->free(gpu, gqo);
    gpu->free(gpu, gkc);
    gpu->free(gpu, gvc);
    gpu->free(gpu, gqw);
    gpu->free(gpu, gkw);
    gpu->free(gpu, grq);
    gpu->free(gpu, grk);
    gpu->free(gpu, gf);
    gpu->free(gpu, gp);
    if (gr) gpu->free(gpu, gr);
    free(q);
    free(k);
    free(v);
    free(qw);
    free(kw);
    free(f);
    free(kc);
    free(vc);
    free(pos);
    free(rows);
    free(q_c);
    free(k_c);
    free(v_c);
    free(rq_c);
    free(rk_c);
    free(q_g);
    free(k_g);
    free(v_g);
}

/* mlp_in_fwd: gate/up projections and SwiGLU, the few-row kernel's SwiGLU mode at decode sizes
 * (F not a multiple of a tile: the partial tile's outputs past F unwritten) and the GEMMs +
 * swiglu_fwd above them; gate, up and act each against the CPU backend. lora: rank-32 terms on
 * both (lora 2: on the up projection only), A and B random, in the one launch at decode sizes. */
static void t_mlp_in(int T, int I, int F, int norm, int lora) {
    char sh[64];
    snprintf(sh, sizeof sh, "T=%d I=%d F=%d%s%s", T, I, F, norm ? " +norm" : "", lora == 1 ? " +lora" : lora ? " +lora(up)" : "");
    enum { LR = 32 };
    size_t nx = (size_t)T * I, nw = (size_t)F * I, ny = (size_t)T * F;
    float *x = gc_rand(nx, 3.0f, 61), *wg = gc_rand(nw, 0.1f, 62), *wu = gc_rand(nw, 0.1f, 63);
    float *a_c = malloc(ny * 4), *g_c = malloc(ny * 4), *u_c = malloc(ny * 4);
    float *lw = gc_rand((size_t)I, 1.0f, 64), *lnc = malloc(nx * 4);
    float *la[2], *lb[2], *lu[2];
    void *gla[2], *glb[2], *glu[2];
    mm_lowrank lc[2] = {{0}}, lg[2] = {{0}};
    for (int i = 0; i < 2; i++) {
        la[i] = gc_rand((size_t)LR * I, 0.1f, 65 + i);
        lb[i] = gc_rand((size_t)F * LR, 0.1f, 67 + i);
        lu[i] = malloc((size_t)T * LR * 4);
        gla[i] = gc_act(gpu, la[i], (size_t)LR * I);
        glb[i] = gc_act(gpu, lb[i], (size_t)F * LR);
        glu[i] = gpu->alloc(gpu, (size_t)T * LR * 2);
        if (lora == 1 || (lora && i == 1)) {
            lc[i] = (mm_lowrank){la[i], lb[i], lu[i], LR};
            lg[i] = (mm_lowrank){gla[i], glb[i], glu[i], LR};
        }
    }
    mm_norm nc = {lw, 1e-6f, lnc};
    cpu->mlp_in_fwd(cpu, a_c, g_c, u_c, x, norm ? &nc : NULL, wg, wu, T, I, F, lora ? lc : NULL);
    void *gx = gc_act(gpu, x, nx), *gwg = gc_act(gpu, wg, nw), *gwu = gc_act(gpu, wu, nw);
    void *ga = gpu->alloc(gpu, ny * 2), *gg = gpu->alloc(gpu, ny * 2), *gu = gpu->alloc(gpu, ny * 2);
    void *glw = gc_act(gpu, lw, (size_t)I), *gln = gpu->alloc(gpu, nx * 2);
    mm_norm ng = {glw, 1e-6f, gln};
    gpu->mlp_in_fwd(gpu, ga, gg, gu, gx, norm ? &ng : NULL, gwg, gwu, T, I, F, lora ? lg : NULL);
    for (int i = 0; i < 2; i++) {
        gpu->free(gpu, gla[i]);
        gpu->free(gpu, glb[i]);
        gpu->free(gpu, glu[i]);
        free(la[i]);
        free(lb[i]);
        free(lu[i]);
    }
    float *a_g = gc_get_act(gpu, ga, ny), *g_g = gc_get_act(gpu, gg, ny), *u_g = gc_get_act(gpu, gu, ny);
    gc_row("mlp_in_fwd gate", sh, rel_l2(g_g, g_c, ny), 3e-3);
    gc_row("mlp_in_fwd up", sh, rel_l2(u_g, u_c, ny), 3e-3);
    gc_row("mlp_in_fwd act", sh, rel_l2(a_g, a_c, ny), 1e-2);
    gpu->free(gpu, gx);
    gpu->free(gpu, gwg);
    gpu->free(gpu, gwu);
    gpu->free(gpu, ga);
    gpu->free(gpu, gg);
    gpu->free(gpu, gu);
    gpu->free(gpu, glw);
    gpu->free(gpu, gln);
    free(x);
    free(wg);
    free(wu);
    free(a_c);
    free(g_c);
    free(u_c);
    free(a_g);
    free(g_g);
    free(u_g);
    free(lw);
    free(lnc);
}

static void t_rope(int T, int H, int D) {
    char sh[64];
    snprintf(sh, sizeof sh, "T=%d H=%d D=%d", T, H, D);
    size_t n = (size_t)T * H * D;
    float *x = gc_rand(n, 1.0f, 31), *f = malloc((size_t)D / 2 * 4);
    rope_inv_freq(f, D, 1000000.0f, 0, 0, 0, 0);
    int *pos = rand_ints(T, 0, 20000, 32);
    float *y_c = gc_copy(x, n), *b_c = gc_copy(x, n);
    cpu->rope_fwd(cpu, y_c, pos, f, T, H, D);
    cpu->rope_bwd(cpu, b_c, pos, f, T, H, D);
    void *gy = gc_act(gpu, x, n), *gb = gc_act(gpu, x, n);
    float *gf = gc_dev(gpu, f, (size_t)D / 2 * 4);
    int *gp = gc_dev(gpu, pos, (size_t)T * 4);
    gpu->rope_fwd(gpu, gy, gp, gf, T, H, D);
    gpu->rope_bwd(gpu, gb, gp, gf, T, H, D);
    float *y_g = gc_get_act(gpu, gy, n), *b_g = gc_get_act(gpu, gb, n);
    gc_row("rope_fwd", sh, rel_l2(y_g, y_c, n), 1e-2);
    gc_row("rope_bwd", sh, rel_l2(b_g, b_c, n), 1e-2);
    gpu->free(gpu, gy);
    gpu->free(gpu, gb);
    gpu->free(gpu, gf);
    gpu->free(gpu, gp);
    free(x);
    free(f);
    free(pos);
    free(y_c);
    free(b_c);
    free(y_g);
    free(b_g);
}

/* The shared expert's gate (kernels/moe_shared.h): out += sigmoid(z) y; the backward in place
 * (y := d y, z := d z), against the CPU backend. */
static void t_moe_shared(int T, int C) {
    char sh[64];
    snprintf(sh, sizeof sh, "T=%d C=%d", T, C);
    size_t n = (size_t)T * C;
    float *o = gc_rand(n, 1.0f, 71), *y = gc_rand(n, 1.0f, 72), *z = gc_rand((size_t)T, 3.0f, 73), *dy = gc_rand(n, 1.0f, 74);
    float *o_c = gc_copy(o, n), *y_c = gc_copy(y, n), *z_c = gc_copy(z, (size_t)T);
    cpu->moe_shared_gate_fwd(cpu, o_c, y, z, T, C);
    cpu->moe_shared_gate_bwd(cpu, y_c, z_c, dy, T, C);
    void *go = gc_act(gpu, o, n), *gy = gc_act(gpu, y, n), *gz = gc_act(gpu, z, (size_t)T), *gdy = gc_act(gpu, dy, n);
    gpu->moe_shared_gate_fwd(gpu, go, gy, gz, T, C);
    gpu->moe_shared_gate_bwd(gpu, gy, gz, gdy, T, C);
    float *o_g = gc_get_act(gpu, go, n), *y_g = gc_get_act(gpu, gy, n), *z_g = gc_get_act(gpu, gz, (size_t)T);
    gc_row("moe_shared_gate_fwd", sh, rel_l2(o_g, o_c, n), 1e-2);
    gc_row("moe_shared_gate_bwd dy", sh, rel_l2(y_g, y_c, n), 1e-2);
    gc_row("moe_shared_gate_bwd dz", sh, rel_l2(z_g, z_c, (size_t)T), 1e-2);
    gpu->free(gpu, go), gpu->free(gpu, gy), gpu->free(gpu, gz), gpu->free(gpu, gdy);
    free(o), free(y), free(z), free(dy), free(o_c), free(y_c), free(z_c), free(o_g), free(y_g), free(z_g);
}

static void t_elementwise(long long n) {
    char sh[64];
    snprintf(sh, sizeof sh, "n=%lld", n);
    float *g = gc_rand((size_t)n, 4.0f, 41), *u = gc_rand((size_t)n, 2.0f, 42), *dy = gc_rand((size_t)n, 1.0f, 43);
    float *o_c = malloc((size_t)n * 4), *dg_c = malloc((size_t)n * 4), *du_c = malloc((size_t)n * 4), *s_c = malloc((size_t)n * 4);
    cpu->swiglu_fwd(cpu, o_c, g, u, n);
    cpu->swiglu_bwd(cpu, dg_c, du_c, dy, g, u, n);
    cpu->add(cpu, s_c, g, u, n);
    void *gg = gc_act(gpu, g, (size_t)n), *gu = gc_act(gpu, u, (size_t)n), *gdy = gc_act(gpu, dy, (size_t)n);
    void *go = gpu->alloc(gpu, (size_t)n * 2), *gdg = gpu->alloc(gpu, (size_t)n * 2), *gdu = gpu->alloc(gpu, (size_t)n * 2);
    float *gf = gc_dev(gpu, g, (size_t)n * 4);
    void *gconv = gpu->alloc(gpu, (size_t)n * 2);
    gpu->swiglu_fwd(gpu, go, gg, gu, n);
    gpu->swiglu_bwd(gpu, gdg, gdu, gdy, gg, gu, n);
    gpu->f32_to_act(gpu, gconv, gf, (size_t)n);
    gpu->add(gpu, gg, gg, gu, n); /* in place, as the model uses it */
    float *o_g = gc_get_act(gpu, go, (size_t)n), *dg_g = gc_get_act(gpu, gdg, (size_t)n), *du_g = gc_get_act(gpu, gdu, (size_t)n);
    float *s_g = gc_get_act(gpu, gg, (size_t)n), *c_g = gc_get_act(gpu, gconv, (size_t)n);
    gc_row("swiglu_fwd", sh, rel_l2(o_g, o_c, (size_t)n), 1e-2);
    gc_row("swiglu_bwd dgate", sh, rel_l2(dg_g, dg_c, (size_t)n), 1e-2);
    gc_row("swiglu_bwd dup", sh, rel_l2(du_g, du_c, (size_t)n), 1e-2);
    gc_row("add (in place)", sh, rel_l2(s_g, s_c, (size_t)n), 1e-2);
    gc_row("f32_to_act", sh, rel_l2(c_g, g, (size_t)n), 0);
    /* acc_f32 twice onto fp32 u: the same fp32 additions of the bf16 values as the cpu's, so exact */
    float *a_c = gc_copy(u, (size_t)n), *ga = gc_dev(gpu, u, (size_t)n * 4), *a_g = malloc((size_t)n * 4);
    cpu->acc_f32(cpu, a_c, c_g, n);
    cpu->acc_f32(cpu, a_c, c_g, n);
    gpu->acc_f32(gpu, ga, gconv, n);
    gpu->acc_f32(gpu, ga, gconv, n);
    if (gpu->to_host(gpu, a_g, ga, (size_t)n * 4)) gc_die(gpu, "acc_f32");
    gc_row("acc_f32 (bf16 into fp32, twice)", sh, rel_l2(a_g, a_c, (size_t)n), 0);
    gpu->free(gpu, ga);
    free(a_c);
    free(a_g);
    gpu->free(gpu, gg);
    gpu->free(gpu, gu);
    gpu->free(gpu, gdy);
    gpu->free(gpu, go);
    gpu->free(gpu, gdg);
    gpu->free(gpu, gdu);
    gpu->free(gpu, gf);
    gpu->free(gpu, gconv);
    free(g);
    free(u);
    free(dy);
    free(o_c);
    free(dg_c);
    free(du_c);
    free(s_c);
    free(o_g);
    free(dg_g);
    free(du_g);
    free(s_g);
    free(c_g);
}

/* ---------------------------------------------------------------- attention */

static int determ; /* t_attention also checks that a second backward is bit-identical */
static void t_attention(const char *name, ranges rg, int S, int H, int K, int D, int bwd) {
    char sh[96];
    int T = rg.T;
    snprintf(sh, sizeof sh, "%s T=%d H=%d K=%d D=%d", name, T, H, K, D);
    size_t nq = (size_t)T * H * D, nk = (size_t)S * K * D;
    float *q = gc_rand(nq, 2.0f, 61), *k = gc_rand(nk, 2.0f, 62), *v = gc_rand(nk, 1.0f, 63), *dout = gc_rand(nq, 1.0f, 64);
    float *dk0 = gc_rand(nk, 0.1f, 65), *dv0 = gc_rand(nk, 0.1f, 66);
    float *o_c = malloc(nq * 4), *l_c = malloc((size_t)T * H * 4), *dq_c = malloc(nq * 4);
    float *dk_c = gc_copy(dk0, nk), *dv_c = gc_copy(dv0, nk);
    attn_ranges rc = {rg.a0, rg.a1, rg.b0, rg.b1, NULL, NULL, 0};
    cpu->attention_fwd(cpu, o_c, l_c, q, k, v, rc, T, H, K, D);
    /* the backward reads the forward's output as bf16 storage would hold it */
    for (size_t i = 0; i < nq; i++) o_c[i] = gc_bf16(o_c[i]);
    if (bwd) cpu->attention_bwd(cpu, dq_c, dk_c, dv_c, dout, q, k, v, o_c, l_c, rc, T, S, H, K, D);
    void *gq = gc_act(gpu, q, nq), *gk = gc_act(gpu, k, nk), *gv = gc_act(gpu, v, nk), *gdo = gc_act(gpu, dout, nq);
    void *go = gpu->alloc(gpu, nq * 2), *gdq = gpu->alloc(gpu, nq * 2), *gdk = gc_act(gpu, dk0, nk), *gdv = gc_act(gpu, dv0, nk);
    float *gl = gpu->alloc(gpu, (size_t)T * H * 4);
    attn_ranges rg_g = gc_dev_ranges(gpu, rg);
    gpu->attention_fwd(gpu, go, gl, gq, gk, gv, rg_g, T, H, K, D);
    if (bwd) gpu->attention_bwd(gpu, gdq, gdk, gdv, gdo, gq, gk, gv, go, gl, rg_g, T, S, H, K, D);
    if (bwd && determ) { /* the same backward again into fresh buffers: bit-identical */
        void *gdq2 = gpu->alloc(gpu, nq * 2), *gdk2 = gc_act(gpu, dk0, nk), *gdv2 = gc_act(gpu, dv0, nk);
        gpu->attention_bwd(gpu, gdq2, gdk2, gdv2, gdo, gq, gk, gv, go, gl, rg_g, T, S, H, K, D);
        float *a1 = gc_get_act(gpu, gdq, nq), *a2 = gc_get_act(gpu, gdq2, nq);
        float *b1 = gc_get_act(gpu, gdk, nk), *b2 = gc_get_act(gpu, gdk2, nk);
        float *c1 = gc_get_act(gpu, gdv, nk), *c2 = gc_get_act(gpu, gdv2, nk);
        double diff = 0;
        for (size_t i = 0; i < nq; i++) diff += a1[i] != a2[i];
        for (size_t i = 0; i < nk; i++) diff += (b1[i] != b2[i]) + (c1[i] != c2[i]);
        gc_row("attention_bwd deterministic (diffs)", sh, diff, 0);
        gpu->free(gpu, gdq2);
        gpu->free(gpu, gdk2);
        gpu->free(gpu, gdv2);
        free(a1);
        free(a2);
        free(b1);
        free(b2);
        free(c1);
        free(c2);
    }
    float *o_g = gc_get_act(gpu, go, nq), *l_g = gc_get_f32(gpu, gl, (size_t)T * H);
    gc_row("attention_fwd out", sh, rel_l2(o_g, o_c, nq), 1e-2);
    gc_row("attention_fwd lse", sh, rel_l2(l_g, l_c, (size_t)T * H), 1e-4);
    if (bwd) {
        float *dq_g = gc_get_act(gpu, gdq, nq), *dk_g = gc_get_act(gpu, gdk, nk), *dv_g = gc_get_act(gpu, gdv, nk);
        gc_row("attention_bwd dq", sh, rel_l2(dq_g, dq_c, nq), 1e-2);
        gc_row("attention_bwd dk", sh, gc_rel_delta(dk_g, dk0, dk_c, dk0, nk), 1e-2);
        gc_row("attention_bwd dv", sh, gc_rel_delta(dv_g, dv0, dv_c, dv0, nk), 1e-2);
        free(dq_g);
        free(dk_g);
        free(dv_g);
    }
    gpu->free(gpu, gq);
    gpu->free(gpu, gk);
    gpu->free(gpu, gv);
    gpu->free(gpu, gdo);
    gpu->free(gpu, go);
    gpu->free(gpu, gdq);
    gpu->free(gpu, gdk);
    gpu->free(gpu, gdv);
    gpu->free(gpu, gl);
    gpu->free(gpu, (void *)rg_g.a0);
    gpu->free(gpu, (void *)rg_g.a1);
    gpu->free(gpu, (void *)rg_g.b0);
    gpu->free(gpu, (void *)rg_g.b1);
    free(q);
    free(k);
    free(v);
    free(dout);
    free(dk0);
    free(dv0);
    free(o_c);
    free(l_c);
    free(dq_c);
    free(dk_c);
    free(dv_c);
    free(o_g);
    free(l_g);
}

static void attention_suite(void) {
    /* causal: one sequence, T not a multiple of 16 or 32 */
    int P1[] = {203}, N1[] = {0};
    const int *R1[] = {NULL};
    ranges r = make_ranges(1, P1, N1, R1);
    t_attention("causal", r, r.T, 4, 4, 64, 1);
    t_attention("causal", r, r.T, 4, 2, 128, 1); /* several query tiles a dkdv block, GQA */
    t_attention("causal", r, r.T, 4, 1, 256, 1); /* Qwen3.5's gated-attention head dim (mma.sync) */
    free_ranges(r);
    if (small_run) {
        int P[] = {21}, N[] = {2}, Ra[] = {9, 1};
        const int *R[] = {Ra};
        r = make_ranges(1, P, N, R);
        t_attention("shared-prefix", r, r.T, 4, 2, 128, 1);
        t_attention("shared-prefix", r, r.T, 4, 2, 16, 1);
        t_attention("shared-prefix", r, r.T, 4, 2, 256, 1);
        free_ranges(r);
        int Pb[] = {70, 3}, Nb[] = {2, 1}, Rb1[] = {65, 1}, Rb2[] = {2};
        const int *Rb[] = {Rb1, Rb2};
        r = make_ranges(2, Pb, Nb, Rb);
        t_attention("2 groups", r, r.T, 2, 1, 64, 1);
        free_ranges(r);
        return;
    }
    /* two-range: several groups, ragged responses (R = 1), GQA, both head dims */
    int P2[] = {37, 5, 70}, N2[] = {3, 2, 4}, Ra[] = {20, 1, 45}, Rb[] = {33, 7}, Rc[] = {12, 64, 3, 29};
    const int *R2[] = {Ra, Rb, Rc};
    r = make_ranges(3, P2, N2, R2);
    t_attention("3 groups", r, r.T, 8, 2, 128, 1);
    t_attention("3 groups", r, r.T, 6, 3, 64, 1);
    t_attention("3 groups", r, r.T, 8, 2, 256, 1);
    t_attention("3 groups", r, r.T, 4, 4, 256, 1);
    free_ranges(r);
    /* a long prompt shared by 16 responses: the dK/dV sum over many queries */
    int P3[] = {300}, N3[] = {16}, Rd[16];
    for (int i = 0; i < 16; i++) Rd[i] = 5 + 7 * i;
    const int *R3[] = {Rd};
    r = make_ranges(1, P3, N3, R3);
    t_attention("P=300 N=16", r, r.T, 16, 8, 128, 1);
    t_attention("P=300 N=16", r, r.T, 16, 4, 256, 1); /* Qwen3.5-9B's heads: 16 / 4 */
    free_ranges(r);
    /* decode-style forward: 5 queries over a KV cache of 200 rows */
    ranges d = {5, malloc(20), malloc(20), malloc(20), malloc(20)};
    for (int i = 0; i < 5; i++) {
        d.a0[i] = 0;
        d.a1[i] = 120;
        d.b0[i] = 120 + 15 * i;
        d.b1[i] = 120 + 15 * i + 3 + i;
    }
    t_attention("kv cache S=200", d, 200, 8, 2, 128, 0);
    t_attention("kv cache S=200", d, 200, 8, 2, 32, 0);
    t_attention("kv cache S=200", d, 200, 16, 4, 256, 0);
    free_ranges(d);
    /* a response micro-batch of the split schedule (engine/model/split.c): queries are responses at
     * cache rows P.., attending to a cached prompt [0, P) and causally to themselves; the backward
     * covers all S = P + T key rows (the prompt's dK/dV collected, S > T) */
    {
        int Pk = 300, Rk[3] = {70, 1, 129}, Tk = 200;
        ranges k = {Tk, malloc(Tk * 4), malloc(Tk * 4), malloc(Tk * 4), malloc(Tk * 4)};
        for (int i = 0, s0 = 0; i < 3; s0 += Rk[i], i++)
            for (int j = 0; j < Rk[i]; j++) {
                k.a0[s0 + j] = 0;
                k.a1[s0 + j] = Pk;
                k.b0[s0 + j] = Pk + s0;
                k.b1[s0 + j] = Pk + s0 + j + 1;
            }
        t_attention("split S=P+T", k, Pk + Tk, 8, 2, 128, 1);
        t_attention("split S=P+T", k, Pk + Tk, 8, 2, 64, 1);
        t_attention("split S=P+T", k, Pk + Tk, 4, 2, 32, 1);
        t_attention("split S=P+T", k, Pk + Tk, 8, 2, 256, 1);
        free_ranges(k);
    }
    /* tensor-core path, odd shapes: N = 1 with R = 1 and a prompt not a multiple of 64 */
    int P4[] = {130}, N4[] = {1}, Re[] = {1};
    const int *R4[] = {Re};
    r = make_ranges(1, P4, N4, R4);
    t_attention("P=130 N=1 R=1", r, r.T, 4, 1, 128, 1);
    t_attention("P=130 N=1 R=1", r, r.T, 4, 2, 256, 1);
    free_ranges(r);
    /* many groups with different P (smaller than, equal to, just over a 64-row tile) */
    int P5[] = {64, 1, 129, 200, 63, 17}, N5[] = {2, 1, 3, 1, 2, 4};
    int R5a[] = {64, 65}, R5b[] = {1}, R5c[] = {3, 128, 40}, R5d[] = {77}, R5e[] = {1, 1}, R5f[] = {9, 70, 2, 31};
    const int *R5[] = {R5a, R5b, R5c, R5d, R5e, R5f};
    r = make_ranges(6, P5, N5, R5);
    determ = 1;
    t_attention("6 groups", r, r.T, 8, 2, 64, 1);
    t_attention("6 groups", r, r.T, 4, 4, 128, 1);
    t_attention("6 groups", r, r.T, 6, 2, 256, 1);
    determ = 0;
    /* the simple path: small head dims (fixture models), and forced at D = 128 */
    t_attention("6 groups", r, r.T, 4, 2, 16, 1);
    t_attention("6 groups", r, r.T, 4, 2, 32, 1);
    t_attention("6 groups", r, r.T, 2, 1, 48, 1);
    gpu->tune.attn = TUNE_ATTN_SIMT;
    t_attention("6 groups, simple path", r, r.T, 4, 4, 128, 1);
    t_attention("6 groups, simple path", r, r.T, 6, 2, 256, 1);
    gpu->tune.attn = TUNE_ATTN_AUTO;
    free_ranges(r);
    /* a longer prompt: whole tiles inside every query's range (the unmasked path) */
    int P6[] = {1000}, N6[] = {4}, R6a[] = {77, 200, 64, 128};
    const int *R6[] = {R6a};
    r = make_ranges(1, P6, N6, R6);
    t_attention("P=1000 N=4", r, r.T, 4, 2, 128, 1);
    t_attention("P=1000 N=4", r, r.T, 4, 1, 64, 1);
    t_attention("P=1000 N=4", r, r.T, 16, 4, 256, 1);
    free_ranges(r);
    /* random, overlapping ranges: a key inside both counts twice, as in the reference */
    int T7 = 301;
    ranges x = {T7, malloc(T7 * 4), malloc(T7 * 4), malloc(T7 * 4), malloc(T7 * 4)};
    unsigned long long sd = 99;
    for (int t = 0; t < T7; t++) {
        int u = (int)((check_randf(&sd, 0.5f) + 0.5f) * T7), w = (int)((check_randf(&sd, 0.5f) + 0.5f) * T7);
        x.a0[t] = u < w ? u : w;
        x.a1[t] = (u < w ? w : u) + 1;
        if (x.a1[t] > T7) x.a1[t] = T7;
        u = (int)((check_randf(&sd, 0.5f) + 0.5f) * T7);
        w = (int)((check_randf(&sd, 0.5f) + 0.5f) * T7);
        x.b0[t] = u < w ? u : w;
        x.b1[t] = t % 3 ? (u < w ? w : u) : x.b0[t]; /* every third: b empty */
    }
    t_attention("random overlapping ranges", x, T7, 4, 2, 64, 1);
    t_attention("random overlapping ranges", x, T7, 4, 2, 128, 1);
    t_attention("random overlapping ranges", x, T7, 4, 2, 256, 1);
    t_attention("random overlapping ranges", x, T7, 8, 1, 256, 1);
    free_ranges(x);
}

/* Decode-step ranges over a KV cache: G groups (prompt P[g], N[g] responses), one query per
 * response; a response sees its group's prompt rows and its own rows, own length random in
 * [0, max_own] (0: the prompt only). Cache rows: the prompts, then max_own rows per response. */
static ranges decode_ranges(int G, const int *P, const int *N, int max_own, unsigned long long seed, int *S) {
    int T = 0, p_tot = 0;
    for (int g = 0; g < G; g++) {
        T += N[g];
        p_tot += P[g];
    }
    ranges r = {T, malloc((size_t)T * 4), malloc((size_t)T * 4), malloc((size_t)T * 4), malloc((size_t)T * 4)};
    int t = 0, p0 = 0, base = p_tot;
    for (int g = 0; g < G; g++) {
        for (int i = 0; i < N[g]; i++, t++, base += max_own) {
            int own = (int)((check_randf(&seed, 0.5f) + 0.5f) * (max_own + 1));
            if (own > max_own) own = max_own;
            if (i == 0) own = 0;
            r.a0[t] = p0;
            r.a1[t] = p0 + P[g];
            r.b0[t] = base;
            r.b1[t] = base + own;
        }
        p0 += P[g];
    }
    *S = base;
    return r;
}

/* The decode attention kernels (attention_decode.cu): small T, groups sharing a prompt. */
static void decode_attention_suite(void) {
    int S;
    int P1[] = {1024}, N1[] = {16};
    ranges r = decode_ranges(1, P1, N1, 300, 71, &S);
    t_attention("decode P=1024 N=16", r, S, 16, 8, 128, 0);
    t_attention("decode P=1024 N=16", r, S, 32, 8, 128, 0);
    t_attention("decode P=1024 N=16", r, S, 16, 8, 64, 0);
    t_attention("decode P=1024 N=16", r, S, 16, 4, 256, 0); /* Qwen3.5-9B's gated layers */
    free_ranges(r);
    if (small_run) return;
    int P2[] = {100, 37, 513, 1, 260}, N2[] = {16, 1, 5, 3, 16};
    r = decode_ranges(5, P2, N2, 300, 72, &S);
    t_attention("decode 5 groups", r, S, 16, 8, 128, 0);
    t_attention("decode 5 groups", r, S, 32, 8, 128, 0);
    t_attention("decode 5 groups", r, S, 32, 8, 64, 0);
    t_attention("decode 5 groups", r, S, 8, 8, 64, 0);
    t_attention("decode 5 groups", r, S, 64, 8, 128, 0);
    t_attention("decode 5 groups", r, S, 8, 8, 256, 0);
    t_attention("decode 5 groups", r, S, 16, 8, 256, 0);
    t_attention("decode 5 groups", r, S, 32, 4, 256, 0);
    t_attention("decode 5 groups", r, S, 64, 8, 256, 0);
    free_ranges(r);
    int P3[] = {700, 90, 33}, N3[] = {1, 1, 1};
    r = decode_ranges(3, P3, N3, 40, 73, &S);
    t_attention("decode N=1", r, S, 16, 8, 128, 0);
    free_ranges(r);
    int P4[16], N4[16];
    for (int g = 0; g < 16; g++) {
        P4[g] = 50 + 61 * g;
        N4[g] = 16;
    }
    r = decode_ranges(16, P4, N4, 256, 74, &S);
    t_attention("decode 16 groups T=256", r, S, 16, 8, 128, 0);
    free_ranges(r);
}

/* ---------------------------------------------------------------- exact attention */

/* Values of a and b (n each) whose bits differ. */
static size_t values_differ(const float *a, const float *b, size_t n) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(a + i, b + i, 4) != 0;
    return d;
}

/* The decode rows of a packed P+NR micro-batch's responses, as rollout lays them: each group's
 * prompt and each response in its own range of KV-pool rows (placed in another order than the
 * pack, with random rows between), one query a response at step js[i] (its token js[i] attends to
 * the prompt and to tokens 0..js[i]). The training forward on the pack vs the decode forward on
 * the pool, for those rows: out and lse bit for bit in exact mode, with every response's query
 * decoded together and with each query alone; with exact = 0 the count that differ is printed
 * (the test can fail). */
static void t_exact_attention(const char *name, int G, const int *P, const int *N, const int *const *R, int H, int K, int D) {
    char sh[96];
    ranges tr = make_ranges(G, P, N, R);
    int T = tr.T, nr = 0;
    for (int g = 0; g < G; g++) nr += N[g];
    snprintf(sh, sizeof sh, "%s T=%d rows=%d H=%d K=%d D=%d", name, T, nr, H, K, D);
    /* pool: a gap of 7 random rows, then the groups from last to first, each group's responses
     * in reverse order before its prompt, 3 random rows between ranges */
    int S = 7 + T + 3 * (G + nr), *src = malloc((size_t)S * 4), *pos = malloc((size_t)T * 4);
    for (int j = 0; j < S; j++) src[j] = -1;
    int row = 7;
    {
        int t_end = T;
        for (int g = G - 1; g >= 0; g--) {
            int len = P[g];
            for (int i = 0; i < N[g]; i++) len += R[g][i];
            int t_beg = t_end - len, t = t_end;
            for (int i = N[g] - 1; i >= 0; i--) {
                t -= R[g][i];
                for (int j = 0; j < R[g][i]; j++) pos[t + j] = row + j;
                row += R[g][i] + 3;
            }
            for (int j = 0; j < P[g]; j++) pos[t_beg + j] = row + j;
            row += P[g] + 3;
            t_end = t_beg;
        }
    }
    for (int t = 0; t < T; t++) src[pos[t]] = t;
    /* decode queries: response i of group g at step js, the training row tq[i] */
    ranges dr = {nr, malloc((size_t)nr * 4), malloc((size_t)nr * 4), malloc((size_t)nr * 4), malloc((size_t)nr * 4)};
    int *tq = malloc((size_t)nr * 4), x = 0, t = 0;
    unsigned long long seed = 0x9E3779B97F4A7C15ull * (unsigned)(T + D);
    for (int g = 0; g < G; g++) {
        int p0 = t;
        t += P[g];
        for (int i = 0; i < N[g]; i++, x++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            int js = (int)((seed >> 33) % (unsigned)R[g][i]);
            tq[x] = t + js;
            dr.a0[x] = pos[p0];
            dr.a1[x] = pos[p0] + P[g];
            dr.b0[x] = pos[t];
            dr.b1[x] = pos[t] + js + 1;
            t += R[g][i];
        }
    }
    size_t nq = (size_t)T * H * D, nk = (size_t)S * K * D, rw = (size_t)H * D;
    float *q = gc_rand(nq, 2.0f, 91), *k = gc_rand((size_t)T * K * D, 2.0f, 92), *v = gc_rand((size_t)T * K * D, 1.0f, 93);
    float *pk = gc_rand(nk, 2.0f, 94), *pv = gc_rand(nk, 1.0f, 95), *dq = malloc((size_t)nr * rw * 4);
    for (int j = 0; j < S; j++)
        if (src[j] >= 0) {
            memcpy(pk + (size_t)j * K * D, k + (size_t)src[j] * K * D, (size_t)K * D * 4);
            memcpy(pv + (size_t)j * K * D, v + (size_t)src[j] * K * D, (size_t)K * D * 4);
        }
    for (int i = 0; i < nr; i++) memcpy(dq + i * rw, q + (size_t)tq[i] * rw, rw * 4);
    void *gq = gc_act(gpu, q, nq), *gk = gc_act(gpu, k, (size_t)T * K * D), *gv = gc_act(gpu, v, (size_t)T * K * D);
    void *gpk = gc_act(gpu, pk, nk), *gpv = gc_act(gpu, pv, nk), *gdq = gc_act(gpu, dq, (size_t)nr * rw);
    void *go = gpu->alloc(gpu, nq * 2), *gdo = gpu->alloc(gpu, (size_t)nr * rw * 2);
    float *gl = gpu->alloc(gpu, (size_t)T * H * 4), *gdl = gpu->alloc(gpu, (size_t)nr * H * 4);
    attn_ranges tg = gc_dev_ranges(gpu, tr), dg = gc_dev_ranges(gpu, dr);
    float *to = malloc((size_t)nr * rw * 4), *tl = malloc((size_t)nr * H * 4);
    int saved = gpu->tune.exact;
    for (int exact = 1; exact >= 0; exact--) {
        gpu->tune.exact = exact;
        gpu->attention_fwd(gpu, go, gl, gq, gk, gv, tg, T, H, K, D);
        float *o = gc_get_act(gpu, go, nq), *l = gc_get_f32(gpu, gl, (size_t)T * H);
        for (int i = 0; i < nr; i++) {
            memcpy(to + i * rw, o + (size_t)tq[i] * rw, rw * 4);
            memcpy(tl + (size_t)i * H, l + (size_t)tq[i] * H, (size_t)H * 4);
        }
        free(o);
        free(l);
        gpu->attention_fwd(gpu, gdo, gdl, gdq, gpk, gpv, dg, nr, H, K, D);
        float *o2 = gc_get_act(gpu, gdo, (size_t)nr * rw), *l2 = gc_get_f32(gpu, gdl, (size_t)nr * H);
        size_t d_o = values_differ(o2, to, (size_t)nr * rw), d_l = values_differ(l2, tl, (size_t)nr * H);
        free(o2);
        free(l2);
        if (!exact) {
            printf("exact=0: %zu of %zu out values and %zu of %zu lse differ (%s)\n", d_o, (size_t)nr * rw, d_l, (size_t)nr * H,
                   sh);
            gc_row("exact=0 decode vs train diffs (shows the test can fail; no limit)", sh, (double)(d_o + d_l), 1e30);
            break;
        }
        gc_row("exact attention decode batch == train (out diffs)", sh, (double)d_o, 0);
        gc_row("exact attention decode batch == train (lse diffs)", sh, (double)d_l, 0);
        /* each query alone, and the last query beside the first */
        size_t alone = 0;
        for (int i = 0; i < nr; i++) {
            attn_ranges one = {dg.a0 + i, dg.a1 + i, dg.b0 + i, dg.b1 + i, NULL, NULL, 0};
            gpu->attention_fwd(gpu, gdo, gdl, (char *)gdq + i * rw * 2, gpk, gpv, one, 1, H, K, D);
            float *o1 = gc_get_act(gpu, gdo, rw), *l1 = gc_get_f32(gpu, gdl, (size_t)H);
            alone += values_differ(o1, to + i * rw, rw) + values_differ(l1, tl + (size_t)i * H, (size_t)H);
            free(o1);
            free(l1);
        }
        gc_row("exact attention decode alone == train (diffs)", sh, (double)alone, 0);
    }
    gpu->tune.exact = saved;
    void *fr[] = {gq, gk, gv, gpk, gpv, gdq, go, gdo, gl, gdl};
    const int *rr[] = {tg.a0, tg.a1, tg.b0, tg.b1, dg.a0, dg.a1, dg.b0, dg.b1};
    for (size_t i = 0; i < sizeof rr / sizeof rr[0]; i++) gpu->free(gpu, (void *)rr[i]);
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) gpu->free(gpu, fr[i]);
    free(q);
    free(k);
    free(v);
    free(pk);
    free(pv);
    free(dq);
    free(to);
    free(tl);
    free(tq);
    free(src);
    free(pos);
    free_ranges(tr);
    free_ranges(dr);
}

/* Exact mode (tune.exact, attention_exact.cu): decode rows == training rows bit for bit, and the
 * exact forward (with the unchanged backward on its lse) against the CPU reference. */
static void exact_attention_suite(void) {
    int P1[] = {300, 37, 129}, N1[] = {4, 3, 5};
    int R1a[] = {20, 1, 45, 77}, R1b[] = {33, 7, 2}, R1c[] = {12, 64, 3, 29, 100};
    const int *R1[] = {R1a, R1b, R1c};
    t_exact_attention("3 groups", 3, P1, N1, R1, 16, 8, 128);
    t_exact_attention("3 groups", 3, P1, N1, R1, 32, 8, 128);
    t_exact_attention("3 groups", 3, P1, N1, R1, 16, 8, 64);
    t_exact_attention("3 groups MHA", 3, P1, N1, R1, 4, 4, 128);
    t_exact_attention("3 groups", 3, P1, N1, R1, 4, 2, 16); /* the head dims past 64 and 128 */
    t_exact_attention("3 groups", 3, P1, N1, R1, 8, 2, 32);
    t_exact_attention("3 groups", 3, P1, N1, R1, 8, 2, 256);
    int P2[] = {1024}, N2[] = {16}, R2a[16];
    for (int i = 0; i < 16; i++) R2a[i] = 30 + 37 * i;
    const int *R2[] = {R2a};
    t_exact_attention("P=1024 N=16", 1, P2, N2, R2, 16, 8, 128);
    /* 40 decode rows x 8 kv heads: past twice the SMs, 16 / HPG queries a block (alone: one) */
    int P4[] = {300}, N4[] = {40}, R4a[40];
    for (int i = 0; i < 40; i++) R4a[i] = 20 + 7 * i;
    const int *R4[] = {R4a};
    t_exact_attention("P=300 N=40", 1, P4, N4, R4, 16, 8, 128);
    /* 48 decode rows of three groups: blocks of 16 / HPG queries straddle the groups (two
     * prompts' segments in one block) */
    int P5[] = {300, 37, 129}, N5[] = {20, 13, 15}, R5a[20];
    for (int i = 0; i < 20; i++) R5a[i] = 3 + 11 * i;
    const int *R5[] = {R5a, R5a + 4, R5a + 2};
    t_exact_attention("3 groups, 48 rows", 3, P5, N5, R5, 16, 8, 128);
    t_exact_attention("3 groups, 48 rows", 3, P5, N5, R5, 32, 8, 128);
    t_exact_attention("3 groups, 48 rows", 3, P5, N5, R5, 64, 8, 64);
    int saved = gpu->tune.exact;
    gpu->tune.exact = 1;
    ranges r = make_ranges(3, P1, N1, R1);
    t_attention("exact: 3 groups", r, r.T, 16, 8, 128, 1);
    t_attention("exact: 3 groups", r, r.T, 8, 2, 64, 1);
    t_attention("exact: 3 groups", r, r.T, 4, 2, 16, 1);
    t_attention("exact: 3 groups", r, r.T, 8, 2, 256, 1);
    free_ranges(r);
    int S;
    int P3[] = {100, 37, 513}, N3[] = {16, 1, 5};
    r = decode_ranges(3, P3, N3, 300, 75, &S);
    t_attention("exact: decode 3 groups", r, S, 16, 8, 128, 0);
    t_attention("exact: decode 3 groups", r, S, 4, 2, 16, 0);
    t_attention("exact: decode 3 groups", r, S, 8, 2, 256, 0);
    free_ranges(r);
    gpu->tune.exact = saved;
}

/* ---------------------------------------------------------------- logprob head */

/* logprob_top: the K best logprobs against the CPU's (values sorted, so a near-tie that bf16
 * reorders still compares), and on the GPU each listed token's logprob bit-equal to
 * logprob_fwd's for it as the target (what /v1/logprobs of that token reports). */
static void t_logprob_top(int T, int M, int C, int V, float temp, int K) {
    char sh[96];
    snprintf(sh, sizeof sh, "T=%d M=%d C=%d V=%d t=%.1f K=%d", T, M, C, V, temp, K);
    float *h = gc_rand((size_t)T * C, 1.0f, 81), *w = gc_rand((size_t)V * C, 0.3f, 82);
    int *pos = malloc((size_t)M * 4), *ids_c = malloc((size_t)M * K * 4);
    float *lps_c = malloc((size_t)M * K * 4);
    for (int m = 0; m < M; m++) pos[m] = (m * 5 + 1) % T;
    cpu->logprob_top(cpu, ids_c, lps_c, h, pos, w, M, C, V, temp, K);
    void *gh = gc_act(gpu, h, (size_t)T * C), *gw = gc_act(gpu, w, (size_t)V * C);
    int *gpos = gc_dev(gpu, pos, (size_t)M * 4), *gids = gpu->alloc(gpu, (size_t)M * K * 4);
    float *glps = gpu->alloc(gpu, (size_t)M * K * 4), *glp = gpu->alloc(gpu, (size_t)M * 4);
    gpu->logprob_top(gpu, gids, glps, gh, gpos, gw, M, C, V, temp, K);
    float *lps_g = gc_get_f32(gpu, glps, (size_t)M * K);
    int *ids_g = malloc((size_t)M * K * 4), *tok = malloc((size_t)M * 4);
    if (gpu->to_host(gpu, ids_g, gids, (size_t)M * K * 4)) gc_die(gpu, "ids");
    gc_row("logprob_top lps", sh, rel_l2(lps_g, lps_c, (size_t)M * K), 1e-4);
    long long ndiff = 0;
    for (int k = 0; k < K; k++) {
        for (int m = 0; m < M; m++) tok[m] = ids_g[(size_t)m * K + k];
        int *gtok = gc_dev(gpu, tok, (size_t)M * 4);
        gpu->logprob_fwd(gpu, glp, NULL, gh, gpos, gtok, gw, M, C, V, temp);
        float *lp = gc_get_f32(gpu, glp, (size_t)M);
        for (int m = 0; m < M; m++) ndiff += memcmp(&lp[m], &lps_g[(size_t)m * K + k], 4) != 0;
        free(lp);
        gpu->free(gpu, gtok);
    }
    gc_row("logprob_top vs logprob_fwd (elems differ)", sh, (double)ndiff, 0);
    gpu->free(gpu, gh);
    gpu->free(gpu, gw);
    gpu->free(gpu, gpos);
    gpu->free(gpu, gids);
    gpu->free(gpu, glps);
    gpu->free(gpu, glp);
    free(h);
    free(w);
    free(pos);
    free(ids_c);
    free(lps_c);
    free(lps_g);
    free(ids_g);
    free(tok);
}

static void t_logprob(int T, int M, int C, int V, float temp, int with_ent) {
    char sh[96];
    snprintf(sh, sizeof sh, "T=%d M=%d C=%d V=%d t=%.1f%s", T, M, C, V, temp, with_ent ? " +ent" : "");
    float *h = gc_rand((size_t)T * C, 1.0f, 71), *w = gc_rand((size_t)V * C, 0.3f, 72);
    int *pos = malloc((size_t)M * 4), *tok = rand_ints(M, 0, V, 73);
    /* distinct while M <= T (5 and T coprime); with M > T positions repeat, as a group's last
     * prompt position predicts the first token of each response */
    for (int m = 0; m < M; m++) pos[m] = (m * 5 + 1) % T;
    float *dlp = gc_rand((size_t)M, 1.0f, 74), *dent = gc_rand((size_t)M, 0.5f, 75);
    float *dh0 = gc_rand((size_t)T * C, 0.05f, 76), *dw0 = gc_rand((size_t)V * C, 0.5f, 77);
    float *lp_c = malloc((size_t)M * 4), *en_c = malloc((size_t)M * 4), *dh_c = gc_copy(dh0, (size_t)T * C);
    float *dw_c = gc_copy(dw0, (size_t)V * C);
    int R = 3;
    float *lg_c = malloc((size_t)R * V * 4);
    cpu->logprob_fwd(cpu, lp_c, with_ent ? en_c : NULL, h, pos, tok, w, M, C, V, temp);
    cpu->logprob_bwd(cpu, dh_c, dw_c, dlp, with_ent ? dent : NULL, h, pos, tok, w, M, C, V, temp);
    cpu->lm_head_rows(cpu, lg_c, h, pos, w, R, C, V);
    void *gh = gc_act(gpu, h, (size_t)T * C), *gw = gc_act(gpu, w, (size_t)V * C), *gdh = gc_act(gpu, dh0, (size_t)T * C);
    int *gpos = gc_dev(gpu, pos, (size_t)M * 4), *gtok = gc_dev(gpu, tok, (size_t)M * 4);
    float *gdlp = gc_dev(gpu, dlp, (size_t)M * 4), *gdent = gc_dev(gpu, dent, (size_t)M * 4);
    float *glp = gpu->alloc(gpu, (size_t)M * 4), *gen = gpu->alloc(gpu, (size_t)M * 4), *gdw = gc_dev(gpu, dw0, (size_t)V * C * 4);
    float *glg = gpu->alloc(gpu, (size_t)R * V * 4);
    gpu->logprob_fwd(gpu, glp, with_ent ? gen : NULL, gh, gpos, gtok, gw, M, C, V, temp);
    gpu->logprob_bwd(gpu, gdh, gdw, gdlp, with_ent ? gdent : NULL, gh, gpos, gtok, gw, M, C, V, temp);
    gpu->lm_head_rows(gpu, glg, gh, gpos, gw, R, C, V);
    float *lp_g = gc_get_f32(gpu, glp, (size_t)M), *en_g = gc_get_f32(gpu, gen, (size_t)M);
    float *dh_g = gc_get_act(gpu, gdh, (size_t)T * C), *dw_g = gc_get_f32(gpu, gdw, (size_t)V * C);
    /* the backward again from the same dh0 / dw0: the same bits (replay after a crash needs it) */
    if (gpu->act_from_f32(gpu, gdh, dh0, (size_t)T * C) || gpu->to_dev(gpu, gdw, dw0, (size_t)V * C * 4)) gc_die(gpu, "reset");
    gpu->logprob_bwd(gpu, gdh, gdw, gdlp, with_ent ? gdent : NULL, gh, gpos, gtok, gw, M, C, V, temp);
    float *dh_2 = gc_get_act(gpu, gdh, (size_t)T * C), *dw_2 = gc_get_f32(gpu, gdw, (size_t)V * C);
    long long ndiff = 0;
    for (size_t i = 0; i < (size_t)T * C; i++) ndiff += memcmp(&dh_g[i], &dh_2[i], 4) != 0;
    for (size_t i = 0; i < (size_t)V * C; i++) ndiff += memcmp(&dw_g[i], &dw_2[i], 4) != 0;
    gc_row("logprob_bwd twice (elems differ)", sh, (double)ndiff, 0);
    free(dh_2);
    free(dw_2);
    float *lg_g = gc_get_f32(gpu, glg, (size_t)R * V);
    gc_row("logprob_fwd logp", sh, rel_l2(lp_g, lp_c, (size_t)M), 1e-4);
    if (with_ent) gc_row("logprob_fwd entropy", sh, rel_l2(en_g, en_c, (size_t)M), 1e-4);
    gc_row("logprob_bwd dh", sh, gc_rel_delta(dh_g, dh0, dh_c, dh0, (size_t)T * C), 1e-2);
    gc_row("logprob_bwd dw", sh, gc_rel_delta(dw_g, dw0, dw_c, dw0, (size_t)V * C), 1e-2);
    gc_row("lm_head_rows", sh, rel_l2(lg_g, lg_c, (size_t)R * V), 1e-4);
    gpu->free(gpu, gh);
    gpu->free(gpu, gw);
    gpu->free(gpu, gdh);
    gpu->free(gpu, gpos);
    gpu->free(gpu, gtok);
    gpu->free(gpu, gdlp);
    gpu->free(gpu, gdent);
    gpu->free(gpu, glp);
    gpu->free(gpu, gen);
    gpu->free(gpu, gdw);
    gpu->free(gpu, glg);
    free(h);
    free(w);
    free(pos);
    free(tok);
    free(dlp);
    free(dent);
    free(dh0);
    free(dw0);
    free(lp_c);
    free(en_c);
    free(dh_c);
    free(dw_c);
    free(lg_c);
    free(lp_g);
    free(en_g);
    free(dh_g);
    free(dw_g);
    free(lg_g);
}

/* ---------------------------------------------------------------- optimizer */

static void t_adamw(long long n, int steps) {
    char sh[64];
    snprintf(sh, sizeof sh, "n=%lld steps=%d", n, steps);
    float *p_c = gc_rand((size_t)n, 1.0f, 81), *m_c = calloc((size_t)n, 4), *v_c = calloc((size_t)n, 4);
    float *gp = gc_dev(gpu, p_c, (size_t)n * 4), *gm = gpu->alloc(gpu, (size_t)n * 4), *gv = gpu->alloc(gpu, (size_t)n * 4);
    float *gg = gpu->alloc(gpu, (size_t)n * 4);
    void *gact = gpu->alloc(gpu, (size_t)n * 2);
    gpu->zero(gpu, gm, (size_t)n * 4);
    gpu->zero(gpu, gv, (size_t)n * 4);
    double ss_c = 0, ss_g = 0;
    for (int s = 1; s <= steps; s++) {
        float *g = gc_rand((size_t)n, 0.01f * s, 90 + s);
        if (gpu->to_dev(gpu, gg, g, (size_t)n * 4)) gc_die(gpu, "upload grad");
        ss_c = cpu->sumsq(cpu, g, n);
        ss_g = gpu->sumsq(gpu, gg, n);
        cpu->scale(cpu, g, n, 0.5f);
        gpu->scale(gpu, gg, n, 0.5f);
        cpu->adamw(cpu, p_c, NULL, g, m_c, v_c, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, s);
        gpu->adamw(gpu, gp, gact, gg, gm, gv, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, s);
        free(g);
    }
    float *p_g = gc_get_f32(gpu, gp, (size_t)n), *m_g = gc_get_f32(gpu, gm, (size_t)n), *v_g = gc_get_f32(gpu, gv, (size_t)n);
    /* the bf16 copy must be exactly the rounding of the GPU's own master */
    float *a_g = gc_get_act(gpu, gact, (size_t)n), *p_bf = gc_copy(p_g, (size_t)n);
    for (long long i = 0; i < n; i++) p_bf[i] = gc_bf16(p_bf[i]);
    gc_row("adamw master", sh, rel_l2(p_g, p_c, (size_t)n), 1e-6);
    gc_row("adamw m", sh, rel_l2(m_g, m_c, (size_t)n), 1e-6);
    gc_row("adamw v", sh, rel_l2(v_g, v_c, (size_t)n), 1e-6);
    gc_row("adamw bf16 copy = bf16(master)", sh, rel_l2(a_g, p_bf, (size_t)n), 0);
    gc_row("sumsq", sh, fabs(ss_g - ss_c) / ss_c, 1e-6);
    gpu->free(gpu, gp);
    gpu->free(gpu, gm);
    gpu->free(gpu, gv);
    gpu->free(gpu, gg);
    gpu->free(gpu, gact);
    free(p_c);
    free(m_c);
    free(v_c);
    free(p_g);
    free(m_g);
    free(v_g);
    free(a_g);
    free(p_bf);
}

/* ---------------------------------------------------------------- mixture of experts */

/* The four moe ops (kernels/moe.h) against the CPU backend. The router runs on both; the other
 * three take the CPU's routes (topi, topw; dtopw and probs for the router's backward) so that a
 * near-tie the two GEMMs break differently cannot move a slot to another expert. Counts are
 * 1..16 (prompt tokens standing for N responses) or NULL. "+=" outputs start random.
 * Tolerances: probs, topw, stats and d logit are fp32 math on the same bf16 inputs (1e-4: the
 * GEMM's sum order); topi must agree except where the CPU's two probabilities differ by less
 * than 1e-5 (a tie within the sum-order noise); everything through bf16 activations (eg, eu,
 * ey, out, dx, dg, du, dtopw, the weight gradients) 1e-2 as the dense ops. dx is "+=" into
 * bf16: the GPU's starting dx is drawn at the scale of the CPU's increment, because rounding the
 * sum to bf16 costs 2^-9 of the sum, which swamps a small increment (a router's dx of rms 2e-3
 * on a start of 0.3 measured 0.25 "error" that was that rounding alone). Then the GPU's own
 * properties: the experts' backward run twice gives the same bits (no atomics), and experts no
 * slot chose keep their gradients bit for bit (only routed experts are touched). */
/* rms of the increment a - a0 */
static double rms_delta(const float *a, const float *a0, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += ((double)a[i] - a0[i]) * ((double)a[i] - a0[i]);
    return sqrt(s / (double)(n ? n : 1));
}
static void t_moe(int T, int C, int E, int k, int Fm, int norm, int counts) {
    char sh0[96], sh[128];
    snprintf(sh0, sizeof sh0, "T=%d C=%d E=%d k=%d Fm=%d%s%s", T, C, E, k, Fm, norm ? " norm" : "", counts ? " counts" : "");
    size_t nx = (size_t)T * C, nk = (size_t)T * k, nw = (size_t)E * Fm * C, ns = MOE_STATS(E), ne = (size_t)T * E;
    unsigned long long sd = 700 + (unsigned long long)T * 31 + E;
    float *x = gc_rand(nx, 2.0f, sd), *wr = gc_rand((size_t)E * C, 0.2f, sd + 1), *res = gc_rand(nx, 1.0f, sd + 2);
    float *wg = gc_rand(nw, 0.1f, sd + 3), *wu = gc_rand(nw, 0.1f, sd + 4), *wd = gc_rand(nw, 0.1f, sd + 5);
    float *dout = gc_rand(nx, 1.0f, sd + 6), *dx0 = gc_rand(nx, 0.5f, sd + 7), *st0 = gc_rand(ns, 4.0f, sd + 8);
    float *dwg0 = gc_rand(nw, 1.0f, sd + 9), *dwu0 = gc_rand(nw, 1.0f, sd + 10), *dwd0 = gc_rand(nw, 1.0f, sd + 11);
    float *dwr0 = gc_rand((size_t)E * C, 1.0f, sd + 12), *aux = gc_rand((size_t)E, 0.05f, sd + 13);
    int *cnt = counts ? rand_ints(T, 1, 17, sd + 14) : NULL;
    for (size_t i = 0; i < ns; i++) st0[i] = fabsf(st0[i]);
    /* CPU */
    float *p_c = malloc(ne * 4), *tw_c = malloc(nk * 4), *st_c = gc_copy(st0, ns);
    int *ti_c = malloc(nk * 4);
    float *eg_c = malloc(nk * Fm * 4), *eu_c = malloc(nk * Fm * 4), *ey_c = malloc(nk * C * 4), *o_c = malloc(nx * 4);
    float *dx_c = gc_copy(dx0, nx), *dwg_c = gc_copy(dwg0, nw), *dwu_c = gc_copy(dwu0, nw), *dwd_c = gc_copy(dwd0, nw);
    float *dtw_c = malloc(nk * 4), *dg_c = malloc(nk * Fm * 4), *du_c = malloc(nk * Fm * 4);
    float *rdx_c = gc_copy(dx0, nx), *dwr_c = gc_copy(dwr0, (size_t)E * C), *dl_c = malloc(ne * 4);
    cpu->moe_router_fwd(cpu, p_c, ti_c, tw_c, st_c, x, wr, NULL, cnt, T, C, E, k, norm);
    cpu->moe_experts_fwd(cpu, o_c, eg_c, eu_c, ey_c, x, res, ti_c, tw_c, wg, wu, wd, T, C, E, k, Fm, NULL);
    cpu->moe_experts_bwd(cpu, dx_c, dwg_c, dwu_c, dwd_c, dtw_c, dg_c, du_c, dout, x, ti_c, tw_c, eg_c, eu_c, ey_c, wg, wu, wd, T,
                         C, E, k, Fm, NULL);
    cpu->moe_router_bwd(cpu, rdx_c, dwr_c, dl_c, dtw_c, p_c, ti_c, x, wr, aux, cnt, T, C, E, k, norm);
    float *dx0e = gc_rand(nx, (float)rms_delta(dx_c, dx0, nx), sd + 15),
          *dx0r = gc_rand(nx, (float)rms_delta(rdx_c, dx0, nx), sd + 16);
    /* GPU, once per variant of the experts' GEMMs (kernels/tune.h): the router on its own, then
     * the rest on the CPU's routes */
    static const int variants[] = {TUNE_MOE_TILES, TUNE_MOE_GROUPED, TUNE_MOE_CUBLAS, TUNE_MOE_FEW, TUNE_MOE_AUTO};
    static const char *vname[] = {"tiles", "grouped", "cublas", "few", "auto"};
    for (int vi = 0; vi < 5; vi++) {
        gpu->tune.moe = variants[vi];
        snprintf(sh, sizeof sh, "%s %s", sh0, vname[vi]);
        void *gx = gc_act(gpu, x, nx), *gwr = gc_act(gpu, wr, (size_t)E * C), *gres = gc_act(gpu, res, nx);
        void *gwg = gc_act(gpu, wg, nw), *gwu = gc_act(gpu, wu, nw), *gwd = gc_act(gpu, wd, nw), *gdout = gc_act(gpu, dout, nx);
        float *gp = gpu->alloc(gpu, ne * 4), *gtw = gpu->alloc(gpu, nk * 4), *gst = gc_dev(gpu, st0, ns * 4);
        int *gti = gpu->alloc(gpu, nk * 4), *gcnt = cnt ? gc_dev(gpu, cnt, (size_t)T * 4) : NULL;
        gpu->moe_router_fwd(gpu, gp, gti, gtw, gst, gx, gwr, NULL, gcnt, T, C, E, k, norm);
        float *p_g = gc_get_f32(gpu, gp, ne), *tw_g = gc_get_f32(gpu, gtw, nk), *st_g = gc_get_f32(gpu, gst, ns);
        int *ti_g = (int *)gc_get_f32(gpu, gti, nk);
        double topi_off = 0;
        for (size_t i = 0; i < nk; i++)
            if (ti_g[i] != ti_c[i]) {
                size_t t = i / k;
                int ok = ti_g[i] >= 0 && ti_g[i] < E && fabsf(p_c[t * E + ti_g[i]] - p_c[t * E + ti_c[i]]) < 1e-5f;
                topi_off += !ok;
            }
        gc_row("moe_router_fwd probs", sh, rel_l2(p_g, p_c, ne), 1e-4);
        gc_row("moe_router_fwd topi (beyond ties)", sh, topi_off, 0);
        gc_row("moe_router_fwd topw", sh, topi_off ? 1 : rel_l2(tw_g, tw_c, nk), 1e-4);
        gc_row("moe_router_fwd stats", sh, gc_rel_delta(st_g, st0, st_c, st0, ns), 1e-4);
        { /* routing replay: given experts (k distinct per token, not the top-k) are taken as they are */
            int *given = malloc(nk * 4), *ti_r = malloc(nk * 4);
            float *tw_r = malloc(nk * 4);
            unsigned long long rs = sd + 17;
            for (int t = 0; t < T; t++)
                for (int s = 0; s < k; s++) {
                    int e, dup;
                    do {
                        e = (int)((check_randf(&rs, 0.5f) + 0.5f) * E) % E;
                        dup = 0;
                        for (int j = 0; j < s; j++) dup |= given[t * k + j] == e;
                    } while (dup);
                    given[t * k + s] = e;
                }
            cpu->moe_router_fwd(cpu, p_c, ti_r, tw_r, NULL, x, wr, given, cnt, T, C, E, k, norm);
            int *ggv = gc_dev(gpu, given, nk * 4);
            gpu->moe_router_fwd(gpu, gp, gti, gtw, NULL, gx, gwr, ggv, gcnt, T, C, E, k, norm);
            float *twr_g = gc_get_f32(gpu, gtw, nk);
            int *tir_g = (int *)gc_get_f32(gpu, gti, nk);
            gc_row("moe_router_fwd replayed topi", sh, memcmp(tir_g, given, nk * 4) != 0 || memcmp(ti_r, given, nk * 4) != 0, 0);
            gc_row("moe_router_fwd replayed topw", sh, rel_l2(twr_g, tw_r, nk), 1e-4);
            free(given), free(ti_r), free(tw_r), free(twr_g), free(tir_g);
            gpu->free(gpu, ggv);
        }
        /* the experts on the CPU's routes */
        if (gpu->to_dev(gpu, gti, ti_c, nk * 4) || gpu->to_dev(gpu, gtw, tw_c, nk * 4)) gc_die(gpu, "routes");
        void *geg = gpu->alloc(gpu, nk * Fm * 2), *geu = gpu->alloc(gpu, nk * Fm * 2), *gey = gpu->alloc(gpu, nk * C * 2);
        void *gout = gpu->alloc(gpu, nx * 2), *gdg = gpu->alloc(gpu, nk * Fm * 2), *gdu = gpu->alloc(gpu, nk * Fm * 2);
        gpu->moe_experts_fwd(gpu, gout, geg, geu, gey, gx, gres, gti, gtw, gwg, gwu, gwd, T, C, E, k, Fm, NULL);
        gc_moe_fwd_rows(gpu, "moe_experts_fwd", sh, (void *[4]){geg, geu, gey, gout}, (const float *[4]){eg_c, eu_c, ey_c, o_c},
                        nk, Fm, C, nx);
        void *gdx = gc_act(gpu, dx0e, nx), *gdx2 = gc_act(gpu, dx0e, nx);
        float *gdwg = gc_dev(gpu, dwg0, nw * 4), *gdwu = gc_dev(gpu, dwu0, nw * 4), *gdwd = gc_dev(gpu, dwd0, nw * 4);
        float *gdwg2 = gc_dev(gpu, dwg0, nw * 4), *gdwu2 = gc_dev(gpu, dwu0, nw * 4), *gdwd2 = gc_dev(gpu, dwd0, nw * 4);
        float *gdtw = gpu->alloc(gpu, nk * 4);
        gpu->moe_experts_bwd(gpu, gdx, gdwg, gdwu, gdwd, gdtw, gdg, gdu, gdout, gx, gti, gtw, geg, geu, gey, gwg, gwu, gwd, T, C,
                             E, k, Fm, NULL);
        float *dx_g = gc_get_act(gpu, gdx, nx), *dtw_g = gc_get_f32(gpu, gdtw, nk), *dg_g = gc_get_act(gpu, gdg, nk * Fm);
        float *du_g = gc_get_act(gpu, gdu, nk * Fm), *dwg_g = gc_get_f32(gpu, gdwg, nw), *dwu_g = gc_get_f32(gpu, gdwu, nw);
        float *dwd_g = gc_get_f32(gpu, gdwd, nw);
        gc_row("moe_experts_bwd dtopw", sh, rel_l2(dtw_g, dtw_c, nk), 1e-2);
        gc_row("moe_experts_bwd dgate", sh, rel_l2(dg_g, dg_c, nk * Fm), 1e-2);
        gc_row("moe_experts_bwd dup", sh, rel_l2(du_g, du_c, nk * Fm), 1e-2);
        gc_row("moe_experts_bwd dinp", sh, gc_rel_delta(dx_g, dx0e, dx_c, dx0, nx), 1e-2);
        gc_row("moe_experts_bwd dWgate", sh, gc_rel_delta(dwg_g, dwg0, dwg_c, dwg0, nw), 1e-2);
        gc_row("moe_experts_bwd dWup", sh, gc_rel_delta(dwu_g, dwu0, dwu_c, dwu0, nw), 1e-2);
        gc_row("moe_experts_bwd dWdown", sh, gc_rel_delta(dwd_g, dwd0, dwd_c, dwd0, nw), 1e-2);
        /* again from the same state: the same bits; unrouted experts: their gradients untouched */
        gpu->moe_experts_bwd(gpu, gdx2, gdwg2, gdwu2, gdwd2, gdtw, gdg, gdu, gdout, gx, gti, gtw, geg, geu, gey, gwg, gwu, gwd, T,
                             C, E, k, Fm, NULL);
        float *dx_2 = gc_get_act(gpu, gdx2, nx), *dwg_2 = gc_get_f32(gpu, gdwg2, nw), *dwu_2 = gc_get_f32(gpu, gdwu2, nw);
        float *dwd_2 = gc_get_f32(gpu, gdwd2, nw);
        double differ = memcmp(dx_2, dx_g, nx * 4) != 0, touched = 0;
        differ += memcmp(dwg_2, dwg_g, nw * 4) != 0 || memcmp(dwu_2, dwu_g, nw * 4) != 0 || memcmp(dwd_2, dwd_g, nw * 4) != 0;
        int unrouted = 0;
        for (int e = 0; e < E; e++) {
            int used = 0;
            for (size_t i = 0; i < nk && !used; i++) used = ti_c[i] == e;
            if (used) continue;
            unrouted++;
            size_t o = (size_t)e * Fm * C, m = (size_t)Fm * C;
            touched += memcmp(dwg_g + o, dwg0 + o, m * 4) != 0 || memcmp(dwu_g + o, dwu0 + o, m * 4) != 0 ||
                memcmp(dwd_g + o, dwd0 + o, m * 4) != 0;
        }
        gc_row("moe_experts_bwd twice: outputs differ", sh, differ, 0);
        char sh2[160];
        snprintf(sh2, sizeof sh2, "%s, %d unrouted", sh, unrouted);
        gc_row("moe_experts_bwd unrouted experts touched", sh2, touched, 0);
        /* the router's backward on the CPU's probs, routes and dtopw */
        void *grdx = gc_act(gpu, dx0r, nx);
        float *gdwr = gc_dev(gpu, dwr0, (size_t)E * C * 4), *gdl = gpu->alloc(gpu, ne * 4), *gaux = gc_dev(gpu, aux, (size_t)E * 4);
        if (gpu->to_dev(gpu, gp, p_c, ne * 4) || gpu->to_dev(gpu, gdtw, dtw_c, nk * 4)) gc_die(gpu, "router bwd inputs");
        gpu->moe_router_bwd(gpu, grdx, gdwr, gdl, gdtw, gp, gti, gx, gwr, gaux, gcnt, T, C, E, k, norm);
        float *rdx_g = gc_get_act(gpu, grdx, nx), *dwr_g = gc_get_f32(gpu, gdwr, (size_t)E * C), *dl_g = gc_get_f32(gpu, gdl, ne);
        gc_row("moe_router_bwd dlogit", sh, rel_l2(dl_g, dl_c, ne), 1e-4);
        gc_row("moe_router_bwd dinp", sh, gc_rel_delta(rdx_g, dx0r, rdx_c, dx0, nx), 1e-2);
        gc_row("moe_router_bwd dWr", sh, gc_rel_delta(dwr_g, dwr0, dwr_c, dwr0, (size_t)E * C), 1e-2);
        void *gbufs[] = {gx,  gwr, gres, gwg,  gwu,  gwd,  gdout, gp,    gtw,   gst,   gti,  gcnt, geg,  geu, gey, gout,
                         gdg, gdu, gdx,  gdx2, gdwg, gdwu, gdwd,  gdwg2, gdwu2, gdwd2, gdtw, grdx, gdwr, gdl, gaux};
        for (size_t i = 0; i < sizeof gbufs / sizeof gbufs[0]; i++)
            if (gbufs[i]) gpu->free(gpu, gbufs[i]);
        void *gh[] = {p_g,   tw_g,  st_g, ti_g,  dx_g,  dtw_g, dg_g,  du_g,  dwg_g,
                      dwu_g, dwd_g, dx_2, dwg_2, dwu_2, dwd_2, rdx_g, dwr_g, dl_g};
        for (size_t i = 0; i < sizeof gh / sizeof gh[0]; i++) free(gh[i]);
    }
    gpu->tune.moe = TUNE_MOE_AUTO;
    void *hbufs[] = {dx0e, dx0r, x,     wr,    res,   wg,    wu,   wd,   dout,  dx0,   st0,  dwg0,
                     dwu0, dwd0, dwr0,  aux,   cnt,   p_c,   tw_c, st_c, ti_c,  eg_c,  eu_c, ey_c,
                     o_c,  dx_c, dwg_c, dwu_c, dwd_c, dtw_c, dg_c, du_c, rdx_c, dwr_c, dl_c};
    for (size_t i = 0; i < sizeof hbufs / sizeof hbufs[0]; i++) free(hbufs[i]);
}

/* Expert parallelism's row moves (engine/model/moe_ep.c) against the CPU backend: the send rows
 * gathered by token (gather_rows), the answers put back in slot order and combined
 * (moe_combine_rows, out NULL too: the copy alone), dx += the slots' rows at weight 1 in place
 * (out = res), and the routing weights' gradient (moe_dtopw). The copies are exact; the sums
 * round to bf16 once. */
static void t_moe_ep_rows(int T, int C, int k) {
    char sh[64];
    snprintf(sh, sizeof sh, "T=%d C=%d k=%d", T, C, k);
    int n = T * k;
    size_t nc = (size_t)n * C, tc = (size_t)T * C;
    float *src = gc_rand(tc, 1.0f, 31), *rows = gc_rand(nc, 1.0f, 32), *res = gc_rand(tc, 1.0f, 33), *tw = gc_rand(n, 1.0f, 34);
    float *dout = gc_rand(tc, 1.0f, 35), *ey_c = malloc(nc * 4), *out_c = malloc(tc * 4), *pk_c = malloc(nc * 4),
          *dt_c = malloc(n * 4);
    float *one = malloc(n * 4), *dx_c = gc_copy(res, tc);
    int *idx = malloc((size_t)n * 4), *inv = malloc((size_t)n * 4);
    for (int i = 0; i < n; i++) {
        idx[i] = (i * 5 + 1) % T; /* tokens repeat, as a token's k slots do */
        inv[i] = (int)(((long long)i * 7 + 2) % n); /* a permutation while 7 is prime to n */
        one[i] = 1.0f;
    }
    cpu->gather_rows(cpu, pk_c, src, idx, n, C);
    cpu->moe_combine_rows(cpu, out_c, ey_c, rows, inv, res, tw, T, C, k);
    cpu->moe_dtopw(cpu, dt_c, dout, ey_c, T, C, k);
    void *gsrc = gc_act(gpu, src, tc), *grows = gc_act(gpu, rows, nc), *gres = gc_act(gpu, res, tc), *gdout = gc_act(gpu, dout, tc);
    float *gtw = gc_dev(gpu, tw, (size_t)n * 4), *gone = gc_dev(gpu, one, (size_t)n * 4), *gdt = gpu->alloc(gpu, (size_t)n * 4);
    int *gidx = gc_dev(gpu, idx, (size_t)n * 4), *ginv = gc_dev(gpu, inv, (size_t)n * 4);
    void *gpk = gpu->alloc(gpu, nc * 2), *gey = gpu->alloc(gpu, nc * 2), *gey2 = gpu->alloc(gpu, nc * 2),
         *gout = gpu->alloc(gpu, tc * 2);
    void *gdx = gc_act(gpu, res, tc);
    gpu->gather_rows(gpu, gpk, gsrc, gidx, n, C);
    gpu->moe_combine_rows(gpu, gout, gey, grows, ginv, gres, gtw, T, C, k);
    gpu->moe_combine_rows(gpu, NULL, gey2, grows, ginv, NULL, gtw, T, C, k);
    gpu->moe_dtopw(gpu, gdt, gdout, gey, T, C, k);
    /* dx += Σ_s rows[inv[ts]]: the backward's use, in place */
    float *sl_c = malloc(nc * 4);
    cpu->moe_combine_rows(cpu, dx_c, sl_c, rows, inv, dx_c, one, T, C, k);
    gpu->moe_combine_rows(gpu, gdx, gey2, grows, ginv, gdx, gone, T, C, k);
    float *pk_g = gc_get_act(gpu, gpk, nc), *ey_g = gc_get_act(gpu, gey, nc), *out_g = gc_get_act(gpu, gout, tc);
    float *dt_g = gc_get_f32(gpu, gdt, (size_t)n), *dx_g = gc_get_act(gpu, gdx, tc);
    /* the cpu's packed rows from the bf16-rounded inputs the gpu moved: the copies are exact */
    float *src_b = gc_get_act(gpu, gsrc, tc), *rows_b = gc_get_act(gpu, grows, nc), *pk_b = malloc(nc * 4), *ey_b = malloc(nc * 4);
    cpu->gather_rows(cpu, pk_b, src_b, idx, n, C);
    cpu->moe_combine_rows(cpu, NULL, ey_b, rows_b, inv, NULL, tw, T, C, k);
    gc_row("gather_rows (bit-equal)", sh, rel_l2(pk_g, pk_b, nc), 0);
    gc_row("moe_combine_rows ey (bit-equal)", sh, rel_l2(ey_g, ey_b, nc), 0);
    gc_row("gather_rows", sh, rel_l2(pk_g, pk_c, nc), 1e-2);
    gc_row("moe_combine_rows out", sh, rel_l2(out_g, out_c, tc), 1e-2);
    gc_row("moe_combine_rows dx += rows", sh, rel_l2(dx_g, dx_c, tc), 1e-2);
    gc_row("moe_dtopw", sh, rel_l2(dt_g, dt_c, (size_t)n), 1e-2);
    void *g[] = {gsrc, grows, gres, gdout, gtw, gone, gdt, gidx, ginv, gpk, gey, gey2, gout, gdx};
    for (size_t i = 0; i < sizeof g / sizeof g[0]; i++) gpu->free(gpu, g[i]);
    float *h[] = {src,  rows, res,  tw,    dout, ey_c, out_c, pk_c,   dt_c, one, dx_c,
                  sl_c, pk_g, ey_g, out_g, dt_g, dx_g, src_b, rows_b, pk_b, ey_b};
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++) free(h[i]);
    free(idx);
    free(inv);
}

static void moe_suite(void) {
    t_moe_ep_rows(333, 256, 2);
    t_moe_ep_rows(40, 100, 3); /* C not a multiple of 8 */
    t_moe_ep_rows(64, 2048, 8); /* Qwen3-30B-A3B's width and top-8 */
    t_moe(333, 256, 8, 2, 136, 1, 1); /* several tiles per expert, Fm past a tile */
    t_moe(77, 200, 16, 4, 72, 0, 1); /* no renormalisation */
    t_moe(40, 100, 6, 3, 36, 1, 1); /* C, Fm not multiples of 8: the scalar loads; E < 32 */
    t_moe(1, 64, 4, 1, 32, 0, 0); /* one token, one expert */
    t_moe(16, 512, 64, 8, 192, 1, 0); /* a decode step: few rows, most experts unrouted */
    t_moe(1024, 1024, 32, 4, 384, 1, 1); /* training-sized rows */
    t_moe(16, 2048, 32, 8, 768, 1, 0); /* Qwen3-30B-A3B's expert dims (32 of its 128 experts), a decode step */
}

/* ---------------------------------------------------------------- hybrid linear attention */

/* The gated DeltaNet ops (kernels/deltanet.h) and the gated attention's (kernels/gated_attn.h)
 * against the CPU backend on a packed layout: groups [P; R_1..R_N] whose prompts and responses
 * cross the CUDA walk's 64-token checkpoints, a prompt shorter than the conv kernel, a response
 * of one token, a group of a prompt alone; so the prompt's final state and conv tail feed every
 * response, and the backward's pending slots collect the responses' state gradients. Inputs
 * are bf16-rounded on both sides; every output passes through bf16 on CUDA: 1e-2 relative L2
 * as the dense ops, rstd 1e-4 (fp32 of the same inputs). "+=" gradients start random and their
 * increments are compared. The rule's forward (chunked for Dk <= 128, deltanet_chunk.cu) and
 * backward (chunked for Dk, Dv <= 128 and few enough chunks, deltanet_chunk_bwd.cu; the rows at
 * Dk 192 and of 160 one-token runs take the recurrent walks) run twice give the same bits (no
 * float atomics). */
typedef struct {
    void *p[48];
    int n;
} gpu_bufs;
static void *gb(gpu_bufs *b, void *p) { return b->p[b->n++] = p; }
static void gb_free(gpu_bufs *b) {
    for (int i = 0; i < b->n; i++) gpu->free(gpu, b->p[i]);
}
static double bits_differ(eng_backend *g, const void *a, const void *b, size_t bytes) {
    char *x = malloc(bytes + 4), *y = malloc(bytes + 4);
    if (g->sync(g) || g->to_host(g, x, a, bytes) || g->to_host(g, y, b, bytes)) gc_die(g, "download");
    double d = memcmp(x, y, bytes) != 0;
    free(x);
    free(y);
    return d;
}

static void t_deltanet(ranges rg, int Hk, int Hv, int Dk, int Dv, int Kc) {
    char sh[96];
    int T = rg.T, Cc = 2 * Hk * Dk + Hv * Dv, VL = Hv * Dv;
    snprintf(sh, sizeof sh, "T=%d Hk=%d Hv=%d Dk=%d Dv=%d Kc=%d", T, Hk, Hv, Dk, Dv, Kc);
    size_t nx = (size_t)T * Cc, nh = (size_t)T * Hv, no = (size_t)T * VL;
    unsigned long long sd = 900 + (unsigned long long)T * 7 + Dk;
    float *x = gc_rand(nx, 1.0f, sd), *cw = gc_rand((size_t)Cc * Kc, 0.5f, sd + 1), *du = gc_rand(nx, 1.0f, sd + 2);
    float *dcw0 = gc_rand((size_t)Cc * Kc, 1.0f, sd + 3), *u = gc_rand(nx, 1.0f, sd + 4), *a = gc_rand(nh, 2.0f, sd + 5);
    float *b = gc_rand(nh, 2.0f, sd + 6), *alog = gc_rand((size_t)Hv, 1.0f, sd + 7), *dt = gc_rand((size_t)Hv, 1.0f, sd + 8);
    float *dout = gc_rand(no, 1.0f, sd + 9), *dal0 = gc_rand((size_t)Hv, 1.0f, sd + 10), *ddt0 = gc_rand((size_t)Hv, 1.0f, sd + 11);
    float *o = gc_rand(no, 1.0f, sd + 12), *z = gc_rand(no, 2.0f, sd + 13), *nw = gc_rand((size_t)Dv, 1.0f, sd + 14);
    float *dy = gc_rand(no, 1.0f, sd + 15), *dnw0 = gc_rand((size_t)Dv, 1.0f, sd + 16);
    attn_ranges rc = {rg.a0, rg.a1, rg.b0, rg.b1, NULL, NULL, 0};
    /* CPU */
    long long st, dst;
    cpu->deltanet_scratch(cpu, &st, &dst, T, Hk, Hv, Dk, Dv);
    float *states = malloc((size_t)st * 4), *dstates = malloc((size_t)dst * 4);
    float *u_c = malloc(nx * 4), *dx_c = malloc(nx * 4), *dcw_c = gc_copy(dcw0, (size_t)Cc * Kc), *o_c = malloc(no * 4);
    float *du_c = malloc(nx * 4), *da_c = malloc(nh * 4), *db_c = malloc(nh * 4), *dal_c = gc_copy(dal0, (size_t)Hv);
    float *ddt_c = gc_copy(ddt0, (size_t)Hv), *y_c = malloc(no * 4), *r_c = malloc(nh * 4), *do_c = malloc(no * 4);
    float *dz_c = malloc(no * 4), *dnw_c = gc_copy(dnw0, (size_t)Dv);
    cpu->deltanet_conv_fwd(cpu, u_c, x, cw, rc, NULL, T, Cc, Kc);
    cpu->deltanet_conv_bwd(cpu, dx_c, dcw_c, du, x, cw, rc, NULL, T, Cc, Kc);
    cpu->deltanet_rule_fwd(cpu, o_c, states, u, a, b, alog, dt, rc, NULL, T, Hk, Hv, Dk, Dv);
    cpu->deltanet_rule_bwd(cpu, du_c, da_c, db_c, dal_c, ddt_c, states, dstates, dout, u, a, b, alog, dt, rc, NULL, T, Hk, Hv, Dk,
                           Dv);
    cpu->deltanet_norm_fwd(cpu, y_c, r_c, o, z, nw, T, Hv, Dv, 1e-6f);
    cpu->deltanet_norm_bwd(cpu, do_c, dz_c, dnw_c, dy, o, z, nw, r_c, T, Hv, Dv);
    /* GPU */
    gpu_bufs B = {{0}, 0};
    gpu->deltanet_scratch(gpu, &st, &dst, T, Hk, Hv, Dk, Dv);
    float *gst = gb(&B, gpu->alloc(gpu, (size_t)st * 4)), *gdst = gb(&B, gpu->alloc(gpu, (size_t)dst * 4));
    void *gx = gb(&B, gc_act(gpu, x, nx)), *gcw = gb(&B, gc_act(gpu, cw, (size_t)Cc * Kc)), *gdu = gb(&B, gc_act(gpu, du, nx));
    void *gu = gb(&B, gc_act(gpu, u, nx)), *ga = gb(&B, gc_act(gpu, a, nh)), *gb_ = gb(&B, gc_act(gpu, b, nh));
    void *gal = gb(&B, gc_act(gpu, alog, (size_t)Hv)), *gdt = gb(&B, gc_act(gpu, dt, (size_t)Hv));
    void *gdout = gb(&B, gc_act(gpu, dout, no)), *go_in = gb(&B, gc_act(gpu, o, no)), *gz = gb(&B, gc_act(gpu, z, no));
    void *gnw = gb(&B, gc_act(gpu, nw, (size_t)Dv)), *gdy = gb(&B, gc_act(gpu, dy, no));
    float *gdcw = gb(&B, gc_dev(gpu, dcw0, (size_t)Cc * Kc * 4)), *gdal = gb(&B, gc_dev(gpu, dal0, (size_t)Hv * 4));
    float *gddt = gb(&B, gc_dev(gpu, ddt0, (size_t)Hv * 4)), *gdal2 = gb(&B, gc_dev(gpu, dal0, (size_t)Hv * 4));
    float *gddt2 = gb(&B, gc_dev(gpu, ddt0, (size_t)Hv * 4)), *gdnw = gb(&B, gc_dev(gpu, dnw0, (size_t)Dv * 4));
    void *gucv = gb(&B, gpu->alloc(gpu, nx * 2)), *gdx = gb(&B, gpu->alloc(gpu, nx * 2)), *go = gb(&B, gpu->alloc(gpu, no * 2));
    void *go2 = gb(&B, gpu->alloc(gpu, no * 2)), *go3 = gb(&B, gpu->alloc(gpu, no * 2));
    void *gdur3 = gb(&B, gpu->alloc(gpu, nx * 2)), *gda3 = gb(&B, gpu->alloc(gpu, nh * 2)), *gdb3 = gb(&B, gpu->alloc(gpu, nh * 2));
    float *gdal3 = gb(&B, gc_dev(gpu, dal0, (size_t)Hv * 4)), *gddt3 = gb(&B, gc_dev(gpu, ddt0, (size_t)Hv * 4));
    void *gdur = gb(&B, gpu->alloc(gpu, nx * 2)), *gda = gb(&B, gpu->alloc(gpu, nh * 2)), *gdb = gb(&B, gpu->alloc(gpu, nh * 2));
    void *gdur2 = gb(&B, gpu->alloc(gpu, nx * 2)), *gda2 = gb(&B, gpu->alloc(gpu, nh * 2)), *gdb2 = gb(&B, gpu->alloc(gpu, nh * 2));
    void *gy = gb(&B, gpu->alloc(gpu, no * 2)), *gdo = gb(&B, gpu->alloc(gpu, no * 2)), *gdz = gb(&B, gpu->alloc(gpu, no * 2));
    float *gr = gb(&B, gpu->alloc(gpu, nh * 4));
    attn_ranges rgd = gc_dev_ranges(gpu, rg);
    gb(&B, (void *)rgd.a0);
    gb(&B, (void *)rgd.a1);
    gb(&B, (void *)rgd.b0);
    gb(&B, (void *)rgd.b1);
    gpu->deltanet_conv_fwd(gpu, gucv, gx, gcw, rgd, NULL, T, Cc, Kc);
    gpu->deltanet_conv_bwd(gpu, gdx, gdcw, gdu, gx, gcw, rgd, NULL, T, Cc, Kc);
    gpu->deltanet_rule_fwd(gpu, go, gst, gu, ga, gb_, gal, gdt, rgd, NULL, T, Hk, Hv, Dk, Dv);
    gpu->deltanet_rule_bwd(gpu, gdur, gda, gdb, gdal, gddt, gst, gdst, gdout, gu, ga, gb_, gal, gdt, rgd, NULL, T, Hk, Hv, Dk, Dv);
    gpu->deltanet_rule_fwd(gpu, go2, gst, gu, ga, gb_, gal, gdt, rgd, NULL, T, Hk, Hv, Dk, Dv);
    gpu->deltanet_rule_bwd(gpu, gdur2, gda2, gdb2, gdal2, gddt2, gst, gdst, gdout, gu, ga, gb_, gal, gdt, rgd, NULL, T, Hk, Hv,
                           Dk, Dv);
    gpu->tune.deltanet = TUNE_DN_RECURRENT; /* the path the chunked kernels replace */
    gpu->deltanet_rule_fwd(gpu, go3, gst, gu, ga, gb_, gal, gdt, rgd, NULL, T, Hk, Hv, Dk, Dv);
    gpu->deltanet_rule_bwd(gpu, gdur3, gda3, gdb3, gdal3, gddt3, gst, gdst, gdout, gu, ga, gb_, gal, gdt, rgd, NULL, T, Hk, Hv,
                           Dk, Dv);
    gpu->tune.deltanet = TUNE_DN_CHUNKED;
    gpu->deltanet_norm_fwd(gpu, gy, gr, go_in, gz, gnw, T, Hv, Dv, 1e-6f);
    gpu->deltanet_norm_bwd(gpu, gdo, gdz, gdnw, gdy, go_in, gz, gnw, gr, T, Hv, Dv);
    float *u_g = gc_get_act(gpu, gucv, nx), *dx_g = gc_get_act(gpu, gdx, nx), *dcw_g = gc_get_f32(gpu, gdcw, (size_t)Cc * Kc);
    float *o_g = gc_get_act(gpu, go, no), *du_g = gc_get_act(gpu, gdur, nx), *da_g = gc_get_act(gpu, gda, nh);
    float *db_g = gc_get_act(gpu, gdb, nh), *dal_g = gc_get_f32(gpu, gdal, (size_t)Hv), *ddt_g = gc_get_f32(gpu, gddt, (size_t)Hv);
    float *y_g = gc_get_act(gpu, gy, no), *r_g = gc_get_f32(gpu, gr, nh), *do_g = gc_get_act(gpu, gdo, no);
    float *dz_g = gc_get_act(gpu, gdz, no), *dnw_g = gc_get_f32(gpu, gdnw, (size_t)Dv);
    gc_row("deltanet_conv_fwd", sh, rel_l2(u_g, u_c, nx), 1e-2);
    gc_row("deltanet_conv_bwd dx", sh, rel_l2(dx_g, dx_c, nx), 1e-2);
    gc_row("deltanet_conv_bwd dw", sh, gc_rel_delta(dcw_g, dcw0, dcw_c, dcw0, (size_t)Cc * Kc), 1e-2);
    gc_row("deltanet_rule_fwd o", sh, rel_l2(o_g, o_c, no), 1e-2);
    gc_row("deltanet_rule_bwd du", sh, rel_l2(du_g, du_c, nx), 1e-2);
    gc_row("deltanet_rule_bwd da", sh, rel_l2(da_g, da_c, nh), 1e-2);
    gc_row("deltanet_rule_bwd db", sh, rel_l2(db_g, db_c, nh), 1e-2);
    gc_row("deltanet_rule_bwd dA_log", sh, gc_rel_delta(dal_g, dal0, dal_c, dal0, (size_t)Hv), 1e-2);
    gc_row("deltanet_rule_bwd ddt_bias", sh, gc_rel_delta(ddt_g, ddt0, ddt_c, ddt0, (size_t)Hv), 1e-2);
    double diff = bits_differ(gpu, gdur, gdur2, nx * 2) + bits_differ(gpu, gda, gda2, nh * 2) +
        bits_differ(gpu, gdb, gdb2, nh * 2) + bits_differ(gpu, gdal, gdal2, (size_t)Hv * 4) +
        bits_differ(gpu, gddt, gddt2, (size_t)Hv * 4);
    gc_row("deltanet_rule_bwd twice: outputs differ", sh, diff, 0);
    gc_row("deltanet_rule_fwd twice: outputs differ", sh, bits_differ(gpu, go, go2, no * 2), 0);
    float *o_r = gc_get_act(gpu, go3, no), *du_r = gc_get_act(gpu, gdur3, nx), *da_r = gc_get_act(gpu, gda3, nh);
    float *db_r = gc_get_act(gpu, gdb3, nh), *dal_r = gc_get_f32(gpu, gdal3, (size_t)Hv);
    gc_row("deltanet_rule_fwd chunked vs recurrent o", sh, rel_l2(o_g, o_r, no), 1e-2);
    gc_row("deltanet_rule_bwd chunked vs recurrent du", sh, rel_l2(du_g, du_r, nx), 1e-2);
    gc_row("deltanet_rule_bwd chunked vs recurrent da", sh, rel_l2(da_g, da_r, nh), 1e-2);
    gc_row("deltanet_rule_bwd chunked vs recurrent db", sh, rel_l2(db_g, db_r, nh), 1e-2);
    gc_row("deltanet_rule_bwd chunked vs recurrent dA_log", sh, gc_rel_delta(dal_g, dal0, dal_r, dal0, (size_t)Hv), 1e-2);
    free(o_r);
    free(du_r);
    free(da_r);
    free(db_r);
    free(dal_r);
    gc_row("deltanet_norm_fwd y", sh, rel_l2(y_g, y_c, no), 1e-2);
    gc_row("deltanet_norm_fwd rstd", sh, rel_l2(r_g, r_c, nh), 1e-4);
    gc_row("deltanet_norm_bwd dout", sh, rel_l2(do_g, do_c, no), 1e-2);
    gc_row("deltanet_norm_bwd dz", sh, rel_l2(dz_g, dz_c, no), 1e-2);
    gc_row("deltanet_norm_bwd dw", sh, gc_rel_delta(dnw_g, dnw0, dnw_c, dnw0, (size_t)Dv), 1e-2);
    gb_free(&B);
    void *h[] = {x,     cw,     du,      dcw0,  u,    a,     b,    alog, dt,    dout,  dal0,  ddt0,  o,    z,    nw,   dy,
                 dnw0,  states, dstates, u_c,   dx_c, dcw_c, o_c,  du_c, da_c,  db_c,  dal_c, ddt_c, y_c,  r_c,  do_c, dz_c,
                 dnw_c, u_g,    dx_g,    dcw_g, o_g,  du_g,  da_g, db_g, dal_g, ddt_g, y_g,   r_g,   do_g, dz_g, dnw_g};
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++) free(h[i]);
}

static void t_gated_attn(int T, int H, int K, int D, int R) {
    char sh[96];
    snprintf(sh, sizeof sh, "T=%d H=%d K=%d D=%d R=%d", T, H, K, D, R);
    size_t nq = (size_t)T * H * D, nk = (size_t)T * K * D, ng = 2 * nq;
    unsigned long long sd = 950 + (unsigned long long)T * 5 + D;
    float *qg = gc_rand(ng, 2.0f, sd), *k0 = gc_rand(nk, 2.0f, sd + 1), *wq = gc_rand((size_t)D, 1.5f, sd + 2);
    float *wk = gc_rand((size_t)D, 1.5f, sd + 3), *dq = gc_rand(nq, 1.0f, sd + 4), *dk = gc_rand(nk, 1.0f, sd + 5);
    float *dwq0 = gc_rand((size_t)D, 1.0f, sd + 6), *dwk0 = gc_rand((size_t)D, 1.0f, sd + 7), *att = gc_rand(nq, 1.0f, sd + 8);
    float *dy = gc_rand(nq, 1.0f, sd + 9), *dqg0 = gc_rand(ng, 1.0f, sd + 10), *f = malloc((size_t)R / 2 * 4 + 4);
    int *pos = rand_ints(T, 0, 40000, sd + 11);
    rope_inv_freq(f, R, 1e7f, 0, 0, 0, 0); /* Qwen3.5's rope_theta */
    float *q_c = malloc(nq * 4), *k_c = malloc(nk * 4), *rq_c = malloc((size_t)T * H * 4), *rk_c = malloc((size_t)T * K * 4);
    float *dqg_c = gc_copy(dqg0, ng), *dk0_c = malloc(nk * 4), *dwq_c = gc_copy(dwq0, (size_t)D), *dwk_c = gc_copy(dwk0, (size_t)D);
    float *y_c = malloc(nq * 4), *datt_c = malloc(nq * 4);
    cpu->gated_attn_qk_fwd(cpu, q_c, k_c, rq_c, rk_c, qg, k0, wq, wk, pos, f, T, H, K, D, R, 1e-6f);
    cpu->gated_attn_qk_bwd(cpu, dqg_c, dk0_c, dwq_c, dwk_c, dq, dk, qg, k0, wq, wk, rq_c, rk_c, pos, f, T, H, K, D, R);
    cpu->gated_attn_gate_fwd(cpu, y_c, att, qg, T, H, D);
    cpu->gated_attn_gate_bwd(cpu, datt_c, dqg_c, dy, att, qg, T, H, D);
    gpu_bufs B = {{0}, 0};
    void *gqg = gb(&B, gc_act(gpu, qg, ng)), *gk0 = gb(&B, gc_act(gpu, k0, nk)), *gwq = gb(&B, gc_act(gpu, wq, (size_t)D));
    void *gwk = gb(&B, gc_act(gpu, wk, (size_t)D)), *gdq = gb(&B, gc_act(gpu, dq, nq)), *gdk = gb(&B, gc_act(gpu, dk, nk));
    void *gatt = gb(&B, gc_act(gpu, att, nq)), *gdqg = gb(&B, gc_act(gpu, dqg0, ng)), *gdy = gb(&B, gc_act(gpu, dy, nq));
    void *gq = gb(&B, gpu->alloc(gpu, nq * 2)), *gk = gb(&B, gpu->alloc(gpu, nk * 2)), *gdk0 = gb(&B, gpu->alloc(gpu, nk * 2));
    void *gy = gb(&B, gpu->alloc(gpu, nq * 2));
    float *grq = gb(&B, gpu->alloc(gpu, (size_t)T * H * 4)), *grk = gb(&B, gpu->alloc(gpu, (size_t)T * K * 4));
    float *gdwq = gb(&B, gc_dev(gpu, dwq0, (size_t)D * 4)), *gdwk = gb(&B, gc_dev(gpu, dwk0, (size_t)D * 4));
    float *gf = gb(&B, gc_dev(gpu, f, (size_t)R / 2 * 4));
    int *gpos = gb(&B, gc_dev(gpu, pos, (size_t)T * 4));
    gpu->gated_attn_qk_fwd(gpu, gq, gk, grq, grk, gqg, gk0, gwq, gwk, gpos, gf, T, H, K, D, R, 1e-6f);
    gpu->gated_attn_qk_bwd(gpu, gdqg, gdk0, gdwq, gdwk, gdq, gdk, gqg, gk0, gwq, gwk, grq, grk, gpos, gf, T, H, K, D, R);
    gpu->gated_attn_gate_fwd(gpu, gy, gatt, gqg, T, H, D);
    gpu->gated_attn_gate_bwd(gpu, gdy, gdqg, gdy, gatt, gqg, T, H, D); /* in place, as the model runs it */
    float *q_g = gc_get_act(gpu, gq, nq), *k_g = gc_get_act(gpu, gk, nk), *rq_g = gc_get_f32(gpu, grq, (size_t)T * H);
    float *rk_g = gc_get_f32(gpu, grk, (size_t)T * K), *dqg_g = gc_get_act(gpu, gdqg, ng), *dk0_g = gc_get_act(gpu, gdk0, nk);
    float *dwq_g = gc_get_f32(gpu, gdwq, (size_t)D), *dwk_g = gc_get_f32(gpu, gdwk, (size_t)D), *y_g = gc_get_act(gpu, gy, nq);
    float *datt_g = gc_get_act(gpu, gdy, nq);
    gc_row("gated_attn_qk_fwd q", sh, rel_l2(q_g, q_c, nq), 1e-2);
    gc_row("gated_attn_qk_fwd k", sh, rel_l2(k_g, k_c, nk), 1e-2);
    gc_row("gated_attn_qk_fwd rstd", sh, rel_l2(rq_g, rq_c, (size_t)T * H) + rel_l2(rk_g, rk_c, (size_t)T * K), 1e-4);
    gc_row("gated_attn_qk_bwd dqg (q and gate halves)", sh, rel_l2(dqg_g, dqg_c, ng), 1e-2);
    gc_row("gated_attn_qk_bwd dk0", sh, rel_l2(dk0_g, dk0_c, nk), 1e-2);
    gc_row("gated_attn_qk_bwd dwq", sh, gc_rel_delta(dwq_g, dwq0, dwq_c, dwq0, (size_t)D), 1e-2);
    gc_row("gated_attn_qk_bwd dwk", sh, gc_rel_delta(dwk_g, dwk0, dwk_c, dwk0, (size_t)D), 1e-2);
    gc_row("gated_attn_gate_fwd", sh, rel_l2(y_g, y_c, nq), 1e-2);
    gc_row("gated_attn_gate_bwd datt (in place)", sh, rel_l2(datt_g, datt_c, nq), 1e-2);
    gb_free(&B);
    void *h[] = {qg,    k0,    wq,    wk,    dq,  dk,     dwq0, dwk0, att,  dy,   dqg0,  f,     pos,   q_c,   k_c, rq_c,  rk_c,
                 dqg_c, dk0_c, dwq_c, dwk_c, y_c, datt_c, q_g,  k_g,  rq_g, rk_g, dqg_g, dk0_g, dwq_g, dwk_g, y_g, datt_g};
    for (size_t i = 0; i < sizeof h / sizeof h[0]; i++) free(h[i]);
}

/* The DeltaNet ops with a carry (deltanet.h deltanet_carry: a split group's prompt handing its
 * final state and conv tail to its response micro-batches), CUDA against the CPU backend on the
 * same inputs, the two passes of the split schedule (engine/model/split.c):
 *   prompt (P tokens, row0 0): s_out, tail_out written; ds_out, dtail_out taken by the backwards;
 *   responses (row0 P, ranges over cache rows): s_in, tail_in read; ds_in, dtail_in += .
 * Responses of one token and across the walk's 64-token checkpoints; a prompt shorter than the
 * conv kernel (its tail holds zeros). Tolerances as t_deltanet's; the carry is fp32 both sides.
 * CUDA runs the chunked kernels (the carry enters their plan and walks) and, as the path they
 * replace, the recurrent walk (GRPOD_TUNE_DELTANET=recurrent) on the same inputs. */
typedef struct {
    float *u, *dx, *dw, *o, *du, *da, *db, *dal, *ddt, *s, *tail; /* host results; s, tail: the carry's out or d in */
} dn_out;

static void *dn_up(eng_backend *be, const float *h, size_t n) {
    void *p = be->alloc(be, n * (size_t)be->act_bytes + 16);
    if (!p || be->act_from_f32(be, p, h, n)) gc_die(be, "upload act");
    return p;
}

/* The four ops on backend be; in: x, u (T,Cc) a, b (T,Hv), dout (T,Hv,Dv), du (T,Cc), the weights;
 * carry buffers from host (cs, ct: s_in/tail_in or ds_out/dtail_out; ds0, dt0: ds_in/dtail_in's
 * start) */
static dn_out dn_carry_run(eng_backend *be, ranges rg, int row0, float **in, const float *cs, const float *ct, const float *ds0,
                           const float *dt0, int Hk, int Hv, int Dk, int Dv, int Kc) {
    int T = rg.T, Cc = 2 * Hk * Dk + Hv * Dv;
    size_t nx = (size_t)T * Cc, nh = (size_t)T * Hv, no = (size_t)T * Hv * Dv, SZ = (size_t)Hv * Dk * Dv,
           TL = (size_t)(Kc - 1) * Cc;
    enum { X, U, A, B, DOUT, DU, CW, ALOG, DT, DCW0, DAL0, DDT0 };
    size_t nin[] = {nx, nx, nh, nh, no, nx, (size_t)Cc * Kc, (size_t)Hv, (size_t)Hv};
    void *d[9];
    for (int i = 0; i < 9; i++) d[i] = dn_up(be, in[i], nin[i]);
    float *dcw = gc_dev(be, in[DCW0], (size_t)Cc * Kc * 4), *dal = gc_dev(be, in[DAL0], (size_t)Hv * 4);
    float *ddt = gc_dev(be, in[DDT0], (size_t)Hv * 4);
    float *cs_d = gc_dev(be, cs, SZ * 4), *ct_d = gc_dev(be, ct, TL * 4 + 4);
    float *so = be->alloc(be, SZ * 4), *to = be->alloc(be, TL * 4 + 4);
    deltanet_carry k = {.row0 = row0};
    if (row0)
        k = (deltanet_carry){row0, cs_d, ct_d, gc_dev(be, ds0, SZ * 4), gc_dev(be, dt0, TL * 4 + 4), NULL, NULL, NULL, NULL};
    else k = (deltanet_carry){0, NULL, NULL, NULL, NULL, so, to, cs_d, ct_d};
    long long st, dst;
    be->deltanet_scratch(be, &st, &dst, T, Hk, Hv, Dk, Dv);
    float *gst = be->alloc(be, (size_t)st * 4), *gdst = be->alloc(be, (size_t)dst * 4);
    void *u = be->alloc(be, nx * be->act_bytes), *dx = be->alloc(be, nx * be->act_bytes), *o = be->alloc(be, no * be->act_bytes);
    void *du = be->alloc(be, nx * be->act_bytes), *da = be->alloc(be, nh * be->act_bytes), *db = be->alloc(be, nh * be->act_bytes);
    attn_ranges r = gc_dev_ranges(be, rg);
    be->deltanet_conv_fwd(be, u, d[X], d[CW], r, &k, T, Cc, Kc);
    be->deltanet_conv_bwd(be, dx, dcw, d[DU], d[X], d[CW], r, &k, T, Cc, Kc);
    be->deltanet_rule_fwd(be, o, gst, d[U], d[A], d[B], d[ALOG], d[DT], r, &k, T, Hk, Hv, Dk, Dv);
    be->deltanet_rule_bwd(be, du, da, db, dal, ddt, gst, gdst, d[DOUT], d[U], d[A], d[B], d[ALOG], d[DT], r, &k, T, Hk, Hv, Dk, Dv);
    dn_out out = {gc_get_act(be, u, nx),
                  gc_get_act(be, dx, nx),
                  gc_get_f32(be, dcw, (size_t)Cc * Kc),
                  gc_get_act(be, o, no),
                  gc_get_act(be, du, nx),
                  gc_get_act(be, da, nh),
                  gc_get_act(be, db, nh),
                  gc_get_f32(be, dal, (size_t)Hv),
                  gc_get_f32(be, ddt, (size_t)Hv),
                  gc_get_f32(be, row0 ? k.ds_in : so, SZ),
                  gc_get_f32(be, row0 ? k.dtail_in : to, TL + 1)};
    void *fr[] = {dcw,
                  dal,
                  ddt,
                  cs_d,
                  ct_d,
                  so,
                  to,
                  gst,
                  gdst,
                  u,
                  dx,
                  o,
                  du,
                  da,
                  db,
                  (void *)r.a0,
                  (void *)r.a1,
                  (void *)r.b0,
                  (void *)r.b1,
                  row0 ? k.ds_in : NULL,
                  row0 ? k.dtail_in : NULL};
    for (int i = 0; i < 9; i++) be->free(be, d[i]);
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++)
        if (fr[i]) be->free(be, fr[i]);
    return out;
}

static void dn_out_free(dn_out *o) {
    float *p[] = {o->u, o->dx, o->dw, o->o, o->du, o->da, o->db, o->dal, o->ddt, o->s, o->tail};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

static void t_deltanet_carry(int P, int N, const int *lens, int Hk, int Hv, int Dk, int Dv, int Kc) {
    int Cc = 2 * Hk * Dk + Hv * Dv;
    size_t SZ = (size_t)Hv * Dk * Dv, TL = (size_t)(Kc - 1) * Cc;
    for (int pass = 0; pass < 2; pass++) { /* the prompt's, then a response micro-batch's */
        int T = 0;
        for (int i = 0; i < N; i++) T += lens[i];
        if (!pass) T = P;
        ranges rg = {T, malloc((size_t)T * 4), malloc((size_t)T * 4), malloc((size_t)T * 4), malloc((size_t)T * 4)};
        for (int t = 0; !pass && t < T; t++) { /* the prompt: causal on itself */
            rg.a0[t] = 0;
            rg.a1[t] = rg.b0[t] = rg.b1[t] = t + 1;
        }
        for (int i = 0, t = 0; pass && i < N; i++)
            for (int j = 0, s0 = t; j < lens[i]; j++, t++) {
                rg.a0[t] = 0;
                rg.a1[t] = P;
                rg.b0[t] = P + s0;
                rg.b1[t] = P + t + 1;
            }
        size_t nx = (size_t)T * Cc, nh = (size_t)T * Hv, no = (size_t)T * Hv * Dv;
        unsigned long long sd = 1700 + (unsigned long long)T * 11 + Dk + pass;
        float *in[12] = {gc_rand(nx, 1.0f, sd),
                         gc_rand(nx, 1.0f, sd + 1),
                         gc_rand(nh, 2.0f, sd + 2),
                         gc_rand(nh, 2.0f, sd + 3),
                         gc_rand(no, 1.0f, sd + 4),
                         gc_rand(nx, 1.0f, sd + 5),
                         gc_rand((size_t)Cc * Kc, 0.5f, sd + 6),
                         gc_rand((size_t)Hv, 1.0f, sd + 7),
                         gc_rand((size_t)Hv, 1.0f, sd + 8),
                         gc_rand((size_t)Cc * Kc, 1.0f, sd + 9),
                         gc_rand((size_t)Hv, 1.0f, sd + 10),
                         gc_rand((size_t)Hv, 1.0f, sd + 11)};
        /* the carry's state is a sum of many rank-one updates: of the order of a real one */
        float *cs = gc_rand(SZ, 0.5f, sd + 12), *ct = gc_rand(TL + 1, 1.0f, sd + 13), *ds0 = gc_rand(SZ, 1.0f, sd + 14),
              *dt0 = gc_rand(TL + 1, 1.0f, sd + 15);
        dn_out c = dn_carry_run(cpu, rg, pass ? P : 0, in, cs, ct, ds0, dt0, Hk, Hv, Dk, Dv, Kc);
        dn_out g = dn_carry_run(gpu, rg, pass ? P : 0, in, cs, ct, ds0, dt0, Hk, Hv, Dk, Dv, Kc);
        gpu->tune.deltanet = TUNE_DN_RECURRENT;
        dn_out w = dn_carry_run(gpu, rg, pass ? P : 0, in, cs, ct, ds0, dt0, Hk, Hv, Dk, Dv, Kc);
        gpu->tune.deltanet = TUNE_DN_CHUNKED;
        char sh[128];
        snprintf(sh, sizeof sh, "%s P=%d T=%d Hk=%d Hv=%d Dk=%d Dv=%d Kc=%d", pass ? "responses" : "prompt", P, T, Hk, Hv, Dk, Dv,
                 Kc);
        gc_row("deltanet carry conv_fwd u", sh, rel_l2(g.u, c.u, nx), 1e-2);
        gc_row("deltanet carry conv_bwd dx", sh, rel_l2(g.dx, c.dx, nx), 1e-2);
        gc_row("deltanet carry conv_bwd dw", sh, gc_rel_delta(g.dw, in[9], c.dw, in[9], (size_t)Cc * Kc), 1e-2);
        gc_row("deltanet carry rule_fwd o", sh, rel_l2(g.o, c.o, no), 1e-2);
        gc_row("deltanet carry rule_bwd du", sh, rel_l2(g.du, c.du, nx), 1e-2);
        gc_row("deltanet carry rule_bwd da", sh, rel_l2(g.da, c.da, nh), 1e-2);
        gc_row("deltanet carry rule_bwd db", sh, rel_l2(g.db, c.db, nh), 1e-2);
        gc_row("deltanet carry rule_bwd dA_log", sh, gc_rel_delta(g.dal, in[10], c.dal, in[10], (size_t)Hv), 1e-2);
        gc_row("deltanet carry chunked vs recurrent o", sh, rel_l2(g.o, w.o, no), 1e-2);
        gc_row("deltanet carry chunked vs recurrent du", sh, rel_l2(g.du, w.du, nx), 1e-2);
        gc_row("deltanet carry chunked vs recurrent da", sh, rel_l2(g.da, w.da, nh), 1e-2);
        gc_row(pass ? "deltanet carry chunked vs recurrent ds_in +=" : "deltanet carry chunked vs recurrent s_out", sh,
               pass ? gc_rel_delta(g.s, ds0, w.s, ds0, SZ) : rel_l2(g.s, w.s, SZ), 1e-2);
        if (pass) {
            gc_row("deltanet carry rule_bwd ds_in +=", sh, gc_rel_delta(g.s, ds0, c.s, ds0, SZ), 1e-2);
            if (TL) gc_row("deltanet carry conv_bwd dtail_in +=", sh, gc_rel_delta(g.tail, dt0, c.tail, dt0, TL), 1e-2);
        } else {
            gc_row("deltanet carry rule_fwd s_out", sh, rel_l2(g.s, c.s, SZ), 1e-2);
            if (TL) gc_row("deltanet carry conv_fwd tail_out", sh, rel_l2(g.tail, c.tail, TL), 1e-2);
        }
        dn_out_free(&c);
        dn_out_free(&g);
        dn_out_free(&w);
        for (int i = 0; i < 12; i++) free(in[i]);
        free(cs), free(ct), free(ds0), free(dt0);
        free_ranges(rg);
    }
}

/* packed groups for t_deltanet: G groups, prompt P[g], N[g] responses of the listed lengths */
static ranges hybrid_layout(int G, const int *P, const int *N, const int *lens) {
    const int *R[8];
    for (int g = 0, o = 0; g < G; o += N[g], g++) R[g] = lens + o;
    return make_ranges(G, P, N, R);
}

/* the compute-sanitizer subset: a prompt, three responses (one of one token), a checkpoint */
static void hybrid_small(void) {
    static const int P[] = {66, 2}, N[] = {3, 1}, L[] = {1, 4, 9, 3};
    ranges r = hybrid_layout(2, P, N, L);
    t_deltanet(r, 2, 4, 32, 40, 4);
    free_ranges(r);
    static const int Lc[] = {1, 4};
    t_deltanet_carry(3, 2, Lc, 2, 4, 32, 40, 4);
    t_gated_attn(5, 3, 1, 64, 16);
}

static void hybrid_suite(void) {
    static const int P1[] = {70, 3, 20}, N1[] = {3, 2, 0}, L1[] = {5, 80, 1, 2, 40};
    ranges r1 = hybrid_layout(3, P1, N1, L1); /* 221 tokens: checkpoints inside a prompt and a response */
    t_deltanet(r1, 2, 4, 32, 48, 4); /* two value heads a key head, Dv not a multiple of 32 */
    t_deltanet(r1, 2, 2, 128, 128, 4); /* Qwen3.5's head dims */
    t_deltanet(r1, 1, 3, 16, 16, 3);
    t_deltanet(r1, 1, 2, 192, 40, 4); /* Dk > 128: the forward's recurrent walk */
    free_ranges(r1);
    static const int P2[] = {150}, N2[] = {8}, L2[] = {100, 1, 64, 63, 65, 7, 130, 2};
    ranges r2 = hybrid_layout(1, P2, N2, L2); /* one group of 8: the prompt's state into each */
    t_deltanet(r2, 4, 8, 128, 128, 4);
    free_ranges(r2);
    static const int P3[] = {1}, N3[] = {1}, L3[] = {1};
    ranges r3 = hybrid_layout(1, P3, N3, L3); /* two tokens */
    t_deltanet(r3, 2, 4, 64, 64, 4);
    free_ranges(r3);
    static const int P4[] = {5, 70, 1, 64, 3, 130, 2, 9, 66, 4}, N4[] = {2, 2, 3, 2, 2, 2, 2, 2, 2, 2};
    static const int L4[] = {3, 1, 65, 2, 1, 1, 7, 64, 2, 4, 5, 1, 1, 1, 2, 9, 63, 1, 8, 3, 2};
    const int *R4[10];
    for (int g = 0, o = 0; g < 10; o += N4[g], g++) R4[g] = L4 + o;
    ranges r4 = make_ranges(10, P4, N4, R4); /* ten prompts of 2+ responses: the chunked forward's state slots reused */
    t_deltanet(r4, 1, 2, 32, 32, 4);
    free_ranges(r4);
    int P5[80], N5[80], L5[80];
    const int *R5[80];
    for (int g = 0; g < 80; g++) P5[g] = N5[g] = L5[g] = 1, R5[g] = L5 + g;
    ranges r5 = make_ranges(80, P5, N5, R5); /* 160 one-token runs: more chunks than the chunked backward holds */
    t_deltanet(r5, 1, 2, 16, 16, 3);
    free_ranges(r5);
    static const int Lc1[] = {1, 70, 3}, Lc2[] = {2, 5};
    t_deltanet_carry(70, 3, Lc1, 2, 4, 32, 48, 4); /* a response across a checkpoint, one of one token */
    t_deltanet_carry(2, 2, Lc2, 2, 2, 128, 128, 4); /* a prompt shorter than the conv: zeros in its tail */
    t_deltanet_carry(5, 2, Lc2, 1, 3, 16, 16, 2);
    t_gated_attn(333, 8, 2, 256, 64); /* Qwen3.5's full attention: D 256, a quarter rotary */
    t_gated_attn(77, 4, 4, 128, 128);
    t_gated_attn(5, 3, 1, 64, 16);
}

/* ---------------------------------------------------------------- errors */

/* A failed launch is sticky and named: attention with an unsupported head dim. */
static void t_sticky_error(void) {
    eng_backend *b;
    if (backend_cuda_create(&b, 0)) gc_die(NULL, "backend_cuda_create");
    int a[1] = {0};
    attn_ranges r = {a, a, a, a, NULL, NULL, 0};
    b->attention_fwd(b, NULL, NULL, NULL, NULL, NULL, r, 1, 1, 1, 97);
    int rc = b->sync(b);
    const char *msg = err_msg();
    int ok = rc == GE_CUDA && strstr(msg, "head dim 97") && b->sync(b) == GE_CUDA;
    printf("  sticky error: rc=%d msg=\"%s\"\n", rc, msg);
    gc_row("sticky error names the call", "attention D=97", ok ? 0 : 1, 0);
    void *huge = b->alloc(b, (size_t)1 << 50);
    int ok2 = huge == NULL && err_code() == GE_NOMEM;
    printf("  out of memory: \"%s\"\n", err_msg());
    gc_row("alloc 1 PiB -> GE_NOMEM", "-", ok2 ? 0 : 1, 0);
    b->destroy(b);
}

int main(int argc, char **argv) {
    small_run = argc > 1 && !strcmp(argv[1], "small");
    backend_cpu_create(&cpu, 0);
    if (backend_cuda_create(&gpu, 0)) gc_die(NULL, "backend_cuda_create");
    if (argc > 1 && !strcmp(argv[1], "attention")) { /* the attention cases alone */
        attention_suite();
    } else if (argc > 1 && !strcmp(argv[1], "decode")) { /* the decode attention cases alone */
        decode_attention_suite();
    } else if (argc > 1 && !strcmp(argv[1], "exact")) { /* exact-mode attention alone */
        exact_attention_suite();
    } else if (argc > 1 && !strcmp(argv[1], "moe")) { /* the mixture-of-experts cases alone */
        moe_suite();
    } else if (argc > 1 && !strcmp(argv[1], "hybrid")) { /* the linear-attention model's ops alone */
        hybrid_suite();
    } else if (argc > 1 && !strcmp(argv[1], "hybrid-small")) { /* their compute-sanitizer subset */
        hybrid_small();
    } else if (small_run) {
        t_embedding(37, 40, 50);
        t_rmsnorm(19, 136);
        t_qk_norm_rope(7, 3, 64);
        t_qk_norm_rope(5, 2, 48);
        t_matmul(37, 64, 40, 1);
        t_matmul(5, 64, 40, 1);
        {
            static const int odd[] = {200, 72, 136};
            t_matmul_fwd_n(5, 320, 3, odd, MM_BIAS | MM_NORM | MM_RES);
            t_matmul_fwd_n(5, 320, 3, odd, MM_BIAS | MM_NORM | MM_RES | MM_LORA);
            t_matmul_fwd_n(40, 320, 3, odd, MM_RES | MM_LORA);
            t_mlp_in(5, 320, 200, 1, 1);
            t_matmul_fwd_n(5, 4096, 3, odd, MM_NORM | MM_LORA); /* B rows through the cp.async stream */
            t_mlp_in(5, 4096, 200, 1, 1);
        }
        t_rope(7, 3, 64);
        t_elementwise(1001);
        t_moe_shared(37, 200);
        attention_suite();
        decode_attention_suite();
        t_logprob(50, 30, 64, 300, 0.8f, 1);
        t_logprob_top(50, 30, 64, 300, 0.8f, 5);
        t_logprob(50, 130, 64, 300, 1.0f, 1); /* repeated positions */
        t_adamw(999, 2);
        t_moe(40, 100, 6, 3, 36, 1, 1);
        t_moe(77, 200, 16, 4, 72, 0, 1); /* the grouped GEMMs of gemm_grouped.cu under memcheck */
        t_moe_ep_rows(40, 100, 3);
        hybrid_small();
    } else {
        t_embedding(333, 1024, 5000);
        t_embedding(77, 257, 1000);
        t_rmsnorm(333, 1024);
        t_rmsnorm(333 * 8, 128);
        t_rmsnorm(50, 5120);
        t_rmsnorm(2000, 2048); /* the model's widths (1.7B, 8B) */
        t_rmsnorm(777, 4096);
        t_rmsnorm(4000 * 16, 128); /* q norm rows of a long batch */
        t_rmsnorm(37, 1001); /* odd width: scalar path */
        t_rmsnorm_determinism(3000, 2048);
        t_rmsnorm_determinism(3000 * 8, 128);
        t_qk_norm_rope(333, 16, 128);
        t_qk_norm_rope(2000, 8, 128);
        t_qk_norm_rope(77, 6, 64);
        t_qk_norm_rope(50, 4, 32);
        t_qk_norm_rope(50, 4, 16); /* fallback: norm and rope apart */
        t_qk_norm_rope(31, 3, 48);
        t_qkv_rope(16, 16, 8, 128, 1, 1); /* a decode step of Qwen3-1.7B heads */
        t_qkv_rope(37, 4, 2, 64, 0, 1);
        t_qkv_rope(37, 4, 2, 64, 0, 0); /* Llama training: in place */
        t_qkv_rope(21, 4, 4, 32, 1, 0);
        t_qkv_rope(9, 3, 1, 48, 1, 1); /* fallback: the ops apart, k through scratch */
        t_matmul(333, 1024, 768, 1);
        t_matmul(77, 200, 72, 0);
        t_matmul(1000, 2048, 6144, 0);
        /* decode rows (few-row skinny kernel, T <= 64): the model's shapes at Qwen3-1.7B
         * (q/o, k/v, gate/up, down), odd T and O, I not a multiple of 512 */
        t_matmul(1, 2048, 1024, 0);
        t_matmul(16, 2048, 6144, 1);
        t_matmul(13, 6144, 2048, 0);
        t_matmul(32, 1024, 300, 1);
        t_matmul(7, 200, 72, 0);
        {
            static const int Ts[] = {1, 3, 16, 33, 64};
            static const int IO[][2] = {{2048, 2048}, {2048, 1024}, {2048, 6144}, {6144, 2048}};
            for (int i = 0; i < 5; i++)
                for (int j = 0; j < 4; j++) t_matmul_fwd(Ts[i], IO[j][0], IO[j][1], (i + j) % 2);
            t_matmul_fwd(5, 320, 100, 1);
            t_matmul_fwd(64, 192, 1000, 0);
            t_matmul_fwd(17, 4096, 77, 1);
            static const int qkv[] = {2048, 1024, 1024}, gu[] = {6144, 6144}, odd[] = {200, 72, 136};
            t_matmul_fwd_n(16, 2048, 3, qkv, MM_BIAS);
            t_matmul_fwd_n(16, 2048, 3, qkv, MM_NORM); /* a decode step's q/k/v */
            t_matmul_fwd_n(1, 2048, 3, qkv, MM_NORM | MM_BIAS);
            t_matmul_fwd_n(16, 2048, 1, qkv, MM_RES); /* the o projection */
            t_matmul_fwd_n(13, 6144, 1, qkv, MM_RES); /* down, odd T */
            t_matmul_fwd_n(9, 2048, 2, gu, 0);
            t_matmul_fwd_n(5, 320, 3, odd, MM_BIAS | MM_RES | MM_NORM);
            t_matmul_fwd_n(40, 320, 3, odd, 0); /* above the few-row sizes: one GEMM a part */
            t_matmul_fwd_n(40, 320, 3, odd, MM_BIAS | MM_RES | MM_NORM);
            t_matmul_fwd_n(16, 2048, 3, qkv, MM_NORM | MM_LORA); /* LoRA: the term in the few-row epilogue */
            t_matmul_fwd_n(1, 4096, 1, qkv, MM_RES | MM_LORA);
            t_matmul_fwd_n(5, 320, 3, odd, MM_BIAS | MM_RES | MM_LORA);
            t_matmul_fwd_n(40, 320, 3, odd, MM_BIAS | MM_RES | MM_NORM | MM_LORA); /* a second GEMM */
            static const int qkv8[] = {4096, 1024, 1024}, o8[] = {4096};
            t_matmul_fwd_n(16, 4096, 3, qkv8, MM_NORM | MM_LORA); /* Qwen3-8B decode: q/k/v, o, down */
            t_matmul_fwd_n(16, 4096, 1, o8, MM_RES | MM_LORA);
            t_matmul_fwd_n(16, 12288, 1, o8, MM_RES | MM_LORA);
            t_matmul_fwd_n(9, 2048, 2, gu, MM_NORM | MM_LORA);
            static const int qkv32[] = {8192, 1024, 1024}, o32[] = {5120};
            t_matmul_fwd_n(16, 5120, 3, qkv32, MM_NORM); /* Qwen3-32B decode: q/k/v (C = 5120) */
            t_matmul_fwd_n(16, 5120, 3, qkv32, MM_NORM | MM_LORA);
            t_matmul_fwd_n(16, 25600, 1, o32, MM_RES | MM_LORA); /* down (131M values) */
            t_mlp_in(16, 2048, 6144, 1, 0); /* a Qwen3-1.7B decode step */
            t_mlp_in(1, 2048, 6144, 0, 0);
            t_mlp_in(7, 320, 200, 1, 0); /* a partial tile */
            t_mlp_in(40, 320, 136, 1, 0); /* GEMMs, then swiglu_fwd */
            t_mlp_in(16, 4096, 12288, 1, 1); /* LoRA: a Qwen3-8B decode step, adapter tiles in SwiGLU mode */
            t_mlp_in(16, 5120, 25600, 1, 1); /* Qwen3-32B */
            t_mlp_in(3, 320, 200, 1, 2); /* the up projection's term alone, a partial tile */
            t_mlp_in(40, 320, 136, 1, 1); /* LoRA on the GEMMs */
        }
        t_rope(333, 16, 128);
        t_rope(77, 6, 64);
        t_elementwise(1000003);
        t_moe_shared(1000, 2048);
        t_elementwise(1 << 20); /* 16-byte vector path */
        t_elementwise(1000002); /* 4-byte vector path */
        attention_suite();
        decode_attention_suite();
        exact_attention_suite();
        t_logprob(700, 600, 256, 5000, 0.7f, 1);
        t_logprob_top(700, 600, 256, 5000, 0.7f, 20); /* across chunks */
        t_logprob(300, 257, 128, 1003, 1.0f, 0);
        t_logprob(100, 600, 256, 5000, 1.0f, 1); /* repeated positions, across chunks */
        t_adamw(1000003, 5);
        moe_suite();
        hybrid_suite();
        t_sticky_error();
    }
    cpu->destroy(cpu);
    gpu->destroy(gpu);
    printf("%d failed\n", gc_failures);
    return gc_failures ? 1 : 0;
}
