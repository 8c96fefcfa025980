/* loss.h — GRPO-family losses on per-token logprobs, names as veRL has them.
 *
 * Everything here is host-side fp32 math on per-token arrays (M predicted tokens of a
 * micro-batch, grouped by response): advantages, PPO-clip / dual-clip / GSPO policy loss,
 * KL penalty, entropy bonus, loss aggregation, and their gradients with respect to the
 * per-token logprob and entropy (which the backend's logprob head back-propagates).
 * It knows nothing of models or backends. */
#ifndef GRPOD_LOSS_H
#define GRPOD_LOSS_H

typedef enum { ADV_GRPO, ADV_DRGRPO, ADV_RLOO, ADV_GIVEN } adv_estimator;
typedef enum { AGG_TOKEN_MEAN, AGG_TOKEN_SUM, AGG_SEQ_MEAN_TOKEN_SUM, AGG_SEQ_MEAN_TOKEN_MEAN,
               AGG_SEQ_MEAN_TOKEN_SUM_NORM } loss_agg_mode;
typedef enum { LOSS_VANILLA, LOSS_GSPO } loss_mode;
typedef enum { KL_K1, KL_ABS, KL_K2, KL_K3 } kl_type;   /* k1 = "kl", k2 = "mse", k3 = "low_var_kl" */

typedef struct {
    adv_estimator adv;
    int norm_adv_by_std;        /* grpo: divide by group std (+1e-6) */
    loss_mode mode;
    float clip_ratio_low, clip_ratio_high, clip_ratio_c;   /* 0.2, 0.28, 3.0 */
    loss_agg_mode agg;
    float kl_coef;              /* 0: no reference pass */
    kl_type kl;
    float entropy_coeff;
    int ppo_epochs;             /* >= 1 */
    int ppo_mini_batch_size;    /* groups per optimizer step; 0 = all groups in one step */
    float temperature;          /* logprobs of logits / temperature */
    int use_rollout_logprobs;   /* old logprobs from the client instead of an old pass */
    int mask_truncated;         /* responses cut by max_tokens add no loss */
    int filter_groups;          /* drop groups whose rewards are all equal (DAPO) */
    int agg_norm_len;           /* seq-mean-token-sum-norm divisor (Dr. GRPO); 0 = max response length */
} loss_config;

void loss_config_default(loss_config *c);

/* Parse veRL names ("grpo", "token-mean", "low_var_kl", ...). Return 0 or GE_INVALID. */
int loss_parse_adv(const char *s, adv_estimator *out);
int loss_parse_agg(const char *s, loss_agg_mode *out);
int loss_parse_mode(const char *s, loss_mode *out);
int loss_parse_kl(const char *s, kl_type *out);

/* Advantages for one group of n responses from its rewards (grpo / drgrpo / rloo).
 * adv_out[i] is the advantage of response i, applied to every one of its tokens. */
void loss_group_advantages(const loss_config *c, const float *rewards, int n, float *adv_out);

/* Metrics summed over the tokens that count; loss_finish turns sums into means. */
typedef struct {
    double loss, pg_loss, kl, entropy;
    double clip_frac, clip_frac_low, clip_frac_high, ratio_mean, ratio_max;
    double n_tokens;            /* tokens that counted (mask applied) */
} loss_metrics;

/* The loss of a set of responses and its gradient.
 *   S responses; response s has len[s] tokens starting at off[s] in the per-token arrays.
 *   logp (M): current logprobs; old (M): old logprobs; ref (M) or NULL when kl_coef == 0;
 *   ent (M) entropies or NULL when entropy_coeff == 0; adv (S) advantages; mask (S) 0 drops a response.
 *   scale: multiplies the loss and gradients (e.g. 1 / number of micro-batches in a mini-batch
 *   is NOT applied here: aggregation normalisers are global, given as denominators below).
 *   tok_denom: the token count for token-mean over the whole mini-batch; seq_denom: number of
 *   sequences for seq-mean modes over the whole mini-batch (so micro-batches add up exactly).
 * Writes dlogp (M) and dent (M, or NULL) = d loss / d logp, d loss / d entropy; adds to *m.
 * Returns the (partial) loss of these responses. */
double loss_compute(const loss_config *c, int S, const int *off, const int *len,
                    const float *logp, const float *old, const float *ref, const float *ent,
                    const float *adv, const int *mask, double tok_denom, double seq_denom,
                    float *dlogp, float *dent, loss_metrics *m);
#endif
