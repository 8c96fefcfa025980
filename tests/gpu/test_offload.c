/* test_offload.c — the optimizer in host memory on the GPU:
 *   (a) the offloaded optimizer (engine/train/offload.c: gradients down a copy lane, AdamW on the host,
 *       bf16 weights up another lane) against the on-GPU fused AdamW after 3 steps with fresh
 *       gradients each step: master, both moments <= 1e-6 relative (max |diff| / max |ref|, and
 *       relative L2), the bf16 weights within one bf16 step of each other. The two differ only by
 *       nvcc's fused multiply-adds (one fp32 rounding here and there), hence 1e-6, not 0.
 *       n is odd and spans several chunks, so the ring of stages wraps.
 *   (b) activations by budget on a small Qwen3-shaped model: the recompute of a checkpointed
 *       layer reproduces its forward activations bit for bit (0 bytes differ); logprobs with
 *       half and all layers recomputed are bit-equal; gradients within the CUDA contract (1e-2
 *       relative L2). They are bit-equal too since the logprob head's scatter lost its bf16
 *       atomics (ninth session: the spread of two full-activation backwards, printed, went from
 *       0 to 2.6e-3 to 0, and so did the recompute's); the rows keep the contract's tolerance.
 *       A recompute that went wrong is off by O(1) (the cpu test_backward.c shows it).
 *   (c) a split optimizer state (--optimizer-offload FRACTION: the master and moments' first d
 *       elements on the GPU, stepped by its fused AdamW, the rest in host memory, stepped by the
 *       offloaded one) against the state all on the GPU, through the engine (the default model,
 *       one update of one optimizer step on the same gradients): master and moments within (a)'s
 *       1e-6 relative, the bf16 weights within one bf16 step; the GPU's part bit-equal.
 * Prints ROW lines for tests/gpu/run.sh. */
#include <cuda_runtime_api.h>

#include "engine/engine.h"
#include "engine/model/model.h"
#include "engine/train/train_testing.h"
#include "engine/train/offload.h"
#include "engine/model/pack.h"
#include "kernels/adamw.h"
#include "tests/gpu/gpu_check.h"

static double max_rel(const float *a, const float *b, size_t n) {
    double md = 0, mb = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > md || d != d) md = d;
        if (fabs(b[i]) > mb) mb = fabs(b[i]);
    }
    return md / (mb > 0 ? mb : 1);
}

static void offload_vs_gpu(eng_backend *be) {
    const long long n = 5000011, chunk = 1 << 20; /* 5 chunks, 3 stages */
    float *h0 = gc_rand((size_t)n, 0.5f, 11);
    float *master_d = gc_dev(be, h0, (size_t)n * 4), *m_d = be->alloc(be, n * 4), *v_d = be->alloc(be, n * 4);
    float *g_d = be->alloc(be, n * 4);
    void *act_gpu = be->alloc(be, n * 2), *act_off = be->alloc(be, n * 2);
    float *master_h = offload_host_alloc(n), *m_h = offload_host_alloc(n), *v_h = offload_host_alloc(n);
    if (!m_d || !v_d || !g_d || !act_gpu || !act_off || !master_h || !m_h || !v_h) gc_die(be, "alloc");
    memcpy(master_h, h0, (size_t)n * 4);
    be->zero(be, m_d, n * 4);
    be->zero(be, v_d, n * 4);
    eng_offload o;
    if (offload_init(&o, be, n, chunk)) gc_die(be, "offload_init");
    for (int step = 1; step <= 3; step++) {
        float *g = gc_rand((size_t)n, 1e-2f, 100 + step);
        for (long long i = 0; i < n; i += 1009) g[i] *= 50; /* some large gradients */
        if (be->to_dev(be, g_d, g, (size_t)n * 4)) gc_die(be, "grad upload");
        be->adamw(be, master_d, act_gpu, g_d, m_d, v_d, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step);
        if (offload_adamw(&o, n, master_h, m_h, v_h, act_off, g_d, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step) || be->sync(be))
            gc_die(be, "offload_adamw");
        free(g);
    }
    float *pm = gc_get_f32(be, master_d, (size_t)n), *mm = gc_get_f32(be, m_d, (size_t)n), *vm = gc_get_f32(be, v_d, (size_t)n);
    float *ag = gc_get_act(be, act_gpu, (size_t)n), *ao = gc_get_act(be, act_off, (size_t)n);
    char shape[96];
    snprintf(shape, sizeof shape, "n=%lld chunk=%lld, 3 steps", n, chunk);
    gc_row("offload adamw master (max rel)", shape, max_rel(master_h, pm, (size_t)n), 1e-6);
    gc_row("offload adamw master (rel L2)", shape, rel_l2(master_h, pm, (size_t)n), 1e-6);
    gc_row("offload adamw m (max rel)", shape, max_rel(m_h, mm, (size_t)n), 1e-6);
    gc_row("offload adamw v (max rel)", shape, max_rel(v_h, vm, (size_t)n), 1e-6);
    /* bf16 weights: each the rounding of its master; the masters may differ in the last fp32
     * bit, so a few may round to the neighbouring bf16 (one step, 2^-8 relative) */
    double worst = 0;
    long long flips = 0;
    for (long long i = 0; i < n; i++) {
        double d = fabs((double)ao[i] - ag[i]) / (fabs(ag[i]) > 1e-30 ? fabs(ag[i]) : 1e-30);
        if (d > worst) worst = d;
        flips += ao[i] != ag[i];
        if (ao[i] != gc_bf16(master_h[i])) {
            worst = INFINITY;
            break;
        }
    }
    printf("  bf16 weights: %lld of %lld differ (one bf16 step at most: %.2e)\n", flips, n, worst);
    gc_row("offload adamw bf16 weights (max rel)", shape, worst, 7.9e-3);
    gc_row("offload adamw bf16 weights (fraction differing)", shape, (double)flips / n, 1e-4);
    printf("  offload: host AdamW %.1f ms, waiting for copies %.1f ms (last step)\n", o.ms_host, o.ms_wait);
    offload_free(&o);
    free(h0);
    free(pm);
    free(mm);
    free(vm);
    free(ag);
    free(ao);
    free(master_h);
    free(m_h);
    free(v_h);
    void *bufs[] = {master_d, m_d, v_d, g_d, act_gpu, act_off};
    for (int i = 0; i < 6; i++) be->free(be, bufs[i]);
}

static void recompute_vs_full(eng_backend *be) {
    model_config c = {.arch = ARCH_QWEN3,
                      .L = 6,
                      .C = 512,
                      .H = 8,
                      .K = 4,
                      .D = 64,
                      .F = 1536,
                      .V = 4096,
                      .max_pos = 4096,
                      .eps = 1e-6f,
                      .rope_theta = 1000000.0f,
                      .qk_norm = 1,
                      .tied = 1,
                      .bos_id = -1};
    snprintf(c.arch_name, sizeof c.arch_name, "qwen3");
    model m;
    if (model_init(&m, &c, be)) gc_die(be, "model_init");
    size_t n = (size_t)m.n_elems;
    float *h = gc_rand(n, 0.05f, 3);
    for (int i = 0; i < m.n_params; i++)
        if (m.params[i].ndim == 1)
            for (long long j = 0; j < m.params[i].numel; j++) h[m.params[i].off + j] += 1.0f;
    void *w = gc_act(be, h, n);
    model_views wv;
    model_views_make(&m, w, 2, &wv);
    int P = 300, N = 4, Rl = 120, *prompt = malloc((size_t)P * 4), **resp = malloc((size_t)N * sizeof(int *)), Rs[4];
    unsigned long long s = 9;
    for (int i = 0; i < P; i++) prompt[i] = (int)((check_randf(&s, 0.5f) + 0.5f) * 4000);
    for (int r = 0; r < N; r++) {
        Rs[r] = Rl - 17 * r;
        resp[r] = malloc((size_t)Rl * 4);
        for (int i = 0; i < Rl; i++) resp[r][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * 4000);
    }
    pack_group pg = {.prompt = prompt, .P = P, .N = N, .resp = (const int *const *)resp, .R = Rs};
    pack_batch b;
    if (pack_build(&b, &pg, 0, 1, PACK_PACKED)) gc_die(NULL, "pack_build");
    model_input in;
    model_input_from_batch(&in, &b);
    float *dl = gc_rand((size_t)b.M, 1.0f / b.M, 21), *grad[4], *lp[4];
    /* runs: full, full again (the CUDA backward's own run-to-run spread), half and all of the
     * layers recomputed */
    const int ck[4] = {0, 0, 3, 6};
    for (int k = 0; k < 4; k++) {
        float *g_d = be->alloc(be, n * 4);
        model_views gv;
        model_views_make(&m, g_d, 4, &gv);
        be->zero(be, g_d, n * 4);
        model_acts a;
        size_t budget = ck[k] ? model_acts_bytes(&m, b.T, b.M, 1, ck[k]) : 0;
        if (model_acts_init_budget(&m, &a, b.T, b.M, budget) || a.n_ckpt != ck[k]) gc_die(be, "acts");
        if (model_forward(&m, &wv, &a, NULL, &in, 1.0f, 0)) gc_die(be, "forward");
        lp[k] = gc_get_f32(be, a.logp, (size_t)b.M);
        if (ck[k] == 3) {
            /* the shared set holds layer 2's activations after the forward: recompute them and
             * compare bit for bit (what the backward relies on) */
            struct model_layer_acts *A = &a.l[2];
            size_t T = (size_t)b.T, HD = (size_t)c.H * c.D, KD = (size_t)c.K * c.D;
            struct {
                void *p;
                size_t bytes;
            } f[] = {{A->q0, T * HD * 2}, {A->k0, T * KD * 2},   {A->q, T * HD * 2},      {A->k, T * KD * 2},
                     {A->v, T * KD * 2},  {A->att, T * HD * 2},  {A->xm, T * c.C * 2},    {A->g, T * c.F * 2},
                     {A->u, T * c.F * 2}, {A->lse, T * c.H * 4}, {A->rstdq, T * c.H * 4}, {A->rstdk, T * c.K * 4}};
            int nf = (int)(sizeof f / sizeof f[0]);
            long long dif = 0;
            char *before[12];
            for (int i = 0; i < nf; i++) {
                before[i] = malloc(f[i].bytes);
                if (be->sync(be) || be->to_host(be, before[i], f[i].p, f[i].bytes)) gc_die(be, "download");
            }
            model_dev_input d;
            if (model_input_upload(&m, &a, &in, &d)) gc_die(be, "upload");
            model_layer_fwd(&m, &wv, &a, 2, NULL, &d, NULL, NULL);
            for (int i = 0; i < nf; i++) {
                char *after = malloc(f[i].bytes);
                if (be->sync(be) || be->to_host(be, after, f[i].p, f[i].bytes)) gc_die(be, "download");
                for (size_t j = 0; j < f[i].bytes; j++) dif += before[i][j] != after[j];
                free(after);
                free(before[i]);
            }
            char shape[96];
            snprintf(shape, sizeof shape, "L=6 T=%d, layer 2 of 3 checkpointed", b.T);
            gc_row("recompute == forward (bytes differing)", shape, (double)dif, 0);
        }
        if (model_backward(&m, &wv, &gv, &a, &in, dl, NULL, 1.0f)) gc_die(be, "backward");
        grad[k] = gc_get_f32(be, g_d, n);
        model_acts_free(&m, &a);
        model_views_free(&gv);
        be->free(be, g_d);
    }
    double spread = rel_l2(grad[1], grad[0], n);
    printf("  full vs full again: rel L2 of grads %.2e (the backward's own spread)\n", spread);
    for (int k = 2; k < 4; k++) {
        long long dif = 0;
        for (int i = 0; i < b.M; i++) dif += memcmp(&lp[0][i], &lp[k][i], 4) != 0;
        char shape[96];
        snprintf(shape, sizeof shape, "L=6 T=%d, %d layers recomputed", b.T, ck[k]);
        gc_row("recompute: logprobs (values differing)", shape, (double)dif, 0);
        double e = rel_l2(grad[k], grad[0], n);
        printf("  recompute %d layers: rel L2 of grads %.2e\n", ck[k], e);
        gc_row("recompute: grads (rel L2)", shape, e, 1e-2);
    }
    for (int k = 0; k < 4; k++) {
        free(grad[k]);
        free(lp[k]);
    }
    pack_batch_free(&b);
    be->free(be, w);
    model_views_free(&wv);
    model_free(&m);
    free(h);
    free(dl);
    free(prompt);
}

#define SPLIT_MODEL "/tmp/grpod_gpu_offload_split_model"

/* One update (one group, one mini-batch: one optimizer step) on an engine opened with `offload`;
 * its master, m, v and act weights as host fp32 (n each, malloc'd into out[4]). */
static void split_run(const char *offload, long long n, float *out[4]) {
    static const int prompt[] = {71, 114, 97, 100, 105, 101, 110, 116, 115, 32, 103, 111, 32, 100, 111, 119, 110, 58};
    static const int ra[] = {49, 50, 51, 10}, rb[] = {97, 98, 99, 100, 101, 102}, rc_[] = {33, 63}, rd[] = {111, 107, 46, 32};
    static const int *resp[4] = {ra, rb, rc_, rd};
    static int R[4] = {4, 6, 2, 4};
    static float rew[4] = {1.0f, 0.0f, 0.7f, 0.2f};
    loss_config a;
    eng_optim opt;
    loss_config_default(&a);
    eng_optim_default(&opt);
    a.kl_coef = 0.01f, opt.lr = 2e-3f;
    eng *e;
    eng_open_opts o = {.model_dir = SPLIT_MODEL, .backend = "cuda", .optimizer_offload = offload};
    if (eng_open(&o, &e)) gc_die(NULL, "eng_open (split)");
    eng_info in;
    eng_get_info(e, &in);
    printf("  optimizer_offload %s: plan optimizer %s, host state %lld bytes\n", offload, in.plan.optimizer, in.plan.host_state);
    eng_update_group g = {.prompt = prompt, .P = 18, .n = 4, .resp = resp, .R = R, .reward = rew};
    eng_update_result u;
    if (eng_update(e, &g, 1, &a, &opt, 1 << 20, &u, NULL, NULL) || u.optimizer_steps != 1) gc_die(NULL, "eng_update (split)");
    for (int i = 0; i < 4; i++)
        if (!(out[i] = malloc((size_t)n * 4))) gc_die(NULL, "alloc");
    if (eng_testing_state(e, out[0], out[1], out[2]) || eng_testing_weights(e, out[3])) gc_die(NULL, "state (split)");
    eng_close(e);
}

static void split_vs_device(void) {
    if (eng_ensure_default_model(SPLIT_MODEL)) gc_die(NULL, "default model");
    eng *e;
    eng_open_opts o = {.model_dir = SPLIT_MODEL, .backend = "cuda", .optimizer_offload = "off", .no_training = 1};
    if (eng_open(&o, &e)) gc_die(NULL, "eng_open");
    eng_testing_info ti;
    eng_testing_get(e, &ti);
    long long n = ti.n_params, d = ti.m->params[1].off + ti.m->params[1].numel / 3; /* inside the second tensor */
    eng_close(e);
    char frac[24];
    snprintf(frac, sizeof frac, "%.12g", (double)(n - d) / (double)n);
    float *dev[4], *spl[4], *again[4];
    split_run("off", n, dev);
    split_run("off", n, again); /* the update's own run-to-run spread: 0 when it is deterministic */
    long long spread = 0;
    for (int i = 0; i < 4; i++) {
        spread += memcmp(again[i], dev[i], (size_t)n * 4) != 0;
        free(again[i]);
    }
    printf("  device vs device again: %lld of 4 arrays differ (the floor of the rows below)\n", spread);
    split_run(frac, n, spl);
    char shape[96];
    snprintf(shape, sizeof shape, "default model, d=%lld of n=%lld, 1 step", d, n);
    static const char *names[3] = {"split vs device master (max rel)", "split vs device m (max rel)",
                                   "split vs device v (max rel)"};
    long long dev_part_diff = 0, flips = 0;
    for (int i = 0; i < 3; i++) {
        gc_row(names[i], shape, max_rel(spl[i], dev[i], (size_t)n), 1e-6);
        dev_part_diff += memcmp(spl[i], dev[i], (size_t)d * 4) != 0;
    }
    gc_row("split vs device: GPU part (arrays differing)", shape, (double)dev_part_diff, 0);
    double worst = 0;
    for (long long i = 0; i < n; i++) {
        double r = fabs((double)spl[3][i] - dev[3][i]) / (fabs(dev[3][i]) > 1e-30 ? fabs(dev[3][i]) : 1e-30);
        if (r > worst) worst = r;
        flips += spl[3][i] != dev[3][i];
    }
    printf("  split vs device bf16 weights: %lld of %lld differ (%.2e)\n", flips, n, worst);
    gc_row("split vs device bf16 weights (max rel)", shape, worst, 7.9e-3);
    gc_row("split vs device bf16 weights (fraction differing)", shape, (double)flips / n, 1e-4);
    for (int i = 0; i < 4; i++) {
        free(dev[i]);
        free(spl[i]);
    }
}

int main(void) {
    eng_backend *be;
    if (backend_cuda_create(&be, 0)) gc_die(NULL, "backend_cuda_create");
    offload_vs_gpu(be);
    recompute_vs_full(be);
    be->destroy(be);
    split_vs_device();
    printf("test_offload: %d failed\n", gc_failures);
    return gc_failures ? 1 : 0;
}
