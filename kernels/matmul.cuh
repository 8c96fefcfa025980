/* matmul.cuh — the CUDA launchers of matmul.cu: cuBLASLt (bf16 in, fp32 accumulate) and the
 * few-row (decode) kernel, for the linear layers and the MLP's gate/up side with SwiGLU
 * (mlp_in_fwd). Legend: T rows, I/O in/out features, F MLP dim.
 * Same arguments as the matmul.h reference with a `_cuda` suffix and a cu_ctx first; bf16 where the
 * CPU has fp32 activations/weights. Launchers enqueue on ctx->stream and never block. */
#ifndef GRPOD_KERNELS_MATMUL_CUH
#define GRPOD_KERNELS_MATMUL_CUH
#include "kernels/common.cuh"
#include "kernels/matmul.h"

/* gemm_lt is the general call the logprob head uses too: column-major D (m,n) = alpha op(A)
 * op(B) + beta C, C == D, optional bf16 bias (m). */
void gemm_lt(cu_ctx *c, int transa, int transb, int m, int n, int k, float alpha, const void *A, int lda, const void *B, int ldb,
             float beta, void *D, int ldd, int d_is_f32, const bf16 *bias);
void gemm_cache_free(cu_ctx *c); /* at context destruction */
/* the context's cublasHandle_t (created at the first call) on its stream; NULL when failed */
void *gemm_blas(cu_ctx *c);
void matmul_fwd_cuda(cu_ctx *c, bf16 *out, const bf16 *inp, const bf16 *w, const bf16 *bias, int T, int I, int O);
/* the RMSNorm in front of matmul_fwd_n_cuda / mlp_in_fwd_cuda: weight (I), eps, ln (T, I) scratch */
typedef struct {
    const bf16 *w;
    float eps;
    bf16 *ln;
} cu_norm;
/* a low-rank term of one output (LoRA): + (inp a^T) b^T, a (r, I), b (O, r), inp the normed
 * input; inp a^T is written to u (T, r); a NULL: none */
typedef struct {
    const bf16 *a, *b;
    bf16 *u;
    int r;
} cu_lowrank;
/* out[i] = inp · w[i]^T + bias[i] (+ res[i]) (+ lr[i]'s term; lr NULL: none) for n <= 3 layers
 * sharing inp: one launch, the terms' first halves included, when the few-row kernel takes them
 * all. */
void matmul_fwd_n_cuda(cu_ctx *c, bf16 *const *out, const bf16 *const *w, const bf16 *const *bias, const bf16 *const *res,
                       const int *O, int n, const bf16 *inp, const cu_norm *norm, int T, int I, const cu_lowrank *lr);
/* exact mode's many-row GEMM (matmul_exact.cu): out (T,O) = inp W^T + bias + res (NULL: none)
 * in the few-row kernel's reduction order (matmul_order.cuh); I a multiple of 64, 16-byte
 * aligned inp and W */
void exact_mm_cuda(cu_ctx *c, bf16 *out, const bf16 *inp, const bf16 *w, const bf16 *bias, const bf16 *res, int T, int I, int O);
/* exact mode's GEMM for decode's rows (matmul_exact_few.cu): out[i] (T,O[i]) = inp w[i]^T + bias[i]
 * (+ res[i]) for n <= XF_PARTS weights (bias, res NULL or arrays of n, entries NULL: none), each
 * weight read once; 0 when the shape is not its (T > 256, I not a multiple of 64) */
enum { XF_PARTS = 3 };
int exact_few_cuda(cu_ctx *c, int n, bf16 *const *out, const bf16 *const *w, const bf16 *const *bias, const bf16 *const *res,
                   const int *O, const bf16 *inp, int T, int I);
void matmul_bwd_cuda(cu_ctx *c, bf16 *dinp, float *dw, float *dbias, const bf16 *dout, const bf16 *inp, const bf16 *w, int T,
                     int I, int O);
void mlp_in_fwd_cuda(cu_ctx *c, bf16 *act, bf16 *g, bf16 *u, const bf16 *inp, const cu_norm *norm, const bf16 *wg, const bf16 *wu,
                     int T, int I, int F, const cu_lowrank *lr);
#endif
