/* bench_rollout.c — eng_rollout on the CUDA backend with random weights (no checkpoint, no
 * tokenizer): G groups of one P-token prompt each, N responses per group, `new` tokens each,
 * temperature 1, ignore_eos, Qwen3 dims with tied embeddings as ../shared/bench/peer_rollout.py
 * builds them. Times prefill (start to the first progress callback: prompt prefill + first
 * sample) and the decode steps (between consecutive progress callbacks, which rollout.c calls
 * after each step's sampling), after a short warm-up rollout. Prints ms per decode step
 * (median and mean), tokens/s, and the HBM floor per step: bf16 weights + KV (each prompt's KV
 * once, each response's own KV at its mean length) over the device-to-device copy bandwidth
 * measured here (bytes read + written by cudaMemcpy), and at the 3.0 TB/s.
 * 8b: Qwen3-8B dims (36 layers, 4096, 32 / 8 heads, 12288), untied: the floor leaves out the
 * embedding table (a step reads G·N of its rows).
 * 30b-a3b[-lL]: Qwen3-30B-A3B dims (48 layers, or L), untied head, 128 experts top-8: the floor
 * counts the non-expert weights and the experts a step is expected to touch when G·N rows each
 * pick 8 of 128 uniformly (E (1 - (1 - k/E)^rows) per layer; random weights route near uniformly).
 * qwen3.5-9b[-d128][-lL]: the HF default Qwen3.5 text config (gc_qwen3_5_9b, 32 layers or L): the
 * floor counts the weights but the embedding table (untied: a step reads G·N of its rows), the
 * gated layers' KV (K 4 x D 256) and each response's fp32 recurrent state in every DeltaNet layer,
 * read and written (Hv·Dk·Dv·4 B twice a row a layer; the conv tails are a few KB).
 * Usage: bench_rollout [0.6b|1.7b|8b|30b-a3b[-lL]|qwen3.5-9b[-d128][-lL]] [G P N new]
 *        bench_rollout 1.7b graphs: the graph-validity check (ROW line; exit 1 on a mismatch)
 *        bench_rollout gemm: the few-row GEMMs of a Qwen3-1.7B decode step (and the lm head), the
 *        skinny kernel of matmul.cu vs cuBLASLt's tuned choice (tune.skinny = 0), us per call
 *        (a CUDA graph of 40 calls over weight copies that do not fit in L2) and GB/s of W.
 * Last, every model: the sampled tokens' logprobs against eng_logprobs' (the training forward). */
#include <cuda_runtime_api.h>

#include "common/clock.h"
#include "engine/rollout/decode.h"
#include "engine/engine_internal.h"
#include "tests/gpu/gpu_check.h"

typedef struct {
    double *t;
    int n, cap;
} stamps;
static void on_progress(void *ud, double frac) {
    stamps *s = ud;
    if (s->n < s->cap) s->t[s->n++] = clock_mono_ms();
}

/* us per matmul_fwd (T, I, O): 40 calls captured in one graph, each on another copy of W
 * (together > L2; in_l2: all on one copy, which stays in L2: the latency part), median of 5
 * replays. */
static double gemm_us(eng_backend *be, char *wbuf, size_t wcap, void *x, void *y, int T, int I, int O, int in_l2) {
    size_t wb = (size_t)O * I * 2;
    int ncopy = (int)(wcap / wb);
    if (ncopy > 40) ncopy = 40;
    if (in_l2) ncopy = 1;
    be->matmul_fwd(be, y, x, wbuf, NULL, T, I, O); /* plans, tuning: uncaptured */
    void *g = NULL;
    if (be->sync(be) || be->graph_begin(be)) gc_die(be, "gemm capture");
    for (int i = 0; i < 40; i++) be->matmul_fwd(be, y, x, wbuf + (size_t)(i % ncopy) * wb, NULL, T, I, O);
    if (be->graph_end(be, &g)) gc_die(be, "gemm capture end");
    double t[5];
    for (int r = 0; r < 6; r++) {
        double t0 = clock_mono_ms();
        if (be->graph_launch(be, g) || be->sync(be)) gc_die(be, "gemm replay");
        if (r) t[r - 1] = (clock_mono_ms() - t0) * 1e3 / 40;
    }
    be->graph_free(be, g);
    qsort(t, 5, sizeof(double), gc_cmpd);
    return t[2];
}

static int bench_gemm(void) {
    eng_backend *be;
    if (backend_cuda_create(&be, 0)) gc_die(NULL, "backend_cuda_create");
    size_t wcap = (size_t)1 << 30;
    char *w = be->alloc(be, wcap);
    void *x = be->alloc(be, (size_t)64 * 6144 * 2), *y = be->alloc(be, (size_t)64 * 151936 * 2);
    if (!w || !x || !y) gc_die(be, "alloc");
    float *hb = gc_rand((size_t)1 << 24, 0.02f, 3);
    for (size_t off = 0; off < wcap / 2; off += (size_t)1 << 24) be->act_from_f32(be, w + off * 2, hb, (size_t)1 << 24);
    be->act_from_f32(be, x, hb, (size_t)64 * 6144);
    free(hb);
    static const int IO[][2] = {{2048, 2048}, {2048, 1024}, {2048, 6144}, {6144, 2048}, {2048, 151936}};
    static const int Ts[] = {1, 16, 64};
    for (int j = 0; j < 5; j++)
        for (int i = 0; i < 3; i++) {
            int T = Ts[i], I = IO[j][0], O = IO[j][1];
            be->tune.skinny = TUNE_SKINNY_OFF;
            double lt = gemm_us(be, w, wcap, x, y, T, I, O, 0);
            be->tune.skinny = TUNE_SKINNY_FORCE;
            double sk = gemm_us(be, w, wcap, x, y, T, I, O, 0), skl = gemm_us(be, w, wcap, x, y, T, I, O, 1);
            double gb = (double)O * I * 2 / 1e3;
            printf("gemm T=%-3d I=%-5d O=%-6d  cuBLASLt %7.2f us (%5.0f GB/s)  skinny %7.2f us (%5.0f GB/s), "
                   "W in L2 %7.2f us  floor@3.0TB/s %6.2f us\n",
                   T, I, O, lt, gb / lt, sk, gb / sk, skl, gb / 3.0e3);
        }
    be->tune.skinny = TUNE_SKINNY_AUTO;
    be->destroy(be);
    return 0;
}

/* An engine of random bf16 weights (one 16M-value random block tiled over the buffer). */
static eng *random_engine(const model_config *c) {
    eng *e = calloc(1, sizeof *e);
    if (backend_cuda_create(&e->be, 0)) gc_die(NULL, "backend_cuda_create");
    eng_backend *be = e->be;
    if (model_init(&e->m, c, be)) gc_die(be, "model_init");
    size_t n = (size_t)e->m.n_elems;
    e->w_act = be->alloc(be, n * 2);
    if (!e->w_act) gc_die(be, "weights");
    size_t blk = (size_t)1 << 24;
    float *hb = gc_rand(blk, 0.02f, 7);
    for (size_t off = 0; off < n; off += blk)
        if (be->act_from_f32(be, (char *)e->w_act + off * 2, hb, n - off < blk ? n - off : blk)) gc_die(be, "upload");
    free(hb);
    model_views_make(&e->m, e->w_act, 2, &e->wv);
    snprintf(e->model_dir, sizeof e->model_dir, "random");
    return e;
}

/* Graph validity across KV pools: on one engine, rollouts A, B, A in a row (each frees its KV
 * pool at the end; B's pool has another size, so A's second pool may come back at B's address
 * with A's layout) give the same tokens as each run on fresh decode state (dec_free first). */
static int one_rollout(eng *e, int P, int N, int new_tokens, unsigned long long seed, eng_group_result *res) {
    int *prompt = malloc((size_t)P * 4);
    unsigned long long s = seed;
    gc_random_ids(prompt, P, &s);
    eng_rollout_group g = {prompt, P, N};
    eng_sampling sp;
    eng_sampling_default(&sp);
    sp.temperature = 1.0f;
    sp.top_p = 0.95f;
    sp.ignore_eos = 1;
    sp.seed = seed;
    sp.max_tokens = new_tokens;
    int rc = eng_rollout(e, &g, 1, &sp, res, NULL, NULL);
    free(prompt);
    return rc;
}
static int same_tokens(const eng_group_result *a, const eng_group_result *b) {
    if (a->n != b->n) return 0;
    for (int r = 0; r < a->n; r++) {
        if (a->resp[r].n_tokens != b->resp[r].n_tokens) return 0;
        if (memcmp(a->resp[r].tokens, b->resp[r].tokens, (size_t)a->resp[r].n_tokens * 4)) return 0;
    }
    return 1;
}
static int graph_check(const model_config *c) {
    eng *e = random_engine(c);
    eng_group_result fa, fb, sa, sb, sa2;
    dec_free(e);
    if (one_rollout(e, 100, 4, 40, 11, &fa)) gc_die(e->be, "fresh A");
    dec_free(e);
    if (one_rollout(e, 300, 8, 40, 12, &fb)) gc_die(e->be, "fresh B");
    dec_free(e);
    if (one_rollout(e, 100, 4, 40, 11, &sa) || one_rollout(e, 300, 8, 40, 12, &sb) || one_rollout(e, 100, 4, 40, 11, &sa2))
        gc_die(e->be, "A B A");
    int ok = same_tokens(&fa, &sa) && same_tokens(&fb, &sb) && same_tokens(&fa, &sa2);
    printf("ROW|decode graphs: A, B, A on one engine (KV freed between) == fresh runs|P=100 N=4 / P=300 N=8, 40 tokens|%d|0|%s\n",
           !ok, ok ? "PASS" : "FAIL");
    eng_group_result_free(&fa);
    eng_group_result_free(&fb);
    eng_group_result_free(&sa);
    eng_group_result_free(&sb);
    eng_group_result_free(&sa2);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "gemm")) return bench_gemm();
    const char *size = argc > 1 ? argv[1] : "1.7b";
    int G = argc > 5 ? atoi(argv[2]) : 1, P = argc > 5 ? atoi(argv[3]) : 1024, N = argc > 5 ? atoi(argv[4]) : 16,
        NEW = argc > 5 ? atoi(argv[5]) : 256;
    int C = 2048, F = 6144, L = 28, H = 16, K = 8, D = 128;
    if (!strcmp(size, "0.6b")) {
        C = 1024;
        F = 3072;
    }
    const int b8 = !strcmp(size, "8b"); /* Qwen3-8B dims, untied */
    if (b8) {
        C = 4096;
        F = 12288;
        L = 36;
        H = 32;
    }
    int moe = !strncmp(size, "30b-a3b", 7);
    if (moe) {
        L = size[7] == '-' && size[8] == 'l' ? atoi(size + 9) : 48;
        if (L < 1 || L > 48) gc_die(NULL, "30b-a3b-lL: L in 1..48");
    }
    model_config c = {.arch = ARCH_QWEN3,
                      .L = L,
                      .C = C,
                      .H = H,
                      .K = K,
                      .D = D,
                      .F = F,
                      .V = 151936,
                      .max_pos = 40960,
                      .eps = 1e-6f,
                      .rope_theta = 1000000.0f,
                      .qk_norm = 1,
                      .tied = !b8,
                      .bos_id = -1};
    snprintf(c.arch_name, sizeof c.arch_name, "qwen3");
    if (moe) {
        gc_moe_30b_a3b(&c, L);
        c.tied = 0;
    }
    int hyb = !strncmp(size, "qwen3.5-9b", 10);
    if (hyb) {
        const char *l = strstr(size, "-l");
        gc_qwen3_5_9b(&c, l ? atoi(l + 2) : 32, strstr(size, "-d128") != NULL);
        L = c.L;
    }
    snprintf(c.dtype, sizeof c.dtype, "bfloat16");
    if (argc > 2 && !strcmp(argv[2], "graphs")) return graph_check(&c);
    double bw = copy_bw();

    eng *e = random_engine(&c);
    eng_backend *be = e->be;
    size_t n = (size_t)e->m.n_elems;

    int **prompt = malloc((size_t)G * sizeof(int *));
    eng_rollout_group *groups = malloc((size_t)G * sizeof *groups);
    unsigned long long s = 5;
    for (int g = 0; g < G; g++) {
        prompt[g] = malloc((size_t)P * 4);
        gc_random_ids(prompt[g], P, &s);
        groups[g] = (eng_rollout_group){prompt[g], P, N};
    }
    eng_sampling sp;
    eng_sampling_default(&sp);
    sp.temperature = 1.0f;
    sp.ignore_eos = 1;
    sp.seed = 1234;
    eng_group_result *res = calloc((size_t)G, sizeof *res);
    stamps st = {malloc((size_t)(NEW + 8) * sizeof(double)), 0, NEW + 8};

    /* warm-up: allocations, GEMM plans */
    sp.max_tokens = 8;
    if (eng_rollout(e, groups, G, &sp, res, NULL, NULL)) gc_die(be, "warm-up rollout");
    for (int g = 0; g < G; g++) eng_group_result_free(&res[g]);

    sp.max_tokens = NEW;
    double t0 = clock_mono_ms();
    if (eng_rollout(e, groups, G, &sp, res, on_progress, &st)) gc_die(be, "rollout");
    double t1 = clock_mono_ms();
    long long gen = 0;
    double lp_sum = 0;
    for (int g = 0; g < G; g++)
        for (int r = 0; r < res[g].n; r++) {
            gen += res[g].resp[r].n_tokens;
            for (int i = 0; i < res[g].resp[r].n_tokens; i++) lp_sum += res[g].resp[r].logprobs[i];
        }
    int nd = st.n - 1;
    double *d = malloc((size_t)(nd > 0 ? nd : 1) * sizeof(double));
    for (int i = 0; i < nd; i++) d[i] = st.t[i + 1] - st.t[i];
    qsort(d, (size_t)nd, sizeof(double), gc_cmpd);
    double prefill = st.t[0] - t0, dec_mean = nd > 0 ? (st.t[st.n - 1] - st.t[0]) / nd : 0, dec_med = nd > 0 ? d[nd / 2] : 0;

    double wbytes = 2.0 * n;
    if (b8) wbytes -= 2.0 * c.V * c.C; /* the untied embedding table is not read whole */
    if (moe) { /* the experts a step is expected to touch instead of all of them; the embedding table is not read whole */
        double expert = 3.0 * c.C * c.Fm * 2, rows = (double)G * N;
        double touched = c.E * (1 - pow(1 - (double)c.top_k / c.E, rows));
        wbytes -= L * c.E * expert + 2.0 * c.V * c.C;
        wbytes += L * touched * expert;
        printf("grpod-cuda rollout %s: %d rows a step touch %.1f of %d experts a layer (expected at uniform routing)\n", size,
               G * N, touched, c.E);
    }
    double kvbytes = 2.0 * L * c.K * c.D * 2 * ((double)G * P + (double)G * N * NEW / 2);
    if (hyb) {
        int lin = 0;
        for (int l = 0; l < L; l++) lin += c.attn[l] == ATTN_DELTANET;
        wbytes -= 2.0 * c.V * c.C;
        kvbytes = kvbytes * (L - lin) / L + 2.0 * lin * G * N * ((double)c.lin_hv * c.lin_dk * c.lin_dv * 4);
    }
    double floor_ms = (wbytes + kvbytes) / bw * 1e3, floor3 = (wbytes + kvbytes) / 3.0e12 * 1e3;
    printf("grpod-cuda rollout %s G=%d P=%d N=%d new=%d (%s): prefill %.1f ms, decode %.2f ms/step "
           "(median; mean %.2f over %d steps), total %.0f ms, %.0f tok/s (decode only %.0f tok/s), "
           "%lld tokens, mean logprob %.3f\n",
           size, G, P, N, NEW, e->be->tune.graphs ? "graphs" : "no graphs", prefill, dec_med, dec_mean, nd, t1 - t0,
           gen / ((t1 - t0) * 1e-3), (double)G * N / (dec_mean * 1e-3), gen, lp_sum / (gen ? gen : 1));
    printf("grpod-cuda rollout %s: HBM floor %.3f ms/step at the measured copy bandwidth %.2f TB/s "
           "(weights %.2f GB + KV %.2f GB), %.3f ms/step at 3.0 TB/s; decode/floor %.2fx\n",
           size, floor_ms, bw / 1e12, wbytes / 1e9, kvbytes / 1e9, floor3, dec_med / floor_ms);
    /* rollout vs trainer: the sampled tokens' logprobs against the training forward's
     * (eng_logprobs: the packed [P; R_1..R_N] pass, chunked DeltaNet), each group */
    double lsum = 0, lmax = 0;
    long long lcnt = 0;
    for (int g = 0; g < G; g++) {
        const int **rs = malloc((size_t)N * sizeof *rs);
        int *R = malloc((size_t)N * sizeof *R);
        for (int r = 0; r < N; r++) {
            rs[r] = res[g].resp[r].tokens;
            R[r] = res[g].resp[r].n_tokens;
        }
        eng_update_group ug = {.prompt = prompt[g], .P = P, .n = N, .resp = rs, .R = R};
        float **lp;
        if (eng_logprobs(e, &ug, 1, 0, 1.0f, 1 << 20, &lp)) gc_die(be, "eng_logprobs");
        for (int r = 0; r < N; r++)
            for (int t = 0; t < R[r]; t++) {
                double dd = fabs((double)lp[r][t] - res[g].resp[r].logprobs[t]);
                lsum += dd;
                lmax = dd > lmax ? dd : lmax;
                lcnt++;
            }
        eng_logprobs_free(lp, &ug, 1);
        free(rs);
        free(R);
    }
    printf("grpod-cuda rollout %s: rollout vs trainer logprobs over %lld tokens: mean |d| %.3e, max |d| %.3e (random weights "
           "uniform +-0.02: near-flat logits)\n",
           size, lcnt, lsum / (lcnt ? lcnt : 1), lmax);
    for (int g = 0; g < G; g++) eng_group_result_free(&res[g]);
    model_acts_free(&e->m, &e->acts_ng);
    be->destroy(be);
    return 0;
}
