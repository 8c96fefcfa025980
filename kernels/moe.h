/* moe.h — the mixture-of-experts MLP of Qwen3-MoE, as transformers computes it
 * (Qwen3MoeSparseMoeBlock, Qwen3MoeTopKRouter, Qwen3MoeExperts):
 *
 *   p   = softmax(x Wr^T)                  in fp32, (T, E)
 *   i_s = the top_k experts of p           largest first; equal probabilities: lower index first
 *                                          (or the given experts: routing replay, below)
 *   w_s = p[i_s]                           divided by Σ_s p[i_s] when norm (norm_topk_prob)
 *   y_s = (silu(x Wg_i^T) * (x Wu_i^T)) Wd_i^T
 *   out = res + Σ_s w_s y_s
 *
 * The backward differentiates out through y (the experts' weights and x) and through w (the
 * router's weights and x, via the renormalisation and the softmax); the choice of i is not
 * differentiated, as autograd does not differentiate topk's indices. The balance loss
 * (transformers' load_balancing_loss_func) is built from the statistics moe_router_fwd_cpu
 * sums, and its gradient enters moe_router_bwd_cpu as a per-expert term on p.
 *
 * Routing replay (R3): with given routes the router still computes p but takes i from them (the
 * experts a rollout's sampler chose) instead of its own top-k; w is read from p at those experts,
 * so the router is trained through the replayed experts' weights. Given the routes the top-k
 * would choose, the results are the same bits as without them. The backward is the same op.
 *
 * Every token carries a count (NULL: 1 each): how many logical tokens it stands for in the
 * balance statistics. A packed prompt token shared by N responses counts N (engine/model/pack.h),
 * so the statistics of [P; R_1..R_N] are those of the N sequences [P; R_i].
 *
 * LoRA on the experts (moe_lora, NULL: none), as PEFT's ParamWrapper adapts transformers 5's fused
 * gate_up_proj (E, 2Fm, C) and down_proj (E, C, Fm): per expert e, one adapter on gate and up
 * together, rank rg, and one on down, rank rd:
 *   h_s = x A_e^T                           (rg)  A = agu (E, rg, C)
 *   g_s += h_s Bg_e^T,  u_s += h_s Bu_e^T         B = bgu (E, 2Fm, rg): gate rows, then up rows
 *   y_s += (a_s Ad_e^T) Bd_e^T                    Ad = ad (E, rd, Fm), Bd = bd (E, C, rd)
 * with the LoRA scale already in B (engine/model/lora.h: B' = s B). The backward adds the
 * adapters' gradients (fp32, NULL: none), each expert's summed over its tokens in token order.
 *
 * Legend: T tokens, C model dim, E experts, k experts per token (top_k), Fm expert MLP dim, rg
 * and rd the adapters' ranks. Expert weights are stacked: wg, wu (E, Fm, C), wd (E, C, Fm), each
 * expert's (out, in) as nn.Linear stores it. */
#ifndef GRPOD_MOE_H
#define GRPOD_MOE_H

/* Statistics of the balance loss, summed by every MoE layer of a forward: stats (MOE_STATS(E)) */
#define MOE_STATS(E) (2 * (E) + 1)
/* stats[e] += Σ_t count_t · [e ∈ i_t]; stats[E + e] += Σ_t count_t · p_te; stats[2E] += Σ_t count_t */

/* The experts' adapters: weights act-typed (NULL pair: that adapter absent), gradients fp32 */
typedef struct {
    const void *agu, *bgu; /* (E,rg,C), (E,2Fm,rg) */
    const void *ad, *bd; /* (E,rd,Fm), (E,C,rd) */
    int rg, rd;
    float *gagu, *gbgu, *gad, *gbd; /* += d A, d B' (backward only; NULL: not wanted) */
} moe_lora;

void moe_router_fwd_cpu(float *probs, int *topi, float *topw, float *stats, const float *x, const float *wr, const int *given,
                        const int *count, int T, int C, int E, int k, int norm);
/* probs (T,E), topi (T,k), topw (T,k) written; x (T,C), wr (E,C); stats NULL: none summed;
 * given (T,k) distinct experts in [0, E) per token (may be topi itself), copied to topi in
 * place of the top-k; a token whose first is -1 takes its top-k (given NULL: every token) */

void moe_experts_fwd_cpu(float *out, float *eg, float *eu, float *ey, const float *x, const float *res, const int *topi,
                         const float *topw, const float *wg, const float *wu, const float *wd, int T, int C, int E, int k, int Fm,
                         const moe_lora *lr);
/* eg, eu (T,k,Fm) each slot's gate and up projections, ey (T,k,C) its expert's output (before w)
 * written; out (T,C) = res + Σ_s w_s ey_s (out NULL: not combined; res NULL: 0) */

void moe_combine_cpu(float *out, const float *ey, const float *res, const float *topw, int T, int C, int k);
/* out (T,C) = res + Σ_s w_s ey_s, the slots in order (res NULL: 0): moe_experts_fwd_cpu's last
 * step, alone for a caller whose ey came from elsewhere (engine/model/moe_ep.c) */

void moe_combine_rows_cpu(float *out, float *ey, const float *rows, const int *inv, const float *res, const float *topw, int T,
                          int C, int k);
/* ey (T,k,C) rows ts = rows' rows inv[ts], then out (T,C) = res + Σ_s w_s ey_s as moe_combine_cpu
 * (out NULL: the copy alone): the answers of expert parallelism's ranks put back in slot order */

void moe_dtopw_cpu(float *dtopw, const float *dout, const float *ey, int T, int C, int k);
/* dtopw (T,k) = dout_t · ey_ts: the routing weights' gradient, as moe_experts_bwd_cpu sums it */

void moe_experts_bwd_cpu(float *dx, float *dwg, float *dwu, float *dwd, float *dtopw, float *dg, float *du, const float *dout,
                         const float *x, const int *topi, const float *topw, const float *eg, const float *eu, const float *ey,
                         const float *wg, const float *wu, const float *wd, int T, int C, int E, int k, int Fm, const moe_lora *lr);
/* dout (T,C): d out. dx (T,C) += through the experts; dwg, dwu, dwd += (NULL: frozen); dtopw
 * (T,k) written: dout_t · ey_ts; dg, du (T,k,Fm) scratch (written). Each expert's weight
 * gradient sums its tokens in token order, whatever the thread count. */

void moe_router_bwd_cpu(float *dx, float *dwr, float *dlogit, const float *dtopw, const float *probs, const int *topi,
                        const float *x, const float *wr, const float *aux_g, const int *count, int T, int C, int E, int k,
                        int norm);
/* d p_te = the routing weights' gradient dtopw (T,k) through the renormalisation (norm), plus
 * aux_g[e] · count_t (aux_g (E) NULL: none); dlogit (T,E) = softmax backward of it (written,
 * scratch); dx (T,C) += dlogit Wr; dwr (E,C) += dlogit^T x (NULL: frozen). */

#endif
