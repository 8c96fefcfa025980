/* rollout_corr.h — veRL's rollout correction: the gap between the policy that sampled the
 * responses (their rollout logprobs, from the client) and the policy the update starts from (the
 * old pass's logprobs), corrected by importance weights, rejection, or both.
 *
 * The semantics are verl 0.9.1's (verl/trainer/ppo/rollout_corr_helper.py), decoupled mode:
 *   rcorr_compute   compute_rollout_correction_and_rejection_mask, with log r = old - rollout:
 *     rollout_is      token: w_t = exp(clamp(log r_t, ±20)); sequence: w = exp(clamp(Σ_t log r_t,
 *                     ±20)) on every token of the response (sums over its trained tokens);
 *                     rollout_is_threshold u: truncated IS, min(w, u); "l_u": IcePop, w where
 *                     l <= w <= u, else 0. The weights multiply each token's policy loss (and its
 *                     gradient) in loss_compute; not its KL or entropy.
 *     rollout_rs      a token (token_*) or a whole response (seq_sum_*, seq_mean_*, seq_max_*) is
 *                     rejected when its divergence leaves the threshold: k1 = -log r must lie in
 *                     [log l, log u] (a number u: l = 1/u); k2 = (log r)^2 / 2 and
 *                     k3 = e^{log r} - 1 - log r must be <= u (log r clamped to ±20). Rejected
 *                     tokens leave the loss mask: no loss, no denominator — as veRL's modified
 *                     response_mask.
 *   metrics         compute_offpolicy_metrics and the IS / RS metrics, under veRL's keys
 *                   (rollout_corr/kl, k3_kl, log_ppl_diff, chi2_token, rollout_is_mean, ...),
 *                   over the responses' trained tokens before rejection; plus grpod's own mean
 *                   and max |old - rollout|.
 * Host-side double math on per-token arrays, like loss.c; knows nothing of models or backends.
 * Legend: S responses, M predicted tokens (addressed by off/len). */
#ifndef GRPOD_ROLLOUT_CORR_H
#define GRPOD_ROLLOUT_CORR_H

#include "engine/train/loss.h"


/* rcorr_metrics (loss.h, where loss_metrics holds one): sums over responses and their trained
 * tokens, combined over calls and ranks by rcorr_add; rcorr_finish reports them. */

/* 1 when c asks for a correction (rollout_is or rollout_rs set). */
int rcorr_enabled(const loss_config *c);

/* Responses [0, S) (off, len into the M-arrays; mask (S) 0 drops a response; tmask (M) or NULL as
 * in loss_compute): old and roll (M) logprobs. Writes isw (M; NULL when rollout_is is none: the
 * weights of every token of the S responses) and clears tmask[t] of each rejected token
 * (tmask must be non-NULL when rollout_rs is set). Adds to *m. */
void rcorr_compute(const loss_config *c, int S, const int *off, const int *len, const int *mask, unsigned char *tmask,
                   const float *old, const float *roll, float *isw, rcorr_metrics *m);

/* Add b into a (the _max fields by max). */
void rcorr_add(rcorr_metrics *a, const rcorr_metrics *b);

/* The reported values (veRL's definitions; see rcorr_metrics), in place. */
typedef struct {
    double kl, k3_kl, chi2_token, log_ppl_diff, training_log_ppl, rollout_log_ppl;
    double abs_diff_mean, abs_diff_max;
    double is_mean, is_max, is_ratio_fraction_high, is_ratio_fraction_low, is_oob_ratio;
    double rs_masked_fraction, rs_seq_masked_fraction;
} rcorr_report;
void rcorr_finish(const loss_config *c, const rcorr_metrics *m, rcorr_report *r);
#endif
