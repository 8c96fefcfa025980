/* params.h — one description per request section: every knob of a rollout's sampling
 * (eng_sampling), an update's loss (loss_config, the "algorithm" section) and its optimizer
 * (eng_optim), and the job-level members of each request kind (eng_update_job,
 * eng_logprobs_job, eng_group_job, eng_overlong), one row each: JSON name, type, range,
 * default, doc line, place in the struct.
 *
 * The rows drive everything a knob touches: the engine's defaults (eng_params_default, behind
 * eng_sampling_default, loss_config_default and eng_optim_default), and on the API side
 * (api/params.h) the validation of a request, the canonical JSON stored with the job, the
 * OpenAPI schema, and the conversion of a stored job back to the engine struct. Adding a
 * sampling field is: a row here, the field in eng_sampling, the kernels that use it, a test.
 *
 * Pure data and plain C: no JSON, no HTTP (GPU programs link it with the engine alone). */
#ifndef GRPOD_PARAMS_H
#define GRPOD_PARAMS_H
#include <stddef.h>

typedef enum {
    PT_NUM, /* JSON number → float */
    PT_INT, /* JSON integer → int */
    PT_BOOL, /* true | false → int */
    PT_ENUM, /* one of choices → int: the choice's index, which is the C enum's value */
    PT_SEED, /* JSON integer → uint64_t; absent: drawn when the request is validated */
    PT_PAIR, /* [a, b], each in [lo, hi) → float at off and at off2 */
    PT_STRS, /* a non-empty string, or an array of lo..hi strings of 1..ENG_PARAM_STR_MAX
                       bytes → const char *const * at off, int count at off2 */
    PT_IDS, /* an array of lo..hi token ids < vocab → const int * at off, int count at off2 */
    PT_COMPAT, /* accepted (false | true | 0 | 1) for compatibility, never stored */
    PT_STR, /* a string → const char * at off (pointing into the JSON); absent: NULL, not stored */
    PT_BOUNDS, /* veRL's threshold spec: a number in (lo, hi] (the upper bound; float at off, the
                       lower bound at off2 stays 0: none), or a string "lower_upper" of two such
                       numbers, lower <= upper (floats at off2 and off). Absent: dflt at off */
} eng_param_type;

/* Where the upper bound comes from when it is not the row's hi. */
typedef enum {
    PB_ROW, /* hi */
    PB_VOCAB, /* the model's vocabulary size */
    PB_MAX_TOKENS, /* the server's sampling.max_tokens limit (--max-tokens); the default is
                       min(dflt, that limit) */
    PB_PREV, /* the value of the row before (min_tokens <= max_tokens) */
    PB_MAX_N, /* the server's responses-per-group limit (--max-n) */
    PB_PLAN_MB, /* a micro-batch's tokens: hi is the row's; the default is the memory plan's (dflt
                       without one) and above what the plan's activations hold the request is a 413 */
} eng_param_bound;

enum {
    PF_LO_OPEN = 1, /* the value must be > lo (top_p) */
    PF_NEG_OFF = 2, /* lo (-1) means off and is stored as 0 (vLLM's top_k = -1) */
    PF_I64 = 4, /* PT_INT: long long at off, not int */
    PF_OMIT_DFLT = 8, /* PT_INT, PT_BOOL: left out of the canonical JSON when it equals dflt */
};

#define ENG_PARAM_STR_MAX 256

typedef struct {
    const char *name; /* the JSON member */
    eng_param_type type;
    double lo, hi; /* inclusive range; element count for PT_STRS / PT_IDS */
    eng_param_bound hi_from;
    double dflt, dflt2; /* PT_ENUM: the default choice's index; PT_PAIR: both */
    const char *choices; /* PT_ENUM: "a|b|c" in enum order; aliases after a comma ("kl,k1|…") */
    int flags; /* PF_* */
    int off, off2; /* offsetof in the engine struct (-1: none) */
    const char *doc; /* one line for docs/api.md and the OpenAPI description */
} eng_param;

typedef struct {
    const char *name; /* the request section: "sampling", "algorithm", "optimizer" */
    const eng_param *rows;
    int n;
    size_t size; /* sizeof the engine struct */
} eng_params;

extern const eng_params eng_sampling_params; /* eng_sampling (engine.h) */
extern const eng_params eng_loss_params; /* loss_config (loss.h) */
extern const eng_params eng_optim_params; /* eng_optim (engine.h) */

/* The default max_tokens_per_micro_batch where the memory plan allows it (and without a plan),
 * and its largest: 16 Mi tokens, far above what activations fit, and an int. */
#define ENG_MB_TOKENS_DEFAULT 32768
#define ENG_MB_TOKENS_MAX (1 << 24)

/* An update job's own members (POST /v1/updates' top level besides groups, algorithm, optimizer). */
typedef struct {
    const char *rollout_job_id; /* NULL: the update's own groups */
    int max_tokens_per_micro_batch;
    long long expected_policy_version; /* -1: none */
} eng_update_job;
/* A logprobs job's own members (POST /v1/logprobs' top level besides groups). */
typedef struct {
    int model; /* ENG_LP_POLICY | ENG_LP_REFERENCE */
    float temperature;
    int max_tokens_per_micro_batch;
    int top_logprobs; /* 0: none */
} eng_logprobs_job;
enum { ENG_LP_POLICY, ENG_LP_REFERENCE };
/* A rollout group's own members besides its prompt, reward and metadata. */
typedef struct {
    int n; /* responses */
} eng_group_job;
/* A rollout's overlong_buffer section (DAPO's overlong shaping; len 0 = off). */
typedef struct {
    float len, penalty_factor;
} eng_overlong;

/* A checkpoint job's members (POST /v1/checkpoints' optional body). */
typedef struct {
    int merged; /* LoRA: also an HF directory with the adapters merged into the base */
} eng_checkpoint_job;

extern const eng_params eng_update_job_params; /* eng_update_job; section "" (top level) */
extern const eng_params eng_logprobs_job_params; /* eng_logprobs_job; section "" */
extern const eng_params eng_group_job_params; /* eng_group_job; section "groups[i]" */
extern const eng_params eng_overlong_params; /* eng_overlong; section "overlong_buffer" */
extern const eng_params eng_checkpoint_job_params; /* eng_checkpoint_job; section "" */

/* Zeroes the struct, then sets every row's default (PT_SEED, PT_STRS, PT_IDS, PT_STR: 0 / NULL). */
void eng_params_default(const eng_params *t, void *dst);
/* PT_ENUM: the index of name s among the row's choices (aliases included), or -1. */
int eng_param_choice(const eng_param *p, const char *s);
/* PT_ENUM: the primary name of choice i ("low_var_kl"), or NULL. */
const char *eng_param_choice_name(const eng_param *p, int i, char *buf, size_t n);
/* The row named name, or NULL. */
const eng_param *eng_param_find(const eng_params *t, const char *name);
#endif
