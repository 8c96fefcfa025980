/* backend_cpu.c — the `cpu` backend: the fp32 reference ops of kernels/NAME_cpu.c behind the
 * backend table. Memory is the host's; activations and weights are fp32, so the "act" copies
 * are memcpy and the AdamW master is the weight itself. Never fails after creation. */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/backend/backend.h"
#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/deltanet.h"
#include "kernels/deltanet_decode.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gated_attn.h"
#include "kernels/logprob.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/sampling.h"
#include "kernels/moe_shared.h"
#include "kernels/swiglu.h"

static void *cpu_alloc(eng_backend *b, size_t n) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64)) {
        err_set(GE_NOMEM, "cpu: cannot allocate %zu bytes", n);
        return NULL;
    }
    return p;
}
static void cpu_free(eng_backend *b, void *p) { free(p); }
static void cpu_zero(eng_backend *b, void *p, size_t n) { memset(p, 0, n); }
static void cpu_d2d(eng_backend *b, void *d, const void *s, size_t n) { memcpy(d, s, n); }
static int cpu_copy(eng_backend *b, void *d, const void *s, size_t n) {
    memmove(d, s, n);
    return 0;
}
static int cpu_act_from(eng_backend *b, void *d, const float *s, size_t n) {
    memmove(d, s, n * 4);
    return 0;
}
static int cpu_act_to(eng_backend *b, float *d, const void *s, size_t n) {
    memmove(d, s, n * 4);
    return 0;
}
static void cpu_f32_to_act(eng_backend *b, void *d, const float *s, size_t n) { memmove(d, s, n * 4); }
static int cpu_sync(eng_backend *b) { return 0; }
static void cpu_destroy(eng_backend *b) { free(b); }

static void cpu_embedding_fwd(eng_backend *b, void *o, const int *t, const void *w, int T, int C) {
    embedding_fwd_cpu(o, t, w, T, C);
}
static void cpu_embedding_bwd(eng_backend *b, float *dw, const void *d, const int *t, int T, int C) {
    embedding_bwd_cpu(dw, d, t, T, C);
}
static void cpu_rmsnorm_fwd(eng_backend *b, void *o, float *r, const void *x, const void *w, int T, int C, float eps) {
    rmsnorm_fwd_cpu(o, r, x, w, T, C, eps);
}
static void cpu_rmsnorm_bwd(eng_backend *b, void *dx, float *dw, const void *dy, const void *x, const void *w, const float *r,
                            int T, int C) {
    rmsnorm_bwd_cpu(dx, dw, dy, x, w, r, T, C);
}
static void cpu_matmul_fwd(eng_backend *b, void *o, const void *x, const void *w, const void *bias, int T, int I, int O) {
    matmul_fwd_cpu(o, x, w, bias, T, I, O);
}
/* the optional norm in front, then each part and its residual */
static const void *normed(const mm_norm *nm, const void *x, int T, int I) {
    if (!nm) return x;
    rmsnorm_fwd_cpu(nm->ln, NULL, x, nm->w, T, I, nm->eps);
    return nm->ln;
}
static void cpu_matmul_fwd_n(eng_backend *b, const mm_part *p, int n, const void *x, const mm_norm *nm, int T, int I) {
    x = normed(nm, x, T, I);
    for (int i = 0; i < n; i++) {
        matmul_fwd_cpu(p[i].out, x, p[i].w, p[i].bias, T, I, p[i].O);
        if (p[i].lr.a) {
            matmul_fwd_cpu(p[i].lr.u, x, p[i].lr.a, NULL, T, I, p[i].lr.r);
            float *o = p[i].out;
            const float *u = p[i].lr.u, *bw = p[i].lr.b;
            int O = p[i].O, r = p[i].lr.r;
#pragma omp parallel for schedule(static)
            for (long long j = 0; j < (long long)T * O; j++) {
                const float *ut = u + (j / O) * r, *bo = bw + (j % O) * r;
                float s = 0;
                for (int k = 0; k < r; k++) s += ut[k] * bo[k];
                o[j] += s;
            }
        }
        if (p[i].res) {
            float *o = p[i].out;
            const float *r = p[i].res;
            long long m = (long long)T * p[i].O;
#pragma omp parallel for schedule(static)
            for (long long j = 0; j < m; j++) o[j] += r[j];
        }
    }
}
static void cpu_matmul_bwd(eng_backend *b, void *dx, float *dw, float *db, const void *dy, const void *x, const void *w, int T,
                           int I, int O) {
    matmul_bwd_cpu(dx, dw, db, dy, x, w, T, I, O);
}
static void cpu_rope_fwd(eng_backend *b, void *x, const int *p, const float *f, int T, int H, int D) {
    rope_fwd_cpu(x, p, f, T, H, D);
}
static void cpu_rope_bwd(eng_backend *b, void *x, const int *p, const float *f, int T, int H, int D) {
    rope_bwd_cpu(x, p, f, T, H, D);
}
static void cpu_attention_fwd(eng_backend *b, void *o, float *lse, const void *q, const void *k, const void *v, attn_ranges r,
                              int T, int H, int K, int D) {
    attention_fwd_cpu(o, lse, q, k, v, r, T, H, K, D);
}
static void cpu_attention_bwd(eng_backend *b, void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                              const void *v, const void *out, const float *lse, attn_ranges r, int T, int S, int H, int K, int D) {
    attention_bwd_cpu(dq, dk, dv, dout, q, k, v, out, lse, r, T, H, K, D);
}
static void cpu_swiglu_fwd(eng_backend *b, void *o, const void *g, const void *u, long long n) { swiglu_fwd_cpu(o, g, u, n); }
static void cpu_mlp_in_fwd(eng_backend *b, void *a, void *g, void *u, const void *x, const mm_norm *nm, const void *wg,
                           const void *wu, int T, int I, int F, const mm_lowrank *lr) {
    if (!lr) {
        mlp_in_fwd_cpu(a, g, u, normed(nm, x, T, I), wg, wu, T, I, F);
        return;
    }
    mm_part p[2] = {{g, wg, NULL, F, NULL, lr[0]}, {u, wu, NULL, F, NULL, lr[1]}};
    cpu_matmul_fwd_n(b, p, 2, x, nm, T, I);
    swiglu_fwd_cpu(a, g, u, (long long)T * F);
}
static void cpu_swiglu_bwd(eng_backend *b, void *dg, void *du, const void *dy, const void *g, const void *u, long long n) {
    swiglu_bwd_cpu(dg, du, dy, g, u, n);
}
static void cpu_acc_f32(eng_backend *b, float *acc, const void *x, long long n) { acc_f32_cpu(acc, x, n); }
static void cpu_add(eng_backend *b, void *o, const void *x, const void *y, long long n) { add_cpu(o, x, y, n); }
static void cpu_scatter_rows(eng_backend *b, void *dst, const void *src, const int *slot, int T, int row) {
    scatter_rows_cpu(dst, src, slot, T, row);
}
static void cpu_gather_rows(eng_backend *b, void *dst, const void *src, const int *idx, int n, int row) {
    gather_rows_cpu(dst, src, idx, n, row);
}
static void cpu_qkv_rope_fwd(eng_backend *b, const qkv_rope_io *io, const int *p, const float *f, int T, int H, int K, int D,
                             float eps) {
    qkv_rope_fwd_cpu(io, p, f, T, H, K, D, eps);
}
static void cpu_qk_norm_rope_bwd(eng_backend *b, void *dx, float *dw, const void *dy, const void *x, const void *w,
                                 const float *r, const int *p, const float *f, int T, int H, int D) {
    qk_norm_rope_bwd_cpu(dx, dw, dy, x, w, r, p, f, T, H, D);
}
static void cpu_logprob_fwd(eng_backend *b, float *lp, float *ent, const void *h, const int *op, const int *ot, const void *w,
                            int M, int C, int V, float t) {
    logprob_fwd_cpu(lp, ent, h, op, ot, w, M, C, V, t);
}
static void cpu_logprob_top(eng_backend *b, int *ids, float *lps, const void *h, const int *op, const void *w, int M, int C,
                            int V, float t, int K) {
    logprob_top_cpu(ids, lps, h, op, w, M, C, V, t, K);
}
static void cpu_logprob_bwd(eng_backend *b, void *dh, float *dw, const float *dlp, const float *dent, const void *h,
                            const int *op, const int *ot, const void *w, int M, int C, int V, float t) {
    logprob_bwd_cpu(dh, dw, dlp, dent, h, op, ot, w, M, C, V, t);
}
static void cpu_moe_router_fwd(eng_backend *b, float *p, int *ti, float *tw, float *st, const void *x, const void *wr,
                               const int *given, const int *cnt, int T, int C, int E, int k, int norm) {
    moe_router_fwd_cpu(p, ti, tw, st, x, wr, given, cnt, T, C, E, k, norm);
}
static void cpu_moe_experts_fwd(eng_backend *b, void *o, void *eg, void *eu, void *ey, const void *x, const void *res,
                                const int *ti, const float *tw, const void *wg, const void *wu, const void *wd, int T, int C,
                                int E, int k, int Fm, const moe_lora *lr) {
    moe_experts_fwd_cpu(o, eg, eu, ey, x, res, ti, tw, wg, wu, wd, T, C, E, k, Fm, lr);
}
static void cpu_moe_experts_bwd(eng_backend *b, void *dx, float *dwg, float *dwu, float *dwd, float *dtw, void *dg, void *du,
                                const void *dy, const void *x, const int *ti, const float *tw, const void *eg, const void *eu,
                                const void *ey, const void *wg, const void *wu, const void *wd, int T, int C, int E, int k,
                                int Fm, const moe_lora *lr) {
    moe_experts_bwd_cpu(dx, dwg, dwu, dwd, dtw, dg, du, dy, x, ti, tw, eg, eu, ey, wg, wu, wd, T, C, E, k, Fm, lr);
}
static void cpu_moe_combine_rows(eng_backend *b, void *o, void *ey, const void *rows, const int *inv, const void *res,
                                 const float *tw, int T, int C, int k) {
    moe_combine_rows_cpu(o, ey, rows, inv, res, tw, T, C, k);
}
static void cpu_moe_dtopw(eng_backend *b, float *dtw, const void *dy, const void *ey, int T, int C, int k) {
    moe_dtopw_cpu(dtw, dy, ey, T, C, k);
}
static void cpu_moe_router_bwd(eng_backend *b, void *dx, float *dwr, float *dl, const float *dtw, const float *p, const int *ti,
                               const void *x, const void *wr, const float *ag, const int *cnt, int T, int C, int E, int k,
                               int norm) {
    moe_router_bwd_cpu(dx, dwr, dl, dtw, p, ti, x, wr, ag, cnt, T, C, E, k, norm);
}
static void cpu_moe_shared_gate_fwd(eng_backend *b, void *o, const void *y, const void *z, int T, int C) {
    moe_shared_gate_fwd_cpu(o, y, z, T, C);
}
static void cpu_moe_shared_gate_bwd(eng_backend *b, void *y, void *z, const void *dy, int T, int C) {
    moe_shared_gate_bwd_cpu(y, z, dy, T, C);
}
static void cpu_deltanet_conv_fwd(eng_backend *b, void *u, const void *x, const void *w, attn_ranges r, const deltanet_carry *cy,
                                  int T, int Cc, int Kc) {
    deltanet_conv_fwd_cpu(u, x, w, r, cy, T, Cc, Kc);
}
static void cpu_deltanet_conv_bwd(eng_backend *b, void *dx, float *dw, const void *du, const void *x, const void *w,
                                  attn_ranges r, const deltanet_carry *cy, int T, int Cc, int Kc) {
    deltanet_conv_bwd_cpu(dx, dw, du, x, w, r, cy, T, Cc, Kc);
}
static void cpu_deltanet_scratch(eng_backend *b, long long *st, long long *dst, int T, int Hk, int Hv, int Dk, int Dv) {
    *st = *dst = (long long)T * Hv * Dk * Dv;
}
static void cpu_deltanet_rule_fwd(eng_backend *b, void *o, float *st, const void *u, const void *a, const void *bb, const void *al,
                                  const void *dt, attn_ranges r, const deltanet_carry *cy, int T, int Hk, int Hv, int Dk, int Dv) {
    deltanet_rule_fwd_cpu(o, st, u, a, bb, al, dt, r, cy, T, Hk, Hv, Dk, Dv);
}
static void cpu_deltanet_rule_bwd(eng_backend *b, void *du, void *da, void *db, float *dal, float *ddt, float *st, float *dst,
                                  const void *dy, const void *u, const void *a, const void *bb, const void *al, const void *dt,
                                  attn_ranges r, const deltanet_carry *cy, int T, int Hk, int Hv, int Dk, int Dv) {
    deltanet_rule_bwd_cpu(du, da, db, dal, ddt, st, dst, dy, u, a, bb, al, dt, r, cy, T, Hk, Hv, Dk, Dv);
}
static void cpu_deltanet_norm_fwd(eng_backend *b, void *y, float *rs, const void *o, const void *z, const void *w, int T, int Hv,
                                  int Dv, float eps) {
    deltanet_norm_fwd_cpu(y, rs, o, z, w, T, Hv, Dv, eps);
}
static void cpu_deltanet_norm_bwd(eng_backend *b, void *dout, void *dz, float *dw, const void *dy, const void *o, const void *z,
                                  const void *w, const float *rs, int T, int Hv, int Dv) {
    deltanet_norm_bwd_cpu(dout, dz, dw, dy, o, z, w, rs, T, Hv, Dv);
}
static void cpu_deltanet_conv_step(eng_backend *b, void *u, float *tail, const void *x, const void *w, const int *srow, int T,
                                   int Cc, int Kc) {
    deltanet_conv_step_cpu(u, tail, x, w, srow, T, Cc, Kc);
}
static void cpu_deltanet_rule_step(eng_backend *b, void *o, float *st, const void *u, const void *a, const void *bb,
                                   const void *al, const void *dt, const int *srow, int T, int Hk, int Hv, int Dk, int Dv) {
    deltanet_rule_step_cpu(o, st, u, a, bb, al, dt, srow, T, Hk, Hv, Dk, Dv);
}
static void cpu_gated_attn_qk_fwd(eng_backend *b, void *q, void *k, float *rq, float *rk, const void *qg, const void *k0,
                                  const void *wq, const void *wk, const int *pos, const float *f, int T, int H, int K, int D,
                                  int R, float eps) {
    gated_attn_qk_fwd_cpu(q, k, rq, rk, qg, k0, wq, wk, pos, f, T, H, K, D, R, eps);
}
static void cpu_gated_attn_qk_bwd(eng_backend *b, void *dqg, void *dk0, float *dwq, float *dwk, const void *dq, const void *dk,
                                  const void *qg, const void *k0, const void *wq, const void *wk, const float *rq,
                                  const float *rk, const int *pos, const float *f, int T, int H, int K, int D, int R) {
    gated_attn_qk_bwd_cpu(dqg, dk0, dwq, dwk, dq, dk, qg, k0, wq, wk, rq, rk, pos, f, T, H, K, D, R);
}
static void cpu_gated_attn_gate_fwd(eng_backend *b, void *y, const void *att, const void *qg, int T, int H, int D) {
    gated_attn_gate_fwd_cpu(y, att, qg, T, H, D);
}
static void cpu_gated_attn_gate_bwd(eng_backend *b, void *datt, void *dqg, const void *dy, const void *att, const void *qg, int T,
                                    int H, int D) {
    gated_attn_gate_bwd_cpu(datt, dqg, dy, att, qg, T, H, D);
}
static void cpu_lm_head_rows(eng_backend *b, float *lg, const void *h, const int *pos, const void *w, int R, int C, int V) {
    lm_head_rows_cpu(lg, h, pos, w, R, C, V);
}
static void cpu_sample(eng_backend *b, int *tok, float *lp, const float *lg, const sample_params *p, const int *ban,
                       const uint32_t *allow, int R, int V) {
    sample_cpu(tok, lp, lg, p, ban, allow, R, V);
}
static void cpu_adamw(eng_backend *b, float *p, void *act, const float *g, float *m, float *v, long long n, float lr, float b1,
                      float b2, float eps, float wd, int step) {
    adamw_cpu(p, g, m, v, n, lr, b1, b2, eps, wd, step);
    if (act && act != p) memcpy(act, p, (size_t)n * 4);
}
static double cpu_sumsq(eng_backend *b, const float *x, long long n) { return sumsq_cpu(x, n); }
static void cpu_scale(eng_backend *b, float *x, long long n, float s) { scale_cpu(x, n, s); }

int backend_cpu_create(eng_backend **out, int n_threads) {
    eng_backend *b = calloc(1, sizeof *b);
    if (!b) return err_set(GE_NOMEM, "cpu backend: out of memory");
    if (n_threads > 0) omp_set_num_threads(n_threads);
    *b = (eng_backend){
        .name = "cpu",
        .act_bytes = 4,
        .tune = tune_defaults(),
        .alloc = cpu_alloc,
        .free = cpu_free,
        .zero = cpu_zero,
        .copy = cpu_d2d,
        .to_dev = cpu_copy,
        .to_host = cpu_copy,
        .act_from_f32 = cpu_act_from,
        .act_to_f32 = cpu_act_to,
        .f32_to_act = cpu_f32_to_act,
        .sync = cpu_sync,
        .destroy = cpu_destroy,
        .embedding_fwd = cpu_embedding_fwd,
        .embedding_bwd = cpu_embedding_bwd,
        .rmsnorm_fwd = cpu_rmsnorm_fwd,
        .rmsnorm_bwd = cpu_rmsnorm_bwd,
        .matmul_fwd = cpu_matmul_fwd,
        .matmul_fwd_n = cpu_matmul_fwd_n,
        .matmul_bwd = cpu_matmul_bwd,
        .rope_fwd = cpu_rope_fwd,
        .rope_bwd = cpu_rope_bwd,
        .attention_fwd = cpu_attention_fwd,
        .attention_bwd = cpu_attention_bwd,
        .swiglu_fwd = cpu_swiglu_fwd,
        .mlp_in_fwd = cpu_mlp_in_fwd,
        .swiglu_bwd = cpu_swiglu_bwd,
        .qkv_rope_fwd = cpu_qkv_rope_fwd,
        .qk_norm_rope_bwd = cpu_qk_norm_rope_bwd,
        .add = cpu_add,
        .acc_f32 = cpu_acc_f32,
        .scatter_rows = cpu_scatter_rows,
        .gather_rows = cpu_gather_rows,
        .logprob_fwd = cpu_logprob_fwd,
        .logprob_top = cpu_logprob_top,
        .logprob_bwd = cpu_logprob_bwd,
        .moe_router_fwd = cpu_moe_router_fwd,
        .moe_experts_fwd = cpu_moe_experts_fwd,
        .moe_combine_rows = cpu_moe_combine_rows,
        .moe_dtopw = cpu_moe_dtopw,
        .moe_experts_bwd = cpu_moe_experts_bwd,
        .moe_router_bwd = cpu_moe_router_bwd,
        .moe_shared_gate_fwd = cpu_moe_shared_gate_fwd,
        .moe_shared_gate_bwd = cpu_moe_shared_gate_bwd,
        .deltanet_conv_fwd = cpu_deltanet_conv_fwd,
        .deltanet_conv_bwd = cpu_deltanet_conv_bwd,
        .deltanet_scratch = cpu_deltanet_scratch,
        .deltanet_rule_fwd = cpu_deltanet_rule_fwd,
        .deltanet_rule_bwd = cpu_deltanet_rule_bwd,
        .deltanet_norm_fwd = cpu_deltanet_norm_fwd,
        .deltanet_norm_bwd = cpu_deltanet_norm_bwd,
        .deltanet_conv_step = cpu_deltanet_conv_step,
        .deltanet_rule_step = cpu_deltanet_rule_step,
        .gated_attn_qk_fwd = cpu_gated_attn_qk_fwd,
        .gated_attn_qk_bwd = cpu_gated_attn_qk_bwd,
        .gated_attn_gate_fwd = cpu_gated_attn_gate_fwd,
        .gated_attn_gate_bwd = cpu_gated_attn_gate_bwd,
        .lm_head_rows = cpu_lm_head_rows,
        .sample = cpu_sample,
        .adamw = cpu_adamw,
        .sumsq = cpu_sumsq,
        .scale = cpu_scale,
    };
    *out = b;
    return 0;
}

#ifndef GRPOD_CUDA
int backend_cuda_create(eng_backend **out, int device) {
    *out = NULL;
    return err_set(GE_UNSUPPORTED, "this grpod was built without CUDA (nvcc was not found at build time)");
}
int backend_cuda_available(void) { return 0; }
int backend_cuda_device_count(void) { return 0; }
#endif
