/* bench_split.c — long prompts: one GRPO step (old pass, reference pass, policy
 * forward + loss + backward, grad norm + AdamW) on the CUDA backend with random weights, one
 * group [P; R_1..R_N], for each P given, in each mode of MODES (a comma list; default
 * one-graph,split,offload):
 *   one-graph  the packed layout in one micro-batch (P + NR tokens), as bench_step runs it,
 *              or "out of memory";
 *   split      engine/model/split.h: the prompt once, the responses in micro-batches of at most
 *              MAXTOK response tokens on its cached K/V, the prompt's backward once; the
 *              dormant set on the device when it fits, else through pinned host memory, else
 *              recomputed;
 *   offload    split with the dormant set forced through host memory (at P <= OFFLOAD_MAX):
 *              its step time minus split's is the exposed transfer time;
 *   recompute  split with the dormant set not kept (SPLIT_RECOMPUTE): each layer's input only;
 *   recompute-host  the same with those inputs through host memory (SPLIT_RECOMPUTE_HOST).
 * DIMS: 1.7b (Qwen3-1.7B, tied; the default) or qwen3.5-9b[-lL] (the HF default Qwen3.5 text
 * config on L layers, 32 by default; tests/gpu/gpu_check.h). The optimizer state is in host
 * memory (engine/train/offload.h) with OPT_OFFLOAD=1, the default for qwen3.5-9b.
 * Each: one warm-up step (none with REPS=1), then one timed (phases in ms), and the device peak
 * (a sampling thread reads cudaMemGetInfo every millisecond: memory in use above what this
 * process held at start, i.e. weights, optimizer state and activations) and the host memory
 * pinned for the dormant set and the optimizer's stages. First a table of the predicted bytes
 * (the engine's own activation sizes, model_acts_bytes). Prints a table line per run.
 * Usage: bench_split [DIMS] N R MAXTOK P [P ...]   (OFFLOAD_MAX env, default 16384; PREDICT_ONLY=1:
 * the table alone) */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <time.h>

#include "common/err.h"
#include "engine/model/model.h"
#include "engine/model/pack.h"
#include "engine/model/split.h"
#include "engine/train/offload.h"
#include "tests/gpu/gpu_check.h"

/* ---------------------------------------------------------------- device peak sampler */

static volatile int samp_run;
static volatile size_t samp_peak, samp_base;
static void *sampler(void *arg) {
    cudaSetDevice(0);
    while (samp_run) {
        size_t fr, tot;
        if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && tot - fr > samp_peak) samp_peak = tot - fr;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* ---------------------------------------------------------------- the step */

typedef struct {
    model m;
    eng_backend *be;
    void *w, *wref;
    float *master, *g, *mo, *ve;
    model_views wv, rv, gv;
    size_t n;
    split_mem mem;
    int opt_off; /* master and moments in host memory (engine/train/offload.h) */
    eng_offload off;
} bench;

typedef struct {
    double old, ref, policy, optim, total;
    split_stats st, old_st;
} step_ms;

/* grad norm, clip, AdamW; the step's phase times from the marks t0..t3 and now */
static int optim_step(bench *B, int rep, double t0, double t1, double t2, double t3, step_ms *t) {
    eng_backend *be = B->be;
    double norm = sqrt(be->sumsq(be, B->g, (long long)B->n));
    if (norm > 1.0) be->scale(be, B->g, (long long)B->n, (float)(1.0 / (norm + 1e-6)));
    int rc = 0;
    if (B->opt_off)
        rc = offload_adamw(&B->off, (long long)B->n, B->master, B->mo, B->ve, B->w, B->g, 1e-6f, 0.9f, 0.999f, 1e-8f, 0.01f,
                           rep + 1);
    else be->adamw(be, B->master, B->w, B->g, B->mo, B->ve, (long long)B->n, 1e-6f, 0.9f, 0.999f, 1e-8f, 0.01f, rep + 1);
    if (!rc) rc = be->sync(be);
    double t4 = gc_now();
    t->old = (t1 - t0) * 1e3;
    t->ref = (t2 - t1) * 1e3;
    t->policy = (t3 - t2) * 1e3;
    t->optim = (t4 - t3) * 1e3;
    t->total = (t4 - t0) * 1e3;
    return rc;
}

static int one_graph_step(bench *B, const pack_group *pg, int rep, step_ms *t) {
    eng_backend *be = B->be;
    pack_batch b;
    if (pack_build(&b, pg, 0, 1, PACK_PACKED)) return GE_NOMEM;
    model_acts a;
    int rc = model_acts_init(&B->m, &a, b.T, b.M, 1);
    if (rc) {
        pack_batch_free(&b);
        return rc;
    }
    model_input in;
    model_input_from_batch(&in, &b);
    float *old = malloc((size_t)b.M * 4), *dlogp = malloc((size_t)b.M * 4);
    for (int i = 0; i < b.M; i++) dlogp[i] = (i % 3 - 1) * 1.0f / b.M;
    double t0 = gc_now();
    rc = model_forward(&B->m, &B->wv, &a, NULL, &in, 1.0f, 0);
    if (!rc) rc = be->to_host(be, old, a.logp, (size_t)b.M * 4);
    double t1 = gc_now();
    if (!rc) rc = model_forward(&B->m, &B->rv, &a, NULL, &in, 1.0f, 0);
    double t2 = gc_now();
    be->zero(be, B->g, B->n * 4);
    if (!rc) rc = model_forward(&B->m, &B->wv, &a, NULL, &in, 1.0f, 1);
    if (!rc) rc = model_backward(&B->m, &B->wv, &B->gv, &a, &in, dlogp, NULL, 1.0f);
    double t3 = gc_now();
    if (!rc) rc = optim_step(B, rep, t0, t1, t2, t3, t);
    model_acts_free(&B->m, &a);
    pack_batch_free(&b);
    free(old);
    free(dlogp);
    return rc;
}

static int fixed_loss(void *ud, int r0, int r1) { return 0; } /* dlogp given up front */

static int split_step(bench *B, const pack_group *pg, long long maxtok, int offload, int rep, step_ms *t) {
    eng_backend *be = B->be;
    long long M = 0;
    for (int r = 0; r < pg->N; r++) M += pg->R[r];
    float *old = malloc((size_t)M * 4), *ref = malloc((size_t)M * 4), *lp = malloc((size_t)M * 4), *dlogp = malloc((size_t)M * 4);
    for (long long i = 0; i < M; i++) dlogp[i] = (i % 3 - 1) * 1.0f / M;
    split_opts so = {maxtok, 1.0f, offload, &B->mem};
    double t0 = gc_now();
    int rc = split_forward(&B->m, &B->wv, pg, &so, old, NULL, &t->old_st);
    double t1 = gc_now();
    if (!rc) rc = split_forward(&B->m, &B->rv, pg, &so, ref, NULL, NULL);
    double t2 = gc_now();
    be->zero(be, B->g, B->n * 4);
    if (!rc) rc = split_train(&B->m, &B->wv, &B->gv, pg, &so, lp, NULL, dlogp, NULL, fixed_loss, NULL, &t->st);
    double t3 = gc_now();
    if (!rc) rc = optim_step(B, rep, t0, t1, t2, t3, t);
    free(old);
    free(ref);
    free(lp);
    free(dlogp);
    return rc;
}

enum { M_ONE, M_SPLIT, M_OFFLOAD, M_RECOMPUTE, M_RECOMPUTE_HOST, N_MODES };
static const char *mode_names[N_MODES] = {"one-graph", "split", "split+offload", "split+recompute", "split+recompute-host"};
static const char *mode_keys[N_MODES] = {"one-graph", "split", "offload", "recompute", "recompute-host"};
static const int mode_offload[N_MODES] = {0, -1, SPLIT_HOST, SPLIT_RECOMPUTE, SPLIT_RECOMPUTE_HOST};

/* reps steps (warm-up, timed) of one mode; prints a line. */
static void run(bench *B, const pack_group *pg, long long maxtok, int mode, int reps) {
    step_ms t = {0};
    int rc = 0;
    samp_peak = 0;
    for (int rep = 0; rep < reps && !rc; rep++)
        rc = mode == M_ONE ? one_graph_step(B, pg, rep, &t) : split_step(B, pg, maxtok, mode_offload[mode], rep, &t);
    if (rc) {
        printf("grpod %-15s P=%-6d N=%d R=%d: out of memory (%s)\n", mode_names[mode], pg->P, pg->N, pg->R[0], err_msg());
        /* a failed CUDA call is sticky: say so, the next runs would fail too */
        if (rc == GE_CUDA) {
            printf("cuda error: stopping\n");
            exit(1);
        }
        return;
    }
    double peak = (samp_peak - samp_base) / 1073741824.0;
    double pinned = (B->mem.bytes + (B->opt_off ? (size_t)B->off.chunk * OFFLOAD_STAGES * (4 + 2) : 0)) / 1073741824.0;
    printf("grpod %-15s P=%-6d N=%d R=%d: step %.0f ms (old %.0f ref %.0f policy %.0f optim %.0f) peak %.1f GiB, host "
           "pinned %.1f GiB",
           mode_names[mode], pg->P, pg->N, pg->R[0], t.total, t.old, t.ref, t.policy, t.optim, peak, pinned);
    if (mode)
        printf("; policy phases: prompt fwd %.0f (old pass's, no saves or copies: %.0f), %d response micro-batches %.0f, "
               "prompt bwd %.0f ms; hot %.0f MiB, dormant %.0f MiB%s %s, %d layers of it on the device (pinning it: %.0f "
               "ms, in prompt fwd)",
               t.st.ms_prompt_fwd, t.old_st.ms_prompt_fwd, t.st.n_micro, t.st.ms_resp, t.st.ms_prompt_bwd, t.st.hot_mib,
               t.st.dormant_mib, t.st.recomputed ? " (the layers' inputs; the rest recomputed)" : "",
               t.st.offloaded ? "in pinned host memory" : "on the device", t.st.offloaded ? t.st.ring : B->m.cfg.L,
               t.st.ms_host_alloc);
    printf("\n");
    fflush(stdout);
}

/* The bytes each mode should take at prompt length P, from the engine's activation sizes
 * (model_acts_bytes: the prompt's saved set at T = P with every layer kept or every layer
 * recomputed, a response micro-batch's at MAXTOK) and split.c's hot set; device figures add the
 * weights, reference, gradients (and the optimizer state unless it is on the host). */
static void predict(const bench *B, int P, int N, long long maxtok) {
    const model *m = &B->m;
    const model_config *c = &m->cfg;
    double G = 1073741824.0, eb = m->be->act_bytes, L = c->L, S = P + (double)maxtok;
    double fixed = (double)B->n * (2 + 2 + 4 + (B->opt_off ? 0 : 12)) / G, host = B->opt_off ? B->n * 12.0 / G : 0;
    double full = model_acts_bytes(m, P, N, 1, 0) / G, ck = model_acts_bytes(m, P, N, 1, c->L) / G;
    double x = 2.0 * c->C * P / G, block = (full - ck) / (L - 1) + x; /* one layer's saved set at P */
    double resp = model_acts_bytes(m, (int)maxtok, (int)maxtok, 1, 0) / G;
    double kvrow = (double)model_kv_row_bytes(m), hot = (kvrow * S + kvrow / eb * 4 * P + 2.0 * c->K * c->D * eb * S) / G;
    double dev = full, ring = ck - (L - 1) * x + 2 * block, rec = ck, rech = ck - (L - 3) * x, all = fixed + hot + resp;
    printf("predict P=%-6d GiB: device fixed %.1f + hot %.1f + a response micro-batch %.1f + the prompt's: all kept %.1f "
           "(device %.1f) | via host, 3 layers %.1f (device %.1f; host %.1f pinned + %.1f) | recomputed %.1f (device %.1f) | "
           "recomputed, inputs via host %.1f (device %.1f; host %.1f pinned + %.1f); a layer's saved set %.1f KiB a token, "
           "its input %.1f\n",
           P, fixed, hot, resp, dev, all + dev, ring, all + ring, (L - 3) * block, host, rec, all + rec, rech, all + rech,
           (L - 3) * x, host, block * G / P / 1024, x * G / P / 1024);
}

int main(int argc, char **argv) {
    const char *dims = argc > 1 && (argv[1][0] < '0' || argv[1][0] > '9') ? argv[1] : "1.7b";
    int a0 = dims == argv[1] ? 2 : 1;
    if (argc < a0 + 4) {
        fprintf(stderr, "usage: bench_split [1.7b|qwen3.5-9b[-lL]] N R MAXTOK P [P ...]\n");
        return 2;
    }
    int N = atoi(argv[a0]), R = atoi(argv[a0 + 1]);
    long long maxtok = atoll(argv[a0 + 2]);
    int offload_max = getenv("OFFLOAD_MAX") ? atoi(getenv("OFFLOAD_MAX")) : 16384;
    int reps = getenv("REPS") ? atoi(getenv("REPS")) : 2, hyb = !strncmp(dims, "qwen3.5-9b", 10);
    int modes[N_MODES] = {0}, nm = 0;
    const char *ml = getenv("MODES") ? getenv("MODES") : "one-graph,split,offload";
    for (const char *f = ml; *f; f += *f == ',') {
        size_t n = strcspn(f, ",");
        for (int k = 0; k < N_MODES; k++)
            if (strlen(mode_keys[k]) == n && !strncmp(f, mode_keys[k], n)) nm += modes[k] = 1;
        f += n;
    }
    if (!nm || reps < 1) {
        fprintf(stderr, "MODES: a comma list of one-graph, split, offload, recompute; REPS >= 1\n");
        return 2;
    }
    /* Qwen3-1.7B dims, tied embeddings, as ../shared/bench/peer_step.py builds them; context
     * 131072 (YaRN-extended Qwen3) so that the longest prompts are allowed */
    model_config c = {.arch = ARCH_QWEN3,
                      .L = 28,
                      .C = 2048,
                      .H = 16,
                      .K = 8,
                      .D = 128,
                      .F = 6144,
                      .V = 151936,
                      .max_pos = 1 << 18,
                      .eps = 1e-6f,
                      .rope_theta = 1000000.0f,
                      .qk_norm = 1,
                      .tied = 1,
                      .bos_id = -1};
    snprintf(c.arch_name, sizeof c.arch_name, "qwen3");
    if (hyb) {
        const char *l = strstr(dims, "-l");
        gc_qwen3_5_9b(&c, l ? atoi(l + 2) : 32, 0);
    } else if (strcmp(dims, "1.7b")) {
        fprintf(stderr, "bench_split: unknown dims %s\n", dims);
        return 2;
    }
    bench B;
    memset(&B, 0, sizeof B);
    B.opt_off = getenv("OPT_OFFLOAD") ? atoi(getenv("OPT_OFFLOAD")) : hyb;
    if (backend_cuda_create(&B.be, 0)) gc_die(NULL, "backend_cuda_create");
    eng_backend *be = B.be;
    size_t fr, tot;
    cudaMemGetInfo(&fr, &tot);
    samp_base = tot - fr;
    if (model_init(&B.m, &c, be)) gc_die(be, "model_init");
    size_t n = B.n = (size_t)B.m.n_elems;
    printf("bench_split: %s dims (L=%d C=%d H=%d K=%d D=%d F=%d V=%d%s), %zu parameters, N=%d R=%d, %lld response tokens "
           "per micro-batch, optimizer state %s; device %.1f GiB, %.1f free at start\n",
           hyb ? "Qwen3.5-9B" : "Qwen3-1.7B", c.L, c.C, c.H, c.K, c.D, c.F, c.V,
           hyb ? ", every fourth layer gated attention, the rest gated DeltaNet" : "", n, N, R, maxtok,
           B.opt_off ? "in host memory" : "on the device", tot / 1073741824.0, fr / 1073741824.0);
    for (int a = a0 + 3; a < argc; a++) predict(&B, atoi(argv[a]), N, maxtok);
    fflush(stdout);
    if (getenv("PREDICT_ONLY")) return 0; /* the table alone */
    double t0 = gc_now();
    B.w = be->alloc(be, n * 2);
    B.wref = be->alloc(be, n * 2);
    B.g = be->alloc(be, n * 4);
    if (B.opt_off) {
        B.master = offload_host_alloc((long long)n);
        B.mo = offload_host_alloc((long long)n);
        B.ve = offload_host_alloc((long long)n);
        if (B.master && B.mo && B.ve && offload_init(&B.off, be, (long long)n, 0)) gc_die(be, "offload_init");
    } else {
        B.master = be->alloc(be, n * 4);
        B.mo = be->alloc(be, n * 4);
        B.ve = be->alloc(be, n * 4);
    }
    if (!B.w || !B.wref || !B.master || !B.g || !B.mo || !B.ve) gc_die(be, "weights");
    /* random weights: one 16M-value random block tiled over the master (through g on the way to
     * the bf16 copies when the master is on the host) */
    size_t blk = (size_t)1 << 24;
    float *hb = gc_rand(blk, 0.02f, 7);
    if (B.opt_off) {
#pragma omp parallel for schedule(static)
        for (long long off = 0; off < (long long)n; off += (long long)blk)
            memcpy(B.master + off, hb, ((long long)n - off < (long long)blk ? (size_t)((long long)n - off) : blk) * 4);
    }
    for (size_t off = 0; off < n; off += blk) {
        size_t k = n - off < blk ? n - off : blk;
        if (B.opt_off) {
            if (be->to_dev(be, B.g, hb, k * 4)) gc_die(be, "upload");
            be->f32_to_act(be, (char *)B.w + off * 2, B.g, k);
            be->f32_to_act(be, (char *)B.wref + off * 2, B.g, k);
        } else if (be->to_dev(be, B.master + off, hb, k * 4)) {
            gc_die(be, "upload");
        }
    }
    free(hb);
    if (!B.opt_off) {
        be->f32_to_act(be, B.w, B.master, n);
        be->f32_to_act(be, B.wref, B.master, n);
        be->zero(be, B.mo, n * 4);
        be->zero(be, B.ve, n * 4);
    }
    if (be->sync(be)) gc_die(be, "init");
    printf("init %.1f s\n", gc_now() - t0);
    model_views_make(&B.m, B.w, 2, &B.wv);
    model_views_make(&B.m, B.wref, 2, &B.rv);
    model_views_make(&B.m, B.g, 4, &B.gv);
    pthread_t th;
    samp_run = 1;
    pthread_create(&th, NULL, sampler, NULL);
    for (int a = a0 + 3; a < argc; a++) {
        int P = atoi(argv[a]);
        int *prompt = malloc((size_t)P * 4), **resp = malloc((size_t)N * sizeof(int *)), *Rs = malloc((size_t)N * 4);
        unsigned long long s = 5;
        gc_random_ids(prompt, P, &s);
        for (int r = 0; r < N; r++) {
            Rs[r] = R;
            resp[r] = malloc((size_t)R * 4);
            gc_random_ids(resp[r], R, &s);
        }
        pack_group pg = {.prompt = prompt, .P = P, .N = N, .resp = (const int *const *)resp, .R = Rs};
        for (int k = 0; k < N_MODES; k++)
            if (modes[k] && (k != M_OFFLOAD || P <= offload_max)) run(&B, &pg, maxtok, k, reps);
        for (int r = 0; r < N; r++) free(resp[r]);
        free(resp);
        free(Rs);
        free(prompt);
    }
    samp_run = 0;
    pthread_join(th, NULL);
    split_mem_free(be, &B.mem);
    if (B.opt_off) offload_free(&B.off);
    be->destroy(be);
    return 0;
}
