/* bench_grpo.c — one end-to-end GRPO step through the engine: eng_rollout of G
 * groups × N responses (P-token random prompts, `new` tokens each, temperature 1, ignore_eos),
 * then eng_update on what it sampled (random rewards, KL to the reference, one optimizer step,
 * on-policy: the old pass is the policy pass's own logprobs), at Qwen3-8B dims (untied) with
 * random weights made in-process and the fp32 master + moments in host memory (offload on).
 * The second step is timed (the first pays plans, graphs, page faults). Prints the phases and
 * tokens per second per GPU as NeMo-RL counts them: (prompt + generated) tokens of every
 * sample, G·N·(P + new), over the step's wall time.
 * At 1.7b dims (Qwen3-1.7B, tied) the fp32 master and moments stay on the device (offload off),
 * as the daemon's memory plan puts them on an 80 GB card: the engine-only figure beside
 * tests/bench/gpu/bench_daemon.py's loop through HTTP for the same batch.
 * Usage: bench_grpo [G P N new [8b|1.7b [max_tokens_per_micro_batch]]]  (default 8 1024 16 512 8b 16384) */
#include <cuda_runtime_api.h>

#include "engine/engine_internal.h"
#include "tests/gpu/gpu_check.h"

static eng *random_engine(int small) {
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
    if (small) {
        c.L = 28;
        c.C = 2048;
        c.H = 16;
        c.F = 6144;
        c.tied = 1;
    }
    snprintf(c.arch_name, sizeof c.arch_name, "qwen3");
    c.n_eos = 1;
    c.eos_ids[0] = 151645;
    eng *e = calloc(1, sizeof *e);
    e->W = 1; /* one rank, as eng_open sets it without a comm */
    if (backend_cuda_create(&e->be, 0)) gc_die(NULL, "backend_cuda_create");
    eng_backend *be = e->be;
    if (model_init(&e->m, &c, be)) gc_die(be, "model_init");
    size_t n = (size_t)e->m.n_elems, blk = (size_t)1 << 24;
    e->offload = !small;
    e->w_master = small ? be->alloc(be, n * 4) : offload_host_alloc((long long)n);
    e->w_act = be->alloc(be, n * 2);
    e->ref_act = be->alloc(be, n * 2);
    if (!e->w_master || !e->w_act || !e->ref_act) gc_die(be, "weights");
    float *hb = gc_rand(blk, 0.02f, 7);
    for (size_t off = 0; off < n; off += blk) {
        size_t k = n - off < blk ? n - off : blk;
        if (small && be->to_dev(be, e->w_master + off, hb, k * 4)) gc_die(be, "upload");
        if (!small) memcpy(e->w_master + off, hb, k * 4);
        if (be->act_from_f32(be, (char *)e->w_act + off * 2, hb, k) || be->act_from_f32(be, (char *)e->ref_act + off * 2, hb, k))
            gc_die(be, "upload");
    }
    free(hb);
    model_views_make(&e->m, e->w_act, 2, &e->wv);
    model_views_make(&e->m, e->ref_act, 2, &e->rv);
    snprintf(e->model_dir, sizeof e->model_dir, small ? "random-1.7b" : "random-8b");
    return e;
}

int main(int argc, char **argv) {
    int G = argc > 4 ? atoi(argv[1]) : 8, P = argc > 4 ? atoi(argv[2]) : 1024, N = argc > 4 ? atoi(argv[3]) : 16,
        NEW = argc > 4 ? atoi(argv[4]) : 512;
    int small = argc > 5 && !strcmp(argv[5], "1.7b");
    long long mtpmb = argc > 6 ? atoll(argv[6]) : 16384;
    const char *dims = small ? "1.7b" : "8b";
    double t0 = gc_now();
    eng *e = random_engine(small);
    printf("grpo-%s: engine with random weights in %.1f s (%lld parameters)\n", dims, gc_now() - t0, e->m.n_elems);
    int **prompt = malloc((size_t)G * sizeof *prompt);
    eng_rollout_group *groups = malloc((size_t)G * sizeof *groups);
    unsigned long long s = 11;
    for (int g = 0; g < G; g++) {
        prompt[g] = malloc((size_t)P * 4);
        gc_random_ids(prompt[g], P, &s);
        groups[g] = (eng_rollout_group){prompt[g], P, N};
    }
    eng_sampling sp;
    eng_sampling_default(&sp);
    sp.temperature = 1.0f;
    sp.ignore_eos = 1;
    sp.max_tokens = NEW;
    loss_config a;
    loss_config_default(&a);
    a.kl_coef = 0.001f;
    eng_optim o;
    eng_optim_default(&o);
    for (int step = 0; step < 3; step++) {
        sp.seed = 100 + step;
        eng_group_result *res = calloc((size_t)G, sizeof *res);
        double ts = gc_now();
        if (eng_rollout(e, groups, G, &sp, res, NULL, NULL)) gc_die(e->be, "rollout");
        double tr = gc_now();
        long long gen = 0;
        eng_update_group *ug = calloc((size_t)G, sizeof *ug);
        for (int g = 0; g < G; g++) {
            const int **rp = malloc((size_t)N * sizeof *rp);
            int *R = malloc((size_t)N * 4);
            float *rew = malloc((size_t)N * 4), **olp = malloc((size_t)N * sizeof *olp);
            for (int r = 0; r < N; r++) {
                rp[r] = res[g].resp[r].tokens;
                R[r] = res[g].resp[r].n_tokens;
                olp[r] = res[g].resp[r].logprobs;
                rew[r] = (float)((check_randf(&s, 0.5f) + 0.5f) > 0.5f);
                gen += R[r];
            }
            ug[g] = (eng_update_group){.prompt = prompt[g], .P = P, .n = N, .resp = rp, .R = R, .reward = rew};
            free(olp);
        }
        eng_update_result u;
        if (eng_update(e, ug, G, &a, &o, mtpmb, &u, NULL, NULL)) gc_die(e->be, "update");
        double te = gc_now();
        /* the engine keeps its grad activations between updates; here the next rollout's KV
         * pool wants the room (measured outside the step) */
        size_t fr0, tot0;
        cudaMemGetInfo(&fr0, &tot0);
        model_acts_free(&e->m, &e->acts_g);
        long long toks = (long long)G * N * P + gen;
        printf("grpo-%s step %d: G=%d P=%d N=%d new=%d: rollout %.2f s, update %.2f s (old %.0f ref %.0f policy %.0f "
               "optimizer %.0f ms, %d micro-batches), step %.2f s; %lld prompt+generated tokens -> %.0f tokens/s/GPU "
               "(NeMo-RL Llama-3.1-8B GRPO, 16 H100: 1,562); packed %lld tokens a pass\n",
               dims, step, G, P, N, NEW, tr - ts, te - tr, u.ms_old, u.ms_ref, u.ms_policy, u.ms_optimizer, u.micro_batches,
               te - ts, toks, toks / (te - ts), u.tokens_packed);
        size_t fr, tot;
        cudaMemGetInfo(&fr, &tot);
        printf("grpo-%s step %d: device memory in use after the update %.1f GiB (%.1f with its activations); grad norm "
               "%.3g, loss %.4g, kl %.3g\n",
               dims, step, (tot - fr) / 1073741824.0, (tot0 - fr0) / 1073741824.0, u.grad_norm, u.loss, u.kl);
        for (int g = 0; g < G; g++) {
            free((void *)ug[g].resp);
            free((void *)ug[g].R);
            free((void *)ug[g].reward);
            eng_group_result_free(&res[g]);
        }
        free(ug);
        free(res);
    }
    eng_close(e);
    return 0;
}
