/* params.c — the rows of params.h: sampling, algorithm (the loss), optimizer, and the job-level
 * members of updates, logprobs and rollouts. A row's default is the only default the knob has;
 * the engine structs, the validator and the stored job's decoder take theirs from here. */
#include "engine/params.h"

#include <stdint.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/train/loss.h"

#define S_(f) (int)offsetof(eng_sampling, f)
#define L_(f) (int)offsetof(loss_config, f)
#define O_(f) (int)offsetof(eng_optim, f)
#define U_(f) (int)offsetof(eng_update_job, f)
#define LP_(f) (int)offsetof(eng_logprobs_job, f)

/*  name, type, lo, hi, hi_from, dflt, dflt2, choices, flags, off, off2, doc */
static const eng_param sampling_rows[] = {
    {"temperature", PT_NUM, 0, 100, PB_ROW, 1.0, 0, NULL, 0, S_(temperature), -1, "softmax temperature; 0 = greedy"},
    {"top_p", PT_NUM, 0, 1, PB_ROW, 1.0, 0, NULL, PF_LO_OPEN, S_(top_p), -1,
     "nucleus: keep the smallest set of tokens whose probability reaches top_p"},
    {"top_k", PT_INT, -1, 0, PB_VOCAB, 0, 0, NULL, PF_NEG_OFF, S_(top_k), -1, "keep the k most likely tokens; 0 or -1 = off"},
    {"min_p", PT_NUM, 0, 1, PB_ROW, 0.0, 0, NULL, 0, S_(min_p), -1,
     "drop tokens below min_p x the top token's probability; 0 = off"},
    {"max_tokens", PT_INT, 1, 0, PB_MAX_TOKENS, 16, 0, NULL, 0, S_(max_tokens), -1,
     "most tokens generated per response (up to --max-tokens)"},
    {"min_tokens", PT_INT, 0, 0, PB_PREV, 0, 0, NULL, 0, S_(min_tokens), -1,
     "EOS and stop tokens are banned before this many tokens (up to max_tokens)"},
    {"stop", PT_STRS, 0, 16, PB_ROW, 0, 0, NULL, 0, S_(stop), S_(n_stop),
     "a string or up to 16 strings that end a response (the match is kept in text)"},
    {"stop_token_ids", PT_IDS, 0, 64, PB_ROW, 0, 0, NULL, 0, S_(stop_token_ids), S_(n_stop_token_ids),
     "token ids that end a response besides the model's EOS (up to 64)"},
    {"seed", PT_SEED, 0, 9223372036854775807.0, PB_ROW, 0, 0, NULL, 0, S_(seed), -1,
     "same seed, same tokens (per backend); drawn at submit and stored when absent"},
    {"ignore_eos", PT_BOOL, 0, 1, PB_ROW, 0, 0, NULL, 0, S_(ignore_eos), -1, "keep sampling past EOS until max_tokens"},
    {"guided", PT_ENUM, 0, 0, PB_ROW, 0, 0, "none|json|json_object", 0, S_(guided), -1,
     "constrained decoding: every response is a JSON value (json) or object (json_object), then guided_suffix, then EOS, "
     "closed in time to fit max_tokens (min_tokens is then not applied)"},
    {"guided_suffix", PT_STRS, 0, 1, PB_ROW, 0, 0, NULL, 0, S_(guided_suffix), S_(n_guided_suffix),
     "with guided: the text every response writes right after its JSON value"},
    {"guided_schema", PT_STR, 0, 0, PB_ROW, 0, 0, NULL, 0, S_(guided_schema), -1,
     "with guided: a JSON Schema (as text) the value keeps to: type, properties (in their order), required, enum, const, "
     "items, additionalProperties, anyOf of types; other validation keywords are refused"},
    {"top_logprobs", PT_INT, 0, 20, PB_ROW, 0, 0, NULL, 0, S_(top_logprobs), -1,
     "each sampled token's k most likely tokens (a response's top_ids and top_logprobs) at the sampling temperature"},
    {"logprobs", PT_COMPAT, 0, 1, PB_ROW, 0, 0, NULL, 0, -1, -1,
     "accepted for vLLM compatibility; the sampled token's logprob is always returned"},
};

static const eng_param loss_rows[] = {
    {"adv_estimator", PT_ENUM, 0, 0, PB_ROW, ADV_GRPO, 0, "grpo|drgrpo|rloo|given", 0, L_(adv), -1,
     "advantages from rewards: group-normalized (grpo), mean-centred (drgrpo), leave-one-out "
     "(rloo), or given by the client"},
    {"norm_adv_by_std", PT_BOOL, 0, 1, PB_ROW, 1, 0, NULL, 0, L_(norm_adv_by_std), -1,
     "grpo: divide by the group's reward std (+1e-6)"},
    {"loss_mode", PT_ENUM, 0, 0, PB_ROW, LOSS_VANILLA, 0, "vanilla|gspo", 0, L_(mode), -1,
     "token-level PPO clip (vanilla) or sequence-level ratio (gspo)"},
    {"clip_ratio_low", PT_NUM, 0, 1, PB_ROW, 0.2, 0, NULL, 0, L_(clip_ratio_low), -1, "ratio clip below 1 - clip_ratio_low"},
    {"clip_ratio_high", PT_NUM, 0, 10, PB_ROW, 0.28, 0, NULL, 0, L_(clip_ratio_high), -1,
     "ratio clip above 1 + clip_ratio_high (DAPO clip-higher; veRL's default is 0.2)"},
    {"clip_ratio_c", PT_NUM, 1, 1000, PB_ROW, 3.0, 0, NULL, 0, L_(clip_ratio_c), -1, "dual-clip bound for negative advantages"},
    {"loss_agg_mode", PT_ENUM, 0, 0, PB_ROW, AGG_TOKEN_MEAN, 0,
     "token-mean|token-sum|seq-mean-token-sum|seq-mean-token-mean|seq-mean-token-sum-norm", 0, L_(agg), -1,
     "how per-token losses make the batch loss (veRL's names)"},
    {"loss_scale_factor", PT_INT, 0, 1 << 24, PB_ROW, 0, 0, NULL, 0, L_(loss_scale_factor), -1,
     "seq-mean-token-sum-norm's constant divisor (veRL's name); 0 or null = the rollout job's "
     "max_tokens when the update names rollout_job_id, else the longest response of the update"},
    {"kl_coef", PT_NUM, 0, 1000, PB_ROW, 0.001, 0, NULL, 0, L_(kl_coef), -1,
     "weight of the KL penalty to the reference model; 0 = no reference pass"},
    {"kl_type", PT_ENUM, 0, 0, PB_ROW, KL_K3, 0, "kl,k1|abs|mse,k2|low_var_kl,k3|k1+,kl+|k3+,low_var_kl+", 0, L_(kl), -1,
     "KL estimator: k1 (kl), abs, k2 (mse), k3 (low_var_kl); k1+ and k3+ take k2's gradient "
     "(veRL's straight-through)"},
    {"entropy_coeff", PT_NUM, -10, 10, PB_ROW, 0.0, 0, NULL, 0, L_(entropy_coeff), -1, "weight of the entropy bonus"},
    {"ppo_epochs", PT_INT, 1, 64, PB_ROW, 1, 0, NULL, 0, L_(ppo_epochs), -1, "passes over the batch"},
    {"ppo_mini_batch_size", PT_INT, 0, 1 << 20, PB_ROW, 0, 0, NULL, 0, L_(ppo_mini_batch_size), -1,
     "groups per optimizer step; 0 = all groups in one step"},
    {"temperature", PT_NUM, 1e-3, 100, PB_ROW, 1.0, 0, NULL, 0, L_(temperature), -1,
     "logprobs of logits / temperature (match the rollout's)"},
    {"old_logprobs", PT_ENUM, 0, 0, PB_ROW, 0, 0, "recompute|rollout", 0, L_(use_rollout_logprobs), -1,
     "old logprobs from an old-policy pass (recompute) or from the responses (rollout)"},
    {"routing_replay", PT_ENUM, 0, 0, PB_ROW, 0, 0, "off|rollout", 0, L_(routing_replay), -1,
     "MoE models: rollout = every pass routes each token to the experts the rollout named by "
     "rollout_job_id chose (R3, veRL's router_replay.mode R3); off = the router's own top-k (veRL's "
     "disabled, its default)"},
    {"mask_truncated_completions", PT_BOOL, 0, 1, PB_ROW, 0, 0, NULL, 0, L_(mask_truncated), -1,
     "responses cut by max_tokens add no loss"},
    {"filter_groups", PT_BOOL, 0, 1, PB_ROW, 0, 0, NULL, 0, L_(filter_groups), -1,
     "drop groups whose rewards are all equal (DAPO dynamic sampling)"},
    {"rollout_is", PT_ENUM, 0, 0, PB_ROW, RIS_NONE, 0, "none|token|sequence", 0, L_(rollout_is), -1,
     "veRL's rollout correction: importance weights old / rollout policy (responses' logprobs) on "
     "the policy loss, per token or per sequence; none = off"},
    {"rollout_is_threshold", PT_BOUNDS, 0, 1e9, PB_ROW, 2.0, 0, NULL, 0, L_(rollout_is_threshold), L_(rollout_is_threshold_lower),
     "a number: truncated IS (weights clamped to it); \"lower_upper\": IcePop (weights outside "
     "[lower, upper] zeroed)"},
    {"rollout_rs", PT_ENUM, 0, 0, PB_ROW, RRS_NONE, 0,
     "none|token_k1|token_k2|token_k3|seq_sum_k1|seq_sum_k2|seq_sum_k3|seq_mean_k1|seq_mean_k2|seq_mean_k3|"
     "seq_max_k2|seq_max_k3",
     0, L_(rollout_rs), -1,
     "veRL's rejection sampling: tokens (token_*) or whole responses (seq_*) whose divergence "
     "from the rollout policy passes rollout_rs_threshold carry no loss; none = off"},
    {"rollout_rs_threshold", PT_BOUNDS, 0, 1e9, PB_ROW, 0, 0, NULL, 0, L_(rollout_rs_threshold), L_(rollout_rs_threshold_lower),
     "k2/k3 options: the upper bound; k1 options: \"lower_upper\" ratio bounds (a number u: 1/u_u)"},
};

static const eng_param optim_rows[] = {
    {"lr", PT_NUM, 0, 1, PB_ROW, 1e-6, 0, NULL, 0, O_(lr), -1, "AdamW peak learning rate"},
    {"weight_decay", PT_NUM, 0, 10, PB_ROW, 0.01, 0, NULL, 0, O_(weight_decay), -1, "AdamW decoupled weight decay"},
    {"betas", PT_PAIR, 0, 1, PB_ROW, 0.9, 0.999, NULL, 0, O_(beta1), O_(beta2), "AdamW beta1, beta2"},
    {"eps", PT_NUM, 1e-20, 1, PB_ROW, 1e-8, 0, NULL, 0, O_(eps), -1, "AdamW epsilon"},
    {"grad_clip", PT_NUM, 0, 1e9, PB_ROW, 1.0, 0, NULL, 0, O_(grad_clip), -1, "clip the global gradient norm to this; 0 = off"},
    {"warmup_steps", PT_INT, 0, 1 << 30, PB_ROW, 0, 0, NULL, 0, O_(warmup_steps), -1,
     "linear warm-up over this many optimizer steps"},
    {"lr_schedule", PT_ENUM, 0, 0, PB_ROW, SCHED_CONSTANT, 0, "constant|cosine", 0, O_(schedule), -1,
     "after warm-up: constant, or cosine decay to min_lr_ratio x lr at total_steps"},
    {"total_steps", PT_INT, 0, 1 << 30, PB_ROW, 0, 0, NULL, 0, O_(total_steps), -1, "cosine decay horizon"},
    {"min_lr_ratio", PT_NUM, 0, 1, PB_ROW, 0.0, 0, NULL, 0, O_(min_lr_ratio), -1, "cosine floor as a fraction of lr"},
};

static const eng_param update_job_rows[] = {
    {"rollout_job_id", PT_STR, 0, 0, PB_ROW, 0, 0, NULL, 0, U_(rollout_job_id), -1,
     "train on this finished rollout's responses (instead of groups)"},
    {"max_tokens_per_micro_batch", PT_INT, 1, ENG_MB_TOKENS_MAX, PB_PLAN_MB, ENG_MB_TOKENS_DEFAULT, 0, NULL, 0,
     U_(max_tokens_per_micro_batch), -1, "default: the memory plan's (GET /v1/model memory_plan)"},
    {"expected_policy_version", PT_INT, 0, 4611686018427387904.0, PB_ROW, -1, 0, NULL, PF_I64 | PF_OMIT_DFLT,
     U_(expected_policy_version), -1, "refuse the update (409) unless the policy is at this version"},
};

static const eng_param logprobs_job_rows[] = {
    {"model", PT_ENUM, 0, 0, PB_ROW, ENG_LP_POLICY, 0, "policy|reference", 0, LP_(model), -1,
     "score under the policy or the frozen reference"},
    {"temperature", PT_NUM, 1e-3, 100, PB_ROW, 1.0, 0, NULL, 0, LP_(temperature), -1, "logprobs of logits / temperature"},
    {"max_tokens_per_micro_batch", PT_INT, 1, ENG_MB_TOKENS_MAX, PB_PLAN_MB, ENG_MB_TOKENS_DEFAULT, 0, NULL, 0,
     LP_(max_tokens_per_micro_batch), -1, "default: the memory plan's (GET /v1/model memory_plan)"},
    {"top_logprobs", PT_INT, 0, ENG_TOP_MAX, PB_ROW, 0, 0, NULL, PF_OMIT_DFLT, LP_(top_logprobs), -1,
     "each position's k most likely tokens too"},
};

static const eng_param rollout_group_rows[] = {
    {"n", PT_INT, 1, 0, PB_MAX_N, 1, 0, NULL, 0, (int)offsetof(eng_group_job, n), -1, "responses sampled for the prompt"},
};

static const eng_param overlong_rows[] = {
    {"len", PT_NUM, 0, 1e7, PB_ROW, 0, 0, NULL, 0, (int)offsetof(eng_overlong, len), -1,
     "DAPO overlong buffer: responses longer than max_tokens - len lose reward linearly; 0 = off"},
    {"penalty_factor", PT_NUM, 0, 1e6, PB_ROW, 1.0, 0, NULL, 0, (int)offsetof(eng_overlong, penalty_factor), -1,
     "the penalty at max_tokens"},
};

static const eng_param checkpoint_job_rows[] = {
    {"merged", PT_BOOL, 0, 1, PB_ROW, 0, 0, NULL, PF_OMIT_DFLT, (int)offsetof(eng_checkpoint_job, merged), -1,
     "LoRA: also write the adapters merged into the base (an HF directory for export)"},
};

#define N_(a) (int)(sizeof a / sizeof a[0])
const eng_params eng_sampling_params = {"sampling", sampling_rows, N_(sampling_rows), sizeof(eng_sampling)};
const eng_params eng_loss_params = {"algorithm", loss_rows, N_(loss_rows), sizeof(loss_config)};
const eng_params eng_optim_params = {"optimizer", optim_rows, N_(optim_rows), sizeof(eng_optim)};
const eng_params eng_update_job_params = {"", update_job_rows, N_(update_job_rows), sizeof(eng_update_job)};
const eng_params eng_logprobs_job_params = {"", logprobs_job_rows, N_(logprobs_job_rows), sizeof(eng_logprobs_job)};
const eng_params eng_group_job_params = {"groups[]", rollout_group_rows, N_(rollout_group_rows), sizeof(eng_group_job)};
const eng_params eng_checkpoint_job_params = {"", checkpoint_job_rows, N_(checkpoint_job_rows), sizeof(eng_checkpoint_job)};
const eng_params eng_overlong_params = {"overlong_buffer", overlong_rows, N_(overlong_rows), sizeof(eng_overlong)};

void eng_params_default(const eng_params *t, void *dst) {
    char *d = dst;
    memset(d, 0, t->size);
    for (int i = 0; i < t->n; i++) {
        const eng_param *p = &t->rows[i];
        switch (p->type) {
        case PT_NUM: *(float *)(d + p->off) = (float)p->dflt; break;
        case PT_INT:
            if (p->flags & PF_I64) *(long long *)(d + p->off) = (long long)p->dflt;
            else *(int *)(d + p->off) = (int)p->dflt;
            break;
        case PT_BOOL:
        case PT_ENUM: *(int *)(d + p->off) = (int)p->dflt; break;
        case PT_PAIR:
        case PT_BOUNDS:
            *(float *)(d + p->off) = (float)p->dflt;
            *(float *)(d + p->off2) = (float)p->dflt2;
            break;
        default: break; /* PT_SEED, PT_STRS, PT_IDS, PT_STR: zero; PT_COMPAT: not stored */
        }
    }
}

void eng_sampling_default(eng_sampling *s) { eng_params_default(&eng_sampling_params, s); }
void loss_config_default(loss_config *c) { eng_params_default(&eng_loss_params, c); }
void eng_optim_default(eng_optim *o) { eng_params_default(&eng_optim_params, o); }

int eng_param_choice(const eng_param *p, const char *s) {
    if (p->type != PT_ENUM || !s) return -1;
    size_t n = strlen(s);
    int idx = 0;
    for (const char *c = p->choices; *c;) {
        size_t len = strcspn(c, ",|");
        if (len == n && !strncmp(c, s, n)) return idx;
        c += len;
        if (*c == '|') idx++;
        if (*c) c++;
    }
    return -1;
}

const char *eng_param_choice_name(const eng_param *p, int i, char *buf, size_t n) {
    if (p->type != PT_ENUM || i < 0) return NULL;
    const char *c = p->choices;
    for (; i > 0 && c; i--)
        if ((c = strchr(c, '|'))) c++;
    if (!c || !n) return NULL;
    size_t len = strcspn(c, ",|");
    if (len >= n) len = n - 1;
    memcpy(buf, c, len);
    buf[len] = 0;
    return buf;
}

const eng_param *eng_param_find(const eng_params *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->rows[i].name, name)) return &t->rows[i];
    return NULL;
}
