/* state.c — the training state (state.h): each function decides here, once, where the state
 * lives (device, host with offload, a shard with a comm). */
#include "engine/train/state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/model/lora.h"
#include "engine/train/offload.h"
#include "kernels/adamw.h"

/* ---------------------------------------------------------------- placement */

/* With a comm (dp.c): act weights whole (padded to W shards), the fp32 master only for this
 * rank's shard [off, off + valid) of the loaded (or resumed) weights, and its experts whole after
 * the shard; in host memory with offload. */
static int place_shard(eng *e, const float *host, long long valid) {
    eng_backend *be = e->be;
    size_t n = (size_t)e->m.n_elems, eb = (size_t)be->act_bytes, S = (size_t)e->sh_n, whole = S * (size_t)e->W + (size_t)e->ep_n,
           pad = whole - n;
    size_t ns = S + (size_t)e->ep_n;
    int rc = dp_open(e);
    if (!rc) rc = plan_host_peers(e); /* one exchange of the host names, for the plan */
    if (!rc && e->offload) rc = plan_host_state(e, (long long)ns * 12); /* every rank of this host together */
    if (rc) return rc;
    e->w_act = be->alloc(be, whole * eb);
    e->w_master = !e->w_act ? NULL : e->offload ? offload_host_alloc((long long)ns) : be->alloc(be, ns * 4);
    if (!e->w_act || !e->w_master) return GE_NOMEM;
    if ((rc = be->act_from_f32(be, e->w_act, host, n))) return rc;
    if (pad) be->zero(be, (char *)e->w_act + n * eb, pad * eb);
    if (e->offload) { /* zeroed by offload_host_alloc; this rank's experts whole after the shard */
        if (valid) memcpy(e->w_master, host + e->sh_off, (size_t)valid * 4);
        if (e->ep_n) memcpy(e->w_master + S, host + S * (size_t)e->W, (size_t)e->ep_n * 4);
        return 0;
    }
    be->zero(be, e->w_master, S * 4);
    if (valid && (rc = be->to_dev(be, e->w_master, host + e->sh_off, (size_t)valid * 4))) return rc;
    /* this rank's experts, whole after the shard */
    if (e->ep_n && (rc = be->to_dev(be, e->w_master + S, host + S * (size_t)e->W, (size_t)e->ep_n * 4))) return rc;
    return 0;
}

/* One rank, offload: the master is host memory, never copied through the device. */
static int place_host(eng *e, const float *host) {
    eng_backend *be = e->be;
    size_t n = (size_t)e->m.n_elems;
    int rc = plan_host_state(e, (long long)n * 12);
    if (rc) return rc;
    if (!(e->w_master = offload_host_alloc((long long)n))) return GE_NOMEM;
    memcpy(e->w_master, host, n * sizeof(float));
    e->w_act = be->alloc(be, n * (size_t)be->act_bytes);
    if (!e->w_act) return GE_NOMEM;
    return be->act_from_f32(be, e->w_act, e->w_master, n);
}

/* One rank on the device: the master, and the act weights (the master itself when fp32). */
static int place_device(eng *e, const float *host) {
    eng_backend *be = e->be;
    size_t n = (size_t)e->m.n_elems;
    int rc;
    if (!(e->w_master = be->alloc(be, n * sizeof(float)))) return GE_NOMEM;
    if ((rc = be->to_dev(be, e->w_master, host, n * sizeof(float)))) return rc;
    if (be->act_bytes == 4) {
        e->w_act = e->w_master;
        return 0;
    }
    e->w_act = be->alloc(be, n * (size_t)be->act_bytes);
    if (!e->w_act) return GE_NOMEM;
    return be->act_from_f32(be, e->w_act, host, n);
}

/* One rank, a split (state.h): the master's first d elements on the device, the rest in host
 * memory; the act weights whole and apart from the master (on cpu too). */
static int place_split(eng *e, const float *host) {
    eng_backend *be = e->be;
    size_t n = (size_t)e->m.n_elems, hn = (size_t)e->host_n, d = n - hn;
    int rc = plan_host_state(e, (long long)hn * 12);
    if (rc) return rc;
    if (!(e->host_whole[0] = offload_host_alloc_from((long long)n, (long long)d))) return GE_NOMEM;
    memcpy(e->host_whole[0] + d, host + d, hn * sizeof(float));
    if (!(e->w_master = be->alloc(be, d * sizeof(float)))) return GE_NOMEM;
    if ((rc = be->to_dev(be, e->w_master, host, d * sizeof(float)))) return rc;
    if (!(e->w_act = be->alloc(be, n * (size_t)be->act_bytes))) return GE_NOMEM;
    return be->act_from_f32(be, e->w_act, host, n);
}

/* The master and moments of one rank without a comm, in element order: [0, n - host_n) where
 * the backend's state lives (all of it without a split), then the host part of a split.
 * Returns the count. */
typedef struct {
    long long at, n;
    float *x[3]; /* master, m, v */
    int host; /* 1: host memory */
} state_part;
static int state_parts(const eng *e, state_part q[2]) {
    long long n = eng_train_n(e), d = n - e->host_n;
    q[0] = (state_part){0, d, {eng_train_master(e), e->adam_m, e->adam_v}, e->offload};
    q[1] = (state_part){d, e->host_n, {0}, 1};
    for (int i = 0; i < 3; i++) q[1].x[i] = e->host_whole[i] ? e->host_whole[i] + d : NULL;
    return e->host_n ? 2 : 1;
}

int state_fits(eng *e, const char *model_dir) {
    eng_backend *be = e->be;
    size_t fr = 0, tot = 0;
    int rc = 0;
    if (!e->dp && be->mem_info && !be->mem_info(be, &fr, &tot)) /* one rank: the whole model on its device */
        rc = plan_full_fits(e->m.n_elems, be->act_bytes, (long long)tot, be->name, model_dir);
    if (!rc) err_clear();
    return rc;
}

int state_open(eng *e, const float *host, const char *offload_mode) {
    /* the replicated elements (all without expert parallelism; its experts follow, ep.c) */
    long long nr = e->ep_full ? e->m.ep_n0 : e->m.n_elems;
    long long S = e->dp ? (nr + e->W - 1) / e->W : 0, off = S * e->rank, valid = off >= nr ? 0 : (nr - off < S ? nr - off : S);
    e->sh_n = S;
    e->sh_off = off;
    e->ep_n = e->ep_full ? e->m.n_elems - nr : 0;
    long long ns = e->dp ? S + e->ep_n : e->m.n_elems, hn; /* a comm's: this rank's shard */
    int rc = plan_offload(e, offload_mode, ns, &hn);
    if (rc) return rc;
    e->offload = hn && hn == ns;
    e->host_n = e->offload ? 0 : hn; /* a split: one rank (plan_offload) */
    return e->dp     ? place_shard(e, host, valid)
        : e->offload ? place_host(e, host)
        : e->host_n  ? place_split(e, host)
                     : place_device(e, host);
}

void state_free(eng *e) {
    eng_backend *be = e->be;
    float *v[3] = {e->w_master, e->adam_m, e->adam_v};
    for (int i = 0; i < 3; i++) {
        if (!v[i]) continue;
        if (e->offload) free(v[i]);
        else be->free(be, v[i]);
    }
    e->w_master = e->adam_m = e->adam_v = NULL;
    for (int i = 0; i < 3; i++) { /* a split's host part */
        free(e->host_whole[i]);
        e->host_whole[i] = NULL;
    }
    offload_free(&e->off);
}

int state_footprint(const eng *e, eng_plan *p) {
    const eng_backend *be = e->be;
    long long n = e->m.n_elems, nt = eng_train_n(e), ns = eng_state_n(e), eb = be->act_bytes;
    long long vec = e->dp ? e->sh_n * e->W + e->ep_n : 0; /* a comm's vectors: the shards, then the experts */
    /* + the decode views' expert stacks beyond the gradient buffer (expert parallelism) */
    p->weights = (e->dp ? vec : n) * eb + (e->m.lora_r ? nt * eb : 0) + e->ep_dec_own;
    p->gradients = (e->dp ? vec : nt) * 4;
    long long hn = e->offload ? ns : e->host_n, dn = ns - hn; /* in host memory; in the backend's */
    p->host_state = 3 * hn * 4;
    /* the backend's memory (the host's on cpu, where the master is the weights but with a split) */
    p->master = eb == 4 && !e->m.lora_r && !e->host_n ? 0 : dn * 4;
    p->moments = 2 * dn * 4;
    snprintf(p->optimizer, sizeof p->optimizer, "%s", e->offload ? "host" : e->host_n ? "split" : "device");
    return !e->offload && be->mem_info;
}

int state_alloc(eng *e) {
    if (e->grad) return 0;
    eng_backend *be = e->be;
    size_t ng = e->dp ? (size_t)(e->sh_n * e->W + e->ep_n) * 4 : (size_t)eng_state_n(e) * 4;
    size_t n = (size_t)(eng_state_n(e) - e->host_n) * 4; /* the moments in the backend's memory */
    e->grad = be->alloc(be, ng);
    if (!e->grad) return err_set(GE_NOMEM, "gradients (%zu MiB) do not fit on %s", ng >> 20, be->name);
    if (ng > n) be->zero(be, e->grad, ng); /* with a comm: the padding stays zero */
    if (e->offload) { /* moments in host memory, zeroed (offload.h; full-parameter training only) */
        long long ns = eng_state_n(e); /* with a comm: this rank's shard */
        int rc = offload_init(&e->off, be, ns, 0);
        if (rc) return rc;
        if (!(e->adam_m = offload_host_alloc(ns)) || !(e->adam_v = offload_host_alloc(ns))) return GE_NOMEM;
    } else {
        e->adam_m = be->alloc(be, n);
        e->adam_v = be->alloc(be, n);
        if (!e->adam_m || !e->adam_v)
            return err_set(GE_NOMEM, "optimizer state (%zu MiB) does not fit on %s: try --optimizer-offload on", 2 * n >> 20,
                           be->name);
        be->zero(be, e->adam_m, n);
        be->zero(be, e->adam_v, n);
    }
    if (e->host_n) { /* a split's host moments, zeroed, and the offload's staging for its part */
        int rc = offload_init(&e->off, be, e->host_n, 0);
        if (rc) return rc;
        long long ns = eng_state_n(e);
        if (!(e->host_whole[1] = offload_host_alloc_from(ns, ns - e->host_n)) ||
            !(e->host_whole[2] = offload_host_alloc_from(ns, ns - e->host_n)))
            return GE_NOMEM;
    }
    return e->m.lora_r ? lora_grad_views(&e->m, e->grad, e->lora_sink, &e->gv) : model_views_make(&e->m, e->grad, 4, &e->gv);
}

int state_pieces(const eng *e, state_piece p[2]) {
    if (!e->dp) {
        p[0] = (state_piece){0, 0, eng_train_n(e)};
        return 1;
    }
    p[0] = (state_piece){e->sh_off, 0, e->sh_n};
    p[1] = (state_piece){e->sh_n * e->W, e->sh_n, e->ep_n}; /* expert parallelism: this rank's experts */
    return e->ep_n ? 2 : 1;
}

/* ---------------------------------------------------------------- gradients */

/* The gradient this rank steps: its shard with a comm, else all of it (the first piece). */
static float *grad_mine(eng *e) { return e->dp ? e->grad + e->sh_off : e->grad; }

void state_grad_zero(eng *e) { e->be->zero(e->be, e->grad, (size_t)(e->dp ? e->sh_n * e->W + e->ep_n : eng_train_n(e)) * 4); }

int state_grad_reduce(eng *e, int rc) {
    const model *m = &e->m;
    if (!rc && m->lora_r) /* B is held as B' = s B (lora.h): dL/dB = s dL/dB' */
        e->be->scale(e->be, e->grad + m->l_elems_a, m->l_elems - m->l_elems_a, m->lora_alpha / (float)m->lora_r);
    if (!rc) rc = e->be->sync(e->be);
    if (!e->dp) return rc;
    rc = dp_agree(e, rc);
    return rc ? rc : comm_reduce_scatter_sum(e->comm, e->grad, grad_mine(e), (size_t)e->sh_n, COMM_F32);
}

/* Sum of squares of this rank's x (its state's memory), then over the ranks in rank order. */
static int sumsq_global(eng *e, const float *x, int host, double *ss) {
    long long n = eng_state_n(e);
    *ss = host ? sumsq_cpu(x, n) : e->be->sumsq(e->be, x, n);
    return e->dp ? dp_sum(e, *ss, ss) : 0;
}

/* the experts' squares are added before the sum over ranks: each rank holds its own */
int state_grad_sumsq(eng *e, double *ss) {
    state_piece p[2];
    int np = state_pieces(e, p);
    *ss = 0;
    for (int i = 0; i < np; i++) *ss += e->be->sumsq(e->be, e->grad + p[i].vec, p[i].n);
    return e->dp ? dp_sum(e, *ss, ss) : 0;
}

void state_grad_scale(eng *e, float s) {
    state_piece p[2];
    int np = state_pieces(e, p);
    for (int i = 0; i < np; i++) e->be->scale(e->be, e->grad + p[i].vec, p[i].n, s);
}

/* ---------------------------------------------------------------- step */

/* Zero-centred norms are held as the gain 1 + w (engine/model/model.h); AdamW's decoupled decay
 * belongs to w: (1 + w)(1 - lr wd) - s + lr wd = 1 + (w (1 - lr wd) - s). Adds lr wd to this
 * rank's gain elements after the step, master and act-typed copy (these are a few vectors). */
static int gain1_decay(eng *e, float lr, float wd) {
    const model *m = &e->m;
    eng_backend *be = e->be;
    if (!m->cfg.gain1 || wd == 0 || m->lora_r) return 0;
    float add = 1.0f - (1.0f - lr * wd); /* the step's own decay factor, as adamw_consts_make rounds it */
    state_piece pc[2]; /* the norms are replicated: in the first piece (the shard, or all) */
    state_pieces(e, pc);
    float *master = eng_train_master(e);
    void *act = e->offload || e->dp || eng_train_act(e) != (void *)master ? eng_train_act(e) : NULL;
    size_t eb = (size_t)be->act_bytes;
    state_part q[2] = {{pc[0].vec, pc[0].n, {master}, e->offload}}; /* with a comm: the shard */
    int nq = e->dp ? 1 : state_parts(e, q), rc = 0;
    for (int k = 0; k < nq; k++) {
        long long lo = q[k].at, hi = lo + q[k].n;
        int host = q[k].host;
        for (int i = 0; i < m->n_params && !rc; i++) {
            const model_param *p = &m->params[i];
            long long a = p->off > lo ? p->off : lo, b = p->off + p->numel < hi ? p->off + p->numel : hi;
            if (!p->gain1 || a >= b) continue;
            size_t n = (size_t)(b - a);
            float *mp = q[k].x[0] + (a - lo), *h = host ? mp : malloc(n * sizeof(float));
            if (!h) return err_set(GE_NOMEM, "state: out of memory");
            if (!host) rc = be->to_host(be, h, mp, n * sizeof(float));
            for (size_t j = 0; !rc && j < n; j++) h[j] += add;
            if (!rc && !host) rc = be->to_dev(be, mp, h, n * sizeof(float));
            if (!rc && act) rc = be->act_from_f32(be, (char *)act + (size_t)a * eb, h, n);
            if (!host) free(h);
        }
    }
    return rc;
}

/* AdamW over the trainable parameters. With LoRA the B part is held as B' = s B (lora.h):
 * stepping it with lr s and weight decay wd / s on the true gradient s dL/dB' (made so before
 * the norm) is AdamW on B exactly. With offload (full-parameter only) the step runs on the
 * host (offload.h). */
int state_step(eng *e, const eng_optim *opt, float lr) {
    eng_backend *be = e->be;
    size_t eb = (size_t)be->act_bytes;
    int rc = 0;
    if (e->offload) { /* all of it, or this rank's shard (and its experts: state_pieces), on the host */
        state_piece p[2];
        int np = state_pieces(e, p);
        for (int i = 0; i < np && !rc; i++)
            rc = offload_adamw(&e->off, p[i].n, e->w_master + p[i].st, e->adam_m + p[i].st, e->adam_v + p[i].st,
                               (char *)e->w_act + (size_t)p[i].vec * eb, e->grad + p[i].vec, lr, opt->beta1, opt->beta2, opt->eps,
                               opt->weight_decay, e->opt_step);
    } else if (e->host_n) { /* a split: the device's part by the backend, the host's offloaded */
        state_part q[2];
        for (int k = 0, nq = state_parts(e, q); k < nq && !rc; k++) {
            char *act = (char *)e->w_act + (size_t)q[k].at * eb;
            const float *g = e->grad + q[k].at;
            if (q[k].host)
                rc = offload_adamw(&e->off, q[k].n, q[k].x[0], q[k].x[1], q[k].x[2], act, g, lr, opt->beta1, opt->beta2, opt->eps,
                                   opt->weight_decay, e->opt_step);
            else
                be->adamw(be, q[k].x[0], act, g, q[k].x[1], q[k].x[2], q[k].n, lr, opt->beta1, opt->beta2, opt->eps,
                          opt->weight_decay, e->opt_step);
        }
    } else if (e->dp) { /* this rank's shard (and its experts: state_pieces) */
        state_piece p[2];
        int np = state_pieces(e, p);
        for (int i = 0; i < np; i++)
            be->adamw(be, e->w_master + p[i].st, (char *)e->w_act + (size_t)p[i].vec * eb, e->grad + p[i].vec, e->adam_m + p[i].st,
                      e->adam_v + p[i].st, p[i].n, lr, opt->beta1, opt->beta2, opt->eps, opt->weight_decay, e->opt_step);
    } else {
        float *master = eng_train_master(e);
        void *act = eng_train_act(e) == master ? NULL : eng_train_act(e);
        long long n = eng_train_n(e), na = e->m.lora_r ? e->m.l_elems_a : n;
        be->adamw(be, master, act, e->grad, e->adam_m, e->adam_v, na, lr, opt->beta1, opt->beta2, opt->eps, opt->weight_decay,
                  e->opt_step);
        if (na < n) {
            float s = e->m.lora_alpha / (float)e->m.lora_r;
            be->adamw(be, master + na, act ? (char *)act + (size_t)na * eb : NULL, e->grad + na, e->adam_m + na, e->adam_v + na,
                      n - na, lr * s, opt->beta1, opt->beta2, opt->eps, opt->weight_decay / s, e->opt_step);
        }
    }
    if (!rc) rc = gain1_decay(e, lr, opt->weight_decay);
    if (!rc) rc = be->sync(be);
    if (e->dp && !(rc = dp_agree(e, rc))) rc = dp_gather_act(e); /* every rank's shard of the act weights */
    return rc;
}

int state_act_from_master(eng *e, int rc) {
    eng_backend *be = e->be;
    size_t eb = (size_t)be->act_bytes;
    float *master = eng_train_master(e);
    char *act = eng_train_act(e);
    if (!rc && e->host_n) { /* a split: each part from where it lives */
        state_part q[2];
        for (int k = 0, nq = state_parts(e, q); k < nq && !rc; k++) {
            char *a = act + (size_t)q[k].at * eb;
            if (q[k].host) rc = be->act_from_f32(be, a, q[k].x[0], (size_t)q[k].n);
            else be->f32_to_act(be, a, q[k].x[0], (size_t)q[k].n);
        }
    } else {
        state_piece p[2]; /* all, or this rank's shard (and its experts) */
        for (int k = 0, np = state_pieces(e, p); k < np && !rc; k++) {
            char *to = act + (size_t)p[k].vec * eb;
            const float *from = master + p[k].st;
            if (e->offload) rc = be->act_from_f32(be, to, from, (size_t)p[k].n); /* a host master, converted on its way */
            else if (to != (const char *)from) be->f32_to_act(be, to, from, (size_t)p[k].n); /* not the fp32 master itself */
        }
    }
    if (!rc) rc = be->sync(be);
    if (e->dp && !(rc = dp_agree(e, rc))) rc = dp_gather_act(e); /* every rank's shard of the act weights */
    return rc;
}

int state_sumsq_after_step(eng *e, double *w2, double *v2) {
    if (e->host_n) { /* a split (one rank): the parts' sums */
        state_part q[2];
        *w2 = *v2 = 0;
        for (int k = 0, nq = state_parts(e, q); k < nq; k++) {
            *w2 += q[k].host ? sumsq_cpu(q[k].x[0], q[k].n) : e->be->sumsq(e->be, q[k].x[0], q[k].n);
            *v2 += q[k].host ? sumsq_cpu(q[k].x[2], q[k].n) : e->be->sumsq(e->be, q[k].x[2], q[k].n);
        }
        return 0;
    }
    int rc = sumsq_global(e, eng_train_master(e), e->offload, w2);
    return rc ? rc : sumsq_global(e, e->adam_v, e->offload, v2);
}

/* ---------------------------------------------------------------- whole vectors */

long long state_whole_n(const eng *e) { return e->ep_full ? e->ep_full->n_elems : eng_train_n(e); }

int state_whole(eng *e, int moments, float *out[3], int owned[3]) {
    float *part[3] = {eng_train_master(e), e->adam_m, e->adam_v};
    int k = moments ? 3 : 1, rc = 0;
    for (int i = 0; i < 3; i++) {
        out[i] = NULL;
        owned[i] = 0;
    }
    size_t n = (size_t)eng_train_n(e), whole = e->ep_full ? (size_t)state_whole_n(e) : e->dp ? (size_t)(e->sh_n * e->W) : n;
    if (e->offload && !e->dp) { /* host state of one rank: written from where it lives, no copy */
        for (int i = 0; i < k; i++) out[i] = part[i];
        return 0;
    }
    if (e->host_n) { /* a split: the host part where it lives, the device's copied in front of it */
        for (int i = 0; i < k && !rc; i++) {
            out[i] = e->host_whole[i];
            /* touched over the threads first (see below: pageable first faults inside a copy) */
            long long d = (long long)n - e->host_n, blk = 1LL << 22;
#pragma omp parallel for schedule(static)
            for (long long b = 0; b < (d + blk - 1) / blk; b++)
                memset(out[i] + b * blk, 0, (size_t)((d - b * blk < blk ? d - b * blk : blk) * 4));
            rc = e->be->to_host(e->be, out[i], part[i], (n - (size_t)e->host_n) * 4);
        }
        return rc;
    }
    for (int i = 0; i < k && e->rank == 0 && !rc; i++)
        /* touched over the threads before the copy (offload_host_alloc): a copy from the device
         * into untouched pageable memory pays each page's first fault inside it, one at a time
         * (a 20 GB capture took 17.9 s on an H200 host) */
        if (!(out[i] = offload_host_alloc((long long)whole)))
            rc = err_set(GE_NOMEM, "checkpoint: out of memory (%zu MiB)", whole * 4 >> 20);
        else owned[i] = 1;
    if (e->dp) { /* shards gathered into rank 0's host memory */
        rc = dp_agree(e, rc);
        for (int i = 0; i < k && !rc; i++)
            rc = e->ep_full ? ep_whole(e, part[i], out[i]) /* the experts too, in the layout without expert parallelism */
                            : dp_agree(e, dp_gather_to_host(e, part[i], out[i]));
    } else { /* one rank: each part from where it lives (a split: two) */
        state_part q[2];
        for (int j = 0, nq = state_parts(e, q); j < nq && !rc; j++)
            for (int i = 0; i < k && !rc; i++) {
                float *dst = out[i] + q[j].at;
                if (q[j].host) memcpy(dst, q[j].x[i], (size_t)q[j].n * 4);
                else rc = e->be->to_host(e->be, dst, q[j].x[i], (size_t)q[j].n * 4);
            }
    }
    if (rc) state_whole_free(out, owned);
    return rc;
}

void state_whole_free(float *out[3], const int owned[3]) {
    for (int i = 0; i < 3; i++) {
        if (owned[i]) free(out[i]);
        out[i] = NULL;
    }
}

int state_moments_in(eng *e, float *buf[2], int owned[2]) {
    int rc = state_alloc(e);
    size_t n = (size_t)eng_train_n(e);
    for (int i = 0; i < 2; i++) {
        owned[i] = !(e->offload && !e->dp) && !e->host_n; /* host state of one rank: read in place */
        buf[i] = rc ? NULL : e->host_n ? e->host_whole[1 + i] : !owned[i] ? (i ? e->adam_v : e->adam_m) : malloc(n * 4);
        if (!rc && !buf[i]) rc = err_set(GE_NOMEM, "checkpoint: out of memory (%zu MiB)", n * 4 >> 20);
    }
    if (rc)
        for (int i = 0; i < 2; i++) {
            if (owned[i]) free(buf[i]);
            buf[i] = NULL;
            owned[i] = 0;
        }
    return rc;
}

int state_set_moments(eng *e, float *buf[2], const int owned[2]) {
    long long n = eng_train_n(e);
    if (e->host_n) { /* a split (one rank): read into host_whole; the device's part moved there */
        long long d = n - e->host_n;
        int rc = 0;
        for (int i = 0; i < 2 && !rc; i++) {
            rc = e->be->to_dev(e->be, i ? e->adam_v : e->adam_m, buf[i], (size_t)d * 4);
            offload_host_release(buf[i], d);
        }
        return rc;
    }
    state_piece p[2];
    int np = state_pieces(e, p);
    float *dst[2] = {e->adam_m, e->adam_v};
    int rc = 0;
    for (int k = 0; k < np; k++) { /* the shard's padding past n is not in buf: stays zero */
        long long cnt = p[k].vec >= n ? 0 : n - p[k].vec < p[k].n ? n - p[k].vec : p[k].n;
        for (int i = 0; i < 2 && !rc && cnt; i++) {
            if (!owned[i]) continue; /* read in place */
            if (e->offload) memcpy(dst[i] + p[k].st, buf[i] + p[k].vec, (size_t)cnt * 4); /* a host shard */
            else rc = e->be->to_dev(e->be, dst[i] + p[k].st, buf[i] + p[k].vec, (size_t)cnt * 4);
        }
    }
    for (int i = 0; i < 2; i++)
        if (owned[i]) free(buf[i]);
    return rc;
}
