/* dot_cpu.h — the one order in which the CPU backend's matmuls and logprob head sum a row's dot
 * products, whatever the batch. (Attention sums its query-key products in attention_cpu.c, one
 * query at a time in one function for every caller, so a row's bits do not depend on the batch
 * there either.)
 *
 * Four lanes: lane l sums a[i]·b[i] for i ≡ l (mod 4) in i's order over the whole blocks of
 * four, the lanes join as (l0 + l1) + (l2 + l3), and the tail adds one by one. Written with
 * explicit lanes rather than `omp simd reduction` (which lets the compiler choose the order), so
 * a row's result is the same bits in a 4×4 tile, alone, in a decode step of one row or in a
 * training forward of thousands: a rollout's logprobs are the trainer's. The build turns off
 * floating-point contraction (-ffp-contract=off), so no code shape fuses differently. */
#ifndef GRPOD_DOT_CPU_H
#define GRPOD_DOT_CPU_H

#define DOT_LANES 4

static inline float dot_lanes_join(const float s[DOT_LANES]) { return (s[0] + s[1]) + (s[2] + s[3]); }

static inline float dot_cpu(const float *a, const float *b, int n) {
    float s[DOT_LANES] = {0};
    int i = 0;
    for (; i + DOT_LANES <= n; i += DOT_LANES)
        for (int l = 0; l < DOT_LANES; l++) s[l] += a[i + l] * b[i + l];
    float r = dot_lanes_join(s);
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

#endif
