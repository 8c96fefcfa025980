/* loss.c — GRPO-family losses on per-token logprobs (contract in loss.h), verl 0.9.1's formulas.
 *
 * Source of each formula: loss.h's table (verl/trainer/ppo/core_algos.py, verl/workers/utils/
 * losses.py ppo_loss). Aggregation is agg_loss's global-batch form: token sums over a global
 * token count, sequence sums over a global sequence count. Everything is computed in double
 * from the fp32 inputs; gradients are exactly those autograd takes through the same expressions.
 *
 * Legend: S responses, M predicted tokens (all responses' tokens, addressed by off/len). */
#include "engine/train/loss.h"

#include <assert.h>
#include <math.h>
#include <string.h>

#include "common/err.h"
#include "engine/params.h"

/* ---------- configuration and names ---------- */

/* Names are the choices of the algorithm section's rows (params.c), in enum order. */
static int parse_name(const char *what, const char *s, int *out) {
    const eng_param *p = eng_param_find(&eng_loss_params, what);
    int v = p ? eng_param_choice(p, s) : -1;
    if (v >= 0) {
        *out = v;
        return 0;
    }
    char known[256] = "";
    for (const char *c = p ? p->choices : ""; *c && strlen(known) < sizeof known - 3; c++) {
        size_t k = strlen(known);
        if (*c == '|' || *c == ',') {
            known[k] = ',';
            known[k + 1] = ' ';
            known[k + 2] = 0;
        } else {
            known[k] = *c;
            known[k + 1] = 0;
        }
    }
    return err_set(GE_INVALID, "%s \"%s\" is not one of: %s", what, s ? s : "(null)", known);
}

int loss_parse_adv(const char *s, adv_estimator *out) {
    int v, rc = parse_name("adv_estimator", s, &v);
    if (!rc) *out = (adv_estimator)v;
    return rc;
}
int loss_parse_agg(const char *s, loss_agg_mode *out) {
    int v, rc = parse_name("loss_agg_mode", s, &v);
    if (!rc) *out = (loss_agg_mode)v;
    return rc;
}
int loss_parse_mode(const char *s, loss_mode *out) {
    int v, rc = parse_name("loss_mode", s, &v);
    if (!rc) *out = (loss_mode)v;
    return rc;
}
int loss_parse_kl(const char *s, kl_type *out) {
    int v, rc = parse_name("kl_type", s, &v);
    if (!rc) *out = (kl_type)v;
    return rc;
}

/* ---------- advantages ---------- */

void loss_group_advantages(const loss_config *c, const float *rewards, int n, float *adv_out) {
    assert(n >= 1);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += rewards[i];
    /* veRL: a group of one has mean 0 and std 1 (grpo), and rloo leaves its score as is. */
    double mean = n > 1 ? sum / n : 0.0, std = 1.0;
    if (n > 1) {
        double ss = 0;
        for (int i = 0; i < n; i++) ss += (rewards[i] - mean) * (rewards[i] - mean);
        std = sqrt(ss / (n - 1)); /* torch.std: unbiased */
    }
    for (int i = 0; i < n; i++) {
        double r = rewards[i], a;
        switch (c->adv) {
        case ADV_GRPO: a = c->norm_adv_by_std ? (r - mean) / (std + 1e-6) : r - mean; break;
        case ADV_DRGRPO: a = r - mean; break;
        case ADV_RLOO: /* r - mean of the others = (n r - sum) / (n - 1) */ a = n > 1 ? (n * r - sum) / (n - 1) : r; break;
        default: /* ADV_GIVEN: the values are the advantages */ a = r; break;
        }
        adv_out[i] = (float)a;
    }
}

int loss_group_uniform(const float *rewards, int n) {
    for (int i = 1; i < n; i++)
        if (rewards[i] != rewards[0]) return 0;
    return 1;
}

/* ---------- aggregation ---------- */

/* Tokens of response s that carry loss: len[s], less those tmask marks 0. */
static int counted_len(int s, const int *off, const int *len, const unsigned char *tmask) {
    if (!tmask) return len[s];
    int n = 0;
    for (int j = 0; j < len[s]; j++) n += tmask[off[s] + j] != 0;
    return n;
}

void loss_count(int S, const int *off, const int *len, const int *mask, const unsigned char *tmask, double *tok_denom,
                double *seq_denom, int *max_len) {
    for (int s = 0; s < S; s++) {
        int n = (mask && !mask[s]) || len[s] <= 0 ? 0 : counted_len(s, off, len, tmask);
        if (n <= 0) continue;
        *tok_denom += n;
        *seq_denom += 1;
        if (len[s] > *max_len) *max_len = len[s];
    }
}

/* The weight of every token of a counted response of length L under an aggregation mode. */
static double agg_weight(loss_agg_mode agg, int L, double tok_denom, double seq_denom, double norm_len) {
    switch (agg) {
    case AGG_TOKEN_MEAN: return 1.0 / tok_denom;
    case AGG_TOKEN_SUM: return 1.0;
    case AGG_SEQ_MEAN_TOKEN_SUM: return 1.0 / seq_denom;
    case AGG_SEQ_MEAN_TOKEN_MEAN: return 1.0 / (((double)L + 1e-8) * seq_denom); /* veRL's 1e-8 */
    case AGG_SEQ_MEAN_TOKEN_SUM_NORM: return 1.0 / (seq_denom * norm_len);
    }
    return 0;
}

/* The seq-mean-token-sum-norm divisor: loss_scale_factor, or veRL's padded width (the longest
 * response, dropped ones included). */
static double norm_len_of(const loss_config *c, int S, const int *len) {
    if (c->loss_scale_factor > 0) return c->loss_scale_factor;
    int mx = 1;
    for (int s = 0; s < S; s++)
        if (len[s] > mx) mx = len[s];
    return mx;
}

double loss_agg(const loss_config *c, int S, const int *off, const int *len, const float *x, const int *mask,
                const unsigned char *tmask, double tok_denom, double seq_denom) {
    double norm_len = norm_len_of(c, S, len), sum = 0;
    for (int s = 0; s < S; s++) {
        int n = (mask && !mask[s]) || len[s] <= 0 ? 0 : counted_len(s, off, len, tmask);
        if (n <= 0) continue;
        double w = agg_weight(c->agg, n, tok_denom, seq_denom, norm_len), t = 0;
        for (int j = 0; j < len[s]; j++)
            if (!tmask || tmask[off[s] + j]) t += x[off[s] + j];
        sum += w * t;
    }
    return sum;
}

void loss_finish(loss_metrics *m, int n_steps) {
    if (n_steps > 0) {
        double n = n_steps;
        m->loss /= n;
        m->pg_loss /= n;
        m->pg_clipfrac /= n;
        m->pg_clipfrac_lower /= n;
        m->ppo_kl /= n;
        m->kl_loss /= n;
        m->entropy_loss /= n;
    }
    if (m->n_tokens > 0) {
        double n = m->n_tokens;
        m->kl /= n;
        m->entropy /= n;
        m->ratio_mean /= n;
        m->clip_frac /= n;
        m->clip_frac_low /= n;
        m->clip_frac_high /= n;
        m->clip_frac_dual /= n;
    }
}

/* ---------- per-token terms ---------- */

/* KL penalty of x = logp - ref and its derivative in logp (veRL kl_penalty). */
static double kl_value(kl_type t, double logp, double ref, double *d) {
    double x = logp - ref;
    switch (t) {
    case KL_K1_ST: /* straight through: k2's gradient, k1's / k3's value */
    case KL_K3_ST: {
        double v = kl_value(t == KL_K1_ST ? KL_K1 : KL_K3, logp, ref, d);
        *d = x;
        return v;
    }
    case KL_K1: *d = 1.0; return x;
    case KL_ABS: *d = x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0; return fabs(x);
    case KL_K2: *d = x; return 0.5 * x * x;
    case KL_K3: {
        double y = -x, yc = y < -20 ? -20 : y > 20 ? 20 : y;
        double e = exp(yc), kld = e - yc - 1;
        /* d kld / d logp = (e - 1) d yc / d logp = (1 - e) inside both clamps, else 0 */
        int inside = y >= -20 && y <= 20 && kld >= -10 && kld <= 10;
        *d = inside ? 1.0 - e : 0.0;
        return kld > 10 ? 10 : kld < -10 ? -10 : kld;
    }
    }
    *d = 0;
    return 0;
}

/* Clipped policy loss of one token with ratio r (dr = d r / d logp) and advantage A.
 * Writes d pg / d logp; counts the clip metrics into m. */
static double pg_token(const loss_config *c, double A, double r, double dr, int dual, double *d, loss_metrics *m) {
    double lo = 1.0 - c->clip_ratio_low, hi = 1.0 + c->clip_ratio_high;
    double rc = r < lo ? lo : r > hi ? hi : r;
    double l1 = -A * r, l2 = -A * rc;
    double pg = l1 > l2 ? l1 : l2;
    int clipped = l2 > l1; /* then rc is a constant: gradient 0 */
    *d = clipped ? 0.0 : -A * dr;
    if (clipped && m) {
        m->clip_frac += 1;
        if (A < 0) m->clip_frac_low += 1;
        else m->clip_frac_high += 1;
    }
    if (dual && A < 0) {
        double l3 = -A * c->clip_ratio_c;
        if (pg > l3) {
            pg = l3;
            *d = 0.0;
            if (m) m->clip_frac_dual += 1;
        }
    }
    return pg;
}

/* ---------- the loss ---------- */

double loss_compute(const loss_config *c, int S, const int *off, const int *len, const float *logp, const float *old,
                    const float *ref, const float *ent, const float *adv, const int *mask, const unsigned char *tmask,
                    const float *isw, double tok_denom, double seq_denom, float *dlogp, float *dent, loss_metrics *m) {
    assert(c->kl_coef == 0 || ref);
    assert(c->entropy_coeff == 0 || ent);
    double norm_len = norm_len_of(c, S, len);
    double total = 0, pg_total = 0, kl_total = 0, ent_total = 0, tok_w = 1.0 / tok_denom;
    for (int s = 0; s < S; s++) {
        int L = len[s], o = off[s], n = (mask && !mask[s]) || L <= 0 ? 0 : counted_len(s, off, len, tmask);
        if (n <= 0) {
            for (int j = 0; j < L; j++) {
                dlogp[o + j] = 0;
                if (dent) dent[o + j] = 0;
            }
            continue;
        }
        double A = adv[s];
        double w = agg_weight(c->agg, n, tok_denom, seq_denom, norm_len);
        /* gspo: one ratio for the response (the mean over its trained tokens), straight-through per token */
        double seq_r = 0, seq_dr = 0;
        if (c->mode == LOSS_GSPO) {
            double sum = 0;
            for (int j = 0; j < L; j++)
                if (!tmask || tmask[o + j]) sum += (double)logp[o + j] - old[o + j];
            double lr = sum / n;
            seq_r = exp(lr < 10 ? lr : 10);
            seq_dr = lr <= 10 ? seq_r : 0.0;
        }
        for (int j = 0; j < L; j++) {
            int t = o + j;
            if (tmask && !tmask[t]) { /* context, not trained: attended to, no loss, no gradient */
                dlogp[t] = 0;
                if (dent) dent[t] = 0;
                continue;
            }
            double r, dr, dpg, lr = (double)logp[t] - old[t];
            int dual;
            if (c->mode == LOSS_GSPO) {
                r = seq_r;
                dr = seq_dr;
                dual = 0;
            } else {
                lr = lr < -20 ? -20 : lr > 20 ? 20 : lr; /* veRL clamps the log-ratio, ppo_kl too */
                r = exp(lr);
                dr = (double)logp[t] - old[t] >= -20 && (double)logp[t] - old[t] <= 20 ? r : 0.0;
                dual = 1;
            }
            double clipped = m ? m->clip_frac : 0, dualed = m ? m->clip_frac_dual : 0;
            double pg = pg_token(c, A, r, dr, dual, &dpg, m);
            if (isw) { /* rollout correction's importance weight: a constant factor of the pg term */
                pg *= isw[t];
                dpg *= isw[t];
            }
            double term = w * pg, dterm = w * dpg;
            pg_total += term;
            if (m) {
                m->pg_clipfrac += (m->clip_frac - clipped) * tok_w;
                m->pg_clipfrac_lower += (m->clip_frac_dual - dualed) * tok_w;
                m->ppo_kl -= lr * tok_w;
            }
            if (ref) {
                double dk, k = kl_value(c->kl, logp[t], ref[t], &dk);
                term += c->kl_coef * w * k;
                dterm += c->kl_coef * w * dk;
                kl_total += w * k;
                if (m) m->kl += k;
            }
            if (ent) {
                term -= c->entropy_coeff * w * ent[t];
                ent_total += w * ent[t];
                if (m) m->entropy += ent[t];
            }
            if (dent) dent[t] = (float)(-c->entropy_coeff * w);
            dlogp[t] = (float)dterm;
            total += term;
            if (m) {
                m->ratio_mean += r;
                if (r > m->ratio_max) m->ratio_max = r;
                m->n_tokens += 1;
            }
        }
    }
    if (m) {
        m->loss += total;
        m->pg_loss += pg_total;
        m->kl_loss += kl_total;
        m->entropy_loss += ent_total;
    }
    return total;
}
