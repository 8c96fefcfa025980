/* rollout_expect.h — what every model's rollouts must do, checked the same way for the dense
 * default model (tests/unit/test_engine.c) and the hybrid one (tests/unit/test_hybrid_decode.c):
 * a seed decides the tokens, and greedy decoding picks the teacher-forced argmax. */
#ifndef GRPOD_ROLLOUT_EXPECT_H
#define GRPOD_ROLLOUT_EXPECT_H
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"

static inline int rollout_same_tokens(const eng_response *x, const eng_response *y) {
    return x->n_tokens == y->n_tokens && !memcmp(x->tokens, y->tokens, (size_t)x->n_tokens * 4);
}

/* Rolls g out three times into a (kept for the caller, who frees it), then twice more: with s's
 * seed and with seed + 1. *same: the first repeat gave a's tokens; *differs: the other seed did
 * not. 0 or the first eng_rollout error. */
static inline int rollout_expect_seeded(eng *e, const eng_rollout_group *g, int n_groups, eng_sampling s, eng_group_result *a,
                                        int *same, int *differs) {
    eng_group_result b[8], c[8];
    int rc = eng_rollout(e, g, n_groups, &s, a, NULL, NULL);
    if (!rc) rc = eng_rollout(e, g, n_groups, &s, b, NULL, NULL);
    s.seed++;
    if (!rc) rc = eng_rollout(e, g, n_groups, &s, c, NULL, NULL);
    if (rc) return rc;
    *same = 1;
    *differs = 0;
    for (int k = 0; k < n_groups; k++) {
        for (int r = 0; r < g[k].n; r++) {
            *same &= rollout_same_tokens(&a[k].resp[r], &b[k].resp[r]);
            *differs |= !rollout_same_tokens(&a[k].resp[r], &c[k].resp[r]);
        }
        eng_group_result_free(&b[k]);
        eng_group_result_free(&c[k]);
    }
    return 0;
}

/* A greedy rollout of `steps` tokens (n = 2: both the same) and, at every step, one packed
 * forward of every candidate token: the token drawn is the argmax (with exact_lp, its logprob
 * is the forward's bit for bit). 1 when all hold. */
static inline int rollout_greedy_is_argmax(eng *e, const int *prompt, int P, int steps, int exact_lp) {
    eng_rollout_group g = {prompt, P, 2};
    eng_sampling s;
    eng_sampling_default(&s);
    s.temperature = 0;
    s.max_tokens = steps;
    s.ignore_eos = 1;
    eng_group_result r;
    if (eng_rollout(e, &g, 1, &s, &r, NULL, NULL)) return 0;
    eng_info info;
    eng_get_info(e, &info);
    eng_response *x = &r.resp[0];
    int V = info.vocab, ok = x->n_tokens == steps && rollout_same_tokens(x, &r.resp[1]);
    int *cand = malloc((size_t)V * steps * sizeof(int)), *R = malloc((size_t)V * sizeof(int));
    const int **resp = malloc((size_t)V * sizeof(int *));
    for (int t = 0; t < x->n_tokens && ok; t++) {
        for (int v = 0; v < V; v++) {
            memcpy(cand + (size_t)v * steps, x->tokens, (size_t)t * 4);
            cand[(size_t)v * steps + t] = v;
            resp[v] = cand + (size_t)v * steps;
            R[v] = t + 1;
        }
        eng_update_group ug = {.prompt = prompt, .P = P, .n = V, .resp = resp, .R = R};
        float **lp;
        if (eng_logprobs(e, &ug, 1, 0, 1.0f, 1 << 20, &lp)) {
            ok = 0;
            break;
        }
        int arg = 0;
        for (int v = 1; v < V; v++)
            if (lp[v][t] > lp[arg][t]) arg = v;
        ok = arg == x->tokens[t] && (!exact_lp || lp[arg][t] == x->logprobs[t]);
        if (!ok) printf("  step %d: greedy %d (%.9g), argmax %d (%.9g)\n", t, x->tokens[t], x->logprobs[t], arg, lp[arg][t]);
        eng_logprobs_free(lp, &ug, 1);
    }
    free(cand);
    free(resp);
    free(R);
    eng_group_result_free(&r);
    return ok;
}
#endif
