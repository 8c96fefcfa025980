/* moe_lora.cu — the experts' LoRA adapters (moe.h moe_lora) on CUDA, beside moe.cu's grouped
 * expert GEMMs: the low-rank terms of each (token, slot) with its expert's A and B, their input
 * gradients, and the adapters' weight gradients. Legend as moe.h (T, C, E, k, Fm, rg, rd);
 * S = T·k slots, slot ts = t·k + s, r a rank.
 *
 * Plain kernels, correctness first (the ranks are small: a term costs r/Fm of its GEMM):
 *   - moe_lora_dot_kernel: out (S, r) fp32 = Σ_i src(ts)[i] · M_e[j, i], one warp per (slot, j),
 *     the lanes' partial sums reduced in a fixed shuffle order;
 *   - moe_lora_add_kernel: dst (S, O) += Σ_j h[ts, j] · M_e[o, j], one thread per (slot, o),
 *     added in fp32 and rounded once (to bf16 where dst is act-typed);
 *   - moe_lora_wgrad_kernel: dW_e (M, N) += Σ over expert e's slots in slot order (moe.cu's
 *     perm) of U(ts)[m] · V(ts)[n], one thread per (e, m, n).
 * No atomics: every sum has one owner and a fixed order, so results are bit-identical from run to
 * run, as moe.cu's. M_e is addressed by strides, so one kernel reads A (E, r, I) by rows and B
 * (E, O, r) by columns. */
#include "kernels/moe.cuh"

/* ---------------------------------------------------------------- row sources */

/* What a slot's row is: a token's row of X (T, ld), a slot's row (S, ld), or silu(g)·u of a
 * slot's rows of g, u (S, ld); times topw[ts] when scaled. bf16 or fp32. */
__device__ __forceinline__ float lora_src(const moe_lora_src &s, int ts, int k, int i) {
    size_t row = (size_t)(s.by_token ? ts / k : ts) * s.ld + i;
    float v;
    if (s.swiglu) {
        float g = __bfloat162float(((const bf16 *)s.p)[row]), u = __bfloat162float(((const bf16 *)s.p2)[row]);
        v = g / (1.0f + __expf(-g)) * u;
    } else {
        v = s.f32 ? ((const float *)s.p)[row] : __bfloat162float(((const bf16 *)s.p)[row]);
    }
    return s.topw ? v * s.topw[ts] : v;
}

/* element (j, i) of expert e's matrix: M[e·es + j·js + i·is] */
__device__ __forceinline__ float lora_mat(const moe_lora_mat &m, int e, int j, int i) {
    return __bfloat162float(m.p[(size_t)e * m.es + (size_t)j * m.js + (size_t)i * m.is]);
}

/* ---------------------------------------------------------------- kernels */

/* out[ts, j] = Σ_i a(ts)[i] M_e[j, i] (+ Σ_i b(ts)[i] N_e[j, i] when b.p); I inputs. */
__global__ void moe_lora_dot_kernel(float *out, moe_lora_src a, moe_lora_mat ma, moe_lora_src b, moe_lora_mat mb, const int *topi,
                                    int S, int k, int r, int I) {
    long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (w >= (long long)S * r) return;
    int ts = (int)(w / r), j = (int)(w % r), e = topi[ts];
    float acc = 0.0f;
    for (int i = lane; i < I; i += 32) {
        acc += lora_src(a, ts, k, i) * lora_mat(ma, e, j, i);
        if (b.p) acc += lora_src(b, ts, k, i) * lora_mat(mb, e, j, i);
    }
    for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (!lane) out[(size_t)ts * r + j] = acc;
}

/* dst[ts·ld + o] += Σ_j h[ts, j] M_e[o, j], o < O; dst bf16 (f32 = 0) or fp32 */
__global__ void moe_lora_add_kernel(void *dst, int f32, int ld, const float *h, moe_lora_mat m, const int *topi, int S, int O,
                                    int r) {
    long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= (long long)S * O) return;
    int ts = (int)(n / O), o = (int)(n % O), e = topi[ts];
    float acc = 0.0f;
    for (int j = 0; j < r; j++) acc += h[(size_t)ts * r + j] * lora_mat(m, e, o, j);
    size_t at = (size_t)ts * ld + o;
    if (f32) ((float *)dst)[at] += acc;
    else ((bf16 *)dst)[at] = __float2bfloat16(__bfloat162float(((bf16 *)dst)[at]) + acc);
}

/* dW[e·es + m·N + n] += Σ_{slots ts of e, in slot order} U(ts)[m] V(ts)[n]; grid (⌈M·N/256⌉, 1, E) */
__global__ void moe_lora_wgrad_kernel(float *dw, size_t es, moe_lora_src u, moe_lora_src v, const int *perm, const int *off,
                                      const int *cnt, int k, int M, int N) {
    long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int e = blockIdx.z;
    if (n >= (long long)M * N || !cnt[e]) return;
    int mi = (int)(n / N), ni = (int)(n % N);
    float acc = 0.0f;
    for (int i = 0; i < cnt[e]; i++) {
        int ts = perm[off[e] + i];
        acc += lora_src(u, ts, k, mi) * lora_src(v, ts, k, ni);
    }
    dw[(size_t)e * es + n] += acc;
}

/* ---------------------------------------------------------------- launchers */

void moe_lora_dot_cuda(cu_ctx *c, float *out, moe_lora_src a, moe_lora_mat ma, moe_lora_src b, moe_lora_mat mb, const int *topi,
                       int S, int k, int r, int I) {
    if (c->failed || S <= 0 || r <= 0) return;
    moe_lora_dot_kernel<<<cu_blocks((long long)S * r * 32, 256), 256, 0, c->stream>>>(out, a, ma, b, mb, topi, S, k, r, I);
    CU_LAUNCHED(c, "moe_lora_dot_kernel");
}

void moe_lora_add_cuda(cu_ctx *c, void *dst, int f32, int ld, const float *h, moe_lora_mat m, const int *topi, int S, int O, int r) {
    if (c->failed || S <= 0 || r <= 0) return;
    moe_lora_add_kernel<<<cu_blocks((long long)S * O, 256), 256, 0, c->stream>>>(dst, f32, ld, h, m, topi, S, O, r);
    CU_LAUNCHED(c, "moe_lora_add_kernel");
}

void moe_lora_wgrad_cuda(cu_ctx *c, float *dw, size_t es, moe_lora_src u, moe_lora_src v, const int *cnt, int E, int k, int M,
                         int N) {
    if (c->failed || !dw || E <= 0) return;
    const int *off = cnt + E, *perm = cnt + 3 * E + 2; /* moe.cu moe_perm's arrays */
    dim3 grid(cu_blocks((long long)M * N, 256), 1, (unsigned)E);
    moe_lora_wgrad_kernel<<<grid, 256, 0, c->stream>>>(dw, es, u, v, perm, off, cnt, k, M, N);
    CU_LAUNCHED(c, "moe_lora_wgrad_kernel");
}
