/* deltanet_decode.cu — the gated DeltaNet decode steps (deltanet_decode.h) on CUDA:
 *
 *   conv: a CTA per (token, block of 256 channels); only the CTA of a run's first token works,
 *         one thread per channel walking the run's tokens through the fp32 tail in registers.
 *   rule: a CTA per (token, value head); only the CTA of a run's first token works, with the
 *         head's state in registers for the whole run (deltanet_rule_step_kernel below).
 *
 * A decode step is one token per row, so every CTA works and the state is read and written once
 * per step; a prefill of P tokens is a walk of P tokens per (row, head) with the state read and
 * written once. Dk ≤ 256 and Dv ≤ 1024 (Qwen3.5: 128, 128). */
#include "kernels/deltanet_decode.cuh"

__device__ __forceinline__ float dd_silu(float x) { return x / (1.0f + __expf(-x)); }
__device__ __forceinline__ float dd_sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }
__device__ __forceinline__ float dd_softplus(float x) { return x > 20.0f ? x : log1pf(__expf(x)); }

__device__ __forceinline__ int dd_run_start(const int *srow, int t) { return t == 0 || srow[t - 1] != srow[t]; }

enum { DD_KT_MAX = 15 }; /* conv taps - 1 held in registers */

__global__ void deltanet_conv_step_kernel(bf16 *__restrict__ u, float *__restrict__ tail, const bf16 *__restrict__ x,
                                          const bf16 *__restrict__ w, const int *__restrict__ srow, int T, int Cc, int Kc) {
    int t0 = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x, Kt = Kc - 1;
    if (c >= Cc || !dd_run_start(srow, t0) || srow[t0] < 0) return;
    /* the taps and history in registers: loops over the most taps, the ones past Kt skipped */
    float *tl = tail + (size_t)srow[t0] * Kt * Cc + c, h[DD_KT_MAX], wc[DD_KT_MAX], wl = __bfloat162float(w[(size_t)c * Kc + Kt]);
#pragma unroll
    for (int j = 0; j < DD_KT_MAX; j++) {
        wc[j] = j < Kt ? __bfloat162float(w[(size_t)c * Kc + j]) : 0.0f;
        h[j] = j < Kt ? tl[(size_t)j * Cc] : 0.0f;
    }
    for (int t = t0; t < T && srow[t] == srow[t0]; t++) {
        float xt = __bfloat162float(x[(size_t)t * Cc + c]), s = 0;
#pragma unroll
        for (int j = 0; j < DD_KT_MAX; j++)
            if (j < Kt) s += wc[j] * h[j];
        s += wl * xt;
        u[(size_t)t * Cc + c] = __float2bfloat16(dd_silu(s));
#pragma unroll
        for (int j = 0; j < DD_KT_MAX; j++)
            if (j + 1 < Kt) h[j] = h[j + 1];
            else if (j + 1 == Kt) h[j] = xt;
    }
#pragma unroll
    for (int j = 0; j < DD_KT_MAX; j++)
        if (j < Kt) tl[(size_t)j * Cc] = h[j];
}

/* The rule: a CTA per (token, value head); only the CTA of a run's first token works. Thread
 * (rg, j) owns column j of the state's rows rg*NR .. rg*NR+NR-1 in registers: the row's state is
 * read once at the run's start and written once at its end, however long the run. Per token:
 * q, k of the token l2-normalised (warp sums, then the warps' partials in order), m_j = S^T k and
 * o_j = S^T q as RG partial sums over row groups combined in order through shared memory. The
 * next token's inputs load while this one computes. Deterministic (fixed owners and orders). */
template <int NR>
__global__ void __launch_bounds__(1024)
    deltanet_rule_step_kernel(bf16 *__restrict__ o, float *__restrict__ state, const bf16 *__restrict__ u,
                              const bf16 *__restrict__ a, const bf16 *__restrict__ b, const bf16 *__restrict__ A_log,
                              const bf16 *__restrict__ dt_bias, const int *__restrict__ srow, int T, int Hk, int Hv, int Dk,
                              int Dv) {
    extern __shared__ float dd_sm[]; /* q[Dk], k[Dk], sq[32], sk[32], pm[RG][Dv], po[RG][Dv] */
    int t0 = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, kh = h / (Hv / Hk), Cc = 2 * Hk * Dk + Hv * Dv;
    if (!dd_run_start(srow, t0) || srow[t0] < 0) return;
    int RG = (Dk + NR - 1) / NR, j = tid % Dv, rg = tid / Dv, own = rg < RG, lane = tid & 31, wid = tid >> 5;
    int nw = (Dk + 31) / 32, row = srow[t0];
    float *qs = dd_sm, *ks = qs + Dk, *sq = ks + Dk, *sk = sq + 32, *pm = sk + 32, *po = pm + RG * Dv;
    float *S = state + ((size_t)row * Hv + h) * Dk * Dv + j;
    float st[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) {
        int i = rg * NR + r;
        st[r] = own && i < Dk ? S[(size_t)i * Dv] : 0.0f;
    }
    float al = __bfloat162float(A_log[h]), dt = __bfloat162float(dt_bias[h]);
    /* this token's inputs, loaded one token ahead: q_i, k_i (tid < Dk), v_j, a, b */
    float nq = 0, nk = 0, nv = 0, na, nb;
    {
        const bf16 *ut = u + (size_t)t0 * Cc;
        if (tid < Dk) {
            nq = __bfloat162float(ut[(size_t)kh * Dk + tid]);
            nk = __bfloat162float(ut[(size_t)(Hk + kh) * Dk + tid]);
        }
        if (own) nv = __bfloat162float(ut[(size_t)2 * Hk * Dk + (size_t)h * Dv + j]);
        na = __bfloat162float(a[(size_t)t0 * Hv + h]);
        nb = __bfloat162float(b[(size_t)t0 * Hv + h]);
    }
    for (int t = t0; t < T && srow[t] == row; t++) {
        float vj = nv, at = na, bt = nb;
        if (tid < Dk) {
            qs[tid] = nq;
            ks[tid] = nk;
        }
        if (wid < nw) { /* whole warps (nq, nk are 0 past Dk) */
            float x = nq * nq, y = nk * nk;
            for (int m = 16; m; m >>= 1) {
                x += __shfl_xor_sync(0xffffffffu, x, m);
                y += __shfl_xor_sync(0xffffffffu, y, m);
            }
            if (lane == 0) {
                sq[wid] = x;
                sk[wid] = y;
            }
        }
        if (t + 1 < T && srow[t + 1] == row) { /* the next token's inputs, in flight while this one computes */
            const bf16 *un = u + (size_t)(t + 1) * Cc;
            if (tid < Dk) {
                nq = __bfloat162float(un[(size_t)kh * Dk + tid]);
                nk = __bfloat162float(un[(size_t)(Hk + kh) * Dk + tid]);
            }
            if (own) nv = __bfloat162float(un[(size_t)2 * Hk * Dk + (size_t)h * Dv + j]);
            na = __bfloat162float(a[(size_t)(t + 1) * Hv + h]);
            nb = __bfloat162float(b[(size_t)(t + 1) * Hv + h]);
        }
        __syncthreads();
        float ssq = 0, ssk = 0;
        for (int w = 0; w < nw; w++) {
            ssq += sq[w];
            ssk += sk[w];
        }
        float iq = rsqrtf(ssq + 1e-6f) * rsqrtf((float)Dk), ik = rsqrtf(ssk + 1e-6f);
        float eg = __expf(-__expf(al) * dd_softplus(at + dt)), beta = dd_sigmoid(bt), m = 0;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            int i = rg * NR + r;
            st[r] *= eg;
            if (i < Dk) m += st[r] * (ks[i] * ik);
        }
        if (own) pm[rg * Dv + j] = m;
        __syncthreads();
        m = 0;
        for (int g = 0; g < RG; g++) m += pm[g * Dv + j];
        float d = beta * (vj - m), acc = 0;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            int i = rg * NR + r;
            if (i < Dk) {
                st[r] += (ks[i] * ik) * d;
                acc += st[r] * (qs[i] * iq);
            }
        }
        if (own) po[rg * Dv + j] = acc;
        __syncthreads();
        if (own && rg == 0) {
            acc = 0;
            for (int g = 0; g < RG; g++) acc += po[g * Dv + j];
            o[((size_t)t * Hv + h) * Dv + j] = __float2bfloat16(acc);
        }
        /* the next token writes qs, ks, sq, sk (all read before the last barrier), pm after its
         * first barrier (pm's readers here are past the last) and po after its second (po's
         * readers here reach the first before it) */
    }
#pragma unroll
    for (int r = 0; r < NR; r++) {
        int i = rg * NR + r;
        if (own && i < Dk) S[(size_t)i * Dv] = st[r];
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
    /* rows a thread holds: the fewest of 32, 64, 128, 256 that fit the (row group, column)
     * threads in one block */
    int nr = 32;
    while (nr < 256 && (Dk + nr - 1) / nr * Dv > 1024) nr *= 2;
    if (Dk > 256 || (Dk + nr - 1) / nr * Dv > 1024) {
        cu_fail(c, "deltanet_rule_step_cuda", "head dims beyond Dk 256 / Dv 1024", __FILE__, __LINE__);
        return;
    }
    int rg = (Dk + nr - 1) / nr, threads = (rg * Dv + 31) / 32 * 32;
    if (threads < Dk) threads = (Dk + 31) / 32 * 32; /* a thread per key element for the norms */
    size_t smem = (size_t)(2 * Dk + 64 + 2 * rg * Dv) * sizeof(float);
    dim3 grid(T, Hv);
#define DD_L(NR) \
    deltanet_rule_step_kernel<NR><<<grid, threads, smem, c->stream>>>(o, state, u, a, b, A_log, dt_bias, srow, T, Hk, Hv, Dk, Dv)
    if (nr == 32) DD_L(32);
    else if (nr == 64) DD_L(64);
    else if (nr == 128) DD_L(128);
    else DD_L(256);
#undef DD_L
    CU_LAUNCHED(c, "deltanet_rule_step_kernel");
}
