/* test_lora.c — LoRA on CUDA against the CPU backend (engine/model/lora.h):
 *   (a) model level, random Qwen3-shaped model with bf16-rounded weights and adapters on all
 *       seven targets (B nonzero), packed groups: logprobs and adapter gradients (frozen base)
 *       CUDA vs CPU, rel L2 <= 1e-2 (test_model.c's contract), each adapter tensor <= 2e-2;
 *       recomputed layers (MODEL_ACTS_RECOMPUTE) vs stored on the GPU: logprobs bit for bit,
 *       gradients <= 1e-2 (the CUDA contract's tolerance); B = 0 vs the base
 *       <= 1e-6;
 *   (b) engine level on the embedded default model (cuda): fresh adapters give the base's
 *       logprobs, three updates leave the reference (the base) exactly as it was, rollouts
 *       decode with the adapters (their logprobs vs the training path's, mean |d| <= 1e-2; other
 *       tokens than the base's under the same seed), graphs == no graphs token for token;
 *   (c) writes the adapter as a PEFT checkpoint plus tokens and grpod's logprobs (cuda, and cpu
 *       after loading the adapter with --lora-init) to OUT/peft_case.json for
 *       tests/gpu/peft_roundtrip.py (transformers + peft on the same files);
 *   (d) the experts' adapters (kernels/moe_lora.cu) in the expert op, CUDA vs CPU (t_moe_lora).
 * Usage: test_lora [OUT_DIR] */
#include <sys/stat.h>

#include "engine/engine.h"
#include "engine/engine_testing.h"
#include "engine/model/lora.h"
#include "engine/model/model.h"
#include "engine/model/pack.h"
#include "kernels/moe.h"
#include "tests/gpu/gpu_check.h"

#define MODEL "/tmp/grpod_gpu_lora_model"

/* ---------------------------------------------------------------- (a) model level */

typedef struct {
    eng_backend *be;
    model m;
    void *w, *lw;
    float *lg, *sink;
    model_views wv, gv, bv;
} lrun;

static void lrun_init(lrun *r, eng_backend *be, const model_config *c, const float *w, const float *lw, int rank) {
    memset(r, 0, sizeof *r);
    r->be = be;
    if (model_init(&r->m, c, be) || lora_init(&r->m, rank, 2.0f * rank, (1u << LORA_N) - 1)) gc_die(be, "init");
    size_t n = (size_t)r->m.n_elems, nl = (size_t)r->m.l_elems;
    r->w = be->alloc(be, n * be->act_bytes);
    r->lw = be->alloc(be, nl * be->act_bytes);
    r->lg = be->alloc(be, nl * 4);
    r->sink = be->alloc(be, 4096 * 4);
    if (!r->w || !r->lw || !r->lg || !r->sink || be->act_from_f32(be, r->w, w, n) || be->act_from_f32(be, r->lw, lw, nl))
        gc_die(be, "weights");
    model_views_make(&r->m, r->w, (size_t)be->act_bytes, &r->wv);
    model_views_make(&r->m, r->w, (size_t)be->act_bytes, &r->bv);
    lora_views(&r->m, r->lw, (size_t)be->act_bytes, &r->wv);
    if (lora_grad_views(&r->m, r->lg, r->sink, &r->gv)) gc_die(be, "grad views");
}

static void lrun_free(lrun *r) {
    eng_backend *be = r->be;
    model_views_free(&r->wv);
    model_views_free(&r->gv);
    model_views_free(&r->bv);
    be->free(be, r->w);
    be->free(be, r->lw);
    be->free(be, r->lg);
    be->free(be, r->sink);
    model_free(&r->m);
}

/* forward (logp to host) and, with dlogp, backward (adapter gradients to host) */
static void lrun_step(lrun *r, const model_views *w, const pack_batch *b, int grad, const float *dlogp, float *logp, float *lgrad) {
    eng_backend *be = r->be;
    model_acts a;
    model_input in;
    model_input_from_batch(&in, b);
    if (model_acts_init(&r->m, &a, b->T, b->M, grad)) gc_die(be, "model_acts_init");
    if (model_forward(&r->m, w, &a, NULL, &in, 1.0f, 0)) gc_die(be, "model_forward");
    if (be->to_host(be, logp, a.logp, (size_t)b->M * 4)) gc_die(be, "logp");
    if (dlogp) {
        be->zero(be, r->lg, (size_t)r->m.l_elems * 4);
        if (model_backward(&r->m, w, &r->gv, &a, &in, dlogp, NULL, 1.0f)) gc_die(be, "model_backward");
        if (be->to_host(be, lgrad, r->lg, (size_t)r->m.l_elems * 4)) gc_die(be, "grad");
    }
    model_acts_free(&r->m, &a);
}

static void model_level(void) {
    model_config c = {.arch = ARCH_QWEN3,
                      .L = 2,
                      .C = 256,
                      .H = 4,
                      .K = 2,
                      .D = 64,
                      .F = 512,
                      .V = 1000,
                      .max_pos = 4096,
                      .eps = 1e-6f,
                      .rope_theta = 1000000.0f,
                      .qk_norm = 1,
                      .bos_id = -1};
    snprintf(c.arch_name, sizeof c.arch_name, "qwen3");
    eng_backend *cpu, *gpu;
    backend_cpu_create(&cpu, 0);
    if (backend_cuda_create(&gpu, 0)) gc_die(NULL, "backend_cuda_create");
    int rank = 16;
    model t;
    model_init(&t, &c, cpu);
    lora_init(&t, rank, 2.0f * rank, (1u << LORA_N) - 1);
    size_t n = (size_t)t.n_elems, nl = (size_t)t.l_elems;
    float *w = gc_rand(n, 0.15f, 3001), *lw = gc_rand(nl, 0.1f, 3002);
    lrun rc, rg;
    lrun_init(&rc, cpu, &c, w, lw, rank);
    lrun_init(&rg, gpu, &c, w, lw, rank);
    /* groups: P = 40, 7, 96 with N = 8, 1, 3, ragged R */
    unsigned long long s = 3003;
    int P[3] = {40, 7, 96}, N[3] = {8, 1, 3}, *bufs[64], nb = 0;
    pack_group pg[3];
    for (int g = 0; g < 3; g++) {
        int *prompt = malloc((size_t)P[g] * 4), **resp = malloc((size_t)N[g] * sizeof(int *)), *R = malloc((size_t)N[g] * 4);
        for (int i = 0; i < P[g]; i++) prompt[i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (c.V - 1));
        for (int i = 0; i < N[g]; i++) {
            R[i] = i == 0 ? 1 : 2 + (int)((check_randf(&s, 0.5f) + 0.5f) * 40);
            resp[i] = malloc((size_t)R[i] * 4);
            for (int j = 0; j < R[i]; j++) resp[i][j] = (int)((check_randf(&s, 0.5f) + 0.5f) * (c.V - 1));
            bufs[nb++] = resp[i];
        }
        bufs[nb++] = prompt;
        bufs[nb++] = R;
        bufs[nb++] = (int *)resp;
        pg[g] = (pack_group){.prompt = prompt, .P = P[g], .N = N[g], .resp = (const int *const *)resp, .R = R};
    }
    pack_batch b;
    if (pack_build(&b, pg, 0, 3, PACK_PACKED)) gc_die(NULL, "pack_build");
    int M = b.M;
    float *dlogp = gc_rand((size_t)M, 1.0f / M, 3004);
    float *lp_c = malloc((size_t)M * 4), *lp_g = malloc((size_t)M * 4), *lp_r = malloc((size_t)M * 4),
          *lp_b = malloc((size_t)M * 4), *lp_0 = malloc((size_t)M * 4);
    float *g_c = malloc(nl * 4), *g_g = malloc(nl * 4), *g_r = malloc(nl * 4);
    lrun_step(&rc, &rc.wv, &b, 1, dlogp, lp_c, g_c);
    lrun_step(&rg, &rg.wv, &b, 1, dlogp, lp_g, g_g);
    /* recompute vs stored: the forward is the same ops (logprobs bit for bit); the backward is
     * not deterministic on the GPU (logprob_bwd scatters the head's input gradient with bf16
     * atomics where one row feeds N predictions), so its gradients agree to the bf16 contract */
    lrun_step(&rg, &rg.wv, &b, MODEL_ACTS_RECOMPUTE, dlogp, lp_r, g_r);
    char sh[128];
    snprintf(sh, sizeof sh, "qwen3 L=2 C=256 r=%d all targets T=%d M=%d", rank, b.T, M);
    gc_row("lora logprobs cuda vs cpu", sh, rel_l2(lp_g, lp_c, (size_t)M), 1e-2);
    gc_row("lora adapter gradients cuda vs cpu", sh, rel_l2(g_g, g_c, nl), 1e-2);
    double worst = 0;
    const char *wname = "";
    for (int i = 0; i < rc.m.n_lparams; i++) {
        const model_param *p = &rc.m.lparams[i];
        double e = rel_l2(g_g + p->off, g_c + p->off, (size_t)p->numel);
        if (!(e <= worst)) {
            worst = e;
            wname = p->name;
        }
    }
    printf("  worst adapter tensor %s rel L2 %.3e\n", wname, worst);
    gc_row("lora worst adapter tensor grad", sh, worst, 2e-2);
    gc_row("lora recompute vs stored (gpu) logprobs", sh, rel_l2(lp_r, lp_g, (size_t)M), 0);
    gc_row("lora recompute vs stored (gpu) adapter grads", sh, rel_l2(g_r, g_g, nl), 1e-2);
    /* B = 0: the base's logprobs */
    float *lw0 = gc_copy(lw, nl);
    memset(lw0 + rg.m.l_elems_a, 0, (nl - (size_t)rg.m.l_elems_a) * 4);
    if (gpu->act_from_f32(gpu, rg.lw, lw0, nl)) gc_die(gpu, "B = 0");
    lrun_step(&rg, &rg.wv, &b, 0, NULL, lp_0, NULL);
    lrun_step(&rg, &rg.bv, &b, 0, NULL, lp_b, NULL);
    gc_row("lora B=0 vs base (gpu)", sh, rel_l2(lp_0, lp_b, (size_t)M), 1e-6);
    lrun_free(&rc);
    lrun_free(&rg);
    model_free(&t);
    pack_batch_free(&b);
    for (int i = 0; i < nb; i++) free(bufs[i]);
    free(w);
    free(lw);
    free(lw0);
    free(dlogp);
    free(lp_c);
    free(lp_g);
    free(lp_r);
    free(lp_b);
    free(lp_0);
    free(g_c);
    free(g_g);
    free(g_r);
    cpu->destroy(cpu);
    gpu->destroy(gpu);
}

/* ---------------------------------------------------------------- (b, c) engine level */

static eng *open_eng(const char *backend, int rank, const char *init) {
    eng *e;
    eng_open_opts o = {.model_dir = MODEL, .backend = backend, .lora_rank = rank, .lora_alpha = rank ? 16 : 0, .lora_init = init};
    if (eng_open(&o, &e)) gc_die(NULL, "eng_open");
    return e;
}

static double max_abs(float **a, float **b, const int *R, int n, double *mean) {
    double w = 0, s = 0;
    long long k = 0;
    for (int r = 0; r < n; r++)
        for (int t = 0; t < R[r]; t++, k++) {
            double d = fabs(a[r][t] - b[r][t]);
            s += d;
            if (d > w) w = d;
        }
    if (mean) *mean = s / (k ? k : 1);
    return w;
}

static const int prompt[] = {72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100};
#define NP ((int)(sizeof prompt / sizeof prompt[0]))

static void engine_level(const char *out) {
    if (eng_ensure_default_model(MODEL)) gc_die(NULL, "default model");
    eng *e0 = open_eng("cuda", 0, NULL), *e = open_eng("cuda", 8, NULL);
    int good[6] = {65, 66, 67, 68, 69, 70}, bad[5] = {97, 98, 99, 100, 101}, mid[4] = {48, 49, 50, 51};
    const int *resp[3] = {good, bad, mid};
    int R[3] = {6, 5, 4};
    float rew[3] = {1.0f, 0.0f, 0.5f};
    eng_update_group g = {.prompt = prompt, .P = NP, .n = 3, .resp = resp, .R = R, .reward = rew};
    float **base, **fresh, **after, **ref;
    if (eng_logprobs(e0, &g, 1, 0, 1.0f, 1 << 20, &base) || eng_logprobs(e, &g, 1, 0, 1.0f, 1 << 20, &fresh))
        gc_die(NULL, "logprobs");
    gc_row("engine cuda: fresh adapters (B=0) vs base, max |d logp|", "default model r=8", max_abs(fresh, base, R, 3, NULL), 1e-6);
    loss_config a;
    loss_config_default(&a);
    a.kl_coef = 0.05f;
    eng_optim o;
    eng_optim_default(&o);
    o.lr = 3e-3f;
    eng_update_result u;
    for (int i = 0; i < 3; i++)
        if (eng_update(e, &g, 1, &a, &o, 1 << 20, &u, NULL, NULL)) gc_die(NULL, "eng_update");
    if (eng_logprobs(e, &g, 1, 0, 1.0f, 1 << 20, &after) || eng_logprobs(e, &g, 1, 1, 1.0f, 1 << 20, &ref))
        gc_die(NULL, "logprobs");
    double moved = 0;
    for (int t = 0; t < R[0]; t++) moved += after[0][t] - base[0][t];
    printf("  3 updates: good response's sum logprob moved %+.3f, kl %.4f\n", moved, u.kl);
    gc_row("engine cuda: updates move the good response up (-moved)", "default model r=8", -moved, -0.5);
    gc_row("engine cuda: reference (base, adapters off) after updates vs base, max |d|", "default model r=8",
           max_abs(ref, base, R, 3, NULL), 0);

    /* rollouts with adapters, graphs and not */
    eng_rollout_group rg = {prompt, NP, 4};
    eng_sampling sp;
    eng_sampling_default(&sp);
    sp.max_tokens = 24;
    sp.seed = 5;
    sp.ignore_eos = 1;
    eng_group_result ga, gb, g0;
    if (eng_rollout(e, &rg, 1, &sp, &ga, NULL, NULL) || eng_rollout(e0, &rg, 1, &sp, &g0, NULL, NULL)) gc_die(NULL, "rollout");
    eng_testing_tune(e)->graphs = 0;
    if (eng_rollout(e, &rg, 1, &sp, &gb, NULL, NULL)) gc_die(NULL, "rollout");
    eng_testing_tune(e)->graphs = 1;
    int same_graph = 1, differs_base = 0;
    double msum = 0;
    long long mk = 0;
    for (int r = 0; r < 4; r++) {
        eng_response *x = &ga.resp[r], *y = &gb.resp[r], *z = &g0.resp[r];
        same_graph &= x->n_tokens == y->n_tokens && !memcmp(x->tokens, y->tokens, (size_t)x->n_tokens * 4);
        differs_base |= x->n_tokens != z->n_tokens || memcmp(x->tokens, z->tokens, (size_t)x->n_tokens * 4);
        const int *rr[1] = {x->tokens};
        eng_update_group ug = {.prompt = prompt, .P = NP, .n = 1, .resp = rr, .R = &x->n_tokens};
        float **lp;
        if (eng_logprobs(e, &ug, 1, 0, 1.0f, 1 << 20, &lp)) gc_die(NULL, "logprobs");
        for (int t = 0; t < x->n_tokens; t++, mk++) msum += fabs(lp[0][t] - x->logprobs[t]);
        eng_logprobs_free(lp, &ug, 1);
    }
    gc_row("engine cuda: rollout vs training logprobs with adapters, mean |d|", "default model r=8 N=4 24 tokens",
           msum / (mk ? mk : 1), 1e-2);
    gc_row("engine cuda: decode graphs vs no graphs with adapters (0 = same tokens)", "N=4 24 tokens", !same_graph, 0);
    gc_row("engine cuda: adapters change the rollout (0 = other tokens than the base)", "same seed", !differs_base, 0);

    /* (c) PEFT artefacts */
    char ck[1024], path[1100];
    snprintf(ck, sizeof ck, "%s/peft_adapter", out);
    snprintf(path, sizeof path, "rm -rf %s", ck);
    if (system(path)) gc_die(NULL, "rm");
    if (eng_checkpoint_save(e, ck)) gc_die(NULL, "checkpoint");
    eng *ec = open_eng("cpu", 0, ck);
    float **cpu_lp;
    if (eng_logprobs(ec, &g, 1, 0, 1.0f, 1 << 20, &cpu_lp)) gc_die(NULL, "cpu logprobs");
    snprintf(path, sizeof path, "%s/peft_case.json", out);
    FILE *f = fopen(path, "w");
    if (!f) gc_die(NULL, "peft_case.json");
    fprintf(f, "{\"base\": \"%s\", \"adapter\": \"%s\", \"prompt\": [", MODEL, ck);
    for (int i = 0; i < NP; i++) fprintf(f, "%s%d", i ? ", " : "", prompt[i]);
    fprintf(f, "], \"responses\": [");
    for (int r = 0; r < 3; r++) {
        fprintf(f, "%s[", r ? ", " : "");
        for (int t = 0; t < R[r]; t++) fprintf(f, "%s%d", t ? ", " : "", resp[r][t]);
        fprintf(f, "]");
    }
    const char *names[2] = {"grpod_cuda", "grpod_cpu"};
    float **vals[2] = {after, cpu_lp};
    for (int k = 0; k < 2; k++) {
        fprintf(f, "], \"%s\": [", names[k]);
        for (int r = 0; r < 3; r++) {
            fprintf(f, "%s[", r ? ", " : "");
            for (int t = 0; t < R[r]; t++) fprintf(f, "%s%.9g", t ? ", " : "", vals[k][r][t]);
            fprintf(f, "]");
        }
    }
    fprintf(f, "]}\n");
    fclose(f);
    printf("  wrote %s\n", path);
    eng_logprobs_free(cpu_lp, &g, 1);
    eng_logprobs_free(base, &g, 1);
    eng_logprobs_free(fresh, &g, 1);
    eng_logprobs_free(after, &g, 1);
    eng_logprobs_free(ref, &g, 1);
    eng_group_result_free(&ga);
    eng_group_result_free(&gb);
    eng_group_result_free(&g0);
    eng_close(ec);
    eng_close(e);
    eng_close(e0);
}

/* ---------------------------------------------------------------- (d) the experts' adapters */

/* The expert op with adapters (kernels/moe.h moe_lora, kernels/moe_lora.cu) CUDA vs CPU on the
 * same routes (random distinct experts per token, random weights): eg, eu, ey, out, then the
 * backward with the base frozen as LoRA runs it: dx, dg, du, dtopw and the four adapter
 * gradients ("+=" onto random starts, compared as increments; dx's start is small, 0.01, since
 * dx is bf16 on the GPU: a start of 0.5 rounded twice moved T = 1's small increment by 9.8e-2). Tolerance 1e-2 rel L2 as the
 * dense ops through bf16 activations. Then the backward twice from the same state: the same bits
 * (no atomics). Edge shapes: T = 1, an expert no slot chose (E > T·k), gate_up alone. */
static void t_moe_lora(int T, int C, int E, int k, int Fm, int r, int with_down, int variant) {
    char sh[112];
    snprintf(sh, sizeof sh, "T=%d C=%d E=%d k=%d Fm=%d r=%d%s %s", T, C, E, k, Fm, r, with_down ? "" : " gate_up only",
             variant == TUNE_MOE_GROUPED ? "grouped" : "tiles");
    eng_backend *cpu, *gpu;
    backend_cpu_create(&cpu, 0);
    if (backend_cuda_create(&gpu, 0)) gc_die(NULL, "backend_cuda_create");
    gpu->tune.moe = variant; /* grouped: gemm_grouped.cu where the ranks and widths are multiples of 8, else tiles */
    int rg = 2 * r, rd = r;
    size_t nx = (size_t)T * C, nk = (size_t)T * k, nw = (size_t)E * Fm * C;
    size_t nag = (size_t)E * rg * C, nbg = (size_t)E * 2 * Fm * rg, nad = (size_t)E * rd * Fm, nbd = (size_t)E * C * rd;
    unsigned long long sd = 900 + (unsigned long long)T * 7 + (unsigned long long)E;
    float *x = gc_rand(nx, 2.0f, sd), *res = gc_rand(nx, 1.0f, sd + 1), *dout = gc_rand(nx, 1.0f, sd + 2);
    float *wg = gc_rand(nw, 0.1f, sd + 3), *wu = gc_rand(nw, 0.1f, sd + 4), *wd = gc_rand(nw, 0.1f, sd + 5);
    float *ag = gc_rand(nag, 0.1f, sd + 6), *bg = gc_rand(nbg, 0.1f, sd + 7), *ad = gc_rand(nad, 0.1f, sd + 8);
    float *bd = gc_rand(nbd, 0.1f, sd + 9), *tw = gc_rand(nk, 0.5f, sd + 10), *dx0 = gc_rand(nx, 0.01f, sd + 11);
    float *g0[4] = {gc_rand(nag, 1.0f, sd + 12), gc_rand(nbg, 1.0f, sd + 13), gc_rand(nad, 1.0f, sd + 14),
                    gc_rand(nbd, 1.0f, sd + 15)};
    size_t gn[4] = {nag, nbg, nad, nbd};
    int *ti = malloc(nk * sizeof(int));
    unsigned long long s = sd + 16;
    for (int t = 0; t < T; t++) /* k distinct experts, from the lower half when E > 2k: some stay unchosen */
        for (int j = 0; j < k; j++) {
            int e, dup;
            do {
                e = (int)((check_randf(&s, 0.5f) + 0.5f) * (E > 2 * k ? E / 2 : E)) % E;
                dup = 0;
                for (int i = 0; i < j; i++) dup |= ti[t * k + i] == e;
            } while (dup);
            ti[t * k + j] = e;
        }
    /* CPU */
    float *eg_c = malloc(nk * Fm * 4), *eu_c = malloc(nk * Fm * 4), *ey_c = malloc(nk * C * 4), *o_c = malloc(nx * 4);
    float *dx_c = gc_copy(dx0, nx), *dtw_c = malloc(nk * 4), *dg_c = malloc(nk * Fm * 4), *du_c = malloc(nk * Fm * 4), *gc[4];
    for (int i = 0; i < 4; i++) gc[i] = gc_copy(g0[i], gn[i]);
    moe_lora lc = {ag, bg, with_down ? ad : NULL, with_down ? bd : NULL, rg, rd, gc[0], gc[1], gc[2], gc[3]};
    cpu->moe_experts_fwd(cpu, o_c, eg_c, eu_c, ey_c, x, res, ti, tw, wg, wu, wd, T, C, E, k, Fm, &lc);
    cpu->moe_experts_bwd(cpu, dx_c, NULL, NULL, NULL, dtw_c, dg_c, du_c, dout, x, ti, tw, eg_c, eu_c, ey_c, wg, wu, wd, T, C, E,
                         k, Fm, &lc);
    /* GPU */
    void *gx = gc_act(gpu, x, nx), *gres = gc_act(gpu, res, nx), *gdout = gc_act(gpu, dout, nx), *gdx = gc_act(gpu, dx0, nx);
    void *gwg = gc_act(gpu, wg, nw), *gwu = gc_act(gpu, wu, nw), *gwd = gc_act(gpu, wd, nw);
    void *gag = gc_act(gpu, ag, nag), *gbg = gc_act(gpu, bg, nbg), *gad = gc_act(gpu, ad, nad), *gbd = gc_act(gpu, bd, nbd);
    int *gti = gc_dev(gpu, ti, nk * sizeof(int));
    float *gtw = gc_dev(gpu, tw, nk * 4), *gdtw = gpu->alloc(gpu, nk * 4), *gg[4], *gg2[4];
    for (int i = 0; i < 4; i++) gg[i] = gc_dev(gpu, g0[i], gn[i] * 4), gg2[i] = gc_dev(gpu, g0[i], gn[i] * 4);
    void *geg = gpu->alloc(gpu, nk * Fm * 2), *geu = gpu->alloc(gpu, nk * Fm * 2), *gey = gpu->alloc(gpu, nk * C * 2);
    void *gout = gpu->alloc(gpu, nx * 2), *gdg = gpu->alloc(gpu, nk * Fm * 2), *gdu = gpu->alloc(gpu, nk * Fm * 2);
    void *gdx2 = gc_act(gpu, dx0, nx);
    moe_lora lg = {gag, gbg, with_down ? gad : NULL, with_down ? gbd : NULL, rg, rd, gg[0], gg[1], gg[2], gg[3]};
    gpu->moe_experts_fwd(gpu, gout, geg, geu, gey, gx, gres, gti, gtw, gwg, gwu, gwd, T, C, E, k, Fm, &lg);
    gc_moe_fwd_rows(gpu, "moe_lora_fwd", sh, (void *[4]){geg, geu, gey, gout}, (const float *[4]){eg_c, eu_c, ey_c, o_c}, nk, Fm,
                    C, nx);
    gpu->moe_experts_bwd(gpu, gdx, NULL, NULL, NULL, gdtw, gdg, gdu, gdout, gx, gti, gtw, geg, geu, gey, gwg, gwu, gwd, T, C, E,
                         k, Fm, &lg);
    float *dx_g = gc_get_act(gpu, gdx, nx), *dtw_g = gc_get_f32(gpu, gdtw, nk), *dg_g = gc_get_act(gpu, gdg, nk * Fm);
    float *du_g = gc_get_act(gpu, gdu, nk * Fm);
    gc_row("moe_lora_bwd dtopw", sh, rel_l2(dtw_g, dtw_c, nk), 1e-2);
    gc_row("moe_lora_bwd dgate", sh, rel_l2(dg_g, dg_c, nk * Fm), 1e-2);
    gc_row("moe_lora_bwd dup", sh, rel_l2(du_g, du_c, nk * Fm), 1e-2);
    gc_row("moe_lora_bwd dinp", sh, gc_rel_delta(dx_g, dx0, dx_c, dx0, nx), 1e-2);
    static const char *gname[4] = {"moe_lora_bwd dA gate_up", "moe_lora_bwd dB gate_up", "moe_lora_bwd dA down",
                                   "moe_lora_bwd dB down"};
    float *got[4];
    for (int i = 0; i < 4; i++) {
        got[i] = gc_get_f32(gpu, gg[i], gn[i]);
        if (with_down || i < 2) gc_row(gname[i], sh, gc_rel_delta(got[i], g0[i], gc[i], g0[i], gn[i]), 1e-2);
    }
    lg.gagu = gg2[0], lg.gbgu = gg2[1], lg.gad = gg2[2], lg.gbd = gg2[3];
    gpu->moe_experts_bwd(gpu, gdx2, NULL, NULL, NULL, gdtw, gdg, gdu, gdout, gx, gti, gtw, geg, geu, gey, gwg, gwu, gwd, T, C, E,
                         k, Fm, &lg);
    float *dx_2 = gc_get_act(gpu, gdx2, nx);
    int differ = memcmp(dx_2, dx_g, nx * 4) != 0;
    for (int i = 0; i < 4; i++) {
        float *again = gc_get_f32(gpu, gg2[i], gn[i]);
        differ |= memcmp(again, got[i], gn[i] * 4) != 0;
        free(again);
        free(got[i]);
        free(gc[i]);
        free(g0[i]);
        gpu->free(gpu, gg[i]);
        gpu->free(gpu, gg2[i]);
    }
    gc_row("moe_lora_bwd twice: outputs differ", sh, differ, 0);
    void *dev[] = {gx, gres, gdout, gdx, gdx2, gwg, gwu, gwd, gag, gbg, gad, gbd, gti, gtw, gdtw, geg, geu, gey, gout, gdg, gdu};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) gpu->free(gpu, dev[i]);
    float *host[] = {x,    res,  dout, wg,   wu,    wd,   ag,   bg,   ad,    bd,   tw,   dx0, eg_c,
                     eu_c, ey_c, o_c,  dx_c, dtw_c, dg_c, du_c, dx_g, dtw_g, dg_g, du_g, dx_2};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
    free(ti);
    gpu->destroy(gpu);
    cpu->destroy(cpu);
}

static void moe_level(void) {
    static const int vs[] = {TUNE_MOE_TILES, TUNE_MOE_GROUPED};
    for (int v = 0; v < 2; v++) {
        t_moe_lora(1, 64, 8, 2, 48, 4, 1, vs[v]); /* grouped: rd = 4 is not a multiple of 8, tiles run */
        t_moe_lora(37, 128, 16, 4, 96, 8, 1, vs[v]); /* ragged tiles; E > 2k: experts 8..15 unchosen */
        t_moe_lora(200, 256, 8, 2, 128, 16, 1, vs[v]);
        t_moe_lora(50, 128, 8, 2, 64, 4, 0, vs[v]);
        t_moe_lora(300, 256, 16, 4, 136, 8, 1, vs[v]); /* several row tiles an expert, Fm past a tile */
    }
}

int main(int argc, char **argv) {
    const char *out = argc > 1 ? argv[1] : "build/gpu/logs";
    mkdir(out, 0755);
    model_level();
    moe_level();
    engine_level(out);
    printf("%d failed\n", gc_failures);
    return gc_failures ? 1 : 0;
}
