/* cuda_ops.cuh — the CUDA launchers of every op family (kernels/NAME.cu), one prototype per
 * kernels/NAME.h function: same arguments, `_cuda` suffix, a cu_ctx instead of nothing, bf16
 * where the CPU has fp32 activations/weights, fp32 where the backend table says float *.
 * Semantics (including "+=" outputs) are those of the *_cpu reference. Launchers enqueue on
 * ctx->stream and never block, except sumsq_cuda which returns a host value.
 * Legend: T tokens/rows, S key rows, C width, H/K query/kv heads, D head dim, F MLP dim,
 * V vocab, M predicted tokens, I/O matmul in/out features, R rows of full logits. */
#ifndef GRPOD_KERNELS_CUDA_OPS_CUH
#define GRPOD_KERNELS_CUDA_OPS_CUH
#include "kernels/attention.h"
#include "kernels/common.cuh"
#include "kernels/rmsnorm.h"
#include "kernels/sampling.h"

/* embedding.cu */
void embedding_fwd_cuda(cu_ctx *c, bf16 *out, const int *tokens, const bf16 *wte, int T, int C);
void embedding_bwd_cuda(cu_ctx *c, float *dwte, const bf16 *dout, const int *tokens, int T, int C);

/* rmsnorm.cu */
void rmsnorm_fwd_cuda(cu_ctx *c, bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int T, int C, float eps);
void rmsnorm_bwd_cuda(cu_ctx *c, bf16 *dinp, float *dw, const bf16 *dout, const bf16 *inp, const bf16 *w,
                      const float *rstd, int T, int C);
void qkv_rope_fwd_cuda(cu_ctx *c, const qkv_rope_io *io, const int *pos, const float *inv_freq, int T, int H, int K,
                       int D, float eps);
void qk_norm_rope_bwd_cuda(cu_ctx *c, bf16 *dinp, float *dw, const bf16 *dout, const bf16 *inp, const bf16 *w,
                           const float *rstd, const int *pos, const float *inv_freq, int T, int H, int D);

/* matmul.cu: cuBLASLt, bf16 in, fp32 accumulate. gemm_lt is the general call the logprob head
 * uses too: column-major D (m,n) = alpha op(A) op(B) + beta C, C == D, optional bf16 bias (m). */
void gemm_lt(cu_ctx *c, int transa, int transb, int m, int n, int k, float alpha, const void *A, int lda,
             const void *B, int ldb, float beta, void *D, int ldd, int d_is_f32, const bf16 *bias);
void gemm_cache_free(cu_ctx *c);   /* at context destruction */
void matmul_fwd_cuda(cu_ctx *c, bf16 *out, const bf16 *inp, const bf16 *w, const bf16 *bias, int T, int I, int O);
/* out[i] = inp · w[i]^T + bias[i] for n layers sharing inp: one launch when the few-row kernel
 * takes them all. */
/* the RMSNorm in front of matmul_fwd_n_cuda / mlp_in_fwd_cuda: weight (C), eps, ln (T, C) scratch */
typedef struct { const bf16 *w; float eps; bf16 *ln; } cu_norm;
/* a low-rank term of one output (LoRA): + u (T, r) · b^T, b (O, r); u NULL: none */
typedef struct { const bf16 *u, *b; int r; } cu_lowrank;
void matmul_fwd_n_cuda(cu_ctx *c, bf16 *const *out, const bf16 *const *w, const bf16 *const *bias,
                       const bf16 *const *res, const int *O, int n, const bf16 *inp, const cu_norm *norm, int T, int I,
                       const cu_lowrank *lr);
void matmul_bwd_cuda(cu_ctx *c, bf16 *dinp, float *dw, float *dbias, const bf16 *dout, const bf16 *inp,
                     const bf16 *w, int T, int I, int O);

/* rope.cu */
void rope_fwd_cuda(cu_ctx *c, bf16 *x, const int *pos, const float *inv_freq, int T, int H, int D);
void rope_bwd_cuda(cu_ctx *c, bf16 *dx, const int *pos, const float *inv_freq, int T, int H, int D);

/* attention.cu: D even, <= 128. Backward assumes S == T (training: keys are the tokens). The
 * ranges must not be written by the kernel launched just before the forward: at decode sizes
 * it reads them before its dependent-launch wait (they come from host uploads). */
void attention_fwd_cuda(cu_ctx *c, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                        attn_ranges r, int T, int H, int K, int D);
void attention_bwd_cuda(cu_ctx *c, bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q, const bf16 *k,
                        const bf16 *v, const bf16 *out, const float *lse, attn_ranges r, int T, int H, int K, int D);

/* swiglu.cu (also the elementwise add, conversions and row scatter the backend table needs) */
void mlp_in_fwd_cuda(cu_ctx *c, bf16 *act, bf16 *g, bf16 *u, const bf16 *inp, const cu_norm *norm, const bf16 *wg,
                     const bf16 *wu, int T, int I, int F);
void swiglu_fwd_cuda(cu_ctx *c, bf16 *out, const bf16 *gate, const bf16 *up, long long n);
void swiglu_bwd_cuda(cu_ctx *c, bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up,
                     long long n);
void add_cuda(cu_ctx *c, bf16 *out, const bf16 *x, const bf16 *y, long long n);
void f32_to_bf16_cuda(cu_ctx *c, bf16 *dst, const float *src, long long n);
void scatter_rows_cuda(cu_ctx *c, bf16 *dst, const bf16 *src, const int *slot, int T, int row);

/* logprob.cu: token chunks of LOGPROB_CHUNK rows; never [M x V] at once. */
enum { LOGPROB_CHUNK = 256 };
void logprob_fwd_cuda(cu_ctx *c, float *logp, float *ent, const bf16 *h, const int *out_pos, const int *out_tok,
                      const bf16 *w, int M, int C, int V, float temperature);
void logprob_bwd_cuda(cu_ctx *c, bf16 *dh, float *dw, const float *dlogp, const float *dent, const bf16 *h,
                      const int *out_pos, const int *out_tok, const bf16 *w, int M, int C, int V, float temperature);
void lm_head_rows_cuda(cu_ctx *c, float *logits, const bf16 *h, const int *pos, const bf16 *w, int R, int C, int V);

/* sampling.cu */
void sample_cuda(cu_ctx *c, int *tok, float *logprob, const float *logits, const sample_params *p, const int *ban, int R,
                 int V);

/* adamw.cu: AdamW (PyTorch's decoupled weight decay) on the fp32 master; writes act_copy
 * (bf16) when not NULL. sumsq blocks and returns sum(x^2) in double. */
void adamw_cuda(cu_ctx *c, float *master, bf16 *act_copy, const float *g, float *m, float *v, long long n,
                float lr, float beta1, float beta2, float eps, float wd, int step);
double sumsq_cuda(cu_ctx *c, const float *x, long long n);
void scale_cuda(cu_ctx *c, float *x, long long n, float s);
#endif
