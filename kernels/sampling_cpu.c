/* sampling_cpu.c — the reference of kernels/sampling.h: Gumbel-max temperature sampling and
 * greedy, one row of logits per response, rows in parallel. */
#include <stddef.h>

#include "kernels/sampling.h"

void sample_cpu(int *tok, float *logprob, const float *logits, const uint64_t *keys, uint64_t counter, int R, int V,
                float temperature) {
    float T = temperature > 0 ? temperature : 1.0f;
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < R; r++) {
        const float *x = logits + (size_t)r * V;
        float mx = -INFINITY;
        for (int j = 0; j < V; j++) mx = fmaxf(mx, x[j] / T);
        double sum = 0, best = -INFINITY;
        int pick = 0;
        for (int j = 0; j < V; j++) {
            float z = x[j] / T;
            sum += exp((double)(z - mx));
            double score = temperature > 0 ? (double)z + sampling_gumbel(keys[r], counter, j) : (double)z;
            if (score > best) { best = score; pick = j; }
        }
        tok[r] = pick;
        logprob[r] = x[pick] / T - (mx + (float)log(sum));
    }
}
