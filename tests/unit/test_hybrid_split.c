/* test_hybrid_split.c — a hybrid model's group split over micro-batches (engine/model/split.h)
 * equals the one-graph packed layout on the CPU backend: the prompt's forward once hands each
 * DeltaNet layer's final recurrent state and conv tail (the carry, kernels/deltanet.h) to every
 * response micro-batch, whose backwards add the carry's gradients up for the prompt's backward;
 * the gated attention layers read the cached prompt K/V and sum its gradients as full attention
 * does.
 *
 * The ops first (deltanet_carry_equals_whole): the conv and rule with a carry across the
 * schedule's passes against the whole packed run, conv widths 1, 2, 4, prompts shorter than the
 * conv: the same forward bits, gradients within 1e-5.
 *
 * Models: the fixtures of test_hybrid.c (qwen3_5_text, qwen3_5_text_b: other conv width and head
 * ratios, a DeltaNet last layer; qwen3_5_moe_text; qwen3_next, qwen3_next_b: MoE layers, fused
 * projections). Groups: P 9 (above the conv), P 2 (below it: the tail holds zeros before the
 * prompt), P 1; ragged responses with R = 1 and R < the conv, at a budget of the longest
 * response, which gives 3 and more response micro-batches. The loss weighs every logprob and
 * entropy with random weights. Tolerance 1e-5 relative (L2 over all logprobs / each gradient
 * tensor): the schedules sum the same terms in other orders (the prompt's state gradient is a
 * sum over micro-batches of partial sums), fp32 rounding only. The forward-only form gives the
 * same logprobs, and with the prompt's saved activations through host memory the same again.
 *
 * The carry's gradients carry real weight: with the state gradient dropped (ds_out), or the conv
 * tail's (dtail_out), the gradients leave the one-graph ones by more than 1e-3.
 * Whole updates split by the budget against one graph: test_update_split.c. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "loaded_model.h"
#include "common/err.h"
#include "engine/model/model.h"
#include "engine/model/pack.h"
#include "engine/model/split.h"
#include "kernels/deltanet.h"

#define FIX "tests/fixtures/data"

/* a fixture by its folder's name */
static void load(loaded *x, const char *name) {
    char dir[256];
    snprintf(dir, sizeof dir, FIX "/%s", name);
    loaded_open(x, dir);
}

/* ---------------------------------------------------------------- groups */

enum { NG = 3, NMAX = 5 };
static const int P_[NG] = {9, 2, 1}, N_[NG] = {4, 4, 5}, R_[NG][NMAX] = {{1, 6, 3, 8}, {4, 5, 2, 7}, {2, 3, 1, 3, 2}};
/* budgets: the longest response of each group (3, 3 and 4 micro-batches: split_resp_batches) */
static const long long MT[NG] = {8, 7, 3};

typedef struct {
    int *prompt[NG], *resp[NG][NMAX];
    const int *rp[NG][NMAX];
    pack_group pg[NG];
    long long M, Mg[NG + 1];
} groups;

static void groups_make(groups *G, int V, unsigned long long seed) {
    memset(G, 0, sizeof *G);
    unsigned long long s = seed;
    for (int g = 0; g < NG; g++) {
        G->prompt[g] = malloc((size_t)P_[g] * sizeof(int));
        for (int i = 0; i < P_[g]; i++) G->prompt[g][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (V - 1));
        for (int r = 0; r < N_[g]; r++) {
            G->resp[g][r] = malloc((size_t)R_[g][r] * sizeof(int));
            for (int i = 0; i < R_[g][r]; i++) G->resp[g][r][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (V - 1));
            G->rp[g][r] = G->resp[g][r];
            G->M += R_[g][r];
        }
        G->Mg[g + 1] = G->M;
        G->pg[g] = (pack_group){.prompt = G->prompt[g], .P = P_[g], .N = N_[g], .resp = G->rp[g], .R = R_[g]};
    }
}

static void groups_free(groups *G) {
    for (int g = 0; g < NG; g++) {
        for (int r = 0; r < N_[g]; r++) free(G->resp[g][r]);
        free(G->prompt[g]);
    }
}

/* ---------------------------------------------------------------- the two schedules */

typedef struct {
    float *logp, *ent, *grad;
} run_out;

static void run_free(run_out *o) {
    free(o->logp);
    free(o->ent);
    free(o->grad);
}

/* Every group in one packed graph: logprobs, entropies, the gradient of Σ wl·logp + we·ent. */
static void run_packed(loaded *x, const groups *G, const float *wl, const float *we, run_out *o) {
    pack_batch b;
    CHECK(pack_build(&b, G->pg, 0, NG, PACK_PACKED) == 0);
    model_acts a;
    CHECK(model_acts_init(&x->m, &a, b.T, b.M, 1) == 0);
    model_input in;
    model_input_from_batch(&in, &b);
    o->grad = calloc((size_t)x->m.n_elems, 4);
    o->logp = malloc((size_t)b.M * 4);
    o->ent = malloc((size_t)b.M * 4);
    model_views gv;
    model_views_make(&x->m, o->grad, 4, &gv);
    CHECK_MSG(model_forward(&x->m, &x->wv, &a, NULL, &in, 0.8f, 1) == 0, "%s", err_msg());
    memcpy(o->logp, a.logp, (size_t)b.M * 4);
    memcpy(o->ent, a.ent, (size_t)b.M * 4);
    CHECK(model_backward(&x->m, &x->wv, &gv, &a, &in, wl, we, 0.8f) == 0);
    model_views_free(&gv);
    model_acts_free(&x->m, &a);
    pack_batch_free(&b);
}

/* The loss callback: dlogp, dent of responses [r0, r1) are the fixed weights. */
typedef struct {
    const float *wl, *we;
    float *dlogp, *dent;
    const long long *off;
    int calls;
} cb_ud;
static int cb_loss(void *ud, int r0, int r1) {
    cb_ud *u = ud;
    for (long long i = u->off[r0]; i < u->off[r1]; i++) {
        u->dlogp[i] = u->wl[i];
        u->dent[i] = u->we[i];
    }
    u->calls++;
    return 0;
}

/* Every group through split_train at its budget (dormant set on the device, through host
 * memory, or recomputed with the layers' inputs on the device or through host memory), and through split_forward: o->ent holds the forward-only logprobs. *micro: the
 * response micro-batches of each group, at least. */
static void run_split(loaded *x, const groups *G, const float *wl, const float *we, int offload, run_out *o, int *micro) {
    size_t M = (size_t)G->M;
    float *ent = malloc(M * 4), *dl = malloc(M * 4), *de = malloc(M * 4);
    o->logp = malloc(M * 4);
    o->ent = malloc(M * 4);
    o->grad = calloc((size_t)x->m.n_elems, 4);
    model_views gv;
    model_views_make(&x->m, o->grad, 4, &gv);
    *micro = 1 << 30;
    for (int g = 0; g < NG; g++) {
        const pack_group *pg = &G->pg[g];
        long long o0 = G->Mg[g], off[NMAX + 1] = {0};
        for (int r = 0; r < pg->N; r++) off[r + 1] = off[r] + pg->R[r];
        split_opts so = {MT[g], 0.8f, offload, NULL};
        cb_ud u = {wl + o0, we + o0, dl + o0, de + o0, off, 0};
        split_stats ss, fs;
        CHECK_MSG(split_train(&x->m, &x->wv, &gv, pg, &so, o->logp + o0, ent + o0, dl + o0, de + o0, cb_loss, &u, &ss) == 0,
                  "split_train: %s", err_msg());
        CHECK_EQ_INT(u.calls, ss.n_micro);
        CHECK_EQ_INT(ss.offloaded, offload == SPLIT_HOST || offload == SPLIT_RECOMPUTE_HOST);
        CHECK_EQ_INT(ss.recomputed, offload >= SPLIT_RECOMPUTE);
        *micro = ss.n_micro < *micro ? ss.n_micro : *micro;
        CHECK_MSG(split_forward(&x->m, &x->wv, pg, &so, o->ent + o0, NULL, &fs) == 0, "split_forward: %s", err_msg());
        CHECK_EQ_INT(fs.n_micro, ss.n_micro);
    }
    model_views_free(&gv);
    free(ent);
    free(dl);
    free(de);
}

/* ---------------------------------------------------------------- the carry's gradients dropped */

/* The cpu backend's DeltaNet backwards, with the gradient from outside dropped: DROP_STATE the
 * prompt's state gradient (ds_out), DROP_TAIL its conv tail's (dtail_out). */
enum { DROP_NONE, DROP_STATE, DROP_TAIL };
static int drop;
static void (*rule_bwd0)(eng_backend *, void *, void *, void *, float *, float *, float *, float *, const void *, const void *,
                         const void *, const void *, const void *, const void *, attn_ranges, const deltanet_carry *, int, int,
                         int, int, int);
static void (*conv_bwd0)(eng_backend *, void *, float *, const void *, const void *, const void *, attn_ranges,
                         const deltanet_carry *, int, int, int);
static void rule_bwd_drop(eng_backend *b, void *du, void *da, void *db, float *dal, float *ddt, float *st, float *dst,
                          const void *dy, const void *u, const void *a, const void *bb, const void *al, const void *dt,
                          attn_ranges r, const deltanet_carry *cy, int T, int Hk, int Hv, int Dk, int Dv) {
    deltanet_carry c = cy ? *cy : (deltanet_carry){0};
    if (drop == DROP_STATE) c.ds_out = NULL;
    rule_bwd0(b, du, da, db, dal, ddt, st, dst, dy, u, a, bb, al, dt, r, cy ? &c : NULL, T, Hk, Hv, Dk, Dv);
}
static void conv_bwd_drop(eng_backend *b, void *dx, float *dw, const void *du, const void *x, const void *w, attn_ranges r,
                          const deltanet_carry *cy, int T, int Cc, int Kc) {
    deltanet_carry c = cy ? *cy : (deltanet_carry){0};
    if (drop == DROP_TAIL) c.dtail_out = NULL;
    conv_bwd0(b, dx, dw, du, x, w, r, cy ? &c : NULL, T, Cc, Kc);
}

/* ---------------------------------------------------------------- the ops */

/* The DeltaNet ops (kernels/deltanet.h) on [P; R_1 R_2 R_3] packed whole, against the split
 * schedule's passes with a carry: the prompt (row0 0, handing its end on), responses {1, 2} and
 * {3} (row0 P, cache rows). The forwards give the same bits (the carry holds copies of the values
 * the whole run reads, summed in the same order); the gradients 1e-5 relative (a prompt row's
 * gradient sums its successors' in another order). Conv widths 1 (no tail), 2 and 4; prompts of
 * 1 and 2 tokens (shorter than the conv: zeros in the tail) and 9. */
enum { DH_K = 2, DH_V = 4, DK = 8, DV = 6, DCC = 2 * DH_K * DK + DH_V * DV };
typedef struct {
    float *x, *u, *a, *b, *dy, *dux; /* per token: x, u, du (T,DCC); a, b (T,DH_V); dy (T,DH_V,DV) */
} dn_tok;
typedef struct {
    float *uc, *dx, *o, *du, *da, *db; /* per token results, as dn_tok */
    float dw[DCC * 4], dal[DH_V], ddt[DH_V];
} dn_res;

/* the four ops on tokens [t0, t0 + T) of in (ranges r), results into out at the same tokens */
static void dn_ops(const dn_tok *in, dn_res *out, int t0, int T, attn_ranges r, const deltanet_carry *fw,
                   const deltanet_carry *bw, const float *w, const float *alog, const float *dt, int Kc) {
    size_t SZ = (size_t)DH_V * DK * DV;
    float *st = malloc((size_t)T * SZ * 4), *dst = malloc((size_t)T * SZ * 4);
    size_t c0 = (size_t)t0 * DCC, h0 = (size_t)t0 * DH_V, v0 = (size_t)t0 * DH_V * DV;
    deltanet_conv_fwd_cpu(out->uc + c0, in->x + c0, w, r, fw, T, DCC, Kc);
    deltanet_rule_fwd_cpu(out->o + v0, st, in->u + c0, in->a + h0, in->b + h0, alog, dt, r, fw, T, DH_K, DH_V, DK, DV);
    deltanet_conv_bwd_cpu(out->dx + c0, out->dw, in->dux + c0, in->x + c0, w, r, bw, T, DCC, Kc);
    deltanet_rule_bwd_cpu(out->du + c0, out->da + h0, out->db + h0, out->dal, out->ddt, st, dst, in->dy + v0, in->u + c0,
                          in->a + h0, in->b + h0, alog, dt, r, bw, T, DH_K, DH_V, DK, DV);
    free(st);
    free(dst);
}

/* The ranges of tokens [t0, t0 + T) of [P; R_1 R_2 R_3]: the prompt causal on itself, a response
 * over the prompt and causally over itself; over token indices (whole: row0 < 0) or, for a
 * response micro-batch, over rows (its token t at row row0 + t, the prompt at rows [0, P)). */
static attn_ranges dn_ranges(int *buf, int P, const int *R, int t0, int T, int row0) {
    int *a0 = buf, *a1 = buf + T, *b0 = buf + 2 * T, *b1 = buf + 3 * T, off = row0 < 0 ? 0 : row0 - t0;
    for (int t = 0; t < T; t++) {
        int g = t0 + t, s = P; /* the token in [P; R..]; the start of its response */
        for (int k = 0; k < 3 && g >= s + R[k]; k++) s += R[k];
        a0[t] = 0;
        a1[t] = g < P ? g + 1 : P;
        b0[t] = g < P ? 0 : s + off;
        b1[t] = g < P ? 0 : g + 1 + off;
    }
    return (attn_ranges){a0, a1, b0, b1, NULL, NULL, 0};
}

TEST(deltanet_carry_equals_whole) {
    static const int Ps[] = {1, 2, 9}, Ks[] = {1, 2, 4}, R[3] = {3, 1, 5};
    size_t SZ = (size_t)DH_V * DK * DV;
    for (int pi = 0; pi < 3; pi++)
        for (int ki = 0; ki < 3; ki++) {
            int P = Ps[pi], Kc = Ks[ki], T = P + R[0] + R[1] + R[2], TL = (Kc - 1) * DCC, buf[4 * 32];
            unsigned long long sd = 7500 + (unsigned long long)(pi * 3 + ki) * 20;
            dn_tok in;
            float **f[] = {&in.x, &in.u, &in.a, &in.b, &in.dy, &in.dux};
            size_t n[] = {(size_t)T * DCC,  (size_t)T * DCC,       (size_t)T * DH_V,
                          (size_t)T * DH_V, (size_t)T * DH_V * DV, (size_t)T * DCC};
            for (int i = 0; i < 6; i++) {
                *f[i] = malloc(n[i] * 4);
                check_fill(*f[i], n[i], sd + i, i == 2 || i == 3 ? 2.0f : 1.0f);
            }
            float w[DCC * 4], alog[DH_V], dt[DH_V];
            check_fill(w, (size_t)DCC * Kc, sd + 7, 0.5f);
            check_fill(alog, DH_V, sd + 8, 1.0f);
            check_fill(dt, DH_V, sd + 9, 1.0f);
            dn_res whole = {0}, split = {0}, *rs[] = {&whole, &split};
            for (int k = 0; k < 2; k++) {
                float **g[] = {&rs[k]->uc, &rs[k]->dx, &rs[k]->o, &rs[k]->du, &rs[k]->da, &rs[k]->db};
                size_t m[] = {n[0], n[0], n[4], n[0], n[2], n[2]};
                for (int i = 0; i < 6; i++) *g[i] = calloc(m[i], 4);
            }
            dn_ops(&in, &whole, 0, T, dn_ranges(buf, P, R, 0, T, -1), NULL, NULL, w, alog, dt, Kc);
            /* split, in the schedule's order: the prompt's forward hands its end on; each response
             * micro-batch starts from it and adds its gradients up; the prompt's backward takes them */
            float *cs = malloc(SZ * 4), *ct = malloc((size_t)TL * 4 + 4), *ds = calloc(SZ, 4), *dtl = calloc((size_t)TL + 1, 4);
            float *st = malloc((size_t)P * SZ * 4);
            deltanet_carry out = {.row0 = 0, .s_out = cs, .tail_out = ct, .ds_out = ds, .dtail_out = dtl};
            deltanet_carry inc = {.row0 = P, .s_in = cs, .tail_in = ct, .ds_in = ds, .dtail_in = dtl};
            attn_ranges rp = dn_ranges(buf, P, R, 0, P, 0);
            deltanet_conv_fwd_cpu(split.uc, in.x, w, rp, &out, P, DCC, Kc);
            deltanet_rule_fwd_cpu(split.o, st, in.u, in.a, in.b, alog, dt, rp, &out, P, DH_K, DH_V, DK, DV);
            int mb[3] = {P, P + R[0] + R[1], T}; /* response micro-batches [mb0, mb1), [mb1, mb2) */
            for (int k = 0; k < 2; k++)
                dn_ops(&in, &split, mb[k], mb[k + 1] - mb[k], dn_ranges(buf, P, R, mb[k], mb[k + 1] - mb[k], P), &inc, &inc, w,
                       alog, dt, Kc);
            out.s_out = out.tail_out = NULL; /* the forward again (the same bits), then the backward */
            dn_ops(&in, &split, 0, P, dn_ranges(buf, P, R, 0, P, 0), &out, &out, w, alog, dt, Kc);
            double e[] = {rel_l2(split.uc, whole.uc, n[0]),
                          rel_l2(split.o, whole.o, n[4]),
                          rel_l2(split.dx, whole.dx, n[0]),
                          rel_l2(split.du, whole.du, n[0]),
                          rel_l2(split.da, whole.da, n[2]),
                          rel_l2(split.db, whole.db, n[2]),
                          rel_l2(split.dw, whole.dw, (size_t)DCC * Kc),
                          rel_l2(split.dal, whole.dal, DH_V),
                          rel_l2(split.ddt, whole.ddt, DH_V)};
            printf("  P %d Kc %d: u %.0e o %.0e | dx %.1e du %.1e da %.1e db %.1e dw %.1e dA_log %.1e ddt_bias %.1e\n", P, Kc,
                   e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8]);
            CHECK(e[0] == 0 && e[1] == 0);
            for (int i = 2; i < 9; i++) CHECK_MSG(e[i] <= 1e-5, "P %d Kc %d: gradient %d rel L2 %.3g", P, Kc, i, e[i]);
            for (int k = 0; k < 2; k++) {
                float *g[] = {rs[k]->uc, rs[k]->dx, rs[k]->o, rs[k]->du, rs[k]->da, rs[k]->db};
                for (int i = 0; i < 6; i++) free(g[i]);
            }
            for (int i = 0; i < 6; i++) free(*f[i]);
            free(cs), free(ct), free(ds), free(dtl), free(st);
        }
}

/* ---------------------------------------------------------------- model level */

TEST(hybrid_split_equals_packed) {
    static const char *models[] = {"qwen3_5_text", "qwen3_5_text_b", "qwen3_5_moe_text", "qwen3_next", "qwen3_next_b"};
    for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
        loaded x;
        load(&x, models[mi]);
        groups G;
        groups_make(&G, x.cfg.V, 7101 + mi);
        size_t M = (size_t)G.M, n = (size_t)x.m.n_elems;
        float *wl = malloc(M * 4), *we = malloc(M * 4);
        check_fill(wl, M, 7201 + mi, 1.0f);
        check_fill(we, M, 7301 + mi, 1.0f);
        run_out pk = {0};
        run_packed(&x, &G, wl, we, &pk);
        static const char *where[] = {"on device", "dormant via host", "recomputed", "recomputed, inputs via host"};
        for (int offload = SPLIT_DEVICE; offload <= SPLIT_RECOMPUTE_HOST; offload++) {
            run_out sp;
            int micro;
            run_split(&x, &G, wl, we, offload, &sp, &micro);
            double el = rel_l2(sp.logp, pk.logp, M), ef = rel_l2(sp.ent, pk.logp, M), eg = rel_l2(sp.grad, pk.grad, n), worst = 0;
            const char *wn = "";
            for (int i = 0; i < x.m.n_params; i++) {
                const model_param *p = &x.m.params[i];
                double e = rel_l2(sp.grad + p->off, pk.grad + p->off, (size_t)p->numel);
                if (e > worst) worst = e, wn = p->name;
            }
            printf("  %-16s %s: >= %d micro-batches a group; vs one graph: logprobs %.2e forward-only %.2e gradients %.2e "
                   "(worst tensor %.2e %s)\n",
                   models[mi], where[offload], micro, el, ef, eg, worst, wn);
            CHECK(micro >= 3);
            CHECK_MSG(el <= 1e-5 && ef <= 1e-5 && eg <= 1e-5, "%s: split differs: %.3g %.3g %.3g", models[mi], el, ef, eg);
            CHECK_MSG(worst <= 1e-5, "%s: %s rel L2 %.3g", models[mi], wn, worst);
            run_free(&sp);
        }
        /* the carry's gradients dropped, one at a time: the gradients leave the one graph's */
        rule_bwd0 = x.be->deltanet_rule_bwd;
        conv_bwd0 = x.be->deltanet_conv_bwd;
        x.be->deltanet_rule_bwd = rule_bwd_drop;
        x.be->deltanet_conv_bwd = conv_bwd_drop;
        for (drop = DROP_STATE; drop <= DROP_TAIL; drop++) {
            run_out sp;
            int micro;
            run_split(&x, &G, wl, we, 0, &sp, &micro);
            double eg = rel_l2(sp.grad, pk.grad, n), el = rel_l2(sp.logp, pk.logp, M);
            printf("  %-16s %s gradient dropped: logprobs %.2e, gradients %.2e\n", models[mi],
                   drop == DROP_STATE ? "state" : "conv tail", el, eg);
            CHECK(el <= 1e-5);
            CHECK_MSG(eg > 1e-3, "%s: dropping the %s gradient moves the gradients by %.3g only", models[mi],
                      drop == DROP_STATE ? "state" : "conv tail", eg);
            run_free(&sp);
        }
        x.be->deltanet_rule_bwd = rule_bwd0;
        x.be->deltanet_conv_bwd = conv_bwd0;
        run_free(&pk);
        free(wl);
        free(we);
        groups_free(&G);
        loaded_close(&x);
    }
}

int main(void) {
    RUN(deltanet_carry_equals_whole);
    RUN(hybrid_split_equals_packed);
    return CHECK_DONE();
}
