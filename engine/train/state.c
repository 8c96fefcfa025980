/* state.c — the training state (state.h): where it lives is decided here, once. state_open
 * places it (device, host with offload, a shard with a comm, a split of device and host);
 * state_parts describes this rank's optimizer state part by part, and each function below loops
 * over those parts, or over the gradients' pieces (state_pieces), without asking again. */
#include "engine/train/state.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/bf16.h"
#include "common/err.h"
#include "engine/model/lora.h"
#include "engine/train/offload.h"
#include "kernels/adamw.h"

/* ---------------------------------------------------------------- placement */

/* With a comm (dp.c): act weights whole (padded to W shards), the fp32 master only for this
 * rank's shard [off, off + valid) of the loaded (or resumed) weights, and its experts whole after
 * the shard; in host memory with offload, where the loaded weights' buffer (*host, taken: set to
 * NULL) becomes the master in place, so that opening never holds both (at 30B-A3B dims on 2 GPUs
 * that is 57 GiB a rank). */
static int place_shard(eng *e, float **hostp, long long valid) {
    const float *host = *hostp;
    eng_backend *be = e->be;
    size_t n = (size_t)e->m.n_elems, eb = (size_t)be->act_bytes, S = (size_t)e->sh_n, whole = S * (size_t)e->W + (size_t)e->ep_n,
           pad = whole - n;
    size_t ns = S + (size_t)e->ep_n;
    int rc = dp_open(e);
    if (!rc) rc = plan_host_peers(e); /* one exchange of the host names, for the plan */
    /* every rank of this host together; the loaded weights (n floats, the master's room) are held */
    if (!rc && e->offload) rc = plan_host_state(e, (long long)ns * state_elem_bytes(e), (long long)n * 4, 0);
    if (rc) return rc;
    e->w_act = be->alloc(be, whole * eb);
    if (!e->w_act) return GE_NOMEM;
    if ((rc = be->act_from_f32(be, e->w_act, host, n))) return rc; /* synchronous: host may change after */
    if (pad) be->zero(be, (char *)e->w_act + n * eb, pad * eb);
    if (e->offload) { /* the shard to the front, zero-padded, then this rank's experts whole */
        float *h = *hostp;
        memmove(h, h + e->sh_off, (size_t)valid * 4);
        memset(h + valid, 0, (S - (size_t)valid) * 4);
        if (e->ep_n) memmove(h + S, h + S * (size_t)e->W, (size_t)e->ep_n * 4);
        float *m = ns <= n ? realloc(h, ns * 4) : NULL; /* a shrink: in place */
        e->w_master = m ? m : h;
        *hostp = NULL;
        return 0;
    }
    if (!(e->w_master = be->alloc(be, ns * 4))) return GE_NOMEM;
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
    int rc = plan_host_state(e, (long long)n * state_elem_bytes(e), (long long)n * 4, (long long)n * 4);
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
    int rc = plan_host_state(e, (long long)hn * 12, (long long)n * 4, (long long)hn * 4);
    if (rc) return rc;
    if (!(e->host_whole[0] = offload_host_alloc_from((long long)n, (long long)d))) return GE_NOMEM;
    memcpy(e->host_whole[0] + d, host + d, hn * sizeof(float));
    if (!(e->w_master = be->alloc(be, d * sizeof(float)))) return GE_NOMEM;
    if ((rc = be->to_dev(be, e->w_master, host, d * sizeof(float)))) return rc;
    if (!(e->w_act = be->alloc(be, n * (size_t)be->act_bytes))) return GE_NOMEM;
    return be->act_from_f32(be, e->w_act, host, n);
}

/* Where this rank's optimizer state lives, described once for every function below: elements
 * [at, at + n) of the trainable vector (weights, gradients) with their master, m and v at x[0..2]
 * (the moments NULL before state_alloc), in host memory when host. The pieces (state_pieces: all,
 * or with a comm the shard and then this rank's experts) where e->offload puts them; a split's
 * single piece cut at d = n - host_n, [d, n) being the tails of host_whole. Returns the count. */
typedef struct {
    long long at, n;
    void *x[3]; /* master (fp32), m, v (fp32, or bf16 bits with e->m16: state_at) */
    int host; /* 1: host memory */
} state_part;
/* Element i of vector x (0 master, 1 m, 2 v) whose element 0 is at p. */
static void *state_at(const eng *e, void *p, int x, long long i) {
    return p ? (char *)p + (size_t)i * (x && e->m16 ? 2 : 4) : NULL;
}
static int state_parts(const eng *e, state_part q[2]) {
    void *base[3] = {eng_train_master(e), e->adam_m, e->adam_v};
    state_piece p[2];
    int np = state_pieces(e, p);
    p[0].n -= e->host_n;
    for (int k = 0; k < np; k++) {
        q[k] = (state_part){p[k].vec, p[k].n, {0}, e->offload};
        for (int i = 0; i < 3; i++) q[k].x[i] = state_at(e, base[i], i, p[k].st);
    }
    if (!e->host_n) return np;
    q[1] = (state_part){p[0].n, e->host_n, {0}, 1}; /* a split: one rank, one piece */
    for (int i = 0; i < 3; i++) q[1].x[i] = e->host_whole[i] ? e->host_whole[i] + p[0].n : NULL;
    return 2;
}

int state_elem_bytes(const eng *e) { return e->m16 ? 8 : 12; }

/* n elements of host vector x (0 master, 1 m, 2 v) at src into dst as fp32, over the threads. */
static void host_to_f32(const eng *e, int x, float *dst, const void *src, long long n) {
    if (!x || !e->m16) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    const uint16_t *h = src;
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < n; i++) dst[i] = f32_from_bf16(h[i]);
}
/* n fp32 moments into dst (fp32, or rounded to nearest even into bf16 bits with e->m16). */
static void moments_from_f32(const eng *e, void *dst, const float *src, long long n) {
    if (!e->m16) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    uint16_t *h = dst;
#pragma omp parallel for schedule(static)
    for (long long i = 0; i < n; i++) h[i] = bf16_from_f32(src[i]);
}

/* The act-typed weights of part q, NULL where they are its fp32 master itself (one rank on a
 * fp32 backend, the state on it). */
static char *part_act(const eng *e, const state_part *q) {
    char *a = (char *)eng_train_act(e) + (size_t)q->at * (size_t)e->be->act_bytes;
    return a == (char *)q->x[0] ? NULL : a;
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

int state_open(eng *e, float **host, const char *offload_mode) {
    /* the replicated elements (all without expert parallelism; its experts follow, ep.c) */
    long long nr = e->ep_full ? e->m.ep_n0 : e->m.n_elems;
    long long S = e->dp ? (nr + e->W - 1) / e->W : 0, off = S * e->rank, valid = off >= nr ? 0 : (nr - off < S ? nr - off : S);
    e->sh_n = S;
    e->sh_off = off;
    e->ep_n = e->ep_full ? e->m.n_elems - nr : 0;
    long long ns = e->dp ? S + e->ep_n : e->m.n_elems, hn; /* a comm's: this rank's shard */
    const char *auto_on = offload_mode && *offload_mode && strcmp(offload_mode, "auto") ? offload_mode : "on";
    int rc = plan_offload(e, e->m16 ? auto_on : offload_mode, ns, &hn); /* bf16 moments: auto is on */
    if (rc) return rc;
    e->offload = hn && hn == ns;
    e->host_n = e->offload ? 0 : hn; /* a split: one rank (plan_offload) */
    if (e->m16 && !e->offload)
        return err_set(GE_UNSUPPORTED,
                       "optimizer_moments bf16: the bf16 moments are kept in host memory only, and this "
                       "state is %s: use it with optimizer_offload on",
                       e->host_n ? "split between the device and the host" : "on the device");
    return e->dp     ? place_shard(e, host, valid)
        : e->offload ? place_host(e, *host)
        : e->host_n  ? place_split(e, *host)
                     : place_device(e, *host);
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
    p->host_state = hn * state_elem_bytes(e);
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
        e->off.m16 = e->m16;
        long long nf = e->m16 ? (ns + 1) / 2 : ns; /* floats' room for ns moments */
        if (!(e->adam_m = offload_host_alloc(nf)) || !(e->adam_v = offload_host_alloc(nf))) return GE_NOMEM;
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
    size_t eb = (size_t)be->act_bytes;
    state_part q[2];
    int rc = 0;
    for (int k = 0, nq = state_parts(e, q); k < nq; k++) {
        long long lo = q[k].at, hi = lo + q[k].n;
        int host = q[k].host;
        char *act = part_act(e, &q[k]);
        for (int i = 0; i < m->n_params && !rc; i++) {
            const model_param *p = &m->params[i];
            long long a = p->off > lo ? p->off : lo, b = p->off + p->numel < hi ? p->off + p->numel : hi;
            if (!p->gain1 || a >= b) continue;
            size_t n = (size_t)(b - a);
            float *mp = (float *)q[k].x[0] + (a - lo), *h = host ? mp : malloc(n * sizeof(float));
            if (!h) return err_set(GE_NOMEM, "state: out of memory");
            if (!host) rc = be->to_host(be, h, mp, n * sizeof(float));
            for (size_t j = 0; !rc && j < n; j++) h[j] += add;
            if (!rc && !host) rc = be->to_dev(be, mp, h, n * sizeof(float));
            if (!rc && act) rc = be->act_from_f32(be, act + (size_t)(a - lo) * eb, h, n);
            if (!host) free(h);
        }
    }
    return rc;
}

/* AdamW over elements [a, a + n) of part q, where it lives: in host memory by the offload
 * (offload.h), else by the backend. */
static int part_adamw(eng *e, const state_part *q, long long a, long long n, const eng_optim *opt, float lr, float wd) {
    eng_backend *be = e->be;
    char *act = part_act(e, q);
    float *x = (float *)q->x[0] + a;
    void *m = state_at(e, q->x[1], 1, a), *v = state_at(e, q->x[2], 2, a);
    const float *g = e->grad + q->at + a;
    if (act) act += (size_t)a * (size_t)be->act_bytes;
    if (q->host) return offload_adamw(&e->off, n, x, m, v, act, g, lr, opt->beta1, opt->beta2, opt->eps, wd, e->opt_step);
    be->adamw(be, x, act, g, m, v, n, lr, opt->beta1, opt->beta2, opt->eps, wd, e->opt_step);
    return 0;
}

/* AdamW over the trainable parameters, each part where it lives. With LoRA the B part is held
 * as B' = s B (lora.h): stepping it with lr s and weight decay wd / s on the true gradient
 * s dL/dB' (made so before the norm) is AdamW on B exactly (LoRA: one rank, one part). */
int state_step(eng *e, const eng_optim *opt, float lr) {
    eng_backend *be = e->be;
    float s = e->m.lora_r ? e->m.lora_alpha / (float)e->m.lora_r : 1;
    state_part q[2];
    int rc = 0;
    e->off.bad = (adamw_bad){0, 0}; /* the host parts' steps count into it */
    for (int k = 0, nq = state_parts(e, q); k < nq && !rc; k++) {
        long long na = e->m.lora_r ? e->m.l_elems_a : q[k].n; /* from na: LoRA's B part */
        rc = part_adamw(e, &q[k], 0, na, opt, lr, opt->weight_decay);
        if (!rc && na < q[k].n) rc = part_adamw(e, &q[k], na, q[k].n - na, opt, lr * s, opt->weight_decay / s);
    }
    if (!rc) rc = gain1_decay(e, lr, opt->weight_decay);
    if (!rc) rc = be->sync(be);
    if (e->dp && !(rc = dp_agree(e, rc))) rc = dp_gather_act(e); /* every rank's shard of the act weights */
    return rc;
}

int state_act_from_master(eng *e, int rc) {
    eng_backend *be = e->be;
    state_part q[2];
    for (int k = 0, nq = state_parts(e, q); k < nq && !rc; k++) {
        char *act = part_act(e, &q[k]);
        if (q[k].host) rc = be->act_from_f32(be, act, q[k].x[0], (size_t)q[k].n); /* converted on its way */
        else if (act) be->f32_to_act(be, act, q[k].x[0], (size_t)q[k].n); /* not the fp32 master itself */
    }
    if (!rc) rc = be->sync(be);
    if (e->dp && !(rc = dp_agree(e, rc))) rc = dp_gather_act(e); /* every rank's shard of the act weights */
    return rc;
}

int state_check_after_step(eng *e, int *bad_w, int *bad_v) {
    state_part q[2];
    int nq = state_parts(e, q);
    double w = e->off.bad.w > 0, v = e->off.bad.v > 0;
    for (int k = 0; k < nq; k++)
        if (!q[k].host) {
            w += !isfinite(e->be->sumsq(e->be, q[k].x[0], q[k].n));
            v += !isfinite(e->be->sumsq(e->be, q[k].x[2], q[k].n));
        }
    int rc = e->dp ? dp_sum(e, w, &w) : 0;
    if (!rc && e->dp) rc = dp_sum(e, v, &v);
    *bad_w = w > 0;
    *bad_v = v > 0;
    return rc;
}

/* ---------------------------------------------------------------- whole vectors */

long long state_whole_n(const eng *e) { return e->ep_full ? e->ep_full->n_elems : eng_train_n(e); }

/* Rank 0's host buffer for the whole vector i (0 master, 1 m, 2 v) of state_whole, touched over
 * the threads where the device's part will be copied in: a copy from the device into untouched
 * pageable memory pays each page's first fault inside it, one at a time (a 20 GB capture took
 * 17.9 s on an H200 host). One rank's host state is itself the buffer, a split's host_whole
 * holds its host part in place, else a new one (offload_host_alloc touches it: *owned = 1). */
static float *whole_buf(eng *e, const state_part *q, int i, size_t whole, int *owned) {
    if (e->offload && !e->dp && !(i && e->m16)) return q->x[i];
    if (e->host_n) {
        float *p = e->host_whole[i];
        long long d = q->n, blk = 1LL << 22; /* the device's part, in front */
#pragma omp parallel for schedule(static)
        for (long long b = 0; b < (d + blk - 1) / blk; b++)
            memset(p + b * blk, 0, (size_t)((d - b * blk < blk ? d - b * blk : blk) * 4));
        return p;
    }
    float *p = offload_host_alloc((long long)whole);
    if (!p) err_set(GE_NOMEM, "checkpoint: out of memory (%zu MiB)", whole * 4 >> 20);
    *owned = !!p;
    return p;
}

int state_whole(eng *e, int moments, float *out[3], int owned[3]) {
    int k = moments ? 3 : 1, rc = 0;
    for (int i = 0; i < 3; i++) {
        out[i] = NULL;
        owned[i] = 0;
    }
    size_t whole = e->ep_full ? (size_t)state_whole_n(e) : e->dp ? (size_t)(e->sh_n * e->W) : (size_t)eng_train_n(e);
    state_part q[2];
    int nq = state_parts(e, q);
    for (int i = 0; i < k && e->rank == 0 && !rc; i++)
        if (!(out[i] = whole_buf(e, &q[0], i, whole, &owned[i]))) rc = GE_NOMEM;
    if (e->dp) { /* shards gathered into rank 0's host memory, from the start of this rank's state */
        rc = dp_agree(e, rc);
        for (int i = 0; i < k && !rc; i++) {
            float *src = q[0].x[i];
            long long ns = eng_state_n(e);
            if (i && e->m16) { /* bf16 moments: this rank's as fp32 first */
                if ((src = malloc((size_t)ns * 4))) host_to_f32(e, i, src, q[0].x[i], ns);
                else err_set(GE_NOMEM, "checkpoint: out of memory (%lld MiB)", ns * 4 >> 20);
                if ((rc = dp_agree(e, src ? 0 : GE_NOMEM))) break;
            }
            rc = e->ep_full ? ep_whole(e, src, out[i]) /* the experts too, in the layout without expert parallelism */
                            : dp_agree(e, dp_gather_to_host(e, src, out[i]));
            if (src != q[0].x[i]) free(src);
        }
    } else /* one rank: each part not already in place, from where it lives */
        for (int j = 0; j < nq && !rc; j++)
            for (int i = 0; i < k && !rc; i++) {
                float *dst = out[i] + q[j].at;
                if (dst == q[j].x[i]) continue;
                if (q[j].host) host_to_f32(e, i, dst, q[j].x[i], q[j].n);
                else rc = e->be->to_host(e->be, dst, q[j].x[i], (size_t)q[j].n * 4);
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
        owned[i] = !(e->offload && !e->dp && !e->m16) && !e->host_n; /* fp32 host state of one rank: read in place */
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
    state_part q[2];
    int rc = 0;
    for (int k = 0, nq = state_parts(e, q); k < nq; k++) { /* the shard's padding past n is not in buf: stays zero */
        long long cnt = q[k].at >= n ? 0 : n - q[k].at < q[k].n ? n - q[k].at : q[k].n;
        for (int i = 0; i < 2 && !rc && cnt; i++) {
            void *dst = q[k].x[1 + i];
            float *src = buf[i] + q[k].at;
            if (dst == src) continue; /* read in place */
            if (q[k].host) moments_from_f32(e, dst, src, cnt);
            else rc = e->be->to_dev(e->be, dst, src, (size_t)cnt * 4);
        }
    }
    for (int i = 0; i < 2; i++)
        if (owned[i]) free(buf[i]);
        else if (e->host_n) offload_host_release(buf[i], n - e->host_n); /* a split's device part, moved */
    return rc;
}
