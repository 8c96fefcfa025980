/* elementwise.h — the small elementwise ops of the backend table beside the op families: the sum
 * of two activations (the residual adds outside a fused launch), an activation added into fp32
 * sums kept across launches (engine/model/split.c's prompt dK/dV), fp32 -> activation type, rows
 * scattered to slots (KV-cache rows) and gathered from them. On the cpu the activation type is fp32 and the
 * conversion a copy. Legend: n elements, T rows of row elements. */
#ifndef GRPOD_ELEMENTWISE_H
#define GRPOD_ELEMENTWISE_H
void add_cpu(float *out, const float *x, const float *y, long long n); /* out = x + y (may alias) */
void acc_f32_cpu(float *acc, const float *x, long long n); /* acc += x */
/* dst rows slot[t] (row elements each) = src rows t, t < T */
void scatter_rows_cpu(float *dst, const float *src, const int *slot, int T, int row);
/* dst rows i = src rows idx[i], i < n (expert parallelism's send rows, engine/model/moe_ep.c) */
void gather_rows_cpu(float *dst, const float *src, const int *idx, int n, int row);
#endif
