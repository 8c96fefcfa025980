/* bench_moe_update.c — the daemon's update without its HTTP: eng_open on a checkpoint directory
 * (the daemon's memory plan, safety copy and defaults), then eng_update on G groups of P random
 * prompt ids and N responses of R random ids each, with the daemon's defaults (kl_coef 0.001, one
 * optimizer step, the old pass the policy pass's own logprobs as with old_logprobs "recompute").
 * As in the daemon, a rollout of the same prompts (R tokens each, ignore_eos) on a scheduler that
 * stays open comes before each update at the plan's micro-batch: its KV pool is what the update
 * releases first. Each round runs the update at the plan's micro-batch (the daemon's default) and at one group a
 * micro-batch (bench_step's shape), then the reference pass alone (eng_logprobs on the reference,
 * no safety copy running beside it) at both, so a slow reference pass inside the update can be
 * told from the micro-batch's shape and from the copy. Prints each update's phases and the part
 * of its wall time outside them (prepare: the plan check, the activations' reservation and the
 * copy's start).
 * Usage: bench_moe_update MODEL_DIR [G P N R [rounds]]   (default 8 1024 16 512 2); SNAP: where the
 * safety copy lives, a comma-separated list opened in turn (default "auto", the daemon's plan);
 * OFFLOAD: the optimizer's place (on | off; default the plan's, which a GPU shared with other
 * processes can turn to host memory).
 * The checkpoint: tests/bench/gpu/bench_daemon.py --make-model DIR --dims 30b-a3b-l4. */
#include "engine/engine.h"
#include "tests/gpu/gpu_check.h"

typedef struct {
    int G, P, N, R;
    int **prompt, ***resp, *Rs;
    float **rew;
    eng_update_group *g;
} batch;

static void batch_make(batch *b, int G, int P, int N, int R) {
    unsigned long long s = 11;
    *b = (batch){.G = G, .P = P, .N = N, .R = R};
    b->prompt = malloc((size_t)G * sizeof *b->prompt);
    b->resp = malloc((size_t)G * sizeof *b->resp);
    b->rew = malloc((size_t)G * sizeof *b->rew);
    b->Rs = malloc((size_t)N * sizeof *b->Rs);
    b->g = calloc((size_t)G, sizeof *b->g);
    for (int r = 0; r < N; r++) b->Rs[r] = R;
    for (int g = 0; g < G; g++) {
        b->prompt[g] = malloc((size_t)P * 4);
        gc_random_ids(b->prompt[g], P, &s);
        b->resp[g] = malloc((size_t)N * sizeof(int *));
        b->rew[g] = malloc((size_t)N * 4);
        for (int r = 0; r < N; r++) {
            b->resp[g][r] = malloc((size_t)R * 4);
            gc_random_ids(b->resp[g][r], R, &s);
            b->rew[g][r] = (float)((s = s * 6364136223846793005ULL + 1442695040888963407ULL) >> 40) / (float)(1 << 24);
        }
        b->g[g] = (eng_update_group){
            .prompt = b->prompt[g], .P = P, .n = N, .resp = (const int *const *)b->resp[g], .R = b->Rs, .reward = b->rew[g]};
    }
}

static void update_row(eng *e, const batch *b, long long mt, const char *what) {
    loss_config a;
    loss_config_default(&a);
    eng_optim o;
    eng_optim_default(&o);
    eng_update_result u;
    double t0 = gc_now();
    if (eng_update(e, b->g, b->G, &a, &o, mt, &u, NULL, NULL)) gc_die(NULL, "update");
    double wall = (gc_now() - t0) * 1e3, rest = u.ms_total - u.ms_old - u.ms_ref - u.ms_policy - u.ms_optimizer;
    printf("update %-9s mb %6lld: total %5.0f ms  old %3.0f  ref %4.0f  policy %4.0f  optim %3.0f  rest %3.0f (prepare %3.0f)  "
           "%d micro-batches, copy wait %.0f, wall %.0f\n",
           what, mt, u.ms_total, u.ms_old, u.ms_ref, u.ms_policy, u.ms_optimizer, rest, u.ms_prepare, u.micro_batches,
           u.ms_snapshot_wait, wall);
}

/* a rollout of b's prompts on s (kept open, as the daemon's): its KV pool stays until the update */
static void rollout(eng *e, eng_sched *s, const batch *b) {
    eng_rollout_group *rg = malloc((size_t)b->G * sizeof *rg);
    eng_group_result *res = calloc((size_t)b->G, sizeof *res);
    for (int g = 0; g < b->G; g++) rg[g] = (eng_rollout_group){b->prompt[g], b->P, b->N};
    eng_sampling sp;
    eng_sampling_default(&sp);
    sp.temperature = 1.0f;
    sp.ignore_eos = 1;
    sp.max_tokens = b->R;
    sp.seed = 7;
    eng_sched_job *j;
    double t0 = gc_now(), progress;
    const char *msg;
    if (eng_sched_add(s, rg, b->G, &sp, res, &j)) gc_die(NULL, "eng_sched_add");
    int rc = 0;
    while (!(rc = eng_sched_job_state(j, &progress, NULL, &msg))) eng_sched_step(s);
    if (rc < 0) fprintf(stderr, "rollout: %s\n", msg);
    if (rc < 0) gc_die(NULL, "rollout");
    eng_sched_job_release(s, j);
    printf("rollout %d x %d x %d tokens: %.0f ms\n", b->G, b->N, b->R, (gc_now() - t0) * 1e3);
    for (int g = 0; g < b->G; g++) eng_group_result_free(&res[g]);
    free(res);
    free(rg);
}

static void ref_row(eng *e, const batch *b, long long mt, const char *what) {
    float **lp;
    double t0 = gc_now();
    if (eng_logprobs(e, b->g, b->G, 1, 1.0f, mt, &lp)) gc_die(NULL, "reference logprobs");
    double ms = (gc_now() - t0) * 1e3;
    printf("ref alone %-9s mb %6lld: %4.0f ms (%.1f a group)\n", what, mt, ms, ms / b->G);
    for (int i = 0; i < b->G * b->N; i++) free(lp[i]);
    free(lp);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_moe_update MODEL_DIR [G P N R [rounds]]\n");
        return 2;
    }
    int G = argc > 5 ? atoi(argv[2]) : 8, P = argc > 5 ? atoi(argv[3]) : 1024, N = argc > 5 ? atoi(argv[4]) : 16,
        R = argc > 5 ? atoi(argv[5]) : 512, rounds = argc > 6 ? atoi(argv[6]) : 2;
    setvbuf(stdout, NULL, _IOLBF, 0); /* each row as it comes (a run cut short keeps them) */
    char snaps[64];
    snprintf(snaps, sizeof snaps, "%s", getenv("SNAP") ? getenv("SNAP") : "auto");
    batch b;
    batch_make(&b, G, P, N, R);
    for (char *sv = NULL, *where = strtok_r(snaps, ",", &sv); where; where = strtok_r(NULL, ",", &sv)) {
        double t0 = gc_now();
        eng *e;
        eng_open_opts oo = {.model_dir = argv[1], .backend = "cuda", .snapshot = where, .optimizer_offload = getenv("OFFLOAD")};
        if (eng_open(&oo, &e)) gc_die(NULL, "eng_open");
        eng_info in;
        eng_get_info(e, &in);
        const eng_plan *p = &in.plan;
        printf("opened %s in %.1f s: %lld parameters, optimizer %s, safety copy %s (%.1f GB), micro-batch %lld tokens\n", argv[1],
               gc_now() - t0, in.n_params, p->optimizer, p->snapshot_at, p->snapshot / 1e9, p->micro_batch_tokens);
        long long mt = p->micro_batch_tokens, one = P + (long long)N * R;
        eng_sched *sc;
        eng_sched_opts so = {0};
        if (eng_sched_open(e, &so, &sc)) gc_die(NULL, "eng_sched_open");
        rollout(e, sc, &b);
        update_row(e, &b, mt, "warm-up");
        for (int k = 0; k < rounds; k++) {
            rollout(e, sc, &b);
            update_row(e, &b, mt, "daemon");
            update_row(e, &b, one, "one-group");
            ref_row(e, &b, mt, "daemon");
            ref_row(e, &b, one, "one-group");
        }
        eng_sched_close(sc);
        eng_close(e);
    }
    return 0;
}
