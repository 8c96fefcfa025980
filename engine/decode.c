/* decode.c — one generation step: forward, lm head of the chosen rows, one draw per row.
 *
 * Rows whose sampling is plain temperature (or greedy) with no ban are drawn on the device
 * (backend op `sample`, kernels/sampling.h: Gumbel-max keyed by the row's key), so a step
 * downloads R ids + R logprobs instead of R x V logits. Other rows (top_k / top_p / min_p, a
 * min_tokens ban) download their logits and draw on the host from the same key. The two draws
 * are different functions of the key; each is deterministic. GRPOD_HOST_SAMPLING=1 forces the
 * host path (for comparison). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/decode.h"
#include "engine/engine_internal.h"
#include "engine/err.h"

struct dec_state {
    int cap;                    /* rows the buffers hold */
    float *dlogits;             /* (cap, V) device */
    int *drows;                 /* (cap) device */
    void *dsamp;                /* cap keys (u64) + cap ids + cap logprobs, device */
    void *hsamp;                /* the same on the host */
    float *logits;              /* (cap, V) host, for host draws */
    void *scratch;              /* (V) candidates */
};

void dec_free(eng *e) {
    dec_state *d = e->dec;
    if (!d) return;
    eng_backend *be = e->be;
    if (d->dlogits) be->free(be, d->dlogits);
    if (d->drows) be->free(be, d->drows);
    if (d->dsamp) be->free(be, d->dsamp);
    free(d->hsamp); free(d->logits); free(d->scratch);
    free(d);
    e->dec = NULL;
}

static int reserve(eng *e, int R) {
    if (e->dec && e->dec->cap >= R) return 0;
    int cap = e->dec ? e->dec->cap : 0;
    while (cap < R) cap = cap ? cap * 2 : 64;
    dec_free(e);
    eng_backend *be = e->be;
    size_t V = (size_t)e->m.cfg.V;
    dec_state *d = e->dec = calloc(1, sizeof *d);
    if (!d) return err_set(GE_NOMEM, "decode: out of memory");
    d->cap = cap;
    d->dlogits = be->alloc(be, (size_t)cap * V * sizeof(float));
    d->drows = be->alloc(be, (size_t)cap * sizeof(int));
    d->dsamp = be->alloc(be, (size_t)cap * 16);
    d->hsamp = malloc((size_t)cap * 16);
    d->logits = malloc((size_t)cap * V * sizeof(float));
    d->scratch = malloc(V * 8);
    if (!d->dlogits || !d->drows || !d->dsamp || !d->hsamp || !d->logits || !d->scratch) {
        dec_free(e);
        return err_set(GE_NOMEM, "decode: out of memory for %d rows", cap);
    }
    return 0;
}

/* ---------------------------------------------------------------- host draw */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

typedef struct { float p; int id; } cand;
static int cand_desc(const void *a, const void *b) {
    float x = ((const cand *)a)->p, y = ((const cand *)b)->p;
    return x < y ? 1 : x > y ? -1 : ((const cand *)a)->id - ((const cand *)b)->id;
}

/* Draws a token from logits (V) under p; banned ids (n_banned) get no mass. Returns the id
 * and its logprob under softmax(logits / T) (T = 1 when greedy). scratch holds V cands. */
static int host_draw(const float *logits, int V, const dec_row *p, const int *banned, int n_banned, cand *scratch,
                     float *logprob) {
    float T = p->temperature > 0 ? p->temperature : 1.0f;
    float mx = -INFINITY;
    for (int j = 0; j < V; j++) mx = fmaxf(mx, logits[j] / T);
    double sum = 0;
    for (int j = 0; j < V; j++) sum += exp((double)(logits[j] / T - mx));
    float lse = mx + (float)log(sum);
    int n = 0;
    for (int j = 0; j < V; j++) {
        int ban = 0;
        for (int b = 0; b < n_banned && !ban; b++) ban = banned[b] == j;
        if (!ban) scratch[n++] = (cand){ expf(logits[j] / T - lse), j };
    }
    int pick = scratch[0].id;
    if (p->temperature <= 0) {
        for (int i = 1; i < n; i++)
            if (scratch[i].p > scratch[0].p) scratch[0] = scratch[i];
        pick = scratch[0].id;
    } else {
        int truncate = (p->top_k > 0 && p->top_k < n) || p->top_p < 1.0f || p->min_p > 0;
        if (truncate) {
            qsort(scratch, (size_t)n, sizeof *scratch, cand_desc);
            if (p->top_k > 0 && p->top_k < n) n = p->top_k;
            if (p->min_p > 0) {
                float floor_p = p->min_p * scratch[0].p;
                int k = 1;
                while (k < n && scratch[k].p >= floor_p) k++;
                n = k;
            }
            if (p->top_p < 1.0f) {
                double tot = 0, acc = 0;
                for (int i = 0; i < n; i++) tot += scratch[i].p;
                int k = 0;
                while (k < n) { acc += scratch[k].p; k++; if (acc >= p->top_p * tot) break; }
                n = k;
            }
        }
        double tot = 0;
        for (int i = 0; i < n; i++) tot += scratch[i].p;
        uint64_t rng = p->key;
        double u = (splitmix(&rng) >> 11) * (1.0 / 9007199254740992.0) * tot, acc = 0;
        pick = scratch[n - 1].id;
        for (int i = 0; i < n; i++) { acc += scratch[i].p; if (u < acc) { pick = scratch[i].id; break; } }
    }
    *logprob = logits[pick] / T - lse;
    return pick;
}

/* ---------------------------------------------------------------- the step */

/* 1 when row p can be drawn by the device op (plain temperature / greedy, no ban). */
static int device_row(const dec_row *p, int V) {
    return (p->top_k <= 0 || p->top_k >= V) && p->top_p >= 1.0f && p->min_p <= 0 && !p->ban;
}

int dec_step(eng *e, model_kv *kv, const model_input *in, int R, const int *rows, const dec_row *p,
             const int *ban, int n_ban, int *ids, float *lps) {
    const model_config *c = &e->m.cfg;
    eng_backend *be = e->be;
    int V = c->V, rc;
    if ((rc = reserve(e, R)) || (rc = eng_acts_reserve(e, &e->acts_ng, in->T, 1, 0)) ||
        (rc = model_forward(&e->m, &e->wv, &e->acts_ng, kv, in, 1.0f, 0)))
        return rc;
    if (!R) return 0;
    dec_state *d = e->dec;
    if ((rc = be->to_dev(be, d->drows, rows, (size_t)R * sizeof(int)))) return rc;
    be->lm_head_rows(be, d->dlogits, e->acts_ng.lnf, d->drows, e->wv.lm_head, R, c->C, V);

    const char *force_host = getenv("GRPOD_HOST_SAMPLING");
    int dev = be->sample && !(force_host && force_host[0] == '1');
    for (int i = 0; i < R && dev; i++) dev = device_row(&p[i], V) && p[i].temperature == p[0].temperature;
    if (dev) {
        uint64_t *hkeys = d->hsamp, *dkeys = d->dsamp;
        int *dtok = (int *)(dkeys + d->cap);
        float *dlp = (float *)(dtok + d->cap);
        for (int i = 0; i < R; i++) hkeys[i] = p[i].key;
        if ((rc = be->to_dev(be, dkeys, hkeys, (size_t)R * sizeof(uint64_t)))) return rc;
        be->sample(be, dtok, dlp, d->dlogits, dkeys, 0, R, V, p[0].temperature);
        if ((rc = be->to_host(be, ids, dtok, (size_t)R * sizeof(int))) ||
            (rc = be->to_host(be, lps, dlp, (size_t)R * sizeof(float))))
            return rc;
        return 0;
    }
    if ((rc = be->sync(be)) || (rc = be->to_host(be, d->logits, d->dlogits, (size_t)R * V * sizeof(float))))
        return rc;
    for (int i = 0; i < R; i++)
        ids[i] = host_draw(d->logits + (size_t)i * V, V, &p[i], ban, p[i].ban ? n_ban : 0, d->scratch, &lps[i]);
    return 0;
}
