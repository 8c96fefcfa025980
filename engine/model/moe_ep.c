/* moe_ep.c — see moe_ep.h. A call's plan, on the host from the routes (topi, T k ints; the
 * activations stay in the backend's memory): slot ts = t k + s of this rank goes to rank
 * topi[ts] / ep_E; the slots are ordered by destination (a stable counting sort, so (t, s) order
 * within one), the counts exchanged, and the rows move in that order, each exchange one array:
 *   forward out   ln2 rows (C), the experts (local to their rank)      back  ey rows (C)
 *   backward out  ln2 rows, dout rows, routing weights, experts         back  dx rows (C)
 * The rows are packed by gather_rows (row i = the token of slot order[i]) and put back in slot
 * order by moe_combine_rows (slot ts's row = inv[ts], inv the order's inverse), backend ops, so
 * the same code runs on the cpu (host memory) and on cuda (device memory, NCCL).
 * A rank receives the rows of ranks 0..W-1 one after another, and sends its answers back in the
 * order received, which the exchange's reversed counts return to their senders in plan order.
 * A rank that fails (memory, the comm) aborts the comm, so the others' exchanges fail too. */
#include "engine/model/moe_ep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/moe.h"

/* A call's plan: host arrays, and their copies in the backend's memory (dev, one allocation) */
typedef struct {
    int n; /* slots T k */
    size_t *send, *recv; /* (W) rows to / from each rank */
    size_t R; /* rows received */
    int *host; /* (4n) src, inv, ids, then topi: the host copies */
    float *w; /* (n) the routing weights in plan order (backward) */
    int *src, *inv, *ids; /* in the backend's memory: the token of each row sent, each slot's row, its expert on its rank */
} ep_plan;

static void plan_free(ep_plan *p) {
    free(p->send);
    free(p->recv);
    free(p->host);
    free(p->w);
}

static size_t up256(size_t b) { return (b + 255) & ~(size_t)255; }

/* Workspace i of the model's (0: a plan's, 1: a call's buffers) with room for bytes: grown (the
 * old one freed first) only when a call needs more than any before, so the exchanges do not
 * allocate and free the backend's memory a layer. NULL: out of memory (GE_NOMEM set). */
static void *ws_take(const model *m, int i, size_t bytes) {
    struct moe_ep_ws *w = m->ep_ws;
    if (bytes <= w->cap[i]) return w->mem[i];
    if (w->mem[i]) m->be->free(m->be, w->mem[i]);
    w->cap[i] = bytes + bytes / 8; /* room for a somewhat larger call next */
    if (!(w->mem[i] = m->be->alloc(m->be, w->cap[i]))) {
        w->cap[i] = 0;
        err_set(GE_NOMEM, "moe_ep: out of memory (%zu MiB of buffers)", bytes >> 20);
    }
    return w->mem[i];
}

void moe_ep_ws_release(const model *m) {
    struct moe_ep_ws *w = m->ep_ws;
    for (int i = 0; w && i < 2; i++) {
        if (w->mem[i]) m->be->free(m->be, w->mem[i]);
        w->mem[i] = NULL;
        w->cap[i] = 0;
    }
}

void moe_ep_ws_free(const model *m) {
    moe_ep_ws_release(m);
    free(m->ep_ws);
}

/* Rows of `bytes` bytes each: send[q] rows to rank q, recv[q] from it. */
static int exchange(const model *m, const void *in, const size_t *send, void *out, const size_t *recv, size_t bytes) {
    int W = m->ep.W;
    size_t sb[W], rb[W];
    for (int q = 0; q < W; q++) {
        sb[q] = send[q] * bytes;
        rb[q] = recv[q] * bytes;
    }
    return m->ep.all_to_all_v(m->ep.ctx, in, sb, out, rb);
}

/* The plan of routes topi (T,k, backend memory; topw NULL: p->w not wanted), its index arrays
 * copied to the backend's memory. */
static int plan_make(const model *m, const int *topi, const float *topw, int T, ep_plan *p) {
    eng_backend *be = m->be;
    int W = m->ep.W, k = m->cfg.top_k, n = T * k;
    memset(p, 0, sizeof *p);
    p->n = n;
    p->send = calloc((size_t)W, sizeof(size_t));
    p->recv = calloc((size_t)W, sizeof(size_t));
    p->host = malloc(4 * (size_t)n * sizeof(int) + 1);
    p->w = topw ? malloc((size_t)n * sizeof(float) + 1) : NULL;
    size_t *at = calloc((size_t)W + 1, sizeof(size_t)), one[W], cb = up256(2 * (size_t)W * sizeof(size_t));
    char *dws = ws_take(m, 0, cb + 3 * (size_t)n * sizeof(int) + 4); /* the counts, then src, inv, ids */
    size_t *dcnt = (size_t *)dws;
    int rc = p->send && p->recv && p->host && (!topw || p->w) && at ? 0 : err_set(GE_NOMEM, "moe_ep: out of memory");
    if (!rc && !dws) rc = GE_NOMEM;
    int *src = p->host, *inv = src + n, *ids = inv + n, *ti = ids + n;
    float *tw = NULL;
    if (!rc && n) rc = be->to_host(be, ti, topi, (size_t)n * sizeof(int));
    for (int ts = 0; !rc && ts < n; ts++) p->send[ti[ts] / m->ep_E]++;
    for (int q = 0; !rc && q < W; q++) at[q + 1] = at[q] + p->send[q];
    for (int ts = 0; !rc && ts < n; ts++) {
        int q = ti[ts] / m->ep_E, i = (int)at[q]++;
        src[i] = ts / k;
        inv[ts] = i;
        ids[i] = ti[ts] - q * m->ep_E;
    }
    if (!rc && topw && n && !(tw = malloc((size_t)n * sizeof(float)))) rc = err_set(GE_NOMEM, "moe_ep: out of memory");
    if (!rc && tw) rc = be->to_host(be, tw, topw, (size_t)n * sizeof(float));
    for (int ts = 0; !rc && tw && ts < n; ts++) p->w[inv[ts]] = tw[ts];
    free(tw);
    /* the counts through the backend's memory, as the comm takes it (NCCL: the device's) */
    for (int q = 0; q < W; q++) one[q] = sizeof(size_t);
    if (!rc) rc = be->to_dev(be, dcnt, p->send, (size_t)W * sizeof(size_t));
    if (!rc) rc = m->ep.all_to_all_v(m->ep.ctx, dcnt, one, dcnt + W, one);
    if (!rc) rc = be->to_host(be, p->recv, dcnt + W, (size_t)W * sizeof(size_t));
    for (int q = 0; !rc && q < W; q++) p->R += p->recv[q];
    if (!rc) {
        p->src = (int *)(dws + cb);
        p->inv = p->src + n;
        p->ids = p->inv + n;
        if (n) rc = be->to_dev(be, p->src, p->host, 3 * (size_t)n * sizeof(int));
    }
    free(at);
    if (rc) {
        plan_free(p);
        m->ep.abort(m->ep.ctx);
    }
    return rc;
}

/* A call's buffers in the model's workspace: *ptr[i] gets len[i] bytes (each 256-byte aligned,
 * none empty). The base, or NULL (GE_NOMEM set). */
static void *buffers(const model *m, void **const *ptr, const size_t *len, int n) {
    size_t tot = 0;
    for (int i = 0; i < n; i++) tot += up256(len[i] + 1);
    char *base = ws_take(m, 1, tot), *at = base;
    for (int i = 0; base && i < n; i++) {
        *ptr[i] = at;
        at += up256(len[i] + 1);
    }
    return base;
}

/* dev (n floats, the backend's memory) = 1 */
static int ones(eng_backend *be, float *dev, size_t n) {
    float *h = malloc(n * sizeof(float) + 1);
    if (!h) return err_set(GE_NOMEM, "moe_ep: out of memory");
    for (size_t i = 0; i < n; i++) h[i] = 1.0f;
    int rc = n ? be->to_dev(be, dev, h, n * sizeof(float)) : 0;
    free(h);
    return rc;
}

int moe_ep_fwd(const model *m, const model_layer_views *W, struct model_layer_acts *A, void *out, int T) {
    eng_backend *be = m->be;
    int C = m->cfg.C, k = m->cfg.top_k, Fm = m->cfg.Fm;
    size_t ab = (size_t)be->act_bytes, row = ab * C;
    ep_plan p;
    int rc = plan_make(m, A->topi, NULL, T, &p);
    if (rc) return rc;
    size_t R = p.R, n = (size_t)p.n;
    void *snd, *back, *rcv, *eg, *eu, *ey, *ids, *one;
    void **ptr[] = {&snd, &back, &rcv, &eg, &eu, &ey, &ids, &one};
    size_t len[] = {n * row, n * row, R * row, R * ab * Fm, R * ab * Fm, R * row, R * 4, R * 4};
    void *mem = buffers(m, ptr, len, 8);
    rc = mem ? ones(be, one, R) : GE_NOMEM;
    if (!rc) be->gather_rows(be, snd, A->ln2, p.src, (int)n, C);
    if (!rc) rc = exchange(m, snd, p.send, rcv, p.recv, row);
    if (!rc) rc = exchange(m, p.ids, p.send, ids, p.recv, sizeof(int));
    if (!rc && R)
        be->moe_experts_fwd(be, NULL, eg, eu, ey, rcv, NULL, ids, one, W->we_gate, W->we_up, W->we_down, (int)R, C, m->ep_E, 1,
                            Fm, NULL);
    if (!rc) rc = exchange(m, ey, p.recv, back, p.send, row);
    if (!rc) be->moe_combine_rows(be, out, A->ey, back, p.inv, A->xm, A->topw, T, C, k);
    plan_free(&p);
    if (rc) m->ep.abort(m->ep.ctx); /* the others' exchanges end instead of waiting for this rank */
    return rc;
}

/* The backward's buffers for n slots sent and R rows received (rows of `row` bytes, the experts'
 * hidden rows of fm), in moe_ep_bwd's order: its ptr[] list. */
enum { BWD_BUFS = 17 };
static void bwd_lens(size_t n, size_t R, size_t row, size_t fm, size_t *len) {
    const size_t l[BWD_BUFS] = {n * row, n * row, n * row, n * row, n * 4,   n * 4, R * row, R * row, R * fm,
                                R * fm,  R * row, R * fm,  R * fm,  R * row, R * 4, R * 4,   R * 4};
    memcpy(len, l, sizeof l);
}

size_t moe_ep_call_bytes(const model *m, long long T) {
    size_t ab = (size_t)m->be->act_bytes, n = (size_t)(T > 0 ? T : 0) * (size_t)m->cfg.top_k, R = 2 * n, len[BWD_BUFS];
    size_t tot = 0;
    bwd_lens(n, R, ab * m->cfg.C, ab * m->cfg.Fm, len);
    for (int i = 0; i < BWD_BUFS; i++) tot += up256(len[i] + 1);
    return tot + tot / 8; /* ws_take's eighth */
}

size_t moe_ep_beside_bytes(const model *m, long long T) {
    const model_config *c = &m->cfg;
    return moe_ep_call_bytes(m, T) + (size_t)(2 * T * c->top_k * (4LL * c->C + 10LL * c->Fm));
}

int moe_ep_bwd(const model *m, const model_layer_views *W, const model_layer_views *G, const struct model_layer_acts *A,
               const void *dout, void *dx, float *dtopw, int T) {
    eng_backend *be = m->be;
    int C = m->cfg.C, k = m->cfg.top_k, Fm = m->cfg.Fm;
    size_t ab = (size_t)be->act_bytes, row = ab * C, fm = ab * Fm;
    /* the routing weights' gradient, where ey is */
    be->moe_dtopw(be, dtopw, dout, A->ey, T, C, k);
    ep_plan p;
    int rc = plan_make(m, A->topi, A->topw, T, &p);
    if (rc) return rc;
    size_t R = p.R, n = (size_t)p.n, len[BWD_BUFS];
    void *sx, *sdy, *back, *slot, *sw, *one, *x, *dy, *eg, *eu, *ey, *dg, *du, *dxr, *ids, *w, *dtw;
    void **ptr[BWD_BUFS] = {&sx, &sdy, &back, &slot, &sw, &one, &x, &dy, &eg, &eu, &ey, &dg, &du, &dxr, &ids, &w, &dtw};
    bwd_lens(n, R, row, fm, len);
    void *mem = buffers(m, ptr, len, BWD_BUFS);
    rc = mem ? ones(be, one, n) : GE_NOMEM;
    if (!rc && n) rc = be->to_dev(be, sw, p.w, n * sizeof(float));
    if (!rc) {
        be->gather_rows(be, sx, A->ln2, p.src, (int)n, C);
        be->gather_rows(be, sdy, dout, p.src, (int)n, C);
    }
    if (!rc) rc = exchange(m, sx, p.send, x, p.recv, row);
    if (!rc) rc = exchange(m, sdy, p.send, dy, p.recv, row);
    if (!rc) rc = exchange(m, sw, p.send, w, p.recv, sizeof(float));
    if (!rc) rc = exchange(m, p.ids, p.send, ids, p.recv, sizeof(int));
    if (!rc && R) {
        be->zero(be, dxr, R * row); /* the experts' backward adds into it */
        be->moe_experts_fwd(be, NULL, eg, eu, ey, x, NULL, ids, w, W->we_gate, W->we_up, W->we_down, (int)R, C, m->ep_E, 1, Fm,
                            NULL);
        be->moe_experts_bwd(be, dxr, G->we_gate, G->we_up, G->we_down, dtw, dg, du, dy, x, ids, w, eg, eu, ey, W->we_gate,
                            W->we_up, W->we_down, (int)R, C, m->ep_E, 1, Fm, NULL);
    }
    if (!rc) rc = exchange(m, dxr, p.recv, back, p.send, row);
    /* dx += the slots' rows in slot order, weight 1: as one rank's accumulation runs */
    if (!rc) be->moe_combine_rows(be, dx, slot, back, p.inv, dx, one, T, C, k);
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

/* p's name (an expert parameter) with its expert index set to e: the same layer and projection. */
static void name_expert(const model_param *p, int e, char *out, size_t len) {
    int l, e_;
    char proj[32];
    sscanf(p->name, "model.layers.%d.mlp.experts.%d.%31[a-z_]", &l, &e_, proj);
    snprintf(out, len, "model.layers.%d.mlp.experts.%d.%s.weight", l, e, proj);
}

/* p's expert index */
static int expert_of(const model_param *p) {
    int l, e;
    sscanf(p->name, "model.layers.%d.mlp.experts.%d.", &l, &e);
    return e;
}

/* Rank q's name of this rank's expert parameter p: its expert index moved from this rank's
 * range to rank q's. */
static void name_on_rank(const model *m, const model_param *p, int q, char *out, size_t len) {
    name_expert(p, expert_of(p) - m->ep_e0 + q * m->ep_E, out, len);
}

/* The comm's buffers are the backend's memory: the experts go through it in chunks of this
 * many floats (W + 1 of them there at once). */
#define GATHER_CHUNK ((size_t)1 << 22)

int moe_ep_gather(const model *m, const float *mine, const model *full, float *whole, int all) {
    eng_backend *be = m->be;
    int W = m->ep.W, r = m->ep.rank, here = all || r == 0;
    size_t n = 0, send[W], recv[W];
    for (int i = 0; i < m->n_params; i++) n += is_expert(&m->params[i]) ? (size_t)m->params[i].numel : 0;
    size_t ch = n < GATHER_CHUNK ? n : GATHER_CHUNK;
    float *out = malloc(n * sizeof(float) + 1), *in = here ? malloc((size_t)W * n * sizeof(float) + 1) : NULL;
    float *dout = be->alloc(be, ((size_t)W + 1) * ch * sizeof(float) + 4), *din = dout ? dout + ch : NULL;
    int rc = out && (!here || in) && dout ? 0 : err_set(GE_NOMEM, "moe_ep: out of memory (%zu MiB)", (size_t)W * n * 4 >> 20);
    for (int i = 0, k = 0; !rc && i < m->n_params; i++) { /* this rank's experts, in its parameter order */
        const model_param *p = &m->params[i];
        if (!is_expert(p)) continue;
        memcpy(out + k, mine + p->off, (size_t)p->numel * sizeof(float));
        k += (int)p->numel;
    }
    /* in[q n + j ..] = rank q's out[j ..], chunk after chunk (the same count on every rank) */
    for (size_t j = 0; !rc && j < n; j += ch) {
        size_t c = n - j < ch ? n - j : ch;
        for (int q = 0; q < W; q++) {
            send[q] = q == 0 ? c * sizeof(float) : 0;
            recv[q] = here ? c * sizeof(float) : 0;
        }
        rc = be->to_dev(be, dout, out + j, c * sizeof(float));
        if (rc) break;
        rc = all ? m->ep.all_gather(m->ep.ctx, dout, din, c * sizeof(float)) : m->ep.all_to_all_v(m->ep.ctx, dout, send, din, recv);
        for (int q = 0; !rc && here && q < W; q++)
            rc = be->to_host(be, in + (size_t)q * n + j, din + (size_t)q * c, c * sizeof(float));
    }
    /* a failure of this rank's aborts the group (the hook's comm), so no rank waits for it */
    if (rc) m->ep.abort(m->ep.ctx);
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
    if (dout) be->free(be, dout);
    return rc;
}

int moe_ep_gather_act(const model *m, const void *act, const model *full, void *whole) {
    eng_backend *be = m->be;
    size_t eb = (size_t)be->act_bytes;
    int rc = 0;
    for (int i = 0; !rc && i < m->n_params; i++) {
        const model_param *p = &m->params[i];
        char name[96];
        if (!is_expert(p)) { /* replicated: this rank's copy is every rank's */
            be->copy(be, (char *)whole + (size_t)named(full, p->name)->off * eb, (const char *)act + (size_t)p->off * eb,
                     (size_t)p->numel * eb);
            continue;
        }
        if (expert_of(p) != m->ep_e0) continue; /* one exchange per layer and projection, from its first expert */
        /* this rank's block of ep_E experts is contiguous (padding after the last only), and so
         * is the projection's E in full: rank q's block lands at expert q ep_E */
        name_expert(p, 0, name, sizeof name);
        rc = m->ep.all_gather(m->ep.ctx, (const char *)act + (size_t)p->off * eb,
                              (char *)whole + (size_t)named(full, name)->off * eb, (size_t)m->ep_E * (size_t)p->numel * eb);
    }
    if (!rc) rc = be->sync(be);
    if (rc) m->ep.abort(m->ep.ctx);
    return rc;
}

void moe_ep_slice(const model *m, const model *full, const float *whole, float *mine) {
    for (int i = 0; i < m->n_params; i++) {
        const model_param *p = &m->params[i];
        memcpy(mine + p->off, whole + named(full, p->name)->off, (size_t)p->numel * sizeof(float));
    }
}
