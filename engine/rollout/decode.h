/* decode.h — one step of generation on the engine's backend: the forward of T new tokens (a
 * prompt prefill or a decode step of many responses) against a KV cache, then one token drawn
 * for each of R chosen rows of the result, with its logprob.
 *
 * Rollout scheduling (which responses run, their cache rows, stop conditions) lives in
 * rollout.c; this file owns everything a step does on the device, so it can be made fast in
 * one place (device sampling, graphs) without the scheduler knowing.
 *
 * Draws are counter-based: row i's token is a function of its logits and p[i].key alone, so a
 * response's tokens do not depend on which other responses share the step. Callers derive the
 * key from the response's seed and its token index (dec_key). The reported logprob is
 * log softmax(logits / T) of the untruncated distribution (T = 1 when greedy) — what the
 * update's old pass recomputes; top_k / top_p / min_p and bans only change which token is
 * drawn. Legend: T tokens in the forward, R sampled rows, V vocab. */
#ifndef GRPOD_DECODE_H
#define GRPOD_DECODE_H
#include <stdint.h>

#include "engine/model/model.h"
#include "kernels/sampling.h"

typedef struct eng eng;

/* A row's draw parameters and key are kernels/sampling.h's sample_params: the sampler reads
 * them as the scheduler writes them (key: dec_key(stream seed, token index)). */

/* The key of token `index` of a response whose stream seed is `stream`: splitmix64's
 * finalizer (sampling_mix) of the index-th step of the stream. */
static inline uint64_t dec_key(uint64_t stream, int index) {
    return sampling_mix(stream + 0x9E3779B97F4A7C15ULL * (uint64_t)(index + 1));
}

/* Device buffers (and, on cuda, captured graphs) for steps of up to cap_rows rows; grown on
 * demand by dec_step. Owned by the engine (e->dec); freed by dec_free. */
typedef struct dec_state dec_state;
void dec_free(eng *e);

/* Forward of `in` (its tokens' K/V written to their cache rows in->slot; ranges index cache
 * rows) and one draw for each of R rows: rows[i] indexes in's tokens. ids and lps (R, host)
 * receive the tokens and their logprobs. ban (n_ban ids) applies to rows with p[i].ban; allow
 * (n_allow masks of sampling_mask_words(V) words, host; NULL: none) to rows with p[i].allow.
 * routes (T, Lm, k) host, or NULL: the experts each MoE layer chose for in's tokens (model.h
 * model_routes_get; untouched for a dense model). */
/* Rows that also want their k most likely tokens (logprob_top at the row's temperature, 1 when
 * greedy): rows[0, n) index the step's R rows; ids, lps (n, k) host receive them. */
typedef struct {
    int n, k;
    const int *rows;
    int *ids;
    float *lps;
} dec_top;
int dec_step(eng *e, model_kv *kv, const model_input *in, int R, const int *rows, const sample_params *p, const int *ban,
             int n_ban, const uint32_t *allow, int n_allow, const dec_top *top, int *ids, float *lps, int *routes);
#endif
