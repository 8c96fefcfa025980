/* update.c — one GRPO-family update step (eng_update), on any backend:
 *
 *   advantages ─► filter groups ─► old pass (policy, no grad; or the rollout's logprobs; or,
 *   on-policy — one epoch of one mini-batch — the policy pass's own logprobs, detached: the
 *   same numbers, as veRL does, so the pass is skipped)
 *   ─► ref pass (frozen reference, no grad; skipped when kl_coef = 0)
 *   ─► rollout correction (train/rollout_corr.h, when asked: importance weights of the old
 *      policy against the responses' logprobs, rejected tokens out of the loss mask; it needs
 *      the old pass, so it turns the on-policy shortcut off)
 *   ─► ppo_epochs × mini-batches: micro-batches fwd + loss + bwd (gradients accumulate)
 *      ─► global grad-norm clip ─► AdamW (one optimizer step per mini-batch)
 *   ─► policy_version + 1
 *
 * Atomic: the state an optimizer step changes is copied while the passes run and the copy is
 * complete before the first step (train/snapshot.h; where it lives is the memory plan's
 * choice); a failure after it (a non-finite gradient norm, found before the step it would
 * poison; non-finite weights or second moments after a step; out of memory; a backend error)
 * copies it back, so a failed update leaves the policy exactly as before. eng_update_undo
 * takes back the last successful update the same way (the daemon's answer to a failed
 * done-write). The update's activations are released when it ends, so the rollout after it
 * has the room the plan gave the KV pool.
 *
 * Micro-batches hold whole groups packed P + NR (engine/model/pack.h); a group larger than a micro-batch
 * runs as its prompt once and its responses in micro-batches (engine/model/split.h). The loss's aggregation
 * denominators are those of the whole mini-batch (its trained tokens: a loss mask's 0 tokens, and
 * rejected ones, are attended to and count in none), so accumulation over micro-batches gives the
 * mini-batch's exact gradient; seq-mean-token-sum-norm's divisor (loss_scale_factor) is one
 * constant for the whole update: the caller's, else the longest response of the update. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "engine/engine_internal.h"
#include "engine/model/lora.h"
#include "engine/model/moe_ep.h"
#include "engine/train/optim.h"
#include "engine/train/rollout_corr.h"
#include "engine/model/split.h"
#include "engine/train/state.h"
#include "kernels/adamw.h"

/* The weights may change from here: the prefix cache's keys and values go, and with them the KV
 * pool's memory when no rollout runs. */
static void weights_changing(eng *e) {
    e->weights_epoch++;
    if (e->sched) sched_forget(e->sched);
}

int eng_update_undo(eng *e) {
    if (!e->snap.ok) return 0;
    weights_changing(e);
    int rc = snap_restore(e);
    return rc ? rc : ep_decode_refresh(e); /* the decode copy follows (a collective, as the undo is) */
}

/* Per-response bookkeeping of the kept groups, in pack order. */
typedef struct {
    pack_group *pg;
    int n_groups;
    int *src; /* (n_groups) index into the caller's groups */
    int S;
    int *off, *len, *mask;
    float *adv; /* (S) responses */
    unsigned char *tmask; /* (M) 0/1 trained tokens, or NULL when no group has a loss_mask and
                                   no rejection sampling can clear one */
    float *roll; /* (M) rollout logprobs: with a rollout correction */
    float *isw; /* (M) its importance weights: with rollout_is */
    long long M; /* predicted tokens */
    float *old, *ref, *logp, *ent, *dlogp, *dent; /* (M) */
    float *ent_old; /* (M) entropies at the old policy, for veRL's actor/entropy: the old
                                   pass's, else the first epoch's forward passes' */
    int ent_old_from_policy; /* the passes running now fill ent_old */
    int *grp_resp0; /* (n_groups) first response index of each kept group */
} work;

static void work_free(work *w) {
    free(w->pg);
    free(w->src);
    free(w->off);
    free(w->len);
    free(w->mask);
    free(w->tmask);
    free(w->roll);
    free(w->isw);
    free(w->adv);
    free(w->old);
    free(w->ref);
    free(w->logp);
    free(w->ent);
    free(w->dlogp);
    free(w->dent);
    free(w->ent_old);
    free(w->grp_resp0);
}

static int work_make(work *w, const eng *e, const eng_update_group *g, int n, const loss_config *a, int *filtered) {
    memset(w, 0, sizeof *w);
    int S = 0, any_mask = 0;
    long long M = 0;
    for (int i = 0; i < n; i++) {
        S += g[i].n;
        any_mask |= g[i].loss_mask != NULL;
        for (int r = 0; r < g[i].n; r++) M += g[i].R[r];
    }
    int corr = rcorr_enabled(a);
    if ((any_mask || a->rollout_rs != RRS_NONE) && !(w->tmask = malloc((size_t)M + 1)))
        return err_set(GE_NOMEM, "update: out of memory");
    if ((corr && !(w->roll = calloc((size_t)M + 1, sizeof(float)))) ||
        (a->rollout_is != RIS_NONE && !(w->isw = calloc((size_t)M + 1, sizeof(float)))))
        return err_set(GE_NOMEM, "update: out of memory");
    w->pg = calloc((size_t)n + 1, sizeof *w->pg);
    w->src = calloc((size_t)n + 1, sizeof(int));
    w->grp_resp0 = calloc((size_t)n + 1, sizeof(int));
    w->off = calloc((size_t)S + 1, sizeof(int));
    w->len = calloc((size_t)S + 1, sizeof(int));
    w->mask = calloc((size_t)S + 1, sizeof(int));
    w->adv = calloc((size_t)S + 1, sizeof(float));
    float **arr[7] = {&w->old, &w->ref, &w->logp, &w->ent, &w->dlogp, &w->dent, &w->ent_old};
    for (int i = 0; i < 7; i++) *arr[i] = calloc((size_t)M + 1, sizeof(float));
    if (!w->pg || !w->src || !w->grp_resp0 || !w->off || !w->len || !w->mask || !w->adv || !w->old || !w->ref || !w->logp ||
        !w->ent || !w->dlogp || !w->dent || !w->ent_old)
        return err_set(GE_NOMEM, "update: out of memory");
    *filtered = 0;
    int s = 0;
    long long off = 0;
    for (int i = 0; i < n; i++) {
        if (a->filter_groups && g[i].reward && !g[i].advantage && loss_group_uniform(g[i].reward, g[i].n)) {
            (*filtered)++;
            continue;
        }
        int k = w->n_groups++;
        w->src[k] = i;
        w->grp_resp0[k] = s;
        w->pg[k] = eng_pack_group(e, &g[i]);
        if (g[i].advantage) memcpy(w->adv + s, g[i].advantage, (size_t)g[i].n * sizeof(float));
        else loss_group_advantages(a, g[i].reward, g[i].n, w->adv + s);
        for (int r = 0; r < g[i].n; r++, s++) {
            w->off[s] = (int)off;
            w->len[s] = g[i].R[r];
            w->mask[s] = !(a->mask_truncated && g[i].truncated && g[i].truncated[r]);
            if (w->tmask && g[i].loss_mask && g[i].loss_mask[r]) memcpy(w->tmask + off, g[i].loss_mask[r], (size_t)g[i].R[r]);
            else if (w->tmask) memset(w->tmask + off, 1, (size_t)g[i].R[r]);
            if (g[i].old_logprobs && a->use_rollout_logprobs)
                memcpy(w->old + off, g[i].old_logprobs[r], (size_t)g[i].R[r] * sizeof(float));
            if (corr && !g[i].old_logprobs)
                return err_set(GE_INVALID, "update: a rollout correction needs every response's logprobs");
            if (corr) memcpy(w->roll + off, g[i].old_logprobs[r], (size_t)g[i].R[r] * sizeof(float));
            off += g[i].R[r];
        }
    }
    w->S = s;
    w->M = off;
    return 0;
}

/* The loss of responses [ms0, ms1) of w (their tokens contiguous from w->off[ms0]): dlogp, dent. */
static int loss_range(work *w, const loss_config *c, int ms0, int ms1, double tok_denom, double seq_denom, loss_metrics *met) {
    long long m0 = w->off[ms0];
    int S = ms1 - ms0;
    /* loss_compute indexes by off[]: shift to these responses' arrays. */
    int *off = malloc((size_t)(S ? S : 1) * sizeof(int));
    if (!off) return err_set(GE_NOMEM, "update: out of memory");
    for (int i = 0; i < S; i++) off[i] = (int)(w->off[ms0 + i] - m0);
    if (w->ent_old_from_policy)
        memcpy(w->ent_old + m0, w->ent + m0, (size_t)((ms1 < w->S ? w->off[ms1] : w->M) - m0) * sizeof(float));
    loss_compute(c, S, off, w->len + ms0, w->logp + m0, w->old + m0, c->kl_coef > 0 ? w->ref + m0 : NULL, w->ent + m0,
                 w->adv + ms0, w->mask + ms0, w->tmask ? w->tmask + m0 : NULL, w->isw ? w->isw + m0 : NULL, tok_denom, seq_denom,
                 w->dlogp + m0, w->dent + m0, met);
    free(off);
    return 0;
}

/* The router's balance loss (a MoE config with output_router_logits): router_aux_loss_coef ×
 * the mean of the micro-batches' balance losses, each weighted by its share of the mini-batch's
 * logical tokens (N(P+R) a group), so a mini-batch of one micro-batch gets transformers' loss
 * over its sequences, packed or not. Groups split over micro-batches (model/split.h) add none.
 * aux_tokens: the logical tokens of groups [g0, g1); 0 when the config asks for no balance loss. */
static double aux_tokens(const model *m, const pack_group *pg, int g0, int g1) {
    const model_config *c = &m->cfg;
    double n = 0;
    for (int i = g0; c->router_logits && c->aux_coef > 0 && config_n_moe(c) && i < g1; i++)
        n += (double)pack_group_tokens(&pg[i], PACK_STANDARD);
    return n;
}

/* coef × the balance loss of the forward just run, into the loss metric */
static int add_aux_loss(const model *m, const model_acts *a, float coef, loss_metrics *met) {
    double aux;
    int rc = model_aux_loss(m, a, &aux);
    if (!rc) met->loss += coef * aux;
    return rc;
}

/* A group too large for a micro-batch (engine/model/split.h): the loss of each response micro-batch. */
typedef struct {
    work *w;
    const loss_config *c;
    int s0, old_from_policy;
    double tok_denom, seq_denom;
    loss_metrics *met;
} split_loss_ud;

static int split_loss(void *ud, int r0, int r1) {
    split_loss_ud *u = ud;
    work *w = u->w;
    int ms0 = u->s0 + r0, ms1 = u->s0 + r1;
    long long m0 = w->off[ms0], n = (ms1 < w->S ? w->off[ms1] : w->M) - m0;
    if (u->old_from_policy) memcpy(w->old + m0, w->logp + m0, (size_t)n * 4);
    return loss_range(w, u->c, ms0, ms1, u->tok_denom, u->seq_denom, u->met);
}

/* Forward + loss + backward of groups [c0, c1) of the mini-batch [g0, g1) of w (with one rank the
 * whole of it; with W the rank's share, dp.c), micro-batch by micro-batch. The loss's
 * denominators are the whole mini-batch's: every rank has every group's lengths and masks, so
 * each computes them alone, and the ranks' gradients add up to the one-rank gradient. */
static int run_minibatch(eng *e, work *w, int g0, int g1, int c0, int c1, const loss_config *a, long long max_tokens,
                         int old_from_policy, loss_metrics *met, int *n_micro) {
    int s0 = w->grp_resp0[g0], s1 = g1 < w->n_groups ? w->grp_resp0[g1] : w->S;
    double tok_denom = 0, seq_denom = 0;
    int max_len = 0;
    loss_count(s1 - s0, w->off + s0, w->len + s0, w->mask + s0, w->tmask, &tok_denom, &seq_denom, &max_len);
    if (seq_denom == 0) return 0; /* every response masked: nothing to learn from (on every rank) */
    const loss_config *c = a;
    double aux_n = aux_tokens(&e->m, w->pg, g0, g1); /* 0: no balance loss */
    pack_plan plan = {0};
    /* no share: none of this rank's own (with expert parallelism its experts serve the others) */
    int rc = c1 > c0 ? pack_plan_make(&plan, w->pg + c0, c1 - c0, max_tokens, model_pack_layout(&e->m)) : 0;
    ep_gate_ud gu = {e, &e->wv};
    for (int k = 0; k < plan.n_mb && !rc; k++) {
        int first = c0 + plan.mb_first[k], count = plan.mb_count[k];
        int ms0 = w->grp_resp0[first], ms1 = first + count < w->n_groups ? w->grp_resp0[first + count] : w->S;
        long long m0 = w->off[ms0];
        if (plan.mb_split[k]) {
            split_loss_ud u = {w, c, ms0, old_from_policy, tok_denom, seq_denom, met};
            split_opts so = {max_tokens, a->temperature, -1, &e->split, e->ep_full ? ep_gate_split : NULL, &gu};
            split_stats st;
            rc = split_train(&e->m, &e->wv, &e->gv, &w->pg[first], &so, w->logp + m0, w->ent + m0, w->dlogp + m0,
                             a->entropy_coeff != 0 ? w->dent + m0 : NULL, split_loss, &u, &st);
            *n_micro += st.n_micro;
            continue;
        }
        pack_batch b;
        if ((rc = pack_build(&b, w->pg, first, count, model_pack_layout(&e->m)))) break;
        model_input in;
        model_input_from_batch(&in, &b);
        if (aux_n > 0) in.aux_coef = (float)(e->m.cfg.aux_coef * aux_tokens(&e->m, w->pg, first, first + count) / aux_n);
        rc = eng_acts_reserve(e, &e->acts_g, b.T, b.M, 1);
        if (!rc) rc = ep_gate(e, &e->wv, MODEL_PASS_FWD);
        if (!rc) rc = model_forward(&e->m, &e->wv, &e->acts_g, NULL, &in, a->temperature, 1);
        if (!rc && aux_n > 0) rc = add_aux_loss(&e->m, &e->acts_g, in.aux_coef, met);
        if (!rc) rc = e->be->to_host(e->be, w->logp + m0, e->acts_g.logp, (size_t)b.M * 4);
        if (!rc) rc = e->be->to_host(e->be, w->ent + m0, e->acts_g.ent, (size_t)b.M * 4);
        if (!rc && old_from_policy) memcpy(w->old + m0, w->logp + m0, (size_t)b.M * 4);
        if (!rc) rc = loss_range(w, c, ms0, ms1, tok_denom, seq_denom, met);
        if (!rc) rc = ep_gate(e, &e->wv, MODEL_PASS_BWD + e->acts_g.n_ckpt);
        if (!rc)
            rc = model_backward(&e->m, &e->wv, &e->gv, &e->acts_g, &in, w->dlogp + m0,
                                a->entropy_coeff != 0 ? w->dent + m0 : NULL, a->temperature);
        (*n_micro)++;
        pack_batch_free(&b);
    }
    rc = ep_gate_end(e, &e->wv, rc);
    if (c1 > c0) pack_plan_free(&plan);
    return rc;
}

/* The kept groups in the order the ranks train them (one rank, without a comm, is W = 1: the kept
 * groups in input order). Mini-batches are cut over the kept groups; within each, the groups are
 * placed on ranks by packed tokens (eng_place_groups) and ordered rank 0's first, then rank 1's,
 * ... (each in input order), so a rank's share is one range [lo, hi) of its mini-batch. Every
 * rank computes the same order. The passes without gradients (old, reference, the rollout
 * correction) run over n_sc ranges [sc_lo, sc_hi): each mini-batch's share with W ranks, all
 * the kept groups at once with one. */
typedef struct {
    eng_update_group *g;
    int n, filtered, n_mb, *lo, *hi;
    int n_sc, *sc_lo, *sc_hi, all[2];
} dp_order;

static void dp_order_free(dp_order *o) {
    free(o->g);
    free(o->lo);
    free(o->hi);
}

static int dp_order_make(eng *e, const eng_update_group *g, int n, const loss_config *a, dp_order *o) {
    memset(o, 0, sizeof *o);
    int *kept = malloc((size_t)(n ? n : 1) * sizeof(int)), *rank = malloc((size_t)(n ? n : 1) * sizeof(int));
    long long *tok = malloc((size_t)(n ? n : 1) * sizeof(long long));
    o->g = malloc((size_t)(n ? n : 1) * sizeof *o->g);
    int rc = kept && rank && tok && o->g ? 0 : err_set(GE_NOMEM, "update: out of memory");
    for (int i = 0; !rc && i < n; i++) { /* the filter of work_make */
        if (a->filter_groups && g[i].reward && !g[i].advantage && loss_group_uniform(g[i].reward, g[i].n)) o->filtered++;
        else kept[o->n++] = i;
    }
    int mb = a->ppo_mini_batch_size > 0 ? a->ppo_mini_batch_size : (o->n ? o->n : 1);
    o->n_mb = (o->n + mb - 1) / mb;
    o->lo = calloc((size_t)o->n_mb + 1, sizeof(int));
    o->hi = calloc((size_t)o->n_mb + 1, sizeof(int));
    if (!rc && (!o->lo || !o->hi)) rc = err_set(GE_NOMEM, "update: out of memory");
    for (int b = 0, k0 = 0; !rc && b < o->n_mb; b++, k0 += mb) {
        int k1 = k0 + mb < o->n ? k0 + mb : o->n, at = k0;
        for (int k = k0; k < k1; k++) {
            const eng_update_group *x = &g[kept[k]];
            tok[k - k0] = x->P;
            for (int r = 0; r < x->n; r++) tok[k - k0] += x->R[r];
        }
        eng_place_groups(tok, k1 - k0, e->W, rank);
        for (int q = 0; q < e->W; q++) {
            if (q == e->rank) o->lo[b] = at;
            for (int k = k0; k < k1; k++)
                if (rank[k - k0] == q) o->g[at++] = g[kept[k]];
            if (q == e->rank) o->hi[b] = at;
        }
    }
    o->all[0] = 0;
    o->all[1] = o->n;
    o->n_sc = e->W > 1 ? o->n_mb : 1;
    o->sc_lo = e->W > 1 ? o->lo : &o->all[0];
    o->sc_hi = e->W > 1 ? o->hi : &o->all[1];
    free(kept);
    free(rank);
    free(tok);
    return rc;
}

/* The loss metrics and micro-batch count of every rank, combined in rank order (sums; ratio_max the
 * max), so the result is the same on every rank; one rank's are already everyone's. */
static int dp_metrics(eng *e, loss_metrics *met, int *n_micro) {
    if (e->W <= 1) return 0;
    struct {
        loss_metrics m;
        double micro;
    } mine = {*met, *n_micro}, *all = malloc((size_t)e->W * sizeof mine);
    if (!all) return err_set(GE_NOMEM, "update: out of memory");
    int rc = dp_exchange(e, &mine, all, sizeof mine);
    if (!rc) {
        loss_metrics t = {0};
        double micro = 0;
        for (int q = 0; q < e->W; q++) {
            const loss_metrics *x = &all[q].m;
            t.loss += x->loss;
            t.pg_loss += x->pg_loss;
            t.kl += x->kl;
            t.entropy += x->entropy;
            t.clip_frac += x->clip_frac;
            t.clip_frac_low += x->clip_frac_low;
            t.clip_frac_high += x->clip_frac_high;
            t.ratio_mean += x->ratio_mean;
            t.n_tokens += x->n_tokens;
            t.clip_frac_dual += x->clip_frac_dual;
            t.pg_clipfrac += x->pg_clipfrac;
            t.pg_clipfrac_lower += x->pg_clipfrac_lower;
            t.ppo_kl += x->ppo_kl;
            t.kl_loss += x->kl_loss;
            t.entropy_loss += x->entropy_loss;
            t.entropy_agg += x->entropy_agg;
            if (q == 0 || x->ratio_max > t.ratio_max) t.ratio_max = x->ratio_max;
            rcorr_add(&t.rc, &x->rc);
            micro += all[q].micro;
        }
        *met = t;
        *n_micro = (int)micro;
    }
    free(all);
    return rc;
}

/* veRL's actor/entropy: the old policy's entropies aggregated over the whole batch; with a comm
 * each rank's share (the others' entropies are 0 here), summed by dp_metrics. */
static void verl_entropy(const work *w, const loss_config *a, loss_metrics *met) {
    double tok = 0, seq = 0;
    int mx = 0;
    loss_count(w->S, w->off, w->len, w->mask, w->tmask, &tok, &seq, &mx);
    if (seq > 0) met->entropy_agg = loss_agg(a, w->S, w->off, w->len, w->ent_old, w->mask, w->tmask, tok, seq);
}

/* The rollout correction (rollout_corr.h) of the responses this rank scored in the old pass (the
 * ranges of dpo): importance weights into w->isw, rejections out of w->tmask, metrics into *m.
 * With W ranks the rejections are exchanged (each rank clears the tokens any rank rejected: only
 * the owner rejects a token), so every rank has the same loss mask and the same denominators. */
static int correct_rollout(eng *e, work *w, const dp_order *dpo, const loss_config *a, rcorr_metrics *m) {
    for (int b = 0; b < dpo->n_sc; b++) {
        int c0 = dpo->sc_lo[b], c1 = dpo->sc_hi[b];
        int s0 = c0 < w->n_groups ? w->grp_resp0[c0] : w->S, s1 = c1 < w->n_groups ? w->grp_resp0[c1] : w->S;
        rcorr_compute(a, s1 - s0, w->off + s0, w->len + s0, w->mask + s0, w->tmask, w->old, w->roll, w->isw, m);
    }
    if (a->rollout_rs == RRS_NONE || e->W <= 1) return 0;
    size_t M = (size_t)w->M + 1;
    unsigned char *all = malloc(M * (size_t)e->W);
    if (!all) return err_set(GE_NOMEM, "update: out of memory");
    int rc = dp_exchange(e, w->tmask, all, M);
    for (size_t t = 0; !rc && t < M; t++)
        for (int q = 0; q < e->W; q++) w->tmask[t] &= all[(size_t)q * M + t];
    free(all);
    return rc;
}

/* The update's micro-batch plan: GE_TOO_LARGE for a group larger than the budget (checked before
 * any pass), else the tokens and predictions of its largest packed micro-batch (*T, *M; groups
 * split over micro-batches bring their own memory, model/split.h). */
static int largest_micro_batch(const eng *e, const work *w, long long max_tokens, long long *T, long long *M) {
    pack_plan plan;
    *T = *M = 0;
    int rc = pack_plan_make(&plan, w->pg, w->n_groups, max_tokens, model_pack_layout(&e->m));
    if (rc) return rc;
    for (int k = 0; k < plan.n_mb; k++) {
        if (plan.mb_split[k]) continue;
        long long t = 0, m = 0;
        for (int i = plan.mb_first[k]; i < plan.mb_first[k] + plan.mb_count[k]; i++) {
            t += pack_group_tokens(&w->pg[i], model_pack_layout(&e->m));
            for (int r = 0; r < w->pg[i].N; r++) m += w->pg[i].R[r];
        }
        if (t > *T) *T = t;
        if (m > *M) *M = m;
    }
    pack_plan_free(&plan);
    return rc;
}

/* Before any pass: the groups this rank keeps, in the ranks' order (dp_order, whose g the
 * update reads from here on), their packed work and token counts, and the largest micro-batch
 * checked against the plan (a group larger than the budget fails here, not midway) and its
 * activations reserved. With a comm every failure from here on is agreed on where it happens,
 * so all ranks stop together and meet in the same collectives (dp_agree is the identity with
 * one rank). */
static int update_prepare(eng *e, const eng_update_group *g, int n_groups, const loss_config *a, long long max_tokens, work *w,
                          dp_order *dpo, eng_update_result *out) {
    int rc = state_alloc(e), none;
    if (!rc && !(rc = dp_order_make(e, g, n_groups, a, dpo))) { /* the kept groups: work_make filters none */
        g = dpo->g;
        n_groups = dpo->n;
    }
    if (!rc) rc = work_make(w, e, g, n_groups, a, &none);
    out->groups_filtered = dpo->filtered;
    for (int i = 0; !rc && i < w->n_groups; i++) {
        out->tokens_packed += pack_group_tokens(&w->pg[i], model_pack_layout(&e->m));
        out->tokens_standard += pack_group_tokens(&w->pg[i], PACK_STANDARD);
    }
    long long mb_T = 0, mb_M = 0;
    if (!rc && w->n_groups) rc = largest_micro_batch(e, w, max_tokens, &mb_T, &mb_M);
    if ((rc = dp_agree(e, rc))) return rc;
    /* The largest micro-batch's activations are reserved before the safety copy starts (a
     * reservation that grows midway frees device memory, and cudaFree waits for every stream,
     * the copy's too), then the copy runs beside the passes and is complete before the first step */
    /* what the rollouts grew (a prefill's activations, the exchanges' buffers of a scoring pass)
     * goes back first: the plan counted this update's own sizes only */
    model_acts_free(&e->m, &e->acts_ng);
    moe_ep_ws_release(&e->m);
    if (mb_T > 0) rc = eng_acts_reserve(e, &e->acts_g, (int)mb_T, (int)mb_M, 1);
    if (mb_T > 0 && !(rc = dp_agree(e, rc))) rc = ep_agree_ckpt(e, &e->acts_g); /* ranks recompute alike */
    /* the no-grad passes (old, reference) run before the policy's, never beside it: their
     * activations in the gradient ones' memory (the plan counts the larger, plan.c) */
    if (mb_T > 0 && !rc && model_acts_init_in(&e->m, &e->acts_ng, (int)mb_T, (int)mb_M, &e->acts_g))
        rc = eng_acts_reserve(e, &e->acts_ng, (int)mb_T, (int)mb_M, 0);
    return dp_agree(e, rc);
}

/* A no-gradient pass (the old policy's or the reference's) over every kept group: with a comm
 * this rank's shares, each padded to the ranks' most micro-batches (expert parallelism's
 * lock-step). lp, ent (may be NULL): (M), filled at each group's responses. */
static int score_pass(eng *e, const model_views *v, const work *w, const dp_order *dpo, long long max_tokens, float temperature,
                      float *lp, float *ent) {
    int rc = 0;
    for (int b = 0; b < dpo->n_sc && !rc; b++) {
        int c0 = dpo->sc_lo[b], c1 = dpo->sc_hi[b];
        long long at = c1 > c0 ? w->off[w->grp_resp0[c0]] : 0;
        if (c1 > c0)
            rc = eng_score(e, v, w->pg + c0, c1 - c0, max_tokens, temperature, lp + at, ent ? ent + at : NULL, 0, NULL, NULL);
        rc = ep_gate_end(e, v, rc);
    }
    return rc;
}

/* One optimizer step over the reduced gradient (step of steps_total, from 1): its norm
 * (GE_NON_FINITE when not finite), the safety copy awaited before the first step (*saved set
 * once it is complete), torch's clip_grad_norm_, the scheduled lr, the state's AdamW step, and
 * a check that the step left the weights and second moments finite. */
static int optimizer_step(eng *e, const eng_optim *opt, int step, int steps_total, int *saved, double *norm, float *lr) {
    double ss;
    int bad_w, bad_v;
    int rc = state_grad_sumsq(e, &ss);
    if (rc) return rc;
    *norm = sqrt(ss);
    if (!isfinite(*norm))
        return err_set(GE_NON_FINITE,
                       "update: the gradient norm is %g at optimizer step %d of %d (loss or "
                       "gradient not finite); the update is not applied",
                       *norm, step, steps_total);
    if (!*saved && (rc = dp_agree(e, snap_wait(e)))) return rc;
    *saved = 1;
    double clip = grad_clip_coef(*norm, opt->grad_clip);
    if (clip < 1.0) state_grad_scale(e, (float)clip);
    e->opt_step++;
    *lr = lr_schedule(opt->lr, e->opt_step, opt->warmup_steps, opt->schedule, opt->total_steps, opt->min_lr_ratio);
    rc = state_step(e, opt, *lr);
    /* a finite gradient can still overflow the weights (lr x weight_decay > 2 grows them
     * geometrically) or the second moments (no clipping): check before going on */
    if (!rc && !(rc = state_check_after_step(e, &bad_w, &bad_v)) && (bad_w || bad_v))
        rc = err_set(GE_NON_FINITE,
                     "update: optimizer step %d of %d made the %s non-finite (lr %g, weight_decay %g); "
                     "the update is not applied",
                     step, steps_total, bad_w ? "weights" : "second moments", opt->lr, opt->weight_decay);
    return rc;
}

/* The loss metrics of a finished update (summed over its steps) into out. */
static void result_metrics(eng_update_result *out, loss_metrics *met, const loss_config *a, int steps, double grad_norm_sum) {
    loss_finish(met, steps ? steps : 1);
    out->loss = met->loss;
    out->pg_loss = met->pg_loss;
    out->kl = met->kl;
    out->entropy = met->entropy;
    out->clip_frac = met->clip_frac;
    out->clip_frac_low = met->clip_frac_low;
    out->clip_frac_high = met->clip_frac_high;
    out->ratio_mean = met->ratio_mean;
    out->ratio_max = met->ratio_max;
    out->pg_clipfrac = met->pg_clipfrac;
    out->pg_clipfrac_lower = met->pg_clipfrac_lower;
    out->ppo_kl = met->ppo_kl;
    out->kl_loss = met->kl_loss;
    out->verl_entropy = met->entropy_agg;
    out->rollout_corr = rcorr_enabled(a);
    if (out->rollout_corr) rcorr_finish(a, &met->rc, &out->rc);
    out->loss_scale_factor = a->loss_scale_factor;
    out->grad_norm = steps ? grad_norm_sum / steps : 0;
    out->optimizer_steps = steps;
}

int eng_update(eng *e, const eng_update_group *g, int n_groups, const loss_config *a, const eng_optim *opt, long long max_tokens,
               eng_update_result *out, eng_progress_cb cb, void *ud) {
    double t0 = clock_mono_ms();
    memset(out, 0, sizeof *out);
    out->policy_version_before = e->policy_version;
    weights_changing(e);
    work w = {0};
    dp_order dpo = {0};
    loss_config ac = *a; /* loss_scale_factor 0: the longest response of the update, every group counted */
    for (int i = 0; ac.loss_scale_factor <= 0 && i < n_groups; i++)
        for (int r = 0; r < g[i].n; r++)
            if (g[i].R[r] > ac.loss_scale_factor) ac.loss_scale_factor = g[i].R[r];
    a = &ac;
    int rc = update_prepare(e, g, n_groups, a, max_tokens, &w, &dpo, out);
    if (rc) {
        work_free(&w);
        dp_order_free(&dpo);
        return rc;
    }
    g = dpo.g;
    rc = snap_begin(e);

    double t = clock_mono_ms();
    out->ms_prepare = t - t0;
    int mb = a->ppo_mini_batch_size > 0 ? a->ppo_mini_batch_size : (w.n_groups ? w.n_groups : 1);
    int epochs = a->ppo_epochs > 0 ? a->ppo_epochs : 1, steps_total = epochs * ((w.n_groups + mb - 1) / mb), steps = 0;
    int need_old = !(a->use_rollout_logprobs) || rcorr_enabled(a);
    for (int i = 0; !need_old && i < w.n_groups; i++) need_old = !g[w.src[i]].old_logprobs;
    /* a rollout correction reads the old logprobs before the passes: no on-policy shortcut */
    int old_from_policy = need_old && steps_total == 1 && !rcorr_enabled(a);
    /* the old and reference passes: every kept group with one rank, the rank's shares with W */
    if (w.n_groups && need_old && !old_from_policy && !rc)
        rc = score_pass(e, &e->wv, &w, &dpo, max_tokens, a->temperature, w.old, w.ent_old);
    out->ms_old = clock_mono_ms() - t;
    t = clock_mono_ms();
    if (w.n_groups && a->kl_coef > 0 && !rc) rc = score_pass(e, &e->rv, &w, &dpo, max_tokens, a->temperature, w.ref, NULL);
    out->ms_ref = clock_mono_ms() - t;
    loss_metrics met = {0};
    if (!rc && rcorr_enabled(a) && w.n_groups) { /* veRL takes actor/entropy in the old pass, before rejection */
        verl_entropy(&w, a, &met);
        rc = correct_rollout(e, &w, &dpo, a, &met.rc);
    }
    rc = dp_agree(e, rc);
    if (cb) cb(ud, 0.2);

    double grad_norm_sum = 0, ms_policy = 0, ms_opt = 0;
    int saved = 0;
    int old_pass = need_old && !old_from_policy;
    for (int ep = 0; ep < epochs && !rc; ep++) {
        w.ent_old_from_policy = ep == 0 && !old_pass;
        for (int g0 = 0; g0 < w.n_groups && !rc; g0 += mb) {
            int g1 = g0 + mb < w.n_groups ? g0 + mb : w.n_groups;
            int c0 = dpo.lo[g0 / mb], c1 = dpo.hi[g0 / mb]; /* this rank's share of the mini-batch */
            t = clock_mono_ms();
            state_grad_zero(e);
            rc = run_minibatch(e, &w, g0, g1, c0, c1, a, max_tokens, old_from_policy, &met, &out->micro_batches);
            rc = state_grad_reduce(e, rc); /* the gradient the state steps; with a comm every rank's, in each shard */
            ms_policy += clock_mono_ms() - t;
            if (rc) break;
            t = clock_mono_ms();
            double norm = 0;
            float lr = 0;
            rc = optimizer_step(e, opt, steps + 1, steps_total, &saved, &norm, &lr);
            ms_opt += clock_mono_ms() - t;
            if (rc) break;
            grad_norm_sum += norm;
            out->lr = lr;
            steps++;
            if (cb) cb(ud, 0.2 + 0.8 * steps / (steps_total ? steps_total : 1));
        }
    }
    if (!rc && !rcorr_enabled(a)) verl_entropy(&w, a, &met);
    if (!rc) rc = dp_metrics(e, &met, &out->micro_batches);
    if (rc && saved) {
        int code = err_code();
        char msg[512];
        snprintf(msg, sizeof msg, "%s", err_msg());
        if (snap_restore(e)) rc = err_set(err_code(), "%s; restoring the state before it failed too: %s", msg, err_msg());
        else err_set(code, "%s", msg);
    } else if (snap_wait(e) && !rc) { /* no step taken: the copy only has to end */
        rc = err_code();
    }
    out->ms_snapshot_wait = e->snap.ms_wait;
    /* the activations go back to the plan (the next rollout's KV pool has their room) */
    model_acts_free(&e->m, &e->acts_ng); /* first: it may live in acts_g's memory */
    model_acts_free(&e->m, &e->acts_g);
    moe_ep_ws_release(&e->m); /* expert parallelism's exchange buffers too */
    if (!rc) {
        result_metrics(out, &met, a, steps, grad_norm_sum);
        if (steps) e->policy_version++;
        e->snap.ok = steps > 0;
        out->policy_version_after = e->policy_version;
    }
    rc = ep_decode_after_update(e, steps, rc); /* the decode copy follows the weights */
    out->ms_policy = ms_policy;
    out->ms_optimizer = ms_opt;
    out->ms_total = clock_mono_ms() - t0;
    work_free(&w);
    dp_order_free(&dpo);
    return rc;
}
