/* test_loss.c — the GRPO-family losses (engine/train/loss.c) against verl 0.9.1 itself.
 *
 * tests/fixtures/loss_reference.inc is the output of make_loss_reference.py, which calls the
 * verl package's own functions (ppo_loss, compute_policy_loss_vanilla / _gspo, agg_loss,
 * kl_penalty, the advantage estimators, logprobs_from_logits / entropy_from_logits, the lr
 * schedulers) in float64 on the float32 inputs written there. Checked here:
 *   - the advantages of grpo, drgrpo and rloo (a group of one included);
 *   - every loss_mode x loss_agg_mode x kl_type (k1+, k3+ included), with and without a dropped
 *     response, and with a per-token loss mask (veRL's response_mask; one response all 0),
 *     loss_scale_factor given and defaulted: the loss, veRL's metrics, grpod's own
 *     metrics, and the gradients d loss / d logp and d loss / d entropy (relative L2);
 *   - the logprob head at temperature 0.7 with the loss on top: d loss / d hidden, d loss / d w;
 *   - the learning-rate schedules (engine/train/optim.c) step by step.
 * Each comparison prints one row of the parity table (docs/verl_parity.md). Tolerances: grpod
 * computes the loss in double from the same float32 inputs and stores gradients as float32, so
 * values agree to 1e-10 + 1e-7 relative and gradients to float32 rounding (rel L2 ~1e-8); the
 * head runs float32 matmuls and exponentials, rel L2 ~1e-6. The contract is 1e-5 everywhere.
 * Also, grpod's own checks: gradients by finite differences (vanilla per token; gspo, whose
 * gradient is straight-through by definition, along each response's all-ones direction), and
 * micro-batches with global denominators adding up to the one-call loss (both with random loss
 * masks on odd seeds), and a loss mask of all ones giving what no mask gives, bit for bit. */
#include "tests/unit/check.h"

#include "common/err.h"
#include "engine/train/loss.h"
#include "engine/train/optim.h"
#include "engine/train/rollout_corr.h"
#include "kernels/logprob.h"
#include "tests/fixtures/loss_reference.inc"

#define PARITY_TOL 1e-5

static void ref_offsets(int *off) {
    for (int s = 0, o = 0; s < REF_S; s++) {
        off[s] = o;
        o += REF_LENS[s];
    }
}

static void ref_config(loss_config *c, int mode, int agg, int kl) {
    loss_config_default(c);
    c->mode = (loss_mode)mode;
    c->agg = (loss_agg_mode)agg;
    c->kl = (kl_type)kl;
    c->clip_ratio_low = REF_CLIP_LOW;
    c->clip_ratio_high = REF_CLIP_HIGH;
    c->clip_ratio_c = REF_CLIP_C;
    c->kl_coef = REF_KL_COEF;
    c->entropy_coeff = REF_ENT_COEF;
    c->loss_scale_factor = 9;
}

static double rel_err(double got, double want) { return fabs(got - want) / fmax(fabs(want), 1e-30); }

static const char *const MODE_NAMES[2] = {"vanilla", "gspo"};
static const char *const AGG_NAMES[5] = {"token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                                         "seq-mean-token-sum-norm"};
static const char *const KL_NAMES[6] = {"k1", "abs", "k2", "k3", "k1+", "k3+"};

/* ---------- names and defaults ---------- */

TEST(test_parse) {
    adv_estimator a;
    loss_agg_mode g;
    loss_mode m;
    kl_type k;
    CHECK_EQ_INT(loss_parse_adv("grpo", &a), 0);
    CHECK_EQ_INT(a, ADV_GRPO);
    CHECK_EQ_INT(loss_parse_adv("drgrpo", &a), 0);
    CHECK_EQ_INT(a, ADV_DRGRPO);
    CHECK_EQ_INT(loss_parse_adv("rloo", &a), 0);
    CHECK_EQ_INT(a, ADV_RLOO);
    CHECK_EQ_INT(loss_parse_adv("given", &a), 0);
    CHECK_EQ_INT(a, ADV_GIVEN);
    CHECK_EQ_INT(loss_parse_adv("gae", &a), GE_INVALID);
    CHECK_STR(err_msg(), "adv_estimator \"gae\" is not one of: grpo, drgrpo, rloo, given");
    const loss_agg_mode aggv[] = {AGG_TOKEN_MEAN, AGG_TOKEN_SUM, AGG_SEQ_MEAN_TOKEN_SUM, AGG_SEQ_MEAN_TOKEN_MEAN,
                                  AGG_SEQ_MEAN_TOKEN_SUM_NORM};
    for (int i = 0; i < 5; i++) {
        CHECK_EQ_INT(loss_parse_agg(AGG_NAMES[i], &g), 0);
        CHECK_EQ_INT(g, aggv[i]);
    }
    CHECK_EQ_INT(loss_parse_agg("token_mean", &g), GE_INVALID);
    CHECK_EQ_INT(loss_parse_agg(NULL, &g), GE_INVALID);
    CHECK_EQ_INT(loss_parse_mode("vanilla", &m), 0);
    CHECK_EQ_INT(m, LOSS_VANILLA);
    CHECK_EQ_INT(loss_parse_mode("gspo", &m), 0);
    CHECK_EQ_INT(m, LOSS_GSPO);
    CHECK_EQ_INT(loss_parse_mode("gpg", &m), GE_INVALID);
    const char *kls[] = {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k1+", "kl+", "k3+", "low_var_kl+"};
    const kl_type klv[] = {KL_K1, KL_K1, KL_ABS, KL_K2, KL_K2, KL_K3, KL_K3, KL_K1_ST, KL_K1_ST, KL_K3_ST, KL_K3_ST};
    for (int i = 0; i < 11; i++) {
        CHECK_EQ_INT(loss_parse_kl(kls[i], &k), 0);
        CHECK_EQ_INT(k, klv[i]);
    }
    CHECK_EQ_INT(loss_parse_kl("full", &k), GE_INVALID);
    CHECK_EQ_INT(loss_parse_kl("k2+", &k), GE_INVALID);
}

TEST(test_defaults) {
    loss_config c;
    loss_config_default(&c);
    CHECK_EQ_INT(c.adv, ADV_GRPO);
    CHECK_EQ_INT(c.norm_adv_by_std, 1);
    CHECK_EQ_INT(c.mode, LOSS_VANILLA);
    CHECK(c.clip_ratio_low == 0.2f && c.clip_ratio_high == 0.28f && c.clip_ratio_c == 3.0f);
    CHECK_EQ_INT(c.agg, AGG_TOKEN_MEAN);
    CHECK(c.kl_coef == 0.001f);
    CHECK_EQ_INT(c.kl, KL_K3);
    CHECK(c.entropy_coeff == 0.0f);
    CHECK_EQ_INT(c.ppo_epochs, 1);
    CHECK_EQ_INT(c.ppo_mini_batch_size, 0);
    CHECK(c.temperature == 1.0f);
    CHECK_EQ_INT(c.loss_scale_factor, 0);
    CHECK_EQ_INT(c.use_rollout_logprobs, 0);
    CHECK_EQ_INT(c.mask_truncated, 0);
    CHECK_EQ_INT(c.filter_groups, 0);
}

/* ---------- advantages ---------- */

TEST(test_advantages) {
    loss_config c;
    loss_config_default(&c);
    float out[REF_S];
    /* {estimator, norm_adv_by_std, row of REF_ADV}: drgrpo is grpo without the std, both ways */
    struct {
        adv_estimator a;
        int norm, row;
    } est[4] = {{ADV_GRPO, 1, 0}, {ADV_GRPO, 0, 1}, {ADV_DRGRPO, 1, 1}, {ADV_RLOO, 1, 2}};
    for (int e = 0; e < 4; e++) {
        c.adv = est[e].a;
        c.norm_adv_by_std = est[e].norm;
        for (int g = 0; g < 3; g++)
            loss_group_advantages(&c, REF_REWARDS + REF_GROUP_FIRST[g], REF_GROUP_N[g], out + REF_GROUP_FIRST[g]);
        for (int i = 0; i < REF_S; i++) /* float32 output of a double computation */
            CHECK_MSG(fabs(out[i] - REF_ADV[est[e].row][i]) <= 1e-7 + 1e-6 * fabs(REF_ADV[est[e].row][i]),
                      "estimator %d response %d: %.9g, verl %.9g", e, i, out[i], REF_ADV[est[e].row][i]);
    }
    /* equal rewards: grpo gives 0 (std 0 + 1e-6), and the group is uniform */
    const float same[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    c.adv = ADV_GRPO;
    c.norm_adv_by_std = 1;
    loss_group_advantages(&c, same, 4, out);
    for (int i = 0; i < 4; i++) CHECK(out[i] == 0.0f);
    CHECK(loss_group_uniform(same, 4));
    CHECK(!loss_group_uniform(REF_REWARDS, 3));
    CHECK(loss_group_uniform(REF_REWARDS, 1));
    c.adv = ADV_GIVEN;
    loss_group_advantages(&c, REF_REWARDS, REF_S, out);
    for (int i = 0; i < REF_S; i++) CHECK(out[i] == REF_REWARDS[i]);
}

/* ---------- every configuration against verl ---------- */

TEST(test_verl_cases) {
    int off[REF_S];
    ref_offsets(off);
    int ncase = (int)(sizeof REF_CASES / sizeof REF_CASES[0]);
    CHECK_EQ_INT(ncase, 3 * (2 * 5 * 6 + 2 * 2));
    double worst_loss = 0, worst_grad = 0;
    printf("# | loss_mode | loss_agg_mode | kl_type | dropped | loss_scale_factor | loss rel | dlogp rel L2 | dent rel L2 |\n");
    for (int k = 0; k < ncase; k++) {
        const ref_case *rc = &REF_CASES[k];
        loss_config c;
        ref_config(&c, rc->mode, rc->agg, rc->kl);
        c.loss_scale_factor = rc->scale;
        int mask[REF_S];
        for (int s = 0; s < REF_S; s++) mask[s] = !(rc->masked == 1 && s == REF_DROPPED);
        const unsigned char *tmask = rc->masked == 2 ? REF_TMASK : NULL; /* veRL's response_mask per token */
        double tok = 0, seq = 0;
        int mx = 0;
        loss_count(REF_S, off, REF_LENS, mask, tmask, &tok, &seq, &mx);
        float dlogp[REF_M], dent[REF_M];
        loss_metrics m;
        memset(&m, 0, sizeof m);
        double loss = loss_compute(&c, REF_S, off, REF_LENS, REF_LOGP, REF_OLD, REF_REF, REF_ENT, REF_LOSS_ADV, mask, tmask, NULL,
                                   tok, seq, dlogp, dent, &m);
        loss_finish(&m, 1);
        const double got[REF_NV] = {m.loss,           m.pg_loss,      m.pg_clipfrac, m.pg_clipfrac_lower, m.ppo_kl,
                                    m.kl_loss,        m.entropy_loss, m.kl,          m.entropy,           m.clip_frac_low,
                                    m.clip_frac_high, m.ratio_mean,   m.ratio_max};
        CHECK_MSG(fabs(loss - rc->v[0]) <= 1e-10 + 1e-7 * fabs(rc->v[0]), "case %d: returned loss %.12g, verl %.12g", k, loss,
                  rc->v[0]);
        for (int i = 0; i < REF_NV; i++)
            CHECK_MSG(fabs(got[i] - rc->v[i]) <= 1e-10 + 1e-7 * fabs(rc->v[i]),
                      "case %d (%s %s %s dropped %d): %s = %.12g, verl %.12g", k, MODE_NAMES[rc->mode], AGG_NAMES[rc->agg],
                      KL_NAMES[rc->kl], rc->masked, REF_V_NAMES[i], got[i], rc->v[i]);
        CHECK(m.clip_frac == m.pg_clipfrac); /* one step: grpod's clip_frac is veRL's pg_clipfrac */
        double el = rel_err(loss, rc->v[0]), eg = rel_l2(dlogp, rc->dlogp, REF_M), ee = rel_l2(dent, rc->dent, REF_M);
        CHECK_MSG(el <= PARITY_TOL && eg <= PARITY_TOL && ee <= PARITY_TOL, "case %d: loss %.2e dlogp %.2e dent %.2e", k, el, eg,
                  ee);
        if (rc->masked == 1) /* the dropped response has no gradient */
            for (int t = off[REF_DROPPED]; t < off[REF_DROPPED] + REF_LENS[REF_DROPPED]; t++)
                CHECK(dlogp[t] == 0.0f && dent[t] == 0.0f);
        for (int t = 0; tmask && t < REF_M; t++) /* nor has a masked token */
            if (!tmask[t]) CHECK(dlogp[t] == 0.0f && dent[t] == 0.0f);
        worst_loss = fmax(worst_loss, el);
        worst_grad = fmax(worst_grad, fmax(eg, ee));
        printf("# | %s | %s | %s | %s | %s | %.1e | %.1e | %.1e |\n", MODE_NAMES[rc->mode], AGG_NAMES[rc->agg], KL_NAMES[rc->kl],
               rc->masked == 2  ? "loss_mask"
                   : rc->masked ? "yes"
                                : "no",
               rc->agg != 4    ? "-"
                   : rc->scale ? "9"
                               : "default (6)",
               el, eg, ee);
    }
    printf("# %d configurations against verl %s: worst loss rel %.1e, worst gradient rel L2 %.1e\n", ncase, REF_VERL_VERSION,
           worst_loss, worst_grad);
}

/* The logprob head (kernels/logprob_cpu.c) at temperature 0.7 under the loss: logprobs and
 * entropies of logits / T, the loss, and its gradient back to the hidden states and weights. */
TEST(test_verl_head_temperature) {
    int off[REF_S], out_pos[REF_M], mask[REF_S];
    ref_offsets(off);
    for (int t = 0; t < REF_M; t++) out_pos[t] = t;
    for (int s = 0; s < REF_S; s++) mask[s] = 1;
    int nh = (int)(sizeof REF_HEAD / sizeof REF_HEAD[0]);
    printf("# | head at T = %.1f: loss_mode | loss_agg_mode | kl_type | loss rel | d hidden rel L2 | d w rel L2 |\n",
           (double)REF_TEMP);
    for (int k = 0; k < nh; k++) {
        const ref_head *rh = &REF_HEAD[k];
        loss_config c;
        ref_config(&c, rh->mode, rh->agg, rh->kl);
        static float logp[REF_M], ent[REF_M], dlogp[REF_M], dent[REF_M], dh[REF_M * REF_HC], dw[REF_HV * REF_HC];
        logprob_fwd_cpu(logp, ent, REF_H, out_pos, REF_HTOK, REF_HW, REF_M, REF_HC, REF_HV, REF_TEMP);
        double tok = 0, seq = 0;
        int mx = 0;
        loss_count(REF_S, off, REF_LENS, mask, NULL, &tok, &seq, &mx);
        double loss = loss_compute(&c, REF_S, off, REF_LENS, logp, REF_HOLD, REF_REF, ent, REF_LOSS_ADV, mask, NULL, NULL, tok,
                                   seq, dlogp, dent, NULL);
        memset(dh, 0, sizeof dh);
        memset(dw, 0, sizeof dw);
        logprob_bwd_cpu(dh, dw, dlogp, dent, REF_H, out_pos, REF_HTOK, REF_HW, REF_M, REF_HC, REF_HV, REF_TEMP);
        double el = rel_err(loss, rh->loss), eh = rel_l2(dh, rh->dh, REF_M * REF_HC), ew = rel_l2(dw, rh->dw, REF_HV * REF_HC);
        /* float32 logits and exponentials against float64: ~1e-7 in the values, ~1e-6 in gradients */
        CHECK_MSG(el <= PARITY_TOL && eh <= PARITY_TOL && ew <= PARITY_TOL, "head case %d: loss %.2e dh %.2e dw %.2e", k, el, eh,
                  ew);
        printf("# | %s | %s | %s | %.1e | %.1e | %.1e |\n", MODE_NAMES[rh->mode], AGG_NAMES[rh->agg], KL_NAMES[rh->kl], el, eh, ew);
    }
}

/* lr_schedule against verl's get_constant_schedule_with_warmup / get_cosine_schedule_with_warmup
 * for every step up to total_steps; past it grpod holds the floor (optim.h). */
TEST(test_verl_schedules) {
    int ns = (int)(sizeof REF_SCHED / sizeof REF_SCHED[0]);
    for (int k = 0; k < ns; k++) {
        const ref_sched *r = &REF_SCHED[k];
        for (int step = 1; step <= r->n; step++) {
            double lr = lr_schedule(REF_SCHED_LR, step, r->warmup, r->schedule, r->total, r->min_lr_ratio);
            /* float32 result of a double computation from a float32 base lr */
            CHECK_MSG(fabs(lr - r->lr[step - 1]) <= 1e-12 + 2e-7 * r->lr[step - 1], "schedule %d step %d: %.9g, verl %.9g", k,
                      step, lr, r->lr[step - 1]);
        }
        if (r->schedule == 1 && r->total < 100) {
            double floor = (double)REF_SCHED_LR * r->min_lr_ratio;
            CHECK_CLOSE(lr_schedule(REF_SCHED_LR, r->total + 5, r->warmup, 1, r->total, r->min_lr_ratio), floor, 1e-12, 2e-7);
        }
    }
    CHECK(lr_schedule(1e-3f, 1, 4, 0, 10, 0.0f) == 0.0f); /* the first warm-up step: lr 0 */
    printf("# %d schedules match verl step by step\n", ns);
}

/* ---------- gradients by finite differences ---------- */

#define RS 9 /* responses in the random cases */
#define RM 60 /* room for their tokens */
typedef struct {
    int S, M, off[RS], len[RS], mask[RS];
    float logp[RM], old[RM], ref[RM], ent[RM], adv[RS];
    unsigned char tmask_v[RM];
    const unsigned char *tmask; /* tmask_v (odd seeds: a random loss_mask) or NULL */
} rand_case;

static void make_rand(rand_case *rc, unsigned long long seed) {
    unsigned long long s = seed * 0x9E3779B97F4A7C15ULL + 7;
    rc->S = RS;
    rc->M = 0;
    for (int i = 0; i < RS; i++) {
        rc->len[i] = 1 + (int)(((check_randf(&s, 1.0f) + 1.0f) * 0.5f) * 6.99f);
        rc->off[i] = rc->M;
        rc->M += rc->len[i];
        rc->mask[i] = i != 4; /* one dropped response */
        rc->adv[i] = check_randf(&s, 1.5f);
    }
    for (int t = 0; t < rc->M; t++) {
        /* on a 2^-12 grid: the finite-difference steps k / 1024 stay exact in float */
        rc->logp[t] = roundf((-1.6f + check_randf(&s, 1.5f)) * 4096) / 4096;
        rc->old[t] = rc->logp[t] - check_randf(&s, 0.6f); /* ratios 0.55 .. 1.8: all regions */
        rc->ref[t] = rc->logp[t] + check_randf(&s, 1.0f);
        rc->ent[t] = 1.5f + check_randf(&s, 1.2f);
    }
    /* odd seeds: a random loss_mask, from its own stream so the values above stay; response 2 all 0 */
    unsigned long long q = seed * 0x2545F4914F6CDD1DULL + 11;
    for (int t = 0; t < rc->M; t++) rc->tmask_v[t] = check_randf(&q, 1.0f) < 0.3f;
    for (int j = 0; j < rc->len[2]; j++) rc->tmask_v[rc->off[2] + j] = 0;
    rc->tmask = seed & 1 ? rc->tmask_v : NULL;
}

/* Distance of token t from a kink of its loss (where a one-sided derivative would differ). */
static int near_kink(const loss_config *c, const rand_case *rc, int s, int t, double h) {
    double r = exp((double)rc->logp[t] - rc->old[t]);
    double kinks[3] = {1.0 - c->clip_ratio_low, 1.0 + c->clip_ratio_high, c->clip_ratio_c};
    for (int i = 0; i < 3; i++)
        if (fabs(r - kinks[i]) < 4 * h * r) return 1;
    double x = (double)rc->logp[t] - rc->ref[t];
    if (c->kl == KL_ABS && fabs(x) < 4 * h) return 1;
    if (c->kl == KL_K3 && fabs(exp(-x) + x - 1 - 10) < 4 * h * 20) return 1;
    (void)s;
    return 0;
}

static double eval_loss(const loss_config *c, const rand_case *rc, double tok, double seq) {
    static float d1[RM], d2[RM];
    return loss_compute(c, rc->S, rc->off, rc->len, rc->logp, rc->old, rc->ref, rc->ent, rc->adv, rc->mask, rc->tmask, NULL, tok,
                        seq, d1, d2, NULL);
}

TEST(test_grad_fd_vanilla) {
    const double h = 1.0 / 1024; /* exact steps on the logp grid of make_rand */
    int checked = 0, skipped = 0;
    double worst = 0;
    for (int agg = 0; agg < 5; agg++)
        for (int kl = 0; kl < 4; kl++) { /* k1+, k3+ are straight-through: no finite difference */
            rand_case rc;
            make_rand(&rc, 100 + agg * 10 + kl);
            loss_config c;
            ref_config(&c, LOSS_VANILLA, agg, kl);
            c.kl_coef = 0.3f;
            c.entropy_coeff = 0.05f;
            c.loss_scale_factor = 0;
            double tok = 0, seq = 0;
            int mx = 0;
            loss_count(rc.S, rc.off, rc.len, rc.mask, rc.tmask, &tok, &seq, &mx);
            float dlogp[RM], dent[RM];
            loss_compute(&c, rc.S, rc.off, rc.len, rc.logp, rc.old, rc.ref, rc.ent, rc.adv, rc.mask, rc.tmask, NULL, tok, seq,
                         dlogp, dent, NULL);
            for (int s = 0; s < rc.S; s++)
                for (int j = 0; j < rc.len[s]; j++) {
                    int t = rc.off[s] + j;
                    if (near_kink(&c, &rc, s, t, h)) {
                        skipped++;
                        continue;
                    }
                    /* five-point stencil: truncation O(h^4), steps exact in float */
                    float x = rc.logp[t];
                    double f[4];
                    const int k[4] = {2, 1, -1, -2};
                    for (int i = 0; i < 4; i++) {
                        rc.logp[t] = (float)(x + k[i] * h);
                        f[i] = eval_loss(&c, &rc, tok, seq);
                    }
                    rc.logp[t] = x;
                    double fd = (-f[0] + 8 * f[1] - 8 * f[2] + f[3]) / (12 * h);
                    double err = fabs(dlogp[t] - fd);
                    double tol = 1e-9 + 1e-6 * fabs(fd);
                    if (err / fmax(fabs(fd), 1e-4) > worst) worst = err / fmax(fabs(fd), 1e-4);
                    CHECK_MSG(err <= tol, "agg %d kl %d token %d (resp %d mask %d): dlogp %.9g, fd %.9g", agg, kl, t, s,
                              rc.mask[s], dlogp[t], fd);
                    /* entropy enters linearly: d loss / d ent */
                    float e = rc.ent[t];
                    rc.ent[t] = e + 0.25f;
                    double ep = eval_loss(&c, &rc, tok, seq);
                    rc.ent[t] = e - 0.25f;
                    double em = eval_loss(&c, &rc, tok, seq);
                    rc.ent[t] = e;
                    double fde = (ep - em) / 0.5;
                    CHECK_MSG(fabs(dent[t] - fde) <= 1e-12 + 1e-6 * fabs(fde), "dent %d: %.9g vs %.9g", t, dent[t], fde);
                    checked++;
                }
        }
    CHECK_MSG(skipped * 10 < checked, "too many kinks skipped: %d of %d", skipped, checked + skipped);
    printf("# vanilla: %d token gradients checked, %d near a kink skipped, worst err / max(|fd|, 1e-4) %.2e\n", checked, skipped,
           worst);
}

/* gspo: the ratio of a response is exp(mean(logp - old)) for all its tokens, its gradient
 * straight-through. Moving every logp of a response by the same step moves that ratio exactly
 * as the straight-through gradient says, so the sum of dlogp over a response equals the finite
 * difference along its all-ones direction; and with no kl the pg gradient is equal on its tokens. */
TEST(test_grad_fd_gspo) {
    const double h = 1e-3;
    int checked = 0;
    for (int agg = 0; agg < 5; agg++)
        for (int kl = 0; kl < 4; kl++) {
            rand_case rc;
            make_rand(&rc, 300 + agg * 10 + kl);
            loss_config c;
            ref_config(&c, LOSS_GSPO, agg, kl);
            c.kl_coef = kl == 1 ? 0.0f : 0.3f; /* abs has kinks: its run checks the pure pg */
            c.entropy_coeff = 0.05f;
            c.loss_scale_factor = 0;
            double tok = 0, seq = 0;
            int mx = 0;
            loss_count(rc.S, rc.off, rc.len, rc.mask, rc.tmask, &tok, &seq, &mx);
            float dlogp[RM], dent[RM];
            loss_compute(&c, rc.S, rc.off, rc.len, rc.logp, rc.old, rc.ref, rc.ent, rc.adv, rc.mask, rc.tmask, NULL, tok, seq,
                         dlogp, dent, NULL);
            for (int s = 0; s < rc.S; s++) {
                double mean = 0;
                int n = 0;
                for (int j = 0; j < rc.len[s]; j++)
                    if (!rc.tmask || rc.tmask[rc.off[s] + j]) {
                        mean += (double)rc.logp[rc.off[s] + j] - rc.old[rc.off[s] + j];
                        n++;
                    }
                if (!n) continue; /* all masked: no loss, nothing to move */
                double r = exp(mean / n);
                if (fabs(r - 0.8) < 4 * h || fabs(r - 1.28) < 4 * h) continue;
                float save[8];
                double sum_g = 0, f[4];
                for (int j = 0; j < rc.len[s]; j++) {
                    save[j] = rc.logp[rc.off[s] + j];
                    sum_g += dlogp[rc.off[s] + j];
                }
                /* the same step on every token (exact on the grid), five-point stencil */
                const double hs = 1.0 / 1024;
                const int k[4] = {2, 1, -1, -2};
                for (int i = 0; i < 4; i++) {
                    for (int j = 0; j < rc.len[s]; j++) rc.logp[rc.off[s] + j] = (float)(save[j] + k[i] * hs);
                    f[i] = eval_loss(&c, &rc, tok, seq);
                }
                for (int j = 0; j < rc.len[s]; j++) rc.logp[rc.off[s] + j] = save[j];
                double fd = (-f[0] + 8 * f[1] - 8 * f[2] + f[3]) / (12 * hs);
                CHECK_MSG(fabs(sum_g - fd) <= 1e-9 + 1e-6 * fabs(fd), "gspo agg %d kl %d resp %d: sum dlogp %.9g, fd %.9g", agg,
                          kl, s, sum_g, fd);
                for (int j = 0, first = -1; c.kl_coef == 0 && j < rc.len[s]; j++) { /* equal on trained tokens, 0 elsewhere */
                    int t = rc.off[s] + j;
                    if (rc.tmask && !rc.tmask[t]) CHECK(dlogp[t] == 0.0f);
                    else if (first < 0) first = t;
                    else CHECK_MSG(dlogp[t] == dlogp[first], "gspo resp %d: unequal token grads", s);
                }
                checked++;
            }
        }
    printf("# gspo: %d response directions checked\n", checked);
}

/* ---------- micro-batch additivity ---------- */

TEST(test_microbatch_additivity) {
    for (int mode = 0; mode < 2; mode++)
        for (int agg = 0; agg < 5; agg++) {
            rand_case rc;
            make_rand(&rc, 500 + mode * 10 + agg);
            loss_config c;
            ref_config(&c, mode, agg, KL_K3);
            c.loss_scale_factor = 0;
            double tok = 0, seq = 0;
            int mx = 0;
            loss_count(rc.S, rc.off, rc.len, rc.mask, rc.tmask, &tok, &seq, &mx);
            c.loss_scale_factor = mx; /* the mini-batch's divisor, fixed */
            float d_all[RM], e_all[RM], d_mb[RM], e_mb[RM];
            loss_metrics m1, m2;
            memset(&m1, 0, sizeof m1);
            memset(&m2, 0, sizeof m2);
            double whole = loss_compute(&c, rc.S, rc.off, rc.len, rc.logp, rc.old, rc.ref, rc.ent, rc.adv, rc.mask, rc.tmask,
                                        NULL, tok, seq, d_all, e_all, &m1);
            /* two micro-batches, each with its own token arrays starting at 0 */
            int cut = 4, o1 = rc.off[cut];
            int off2[RS];
            for (int s = cut; s < rc.S; s++) off2[s - cut] = rc.off[s] - o1;
            double part = loss_compute(&c, cut, rc.off, rc.len, rc.logp, rc.old, rc.ref, rc.ent, rc.adv, rc.mask, rc.tmask, NULL,
                                       tok, seq, d_mb, e_mb, &m2);
            part += loss_compute(&c, rc.S - cut, off2, rc.len + cut, rc.logp + o1, rc.old + o1, rc.ref + o1, rc.ent + o1,
                                 rc.adv + cut, rc.mask + cut, rc.tmask ? rc.tmask + o1 : NULL, NULL, tok, seq, d_mb + o1,
                                 e_mb + o1, &m2);
            CHECK_MSG(fabs(part - whole) <= 1e-13 * (1 + fabs(whole)), "mode %d agg %d: %.17g vs %.17g", mode, agg, part, whole);
            CHECK_CLOSE(m2.loss, m1.loss, 1e-13, 1e-12);
            CHECK_CLOSE(m2.pg_loss, m1.pg_loss, 1e-13, 1e-12);
            CHECK(m2.n_tokens == m1.n_tokens && m2.clip_frac == m1.clip_frac && m2.ratio_max == m1.ratio_max);
            /* veRL's metrics too: per-token values over the mini-batch's denominators add up */
            CHECK_CLOSE(m2.pg_clipfrac, m1.pg_clipfrac, 1e-15, 1e-12);
            CHECK_CLOSE(m2.pg_clipfrac_lower, m1.pg_clipfrac_lower, 1e-15, 1e-12);
            CHECK_CLOSE(m2.ppo_kl, m1.ppo_kl, 1e-15, 1e-12);
            CHECK_CLOSE(m2.kl_loss, m1.kl_loss, 1e-15, 1e-12);
            CHECK_CLOSE(m2.entropy_loss, m1.entropy_loss, 1e-15, 1e-12);
            for (int t = 0; t < rc.M; t++)
                CHECK_MSG(d_mb[t] == d_all[t] && e_mb[t] == e_all[t], "mode %d agg %d token %d", mode, agg, t);
        }
}

/* loss_finish over several optimizer steps: loss and pg_loss average over steps, token metrics
 * over tokens. */
TEST(test_finish) {
    loss_metrics m;
    memset(&m, 0, sizeof m);
    m.loss = 3.0;
    m.pg_loss = 1.5;
    m.kl = 2.0;
    m.entropy = 8.0;
    m.ratio_mean = 4.2;
    m.ratio_max = 1.3;
    m.clip_frac = 1;
    m.clip_frac_low = 0;
    m.clip_frac_high = 1;
    m.clip_frac_dual = 0;
    m.n_tokens = 4;
    m.pg_clipfrac = 0.6;
    m.pg_clipfrac_lower = 0.3;
    m.ppo_kl = -0.09;
    m.kl_loss = 0.12;
    m.entropy_loss = 2.7;
    m.entropy_agg = 1.7;
    loss_finish(&m, 3);
    CHECK_CLOSE(m.loss, 1.0, 0, 1e-15);
    CHECK_CLOSE(m.pg_loss, 0.5, 0, 1e-15);
    /* veRL's: the mean over the optimizer steps of each step's value; actor/entropy kept */
    CHECK_CLOSE(m.pg_clipfrac, 0.2, 0, 1e-15);
    CHECK_CLOSE(m.pg_clipfrac_lower, 0.1, 0, 1e-15);
    CHECK_CLOSE(m.ppo_kl, -0.03, 0, 1e-15);
    CHECK_CLOSE(m.kl_loss, 0.04, 0, 1e-15);
    CHECK_CLOSE(m.entropy_loss, 0.9, 0, 1e-15);
    CHECK(m.entropy_agg == 1.7);
    CHECK_CLOSE(m.kl, 0.5, 0, 1e-15);
    CHECK_CLOSE(m.entropy, 2.0, 0, 1e-15);
    CHECK_CLOSE(m.ratio_mean, 1.05, 0, 1e-15);
    CHECK(m.ratio_max == 1.3);
    CHECK_CLOSE(m.clip_frac, 0.25, 0, 1e-15);
    CHECK_CLOSE(m.clip_frac_high, 0.25, 0, 1e-15);
}

/* A loss_mask of all ones computes what no mask does, bit for bit: loss, gradients, metrics. */
TEST(test_all_ones_mask) {
    for (int mode = 0; mode < 2; mode++)
        for (int agg = 0; agg < 5; agg++) {
            rand_case rc;
            make_rand(&rc, 700 + mode * 10 + agg * 2); /* even: tmask NULL */
            unsigned char ones[RM];
            memset(ones, 1, sizeof ones);
            loss_config c;
            ref_config(&c, mode, agg, KL_K3);
            c.loss_scale_factor = 0;
            double tok[2] = {0, 0}, seq[2] = {0, 0}, loss[2];
            int mx[2] = {0, 0};
            float d[2][RM], e[2][RM];
            loss_metrics m[2];
            memset(m, 0, sizeof m);
            for (int k = 0; k < 2; k++) {
                const unsigned char *tm = k ? ones : NULL;
                loss_count(rc.S, rc.off, rc.len, rc.mask, tm, &tok[k], &seq[k], &mx[k]);
                loss[k] = loss_compute(&c, rc.S, rc.off, rc.len, rc.logp, rc.old, rc.ref, rc.ent, rc.adv, rc.mask, tm, NULL,
                                       tok[k], seq[k], d[k], e[k], &m[k]);
            }
            CHECK(tok[0] == tok[1] && seq[0] == seq[1] && mx[0] == mx[1]);
            CHECK(memcmp(&loss[0], &loss[1], sizeof loss[0]) == 0);
            CHECK(memcmp(d[0], d[1], (size_t)rc.M * sizeof(float)) == 0);
            CHECK(memcmp(e[0], e[1], (size_t)rc.M * sizeof(float)) == 0);
            CHECK(memcmp(&m[0], &m[1], sizeof m[0]) == 0);
        }
}

/* The rollout correction on a hand-checked case (verl parity of the rest: test_verl_update.c):
 * log r = old - rollout = {0.5, -1 | 0}; token TIS at 1.5 gives {1.5, e^-1 | 1}; token_k2 at 0.2
 * rejects the second token (k2 0.5); IcePop [0.5, 1.5] zeroes the first two. */
TEST(test_rollout_corr_by_hand) {
    const float old[3] = {-1.0f, -2.0f, -0.1f}, roll[3] = {-1.5f, -1.0f, -0.1f};
    const int off[2] = {0, 2}, len[2] = {2, 1};
    loss_config c;
    loss_config_default(&c);
    c.rollout_is = RIS_TOKEN;
    c.rollout_is_threshold = 1.5f;
    c.rollout_rs = RRS_TOKEN_K2;
    c.rollout_rs_threshold = 0.2f;
    unsigned char tm[3] = {1, 1, 1};
    float w[3];
    rcorr_metrics m;
    memset(&m, 0, sizeof m);
    rcorr_compute(&c, 2, off, len, NULL, tm, old, roll, w, &m);
    CHECK(w[0] == 1.5f && fabsf(w[1] - expf(-1.0f)) < 1e-7f && w[2] == 1.0f);
    CHECK(tm[0] == 1 && tm[1] == 0 && tm[2] == 1);
    rcorr_report r;
    rcorr_finish(&c, &m, &r);
    CHECK_CLOSE(r.abs_diff_mean, 0.5, 1e-7, 0);
    CHECK_CLOSE(r.abs_diff_max, 1.0, 1e-7, 0);
    CHECK_CLOSE(r.rs_masked_fraction, 1.0 / 3, 1e-7, 0);
    CHECK_CLOSE(r.rs_seq_masked_fraction, 0.5, 1e-12, 0);
    CHECK_CLOSE(r.kl, (0.5 - 1.0 + 0.0) / -3.0, 1e-7, 0); /* mean rollout - old */
    CHECK_CLOSE(r.is_max, 1.5, 1e-12, 0);
    c.rollout_is_threshold_lower = 0.5f; /* IcePop */
    c.rollout_rs = RRS_NONE;
    memset(&m, 0, sizeof m);
    rcorr_compute(&c, 2, off, len, NULL, NULL, old, roll, w, &m);
    CHECK(w[0] == 0.0f && w[1] == 0.0f && w[2] == 1.0f);
    rcorr_finish(&c, &m, &r);
    CHECK_CLOSE(r.is_oob_ratio, 2.0 / 3, 1e-7, 0);
}

int main(void) {
    RUN(test_parse);
    RUN(test_defaults);
    RUN(test_advantages);
    RUN(test_verl_cases);
    RUN(test_verl_head_temperature);
    RUN(test_verl_schedules);
    RUN(test_grad_fd_vanilla);
    RUN(test_grad_fd_gspo);
    RUN(test_microbatch_additivity);
    RUN(test_finish);
    RUN(test_all_ones_mask);
    RUN(test_rollout_corr_by_hand);
    return CHECK_DONE();
}
