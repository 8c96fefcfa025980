/* bench_split.c — long prompts: one GRPO step (old pass, reference pass, policy
 * forward + loss + backward, grad norm + AdamW) on the CUDA backend at Qwen3-1.7B dims with
 * random weights, one group [P; R_1..R_N], for each P given:
 *   one-graph  the packed layout in one micro-batch (P + NR tokens), as bench_step runs it,
 *              or "out of memory";
 *   split      engine/model/split.h: the prompt once, the responses in micro-batches of at most
 *              MAXTOK response tokens on its cached K/V, the prompt's backward once; the
 *              dormant set on the device when it fits, else through pinned host memory;
 *   offload    split with the dormant set forced through host memory (at P <= OFFLOAD_MAX):
 *              its step time minus split's is the exposed transfer time.
 * Each: one warm-up step, then one timed (phases in ms), and the device peak (a sampling
 * thread reads cudaMemGetInfo every millisecond: memory in use above what this process held
 * at start, i.e. weights, optimizer state and activations). Prints a table line per run.
 * Usage: bench_split N R MAXTOK P [P ...]   (OFFLOAD_MAX env, default 16384) */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <time.h>

#include "common/err.h"
#include "engine/model/model.h"
#include "engine/model/pack.h"
#include "engine/model/split.h"
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
    be->adamw(be, B->master, B->w, B->g, B->mo, B->ve, (long long)B->n, 1e-6f, 0.9f, 0.999f, 1e-8f, 0.01f, rep + 1);
    int rc = be->sync(be);
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

/* Two steps (warm-up, timed) of one mode; prints a line. mode: 0 one-graph, 1 split, 2 offload. */
static void run(bench *B, const pack_group *pg, long long maxtok, int mode) {
    static const char *names[] = {"one-graph", "split", "split+offload"};
    step_ms t = {0};
    int rc = 0;
    samp_peak = 0;
    for (int rep = 0; rep < 2 && !rc; rep++)
        rc = mode == 0 ? one_graph_step(B, pg, rep, &t) : split_step(B, pg, maxtok, mode == 2 ? 1 : -1, rep, &t);
    if (rc) {
        printf("grpod %-13s P=%-6d N=%d R=%d: out of memory (%s)\n", names[mode], pg->P, pg->N, pg->R[0], err_msg());
        /* a failed CUDA call is sticky: say so, the next runs would fail too */
        if (rc == GE_CUDA) {
            printf("cuda error: stopping\n");
            exit(1);
        }
        return;
    }
    double peak = (samp_peak - samp_base) / 1073741824.0;
    printf("grpod %-13s P=%-6d N=%d R=%d: step %.0f ms (old %.0f ref %.0f policy %.0f optim %.0f) peak %.1f GiB", names[mode],
           pg->P, pg->N, pg->R[0], t.total, t.old, t.ref, t.policy, t.optim, peak);
    if (mode)
        printf("; policy phases: prompt fwd %.0f (old pass's, no saves or copies: %.0f), %d response micro-batches %.0f, "
               "prompt bwd %.0f ms; hot %.0f MiB, dormant %.0f MiB %s, %d layers of it on the device (pinning it: %.0f ms, "
               "in prompt fwd)",
               t.st.ms_prompt_fwd, t.old_st.ms_prompt_fwd, t.st.n_micro, t.st.ms_resp, t.st.ms_prompt_bwd, t.st.hot_mib,
               t.st.dormant_mib, t.st.offloaded ? "in pinned host memory" : "on the device",
               t.st.offloaded ? t.st.ring : B->m.cfg.L, t.st.ms_host_alloc);
    printf("\n");
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: bench_split N R MAXTOK P [P ...]\n");
        return 2;
    }
    int N = atoi(argv[1]), R = atoi(argv[2]);
    long long maxtok = atoll(argv[3]);
    int offload_max = getenv("OFFLOAD_MAX") ? atoi(getenv("OFFLOAD_MAX")) : 16384;
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
    bench B;
    memset(&B, 0, sizeof B);
    if (backend_cuda_create(&B.be, 0)) gc_die(NULL, "backend_cuda_create");
    eng_backend *be = B.be;
    size_t fr, tot;
    cudaMemGetInfo(&fr, &tot);
    samp_base = tot - fr;
    if (model_init(&B.m, &c, be)) gc_die(be, "model_init");
    size_t n = B.n = (size_t)B.m.n_elems;
    B.w = be->alloc(be, n * 2);
    B.wref = be->alloc(be, n * 2);
    B.master = be->alloc(be, n * 4);
    B.g = be->alloc(be, n * 4);
    B.mo = be->alloc(be, n * 4);
    B.ve = be->alloc(be, n * 4);
    if (!B.w || !B.wref || !B.master || !B.g || !B.mo || !B.ve) gc_die(be, "weights");
    size_t blk = (size_t)1 << 24;
    float *hb = gc_rand(blk, 0.02f, 7);
    for (size_t off = 0; off < n; off += blk)
        if (be->to_dev(be, B.master + off, hb, (n - off < blk ? n - off : blk) * 4)) gc_die(be, "upload");
    free(hb);
    be->f32_to_act(be, B.w, B.master, n);
    be->f32_to_act(be, B.wref, B.master, n);
    be->zero(be, B.mo, n * 4);
    be->zero(be, B.ve, n * 4);
    model_views_make(&B.m, B.w, 2, &B.wv);
    model_views_make(&B.m, B.wref, 2, &B.rv);
    model_views_make(&B.m, B.g, 4, &B.gv);
    pthread_t th;
    samp_run = 1;
    pthread_create(&th, NULL, sampler, NULL);
    printf("bench_split: Qwen3-1.7B dims (L=28 C=2048 H=16 K=8 F=6144 V=151936), N=%d R=%d, %lld response tokens "
           "per micro-batch\n",
           N, R, maxtok);
    for (int a = 4; a < argc; a++) {
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
        run(&B, &pg, maxtok, 0);
        run(&B, &pg, maxtok, 1);
        if (P <= offload_max) run(&B, &pg, maxtok, 2);
        for (int r = 0; r < N; r++) free(resp[r]);
        free(resp);
        free(Rs);
        free(prompt);
    }
    samp_run = 0;
    pthread_join(th, NULL);
    split_mem_free(be, &B.mem);
    be->destroy(be);
    return 0;
}
