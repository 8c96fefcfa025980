/* hybrid.c — see hybrid.h. The two layers, as transformers' Qwen3_5Attention and
 * Qwen3_5GatedDeltaNet compute them:
 *
 *   gated:     qg = ln1 Wq^T (T,H,2D)     k0, v = ln1 Wk^T, ln1 Wv^T
 *              q, k = partial RoPE of the per-head norms     att = attention(q, k, v)
 *              xm = x + (att ⊙ sigmoid(gate)) Wo^T
 *   deltanet:  x_qkv, z, b, a = ln1 in_proj_{qkv,z,b,a}^T    u = silu(conv(x_qkv))
 *              o = gated delta rule(u, a, b)                  y = gated norm(o, z)
 *              xm = x + y out_proj^T
 *
 * ln1 is scratch, recomputed by the backward as the other kinds do; the DeltaNet's states are
 * one scratch the layers share (its backward recomputes them).
 *
 * Decode (a KV cache): the gated layer scatters its keys and values to their cache rows
 * (d->slot) and attends over the rows the ranges name, as full attention does; the DeltaNet
 * layer's "cache" is its state rows (kv_k: state, kv_v: conv tail, model.h model_kv), which the
 * step ops read and update in place for the row each token continues (d->srow). */
#include "engine/model/hybrid.h"

/* ---------------------------------------------------------------- gated softmax attention */

void hybrid_gated_fwd(const model *m, const model_views *w, model_acts *a, int l, const model_dev_input *d, void *kv_k, void *kv_v) {
    const model_config *c = &m->cfg;
    eng_backend *be = m->be;
    int T = d->T, C = c->C, H = c->H, K = c->K, D = c->D, HD = H * D, KD = K * D;
    struct model_layer_acts *A = &a->l[l];
    const model_layer_views *W = &w->layers[l];
    mm_norm n1 = {W->attn_norm, c->eps, A->ln1};
    mm_part qkv[3] = {
        {A->qg, W->wq, NULL, 2 * HD, NULL, {0}}, {A->k0, W->wk, NULL, KD, NULL, {0}}, {A->v, W->wv, NULL, KD, NULL, {0}}};
    be->matmul_fwd_n(be, qkv, 3, A->x, &n1, T, C);
    be->gated_attn_qk_fwd(be, A->q, A->k, A->rstdq, A->rstdk, A->qg, A->k0, W->q_norm, W->k_norm, d->pos, m->inv_freq, T, H, K, D,
                          c->R, c->eps);
    const void *keys = A->k, *vals = A->v;
    if (kv_k) { /* decode: this step's keys and values join the cache rows the ranges index */
        be->scatter_rows(be, kv_k, A->k, d->slot, T, KD);
        be->scatter_rows(be, kv_v, A->v, d->slot, T, KD);
        keys = kv_k;
        vals = kv_v;
    }
    be->attention_fwd(be, A->att, A->lse, A->q, keys, vals, d->r, T, H, K, D);
    be->gated_attn_gate_fwd(be, A->ag, A->att, A->qg, T, H, D);
    mm_part o = {A->xm, W->wo, NULL, C, A->x, {0}};
    be->matmul_fwd_n(be, &o, 1, A->ag, NULL, T, HD);
}

void hybrid_gated_bwd(const model *m, const model_views *w, const model_views *g, model_acts *a, int l, const model_dev_input *d) {
    const model_config *c = &m->cfg;
    eng_backend *be = m->be;
    int T = d->T, C = c->C, H = c->H, K = c->K, D = c->D, HD = H * D, KD = K * D;
    size_t eb = (size_t)be->act_bytes;
    struct model_layer_acts *A = &a->l[l];
    const model_layer_views *W = &w->layers[l], *G = &g->layers[l];
    be->zero(be, a->datt, (size_t)T * HD * eb);
    be->matmul_bwd(be, a->datt, G->wo, NULL, a->dres, A->ag, W->wo, T, HD, C);
    be->gated_attn_gate_bwd(be, a->datt, a->dqg, a->datt, A->att, A->qg, T, H, D); /* in place: d ag -> d att */
    model_attn_keys ks; /* the T tokens' own keys, or KV-cache rows (a split group's) */
    model_attn_keys_begin(m, a, l, T, &ks);
    be->attention_bwd(be, a->dq, ks.dk, ks.dv, a->datt, A->q, ks.k, ks.v, A->att, A->lse, d->r, T, ks.S, H, K, D);
    model_attn_keys_end(m, a, l, &ks);
    be->gated_attn_qk_bwd(be, a->dqg, a->dkg, G->q_norm, G->k_norm, a->dq, ks.dk_own, A->qg, A->k0, W->q_norm, W->k_norm,
                          A->rstdq, A->rstdk, d->pos, m->inv_freq, T, H, K, D, c->R);
    be->rmsnorm_fwd(be, A->ln1, A->rstd1, A->x, W->attn_norm, T, C, c->eps);
    be->zero(be, a->dln, (size_t)T * C * eb);
    be->matmul_bwd(be, a->dln, G->wq, NULL, a->dqg, A->ln1, W->wq, T, C, 2 * HD);
    be->matmul_bwd(be, a->dln, G->wk, NULL, a->dkg, A->ln1, W->wk, T, C, KD);
    be->matmul_bwd(be, a->dln, G->wv, NULL, ks.dv_own, A->ln1, W->wv, T, C, KD);
    be->rmsnorm_bwd(be, a->dres, G->attn_norm, a->dln, A->x, W->attn_norm, A->rstd1, T, C);
}

/* ---------------------------------------------------------------- gated DeltaNet */

/* Layer l's carry across a split group's passes (model.h model_dn_carry) as the ops take it, in
 * *cy; NULL without one. The prompt's pass (row0 0) hands its end on, a response micro-batch's
 * starts from it. */
static deltanet_carry *carry_of(const model_acts *a, int l, deltanet_carry *cy) {
    const model_dn_carry *k = a->carry;
    if (!k) return NULL;
    *cy = (deltanet_carry){.row0 = k->row0};
    if (k->row0 == 0) {
        cy->s_out = k->state[l];
        cy->tail_out = k->tail[l];
        cy->ds_out = k->dstate ? k->dstate[l] : NULL;
        cy->dtail_out = k->dtail ? k->dtail[l] : NULL;
    } else {
        cy->s_in = k->state[l];
        cy->tail_in = k->tail[l];
        cy->ds_in = k->dstate ? k->dstate[l] : NULL;
        cy->dtail_in = k->dtail ? k->dtail[l] : NULL;
    }
    return cy;
}

void hybrid_deltanet_fwd(const model *m, const model_views *w, model_acts *a, int l, const model_dev_input *d, void *kv_k,
                         void *kv_v) {
    const model_config *c = &m->cfg;
    eng_backend *be = m->be;
    int T = d->T, C = c->C, Hk = c->lin_hk, Hv = c->lin_hv, Dk = c->lin_dk, Dv = c->lin_dv, VL = Hv * Dv, Cc = 2 * Hk * Dk + VL;
    struct model_layer_acts *A = &a->l[l];
    const model_layer_views *W = &w->layers[l];
    be->rmsnorm_fwd(be, A->ln1, A->rstd1, A->x, W->attn_norm, T, C, c->eps);
    mm_part in[4] = {{A->x_qkv, W->dn_qkv, NULL, Cc, NULL, {0}},
                     {A->z, W->dn_z, NULL, VL, NULL, {0}},
                     {A->dn_b, W->dn_b, NULL, Hv, NULL, {0}},
                     {A->dn_a, W->dn_a, NULL, Hv, NULL, {0}}};
    be->matmul_fwd_n(be, in, 2, A->ln1, NULL, T, C);
    be->matmul_fwd_n(be, in + 2, 2, A->ln1, NULL, T, C);
    if (kv_k) { /* decode: kv_k, kv_v are the state and conv tail rows, d->srow each token's */
        be->deltanet_conv_step(be, A->dn_u, kv_v, A->x_qkv, W->dn_conv, d->srow, T, Cc, c->conv_k);
        be->deltanet_rule_step(be, A->o, kv_k, A->dn_u, A->dn_a, A->dn_b, W->dn_alog, W->dn_dt, d->srow, T, Hk, Hv, Dk, Dv);
    } else {
        deltanet_carry cy, *cp = carry_of(a, l, &cy);
        be->deltanet_conv_fwd(be, A->dn_u, A->x_qkv, W->dn_conv, d->r, cp, T, Cc, c->conv_k);
        be->deltanet_rule_fwd(be, A->o, a->states, A->dn_u, A->dn_a, A->dn_b, W->dn_alog, W->dn_dt, d->r, cp, T, Hk, Hv, Dk, Dv);
    }
    be->deltanet_norm_fwd(be, A->y, A->rstdn, A->o, A->z, W->dn_norm, T, Hv, Dv, c->eps);
    mm_part o = {A->xm, W->dn_out, NULL, C, A->x, {0}};
    be->matmul_fwd_n(be, &o, 1, A->y, NULL, T, VL);
}

void hybrid_deltanet_bwd(const model *m, const model_views *w, const model_views *g, model_acts *a, int l,
                         const model_dev_input *d) {
    const model_config *c = &m->cfg;
    eng_backend *be = m->be;
    int T = d->T, C = c->C, Hk = c->lin_hk, Hv = c->lin_hv, Dk = c->lin_dk, Dv = c->lin_dv, VL = Hv * Dv, Cc = 2 * Hk * Dk + VL;
    size_t eb = (size_t)be->act_bytes;
    struct model_layer_acts *A = &a->l[l];
    const model_layer_views *W = &w->layers[l], *G = &g->layers[l];
    be->zero(be, a->dy_lin, (size_t)T * VL * eb);
    be->matmul_bwd(be, a->dy_lin, G->dn_out, NULL, a->dres, A->y, W->dn_out, T, VL, C);
    be->deltanet_norm_bwd(be, a->do_lin, a->dz, G->dn_norm, a->dy_lin, A->o, A->z, W->dn_norm, A->rstdn, T, Hv, Dv);
    deltanet_carry cy, *cp = carry_of(a, l, &cy);
    be->deltanet_rule_bwd(be, a->du_lin, a->ddn_a, a->ddn_b, G->dn_alog, G->dn_dt, a->states, a->dstates, a->do_lin, A->dn_u,
                          A->dn_a, A->dn_b, W->dn_alog, W->dn_dt, d->r, cp, T, Hk, Hv, Dk, Dv);
    be->deltanet_conv_bwd(be, a->dx_qkv, G->dn_conv, a->du_lin, A->x_qkv, W->dn_conv, d->r, cp, T, Cc, c->conv_k);
    be->rmsnorm_fwd(be, A->ln1, A->rstd1, A->x, W->attn_norm, T, C, c->eps);
    be->zero(be, a->dln, (size_t)T * C * eb);
    be->matmul_bwd(be, a->dln, G->dn_qkv, NULL, a->dx_qkv, A->ln1, W->dn_qkv, T, C, Cc);
    be->matmul_bwd(be, a->dln, G->dn_z, NULL, a->dz, A->ln1, W->dn_z, T, C, VL);
    be->matmul_bwd(be, a->dln, G->dn_b, NULL, a->ddn_b, A->ln1, W->dn_b, T, C, Hv);
    be->matmul_bwd(be, a->dln, G->dn_a, NULL, a->ddn_a, A->ln1, W->dn_a, T, C, Hv);
    be->rmsnorm_bwd(be, a->dres, G->attn_norm, a->dln, A->x, W->attn_norm, A->rstd1, T, C);
}
