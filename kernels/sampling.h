/* sampling.h — drawing one token per row of full logits on the device side, for the common RL
 * case (plain temperature sampling, or greedy): row r of logits (R, V) gives tok[r] and
 * logprob[r] = log softmax(logits[r] / T)[tok[r]] (T = 1 when greedy, as the host path reports).
 *
 * Temperature > 0 is the Gumbel-max trick: tok = argmax_j (logits[j] / T + g_j) with
 * g_j = -log(-log(u_j)), which draws j with probability softmax(logits / T)_j exactly. u_j comes
 * from a counter-based hash of (key[r], counter, j) — key is a response's stream, counter its
 * step — so a draw depends on nothing but those three: the same seed gives the same tokens on
 * a backend whatever the batch composition. Ties go to the lowest id. temperature <= 0 is
 * greedy (argmax of the logits, lowest id on ties). The CPU and CUDA backends share the hash,
 * but their logits differ by rounding, so the two may pick different tokens from one seed. */
#ifndef GRPOD_KERNELS_SAMPLING_H
#define GRPOD_KERNELS_SAMPLING_H
#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define SAMPLING_HD __host__ __device__
#else
#define SAMPLING_HD
#endif

static inline SAMPLING_HD uint64_t sampling_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
/* Gumbel noise for (key, counter, j): u in (0, 1) with 52 random bits, in double. */
static inline SAMPLING_HD double sampling_gumbel(uint64_t key, uint64_t counter, int j) {
    uint64_t x = sampling_mix(key ^ sampling_mix(counter * 0x9E3779B97F4A7C15ULL + (uint64_t)(uint32_t)j + 1));
    double u = ((double)(x >> 12) + 0.5) * (1.0 / 4503599627370496.0);
    return -log(-log(u));
}

/* tok (R), logprob (R); logits (R, V) fp32; keys (R). */
void sample_cpu(int *tok, float *logprob, const float *logits, const uint64_t *keys, uint64_t counter, int R, int V,
                float temperature);
#endif
