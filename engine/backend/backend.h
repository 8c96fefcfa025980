/* backend.h — the op table every backend implements (ggml-style): memory, copies, and the
 * forward/backward of each op family in kernels/. The model's layer composition (engine/model/model.c)
 * is written once against this table; `cpu` (fp32 reference, backend_cpu.c) and `cuda` (bf16
 * activations and weights with fp32 accumulation, fp32 master weights/grads/moments,
 * backend_cuda.cu) implement it.
 *
 * Pointer kinds in the signatures: `act` (void *) is the backend's activation/weight element
 * type (fp32 on cpu, bf16 on cuda; act_bytes says which); float * is fp32 and int * is int32,
 * all in the backend's memory. Ops run in order on one stream; errors are sticky and reported
 * by sync() (a failed CUDA call marks the backend failed with a message naming the call).
 * Semantics of each op are those of the matching *_cpu function in kernels/NAME.h ("+=" there
 * means accumulate here too). Only the engine thread calls a backend. */
#ifndef GRPOD_BACKEND_H
#define GRPOD_BACKEND_H
#include <stddef.h>
#include <stdint.h>

#include "kernels/attention.h"
#include "kernels/deltanet.h"
#include "kernels/moe.h"
#include "kernels/rmsnorm.h"
#include "kernels/sampling.h"
#include "kernels/tune.h"

typedef struct eng_backend eng_backend;
enum {
    BE_LANE_HOST = -1,
    BE_LANE_OPS = 0,
    BE_LANE_D2H = 1,
    BE_LANE_H2D = 2,
    BE_LANE_SNAP = 3,
    BE_LANES = 4,
    BE_EV_SNAP = 16,
    BE_EVENTS = 17
};
/* One linear layer of matmul_fwd_n: out (T, O) = inp · w^T + bias + (inp · lr.a^T) · lr.b^T + res
 * (bias, lr.a, res (T, O) may be NULL; on CUDA the sum is rounded to bf16 once at decode sizes:
 * the residual add that closes a sub-layer, the adapter term inside the few-row GEMM). */
/* A low-rank term added with it (LoRA, unmerged): + (inp a^T) b^T, a (r, I), b (O, r), inp the
 * op's (normed) input; inp a^T is written to u (T, r), scratch; a NULL: none. On CUDA at decode
 * sizes both halves ride the base projection's one launch. */
typedef struct {
    const void *a, *b;
    void *u;
    int r;
} mm_lowrank;
typedef struct {
    void *out;
    const void *w;
    const void *bias;
    int O;
    const void *res;
    mm_lowrank lr;
} mm_part;
/* The RMSNorm in front of matmul_fwd_n / mlp_in_fwd (NULL: none): the projections read
 * rmsnorm(inp) · w (kernels/rmsnorm.h, eps); ln (T, I) is scratch the op may use. */
typedef struct {
    const void *w;
    float eps;
    void *ln;
} mm_norm;
struct eng_backend {
    const char *name;
    int act_bytes; /* 4 (cpu) or 2 (cuda) */
    void *impl;
    tune_opts tune; /* kernels/tune.h: read once at creation; tests may set fields */
    const char *no_moe; /* NULL: the moe ops run; else why they do not (a MoE model is refused with it) */
    const char *no_moe_lora; /* NULL: moe_experts_* take adapters (moe_lora); else why not (LoRA on a MoE model is refused) */
    const char *no_hybrid; /* NULL: the linear-attention ops run; else why not (a hybrid model is refused with it) */
    int max_head_dim; /* 0: any; else the attention ops' largest head dim (a model with a larger one is refused) */

    /* memory: alloc returns NULL with err_set(GE_NOMEM, ...) on failure */
    void *(*alloc)(eng_backend *b, size_t bytes);
    void (*free)(eng_backend *b, void *p);
    void (*zero)(eng_backend *b, void *p, size_t bytes);
    void (*copy)(eng_backend *b, void *dst, const void *src, size_t bytes); /* dev -> dev, queued like an op */
    int (*to_dev)(eng_backend *b, void *dst, const void *src, size_t bytes); /* raw host -> dev */
    int (*to_host)(eng_backend *b, void *dst, const void *src, size_t bytes); /* raw dev -> host */
    int (*act_from_f32)(eng_backend *b, void *dst, const float *src_host, size_t n); /* host f32 -> dev act */
    int (*act_to_f32)(eng_backend *b, float *dst_host, const void *src, size_t n); /* dev act -> host f32 */
    void (*f32_to_act)(eng_backend *b, void *dst, const float *src, size_t n); /* dev f32 -> dev act */
    int (*sync)(eng_backend *b); /* wait for queued work; 0 or the sticky error */
    long long (*mem_free)(eng_backend *b); /* free device memory in bytes; NULL on cpu (host memory) */
    /* Optional (NULL on cpu): pinned host memory, a host -> device copy that does not wait (src
     * must stay unchanged until the next sync), and CUDA graphs: graph_begin captures the ops
     * queued until graph_end into *graph (nothing runs); graph_launch replays it, returning 1
     * (nothing launched) when the backend's scratch moved since the capture: capture again. */
    void *(*host_alloc)(eng_backend *b, size_t bytes);
    void (*host_free)(eng_backend *b, void *p);
    int (*to_dev_async)(eng_backend *b, void *dst, const void *src, size_t bytes);
    int (*graph_begin)(eng_backend *b);
    int (*graph_end)(eng_backend *b, void **graph);
    int (*graph_launch)(eng_backend *b, void *graph);
    void (*graph_free)(eng_backend *b, void *graph);
    void (*destroy)(eng_backend *b);
    /* Optional (NULL on cpu, whose memory is the host's): copies that overlap the ops, for state
     * kept in host memory (engine/train/offload.c). Lane 0 is the op stream, lane 1 a device -> host
     * copy stream, lane 2 a host -> device one, lane 3 the update's safety copy (any direction,
     * engine/train/snapshot.c, which feeds it a piece at a time: a copy engine works through its
     * queue in order, and the op stream's own copies share it). copy_async queues a copy
     * between device and pinned host memory (either direction) on a lane; mark records event ev (0 <= ev <
     * BE_EVENTS) on a lane after what is queued there; wait makes a lane wait for ev's last
     * mark, lane -1 the calling thread (blocks; returns the sticky error). mem_info: free and
     * total device bytes. scratch_held: the bytes of the ops' scratch held now (grown to the
     * largest op's so far and kept; NULL: none kept). Events 0-7 are engine/train/offload.c's, 8-15 engine/model/split.c's, BE_EV_SNAP
     * engine/train/snapshot.c's. */
    int (*copy_async)(eng_backend *b, int lane, void *dst, const void *src, size_t bytes);
    void (*mark)(eng_backend *b, int lane, int ev);
    int (*wait)(eng_backend *b, int lane, int ev);
    int (*mem_info)(eng_backend *b, size_t *free_bytes, size_t *total_bytes);
    size_t (*scratch_held)(eng_backend *b);
    void *xfer; /* the lanes' state (cuda) */

    /* ops (kernels/NAME.h) */
    void (*embedding_fwd)(eng_backend *b, void *out, const int *tokens, const void *wte, int T, int C);
    void (*embedding_bwd)(eng_backend *b, float *dwte, const void *dout, const int *tokens, int T, int C);
    void (*rmsnorm_fwd)(eng_backend *b, void *out, float *rstd, const void *inp, const void *w, int T, int C, float eps);
    void (*rmsnorm_bwd)(eng_backend *b, void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                        const float *rstd, int T, int C);
    void (*matmul_fwd)(eng_backend *b, void *out, const void *inp, const void *w, const void *bias, int T, int I, int O);
    void (*matmul_bwd)(eng_backend *b, void *dinp, float *dw, float *dbias, const void *dout, const void *inp, const void *w,
                       int T, int I, int O);
    /* n <= 3 linear layers sharing their input (q/k/v; o and down with their residual), the
     * input normed first when norm is set: one launch on CUDA at decode sizes */
    void (*matmul_fwd_n)(eng_backend *b, const mm_part *p, int n, const void *inp, const mm_norm *norm, int T, int I);
    void (*rope_fwd)(eng_backend *b, void *x, const int *pos, const float *inv_freq, int T, int H, int D);
    void (*rope_bwd)(eng_backend *b, void *dx, const int *pos, const float *inv_freq, int T, int H, int D);
    void (*attention_fwd)(eng_backend *b, void *out, float *lse, const void *q, const void *k, const void *v, attn_ranges r,
                          int T, int H, int K, int D);
    /* S key rows (>= T; the ranges index them: T when keys are the tokens) */
    void (*attention_bwd)(eng_backend *b, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                          const void *v, const void *out, const float *lse, attn_ranges r, int T, int S, int H, int K, int D);
    void (*swiglu_fwd)(eng_backend *b, void *out, const void *gate, const void *up, long long n);
    /* gate/up projections and SwiGLU (kernels/matmul.h mlp_in_fwd_cpu): all three written; one
     * launch on CUDA at decode sizes. lr (NULL: none): the gate's and the up projection's
     * low-rank terms (lr[0], lr[1]), added before SwiGLU */
    void (*mlp_in_fwd)(eng_backend *b, void *act, void *gate, void *up, const void *inp, const mm_norm *norm, const void *wg,
                       const void *wu, int T, int I, int F, const mm_lowrank *lr);
    void (*swiglu_bwd)(eng_backend *b, void *dgate, void *dup, const void *dout, const void *gate, const void *up, long long n);
    void (*add)(eng_backend *b, void *out, const void *x, const void *y, long long n); /* out = x + y */
    void (*acc_f32)(eng_backend *b, float *acc, const void *x, long long n); /* acc += x (act-typed) */
    /* dst rows slot[t] = src rows t (T rows of row elements, act-typed): KV-cache rows */
    void (*scatter_rows)(eng_backend *b, void *dst, const void *src, const int *slot, int T, int row);
    /* dst rows i = src rows idx[i] (n rows of row elements, act-typed): expert parallelism's send rows */
    void (*gather_rows)(eng_backend *b, void *dst, const void *src, const int *idx, int n, int row);
    /* fused neighbours (kernels/rmsnorm.h): the backward of the q/k per-head norm then RoPE
     * (dinp written, not added) */
    /* between the q/k/v projections and attention (kernels/rmsnorm.h qkv_rope_io): q/k norm and
     * RoPE, k and v into their KV-cache rows; one launch on CUDA */
    void (*qkv_rope_fwd)(eng_backend *b, const qkv_rope_io *io, const int *pos, const float *inv_freq, int T, int H, int K, int D,
                         float eps);
    void (*qk_norm_rope_bwd)(eng_backend *b, void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                             const float *rstd, const int *pos, const float *inv_freq, int T, int H, int D);
    void (*logprob_fwd)(eng_backend *b, float *logp, float *ent, const void *h, const int *out_pos, const int *out_tok,
                        const void *w, int M, int C, int V, float temperature);
    /* the K most likely tokens of each prediction, ids and lps (M,K) on the device */
    void (*logprob_top)(eng_backend *b, int *ids, float *lps, const void *h, const int *out_pos, const void *w, int M, int C,
                        int V, float temperature, int K);
    void (*logprob_bwd)(eng_backend *b, void *dh, float *dw, const float *dlogp, const float *dent, const void *h,
                        const int *out_pos, const int *out_tok, const void *w, int M, int C, int V, float temperature);
    /* mixture of experts (kernels/moe.h): the router (softmax, top-k, the balance statistics),
     * the experts' SwiGLU MLPs and their weighted sum, and the backward of each */
    void (*moe_router_fwd)(eng_backend *b, float *probs, int *topi, float *topw, float *stats, const void *x, const void *wr,
                           const int *given, const int *count, int T, int C, int E, int k, int norm);
    void (*moe_experts_fwd)(eng_backend *b, void *out, void *eg, void *eu, void *ey, const void *x, const void *res,
                            const int *topi, const float *topw, const void *wg, const void *wu, const void *wd, int T, int C,
                            int E, int k, int Fm, const moe_lora *lr);
    void (*moe_experts_bwd)(eng_backend *b, void *dx, float *dwg, float *dwu, float *dwd, float *dtopw, void *dg, void *du,
                            const void *dout, const void *x, const int *topi, const float *topw, const void *eg, const void *eu,
                            const void *ey, const void *wg, const void *wu, const void *wd, int T, int C, int E, int k, int Fm,
                            const moe_lora *lr);
    /* expert parallelism (engine/model/moe_ep.c): ey (T,k,C) rows ts = rows' rows inv[ts], then
     * out = res + Σ_s w_s ey_s (out NULL: the copy alone); dtopw (T,k) = dout_t · ey_ts */
    void (*moe_combine_rows)(eng_backend *b, void *out, void *ey, const void *rows, const int *inv, const void *res,
                             const float *topw, int T, int C, int k);
    void (*moe_dtopw)(eng_backend *b, float *dtopw, const void *dout, const void *ey, int T, int C, int k);
    void (*moe_router_bwd)(eng_backend *b, void *dx, float *dwr, float *dlogit, const float *dtopw, const float *probs,
                           const int *topi, const void *x, const void *wr, const float *aux_g, const int *count, int T, int C,
                           int E, int k, int norm);
    /* a shared expert's gate (kernels/moe_shared.h): out += sigmoid(z) y per token; its backward in
     * place (y := d y, z := d z) */
    void (*moe_shared_gate_fwd)(eng_backend *b, void *out, const void *y, const void *z, int T, int C);
    void (*moe_shared_gate_bwd)(eng_backend *b, void *y, void *z, const void *dout, int T, int C);
    /* hybrid linear-attention models (kernels/deltanet.h, kernels/gated_attn.h): the gated
     * DeltaNet's conv, recurrent rule and gated norm; the gated full attention's q/k norm with
     * partial RoPE and its output gate; the backward of each. cy: deltanet.h's carry (NULL: none) */
    void (*deltanet_conv_fwd)(eng_backend *b, void *u, const void *x, const void *w, attn_ranges r, const deltanet_carry *cy,
                              int T, int Cc, int Kc);
    void (*deltanet_conv_bwd)(eng_backend *b, void *dx, float *dw, const void *du, const void *x, const void *w, attn_ranges r,
                              const deltanet_carry *cy, int T, int Cc, int Kc);
    /* the floats of the rule's states and dstates scratch at T tokens: every token's state
     * (T, Hv, Dk, Dv) on cpu; checkpoints and per-token partials on cuda (kernels/deltanet.cu) */
    void (*deltanet_scratch)(eng_backend *b, long long *states, long long *dstates, int T, int Hk, int Hv, int Dk, int Dv);
    void (*deltanet_rule_fwd)(eng_backend *b, void *o, float *states, const void *u, const void *a, const void *bb,
                              const void *A_log, const void *dt_bias, attn_ranges r, const deltanet_carry *cy, int T, int Hk,
                              int Hv, int Dk, int Dv);
    void (*deltanet_rule_bwd)(eng_backend *b, void *du, void *da, void *db, float *dA_log, float *ddt_bias, float *states,
                              float *dstates, const void *dout, const void *u, const void *a, const void *bb, const void *A_log,
                              const void *dt_bias, attn_ranges r, const deltanet_carry *cy, int T, int Hk, int Hv, int Dk, int Dv);
    void (*deltanet_norm_fwd)(eng_backend *b, void *y, float *rstd, const void *o, const void *z, const void *w, int T, int Hv,
                              int Dv, float eps);
    void (*deltanet_norm_bwd)(eng_backend *b, void *dout, void *dz, float *dw, const void *dy, const void *o, const void *z,
                              const void *w, const float *rstd, int T, int Hv, int Dv);
    /* the DeltaNet's conv and rule one token at a time on state rows kept across forwards
     * (kernels/deltanet_decode.h: tail (S,Kc-1,Cc), state (S,Hv,Dk,Dv) fp32, updated in place) */
    void (*deltanet_conv_step)(eng_backend *b, void *u, float *tail, const void *x, const void *w, const int *srow, int T, int Cc,
                               int Kc);
    void (*deltanet_rule_step)(eng_backend *b, void *o, float *state, const void *u, const void *a, const void *bb,
                               const void *A_log, const void *dt_bias, const int *srow, int T, int Hk, int Hv, int Dk, int Dv);
    void (*gated_attn_qk_fwd)(eng_backend *b, void *q, void *k, float *rstdq, float *rstdk, const void *qg, const void *k0,
                              const void *wq, const void *wk, const int *pos, const float *inv_freq, int T, int H, int K, int D,
                              int R, float eps);
    void (*gated_attn_qk_bwd)(eng_backend *b, void *dqg, void *dk0, float *dwq, float *dwk, const void *dq, const void *dk,
                              const void *qg, const void *k0, const void *wq, const void *wk, const float *rstdq,
                              const float *rstdk, const int *pos, const float *inv_freq, int T, int H, int K, int D, int R);
    void (*gated_attn_gate_fwd)(eng_backend *b, void *y, const void *att, const void *qg, int T, int H, int D);
    void (*gated_attn_gate_bwd)(eng_backend *b, void *datt, void *dqg, const void *dy, const void *att, const void *qg, int T,
                                int H, int D);
    void (*lm_head_rows)(eng_backend *b, float *logits, const void *h, const int *pos, const void *w, int R, int C, int V);
    /* one token per row of logits (R, V) and its logprob (kernels/sampling.h): per-row params
     * p (R); ban: ban[0] = n, then n ids (NULL: none); allow (M, W): the rows' allow masks (NULL:
     * none) */
    void (*sample)(eng_backend *b, int *tok, float *logprob, const float *logits, const sample_params *p, const int *ban,
                   const uint32_t *allow, int R, int V);

    /* optimizer on fp32 master weights; writes the act copy (NULL when the master is the act copy) */
    void (*adamw)(eng_backend *b, float *master, void *act_copy, const float *g, float *m, float *v, long long n, float lr,
                  float beta1, float beta2, float eps, float wd, int step);
    double (*sumsq)(eng_backend *b, const float *x, long long n); /* synchronous */
    void (*scale)(eng_backend *b, float *x, long long n, float s);
};

/* Constructors. backend_cpu_create never fails; backend_cuda_create returns GE_CUDA / GE_UNSUPPORTED
 * with a message when no GPU (or a build without CUDA). */
int backend_cpu_create(eng_backend **out, int n_threads);
int backend_cuda_create(eng_backend **out, int device);
/* 1 when a CUDA device is usable (always 0 in a CPU-only build). */
int backend_cuda_available(void);
int backend_cuda_device_count(void); /* 0 likewise */
/* The tuning knobs from the GRPOD_TUNE_* environment over tune_defaults() (engine/backend/tune.c);
 * GE_INVALID naming the variable for an unknown knob or a bad value. */
int tune_from_env(tune_opts *t);
#endif
