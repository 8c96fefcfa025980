/* engine.h — what the daemon calls: a loaded policy + frozen reference + tokenizer on one
 * backend, and the jobs it runs (rollout, update, logprobs, checkpoint).
 *
 * Threading: every eng_* call except eng_get_info and the tokenizer helpers must come from
 * the one engine thread that opened it (it owns the backend, and on CUDA the context).
 * eng_get_info, eng_tokenize, eng_detokenize and eng_render_chat are safe from any thread.
 * No HTTP, no SQL here. Arrays in results are malloc'd; the caller frees them with the
 * matching *_free function. */
#ifndef GRPOD_ENGINE_H
#define GRPOD_ENGINE_H
#include <stddef.h>
#include <stdint.h>

#include "engine/dist/comm.h"
#include "engine/train/loss.h"
#include "engine/train/rollout_corr.h"

typedef struct eng eng;

typedef struct {
    const char *model_dir; /* HF checkpoint directory */
    const char *backend; /* "auto" | "cpu" | "cuda" */
    const char *resume_dir; /* NULL, or a checkpoint directory written by eng_checkpoint_save */
    int n_threads; /* CPU threads; 0 = all cores */
    /* LoRA (engine/model/lora.h): lora_rank > 0 or lora_init trains adapters over the frozen base,
     * which is also the reference (no second copy). lora_alpha 0 = 2 * rank; lora_targets NULL =
     * all seven ("q,k,v,o,gate,up,down"). lora_init: a PEFT adapter directory to start from (its
     * adapter_config.json gives rank, alpha and targets). A resume_dir holding
     * adapter_model.safetensors resumes the adapters from it. */
    int lora_rank;
    float lora_alpha;
    const char *lora_targets, *lora_init;
    /* "auto" (NULL) | "on" | "off": fp32 master weights and AdamW moments in host memory
     * (engine/train/offload.h). auto: on when, on the device, they and the gradients would leave less
     * than a quarter of its memory for activations and the rollout KV pool; off on cpu and with LoRA. */
    const char *optimizer_offload; /* or a fraction (0 to 1) of them in host memory, the rest
                                    * on the device: one rank (eng_offload_mode_check) */
    /* "fp32" (NULL) | "bf16": AdamW's m and v held as bf16 in host memory (adamw_m16_cpu, as
     * Megatron's precision-aware optimizer with exp_avg(_sq)_dtype bf16): 8 bytes of host state a
     * parameter, not 12. Needs the whole optimizer state in host memory (optimizer_offload on;
     * auto is then on) and full-parameter training; checkpoints still hold fp32 moments. */
    const char *optimizer_moments;
    /* Several ranks (engine/dist/comm.h, engine/train/dp.c): NULL = one rank, exactly as before.
     * With a comm of W ranks (W = 1 too: the same path, bit-equal to none on cpu), each rank's
     * engine thread makes the same eng_update, eng_update_undo, eng_logprobs and
     * eng_checkpoint_save calls with the same full inputs in the same order (SPMD): groups are
     * placed whole on ranks, the optimizer state is sharded 1/W, checkpoints are written by rank 0
     * whole. Rollouts need no comm (the caller gives each rank its share of groups, with
     * eng_sampling.group_index set). Optimizer offload holds the rank's shard in host memory;
     * LoRA is refused with a comm. The caller owns the comm and frees it after eng_close. */
    comm *comm;
    /* 1: expert parallelism (engine/train/ep.c): a mixture-of-experts model's experts
     * split over the comm's W ranks, rank r holding [r E/W, (r+1) E/W) of every MoE layer with
     * their whole training state; the rest sharded as above. Needs a comm, a MoE model with E
     * divisible by W, full-parameter training without optimizer offload (cpu, or cuda with the
     * NCCL comm below); else eng_open refuses with one line. Every MoE layer is then a
     * collective: every rank runs every pass (empty micro-batches where it has fewer). Rollouts
     * decode from a whole act-typed copy of the model each rank holds (engine/rollout/ep_decode.c),
     * refreshed by every update: no comm during a rollout. */
    int expert_parallel;
    int device; /* CUDA device index (0 default); unused on cpu */
    /* NCCL on the cuda backend (instead of comm): the unique id (comm_nccl_unique_id, made once
     * and handed to every rank), this rank and the world size. eng_open opens the communicator
     * on its backend's stream (blocking until all world ranks joined) and owns it. nccl_cancel
     * (may be NULL): a flag that, set non-zero by another thread, ends that wait (GE_COMM), for
     * a rank that failed to open before it joined (daemon/ranks.c). */
    const unsigned char *nccl_id;
    int rank, world;
    const int *nccl_cancel;
    int no_training; /* 1: the engine never updates (a CLI's logprobs): no training
                                 * state, no safety copy, no memory plan for them */
    const char *snapshot; /* where the update's safety copy lives (engine/train/snapshot.h):
                                 * NULL or "auto" (the memory plan decides), "device", "pinned"
                                 * (cuda only), "host" or "none" */
} eng_open_opts;

int eng_open(const eng_open_opts *o, eng **out);
/* 0 when mode is a valid optimizer_offload (NULL, "", auto, on, off or a fraction in [0, 1]),
 * *frac its fraction in host memory (-1: auto); else GE_INVALID naming the field. */
int eng_offload_mode_check(const char *mode, double *frac);
/* 0 when m is a valid optimizer_moments (NULL, "", fp32 or bf16), *m16 1 for bf16; else
 * GE_INVALID naming the field. */
int eng_moments_check(const char *m, int *m16);
/* Create grpod's embedded default model in dir once (a tiny Qwen3 with a byte-level
 * tokenizer, random weights from a fixed seed, written as an ordinary HF directory); does
 * nothing when dir/config.json exists. Safe against a crash midway (written then renamed). */
int eng_ensure_default_model(const char *dir);
void eng_close(eng *e);
/* The engine's comm (opts.comm, or the NCCL one it opened), NULL with one rank. Any thread: for
 * comm_abort when another rank failed, so this one's pending collective returns GE_COMM. */
comm *eng_comm(eng *e);
/* CUDA devices usable by this process (0 in a build without CUDA or with no GPU). Any thread. */
int eng_device_count(void);
/* The backend name eng_open uses for name: "auto" (or NULL) is "cuda" when a GPU is usable, else
 * "cpu"; any other name as given. What several processes or ranks that must make the same kind of
 * communicator agree on. Any thread. */
const char *eng_backend_resolve(const char *name);

/* The memory plan (engine/plan.c), made once at open from the device and the model: where
 * each buffer lives and how many bytes it holds, so that a rollout after an update, an update
 * after a rollout, and any order of the two always fit. Rollouts and updates take turns (the
 * KV pool is released whenever no rollout runs, and an update's activations when it ends), so
 * kv_bytes and acts_bytes are each what is left beside the resident state, not shares of it.
 * On the cpu backend (host memory) only the sizes of the state are given. */
typedef struct {
    long long device_total; /* bytes of the device (0: cpu) */
    long long weights, reference; /* act-typed policy weights (and the decode copy under expert
                                   * parallelism); the frozen reference (0 with LoRA) */
    long long master, gradients, moments; /* fp32 training state on the device */
    long long snapshot; /* the update's safety copy (engine/train/snapshot.h), where it lives */
    long long host_state; /* master + moments in host memory (optimizer offload) */
    long long headroom; /* kernel scratch, cuBLASLt workspace, decode and logprob buffers */
    long long kv_bytes; /* the rollout KV pool's default budget */
    long long acts_bytes; /* an update's activations: what is free once the state is placed */
    long long micro_batch_tokens; /* default max_tokens_per_micro_batch: fits acts_bytes */
    long long micro_batch_tokens_max; /* the most that fits, every layer recomputed (0: no limit) */
    char optimizer[8]; /* "device", "host" (offload) or "split" (host_state: the host's part) */
    char snapshot_at[8]; /* "device", "pinned", "host" or "none" */
    double ms_load, ms_plan; /* eng_open's time: weights read and placed; this plan's allocations */
} eng_plan;

typedef struct {
    char arch[32]; /* "qwen3" */
    char backend[16]; /* "cpu" | "cuda" */
    char model_dir[512];
    char dtype[16]; /* checkpoint dtype */
    int n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab, max_pos;
    long long n_params;
    long long policy_version; /* bumped by each update */
    int eos_ids[8], n_eos;
    int lora_rank; /* 0: full fine-tuning */
    float lora_alpha;
    char lora_targets[96]; /* PEFT module names, comma-separated */
    long long lora_params; /* trainable adapter parameters */
    /* MoE layers, experts, experts per token (0: a dense model): a token's routes are
     * moe_layers·top_k ints in [0, n_experts) */
    int moe_layers, n_experts, top_k;
    eng_plan plan; /* the memory plan */
} eng_info;
void eng_get_info(eng *e, eng_info *out);

/* ---------------------------------------------------------------- text */

int eng_tokenize(eng *e, const char *text, size_t len, int add_special, int **ids, int *n);
int eng_detokenize(eng *e, const int *ids, int n, int skip_special, char **text, size_t *len);
/* The chat template (engine/text/chat.h): messages, an assistant's tool calls (arguments: JSON
 * text), the tools offered (each one's JSON as the template's tojson writes it) and Qwen3's
 * enable_thinking switch. o may be NULL (no tools). */
typedef struct {
    const char *name, *arguments;
} eng_tool_call;
typedef struct {
    const char *role, *content;
    const eng_tool_call *tool_calls; /* NULL, or n_tool_calls of an assistant's calls */
    int n_tool_calls;
} eng_message;
typedef struct {
    const char *const *tools;
    int n_tools;
    int thinking_off; /* enable_thinking false */
} eng_chat_opts;
int eng_render_chat(eng *e, const eng_message *m, int n, int add_generation_prompt, const eng_chat_opts *o, char **text);
/* How the chat template writes tool calls, so how the model writes them (chat.h's CHAT_TOOLS_*). */
enum { ENG_TOOLS_NONE, ENG_TOOLS_HERMES, ENG_TOOLS_LLAMA3 };
int eng_tool_format(eng *e);
/* 0 when schema (JSON text) is one guided decoding enforces; else GE_INVALID, err_msg naming the
 * keyword's path in it (properties.city.anyOf). */
int eng_guided_schema_check(const char *schema);

/* ---------------------------------------------------------------- rollout */

/* A rollout's sampling knobs; names, ranges, defaults and docs: engine/params.c. */
typedef struct {
    float temperature; /* 0 = greedy */
    float top_p;
    int top_k; /* 0 = off */
    float min_p; /* 0 = off */
    int max_tokens, min_tokens;
    int ignore_eos;
    const char *const *stop;
    int n_stop; /* stop strings */
    const int *stop_token_ids;
    int n_stop_token_ids;
    uint64_t seed; /* same seed, same tokens */
    /* constrained decoding (engine/text/json_grammar.h): ENG_GUIDED_JSON / _OBJECT: the response
     * is a JSON value / object, then guided_suffix[0] (n_guided_suffix 0 or 1), then an end id */
    int guided;
    const char *const *guided_suffix;
    int n_guided_suffix;
    const char *guided_schema; /* NULL, or a JSON Schema (text) the value keeps to (json_schema.c's subset) */
    /* 0..ENG_TOP_MAX: each sampled token's k most likely tokens (eng_response.top_ids), from the
     * decode step's hidden state at the row's temperature (1 when greedy), as eng_logprobs_top
     * lists them */
    int top_logprobs;
    /* (n_groups) or NULL: each group's index in the original request, which its responses'
     * stream seeds use (tokens depend only on seed, this index and the response index). NULL:
     * its position in the groups passed. Set when a request is split (across ranks)
     * so each share draws the tokens the whole request draws on one rank. */
    const int *group_index;
} eng_sampling;
enum { ENG_GUIDED_NONE, ENG_GUIDED_JSON, ENG_GUIDED_OBJECT }; /* eng_sampling.guided: the row's choices */
void eng_sampling_default(eng_sampling *s); /* the sampling rows' defaults (params.c) */

typedef struct {
    const int *prompt;
    int P;
    int n;
} eng_rollout_group;

typedef enum { FINISH_STOP = 0, FINISH_LENGTH = 1 } eng_finish;
typedef struct {
    int *tokens;
    int n_tokens; /* generated ids (a matched stop token is included) */
    float *logprobs; /* (n_tokens) log p(token | prefix) of logits / temperature */
    char *text;
    size_t text_len;
    eng_finish finish;
    /* MoE models (else NULL): the experts each MoE layer chose for token i as an input, for
     * routing replay (eng_update_group's routes; engine/rollout/routes.h): (n_tokens, Lm, k),
     * Lm = eng_info.moe_layers, k = eng_info.top_k; the last token (never an input) is -1.
     * Grown as the response decodes; NULL also when host memory ran out (nothing to replay) */
    int *routes;
    /* sampling.top_logprobs k > 0 (else NULL): (n_tokens, k) the k most likely tokens at each
     * position, logprob descending, and their logprobs (as eng_logprobs_top) */
    int *top_ids;
    float *top_lps;
} eng_response;
typedef struct {
    eng_response *resp;
    int n;
    int cached_tokens; /* prompt ids whose K/V came from the scheduler's prefix cache, not prefilled */
    /* MoE models (else NULL): (P, Lm, k) the prompt's routes; the cached_tokens first are -1 (the
     * prefix cache keeps keys and values, not routes: the trainer routes those tokens itself) */
    int *prompt_routes;
} eng_group_result;

/* Optional progress report, called on the engine thread: done of total tokens. */
typedef void (*eng_progress_cb)(void *ud, double fraction);

/* Sample groups[g].n responses for each group. out[g] is filled (caller provides n_groups).
 * A thin wrapper over the scheduler below (open with default options, add, step until done);
 * GE_TOO_LARGE when a group can never fit the default KV pool. */
int eng_rollout(eng *e, const eng_rollout_group *groups, int n_groups, const eng_sampling *s, eng_group_result *out,
                eng_progress_cb cb, void *ud);
void eng_group_result_free(eng_group_result *r);

/* ---------------------------------------------------------------- rollout scheduler
 *
 * Continuous batching (rollout.c): the groups of many rollout jobs decode together, one
 * batch per step. A group is admitted (FIFO over all jobs; a group that does not fit blocks
 * the ones behind it, so big groups never starve) when the KV pool has room for its prompt
 * (P rows, prefilled once, shared by its N responses) and its N responses (max_tokens rows
 * each, reserved up front so a running response never runs out). A step prefills the newly
 * admitted groups (drawing their first tokens), then decodes every live response by one
 * token; a finished response frees its rows at once, a group frees its prompt when its last
 * response ends. Keys are dec_key(stream seed, token index) with the stream seed a function
 * of (request seed, group index in its request, response index): a response's tokens do not
 * depend on what else runs. Rows whose draw parameters differ (temperature, top_k, top_p,
 * min_p, a min_tokens ban) go to separate dec_step calls of the same step, so each call is
 * homogeneous — exactly what the job would see alone.
 * Threading: the engine thread only, like every eng_* call. */
typedef struct eng_sched eng_sched;
typedef struct eng_sched_job eng_sched_job;

typedef struct {
    long long kv_bytes; /* KV pool budget; 0 = default: cuda, half of the free device
                                 * memory at open net of the training state an update will
                                 * allocate; cpu, 1 << 18 rows capped at 8 GiB. A hybrid
                                 * model's recurrent-state rows (max_running + 64 of them)
                                 * take at most half of it first */
    int kv_rows; /* > 0: the pool's rows exactly (overrides kv_bytes) */
    int max_prefill_tokens; /* prompt tokens prefilled per step; 0 = 8192 (one group may exceed it) */
    int max_running; /* responses decoding per step; 0 = 1024 (one group may exceed it) */
} eng_sched_opts;

typedef struct {
    int jobs; /* added and not released */
    int running_groups, running_responses, waiting_groups;
    long long rows_used, rows_cap, row_bytes; /* rows_used: held by admitted groups */
    /* hybrid models: the recurrent-state rows beside the K/V rows (one per prompt and per
     * response of an admitted group), their capacity and bytes each; 0 for other models */
    long long state_rows_used, state_rows_cap, state_row_bytes;
    long long steps, dec_calls; /* scheduler steps taken; dec_step calls they made */
    /* the prefix cache: entries now; since open, groups that hit, prompt ids copied instead of
     * prefilled, prompt ids looked up, entries evicted for room */
    long long prefix_entries, prefix_hits, prefix_hit_tokens, prefix_query_tokens, prefix_evicted;
    long long prefix_rows; /* rows only the cache holds (free for admission: evicted on demand) */
} eng_sched_stats;

/* Sizes the pool (its device memory is allocated when the first group is admitted and given
 * back when the scheduler runs empty and its prefix cache holds nothing; an update empties the
 * cache of the engine's first scheduler, so it has the memory).
 *
 * Prefix cache (automatic, as vLLM's and SGLang's): a finished response's rows stay, keyed by
 * its prompt and response ids, until the pool needs the room (least recently used first) or the
 * weights change (an update, an undo). A group whose prompt begins with ids the cache holds (an
 * agent's next turn: the previous prompt, a response, the tool's output) copies their keys and
 * values and prefills only the rest; eng_group_result.cached_tokens says how many. The tokens and
 * logprobs are those of a full prefill (bit for bit on the cpu). Hybrid models (recurrent state)
 * skip the cache: every group prefills. */
int eng_sched_open(eng *e, const eng_sched_opts *o, eng_sched **out);
void eng_sched_close(eng_sched *s); /* releases every job still in it */
/* Queues a job's groups behind everything queued before. groups (and their prompts), the
 * sampling (with its stop arrays) and out (n_groups, zeroed here) stay the caller's and must
 * stay valid until the job is released. GE_TOO_LARGE, naming the pool size, when a group needs
 * more rows than the whole pool (eng_sched_rows_needed); nothing is queued then. */
int eng_sched_add(eng_sched *s, const eng_rollout_group *groups, int n_groups, const eng_sampling *sp, eng_group_result *out,
                  eng_sched_job **job);
long long eng_sched_rows_needed(const eng_rollout_group *g, const eng_sampling *sp);
/* One step: admit, prefill, decode, retire. 0 when it ran (or had nothing to do); a negative
 * code when a dec_step failed: the jobs it served have failed with that error (job_state),
 * the others go on. */
int eng_sched_step(eng_sched *s);
int eng_sched_busy(const eng_sched *s); /* 1 while some job has a group waiting or running */
/* 1 when a group queued now would start at the next step: nothing waits for rows. */
int eng_sched_can_admit(const eng_sched *s);
void eng_sched_get_stats(const eng_sched *s, eng_sched_stats *st);

/* 0 running, 1 done (out filled: free it with eng_group_result_free), or the negative GE_*
 * code it failed with (out emptied; *msg says why). progress (may be NULL): 0..1 of its
 * tokens; started (may be NULL): 1 once any of its groups was admitted. */
int eng_sched_job_state(const eng_sched_job *j, double *progress, int *started, const char **msg);
/* Drops the job: a running one is cancelled (its streams stop, their rows are freed, out is
 * emptied); a done one keeps out for the caller. j is invalid afterwards. */
void eng_sched_job_release(eng_sched *s, eng_sched_job *j);

/* ---------------------------------------------------------------- update */

typedef struct {
    const int *prompt;
    int P;
    int n; /* responses */
    const int *const *resp;
    const int *R;
    const float *reward; /* (n) or NULL when advantages are given */
    const float *advantage; /* (n) or NULL: computed by the adv estimator from rewards */
    const float *const *old_logprobs; /* n arrays (R[i]) or NULL: recomputed by the old pass */
    const int *truncated; /* (n) 1 = cut by max_tokens, or NULL */
    /* n arrays (R[i]) of 0/1, or NULL: every token trained (so is every token of a response
     * whose array is NULL). A 0 token is context (a tool's output): attended to, no loss
     * (loss.h loss_compute's tmask) */
    const unsigned char *const *loss_mask;
    /* MoE routing replay (kernels/moe.h), or NULL: each token's experts as a rollout chose them
     * (eng_response.routes, eng_group_result.prompt_routes), replayed by every pass instead of
     * the router's top-k; (P, Lm, k) and n arrays (R[i], Lm, k); a token whose first is -1
     * routes freely */
    const int *prompt_routes;
    const int *const *resp_routes;
} eng_update_group;

/* Data-parallel placement (engine/train/dp.c): rank[i] in 0..W-1 for each of n groups of
 * weight[i] (packed tokens P + sum R for an update; KV rows for a rollout). Largest first to the
 * least loaded rank, ties to the lower index and rank: a pure function, the same on every rank.
 * eng_update with W > 1 places the groups of each mini-batch with it. Any thread. */
void eng_place_groups(const long long *weight, int n, int W, int *rank);

typedef enum { SCHED_CONSTANT = 0, SCHED_COSINE = 1 } eng_lr_schedule;
/* AdamW and its schedule; names, ranges, defaults and docs: engine/params.c. */
typedef struct {
    float lr, weight_decay, beta1, beta2, eps, grad_clip;
    int warmup_steps; /* linear warm-up over optimizer steps */
    eng_lr_schedule schedule;
    int total_steps; /* cosine decay horizon */
    float min_lr_ratio;
} eng_optim;
void eng_optim_default(eng_optim *o); /* the optimizer rows' defaults (params.c) */

typedef struct {
    long long policy_version_before, policy_version_after;
    double loss, pg_loss, kl, entropy, clip_frac, clip_frac_low, clip_frac_high;
    double ratio_mean, ratio_max, grad_norm, lr;
    /* veRL's metrics (loss.h loss_metrics): actor/pg_clipfrac, actor/pg_clipfrac_lower,
     * actor/ppo_kl, actor/kl_loss (means over the optimizer steps), actor/entropy */
    double pg_clipfrac, pg_clipfrac_lower, ppo_kl, kl_loss, verl_entropy;
    int rollout_corr; /* 1: a rollout correction ran; rc holds its metrics (veRL's rollout_corr/...) */
    rcorr_report rc;
    int loss_scale_factor; /* the seq-mean-token-sum-norm divisor the update used */
    long long tokens_packed, tokens_standard; /* per forward pass over the batch */
    int groups_filtered, optimizer_steps, micro_batches;
    double ms_old, ms_ref, ms_policy, ms_optimizer, ms_total;
    double ms_snapshot_wait; /* of ms_optimizer: waiting for the safety copy (train/snapshot.h) */
    double ms_prepare; /* of ms_total, before the passes: the plan check, activations, the copy's start */
} eng_update_result;

/* Atomic: 0 with the update applied, or an error with weights, optimizer state, opt_step and
 * policy_version exactly as before — also when it fails after some of its optimizer steps.
 * GE_NON_FINITE when the loss/gradient (caught before the step) or the weights / second
 * moments after a step are not finite. Keeps a host copy of the state it changed (3 x 4 bytes
 * per parameter) until the next update. */
int eng_update(eng *e, const eng_update_group *g, int n_groups, const loss_config *algo, const eng_optim *opt,
               long long max_tokens_per_micro_batch, eng_update_result *out, eng_progress_cb cb, void *ud);
/* Takes back the last successful eng_update (its weights, optimizer state, opt_step and
 * policy_version), once; 0 and nothing done when there is nothing to take back. */
int eng_update_undo(eng *e);

/* ---------------------------------------------------------------- scoring, checkpoints */

/* Per-token logprobs of given responses under the policy (use_reference = 0) or the frozen
 * reference, at a temperature; packed by prompt. out[g][i] is a malloc'd (R[i]) array;
 * free with eng_logprobs_free. */
int eng_logprobs(eng *e, const eng_update_group *g, int n_groups, int use_reference, float temperature,
                 long long max_tokens_per_micro_batch, float ***out);
void eng_logprobs_free(float **out, const eng_update_group *g, int n_groups);
/* eng_logprobs with, for k in 1..ENG_TOP_MAX, the k most likely tokens at each position under the
 * same distribution: ids[g][i] and lps[g][i] (R[i] * k, malloc'd like out; free both with
 * eng_logprobs_top_free), by logprob descending, lowest id first on ties. A listed token's
 * logprob is the one eng_logprobs reports for it as the response token (bit-equal on one
 * backend). Positions of a group too large for one micro-batch list id -1 (not computed). */
#define ENG_TOP_MAX 20
int eng_logprobs_top(eng *e, const eng_update_group *g, int n_groups, int use_reference, float temperature,
                     long long max_tokens_per_micro_batch, int k, float ***out, int ***ids, float ***lps);
void eng_logprobs_top_free(int **ids, float **lps, const eng_update_group *g, int n_groups);

/* Write an HF-compatible directory (config.json, model.safetensors, tokenizer files) plus
 * optimizer state (optimizer.safetensors, grpod_state.json) and manifest.json (each file's
 * size and hash) to dir.tmp, fsync, then rename to dir (checkpoint.c). On failure (disk full)
 * dir.tmp is removed and nothing is left half-written. Idempotent: when dir exists already
 * and eng_checkpoint_matches it, it is kept (0, nothing written); when it does not match, it
 * is replaced (written whole to dir.tmp first, then swapped in). */
int eng_checkpoint_save(eng *e, const char *dir);
/* With LoRA the checkpoint is the adapter in PEFT's layout (adapter_model.safetensors,
 * adapter_config.json) plus optimizer.safetensors and grpod_state.json. merged = 1 writes an
 * HF directory (config.json, model.safetensors with base + s B A, tokenizer files) instead;
 * without LoRA both write the full checkpoint. */
int eng_checkpoint_save_ex(eng *e, const char *dir, int merged);
/* A save in two halves, so that the file I/O can run beside rollouts: eng_checkpoint_capture
 * takes what the save writes at this moment (collective with a comm, like the save: the state is
 * gathered to rank 0, whose *out is the capture; the other ranks get NULL), and
 * eng_checkpoint_write writes it as eng_checkpoint_save_ex would (dir.tmp, fsync, rename; kept
 * when dir already holds it). The write makes no backend call and may run on any thread, but
 * the capture may read the live host training state (optimizer offload, LoRA): no update,
 * undo or resume may run on the engine until the write returned. */
typedef struct eng_ckpt eng_ckpt;
int eng_checkpoint_capture(eng *e, int merged, eng_ckpt **out);
int eng_checkpoint_write(const eng_ckpt *c, const char *dir);
void eng_checkpoint_capture_free(eng_ckpt *c);
/* 0 when dir's files match its manifest; GE_FORMAT naming the file otherwise (no manifest,
 * a missing, short or changed file). Reads every byte. Any thread. */
int eng_checkpoint_verify(const char *dir);
/* 0 when dir is what eng_checkpoint_save_ex(e, dir, merged) would write now: its files match
 * its manifest and its grpod_state.json holds e's policy_version and optimizer step (a merged
 * export, which has no state: its files alone). GE_FORMAT (damaged) or GE_CONFLICT (another
 * state) otherwise. Reads every byte. Engine thread. */
int eng_checkpoint_matches(eng *e, const char *dir, int merged);
/* rm -r dir (leftover temporaries); 0 when it is gone or never was. Any thread. */
int eng_remove_tree(const char *dir);
#endif
