/* test_moe_ep.c — expert parallelism in the MoE layer (engine/model/moe_ep.h) on cpu ranks
 * (threads sharing a cpu comm), against one rank holding every expert.
 *
 * A Qwen3-MoE model (E = 12, top-2, layers MoE/dense/MoE, random weights) and six groups of
 * random tokens, placed whole on W = 1..4 ranks (rank r takes groups r, r + W, ...). Rank r
 * holds experts [r E/W, (r+1) E/W) (its parameter buffer only those: their values copied by name
 * from the one-rank weights) and runs one packed micro-batch of its groups, forward and
 * backward. The reference is one rank with every expert running the same W micro-batches one
 * after another, its gradients accumulating, as the one-rank update does.
 *   - logprobs and the balance loss of each micro-batch: bit-equal (the forward's rows meet the
 *     same arithmetic; the combine sums the slots in the one-rank order);
 *   - gradients: each rank's experts against the reference's, the replicated parts summed over
 *     the ranks in rank order against the reference's; relative L2 per tensor ≤ 1e-5 (the
 *     experts' dx comes back per slot and is added to the token's row, where one rank adds the
 *     terms straight into it: fp32 rounding, 1e-7 relative, which the later layers carry);
 *   - the same at W = 3 with every layer recomputed in the backward (its experts' forward runs
 *     again, on every rank together), and at W = 3 with rank 1 given no group (a rank without
 *     tokens takes part in every exchange: its experts serve the others), and at W = 2 with a
 *     shared expert (qwen3_5_moe: replicated, beside the routed experts);
 *   - the control: with the ranks' experts shifted by one (rank r given the weights of the
 *     experts of r + 1), the logprobs differ, so the comparison sees which expert ran where;
 *   - checkpoints: W = 4 ranks holding slices of random weights (moe_ep_slice) gather them to
 *     rank 0 (moe_ep_gather): the whole vector bit-equal to the one-rank weights; written as one
 *     HF safetensors file and read back by name on W = 2 and on one rank: bit-equal slices; at
 *     W = 3 every rank gathers every expert (rollouts): each whole vector bit-equal;
 *   - the exchange's buffers after a micro-batch fit in moe_ep_call_bytes at its tokens (what
 *     eng_acts_reserve keeps free beside the activations on a device);
 *   - the layout: on every rank the replicated parameters fill [0, ep_n0) (a multiple of 16 W
 *     elements) and its experts come after;
 *   - E not divisible by W is refused with one line naming both. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "common/err.h"
#include "engine/dist/comm.h"
#include "engine/model/model.h"
#include "engine/model/moe_ep.h"
#include "engine/model/pack.h"
#include "moe_config.h"

#define NG 6
#define WMAX 4

static int shared_ = 0; /* 1: a shared expert beside the routed ones (qwen3_5_moe), replicated */
static model_config cfg(void) {
    model_config c = moe_test_config(12, 1);
    c.shared = shared_;
    return c;
}

/* ---------------------------------------------------------------- inputs */

static const int P_[NG] = {9, 1, 5, 12, 3, 7}, N_[NG] = {4, 1, 3, 2, 2, 3};
static const int R_[NG][4] = {{1, 6, 3, 8}, {5}, {4, 2, 7}, {3, 9}, {1, 2}, {6, 1, 4}};
static int *prompt_[NG], *resp_[NG][4];
static const int *rp_[NG][4];
static pack_group pg_[NG];

static void make_groups(int V) { /* once: the tests share them */
    if (prompt_[0]) return;
    unsigned long long s = 515;
    for (int g = 0; g < NG; g++) {
        prompt_[g] = malloc((size_t)P_[g] * sizeof(int));
        for (int i = 0; i < P_[g]; i++) prompt_[g][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (V - 1));
        for (int r = 0; r < N_[g]; r++) {
            resp_[g][r] = malloc((size_t)R_[g][r] * sizeof(int));
            for (int i = 0; i < R_[g][r]; i++) resp_[g][r][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (V - 1));
            rp_[g][r] = resp_[g][r];
        }
        pg_[g] = (pack_group){.prompt = prompt_[g], .P = P_[g], .N = N_[g], .resp = rp_[g], .R = R_[g]};
    }
}

static int idle_rank_ = -1; /* >= 0: this rank gets no group (its groups go to the next rank) */

/* Rank r's groups of W, in order, into out; their count. */
static int groups_of(int r, int W, pack_group *out) {
    int n = 0;
    for (int g = 0; g < NG; g++)
        if ((g % W == idle_rank_ ? (g + 1) % W : g % W) == r) out[n++] = pg_[g];
    return n;
}

/* ---------------------------------------------------------------- one micro-batch */

typedef struct {
    float *logp;
    int M;
    double aux;
} mb_out;

static int grad_mode_ = 1; /* or MODEL_ACTS_RECOMPUTE: every layer's forward runs again in the backward */

/* Forward and backward of groups (one packed micro-batch) on m: logprobs, balance loss, and the
 * gradient of Σ wl·logp + 0.5 aux added into grad. */
static int run_mb(const model *m, const float *w, float *grad, const pack_group *groups, int n, mb_out *o) {
    pack_batch b;
    model_acts a;
    model_views wv, gv;
    int rc = pack_build(&b, groups, 0, n, PACK_PACKED);
    if (rc) return rc;
    model_views_make(m, (void *)w, 4, &wv);
    model_views_make(m, grad, 4, &gv);
    rc = model_acts_init(m, &a, b.T, b.M, grad_mode_);
    model_input in;
    model_input_from_batch(&in, &b);
    in.aux_coef = 0.5f;
    float *wl = malloc((size_t)b.M * 4 + 4);
    check_fill(wl, (size_t)b.M, 77 + (unsigned long long)b.M, 1.0f);
    if (!rc) rc = model_forward(m, &wv, &a, NULL, &in, 1.0f, 0);
    o->M = b.M;
    o->logp = malloc((size_t)b.M * 4 + 4);
    if (!rc) memcpy(o->logp, a.logp, (size_t)b.M * 4);
    if (!rc) rc = model_aux_loss(m, &a, &o->aux);
    if (!rc) rc = model_backward(m, &wv, &gv, &a, &in, wl, NULL, 1.0f);
    free(wl);
    model_acts_free(m, &a);
    model_views_free(&wv);
    model_views_free(&gv);
    pack_batch_free(&b);
    return rc;
}

/* ---------------------------------------------------------------- ranks */

/* the comm hooks of model_ep (the model room does not include engine/dist) */
static int a2a_bytes(void *ctx, const void *in, const size_t *send, void *out, const size_t *recv) {
    return comm_all_to_all_v(ctx, in, send, out, recv, COMM_U8);
}
static int gather_bytes(void *ctx, const void *in, void *out, size_t bytes) {
    return comm_all_gather(ctx, in, out, bytes, COMM_U8);
}
static void abort_comm(void *ctx) { comm_abort(ctx); }

typedef struct {
    comm *c;
    int W, shift; /* shift: take the weights of the experts of rank (r + shift) mod W (the control) */
    const model *full;
    const float *wfull;
    model m;
    float *grad;
    mb_out o;
    int rc;
    char msg[256];
} rank_job;

static const model_param *param_named(const model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) return &m->params[i];
    return NULL;
}

static int is_expert(const char *name) { return strstr(name, ".mlp.experts.") != NULL; }

static void *rank_main(void *p) {
    rank_job *j = p;
    int r = comm_rank(j->c);
    eng_backend *be;
    backend_cpu_create(&be, 0);
    model_config c = cfg();
    model_ep ep = {r, j->W, a2a_bytes, gather_bytes, abort_comm, j->c};
    j->rc = model_init_ep(&j->m, &c, be, &ep);
    float *w = j->rc ? NULL : malloc((size_t)j->m.n_elems * 4);
    j->grad = j->rc ? NULL : calloc((size_t)j->m.n_elems, 4);
    for (int i = 0; !j->rc && i < j->m.n_params; i++) { /* this rank's slice of the one-rank weights, by name */
        const model_param *q = &j->m.params[i];
        char name[96];
        int l, e;
        char proj[32];
        snprintf(name, sizeof name, "%s", q->name);
        if (j->shift && sscanf(q->name, "model.layers.%d.mlp.experts.%d.%31[a-z_]", &l, &e, proj) == 3)
            snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.%s.weight", l, (e + j->shift * j->m.ep_E) % c.E, proj);
        const model_param *f = param_named(j->full, name);
        memcpy(w + q->off, j->wfull + f->off, (size_t)q->numel * 4);
    }
    for (int i = 0; !j->rc && i < j->m.n_params; i++) { /* the layout: replicated first, then the experts */
        const model_param *q = &j->m.params[i];
        if (is_expert(q->name) ? q->off < j->m.ep_n0 : q->off + q->numel > j->m.ep_n0 || j->m.ep_n0 % (16 * j->W))
            j->rc = err_set(GE_INTERNAL, "%s at %lld: on the wrong side of ep_n0 %lld", q->name, q->off, j->m.ep_n0);
    }
    pack_group mine[NG];
    int n = groups_of(r, j->W, mine);
    if (!j->rc) j->rc = run_mb(&j->m, w, j->grad, mine, n, &j->o);
    if (j->rc) {
        snprintf(j->msg, sizeof j->msg, "%s", err_msg());
        comm_abort(j->c); /* the others' exchanges end instead of waiting for this rank */
    }
    free(w);
    return NULL;
}


/* The one-rank reference: W micro-batches (rank r's groups each) on `full`, the gradients
 * accumulated in gref (calloc'd here). */
static void reference(int W, const model *full, const float *w, mb_out *ref, float **gref_out) {
    float *gref = *gref_out = calloc((size_t)full->n_elems, 4);
    for (int r = 0; r < W; r++) {
        pack_group mine[NG];
        int n = groups_of(r, W, mine);
        CHECK_MSG(run_mb(full, w, gref, mine, n, &ref[r]) == 0, "%s", err_msg());
    }
}

/* W expert-parallel ranks on threads over a cpu comm, each its micro-batch (j: their results). */
static void run_ranks(int W, int shift, const model *full, const float *wfull, rank_job *j) {
    comm *cs[WMAX];
    CHECK_EQ_INT(comm_cpu_group(W, cs), 0);
    pthread_t th[WMAX];
    for (int r = 0; r < W; r++) {
        j[r] = (rank_job){.c = cs[r], .W = W, .shift = shift, .full = full, .wfull = wfull};
        pthread_create(&th[r], NULL, rank_main, &j[r]);
    }
    for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < W; r++) CHECK_MSG(j[r].rc == 0, "W=%d rank %d: %s", W, r, j[r].msg);
}

static void ranks_free(int W, rank_job *j) {
    for (int r = 0; r < W; r++) {
        free(j[r].o.logp);
        free(j[r].grad);
        eng_backend *be = j[r].m.be;
        model_free(&j[r].m);
        be->destroy(be);
        comm_free(j[r].c);
    }
}

/* W ranks against the reference. */
static void compare(int W, const model *full, const float *wfull) {
    mb_out ref[WMAX];
    float *gref;
    reference(W, full, wfull, ref, &gref);
    rank_job j[WMAX];
    run_ranks(W, 0, full, wfull, j);
    int lp_diff = 0, aux_diff = 0;
    for (int r = 0; r < W; r++) {
        CHECK_EQ_INT(j[r].o.M, ref[r].M);
        lp_diff += memcmp(j[r].o.logp, ref[r].logp, (size_t)ref[r].M * 4) != 0;
        aux_diff += j[r].o.aux != ref[r].aux;
    }
    /* every tensor: an expert's from its rank, a replicated one summed over the ranks */
    double worst = 0;
    const char *worst_name = "";
    int experts_seen = 0;
    for (int i = 0; i < full->n_params; i++) {
        const model_param *f = &full->params[i];
        float *sum = calloc((size_t)f->numel, 4);
        for (int r = 0; r < W; r++) {
            const model_param *q = param_named(&j[r].m, f->name);
            if (!q) continue;
            experts_seen += is_expert(f->name);
            for (long long k = 0; k < f->numel; k++) sum[k] += j[r].grad[q->off + k];
        }
        double e = rel_l2(sum, gref + f->off, (size_t)f->numel);
        if (e > worst || isnan(e)) worst = e, worst_name = f->name;
        free(sum);
    }
    printf("  W=%d%s%s: logprobs %s, balance loss %s, gradients worst rel L2 %.2e (%s)\n", W,
           grad_mode_ == 1 ? "" : " (layers recomputed in the backward)",
           idle_rank_ >= 0 ? " (rank 1 without tokens)"
               : shared_   ? " (a shared expert)"
                           : "",
           lp_diff ? "DIFFER" : "bit-equal", aux_diff ? "DIFFERS" : "bit-equal", worst, worst_name);
    CHECK_MSG(!lp_diff, "W=%d: logprobs differ from one rank", W);
    CHECK_MSG(!aux_diff, "W=%d: the balance loss differs from one rank", W);
    CHECK_MSG(experts_seen == 2 * 3 * cfg().E, "W=%d: %d expert tensors held, one each wanted", W, experts_seen);
    CHECK_MSG(worst <= 1e-5, "W=%d: %s rel L2 %.3g", W, worst_name, worst);
    /* the buffers eng_acts_reserve keeps free cover what ran, on the ranks whose micro-batch is at
     * least half the largest (the estimate counts twice a rank's share received; the daemon
     * places groups by tokens, so the ranks' micro-batches are near equal there) */
    int T[WMAX], most = 0, checked = 0;
    for (int r = 0; r < W; r++) {
        pack_group mine[NG];
        pack_batch b;
        CHECK_EQ_INT(pack_build(&b, mine, 0, groups_of(r, W, mine), PACK_PACKED), 0);
        T[r] = b.T;
        most = T[r] > most ? T[r] : most;
        pack_batch_free(&b);
    }
    for (int r = 0; r < W && W > 1; r++) {
        if (2 * T[r] < most) continue;
        size_t used = j[r].m.ep_ws->cap[1], kept = moe_ep_call_bytes(&j[r].m, T[r]);
        CHECK_MSG(used > 0 && used <= kept, "W=%d rank %d: the exchange took %zu bytes, %zu kept free for %d tokens", W, r, used,
                  kept, T[r]);
        checked++;
    }
    CHECK_MSG(W == 1 || checked > 0, "W=%d: no rank's buffers checked", W);
    ranks_free(W, j);
    for (int r = 0; r < W; r++) free(ref[r].logp);
    free(gref);
}

/* The one-rank model and its random weights. */
static void full_model(model *full, eng_backend **be, float **w) {
    model_config c = cfg();
    backend_cpu_create(be, 0);
    CHECK(model_init(full, &c, *be) == 0);
    *w = malloc((size_t)full->n_elems * 4);
    check_fill(*w, (size_t)full->n_elems, 4711, 0.3f);
    make_groups(c.V);
}

TEST(expert_parallel_equals_one_rank) {
    model full;
    eng_backend *be;
    float *w;
    full_model(&full, &be, &w);
    for (int W = 1; W <= WMAX; W++) compare(W, &full, w);
    grad_mode_ = MODEL_ACTS_RECOMPUTE; /* the recompute's dispatch is a collective too */
    compare(3, &full, w);
    grad_mode_ = 1;
    idle_rank_ = 1; /* a rank without tokens still takes part in every exchange */
    compare(3, &full, w);
    idle_rank_ = -1;
    free(w);
    model_free(&full);
    be->destroy(be);
    shared_ = 1; /* the shared expert is replicated, like the router */
    full_model(&full, &be, &w);
    compare(2, &full, w);
    shared_ = 0;
    free(w);
    model_free(&full);
    be->destroy(be);
}

TEST(experts_on_the_wrong_rank_are_seen) {
    model full;
    eng_backend *be;
    float *w;
    full_model(&full, &be, &w);
    mb_out ref[2];
    float *gref;
    reference(2, &full, w, ref, &gref);
    rank_job j[2];
    run_ranks(2, 1, &full, w, j);
    double d = 0;
    for (int r = 0; r < 2; r++) d += rel_l2(j[r].o.logp, ref[r].logp, (size_t)ref[r].M);
    printf("  experts swapped between the ranks: logprobs rel L2 %.2e from one rank\n", d);
    CHECK_MSG(d > 1e-3, "swapping the ranks' experts changed the logprobs by %.3g only", d);
    ranks_free(2, j);
    for (int r = 0; r < 2; r++) free(ref[r].logp);
    free(gref);
    free(w);
    model_free(&full);
    be->destroy(be);
}

/* a and b (m's layout) hold the same parameters, bit for bit (the padding between them aside) */
static int same_params(const model *m, const float *a, const float *b) {
    for (int i = 0; i < m->n_params; i++)
        if (memcmp(a + m->params[i].off, b + m->params[i].off, (size_t)m->params[i].numel * 4)) return 0;
    return 1;
}

/* One rank of a checkpoint's round trip: its slice of wfull, then (gather) the whole vector on
 * rank 0, or (dir) its parameters read back from dir's safetensors into got. */
typedef struct {
    comm *c;
    int W;
    const model *full;
    const float *wfull;
    const char *dir; /* NULL: slice and gather */
    float *whole; /* rank 0 (every rank with all), gather: full->n_elems */
    int all;
    int rc, same;
    char msg[256];
} ck_job;

static void *ck_main(void *p) {
    ck_job *j = p;
    eng_backend *be;
    backend_cpu_create(&be, 0);
    model_config c = cfg();
    model_ep ep = {comm_rank(j->c), j->W, a2a_bytes, gather_bytes, abort_comm, j->c};
    model m;
    j->rc = model_init_ep(&m, &c, be, &ep);
    float *want = j->rc ? NULL : malloc((size_t)m.n_elems * 4), *got = j->rc ? NULL : malloc((size_t)m.n_elems * 4);
    if (!j->rc) moe_ep_slice(&m, j->full, j->wfull, want);
    if (!j->rc && !j->dir) j->rc = moe_ep_gather(&m, want, j->full, j->all || !comm_rank(j->c) ? j->whole : NULL, j->all);
    if (!j->rc && j->all) j->same = same_params(j->full, j->whole, j->wfull);
    if (!j->rc && j->dir) j->rc = model_load_host(&m, j->dir, got);
    if (!j->rc && j->dir) j->same = same_params(&m, got, want);
    if (j->rc) {
        snprintf(j->msg, sizeof j->msg, "%s", err_msg());
        comm_abort(j->c);
    }
    free(want);
    free(got);
    model_free(&m);
    be->destroy(be);
    return NULL;
}

static void ck_ranks(int W, const model *full, const float *wfull, const char *dir, float *whole, int all, int *same) {
    comm *cs[WMAX];
    CHECK_EQ_INT(comm_cpu_group(W, cs), 0);
    ck_job j[WMAX];
    pthread_t th[WMAX];
    for (int r = 0; r < W; r++) {
        j[r] = (ck_job){.c = cs[r], .W = W, .full = full, .wfull = wfull, .dir = dir, .all = all};
        j[r].whole = all ? calloc((size_t)full->n_elems, 4) : whole;
        pthread_create(&th[r], NULL, ck_main, &j[r]);
    }
    for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
    *same = 1;
    for (int r = 0; r < W; r++) {
        CHECK_MSG(j[r].rc == 0, "W=%d rank %d: %s", W, r, j[r].msg);
        *same &= j[r].same;
        if (all) free(j[r].whole);
        comm_free(cs[r]);
    }
}

TEST(checkpoint_gathers_and_loads_on_any_w) {
    model full;
    eng_backend *be;
    float *w;
    full_model(&full, &be, &w);
    float *whole = calloc((size_t)full.n_elems, 4), *back = malloc((size_t)full.n_elems * 4);
    int same;
    int every;
    ck_ranks(3, &full, w, NULL, NULL, 1, &every); /* every expert to every rank: how rollouts run */
    ck_ranks(4, &full, w, NULL, whole, 0, &same);
    int gathered = same_params(&full, whole, w);
    char dir[128];
    snprintf(dir, sizeof dir, TEST_TMP "/grpod_test_moe_ep_%d", (int)getpid());
    mkdir(dir, 0700);
    CHECK_MSG(model_save_host(&full, dir, whole, 0) == 0, "%s", err_msg());
    ck_ranks(2, &full, w, dir, NULL, 0, &same);
    CHECK_MSG(model_load_host(&full, dir, back) == 0, "%s", err_msg());
    int one = same_params(&full, back, w);
    printf("  W=3 every expert to every rank: %s; W=4 gathered: %s; read back on W=2: %s, on one rank: %s\n",
           every ? "bit-equal" : "DIFFERS", gathered ? "bit-equal" : "DIFFERS", same ? "bit-equal" : "DIFFERS",
           one ? "bit-equal" : "DIFFERS");
    CHECK(every && gathered && same && one);
    char path[256];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
    free(whole);
    free(back);
    free(w);
    model_free(&full);
    be->destroy(be);
}

TEST(experts_that_do_not_split_are_refused) {
    model_config c = cfg();
    eng_backend *be;
    backend_cpu_create(&be, 0);
    model m;
    model_ep ep = {0, 5, a2a_bytes, gather_bytes, abort_comm, NULL};
    CHECK_EQ_INT(model_init_ep(&m, &c, be, &ep), GE_UNSUPPORTED);
    CHECK_MSG(strstr(err_msg(), "12 experts") && strstr(err_msg(), "5 ranks"), "%s", err_msg());
    model_free(&m);
    be->destroy(be);
}

int main(void) {
    RUN(expert_parallel_equals_one_rank);
    RUN(experts_on_the_wrong_rank_are_seen);
    RUN(checkpoint_gathers_and_loads_on_any_w);
    RUN(experts_that_do_not_split_are_refused);
    return CHECK_DONE();
}
