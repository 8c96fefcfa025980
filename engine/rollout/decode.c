/* decode.c — one generation step: forward, lm head of the chosen rows, one draw per row, all on
 * the backend (op `sample`, kernels/sampling.h: per-row temperature / top_k / top_p / min_p /
 * ban / allow mask, Gumbel-max keyed by the row's key). A step moves one packed staging buffer to
 * the device (tokens, positions, ranges, slots, rows, row parameters, the ban list; then the
 * rows' allow masks, only as many as the step has) and R ids + R logprobs back.
 *
 * CUDA graphs (backends with graph ops, steps of at most DEC_GRAPH_T tokens): the step is padded
 * to a power-of-two bucket of tokens Tb (extra tokens repeat the last real one: same slot, same
 * values, but no state row (-1), which the DeltaNet steps skip; extra rows repeat the last row;
 * their outputs are ignored) and the whole step —
 * model_forward_dev, lm head, sample — is captured once per bucket and replayed. The first step
 * of a bucket runs uncaptured (it grows the scratch, makes the GEMM plans); the second captures.
 * A graph is dropped when what it captured moves or is laid out anew: the KV cache (address
 * or rows), the activations (address or capacities), the weights, the logits buffer or the
 * backend's scratch (checked by the backend). Everything else runs the same ops directly. */
#include <stdlib.h>
#include <string.h>

#include "engine/rollout/decode.h"
#include "common/err.h"
#include "engine/engine_internal.h"

enum { DEC_GRAPH_T = 512, DEC_BUCKETS = 10, DEC_BAN_CAP = 1024 };

typedef struct {
    void *g; /* backend graph, or NULL */
    int warm; /* ran once uncaptured */
    const void *kv, *st, *acts, *w, *lm, *logits; /* what the capture read */
    int kv_cap, acts_cap, acts_capm; /* KV rows, activation tokens / predictions: the layouts
                                          inside kv and acts (a freed and reallocated pool can
                                          come back at the same address with another size) */
    tune_opts tune; /* the knobs at capture: a test switching one (exact mode) re-captures */
} dec_graph;

struct dec_state {
    int cap_T, cap_R, cap_M; /* staging capacity: tokens, rows, allow masks */
    int mask_words; /* a mask's words (sampling_mask_words(V)) */
    size_t in_bytes; /* the uploaded part of the staging */
    char *h, *d; /* staging: host (pinned when the backend can) and device */
    int pinned;
    float *dlogits; /* (cap_L, V) device */
    int cap_L;
    int *dtop; /* device: cap_top positions, then (cap_top, ENG_TOP_MAX) ids and logprobs */
    int cap_top;
    dec_graph graph[DEC_BUCKETS];
};

/* Staging layout (byte offsets for capacities cT tokens, cR rows, cM masks of mw words): 8 token
 * arrays, rows, the ban list, then the row params (32-byte aligned), then the outputs (tok,
 * logprob), then the masks (uploaded apart, as many as a step has). */
typedef struct {
    size_t tok, pos, a0, a1, b0, b1, slot, srow, rows, ban, prm, out_tok, out_lp, masks, in_bytes, total;
} dec_layout;
static dec_layout layout(int cT, int cR, int cM, int mw) {
    dec_layout L;
    size_t t = (size_t)cT * 4;
    L.tok = 0;
    L.pos = t;
    L.a0 = 2 * t;
    L.a1 = 3 * t;
    L.b0 = 4 * t;
    L.b1 = 5 * t;
    L.slot = 6 * t;
    L.srow = 7 * t;
    L.rows = 8 * t;
    L.ban = L.rows + (size_t)cR * 4;
    L.prm = (L.ban + (1 + DEC_BAN_CAP) * 4 + 31) & ~(size_t)31;
    L.in_bytes = L.prm + (size_t)cR * sizeof(sample_params);
    L.out_tok = L.in_bytes;
    L.out_lp = L.out_tok + (size_t)cR * 4;
    L.masks = L.out_lp + (size_t)cR * 4;
    L.total = L.masks + (size_t)cM * mw * 4;
    return L;
}

static void drop_graphs(eng *e) {
    dec_state *d = e->dec;
    eng_backend *be = e->be;
    for (int i = 0; i < DEC_BUCKETS; i++) {
        if (d->graph[i].g) be->graph_free(be, d->graph[i].g);
        memset(&d->graph[i], 0, sizeof d->graph[i]);
    }
}

static void free_staging(eng *e) {
    dec_state *d = e->dec;
    eng_backend *be = e->be;
    if (d->d) be->free(be, d->d);
    if (d->h) {
        if (d->pinned) be->host_free(be, d->h);
        else free(d->h);
    }
    d->h = d->d = NULL;
}

void dec_free(eng *e) {
    dec_state *d = e->dec;
    if (!d) return;
    drop_graphs(e);
    free_staging(e);
    if (d->dlogits) e->be->free(e->be, d->dlogits);
    if (d->dtop) e->be->free(e->be, d->dtop);
    free(d);
    e->dec = NULL;
}

static int grow(int have, int need, int first) {
    int c = have ? have : first;
    while (c < need) c *= 2;
    return c;
}

/* Room for T tokens, R rows and M masks (staging) and R rows of logits; growing drops the graphs. */
static int reserve(eng *e, int T, int R, int M) {
    eng_backend *be = e->be;
    if (!e->dec && !(e->dec = calloc(1, sizeof(dec_state)))) return err_set(GE_NOMEM, "decode: out of memory");
    dec_state *d = e->dec;
    if (T > d->cap_T || R > d->cap_R || M > d->cap_M) {
        drop_graphs(e);
        free_staging(e);
        d->cap_T = grow(d->cap_T, T, DEC_GRAPH_T);
        d->cap_R = grow(d->cap_R, R, DEC_GRAPH_T);
        d->cap_M = M > d->cap_M ? grow(d->cap_M, M, 4) : d->cap_M;
        d->mask_words = sampling_mask_words(eng_dec_model(e)->cfg.V);
        dec_layout L = layout(d->cap_T, d->cap_R, d->cap_M, d->mask_words);
        d->in_bytes = L.in_bytes;
        d->pinned = be->host_alloc != NULL;
        d->h = d->pinned ? be->host_alloc(be, L.total) : malloc(L.total);
        d->d = be->alloc(be, L.total);
        if (!d->h || !d->d) {
            free_staging(e);
            d->cap_T = d->cap_R = d->cap_M = 0;
            return err_set(GE_NOMEM, "decode: out of memory for a step of %d tokens, %d rows", T, R);
        }
    }
    if (R > d->cap_L) {
        drop_graphs(e);
        if (d->dlogits) be->free(be, d->dlogits);
        d->cap_L = grow(d->cap_L, R, 16);
        d->dlogits = be->alloc(be, (size_t)d->cap_L * eng_dec_model(e)->cfg.V * sizeof(float));
        if (!d->dlogits) {
            d->cap_L = 0;
            return err_set(GE_NOMEM, "decode: out of memory for %d rows of logits", R);
        }
    }
    return 0;
}

/* Queues the step on the staged inputs: T tokens, R rows (srow: the staged state rows are set). */
static void queue_step(eng *e, model_kv *kv, int T, int R, int srow) {
    dec_state *d = e->dec;
    eng_backend *be = e->be;
    const model *m = eng_dec_model(e);
    const model_views *wv = eng_dec_views(e);
    const model_config *c = &m->cfg;
    dec_layout L = layout(d->cap_T, d->cap_R, d->cap_M, d->mask_words);
    char *b = d->d;
    model_dev_input di = {.T = T,
                          .M = 0,
                          .tokens = (int *)(b + L.tok),
                          .pos = (int *)(b + L.pos),
                          .slot = (int *)(b + L.slot),
                          .srow = srow ? (int *)(b + L.srow) : NULL,
                          .r = {(int *)(b + L.a0), (int *)(b + L.a1), (int *)(b + L.b0), (int *)(b + L.b1)},
                          .routes = e->acts_ng.routes}; /* recorded (MoE; NULL for a dense model) */
    model_forward_dev(m, wv, &e->acts_ng, kv, &di, 1.0f, 0);
    be->lm_head_rows(be, d->dlogits, e->acts_ng.lnf, (int *)(b + L.rows), wv->lm_head, R, c->C, c->V);
    be->sample(be, (int *)(b + L.out_tok), (float *)(b + L.out_lp), d->dlogits, (sample_params *)(b + L.prm), (int *)(b + L.ban),
               d->cap_M ? (uint32_t *)(b + L.masks) : NULL, R, c->V);
}

/* The k most likely tokens of top's rows, from the step's final-norm output (still in the
 * activations) through the logprob head's logprob_top: one call per temperature among them
 * (1 when greedy), as eng_logprobs_top scores a position. */
static int step_top(eng *e, const int *rows, const sample_params *p, const dec_top *top) {
    eng_backend *be = e->be;
    dec_state *d = e->dec;
    const model_config *c = &eng_dec_model(e)->cfg;
    int n = top->n, K = top->k, rc = 0;
    if (n > d->cap_top) {
        if (d->dtop) be->free(be, d->dtop);
        d->cap_top = grow(d->cap_top, n, 16);
        if (!(d->dtop = be->alloc(be, (size_t)d->cap_top * (1 + 2 * ENG_TOP_MAX) * 4))) {
            d->cap_top = 0;
            return err_set(GE_NOMEM, "decode: out of memory for the top tokens of %d rows", n);
        }
    }
    int *dpos = d->dtop, *dids = dpos + d->cap_top;
    float *dlps = (float *)(dids + (size_t)d->cap_top * ENG_TOP_MAX);
    int *pos = malloc(sizeof(int) * (size_t)n * (2 + K)), *which = pos + n, *hid = which + n;
    float *hlp = malloc(sizeof(float) * (size_t)n * K);
    char *done = calloc((size_t)n, 1);
    if (!pos || !hlp || !done) rc = err_set(GE_NOMEM, "decode: out of memory for the top tokens of %d rows", n);
    for (int i = 0; !rc && i < n; i++) {
        if (done[i]) continue;
        float T = p[top->rows[i]].temperature;
        int M = 0;
        for (int j = i; j < n; j++)
            if (!done[j] && p[top->rows[j]].temperature == T) {
                which[M] = j;
                pos[M++] = rows[top->rows[j]];
                done[j] = 1;
            }
        if ((rc = be->to_dev(be, dpos, pos, (size_t)M * 4))) break;
        be->logprob_top(be, dids, dlps, e->acts_ng.lnf, dpos, eng_dec_views(e)->lm_head, M, c->C, c->V, T > 0 ? T : 1.0f, K);
        if ((rc = be->to_host(be, hid, dids, (size_t)M * K * 4)) || (rc = be->to_host(be, hlp, dlps, (size_t)M * K * 4))) break;
        for (int q = 0; q < M; q++) {
            memcpy(top->ids + (size_t)which[q] * K, hid + (size_t)q * K, (size_t)K * 4);
            memcpy(top->lps + (size_t)which[q] * K, hlp + (size_t)q * K, (size_t)K * 4);
        }
    }
    free(pos);
    free(hlp);
    free(done);
    return rc;
}

static int bucket_of(int T, int *Tb) {
    int i = 0, b = 1;
    while (b < T) {
        b *= 2;
        i++;
    }
    *Tb = b;
    return i;
}

int dec_step(eng *e, model_kv *kv, const model_input *in, int R, const int *rows, const sample_params *p, const int *ban,
             int n_ban, const uint32_t *allow, int n_allow, const dec_top *top, int *ids, float *lps, int *routes) {
    eng_backend *be = e->be;
    const model *m = eng_dec_model(e);
    const model_views *wv = eng_dec_views(e);
    int T = in->T, rc;
    if (!kv || !in->slot) return err_set(GE_INTERNAL, "dec_step: needs a KV cache and slots");
    if (kv->cap_st && !in->srow) return err_set(GE_INTERNAL, "dec_step: a hybrid model's step needs its state rows");
    if (n_ban > DEC_BAN_CAP) return err_set(GE_INVALID, "decode: %d banned ids (at most %d)", n_ban, DEC_BAN_CAP);
    if ((rc = ep_decode_ready(e))) return rc;
    if (!R) { /* a forward only */
        if ((rc = eng_acts_reserve(e, &e->acts_ng, T, 1, 0))) return rc;
        rc = model_forward(m, wv, &e->acts_ng, kv, in, 1.0f, 0);
        return rc || !routes ? rc : model_routes_get(m, &e->acts_ng, T, T, routes);
    }
    int Tb = T, bi = -1;
    int graphs = be->graph_begin && T <= DEC_GRAPH_T && R <= T && be->tune.graphs;
    if (graphs) bi = bucket_of(T, &Tb);
    int Rb = graphs ? Tb : R;
    if ((rc = reserve(e, Tb, Rb, allow ? n_allow : 0)) || (rc = eng_acts_reserve(e, &e->acts_ng, Tb, 1, 0))) return rc;
    dec_state *d = e->dec;

    /* stage the inputs (padded to the bucket) */
    dec_layout L = layout(d->cap_T, d->cap_R, d->cap_M, d->mask_words);
    char *h = d->h;
    const int *src[8] = {in->tokens, in->pos, in->a0, in->a1, in->b0, in->b1, in->slot, in->srow};
    size_t off[8] = {L.tok, L.pos, L.a0, L.a1, L.b0, L.b1, L.slot, L.srow};
    for (int i = 0; i < 8; i++) {
        if (!src[i]) continue;
        int *x = (int *)(h + off[i]);
        memcpy(x, src[i], (size_t)T * 4);
        for (int t = T; t < Tb; t++) x[t] = off[i] == L.srow ? -1 : x[T - 1]; /* no state row: the steps skip it */
    }
    int *xr = (int *)(h + L.rows);
    sample_params *xp = (sample_params *)(h + L.prm);
    for (int i = 0; i < Rb; i++) {
        xr[i] = rows[i < R ? i : R - 1];
        xp[i] = p[i < R ? i : R - 1];
    }
    int *xb = (int *)(h + L.ban);
    xb[0] = ban ? n_ban : 0;
    if (ban && n_ban) memcpy(xb + 1, ban, (size_t)n_ban * 4);
    rc = be->to_dev_async ? be->to_dev_async(be, d->d, h, d->in_bytes) : be->to_dev(be, d->d, h, d->in_bytes);
    if (rc) return rc;
    if (allow && n_allow) { /* the masks the step's rows name (p[i].allow), after the outputs */
        size_t mb = (size_t)n_allow * d->mask_words * 4;
        memcpy(h + L.masks, allow, mb);
        rc = be->to_dev_async ? be->to_dev_async(be, d->d + L.masks, h + L.masks, mb)
                              : be->to_dev(be, d->d + L.masks, h + L.masks, mb);
        if (rc) return rc;
    }

    if (!graphs) {
        queue_step(e, kv, T, R, in->srow != NULL);
    } else {
        dec_graph *g = &d->graph[bi];
        const model_acts *A = &e->acts_ng;
        if (g->g &&
            (g->kv != kv->mem || g->st != kv->st_mem || g->kv_cap != kv->cap_S || g->acts != A->mem || g->acts_cap != A->cap_T ||
             g->acts_capm != A->cap_M || g->w != wv->embed || g->lm != wv->lm_head || g->logits != d->dlogits ||
             memcmp(&g->tune, &be->tune, sizeof be->tune))) {
            be->graph_free(be, g->g);
            g->g = NULL;
        }
        int launched = 0;
        if (g->g) {
            if ((rc = be->graph_launch(be, g->g)) < 0) return rc;
            if (rc == 1) {
                be->graph_free(be, g->g);
                g->g = NULL;
            } else launched = 1;
        }
        if (!launched && !g->warm) {
            queue_step(e, kv, Tb, Rb, in->srow != NULL);
            g->warm = 1;
            launched = 1;
        }
        if (!launched) {
            if ((rc = be->graph_begin(be))) return rc;
            queue_step(e, kv, Tb, Rb, in->srow != NULL);
            if ((rc = be->graph_end(be, &g->g))) return rc;
            *g = (dec_graph){.g = g->g,
                             .warm = 1,
                             .kv = kv->mem,
                             .st = kv->st_mem,
                             .acts = e->acts_ng.mem,
                             .w = wv->embed,
                             .lm = wv->lm_head,
                             .logits = d->dlogits,
                             .kv_cap = kv->cap_S,
                             .acts_cap = e->acts_ng.cap_T,
                             .acts_capm = e->acts_ng.cap_M,
                             .tune = be->tune};
            if ((rc = be->graph_launch(be, g->g))) return rc < 0 ? rc : err_set(GE_INTERNAL, "decode: fresh graph stale");
        }
    }
    /* tok and logprob are adjacent: one copy back */
    if ((rc = be->to_host(be, h + L.out_tok, d->d + L.out_tok, (size_t)d->cap_R * 8))) return rc;
    memcpy(ids, h + L.out_tok, (size_t)R * 4);
    memcpy(lps, h + L.out_lp, (size_t)R * 4);
    if (top && top->n && (rc = step_top(e, rows, p, top))) return rc;
    return routes ? model_routes_get(m, &e->acts_ng, graphs ? Tb : T, T, routes) : 0;
}
