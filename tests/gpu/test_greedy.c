/* test_greedy.c (GPU) — generation on the CUDA backend against the training path, at dims that
 * take the real decode kernels (head_dim 128, GQA 2, the split-KV decode attention, the
 * few-row GEMM, CUDA graphs): a random Qwen3-shaped model (L=4, C=1024, H=16, K=8, D=128,
 * F=3072, V=151,936, tied), two groups with prompts of 300 and 173 random tokens.
 *   greedy: every token of a greedy rollout (T = 0, 4 responses per group, 48 tokens) against
 *     the argmax of a teacher-forced full forward of prompt + response (the training path:
 *     flash attention over the packed sequence, cuBLASLt GEMMs). Both are bf16, so a token may
 *     differ from the argmax only where the two best teacher-forced logits are within 0.05 of
 *     each other (a near tie that bf16 rounding can flip); any other difference fails.
 *   mismatch: the logprobs a sampled rollout (T = 1) reports for its tokens against
 *     eng_logprobs of the same tokens (the update's old pass): mean and max |Δ|. The mean must
 *     stay within 1e-2 (the decode-dims bound); the max is reported.
 * With the argument "moe" the model is Qwen3-MoE (32 experts, top-4; layer 1 dense): decode
 * runs the experts on few rows inside the CUDA graphs. Routes are chosen afresh on both paths
 * (no routing replay), so a near tie of the router can move a token to other experts: the
 * mismatch's mean is held to 3e-2 there (measured on the H200: mean 1.1e-2, max 0.28; the
 * greedy rows held, 95 of 96 tokens equal and one near tie). Then the same with routing replay
 * (the rollout's recorded routes given to the scoring pass, as an update with routing_replay
 * "rollout" does): its mean and max, replay not wider than free routing, and the fraction of
 * (token, MoE layer) pairs whose top-k set the trainer chooses differently from the sampler
 * (a free forward of the standard layout against the recorded routes).
 * Then the sampled rollout in exact mode (exact_rows): max |Δ| and the count of differing tokens.
 * Prints ROW lines for tests/gpu/run.sh. */
#include <cuda_runtime_api.h>

#include "engine/engine_internal.h"
#include "tests/gpu/gpu_check.h"
#include "tests/unit/run_config.h"

enum { NG = 2, N = 4, NEW = 48 };

static eng *open_random(int moe) {
    model_config c = {.arch = ARCH_QWEN3,
                      .L = 4,
                      .C = 1024,
                      .H = 16,
                      .K = 8,
                      .D = 128,
                      .F = 3072,
                      .V = 151936,
                      .max_pos = 40960,
                      .eps = 1e-6f,
                      .rope_theta = 1000000.0f,
                      .qk_norm = 1,
                      .tied = 1,
                      .bos_id = -1};
    snprintf(c.arch_name, sizeof c.arch_name, "qwen3");
    if (moe) { /* Qwen3-MoE: 32 experts, top-4 renormalised, layer 1 dense */
        c.arch = ARCH_QWEN3_MOE;
        snprintf(c.arch_name, sizeof c.arch_name, "qwen3_moe");
        c.E = 32;
        c.top_k = 4;
        c.Fm = 512;
        c.norm_topk = 1;
        for (int l = 0; l < c.L; l++) c.mlp[l] = l == 1 ? MLP_DENSE : MLP_MOE;
    }
    snprintf(c.dtype, sizeof c.dtype, "bfloat16");
    eng *e = calloc(1, sizeof *e);
    e->W = 1; /* one rank, as eng_open sets it without a comm */
    if (backend_cuda_create(&e->be, 0)) gc_die(NULL, "backend_cuda_create");
    eng_backend *be = e->be;
    if (model_init(&e->m, &c, be)) gc_die(be, "model_init");
    size_t n = (size_t)e->m.n_elems;
    e->w_act = be->alloc(be, n * 2);
    if (!e->w_act) gc_die(be, "weights");
    /* norms at 1 + noise, everything else N(0, 0.05): logits spread enough to have clear winners */
    float *h = gc_rand(n, 0.05f, 11);
    for (int i = 0; i < e->m.n_params; i++)
        if (strstr(e->m.params[i].name, "norm"))
            for (long long j = 0; j < e->m.params[i].numel; j++) h[e->m.params[i].off + j] += 1.0f;
    if (be->act_from_f32(be, e->w_act, h, n)) gc_die(be, "upload");
    free(h);
    model_views_make(&e->m, e->w_act, 2, &e->wv);
    snprintf(e->model_dir, sizeof e->model_dir, "random");
    return e;
}

/* Teacher-forced logits (n, V) of prompt + resp at the positions that predict resp[0 .. n). */
static float *teacher_logits(eng *e, const int *prompt, int P, const int *resp, int n) {
    eng_backend *be = e->be;
    int T = P + n, V = e->m.cfg.V, C = e->m.cfg.C;
    int *ints = malloc((size_t)T * 7 * sizeof(int));
    int *tok = ints, *pos = ints + T, *a0 = ints + 2 * T, *a1 = ints + 3 * T, *b0 = ints + 4 * T, *rows = ints + 5 * T;
    for (int t = 0; t < T; t++) {
        tok[t] = t < P ? prompt[t] : resp[t - P];
        pos[t] = t;
        a0[t] = 0;
        a1[t] = t + 1;
        b0[t] = 0;
    }
    for (int i = 0; i < n; i++) rows[i] = P - 1 + i;
    model_input in = {.T = T, .tokens = tok, .pos = pos, .a0 = a0, .a1 = a1, .b0 = b0, .b1 = b0};
    float *dl = be->alloc(be, (size_t)n * V * 4), *hl = malloc((size_t)n * V * 4);
    int *dr = be->alloc(be, (size_t)n * 4);
    if (!dl || !dr || !hl || eng_acts_reserve(e, &e->acts_ng, T, 1, 0) ||
        model_forward(&e->m, &e->wv, &e->acts_ng, NULL, &in, 1.0f, 0) || be->to_dev(be, dr, rows, (size_t)n * 4))
        gc_die(be, "teacher forward");
    be->lm_head_rows(be, dl, e->acts_ng.lnf, dr, e->wv.lm_head, n, C, V);
    if (be->sync(be) || be->to_host(be, hl, dl, (size_t)n * V * 4)) gc_die(be, "teacher logits");
    be->free(be, dl);
    be->free(be, dr);
    free(ints);
    return hl;
}

/* The trainer's own top-k (a free forward of ug in the standard layout: each response after its
 * own prompt copy) against the routes res recorded: *pairs (token, MoE layer) pairs compared,
 * *differ of them with another set of experts (a response's last token has none: skipped). */
static void topk_differs(eng *e, const eng_update_group *ug, const eng_group_result *res, long long *pairs, long long *differ) {
    eng_backend *be = e->be;
    int Lm = config_n_moe(&e->m.cfg), k = e->m.cfg.top_k, W = Lm * k;
    pack_group pg = eng_pack_group(e, ug);
    pg.prompt_routes = NULL, pg.resp_routes = NULL;
    pack_batch b;
    if (pack_build(&b, &pg, 0, 1, PACK_STANDARD)) gc_die(be, "pack");
    model_input in;
    model_input_from_batch(&in, &b);
    int *own = malloc((size_t)b.T * W * sizeof(int));
    if (!own || eng_acts_reserve(e, &e->acts_ng, b.T, b.M, 0) || model_forward(&e->m, &e->wv, &e->acts_ng, NULL, &in, 1.0f, 0) ||
        model_routes_get(&e->m, &e->acts_ng, b.T, b.T, own))
        gc_die(be, "free forward");
    for (int r = 0, base = 0; r < ug->n; base += ug->P + ug->R[r], r++)
        for (int t = 0; t < ug->P + ug->R[r] - 1; t++) {
            const int *rec = t < ug->P ? res->prompt_routes + (size_t)t * W : res->resp[r].routes + (size_t)(t - ug->P) * W;
            const int *mine = own + (size_t)(base + t) * W;
            if (rec[0] < 0) continue;
            for (int l = 0; l < Lm; l++) {
                int same = 0; /* sets: every recorded expert among the chosen ones */
                for (int i = 0; i < k; i++)
                    for (int j = 0; j < k; j++) same += rec[l * k + i] == mine[l * k + j];
                *pairs += 1;
                *differ += same != k;
            }
        }
    free(own);
    pack_batch_free(&b);
}

/* Exact mode (tune.exact): the sampled rollout again with batch-invariant kernels, its
 * logprobs against eng_logprobs': the max |d| and the tokens whose bits differ. 0 is asserted only
 * when the run sets GRPOD_TUNE_EXACT=1 (every kernel exact, attention included); else printed. */
static void exact_rows(eng *e, const eng_rollout_group *g, int *const *prompt, const int *P, const eng_sampling *sp,
                       const char *tag) {
    eng_backend *be = e->be;
    int asserted = be->tune.exact;
    be->tune.exact = 1;
    eng_group_result res[NG];
    if (eng_rollout(e, g, NG, sp, res, NULL, NULL)) gc_die(be, "exact rollout");
    double mx = 0;
    long long cnt = 0, differ = 0;
    for (int k = 0; k < NG; k++) {
        const int *resp[N];
        int R[N];
        for (int r = 0; r < N; r++) resp[r] = res[k].resp[r].tokens, R[r] = res[k].resp[r].n_tokens;
        eng_update_group ug = {.prompt = prompt[k], .P = P[k], .n = N, .resp = resp, .R = R};
        float **lp;
        if (eng_logprobs(e, &ug, 1, 0, 1.0f, 1 << 20, &lp)) gc_die(be, "eng_logprobs");
        for (int r = 0; r < N; r++)
            for (int t = 0; t < R[r]; t++, cnt++) {
                mx = fmax(mx, fabs((double)lp[r][t] - res[k].resp[r].logprobs[t]));
                differ += memcmp(&lp[r][t], &res[k].resp[r].logprobs[t], 4) != 0;
            }
        eng_logprobs_free(lp, &ug, 1);
        eng_group_result_free(&res[k]);
    }
    printf("exact mode: rollout vs training-path logprobs (T=1, %lld tokens): max |d| %.3e, %lld tokens differ\n", cnt, mx, differ);
    char shape[128];
    snprintf(shape, sizeof shape, "%s%lld sampled tokens, %lld differ%s", tag, cnt, differ,
             asserted ? "" : " (GRPOD_TUNE_EXACT unset: printed)");
    gc_row("rollout vs trainer logprob max abs diff, exact", shape, mx, asserted ? 0 : INFINITY);
    be->tune.exact = asserted;
}

int main(int argc, char **argv) {
    int moe = argc > 1 && !strcmp(argv[1], "moe");
    const char *tag = moe ? "qwen3_moe E=32 k=4, " : "";
    eng *e = open_random(moe);
    eng_backend *be = e->be;
    int V = e->m.cfg.V, P[NG] = {300, 173};
    int *prompt[NG];
    unsigned long long s = 99;
    eng_rollout_group g[NG];
    for (int k = 0; k < NG; k++) {
        prompt[k] = malloc((size_t)P[k] * 4);
        for (int i = 0; i < P[k]; i++) prompt[k][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (V - 1));
        g[k] = (eng_rollout_group){prompt[k], P[k], N};
    }
    eng_sampling sp;
    fixed_sampling(&sp, 0, NEW, 4321); /* greedy vs teacher-forced argmax */
    eng_group_result res[NG];
    if (eng_rollout(e, g, NG, &sp, res, NULL, NULL)) gc_die(be, "greedy rollout");
    int checked = 0, equal = 0, ties = 0, bad = 0, same_in_group = 1;
    double worst_margin = 0;
    for (int k = 0; k < NG; k++) {
        for (int r = 1; r < N; r++) same_in_group &= !memcmp(res[k].resp[r].tokens, res[k].resp[0].tokens, NEW * sizeof(int));
        eng_response *x = &res[k].resp[0];
        float *lg = teacher_logits(e, prompt[k], P[k], x->tokens, x->n_tokens);
        for (int t = 0; t < x->n_tokens; t++) {
            const float *row = lg + (size_t)t * V;
            int arg = 0;
            for (int v = 1; v < V; v++)
                if (row[v] > row[arg]) arg = v;
            double margin = row[arg] - row[x->tokens[t]];
            checked++;
            if (arg == x->tokens[t]) equal++;
            else if (margin < 0.05) ties++;
            else {
                bad++;
                printf("  group %d step %d: greedy %d, argmax %d, margin %.4f\n", k, t, x->tokens[t], arg, margin);
            }
            if (arg != x->tokens[t] && margin > worst_margin) worst_margin = margin;
        }
        free(lg);
    }
    printf("greedy: %d tokens, %d equal the teacher-forced argmax, %d near ties (< 0.05), %d wrong; "
           "the N responses of a group identical: %s\n",
           checked, equal, ties, bad, same_in_group ? "yes" : "no");
    char shape[96];
    snprintf(shape, sizeof shape, "%s%d tokens: %d equal, %d near-tie flips", tag, checked, equal, ties);
    gc_row("greedy == teacher-forced argmax", shape, bad ? worst_margin : 0, 0);
    snprintf(shape, sizeof shape, "%s2 groups x 4", tag);
    gc_row("greedy: N responses identical", shape, same_in_group ? 0 : 1, 0);
    snprintf(shape, sizeof shape, "%s%d tokens: %d equal, %d near-tie flips", tag, checked, equal, ties);
    gc_row("greedy: mostly exact", shape, (double)(checked - equal) / checked, 0.1);
    for (int k = 0; k < NG; k++) eng_group_result_free(&res[k]);

    /* sampled rollout logprobs vs the training path's */
    sp.temperature = 1.0f;
    if (eng_rollout(e, g, NG, &sp, res, NULL, NULL)) gc_die(be, "sampled rollout");
    double sum = 0, mx = 0, rsum = 0, rmx = 0; /* free routing; replayed (moe) */
    long long cnt = 0, pairs = 0, differ = 0;
    for (int k = 0; k < NG; k++) {
        const int *resp[N], *routes[N];
        int R[N];
        for (int r = 0; r < N; r++) {
            resp[r] = res[k].resp[r].tokens;
            routes[r] = res[k].resp[r].routes;
            R[r] = res[k].resp[r].n_tokens;
        }
        eng_update_group ug = {.prompt = prompt[k], .P = P[k], .n = N, .resp = resp, .R = R};
        for (int replay = 0; replay <= moe; replay++) {
            ug.prompt_routes = replay ? res[k].prompt_routes : NULL;
            ug.resp_routes = replay ? routes : NULL;
            float **lp;
            if (eng_logprobs(e, &ug, 1, 0, 1.0f, 1 << 20, &lp)) gc_die(be, "eng_logprobs");
            for (int r = 0; r < N; r++)
                for (int t = 0; t < R[r]; t++) {
                    double d = fabs((double)lp[r][t] - res[k].resp[r].logprobs[t]);
                    *(replay ? &rsum : &sum) += d;
                    cnt += !replay;
                    if (d > (replay ? rmx : mx)) *(replay ? &rmx : &mx) = d;
                }
            eng_logprobs_free(lp, &ug, 1);
        }
        if (moe) topk_differs(e, &ug, &res[k], &pairs, &differ);
        eng_group_result_free(&res[k]);
    }
    printf("rollout vs training-path logprobs (T=1, %lld tokens): mean |d| %.3e, max |d| %.3e\n", cnt, sum / cnt, mx);
    snprintf(shape, sizeof shape, "%s%lld sampled tokens, max abs diff %.2e", tag, cnt, mx);
    gc_row("rollout vs trainer logprob mean abs diff", shape, sum / cnt, moe ? 3e-2 : 1e-2);
    if (moe) {
        printf("routing replay: mean |d| %.3e, max |d| %.3e (free: %.3e, %.3e); top-k differs on %lld of %lld "
               "(token, MoE layer) pairs (%.2f%%)\n",
               rsum / cnt, rmx, sum / cnt, mx, differ, pairs, 100.0 * differ / (pairs ? pairs : 1));
        snprintf(shape, sizeof shape, "%s%lld tokens, replayed, max abs diff %.2e", tag, cnt, rmx);
        gc_row("rollout vs trainer logprob mean abs diff, replay", shape, rsum / cnt, 3e-2);
        snprintf(shape, sizeof shape, "%sreplayed / free mean abs diff (%.2e / %.2e)", tag, rsum / cnt, sum / cnt);
        gc_row("routing replay does not widen the gap", shape, rsum / (sum > 0 ? sum : 1), 1.0);
        /* reported, not a limit: how often bf16 decode and the training path route apart */
        snprintf(shape, sizeof shape, "%s%lld of %lld (token, layer) pairs", tag, differ, pairs);
        gc_row("rollout vs trainer top-k differs (fraction)", shape, (double)differ / (pairs ? pairs : 1), 1.0);
    }
    exact_rows(e, g, prompt, P, &sp, tag);
    for (int k = 0; k < NG; k++) free(prompt[k]);
    model_acts_free(&e->m, &e->acts_ng);
    be->destroy(be);
    return gc_failures ? 1 : 0;
}
