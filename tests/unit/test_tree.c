/* test_tree.c — prefix trees deeper than one trunk (engine/model/pack.h, PACK_TREE): the layout
 * and the model on it.
 *
 * Layout: random groups shaped like agent trajectories (turn k of response i is chosen by
 * i / q_k with q_k shrinking: turn 1 shared by all, turn 2 by pairs or fours, later turns own),
 * branching at 2-4 depths, truncated at random (a response that is a prefix of another), plus
 * degenerate groups (no sharing, all equal, N = 1, R = 1). Every token's attended (id, position)
 * context must equal the one it has in the standard layout N(P+R), every prediction must read
 * a row whose context is the prefix before its target, the token count must be the trie's
 * (P + the distinct prefixes of the responses short of their last token + one last token each),
 * and a group whose trie is one trunk must be laid out bit for bit as PACK_PACKED lays it out.
 * Model: tree ≡ standard on the fp32 reference, logprobs and every parameter gradient within
 * 1e-5 relative L2 (the layouts sum the same terms in other orders: fp32 rounding only), and
 * the logprobs bit for bit (each row's keys are summed in position order on every layout). */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "moe_config.h"
#include "tiny_model.h"
#include "common/err.h"
#include "engine/model/model.h"
#include "engine/model/pack.h"

static unsigned long long rng = 777;
static int rnd(int lo, int hi) { /* inclusive */
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (int)((rng >> 33) % (unsigned long long)(hi - lo + 1));
}

/* ---------- random tree-shaped groups ---------- */

enum { MAXG = 6, MAXN = 12, MAXL = 64, MAXP = 12, TURNS = 4 };
typedef struct {
    int P, N;
    int prompt[MAXP], resp[MAXN][MAXL], R[MAXN];
    const int *rp[MAXN];
} tgroup;

/* kind 0: turns shared by shrinking subsets; 1: no sharing; 2: all equal; 3: N = 1; vocab: ids
 * in [0, vocab) (small: accidental sharing too). */
static void make_group(tgroup *t, int kind, int vocab, pack_group *pg) {
    memset(t, 0, sizeof *t);
    t->P = rnd(1, MAXP);
    t->N = kind == 3 ? 1 : rnd(2, MAXN);
    for (int i = 0; i < t->P; i++) t->prompt[i] = rnd(0, vocab - 1);
    int q = t->N, turn[TURNS][MAXN][8], tl[TURNS][MAXN];
    for (int k = 0; k < TURNS; k++) {
        for (int key = 0; key < MAXN; key++) {
            tl[k][key] = rnd(1, 6);
            for (int j = 0; j < tl[k][key]; j++) turn[k][key][j] = rnd(0, vocab - 1);
        }
        int qk = kind == 1 ? 1 : kind == 2 ? t->N : q;
        for (int i = 0; i < t->N; i++) {
            int key = i / qk;
            for (int j = 0; j < tl[k][key] && t->R[i] < MAXL; j++) t->resp[i][t->R[i]++] = turn[k][key][j];
        }
        q = q > 1 ? rnd(1, q) : 1; /* the next turn is shared by fewer */
    }
    for (int i = 0; kind == 0 && i < t->N; i++)
        if (rnd(0, 3) == 0) t->R[i] = rnd(1, t->R[i]); /* cut short: maybe a prefix of another */
    if (kind == 1)
        for (int i = 1; i < t->N; i++) t->resp[i][0] = (t->resp[0][0] + i) % vocab; /* diverge at once */
    for (int i = 0; i < t->N; i++) t->rp[i] = t->resp[i];
    *pg = (pack_group){.prompt = t->prompt, .P = t->P, .N = t->N, .resp = t->rp, .R = t->R};
}

/* P + the distinct prefixes r[0:k], 1 <= k <= R - 1, + one last token per response (R >= 1). */
static long long trie_tokens(const tgroup *t) {
    long long n = t->P;
    for (int i = 0; i < t->N; i++) {
        n += t->R[i] >= 1;
        for (int k = 1; k <= t->R[i] - 1; k++) {
            int seen = 0;
            for (int i2 = 0; i2 < i && !seen; i2++)
                seen = t->R[i2] - 1 >= k && memcmp(t->resp[i2], t->resp[i], (size_t)k * sizeof(int)) == 0;
            n += !seen;
        }
    }
    return n;
}

/* ---------- contexts ---------- */

static void sort_ll(long long *a, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && a[j - 1] > a[j]; j--) {
            long long x = a[j];
            a[j] = a[j - 1];
            a[j - 1] = x;
        }
}

/* The keys token t attends to, every range, as sorted id * 4096 + pos; -1 when two ranges overlap
 * (a key counted twice) or a range leaves [0, t]. */
static int context(const pack_batch *b, int t, long long *out) {
    int lo[2 + ATTN_XR_MAX], hi[2 + ATTN_XR_MAX], nr = 2 + b->nx, n = 0;
    lo[0] = b->kv_a0[t], hi[0] = b->kv_a1[t], lo[1] = b->kv_b0[t], hi[1] = b->kv_b1[t];
    for (int x = 0; x < b->nx; x++) lo[2 + x] = b->kv_x0[(size_t)x * b->T + t], hi[2 + x] = b->kv_x1[(size_t)x * b->T + t];
    for (int r = 0; r < nr; r++) {
        if (lo[r] > hi[r] || (lo[r] < hi[r] && (lo[r] < 0 || hi[r] > t + 1))) return -1;
        for (int r2 = 0; r2 < r; r2++)
            if (lo[r] < hi[r] && lo[r2] < hi[r2] && lo[r] < hi[r2] && lo[r2] < hi[r]) return -1;
        for (int k = lo[r]; k < hi[r]; k++) out[n++] = (long long)b->tokens[k] * 4096 + b->pos[k];
    }
    sort_ll(out, n);
    return n;
}

/* prompt + r_i[0..j] (j = -1: the prompt alone) */
static int expected(const pack_group *g, int i, int j, long long *out) {
    int n = 0;
    for (int k = 0; k < g->P; k++) out[n++] = (long long)g->prompt[k] * 4096 + k;
    for (int k = 0; k <= j; k++) out[n++] = (long long)g->resp[i][k] * 4096 + g->P + k;
    sort_ll(out, n);
    return n;
}

static int same(const long long *a, int na, const long long *b, int nb) {
    return na == nb && (na == 0 || memcmp(a, b, (size_t)na * sizeof *a) == 0);
}

/* Every token and prediction of a tree batch of groups g[0, ng): contexts as the standard
 * layout's. Returns the number of problems (each reported). */
static int check_contexts(const pack_batch *b, const pack_group *g, int ng) {
    static long long c1[MAXP + MAXL + 8], c2[MAXP + MAXL + 8];
    int bad = 0;
    /* each token is some response's token j (or a prompt token): find one whose context it has */
    for (int gu = 0; gu < b->G; gu++) {
        const pack_group *src = &g[b->seg_group[b->grp_seg0[gu]]];
        for (int t = b->cu_seqlens[gu]; t < b->cu_seqlens[gu + 1]; t++) {
            int n1 = context(b, t, c1), ok = 0, j = b->pos[t] - src->P;
            if (n1 < 0) {
                printf("  token %d: overlapping or out-of-order ranges\n", t);
                bad++;
                continue;
            }
            if (j < 0) {
                int n2 = 0;
                for (int k = 0; k <= b->pos[t]; k++) c2[n2++] = (long long)src->prompt[k] * 4096 + k;
                sort_ll(c2, n2);
                ok = b->tokens[t] == src->prompt[b->pos[t]] && same(c1, n1, c2, n2);
            }
            for (int i = 0; j >= 0 && !ok && i < src->N; i++)
                ok = j < src->R[i] && src->resp[i][j] == b->tokens[t] && same(c1, n1, c2, expected(src, i, j, c2));
            if (!ok) {
                printf("  token %d (unit %d, pos %d): no response has its context\n", t, gu, b->pos[t]);
                bad++;
            }
        }
    }
    for (int s = 0; s < b->S; s++) {
        const pack_group *src = &g[b->seg_group[s]];
        int i = b->seg_resp[s];
        for (int j = 0; j < src->R[i]; j++) {
            int m = b->seg_out0[s] + j, n1 = context(b, b->out_pos[m], c1), n2 = expected(src, i, j - 1, c2);
            if (b->out_tok[m] != src->resp[i][j] || !same(c1, n1, c2, n2)) {
                printf("  segment %d prediction %d reads row %d: wrong context or target\n", s, j, b->out_pos[m]);
                bad++;
            }
        }
        if (src->R[i] >= 1 && b->seg_len[s] < 1) {
            printf("  segment %d: a response keeps its last token\n", s);
            bad++;
        }
    }
    (void)ng;
    return bad;
}

/* ---------- the layout ---------- */

TEST(tree_layout_random) {
    static tgroup tg[MAXG];
    pack_group g[MAXG];
    int deeper = 0, trials = 300;
    for (int trial = 0; trial < trials; trial++) {
        int ng = rnd(1, MAXG), vocab = trial % 3 == 0 ? 3 : 50;
        long long want = 0;
        for (int k = 0; k < ng; k++) {
            make_group(&tg[k], rnd(0, 9) < 7 ? 0 : rnd(1, 3), vocab, &g[k]);
            want += trie_tokens(&tg[k]);
        }
        pack_batch tr, pk, st;
        CHECK_EQ_INT(pack_build(&tr, g, 0, ng, PACK_TREE), 0);
        CHECK_EQ_INT(pack_build(&pk, g, 0, ng, PACK_PACKED), 0);
        CHECK_EQ_INT(pack_build(&st, g, 0, ng, PACK_STANDARD), 0);
        CHECK(tr.nx <= ATTN_XR_MAX);
        deeper += tr.nx > 0;
        CHECK_MSG(tr.T <= pk.T && pk.T <= st.T, "trial %d: tree %d packed %d standard %d tokens", trial, tr.T, pk.T, st.T);
        /* the budget of runs is never reached by four turns: every shared prefix once */
        CHECK_MSG(tr.T == want, "trial %d: %d tokens, the trie has %lld", trial, tr.T, want);
        long long sum = 0;
        for (int k = 0; k < ng; k++) sum += pack_group_tokens(&g[k], PACK_TREE);
        CHECK_EQ_INT((int)sum, tr.T);
        CHECK_EQ_INT(tr.M, st.M);
        CHECK(memcmp(tr.out_tok, st.out_tok, (size_t)tr.M * sizeof(int)) == 0); /* response order */
        CHECK_MSG(check_contexts(&tr, g, ng) == 0, "trial %d: tree contexts", trial);
        CHECK_MSG(check_contexts(&pk, g, ng) == 0, "trial %d: packed contexts", trial);
        long long stands = 0; /* the standard tokens the packed ones stand for (MoE balance counts) */
        for (int t = 0; t < tr.T; t++) stands += tr.tok_count[t];
        CHECK_EQ_INT((int)stands, st.T);
        pack_batch_free(&tr);
        pack_batch_free(&pk);
        pack_batch_free(&st);
    }
    printf("  %d of %d batches needed extra ranges\n", deeper, trials);
    CHECK(deeper > trials / 4);
}

/* A group whose trie is one trunk: PACK_TREE lays it out as PACK_PACKED, every array equal. */
TEST(tree_one_trunk_bits) {
    static tgroup tg[MAXG];
    pack_group g[MAXG];
    int trunks = 0;
    for (int trial = 0; trial < 100; trial++) {
        int ng = rnd(1, MAXG);
        for (int k = 0; k < ng; k++) {
            tgroup *t = &tg[k];
            make_group(t, 1, 50, &g[k]); /* responses that diverge at once ... */
            int c = rnd(0, 5), trunk[5];
            for (int j = 0; j < c; j++) trunk[j] = rnd(0, 49);
            for (int i = 0; i < t->N; i++) { /* ... after a common trunk */
                memmove(t->resp[i] + c, t->resp[i], (size_t)(MAXL - c) * sizeof(int));
                memcpy(t->resp[i], trunk, (size_t)c * sizeof(int));
                t->R[i] = t->R[i] + c > MAXL ? MAXL : t->R[i] + c;
                if (rnd(0, 4) == 0) t->R[i] = rnd(c + 1, t->R[i]); /* still past the trunk */
            }
            trunks += c > 0;
        }
        pack_batch tr, pk;
        CHECK_EQ_INT(pack_build(&tr, g, 0, ng, PACK_TREE), 0);
        CHECK_EQ_INT(pack_build(&pk, g, 0, ng, PACK_PACKED), 0);
        CHECK_EQ_INT(tr.nx, 0);
        CHECK(tr.T == pk.T && tr.M == pk.M && tr.G == pk.G && tr.S == pk.S);
#define SAME_(f, n) CHECK_MSG(memcmp(tr.f, pk.f, (size_t)(n) * sizeof(int)) == 0, "trial %d: %s differs", trial, #f)
        SAME_(tokens, tr.T);
        SAME_(pos, tr.T);
        SAME_(kv_a0, tr.T);
        SAME_(kv_a1, tr.T);
        SAME_(kv_b0, tr.T);
        SAME_(kv_b1, tr.T);
        SAME_(tok_count, tr.T);
        SAME_(cu_seqlens, tr.G + 1);
        SAME_(grp_plen, tr.G);
        SAME_(seg_start, tr.S);
        SAME_(seg_len, tr.S);
        SAME_(out_pos, tr.M);
        SAME_(out_tok, tr.M);
#undef SAME_
        pack_batch_free(&tr);
        pack_batch_free(&pk);
    }
    CHECK(trunks > 50);
}

/* Degenerate groups by hand: all equal, a prefix of another, R = 1, N = 1. */
TEST(tree_degenerate) {
    static const int p[] = {1, 2, 3}, a[] = {7, 8, 9, 10}, b[] = {7, 8}, c[] = {7}, d[] = {7, 8, 9, 11};
    const int *eq[] = {a, a, a}, Req[] = {4, 4, 4};
    const int *pre[] = {c, b, a, d}, Rpre[] = {1, 2, 4, 4};
    pack_group g[3] = {
        {.prompt = p, .P = 3, .N = 3, .resp = eq, .R = Req},
        {.prompt = p, .P = 3, .N = 4, .resp = pre, .R = Rpre},
        {.prompt = p, .P = 3, .N = 1, .resp = pre, .R = Rpre},
    };
    /* all equal: the trunk is 3 tokens, then each response's last token alone */
    CHECK_EQ_INT(pack_group_tokens(&g[0], PACK_TREE), 3 + 3 + 3);
    /* {7}, {7 8}, {7 8 9 10}, {7 8 9 11}: root [P]; leaf {7} of c; node {7} of b a d; leaf {8} of b;
     * node {8 9} of a d; leaves {10}, {11} */
    CHECK_EQ_INT(pack_group_tokens(&g[1], PACK_TREE), 3 + 1 + 1 + 1 + 2 + 1 + 1);
    CHECK_EQ_INT(pack_group_tokens(&g[2], PACK_TREE), 3 + 1);
    pack_batch bt;
    CHECK_EQ_INT(pack_build(&bt, g, 0, 3, PACK_TREE), 0);
    CHECK_EQ_INT(check_contexts(&bt, g, 3), 0);
    CHECK_EQ_INT(bt.nx, 2); /* a's leaf: [P] | node {7} after c's leaf | node {8 9} after b's | itself */
    pack_batch_free(&bt);
}

/* Response i is 0 1 .. i-1, then base + i: a comb whose shared node at each level comes after a
 * leaf (a non-first child), so each level adds a run. */
static void make_comb(tgroup *t, int base, pack_group *pg) {
    memset(t, 0, sizeof *t);
    t->P = 1;
    t->N = 10;
    t->prompt[0] = 5;
    for (int i = 0; i < t->N; i++) {
        for (int k = 0; k <= i; k++) t->resp[i][k] = k == i ? base + i : k;
        t->R[i] = i + 1;
        t->rp[i] = t->resp[i];
    }
    *pg = (pack_group){.prompt = t->prompt, .P = t->P, .N = t->N, .resp = t->rp, .R = t->R};
}

/* A tree whose paths need more runs than the kernels take: deeper nodes become leaves. */
TEST(tree_run_budget) {
    static tgroup t;
    pack_group g;
    make_comb(&t, 100, &g);
    int N = g.N;
    pack_batch b;
    CHECK_EQ_INT(pack_build(&b, &g, 0, 1, PACK_TREE), 0);
    CHECK_EQ_INT(b.nx, ATTN_XR_MAX);
    CHECK_EQ_INT(check_contexts(&b, &g, 1), 0);
    printf("  comb of %d: %d tokens (trunk only %lld, standard %lld), %d extra ranges\n", N, b.T,
           pack_group_tokens(&g, PACK_PACKED), pack_group_tokens(&g, PACK_STANDARD), b.nx);
    CHECK(b.T < pack_group_tokens(&g, PACK_PACKED));
    pack_batch_free(&b);
}

/* ---------- the model on a tree ---------- */

static void model_case(model_config c, unsigned long long seed) {
    eng_backend *be;
    backend_cpu_create(&be, 0);
    model m;
    CHECK(model_init(&m, &c, be) == 0);
    CHECK(model_pack_layout(&m) == PACK_TREE);
    float *w = malloc((size_t)m.n_elems * 4);
    check_fill(w, (size_t)m.n_elems, seed, 0.2f);
    model_views wv;
    model_views_make(&m, w, 4, &wv);
    rng = seed;
    static tgroup tg[MAXG + 1];
    pack_group g[MAXG + 1];
    int ng = MAXG + 1, M = 0;
    for (int k = 0; k < ng; k++) {
        /* trees (one over 3 ids), no sharing, all equal, N = 1, a comb that needs every range */
        if (k < MAXG) make_group(&tg[k], k < 3 ? 0 : k - 2, k == 0 ? 3 : c.V, &g[k]);
        else make_comb(&tg[k], c.V - 10, &g[k]);
        for (int i = 0; i < g[k].N; i++) M += g[k].R[i];
    }
    float *wl = malloc((size_t)M * 4);
    check_fill(wl, (size_t)M, seed + 1, 1.0f);
    run_out tr = {0}, pk = {0}, st = {0};
    CHECK(run_layout(&m, &wv, g, ng, PACK_TREE, wl, NULL, &tr) == 0);
    CHECK(run_layout(&m, &wv, g, ng, PACK_PACKED, wl, NULL, &pk) == 0);
    CHECK(run_layout(&m, &wv, g, ng, PACK_STANDARD, wl, NULL, &st) == 0);
    double el = rel_l2(tr.logp, st.logp, (size_t)M), eg = rel_l2(tr.grad, st.grad, (size_t)m.n_elems);
    double elp = rel_l2(tr.logp, pk.logp, (size_t)M), egp = rel_l2(tr.grad, pk.grad, (size_t)m.n_elems);
    printf(
        "  %s: tree %lld, trunk only %lld, standard %lld tokens; tree vs standard: logprobs %.2e gradients %.2e; vs trunk only: "
        "%.2e %.2e\n",
        c.arch_name, tr.T, pk.T, st.T, el, eg, elp, egp);
    CHECK(tr.T < pk.T && pk.T < st.T);
    CHECK_MSG(el <= 1e-5 && eg <= 1e-5, "tree vs standard: logprobs %.3g gradients %.3g > 1e-5", el, eg);
    /* a row's keys in position order on every layout (attention_cpu.c): the forward's bits too,
     * which a rollout's logprobs equal to /v1/logprobs' rely on */
    CHECK_MSG(memcmp(tr.logp, st.logp, (size_t)M * 4) == 0, "tree vs standard: logprobs not bit-equal");
    CHECK_MSG(elp <= 1e-5 && egp <= 1e-5, "tree vs trunk only: logprobs %.3g gradients %.3g > 1e-5", elp, egp);
    for (int i = 0; i < m.n_params; i++) {
        double e = rel_l2(tr.grad + m.params[i].off, st.grad + m.params[i].off, (size_t)m.params[i].numel);
        CHECK_MSG(e <= 1e-5, "%s: %s rel L2 %.3g", c.arch_name, m.params[i].name, e);
    }
    run_free(&tr);
    run_free(&pk);
    run_free(&st);
    free(wl);
    free(w);
    model_views_free(&wv);
    model_free(&m);
    be->destroy(be);
}

TEST(tree_equals_standard_qwen3) { model_case(tiny_model_config(ARCH_QWEN3, 2), 1901); }
TEST(tree_equals_standard_qwen2) { model_case(tiny_model_config(ARCH_QWEN2, 2), 1902); }
/* MoE: every packed token routed once, a shared one standing for each response it is in */
TEST(tree_equals_standard_qwen3_moe) { model_case(moe_test_config(4, 1), 1903); }

int main(void) {
    RUN(tree_layout_random);
    RUN(tree_one_trunk_bits);
    RUN(tree_degenerate);
    RUN(tree_run_budget);
    RUN(tree_equals_standard_qwen3);
    RUN(tree_equals_standard_qwen2);
    RUN(tree_equals_standard_qwen3_moe);
    return CHECK_DONE();
}
