/* backend_cuda.cu — the `cuda` backend: the launchers of kernels/NAME.cu behind the backend table
 * (backend.h). Activations and weights are bf16 ("act"), master weights, gradients, moments and
 * per-row statistics fp32. All work is queued on one stream owned by the engine thread.
 *
 * Memory: alloc is cudaMalloc (weights at load, activations at plan time, nothing per step;
 * the kernels' scratch grows once to its largest size). Out of device memory is GE_NOMEM with
 * the free/total bytes in the message, never a crash.
 * Errors: every CUDA / cuBLAS call goes through kernels/common.cuh's check macros, which keep
 * the first failure (call text, error string, file:line) in the context; ops after a failure
 * are skipped, and sync() returns GE_CUDA with that message. A failed backend stays failed. */
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "common/err.h"
#include "engine/backend/backend.h"
#include "engine/backend/host_pages.h"
}
#include <cublas_v2.h>

#include "kernels/adamw.cuh"
#include "kernels/attention.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/deltanet.cuh"
#include "kernels/deltanet_decode.cuh"
#include "kernels/embedding.cuh"
#include "kernels/gemm_grouped.cuh"
#include "kernels/gated_attn.cuh"
#include "kernels/logprob.cuh"
#include "kernels/matmul.cuh"
#include "kernels/moe.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "kernels/sampling.cuh"
#include "kernels/moe_shared.cuh"
#include "kernels/swiglu.cuh"

#define CTX(b) ((cu_ctx *)(b)->impl)
/* backend_cuda_xfer.cu: copy lanes, events, mem_info */
int cu_xfer_init(eng_backend *b);
void cu_xfer_free(eng_backend *b);
typedef const bf16 cbf;

/* ---------------------------------------------------------------- memory and copies */

static void *cu_alloc(eng_backend *b, size_t n) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, n ? n : 256);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is not sticky: clear it */
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        err_set(e == cudaErrorMemoryAllocation ? GE_NOMEM : GE_CUDA, "cuda: cannot allocate %.1f MiB (%s; %.1f of %.1f MiB free)",
                n / 1048576.0, cudaGetErrorString(e), fr / 1048576.0, tot / 1048576.0);
        return NULL;
    }
    return p;
}
static void cu_free_(eng_backend *b, void *p) {
    if (!p) return;
    CU_CK(CTX(b), cudaStreamSynchronize(CTX(b)->stream));
    CU_CK(CTX(b), cudaFree(p));
}
static void cu_zero(eng_backend *b, void *p, size_t n) {
    if (!CTX(b)->failed && n) CU_CK(CTX(b), cudaMemsetAsync(p, 0, n, CTX(b)->stream));
}
static int cu_status(eng_backend *b) { return CTX(b)->failed ? err_set(GE_CUDA, "cuda backend failed: %s", CTX(b)->msg) : 0; }
static long long cu_mem_free(eng_backend *b) {
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) return (long long)fr;
    cudaGetLastError(); /* not sticky: the caller falls back to its own default */
    return -1;
}
static void cu_copy(eng_backend *b, void *d, const void *s, size_t n) {
    if (!CTX(b)->failed && n) CU_CK(CTX(b), cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToDevice, CTX(b)->stream));
}
static int cu_to_dev(eng_backend *b, void *d, const void *s, size_t n) {
    cu_ctx *c = CTX(b);
    if (!c->failed && n) CU_CK(c, cudaMemcpyAsync(d, s, n, cudaMemcpyHostToDevice, c->stream));
    if (!c->failed && n) CU_CK(c, cudaStreamSynchronize(c->stream)); /* the caller may reuse s at once */
    return cu_status(b);
}
static int cu_to_host(eng_backend *b, void *d, const void *s, size_t n) {
    cu_ctx *c = CTX(b);
    if (!c->failed && n) CU_CK(c, cudaMemcpyAsync(d, s, n, cudaMemcpyDeviceToHost, c->stream));
    if (!c->failed) CU_CK(c, cudaStreamSynchronize(c->stream));
    return cu_status(b);
}
/* fp32 host values to bf16 on the device: uploaded in chunks through a device staging buffer
 * and rounded there (the same round-to-nearest-even as on the host), so the host does not
 * convert value by value (8 G values a copy of the weights at Qwen3-8B dims). */
static int cu_act_from(eng_backend *b, void *d, const float *s, size_t n) {
    cu_ctx *c = CTX(b);
    size_t chunk = n < ((size_t)16 << 20) ? n : ((size_t)16 << 20);
    float *stage = NULL;
    if (!chunk) return 0;
    if (cudaMalloc(&stage, chunk * sizeof(float)) != cudaSuccess) {
        cudaGetLastError();
        return err_set(GE_NOMEM, "cuda: no device memory to stage %zu values", chunk);
    }
    for (size_t off = 0; off < n && !c->failed; off += chunk) {
        size_t k = n - off < chunk ? n - off : chunk;
        CU_CK(c, cudaMemcpyAsync(stage, s + off, k * sizeof(float), cudaMemcpyHostToDevice, c->stream));
        f32_to_bf16_cuda(c, (bf16 *)d + off, stage, (long long)k);
    }
    if (!c->failed) CU_CK(c, cudaStreamSynchronize(c->stream));
    cudaFree(stage);
    return cu_status(b);
}
static int cu_act_to(eng_backend *b, float *d, const void *s, size_t n) {
    bf16 *h = (bf16 *)malloc(n * sizeof(bf16) + 1);
    if (!h) return err_set(GE_NOMEM, "cuda: no host memory to convert %zu values", n);
    int rc = cu_to_host(b, h, s, n * sizeof(bf16));
    if (!rc)
        for (size_t i = 0; i < n; i++) d[i] = __bfloat162float(h[i]);
    free(h);
    return rc;
}
static void cu_f32_to_act(eng_backend *b, void *d, const float *s, size_t n) {
    f32_to_bf16_cuda(CTX(b), (bf16 *)d, s, (long long)n);
}
static int cu_sync(eng_backend *b) {
    cu_ctx *c = CTX(b);
    if (!c->failed) CU_CK(c, cudaStreamSynchronize(c->stream));
    return cu_status(b);
}
static void cu_destroy(eng_backend *b) {
    if (!b) return;
    cu_ctx *c = CTX(b);
    cu_xfer_free(b);
    if (c) {
        if (c->stream) cudaStreamSynchronize(c->stream);
        if (c->scratch) cudaFree(c->scratch);
        if (c->lt_ws) cudaFree(c->lt_ws);
        if (c->red) cudaFree(c->red);
        if (c->sk_sync) cudaFree(c->sk_sync);
        gemm_cache_free(c);
        gemm_grouped_free(c);
        if (c->lt) cublasLtDestroy(c->lt);
        if (c->blas) cublasDestroy((cublasHandle_t)c->blas);
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c);
    }
    free(b);
}

/* ---------------------------------------------------------------- ops */

static void cu_embedding_fwd(eng_backend *b, void *o, const int *t, const void *w, int T, int C) {
    embedding_fwd_cuda(CTX(b), (bf16 *)o, t, (cbf *)w, T, C);
}
static void cu_embedding_bwd(eng_backend *b, float *dw, const void *d, const int *t, int T, int C) {
    embedding_bwd_cuda(CTX(b), dw, (cbf *)d, t, T, C);
}
static void cu_rmsnorm_fwd(eng_backend *b, void *o, float *r, const void *x, const void *w, int T, int C, float eps) {
    rmsnorm_fwd_cuda(CTX(b), (bf16 *)o, r, (cbf *)x, (cbf *)w, T, C, eps);
}
static void cu_rmsnorm_bwd(eng_backend *b, void *dx, float *dw, const void *dy, const void *x, const void *w, const float *r,
                           int T, int C) {
    rmsnorm_bwd_cuda(CTX(b), (bf16 *)dx, dw, (cbf *)dy, (cbf *)x, (cbf *)w, r, T, C);
}
static void cu_matmul_fwd(eng_backend *b, void *o, const void *x, const void *w, const void *bias, int T, int I, int O) {
    matmul_fwd_cuda(CTX(b), (bf16 *)o, (cbf *)x, (cbf *)w, (cbf *)bias, T, I, O);
}
/* three parts a call to matmul_fwd_n_cuda (more than the op promises still work) */
static void cu_matmul_fwd_n(eng_backend *b, const mm_part *p, int n, const void *x, const mm_norm *nm, int T, int I) {
    cu_norm cn = {nm ? (cbf *)nm->w : NULL, nm ? nm->eps : 0.0f, nm ? (bf16 *)nm->ln : NULL};
    for (int i0 = 0; i0 < n; i0 += 3) {
        bf16 *o[3];
        cbf *w[3], *bias[3], *res[3];
        cu_lowrank lr[3];
        int O[3], m = n - i0 < 3 ? n - i0 : 3, any = 0;
        for (int i = 0; i < m; i++) {
            const mm_part *q = &p[i0 + i];
            o[i] = (bf16 *)q->out;
            w[i] = (cbf *)q->w;
            bias[i] = (cbf *)q->bias;
            res[i] = (cbf *)q->res;
            O[i] = q->O;
            lr[i] = (cu_lowrank){(cbf *)q->lr.a, (cbf *)q->lr.b, (bf16 *)q->lr.u, q->lr.r};
            any |= q->lr.a != NULL;
        }
        matmul_fwd_n_cuda(CTX(b), o, w, bias, res, O, m, (cbf *)x, nm ? &cn : NULL, T, I, any ? lr : NULL);
    }
}
static void cu_matmul_bwd(eng_backend *b, void *dx, float *dw, float *db, const void *dy, const void *x, const void *w, int T,
                          int I, int O) {
    matmul_bwd_cuda(CTX(b), (bf16 *)dx, dw, db, (cbf *)dy, (cbf *)x, (cbf *)w, T, I, O);
}
static void cu_rope_fwd(eng_backend *b, void *x, const int *p, const float *f, int T, int H, int D) {
    rope_fwd_cuda(CTX(b), (bf16 *)x, p, f, T, H, D);
}
static void cu_rope_bwd(eng_backend *b, void *x, const int *p, const float *f, int T, int H, int D) {
    rope_bwd_cuda(CTX(b), (bf16 *)x, p, f, T, H, D);
}
static void cu_attention_fwd(eng_backend *b, void *o, float *lse, const void *q, const void *k, const void *v, attn_ranges r,
                             int T, int H, int K, int D) {
    attention_fwd_cuda(CTX(b), (bf16 *)o, lse, (cbf *)q, (cbf *)k, (cbf *)v, r, T, H, K, D);
}
static void cu_attention_bwd(eng_backend *b, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                             const void *v, const void *out, const float *lse, attn_ranges r, int T, int S, int H, int K, int D) {
    attention_bwd_cuda(CTX(b), (bf16 *)dq, (bf16 *)dk, (bf16 *)dv, (cbf *)dout, (cbf *)q, (cbf *)k, (cbf *)v, (cbf *)out, lse, r,
                       T, S, H, K, D);
}
static void cu_moe_router_fwd(eng_backend *b, float *p, int *ti, float *tw, float *st, const void *x, const void *wr,
                              const int *given, const int *cnt, int T, int C, int E, int k, int norm) {
    moe_router_fwd_cuda(CTX(b), p, ti, tw, st, (cbf *)x, (cbf *)wr, given, cnt, T, C, E, k, norm);
}
static void cu_moe_experts_fwd(eng_backend *b, void *o, void *eg, void *eu, void *ey, const void *x, const void *res,
                               const int *ti, const float *tw, const void *wg, const void *wu, const void *wd, int T, int C,
                               int E, int k, int Fm, const moe_lora *lr) {
    moe_experts_fwd_cuda(CTX(b), (bf16 *)o, (bf16 *)eg, (bf16 *)eu, (bf16 *)ey, (cbf *)x, (cbf *)res, ti, tw, (cbf *)wg,
                         (cbf *)wu, (cbf *)wd, T, C, E, k, Fm, lr);
}
static void cu_moe_combine_rows(eng_backend *b, void *o, void *ey, const void *rows, const int *inv, const void *res,
                                const float *tw, int T, int C, int k) {
    if (T > 0) moe_combine_cuda(CTX(b), (bf16 *)o, (cbf *)res, (bf16 *)ey, (cbf *)rows, inv, tw, T, C, k);
}
static void cu_moe_dtopw(eng_backend *b, float *dtw, const void *dy, const void *ey, int T, int C, int k) {
    if (T > 0) moe_dtopw_cuda(CTX(b), dtw, (cbf *)dy, (cbf *)ey, T * k, C, k);
}
static void cu_moe_experts_bwd(eng_backend *b, void *dx, float *dwg, float *dwu, float *dwd, float *dtw, void *dg, void *du,
                               const void *dy, const void *x, const int *ti, const float *tw, const void *eg, const void *eu,
                               const void *ey, const void *wg, const void *wu, const void *wd, int T, int C, int E, int k, int Fm,
                               const moe_lora *lr) {
    moe_experts_bwd_cuda(CTX(b), (bf16 *)dx, dwg, dwu, dwd, dtw, (bf16 *)dg, (bf16 *)du, (cbf *)dy, (cbf *)x, ti, tw, (cbf *)eg,
                         (cbf *)eu, (cbf *)ey, (cbf *)wg, (cbf *)wu, (cbf *)wd, T, C, E, k, Fm, lr);
}
static void cu_moe_router_bwd(eng_backend *b, void *dx, float *dwr, float *dl, const float *dtw, const float *p, const int *ti,
                              const void *x, const void *wr, const float *ag, const int *cnt, int T, int C, int E, int k, int norm) {
    moe_router_bwd_cuda(CTX(b), (bf16 *)dx, dwr, dl, dtw, p, ti, (cbf *)x, (cbf *)wr, ag, cnt, T, C, E, k, norm);
}
static void cu_moe_shared_gate_fwd(eng_backend *b, void *o, const void *y, const void *z, int T, int C) {
    moe_shared_gate_fwd_cuda(CTX(b), (bf16 *)o, (cbf *)y, (cbf *)z, T, C);
}
static void cu_moe_shared_gate_bwd(eng_backend *b, void *y, void *z, const void *dy, int T, int C) {
    moe_shared_gate_bwd_cuda(CTX(b), (bf16 *)y, (bf16 *)z, (cbf *)dy, T, C);
}
static void cu_deltanet_conv_fwd(eng_backend *b, void *u, const void *x, const void *w, attn_ranges r, const deltanet_carry *cy,
                                 int T, int Cc, int Kc) {
    deltanet_conv_fwd_cuda(CTX(b), (bf16 *)u, (cbf *)x, (cbf *)w, r, cy, T, Cc, Kc);
}
static void cu_deltanet_conv_bwd(eng_backend *b, void *dx, float *dw, const void *du, const void *x, const void *w, attn_ranges r,
                                 const deltanet_carry *cy, int T, int Cc, int Kc) {
    deltanet_conv_bwd_cuda(CTX(b), (bf16 *)dx, dw, (cbf *)du, (cbf *)x, (cbf *)w, r, cy, T, Cc, Kc);
}
static void cu_deltanet_scratch(eng_backend *b, long long *st, long long *dst, int T, int Hk, int Hv, int Dk, int Dv) {
    deltanet_scratch_cuda(st, dst, T, Hk, Hv, Dk, Dv);
}
static void cu_deltanet_rule_fwd(eng_backend *b, void *o, float *st, const void *u, const void *a, const void *bb, const void *al,
                                 const void *dt, attn_ranges r, const deltanet_carry *cy, int T, int Hk, int Hv, int Dk, int Dv) {
    deltanet_rule_fwd_cuda(CTX(b), (bf16 *)o, st, (cbf *)u, (cbf *)a, (cbf *)bb, (cbf *)al, (cbf *)dt, r, cy, T, Hk, Hv, Dk, Dv);
}
static void cu_deltanet_rule_bwd(eng_backend *b, void *du, void *da, void *db, float *dal, float *ddt, float *st, float *dst,
                                 const void *dy, const void *u, const void *a, const void *bb, const void *al, const void *dt,
                                 attn_ranges r, const deltanet_carry *cy, int T, int Hk, int Hv, int Dk, int Dv) {
    deltanet_rule_bwd_cuda(CTX(b), (bf16 *)du, (bf16 *)da, (bf16 *)db, dal, ddt, st, dst, (cbf *)dy, (cbf *)u, (cbf *)a,
                           (cbf *)bb, (cbf *)al, (cbf *)dt, r, cy, T, Hk, Hv, Dk, Dv);
}
static void cu_deltanet_norm_fwd(eng_backend *b, void *y, float *rs, const void *o, const void *z, const void *w, int T, int Hv,
                                 int Dv, float eps) {
    deltanet_norm_fwd_cuda(CTX(b), (bf16 *)y, rs, (cbf *)o, (cbf *)z, (cbf *)w, T, Hv, Dv, eps);
}
static void cu_deltanet_norm_bwd(eng_backend *b, void *dout, void *dz, float *dw, const void *dy, const void *o, const void *z,
                                 const void *w, const float *rs, int T, int Hv, int Dv) {
    deltanet_norm_bwd_cuda(CTX(b), (bf16 *)dout, (bf16 *)dz, dw, (cbf *)dy, (cbf *)o, (cbf *)z, (cbf *)w, rs, T, Hv, Dv);
}
static void cu_deltanet_conv_step(eng_backend *b, void *u, float *tail, const void *x, const void *w, const int *srow, int T,
                                  int Cc, int Kc) {
    deltanet_conv_step_cuda(CTX(b), (bf16 *)u, tail, (cbf *)x, (cbf *)w, srow, T, Cc, Kc);
}
static void cu_deltanet_rule_step(eng_backend *b, void *o, float *st, const void *u, const void *a, const void *bb,
                                  const void *al, const void *dt, const int *srow, int T, int Hk, int Hv, int Dk, int Dv) {
    deltanet_rule_step_cuda(CTX(b), (bf16 *)o, st, (cbf *)u, (cbf *)a, (cbf *)bb, (cbf *)al, (cbf *)dt, srow, T, Hk, Hv, Dk, Dv);
}
static void cu_gated_attn_qk_fwd(eng_backend *b, void *q, void *k, float *rq, float *rk, const void *qg, const void *k0,
                                 const void *wq, const void *wk, const int *pos, const float *f, int T, int H, int K, int D,
                                 int R, float eps) {
    gated_attn_qk_fwd_cuda(CTX(b), (bf16 *)q, (bf16 *)k, rq, rk, (cbf *)qg, (cbf *)k0, (cbf *)wq, (cbf *)wk, pos, f, T, H, K, D,
                           R, eps);
}
static void cu_gated_attn_qk_bwd(eng_backend *b, void *dqg, void *dk0, float *dwq, float *dwk, const void *dq, const void *dk,
                                 const void *qg, const void *k0, const void *wq, const void *wk, const float *rq, const float *rk,
                                 const int *pos, const float *f, int T, int H, int K, int D, int R) {
    gated_attn_qk_bwd_cuda(CTX(b), (bf16 *)dqg, (bf16 *)dk0, dwq, dwk, (cbf *)dq, (cbf *)dk, (cbf *)qg, (cbf *)k0, (cbf *)wq,
                           (cbf *)wk, rq, rk, pos, f, T, H, K, D, R);
}
static void cu_gated_attn_gate_fwd(eng_backend *b, void *y, const void *att, const void *qg, int T, int H, int D) {
    gated_attn_gate_fwd_cuda(CTX(b), (bf16 *)y, (cbf *)att, (cbf *)qg, T, H, D);
}
static void cu_gated_attn_gate_bwd(eng_backend *b, void *datt, void *dqg, const void *dy, const void *att, const void *qg, int T,
                                   int H, int D) {
    gated_attn_gate_bwd_cuda(CTX(b), (bf16 *)datt, (bf16 *)dqg, (cbf *)dy, (cbf *)att, (cbf *)qg, T, H, D);
}
static void cu_swiglu_fwd(eng_backend *b, void *o, const void *g, const void *u, long long n) {
    swiglu_fwd_cuda(CTX(b), (bf16 *)o, (cbf *)g, (cbf *)u, n);
}
static void cu_mlp_in_fwd(eng_backend *b, void *a, void *g, void *u, const void *x, const mm_norm *nm, const void *wg,
                          const void *wu, int T, int I, int F, const mm_lowrank *lr) {
    cu_norm cn = {nm ? (cbf *)nm->w : NULL, nm ? nm->eps : 0.0f, nm ? (bf16 *)nm->ln : NULL};
    cu_lowrank cl[2];
    for (int i = 0; lr && i < 2; i++) cl[i] = (cu_lowrank){(cbf *)lr[i].a, (cbf *)lr[i].b, (bf16 *)lr[i].u, lr[i].r};
    mlp_in_fwd_cuda(CTX(b), (bf16 *)a, (bf16 *)g, (bf16 *)u, (cbf *)x, nm ? &cn : NULL, (cbf *)wg, (cbf *)wu, T, I, F,
                    lr ? cl : NULL);
}
static void cu_swiglu_bwd(eng_backend *b, void *dg, void *du, const void *dy, const void *g, const void *u, long long n) {
    swiglu_bwd_cuda(CTX(b), (bf16 *)dg, (bf16 *)du, (cbf *)dy, (cbf *)g, (cbf *)u, n);
}
static void cu_acc_f32(eng_backend *b, float *acc, const void *x, long long n) { acc_f32_cuda(CTX(b), acc, (cbf *)x, n); }
static void cu_scatter_rows(eng_backend *b, void *dst, const void *src, const int *slot, int T, int row) {
    scatter_rows_cuda(CTX(b), (bf16 *)dst, (cbf *)src, slot, T, row);
}
static void cu_gather_rows(eng_backend *b, void *dst, const void *src, const int *idx, int n, int row) {
    gather_rows_cuda(CTX(b), (bf16 *)dst, (cbf *)src, idx, n, row);
}
static void cu_add(eng_backend *b, void *o, const void *x, const void *y, long long n) {
    add_cuda(CTX(b), (bf16 *)o, (cbf *)x, (cbf *)y, n);
}
static void cu_qkv_rope_fwd(eng_backend *b, const qkv_rope_io *io, const int *p, const float *f, int T, int H, int K, int D,
                            float eps) {
    qkv_rope_fwd_cuda(CTX(b), io, p, f, T, H, K, D, eps);
}
static void cu_qk_norm_rope_bwd(eng_backend *b, void *dx, float *dw, const void *dy, const void *x, const void *w, const float *r,
                                const int *p, const float *f, int T, int H, int D) {
    qk_norm_rope_bwd_cuda(CTX(b), (bf16 *)dx, dw, (cbf *)dy, (cbf *)x, (cbf *)w, r, p, f, T, H, D);
}
static void cu_logprob_fwd(eng_backend *b, float *lp, float *ent, const void *h, const int *op, const int *ot, const void *w,
                           int M, int C, int V, float t) {
    logprob_fwd_cuda(CTX(b), lp, ent, (cbf *)h, op, ot, (cbf *)w, M, C, V, t);
}
static void cu_logprob_top(eng_backend *b, int *ids, float *lps, const void *h, const int *op, const void *w, int M, int C, int V,
                           float t, int K) {
    logprob_top_cuda(CTX(b), ids, lps, (cbf *)h, op, (cbf *)w, M, C, V, t, K);
}
static void cu_logprob_bwd(eng_backend *b, void *dh, float *dw, const float *dlp, const float *dent, const void *h, const int *op,
                           const int *ot, const void *w, int M, int C, int V, float t) {
    logprob_bwd_cuda(CTX(b), (bf16 *)dh, dw, dlp, dent, (cbf *)h, op, ot, (cbf *)w, M, C, V, t);
}
static void cu_lm_head_rows(eng_backend *b, float *lg, const void *h, const int *pos, const void *w, int R, int C, int V) {
    lm_head_rows_cuda(CTX(b), lg, (cbf *)h, pos, (cbf *)w, R, C, V);
}
static void cu_sample(eng_backend *b, int *tok, float *lp, const float *lg, const sample_params *p, const int *ban,
                      const uint32_t *allow, int R, int V) {
    sample_cuda(CTX(b), tok, lp, lg, p, ban, allow, R, V);
}

/* ---------------------------------------------------------------- pinned copies and graphs */

/* Pinned host memory: pages made present by all cores, then registered (host_pages.h). */
static void *cu_host_alloc(eng_backend *b, size_t n) {
    if (!n) n = 256;
    void *p = host_pages_map(n);
    if (!p) return NULL;
    if (cudaHostRegister(p, n, cudaHostRegisterDefault) != cudaSuccess) {
        cudaGetLastError();
        host_pages_unmap(p);
        err_set(GE_NOMEM, "cuda: cannot pin %zu bytes of host memory", n);
        return NULL;
    }
    return p;
}
static void cu_host_free(eng_backend *b, void *p) {
    if (!p) return;
    CU_CK(CTX(b), cudaStreamSynchronize(CTX(b)->stream));
    CU_CK(CTX(b), cudaHostUnregister(p));
    host_pages_unmap(p);
}
static int cu_to_dev_async(eng_backend *b, void *d, const void *s, size_t n) {
    cu_ctx *c = CTX(b);
    if (!c->failed && n) CU_CK(c, cudaMemcpyAsync(d, s, n, cudaMemcpyHostToDevice, c->stream));
    return cu_status(b);
}
typedef struct {
    cudaGraphExec_t exec;
    void *scratch;
} cu_graph;
static int cu_graph_begin(eng_backend *b) {
    cu_ctx *c = CTX(b);
    if (!c->failed) CU_CK(c, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    return cu_status(b);
}
static int cu_graph_end(eng_backend *b, void **out) {
    cu_ctx *c = CTX(b);
    cudaGraph_t g = NULL;
    *out = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g); /* always: the stream leaves capture mode */
    if (e != cudaSuccess) cu_fail(c, "cudaStreamEndCapture", cudaGetErrorString(e), __FILE__, __LINE__);
    cu_graph *cg = (cu_graph *)calloc(1, sizeof *cg);
    if (!c->failed && !cg) cu_fail(c, "calloc(cu_graph)", "out of host memory", __FILE__, __LINE__);
    if (!c->failed) CU_CK(c, cudaGraphInstantiate(&cg->exec, g, 0));
    if (g) cudaGraphDestroy(g);
    if (c->failed) {
        free(cg);
        return cu_status(b);
    }
    cg->scratch = c->scratch;
    *out = cg;
    return 0;
}
static int cu_graph_launch(eng_backend *b, void *gp) {
    cu_ctx *c = CTX(b);
    cu_graph *g = (cu_graph *)gp;
    if (c->failed) return cu_status(b);
    if (g->scratch != c->scratch) return 1;
    CU_CK(c, cudaGraphLaunch(g->exec, c->stream));
    return cu_status(b);
}
static void cu_graph_free(eng_backend *b, void *gp) {
    cu_graph *g = (cu_graph *)gp;
    if (!g) return;
    if (g->exec) cudaGraphExecDestroy(g->exec);
    free(g);
}
static void cu_adamw(eng_backend *b, float *p, void *act, const float *g, float *m, float *v, long long n, float lr, float b1,
                     float b2, float eps, float wd, int step) {
    adamw_cuda(CTX(b), p, (bf16 *)act, g, m, v, n, lr, b1, b2, eps, wd, step);
}
static double cu_sumsq(eng_backend *b, const float *x, long long n) { return sumsq_cuda(CTX(b), x, n); }
static void cu_scale(eng_backend *b, float *x, long long n, float s) { scale_cuda(CTX(b), x, n, s); }

/* ---------------------------------------------------------------- construction */

extern "C" int backend_cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n > 0;
}

extern "C" int backend_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

extern "C" int backend_cuda_create(eng_backend **out, int device) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        cudaGetLastError();
        return err_set(GE_CUDA, "cuda: no usable GPU (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    }
    if (device < 0 || device >= n) return err_set(GE_CUDA, "cuda: device %d does not exist (%d devices)", device, n);
    eng_backend *b = (eng_backend *)calloc(1, sizeof *b);
    cu_ctx *c = (cu_ctx *)calloc(1, sizeof *c);
    if (!b || !c) {
        free(b);
        free(c);
        return err_set(GE_NOMEM, "cuda backend: out of host memory");
    }
    b->impl = c;
    int rc = tune_from_env(&b->tune);
    if (rc) {
        free(b);
        free(c);
        return rc;
    }
    c->tune = &b->tune;
    CU_CK(c, cudaSetDevice(device));
    CU_CK(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    LT_CK(c, cublasLtCreate(&c->lt));
    c->lt_ws_bytes = 32u << 20;
    CU_CK(c, cudaMalloc(&c->lt_ws, c->lt_ws_bytes));
    if (!c->failed) CU_CK(c, cudaMemset(c->lt_ws, 0, c->lt_ws_bytes)); /* every process starts from the same workspace */
    CU_CK(c, cudaMalloc(&c->red, CU_RED_SLOTS * sizeof(double)));
    CU_CK(c, cudaMalloc(&c->sk_sync, 2 * sizeof(unsigned)));
    if (!c->failed) CU_CK(c, cudaMemset(c->sk_sync, 0, 2 * sizeof(unsigned)));
    CU_CK(c, cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, device));
    if (!c->failed) cu_xfer_init(b);
    if (c->failed) {
        rc = err_set(GE_CUDA, "cuda backend: %s", c->msg);
        cu_destroy(b);
        return rc;
    }
    b->name = "cuda";
    b->act_bytes = 2;
    b->alloc = cu_alloc;
    b->free = cu_free_;
    b->zero = cu_zero;
    b->copy = cu_copy;
    b->to_dev = cu_to_dev;
    b->to_host = cu_to_host;
    b->act_from_f32 = cu_act_from;
    b->act_to_f32 = cu_act_to;
    b->f32_to_act = cu_f32_to_act;
    b->sync = cu_sync;
    b->mem_free = cu_mem_free;
    b->destroy = cu_destroy;
    b->embedding_fwd = cu_embedding_fwd;
    b->embedding_bwd = cu_embedding_bwd;
    b->rmsnorm_fwd = cu_rmsnorm_fwd;
    b->rmsnorm_bwd = cu_rmsnorm_bwd;
    b->matmul_fwd = cu_matmul_fwd;
    b->matmul_fwd_n = cu_matmul_fwd_n;
    b->matmul_bwd = cu_matmul_bwd;
    b->rope_fwd = cu_rope_fwd;
    b->rope_bwd = cu_rope_bwd;
    b->attention_fwd = cu_attention_fwd;
    b->attention_bwd = cu_attention_bwd;
    b->swiglu_fwd = cu_swiglu_fwd;
    b->mlp_in_fwd = cu_mlp_in_fwd;
    b->swiglu_bwd = cu_swiglu_bwd;
    b->qkv_rope_fwd = cu_qkv_rope_fwd;
    b->qk_norm_rope_bwd = cu_qk_norm_rope_bwd;
    b->add = cu_add;
    b->acc_f32 = cu_acc_f32;
    b->scatter_rows = cu_scatter_rows;
    b->gather_rows = cu_gather_rows;
    b->logprob_fwd = cu_logprob_fwd;
    b->logprob_top = cu_logprob_top;
    b->logprob_bwd = cu_logprob_bwd;
    b->moe_router_fwd = cu_moe_router_fwd;
    b->moe_experts_fwd = cu_moe_experts_fwd;
    b->moe_combine_rows = cu_moe_combine_rows;
    b->moe_dtopw = cu_moe_dtopw;
    b->moe_experts_bwd = cu_moe_experts_bwd;
    b->moe_router_bwd = cu_moe_router_bwd;
    b->moe_shared_gate_fwd = cu_moe_shared_gate_fwd;
    b->moe_shared_gate_bwd = cu_moe_shared_gate_bwd;
    b->deltanet_conv_fwd = cu_deltanet_conv_fwd;
    b->deltanet_conv_bwd = cu_deltanet_conv_bwd;
    b->deltanet_scratch = cu_deltanet_scratch;
    b->deltanet_rule_fwd = cu_deltanet_rule_fwd;
    b->deltanet_rule_bwd = cu_deltanet_rule_bwd;
    b->deltanet_norm_fwd = cu_deltanet_norm_fwd;
    b->deltanet_norm_bwd = cu_deltanet_norm_bwd;
    b->deltanet_conv_step = cu_deltanet_conv_step;
    b->deltanet_rule_step = cu_deltanet_rule_step;
    b->gated_attn_qk_fwd = cu_gated_attn_qk_fwd;
    b->gated_attn_qk_bwd = cu_gated_attn_qk_bwd;
    b->gated_attn_gate_fwd = cu_gated_attn_gate_fwd;
    b->gated_attn_gate_bwd = cu_gated_attn_gate_bwd;
    b->max_head_dim = ATTN_MAX_HEAD_DIM; /* kernels/attention.cuh */
    b->lm_head_rows = cu_lm_head_rows;
    b->sample = cu_sample;
    b->host_alloc = cu_host_alloc;
    b->host_free = cu_host_free;
    b->to_dev_async = cu_to_dev_async;
    b->graph_begin = cu_graph_begin;
    b->graph_end = cu_graph_end;
    b->graph_launch = cu_graph_launch;
    b->graph_free = cu_graph_free;
    b->adamw = cu_adamw;
    b->sumsq = cu_sumsq;
    b->scale = cu_scale;
    *out = b;
    return 0;
}
