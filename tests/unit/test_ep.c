/* test_ep.c — expert parallelism in the engine (eng_open_opts.expert_parallel, engine/train/ep.c)
 * on cpu ranks as threads of this process, against one rank without a comm holding every expert.
 *
 * The model: the qwen3_moe fixture's config with E = 12 experts (so W = 2, 3 and 4 divide them),
 * two MoE layers around a dense one, random weights, the balance loss on with coefficient 0.5
 * (a visible part of the loss). Seven groups of 13..24 packed tokens and max_tokens 24: every
 * micro-batch holds one group on one rank and on W, so the balance loss (a function of each
 * micro-batch's tokens) is the same sum of terms on both.
 *   - a whole update (the old pass, the reference pass with kl, three mini-batches of 3, 3, 1
 *     groups — at W = 4 three ranks have no group in the last and run empty micro-batches —
 *     two epochs, AdamW with the grad-norm clip active) and a second configuration replaying
 *     given routes (routing replay) on W = 1 (a comm of one rank), 2, 3, 4 against the one-rank
 *     update: the loss (balance loss included) and the grad norm within 1e-6 relative; the fp32
 *     master and both AdamW moments gathered whole (every expert) relative L2 <= 1e-5, taken
 *     apart for the experts and for the replicated parameters. The bound is fp32 rounding of
 *     the same sums in another order (~1e-7 seen); an expert gradient summed over ranks
 *     (doubled at W = 2) makes m's experts' error 1, a wrong shard or experts taken from another
 *     rank's range makes it O(1), and a grad norm that left out or repeated the experts' squares
 *     differs in its 3rd digit;
 *   - the logprobs after the update (eng_logprobs: every rank scores every group in lock-step)
 *     within 2e-5 of the one-rank engine's;
 *   - ranks whose memory chose different recomputed layers (the last rank every layer): the
 *     same bits as that W without the difference (ep_agree_ckpt);
 *   - checkpoints: saved by W = 4 (every expert gathered into one HF directory, the moments
 *     too), loaded on W = 2 and on one rank without expert parallelism: logprobs bit-equal to
 *     each other, and the next update from each equal as above (its moments compared too);
 *   - rollouts (the decode copy, engine/rollout/ep_decode.c): on W = 2 and 3 every rank's
 *     sampled rollouts of every group — tokens, logprobs and the recorded routes — bit-equal to
 *     one rank's without a comm; after an update replaying routes and its checkpoint, bit-equal
 *     to one rank resuming that checkpoint (the copy followed the new weights), and not equal
 *     to the rollouts before (the check could fail);
 *   - an update taken back (eng_update_undo) on W = 2 and 3, the optimizer on the device and
 *     offloaded: the state, the logprobs and every rank's rollouts bit-equal to before it;
 *   - a rank left alone in a collective fails its op in bounded time (rank_threads.h);
 *   - groups larger than a micro-batch (split, model/split.h) beside whole ones on W = 2, 3, 4
 *     equal one rank splitting the same groups;
 *   - refusals with one line: no comm, a dense model, E % W (8 experts on 3 ranks). */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "check.h"
#include "common/bf16.h"
#include "logprobs_flat.h"
#include "rank_threads.h"
#include "run_config.h"
#include "common/err.h"
#include "engine/engine.h"
#include "engine/engine_testing.h"
#include "engine/format/config.h"
#include "engine/model/model.h"
#include "engine/train/train_testing.h"

#define FIX "tests/fixtures/data"
/* under the build's scratch folder: a checkpoint directory that already holds the same version
 * is kept as that save's own result (checkpoint.c save_dir), so one shared across runs and builds
 * would be resumed stale */
#define MODEL TEST_TMP "/grpod_test_ep_model"
#define CKPT TEST_TMP "/grpod_test_ep_ckpt"
#define WMAX 4
#define NG 7
#define NCFG 2
#define MB_TOKENS 24
#define LM 2 /* MoE layers */
#define TOPK 2
#define EXPERTS 12

/* ---------------------------------------------------------------- model and inputs */

static uint64_t rs = 4242;
static uint32_t rnd(void) {
    rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rs >> 33);
}
static float frand(void) { return (float)(rnd() % 100000) / 100000.0f; }

static int V;
static int P_[NG] = {5, 9, 3, 8, 7, 4, 10}, N_[NG] = {2, 3, 2, 4, 2, 3, 2};
static int prompt_[NG][12], resp_[NG][4][9], R_[NG][4];
static const int *respp_[NG][4];
static float reward_[NG][4], old_[NG][4][9];
static const float *oldp_[NG][4];
static int proute_[NG][12 * LM * TOPK], rroute_[NG][4][9 * LM * TOPK];
static const int *rroutep_[NG][4];

static void random_routes(int *r, int n) { /* n tokens' LM x TOPK distinct experts each */
    for (int t = 0; t < n * LM; t++) {
        int a = (int)(rnd() % EXPERTS), b = (a + 1 + (int)(rnd() % (EXPERTS - 1))) % EXPERTS;
        r[t * TOPK] = a;
        r[t * TOPK + 1] = b;
    }
}

static int make_model(void) {
    model_config c;
    if (config_load(FIX "/qwen3_moe", &c)) return -1;
    c.E = EXPERTS;
    c.aux_coef = 0.5f;
    eng_backend *be;
    model m;
    if (backend_cpu_create(&be, 1) || model_init(&m, &c, be)) return -1;
    float *w = calloc((size_t)m.n_elems, 4);
    for (int i = 0; i < m.n_params; i++) {
        const model_param *p = &m.params[i];
        int norm = p->ndim == 1;
        for (long long j = 0; j < p->numel; j++) w[p->off + j] = norm ? 1.0f + 0.1f * (frand() - 0.5f) : 0.2f * (frand() - 0.5f);
    }
    mkdir(MODEL, 0700);
    int rc = config_write(MODEL, &c) || model_save_host(&m, MODEL, w, 0);
    free(w);
    model_free(&m);
    be->destroy(be);
    V = c.V;
    return rc ? -1 : 0;
}

static void make_inputs(void) {
    for (int i = 0; i < NG; i++) {
        int tok = P_[i];
        for (int t = 0; t < P_[i]; t++) prompt_[i][t] = 3 + (int)(rnd() % (unsigned)(V - 3));
        random_routes(proute_[i], P_[i]);
        for (int r = 0; r < N_[i]; r++) {
            R_[i][r] = 1 + (int)(rnd() % 5);
            tok += R_[i][r];
            for (int t = 0; t < R_[i][r]; t++) {
                resp_[i][r][t] = 3 + (int)(rnd() % (unsigned)(V - 3));
                old_[i][r][t] = -5.7f - 0.5f * frand();
            }
            random_routes(rroute_[i][r], R_[i][r]);
            respp_[i][r] = resp_[i][r];
            oldp_[i][r] = old_[i][r];
            rroutep_[i][r] = rroute_[i][r];
            reward_[i][r] = frand();
        }
        while (tok < 13) { /* two groups never share a micro-batch of 24 */
            R_[i][0]++;
            resp_[i][0][R_[i][0] - 1] = 5;
            tok++;
        }
        while (tok > MB_TOKENS) {
            for (int r = 0; r < N_[i] && tok > MB_TOKENS; r++)
                if (R_[i][r] > 1) R_[i][r]--, tok--;
        }
    }
}

static void groups(eng_update_group *g, int routes) {
    for (int i = 0; i < NG; i++)
        g[i] = (eng_update_group){.prompt = prompt_[i],
                                  .P = P_[i],
                                  .n = N_[i],
                                  .resp = respp_[i],
                                  .R = R_[i],
                                  .reward = reward_[i],
                                  .old_logprobs = oldp_[i],
                                  .prompt_routes = routes ? proute_[i] : NULL,
                                  .resp_routes = routes ? rroutep_[i] : NULL};
}

static long long mb_tokens_ = MB_TOKENS; /* the updates' max_tokens */
static int run_update(eng *e, int k, eng_update_result *u) {
    loss_config a;
    eng_optim o;
    grpo_update_config(&a, &o, 2e-3f, 0.05f, k ? 0 : 0.05f);
    a.ppo_epochs = k ? 1 : 2;
    a.use_rollout_logprobs = k; /* 0: the old pass runs */
    eng_update_group g[NG];
    groups(g, k);
    return eng_update(e, g, NG, &a, &o, mb_tokens_, u, NULL, NULL);
}

#define NPROBE (NG * 4 * 9)
/* Logprobs of every response under the policy, flattened (returns the count, or -1). */
static int probe(eng *e, float *out) {
    eng_update_group g[NG];
    groups(g, 0);
    return logprobs_flat(e, g, NG, out);
}

static const char *offload_ = "off"; /* --optimizer-offload of the ranks the tests open */
static const char *moments_; /* --optimizer-moments of the ranks the tests open (NULL: fp32) */
static eng *open_one(comm *c, const char *model, const char *resume, int ep) {
    eng *e;
    eng_open_opts o = {.model_dir = model,
                       .backend = "cpu",
                       .n_threads = 1,
                       .comm = c,
                       .resume_dir = resume,
                       .expert_parallel = ep,
                       .optimizer_offload = c ? offload_ : "off",
                       .optimizer_moments = c ? moments_ : NULL};
    return eng_open(&o, &e) ? NULL : e;
}

/* Rollouts of every group (sampled, seed 7, 6 tokens, routes recorded): tokens, logprobs and
 * routes flattened, -1 and NaN-free, to compare bit for bit. */
#define RMAX (NG * 4 * (6 + 12 + 7 * LM * TOPK) * 4)
struct roll {
    int tok[RMAX], rt[RMAX * LM * TOPK];
    float lp[RMAX];
    int n_tok, n_rt;
};
static int rollout(eng *e, struct roll *r) {
    eng_rollout_group g[NG];
    for (int i = 0; i < NG; i++) g[i] = (eng_rollout_group){prompt_[i], P_[i], N_[i]};
    eng_sampling sp;
    fixed_sampling(&sp, 1.0f, 6, 7);
    eng_group_result out[NG];
    if (eng_rollout(e, g, NG, &sp, out, NULL, NULL)) return -1;
    r->n_tok = r->n_rt = 0;
    for (int i = 0; i < NG; i++) {
        for (int t = 0; out[i].prompt_routes && t < P_[i] * LM * TOPK; t++) r->rt[r->n_rt++] = out[i].prompt_routes[t];
        for (int q = 0; q < out[i].n; q++) {
            eng_response *x = &out[i].resp[q];
            for (int t = 0; t < x->n_tokens; t++) {
                r->tok[r->n_tok] = x->tokens[t];
                r->lp[r->n_tok++] = x->logprobs[t];
            }
            for (int t = 0; x->routes && t < x->n_tokens * LM * TOPK; t++) r->rt[r->n_rt++] = x->routes[t];
        }
        eng_group_result_free(&out[i]);
    }
    return 0;
}
static int same_roll(const struct roll *a, const struct roll *b) {
    return a->n_tok == b->n_tok && a->n_rt == b->n_rt && a->n_tok > 0 && a->n_rt > 0 &&
        !memcmp(a->tok, b->tok, (size_t)a->n_tok * 4) && !memcmp(a->lp, b->lp, (size_t)a->n_tok * 4) &&
        !memcmp(a->rt, b->rt, (size_t)a->n_rt * 4);
}

/* ---------------------------------------------------------------- ranks as threads */

typedef enum {
    OP_OPEN = RANK_OPEN,
    OP_SAVE = RANK_SAVE,
    OP_CLOSE = RANK_CLOSE,
    OP_UPDATE = RANK_OPS,
    OP_STATE,
    OP_PROBE,
    OP_ROLL,
    OP_UNDO,
    OP_STRAY,
    OP_RECOMPUTE
} op_t;
typedef struct {
    rank_head h; /* first: rank_threads.h */
    eng_update_result u;
    float *st[3]; /* rank 0: the gathered master, m, v */
    long long empty; /* OP_UPDATE: the empty passes the rank's lock-step ran */
    float lp[NPROBE];
    int n_lp;
    struct roll *roll; /* OP_ROLL: the rollouts' tokens, logprobs and routes */
} rank_job;

static int rank_op(rank_head *h) {
    rank_job *j = (rank_job *)h;
    switch (h->op) {
    case OP_OPEN: h->e = open_one(h->c, MODEL, h->dir, 1); return h->e ? 0 : -1;
    case OP_UPDATE: {
        int rc = run_update(h->e, h->k, &j->u);
        eng_testing_info t;
        eng_testing_get(h->e, &t);
        j->empty = t.ep_empty;
        return rc;
    }
    case OP_STATE: return eng_testing_state(h->e, j->st[0], j->st[1], j->st[2]);
    case OP_PROBE: j->n_lp = probe(h->e, j->lp); return j->n_lp < 0;
    case OP_ROLL: return rollout(h->e, j->roll);
    case OP_UNDO: return eng_update_undo(h->e);
    case OP_STRAY: return h->c && comm_rank(h->c) == 0 ? comm_barrier(h->c) : 0; /* the others never enter it */
    case OP_RECOMPUTE: { /* the last rank's memory recomputes every layer, the others' none */
        eng_testing_info t;
        eng_testing_get(h->e, &t);
        if (t.rank == t.world - 1) eng_testing_acts_ckpt(h->e, t.m->cfg.L);
        return 0;
    }
    }
    return -1;
}

static int all_ranks(rank_job *j, int W, op_t op, int k, const char *dir) { return rank_all(j, sizeof *j, W, op, k, dir); }
static int open_world(int W, comm **cs, rank_job *j, const char *resume) {
    return rank_open_world(j, sizeof *j, W, rank_op, cs, resume);
}
static void close_world(int W, comm **cs, rank_job *j) { rank_close_world(j, sizeof *j, W, cs); }

/* ---------------------------------------------------------------- comparisons */

static long long N; /* elements of the whole model (every expert) */
static const model *M; /* its layout: the one-rank engine's model */

/* relative L2 of a against b over the expert parameters (experts = 1) or the others */
static double part_err(const float *a, const float *b, int experts) {
    double num = 0, den = 0;
    for (int i = 0; i < M->n_params; i++) {
        const model_param *p = &M->params[i];
        if ((strstr(p->name, ".mlp.experts.") != NULL) != experts) continue;
        for (long long j = p->off; j < p->off + p->numel; j++) {
            double d = (double)a[j] - b[j];
            num += d * d;
            den += (double)b[j] * b[j];
        }
    }
    return sqrt(num / (den > 0 ? den : 1e-30));
}

static float *ref_st[NCFG][3];
static eng_update_result ref_u[NCFG];
static float ref_lp[NCFG][NPROBE];

static int close_rel(double a, double b, double rel) { return fabs(a - b) <= 1e-6 + rel * fabs(b); }

/* W ranks' update k against a one-rank reference (ru, rst, rlp); 0 when every bound holds. */
static int compare_update_to(rank_job *j, int W, int k, const eng_update_result *ru, float *const rst[3], const float *rlp) {
    static const char *what[3] = {"master", "adam_m", "adam_v"};
    int bad = 0;
    for (int q = 1; q < W; q++) bad |= j[q].u.loss != j[0].u.loss || j[q].u.grad_norm != j[0].u.grad_norm;
    if (!close_rel(j[0].u.loss, ru->loss, 1e-6) || !close_rel(j[0].u.grad_norm, ru->grad_norm, 1e-6)) {
        printf("  W=%d cfg %d: loss %.9g vs %.9g, grad_norm %.9g vs %.9g\n", W, k, j[0].u.loss, ru->loss, j[0].u.grad_norm,
               ru->grad_norm);
        bad = 1;
    }
    for (int i = 0; i < 3; i++) {
        double ex = part_err(j[0].st[i], rst[i], 1), rp = part_err(j[0].st[i], rst[i], 0);
        if (i > 0 || ex > 1e-7 || rp > 1e-7)
            printf("  W=%d cfg %d %s: rel L2 experts %.2e, replicated %.2e\n", W, k, what[i], ex, rp);
        bad |= !(ex <= 1e-5 && rp <= 1e-5);
    }
    double mx = 0;
    for (int i = 0; i < j[0].n_lp; i++) mx = fmax(mx, fabs(j[0].lp[i] - rlp[i]));
    for (int q = 1; q < W; q++) bad |= memcmp(j[q].lp, j[0].lp, sizeof j[0].lp) != 0;
    printf("  W=%d cfg %d: loss %.7f grad_norm %.6f, logprobs after max |d| %.2e\n", W, k, j[0].u.loss, j[0].u.grad_norm, mx);
    /* one rank holds every expert: the MoE op itself runs, the same bits as without expert
     * parallelism (the grad norm aside: its squares are summed in two pieces, the shard's and the
     * experts', within the bound above) */
    if (W == 1) {
        int same = j[0].u.loss == ru->loss && !memcmp(j[0].lp, rlp, (size_t)j[0].n_lp * 4);
        for (int i = 0; i < 3; i++) same &= !memcmp(j[0].st[i], rst[i], (size_t)N * 4);
        if (!same)
            printf("  W=1 cfg %d: not bit-equal to the engine without expert parallelism (equal: loss %d logprobs %d master %d "
                   "m %d v %d)\n",
                   k, j[0].u.loss == ru->loss, !memcmp(j[0].lp, rlp, (size_t)j[0].n_lp * 4),
                   !memcmp(j[0].st[0], rst[0], (size_t)N * 4), !memcmp(j[0].st[1], rst[1], (size_t)N * 4),
                   !memcmp(j[0].st[2], rst[2], (size_t)N * 4));
        bad |= !same;
    }
    return bad || mx > 2e-5;
}

/* ... against the one-rank reference of one_rank_reference */
static int compare_update(rank_job *j, int W, int k) { return compare_update_to(j, W, k, &ref_u[k], ref_st[k], ref_lp[k]); }

static void alloc_st(float *st[3]) {
    for (int i = 0; i < 3; i++) st[i] = calloc((size_t)N, 4);
}
static void free_st(float *st[3]) {
    for (int i = 0; i < 3; i++) free(st[i]);
}

/* ---------------------------------------------------------------- tests */

static eng *ref_e;

TEST(one_rank_reference) {
    CHECK_EQ_INT(make_model(), 0);
    make_inputs();
    for (int k = 0; k < NCFG; k++) {
        ref_e = open_one(NULL, MODEL, NULL, 0);
        CHECK_MSG(ref_e, "%s", err_msg());
        eng_testing_info t;
        eng_testing_get(ref_e, &t);
        N = t.n_params;
        CHECK_MSG(run_update(ref_e, k, &ref_u[k]) == 0, "%s", err_msg());
        alloc_st(ref_st[k]);
        CHECK(eng_testing_state(ref_e, ref_st[k][0], ref_st[k][1], ref_st[k][2]) == 0);
        CHECK(probe(ref_e, ref_lp[k]) > 0);
        printf("  cfg %d: loss %.7f grad_norm %.6f (clip 0.05) steps %d micro-batches %d\n", k, ref_u[k].loss, ref_u[k].grad_norm,
               ref_u[k].optimizer_steps, ref_u[k].micro_batches);
        if (k < NCFG - 1) eng_close(ref_e);
    }
    eng_testing_info t;
    eng_testing_get(ref_e, &t);
    M = t.m; /* kept open for its layout */
}

/* rank 0's results at W = 1..3 without offload: what the offloaded ranks must give bit for bit */
#define WOFF 3
static float *ep_st[WOFF + 1][NCFG][3];
static eng_update_result ep_u[WOFF + 1][NCFG];
static float ep_lp[WOFF + 1][NCFG][NPROBE];
static long long ep_empty[WOFF + 1][WMAX]; /* cfg 0: each rank's empty passes */

TEST(ep_update_equals_one_rank) {
    for (int W = 1; W <= WMAX; W++)
        for (int k = 0; k < NCFG; k++) {
            comm *cs[WMAX];
            rank_job j[WMAX];
            CHECK_MSG(open_world(W, cs, j, NULL) == 0, "W=%d open", W);
            for (int q = 0; q < W; q++) alloc_st(j[q].st); /* every rank asks for the same vectors */
            CHECK_MSG(all_ranks(j, W, OP_UPDATE, k, NULL) == 0, "W=%d cfg %d update", W, k);
            CHECK(all_ranks(j, W, OP_STATE, 0, NULL) == 0);
            CHECK(all_ranks(j, W, OP_PROBE, 0, NULL) == 0);
            CHECK_MSG(compare_update(j, W, k) == 0, "W=%d cfg %d differs from one rank", W, k);
            if (W <= WOFF) { /* kept for the offloaded ranks */
                memcpy(ep_st[W][k], j[0].st, sizeof j[0].st);
                ep_u[W][k] = j[0].u;
                memcpy(ep_lp[W][k], j[0].lp, sizeof j[0].lp);
                for (int q = 0; q < W && k == 0; q++) ep_empty[W][q] = j[q].empty;
            }
            for (int q = W <= WOFF; q < W; q++) free_st(j[q].st);
            close_world(W, cs, j);
        }
}

/* Ranks whose memory chose different checkpointed layers (here the last recomputes every layer,
 * the others none): model_backward's refill of a checkpointed MoE layer is a forward exchange,
 * so the ranks agree on the most (ep_agree_ckpt) and the update is bit-equal to the same W
 * without the difference (recomputing gives the kept activations' bits), with the same empty
 * passes on every rank. Without the agreement the backwards are passes of different kinds: the
 * gate (ep_gate) still meets them, each with an empty one, and the counts grow. */
TEST(ep_ranks_recompute_alike) {
    for (int W = 2; W <= WOFF; W++) {
        comm *cs[WMAX];
        rank_job j[WMAX];
        CHECK_MSG(ep_st[W][0][0], "W=%d: no result of ep_update_equals_one_rank to compare with", W);
        CHECK_MSG(open_world(W, cs, j, NULL) == 0, "W=%d open", W);
        for (int q = 0; q < W; q++) alloc_st(j[q].st);
        CHECK(all_ranks(j, W, OP_RECOMPUTE, 0, NULL) == 0);
        CHECK_MSG(all_ranks(j, W, OP_UPDATE, 0, NULL) == 0, "W=%d update with the last rank recomputing", W);
        CHECK(all_ranks(j, W, OP_STATE, 0, NULL) == 0);
        CHECK(all_ranks(j, W, OP_PROBE, 0, NULL) == 0);
        int same = j[0].u.loss == ep_u[W][0].loss && j[0].u.grad_norm == ep_u[W][0].grad_norm &&
            !memcmp(j[0].lp, ep_lp[W][0], sizeof j[0].lp);
        for (int i = 0; i < 3; i++) same &= !memcmp(j[0].st[i], ep_st[W][0][i], (size_t)N * 4);
        printf("  W=%d, the last rank recomputing every layer: %s the same W without\n", W, same ? "bit-equal to" : "DIFFERS from");
        CHECK_MSG(same, "W=%d: ranks recomputing different layers changed the update", W);
        for (int q = 0; q < W; q++)
            CHECK_MSG(j[q].empty == ep_empty[W][q], "W=%d rank %d: %lld empty passes, %lld without the difference", W, q,
                      j[q].empty, ep_empty[W][q]);
        for (int q = 0; q < W; q++) free_st(j[q].st);
        close_world(W, cs, j);
    }
}

/* Groups larger than a micro-batch (model/split.h: the prompt once, the responses in chunks) under
 * expert parallelism: with max_tokens the smallest group's tokens, the larger groups split and
 * the smallest stay whole, so ranks run passes of different kinds and counts (split groups' prompt forward,
 * response chunks and prompt backward beside whole micro-batches, or nothing); ep_gate meets
 * each rank's pass with the others' (empty ones filling in). W = 2, 3, 4 against one rank
 * without expert parallelism that splits the same groups: the same bounds as the updates above.
 * Before the gate such an update was refused. */
TEST(ep_split_groups_equal_one_rank) {
    int tok[NG], lo = 1 << 30, hi = 0, split = 0;
    for (int i = 0; i < NG; i++) {
        tok[i] = P_[i];
        for (int r = 0; r < N_[i]; r++) tok[i] += R_[i][r];
        lo = tok[i] < lo ? tok[i] : lo;
        hi = tok[i] > hi ? tok[i] : hi;
    }
    mb_tokens_ = lo; /* every group larger than the smallest splits */
    for (int i = 0; i < NG; i++) split += tok[i] > mb_tokens_;
    printf("  groups of %d..%d tokens: %d of %d split at max_tokens %lld\n", lo, hi, split, NG, mb_tokens_);
    CHECK(split > 0 && split < NG);
    for (int k = 0; k < NCFG; k++) {
        eng *one = open_one(NULL, MODEL, NULL, 0);
        CHECK_MSG(one, "%s", err_msg());
        eng_update_result ru;
        float *rst[3], rlp[NPROBE];
        alloc_st(rst);
        CHECK_MSG(run_update(one, k, &ru) == 0, "one rank, cfg %d: %s", k, err_msg());
        CHECK(eng_testing_state(one, rst[0], rst[1], rst[2]) == 0);
        CHECK(probe(one, rlp) > 0);
        eng_close(one);
        for (int W = 2; W <= WMAX; W++) {
            comm *cs[WMAX];
            rank_job j[WMAX];
            CHECK_MSG(open_world(W, cs, j, NULL) == 0, "W=%d open", W);
            for (int q = 0; q < W; q++) alloc_st(j[q].st);
            CHECK_MSG(all_ranks(j, W, OP_UPDATE, k, NULL) == 0, "W=%d cfg %d update with split groups", W, k);
            CHECK(all_ranks(j, W, OP_STATE, 0, NULL) == 0);
            CHECK(all_ranks(j, W, OP_PROBE, 0, NULL) == 0);
            CHECK_MSG(compare_update_to(j, W, k, &ru, rst, rlp) == 0, "W=%d cfg %d with split groups differs from one rank", W, k);
            for (int q = 0; q < W; q++) free_st(j[q].st);
            close_world(W, cs, j);
        }
        free_st(rst);
    }
}

/* Optimizer offload under expert parallelism (train/state.c: the shard's and the experts'
 * master and moments in host memory, stepped there piece by piece): on the cpu backend the host
 * AdamW is the backend's own arithmetic, so W = 1, 2, 3 offloaded ranks give the bits of the
 * same W without offload — the loss, the grad norm, the logprobs after, and the master and
 * both moments gathered whole (every expert) — and so equal one rank as above. A shard's or an
 * expert piece's state stepped at the wrong place, left unstepped, or gathered from the wrong
 * memory changes those bits. Then a checkpoint saved by the offloaded W = 3 resumes on offloaded
 * W = 2 with the same master and moments (gathered back whole, bit for bit). */
TEST(ep_offload_equals_ep) {
    static const char *what[3] = {"master", "adam_m", "adam_v"};
    offload_ = "on";
    for (int W = 1; W <= WOFF; W++)
        for (int k = 0; k < NCFG; k++) {
            comm *cs[WMAX];
            rank_job j[WMAX];
            CHECK_MSG(ep_st[W][k][0], "W=%d cfg %d: no result of ep_update_equals_one_rank to compare with", W, k);
            CHECK_MSG(open_world(W, cs, j, NULL) == 0, "W=%d open with offload", W);
            eng_info in;
            eng_get_info(j[0].h.e, &in);
            CHECK_MSG(!strcmp(in.plan.optimizer, "host"), "W=%d: the optimizer is on the %s", W, in.plan.optimizer);
            for (int q = 0; q < W; q++) alloc_st(j[q].st);
            CHECK_MSG(all_ranks(j, W, OP_UPDATE, k, NULL) == 0, "W=%d cfg %d offloaded update", W, k);
            CHECK(all_ranks(j, W, OP_STATE, 0, NULL) == 0);
            CHECK(all_ranks(j, W, OP_PROBE, 0, NULL) == 0);
            int same = j[0].u.loss == ep_u[W][k].loss && j[0].u.grad_norm == ep_u[W][k].grad_norm &&
                !memcmp(j[0].lp, ep_lp[W][k], sizeof j[0].lp);
            for (int i = 0; i < 3; i++) {
                int eq = !memcmp(j[0].st[i], ep_st[W][k][i], (size_t)N * 4);
                if (!eq)
                    printf("  W=%d cfg %d %s: rel L2 experts %.2e, replicated %.2e from the ranks without offload\n", W, k,
                           what[i], part_err(j[0].st[i], ep_st[W][k][i], 1), part_err(j[0].st[i], ep_st[W][k][i], 0));
                same &= eq;
            }
            printf("  W=%d cfg %d offloaded: %s the same W without offload\n", W, k, same ? "bit-equal to" : "DIFFERS from");
            CHECK_MSG(same, "W=%d cfg %d: the offloaded update differs from the one on the device", W, k);
            CHECK_MSG(compare_update(j, W, k) == 0, "W=%d cfg %d offloaded differs from one rank", W, k);
            if (W == WOFF && k == 0) { /* its checkpoint, resumed on W = 2 */
                CHECK(system("rm -rf " CKPT "_off") == 0);
                CHECK(all_ranks(j, W, OP_SAVE, 0, CKPT "_off") == 0);
            }
            for (int q = 0; q < W; q++) free_st(j[q].st);
            close_world(W, cs, j);
        }
    comm *cs[WMAX];
    rank_job j[WMAX];
    CHECK(open_world(2, cs, j, CKPT "_off") == 0);
    for (int q = 0; q < 2; q++) alloc_st(j[q].st);
    CHECK(all_ranks(j, 2, OP_STATE, 0, NULL) == 0);
    int same = 1;
    for (int i = 0; i < 3; i++) same &= !memcmp(j[0].st[i], ep_st[WOFF][0][i], (size_t)N * 4);
    printf("  checkpoint of offloaded W=3 on offloaded W=2: master and moments %s\n", same ? "bit-equal" : "DIFFER");
    CHECK_MSG(same, "the offloaded W=3 checkpoint resumed on W=2 differs");
    for (int q = 0; q < 2; q++) free_st(j[q].st);
    close_world(2, cs, j);
    offload_ = "off";
    for (int W = 1; W <= WOFF; W++)
        for (int k = 0; k < NCFG; k++) free_st(ep_st[W][k]);
}

/* The control: the bound sees an expert gradient counted twice (AdamW's m is linear in it). */
TEST(control_doubled_expert_gradient) {
    float *m2 = malloc((size_t)N * 4);
    memcpy(m2, ref_st[0][1], (size_t)N * 4);
    for (int i = 0; i < M->n_params; i++)
        if (strstr(M->params[i].name, ".mlp.experts."))
            for (long long j = M->params[i].off; j < M->params[i].off + M->params[i].numel; j++) m2[j] *= 2;
    double ex = part_err(m2, ref_st[0][1], 1);
    printf("  m with the experts' gradient doubled: rel L2 %.2f\n", ex);
    CHECK(ex > 1e-5);
    free(m2);
}

TEST(checkpoint_w4_resumes_on_w2_and_one_rank) {
    comm *cs[WMAX];
    rank_job j[WMAX];
    float *st4[3];
    CHECK(open_world(4, cs, j, NULL) == 0);
    for (int q = 0; q < 4; q++) alloc_st(j[q].st);
    CHECK(all_ranks(j, 4, OP_UPDATE, 0, NULL) == 0);
    CHECK(all_ranks(j, 4, OP_STATE, 0, NULL) == 0);
    alloc_st(st4);
    for (int i = 0; i < 3; i++) memcpy(st4[i], j[0].st[i], (size_t)N * 4);
    CHECK(system("rm -rf " CKPT) == 0);
    CHECK(all_ranks(j, 4, OP_SAVE, 0, CKPT) == 0);
    for (int q = 0; q < 4; q++) free_st(j[q].st);
    close_world(4, cs, j);
    /* on W = 2 with expert parallelism: the master and both moments as W = 4 left them (each
     * rank's shard and experts read back), then the next update */
    CHECK(open_world(2, cs, j, CKPT) == 0);
    for (int q = 0; q < 2; q++) alloc_st(j[q].st);
    CHECK(all_ranks(j, 2, OP_STATE, 0, NULL) == 0);
    for (int i = 0; i < 3; i++)
        CHECK_MSG(!memcmp(j[0].st[i], st4[i], (size_t)N * 4), "W=4's checkpoint on W=2: array %d (0 master, 1 m, 2 v) differs", i);
    free_st(st4);
    CHECK(all_ranks(j, 2, OP_PROBE, 0, NULL) == 0);
    float lp2[NPROBE];
    memcpy(lp2, j[0].lp, sizeof lp2);
    CHECK(all_ranks(j, 2, OP_UPDATE, 1, NULL) == 0);
    CHECK(all_ranks(j, 2, OP_STATE, 0, NULL) == 0);
    CHECK(all_ranks(j, 2, OP_PROBE, 0, NULL) == 0);
    /* on one rank without: the reference of the next update */
    eng *e = open_one(NULL, MODEL, CKPT, 0);
    CHECK_MSG(e, "%s", err_msg());
    float lp1[NPROBE];
    int n = probe(e, lp1);
    CHECK(n > 0);
    CHECK_MSG(memcmp(lp1, lp2, (size_t)n * 4) == 0, "logprobs of the checkpoint on W=2 and on one rank differ");
    free_st(ref_st[1]);
    alloc_st(ref_st[1]);
    CHECK_MSG(run_update(e, 1, &ref_u[1]) == 0, "%s", err_msg());
    CHECK(eng_testing_state(e, ref_st[1][0], ref_st[1][1], ref_st[1][2]) == 0);
    CHECK(probe(e, ref_lp[1]) > 0);
    CHECK_MSG(compare_update(j, 2, 1) == 0, "the next update after the checkpoint differs");
    for (int q = 0; q < 2; q++) free_st(j[q].st);
    close_world(2, cs, j);
    eng_close(e);
}

/* bf16 moments (--optimizer-moments bf16, the offloaded state of 8 bytes a parameter) under
 * expert parallelism: after an update on W = 2 the moments are bf16 values near the fp32 ones
 * of the same update; its checkpoint resumes on W = 3 and on W = 1 to the same master and
 * moments bit for bit (each rank's bf16 shard and experts gathered, then scattered again). */
TEST(ep_bf16_moments_checkpoint_crosses_w) {
    comm *cs[WMAX];
    rank_job j[WMAX];
    float *f32[3], *b16[3];
    offload_ = "on";
    CHECK(open_world(2, cs, j, NULL) == 0);
    for (int q = 0; q < 2; q++) alloc_st(j[q].st);
    CHECK(all_ranks(j, 2, OP_UPDATE, 0, NULL) == 0 && all_ranks(j, 2, OP_STATE, 0, NULL) == 0);
    alloc_st(f32);
    for (int i = 0; i < 3; i++) memcpy(f32[i], j[0].st[i], (size_t)N * 4);
    for (int q = 0; q < 2; q++) free_st(j[q].st);
    close_world(2, cs, j);
    moments_ = "bf16";
    CHECK(open_world(2, cs, j, NULL) == 0);
    for (int q = 0; q < 2; q++) alloc_st(j[q].st);
    CHECK(all_ranks(j, 2, OP_UPDATE, 0, NULL) == 0 && all_ranks(j, 2, OP_STATE, 0, NULL) == 0);
    CHECK(system("rm -rf " CKPT "_m16") == 0);
    CHECK(all_ranks(j, 2, OP_SAVE, 0, CKPT "_m16") == 0);
    alloc_st(b16);
    for (int i = 0; i < 3; i++) memcpy(b16[i], j[0].st[i], (size_t)N * 4);
    long long not_bf16 = 0, nonzero = 0;
    for (int i = 1; i < 3; i++)
        for (long long k = 0; k < N; k++) {
            not_bf16 += b16[i][k] != f32_from_bf16(bf16_from_f32(b16[i][k]));
            nonzero += b16[i][k] != 0;
        }
    double e_m = rel_l2(b16[1], f32[1], N), e_v = rel_l2(b16[2], f32[2], N);
    printf("  W=2 bf16 moments vs fp32: m %.2e, v %.2e rel L2; %lld not bf16 values, %lld nonzero\n", e_m, e_v, not_bf16, nonzero);
    CHECK(not_bf16 == 0 && nonzero > N / 2 && e_m > 0 && e_m < 1e-2 && e_v < 1e-2);
    for (int q = 0; q < 2; q++) free_st(j[q].st);
    close_world(2, cs, j);
    for (int W = 3; W >= 1; W -= 2) {
        CHECK_MSG(open_world(W, cs, j, CKPT "_m16") == 0, "W=%d resume", W);
        for (int q = 0; q < W; q++) alloc_st(j[q].st);
        CHECK(all_ranks(j, W, OP_STATE, 0, NULL) == 0);
        int same = 1;
        for (int i = 0; i < 3; i++) same &= !memcmp(j[0].st[i], b16[i], (size_t)N * 4);
        printf("  the W=2 bf16 checkpoint on W=%d: master and moments %s\n", W, same ? "bit-equal" : "DIFFER");
        CHECK_MSG(same, "W=%d: the resumed state differs", W);
        for (int q = 0; q < W; q++) free_st(j[q].st);
        close_world(W, cs, j);
    }
    free_st(f32);
    free_st(b16);
    moments_ = NULL;
    offload_ = "off";
}

/* Rollouts under expert parallelism decode the gathered decode copy (rollout/ep_decode.c): on
 * W = 2 and 3 every rank's rollouts of every group (sampled, routes recorded for routing
 * replay) are bit-equal to one rank's without a comm; after an update (routing replay of those
 * routes, with the balance loss) and its checkpoint, bit-equal to one rank resuming it, so the
 * copy followed the new weights; and they differ from the rollouts before the update. */
TEST(ep_rollouts_equal_one_rank) {
    static struct roll ref, ref2, got[WMAX], before;
    CHECK(system("rm -rf " CKPT "_roll1 " CKPT "_roll2 " CKPT "_roll3") == 0);
    eng *e = open_one(NULL, MODEL, NULL, 0);
    CHECK_MSG(e, "%s", err_msg());
    CHECK_MSG(rollout(e, &ref) == 0, "%s", err_msg());
    eng_close(e);
    printf("  one rank: %d tokens, %d route entries\n", ref.n_tok, ref.n_rt);
    for (int W = 1; W <= 3; W++) {
        comm *cs[WMAX];
        rank_job j[WMAX];
        CHECK(open_world(W, cs, j, NULL) == 0);
        eng_testing_info t;
        eng_testing_get(j[0].h.e, &t);
        printf("  W=%d: the decode views' expert stacks: %lld bytes in the gradient buffer, %lld in their own\n", W,
               t.dec_grad_bytes, t.dec_own_bytes);
        CHECK_MSG(t.dec_grad_bytes > 0, "W=%d: the gradient buffer holds no stack", W);
        CHECK_MSG(W == 1 || t.dec_own_bytes > 0, "W=%d: every stack in the gradients (the test covers both places)", W);
        for (int q = 0; q < W; q++) j[q].roll = &got[q];
        CHECK_MSG(all_ranks(j, W, OP_ROLL, 0, NULL) == 0, "%s", err_msg());
        for (int q = 0; q < W; q++) CHECK_MSG(same_roll(&got[q], &ref), "W=%d rank %d: rollouts differ from one rank's", W, q);
        before = got[0];
        CHECK(all_ranks(j, W, OP_UPDATE, 1, NULL) == 0);
        char dir[64]; /* a directory a W: a save of the same policy version into one is taken as done */
        snprintf(dir, sizeof dir, "%s_roll%d", CKPT, W);
        CHECK(all_ranks(j, W, OP_SAVE, 0, dir) == 0);
        CHECK_MSG(all_ranks(j, W, OP_ROLL, 0, NULL) == 0, "%s", err_msg());
        close_world(W, cs, j);
        e = open_one(NULL, MODEL, dir, 0);
        CHECK_MSG(e, "%s", err_msg());
        CHECK_MSG(rollout(e, &ref2) == 0, "%s", err_msg());
        eng_close(e);
        CHECK_MSG(!same_roll(&ref2, &before), "the update changed no rollout: the test could not fail");
        for (int q = 0; q < W; q++)
            CHECK_MSG(same_roll(&got[q], &ref2), "W=%d rank %d: rollouts after the update differ from one rank's", W, q);
        printf("  W=%d: every rank bit-equal to one rank, before and after an update\n", W);
    }
}

/* An update taken back (eng_update_undo: the safety copy of the master and moments restored,
 * the act weights made again from the master piece by piece — the shard's and this rank's
 * experts', train/state.c state_act_from_master — then the decode copy gathered again) leaves
 * W = 2 and 3 ranks, the optimizer on the device and offloaded, as they were before it, bit for
 * bit: the master and both moments gathered whole, the logprobs and every rank's rollouts. The
 * update itself changed the logprobs (the check could fail); act weights of the experts left
 * as the update made them change them again. */
TEST(ep_undo_restores_the_state) {
    static struct roll before[WMAX], after[WMAX];
    static const char *modes[2] = {"off", "on"};
    for (int o = 0; o < 2; o++)
        for (int W = 2; W <= 3; W++) {
            offload_ = modes[o];
            comm *cs[WMAX];
            rank_job j[WMAX];
            float *st0[3], lp0[NPROBE];
            CHECK(open_world(W, cs, j, NULL) == 0);
            alloc_st(st0);
            for (int q = 0; q < W; q++) {
                alloc_st(j[q].st);
                j[q].roll = &before[q];
            }
            CHECK(all_ranks(j, W, OP_STATE, 0, NULL) == 0);
            CHECK(all_ranks(j, W, OP_PROBE, 0, NULL) == 0);
            CHECK(all_ranks(j, W, OP_ROLL, 0, NULL) == 0);
            for (int i = 0; i < 3; i++) memcpy(st0[i], j[0].st[i], (size_t)N * 4);
            memcpy(lp0, j[0].lp, sizeof lp0);
            CHECK(all_ranks(j, W, OP_UPDATE, 0, NULL) == 0);
            CHECK(all_ranks(j, W, OP_PROBE, 0, NULL) == 0);
            CHECK_MSG(memcmp(lp0, j[0].lp, sizeof lp0) != 0, "W=%d: the update changed no logprob: the test could not fail", W);
            CHECK_MSG(all_ranks(j, W, OP_UNDO, 0, NULL) == 0, "W=%d offload %s: undo", W, modes[o]);
            for (int q = 0; q < W; q++) j[q].roll = &after[q];
            CHECK(all_ranks(j, W, OP_STATE, 0, NULL) == 0);
            CHECK(all_ranks(j, W, OP_PROBE, 0, NULL) == 0);
            CHECK(all_ranks(j, W, OP_ROLL, 0, NULL) == 0);
            int same_st = 1, same_roll_all = 1;
            for (int i = 0; i < 3; i++) same_st &= !memcmp(st0[i], j[0].st[i], (size_t)N * 4);
            for (int q = 0; q < W; q++) same_roll_all &= same_roll(&before[q], &after[q]);
            int same_lp = !memcmp(lp0, j[0].lp, sizeof lp0);
            printf("  W=%d offload %s: after the undo state %s, logprobs %s, rollouts %s\n", W, modes[o],
                   same_st ? "bit-equal" : "DIFFERS", same_lp ? "bit-equal" : "DIFFER", same_roll_all ? "bit-equal" : "DIFFER");
            CHECK_MSG(same_st && same_lp && same_roll_all, "W=%d offload %s: the undo did not restore the state", W, modes[o]);
            free_st(st0);
            for (int q = 0; q < W; q++) free_st(j[q].st);
            close_world(W, cs, j);
        }
    offload_ = "off";
}

/* A rank left waiting in a collective the others never enter (as when a code path gathers on
 * some ranks only) fails the op in bounded time instead of hanging the binary (rank_threads.h:
 * the group is aborted past the bound, the waiting rank returns GE_COMM). */
TEST(a_rank_left_waiting_fails) {
    comm *cs[2];
    rank_job j[2];
    memset(j, 0, sizeof j);
    CHECK(comm_cpu_group(2, cs) == 0);
    for (int q = 0; q < 2; q++) {
        j[q].h.c = cs[q];
        j[q].h.fn = rank_op;
    }
    int keep = rank_bound_s;
    rank_bound_s = 1;
    int bad = all_ranks(j, 2, OP_STRAY, 0, NULL);
    rank_bound_s = keep;
    rank_hung = 0; /* on purpose: the next tests keep the whole bound */
    CHECK_MSG(bad, "the stray collective passed");
    CHECK_EQ_INT(j[0].h.rc, GE_COMM);
    CHECK_EQ_INT(j[1].h.rc, 0);
    for (int q = 0; q < 2; q++) comm_free(cs[q]);
}

TEST(refusals) {
    eng *e;
    eng_open_opts o = {.model_dir = MODEL, .backend = "cpu", .n_threads = 1, .expert_parallel = 1};
    CHECK_EQ_INT(eng_open(&o, &e), GE_UNSUPPORTED);
    printf("  no comm: %s\n", err_msg());
    comm *c;
    CHECK_EQ_INT(comm_cpu_group(1, &c), 0);
    o.comm = c;
    o.model_dir = FIX "/qwen3";
    CHECK_EQ_INT(eng_open(&o, &e), GE_UNSUPPORTED);
    printf("  dense: %s\n", err_msg());
    CHECK(strstr(err_msg(), "mixture-of-experts") != NULL);
    o.model_dir = MODEL;
    CHECK_MSG(eng_open(&o, &e) == 0, "%s", err_msg());
    eng_close(e);
    comm_free(c);
    comm *c3[3];
    CHECK_EQ_INT(comm_cpu_group(3, c3), 0);
    /* 8 experts on 3 ranks: every rank refuses alone (model_init_ep), before any collective */
    o.comm = c3[0];
    o.model_dir = FIX "/qwen3_moe";
    CHECK_EQ_INT(eng_open(&o, &e), GE_UNSUPPORTED);
    printf("  E %% W: %s\n", err_msg());
    for (int q = 0; q < 3; q++) comm_free(c3[q]);
    eng_close(ref_e);
}

/* Each test starts from the default options: one that fails before it sets them back (a CHECK
 * returns) leaves no offload or bf16 moments to the tests after it. */
#define RUN_EP(name) \
    do { \
        offload_ = "off"; \
        moments_ = NULL; \
        mb_tokens_ = MB_TOKENS; \
        RUN(name); \
    } while (0)

int main(void) {
    RUN_EP(one_rank_reference);
    RUN_EP(ep_update_equals_one_rank);
    RUN_EP(ep_ranks_recompute_alike);
    RUN_EP(ep_split_groups_equal_one_rank);
    RUN_EP(ep_offload_equals_ep);
    RUN_EP(ep_bf16_moments_checkpoint_crosses_w);
    RUN_EP(control_doubled_expert_gradient);
    RUN_EP(checkpoint_w4_resumes_on_w2_and_one_rank);
    RUN_EP(ep_rollouts_equal_one_rank);
    RUN_EP(ep_undo_restores_the_state);
    RUN_EP(a_rank_left_waiting_fails);
    RUN_EP(refusals);
    return CHECK_DONE();
}
