/* loss.h — GRPO-family losses on per-token logprobs, with the meaning veRL gives their names.
 *
 * Everything here is host-side fp32 math on per-token arrays (M predicted tokens of a
 * micro-batch, grouped by response): advantages, PPO-clip / dual-clip / GSPO policy loss,
 * KL penalty, entropy bonus, loss aggregation, and their gradients with respect to the
 * per-token logprob and entropy (which the backend's logprob head back-propagates). Every
 * backend (CPU and CUDA) runs this same code between its forward and backward passes.
 * It knows nothing of models or backends.
 *
 * The semantics are those of verl 0.9.1 (PyPI), function by function:
 *   loss_group_advantages   verl/trainer/ppo/core_algos.py compute_grpo_outcome_advantage
 *                           (grpo; drgrpo = norm_adv_by_std_in_grpo False), compute_rloo_outcome_advantage
 *   loss_compute, vanilla   core_algos.py compute_policy_loss_vanilla (dual clip, clip_ratio_c)
 *   loss_compute, gspo      core_algos.py compute_policy_loss_gspo
 *   kl types                core_algos.py kl_penalty / kl_penalty_forward ("k1+", "k3+": the
 *                           value of k1 / k3, the gradient of k2, straight through)
 *   aggregation, loss_agg   core_algos.py agg_loss with the global batch info (batch_num_tokens,
 *                           global_batch_size, loss_scale_factor)
 *   the sum of the three    verl/workers/utils/losses.py ppo_loss: pg - entropy_coeff * entropy
 *                           + kl_loss_coef * kl, each aggregated with loss_agg_mode
 *   metrics (veRL names)    ppo_loss and compute_policy_loss_*: actor/pg_clipfrac, actor/ppo_kl,
 *                           actor/pg_clipfrac_lower, kl_loss; actor/entropy from
 *                           verl/trainer/ppo/ray_trainer.py (agg_loss of the old pass's entropies)
 * tests/fixtures/make_loss_reference.py calls those functions of the verl package and
 * tests/unit/test_loss.c checks this file against its output. */
#ifndef GRPOD_LOSS_H
#define GRPOD_LOSS_H

typedef enum { ADV_GRPO, ADV_DRGRPO, ADV_RLOO, ADV_GIVEN } adv_estimator;
typedef enum {
    AGG_TOKEN_MEAN,
    AGG_TOKEN_SUM,
    AGG_SEQ_MEAN_TOKEN_SUM,
    AGG_SEQ_MEAN_TOKEN_MEAN,
    AGG_SEQ_MEAN_TOKEN_SUM_NORM
} loss_agg_mode;
typedef enum { LOSS_VANILLA, LOSS_GSPO } loss_mode;
/* k1 = "kl", k2 = "mse", k3 = "low_var_kl"; k1+ / k3+: k1 / k3's value with k2's gradient */
typedef enum { KL_K1, KL_ABS, KL_K2, KL_K3, KL_K1_ST, KL_K3_ST } kl_type;

/* veRL's rollout correction (verl/trainer/ppo/rollout_corr_helper.py; engine/train/rollout_corr.h) */
typedef enum { RIS_NONE, RIS_TOKEN, RIS_SEQUENCE } rollout_is_level;
typedef enum {
    RRS_NONE,
    RRS_TOKEN_K1,
    RRS_TOKEN_K2,
    RRS_TOKEN_K3,
    RRS_SEQ_SUM_K1,
    RRS_SEQ_SUM_K2,
    RRS_SEQ_SUM_K3,
    RRS_SEQ_MEAN_K1,
    RRS_SEQ_MEAN_K2,
    RRS_SEQ_MEAN_K3,
    RRS_SEQ_MAX_K2,
    RRS_SEQ_MAX_K3
} rollout_rs_mode;

/* The "algorithm" section; names, ranges, defaults and docs: engine/params.c. */
typedef struct {
    adv_estimator adv;
    int norm_adv_by_std; /* grpo: divide by group std (+1e-6) */
    loss_mode mode;
    float clip_ratio_low, clip_ratio_high, clip_ratio_c;
    loss_agg_mode agg;
    float kl_coef; /* 0: no reference pass */
    kl_type kl;
    float entropy_coeff;
    int ppo_epochs; /* >= 1 */
    int ppo_mini_batch_size; /* groups per optimizer step; 0 = all groups in one step */
    float temperature; /* logprobs of logits / temperature */
    int use_rollout_logprobs; /* old logprobs from the client instead of an old pass */
    int routing_replay; /* 1: the daemon passes the rollout's recorded MoE routes (eng_update_group) */
    int mask_truncated; /* responses cut by max_tokens add no loss */
    int filter_groups; /* drop groups whose rewards are all equal (DAPO) */
    int loss_scale_factor; /* seq-mean-token-sum-norm divisor (Dr. GRPO's constant); 0: the
                                   caller's default (eng_update: the longest response of the update) */
    int rollout_is; /* rollout_is_level */
    float rollout_is_threshold, rollout_is_threshold_lower; /* lower 0: truncated IS; else IcePop */
    int rollout_rs; /* rollout_rs_mode */
    float rollout_rs_threshold, rollout_rs_threshold_lower; /* upper 0: not given; lower 0: none */
} loss_config;

void loss_config_default(loss_config *c); /* the algorithm rows' defaults (params.c) */

/* Parse veRL names ("grpo", "token-mean", "low_var_kl", ...). Return 0 or GE_INVALID. */
int loss_parse_adv(const char *s, adv_estimator *out);
int loss_parse_agg(const char *s, loss_agg_mode *out);
int loss_parse_mode(const char *s, loss_mode *out);
int loss_parse_kl(const char *s, kl_type *out);

/* Advantages for one group of n responses from its rewards (grpo / drgrpo / rloo).
 * adv_out[i] is the advantage of response i, applied to every one of its tokens.
 *   grpo: (r - mean) / (std + 1e-6) with the unbiased std (torch.std), or r - mean when
 *   norm_adv_by_std is 0; drgrpo: r - mean; rloo: r - mean of the other n - 1; given: r itself.
 *   A group of one (veRL): grpo and drgrpo use mean 0 and std 1, rloo leaves r as is. */
void loss_group_advantages(const loss_config *c, const float *rewards, int n, float *adv_out);

/* The rollout correction's sums (rollout_corr.h) over responses and their trained tokens,
 * combined over calls and ranks by adding (the _max fields by max). */
typedef struct {
    double n_rows, n_tok; /* responses (veRL's batch rows, dropped ones too); trained tokens */
    double kl, k3_kl, chi2_token, abs_diff, abs_diff_max; /* per token: rollout - old, k3, r^2, |old - rollout| */
    double log_ppl_diff, training_log_ppl, rollout_log_ppl; /* per row: differences of token means */
    double is_sum, is_max, is_high, is_low, is_oob; /* weights: is_sum, is_oob per token; is_high,
                                   is_low per token (token level) or per row (sequence level) */
    double rs_tok, rs_seq; /* rejected trained tokens; rows with one */
} rcorr_metrics;

/* Metrics of one or more optimizer steps; loss_finish turns the sums into reported values.
 * grpod's own: per-token sums over every step's counted tokens (kl, entropy, clip_frac*,
 * ratio_mean), and loss, pg_loss summed over the steps.
 * veRL's (the per_step group): each step adds its mini-batch's value as veRL computes it for a
 * mini-batch in one micro-batch (token means over the mini-batch's tokens, aggregates with
 * loss_agg_mode), so that their sum over steps / n_steps is veRL's mean over its optimizer steps. */
typedef struct {
    double loss, pg_loss, kl, entropy;
    double clip_frac, clip_frac_low, clip_frac_high, ratio_mean, ratio_max;
    double n_tokens; /* tokens that counted (mask applied) */
    double clip_frac_dual; /* A < 0 tokens whose loss the dual clip (ratio > clip_ratio_c) bounded */
    /* per_step: veRL's actor/pg_clipfrac, actor/pg_clipfrac_lower (the dual-clip fraction; 0 for
     * gspo), actor/ppo_kl (token mean of old - logp, for vanilla clamped to +-20 as its ratio),
     * kl_loss (agg of the kl_type values; 0 without a reference), entropy_loss (agg of the
     * entropies, as in the loss) */
    double pg_clipfrac, pg_clipfrac_lower, ppo_kl, kl_loss, entropy_loss;
    double entropy_agg; /* veRL's actor/entropy: set once per update by its caller (loss_agg
                                   of the old policy's entropies over the whole batch); kept */
    rcorr_metrics rc; /* the rollout correction's (rollout_corr.h), once per update; kept */
} loss_metrics;

/* Sums -> reported values. loss, pg_loss and the per_step group hold the sum over the
 * mini-batches (optimizer steps) that added to m; they are divided by n_steps. The per-token
 * sums (kl, entropy, clip_frac*, ratio_mean) are divided by n_tokens; ratio_max is kept. */
void loss_finish(loss_metrics *m, int n_steps);

/* Global denominators of one mini-batch: call once per micro-batch (or once for all) with the
 * same accumulators, starting from 0. Adds the trained tokens (tmask[t] != 0, or all with tmask
 * NULL) of responses that count (mask[s] != 0 and at least one trained token) to *tok_denom and
 * the number of those responses to *seq_denom; raises *max_len to the longest such response. */
void loss_count(int S, const int *off, const int *len, const int *mask, const unsigned char *tmask, double *tok_denom,
                double *seq_denom, int *max_len);

/* veRL's agg_loss of per-token values x (M) over S responses (off, len, mask, tmask as
 * loss_compute), with the same denominators and c->agg, c->loss_scale_factor as loss_compute. */
double loss_agg(const loss_config *c, int S, const int *off, const int *len, const float *x, const int *mask,
                const unsigned char *tmask, double tok_denom, double seq_denom);

/* 1 when all n rewards are equal (a group DAPO's filter_groups drops: every advantage is 0). */
int loss_group_uniform(const float *rewards, int n);

/* The loss of a set of responses and its gradient.
 *   S responses; response s has len[s] tokens starting at off[s] in the per-token arrays.
 *   logp (M): current logprobs; old (M): old logprobs; ref (M) or NULL when kl_coef == 0;
 *   ent (M) entropies or NULL when entropy_coeff == 0; adv (S) advantages; mask (S) 0 drops a
 *   response (or NULL: all count); tmask (M) 0/1 per token, veRL's response_mask (or NULL: all
 *   ones): a 0 token is context — it stays in the sequence and is attended to, but carries no
 *   loss, KL or entropy, adds to no metric and counts in no denominator; a response whose tokens
 *   are all 0 is dropped as mask[s] = 0 drops it. All ones computes exactly what NULL does.
 *   isw (M) or NULL: rollout-correction importance weights (rollout_corr.h), multiplying each
 *   token's pg term and its gradient (veRL's pg_losses * rollout_is_weights), not kl or entropy.
 *   tok_denom: the token count for token-mean over the whole mini-batch; seq_denom: number of
 *   sequences for seq-mean modes over the whole mini-batch (so micro-batches add up exactly:
 *   the sum of loss_compute over disjoint sets of responses with the same denominators is the
 *   loss of their union, and so are the gradients). loss_count computes both.
 *
 * The loss (veRL's actor with use_kl_loss):  agg(pg) - entropy_coeff agg(ent) + kl_coef agg(kl),
 * each agg with the weight w of every counted token t of response s (L: its trained tokens):
 *   token-mean 1/tok_denom; token-sum 1; seq-mean-token-sum 1/seq_denom;
 *   seq-mean-token-mean 1/((L + 1e-8) seq_denom) (veRL's 1e-8);
 *   seq-mean-token-sum-norm 1/(seq_denom loss_scale_factor) (loss_scale_factor 0: the longest
 *   response of this call, dropped ones included: veRL's padded width; callers that split a
 *   batch set it).
 * vanilla: ratio r = exp(clamp(logp - old, -20, 20)); pg = max(-A r, -A clip(r, 1-lo, 1+hi)),
 *   and for A < 0 min(that, -A clip_ratio_c) (dual clip).
 * gspo: r = exp(min(mean over the response's trained tokens of (logp - old), 10)) for each, with the
 *   straight-through gradient d r_t / d logp_t = r_t (veRL's sg[s_i] pi_t / sg[pi_t]); the same
 *   clipped pg and the same aggregation mode as vanilla (no dual clip).
 * kl (x = logp - ref): k1 x; abs |x|; k2 x^2/2; k3 clamp(e^y - y - 1, -10, 10), y = clamp(-x, -20, 20);
 *   k1+ and k3+ the value of k1 and k3 with the gradient of k2 (x): veRL's straight-through
 *   k2 - sg(k2) + sg(k1 or k3).
 * Gradients are those of the expressions above as autograd computes them (0 where a clamp or a
 * clip is active, max/min ties resolved toward the unclipped branch).
 * Writes dlogp and dent (or dent NULL) = d loss / d logp, d loss / d entropy at every token of
 * the S responses (0 for dropped responses and masked tokens; other entries untouched): the
 * backward passes attend through masked tokens and send them no gradient of their own.
 * Adds to *m (NULL: no metrics): loss, pg_loss (this call's parts of the aggregated values);
 * per counted token: kl (the kl_type value, when ref != NULL), entropy (when ent != NULL), ratio
 * r; clip_frac counts tokens where the clip bound (-A clip(r) > -A r): clip_frac_low those with
 * A < 0 and r < 1 - lo, clip_frac_high those with A > 0 and r > 1 + hi (clip_frac = low + high);
 * clip_frac_dual those with A < 0 and max(r, 1 - lo) > clip_ratio_c (veRL's pg_clipfrac_lower);
 * and the per_step group of loss_metrics (this call's part of the mini-batch's values).
 * Returns this call's part of the loss. */
double loss_compute(const loss_config *c, int S, const int *off, const int *len, const float *logp, const float *old,
                    const float *ref, const float *ent, const float *adv, const int *mask, const unsigned char *tmask,
                    const float *isw, double tok_denom, double seq_denom, float *dlogp, float *dent, loss_metrics *m);
#endif
