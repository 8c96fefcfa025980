/* test_equivalence.c — grpod's core claim on the fp32 reference: training on [P; R_1 .. R_N]
 * (P + ΣR tokens) gives the same per-token logprobs and the same parameter gradients of the
 * same loss as N copies of [P; R_i] (NP + ΣR tokens) — and so does the three-phase schedule of
 * a group too large for a micro-batch (engine/model/split.h: the prompt once, the responses in 2..N
 * micro-batches attending to its cached K/V, the prompt's backward once).
 * Random groups: different P per group (P = 1 included), N from 1 to 16, ragged R_i (R = 1
 * included), several groups per micro-batch, on a random Qwen3-shaped model (q/k norm, GQA) and
 * a Qwen2-shaped one (QKV bias). The loss weighs every logprob (and, for the split schedule,
 * every entropy) with random weights, so every path of the backward carries gradient; the split
 * cases use 5 layers so that the dormant set's host round trip (a ring of 3 layers) moves real
 * layers, and check the forward-only form too.
 * Tolerance 1e-5 relative (L2 over all logprobs / all gradients): the layouts sum the same
 * terms in different orders (a prompt key's gradient: a sum over micro-batches of partial
 * sums), so they differ by fp32 rounding only. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tiny_model.h"
#include "common/err.h"
#include "engine/model/model.h"
#include "engine/model/pack.h"
#include "engine/model/split.h"

/* A random model of L layers and G random groups (group 0 has 16 responses, group 1 one — or,
 * with nmin = 2, a one-token prompt — the others nmin..8; response 0 of each has R = 1). */
enum { G = 5 };
typedef struct {
    model_config c;
    eng_backend *be;
    model m;
    float *w;
    model_views wv;
    pack_group pg[G];
    int *prompts[G], **resp[G], *R[G], maxR[G];
    long long M, Mg[G + 1]; /* predicted tokens: all, and where each group's start */
} fixture;

static void fixture_make(fixture *f, model_arch arch, int L, unsigned long long seed, int nmin) {
    memset(f, 0, sizeof *f);
    model_config c = tiny_model_config(arch, L);
    f->c = c;
    backend_cpu_create(&f->be, 0);
    CHECK(model_init(&f->m, &c, f->be) == 0);
    f->w = malloc((size_t)f->m.n_elems * 4);
    check_fill(f->w, (size_t)f->m.n_elems, seed, 0.2f);
    model_views_make(&f->m, f->w, 4, &f->wv);
    unsigned long long s = seed;
    for (int g = 0; g < G; g++) {
        int P = nmin > 1 && g == 1 ? 1 : 1 + (int)((check_randf(&s, 0.5f) + 0.5f) * 20);
        int N = g == 0 ? 16 : g == 1 && nmin == 1 ? 1 : nmin + (int)((check_randf(&s, 0.5f) + 0.5f) * (9 - nmin));
        f->prompts[g] = malloc((size_t)P * sizeof(int));
        for (int i = 0; i < P; i++) f->prompts[g][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (c.V - 1));
        f->resp[g] = malloc((size_t)N * sizeof(int *));
        f->R[g] = malloc((size_t)N * sizeof(int));
        for (int r = 0; r < N; r++) {
            f->R[g][r] = r == 0 ? 1 : 1 + (int)((check_randf(&s, 0.5f) + 0.5f) * 12);
            if (f->R[g][r] > f->maxR[g]) f->maxR[g] = f->R[g][r];
            f->resp[g][r] = malloc((size_t)f->R[g][r] * sizeof(int));
            for (int i = 0; i < f->R[g][r]; i++) f->resp[g][r][i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (c.V - 1));
            f->M += f->R[g][r];
        }
        f->Mg[g + 1] = f->M;
        f->pg[g] = (pack_group){.prompt = f->prompts[g], .P = P, .N = N, .resp = (const int *const *)f->resp[g], .R = f->R[g]};
    }
}

static void fixture_free(fixture *f) {
    for (int g = 0; g < G; g++) {
        for (int r = 0; r < f->pg[g].N; r++) free(f->resp[g][r]);
        free(f->resp[g]);
        free(f->R[g]);
        free(f->prompts[g]);
    }
    free(f->w);
    model_views_free(&f->wv);
    model_free(&f->m);
    f->be->destroy(f->be);
}

static void equivalence(model_arch arch, unsigned long long seed) {
    fixture f;
    fixture_make(&f, arch, 2, seed, 1);
    model *m = &f.m;
    float *weights = malloc((size_t)f.M * 4);
    /* masked 1: a loss mask (engine/train/loss.h tmask) zeroes ~30% of the per-token weights:
     * those tokens stay in both layouts and are attended to, with no gradient of their own */
    for (int masked = 0; masked < 2; masked++) {
        check_fill(weights, (size_t)f.M, seed + 1, 1.0f);
        unsigned long long q = seed + 7;
        for (int t = 0; masked && t < f.M; t++)
            if (check_randf(&q, 0.5f) < -0.2f) weights[t] = 0;
        run_out pk = {0}, st = {0};
        CHECK(run_layout(m, &f.wv, f.pg, G, PACK_PACKED, weights, NULL, &pk) == 0);
        CHECK(run_layout(m, &f.wv, f.pg, G, PACK_STANDARD, weights, NULL, &st) == 0);
        size_t M = (size_t)f.M;
        double el = rel_l2(pk.logp, st.logp, M), eg = rel_l2(pk.grad, st.grad, (size_t)m->n_elems);
        printf("  %s%s: %lld packed vs %lld standard tokens (%.2fx); logprobs rel L2 %.2e, gradients rel L2 %.2e\n",
               f.c.arch_name, masked ? " (loss-masked)" : "", pk.T, st.T, (double)st.T / pk.T, el, eg);
        CHECK_MSG(pk.T < st.T, "packing saved nothing");
        CHECK_MSG(el <= 1e-5 && eg <= 1e-5, "logprobs %.3g gradients %.3g > 1e-5", el, eg);
        /* Each parameter tensor on its own too: no tensor hides behind a large one. */
        for (int i = 0; i < m->n_params; i++) {
            double e = rel_l2(pk.grad + m->params[i].off, st.grad + m->params[i].off, (size_t)m->params[i].numel);
            CHECK_MSG(e <= 1e-5, "%s: %s rel L2 %.3g", f.c.arch_name, m->params[i].name, e);
        }
        run_free(&pk);
        run_free(&st);
    }
    free(weights);
    fixture_free(&f);
}

/* Tree-shaped groups (engine/model/pack.h): each group's responses begin with the same c tokens
 * (the turns a branching agent's trajectories share), which the packed layout computes once
 * after the prompt; the standard layout has every response whole. Same logprobs and gradients. */
static void tree_equivalence(model_arch arch, unsigned long long seed) {
    fixture f;
    fixture_make(&f, arch, 2, seed, 2);
    unsigned long long s = seed + 11;
    long long want_T = 0;
    f.M = 0;
    for (int g = 0; g < G; g++) {
        pack_group *pg = &f.pg[g];
        int c = 1 + (int)((check_randf(&s, 0.5f) + 0.5f) * 6), trunk[8];
        for (int i = 0; i < c; i++) trunk[i] = (int)((check_randf(&s, 0.5f) + 0.5f) * (f.c.V - 1));
        long long rsum = 0;
        int minR = 1 << 30;
        for (int r = 0; r < pg->N; r++) {
            int R = c + 1 + (int)((check_randf(&s, 0.5f) + 0.5f) * 8);
            f.resp[g][r] = realloc(f.resp[g][r], (size_t)R * sizeof(int));
            for (int i = 0; i < R; i++) f.resp[g][r][i] = i < c ? trunk[i] : (int)((check_randf(&s, 0.5f) + 0.5f) * (f.c.V - 1));
            f.R[g][r] = R;
            rsum += R;
            if (R < minR) minR = R;
        }
        /* a response that diverges at once leaves no trunk; so does a group of one */
        int trunk_len = pg->N > 1 ? c : 0;
        for (int r = 1; r < pg->N && trunk_len; r++)
            for (int i = 0; i < trunk_len; i++)
                if (f.resp[g][r][i] != f.resp[g][0][i]) trunk_len = i;
        if (trunk_len > minR - 1) trunk_len = minR - 1;
        want_T += pg->P + rsum - (long long)(pg->N - 1) * trunk_len;
        f.M += rsum;
        f.Mg[g + 1] = f.M;
    }
    float *weights = malloc((size_t)f.M * 4);
    check_fill(weights, (size_t)f.M, seed + 1, 1.0f);
    run_out pk = {0}, st = {0};
    CHECK(run_layout(&f.m, &f.wv, f.pg, G, PACK_PACKED, weights, NULL, &pk) == 0);
    CHECK(run_layout(&f.m, &f.wv, f.pg, G, PACK_STANDARD, weights, NULL, &st) == 0);
    double el = rel_l2(pk.logp, st.logp, (size_t)f.M), eg = rel_l2(pk.grad, st.grad, (size_t)f.m.n_elems);
    printf("  %s trees: %lld packed (trunks once) vs %lld standard tokens; logprobs rel L2 %.2e, gradients rel L2 %.2e\n",
           f.c.arch_name, pk.T, st.T, el, eg);
    CHECK_MSG(pk.T == want_T, "packed %lld tokens, want %lld (each trunk once)", pk.T, want_T);
    CHECK_MSG(el <= 1e-5 && eg <= 1e-5, "logprobs %.3g gradients %.3g > 1e-5", el, eg);
    run_free(&pk);
    run_free(&st);
    free(weights);
    fixture_free(&f);
}

TEST(tree_equals_standard_qwen3) { tree_equivalence(ARCH_QWEN3, 505); }
TEST(tree_equals_standard_qwen2) { tree_equivalence(ARCH_QWEN2, 606); }

TEST(packed_equals_standard_qwen3) { equivalence(ARCH_QWEN3, 101); }
TEST(packed_equals_standard_qwen2) { equivalence(ARCH_QWEN2, 202); }

/* The loss callback: dlogp, dent of responses [r0, r1) are the fixed weights; checks that the
 * logprobs of those responses are written (NaN-filled before). */
typedef struct {
    const float *wl, *we, *logp;
    float *dlogp, *dent;
    const long long *off;
    int calls, unwritten;
} cb_ud;
static int cb_loss(void *ud, int r0, int r1) {
    cb_ud *u = ud;
    for (long long i = u->off[r0]; i < u->off[r1]; i++) {
        if (u->logp[i] != u->logp[i]) u->unwritten++;
        u->dlogp[i] = u->wl[i];
        u->dent[i] = u->we[i];
    }
    u->calls++;
    return 0;
}

/* A device with no memory to spare: the dormant set's ring takes the 2 slots the forward needs. */
static int no_room(eng_backend *b, size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = 1 << 20;
    *total_bytes = (size_t)1 << 34;
    return 0;
}

/* Each group through split_train at a budget of its longest response
 * (responses up to the longest per micro-batch) and of about half the responses, with the dormant set on the device or through host memory
 * (3 layers of it on the device, or 2 when mem_info says there is no room for more),
 * against the one-graph packed and the standard layouts of all groups. */
static void split_case(model_arch arch, unsigned long long seed) {
    fixture f;
    fixture_make(&f, arch, 5, seed, 2);
    model *m = &f.m;
    size_t M = (size_t)f.M, n = (size_t)m->n_elems;
    float *wl = malloc(M * 4), *we = malloc(M * 4);
    check_fill(wl, M, seed + 1, 1.0f);
    check_fill(we, M, seed + 2, 1.0f);
    run_out pk = {0}, st = {0};
    CHECK(run_layout(m, &f.wv, f.pg, G, PACK_PACKED, wl, we, &pk) == 0);
    CHECK(run_layout(m, &f.wv, f.pg, G, PACK_STANDARD, wl, we, &st) == 0);
    for (int v = 0; v < 6; v++) {
        m->be->mem_info = v >= 4 ? no_room : NULL;
        float *lp = malloc(M * 4), *en = malloc(M * 4), *dl = malloc(M * 4), *de = malloc(M * 4), *flp = malloc(M * 4),
              *grad = calloc(n, 4);
        for (size_t i = 0; i < M; i++) lp[i] = en[i] = flp[i] = 0.0f / 0.0f;
        model_views gv;
        model_views_make(m, grad, 4, &gv);
        int micro = 0, offloaded = 0, unwritten = 0;
        for (int g = 0; g < G; g++) {
            const pack_group *pg = &f.pg[g];
            long long o0 = f.Mg[g], tot = f.Mg[g + 1] - o0;
            long long mt = v & 1 ? (tot / 2 > f.maxR[g] ? tot / 2 : f.maxR[g]) : f.maxR[g];
            split_opts so = {mt, 0.8f, v >= 2, NULL};
            long long off[17] = {0};
            for (int r = 0; r < pg->N; r++) off[r + 1] = off[r] + pg->R[r];
            cb_ud u = {wl + o0, we + o0, lp + o0, dl + o0, de + o0, off, 0, 0};
            split_stats ss, fs;
            int rc = split_train(m, &f.wv, &gv, pg, &so, lp + o0, en + o0, dl + o0, de + o0, cb_loss, &u, &ss);
            CHECK_MSG(rc == 0, "split_train: %s", err_msg());
            CHECK_EQ_INT(u.calls, ss.n_micro);
            CHECK_MSG(ss.n_micro >= 2, "group %d: %d micro-batches", g, ss.n_micro);
            int first[17];
            CHECK_EQ_INT(ss.n_micro, split_resp_batches(pg, mt, first));
            CHECK_EQ_INT(ss.ring, v >= 4 ? 2 : v >= 2 ? 3 : 0);
            micro += ss.n_micro;
            offloaded += ss.offloaded;
            unwritten += u.unwritten;
            CHECK(split_forward(m, &f.wv, pg, &so, flp + o0, NULL, &fs) == 0);
            CHECK_EQ_INT(fs.n_micro, ss.n_micro);
        }
        CHECK_EQ_INT(unwritten, 0);
        CHECK_EQ_INT(offloaded, v >= 2 ? G : 0);
        double el = rel_l2(lp, pk.logp, M), ee = rel_l2(en, pk.ent, M), ef = rel_l2(flp, pk.logp, M),
               eg = rel_l2(grad, pk.grad, n), els = rel_l2(lp, st.logp, M), egs = rel_l2(grad, st.grad, n);
        printf("  %s split, %s, %s: %d micro-batches; vs one graph: logprobs %.2e entropies %.2e forward-only %.2e "
               "gradients %.2e; vs standard: logprobs %.2e gradients %.2e\n",
               f.c.arch_name, v & 1 ? "half the responses" : "longest response",
               v >= 4       ? "dormant via host, 2 on device"
                   : v >= 2 ? "dormant via host"
                            : "on device",
               micro, el, ee, ef, eg, els, egs);
        CHECK_MSG(el <= 1e-5 && ee <= 1e-5 && ef <= 1e-5 && eg <= 1e-5 && els <= 1e-5 && egs <= 1e-5,
                  "split differs: %.3g %.3g %.3g %.3g %.3g %.3g", el, ee, ef, eg, els, egs);
        for (int i = 0; i < m->n_params; i++) {
            double e = rel_l2(grad + m->params[i].off, pk.grad + m->params[i].off, (size_t)m->params[i].numel);
            CHECK_MSG(e <= 1e-5, "%s: %s rel L2 %.3g", f.c.arch_name, m->params[i].name, e);
        }
        model_views_free(&gv);
        free(lp);
        free(en);
        free(dl);
        free(de);
        free(flp);
        free(grad);
    }
    m->be->mem_info = NULL;
    run_free(&pk);
    run_free(&st);
    free(wl);
    free(we);
    fixture_free(&f);
}

TEST(split_equals_packed_and_standard_qwen3) { split_case(ARCH_QWEN3, 303); }
TEST(split_equals_packed_and_standard_qwen2) { split_case(ARCH_QWEN2, 404); }

int main(void) {
    RUN(packed_equals_standard_qwen3);
    RUN(packed_equals_standard_qwen2);
    RUN(tree_equals_standard_qwen3);
    RUN(tree_equals_standard_qwen2);
    RUN(split_equals_packed_and_standard_qwen3);
    RUN(split_equals_packed_and_standard_qwen2);
    return CHECK_DONE();
}
