/* engine_internal.h — the engine object shared by engine.c, rollout.c and update.c.
 * Not for use outside engine/. */
#ifndef GRPOD_ENGINE_INTERNAL_H
#define GRPOD_ENGINE_INTERNAL_H
#include <stdatomic.h>

#include "engine/engine.h"
#include "engine/model/model.h"
#include "engine/train/offload.h"
#include "engine/model/split.h"
#include "engine/text/json_grammar.h"
#include "engine/text/tokenizer.h"
#include "engine/train/snapshot.h"

struct eng {
    eng_backend *be;
    comm *comm; /* NULL: one rank (eng_open_opts.comm, not owned; or NCCL, owned) */
    int own_comm;
    int rank, W; /* this rank and the world size (0 and 1 without a comm) */
    int host_peers; /* the other ranks on this rank's host (plan_host_peers; 0 without a comm) */
    /* dp: the sharded path (dp.c), taken whenever a comm was given, also of one rank (so the
     * collectives run, and a one-rank comm is checked bit-equal to none). This rank's shard of the trainable vector, [sh_off, sh_off + sh_n), sh_n =
     * ceil(n / W), sh_off = rank * sh_n. w_master, adam_m, adam_v hold sh_n elements; w_act and
     * grad W * sh_n (padded, the padding zero). dp_buf: device scratch of the small exchanges. */
    int dp;
    long long sh_n, sh_off;
    /* expert parallelism (ep.c): this rank's expert elements, [sh_n W, sh_n W + ep_n) of its
     * vectors (m.ep_n0 = sh_n W), held whole in the state after the shard (master, moments at
     * [sh_n, sh_n + ep_n)), never summed over ranks; ep_full: the model without expert
     * parallelism, whose layout checkpoints hold. 0 and NULL without. */
    long long ep_n;
    model *ep_full;
    /* the decode views (rollout/ep_decode.c): ep_full's model, the replicated parameters in
     * w_act, every expert's stacks copied into the gradient buffer (ep_dec_grad bytes of it) and
     * ep_dact (ep_dec_own bytes, the rest; NULL when none); ep_dv.layers NULL without. ep_dec_lost: gathering the
     * stacks again after an update failed (the comm down), so rollouts are refused until a
     * refresh succeeds. */
    void *ep_dact;
    model_views ep_dv;
    long long ep_dec_grad, ep_dec_own;
    int ep_dec_lost;
    void *dp_buf;
    model m;
    tok *tok; /* NULL when the directory has no tokenizer.json */
    jg_vocab *jg_vocab; /* tok's tokens as bytes for guided decoding: built at the first
                                  guided rollout (engine thread), freed with the engine */
    char model_dir[512];
    /* policy: act-typed weights used by the ops, fp32 master (== act on the cpu backend without
     * offload). With offload the master and the moments are host memory (offload.h). */
    void *w_act;
    float *w_master;
    int offload; /* 1: w_master, adam_m, adam_v in host memory (full-parameter only) */
    int m16; /* 1: adam_m, adam_v hold bf16 bits (--optimizer-moments bf16; with offload only) */
    /* a split (offload 0, one rank, full-parameter): elements [0, d = n - host_n) of the master
     * and moments on the device (w_master, adam_m, adam_v), [d, n) in host memory: the tails of
     * host_whole's master, m, v (n floats each; [0, d) untouched but as a checkpoint's buffer,
     * state.c); host_n 0 without one */
    long long host_n;
    float *host_whole[3];
    eng_offload off; /* staging of the host optimizer (offload) */
    model_views wv; /* views into w_act (and the adapters) */
    /* frozen reference (act-typed); with LoRA ref_act is NULL and rv views the policy's base */
    void *ref_act;
    model_views rv;
    /* LoRA adapters (m.lora_r > 0): fp32 master, act copy (== master on cpu), the norm-gradient
     * sink of lora_grad_views. The base has no fp32 master then on cuda (w_master NULL). */
    float *lora_master;
    void *lora_act;
    float *lora_sink;
    /* training state over the trainable parameters (eng_train_n: the adapters with LoRA),
     * allocated on the first update; the moments fp32, or bf16 bits with m16 */
    float *grad;
    void *adam_m, *adam_v;
    model_views gv; /* views into grad */
    int opt_step; /* AdamW steps taken (1-based bias correction) */
    snap_state snap; /* the update's safety copy (train/snapshot.h) */
    eng_plan plan; /* the memory plan (plan.c) */
    _Atomic long long policy_version;
    long long weights_epoch; /* bumped by whatever may change the policy's weights (update, undo) */
    struct eng_sched *sched; /* the first scheduler opened on e (rollout.c), NULL when closed */
    /* activations, grown on demand (no-grad and grad) */
    model_acts acts_ng, acts_g;
    model_acts acts_pad; /* expert parallelism: one token's, for the empty passes of ep_gate */
    long long ep_empty; /* the empty passes ep_gate ran, since open */
    int test_ckpt; /* tests only (eng_testing_acts_ckpt): n + 1 forces acts_g's n_ckpt to n; 0: by memory */
    struct dec_state *dec; /* generation step buffers (decode.c), made on first use */
    split_mem split; /* pinned host memory of split groups' dormant sets (split.h) */
};

/* Make sure acts has room for T tokens and M predictions (grad or not); reallocates to the
 * larger size when needed. */
int eng_acts_reserve(eng *e, model_acts *a, int T, int M, int grad);
/* Logprobs (and entropies when ent != NULL) of every predicted token of a set of groups under
 * views w, micro-batch by micro-batch; out is (M_total) in response order (group, response,
 * token). top_k > 0: top_ids, top_lps (M_total, top_k) get each position's most likely tokens
 * (kernels/logprob.h logprob_top; ids -1 in a group too large for one micro-batch). */
int eng_score(eng *e, const model_views *w, const pack_group *groups, int n, long long max_tokens, float temperature, float *out,
              float *ent, int top_k, int *top_ids, float *top_lps);
/* An update group as the packer takes it (sharing its arrays; routes sized for e's model). */
pack_group eng_pack_group(const eng *e, const eng_update_group *g);
/* rollout.c: the weights are about to change: the scheduler's prefix cache is emptied and its
 * KV pool given back when no rollout runs (the update has the memory). */
void sched_forget(struct eng_sched *s);
/* Trainable elements: m.l_elems with LoRA, else m.n_elems; their fp32 master and act copy. */
static inline long long eng_train_n(const eng *e) { return e->m.lora_r ? e->m.l_elems : e->m.n_elems; }
static inline float *eng_train_master(const eng *e) { return e->m.lora_r ? e->lora_master : e->w_master; }
static inline void *eng_train_act(const eng *e) { return e->m.lora_r ? e->lora_act : e->w_act; }
/* train/snapshot.c (snapshot.h): snap_alloc places the safety copy (plan.c, once); snap_begin
 * starts copying the state, snap_wait finishes it; snap_restore puts it back (GE_STATE_LOST
 * with none; all ranks together with a comm); snap_free releases it (eng_close). */
int snap_alloc(eng *e, int where);
int snap_begin(eng *e);
int snap_wait(eng *e);
int snap_restore(eng *e);
void snap_free(eng *e);
/* plan.c: the memory plan at the end of eng_open (the training state and the safety copy
 * allocated, the budgets set in e->plan). */
int plan_make(eng *e, const eng_open_opts *o);
/* plan.c: device bytes an update's micro-batch of T tokens takes beside its activations under
 * expert parallelism (0 without): each MoE layer's exchange buffers (moe_ep_call_bytes) and the
 * experts' backward scratch on the rows received (kernels/moe_gemm.cu: S (4 C + 10 Fm) bytes for
 * S rows, here 2 T k). ~13 GB at Qwen3-30B-A3B dims and 18,432 tokens a rank: with the 4 GiB
 * headroom alone the first update at 48 layers on 4 H200s ran out of memory in the scratch.
 * The plan's micro-batch fit and eng_acts_reserve keep it free; the scratch is the backend's
 * own, kept once grown (backend.h scratch_held): held bytes count toward it, else an update after
 * the first would keep the room twice (at 12,288 tokens 2.9 GiB: the 48-layer update at P=4096
 * on 2 H200s ran once, then fell 1.2 GiB short). */
long long plan_ep_beside(const eng *e, long long T, size_t held);
/* plan.c: 0 when full-parameter training of n parameters can place its device minimum (the act
 * policy and reference, act_bytes each, and fp32 gradients, 4 bytes a parameter, plus the
 * headroom) on a device of dev_total bytes (<= 0: unknown, taken as room); else GE_NOMEM naming
 * the bytes, the limit and the ways out (LoRA, more GPUs). eng_open, before any weight is placed. */
int plan_full_fits(long long n, int act_bytes, long long dev_total, const char *dev_name, const char *model_dir);
/* plan.c: --optimizer-offload auto|on|off|FRACTION -> *host_n, the elements of the master and
 * moments this rank holds in host memory (0: all on the device; state_n: all in host memory;
 * between: a split, one rank only), state_open's choice before the master is placed;
 * state_n: the elements of master and moments this rank will hold (state.h). */
int plan_offload(eng *e, const char *mode, long long state_n, long long *host_n);
/* plan.c, with a comm, when the state is placed (every rank): e->host_peers, the other ranks
 * whose host has this rank's host name, from one exchange of the names. The host memory the plan
 * gives a rank (host state, a host safety copy) is asked for by each of them alike: equal
 * shards, E / W experts each. */
int plan_host_peers(eng *e);
/* plan.c: with offload, before the host state is placed: 0 when the host state of the ranks on
 * this host (`bytes` each, 1 + host_peers of them) fits in its MemAvailable beside the host reserve,
 * counting the `held` bytes each rank holds now and frees before its moments are allocated (the
 * loaded weights), and their masters (`master` bytes each) fit beside those; else GE_NOMEM naming
 * both (plan_host_state_fits; every rank returns it). */
int plan_host_state(eng *e, long long bytes, long long held, long long master);
int plan_host_state_fits(long long need, int ranks, long long avail);
/* plan.c, auto with one rank when the state must leave the device: *host_n of the n elements
 * of the master and moments in host memory (n when all fit avail, MemAvailable's bytes; else as
 * many as fit, the rest on the device of fr free bytes beside the act policy and the fp32
 * gradients, when that leaves mb bytes, a micro-batch's activations); else GE_NOMEM naming both. */
int plan_split_fits(long long n, int act_bytes, long long fr, long long avail, long long mb, const char *dev_name,
                    long long *host_n);
/* Elements of the optimizer state this rank holds: the shard with a comm, else all trainable. */
static inline long long eng_state_n(const eng *e) {
    return e->dp ? e->sh_n + e->ep_n : (e->m.lora_r ? e->m.l_elems : e->m.n_elems);
}
/* The model a checkpoint's files describe: without expert parallelism (ep_full), else e's. */
static inline const model *eng_ckpt_model(const eng *e) { return e->ep_full ? e->ep_full : &e->m; }
/* dp.c (with a comm only; every rank calls each, in the same order). dp_exchange: all-gather bytes
 * of host memory from every rank into all (W * bytes). dp_agree: 0 when every rank passed rc 0;
 * else this rank's rc (its message kept), or the first failing rank's code with a message
 * naming it. dp_sum: the sum over ranks of x, in rank order. dp_gather_to_host: a sharded fp32
 * vector (sh_n a rank; host memory with offload, else the backend's) into host (W * sh_n, NULL on ranks that do not need it). dp_gather_act:
 * every rank's shard of the act weights to every rank. */
int dp_open(eng *e); /* eng_open with a comm: the exchanges' device scratch */
int dp_exchange(eng *e, const void *mine, void *all, size_t bytes);
int dp_agree(eng *e, int rc);
int dp_sum(eng *e, double x, double *sum);
int dp_gather_to_host(eng *e, const float *shard, float *host);
int dp_gather_act(eng *e);
/* ep.c, expert parallelism (with eng_open_opts.expert_parallel; every rank calls each, in the
 * same order). ep_model_init: e->m with the experts split over the comm's ranks and e->ep_full,
 * or one line saying why not (no comm, dense model, LoRA, E % W).
 * Lock-step: every pass over the layers (model.h MODEL_PASS_*: a forward, or a backward that
 * recomputes some layers) is a run of MoE exchanges that must meet the other ranks' passes of
 * the same kind. Before each of its passes a rank calls ep_gate with the pass's kind: the ranks
 * exchange the kinds they want next, the most wanted (the lowest on a tie) runs, and a rank that
 * wants another runs an empty one of that kind (T = 0 under views w: its experts serve the
 * others' rows) and asks again, until its own runs. Whatever a rank runs, micro-batches or split
 * groups (model/split.h, split_opts.gate = ep_gate_split), the others meet it. After its last
 * pass (rc: its result so far) ep_gate_end runs empty ones until every rank is done; a failure
 * aborts the comm instead, so no rank waits in an exchange. Both the identity without.
 * ep_agree_ckpt: the gradient activations a (reserved on every rank) re-made with the most
 * recomputed layers any rank's memory chose (model_backward's refill of a checkpointed MoE layer
 * is a forward exchange, so backwards that recompute different layers are passes of different
 * kinds: the gate would meet each with an empty one, every micro-batch's backward run twice).
 * ep_whole: this rank's state vector x (eng_state_n) gathered into whole (ep_full's n_elems,
 * rank 0; NULL elsewhere). ep_slice: a whole vector in ep_full's layout to this rank's part
 * (m.n_elems, zero where no parameter is). ep_model_free: e->ep_full's (eng_close; none: nothing). */
int ep_model_init(eng *e, const model_config *cfg, const eng_open_opts *o, int lora);
void ep_model_free(eng *e);
int ep_gate(eng *e, const model_views *w, int kind);
int ep_gate_end(eng *e, const model_views *w, int rc);
/* split_opts.gate for ep_gate: ud an ep_gate_ud */
typedef struct {
    eng *e;
    const model_views *w;
} ep_gate_ud;
int ep_gate_split(void *ud, int kind);
int ep_agree_ckpt(eng *e, model_acts *a);
int ep_whole(eng *e, const float *x, float *whole);
void ep_slice(const eng *e, const float *whole, float *mine);
/* rollout/ep_decode.c: the decode views' expert stacks gathered from every rank's act weights
 * (a collective; nothing without expert parallelism), and freed. The scheduler decodes with
 * eng_dec_model and eng_dec_views: the decode views under expert parallelism, else the policy.
 * ep_decode_param: where the decode views hold p (a parameter of ep_full), act-typed. */
int ep_decode_refresh(eng *e);
void *ep_decode_param(const eng *e, const model_param *p);
/* The end of eng_update (every rank, stepped: optimizer steps taken, rc: its result so far):
 * the copy gathered again where the weights changed. Returns rc, or the refresh's error. */
int ep_decode_after_update(eng *e, int stepped, int rc);
/* 0, or why the copy cannot decode now (err_set) */
int ep_decode_ready(const eng *e);
void ep_decode_free(eng *e);
static inline const model *eng_dec_model(const eng *e) { return e->ep_full ? e->ep_full : &e->m; }
static inline const model_views *eng_dec_views(const eng *e) { return e->ep_full ? &e->ep_dv : &e->wv; }
/* checkpoint.c: a checkpoint's policy_version, optimizer step and AdamW state into e. */
int eng_checkpoint_load_state(eng *e, const char *dir);
#endif
