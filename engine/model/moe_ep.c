/* moe_ep.c — see moe_ep.h. A call's plan: slot ts = t k + s of this rank goes to rank
 * topi[ts] / ep_E; the slots are ordered by destination (a stable counting sort, so (t, s) order
 * within one), the counts exchanged, and rows of floats move in that order (the cpu backend's
 * activations are fp32; an expert index rides in a float, exact below 2^24):
 *   forward out   [ln2 row (C) | expert]          back  [ey row (C)]
 *   backward out  [ln2 row (C) | dout row (C) | w | expert]   back  [dx row (C)]
 * A rank receives the rows of ranks 0..W-1 one after another, and sends its answers back in the
 * order received, which the exchange's reversed counts return to their senders in plan order. */
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
    if (rc) plan_free(p);
    return rc;
}

/* The received rows' experts, local (row i's expert in column col of rows `width` wide). */
static int *local_experts(const model *m, const float *rows, size_t R, int width, int col) {
    int *ids = malloc(R * sizeof(int) + 1);
    for (size_t i = 0; ids && i < R; i++) ids[i] = (int)rows[i * (size_t)width + (size_t)col] - m->ep_e0;
    return ids;
}

/* Rows i of in (width wide), columns [c0, c0 + n), into out (R, n). */
static float *columns(const float *in, size_t R, int width, int c0, int n) {
    float *out = malloc(R * (size_t)n * sizeof(float) + 1);
    for (size_t i = 0; out && i < R; i++) memcpy(out + i * (size_t)n, in + i * (size_t)width + c0, (size_t)n * sizeof(float));
    return out;
}

int moe_ep_fwd(const model *m, const model_layer_views *W, struct model_layer_acts *A, void *out, int T) {
    eng_backend *be = m->be;
    int C = m->cfg.C, k = m->cfg.top_k, Fm = m->cfg.Fm, w1 = C + 1;
    const float *ln2 = A->ln2;
    ep_plan p;
    int rc = plan_make(m, A->topi, T, &p);
    if (rc) return rc;
    float *snd = malloc((size_t)p.n * w1 * sizeof(float) + 1), *rcv = malloc(p.R * w1 * sizeof(float) + 1);
    float *eg = malloc(p.R * Fm * sizeof(float) + 1), *eu = malloc(p.R * Fm * sizeof(float) + 1);
    float *ey = malloc(p.R * C * sizeof(float) + 1), *back = malloc((size_t)p.n * C * sizeof(float) + 1);
    float *one = malloc(p.R * sizeof(float) + 1), *xr = NULL;
    int *ids = NULL;
    if (!snd || !rcv || !eg || !eu || !ey || !back || !one) rc = err_set(GE_NOMEM, "moe_ep: out of memory");
    for (int i = 0; !rc && i < p.n; i++) {
        int ts = p.order[i];
        memcpy(snd + (size_t)i * w1, ln2 + (size_t)(ts / k) * C, (size_t)C * sizeof(float));
        snd[(size_t)i * w1 + C] = (float)A->topi[ts];
    }
    if (!rc) rc = exchange(m, snd, p.send, rcv, p.recv, w1);
    if (!rc && (!(ids = local_experts(m, rcv, p.R, w1, C)) || !(xr = columns(rcv, p.R, w1, 0, C))))
        rc = err_set(GE_NOMEM, "moe_ep: out of memory");
    for (size_t i = 0; !rc && i < p.R; i++) one[i] = 1.0f;
    if (!rc && p.R)
        be->moe_experts_fwd(be, NULL, eg, eu, ey, xr, NULL, ids, one, W->we_gate, W->we_up, W->we_down, (int)p.R, C, m->ep_E, 1,
                            Fm, NULL);
    if (!rc) rc = exchange(m, ey, p.recv, back, p.send, C);
    for (int i = 0; !rc && i < p.n; i++)
        memcpy((float *)A->ey + (size_t)p.order[i] * C, back + (size_t)i * C, (size_t)C * sizeof(float));
    if (!rc && out) moe_combine_cpu(out, A->ey, A->xm, A->topw, T, C, k);
    free(snd);
    free(rcv);
    free(eg);
    free(eu);
    free(ey);
    free(back);
    free(one);
    free(xr);
    free(ids);
    plan_free(&p);
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
    size_t R = p.R;
    float *snd = malloc((size_t)p.n * w2 * sizeof(float) + 1), *rcv = malloc(R * w2 * sizeof(float) + 1);
    float *eg = malloc(R * Fm * sizeof(float) + 1), *eu = malloc(R * Fm * sizeof(float) + 1),
          *eyr = malloc(R * C * sizeof(float) + 1);
    float *dg = malloc(R * Fm * sizeof(float) + 1), *du = malloc(R * Fm * sizeof(float) + 1), *dtw = malloc(R * sizeof(float) + 1);
    float *dxr = calloc(R * C + 1, sizeof(float)), *back = malloc((size_t)p.n * C * sizeof(float) + 1);
    float *xr = NULL, *dyr = NULL, *wr = NULL;
    int *ids = NULL, *inv = malloc((size_t)p.n * sizeof(int) + 1);
    if (!snd || !rcv || !eg || !eu || !eyr || !dg || !du || !dtw || !dxr || !back || !inv)
        rc = err_set(GE_NOMEM, "moe_ep: out of memory");
    for (int i = 0; !rc && i < p.n; i++) {
        int ts = p.order[i];
        float *row = snd + (size_t)i * w2;
        memcpy(row, ln2 + (size_t)(ts / k) * C, (size_t)C * sizeof(float));
        memcpy(row + C, dy + (size_t)(ts / k) * C, (size_t)C * sizeof(float));
        row[2 * C] = A->topw[ts];
        row[2 * C + 1] = (float)A->topi[ts];
        inv[ts] = i;
    }
    if (!rc) rc = exchange(m, snd, p.send, rcv, p.recv, w2);
    if (!rc &&
        (!(ids = local_experts(m, rcv, R, w2, 2 * C + 1)) || !(xr = columns(rcv, R, w2, 0, C)) ||
         !(dyr = columns(rcv, R, w2, C, C)) || !(wr = columns(rcv, R, w2, 2 * C, 1))))
        rc = err_set(GE_NOMEM, "moe_ep: out of memory");
    if (!rc && R) {
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
    free(snd);
    free(rcv);
    free(eg);
    free(eu);
    free(eyr);
    free(dg);
    free(du);
    free(dtw);
    free(dxr);
    free(back);
    free(xr);
    free(dyr);
    free(wr);
    free(ids);
    free(inv);
    plan_free(&p);
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

int moe_ep_gather(const model *m, const float *mine, const model *full, float *whole) {
    int W = m->ep.W, r = m->ep.rank;
    size_t n = 0, send[W], recv[W];
    for (int i = 0; i < m->n_params; i++) n += is_expert(&m->params[i]) ? (size_t)m->params[i].numel : 0;
    float *out = malloc(n * sizeof(float) + 1), *in = r ? NULL : malloc((size_t)W * n * sizeof(float) + 1);
    int rc = out && (r || in) ? 0 : err_set(GE_NOMEM, "moe_ep: out of memory (%zu MiB)", (size_t)W * n * 4 >> 20);
    for (int i = 0, k = 0; !rc && i < m->n_params; i++) { /* this rank's experts, in its parameter order */
        const model_param *p = &m->params[i];
        if (!is_expert(p)) continue;
        memcpy(out + k, mine + p->off, (size_t)p->numel * sizeof(float));
        k += (int)p->numel;
    }
    for (int q = 0; q < W; q++) {
        send[q] = q == 0 ? n * sizeof(float) : 0;
        recv[q] = r == 0 ? n * sizeof(float) : 0;
    }
    /* a failed allocation still takes part, moving nothing, so no rank waits for it */
    if (rc) memset(send, 0, sizeof send), memset(recv, 0, sizeof recv);
    int xrc = m->ep.all_to_all_v(m->ep.ctx, out, send, in, recv);
    rc = rc ? rc : xrc;
    size_t at = 0; /* the next expert parameter's place among a rank's: the same on every rank */
    for (int i = 0; !rc && !r && i < m->n_params; i++) {
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
