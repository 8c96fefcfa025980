/* logprobs_flat.h — for the engine tests: the policy's logprobs of every response of g
 * (eng_logprobs, temperature 1), flattened in group, response, token order into out, which holds
 * them all. Returns the count, or -1 (err_msg says why). */
#ifndef GRPOD_TEST_LOGPROBS_FLAT_H
#define GRPOD_TEST_LOGPROBS_FLAT_H
#include "engine/engine.h"

static inline int logprobs_flat(eng *e, const eng_update_group *g, int n_groups, float *out) {
    float **lp;
    if (eng_logprobs(e, g, n_groups, 0, 1.0f, 1 << 20, &lp)) return -1;
    int k = 0, s = 0;
    for (int i = 0; i < n_groups; i++)
        for (int r = 0; r < g[i].n; r++, s++)
            for (int t = 0; t < g[i].R[r]; t++) out[k++] = lp[s][t];
    eng_logprobs_free(lp, g, n_groups);
    return k;
}
#endif
