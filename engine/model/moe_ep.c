/* moe_ep.c — see moe_ep.h. A call's plan: slot ts = t k + s of this rank goes to rank
 * topi[ts] / ep_E; the slots are ordered by destination (a stable counting sort, so (t, s) order
 * within one), the counts exchanged, and rows of floats move in that order (the cpu backend's
 * activations are fp32; an expert index rides in a float, exact below 2^24):
 *   forward out   [ln2 row (C) | expert]          back  [ey row (C)]
 *   backward out  [ln2 row (C) | dout row (C) | w | expert]   back  [dx row (C)]
 * A rank receives the rows of ranks 0..W-1 one after another, and sends its answers back in the
 * order received, which the exchange's reversed counts return to their senders in plan order.
 * A rank that fails (memory, the comm) aborts the comm, so the others' exchanges fail too. */
#include "engine/model/moe_ep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/moe.h"

typedef struct {
    int n; /* slots T k */
    int *order; /* (n) slot of each row sent, by destination rank */
    size_t *send, *recv; /* (W) rows to / from each rank */
    size_t R; /* rows received */
} ep_plan;

static void plan_free(ep_plan *p) {
    free(p->order);
    free(p->send);
    free(p->recv);
}

/* The rows' moves: the counts' exchange, then rows of `width` floats (bytes in the comm). */
static int exchange(const model *m, const float *in, const size_t *send, float *out, const size_t *recv, int width) {
    int W = m->ep.W;
    size_t sb[W], rb[W];
    for (int q = 0; q < W; q++) {
        sb[q] = send[q] * (size_t)width * sizeof(float);
        rb[q] = recv[q] * (size_t)width * sizeof(float);
    }
    return m->ep.all_to_all_v(m->ep.ctx, in, sb, out, rb);
}

static int plan_make(const model *m, const int *topi, int T, ep_plan *p) {
    int W = m->ep.W, k = m->cfg.top_k;
    memset(p, 0, sizeof *p);
    p->n = T * k;
    p->order = malloc((size_t)p->n * sizeof(int) + 1);
    p->send = calloc((size_t)W, sizeof(size_t));
    p->recv = calloc((size_t)W, sizeof(size_t));
    size_t *at = calloc((size_t)W + 1, sizeof(size_t)), one[W];
    int rc = p->order && p->send && p->recv && at ? 0 : err_set(GE_NOMEM, "moe_ep: out of memory");
    for (int ts = 0; !rc && ts < p->n; ts++) p->send[topi[ts] / m->ep_E]++;
    for (int q = 0; !rc && q < W; q++) at[q + 1] = at[q] + p->send[q];
    for (int ts = 0; !rc && ts < p->n; ts++) p->order[at[topi[ts] / m->ep_E]++] = ts;
    for (int q = 0; q < W; q++) one[q] = sizeof(size_t);
    if (!rc) rc = m->ep.all_to_all_v(m->ep.ctx, p->send, one, p->recv, one);
    for (int q = 0; !rc && q < W; q++) p->R += p->recv[q];
    free(at);
    if (rc) {
        plan_free(p);
        m->ep.abort(m->ep.ctx);
    }
    return rc;
}

/* One allocation for a call's buffers: *bufs[i] gets len[i] floats, zeroed, and *ints ni ints
 * (each rounded up by one, so none is empty). The base to free, or NULL (GE_NOMEM set). */
static void *scratch(float **const *bufs, const size_t *len, int n, int **ints, size_t ni) {
    size_t tot = ni + 1;
    for (int i = 0; i < n; i++) tot += len[i] + 1;
    float *base = calloc(tot, sizeof(float)), *p = base; /* ints are as wide as floats */
    if (!base) {
        err_set(GE_NOMEM, "moe_ep: out of memory (%zu MiB of rows)", tot * sizeof(float) >> 20);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        *bufs[i] = p;
        p += len[i] + 1;
    }
    *ints = (int *)p;
    return base;
}

/* Columns [c0, c0 + n) of in's R rows (width wide) into out (R, n). */
static void columns(float *out, const float *in, size_t R, int width, int c0, int n) {
    for (size_t i = 0; i < R; i++) memcpy(out + i * (size_t)n, in + i * (size_t)width + c0, (size_t)n * sizeof(float));
}

/* The received rows' experts (column col of rows width wide), local to this rank. */
static void local_experts(const model *m, int *ids, const float *rows, size_t R, int width, int col) {
    for (size_t i = 0; i < R; i++) ids[i] = (int)rows[i * (size_t)width + (size_t)col] - m->ep_e0;
}

int moe_ep_fwd(const model *m, const model_layer_views *W, struct model_layer_acts *A, void *out, int T) {
    eng_backend *be = m->be;
    int C = m->cfg.C, k = m->cfg.top_k, Fm = m->cfg.Fm, w1 = C + 1;
    const float *ln2 = A->ln2;
    ep_plan p;
    int rc = plan_make(m, A->topi, T, &p);
    if (rc) return rc;
    size_t R = p.R, n = (size_t)p.n;
    float *snd, *rcv, *xr, *eg, *eu, *ey, *back, *one;
    int *ids;
    float **bufs[] = {&snd, &rcv, &xr, &eg, &eu, &ey, &back, &one};
    size_t len[] = {n * w1, R * w1, R * C, R * Fm, R * Fm, R * C, n * C, R};
    void *mem = scratch(bufs, len, 8, &ids, R);
    if (!mem) rc = GE_NOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        int ts = p.order[i];
        memcpy(snd + i * w1, ln2 + (size_t)(ts / k) * C, (size_t)C * sizeof(float));
        snd[i * w1 + C] = (float)A->topi[ts];
    }
    if (!rc) rc = exchange(m, snd, p.send, rcv, p.recv, w1);
    if (!rc && R) {
        local_experts(m, ids, rcv, R, w1, C);
        columns(xr, rcv, R, w1, 0, C);
        for (size_t i = 0; i < R; i++) one[i] = 1.0f;
        be->moe_experts_fwd(be, NULL, eg, eu, ey, xr, NULL, ids, one, W->we_gate, W->we_up, W->we_down, (int)R, C, m->ep_E, 1, Fm,
                            NULL);
    }
    if (!rc) rc = exchange(m, ey, p.recv, back, p.send, C);
    for (size_t i = 0; !rc && i < n; i++)
        memcpy((float *)A->ey + (size_t)p.order[i] * C, back + i * C, (size_t)C * sizeof(float));
    if (!rc && out) moe_combine_cpu(out, A->ey, A->xm, A->topw, T, C, k);
    free(mem);
    plan_free(&p);
    if (rc) m->ep.abort(m->ep.ctx); /* the others' exchanges end instead of waiting for this rank */
    return rc;
}

int moe_ep_bwd(const model *m, const model_layer_views *W, const model_layer_views *G, const struct model_layer_acts *A,
               const void *dout, void *dx, float *dtopw, int T) {
    eng_backend *be = m->be;
    int C = m->cfg.C, k = m->cfg.top_k, Fm = m->cfg.Fm, w2 = 2 * C + 2;
    const float *ln2 = A->ln2, *dy = dout, *ey = A->ey;
    float *dxo = dx;
    /* the routing weights' gradient, where ey is: as moe_experts_bwd_cpu computes it */
    for (int ts = 0; ts < T * k; ts++) {
        const float *d = dy + (size_t)(ts / k) * C, *y = ey + (size_t)ts * C;
        float dot = 0;
        for (int c = 0; c < C; c++) dot += d[c] * y[c];
        dtopw[ts] = dot;
    }
    ep_plan p;
    int rc = plan_make(m, A->topi, T, &p);
    if (rc) return rc;
    size_t R = p.R, n = (size_t)p.n;
    float *snd, *rcv, *xr, *dyr, *wr, *eg, *eu, *eyr, *dg, *du, *dtw, *dxr, *back;
    int *ints;
    float **bufs[] = {&snd, &rcv, &xr, &dyr, &wr, &eg, &eu, &eyr, &dg, &du, &dtw, &dxr, &back};
    size_t len[] = {n * w2, R * w2, R * C, R * C, R, R * Fm, R * Fm, R * C, R * Fm, R * Fm, R, R * C, n * C};
    void *mem = scratch(bufs, len, 13, &ints, R + n);
    if (!mem) rc = GE_NOMEM;
    int *ids = ints, *inv = ints + R; /* inv[ts]: slot ts's row in the plan's order */
    for (size_t i = 0; !rc && i < n; i++) {
        int ts = p.order[i];
        float *row = snd + i * w2;
        memcpy(row, ln2 + (size_t)(ts / k) * C, (size_t)C * sizeof(float));
        memcpy(row + C, dy + (size_t)(ts / k) * C, (size_t)C * sizeof(float));
        row[2 * C] = A->topw[ts];
        row[2 * C + 1] = (float)A->topi[ts];
        inv[ts] = (int)i;
    }
    if (!rc) rc = exchange(m, snd, p.send, rcv, p.recv, w2);
    if (!rc && R) {
        local_experts(m, ids, rcv, R, w2, 2 * C + 1);
        columns(xr, rcv, R, w2, 0, C);
        columns(dyr, rcv, R, w2, C, C);
        columns(wr, rcv, R, w2, 2 * C, 1);
        be->moe_experts_fwd(be, NULL, eg, eu, eyr, xr, NULL, ids, wr, W->we_gate, W->we_up, W->we_down, (int)R, C, m->ep_E, 1, Fm,
                            NULL);
        be->moe_experts_bwd(be, dxr, G->we_gate, G->we_up, G->we_down, dtw, dg, du, dyr, xr, ids, wr, eg, eu, eyr, W->we_gate,
                            W->we_up, W->we_down, (int)R, C, m->ep_E, 1, Fm, NULL);
    }
    if (!rc) rc = exchange(m, dxr, p.recv, back, p.send, C);
    for (int t = 0; !rc && t < T; t++) /* the slots in order, as one rank's accumulation runs */
        for (int s = 0; s < k; s++) {
            const float *b = back + (size_t)inv[t * k + s] * C;
            for (int c = 0; c < C; c++) dxo[(size_t)t * C + c] += b[c];
        }
    free(mem);
    plan_free(&p);
    if (rc) m->ep.abort(m->ep.ctx); /* the others' exchanges end instead of waiting for this rank */
    return rc;
}

/* ---------------------------------------------------------------- checkpoints */

static const model_param *named(const model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (!strcmp(m->params[i].name, name)) return &m->params[i];
    return NULL;
}

static int is_expert(const model_param *p) { return strstr(p->name, ".mlp.experts.") != NULL; }

/* Rank q's name of this rank's expert parameter p: the same layer and projection, its expert
 * index moved from this rank's range to rank q's. */
static void name_on_rank(const model *m, const model_param *p, int q, char *out, size_t len) {
    int l, e;
    char proj[32];
    sscanf(p->name, "model.layers.%d.mlp.experts.%d.%31[a-z_]", &l, &e, proj);
    snprintf(out, len, "model.layers.%d.mlp.experts.%d.%s.weight", l, e - m->ep_e0 + q * m->ep_E, proj);
}

int moe_ep_gather(const model *m, const float *mine, const model *full, float *whole, int all) {
    int W = m->ep.W, r = m->ep.rank, here = all || r == 0;
    size_t n = 0, send[W], recv[W];
    for (int i = 0; i < m->n_params; i++) n += is_expert(&m->params[i]) ? (size_t)m->params[i].numel : 0;
    float *out = malloc(n * sizeof(float) + 1), *in = here ? malloc((size_t)W * n * sizeof(float) + 1) : NULL;
    int rc = out && (!here || in) ? 0 : err_set(GE_NOMEM, "moe_ep: out of memory (%zu MiB)", (size_t)W * n * 4 >> 20);
    for (int i = 0, k = 0; !rc && i < m->n_params; i++) { /* this rank's experts, in its parameter order */
        const model_param *p = &m->params[i];
        if (!is_expert(p)) continue;
        memcpy(out + k, mine + p->off, (size_t)p->numel * sizeof(float));
        k += (int)p->numel;
    }
    for (int q = 0; q < W; q++) {
        send[q] = q == 0 ? n * sizeof(float) : 0;
        recv[q] = here ? n * sizeof(float) : 0;
    }
    /* a failed allocation aborts the group (the hook's comm), so no rank waits for it */
    if (!rc)
        rc = all ? m->ep.all_gather(m->ep.ctx, out, in, n * sizeof(float)) : m->ep.all_to_all_v(m->ep.ctx, out, send, in, recv);
    else m->ep.abort(m->ep.ctx);
    size_t at = 0; /* the next expert parameter's place among a rank's: the same on every rank */
    for (int i = 0; !rc && here && i < m->n_params; i++) {
        const model_param *p = &m->params[i];
        if (!is_expert(p)) {
            memcpy(whole + named(full, p->name)->off, mine + p->off, (size_t)p->numel * sizeof(float));
            continue;
        }
        for (int q = 0; q < W; q++) {
            char name[96];
            name_on_rank(m, p, q, name, sizeof name);
            memcpy(whole + named(full, name)->off, in + (size_t)q * n + at, (size_t)p->numel * sizeof(float));
        }
        at += (size_t)p->numel;
    }
    free(out);
    free(in);
    return rc;
}

void moe_ep_slice(const model *m, const model *full, const float *whole, float *mine) {
    for (int i = 0; i < m->n_params; i++) {
        const model_param *p = &m->params[i];
        memcpy(mine + p->off, whole + named(full, p->name)->off, (size_t)p->numel * sizeof(float));
    }
}
