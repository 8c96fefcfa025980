/* deltanet_decode.cu — the gated DeltaNet decode steps (deltanet_decode.h) on CUDA, kept simple:
 *
 *   conv: a CTA per (token, block of 256 channels); only the CTA of a run's first token works,
 *         one thread per channel walking the run's tokens through the fp32 tail in registers.
 *   rule: a CTA per (token, value head), Dv threads (a warp multiple); only the CTA of a run's
 *         first token works. Per token of the run: q, k l2-normalised in shared memory (one
 *         thread sums the squares in order: deterministic), then thread j owns column j of the
 *         state (Dk fp32 in global memory, coalesced across j): S = e^g S, m_j = S^T k, δ_j =
 *         β (v_j - m_j), S += k δ^T, o_j = S^T q — two passes over the state, in place.
 *
 * A decode step is one token per row, so every CTA works and the state is read and written once
 * per step; a prefill of P tokens is a serial walk of P tokens per (row, head). Dk ≤ 256 and
 * Dv ≤ 1024 (Qwen3.5: 128, 128). */
#include "kernels/deltanet_decode.cuh"

__device__ __forceinline__ float dd_silu(float x) { return x / (1.0f + __expf(-x)); }
__device__ __forceinline__ float dd_sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }
__device__ __forceinline__ float dd_softplus(float x) { return x > 20.0f ? x : log1pf(__expf(x)); }

__device__ __forceinline__ int dd_run_start(const int *srow, int t) { return t == 0 || srow[t - 1] != srow[t]; }

enum { DD_KT_MAX = 15 }; /* conv taps - 1 held in registers */

__global__ void deltanet_conv_step_kernel(bf16 *u, float *tail, const bf16 *x, const bf16 *w, const int *srow, int T, int Cc,
                                          int Kc) {
    int t0 = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x, Kt = Kc - 1;
    if (c >= Cc || !dd_run_start(srow, t0) || srow[t0] < 0) return;
    float *tl = tail + (size_t)srow[t0] * Kt * Cc + c, h[DD_KT_MAX], wc[DD_KT_MAX + 1];
    for (int j = 0; j < Kc; j++) wc[j] = __bfloat162float(w[(size_t)c * Kc + j]);
    for (int j = 0; j < Kt; j++) h[j] = tl[(size_t)j * Cc];
    for (int t = t0; t < T && srow[t] == srow[t0]; t++) {
        float xt = __bfloat162float(x[(size_t)t * Cc + c]), s = 0;
        for (int j = 0; j < Kt; j++) s += wc[j] * h[j];
        s += wc[Kt] * xt;
        u[(size_t)t * Cc + c] = __float2bfloat16(dd_silu(s));
        for (int j = 0; j + 1 < Kt; j++) h[j] = h[j + 1];
        if (Kt > 0) h[Kt - 1] = xt;
    }
    for (int j = 0; j < Kt; j++) tl[(size_t)j * Cc] = h[j];
}

__global__ void deltanet_rule_step_kernel(bf16 *o, float *state, const bf16 *u, const bf16 *a, const bf16 *b, const bf16 *A_log,
                                          const bf16 *dt_bias, const int *srow, int T, int Hk, int Hv, int Dk, int Dv) {
    __shared__ float q[256], k[256], inv[2];
    int t0 = blockIdx.x, h = blockIdx.y, j = threadIdx.x, kh = h / (Hv / Hk), Cc = 2 * Hk * Dk + Hv * Dv;
    if (!dd_run_start(srow, t0) || srow[t0] < 0) return;
    float *S = state + ((size_t)srow[t0] * Hv + h) * Dk * Dv;
    float al = __bfloat162float(A_log[h]), dt = __bfloat162float(dt_bias[h]);
    for (int t = t0; t < T && srow[t] == srow[t0]; t++) {
        const bf16 *ut = u + (size_t)t * Cc;
        for (int i = j; i < Dk; i += blockDim.x) {
            q[i] = __bfloat162float(ut[(size_t)kh * Dk + i]);
            k[i] = __bfloat162float(ut[(size_t)(Hk + kh) * Dk + i]);
        }
        __syncthreads();
        if (j == 0) {
            float sq = 0, sk = 0;
            for (int i = 0; i < Dk; i++) {
                sq += q[i] * q[i];
                sk += k[i] * k[i];
            }
            inv[0] = rsqrtf(sq + 1e-6f) * rsqrtf((float)Dk);
            inv[1] = rsqrtf(sk + 1e-6f);
        }
        __syncthreads();
        float g = -__expf(al) * dd_softplus(__bfloat162float(a[(size_t)t * Hv + h]) + dt), eg = __expf(g);
        float beta = dd_sigmoid(__bfloat162float(b[(size_t)t * Hv + h]));
        if (j < Dv) {
            float m = 0, acc = 0, iq = inv[0], ik = inv[1];
            for (int i = 0; i < Dk; i++) {
                float s = eg * S[(size_t)i * Dv + j];
                S[(size_t)i * Dv + j] = s;
                m += s * (k[i] * ik);
            }
            float d = beta * (__bfloat162float(ut[(size_t)2 * Hk * Dk + (size_t)h * Dv + j]) - m);
            for (int i = 0; i < Dk; i++) {
                float s = S[(size_t)i * Dv + j] + (k[i] * ik) * d;
                S[(size_t)i * Dv + j] = s;
                acc += s * (q[i] * iq);
            }
            o[((size_t)t * Hv + h) * Dv + j] = __float2bfloat16(acc);
        }
        __syncthreads(); /* q, k are the next token's */
    }
}

void deltanet_conv_step_cuda(cu_ctx *c, bf16 *u, float *tail, const bf16 *x, const bf16 *w, const int *srow, int T, int Cc, int Kc) {
    if (c->failed || T <= 0) return;
    if (Kc - 1 > DD_KT_MAX) {
        cu_fail(c, "deltanet_conv_step_cuda", "more conv taps than the kernel holds", __FILE__, __LINE__);
        return;
    }
    deltanet_conv_step_kernel<<<dim3(T, cu_blocks(Cc, 256)), 256, 0, c->stream>>>(u, tail, x, w, srow, T, Cc, Kc);
    CU_LAUNCHED(c, "deltanet_conv_step_kernel");
}

void deltanet_rule_step_cuda(cu_ctx *c, bf16 *o, float *state, const bf16 *u, const bf16 *a, const bf16 *b, const bf16 *A_log,
                             const bf16 *dt_bias, const int *srow, int T, int Hk, int Hv, int Dk, int Dv) {
    if (c->failed || T <= 0) return;
    if (Dk > 256 || Dv > 1024) {
        cu_fail(c, "deltanet_rule_step_cuda", "head dims beyond Dk 256 / Dv 1024", __FILE__, __LINE__);
        return;
    }
    int threads = (Dv + 31) / 32 * 32;
    deltanet_rule_step_kernel<<<dim3(T, Hv), threads, 0, c->stream>>>(o, state, u, a, b, A_log, dt_bias, srow, T, Hk, Hv, Dk, Dv);
    CU_LAUNCHED(c, "deltanet_rule_step_kernel");
}
