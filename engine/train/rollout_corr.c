/* rollout_corr.c — veRL's rollout correction (contract in rollout_corr.h), verl 0.9.1's formulas
 * from verl/trainer/ppo/rollout_corr_helper.py: compute_rollout_correction_weights,
 * compute_rollout_rejection_mask, compute_is_metrics, compute_offpolicy_metrics. Double math on
 * the fp32 inputs; masked means divide by (count + 1e-8) as verl_F.masked_mean does.
 *
 * Legend: S responses (veRL's batch rows), M predicted tokens (addressed by off/len). */
#include "engine/train/rollout_corr.h"

#include <assert.h>
#include <math.h>

#define SAFETY_BOUND 20.0 /* veRL's clamp of log ratios before exp */

static double clampd(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

int rcorr_enabled(const loss_config *c) { return c->rollout_is != RIS_NONE || c->rollout_rs != RRS_NONE; }

/* ---------- rejection sampling ---------- */

static int rs_is_k1(int rs) { return rs == RRS_TOKEN_K1 || rs == RRS_SEQ_SUM_K1 || rs == RRS_SEQ_MEAN_K1; }

/* The divergence statistic of one token: k1 = -lr, k2 = lr^2 / 2, k3 = e^lr - 1 - lr (lr clamped). */
static double rs_token_stat(int rs, double lr) {
    double l = clampd(lr, -SAFETY_BOUND, SAFETY_BOUND);
    switch (rs) {
    case RRS_TOKEN_K1:
    case RRS_SEQ_SUM_K1:
    case RRS_SEQ_MEAN_K1: return -l;
    case RRS_TOKEN_K2:
    case RRS_SEQ_SUM_K2:
    case RRS_SEQ_MEAN_K2:
    case RRS_SEQ_MAX_K2: return 0.5 * l * l;
    default: return exp(l) - 1.0 - l;
    }
}

/* Whether a statistic passes: k1 within [log lower, log upper], the others <= upper. */
static int rs_keep(const loss_config *c, double stat) {
    if (!rs_is_k1(c->rollout_rs)) return stat <= (double)c->rollout_rs_threshold;
    double up = c->rollout_rs_threshold, lo = c->rollout_rs_threshold_lower > 0 ? c->rollout_rs_threshold_lower : 1.0 / up;
    return stat >= log(lo) && stat <= log(up);
}

/* ---------- one response ---------- */

void rcorr_compute(const loss_config *c, int S, const int *off, const int *len, const int *mask, unsigned char *tmask,
                   const float *old, const float *roll, float *isw, rcorr_metrics *m) {
    assert(c->rollout_rs == RRS_NONE || tmask);
    double up = c->rollout_is_threshold, lo = c->rollout_is_threshold_lower; /* lo 0: truncated IS */
    double lo_metric = lo > 0 ? lo : 1.0 / up;
    for (int s = 0; s < S; s++) {
        int o = off[s], L = len[s], dropped = mask && !mask[s];
#define TRAINED(t) (!dropped && (!tmask || tmask[t]))
        m->n_rows += 1;
        /* per row: sums over its trained tokens */
        double n = 0, sum_lr = 0, sum_old = 0, sum_roll = 0, seq_stat = 0;
        int first = 1;
        for (int j = 0; j < L; j++) {
            int t = o + j;
            if (!TRAINED(t)) continue;
            double lr = (double)old[t] - roll[t], d = fabs(lr);
            n += 1;
            sum_lr += lr;
            sum_old += old[t];
            sum_roll += roll[t];
            m->n_tok += 1;
            m->kl += (double)roll[t] - old[t];
            m->k3_kl += exp(lr) - lr - 1.0;
            double rho = exp(clampd(lr, -SAFETY_BOUND, SAFETY_BOUND));
            m->chi2_token += rho * rho;
            m->abs_diff += d;
            if (d > m->abs_diff_max) m->abs_diff_max = d;
            if (c->rollout_rs >= RRS_SEQ_SUM_K1) {
                double st = rs_token_stat(c->rollout_rs, lr);
                if (c->rollout_rs >= RRS_SEQ_MAX_K2) seq_stat = first || st > seq_stat ? st : seq_stat;
                else seq_stat += st;
                first = 0;
            }
        }
        m->training_log_ppl += -sum_old / (n + 1e-8);
        m->rollout_log_ppl += -sum_roll / (n + 1e-8);
        m->log_ppl_diff += sum_roll / (n + 1e-8) - sum_old / (n + 1e-8);
        /* importance weights */
        if (c->rollout_is != RIS_NONE) {
            double seq_w = exp(clampd(sum_lr, -SAFETY_BOUND, SAFETY_BOUND));
            if (c->rollout_is == RIS_SEQUENCE) { /* veRL's sequence metrics: per row, from the log sum */
                double wmax = exp(sum_lr < SAFETY_BOUND ? sum_lr : SAFETY_BOUND);
                if (wmax > m->is_max) m->is_max = wmax; /* weights are > 0: max from 0 */
                m->is_high += sum_lr > log(up);
                m->is_low += sum_lr < log(lo_metric);
            }
            for (int j = 0; j < L; j++) {
                int t = o + j;
                double raw = c->rollout_is == RIS_TOKEN ? exp(clampd((double)old[t] - roll[t], -SAFETY_BOUND, SAFETY_BOUND))
                                                        : seq_w;
                if (!TRAINED(t)) raw = 0; /* veRL: raw weights * response_mask */
                double w = lo > 0 ? (raw >= lo && raw <= up ? raw : 0.0) : (raw < up ? raw : up);
                isw[t] = (float)w;
                if (!TRAINED(t)) continue;
                m->is_sum += w;
                if (lo > 0) m->is_oob += raw < lo || raw > up;
                if (c->rollout_is == RIS_TOKEN) {
                    if (w > m->is_max) m->is_max = w;
                    m->is_high += raw > up;
                    m->is_low += raw < lo_metric;
                }
            }
        }
        /* rejection: a token, or every token of the row */
        if (c->rollout_rs != RRS_NONE) {
            int seq_keep = 1, any = 0;
            if (c->rollout_rs >= RRS_SEQ_SUM_K1) {
                if (c->rollout_rs >= RRS_SEQ_MEAN_K1 && c->rollout_rs <= RRS_SEQ_MEAN_K3) seq_stat /= n + 1e-8;
                seq_keep = rs_keep(c, seq_stat);
            }
            for (int j = 0; j < L; j++) {
                int t = o + j;
                if (!TRAINED(t)) continue;
                int keep = c->rollout_rs >= RRS_SEQ_SUM_K1 ? seq_keep
                                                           : rs_keep(c, rs_token_stat(c->rollout_rs, (double)old[t] - roll[t]));
                if (!keep) {
                    tmask[t] = 0;
                    m->rs_tok += 1;
                    any = 1;
                }
            }
            m->rs_seq += any;
        }
#undef TRAINED
    }
}

void rcorr_add(rcorr_metrics *a, const rcorr_metrics *b) {
    a->n_rows += b->n_rows;
    a->n_tok += b->n_tok;
    a->kl += b->kl;
    a->k3_kl += b->k3_kl;
    a->chi2_token += b->chi2_token;
    a->abs_diff += b->abs_diff;
    a->log_ppl_diff += b->log_ppl_diff;
    a->training_log_ppl += b->training_log_ppl;
    a->rollout_log_ppl += b->rollout_log_ppl;
    a->is_sum += b->is_sum;
    a->is_high += b->is_high;
    a->is_low += b->is_low;
    a->is_oob += b->is_oob;
    a->rs_tok += b->rs_tok;
    a->rs_seq += b->rs_seq;
    a->abs_diff_max = fmax(a->abs_diff_max, b->abs_diff_max);
    a->is_max = fmax(a->is_max, b->is_max);
}

void rcorr_finish(const loss_config *c, const rcorr_metrics *m, rcorr_report *r) {
    double nt = m->n_tok + 1e-8, nr = m->n_rows > 0 ? m->n_rows : 1;
    r->kl = m->kl / nt;
    r->k3_kl = m->k3_kl / nt;
    r->chi2_token = m->chi2_token / nt - 1.0;
    r->log_ppl_diff = m->log_ppl_diff / nr;
    r->training_log_ppl = m->training_log_ppl / nr;
    r->rollout_log_ppl = m->rollout_log_ppl / nr;
    r->abs_diff_mean = m->n_tok > 0 ? m->abs_diff / m->n_tok : 0;
    r->abs_diff_max = m->abs_diff_max;
    r->is_mean = m->is_sum / nt;
    r->is_max = m->is_max;
    double den = c->rollout_is == RIS_SEQUENCE ? nr : nt;
    r->is_ratio_fraction_high = m->is_high / den;
    r->is_ratio_fraction_low = m->is_low / den;
    r->is_oob_ratio = m->is_oob / nt;
    r->rs_masked_fraction = m->rs_tok / nt;
    r->rs_seq_masked_fraction = m->rs_seq / nr;
}
