/* test_loss.c — the GRPO-family losses (engine/train/loss.c).
 *
 * Values: every adv_estimator, and every loss_mode x loss_agg_mode x kl_type (plus a masked
 * response) against tests/fixtures/loss_reference.inc, made by make_loss_reference.py, a plain-
 * Python transcription of veRL's core_algos.py (independent of loss.c). Gradients: central finite
 * differences of loss_compute itself (vanilla: per token; gspo, whose gradient is straight-through
 * by definition: along each response's all-ones direction), and the clipped regions by their
 * closed form. Additivity: micro-batches with global denominators sum to the one-call loss. */
#include "tests/unit/check.h"

#include "common/err.h"
#include "engine/train/loss.h"
#include "tests/fixtures/loss_reference.inc"

#define NREF 5
#define MREF 15

static void ref_offsets(int *off) {
    for (int s = 0, o = 0; s < NREF; s++) { off[s] = o; o += REF_LENS[s]; }
}

static void ref_config(loss_config *c, int mode, int agg, int kl) {
    loss_config_default(c);
    c->mode = (loss_mode)mode;
    c->agg = (loss_agg_mode)agg;
    c->kl = (kl_type)kl;
    c->kl_coef = 0.1f;
    c->entropy_coeff = 0.01f;
    c->agg_norm_len = 6;
}

/* ---------- names and defaults ---------- */

TEST(test_parse) {
    adv_estimator a; loss_agg_mode g; loss_mode m; kl_type k;
    CHECK_EQ_INT(loss_parse_adv("grpo", &a), 0); CHECK_EQ_INT(a, ADV_GRPO);
    CHECK_EQ_INT(loss_parse_adv("drgrpo", &a), 0); CHECK_EQ_INT(a, ADV_DRGRPO);
    CHECK_EQ_INT(loss_parse_adv("rloo", &a), 0); CHECK_EQ_INT(a, ADV_RLOO);
    CHECK_EQ_INT(loss_parse_adv("given", &a), 0); CHECK_EQ_INT(a, ADV_GIVEN);
    CHECK_EQ_INT(loss_parse_adv("gae", &a), GE_INVALID);
    CHECK_STR(err_msg(), "adv_estimator \"gae\" is not one of: grpo, drgrpo, rloo, given");
    const char *aggs[] = {"token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
                          "seq-mean-token-sum-norm"};
    const loss_agg_mode aggv[] = {AGG_TOKEN_MEAN, AGG_TOKEN_SUM, AGG_SEQ_MEAN_TOKEN_SUM,
                                  AGG_SEQ_MEAN_TOKEN_MEAN, AGG_SEQ_MEAN_TOKEN_SUM_NORM};
    for (int i = 0; i < 5; i++) { CHECK_EQ_INT(loss_parse_agg(aggs[i], &g), 0); CHECK_EQ_INT(g, aggv[i]); }
    CHECK_EQ_INT(loss_parse_agg("token_mean", &g), GE_INVALID);
    CHECK_EQ_INT(loss_parse_agg(NULL, &g), GE_INVALID);
    CHECK_EQ_INT(loss_parse_mode("vanilla", &m), 0); CHECK_EQ_INT(m, LOSS_VANILLA);
    CHECK_EQ_INT(loss_parse_mode("gspo", &m), 0); CHECK_EQ_INT(m, LOSS_GSPO);
    CHECK_EQ_INT(loss_parse_mode("gpg", &m), GE_INVALID);
    const char *kls[] = {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"};
    const kl_type klv[] = {KL_K1, KL_K1, KL_ABS, KL_K2, KL_K2, KL_K3, KL_K3};
    for (int i = 0; i < 7; i++) { CHECK_EQ_INT(loss_parse_kl(kls[i], &k), 0); CHECK_EQ_INT(k, klv[i]); }
    CHECK_EQ_INT(loss_parse_kl("full", &k), GE_INVALID);
}

TEST(test_defaults) {
    loss_config c;
    loss_config_default(&c);
    CHECK_EQ_INT(c.adv, ADV_GRPO); CHECK_EQ_INT(c.norm_adv_by_std, 1); CHECK_EQ_INT(c.mode, LOSS_VANILLA);
    CHECK(c.clip_ratio_low == 0.2f && c.clip_ratio_high == 0.28f && c.clip_ratio_c == 3.0f);
    CHECK_EQ_INT(c.agg, AGG_TOKEN_MEAN); CHECK(c.kl_coef == 0.001f); CHECK_EQ_INT(c.kl, KL_K3);
    CHECK(c.entropy_coeff == 0.0f); CHECK_EQ_INT(c.ppo_epochs, 1); CHECK_EQ_INT(c.ppo_mini_batch_size, 0);
    CHECK(c.temperature == 1.0f); CHECK_EQ_INT(c.agg_norm_len, 0);
    CHECK_EQ_INT(c.use_rollout_logprobs, 0); CHECK_EQ_INT(c.mask_truncated, 0); CHECK_EQ_INT(c.filter_groups, 0);
}

/* ---------- advantages ---------- */

TEST(test_advantages) {
    loss_config c;
    loss_config_default(&c);
    float out[NREF];
    struct { adv_estimator a; int norm; } est[4] = {{ADV_GRPO, 1}, {ADV_GRPO, 0}, {ADV_DRGRPO, 1}, {ADV_RLOO, 1}};
    for (int e = 0; e < 4; e++) {
        c.adv = est[e].a; c.norm_adv_by_std = est[e].norm;
        for (int g = 0; g < 2; g++)
            loss_group_advantages(&c, REF_REWARDS + REF_GROUP_FIRST[g], REF_GROUP_N[g], out + REF_GROUP_FIRST[g]);
        for (int i = 0; i < NREF; i++) CHECK_CLOSE(out[i], REF_ADV[e][i], 1e-7, 1e-6);
    }
    /* groups of one (veRL: grpo mean 0 std 1, rloo unchanged) */
    adv_estimator one[3] = {ADV_GRPO, ADV_DRGRPO, ADV_RLOO};
    for (int e = 0; e < 3; e++) {
        c.adv = one[e]; c.norm_adv_by_std = 1;
        for (int i = 0; i < NREF; i++) {
            loss_group_advantages(&c, REF_REWARDS + i, 1, out + i);
            CHECK_CLOSE(out[i], REF_ADV1[e][i], 1e-7, 1e-6);
        }
    }
    /* equal rewards: grpo gives 0 (std 0 + 1e-6), and the group is uniform */
    const float same[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    c.adv = ADV_GRPO;
    loss_group_advantages(&c, same, 4, out);
    for (int i = 0; i < 4; i++) CHECK(out[i] == 0.0f);
    CHECK(loss_group_uniform(same, 4));
    CHECK(!loss_group_uniform(REF_REWARDS, 3));
    CHECK(loss_group_uniform(REF_REWARDS, 1));
    c.adv = ADV_GIVEN;
    loss_group_advantages(&c, REF_REWARDS, NREF, out);
    for (int i = 0; i < NREF; i++) CHECK(out[i] == REF_REWARDS[i]);
}

/* ---------- values against the veRL transcription ---------- */

TEST(test_reference_values) {
    int off[NREF];
    ref_offsets(off);
    int ncase = (int)(sizeof REF_CASES / sizeof REF_CASES[0]);
    CHECK_EQ_INT(ncase, 2 * 5 * 5);
    for (int k = 0; k < ncase; k++) {
        const ref_case *rc = &REF_CASES[k];
        loss_config c;
        ref_config(&c, rc->mode, rc->agg, rc->kl);
        int mask[NREF] = {1, 1, rc->masked ? 0 : 1, 1, 1};
        double tok = 0, seq = 0; int mx = 0;
        loss_count(NREF, REF_LENS, mask, &tok, &seq, &mx);
        CHECK_EQ_INT(mx, 5);
        float dlogp[MREF], dent[MREF];
        loss_metrics m;
        memset(&m, 0, sizeof m);
        double loss = loss_compute(&c, NREF, off, REF_LENS, REF_LOGP, REF_OLD, REF_REF, REF_ENT,
                                   REF_LOSS_ADV, mask, tok, seq, dlogp, dent, &m);
        loss_finish(&m, 1);
        const double got[10] = {m.loss, m.pg_loss, m.kl, m.entropy, m.clip_frac, m.clip_frac_low,
                                m.clip_frac_high, m.clip_frac_dual, m.ratio_mean, m.ratio_max};
        static const char *names[10] = {"loss", "pg_loss", "kl", "entropy", "clip_frac", "clip_frac_low",
                                        "clip_frac_high", "clip_frac_dual", "ratio_mean", "ratio_max"};
        CHECK_MSG(fabs(loss - rc->v[0]) <= 1e-10 + 1e-7 * fabs(rc->v[0]),
                  "case %d: returned loss %.12g, expected %.12g", k, loss, rc->v[0]);
        for (int i = 0; i < 10; i++)
            CHECK_MSG(fabs(got[i] - rc->v[i]) <= 1e-10 + 1e-7 * fabs(rc->v[i]),
                      "case %d (mode %d agg %d kl %d masked %d): %s = %.12g, expected %.12g",
                      k, rc->mode, rc->agg, rc->kl, rc->masked, names[i], got[i], rc->v[i]);
        CHECK_EQ_INT((long long)m.n_tokens, rc->masked ? 11 : 15);
        if (rc->masked)                  /* the dropped response has no gradient */
            for (int t = off[2]; t < off[2] + REF_LENS[2]; t++) CHECK(dlogp[t] == 0.0f && dent[t] == 0.0f);
    }
}

/* The clipped regions of the hand case, by closed form: pg gradient -A r w where the ratio is
 * live, exactly 0 where a clip, the dual clip or the +-20 log-ratio clamp holds it. */
TEST(test_clipped_regions) {
    int off[NREF];
    ref_offsets(off);
    loss_config c;
    ref_config(&c, LOSS_VANILLA, AGG_TOKEN_SUM, KL_K1);
    c.kl_coef = 0; c.entropy_coeff = 0;
    float dlogp[MREF];
    loss_compute(&c, NREF, off, REF_LENS, REF_LOGP, REF_OLD, NULL, NULL, REF_LOSS_ADV, NULL,
                 15, 5, dlogp, NULL, NULL);
    /* tokens: s0 {1.05 live, 1.49 clip-high, 0.74 live (A>0)}, s1 {3.32 dual}, s2 {0.61 clip-low,
     * 1.105, 1.35 (A<0: live), 0.95}, s3 {e^20 dual, e^-20 clamped}, s4 {.., 1.284 clip-high} */
    const int zero[MREF] = {0, 1, 0, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1};
    for (int s = 0; s < NREF; s++)
        for (int j = 0; j < REF_LENS[s]; j++) {
            int t = off[s] + j;
            double r = exp((double)REF_LOGP[t] - REF_OLD[t]);
            double want = zero[t] ? 0.0 : -REF_LOSS_ADV[s] * r;
            CHECK_MSG(fabs(dlogp[t] - want) <= 1e-7 * fabs(want) + (zero[t] ? 0 : 1e-12),
                      "token %d: dlogp %.9g, expected %.9g", t, dlogp[t], want);
        }
    /* k3: d/dlogp = 1 - e^(ref - logp), 0 where the value is clamped at 10 (token 3: y = 3) */
    c.kl = KL_K3; c.kl_coef = 1.0f;
    float dl2[MREF];
    loss_compute(&c, NREF, off, REF_LENS, REF_LOGP, REF_OLD, REF_REF, NULL, REF_LOSS_ADV, NULL,
                 15, 5, dl2, NULL, NULL);
    for (int t = 0; t < MREF; t++) {
        double y = (double)REF_REF[t] - REF_LOGP[t], kld = exp(y) - y - 1;
        double want = kld > 10 ? 0.0 : 1.0 - exp(y);
        CHECK_MSG(fabs((dl2[t] - dlogp[t]) - want) <= 1e-6 * fabs(want) + 1e-7,
                  "k3 token %d: %.9g, expected %.9g", t, dl2[t] - dlogp[t], want);
        if (t == 3) CHECK(dl2[t] == dlogp[t]);
    }
}

/* ---------- gradients by finite differences ---------- */

#define RS 9            /* responses in the random cases */
#define RM 60           /* room for their tokens */
typedef struct {
    int S, M, off[RS], len[RS], mask[RS];
    float logp[RM], old[RM], ref[RM], ent[RM], adv[RS];
} rand_case;

static void make_rand(rand_case *rc, unsigned long long seed) {
    unsigned long long s = seed * 0x9E3779B97F4A7C15ULL + 7;
    rc->S = RS; rc->M = 0;
    for (int i = 0; i < RS; i++) {
        rc->len[i] = 1 + (int)(((check_randf(&s, 1.0f) + 1.0f) * 0.5f) * 6.99f);
        rc->off[i] = rc->M; rc->M += rc->len[i];
        rc->mask[i] = i != 4;                               /* one dropped response */
        rc->adv[i] = check_randf(&s, 1.5f);
    }
    for (int t = 0; t < rc->M; t++) {
        /* on a 2^-12 grid: the finite-difference steps k / 1024 stay exact in float */
        rc->logp[t] = roundf((-1.6f + check_randf(&s, 1.5f)) * 4096) / 4096;
        rc->old[t] = rc->logp[t] - check_randf(&s, 0.6f);   /* ratios 0.55 .. 1.8: all regions */
        rc->ref[t] = rc->logp[t] + check_randf(&s, 1.0f);
        rc->ent[t] = 1.5f + check_randf(&s, 1.2f);
    }
}

/* Distance of token t from a kink of its loss (where a one-sided derivative would differ). */
static int near_kink(const loss_config *c, const rand_case *rc, int s, int t, double h) {
    double r = exp((double)rc->logp[t] - rc->old[t]);
    double kinks[3] = {1.0 - c->clip_ratio_low, 1.0 + c->clip_ratio_high, c->clip_ratio_c};
    for (int i = 0; i < 3; i++) if (fabs(r - kinks[i]) < 4 * h * r) return 1;
    double x = (double)rc->logp[t] - rc->ref[t];
    if (c->kl == KL_ABS && fabs(x) < 4 * h) return 1;
    if (c->kl == KL_K3 && fabs(exp(-x) + x - 1 - 10) < 4 * h * 20) return 1;
    (void)s;
    return 0;
}

static double eval_loss(const loss_config *c, const rand_case *rc, double tok, double seq) {
    static float d1[RM], d2[RM];
    return loss_compute(c, rc->S, rc->off, rc->len, rc->logp, rc->old, rc->ref, rc->ent, rc->adv,
                        rc->mask, tok, seq, d1, d2, NULL);
}

TEST(test_grad_fd_vanilla) {
    const double h = 1.0 / 1024;    /* exact steps on the logp grid of make_rand */
    int checked = 0, skipped = 0;
    double worst = 0;
    for (int agg = 0; agg < 5; agg++)
        for (int kl = 0; kl < 4; kl++) {
            rand_case rc;
            make_rand(&rc, 100 + agg * 10 + kl);
            loss_config c;
            ref_config(&c, LOSS_VANILLA, agg, kl);
            c.kl_coef = 0.3f; c.entropy_coeff = 0.05f; c.agg_norm_len = 0;
            double tok = 0, seq = 0; int mx = 0;
            loss_count(rc.S, rc.len, rc.mask, &tok, &seq, &mx);
            float dlogp[RM], dent[RM];
            loss_compute(&c, rc.S, rc.off, rc.len, rc.logp, rc.old, rc.ref, rc.ent, rc.adv, rc.mask,
                         tok, seq, dlogp, dent, NULL);
            for (int s = 0; s < rc.S; s++)
                for (int j = 0; j < rc.len[s]; j++) {
                    int t = rc.off[s] + j;
                    if (near_kink(&c, &rc, s, t, h)) { skipped++; continue; }
                    /* five-point stencil: truncation O(h^4), steps exact in float */
                    float x = rc.logp[t];
                    double f[4]; const int k[4] = {2, 1, -1, -2};
                    for (int i = 0; i < 4; i++) { rc.logp[t] = (float)(x + k[i] * h); f[i] = eval_loss(&c, &rc, tok, seq); }
                    rc.logp[t] = x;
                    double fd = (-f[0] + 8 * f[1] - 8 * f[2] + f[3]) / (12 * h);
                    double err = fabs(dlogp[t] - fd);
                    double tol = 1e-9 + 1e-6 * fabs(fd);
                    if (err / fmax(fabs(fd), 1e-4) > worst) worst = err / fmax(fabs(fd), 1e-4);
                    CHECK_MSG(err <= tol, "agg %d kl %d token %d (resp %d mask %d): dlogp %.9g, fd %.9g",
                              agg, kl, t, s, rc.mask[s], dlogp[t], fd);
                    /* entropy enters linearly: d loss / d ent */
                    float e = rc.ent[t];
                    rc.ent[t] = e + 0.25f; double ep = eval_loss(&c, &rc, tok, seq);
                    rc.ent[t] = e - 0.25f; double em = eval_loss(&c, &rc, tok, seq);
                    rc.ent[t] = e;
                    double fde = (ep - em) / 0.5;
                    CHECK_MSG(fabs(dent[t] - fde) <= 1e-12 + 1e-6 * fabs(fde), "dent %d: %.9g vs %.9g",
                              t, dent[t], fde);
                    checked++;
                }
        }
    CHECK_MSG(skipped * 10 < checked, "too many kinks skipped: %d of %d", skipped, checked + skipped);
    printf("# vanilla: %d token gradients checked, %d near a kink skipped, worst err / max(|fd|, 1e-4) %.2e\n",
           checked, skipped, worst);
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
            c.kl_coef = kl == 1 ? 0.0f : 0.3f;      /* abs has kinks: its run checks the pure pg */
            c.entropy_coeff = 0.05f; c.agg_norm_len = 0;
            double tok = 0, seq = 0; int mx = 0;
            loss_count(rc.S, rc.len, rc.mask, &tok, &seq, &mx);
            float dlogp[RM], dent[RM];
            loss_compute(&c, rc.S, rc.off, rc.len, rc.logp, rc.old, rc.ref, rc.ent, rc.adv, rc.mask,
                         tok, seq, dlogp, dent, NULL);
            for (int s = 0; s < rc.S; s++) {
                double mean = 0;
                for (int j = 0; j < rc.len[s]; j++) mean += (double)rc.logp[rc.off[s] + j] - rc.old[rc.off[s] + j];
                double r = exp(mean / rc.len[s]);
                if (fabs(r - 0.8) < 4 * h || fabs(r - 1.28) < 4 * h) continue;
                float save[8];
                double sum_g = 0, f[4];
                for (int j = 0; j < rc.len[s]; j++) { save[j] = rc.logp[rc.off[s] + j]; sum_g += dlogp[rc.off[s] + j]; }
                /* the same step on every token (exact on the grid), five-point stencil */
                const double hs = 1.0 / 1024; const int k[4] = {2, 1, -1, -2};
                for (int i = 0; i < 4; i++) {
                    for (int j = 0; j < rc.len[s]; j++) rc.logp[rc.off[s] + j] = (float)(save[j] + k[i] * hs);
                    f[i] = eval_loss(&c, &rc, tok, seq);
                }
                for (int j = 0; j < rc.len[s]; j++) rc.logp[rc.off[s] + j] = save[j];
                double fd = (-f[0] + 8 * f[1] - 8 * f[2] + f[3]) / (12 * hs);
                CHECK_MSG(fabs(sum_g - fd) <= 1e-9 + 1e-6 * fabs(fd),
                          "gspo agg %d kl %d resp %d: sum dlogp %.9g, fd %.9g", agg, kl, s, sum_g, fd);
                if (c.kl_coef == 0)
                    for (int j = 1; j < rc.len[s]; j++)
                        CHECK_MSG(dlogp[rc.off[s] + j] == dlogp[rc.off[s]], "gspo resp %d: unequal token grads", s);
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
            c.agg_norm_len = 0;
            double tok = 0, seq = 0; int mx = 0;
            loss_count(rc.S, rc.len, rc.mask, &tok, &seq, &mx);
            c.agg_norm_len = mx;                        /* the mini-batch's divisor, fixed */
            float d_all[RM], e_all[RM], d_mb[RM], e_mb[RM];
            loss_metrics m1, m2;
            memset(&m1, 0, sizeof m1); memset(&m2, 0, sizeof m2);
            double whole = loss_compute(&c, rc.S, rc.off, rc.len, rc.logp, rc.old, rc.ref, rc.ent,
                                        rc.adv, rc.mask, tok, seq, d_all, e_all, &m1);
            /* two micro-batches, each with its own token arrays starting at 0 */
            int cut = 4, o1 = rc.off[cut];
            int off2[RS];
            for (int s = cut; s < rc.S; s++) off2[s - cut] = rc.off[s] - o1;
            double part = loss_compute(&c, cut, rc.off, rc.len, rc.logp, rc.old, rc.ref, rc.ent,
                                       rc.adv, rc.mask, tok, seq, d_mb, e_mb, &m2);
            part += loss_compute(&c, rc.S - cut, off2, rc.len + cut, rc.logp + o1, rc.old + o1,
                                 rc.ref + o1, rc.ent + o1, rc.adv + cut, rc.mask + cut, tok, seq,
                                 d_mb + o1, e_mb + o1, &m2);
            CHECK_MSG(fabs(part - whole) <= 1e-13 * (1 + fabs(whole)), "mode %d agg %d: %.17g vs %.17g",
                      mode, agg, part, whole);
            CHECK_CLOSE(m2.loss, m1.loss, 1e-13, 1e-12);
            CHECK_CLOSE(m2.pg_loss, m1.pg_loss, 1e-13, 1e-12);
            CHECK(m2.n_tokens == m1.n_tokens && m2.clip_frac == m1.clip_frac && m2.ratio_max == m1.ratio_max);
            for (int t = 0; t < rc.M; t++)
                CHECK_MSG(d_mb[t] == d_all[t] && e_mb[t] == e_all[t], "mode %d agg %d token %d", mode, agg, t);
        }
}

/* loss_finish over several optimizer steps: loss and pg_loss average over steps, token metrics
 * over tokens. */
TEST(test_finish) {
    loss_metrics m;
    memset(&m, 0, sizeof m);
    m.loss = 3.0; m.pg_loss = 1.5; m.kl = 2.0; m.entropy = 8.0; m.ratio_mean = 4.2; m.ratio_max = 1.3;
    m.clip_frac = 1; m.clip_frac_low = 0; m.clip_frac_high = 1; m.clip_frac_dual = 0; m.n_tokens = 4;
    loss_finish(&m, 3);
    CHECK_CLOSE(m.loss, 1.0, 0, 1e-15); CHECK_CLOSE(m.pg_loss, 0.5, 0, 1e-15);
    CHECK_CLOSE(m.kl, 0.5, 0, 1e-15); CHECK_CLOSE(m.entropy, 2.0, 0, 1e-15);
    CHECK_CLOSE(m.ratio_mean, 1.05, 0, 1e-15); CHECK(m.ratio_max == 1.3);
    CHECK_CLOSE(m.clip_frac, 0.25, 0, 1e-15); CHECK_CLOSE(m.clip_frac_high, 0.25, 0, 1e-15);
}

int main(void) {
    RUN(test_parse);
    RUN(test_defaults);
    RUN(test_advantages);
    RUN(test_reference_values);
    RUN(test_clipped_regions);
    RUN(test_grad_fd_vanilla);
    RUN(test_grad_fd_gspo);
    RUN(test_microbatch_additivity);
    RUN(test_finish);
    return CHECK_DONE();
}
