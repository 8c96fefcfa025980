/* test_pack.c — the P + NR packing (engine/model/pack.c): token counts, every array of a hand-built
 * case in both layouts, the micro-batch planner and its error, and a randomized check that every
 * packed token sees exactly the (token id, position) context its standard-layout twin sees. */
#include "tests/unit/check.h"

#include "common/err.h"
#include "engine/model/pack.h"

/* ---------- a hand-built case ----------
 * g0: prompt {10,11,12}, responses {20,21} and {30};  g1: prompt {40,41}, response {50,51,52}. */
static const int g0p[] = {10, 11, 12}, g0r0[] = {20, 21}, g0r1[] = {30};
static const int g1p[] = {40, 41}, g1r0[] = {50, 51, 52};
static const int *const g0r[] = {g0r0, g0r1}, *const g1r[] = {g1r0};
static const int g0R[] = {2, 1}, g1R[] = {3};
static const pack_group hand[2] = {
    {.prompt = g0p, .P = 3, .N = 2, .resp = g0r, .R = g0R},
    {.prompt = g1p, .P = 2, .N = 1, .resp = g1r, .R = g1R},
};

#define CHECK_ARR(arr, n, ...) \
    do { \
        const int e_[] = {__VA_ARGS__}; \
        CHECK_EQ_INT((int)(sizeof e_ / sizeof e_[0]), (n)); \
        for (int i_ = 0; i_ < (n); i_++) \
            if ((arr)[i_] != e_[i_]) FAILF("%s[%d] == %d, expected %d", #arr, i_, (arr)[i_], e_[i_]); \
    } while (0)

TEST(test_group_tokens) {
    CHECK_EQ_INT(pack_group_tokens(&hand[0], PACK_PACKED), 3 + 3);
    CHECK_EQ_INT(pack_group_tokens(&hand[0], PACK_STANDARD), 2 * 3 + 3);
    CHECK_EQ_INT(pack_group_tokens(&hand[1], PACK_PACKED), 5);
    CHECK_EQ_INT(pack_group_tokens(&hand[1], PACK_STANDARD), 5);
}

TEST(test_hand_packed) {
    pack_batch b;
    CHECK_EQ_INT(pack_build(&b, hand, 0, 2, PACK_PACKED), 0);
    CHECK_EQ_INT(b.T, 11);
    CHECK_EQ_INT(b.G, 2);
    CHECK_EQ_INT(b.S, 3);
    CHECK_EQ_INT(b.M, 6);
    CHECK_ARR(b.tokens, b.T, 10, 11, 12, 20, 21, 30, 40, 41, 50, 51, 52);
    CHECK_ARR(b.pos, b.T, 0, 1, 2, 3, 4, 3, 0, 1, 2, 3, 4);
    CHECK_ARR(b.kv_a0, b.T, 0, 0, 0, 0, 0, 0, 6, 6, 6, 6, 6);
    CHECK_ARR(b.kv_a1, b.T, 1, 2, 3, 3, 3, 3, 7, 8, 8, 8, 8);
    for (int t = 0; t < b.T; t++) { /* prompt tokens: empty second range */
        int prompt = t < 3 || t == 6 || t == 7;
        if (prompt) CHECK_MSG(b.kv_b0[t] == b.kv_b1[t], "token %d: b range not empty", t);
    }
    const int rt[] = {3, 4, 5, 8, 9, 10}, rb0[] = {3, 3, 5, 8, 8, 8}, rb1[] = {4, 5, 6, 9, 10, 11};
    for (int i = 0; i < 6; i++) {
        CHECK_EQ_INT(b.kv_b0[rt[i]], rb0[i]);
        CHECK_EQ_INT(b.kv_b1[rt[i]], rb1[i]);
    }
    CHECK_ARR(b.cu_seqlens, b.G + 1, 0, 6, 11);
    CHECK_ARR(b.grp_plen, b.G, 3, 2);
    CHECK_ARR(b.grp_seg0, b.G, 0, 2);
    CHECK_ARR(b.grp_nseg, b.G, 2, 1);
    CHECK_ARR(b.seg_start, b.S, 3, 5, 8);
    CHECK_ARR(b.seg_len, b.S, 2, 1, 3);
    CHECK_ARR(b.seg_group, b.S, 0, 0, 1);
    CHECK_ARR(b.seg_resp, b.S, 0, 1, 0);
    CHECK_ARR(b.seg_out0, b.S, 0, 2, 3);
    CHECK_ARR(b.out_pos, b.M, 2, 3, 2, 7, 8, 9);
    CHECK_ARR(b.out_tok, b.M, 20, 21, 30, 50, 51, 52);
    pack_batch_free(&b);
    CHECK(b.tokens == NULL);
}

TEST(test_hand_standard) {
    pack_batch b;
    CHECK_EQ_INT(pack_build(&b, hand, 0, 2, PACK_STANDARD), 0);
    CHECK_EQ_INT(b.T, 14);
    CHECK_EQ_INT(b.G, 3);
    CHECK_EQ_INT(b.S, 3);
    CHECK_EQ_INT(b.M, 6);
    CHECK_ARR(b.tokens, b.T, 10, 11, 12, 20, 21, 10, 11, 12, 30, 40, 41, 50, 51, 52);
    CHECK_ARR(b.pos, b.T, 0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2, 3, 4);
    CHECK_ARR(b.kv_a0, b.T, 0, 0, 0, 0, 0, 5, 5, 5, 5, 9, 9, 9, 9, 9);
    CHECK_ARR(b.kv_a1, b.T, 1, 2, 3, 3, 3, 6, 7, 8, 8, 10, 11, 11, 11, 11);
    const int rt[] = {3, 4, 8, 11, 12, 13}, rb0[] = {3, 3, 8, 11, 11, 11}, rb1[] = {4, 5, 9, 12, 13, 14};
    for (int i = 0; i < 6; i++) {
        CHECK_EQ_INT(b.kv_b0[rt[i]], rb0[i]);
        CHECK_EQ_INT(b.kv_b1[rt[i]], rb1[i]);
    }
    CHECK_ARR(b.cu_seqlens, b.G + 1, 0, 5, 9, 14);
    CHECK_ARR(b.grp_plen, b.G, 3, 3, 2);
    CHECK_ARR(b.grp_seg0, b.G, 0, 1, 2);
    CHECK_ARR(b.grp_nseg, b.G, 1, 1, 1);
    CHECK_ARR(b.seg_start, b.S, 3, 8, 11);
    CHECK_ARR(b.seg_len, b.S, 2, 1, 3);
    CHECK_ARR(b.seg_group, b.S, 0, 0, 1);
    CHECK_ARR(b.seg_resp, b.S, 0, 1, 0);
    CHECK_ARR(b.seg_out0, b.S, 0, 2, 3);
    CHECK_ARR(b.out_pos, b.M, 2, 3, 7, 10, 11, 12);
    CHECK_ARR(b.out_tok, b.M, 20, 21, 30, 50, 51, 52);
    pack_batch_free(&b);
}

/* A batch that starts at group 1 still names the caller's group index. */
TEST(test_first_offset) {
    pack_batch b;
    CHECK_EQ_INT(pack_build(&b, hand, 1, 1, PACK_PACKED), 0);
    CHECK_EQ_INT(b.T, 5);
    CHECK_ARR(b.seg_group, b.S, 1);
    CHECK_ARR(b.out_pos, b.M, 1, 2, 3);
    pack_batch_free(&b);
    CHECK_EQ_INT(pack_build(&b, hand, 0, 0, PACK_PACKED), 0); /* empty batch */
    CHECK_EQ_INT(b.T, 0);
    CHECK_EQ_INT(b.G, 0);
    CHECK_EQ_INT(b.cu_seqlens[0], 0);
    pack_batch_free(&b);
}

/* ---------- the planner ---------- */

TEST(test_plan) {
    /* 6 groups, packed sizes 6 5 6 5 6 5 (copies of the hand groups); budget 12. */
    pack_group g[6];
    for (int i = 0; i < 6; i++) g[i] = hand[i % 2];
    pack_plan p;
    CHECK_EQ_INT(pack_plan_make(&p, g, 6, 12, PACK_PACKED), 0);
    CHECK_EQ_INT(p.n_mb, 3);
    CHECK_ARR(p.mb_first, p.n_mb, 0, 2, 4);
    CHECK_ARR(p.mb_count, p.n_mb, 2, 2, 2);
    pack_plan_free(&p);
    /* standard sizes 9 5 9 5 9 5, budget 14: 9+5 | 9+5 | 9+5 */
    CHECK_EQ_INT(pack_plan_make(&p, g, 6, 14, PACK_STANDARD), 0);
    CHECK_EQ_INT(p.n_mb, 3);
    CHECK_ARR(p.mb_count, p.n_mb, 2, 2, 2);
    pack_plan_free(&p);
    /* budget 11 standard: 9 | 5 | 9 | 5 ... no merge beats the budget except none */
    CHECK_EQ_INT(pack_plan_make(&p, g, 6, 11, PACK_STANDARD), 0);
    CHECK_EQ_INT(p.n_mb, 6);
    pack_plan_free(&p);
    /* everything in one */
    CHECK_EQ_INT(pack_plan_make(&p, g, 6, 1000, PACK_PACKED), 0);
    CHECK_EQ_INT(p.n_mb, 1);
    CHECK_EQ_INT(p.mb_count[0], 6);
    pack_plan_free(&p);
    CHECK_EQ_INT(pack_plan_make(&p, g, 0, 1000, PACK_PACKED), 0);
    CHECK_EQ_INT(p.n_mb, 0);
    pack_plan_free(&p);
}

TEST(test_plan_too_large) {
    static int prompt[1000], resp[8][1000];
    for (int i = 0; i < 1000; i++) {
        prompt[i] = i;
        for (int k = 0; k < 8; k++) resp[k][i] = i + 1 + k; /* no two begin alike: no trunk */
    }
    const int *rs[8];
    int R[8];
    for (int i = 0; i < 8; i++) {
        rs[i] = resp[i];
        R[i] = 1000;
    }
    pack_group g[4];
    for (int i = 0; i < 3; i++) g[i] = hand[0];
    g[3] = (pack_group){.prompt = prompt, .P = 1000, .N = 8, .resp = rs, .R = R};
    pack_plan p;
    /* packed: the group over the budget is a micro-batch of its own, run split (engine/model/split.h) */
    CHECK_EQ_INT(pack_plan_make(&p, g, 4, 8192, PACK_PACKED), 0);
    CHECK_EQ_INT(p.n_mb, 2);
    CHECK_ARR(p.mb_count, p.n_mb, 3, 1);
    CHECK_ARR(p.mb_split, p.n_mb, 0, 1);
    pack_plan_free(&p);
    /* a response is never split */
    CHECK_EQ_INT(pack_plan_make(&p, g, 4, 999, PACK_PACKED), GE_TOO_LARGE);
    CHECK_STR(err_msg(),
              "group 3 response 0 has 1000 tokens > max_tokens_per_micro_batch 999 "
              "(a response is never split across micro-batches)");
    CHECK(p.mb_first == NULL && p.n_mb == 0);
    pack_plan_free(&p);
    /* the standard layout has no split form */
    CHECK_EQ_INT(pack_plan_make(&p, g, 4, 8192, PACK_STANDARD), GE_TOO_LARGE);
    CHECK_STR(err_msg(),
              "group 3 needs 16000 tokens (P=1000, N=8, R total 8000) > "
              "max_tokens_per_micro_batch 8192");
    pack_plan_free(&p);
    CHECK_EQ_INT(pack_plan_make(&p, g, 4, 9000, PACK_PACKED), 0);
    CHECK_EQ_INT(p.n_mb, 2);
    CHECK_ARR(p.mb_split, p.n_mb, 0, 0);
    pack_plan_free(&p);
    /* a split group between small ones does not take them in */
    pack_group h[3] = {hand[0], g[3], hand[1]};
    CHECK_EQ_INT(pack_plan_make(&p, h, 3, 8192, PACK_PACKED), 0);
    CHECK_EQ_INT(p.n_mb, 3);
    CHECK_ARR(p.mb_split, p.n_mb, 0, 1, 0);
    pack_plan_free(&p);
}

/* ---------- randomized consistency of the two layouts ---------- */

static unsigned long long rng_s = 12345;
static int rnd(int lo, int hi) { /* inclusive */
    rng_s = rng_s * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (int)((rng_s >> 33) % (unsigned long long)(hi - lo + 1));
}

/* The context of token t: sorted (id, pos) pairs of the keys it attends to, encoded id*4096+pos. */
static int context(const pack_batch *b, int t, long long *out) {
    int n = 0;
    for (int k = b->kv_a0[t]; k < b->kv_a1[t]; k++) out[n++] = (long long)b->tokens[k] * 4096 + b->pos[k];
    for (int k = b->kv_b0[t]; k < b->kv_b1[t]; k++) out[n++] = (long long)b->tokens[k] * 4096 + b->pos[k];
    for (int i = 1; i < n; i++) /* insertion sort: contexts are small */
        for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
            long long x = out[j];
            out[j] = out[j - 1];
            out[j - 1] = x;
        }
    return n;
}

/* The context the model must see, from the groups themselves: prompt + own response prefix. */
static int expected_context(const pack_group *g, int ri, int j /* -1: prompt token i */, int i, long long *out) {
    int n = 0;
    if (j < 0) {
        for (int k = 0; k <= i; k++) out[n++] = (long long)g->prompt[k] * 4096 + k;
    } else {
        for (int k = 0; k < g->P; k++) out[n++] = (long long)g->prompt[k] * 4096 + k;
        for (int k = 0; k <= j; k++) out[n++] = (long long)g->resp[ri][k] * 4096 + g->P + k;
    }
    for (int a = 1; a < n; a++)
        for (int c = a; c > 0 && out[c - 1] > out[c]; c--) {
            long long x = out[c];
            out[c] = out[c - 1];
            out[c - 1] = x;
        }
    return n;
}

static int same(const long long *a, int na, const long long *b, int nb) {
    if (na != nb) return 0;
    for (int i = 0; i < na; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

#define NG 5
#define MAXN 16
#define MAXL 40
TEST(test_random_layouts_agree) {
    static int prompts[NG][MAXL], resps[NG][MAXN][MAXL], Rs[NG][MAXN];
    static const int *rptr[NG][MAXN];
    int trunk[NG], trunks = 0;
    static long long c1[2 * MAXL + 2], c2[2 * MAXL + 2];
    for (int trial = 0; trial < 40; trial++) {
        pack_group g[NG];
        int ng = rnd(1, NG);
        long long want_packed = 0, want_std = 0;
        for (int k = 0; k < ng; k++) {
            /* small vocab so repeated ids are common: a wrong range would be caught by positions */
            int P = rnd(1, 12), N = rnd(1, MAXN);
            for (int i = 0; i < P; i++) prompts[k][i] = rnd(0, 5);
            for (int i = 0; i < N; i++) {
                Rs[k][i] = rnd(1, 10);
                for (int j = 0; j < Rs[k][i]; j++) resps[k][i][j] = rnd(0, 5);
                rptr[k][i] = resps[k][i];
                want_packed += Rs[k][i];
                want_std += Rs[k][i];
            }
            /* the trunk: the leading ids all responses share, short of the shortest one's last */
            int c = 0, minR = MAXL;
            for (int i = 0; i < N; i++) minR = Rs[k][i] < minR ? Rs[k][i] : minR;
            while (N > 1 && c < minR - 1) {
                int all = 1;
                for (int i = 1; i < N; i++) all &= resps[k][i][c] == resps[k][0][c];
                if (!all) break;
                c++;
            }
            trunk[k] = c;
            trunks += c > 0;
            want_packed += P - (long long)(N - 1) * c;
            want_std += (long long)N * P;
            g[k] = (pack_group){.prompt = prompts[k], .P = P, .N = N, .resp = rptr[k], .R = Rs[k]};
        }
        pack_batch pk, st;
        CHECK_EQ_INT(pack_build(&pk, g, 0, ng, PACK_PACKED), 0);
        CHECK_EQ_INT(pack_build(&st, g, 0, ng, PACK_STANDARD), 0);
        CHECK_EQ_INT(pk.T, want_packed);
        CHECK_EQ_INT(st.T, want_std);
        CHECK_EQ_INT(pk.M, st.M);
        CHECK_EQ_INT(pk.S, st.S);

        /* every packed token: its context equals the expected one and its standard twin's */
        for (int gu = 0; gu < pk.G; gu++) {
            const pack_group *src = &g[pk.seg_group[pk.grp_seg0[gu]]];
            int p0 = pk.cu_seqlens[gu], c = trunk[pk.seg_group[pk.grp_seg0[gu]]];
            CHECK_EQ_INT(pk.grp_plen[gu], src->P + c);
            for (int i = 0; i < c; i++) { /* the trunk, after the prompt: response 0's first c ids */
                int n1 = context(&pk, p0 + src->P + i, c1), n2 = expected_context(src, 0, i, 0, c2);
                CHECK_MSG(same(c1, n1, c2, n2), "trial %d: trunk token %d of unit %d", trial, i, gu);
            }
            for (int i = 0; i < src->P; i++) {
                int n1 = context(&pk, p0 + i, c1), n2 = expected_context(src, 0, -1, i, c2);
                CHECK_MSG(same(c1, n1, c2, n2), "trial %d: packed prompt token %d of unit %d", trial, i, gu);
                for (int s = pk.grp_seg0[gu]; s < pk.grp_seg0[gu] + pk.grp_nseg[gu]; s++) {
                    /* the standard copy of the prompt that this response's unit carries */
                    int st_unit = -1;
                    for (int u = 0; u < st.G; u++)
                        if (st.seg_group[st.grp_seg0[u]] == pk.seg_group[s] && st.seg_resp[st.grp_seg0[u]] == pk.seg_resp[s])
                            st_unit = u;
                    CHECK(st_unit >= 0);
                    n2 = context(&st, st.cu_seqlens[st_unit] + i, c2);
                    CHECK_MSG(same(c1, n1, c2, n2), "trial %d: prompt token %d differs from standard copy", trial, i);
                }
            }
        }
        for (int s = 0; s < pk.S; s++) {
            const pack_group *src = &g[pk.seg_group[s]];
            int ri = pk.seg_resp[s], s2 = -1;
            for (int u = 0; u < st.S; u++)
                if (st.seg_group[u] == pk.seg_group[s] && st.seg_resp[u] == ri) s2 = u;
            CHECK(s2 >= 0);
            int c = trunk[pk.seg_group[s]];
            CHECK_EQ_INT(pk.seg_len[s], src->R[ri] - c);
            CHECK_EQ_INT(st.seg_len[s2], src->R[ri]);
            CHECK_EQ_INT(pk.seg_out0[s], st.seg_out0[s2]); /* same order of segments */
            for (int j = 0; j < src->R[ri]; j++) {
                int n1, n2;
                if (j >= c) { /* the segment holds the ids past the trunk */
                    int t1 = pk.seg_start[s] + j - c, t2 = st.seg_start[s2] + j;
                    CHECK_EQ_INT(pk.tokens[t1], src->resp[ri][j]);
                    CHECK_EQ_INT(pk.pos[t1], src->P + j);
                    n1 = context(&pk, t1, c1), n2 = context(&st, t2, c2);
                    CHECK_MSG(same(c1, n1, c2, n2), "trial %d: segment %d token %d differs", trial, s, j);
                    n2 = expected_context(src, ri, j, 0, c2);
                    CHECK_MSG(same(c1, n1, c2, n2), "trial %d: segment %d token %d wrong context", trial, s, j);
                }
                /* prediction j: target r_j, read at a token whose context is the prefix before r_j */
                int m1 = pk.seg_out0[s] + j, m2 = st.seg_out0[s2] + j;
                CHECK_EQ_INT(pk.out_tok[m1], src->resp[ri][j]);
                CHECK_EQ_INT(st.out_tok[m2], src->resp[ri][j]);
                n1 = context(&pk, pk.out_pos[m1], c1);
                n2 = j == 0 ? expected_context(src, 0, -1, src->P - 1, c2) : expected_context(src, ri, j - 1, 0, c2);
                CHECK_MSG(same(c1, n1, c2, n2), "trial %d: out %d reads the wrong context", trial, m1);
                n2 = context(&st, st.out_pos[m2], c2);
                CHECK_MSG(same(c1, n1, c2, n2), "trial %d: out %d differs from standard", trial, m1);
                CHECK_EQ_INT(pk.pos[pk.out_pos[m1]], st.pos[st.out_pos[m2]]);
            }
        }
        /* ranges stay inside their unit: no token ever reads another group or response */
        for (int gu = 0; gu < pk.G; gu++)
            for (int t = pk.cu_seqlens[gu]; t < pk.cu_seqlens[gu + 1]; t++) {
                CHECK(pk.kv_a0[t] >= pk.cu_seqlens[gu] && pk.kv_a1[t] <= t + 1 && pk.kv_a0[t] < pk.kv_a1[t]);
                CHECK(pk.kv_b0[t] <= pk.kv_b1[t] && pk.kv_b1[t] <= t + 1);
            }
        pack_batch_free(&pk);
        pack_batch_free(&st);
    }
    printf("  %d groups had a trunk\n", trunks);
    CHECK(trunks > 0); /* the trunk's layout was exercised */
}

int main(void) {
    RUN(test_group_tokens);
    RUN(test_hand_packed);
    RUN(test_hand_standard);
    RUN(test_first_offset);
    RUN(test_plan);
    RUN(test_plan_too_large);
    RUN(test_random_layouts_agree);
    return CHECK_DONE();
}
