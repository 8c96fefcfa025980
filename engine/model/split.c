/* split.c — the three-phase schedule of a group larger than a micro-batch (contract in split.h).
 *
 * Rows of the KV cache: the prompt's keys at [0, P), the current response micro-batch's at
 * [P, P + T_s) — so one response micro-batch's key ranges are a = [0, P) and b = its own rows,
 * the same two ranges the one-graph layout gives it (pack.h), over cache rows instead of packed
 * tokens. Training keeps the prompt keys' gradients in fp32 (acc, model_kv_acc: (L) each
 * (P, K, D)): every response micro-batch's attention backward writes its own into dkv, one
 * layer of act-typed scratch that all layers share, and adds rows [0, P) of it into acc; the
 * prompt's backward starts its dK/dV from acc cast once and adds its own (model.h).
 *
 * The dormant set on the host: the prompt's activations keep `ring` layers on the device
 * (model_acts_init_kv), layer l in slot l % ring, and each layer's block (from l[l].x, which
 * layer l - 1 writes) goes to host memory after layer l's forward. Layer l's forward writes
 * its own slot and slot (l + 1) % ring (the next layer's x), so it waits for the copy out of
 * layer l + 1 - ring; the backward fetches layer l + 1 - ring before running layer l (its
 * slot was layer l + 1's, already run), so a copy overlaps ring - 1 layers of compute either
 * way. The last `ring` layers never leave. The copies go on the backend's copy lanes (backend.h:
 * out on the device -> host lane, in on the host -> device one; events 8-15); without lanes (cpu)
 * they are synchronous: the CPU test runs the same slot logic. */
#include "engine/model/split.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"

/* Dormant layers on the device at most (RING - 1 fetched ahead in the backward), and the free
 * device memory left beside them for the backend's scratch before RING is chosen over 2. */
enum { RING = 3 };
#define RING_MARGIN ((size_t)1 << 30)

int split_resp_batches(const pack_group *g, long long max_tokens, int *first) {
    int k = 0;
    long long used = 0;
    for (int r = 0; r < g->N; r++) {
        if (r == 0 || used + g->R[r] > max_tokens) {
            first[k++] = r;
            used = 0;
        }
        used += g->R[r];
    }
    first[k] = g->N;
    return k;
}

/* ---------------------------------------------------------------- inputs (host arrays) */

/* One block of host ints for a model_input of T tokens and M predictions. */
typedef struct {
    model_input in;
    int *mem;
} host_input;

static int input_alloc(host_input *h, int T, int M, const pack_group *g) {
    size_t nr = pack_has_routes(g) ? (size_t)g->rl * T * g->rk : 0;
    int *p = malloc(((size_t)7 * T + 2 * (size_t)M + 1 + nr) * sizeof(int));
    h->mem = p;
    if (!p) return err_set(GE_NOMEM, "split: out of memory");
    h->in = (model_input){.T = T,
                          .M = M,
                          .tokens = p,
                          .pos = p + T,
                          .a0 = p + 2 * T,
                          .a1 = p + 3 * T,
                          .b0 = p + 4 * T,
                          .b1 = p + 5 * T,
                          .slot = p + 6 * T,
                          .out_pos = p + 7 * T,
                          .out_tok = p + 7 * T + M,
                          .routes = nr ? p + 7 * T + 2 * M : NULL};
    if (nr) memset(p + 7 * T + 2 * M, 0xff, nr * sizeof(int)); /* -1: free (pack.h) */
    return 0;
}

/* The prompt: causal, cache rows 0..P-1; predictions: each response's first token from the last
 * prompt token (responses with R = 0 predict nothing). */
static int prompt_input(host_input *h, const pack_group *g) {
    int M = 0;
    for (int r = 0; r < g->N; r++) M += g->R[r] > 0;
    int rc = input_alloc(h, g->P, M, g);
    if (rc) return rc;
    int *tok = (int *)h->in.tokens, *pos = (int *)h->in.pos, *a0 = (int *)h->in.a0, *a1 = (int *)h->in.a1, *b0 = (int *)h->in.b0,
        *b1 = (int *)h->in.b1, *slot = (int *)h->in.slot;
    for (int i = 0; i < g->P; i++) {
        tok[i] = g->prompt[i];
        if (h->in.routes) pack_route_put((int *)h->in.routes, g->P, i, pack_route_src(g, -1, i), g->rl, g->rk);
        pos[i] = i;
        slot[i] = i;
        a0[i] = 0;
        a1[i] = i + 1;
        b0[i] = b1[i] = i + 1;
    }
    int *op = (int *)h->in.out_pos, *ot = (int *)h->in.out_tok;
    for (int r = 0, m = 0; r < g->N; r++)
        if (g->R[r] > 0) {
            op[m] = g->P - 1;
            ot[m] = g->resp[r][0];
            m++;
        }
    return 0;
}

/* Responses [r0, r1): tokens at cache rows P.., positions from P; predictions of each response's
 * tokens 1..R-1 (token 0 is the prompt's), out_pos local to the micro-batch. */
static int resp_input(host_input *h, const pack_group *g, int r0, int r1) {
    int T = 0, M = 0, P = g->P;
    for (int r = r0; r < r1; r++) {
        T += g->R[r];
        M += g->R[r] > 0 ? g->R[r] - 1 : 0;
    }
    int rc = input_alloc(h, T, M, g);
    if (rc) return rc;
    int *tok = (int *)h->in.tokens, *pos = (int *)h->in.pos, *a0 = (int *)h->in.a0, *a1 = (int *)h->in.a1, *b0 = (int *)h->in.b0,
        *b1 = (int *)h->in.b1, *slot = (int *)h->in.slot;
    int *op = (int *)h->in.out_pos, *ot = (int *)h->in.out_tok;
    for (int r = r0, s0 = 0, m = 0; r < r1; r++) {
        for (int j = 0; j < g->R[r]; j++) {
            int t = s0 + j;
            tok[t] = g->resp[r][j];
            if (h->in.routes) pack_route_put((int *)h->in.routes, T, t, pack_route_src(g, r, j), g->rl, g->rk);
            pos[t] = P + j;
            slot[t] = P + t;
            a0[t] = 0;
            a1[t] = P;
            b0[t] = P + s0;
            b1[t] = P + t + 1;
            if (j > 0) {
                op[m] = t - 1;
                ot[m] = g->resp[r][j];
                m++;
            }
        }
        s0 += g->R[r];
    }
    return 0;
}

/* Response offsets of g (N + 1): off[r] = R_0 + .. + R_{r-1}. */
static long long *resp_offsets(const pack_group *g) {
    long long *off = malloc(((size_t)g->N + 1) * sizeof *off);
    if (!off) return NULL;
    off[0] = 0;
    for (int r = 0; r < g->N; r++) off[r + 1] = off[r] + g->R[r];
    return off;
}

/* Per-token values of the prompt's predictions (src, one per response with R > 0) to/from
 * position 0 of each response in a response-order array. */
static void first_scatter(const pack_group *g, const long long *off, const float *src, float *dst) {
    for (int r = 0, m = 0; r < g->N; r++)
        if (g->R[r] > 0) dst[off[r]] = src[m++];
}
static void first_gather(const pack_group *g, const long long *off, const float *src, float *dst) {
    for (int r = 0, m = 0; r < g->N; r++)
        if (g->R[r] > 0) dst[m++] = src[off[r]];
}
/* The same for a response micro-batch's predictions (tokens 1..R-1 of responses [r0, r1)). */
static void rest_scatter(const pack_group *g, const long long *off, int r0, int r1, const float *src, float *dst) {
    for (int r = r0, m = 0; r < r1; r++)
        for (int j = 1; j < g->R[r]; j++) dst[off[r] + j] = src[m++];
}
static void rest_gather(const pack_group *g, const long long *off, int r0, int r1, const float *src, float *dst) {
    for (int r = r0, m = 0; r < r1; r++)
        for (int j = 1; j < g->R[r]; j++) dst[m++] = src[off[r] + j];
}

/* ---------------------------------------------------------------- shared state */

typedef struct {
    const model *m;
    const pack_group *g;
    int nb, *first; /* response micro-batches */
    int capT, capM; /* largest response micro-batch */
    long long *off; /* (N + 1) */
    host_input hp; /* the prompt's input */
    model_kv kv, dkv; /* dkv: training only, one layer (P + capT rows) all layers share */
    model_kv_acc acc; /* training only: the prompt rows' dK/dV sums, fp32 */
    void *acc_mem;
    size_t acc_bytes;
    /* hybrid models: the DeltaNet layers' carry (model.h), as the prompt's pass and the response
     * micro-batches' see it (the same buffers, row0 0 and P) */
    model_dn_carry cy_prompt, cy_resp;
    void *carry_mem;
    size_t carry_grad_bytes; /* dstate, dtail: the tail of carry_mem */
    float *hbuf; /* (M) host scratch: one micro-batch's logprobs / gradients */
} split_ctx;

static void ctx_free(split_ctx *x) {
    if (x->kv.mem) model_kv_free(x->m, &x->kv);
    if (x->dkv.mem) model_kv_free(x->m, &x->dkv);
    if (x->acc_mem) x->m->be->free(x->m->be, x->acc_mem);
    if (x->carry_mem) x->m->be->free(x->m->be, x->carry_mem);
    free(x->cy_prompt.state);
    free(x->acc.k);
    free(x->acc.v);
    free(x->first);
    free(x->off);
    free(x->hp.mem);
    free(x->hbuf);
}

/* dkv: one layer of cap_S rows behind every layer's pointers; acc: each layer with K/V in the
 * cache (not a DeltaNet layer) (S, K, D) fp32, acc_bytes in all. */
static int train_bufs_init(split_ctx *x, int cap_S, int S) {
    const model *m = x->m;
    const model_config *c = &m->cfg;
    eng_backend *be = m->be;
    size_t row = (size_t)c->K * c->D, per = (size_t)cap_S * row * (size_t)be->act_bytes, per32 = (size_t)S * row * 4;
    x->dkv.cap_S = cap_S;
    x->dkv.k = calloc((size_t)c->L, sizeof(void *));
    x->dkv.v = calloc((size_t)c->L, sizeof(void *));
    x->acc.S = S;
    x->acc.k = calloc((size_t)c->L, sizeof(float *));
    x->acc.v = calloc((size_t)c->L, sizeof(float *));
    if (!x->dkv.k || !x->dkv.v || !x->acc.k || !x->acc.v) return err_set(GE_NOMEM, "split: out of memory");
    int n = 0;
    for (int l = 0; l < c->L; l++) n += x->kv.k[l] != NULL;
    x->acc_bytes = per32 * 2 * (size_t)n;
    if (!(x->dkv.mem = be->alloc(be, per * 2)) || !(x->acc_mem = be->alloc(be, x->acc_bytes + 16))) return GE_NOMEM;
    for (int l = 0, i = 0; l < c->L; l++) {
        x->dkv.k[l] = x->dkv.mem;
        x->dkv.v[l] = (char *)x->dkv.mem + per;
        if (!x->kv.k[l]) continue;
        x->acc.k[l] = (float *)((char *)x->acc_mem + per32 * (size_t)(2 * i));
        x->acc.v[l] = (float *)((char *)x->acc_mem + per32 * (size_t)(2 * i + 1));
        i++;
    }
    return 0;
}

/* The DeltaNet layers' carry: per layer state (Hv,Dk,Dv) and tail (Kc-1,Cc), and when training
 * dstate, dtail after all of them; one pointer array (4L) behind both views. */
static int carry_init(split_ctx *x, int train) {
    const model_config *c = &x->m->cfg;
    eng_backend *be = x->m->be;
    int L = c->L, nl = config_n_linear(c);
    size_t SZ = (size_t)c->lin_hv * c->lin_dk * c->lin_dv,
           TL = (size_t)(c->conv_k - 1) * (2 * c->lin_hk * c->lin_dk + c->lin_hv * c->lin_dv);
    size_t one = (SZ + TL) * (size_t)nl * sizeof(float);
    float **p = calloc((size_t)4 * L, sizeof(float *));
    if (!p) return err_set(GE_NOMEM, "split: out of memory");
    model_dn_carry *k = &x->cy_prompt;
    *k = (model_dn_carry){0, p, p + L, train ? p + 2 * L : NULL, train ? p + 3 * L : NULL};
    x->carry_grad_bytes = train ? one : 0;
    if (!(x->carry_mem = be->alloc(be, one + x->carry_grad_bytes))) return GE_NOMEM;
    float *f = x->carry_mem;
    for (int l = 0; l < L; l++)
        if (c->attn[l] == ATTN_DELTANET) {
            k->state[l] = f;
            k->tail[l] = f + SZ;
            if (train) {
                k->dstate[l] = (float *)((char *)f + one);
                k->dtail[l] = k->dstate[l] + SZ;
            }
            f += SZ + TL;
        }
    x->cy_resp = *k;
    x->cy_resp.row0 = x->g->P;
    return 0;
}

static int ctx_init(split_ctx *x, const model *m, const pack_group *g, const split_opts *o, int train, split_stats *st) {
    memset(x, 0, sizeof *x);
    x->m = m;
    x->g = g;
    int hybrid = config_n_linear(&m->cfg) > 0;
    x->first = malloc(((size_t)g->N + 1) * sizeof(int));
    x->off = resp_offsets(g);
    if (!x->first || !x->off) return err_set(GE_NOMEM, "split: out of memory");
    x->nb = split_resp_batches(g, o->max_tokens, x->first);
    for (int k = 0; k < x->nb; k++) {
        long long T = x->off[x->first[k + 1]] - x->off[x->first[k]];
        if (T > x->capT) x->capT = (int)T;
    }
    x->capM = x->capT > g->N ? x->capT : g->N;
    x->hbuf = malloc(((size_t)x->capM + 1) * sizeof(float));
    int rc = x->hbuf ? prompt_input(&x->hp, g) : err_set(GE_NOMEM, "split: out of memory");
    if (rc) return rc;
    /* a prompt's length is limited by the model's context and by its hot set */
    int maxR = 0;
    for (int r = 0; r < g->N; r++) maxR = g->R[r] > maxR ? g->R[r] : maxR;
    if ((long long)g->P + maxR > m->cfg.max_pos)
        return err_set(GE_TOO_LARGE,
                       "prompt of %d tokens + response of %d exceed the model's context "
                       "(max_position_embeddings %d)",
                       g->P, maxR, m->cfg.max_pos);
    /* the hot set: the prompt's K/V of every softmax-attention layer (and when training their
     * gradients' fp32 sums, and one layer of dK/dV scratch); a DeltaNet layer's carry */
    const model_config *c = &m->cfg;
    double row_mib = (double)c->K * c->D * 2.0 / 1048576.0, S = g->P + x->capT;
    st->hot_mib = (double)model_kv_row_bytes(m) * S / 1048576.0 + (double)model_state_row_bytes(m) * (train ? 2 : 1) / 1048576.0;
    if (train)
        st->hot_mib += (double)model_kv_row_bytes(m) / m->be->act_bytes * 4.0 * g->P / 1048576.0 + row_mib * m->be->act_bytes * S;
    rc = model_kv_init(m, &x->kv, g->P + x->capT);
    /* attention loads whole key tiles and weights keys outside a query's ranges by 0: rows no
     * micro-batch has written yet must hold numbers, not recycled memory's NaNs (0 x NaN) */
    if (!rc) model_kv_clean_to(m, &x->kv, x->kv.cap_S);
    if (!rc && train) rc = train_bufs_init(x, g->P + x->capT, g->P);
    if (!rc && hybrid) rc = carry_init(x, train);
    if (rc)
        return err_set(GE_TOO_LARGE,
                       "prompt of %d tokens: its keys and values in every layer (the hot set: %.0f MiB%s) "
                       "do not fit on %s",
                       g->P, st->hot_mib, train ? " with their gradients" : "", m->be->name);
    return 0;
}

/* the caller's gate before a pass (split_opts.gate), 0 without one */
static int gate(const split_opts *o, int kind) { return o->gate ? o->gate(o->gate_ud, kind) : 0; }

/* ---------------------------------------------------------------- forward only */

int split_forward(const model *m, const model_views *w, const pack_group *g, const split_opts *o, float *logp, float *ent,
                  split_stats *st) {
    split_stats st0;
    if (!st) st = &st0;
    memset(st, 0, sizeof *st);
    eng_backend *be = m->be;
    split_ctx x;
    model_acts a = {0};
    host_input hr = {0};
    double t = clock_mono_ms();
    int rc = ctx_init(&x, m, g, o, 0, st);
    int capT = g->P > x.capT ? g->P : x.capT;
    if (!rc) rc = model_acts_init(m, &a, capT, x.capM, 0);
    /* A: the prompt once, its K/V into cache rows [0, P) (its final DeltaNet states into the carry) */
    a.carry = x.carry_mem ? &x.cy_prompt : NULL;
    if (!rc) rc = gate(o, MODEL_PASS_FWD);
    if (!rc) rc = model_forward(m, w, &a, &x.kv, &x.hp.in, o->temperature, ent != NULL);
    if (!rc && x.hp.in.M) rc = be->to_host(be, x.hbuf, a.logp, (size_t)x.hp.in.M * 4);
    if (!rc) first_scatter(g, x.off, x.hbuf, logp);
    if (!rc && ent && x.hp.in.M) rc = be->to_host(be, x.hbuf, a.ent, (size_t)x.hp.in.M * 4);
    if (!rc && ent) first_scatter(g, x.off, x.hbuf, ent);
    st->ms_prompt_fwd = clock_mono_ms() - t;
    t = clock_mono_ms();
    /* B: the responses on the cached prompt */
    a.carry = x.carry_mem ? &x.cy_resp : NULL;
    for (int k = 0; k < x.nb && !rc; k++) {
        int r0 = x.first[k], r1 = x.first[k + 1];
        if ((rc = resp_input(&hr, g, r0, r1))) break;
        rc = gate(o, MODEL_PASS_FWD);
        if (!rc) rc = model_forward(m, w, &a, &x.kv, &hr.in, o->temperature, ent != NULL);
        if (!rc && hr.in.M) rc = be->to_host(be, x.hbuf, a.logp, (size_t)hr.in.M * 4);
        if (!rc) rest_scatter(g, x.off, r0, r1, x.hbuf, logp);
        if (!rc && ent && hr.in.M) rc = be->to_host(be, x.hbuf, a.ent, (size_t)hr.in.M * 4);
        if (!rc && ent) rest_scatter(g, x.off, r0, r1, x.hbuf, ent);
        free(hr.mem);
        hr.mem = NULL;
        st->n_micro++;
    }
    st->ms_resp = clock_mono_ms() - t;
    if (a.mem) model_acts_free(m, &a);
    ctx_free(&x);
    return rc;
}

/* ---------------------------------------------------------------- training */

/* The prompt's saved activations: all layers on the device, or RING slots + host memory. */
typedef struct {
    model_acts a;
    int ring; /* 0: every layer on the device */
    char *host; /* (L - ring) layer blocks */
    split_mem own; /* host's memory when the caller gave no split_mem */
} prompt_acts;

void split_mem_free(eng_backend *be, split_mem *s) {
    if (s->host) {
        if (be->host_free) be->host_free(be, s->host);
        else free(s->host);
    }
    memset(s, 0, sizeof *s);
}

static void pacts_free(const model *m, prompt_acts *p) {
    if (p->a.mem) model_acts_free(m, &p->a);
    split_mem_free(m->be, &p->own);
    memset(p, 0, sizeof *p);
}

/* Host memory the kernel can still give (MemAvailable), or 0 when it does not say. */
static size_t host_avail_bytes(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[128];
    unsigned long long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
    if (f) fclose(f);
    return (size_t)kb * 1024;
}

/* The dormant set on the device: every layer's whole, or (recompute) each layer's input and one
 * set of the rest that all layers share, refilled by a forward of the layer before its backward
 * in C. */
static int pacts_device(const model *m, prompt_acts *p, split_ctx *x, int recompute, split_stats *st) {
    int rc = model_acts_init_kv(m, &p->a, x->g->P, x->hp.in.M, &x->kv, &x->dkv, 0, 0, recompute);
    if (rc) return rc;
    size_t in = (size_t)x->g->P * m->cfg.C * (size_t)m->be->act_bytes;
    st->dormant_mib = (recompute ? in : p->a.layer_bytes) * (double)m->cfg.L / 1048576.0;
    st->recomputed = recompute;
    return 0;
}

/* The dormant set (or with recompute each layer's input) through host memory: `ring` layers of
 * it on the device. RING when the free device memory (mem_info) holds the extra slots beside
 * RING_MARGIN: the backward fetches RING - 1 layers ahead. Else 2, the fewest the forward needs
 * (a layer writes the next one's input): the backward fetches one layer ahead into the slot it
 * has just left, no memory beyond the forward's spent on prefetching. */
static int pacts_host(const model *m, prompt_acts *p, split_ctx *x, int recompute, split_mem *mem, split_stats *st) {
    eng_backend *be = m->be;
    int L = m->cfg.L, P = x->g->P, M = x->hp.in.M;
    int rc = model_acts_init_kv(m, &p->a, P, M, &x->kv, &x->dkv, 0, 2, recompute);
    if (rc) return rc;
    p->ring = 2;
    size_t fr = 0, tot = 0;
    if (!be->mem_info || (!be->mem_info(be, &fr, &tot) && fr >= (RING - 2) * p->a.layer_bytes + RING_MARGIN)) {
        model_acts_free(m, &p->a);
        if ((rc = model_acts_init_kv(m, &p->a, P, M, &x->kv, &x->dkv, 0, RING, recompute))) return rc;
        p->ring = RING;
    }
    size_t bytes = p->a.layer_bytes * (size_t)(L - p->ring);
    st->dormant_mib = p->a.layer_bytes * (double)L / 1048576.0;
    split_mem *s = mem ? mem : &p->own;
    /* pinning more than the host has left would page the machine to a halt: refuse first */
    size_t avail = host_avail_bytes();
    if (s->bytes < bytes && avail && bytes > (avail + s->bytes) / 10 * 9)
        return err_set(GE_TOO_LARGE,
                       "prompt of %d tokens: its saved activations (%.0f MiB%s, %.0f to move out) fit "
                       "neither on %s nor in the host memory left (%.0f MiB)",
                       P, st->dormant_mib, recompute ? ", the layers' inputs alone" : "", bytes / 1048576.0, be->name,
                       (avail + s->bytes) / 1048576.0);
    if (s->bytes < bytes) {
        double t = clock_mono_ms();
        split_mem_free(be, s);
        s->host = be->host_alloc ? be->host_alloc(be, bytes) : malloc(bytes);
        s->bytes = s->host ? bytes : 0;
        st->ms_host_alloc = clock_mono_ms() - t;
    }
    p->host = s->host;
    if (!p->host)
        return err_set(GE_TOO_LARGE,
                       "prompt of %d tokens: its saved activations (%.0f MiB) fit neither on %s nor "
                       "in host memory",
                       P, st->dormant_mib, be->name);
    st->offloaded = 1;
    st->ring = p->ring;
    st->recomputed = recompute;
    return 0;
}

/* The prompt's saved activations where `offload` says (split.h: SPLIT_DEVICE .. SPLIT_RECOMPUTE_HOST),
 * or for -1 the first of those that fits. With L <= RING nothing would move: the host forms are
 * the device ones. */
static int pacts_init(const model *m, prompt_acts *p, split_ctx *x, int offload, split_mem *mem, split_stats *st) {
    int rc = GE_NOMEM;
    for (int k = SPLIT_DEVICE; k <= SPLIT_RECOMPUTE_HOST && rc; k++) {
        if (offload >= 0 && k != offload) continue;
        pacts_free(m, p);
        st->dormant_mib = st->ms_host_alloc = 0;
        st->offloaded = st->ring = st->recomputed = 0;
        int host = k == SPLIT_HOST || k == SPLIT_RECOMPUTE_HOST, rec = k >= SPLIT_RECOMPUTE;
        rc = host && m->cfg.L > RING ? pacts_host(m, p, x, rec, mem, st) : pacts_device(m, p, x, rec, st);
    }
    return rc;
}

/* Events of the backend's copy lanes (backend.h; offload.c has 0..7): the ops so far, the copy
 * of each ring slot out and in, all copies out. */
enum { EV_GO = 8, EV_OUT = 9, EV_IN = EV_OUT + RING, EV_OUTS = EV_IN + RING };
_Static_assert((int)EV_OUTS < (int)BE_EVENTS, "split.c: copy-lane events");

/* Queue a copy of layer l's block between its slot and host memory on the backend's copy lane
 * (device -> host or host -> device), to start once the ops queued so far are done; its event
 * is that of l's ring slot. Without lanes (cpu) the copy is synchronous. */
static int pacts_copy(const model *m, prompt_acts *p, int l, int to_host) {
    eng_backend *be = m->be;
    size_t n = p->a.layer_bytes;
    char *h = p->host + n * (size_t)l, *d = p->a.l[l].x;
    if (!be->copy_async) return to_host ? be->to_host(be, h, d, n) : be->to_dev(be, d, h, n);
    int lane = to_host ? BE_LANE_D2H : BE_LANE_H2D;
    be->mark(be, BE_LANE_OPS, EV_GO);
    int rc = be->wait(be, lane, EV_GO);
    if (!rc) rc = be->copy_async(be, lane, to_host ? (void *)h : d, to_host ? (void *)d : h, n);
    be->mark(be, lane, (to_host ? EV_OUT : EV_IN) + l % p->ring);
    return rc;
}
/* The ops queued next wait for the last copy of layer l's slot (out or in). */
static int pacts_wait(const model *m, const prompt_acts *p, int l, int to_host) {
    eng_backend *be = m->be;
    return be->copy_async ? be->wait(be, BE_LANE_OPS, (to_host ? EV_OUT : EV_IN) + l % p->ring) : 0;
}

/* A: the prompt's forward, its K/V into cache rows [0, P), its dormant set moved out as it goes. */
static int prompt_forward(const model *m, const model_views *w, prompt_acts *p, split_ctx *x, const model_dev_input *d,
                          float temperature, int want_entropy) {
    const model_config *c = &m->cfg;
    eng_backend *be = m->be;
    model_acts *a = &p->a;
    int R = p->ring, rc = 0;
    a->ep_rc = 0;
    be->embedding_fwd(be, a->l[0].x, d->tokens, w->embed, d->T, c->C);
    for (int l = 0; l < c->L && !rc; l++) {
        if (R && l + 1 - R >= 0 && l + 1 - R < c->L - R) rc = pacts_wait(m, p, l + 1 - R, 1);
        void *out = l + 1 < c->L ? a->l[l + 1].x : a->xL;
        model_layer_fwd(m, w, a, l, out, d, x->kv.k[l], x->kv.v[l]);
        if (!rc && R && l < c->L - R) rc = pacts_copy(m, p, l, 1);
    }
    /* every copy out done before the sync below: the backward's copies in read host memory on
     * the other lane */
    if (!rc && R && be->copy_async) {
        be->mark(be, BE_LANE_D2H, EV_OUTS);
        rc = be->wait(be, BE_LANE_OPS, EV_OUTS);
    }
    if (rc) return rc;
    be->rmsnorm_fwd(be, a->lnf, a->rstdf, a->xL, w->final_norm, d->T, c->C, c->eps);
    if (d->M)
        be->logprob_fwd(be, a->logp, want_entropy ? a->ent : NULL, a->lnf, d->out_pos, d->out_tok, w->lm_head, d->M, c->C, c->V,
                        temperature);
    rc = be->sync(be);
    return rc ? rc : a->ep_rc; /* an expert-parallel exchange's failure (moe_ep.h) */
}

/* C: the prompt's backward from its own predictions' dlogp/dent (host, M) and dkv's rows [0, P). */
static int prompt_backward(const model *m, const model_views *w, const model_views *g, prompt_acts *p, const model_dev_input *d,
                           const float *dlogp, const float *dent, float temperature) {
    const model_config *c = &m->cfg;
    eng_backend *be = m->be;
    model_acts *a = &p->a;
    int T = d->T, M = d->M, C = c->C, L = c->L, R = p->ring, rc = 0;
    size_t eb = (size_t)be->act_bytes;
    a->ep_rc = 0;
    if (M) rc = be->to_dev(be, a->dlogp, dlogp, (size_t)M * 4);
    if (!rc && M && dent) rc = be->to_dev(be, a->dent, dent, (size_t)M * 4);
    if (rc) return rc;
    be->zero(be, a->dlnf, (size_t)T * C * eb);
    be->zero(be, a->dres, (size_t)T * C * eb);
    if (M)
        be->logprob_bwd(be, a->dlnf, g->lm_head, a->dlogp, dent ? a->dent : NULL, a->lnf, d->out_pos, d->out_tok, w->lm_head, M,
                        C, c->V, temperature);
    be->rmsnorm_bwd(be, a->dres, g->final_norm, a->dlnf, a->xL, w->final_norm, a->rstdf, T, C);
    for (int l = L - 1; l >= 0 && !rc; l--) {
        int f = l + 1 - R; /* fetched now into layer l + 1's slot, used R - 1 layers later */
        if (R && f >= 0 && f < L - R) rc = pacts_copy(m, p, f, 0);
        if (!rc && R && l < L - R) rc = pacts_wait(m, p, l, 0);
        if (l < a->n_ckpt) model_layer_fwd(m, w, a, l, NULL, d, NULL, NULL); /* refill the shared set */
        model_layer_bwd(m, w, g, a, l, d);
    }
    if (rc) return rc;
    be->embedding_bwd(be, g->embed, a->dres, d->tokens, T, C);
    rc = be->sync(be);
    return rc ? rc : a->ep_rc;
}

int split_train(const model *m, const model_views *w, const model_views *g_out, const pack_group *g, const split_opts *o,
                float *logp, float *ent, float *dlogp, float *dent, split_loss_cb loss, void *ud, split_stats *st) {
    split_stats st0;
    if (!st) st = &st0;
    memset(st, 0, sizeof *st);
    eng_backend *be = m->be;
    split_ctx x;
    prompt_acts p = {0};
    model_acts as = {0};
    host_input hr = {0};
    model_dev_input dp;
    int P = g->P, want_ent = ent != NULL;
    double t = clock_mono_ms();
    int rc = ctx_init(&x, m, g, o, 1, st);
    if (!rc) rc = model_acts_init_kv(m, &as, x.capT, x.capM, &x.kv, &x.dkv, P, 0, 0);
    if (!rc) rc = pacts_init(m, &p, &x, o->offload, o->mem, st);
    as.acc = p.a.acc = &x.acc;
    if (x.carry_mem) { /* the DeltaNet layers: the prompt's end carried to every response micro-batch */
        p.a.carry = &x.cy_prompt;
        as.carry = &x.cy_resp;
    }
    /* A */
    if (!rc) rc = model_input_upload(m, &p.a, &x.hp.in, &dp);
    if (!rc) rc = gate(o, MODEL_PASS_FWD);
    if (!rc) rc = prompt_forward(m, w, &p, &x, &dp, o->temperature, want_ent);
    if (!rc && dp.M) rc = be->to_host(be, x.hbuf, p.a.logp, (size_t)dp.M * 4);
    if (!rc) first_scatter(g, x.off, x.hbuf, logp);
    if (!rc && want_ent && dp.M) rc = be->to_host(be, x.hbuf, p.a.ent, (size_t)dp.M * 4);
    if (!rc && want_ent) first_scatter(g, x.off, x.hbuf, ent);
    st->ms_prompt_fwd = clock_mono_ms() - t;
    t = clock_mono_ms();
    /* B: acc collects the prompt keys' gradients from every response micro-batch */
    if (!rc && x.acc_bytes) be->zero(be, x.acc_mem, x.acc_bytes);
    if (!rc && x.carry_grad_bytes) be->zero(be, (char *)x.carry_mem + x.carry_grad_bytes, x.carry_grad_bytes);
    for (int k = 0; k < x.nb && !rc; k++) {
        int r0 = x.first[k], r1 = x.first[k + 1];
        if ((rc = resp_input(&hr, g, r0, r1))) break;
        int M = hr.in.M;
        rc = gate(o, MODEL_PASS_FWD);
        if (!rc) rc = model_forward(m, w, &as, &x.kv, &hr.in, o->temperature, want_ent);
        if (!rc && M) rc = be->to_host(be, x.hbuf, as.logp, (size_t)M * 4);
        if (!rc) rest_scatter(g, x.off, r0, r1, x.hbuf, logp);
        if (!rc && want_ent && M) rc = be->to_host(be, x.hbuf, as.ent, (size_t)M * 4);
        if (!rc && want_ent) rest_scatter(g, x.off, r0, r1, x.hbuf, ent);
        if (!rc) rc = loss(ud, r0, r1);
        float *de = NULL;
        if (!rc && dent) {
            /* model_backward takes dlogp and dent as two host arrays: dent after dlogp in hbuf
             * would need 2M; a second gather buffer keeps hbuf at capM */
            de = malloc(((size_t)M + 1) * sizeof(float));
            if (!de) rc = err_set(GE_NOMEM, "split: out of memory");
            else rest_gather(g, x.off, r0, r1, dent, de);
        }
        if (!rc) rc = gate(o, MODEL_PASS_BWD + as.n_ckpt);
        if (!rc) {
            rest_gather(g, x.off, r0, r1, dlogp, x.hbuf);
            rc = model_backward(m, w, g_out, &as, &hr.in, x.hbuf, de, o->temperature);
        }
        free(de);
        free(hr.mem);
        hr.mem = NULL;
        st->n_micro++;
    }
    st->ms_resp = clock_mono_ms() - t;
    t = clock_mono_ms();
    /* C: the prompt's backward, its first-token predictions' gradients and dK/dV in */
    float *de = NULL;
    if (!rc && dent && !(de = malloc(((size_t)g->N + 1) * sizeof(float)))) rc = err_set(GE_NOMEM, "split: out of memory");
    if (!rc) rc = gate(o, MODEL_PASS_BWD + p.a.n_ckpt);
    if (!rc) {
        first_gather(g, x.off, dlogp, x.hbuf);
        if (de) first_gather(g, x.off, dent, de);
        rc = prompt_backward(m, w, g_out, &p, &dp, x.hbuf, de, o->temperature);
    }
    free(de);
    st->ms_prompt_bwd = clock_mono_ms() - t;
    if (as.mem) model_acts_free(m, &as);
    pacts_free(m, &p);
    ctx_free(&x);
    return rc;
}
