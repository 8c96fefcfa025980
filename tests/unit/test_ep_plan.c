/* test_ep_plan.c — the memory plan of a full-parameter Qwen3-30B-A3B rank under expert
 * parallelism (48 layers, every one MoE: 128 experts of 768, top-8, hidden 2048, 32 query / 4 KV
 * heads of 128, vocabulary 151,936 untied; 30.5 B parameters), at W = 1, 2, 4, 8, printed as a
 * table: what a rank holds on its device and what the ranks of one host hold in its memory,
 * before this session (the optimizer on the device, since offload was refused with EP, and a
 * whole bf16 decode copy a rank) and now (the optimizer offloaded, the decode views' expert
 * stacks in the gradient buffer as far as it holds them, rollout/ep_decode.c).
 *   Every size is the engine's own arithmetic: the rank's layout from model_init_ep (the
 *   replicated part in W shards of 16-element blocks, its E/W experts), the activations of one
 *   update micro-batch from model_acts_bytes (one group, P + N R = 9,216 tokens, every layer
 *   recomputed, the no-grad passes' within them as plan.c's micro_batch_bytes), the rollout KV of the
 *   rank's share of 8 groups (P + N x 64 new tokens), plan.c's 5 GiB headroom.
 *   The tie to the engine: two cpu ranks of the qwen3_moe fixture with expert parallelism and
 *   the optimizer offloaded report the same weights (the decode part included), gradients and
 *   host state in their eng_info.plan as this test's arithmetic for that model, and count each
 *   other as a rank of their host (the names exchanged once at open, plan.c plan_host_peers).
 *   The host rows go through plan.c's own check (plan_host_state_fits) with the memory of the
 *   machines lent (2 H200s: 256 GiB; 4: 512 GiB; 8: 560 GiB): W = 2 is refused with a line naming
 *   both figures, W = 4 and 8 fit. No timing anywhere. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "common/err.h"
#include "engine/backend/backend.h"
#include "engine/dist/comm.h"
#include "engine/engine.h"
#include "engine/engine_testing.h"
#include "engine/format/config.h"
#include "engine/model/model.h"
#include "engine/model/moe_ep.h"

#define FIX "tests/fixtures/data/qwen3_moe"
#define GIB 1073741824.0
#define HEADROOM (5.0 * GIB) /* plan.c's PLAN_HEADROOM */

typedef struct {
    double weights, ref, grads, state, dec_whole, dec_own, acts, kv; /* bytes a rank */
    long long n_rank, n_full;
} rank_plan;

/* The rank's sizes at W (0: no expert parallelism) with act-typed elements of eb bytes. */
static int plan_of(eng_backend *be, const model_config *c, int W, int eb, int T, int groups, int P, int N, int NEW, rank_plan *p) {
    model m, f;
    model_ep ep = {0, W, NULL, NULL, NULL, NULL};
    int keep = be->act_bytes;
    be->act_bytes = eb; /* the sizes of the act type asked for (bf16 on cuda) */
    if (model_init_ep(&m, c, be, W ? &ep : NULL) || model_init(&f, c, be)) {
        be->act_bytes = keep;
        return -1;
    }
    long long n = m.n_elems, rep = W ? m.ep_n0 : n, S = W ? rep / W : n, ep_n = n - rep;
    p->n_rank = n;
    p->n_full = f.n_elems;
    p->weights = (double)n * eb;
    p->ref = (double)n * eb;
    p->grads = (double)n * 4;
    p->state = (double)(S + ep_n) * 12;
    p->dec_whole = W ? (double)f.n_elems * eb : 0;
    /* the decode views' stacks: each MoE layer's gate, up, down of E experts, placed whole */
    double stack = (double)c->E * c->Fm * c->C * eb;
    int n_moe = 0;
    for (int l = 0; l < c->L; l++) n_moe += c->mlp[l] == MLP_MOE;
    long long in_grad = (long long)(p->grads / stack), stacks = 3LL * n_moe;
    p->dec_own = W ? (double)(stacks > in_grad ? stacks - in_grad : 0) * stack : 0;
    p->acts = (double)model_acts_update_bytes(&m, T);
    if (W) /* the exchange's buffers and the experts' backward scratch beside them (plan_ep_beside) */
        p->acts += (double)moe_ep_beside_bytes(&m, T);
    int mine = (groups + (W ? W : 1) - 1) / (W ? W : 1);
    p->kv = (double)mine * (P + (double)N * NEW) * c->L * 2.0 * c->K * c->D * eb;
    model_free(&m);
    model_free(&f);
    be->act_bytes = keep;
    return 0;
}

/* ---------------------------------------------------------------- the engine's plan */

typedef struct {
    comm *c;
    eng_info in;
    int host_peers; /* eng_testing_info's */
    int beside_ok; /* the room kept beside the activations counts the scratch held (W > 1) */
    int rc;
    char msg[256];
} rank_job;

static void *open_rank(void *p) {
    rank_job *j = p;
    eng *e;
    eng_open_opts o = {.model_dir = FIX,
                       .backend = "cpu",
                       .n_threads = 1,
                       .comm = j->c,
                       .expert_parallel = 1,
                       .optimizer_offload = "on",
                       .snapshot = "none"};
    if (!(j->rc = eng_open(&o, &e))) {
        eng_get_info(e, &j->in);
        eng_testing_info t;
        eng_testing_get(e, &t);
        j->host_peers = t.host_peers;
        /* the experts' scratch the backend already holds (grown in an earlier update) is not kept
         * free again: the exchange's buffers always, the scratch less what is held */
        long long T = 4096, call = (long long)moe_ep_call_bytes(t.m, T), all = (long long)moe_ep_beside_bytes(t.m, T);
        j->beside_ok = t.world < 2 ||
            (eng_testing_ep_beside(e, T, 0) == all && eng_testing_ep_beside(e, T, 1000) == all - 1000 &&
             eng_testing_ep_beside(e, T, (size_t)1 << 40) == call && call < all);
        eng_close(e);
    }
    snprintf(j->msg, sizeof j->msg, "%s", j->rc ? err_msg() : "");
    return NULL;
}

TEST(engine_plan_matches_the_arithmetic) {
    model_config c;
    eng_backend *be;
    CHECK(config_load(FIX, &c) == 0);
    CHECK(backend_cpu_create(&be, 1) == 0);
    for (int W = 1; W <= 2; W++) {
        comm *cs[2];
        CHECK(comm_cpu_group(W, cs) == 0);
        rank_job j[2] = {{.c = cs[0]}, {.c = W > 1 ? cs[1] : NULL}};
        pthread_t th[2];
        for (int q = 0; q < W; q++) pthread_create(&th[q], NULL, open_rank, &j[q]);
        for (int q = 0; q < W; q++) pthread_join(th[q], NULL);
        CHECK_MSG(j[0].rc == 0, "W=%d: %s", W, j[0].msg);
        rank_plan p;
        CHECK(plan_of(be, &c, W, 4, 64, 1, 8, 2, 4, &p) == 0);
        const eng_plan *e = &j[0].in.plan;
        printf("  W=%d fixture: engine weights %lld grads %lld host %lld; arithmetic %.0f %.0f %.0f (decode own %.0f)\n", W,
               e->weights, e->gradients, e->host_state, p.weights + p.dec_own, p.grads, p.state, p.dec_own);
        CHECK(e->weights == (long long)(p.weights + p.dec_own));
        CHECK(e->gradients == (long long)p.grads);
        CHECK(e->host_state == (long long)p.state);
        CHECK(!strcmp(e->optimizer, "host"));
        /* the ranks' host names, exchanged once at open: threads of one process share a host */
        CHECK_MSG(j[0].beside_ok, "W=%d: the room beside the activations with the ops' scratch held", W);
        for (int q = 0; q < W; q++)
            CHECK_MSG(j[q].host_peers == W - 1, "W=%d rank %d: %d other ranks on its host", W, q, j[q].host_peers);
        for (int q = 0; q < W; q++) comm_free(cs[q]);
    }
    be->destroy(be);
}

TEST(qwen3_30b_a3b_plan) {
    model_config c;
    eng_backend *be;
    CHECK(config_load(FIX, &c) == 0);
    CHECK(backend_cpu_create(&be, 1) == 0);
    c.L = 48, c.V = 151936, c.tied = 0, c.max_pos = 40960;
    c.C = 2048, c.H = 32, c.K = 4, c.D = 128, c.E = 128, c.top_k = 8, c.Fm = 768, c.norm_topk = 1;
    for (int l = 0; l < c.L; l++) c.mlp[l] = MLP_MOE;
    const double dev = 139.8 * GIB; /* an H200 as cudaMemGetInfo gives it */
    const double ram[4] = {128 * GIB, 256 * GIB, 512 * GIB, 560 * GIB}; /* the host of 1, 2, 4, 8 lent GPUs */
    int Ws[4] = {1, 2, 4, 8}, fits[4] = {0}, fits16[4] = {0};
    printf("\n  Qwen3-30B-A3B full-parameter, bf16 act weights, fp32 master/moments/gradients; GiB a rank unless "
           "'host'; micro-batch 9,216 tokens, KV of the rank's share of 8 groups x (1024 + 16 x 64)\n");
    printf("  | W | params a rank | weights | reference | gradients | master+moments | decode copy: before -> now | "
           "activations | KV | device before | device now (of %.0f) | host now (ranks of a host) | host memory |\n",
           dev / GIB);
    printf("  | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (int i = 0; i < 4; i++) {
        int W = Ws[i];
        rank_plan p;
        CHECK(plan_of(be, &c, W, 2, 9216, 8, 1024, 16, 64, &p) == 0);
        double fixed = p.weights + p.ref + p.grads + HEADROOM;
        double before = fixed + p.state + p.dec_whole + (p.acts > p.kv ? p.acts : p.kv);
        double now = fixed + p.dec_own + (p.acts > p.kv ? p.acts : p.kv);
        double host = p.state * W;
        int hrc = eng_testing_host_state_fits((long long)host, W, (long long)ram[i]);
        fits[i] = now <= dev && hrc == 0;
        printf("  | %d | %.2f B | %.1f | %.1f | %.1f | %.1f | %.1f -> %.1f | %.1f | %.1f | %.1f | %.1f%s | %.1f | %.0f%s |\n", W,
               p.n_rank / 1e9, p.weights / GIB, p.ref / GIB, p.grads / GIB, p.state / GIB, p.dec_whole / GIB, p.dec_own / GIB,
               p.acts / GIB, p.kv / GIB, before / GIB, now / GIB, now <= dev ? "" : " (over)", host / GIB, ram[i] / GIB,
               hrc ? " (over)" : "");
        if (hrc) printf("    W=%d refused: %s\n", W, err_msg());
        err_clear();
        /* bf16 moments: 8 bytes a parameter; the load buffer (n_rank fp32) becomes the master */
        double host16 = p.state * 8 / 12 * W;
        int h16 = eng_testing_host_state_fits((long long)host16, W, (long long)ram[i]);
        fits16[i] = now <= dev && h16 == 0;
        printf("    W=%d with --optimizer-moments bf16: host %.1f GiB%s; at open the ranks' load buffers, %.1f GiB, become "
               "the masters\n",
               W, host16 / GIB, h16 ? " (over)" : "", (double)p.n_rank * 4 * W / GIB);
        err_clear();
    }
    printf("  before: master and moments on the device (EP refused offload), a whole decode copy a rank;\n"
           "  now: master and moments in host memory, the decode views' expert stacks in the gradients first.\n"
           "  W = 2 fits its devices but not its host with fp32 moments: 341 GiB of master and moments against 248;\n"
           "  with bf16 moments (8 bytes a parameter) 227 GiB, which it holds.\n");
    /* what the plan says, checked: 48 layers fit neither before nor now on one GPU or on 2 H200s with
     * 256 GiB of host memory and fp32 moments; they fit on 4 and 8, and on 2 with bf16 moments */
    CHECK(!fits[0] && !fits[1] && fits[2] && fits[3]);
    CHECK(!fits16[0] && fits16[1] && fits16[2] && fits16[3]);
    be->destroy(be);
}

int main(void) {
    RUN(engine_plan_matches_the_arithmetic);
    RUN(qwen3_30b_a3b_plan);
    return CHECK_DONE();
}
