/* bench_lora.c — LoRA GRPO on the CUDA backend at Qwen3-8B or Qwen3-32B dims with random bf16
 * base weights made in-process (untied lm head, as the real checkpoints), rank r adapters on
 * all seven projections (A random, B random small: a trained adapter's cost), through the
 * engine as the daemon runs it:
 *   update: eng_update on one group P + N·R (on-policy: no old pass; kl_coef > 0: the reference
 *     pass, which is the base with the adapters off), median of 3 after a warm-up; phases,
 *     device memory in use after the step (allocations persist, so this is the peak), whether
 *     the layers were recomputed (activations of every layer did not fit), and MFU: useful
 *     FLOPs = reference forward + policy forward + policy backward without the base's
 *     weight-gradient GEMMs (input gradients: one forward's linear FLOPs; attention backward:
 *     2x its forward) + the adapters' own FLOPs; a recomputed forward is not counted. Against
 *     989 TFLOP/s (H100/H200 dense bf16) and the 793 TFLOP/s bf16 GEMM rate measured earlier
 *     (docs/benchmarks.md);
 *   decode: eng_rollout of one group (P prompt tokens, N responses, NEW tokens, temperature 1,
 *     ignore_eos), ms per decode step (median) with the adapters and without them (the same
 *     engine, base views; graphs rebuilt), and the HBM floor per step: bf16 weights (+ the
 *     adapters when on) + KV over the copy bandwidth measured here. The timed rollouts sit
 *     between cudaProfilerStart/Stop, so `nsys profile --capture-range=cudaProfilerApi
 *     --capture-range-end=repeat` writes one report each (with adapters, then without).
 * Usage: bench_lora [--decode-only] [8b|32b] [r] [P N R] [DP DN NEW] (--decode-only: no update) */
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include "common/clock.h"
#include "engine/rollout/decode.h"
#include "engine/engine_internal.h"
#include "engine/model/lora.h"
#include "tests/gpu/gpu_check.h"

typedef struct {
    double *t;
    int n, cap;
} stamps;
static void on_progress(void *ud, double frac) {
    stamps *s = ud;
    if (s->n < s->cap) s->t[s->n++] = clock_mono_ms();
}

/* An engine of random bf16 base weights (one 16M-value block tiled on the device) with
 * adapters: the state eng_open makes with --lora-rank. */
static eng *lora_engine(const model_config *c, int r) {
    eng *e = calloc(1, sizeof *e);
    e->W = 1; /* one rank, as eng_open sets it without a comm */
    if (backend_cuda_create(&e->be, 0)) gc_die(NULL, "backend_cuda_create");
    eng_backend *be = e->be;
    if (model_init(&e->m, c, be) || lora_init(&e->m, r, 2.0f * r, (1u << LORA_N) - 1)) gc_die(be, "model_init");
    size_t n = (size_t)e->m.n_elems, blk = (size_t)1 << 24, nl = (size_t)e->m.l_elems;
    e->w_act = be->alloc(be, n * 2);
    if (!e->w_act) gc_die(be, "weights");
    float *hb = gc_rand(blk, 0.02f, 7);
    if (be->act_from_f32(be, e->w_act, hb, blk)) gc_die(be, "upload");
    for (size_t off = blk; off < n; off += blk)
        cudaMemcpy((char *)e->w_act + off * 2, e->w_act, (n - off < blk ? n - off : blk) * 2, cudaMemcpyDeviceToDevice);
    free(hb);
    float *hl = malloc(nl * 4);
    lora_init_host(&e->m, hl, 11);
    unsigned long long s = 12;
    for (size_t i = (size_t)e->m.l_elems_a; i < nl; i++) hl[i] = check_randf(&s, 1e-3f);
    e->lora_master = be->alloc(be, nl * 4);
    e->lora_act = be->alloc(be, nl * 2);
    e->lora_sink = be->alloc(be, 8192 * 4);
    if (!e->lora_master || !e->lora_act || !e->lora_sink || be->to_dev(be, e->lora_master, hl, nl * 4) ||
        be->act_from_f32(be, e->lora_act, hl, nl))
        gc_die(be, "adapters");
    free(hl);
    model_views_make(&e->m, e->w_act, 2, &e->wv);
    model_views_make(&e->m, e->w_act, 2, &e->rv);
    lora_views(&e->m, e->lora_act, 2, &e->wv);
    snprintf(e->model_dir, sizeof e->model_dir, "random");
    return e;
}

static size_t in_use(void) {
    size_t fr, tot;
    cudaMemGetInfo(&fr, &tot);
    return tot - fr;
}

static void bench_update(eng *e, const char *size, int P, int N, int R) {
    const model_config *c = &e->m.cfg;
    int *prompt = malloc((size_t)P * 4), **resp = malloc((size_t)N * sizeof(int *)), *Rs = malloc((size_t)N * 4);
    float *rew = malloc((size_t)N * 4);
    unsigned long long s = 5;
    gc_random_ids(prompt, P, &s);
    for (int r = 0; r < N; r++) {
        Rs[r] = R;
        rew[r] = (float)(r % 4) / 3.0f;
        resp[r] = malloc((size_t)R * 4);
        gc_random_ids(resp[r], R, &s);
    }
    eng_update_group g = {.prompt = prompt, .P = P, .n = N, .resp = (const int *const *)resp, .R = Rs, .reward = rew};
    loss_config a;
    loss_config_default(&a);
    a.kl_coef = 0.001f;
    eng_optim o;
    eng_optim_default(&o);
    o.lr = 1e-5f;
    enum { REPS = 3 };
    double t[REPS + 1][4];
    size_t peak = 0;
    for (int rep = 0; rep <= REPS; rep++) {
        eng_update_result u;
        if (eng_update(e, &g, 1, &a, &o, (long long)P + (long long)N * R, &u, NULL, NULL)) gc_die(e->be, "eng_update");
        t[rep][0] = u.ms_total;
        t[rep][1] = u.ms_ref;
        t[rep][2] = u.ms_policy;
        t[rep][3] = u.ms_optimizer;
        size_t used = in_use();
        if (used > peak) peak = used;
        fprintf(stderr, "rep %d: total %.0f ref %.0f policy %.0f optim %.0f ms (old %.0f) grad norm %.3g kl %.3g\n", rep,
                u.ms_total, u.ms_ref, u.ms_policy, u.ms_optimizer, u.ms_old, u.grad_norm, u.kl);
    }
    double med[4];
    for (int k = 0; k < 4; k++) {
        double v[REPS];
        for (int r = 0; r < REPS; r++) v[r] = t[r + 1][k];
        qsort(v, REPS, sizeof(double), gc_cmpd);
        med[k] = v[REPS / 2];
    }
    double L = c->L, C = c->C, H = c->H, K = c->K, D = c->D, F = c->F, rk = e->m.lora_r;
    double T = P + (double)N * R, M = (double)N * R;
    double nonemb = L * (C * H * D + 2.0 * C * K * D + H * D * C + 3.0 * C * F);
    double att = L * (2.0 * P * P * H * D + 4.0 * N * R * (P + R / 2.0) * H * D);
    double lin = 2 * nonemb * T + 2.0 * C * c->V * M;
    double io = L * ((C + H * D) + 2 * (C + K * D) + (H * D + C) + 2 * (C + F) + (F + C)); /* sum of I + O over targets */
    double adapters = 6.0 * T * rk * io; /* fwd 2 T r (I + O), bwd 4 T r (I + O) */
    double useful = (lin + att) + (lin + att) + (lin + 2 * att) + adapters;
    double s_tot = med[0] * 1e-3;
    printf("grpod-cuda lora %s r=%d P=%d N=%d R=%d T=%.0f: update %.0f ms (ref %.0f, policy fwd+bwd %.0f, optimizer %.1f; "
           "no old pass: on-policy), device memory in use %.1f GiB, layers %s\n",
           size, e->m.lora_r, P, N, R, T, med[0], med[1], med[2], med[3], peak / 1073741824.0,
           e->acts_g.grad == MODEL_ACTS_RECOMPUTE ? "recomputed in the backward (stored inputs only)" : "all stored");
    printf("grpod-cuda lora %s: useful %.1f TFLOP (base fwd ref + fwd + input-grad bwd, adapters; no base weight-grad "
           "GEMMs) -> %.0f TFLOP/s, MFU %.1f%% of 989 (%.1f%% of the measured 793 GEMM rate)\n",
           size, useful / 1e12, useful / s_tot / 1e12, useful / s_tot / 989e12 * 100, useful / s_tot / 793e12 * 100);
    for (int r = 0; r < N; r++) free(resp[r]);
    free(resp);
    free(prompt);
    free(Rs);
    free(rew);
}

static double decode_ms(eng *e, int P, int N, int NEW, double *prefill) {
    int *prompt = malloc((size_t)P * 4);
    unsigned long long s = 9;
    gc_random_ids(prompt, P, &s);
    eng_rollout_group g = {prompt, P, N};
    eng_sampling sp;
    eng_sampling_default(&sp);
    sp.temperature = 1.0f;
    sp.ignore_eos = 1;
    sp.seed = 1234;
    eng_group_result res;
    stamps st = {malloc((size_t)(NEW + 8) * sizeof(double)), 0, NEW + 8};
    dec_free(e); /* graphs are captured anew for these views */
    sp.max_tokens = 8;
    if (eng_rollout(e, &g, 1, &sp, &res, NULL, NULL)) gc_die(e->be, "warm-up rollout");
    eng_group_result_free(&res);
    sp.max_tokens = NEW;
    double t0 = clock_mono_ms();
    cudaProfilerStart(); /* the timed rollout alone (nsys --capture-range=cudaProfilerApi: kernels per step) */
    if (eng_rollout(e, &g, 1, &sp, &res, on_progress, &st)) gc_die(e->be, "rollout");
    cudaProfilerStop();
    eng_group_result_free(&res);
    int nd = st.n - 1;
    double *d = malloc((size_t)(nd > 0 ? nd : 1) * sizeof(double));
    for (int i = 0; i < nd; i++) d[i] = st.t[i + 1] - st.t[i];
    qsort(d, (size_t)nd, sizeof(double), gc_cmpd);
    double med = nd > 0 ? d[nd / 2] : 0;
    *prefill = st.t[0] - t0;
    free(d);
    free(st.t);
    free(prompt);
    return med;
}

int main(int argc, char **argv) {
    int decode_only = argc > 1 && !strcmp(argv[1], "--decode-only");
    if (decode_only) {
        argv[1] = argv[0];
        argv++;
        argc--;
    }
    const char *size = argc > 1 ? argv[1] : "8b";
    int r = argc > 2 ? atoi(argv[2]) : 32;
    int P = argc > 5 ? atoi(argv[3]) : 4096, N = argc > 5 ? atoi(argv[4]) : 16, R = argc > 5 ? atoi(argv[5]) : 512;
    int DP = argc > 8 ? atoi(argv[6]) : 1024, DN = argc > 8 ? atoi(argv[7]) : 16, NEW = argc > 8 ? atoi(argv[8]) : 128;
    model_config c = {.arch = ARCH_QWEN3,
                      .L = 36,
                      .C = 4096,
                      .H = 32,
                      .K = 8,
                      .D = 128,
                      .F = 12288,
                      .V = 151936,
                      .max_pos = 40960,
                      .eps = 1e-6f,
                      .rope_theta = 1000000.0f,
                      .qk_norm = 1,
                      .tied = 0,
                      .bos_id = -1};
    if (!strcmp(size, "32b")) {
        c.L = 64;
        c.C = 5120;
        c.H = 64;
        c.F = 25600;
    }
    snprintf(c.arch_name, sizeof c.arch_name, "qwen3");
    snprintf(c.dtype, sizeof c.dtype, "bfloat16");
    double bw = copy_bw();
    eng *e = lora_engine(&c, r);
    printf("grpod-cuda lora %s: %.2f B base parameters (bf16 %.1f GiB), %.1f M adapter parameters (r=%d, all seven "
           "targets), device memory in use after load %.1f GiB\n",
           size, e->m.n_elems / 1e9, e->m.n_elems * 2 / 1073741824.0, e->m.l_elems / 1e6, r, in_use() / 1073741824.0);
    fflush(stdout);
    if (!decode_only) bench_update(e, size, P, N, R);
    fflush(stdout);
    /* decode: with adapters, then the base alone (same engine) */
    model_views with = e->wv, base;
    model_views_make(&e->m, e->w_act, 2, &base);
    double pf_a, pf_b;
    double ms_a = decode_ms(e, DP, DN, NEW, &pf_a);
    e->wv = base;
    double ms_b = decode_ms(e, DP, DN, NEW, &pf_b);
    e->wv = with;
    double kv = 2.0 * c.L * c.K * c.D * 2 * ((double)DP + (double)DN * NEW / 2);
    double wb = 2.0 * e->m.n_elems, lb = 2.0 * e->m.l_elems;
    double floor_a = (wb + lb + kv) / bw * 1e3, floor_b = (wb + kv) / bw * 1e3;
    printf("grpod-cuda lora %s decode P=%d N=%d new=%d: with adapters %.2f ms/step, without %.2f ms/step -> %.3fx "
           "(target <= 1.15x); prefill %.1f / %.1f ms\n",
           size, DP, DN, NEW, ms_a, ms_b, ms_a / ms_b, pf_a, pf_b);
    printf("grpod-cuda lora %s decode: HBM floor %.2f ms/step with adapters (%.2f without) at the measured %.2f TB/s "
           "copy bandwidth: with adapters %.2fx the floor\n",
           size, floor_a, floor_b, bw / 1e12, ms_a / floor_a);
    printf("ROW|lora decode with / without adapters|%s P=%d N=%d|%.3f|1.15|%s\n", size, DP, DN, ms_a / ms_b,
           ms_a / ms_b <= 1.15 ? "PASS" : "FAIL");
    return 0;
}
