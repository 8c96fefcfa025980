/* test_hybrid_split.c — a hybrid model's group split over micro-batches (engine/model/split.h)
 * equals the one-graph packed layout on the CPU backend: the prompt's forward once hands each
 * DeltaNet layer's final recurrent state and conv tail (the carry, kernels/deltanet.h) to every
 * response micro-batch, whose backwards add the carry's gradients up for the prompt's backward;
 * the gated attention layers read the cached prompt K/V and sum its gradients as full attention
 * does.
 *
 * Models: the fixtures of test_hybrid.c (qwen3_5_text, qwen3_5_text_b: other conv width and head
 * ratios, a DeltaNet last layer; qwen3_5_moe_text; qwen3_next, qwen3_next_b: MoE layers, fused
 * projections). Groups: P 9 (above the conv), P 2 (below it: the tail holds zeros before the
 * prompt), P 1; ragged responses with R = 1 and R < the conv, at a budget of the longest
 * response, which gives 3 and more response micro-batches. The loss weighs every logprob and
 * entropy with random weights. Tolerance 1e-5 relative (L2 over all logprobs / each gradient
 * tensor): the schedules sum the same terms in other orders (the prompt's state gradient is a
 * sum over micro-batches of partial sums), fp32 rounding only. The forward-only form gives the
 * same logprobs, and with the prompt's saved activations through host memory the same again.
 *
 * The carry's gradients carry real weight: with the state gradient dropped (ds_out), or the conv
 * tail's (dtail_out), the gradients leave the one-graph ones by more than 1e-3.
 * Whole updates split by the budget against one graph: test_update_split.c. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "loaded_model.h"
#include "common/err.h"
#include "engine/model/model.h"
#include "engine/model/pack.h"
#include "engine/model/split.h"

#define FIX "tests/fixtures/data"

/* a fixture by its folder's name */
static void load(loaded *x, const char *name) {
    char dir[256];
    snprintf(dir, sizeof dir, FIX "/%s", name);
    loaded_open(x, dir);
}

/* ---------------------------------------------------------------- groups */

enum { NG = 3, NMAX = 5 };
static const int P_[NG] = {9, 2, 1}, N_[NG] = {4, 4, 5}, R_[NG][NMAX] = {{1, 6, 3, 8}, {4, 5, 2, 7}, {2, 3, 1, 3, 2}};
/* budgets: the longest response of each group (3, 3 and 4 micro-batches: split_resp_batches) */
static const long long MT[NG] = {8, 7, 3};

typedef struct {
    int *prompt[NG], *resp[NG][NMAX];
    const int *rp[NG][NMAX];
    pack_group pg[NG];
    long long M, Mg[NG + 1];
} groups;

static void groups_make(groups *G, int V, unsigned long long seed) {
    memset(G, 0, sizeof *G);
    unsigned long long s = seed;
    for (int g = 0; g < NG; g++) {
        G->prompt[g] = malloc((size_t)P_[g] * sizeof(int));
        for (int i = 0; i < P_[g]; i++) G->prompt[g][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (V - 1));
        for (int r = 0; r < N_[g]; r++) {
            G->resp[g][r] = malloc((size_t)R_[g][r] * sizeof(int));
            for (int i = 0; i < R_[g][r]; i++) G->resp[g][r][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (V - 1));
            G->rp[g][r] = G->resp[g][r];
            G->M += R_[g][r];
        }
        G->Mg[g + 1] = G->M;
        G->pg[g] = (pack_group){.prompt = G->prompt[g], .P = P_[g], .N = N_[g], .resp = G->rp[g], .R = R_[g]};
    }
}

static void groups_free(groups *G) {
    for (int g = 0; g < NG; g++) {
        for (int r = 0; r < N_[g]; r++) free(G->resp[g][r]);
        free(G->prompt[g]);
    }
}

/* ---------------------------------------------------------------- the two schedules */

typedef struct {
    float *logp, *ent, *grad;
} run_out;

static void run_free(run_out *o) {
    free(o->logp);
    free(o->ent);
    free(o->grad);
}

/* Every group in one packed graph: logprobs, entropies, the gradient of Σ wl·logp + we·ent. */
static void run_packed(loaded *x, const groups *G, const float *wl, const float *we, run_out *o) {
    pack_batch b;
    CHECK(pack_build(&b, G->pg, 0, NG, PACK_PACKED) == 0);
    model_acts a;
    CHECK(model_acts_init(&x->m, &a, b.T, b.M, 1) == 0);
    model_input in;
    model_input_from_batch(&in, &b);
    o->grad = calloc((size_t)x->m.n_elems, 4);
    o->logp = malloc((size_t)b.M * 4);
    o->ent = malloc((size_t)b.M * 4);
    model_views gv;
    model_views_make(&x->m, o->grad, 4, &gv);
    CHECK_MSG(model_forward(&x->m, &x->wv, &a, NULL, &in, 0.8f, 1) == 0, "%s", err_msg());
    memcpy(o->logp, a.logp, (size_t)b.M * 4);
    memcpy(o->ent, a.ent, (size_t)b.M * 4);
    CHECK(model_backward(&x->m, &x->wv, &gv, &a, &in, wl, we, 0.8f) == 0);
    model_views_free(&gv);
    model_acts_free(&x->m, &a);
    pack_batch_free(&b);
}

/* The loss callback: dlogp, dent of responses [r0, r1) are the fixed weights. */
typedef struct {
    const float *wl, *we;
    float *dlogp, *dent;
    const long long *off;
    int calls;
} cb_ud;
static int cb_loss(void *ud, int r0, int r1) {
    cb_ud *u = ud;
    for (long long i = u->off[r0]; i < u->off[r1]; i++) {
        u->dlogp[i] = u->wl[i];
        u->dent[i] = u->we[i];
    }
    u->calls++;
    return 0;
}

/* Every group through split_train at its budget (dormant set on the device, or through host
 * memory), and through split_forward: o->ent holds the forward-only logprobs. *micro: the
 * response micro-batches of each group, at least. */
static void run_split(loaded *x, const groups *G, const float *wl, const float *we, int offload, run_out *o, int *micro) {
    size_t M = (size_t)G->M;
    float *ent = malloc(M * 4), *dl = malloc(M * 4), *de = malloc(M * 4);
    o->logp = malloc(M * 4);
    o->ent = malloc(M * 4);
    o->grad = calloc((size_t)x->m.n_elems, 4);
    model_views gv;
    model_views_make(&x->m, o->grad, 4, &gv);
    *micro = 1 << 30;
    for (int g = 0; g < NG; g++) {
        const pack_group *pg = &G->pg[g];
        long long o0 = G->Mg[g], off[NMAX + 1] = {0};
        for (int r = 0; r < pg->N; r++) off[r + 1] = off[r] + pg->R[r];
        split_opts so = {MT[g], 0.8f, offload, NULL};
        cb_ud u = {wl + o0, we + o0, dl + o0, de + o0, off, 0};
        split_stats ss, fs;
        CHECK_MSG(split_train(&x->m, &x->wv, &gv, pg, &so, o->logp + o0, ent + o0, dl + o0, de + o0, cb_loss, &u, &ss) == 0,
                  "split_train: %s", err_msg());
        CHECK_EQ_INT(u.calls, ss.n_micro);
        CHECK_EQ_INT(ss.offloaded, offload);
        *micro = ss.n_micro < *micro ? ss.n_micro : *micro;
        CHECK_MSG(split_forward(&x->m, &x->wv, pg, &so, o->ent + o0, NULL, &fs) == 0, "split_forward: %s", err_msg());
        CHECK_EQ_INT(fs.n_micro, ss.n_micro);
    }
    model_views_free(&gv);
    free(ent);
    free(dl);
    free(de);
}

/* ---------------------------------------------------------------- the carry's gradients dropped */

/* The cpu backend's DeltaNet backwards, with the gradient from outside dropped: DROP_STATE the
 * prompt's state gradient (ds_out), DROP_TAIL its conv tail's (dtail_out). */
enum { DROP_NONE, DROP_STATE, DROP_TAIL };
static int drop;
static void (*rule_bwd0)(eng_backend *, void *, void *, void *, float *, float *, float *, float *, const void *, const void *,
                         const void *, const void *, const void *, const void *, attn_ranges, const deltanet_carry *, int, int,
                         int, int, int);
static void (*conv_bwd0)(eng_backend *, void *, float *, const void *, const void *, const void *, attn_ranges,
                         const deltanet_carry *, int, int, int);
static void rule_bwd_drop(eng_backend *b, void *du, void *da, void *db, float *dal, float *ddt, float *st, float *dst,
                          const void *dy, const void *u, const void *a, const void *bb, const void *al, const void *dt,
                          attn_ranges r, const deltanet_carry *cy, int T, int Hk, int Hv, int Dk, int Dv) {
    deltanet_carry c = cy ? *cy : (deltanet_carry){0};
    if (drop == DROP_STATE) c.ds_out = NULL;
    rule_bwd0(b, du, da, db, dal, ddt, st, dst, dy, u, a, bb, al, dt, r, cy ? &c : NULL, T, Hk, Hv, Dk, Dv);
}
static void conv_bwd_drop(eng_backend *b, void *dx, float *dw, const void *du, const void *x, const void *w, attn_ranges r,
                          const deltanet_carry *cy, int T, int Cc, int Kc) {
    deltanet_carry c = cy ? *cy : (deltanet_carry){0};
    if (drop == DROP_TAIL) c.dtail_out = NULL;
    conv_bwd0(b, dx, dw, du, x, w, r, cy ? &c : NULL, T, Cc, Kc);
}

/* ---------------------------------------------------------------- model level */

TEST(hybrid_split_equals_packed) {
    static const char *models[] = {"qwen3_5_text", "qwen3_5_text_b", "qwen3_5_moe_text", "qwen3_next", "qwen3_next_b"};
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        loaded x;
        load(&x, models[mi]);
        groups G;
        groups_make(&G, x.cfg.V, 7101 + mi);
        size_t M = (size_t)G.M, n = (size_t)x.m.n_elems;
        float *wl = malloc(M * 4), *we = malloc(M * 4);
        check_fill(wl, M, 7201 + mi, 1.0f);
        check_fill(we, M, 7301 + mi, 1.0f);
        run_out pk = {0};
        run_packed(&x, &G, wl, we, &pk);
        for (int offload = 0; offload < 2; offload++) {
            run_out sp;
            int micro;
            run_split(&x, &G, wl, we, offload, &sp, &micro);
            double el = rel_l2(sp.logp, pk.logp, M), ef = rel_l2(sp.ent, pk.logp, M), eg = rel_l2(sp.grad, pk.grad, n), worst = 0;
            const char *wn = "";
            for (int i = 0; i < x.m.n_params; i++) {
                const model_param *p = &x.m.params[i];
                double e = rel_l2(sp.grad + p->off, pk.grad + p->off, (size_t)p->numel);
                if (e > worst) worst = e, wn = p->name;
            }
            printf("  %-16s %s: >= %d micro-batches a group; vs one graph: logprobs %.2e forward-only %.2e gradients %.2e "
                   "(worst tensor %.2e %s)\n",
                   models[mi], offload ? "dormant via host" : "on device", micro, el, ef, eg, worst, wn);
            CHECK(micro >= 3);
            CHECK_MSG(el <= 1e-5 && ef <= 1e-5 && eg <= 1e-5, "%s: split differs: %.3g %.3g %.3g", models[mi], el, ef, eg);
            CHECK_MSG(worst <= 1e-5, "%s: %s rel L2 %.3g", models[mi], wn, worst);
            run_free(&sp);
        }
        /* the carry's gradients dropped, one at a time: the gradients leave the one graph's */
        rule_bwd0 = x.be->deltanet_rule_bwd;
        conv_bwd0 = x.be->deltanet_conv_bwd;
        x.be->deltanet_rule_bwd = rule_bwd_drop;
        x.be->deltanet_conv_bwd = conv_bwd_drop;
        for (drop = DROP_STATE; drop <= DROP_TAIL; drop++) {
            run_out sp;
            int micro;
            run_split(&x, &G, wl, we, 0, &sp, &micro);
            double eg = rel_l2(sp.grad, pk.grad, n), el = rel_l2(sp.logp, pk.logp, M);
            printf("  %-16s %s gradient dropped: logprobs %.2e, gradients %.2e\n", models[mi],
                   drop == DROP_STATE ? "state" : "conv tail", el, eg);
            CHECK(el <= 1e-5);
            CHECK_MSG(eg > 1e-3, "%s: dropping the %s gradient moves the gradients by %.3g only", models[mi],
                      drop == DROP_STATE ? "state" : "conv tail", eg);
            run_free(&sp);
        }
        x.be->deltanet_rule_bwd = rule_bwd0;
        x.be->deltanet_conv_bwd = conv_bwd0;
        run_free(&pk);
        free(wl);
        free(we);
        groups_free(&G);
        loaded_close(&x);
    }
}

/* A backend whose DeltaNet ops take no carry (no_hybrid_split: cuda's today) refuses the split
 * in one line naming why and the budget to raise, for training and scoring alike. */
TEST(hybrid_split_refused_without_a_carry) {
    loaded x;
    load(&x, "qwen3_5_text");
    groups G;
    groups_make(&G, x.cfg.V, 7401);
    x.be->no_hybrid_split = "no carry here";
    float *lp = malloc((size_t)G.M * 4);
    split_opts so = {MT[0], 1.0f, 0, NULL};
    CHECK(split_forward(&x.m, &x.wv, &G.pg[0], &so, lp, NULL, NULL) == GE_UNSUPPORTED);
    CHECK_MSG(strstr(err_msg(), "no carry here") && strstr(err_msg(), "raise max_tokens_per_micro_batch"), "%s", err_msg());
    CHECK(split_train(&x.m, &x.wv, &x.wv, &G.pg[0], &so, lp, NULL, lp, NULL, cb_loss, NULL, NULL) == GE_UNSUPPORTED);
    x.be->no_hybrid_split = NULL;
    free(lp);
    groups_free(&G);
    loaded_close(&x);
}

int main(void) {
    RUN(hybrid_split_equals_packed);
    RUN(hybrid_split_refused_without_a_carry);
    return CHECK_DONE();
}
