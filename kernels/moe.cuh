/* moe.cuh — the CUDA launchers of moe.cu. Legend as moe.h (T, C, E, k, Fm).
 * Same arguments as the moe.h reference with a `_cuda` suffix and a cu_ctx first; bf16 where the
 * CPU has fp32 activations/weights (probs, topw, dtopw, dlogit, stats and the weight
 * gradients stay fp32). Launchers enqueue on ctx->stream and never block: the expert
 * permutation is built on the device (moe.cu), so the calls can be captured in a graph. They
 * use ctx->scratch: the experts' T·k slot indices, and in the backward T·k·C fp32 more; with
 * adapters (lr, moe.h; NULL: none) T·k·max(rg, rd) fp32 more forward, T·k·2(rg + rd) backward. */
#ifndef GRPOD_KERNELS_MOE_CUH
#define GRPOD_KERNELS_MOE_CUH
#include "kernels/common.cuh"
#include "kernels/moe.h"

/* moe_lora.cu: the experts' adapters. A row source (moe_lora.cu lora_src) and an expert's matrix
 * addressed by strides, M_e[j, i] = p[e·es + j·js + i·is]. */
typedef struct {
    const void *p, *p2; /* p2: the u rows when swiglu */
    const float *topw; /* non-NULL: each value times topw[ts] */
    int ld, by_token, f32, swiglu; /* row ts/k of (T, ld), else row ts of (S, ld); fp32 or bf16; silu(p)·p2 */
} moe_lora_src;
typedef struct {
    const bf16 *p;
    size_t es, js, is;
} moe_lora_mat;
void moe_lora_dot_cuda(cu_ctx *c, float *out, moe_lora_src a, moe_lora_mat ma, moe_lora_src b, moe_lora_mat mb, const int *topi,
                       int S, int k, int r, int I);
void moe_lora_add_cuda(cu_ctx *c, void *dst, int f32, int ld, const float *h, moe_lora_mat m, const int *topi, int S, int O, int r);
void moe_lora_wgrad_cuda(cu_ctx *c, float *dw, size_t es, moe_lora_src u, moe_lora_src v, const int *cnt, int E, int k, int M,
                         int N);

void moe_router_fwd_cuda(cu_ctx *c, float *probs, int *topi, float *topw, float *stats, const bf16 *x, const bf16 *wr,
                         const int *given, const int *count, int T, int C, int E, int k, int norm);
void moe_experts_fwd_cuda(cu_ctx *c, bf16 *out, bf16 *eg, bf16 *eu, bf16 *ey, const bf16 *x, const bf16 *res, const int *topi,
                          const float *topw, const bf16 *wg, const bf16 *wu, const bf16 *wd, int T, int C, int E, int k, int Fm,
                          const moe_lora *lr);
void moe_experts_bwd_cuda(cu_ctx *c, bf16 *dx, float *dwg, float *dwu, float *dwd, float *dtopw, bf16 *dg, bf16 *du,
                          const bf16 *dout, const bf16 *x, const int *topi, const float *topw, const bf16 *eg, const bf16 *eu,
                          const bf16 *ey, const bf16 *wg, const bf16 *wu, const bf16 *wd, int T, int C, int E, int k, int Fm,
                          const moe_lora *lr);
void moe_router_bwd_cuda(cu_ctx *c, bf16 *dx, float *dwr, float *dlogit, const float *dtopw, const float *probs, const int *topi,
                         const bf16 *x, const bf16 *wr, const float *aux_g, const int *count, int T, int C, int E, int k, int norm);

/* ---- between the moe*.cu files: the experts' variants (moe.cu picks one, kernels/tune.h) and
 * the pieces they share. S = T·k slots. */
enum { MOE_FEW_T = 512 }; /* auto: the few-slot kernels up to this many tokens (decode.c's graphs hold at most 512) */
/* cnt (E), off (E+1), toff (E+1), perm (S) at scratch (moe_perm_bytes of it): each expert's slots
 * in slot order; returns cnt */
const int *moe_perm_cuda(cu_ctx *c, const int *topi, int S, int E, void *scratch);
size_t moe_perm_bytes(int S, int E);
/* out = res + Σ_s w y (out NULL: none), y the slot's ey row, or eyp's row inv[ts] copied to ey */
void moe_combine_cuda(cu_ctx *c, bf16 *out, const bf16 *res, bf16 *ey, const bf16 *eyp, const int *inv, const float *topw, int T,
                      int C, int k);
void moe_dx_cuda(cu_ctx *c, bf16 *dx, const float *part, const int *inv, int T, int C, int k); /* dx += Σ_s part */
void moe_dtopw_cuda(cu_ctx *c, float *dtopw, const bf16 *dout, const bf16 *ey, int S, int C, int k);
/* moe_few.cu: a weight stream per routed expert (decode; no host involved) */
void moe_experts_fwd_few(cu_ctx *c, bf16 *out, bf16 *eg, bf16 *eu, bf16 *ey, const bf16 *x, const bf16 *res, const int *topi,
                         const float *topw, const bf16 *wg, const bf16 *wu, const bf16 *wd, int T, int C, int E, int k, int Fm);
/* moe_gemm.cu: rows gathered by expert, grouped GEMMs (the counts read on the host); the
 * adapters (lr, NULL: none) on gemm_grouped.cu where moe_lora_grouped_fits */
void moe_experts_fwd_grouped(cu_ctx *c, bf16 *out, bf16 *eg, bf16 *eu, bf16 *ey, const bf16 *x, const bf16 *res, const int *topi,
                             const float *topw, const bf16 *wg, const bf16 *wu, const bf16 *wd, int T, int C, int E, int k,
                             int Fm, const moe_lora *lr);
void moe_experts_bwd_grouped(cu_ctx *c, bf16 *dx, float *dwg, float *dwu, float *dwd, float *dtopw, bf16 *dg, bf16 *du,
                             const bf16 *dout, const bf16 *x, const int *topi, const float *topw, const bf16 *eg, const bf16 *eu,
                             const bf16 *ey, const bf16 *wg, const bf16 *wu, const bf16 *wd, int T, int C, int E, int k, int Fm,
                             const moe_lora *lr);
/* 1 when the adapters' GEMMs fit gemm_grouped.cu (C, Fm and the ranks multiples of 8) */
int moe_lora_grouped_fits(int C, int Fm, const moe_lora *lr);
#endif
