/* model.h — the decoder (Qwen2/Qwen3/Qwen3-MoE/Llama) composed once from the backend table's ops:
 * parameter layout, loading from safetensors, forward (training, prefill and decode through
 * one function), and backward over a packed micro-batch.
 *
 * Parameters live in one flat buffer in a fixed order (model_param table); a model_views
 * struct points into any buffer laid out that way: the act-typed weights, the fp32 master, the
 * fp32 gradients, the AdamW moments. Tied models have no lm_head entry (views.lm_head ==
 * views.embed), so the embedding's gradient collects both uses.
 * Legend: T tokens, S key rows (KV cache), M predicted tokens, L layers, C model dim, H heads,
 * K kv heads, D head dim, F MLP dim, V vocab (config.h); HD = H*D, KD = K*D; E experts, k
 * experts per token, Fm expert MLP dim (kernels/moe.h). Every tensor is row-major, the last
 * letter fastest; weights are (out, in) as in HF's nn.Linear.
 *
 * A layer is a row: the attention of its kind (cfg.attn[l]: softmax, gated softmax or gated
 * DeltaNet), then the MLP of its kind (cfg.mlp[l]: dense SwiGLU or a mixture of experts). The
 * composition looks each kind up in a table of forward/backward pairs (model.c, attn_kinds and
 * mlp_kinds; the hybrid kinds in hybrid.c); no op asks which model it is in.
 * Zero-centred RMSNorm weights (Qwen3.5: the checkpoint holds w, the norm applies 1 + w) are
 * held as the gain 1 + w in every buffer and written back as w (model_param.gain1): the same
 * kernels run, and the gradient with respect to the gain is the gradient with respect to w.
 * (In fp32 the gain keeps w to 2^-24 absolute; a bf16 copy of it would keep w only to 2^-8
 * absolute, so a CUDA port applies the offset in its norm kernels rather than in the weights.)
 * Qwen3-Next's fused DeltaNet projections (cfg.dn_fused) are one parameter each, in_proj_qkvz
 * and in_proj_ba, whose rows the checkpoint interleaves per key head ([q_g; k_g; v_g; z_g] for
 * each key head g, [b_g; a_g]); every buffer holds them as Qwen3.5's [q; k; v; z] and [b; a]
 * (model_param.rows), so the views split them into Qwen3.5's four projections and the layer
 * runs Qwen3.5's ops; loading and saving (and a test reading HF-named gradients) reorder. */
#ifndef GRPOD_MODEL_H
#define GRPOD_MODEL_H
#include <stddef.h>

#include "engine/backend/backend.h"
#include "engine/format/config.h"
#include "engine/model/pack.h"

typedef struct {
    char name[96]; /* HF name, e.g. "model.layers.3.self_attn.q_proj.weight" */
    int ndim;
    long long shape[3];
    long long off, numel; /* elements into the flat buffer */
    int gain1; /* a zero-centred RMSNorm weight (config gain1): held as 1 + the checkpoint's value */
    int rows; /* PARAM_ROWS_*: the checkpoint orders its rows otherwise than the buffers */
} model_param;
enum { PARAM_ROWS_SAME, PARAM_ROWS_QKVZ, PARAM_ROWS_BA };

/* LoRA targets (engine/model/lora.h): the seven projections an adapter can ride on; in a MoE
 * layer gate+up and down are the experts' two adapters (PEFT's gate_up_proj and down_proj). */
enum { LORA_Q, LORA_K, LORA_V, LORA_O, LORA_GATE, LORA_UP, LORA_DOWN, LORA_N };
enum { LORA_EGU, LORA_EDOWN, LORA_EN }; /* the experts' adapters (kernels/moe.h moe_lora) */

/* One layer's parameters; bq/bk/bv/bo and q_norm/k_norm are NULL when the config has none. */
typedef struct {
    void *attn_norm; /* (C) */
    void *wq, *bq; /* (HD,C), (HD) */
    void *wk, *bk; /* (KD,C), (KD) */
    void *wv, *bv; /* (KD,C), (KD) */
    void *q_norm, *k_norm; /* (D), (D) */
    void *wo, *bo; /* (C,HD), (C) */
    void *mlp_norm; /* (C) */
    void *w_gate, *w_up; /* (F,C), (F,C) */
    void *w_down; /* (C,F) */
    /* MLP_MOE layers (the dense three above are NULL there, these NULL in dense layers): the
     * router and the stacked experts, each kind's E matrices back to back in the flat buffer */
    void *router; /* (E,C) mlp.gate.weight */
    void *we_gate, *we_up; /* (E,Fm,C) mlp.experts.{e}.gate_proj / up_proj */
    void *we_down; /* (E,C,Fm) mlp.experts.{e}.down_proj */
    void *ws_gate, *ws_up, *ws_down; /* (F,C), (F,C), (C,F) mlp.shared_expert.* (cfg.shared) */
    void *ws_g; /* (1,C) mlp.shared_expert_gate (cfg.shared) */
    /* ATTN_GATED layers use wq (2HD,C): per head the query's D rows, then its gate's D rows.
     * ATTN_DELTANET layers have none of the attention weights above but these (kernels/deltanet.h;
     * Cc = 2 Hk Dk + Hv Dv, VL = Hv Dv): */
    void *dn_qkv; /* (Cc,C) linear_attn.in_proj_qkv */
    void *dn_z; /* (VL,C) in_proj_z */
    void *dn_b, *dn_a; /* (Hv,C) in_proj_b, in_proj_a */
    void *dn_conv; /* (Cc,Kc) conv1d.weight (Cc,1,Kc) */
    void *dn_dt, *dn_alog; /* (Hv) dt_bias, A_log */
    void *dn_norm; /* (Dv) norm.weight, the gated norm (not zero-centred) */
    void *dn_out; /* (C,VL) out_proj */
    /* low-rank adapters (NULL: none, the base alone): target t adds (X A^T) B^T to its
     * projection's output, A (r, I) and B (O, r) with the LoRA scale folded into B (lora.h) */
    void *la[LORA_N], *lb[LORA_N];
    /* MLP_MOE layers: the experts' adapters, A (E,r,in) and B (E,out,r) (kernels/moe.h moe_lora;
     * gate_up's B holds the gate rows, then the up rows) */
    void *lea[LORA_EN], *leb[LORA_EN];
} model_layer_views;

typedef struct {
    void *embed; /* (V,C) */
    void *final_norm; /* (C) */
    void *lm_head; /* (V,C), == embed when tied */
    model_layer_views *layers; /* (L) */
} model_views;

/* Expert parallelism (engine/model/moe_ep.h): the ranks' comm, reached through its
 * all-to-all-v, all-gather and abort (comm.h's, counts in bytes, buffers in the backend's
 * memory), since the model room does not include engine/dist. */
typedef struct {
    int rank, W;
    int (*all_to_all_v)(void *ctx, const void *in, const size_t *send, void *out, const size_t *recv);
    int (*all_gather)(void *ctx, const void *in, void *out, size_t bytes);
    void (*abort)(void *ctx); /* a rank that cannot take part ends the others' exchange */
    void *ctx;
} model_ep;

typedef struct {
    model_config cfg;
    eng_backend *be;
    /* the experts this rank holds in every MoE layer: [ep_e0, ep_e0 + ep_E) (0, E without
     * expert parallelism, ep.W = 0); the parameter buffers hold only those */
    model_ep ep;
    int ep_e0, ep_E;
    /* with ep.W: the replicated parameters are [0, ep_n0) (W shards of whole 16-element blocks),
     * this rank's experts follow (the training state keeps them whole, never summed over ranks) */
    long long ep_n0;
    struct moe_ep_ws *ep_ws; /* with ep.W: the exchanges' buffers, kept between calls (moe_ep.c) */
    model_param *params;
    int n_params;
    long long n_elems; /* elements of a flat parameter buffer */
    float *inv_freq; /* (D/2) in backend memory */
    /* LoRA adapters (engine/model/lora.c; lora_r = 0: none): their own flat buffer, all A then all B */
    int lora_r;
    float lora_alpha;
    unsigned lora_targets; /* bit t for target t */
    model_param *lparams;
    int n_lparams;
    long long l_elems, l_elems_a; /* elements of the adapter buffer; of its A part (first) */
} model;

int model_init(model *m, const model_config *cfg, eng_backend *be);
/* model_init with the experts split over ep->W ranks (ep NULL: model_init); one line when E
 * does not split evenly. The comm's buffers are the backend's memory (host on cpu, device on
 * cuda: NCCL). */
int model_init_ep(model *m, const model_config *cfg, eng_backend *be, const model_ep *ep);
void model_free(model *m);
/* Views into a flat buffer whose elements are esize bytes (be->act_bytes or 4). */
int model_views_make(const model *m, void *base, size_t esize, model_views *v);
void model_views_free(model_views *v);
/* 0 when dir's safetensors hold every parameter with its shape (nothing is read or allocated). */
int model_check_files(const model *m, const char *dir);
/* p's values from the checkpoint's row order into the buffers' (to_file 0) or back (1); src and
 * dst are p->numel floats, not overlapping. A plain copy for PARAM_ROWS_SAME. */
void model_param_reorder(const model *m, const model_param *p, const float *src, float *dst, int to_file);
/* Read every parameter from DIR's safetensors into host fp32 (n_elems floats). Missing,
 * misshapen or unsupported tensors, and NaN or Inf weights, are errors naming the file and
 * tensor. */
int model_load_host(const model *m, const char *dir, float *host);
/* The same into dst, act-typed in backend memory (m->n_elems elements), tensor by tensor through
 * one host buffer of the largest tensor: no host copy of the whole model (a frozen base). */
int model_load_act(const model *m, const char *dir, void *dst);
/* Write the host fp32 buffer as DIR/model.safetensors (dtype ST_F32 or ST_BF16). */
int model_save_host(const model *m, const char *dir, const float *host, int bf16);

/* Activations for up to T tokens / M predictions, in backend memory, allocated once.
 * grad = 0 keeps one layer's worth (no backward possible). With grad, ln1, ln2 and a are not
 * kept per layer (the backward recomputes them) and some backward scratch pointers share
 * memory (model.c carve() lists which).
 * Activations by budget (model_acts_init_budget): layers [0, n_ckpt) keep only their input x
 * and share one set of the rest, which model_backward refills by running the layer's forward
 * again (without its last projection) just before its backward: the same kernels on the same
 * inputs, so the gradients are those of the full set, bit for bit. Per token and layer that is
 * 2C bytes (bf16) instead of 2(2C + 3HD + 3KD + 2F) + 4(2 + 2H + K), for one more forward of
 * those layers less their down projection (figures: docs/benchmarks.md, "Optimizer state in host
 * memory, activations by budget"). */
enum { MODEL_ACTS_RECOMPUTE = 2 }; /* grad mode with every layer checkpointed (n_ckpt = L) */
typedef struct model_kv model_kv;
/* fp32 sums of the gradients of KV-cache rows [0, S) in every layer, k and v (L) each (S, K, D):
 * a split group's prompt dK/dV (engine/model/split.c), added to by several backwards, cast once. */
typedef struct {
    int S;
    float **k, **v;
} model_kv_acc;
/* A split group's DeltaNet carry (engine/model/split.c), per layer (L; NULL in the other layers),
 * fp32: the prompt's final recurrent state (Hv,Dk,Dv) and conv tail (Kc-1,Cc) (kernels/deltanet.h
 * deltanet_carry), and the sums of their gradients over the response micro-batches (NULL
 * without grad). row0 0: the prompt's own pass (its forward writes state and tail, its backward
 * takes dstate and dtail as gradient from outside); row0 P: a response micro-batch's (its tokens
 * at rows P.., each run starting from state and tail; its backward ADDS their gradients into
 * dstate and dtail). */
typedef struct {
    int row0;
    float **state, **tail, **dstate, **dtail;
} model_dn_carry;
typedef struct {
    int cap_T, cap_M, grad; /* grad: 0, 1, or MODEL_ACTS_RECOMPUTE */
    int n_ckpt; /* layers that keep only x (grad only) */
    void *mem; /* one backend allocation */
    size_t bytes; /* its size */
    int borrowed; /* mem is another model_acts' (model_acts_init_in): model_acts_free leaves it */
    /* model_acts_init_kv only (else NULL / 0): keys and values in a KV cache, gradients into dkv */
    const model_kv *kv;
    model_kv *dkv;
    int kv_row0, ring;
    /* set by the caller after model_acts_init_kv (else NULL): dkv is then scratch that all
     * layers may share, and the gradients of rows [0, acc->S) are kept in acc (model_layer_bwd) */
    model_kv_acc *acc;
    /* set by the caller (else NULL): the DeltaNet layers' carry across a split group's passes */
    const model_dn_carry *carry;
    size_t layer_bytes; /* one layer's saved activations: a block from l[l].x */
    int ep_rc; /* the first error of an expert-parallel exchange (moe_ep.h) since model_forward/_backward began */
    struct model_layer_acts { /* act-typed (be->act_bytes) unless float */
        void *x; /* (T,C) the layer's input (residual stream) */
        void *ln1; /* (T,C) rmsnorm(x) */
        void *q0, *k0; /* (T,HD), (T,KD) before q/k norm and RoPE (qk_norm only) */
        void *q, *k, *v; /* (T,HD), (T,KD), (T,KD) after RoPE */
        void *att; /* (T,HD) attention output */
        void *xm; /* (T,C) x + att Wo^T */
        void *ln2; /* (T,C) rmsnorm(xm) */
        void *g, *u, *a; /* (T,F) gate, up, silu(g)*u */
        float *rstd1, *rstd2; /* (T) 1/rms of x, xm */
        float *rstdq, *rstdk; /* (T,H), (T,K) 1/rms of each q/k head */
        float *lse; /* (T,H) attention logsumexp */
        /* MLP_MOE layers (allocated when the model has any; kernels/moe.h) */
        float *probs, *topw; /* (T,E) router softmax, (T,k) routing weights */
        int *topi; /* (T,k) experts chosen */
        void *eg, *eu, *ey; /* (T,k,Fm), (T,k,Fm), (T,k,C) each slot's gate, up, expert output */
        void *sy, *sz; /* (T,C), (T) the shared expert's output and its gate's logit (cfg.shared) */
        /* ATTN_GATED layers: qg (T,2HD) q_proj's output (query and gate per head), ag (T,HD) the
         * gated attention output; k0 as qk_norm */
        void *qg, *ag;
        /* ATTN_DELTANET layers (kernels/deltanet.h): x_qkv (T,Cc) in_proj_qkv's output, dn_u (T,Cc)
         * the conv's, z (T,VL), dn_a, dn_b (T,Hv) the projections, o (T,VL) the rule's output,
         * y (T,VL) the gated norm's; rstdn (T,Hv) */
        void *x_qkv, *dn_u, *z, *dn_a, *dn_b, *o, *y;
        float *rstdn;
    } * l; /* (L) */
    /* ATTN_DELTANET scratch, shared by the layers: each token's state (T,Hv,Dk,Dv) (forward and
     * backward), their gradients (grad only); backward scratch dqg (T,2HD), dkg (T,KD), dx_qkv, du (T,Cc),
     * dz, dy, dob (T,VL), ddn_a, ddn_b (T,Hv) (act-typed) */
    float *states, *dstates;
    void *dqg, *dkg, *dx_qkv, *du_lin, *dz, *dy_lin, *do_lin, *ddn_a, *ddn_b;
    int *routes; /* (Lm, T, k) the experts each MoE layer chose (or replayed) in the last forward of T tokens */
    float *moe_stats; /* (MOE_STATS(E)) the balance loss's statistics of the last forward, every MoE layer */
    float *aux_g; /* (E) its gradient per unit count (model_backward) */
    float *dtopw, *dlogit; /* (T,k), (T,E) MoE backward scratch */
    void *edg, *edu; /* (T,k,Fm) MoE backward scratch, act-typed */
    void *lu, *ldu; /* LoRA scratch (m->lora_r > 0): X A^T of up to three targets
                                 * (3, T, r); one's gradient (T, r) */
    void *xL, *lnf; /* (T,C) last layer's output, final norm of it */
    float *rstdf; /* (T) */
    float *logp, *ent, *dlogp, *dent; /* (M) */
    int *ints; /* batch arrays: tokens, pos, a0, a1, b0, b1, slot, count, srow (T each), out_pos, out_tok (M),
                * x0, x1 (ATTN_XR_MAX T each) */
    /* backward scratch, act-typed */
    void *dres, *dlnf, *dln; /* (T,C) */
    void *dq, *dq0, *datt; /* (T,HD) */
    void *dk, *dv, *dk0; /* (T,KD) */
    void *da, *dg, *du; /* (T,F) */
} model_acts;

int model_acts_init(const model *m, model_acts *a, int cap_T, int cap_M, int grad);
/* Grad activations within budget bytes (0: no limit, every layer kept whole): the fewest
 * checkpointed layers that fit; GE_NOMEM naming the bytes when even all of them do not. */
int model_acts_init_budget(const model *m, model_acts *a, int cap_T, int cap_M, size_t budget);
/* Grad activations with layers [0, n_ckpt) checkpointed (0..L). */
int model_acts_init_ckpt(const model *m, model_acts *a, int cap_T, int cap_M, int n_ckpt);
/* The bytes model_acts_init_budget would allocate with n_ckpt checkpointed layers. */
size_t model_acts_bytes(const model *m, int cap_T, int cap_M, int grad, int n_ckpt);
/* No-grad activations carved in owner's memory (an update's gradient activations: its no-grad
 * passes, the old policy's and the reference's, run before its policy pass and never beside
 * it), nothing allocated; model_acts_free leaves the memory to owner, which must outlive a.
 * 1 (a zeroed) when they do not fit there. */
int model_acts_init_in(const model *m, model_acts *a, int cap_T, int cap_M, const model_acts *owner);
/* An update's activations at T tokens and T predictions with every layer recomputed: the
 * gradient set, its no-grad set inside it when that fits (model_acts_init_in), else beside. */
size_t model_acts_update_bytes(const model *m, int T);
void model_acts_free(const model *m, model_acts *a);

/* A KV cache: per softmax-attention layer k, v (S,K,D) act-typed, in backend memory; a gated
 * DeltaNet layer has no K/V (its k[l], v[l] are NULL) but state rows (model_kv_states_init):
 * per sequence its recurrent state and conv tail (kernels/deltanet_decode.h), fp32. */
struct model_kv {
    int cap_S;
    int clean; /* rows [0, clean) hold zeros or written keys and values (model_kv_clean_to) */
    void *mem; /* one backend allocation */
    void **k, **v; /* (L) each (S,K,D), NULL in DeltaNet layers */
    int cap_st; /* state rows (0: none) */
    void *st_mem; /* one backend allocation */
    float **state, **tail; /* (L) each (cap_st,Hv,Dk,Dv), (cap_st,Kc-1,Cc); NULL in other layers */
};

/* Grad-mode activations whose tokens' keys and values live in rows row0 .. row0 + T of the KV
 * cache kv (the forward's slots must be row0 + t), the key ranges indexing cache rows, so they
 * may attend to rows other forwards wrote (engine/model/split.c: a response micro-batch attending to
 * its cached prompt). model_layer_bwd reads kv's keys and ADDS the gradient of every key row
 * the queries saw into dkv (same shape): the caller zeroes dkv's rows [row0, row0 + T) first
 * unless they hold gradients to add to (a prompt's dK/dV collected from its responses).
 * With a->acc set, dkv is scratch: model_layer_bwd starts it itself, and either (row0 == acc->S:
 * queries after the accumulated rows) zeroes it and adds its rows [0, S) into acc after the
 * attention backward, or (row0 == 0, T == S: the accumulated rows' own queries) starts its rows
 * from acc, cast to the act type once, for the attention backward to add to.
 * ring > 0 keeps the saved activations of `ring` layers only (l[l] aliases l[l % ring]): each
 * layer's block (layer_bytes from l[l].x) must be moved out after its forward and back before
 * its backward by the caller; 0 keeps every layer. recompute: each layer keeps its input x only
 * and one set of the rest that all layers share (n_ckpt = L), which the caller refills before
 * each layer's backward with model_layer_fwd(.., out NULL, kv_k, kv_v NULL) as model_backward
 * does; with ring > 0 too, the inputs alone are in `ring` slots (layer_bytes: one input). */
int model_acts_init_kv(const model *m, model_acts *a, int cap_T, int cap_M, const model_kv *kv, model_kv *dkv, int row0, int ring,
                       int recompute);
int model_kv_init(const model *m, model_kv *kv, int cap_S);
void model_kv_free(const model *m, model_kv *kv);
/* Bytes of one KV row over the layers that keep K/V; of one state row over the DeltaNet layers
 * (0: the model has none). */
long long model_kv_row_bytes(const model *m);
long long model_state_row_bytes(const model *m);
/* cap state rows beside kv's K/V (freed by model_kv_free), uninitialised. */
int model_kv_states_init(const model *m, model_kv *kv, int cap);
/* State row dst := zeros (src < 0: a sequence with no history yet) or a copy of row src, every
 * DeltaNet layer, queued like an op: a prompt's final state handed to each of its responses. */
void model_kv_state_set(const model *m, model_kv *kv, int dst, int src);
/* Rows [src, src + n) of every layer's keys and values copied to [dst, dst + n) (not overlapping),
 * queued on the backend like an op. */
void model_kv_copy_rows(const model *m, model_kv *kv, int dst, int src, int n);
/* Zeroes rows [kv->clean, end) of every layer's keys and values (queued like an op) and moves
 * kv->clean to end; nothing when end <= clean. A caller hands out rows below kv->clean only: the
 * attention kernels load whole tiles of keys, rows no query of the tile attends to included, and
 * weight those by 0; a never-written row is whatever the memory held before (0 x NaN = NaN). */
void model_kv_clean_to(const model *m, model_kv *kv, int end);

/* One forward input: T tokens with positions, key ranges and (with a KV cache) the cache
 * slot each token's k/v is written to; ranges then index cache rows. Host arrays: they are
 * uploaded into a->ints. Without kv, keys are the T tokens themselves. A hybrid model decodes
 * with a KV cache only with its state rows (srow). */
typedef struct {
    int T;
    const int *tokens, *pos; /* (T) */
    const int *a0, *a1, *b0, *b1; /* (T) */
    const int *x0, *x1; /* (nx, T) extra key ranges (a prefix tree's, pack.h), or NULL */
    int nx; /* <= ATTN_XR_MAX; 0 in a model with DeltaNet layers (model_pack_layout) */
    const int *slot; /* (T) or NULL */
    /* with state rows (kv->cap_st): the state row each token continues, the tokens of one row
     * contiguous and in order (kernels/deltanet_decode.h); NULL otherwise */
    const int *srow; /* (T) or NULL */
    int M;
    const int *out_pos, *out_tok; /* (M) predictions (may be 0) */
    /* MoE only: the logical tokens each token stands for in the router's balance statistics
     * (pack_batch.tok_count; NULL: 1 each), and d loss / d (balance loss) for model_backward
     * (0: the balance loss is not part of the loss) */
    const int *count; /* (T) or NULL */
    float aux_coef;
    /* MoE only: routing replay (kernels/moe.h). The experts of each MoE layer (in layer order,
     * Lm = config_n_moe) for each token, replayed instead of the router's top-k; a token whose
     * first entry is -1 takes the top-k. NULL: every token takes the top-k. */
    const int *routes; /* (Lm, T, k) or NULL */
} model_input;

/* The packed layout a model trains and scores in: PACK_TREE (every shared segment of a group's
 * responses once), or PACK_PACKED (the trunk only) for a model with DeltaNet layers, whose
 * recurrent state runs along ranges a and b only, and in exact mode (tune.exact), where a row
 * must sum in decode's order and CUDA merges a tree's extra ranges from separate launches. */
pack_layout model_pack_layout(const model *m);
/* Fill a model_input from a packed micro-batch (pointers into b; aux_coef 0). */
void model_input_from_batch(model_input *in, const pack_batch *b);

/* The kinds of pass over the layers whose MoE exchanges must meet other ranks' passes of the same
 * kind under expert parallelism (moe_ep.h): a forward (every layer in order), or a backward whose
 * refills recompute layers [0, c) (MODEL_PASS_BWD + c: from the last layer, each refilled layer's
 * forward before its backward; c = a->n_ckpt). */
enum { MODEL_PASS_FWD = 0, MODEL_PASS_BWD = 1 };

/* Forward: the final-norm hidden states land in a->lnf; with in->M > 0 also a->logp (and
 * a->ent when want_entropy) at temperature. kv may be NULL. */
int model_forward(const model *m, const model_views *w, model_acts *a, model_kv *kv, const model_input *in, float temperature,
                  int want_entropy);
/* The same forward in two halves, for callers that keep inputs on the device or capture the
 * forward in a CUDA graph: model_input_upload copies in's arrays into a->ints (synchronous
 * host copies); model_forward_dev only queues the ops (no copies, no sync: errors surface at
 * the next be->sync). A captured forward replays against whatever a->ints holds then. */
typedef struct {
    int T, M;
    int *tokens, *pos, *slot, *out_pos, *out_tok;
    int *srow; /* NULL: no state rows (the DeltaNet layers run the training ops on the ranges) */
    attn_ranges r;
    int *count; /* NULL: 1 each */
    float *aux_g; /* (E) the balance loss's gradient per unit count; NULL: not in the loss */
    /* MoE only (else NULL): (Lm, T, k) the routes, replayed (replay) or written by the forward */
    int *routes;
    int replay;
} model_dev_input;
int model_input_upload(const model *m, model_acts *a, const model_input *in, model_dev_input *d);
void model_forward_dev(const model *m, const model_views *w, model_acts *a, model_kv *kv, const model_dev_input *d,
                       float temperature, int want_entropy);
/* One decoder layer l of model_forward_dev on a->l[l], queued (no sync): A->x (T,C) holds the
 * residual stream, out (T,C) gets it after the layer (NULL: stop before the down projection,
 * as the backward's recompute of a checkpointed layer does):
 *   q, k, v = rmsnorm(A->x) W^T (the norm fused into the projections), RoPE (q/k norm), attention;
 *   A->xm = A->x + att Wo^T; out = A->xm + (silu(ln2 Wg^T) * (ln2 Wu^T)) Wd^T, ln2 = rmsnorm(A->xm).
 * out may be A->x (not read once A->xm is made). ln1 / ln2 are scratch (the backward recomputes
 * them and their rstd). kv_k, kv_v: this layer's cache (d->slot set) or NULL; for a DeltaNet
 * layer its state and conv-tail rows (d->srow set). */
void model_layer_fwd(const model *m, const model_views *w, model_acts *a, int l, void *out, const model_dev_input *d, void *kv_k,
                     void *kv_v);
/* Backward of model_layer_fwd (grad mode, queued): a->dres holds d(layer output) on entry and
 * d(A->x) on return; weight gradients are added into g; a's backward scratch is overwritten. */
void model_layer_bwd(const model *m, const model_views *w, const model_views *g, model_acts *a, int l, const model_dev_input *d);
/* For the softmax attention kinds' backwards (model.c, hybrid.c): the keys and values layer l's
 * attention read in the forward and where their gradients go: the T tokens' own (A->k, A->v;
 * a->dk, a->dv zeroed), or with a KV cache (model_acts_init_kv) the cache rows [0, S) and dkv,
 * started as model_acts_init_kv says; own: the T tokens' rows in dk, dv. After the attention
 * backward model_attn_keys_end adds the accumulated rows' gradients into a->acc. */
typedef struct {
    const void *k, *v;
    void *dk, *dv, *dk_own, *dv_own;
    int S;
} model_attn_keys;
void model_attn_keys_begin(const model *m, model_acts *a, int l, int T, model_attn_keys *o);
void model_attn_keys_end(const model *m, model_acts *a, int l, const model_attn_keys *o);
/* The routes of tokens [0, T) of the last forward on a, which ran T_fwd tokens (T <= T_fwd), into
 * out (T, Lm, k) host, token-major (model_input.routes is layer-major); synchronous. 0 without
 * MoE layers (nothing written). */
int model_routes_get(const model *m, const model_acts *a, int T_fwd, int T, int *out);
/* The router's balance loss of the last model_forward on a (transformers' load_balancing_loss_func
 * over every MoE layer's router, each token counted in->count times): 0 without MoE layers. */
int model_aux_loss(const model *m, const model_acts *a, double *aux);
/* Backward of sum(dlogp·logp + dent·ent) + in->aux_coef·aux given host dlogp/dent (M, dent may be NULL) for the
 * input of the last model_forward on a (grad mode); gradients are ADDED into the fp32 views g. */
int model_backward(const model *m, const model_views *w, const model_views *g, model_acts *a, const model_input *in,
                   const float *dlogp, const float *dent, float temperature);
#endif
