/* bench_exact_gap.c — rollout logprobs against the trainer's, bit for bit, at real dims on one
 * GPU, and what exact mode costs there. Random bf16 weights at Qwen3-1.7B dims (28 layers, 2048,
 * 16/8 heads, 6144, tied) or Qwen3-8B dims (36, 4096, 32/8, 12288, untied); the tokens are random
 * too (temperature 1 over near-flat logits), which is what the bits are checked on.
 *   mixed: two rollout jobs on one scheduler, as the daemon runs them: job A 8 groups x 16,
 *     prompts of 1024 + 37 g ids, `new` tokens each; job B 7 groups x 16, prompts of 1043 + 37 g,
 *     new - new/8 tokens, another seed, added after A's fifth step: decode batches of both jobs'
 *     groups, whose make-up changes as B joins and as B ends first. Decode ms a step: the median
 *     of the steps where all 240 rows decode.
 *   trainer: every group's sampled tokens scored by eng_logprobs (the training forward over the
 *     packed [P; R_1..R_N], micro-batches of 16,384 tokens): the tokens whose logprob bits
 *     differ, the max and mean |d|.
 *   alone: A's group 0 decoded by itself (same seed, same group index): the tokens and logprob
 *     bits against the same group in the mixed batch.
 *   update (with the argument "update"): an update on A's groups 0-3 (random 0/1 rewards, KL to
 *     the reference, mini-batches of 2 groups: two optimizer steps, so the old pass is not the
 *     policy pass) with the old logprobs recomputed (an old pass) and with the rollout's; each
 *     from the same state (eng_update_undo between; the safety copy on the device), after one
 *     warm-up update. Phase times, and the fp32 master weights after each: equal bits mean the
 *     old pass can be skipped without changing the update.
 * Exact mode is GRPOD_TUNE_EXACT=1 in the environment (read at backend start): its rows assert
 * 0 differing tokens / values; without it the same rows are printed, not asserted (tolerance inf).
 * Usage: bench_exact_gap [1.7b|8b|tiny] [new] [update] */
#include <cuda_runtime_api.h>

#include "engine/engine_internal.h"
#include "tests/gpu/gpu_check.h"

enum { GA = 8, GB = 7, NR = 16, UG = 4, JOIN_STEP = 5 };
#define MAX_TOK_MB 16384

/* big: 8B dims, else 1.7B; tiny: a 2-layer model of width 64 on the cpu backend (a smoke test
 * of this program where no GPU is) */
static eng *random_engine(int big, int tiny, int train) {
    model_config c = {.arch = ARCH_QWEN3,
                      .L = big ? 36 : 28,
                      .C = big ? 4096 : 2048,
                      .H = big ? 32 : 16,
                      .K = 8,
                      .D = 128,
                      .F = big ? 12288 : 6144,
                      .V = 151936,
                      .max_pos = 40960,
                      .eps = 1e-6f,
                      .rope_theta = 1000000.0f,
                      .qk_norm = 1,
                      .tied = !big,
                      .bos_id = -1};
    if (tiny) c.L = 2, c.C = 64, c.H = 4, c.K = 2, c.D = 32, c.F = 128;
    snprintf(c.arch_name, sizeof c.arch_name, "qwen3");
    snprintf(c.dtype, sizeof c.dtype, "bfloat16");
    eng *e = calloc(1, sizeof *e);
    if (tiny ? backend_cpu_create(&e->be, 2) : backend_cuda_create(&e->be, 0)) gc_die(NULL, "backend_create");
    eng_backend *be = e->be;
    e->W = 1; /* one rank, as eng_open sets it without a comm */
    if (model_init(&e->m, &c, be)) gc_die(be, "model_init");
    size_t n = (size_t)e->m.n_elems, blk = (size_t)1 << 24, ab = (size_t)be->act_bytes;
    e->w_act = be->alloc(be, n * ab);
    if (train) { /* fp32 activations (cpu): the weights are the master */
        e->w_master = ab == 4 ? e->w_act : be->alloc(be, n * 4);
        e->ref_act = be->alloc(be, n * ab);
    }
    if (!e->w_act || (train && (!e->w_master || !e->ref_act))) gc_die(be, "weights");
    float *hb = gc_rand(blk, 0.02f, 17);
    for (size_t off = 0; off < n; off += blk) {
        size_t k = n - off < blk ? n - off : blk;
        if (be->act_from_f32(be, (char *)e->w_act + off * ab, hb, k)) gc_die(be, "upload");
        if (train &&
            ((ab != 4 && be->to_dev(be, e->w_master + off, hb, k * 4)) ||
             be->act_from_f32(be, (char *)e->ref_act + off * ab, hb, k)))
            gc_die(be, "upload");
    }
    free(hb);
    model_views_make(&e->m, e->w_act, (int)ab, &e->wv);
    if (train) {
        model_views_make(&e->m, e->ref_act, (int)ab, &e->rv);
        /* the safety copy eng_update_undo restores: on the device, else pinned host memory */
        if (tiny ? snap_alloc(e, SNAP_HOST) : snap_alloc(e, SNAP_DEVICE) && snap_alloc(e, SNAP_PINNED)) gc_die(be, "safety copy");
        printf("safety copy: %s\n", snap_where_name(e->snap.where));
    }
    snprintf(e->model_dir, sizeof e->model_dir, big ? "random-8b" : "random-1.7b");
    return e;
}

typedef struct {
    int *prompt[GA + GB];
    eng_rollout_group g[GA + GB];
    eng_sampling sp[2];
    eng_group_result res[GA + GB];
    long long tokens;
} batch;

static void batch_make(batch *b, int new_tokens) {
    unsigned long long s = 5;
    for (int i = 0; i < GA + GB; i++) {
        int P = i < GA ? 1024 + 37 * i : 1043 + 37 * (i - GA);
        b->prompt[i] = malloc((size_t)P * 4);
        gc_random_ids(b->prompt[i], P, &s);
        b->g[i] = (eng_rollout_group){b->prompt[i], P, NR};
    }
    for (int j = 0; j < 2; j++) {
        eng_sampling_default(&b->sp[j]);
        b->sp[j].temperature = 1.0f;
        b->sp[j].ignore_eos = 1;
        b->sp[j].seed = 1000 + j;
        b->sp[j].max_tokens = new_tokens - (j ? new_tokens / 8 : 0);
    }
}

/* Both jobs on one scheduler, B joining after A's JOIN_STEP-th step. *ms: median ms of the
 * steps that decoded every row of both jobs. */
static void mixed_rollout(eng *e, batch *b, double *ms, int *full_steps) {
    eng_backend *be = e->be;
    eng_sched *s;
    eng_sched_job *ja, *jb = NULL;
    eng_sched_opts o = {0};
    if (eng_sched_open(e, &o, &s) || eng_sched_add(s, b->g, GA, &b->sp[0], b->res, &ja)) gc_die(be, "sched A");
    int cap = 4096, n = 0, steps = 0;
    double *t = malloc((size_t)cap * sizeof(double));
    const char *msg;
    int sa = 0, sb = 0;
    while (!sa || !sb) {
        if (steps == JOIN_STEP && eng_sched_add(s, b->g + GA, GB, &b->sp[1], b->res + GA, &jb)) gc_die(be, "sched B");
        eng_sched_stats st;
        eng_sched_get_stats(s, &st);
        double t0 = gc_now();
        if (eng_sched_step(s)) gc_die(be, "sched step");
        if (st.running_responses == (GA + GB) * NR && st.waiting_groups == 0 && n < cap) t[n++] = (gc_now() - t0) * 1e3;
        steps++;
        sa = eng_sched_job_state(ja, NULL, NULL, &msg);
        sb = jb ? eng_sched_job_state(jb, NULL, NULL, &msg) : 0;
        if (sa < 0 || sb < 0) gc_die(be, msg);
    }
    eng_sched_job_release(s, ja);
    eng_sched_job_release(s, jb);
    eng_sched_close(s);
    qsort(t, (size_t)n, sizeof(double), gc_cmpd);
    *ms = n ? t[n / 2] : 0;
    *full_steps = n;
    free(t);
    b->tokens = 0;
    for (int i = 0; i < GA + GB; i++)
        for (int r = 0; r < NR; r++) b->tokens += b->res[i].resp[r].n_tokens;
}

static eng_update_group ugroup(const batch *b, int i, const int **resp, int *R, const float **olp, float *rew) {
    for (int r = 0; r < NR; r++) {
        resp[r] = b->res[i].resp[r].tokens;
        R[r] = b->res[i].resp[r].n_tokens;
        olp[r] = b->res[i].resp[r].logprobs;
        if (rew) rew[r] = (float)((r * 7 + i * 3) % 5 < 2);
    }
    return (eng_update_group){
        .prompt = b->prompt[i], .P = b->g[i].P, .n = NR, .resp = resp, .R = R, .reward = rew, .old_logprobs = olp};
}

/* The trainer's logprobs of every sampled token against the rollout's. */
static void trainer_rows(eng *e, const batch *b, const char *dims, int exact) {
    const int *resp[GA + GB][NR];
    const float *olp[GA + GB][NR];
    int R[GA + GB][NR];
    eng_update_group ug[GA + GB];
    for (int i = 0; i < GA + GB; i++) ug[i] = ugroup(b, i, resp[i], R[i], olp[i], NULL);
    float **lp[GA + GB];
    double t0 = gc_now();
    for (int i = 0; i < GA + GB; i++) /* one group a call: the whole batch's outputs at once are large */
        if (eng_logprobs(e, &ug[i], 1, 0, 1.0f, MAX_TOK_MB, &lp[i])) gc_die(e->be, "eng_logprobs");
    double ms = (gc_now() - t0) * 1e3;
    long long cnt = 0, differ = 0;
    double mx = 0, sum = 0;
    for (int i = 0; i < GA + GB; i++) {
        for (int r = 0; r < NR; r++)
            for (int t = 0; t < R[i][r]; t++, cnt++) {
                double d = fabs((double)lp[i][r][t] - b->res[i].resp[r].logprobs[t]);
                sum += d;
                mx = fmax(mx, d);
                differ += memcmp(&lp[i][r][t], &b->res[i].resp[r].logprobs[t], 4) != 0;
            }
        eng_logprobs_free(lp[i], &ug[i], 1);
    }
    printf("exact-gap %s exact=%d: trainer (eng_logprobs, %.0f ms): %lld sampled tokens, %lld differ, max |d| %.3e, "
           "mean |d| %.3e\n",
           dims, exact, ms, cnt, differ, mx, sum / (cnt ? cnt : 1));
    char shape[160];
    snprintf(shape, sizeof shape, "%s exact=%d, %lld tokens in mixed batches, %lld differ, mean %.2e", dims, exact, cnt, differ,
             sum / (cnt ? cnt : 1));
    gc_row("rollout vs trainer logprob max abs diff", shape, mx, exact ? 0 : INFINITY);
}

/* A's group 0 alone against the same group in the mixed batch: tokens and logprob bits. */
static void alone_rows(eng *e, const batch *b, const char *dims, int exact) {
    eng_group_result one;
    if (eng_rollout(e, &b->g[0], 1, &b->sp[0], &one, NULL, NULL)) gc_die(e->be, "alone rollout");
    long long cnt = 0, tok_differ = 0, lp_differ = 0;
    for (int r = 0; r < NR; r++) {
        const eng_response *x = &one.resp[r], *y = &b->res[0].resp[r];
        int n = x->n_tokens < y->n_tokens ? x->n_tokens : y->n_tokens;
        tok_differ += abs(x->n_tokens - y->n_tokens);
        for (int t = 0; t < n; t++, cnt++) {
            tok_differ += x->tokens[t] != y->tokens[t];
            lp_differ += memcmp(&x->logprobs[t], &y->logprobs[t], 4) != 0;
        }
    }
    eng_group_result_free(&one);
    printf("exact-gap %s exact=%d: group 0 alone vs in the mixed batch: %lld tokens, %lld ids differ, %lld logprobs differ\n",
           dims, exact, cnt, tok_differ, lp_differ);
    char shape[160];
    snprintf(shape, sizeof shape, "%s exact=%d, %lld tokens, %lld ids differ", dims, exact, cnt, tok_differ);
    gc_row("one group alone vs mixed: logprobs that differ", shape, (double)lp_differ, exact ? 0 : INFINITY);
}

static void update_once(eng *e, const batch *b, int from_rollout, eng_update_result *u) {
    const int *resp[UG][NR];
    const float *olp[UG][NR];
    int R[UG][NR];
    float rew[UG][NR];
    eng_update_group ug[UG];
    for (int i = 0; i < UG; i++) {
        ug[i] = ugroup(b, i, resp[i], R[i], olp[i], rew[i]);
        if (!from_rollout) ug[i].old_logprobs = NULL;
    }
    loss_config a;
    loss_config_default(&a);
    a.ppo_mini_batch_size = 2;
    a.use_rollout_logprobs = from_rollout;
    eng_optim o;
    eng_optim_default(&o);
    if (eng_update(e, ug, UG, &a, &o, MAX_TOK_MB, u, NULL, NULL)) gc_die(e->be, "update");
}

/* The update with the old pass recomputed and with the rollout's logprobs, from one state: the
 * fp32 master and AdamW's m after each (m carries the gradients' bits, which Adam's first step
 * hides from the master: its step is about lr times the gradient's sign). */
static void update_rows(eng *e, const batch *b, const char *dims, int exact) {
    eng_backend *be = e->be;
    size_t n = (size_t)e->m.n_elems, chunk = (size_t)1 << 26;
    eng_update_result w, u[2];
    update_once(e, b, 0, &w); /* warm-up: plans, activations */
    if (eng_update_undo(e)) gc_die(be, "undo");
    float *keep = malloc(2 * n * 4), *part = malloc(chunk * 4);
    long long differ[2] = {0, 0};
    double mx[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        update_once(e, b, k, &u[k]);
        const float *src[2] = {eng_train_master(e), e->adam_m};
        for (int a = 0; a < 2; a++)
            for (size_t off = 0; off < n; off += chunk) {
                size_t m = n - off < chunk ? n - off : chunk;
                float *x = keep + a * n + off;
                if (be->sync(be) || be->to_host(be, k ? part : x, src[a] + off, m * 4)) gc_die(be, "state");
                for (size_t i = 0; k && i < m; i++)
                    if (memcmp(&part[i], &x[i], 4)) {
                        differ[a]++;
                        mx[a] = fmax(mx[a], fabs((double)part[i] - x[i]));
                    }
            }
        if (eng_update_undo(e)) gc_die(be, "undo");
        printf("exact-gap %s exact=%d: update (%d groups, %lld tokens a pass, %d optimizer steps), old logprobs %s: "
               "%.0f ms (old %.0f ref %.0f policy %.0f optimizer %.0f), grad norm %.17g, loss %.17g\n",
               dims, exact, UG, u[k].tokens_packed, u[k].optimizer_steps, k ? "from the rollout" : "recomputed", u[k].ms_total,
               u[k].ms_old, u[k].ms_ref, u[k].ms_policy, u[k].ms_optimizer, u[k].grad_norm, u[k].loss);
        fflush(stdout);
    }
    printf("exact-gap %s exact=%d: update, old pass skipped / recomputed: %.0f / %.0f ms (%.2fx); after each: master "
           "%lld of %zu differ (max |d| %.3e), AdamW m %lld differ (max |d| %.3e)\n",
           dims, exact, u[1].ms_total, u[0].ms_total, u[1].ms_total / u[0].ms_total, differ[0], n, mx[0], differ[1], mx[1]);
    char shape[160];
    snprintf(shape, sizeof shape, "%s exact=%d, %d groups, 2 steps: master %lld, m %lld of %zu differ", dims, exact, UG,
             differ[0], differ[1], n);
    gc_row("update, old pass skipped vs recomputed: max abs diff", shape, fmax(mx[0], mx[1]), exact ? 0 : INFINITY);
    free(keep);
    free(part);
}

int main(int argc, char **argv) {
    const char *dims = argc > 1 ? argv[1] : "1.7b";
    int big = !strcmp(dims, "8b"), tiny = !strcmp(dims, "tiny"), new_tokens = argc > 2 ? atoi(argv[2]) : 512;
    int upd = argc > 3 && !strcmp(argv[3], "update");
    if (strcmp(dims, "1.7b") && !big && !tiny) gc_die(NULL, "dims: 1.7b, 8b or tiny");
    double t0 = gc_now();
    eng *e = random_engine(big, tiny, upd);
    int exact = e->be->tune.exact;
    printf("exact-gap %s exact=%d: engine with random weights in %.1f s\n", dims, exact, gc_now() - t0);
    batch b;
    batch_make(&b, new_tokens);
    double ms;
    int full;
    t0 = gc_now();
    mixed_rollout(e, &b, &ms, &full);
    printf("exact-gap %s exact=%d: mixed rollout, %d + %d groups x %d, %d / %d new tokens: %lld tokens in %.2f s, decode "
           "%.2f ms/step (median of %d steps with all %d rows)\n",
           dims, exact, GA, GB, NR, b.sp[0].max_tokens, b.sp[1].max_tokens, b.tokens, gc_now() - t0, ms, full, (GA + GB) * NR);
    fflush(stdout);
    trainer_rows(e, &b, dims, exact);
    alone_rows(e, &b, dims, exact);
    if (upd) update_rows(e, &b, dims, exact);
    for (int i = 0; i < GA + GB; i++) {
        eng_group_result_free(&b.res[i]);
        free(b.prompt[i]);
    }
    eng_close(e);
    return gc_failures ? 1 : 0;
}
