/* test_rollout_top.c (GPU) — sampling.top_logprobs on the cuda backend: the decode step lists
 * each sampled token's 5 most likely tokens (logprob_top on the step's final-norm rows); they
 * are compared with eng_logprobs_top of the same responses (the scoring pass, another batch
 * shape, so bf16 rounding apart: held to the dense rollout-vs-trainer tolerance, 2e-2 on a
 * logprob, and 5% of positions whose first alternative differs on a near-tie). Greedy: the first
 * alternative is the drawn token. Prints ROW lines for tests/gpu/run.sh. */
#include "engine/engine.h"
#include "tests/gpu/gpu_check.h"
#include "tests/unit/default_engine.h"

enum { K = 5, N = 4, MAXT = 24 };

int main(void) {
    eng *e = default_engine_on("build/gpu/top_model", "cuda");
    if (!e) gc_die(NULL, "the default model on cuda");
    static const int prompt[] = {72, 101, 108, 108, 111, 44, 32, 119};
    for (int greedy = 0; greedy < 2; greedy++) {
        eng_rollout_group g = {prompt, 8, N};
        eng_sampling s;
        eng_sampling_default(&s);
        s.temperature = greedy ? 0 : 0.7f;
        s.max_tokens = MAXT;
        s.seed = 5;
        s.ignore_eos = 1;
        s.top_logprobs = K;
        eng_group_result out;
        if (eng_rollout(e, &g, 1, &s, &out, NULL, NULL)) gc_die(NULL, "eng_rollout");
        const int *resp[N];
        int R[N];
        for (int k = 0; k < N; k++) resp[k] = out.resp[k].tokens, R[k] = out.resp[k].n_tokens;
        eng_update_group ug = {.prompt = prompt, .P = 8, .n = N, .resp = resp, .R = R};
        float **lp;
        int **ids;
        float **lps;
        if (eng_logprobs_top(e, &ug, 1, 0, greedy ? 1.0f : s.temperature, 1 << 20, K, &lp, &ids, &lps)) gc_die(NULL, "logprobs");
        int pos = 0, first = 0, drawn = 0, missing = 0;
        double worst = 0;
        for (int k = 0; k < N; k++) {
            const eng_response *x = &out.resp[k];
            missing += !x->top_ids;
            for (int t = 0; x->top_ids && t < R[k]; t++, pos++) {
                const int *a = x->top_ids + t * K, *b = ids[k] + t * K;
                first += a[0] != b[0];
                drawn += greedy && a[0] != x->tokens[t];
                for (int i = 0; i < K; i++)
                    for (int j = 0; j < K; j++)
                        if (a[i] == b[j]) worst = fmax(worst, fabs(x->top_lps[t * K + i] - lps[k][t * K + j]));
            }
        }
        char name[96];
        snprintf(name, sizeof name, "rollout top_logprobs %s: first alternative differs", greedy ? "greedy" : "T=0.7");
        gc_row(name, "default model N=4 24 tokens k=5 (fraction)", missing ? NAN : (double)first / pos, 0.05);
        snprintf(name, sizeof name, "rollout top_logprobs %s: max abs lp vs scorer's", greedy ? "greedy" : "T=0.7");
        gc_row(name, "default model N=4 24 tokens k=5", missing ? NAN : worst, 2e-2);
        if (greedy) gc_row("rollout top_logprobs greedy: first != drawn", "fraction of positions", (double)drawn / pos, 0.05);
        eng_logprobs_free(lp, &ug, 1);
        eng_logprobs_top_free(ids, lps, &ug, 1);
        eng_group_result_free(&out);
    }
    eng_close(e);
    return gc_failures ? 1 : 0;
}
