/* test_dp.c — the data-parallel update (engine/train/dp.c) on the cpu comm: W = 2, 3, 4 ranks
 * as threads of this process, each with its own engine on the embedded default model, against
 * one rank without a comm.
 *
 *   - ragged groups (P 3..12, N 1..4, R 1..9, random tokens, rewards and old logprobs) and five
 *     algorithm configurations, one per loss_agg_mode, together covering every estimator, both
 *     loss modes, kl on/off, entropy, several mini-batches and epochs, the on-policy single step,
 *     masked truncations, loss masks (three configurations; one response all context), veRL's
 *     rollout correction (two: IcePop with sequence rejection, sequence IS with token rejection:
 *     rejections made on one rank reach every rank's denominators), filtered
 *     groups, groups split across micro-batches, and the grad-norm clip (active: grad_clip 0.05):
 *     after the update every rank's weights equal the one-rank update within |Δ| <= 1e-6 +
 *     1e-5 |w| — fp32 rounding of the gradient summed in another order (ranks, then the shards'
 *     sum of squares), carried through AdamW; the observed worst is printed (~1e-8). Every rank's
 *     result struct equals the others' bit for bit, and the one-rank result within 1e-6
 *     relative (the metric sums are taken in another order);
 *   - a comm of one rank takes the same sharded path (every collective the identity) and gives
 *     the no-comm update bit for bit (weights and result);
 *   - eng_update_undo on every rank brings back the weights before the update bit for bit;
 *   - a non-finite gradient on one rank fails every rank together, each restoring its shard;
 *   - a checkpoint saved by W = 3 loads on one rank (same logprobs, bit for bit: rank 0 writes
 *     the gathered fp32 master), and one saved by one rank loads on W = 3 (each rank takes its
 *     shard); the next update from either agrees with the other's;
 *   - with optimizer offload (the shards in host memory) W = 2, 3 equal one rank the same way, and
 *     a checkpoint from W = 2 with offload loads on one rank without it (bit-equal logprobs);
 *   - LoRA with a comm is refused with a message;
 *   - eng_place_groups is deterministic and balanced (largest first to the least loaded rank).
 * Threads: each rank's engine is opened, used and closed on its own thread with 1 OpenMP thread. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "logprobs_flat.h"
#include "rank_threads.h"
#include "common/err.h"
#include "engine/engine.h"
#include "engine/engine_testing.h"

#define MODEL TEST_TMP "/grpod_test_dp_model"
#define CKPT TEST_TMP "/grpod_test_dp_ckpt"
#define WMAX 4
#define NG 7
#define NCFG 5
#define LR 2e-3f
#define MB_TOKENS 24 /* tokens a micro-batch: several per mini-batch, and some groups split */

/* ---------------------------------------------------------------- inputs */

static int V;
static int P_[NG] = {5, 9, 3, 12, 7, 4, 10}, N_[NG] = {2, 3, 1, 4, 2, 3, 2};
static int prompt_[NG][12], resp_[NG][4][9], R_[NG][4], trunc_[NG][4];
static const int *respp_[NG][4];
static float reward_[NG][4], adv_[NG][4], old_[NG][4][9];
static const float *oldp_[NG][4];
static unsigned char lmask_[NG][4][9];
static const unsigned char *lmaskp_[NG][4];

static uint64_t rs = 12345;
static uint32_t rnd(void) {
    rs = rs * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rs >> 33);
}
static float frand(void) { return (float)(rnd() % 100000) / 100000.0f; }

static void make_inputs(void) {
    for (int i = 0; i < NG; i++) {
        for (int t = 0; t < P_[i]; t++) prompt_[i][t] = 3 + (int)(rnd() % (unsigned)(V - 3));
        for (int r = 0; r < N_[i]; r++) {
            R_[i][r] = 1 + (int)(rnd() % 9);
            for (int t = 0; t < R_[i][r]; t++) {
                resp_[i][r][t] = 3 + (int)(rnd() % (unsigned)(V - 3));
                old_[i][r][t] = -5.5f - 0.6f * frand(); /* near log(1/V): ratios around 1, some clipped */
            }
            respp_[i][r] = resp_[i][r];
            oldp_[i][r] = old_[i][r];
            reward_[i][r] = frand();
            adv_[i][r] = 2 * frand() - 1;
            trunc_[i][r] = rnd() % 4 == 0;
        }
    }
    reward_[5][0] = reward_[5][1] = reward_[5][2] = 0.25f; /* uniform: filter_groups drops it */
    for (int i = 0; i < NG; i++) /* loss masks (configs 0, 2, 3): ~30% context tokens */
        for (int r = 0; r < N_[i]; r++) {
            for (int t = 0; t < R_[i][r]; t++) lmask_[i][r][t] = rnd() % 10 < 7;
            lmaskp_[i][r] = lmask_[i][r];
        }
    memset(lmask_[3][1], 0, sizeof lmask_[3][1]); /* a response all context: dropped by its mask */
}

static void groups(eng_update_group *g, int with_old) {
    for (int i = 0; i < NG; i++)
        g[i] = (eng_update_group){.prompt = prompt_[i],
                                  .P = P_[i],
                                  .n = N_[i],
                                  .resp = respp_[i],
                                  .R = R_[i],
                                  .reward = reward_[i],
                                  .old_logprobs = with_old ? oldp_[i] : NULL,
                                  .truncated = trunc_[i]};
}

/* Configuration k: its loss_config (agg mode k) and whether advantages are given. */
static void config(int k, loss_config *a, eng_optim *o, int *given) {
    loss_config_default(a);
    eng_optim_default(o);
    o->lr = LR;
    o->grad_clip = 0.05f; /* below every norm seen here: the clip is active */
    a->agg = (loss_agg_mode)k;
    *given = 0;
    switch (k) {
    case 0:
        a->adv = ADV_GRPO;
        a->kl_coef = 0.05f;
        a->kl = KL_K3;
        a->entropy_coeff = 0.01f;
        a->ppo_mini_batch_size = 3;
        a->ppo_epochs = 2;
        a->use_rollout_logprobs = 1;
        break;
    case 1:
        a->adv = ADV_DRGRPO;
        a->kl_coef = 0;
        break; /* one step, on-policy: the policy pass is the old pass */
    case 2: /* rollout correction: IcePop and a sequence-level rejection (old_ as rollout logprobs) */
        a->adv = ADV_RLOO;
        a->kl_coef = 0.02f;
        a->kl = KL_K1;
        a->ppo_mini_batch_size = 2;
        a->rollout_is = RIS_TOKEN;
        a->rollout_is_threshold = 1.25f;
        a->rollout_is_threshold_lower = 0.8f;
        a->rollout_rs = RRS_SEQ_MEAN_K3;
        a->rollout_rs_threshold = 0.05f;
        break;
    case 3:
        a->adv = ADV_GIVEN;
        *given = 1;
        a->mode = LOSS_GSPO;
        a->mask_truncated = 1;
        a->ppo_mini_batch_size = 4;
        a->use_rollout_logprobs = 1;
        break;
    default: /* rollout correction: sequence-level truncated IS, token-level rejection */
        a->rollout_is = RIS_SEQUENCE;
        a->rollout_is_threshold = 2.0f;
        a->rollout_rs = RRS_TOKEN_K2;
        a->rollout_rs_threshold = 0.05f;
        a->adv = ADV_GRPO;
        a->filter_groups = 1;
        a->ppo_mini_batch_size = 3;
        a->kl_coef = 0.01f;
        a->kl = KL_K2;
        a->entropy_coeff = 0.02f;
        break;
    }
}

static int run_update(eng *e, int k, eng_update_result *u) {
    loss_config a;
    eng_optim o;
    int given;
    config(k, &a, &o, &given);
    eng_update_group g[NG];
    groups(g, a.use_rollout_logprobs || rcorr_enabled(&a));
    for (int i = 0; i < NG && (k == 0 || k == 2 || k == 3); i++) g[i].loss_mask = lmaskp_[i];
    if (given)
        for (int i = 0; i < NG; i++) {
            g[i].advantage = adv_[i];
            g[i].reward = NULL;
        }
    return eng_update(e, g, NG, &a, &o, MB_TOKENS, u, NULL, NULL);
}

/* Logprobs of every response under the policy, flattened (returns the count, or -1). */
static int probe(eng *e, float *out) {
    eng_update_group g[NG];
    groups(g, 0);
    return logprobs_flat(e, g, NG, out);
}
#define NPROBE (NG * 4 * 9)

static const char *offload_; /* optimizer_offload of the engines opened next (NULL: auto, off on cpu) */

static eng *open_rank(comm *c, const char *resume) {
    eng *e;
    eng_open_opts o = {
        .model_dir = MODEL, .backend = "cpu", .n_threads = 1, .comm = c, .resume_dir = resume, .optimizer_offload = offload_};
    return eng_open(&o, &e) ? NULL : e;
}

/* ---------------------------------------------------------------- ranks as threads */

typedef enum { OP_OPEN = RANK_OPEN, OP_SAVE = RANK_SAVE, OP_CLOSE = RANK_CLOSE, OP_UPDATE = RANK_OPS, OP_UNDO, OP_PROBE } op_t;
typedef struct {
    rank_head h; /* first: rank_threads.h */
    eng_update_result u;
    float lp[NPROBE];
    int n_lp;
} rank_job;

static int rank_op(rank_head *h) {
    rank_job *j = (rank_job *)h;
    switch (h->op) {
    case OP_OPEN: h->e = open_rank(h->c, h->dir); return h->e ? 0 : -1;
    case OP_UPDATE: return run_update(h->e, h->k, &j->u);
    case OP_UNDO: return eng_update_undo(h->e);
    case OP_PROBE: j->n_lp = probe(h->e, j->lp); return j->n_lp < 0;
    }
    return -1;
}

static int all_ranks(rank_job *j, int W, op_t op, int k, const char *dir) { return rank_all(j, sizeof *j, W, op, k, dir); }
static int open_world(int W, comm **cs, rank_job *j, const char *resume) {
    return rank_open_world(j, sizeof *j, W, rank_op, cs, resume);
}
static void close_world(int W, comm **cs, rank_job *j) { rank_close_world(j, sizeof *j, W, cs); }

/* ---------------------------------------------------------------- comparisons */

static long long n_elems(eng *e) {
    eng_testing_info t;
    eng_testing_get(e, &t);
    return t.n_params;
}

/* e's weights as host fp32 (engine/engine_testing.h) in scratch slot s (0 or 1), valid until the
 * next call with that slot. Every engine here has the default model's n_elems. */
static float *wbuf_[2];
static const float *weights(eng *e, int s) {
    if (!wbuf_[s]) wbuf_[s] = malloc((size_t)n_elems(e) * 4);
    if (eng_testing_weights(e, wbuf_[s])) printf("  weights: %s\n", err_msg());
    return wbuf_[s];
}

/* How far weights a are from the reference b, both reached from w0 by an update of learning rate
 * lr: the relative L2 error of the update (a - w0 against b - w0) and the largest |a - b| in units
 * of lr. Tolerances (weights_ok): rel L2 <= 1e-5 — fp32 rounding of a gradient summed in another
 * order (ranks, then micro-batches), ~1.5e-6 observed; max |a - b| <= 0.01 lr — AdamW divides by
 * sqrt(v), so an element whose gradient nearly cancels sees its rounding amplified, bounded by the
 * step itself (lr); ~1e-3 lr observed. */
typedef struct {
    double rel_l2, max_lr;
} w_err;
static w_err weight_err(const float *a, const float *b, const float *w0, long long n, float lr) {
    double num = 0, den = 0, mx = 0;
    for (long long i = 0; i < n; i++) {
        double d = (double)a[i] - b[i], u = (double)b[i] - w0[i];
        num += d * d;
        den += u * u;
        if (fabs(d) > mx) mx = fabs(d);
    }
    return (w_err){sqrt(num / (den > 0 ? den : 1e-30)), mx / lr};
}
static int weights_ok(w_err x) { return x.rel_l2 <= 1e-5 && x.max_lr <= 0.01; }

static int same_result(const eng_update_result *a, const eng_update_result *b) {
    return a->loss == b->loss && a->pg_loss == b->pg_loss && a->kl == b->kl && a->entropy == b->entropy &&
        a->clip_frac == b->clip_frac && a->ratio_mean == b->ratio_mean && a->ratio_max == b->ratio_max &&
        a->grad_norm == b->grad_norm && a->lr == b->lr && a->tokens_packed == b->tokens_packed &&
        a->groups_filtered == b->groups_filtered && a->optimizer_steps == b->optimizer_steps &&
        a->micro_batches == b->micro_batches && a->policy_version_after == b->policy_version_after &&
        a->rollout_corr == b->rollout_corr && !memcmp(&a->rc, &b->rc, sizeof a->rc);
}

/* The one-rank result within 1e-6 + rel |b|: the metrics are sums of O(1) terms taken in another
 * order, and those of later mini-batches are measured on weights that already differ at rounding
 * (~7e-8 absolute observed on the loss). */
static const char *close_result(const eng_update_result *a, const eng_update_result *b, double rel) {
    const double x[] = {a->loss,           a->pg_loss,    a->kl,        a->entropy,   a->clip_frac, a->clip_frac_low,
                        a->clip_frac_high, a->ratio_mean, a->ratio_max, a->grad_norm, a->lr},
                 y[] = {b->loss,           b->pg_loss,    b->kl,        b->entropy,   b->clip_frac, b->clip_frac_low,
                        b->clip_frac_high, b->ratio_mean, b->ratio_max, b->grad_norm, b->lr};
    static const char *names[] = {"loss",           "pg_loss",    "kl",        "entropy",   "clip_frac", "clip_frac_low",
                                  "clip_frac_high", "ratio_mean", "ratio_max", "grad_norm", "lr"};
    for (int i = 0; i < 11; i++)
        if (fabs(x[i] - y[i]) > 1e-6 + rel * fabs(y[i])) {
            printf("  %s %.10g vs %.10g\n", names[i], x[i], y[i]);
            return names[i];
        }
    if (a->tokens_packed != b->tokens_packed || a->tokens_standard != b->tokens_standard) return "tokens";
    if (a->groups_filtered != b->groups_filtered || a->optimizer_steps != b->optimizer_steps) return "steps";
    if (a->policy_version_after != b->policy_version_after) return "policy_version";
    /* the rollout correction's metrics: from the old pass, before any step: sums in rank order */
    const double p[] = {a->rc.kl,      a->rc.k3_kl,  a->rc.abs_diff_mean,      a->rc.abs_diff_max,
                        a->rc.is_mean, a->rc.is_max, a->rc.rs_masked_fraction, a->rc.rs_seq_masked_fraction},
                 q[] = {b->rc.kl,      b->rc.k3_kl,  b->rc.abs_diff_mean,      b->rc.abs_diff_max,
                        b->rc.is_mean, b->rc.is_max, b->rc.rs_masked_fraction, b->rc.rs_seq_masked_fraction};
    for (int i = 0; i < 8; i++)
        if (a->rollout_corr != b->rollout_corr || fabs(p[i] - q[i]) > 1e-6 + rel * fabs(q[i])) return "rollout_corr";
    return NULL;
}

/* ---------------------------------------------------------------- tests */

TEST(placement_is_balanced_and_deterministic) {
    long long w[9] = {5, 40, 12, 12, 7, 30, 1, 22, 12};
    int r[9], r2[9];
    eng_place_groups(w, 9, 3, r);
    eng_place_groups(w, 9, 3, r2);
    CHECK(memcmp(r, r2, sizeof r) == 0);
    long long load[3] = {0};
    for (int i = 0; i < 9; i++) {
        CHECK(r[i] >= 0 && r[i] < 3);
        load[r[i]] += w[i];
    }
    /* LPT: 40 | 30 | 22, then 12s to the lightest ... total 141: no rank above 40 + 12 */
    for (int q = 0; q < 3; q++) CHECK_MSG(load[q] <= 52 && load[q] >= 40, "rank %d load %lld", q, load[q]);
    CHECK_EQ_INT(r[1], 0);
    CHECK_EQ_INT(r[5], 1);
    CHECK_EQ_INT(r[7], 2);
    eng_place_groups(w, 9, 1, r);
    for (int i = 0; i < 9; i++) CHECK_EQ_INT(r[i], 0);
}

static float *ref_w[NCFG];
static eng_update_result ref_u[NCFG];

TEST(one_rank_reference) {
    int split = 0; /* groups larger than a micro-batch (MB_TOKENS): the split path (engine/model/split.h) runs on ranks too */
    for (int i = 0; i < NG; i++) {
        int t = P_[i];
        for (int r = 0; r < N_[i]; r++) t += R_[i][r];
        split += t > MB_TOKENS;
    }
    printf("  %d of %d groups larger than a micro-batch\n", split, NG);
    CHECK(split >= 1);
    eng *e = open_rank(NULL, NULL);
    CHECK_MSG(e, "%s", err_msg());
    long long n = n_elems(e);
    float *w0 = malloc((size_t)n * 4);
    memcpy(w0, weights(e, 0), (size_t)n * 4);
    for (int k = 0; k < NCFG; k++) {
        CHECK_MSG(run_update(e, k, &ref_u[k]) == 0, "config %d: %s", k, err_msg());
        CHECK_MSG(ref_u[k].optimizer_steps > 0, "config %d took no step", k);
        ref_w[k] = malloc((size_t)n * 4);
        memcpy(ref_w[k], weights(e, 0), (size_t)n * 4);
        CHECK(eng_update_undo(e) == 0);
        CHECK(memcmp(w0, weights(e, 0), (size_t)n * 4) == 0);
        printf("  config %d: loss %.6f grad_norm %.4f (clip %.2f) steps %d micro %d clip_frac %.3f filtered %d\n", k,
               ref_u[k].loss, ref_u[k].grad_norm, 0.05, ref_u[k].optimizer_steps, ref_u[k].micro_batches, ref_u[k].clip_frac,
               ref_u[k].groups_filtered);
        if (ref_u[k].rollout_corr)
            printf("    rollout_corr: |old - rollout| mean %.3f max %.3f, rollout_is_mean %.3f, rs masked %.3f of tokens\n",
                   ref_u[k].rc.abs_diff_mean, ref_u[k].rc.abs_diff_max, ref_u[k].rc.is_mean, ref_u[k].rc.rs_masked_fraction);
    }
    free(w0);
    eng_close(e);
}

/* A comm of one rank is no comm: the same code path, the same bits. */
TEST(one_rank_comm_is_no_comm) {
    comm *c;
    CHECK_EQ_INT(comm_cpu_group(1, &c), 0);
    eng *e = open_rank(c, NULL);
    CHECK_MSG(e, "%s", err_msg());
    for (int k = 0; k < NCFG; k++) {
        eng_update_result u;
        CHECK_MSG(run_update(e, k, &u) == 0, "config %d: %s", k, err_msg());
        CHECK_MSG(memcmp(weights(e, 0), ref_w[k], (size_t)n_elems(e) * 4) == 0, "config %d: weights differ", k);
        u.ms_old = ref_u[k].ms_old;
        u.ms_ref = ref_u[k].ms_ref;
        u.ms_policy = ref_u[k].ms_policy;
        u.ms_optimizer = ref_u[k].ms_optimizer;
        u.ms_total = ref_u[k].ms_total;
        u.ms_snapshot_wait = ref_u[k].ms_snapshot_wait;
        u.ms_prepare = ref_u[k].ms_prepare;
        CHECK_MSG(memcmp(&u, &ref_u[k], sizeof u) == 0, "config %d: result differs", k);
        CHECK(eng_update_undo(e) == 0);
    }
    eng_close(e);
    comm_free(c);
}

TEST(ranks_equal_one_rank) {
    for (int W = 2; W <= WMAX; W++) {
        comm *cs[WMAX];
        rank_job j[WMAX];
        CHECK_MSG(open_world(W, cs, j, NULL) == 0, "%s", err_msg());
        long long n = n_elems(j[0].h.e);
        float *w0 = malloc((size_t)n * 4);
        memcpy(w0, weights(j[0].h.e, 0), (size_t)n * 4);
        w_err worst = {0, 0};
        int bad = 0;
        for (int k = 0; k < NCFG && !bad; k++) {
            if (all_ranks(j, W, OP_UPDATE, k, NULL)) {
                bad = 1;
                break;
            }
            for (int q = 0; q < W && !bad; q++) {
                w_err x = weight_err(weights(j[q].h.e, 0), ref_w[k], w0, n, LR);
                if (x.rel_l2 > worst.rel_l2) worst.rel_l2 = x.rel_l2;
                if (x.max_lr > worst.max_lr) worst.max_lr = x.max_lr;
                if (!weights_ok(x)) {
                    printf("  W=%d config %d rank %d: update rel L2 %.3g, max |dw| %.3g lr\n", W, k, q, x.rel_l2, x.max_lr);
                    bad = 1;
                }
                if (!same_result(&j[q].u, &j[0].u)) {
                    printf("  W=%d config %d: rank %d's result differs from rank 0's\n", W, k, q);
                    bad = 1;
                }
            }
            const char *f = bad ? NULL : close_result(&j[0].u, &ref_u[k], 1e-5);
            if (f) {
                printf("  W=%d config %d: result field %s differs from one rank's\n", W, k, f);
                bad = 1;
            }
            if (!bad && all_ranks(j, W, OP_UNDO, 0, NULL)) bad = 1;
            for (int q = 0; q < W && !bad; q++)
                if (memcmp(weights(j[q].h.e, 0), w0, (size_t)n * 4)) {
                    printf("  W=%d: undo did not restore rank %d\n", W, q);
                    bad = 1;
                }
        }
        printf("  W=%d: worst over %d configs and every rank: update rel L2 %.3g (tol 1e-5), max |dw| %.3g lr (tol 0.01)\n", W,
               NCFG, worst.rel_l2, worst.max_lr);
        close_world(W, cs, j);
        free(w0);
        CHECK(!bad);
    }
}

/* A non-finite advantage in the second mini-batch poisons the gradient of the one rank that holds
 * its group: the global norm makes every rank fail together, after the first step, and every rank
 * restores its shard (and the gathered weights) bit for bit. */
TEST(failure_is_global_and_atomic) {
    comm *cs[3];
    rank_job j[3];
    CHECK_MSG(open_world(3, cs, j, NULL) == 0, "%s", err_msg());
    long long n = n_elems(j[0].h.e);
    float *w0 = malloc((size_t)n * 4);
    memcpy(w0, weights(j[0].h.e, 0), (size_t)n * 4);
    int gi = 4, ri = 0; /* config 3: given advantages, mini-batches of 4 groups; a response it does not mask */
    while (trunc_[gi][ri])
        if (++ri == N_[gi]) {
            ri = 0;
            gi++;
        }
    CHECK(gi < NG);
    float keep = adv_[gi][ri];
    adv_[gi][ri] = NAN;
    all_ranks(j, 3, OP_UPDATE, 3, NULL);
    adv_[gi][ri] = keep;
    for (int q = 0; q < 3; q++) {
        CHECK_MSG(j[q].h.rc == GE_NON_FINITE, "rank %d: rc %d (%s)", q, j[q].h.rc, j[q].h.msg);
        CHECK_MSG(strstr(j[q].h.msg, "step 2 of 2"), "rank %d: %s", q, j[q].h.msg);
        CHECK_MSG(memcmp(weights(j[q].h.e, 0), w0, (size_t)n * 4) == 0, "rank %d's weights were not restored", q);
        eng_info i;
        eng_get_info(j[q].h.e, &i);
        CHECK_EQ_INT(i.policy_version, 0);
    }
    /* and the next update is the one an untouched world makes */
    CHECK(all_ranks(j, 3, OP_UPDATE, 3, NULL) == 0);
    w_err x = weight_err(weights(j[2].h.e, 0), ref_w[3], w0, n, LR);
    CHECK_MSG(weights_ok(x), "after the failure: rel L2 %.3g, max %.3g lr", x.rel_l2, x.max_lr);
    close_world(3, cs, j);
    free(w0);
}

TEST(checkpoints_cross_world_sizes) {
    eng_remove_tree(CKPT "_w3");
    eng_remove_tree(CKPT "_w1");
    comm *cs[3];
    rank_job j[3];
    CHECK_MSG(open_world(3, cs, j, NULL) == 0, "%s", err_msg());
    CHECK(all_ranks(j, 3, OP_UPDATE, 0, NULL) == 0);
    CHECK(all_ranks(j, 3, OP_SAVE, 0, CKPT "_w3") == 0);
    CHECK(all_ranks(j, 3, OP_PROBE, 0, NULL) == 0);
    CHECK_EQ_INT(eng_checkpoint_verify(CKPT "_w3"), 0);
    /* W = 3 -> one rank: the same logprobs, and the same next update */
    eng *one = open_rank(NULL, CKPT "_w3");
    CHECK_MSG(one, "%s", err_msg());
    float lp[NPROBE];
    int np = probe(one, lp);
    CHECK(np > 0 && np == j[0].n_lp);
    CHECK_MSG(memcmp(lp, j[0].lp, (size_t)np * 4) == 0, "logprobs after W=3 -> 1 differ");
    long long n = n_elems(one);
    float *w0 = malloc((size_t)n * 4);
    memcpy(w0, weights(one, 1), (size_t)n * 4);
    eng_update_result u1;
    CHECK(run_update(one, 2, &u1) == 0);
    CHECK(all_ranks(j, 3, OP_UPDATE, 2, NULL) == 0);
    w_err x = weight_err(weights(j[1].h.e, 0), weights(one, 1), w0, n, LR);
    CHECK_MSG(weights_ok(x), "the update after W=3 -> 1 differs: rel L2 %.3g, max %.3g lr", x.rel_l2, x.max_lr);
    CHECK_EQ_INT(u1.policy_version_after, j[0].u.policy_version_after);
    /* one rank -> W = 3 */
    CHECK(eng_checkpoint_save(one, CKPT "_w1") == 0);
    close_world(3, cs, j);
    CHECK_MSG(open_world(3, cs, j, CKPT "_w1") == 0, "%s", err_msg());
    CHECK(all_ranks(j, 3, OP_PROBE, 0, NULL) == 0);
    np = probe(one, lp);
    for (int q = 0; q < 3; q++)
        CHECK_MSG(memcmp(lp, j[q].lp, (size_t)np * 4) == 0, "logprobs after 1 -> W=3 differ on rank %d", q);
    memcpy(w0, weights(one, 1), (size_t)n * 4);
    CHECK(run_update(one, 4, &u1) == 0);
    CHECK(all_ranks(j, 3, OP_UPDATE, 4, NULL) == 0);
    for (int q = 0; q < 3; q++) {
        x = weight_err(weights(j[q].h.e, 0), weights(one, 1), w0, n, LR);
        CHECK_MSG(weights_ok(x), "the update after 1 -> W=3 differs on rank %d: rel L2 %.3g, max %.3g lr", q, x.rel_l2, x.max_lr);
    }
    free(w0);
    CHECK_EQ_INT(j[2].u.policy_version_after, u1.policy_version_after);
    close_world(3, cs, j);
    eng_close(one);
    eng_remove_tree(CKPT "_w3");
    eng_remove_tree(CKPT "_w1");
}

/* The sharded state in host memory (optimizer offload, engine/train/offload.h): each rank's master and
 * moments shard on the host, its AdamW there. The same updates as one rank without offload (on
 * cpu the offloaded step is bit-equal to the backend's), exact undo, and a checkpoint from W = 2
 * with offload that one rank without it loads with bit-equal logprobs. */
TEST(offload_on_ranks_equals_one_rank) {
    offload_ = "on";
    for (int W = 2; W <= 3; W++) {
        comm *cs[WMAX];
        rank_job j[WMAX];
        CHECK_MSG(open_world(W, cs, j, NULL) == 0, "%s", err_msg());
        eng_testing_info ti;
        eng_testing_get(j[0].h.e, &ti);
        CHECK(ti.offload);
        long long n = n_elems(j[0].h.e);
        float *w0 = malloc((size_t)n * 4);
        memcpy(w0, weights(j[0].h.e, 0), (size_t)n * 4);
        int bad = 0;
        for (int k = 0; k < NCFG && !bad; k++) {
            if (all_ranks(j, W, OP_UPDATE, k, NULL)) {
                bad = 1;
                break;
            }
            for (int q = 0; q < W && !bad; q++) {
                w_err x = weight_err(weights(j[q].h.e, 0), ref_w[k], w0, n, LR);
                if (!weights_ok(x)) {
                    printf("  offload W=%d config %d rank %d: rel L2 %.3g, max %.3g lr\n", W, k, q, x.rel_l2, x.max_lr);
                    bad = 1;
                }
            }
            if (!bad && all_ranks(j, W, OP_UNDO, 0, NULL)) bad = 1;
            for (int q = 0; q < W && !bad; q++)
                if (memcmp(weights(j[q].h.e, 0), w0, (size_t)n * 4)) {
                    printf("  offload W=%d: undo did not restore rank %d\n", W, q);
                    bad = 1;
                }
        }
        if (!bad && W == 2) { /* a checkpoint with offloaded shards, loaded by one rank without offload */
            eng_remove_tree(CKPT "_off");
            if (all_ranks(j, W, OP_UPDATE, 0, NULL) || all_ranks(j, W, OP_SAVE, 0, CKPT "_off") ||
                all_ranks(j, W, OP_PROBE, 0, NULL))
                bad = 1;
            offload_ = NULL;
            eng *one = bad ? NULL : open_rank(NULL, CKPT "_off");
            offload_ = "on";
            float lp[NPROBE];
            if (!bad && (!one || probe(one, lp) != j[0].n_lp || memcmp(lp, j[0].lp, (size_t)j[0].n_lp * 4))) {
                printf("  offload W=2 -> one rank: logprobs differ (%s)\n", one ? "" : err_msg());
                bad = 1;
            }
            eng_close(one);
            eng_remove_tree(CKPT "_off");
        }
        close_world(W, cs, j);
        free(w0);
        CHECK(!bad);
    }
    offload_ = NULL;
}

TEST(refused_combinations_say_why) {
    comm *cs[2];
    CHECK_EQ_INT(comm_cpu_group(2, cs), 0);
    eng *e;
    eng_open_opts o = {.model_dir = MODEL, .backend = "cpu", .n_threads = 1, .comm = cs[0], .lora_rank = 4};
    CHECK_EQ_INT(eng_open(&o, &e), GE_UNSUPPORTED);
    CHECK(strstr(err_msg(), "LoRA"));
    for (int q = 0; q < 2; q++) comm_free(cs[q]);
}

int main(void) {
    if (eng_ensure_default_model(MODEL)) {
        printf("FAIL default model: %s\n", err_msg());
        return 1;
    }
    {
        eng *e = open_rank(NULL, NULL);
        if (!e) {
            printf("FAIL open: %s\n", err_msg());
            return 1;
        }
        eng_info i;
        eng_get_info(e, &i);
        V = i.vocab;
        eng_close(e);
    }
    make_inputs();
    RUN(placement_is_balanced_and_deterministic);
    RUN(one_rank_reference);
    RUN(one_rank_comm_is_no_comm);
    RUN(ranks_equal_one_rank);
    RUN(failure_is_global_and_atomic);
    RUN(checkpoints_cross_world_sizes);
    RUN(offload_on_ranks_equals_one_rank);
    RUN(refused_combinations_say_why);
    for (int k = 0; k < NCFG; k++) free(ref_w[k]);
    free(wbuf_[0]);
    free(wbuf_[1]);
    return CHECK_DONE();
}
