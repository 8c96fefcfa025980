/* sampling.h — one token per row of full logits, drawn on the backend with per-row parameters
 * (temperature, top_k, top_p, min_p, a ban flag, a key), and its logprob.
 *
 * Row r of logits (R, V): z_j = logits_j / T with T = temperature (1 when greedy). The reported
 * logprob is z_tok - logsumexp_j z_j over all V ids — the untruncated distribution, banned ids
 * included — which is what the update's old pass recomputes. Eligible ids: all, minus the ban
 * list when the row's ban flag is set, and only those of the row's allow mask when it has one
 * (constrained decoding: engine/text/json_grammar.h says which ids a grammar allows).
 *   greedy (temperature <= 0): tok = argmax over eligible z, lowest id on ties.
 *   sampling: the kept set, in the order the host path applied them (sort eligible by z desc):
 *     top_k (0 < k < V): ids whose z is >= the k-th largest eligible z (ties at that value are
 *       all kept);
 *     min_p (> 0): ids with w_j = exp(z_j - z_max) >= min_p (p_j >= min_p * p_max);
 *     top_p (< 1): of what remains, ids with z >= tau, tau the largest value such that the
 *       mass w of the remaining ids with z >= tau reaches top_p times the remaining mass
 *       (the nucleus; ties at tau all kept);
 *   then tok = argmax over the kept set of z_j + g_j (Gumbel-max), which draws j with
 *   probability w_j / sum of kept w exactly. g_j = -log(-log(u_j)) with u_j from a counter-based
 *   hash of (key, j), so a draw depends on its logits and key alone: the same seed gives the
 *   same tokens whatever the batch composition. Ties go to the lowest id.
 * The CPU and CUDA backends share the hash and the rules, but their logits differ by rounding
 * (and their mass sums by order), so the two may pick different tokens from one key.
 *
 * The ban list: ban[0] = n, then n ids (so one buffer serves any n, inside a captured graph).
 * The allow masks: allow (M, W) words, W = sampling_mask_words(V); a row with p.allow = m > 0 may
 * draw id j only when bit j % 32 of word j / 32 of mask m - 1 is set (allow may be NULL when no
 * row has one). When a row's masks leave nothing eligible, greedy's fallback id 0 is drawn.
 * Legend: R rows, V vocab, M masks, W words a mask. */
#ifndef GRPOD_KERNELS_SAMPLING_H
#define GRPOD_KERNELS_SAMPLING_H
#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define SAMPLING_HD __host__ __device__
#else
#define SAMPLING_HD
#endif

typedef struct {
    uint64_t key; /* the draw's key (engine/rollout/decode.h dec_key) */
    float temperature; /* <= 0: greedy */
    float top_p; /* >= 1: off */
    float min_p; /* <= 0: off */
    int top_k; /* <= 0 or >= V: off */
    int ban; /* 1: the ban list's ids are not eligible */
    int allow; /* m > 0: only the ids of allow mask m - 1 are eligible; 0: no mask */
} sample_params; /* 32 bytes */

/* splitmix64's finalizer; also the engine's key and stream mixer (engine/rollout/decode.h dec_key). */
static inline SAMPLING_HD uint64_t sampling_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
/* Gumbel noise for (key, j) in fp32: v = 1 - u from 32 hash bits, E = -log(u) = -log1p(-v)
 * (exact for small v: the top of the Gumbel tail), g = -log(E). */
static inline SAMPLING_HD float sampling_gumbel(uint64_t key, int j) {
    uint64_t x = sampling_mix(key ^ sampling_mix((uint64_t)(uint32_t)j * 0x9E3779B97F4A7C15ULL + 1));
    float v = ((float)(uint32_t)(x >> 32) + 0.5f) * 2.3283064365386963e-10f;
    v = fminf(v, 0.99999994f);
    return -logf(-log1pf(-v));
}
static inline SAMPLING_HD int sampling_mask_words(int V) { return (V + 31) / 32; }
/* 1 when id j is outside the row's allow mask (mask: its words, or NULL for none). */
static inline SAMPLING_HD int sampling_masked(const uint32_t *mask, int j) { return mask && !((mask[j >> 5] >> (j & 31)) & 1u); }
/* 1 when the row draws from a truncated set (top_k, top_p or min_p active). */
static inline SAMPLING_HD int sampling_truncates(const sample_params *p, int V) {
    return p->temperature > 0 && ((p->top_k > 0 && p->top_k < V) || p->top_p < 1.0f || p->min_p > 0);
}

/* tok (R), logprob (R); logits (R, V) fp32; p (R); ban and allow as above (NULL: none). */
void sample_cpu(int *tok, float *logprob, const float *logits, const sample_params *p, const int *ban, const uint32_t *allow,
                int R, int V);
#endif
