/* deltanet.cu — the gated DeltaNet ops (deltanet.h) on CUDA: bf16 activations, fp32 state and
 * accumulation, no float atomics (every sum has one owner and a fixed order: same bits twice).
 * Legend as deltanet.h (T, Hk, Hv, Dk, Dv, Kc, Cc); NS = ⌈Dv/DN_BV⌉ column slices of a state.
 *
 * The rule's backward is the recurrent form, walked token by token (and its forward when Dk > 128):
 *   - dn_prep_kernel: per token the l2-normalised q (scaled by 1/sqrt(Dk)) and k of each key
 *     head, g and β of each value head, fp32 (scratch in `states`).
 *   - dn_rule_fwd_kernel: one block per (value head, slice of DN_BV state columns) — the columns
 *     of S evolve independently — walking every token in order with its Dk × DN_BV part of S in
 *     registers (thread (warp w, lane) owns column w·8 + lane%8 and rows lane/8 + 4i). A token
 *     continues the state of deltanet_prev(): t - 1 in registers, or any earlier token through
 *     state_after(), which replays its chain from the last checkpoint on it. The state after
 *     every token t ≡ 63 (mod 64) is a checkpoint (`states`), so a replay is at most one
 *     chunk of the response and one of its prompt: the prompt's final state continues into
 *     each response without N copies of it.
 *   - dn_rule_bwd_kernel: the same blocks walk the chunks of 64 tokens in reverse: recompute
 *     the chunk's states into a buffer, then walk its tokens in reverse carrying dS (the
 *     gradient of the state after the token) in registers. The gradient a token passes to a
 *     predecessor that is not t - 1 (a response start to its prompt's last token) waits in a
 *     pending slot until the walk reaches it, summed in reverse token order. Per token the
 *     block writes its partial dq, dk (Dk), dβ and dg sums; dn_rule_qk_kernel and
 *     dn_rule_gate_kernel sum them over slices and value heads in a fixed order and run the
 *     l2 norms', softplus' and sigmoid's backward.
 * Scratch (deltanet_scratch_cuda): `states` holds the checkpoints (T/64 + 1, Hv, Dk, Dv), the
 * backward's chunk buffer (Hv, 64, Dk, Dv) and the prep values; `dstates` the pending slots
 * (DN_PEND, Hv, Dk, Dv) and the per-slice partials — O(T/64) states, never (T, Hv, Dk, Dv).
 * Invariants of a packed layout (engine/model/pack.h), asserted with __trap (a sticky error):
 * a chain needs at most DN_CHAIN tokens of replay and at most DN_PEND prompts wait for their
 * responses' gradients at once (a packed batch has one). The forward runs the chunked form
 * instead (deltanet_chunk.cu) when Dk <= 128, and so does the backward when Dk, Dv <= 128
 * (deltanet_chunk_bwd.cu: its partials go through dn_rule_qk_kernel and dn_rule_gate_kernel as
 * one slice) unless the layout has more chunks than its scratch holds, with a carry or without; then the reverse walk
 * here runs on checkpoints from the chunked forward (its scratch in dstates, before the walk
 * writes its partials there).
 *
 * A carry (deltanet.h): dn_prev names the carry's row (DN_CARRY) as one more predecessor, whose
 * state is the carry's s_in (loaded where a checkpoint or zeros would be) and whose gradient
 * each block adds into ds_in for its own elements when the walk leaves a token that continues
 * it; ds_out is the reverse walk's starting dS, s_out the forward walk's last S. The conv reads
 * the carry's tail as history entries before the call's tokens (tail_out: one more kernel) and
 * adds their gradients to dtail_in in each channel's thread, dtail_out after the walk.
 *
 * The conv is one thread per (token, channel) forward; backward one thread per channel walking
 * the tokens in order (the CPU's order), scattering into an fp32 copy of dx (ctx scratch) that
 * is rounded to bf16 once. The gated norm is a warp per (token, head) row; its dw sums rows in
 * fixed chunks, then the chunks in order. */
#include "kernels/deltanet.cuh"
#include "kernels/deltanet_chunk.cuh"

enum { DN_BV = 32, DN_NT = 128, DN_CHUNK = 64, DN_PEND = 8, DN_CHAIN = 256 };

__device__ __forceinline__ float dn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float dn_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* dn_prev (deltanet_chunk.cuh): the token of the call t continues, DN_NONE, or DN_CARRY */
enum { DN_NONE = DC_NONE, DN_CARRY = DC_CARRY };

/* a carry by value for the kernels (NULL: none, every pointer NULL and row0 0) */
static deltanet_carry dn_cy(const deltanet_carry *cy) {
    deltanet_carry z;
    memset(&z, 0, sizeof z);
    return cy ? *cy : z;
}

/* ---------------------------------------------------------------- scratch layout */

typedef struct {
    float *ck, *buf, *qn, *kn, *g, *beta; /* states: (NCK,Hv,Dk,Dv) (Hv,64,Dk,Dv) (T,Hk,Dk) x2 (T,Hv) x2 */
    float *pend, *pdq, *pdk, *pdb, *pdg; /* dstates: (DN_PEND,Hv,Dk,Dv) (T,Hv,NS,Dk) x2 (T,Hv,NS) x2 */
} dn_scratch;

static long long dn_nck(int T) { return T / DN_CHUNK + 1; }
static int dn_ns(int Dv) { return (Dv + DN_BV - 1) / DN_BV; }

/* the chunked kernels unless GRPOD_TUNE_DELTANET=recurrent */
static int dn_chunked(const cu_ctx *c, int Dk) { return dn_chunk_ok(Dk) && !(c->tune && c->tune->deltanet == TUNE_DN_RECURRENT); }

static long long dn_walk_floats(int T, int Hk, int Hv, int Dk, int Dv) {
    return (dn_nck(T) + DN_CHUNK) * ((long long)Hv * Dk * Dv) + 2LL * T * Hk * Dk + 2LL * T * Hv;
}

/* where the chunked forward's scratch starts in `states`: over the checkpoints and the chunk
 * buffer (which the forward does not use) when it fits there, else after the walk's layout */
static long long dn_chunk_at(int T, int Hk, int Hv, int Dk, int Dv) {
    long long spare = (dn_nck(T) + DN_CHUNK) * ((long long)Hv * Dk * Dv);
    return dn_chunk_floats(T, Hv, Dk, Dv) <= spare ? 0 : dn_walk_floats(T, Hk, Hv, Dk, Dv);
}

void deltanet_scratch_cuda(long long *states, long long *dstates, int T, int Hk, int Hv, int Dk, int Dv) {
    long long SZ = (long long)Hv * Dk * Dv, NS = dn_ns(Dv), walk = dn_walk_floats(T, Hk, Hv, Dk, Dv);
    long long chunk = dn_chunk_ok(Dk) ? dn_chunk_at(T, Hk, Hv, Dk, Dv) + dn_chunk_floats(T, Hv, Dk, Dv) : 0;
    *states = walk > chunk ? walk : chunk;
    *dstates = DN_PEND * SZ + 2LL * T * Hv * NS * Dk + 2LL * T * Hv * NS;
    long long ch = dn_chunk_bwd_ok(Dk, Dv) ? dn_chunk_bwd_floats(T, Hv, Dk, Dv)
        : dn_chunk_ok(Dk)                  ? dn_chunk_floats(T, Hv, Dk, Dv)
                                           : 0;
    if (ch > *dstates) *dstates = ch;
}

static dn_scratch dn_carve(float *states, float *dstates, int T, int Hk, int Hv, int Dk, int Dv) {
    long long SZ = (long long)Hv * Dk * Dv, NS = dn_ns(Dv);
    dn_scratch s;
    s.ck = states;
    s.buf = s.ck + dn_nck(T) * SZ;
    s.qn = s.buf + DN_CHUNK * SZ;
    s.kn = s.qn + (long long)T * Hk * Dk;
    s.g = s.kn + (long long)T * Hk * Dk;
    s.beta = s.g + (long long)T * Hv;
    s.pend = dstates;
    s.pdq = dstates ? s.pend + DN_PEND * SZ : NULL;
    s.pdk = dstates ? s.pdq + (long long)T * Hv * NS * Dk : NULL;
    s.pdb = dstates ? s.pdk + (long long)T * Hv * NS * Dk : NULL;
    s.pdg = dstates ? s.pdb + (long long)T * Hv * NS : NULL;
    return s;
}

/* ---------------------------------------------------------------- conv */

/* hist[j] = the entry Kc-1-j steps back from t along dn_prev: a token (>= 0), none (-1), or
 * the carry's tail entry i (-2 - i, oldest first), as deltanet_cpu.c walks it */
__device__ __forceinline__ void dn_conv_hist(int *hist, attn_ranges r, int row0, int t, int Kc) {
    int e = t;
    for (int j = Kc - 1; j >= 0; j--) {
        hist[j] = e;
        if (e >= 0) {
            int p = dn_prev(r, row0, e);
            e = p == DN_CARRY ? (Kc >= 2 ? -Kc : -1) : p;
        } else if (e != -1) e = e <= -3 ? e + 1 : -1;
    }
}

/* channel c's input at history entry e (not -1) */
__device__ __forceinline__ float dn_conv_in(const bf16 *x, const deltanet_carry &cy, int e, int c, int Cc) {
    return e >= 0 ? __bfloat162float(x[(size_t)e * Cc + c]) : cy.tail_in[(size_t)(-2 - e) * Cc + c];
}

enum { DN_KC_MAX = 16 };

__global__ void dn_conv_fwd_kernel(bf16 *u, const bf16 *x, const bf16 *w, attn_ranges r, deltanet_carry cy, int T, int Cc, int Kc) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)T * Cc) return;
    int t = (int)(i / Cc), c = (int)(i % Cc), hist[DN_KC_MAX];
    dn_conv_hist(hist, r, cy.row0, t, Kc);
    float s = 0;
    for (int j = 0; j < Kc; j++)
        if (hist[j] != -1) s += __bfloat162float(w[(size_t)c * Kc + j]) * dn_conv_in(x, cy, hist[j], c, Cc);
    u[i] = __float2bfloat16(s * dn_sigmoid(s));
}

/* the carry's tail_out: the inputs of T - 1 and the Kc - 2 before it, a thread per (entry, channel) */
__global__ void dn_conv_tail_kernel(const bf16 *x, attn_ranges r, deltanet_carry cy, int T, int Cc, int Kc) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)(Kc - 1) * Cc) return;
    int j = (int)(i / Cc), c = (int)(i % Cc), hist[DN_KC_MAX];
    dn_conv_hist(hist, r, cy.row0, T - 1, Kc);
    cy.tail_out[i] = hist[j + 1] != -1 ? dn_conv_in(x, cy, hist[j + 1], c, Cc) : 0.0f;
}

/* d (channel c's input at entry e) += g: dxf for a token, the carry's dtail_in for its tail */
__device__ __forceinline__ void dn_conv_in_add(float *dxf, const deltanet_carry &cy, int e, int c, int Cc, float g) {
    if (e >= 0) dxf[(size_t)e * Cc + c] += g;
    else if (cy.dtail_in) cy.dtail_in[(size_t)(-2 - e) * Cc + c] += g;
}

/* the value at history entry e (not -1) of the input's gradient: dxf for a token, the carry's
 * dtail_in for its tail entries (0 without one); dn_conv_in_put writes it back (dropped then) */
__device__ __forceinline__ float dn_conv_in_get(const float *dxf, const deltanet_carry &cy, int e, int c, int Cc) {
    return e >= 0 ? dxf[(size_t)e * Cc + c] : cy.dtail_in ? cy.dtail_in[(size_t)(-2 - e) * Cc + c] : 0.0f;
}
__device__ __forceinline__ void dn_conv_in_put(float *dxf, const deltanet_carry &cy, int e, int c, int Cc, float v) {
    if (e >= 0) dxf[(size_t)e * Cc + c] = v;
    else if (cy.dtail_in) cy.dtail_in[(size_t)(-2 - e) * Cc + c] = v;
}

/* one thread per channel, tokens in order: dxf (T,Cc) fp32 zeroed before; dw +=. The Kc entries
 * of a token's history live in registers (its inputs xs, the gradients acc being summed) while
 * tokens continue their predecessor (dn_prev(t) = t - 1: the history shifts by one, the entry
 * leaving it written back); another token writes the window back and reads its own from memory.
 * Each entry's gradient takes the same additions in the same order as one read-modify-write per
 * addition would: the same bits, without a global memory round trip per token and tap. The next
 * token's predecessor, input and upstream gradient are loaded one token ahead. KC: Kc known at
 * compile time (the arrays in registers), 0: any Kc <= DN_KC_MAX. */
template <int KC>
__global__ void dn_conv_bwd_kernel(float *dxf, float *dw, const bf16 *du, const bf16 *x, const bf16 *w, attn_ranges r,
                                   deltanet_carry cy, int T, int Cc, int Kc_) {
    const int Kc = KC ? KC : Kc_;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= Cc) return;
    float wc[DN_KC_MAX], dwc[DN_KC_MAX], xs[DN_KC_MAX], acc[DN_KC_MAX];
    int hist[DN_KC_MAX], have = 0;
#pragma unroll
    for (int j = 0; j < Kc; j++) {
        wc[j] = __bfloat162float(w[(size_t)c * Kc + j]);
        dwc[j] = 0;
    }
    int pn = T > 0 ? dn_prev(r, cy.row0, 0) : DN_NONE;
    float xn = T > 0 ? __bfloat162float(x[c]) : 0.0f, dun = T > 0 ? __bfloat162float(du[c]) : 0.0f;
    for (int t = 0; t < T; t++) {
        int pt = pn;
        float xt = xn, dut = dun;
        if (t + 1 < T) { /* one token ahead */
            pn = dn_prev(r, cy.row0, t + 1);
            xn = __bfloat162float(x[(size_t)(t + 1) * Cc + c]);
            dun = __bfloat162float(du[(size_t)(t + 1) * Cc + c]);
        }
        if (have && pt == t - 1) { /* the window shifts: its oldest entry is done with this run */
            if (hist[0] != -1) dn_conv_in_put(dxf, cy, hist[0], c, Cc, acc[0]);
#pragma unroll
            for (int j = 0; j + 1 < Kc; j++) {
                hist[j] = hist[j + 1];
                xs[j] = xs[j + 1];
                acc[j] = acc[j + 1];
            }
            hist[Kc - 1] = t;
            xs[Kc - 1] = xt;
            acc[Kc - 1] = dxf[(size_t)t * Cc + c];
        } else {
            if (have)
#pragma unroll
                for (int j = 0; j < Kc; j++)
                    if (hist[j] != -1) dn_conv_in_put(dxf, cy, hist[j], c, Cc, acc[j]);
            dn_conv_hist(hist, r, cy.row0, t, Kc);
#pragma unroll
            for (int j = 0; j < Kc; j++) {
                xs[j] = hist[j] != -1 ? dn_conv_in(x, cy, hist[j], c, Cc) : 0.0f;
                acc[j] = hist[j] != -1 ? dn_conv_in_get(dxf, cy, hist[j], c, Cc) : 0.0f;
            }
            have = 1;
        }
        float p = 0;
#pragma unroll
        for (int j = 0; j < Kc; j++) p += wc[j] * xs[j];
        float sg = dn_sigmoid(p), dp = dut * (sg * (1.0f + p * (1.0f - sg)));
#pragma unroll
        for (int j = 0; j < Kc; j++)
            if (hist[j] != -1) {
                dwc[j] += dp * xs[j];
                acc[j] += dp * wc[j];
            }
    }
    if (have)
#pragma unroll
        for (int j = 0; j < Kc; j++)
            if (hist[j] != -1) dn_conv_in_put(dxf, cy, hist[j], c, Cc, acc[j]);
#pragma unroll
    for (int j = 0; j < Kc; j++) dw[(size_t)c * Kc + j] += dwc[j];
    if (cy.dtail_out) { /* the gradient of the carry's tail_out, from outside */
        dn_conv_hist(hist, r, cy.row0, T - 1, Kc);
#pragma unroll
        for (int j = 0; j + 1 < Kc; j++)
            if (hist[j + 1] != -1) dn_conv_in_add(dxf, cy, hist[j + 1], c, Cc, cy.dtail_out[(size_t)j * Cc + c]);
    }
}

__global__ void dn_f32_to_bf16_kernel(bf16 *y, const float *x, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16(x[i]);
}

static int dn_conv_ok(cu_ctx *c, const char *op, int Kc) {
    if (Kc >= 1 && Kc <= DN_KC_MAX) return 1;
    char m[64];
    snprintf(m, sizeof m, "conv kernel %d taps (1..%d)", Kc, DN_KC_MAX);
    cu_fail(c, op, m, __FILE__, __LINE__);
    return 0;
}

void deltanet_conv_fwd_cuda(cu_ctx *c, bf16 *u, const bf16 *x, const bf16 *w, attn_ranges r, const deltanet_carry *cy, int T,
                            int Cc, int Kc) {
    if (c->failed || T <= 0 || !dn_conv_ok(c, "deltanet_conv_fwd_cuda", Kc)) return;
    deltanet_carry k = dn_cy(cy);
    dn_conv_fwd_kernel<<<cu_blocks((long long)T * Cc, 256), 256, 0, c->stream>>>(u, x, w, r, k, T, Cc, Kc);
    CU_LAUNCHED(c, "dn_conv_fwd_kernel");
    if (k.tail_out && Kc > 1) {
        dn_conv_tail_kernel<<<cu_blocks((long long)(Kc - 1) * Cc, 256), 256, 0, c->stream>>>(x, r, k, T, Cc, Kc);
        CU_LAUNCHED(c, "dn_conv_tail_kernel");
    }
}

void deltanet_conv_bwd_cuda(cu_ctx *c, bf16 *dx, float *dw, const bf16 *du, const bf16 *x, const bf16 *w, attn_ranges r,
                            const deltanet_carry *cy, int T, int Cc, int Kc) {
    if (c->failed || T <= 0 || !dn_conv_ok(c, "deltanet_conv_bwd_cuda", Kc)) return;
    long long n = (long long)T * Cc;
    float *dxf = (float *)cu_scratch(c, (size_t)n * sizeof(float));
    if (!dxf) return;
    CU_CK(c, cudaMemsetAsync(dxf, 0, (size_t)n * sizeof(float), c->stream));
    if (Kc == 4) dn_conv_bwd_kernel<4><<<cu_blocks(Cc, 64), 64, 0, c->stream>>>(dxf, dw, du, x, w, r, dn_cy(cy), T, Cc, Kc);
    else dn_conv_bwd_kernel<0><<<cu_blocks(Cc, 64), 64, 0, c->stream>>>(dxf, dw, du, x, w, r, dn_cy(cy), T, Cc, Kc);
    CU_LAUNCHED(c, "dn_conv_bwd_kernel");
    dn_f32_to_bf16_kernel<<<cu_blocks(n, 256), 256, 0, c->stream>>>(dx, dxf, n);
    CU_LAUNCHED(c, "dn_f32_to_bf16_kernel");
}

/* ---------------------------------------------------------------- rule: inputs */

/* one block per token: a warp per key head (q, k) then per value head (g, β) */
__global__ void dn_prep_kernel(float *qn, float *kn, float *g, float *beta, const bf16 *u, const bf16 *a, const bf16 *b,
                               const bf16 *A_log, const bf16 *dt_bias, int Hk, int Hv, int Dk, int Dv) {
    int t = blockIdx.x, lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int Cc = 2 * Hk * Dk + Hv * Dv;
    const bf16 *ut = u + (size_t)t * Cc;
    float sc = rsqrtf((float)Dk);
    for (int hh = wp; hh < 2 * Hk; hh += nw) { /* hh < Hk: q of key head hh; else k of hh - Hk */
        const bf16 *x = ut + (size_t)hh * Dk;
        float ss = 0;
        for (int i = lane; i < Dk; i += 32) {
            float v = __bfloat162float(x[i]);
            ss += v * v;
        }
        float inv = 1.0f / sqrtf(warp_sum(ss) + 1e-6f), s = hh < Hk ? inv * sc : inv;
        float *y = (hh < Hk ? qn + ((size_t)t * Hk + hh) * Dk : kn + ((size_t)t * Hk + hh - Hk) * Dk);
        for (int i = lane; i < Dk; i += 32) y[i] = __bfloat162float(x[i]) * s;
    }
    for (int h = threadIdx.x; h < Hv; h += blockDim.x) {
        size_t th = (size_t)t * Hv + h;
        float x = __bfloat162float(a[th]) + __bfloat162float(dt_bias[h]);
        g[th] = -expf(__bfloat162float(A_log[h])) * dn_softplus(x);
        beta[th] = dn_sigmoid(__bfloat162float(b[th]));
    }
}

/* ---------------------------------------------------------------- rule: the walk */

/* What a block of the walk reads: value head h, columns j (this thread's) of the state. */
struct dn_walk {
    attn_ranges r;
    int row0; /* the carry's (deltanet.h): token t is row row0 + t */
    const float *s_in; /* the carry's state (Hv,Dk,Dv): the state of DN_CARRY */
    const float *qn, *kn, *g, *beta;
    const bf16 *u;
    float *ck;
    int T, Hk, Hv, Dk, Dv, Cc, h, kh, j, rg;
    size_t SZ; /* Dk * Dv */
    __device__ size_t at(int i) const { return (size_t)i * Dv + j; } /* element (i, j) of a state */
    __device__ float *ckpt(int t) const { return ck + ((size_t)(t / DN_CHUNK) * Hv + h) * SZ; }
};

/* One token: S = e^g S; δ = β (v - S^T k); S += k δ^T; returns o_j = (S^T q)_j (every row lane
 * of the column gets it). KPT rows per thread: i = rg + 4 ii. */
template <int KPT> __device__ __forceinline__ float dn_step(float *S, const dn_walk &w, int t) {
    const float *k = w.kn + ((size_t)t * w.Hk + w.kh) * w.Dk, *q = w.qn + ((size_t)t * w.Hk + w.kh) * w.Dk;
    size_t th = (size_t)t * w.Hv + w.h;
    float eg = expf(w.g[th]), bt = w.beta[th];
    float v = w.j < w.Dv ? __bfloat162float(w.u[(size_t)t * w.Cc + 2 * w.Hk * w.Dk + (size_t)w.h * w.Dv + w.j]) : 0.0f;
    float kr[KPT], m = 0;
#pragma unroll
    for (int ii = 0; ii < KPT; ii++) {
        int i = w.rg + 4 * ii;
        kr[ii] = i < w.Dk ? k[i] : 0.0f;
        S[ii] *= eg;
        m += S[ii] * kr[ii];
    }
    m += __shfl_xor_sync(0xffffffffu, m, 8);
    m += __shfl_xor_sync(0xffffffffu, m, 16);
    float d = bt * (v - m), o = 0;
#pragma unroll
    for (int ii = 0; ii < KPT; ii++) {
        int i = w.rg + 4 * ii;
        S[ii] += kr[ii] * d;
        o += S[ii] * (i < w.Dk ? q[i] : 0.0f);
    }
    o += __shfl_xor_sync(0xffffffffu, o, 8);
    o += __shfl_xor_sync(0xffffffffu, o, 16);
    return o;
}

template <int KPT> __device__ __forceinline__ void dn_load(float *S, const float *src, const dn_walk &w) {
#pragma unroll
    for (int ii = 0; ii < KPT; ii++) {
        int i = w.rg + 4 * ii;
        S[ii] = i < w.Dk && w.j < w.Dv ? src[w.at(i)] : 0.0f;
    }
}
template <int KPT> __device__ __forceinline__ void dn_store(float *dst, const float *S, const dn_walk &w) {
#pragma unroll
    for (int ii = 0; ii < KPT; ii++) {
        int i = w.rg + 4 * ii;
        if (i < w.Dk && w.j < w.Dv) dst[w.at(i)] = S[ii];
    }
}
/* dst += S, each element by its one owner thread */
template <int KPT> __device__ __forceinline__ void dn_store_add(float *dst, const float *S, const dn_walk &w) {
#pragma unroll
    for (int ii = 0; ii < KPT; ii++) {
        int i = w.rg + 4 * ii;
        if (i < w.Dk && w.j < w.Dv) dst[w.at(i)] += S[ii];
    }
}

/* S = the state after token p (zeros for DN_NONE, the carry's s_in for DN_CARRY): the last
 * checkpoint on p's chain (a token ≡ 63 mod 64 at or before p, written by this block's walk
 * earlier) or the chain's start, then the chain's tokens after it replayed. The whole block
 * calls it (it syncs); chain: DN_CHAIN ints of shared memory. */
template <int KPT> __device__ void dn_state_after(float *S, int p, const dn_walk &w, int *chain) {
    __syncthreads();
    if (threadIdx.x == 0) {
        int n = 0, s = p;
        while (s >= 0 && s % DN_CHUNK != DN_CHUNK - 1) {
            if (n == DN_CHAIN - 2) __trap(); /* a chain of more than two runs: not a packed layout */
            chain[2 + n++] = s;
            s = dn_prev(w.r, w.row0, s);
        }
        chain[0] = n;
        chain[1] = s;
    }
    __syncthreads();
    int n = chain[0], s = chain[1];
    if (s >= 0) dn_load<KPT>(S, w.ckpt(s), w);
    else if (s == DN_CARRY) dn_load<KPT>(S, w.s_in + (size_t)w.h * w.SZ, w);
    else
        for (int ii = 0; ii < KPT; ii++) S[ii] = 0;
    for (int x = n - 1; x >= 0; x--) dn_step<KPT>(S, w, chain[2 + x]);
}

__device__ dn_walk dn_walk_init(attn_ranges r, const deltanet_carry &cy, const dn_scratch &s, const bf16 *u, int T, int Hk,
                                int Hv, int Dk, int Dv) {
    dn_walk w;
    w.r = r;
    w.row0 = cy.row0;
    w.s_in = cy.s_in;
    w.qn = s.qn;
    w.kn = s.kn;
    w.g = s.g;
    w.beta = s.beta;
    w.u = u;
    w.ck = s.ck;
    w.T = T;
    w.Hk = Hk;
    w.Hv = Hv;
    w.Dk = Dk;
    w.Dv = Dv;
    w.Cc = 2 * Hk * Dk + Hv * Dv;
    w.h = blockIdx.x;
    w.kh = w.h / (Hv / Hk);
    int lane = threadIdx.x & 31;
    w.j = blockIdx.y * DN_BV + (threadIdx.x >> 5) * 8 + (lane & 7);
    w.rg = lane >> 3;
    w.SZ = (size_t)Dk * Dv;
    return w;
}

/* grid (Hv, NS), DN_NT threads; o (T,Hv,Dv) may be NULL (checkpoints only); the state after
 * T - 1 into cy.s_out when set */
template <int KPT>
__global__ void __launch_bounds__(DN_NT) dn_rule_fwd_kernel(bf16 *o, dn_scratch s, const bf16 *u, attn_ranges r,
                                                            deltanet_carry cy, int T, int Hk, int Hv, int Dk, int Dv) {
    __shared__ int chain[DN_CHAIN];
    dn_walk w = dn_walk_init(r, cy, s, u, T, Hk, Hv, Dk, Dv);
    float S[KPT];
    for (int ii = 0; ii < KPT; ii++) S[ii] = 0;
    for (int t = 0; t < T; t++) {
        int p = dn_prev(r, cy.row0, t);
        if (p != t - 1 || t == 0) dn_state_after<KPT>(S, p, w, chain);
        float ov = dn_step<KPT>(S, w, t);
        if (o && w.rg == 0 && w.j < Dv) o[((size_t)t * Hv + w.h) * Dv + w.j] = __float2bfloat16(ov);
        if (t % DN_CHUNK == DN_CHUNK - 1) dn_store<KPT>(w.ckpt(t), S, w);
    }
    if (cy.s_out) dn_store<KPT>(cy.s_out + (size_t)w.h * w.SZ, S, w);
}

/* grid (Hv, NS), DN_NT threads: the reverse walk (see the top). dv written to du's v slice;
 * partial dq, dk (per slice, before the value-head sum), dβ, dg sums per (t, h, slice). */
template <int KPT>
__global__ void __launch_bounds__(DN_NT) dn_rule_bwd_kernel(bf16 *du, dn_scratch s, const bf16 *dout, const bf16 *u, attn_ranges r,
                                                            deltanet_carry cy, int T, int Hk, int Hv, int Dk, int Dv) {
    __shared__ int chain[DN_CHAIN];
    __shared__ float red_q[DN_BV][33], red_k[DN_BV][33]; /* per column, a chunk of 32 rows (padded) */
    __shared__ float red_b[DN_BV], red_g[DN_NT / 32];
    dn_walk w = dn_walk_init(r, cy, s, u, T, Hk, Hv, Dk, Dv);
    int NS = gridDim.y, sl = blockIdx.y, col = threadIdx.x >> 5 << 3 | (threadIdx.x & 7), lane = threadIdx.x & 31;
    float *buf = s.buf + (size_t)w.h * DN_CHUNK * w.SZ;
    float dS[KPT], Sp[KPT], kr[KPT];
    int ptok[DN_PEND];
    for (int x = 0; x < DN_PEND; x++) ptok[x] = -1;
    if (cy.ds_out) dn_load<KPT>(dS, cy.ds_out + (size_t)w.h * w.SZ, w); /* the last state's gradient from outside */
    else
        for (int ii = 0; ii < KPT; ii++) dS[ii] = 0;
    for (int c0 = (T - 1) / DN_CHUNK * DN_CHUNK; c0 >= 0; c0 -= DN_CHUNK) {
        int c1 = min(T, c0 + DN_CHUNK);
        /* the chunk's states, forward */
        for (int t = c0; t < c1; t++) {
            int p = dn_prev(r, cy.row0, t);
            if (t == c0 || p != t - 1) {
                if (p >= c0) dn_load<KPT>(Sp, buf + (size_t)(p - c0) * w.SZ, w);
                else dn_state_after<KPT>(Sp, p, w, chain);
            }
            dn_step<KPT>(Sp, w, t);
            dn_store<KPT>(buf + (size_t)(t - c0) * w.SZ, Sp, w);
        }
        /* reverse */
        for (int t = c1 - 1; t >= c0; t--) {
            int p = dn_prev(r, cy.row0, t);
            for (int x = 0; x < DN_PEND; x++)
                if (ptok[x] == t) { /* the gradients of t's other successors */
                    float *pe = s.pend + ((size_t)x * Hv + w.h) * w.SZ;
                    for (int ii = 0; ii < KPT; ii++) {
                        int i = w.rg + 4 * ii;
                        if (i < Dk && w.j < Dv) dS[ii] += pe[w.at(i)];
                    }
                    ptok[x] = -1;
                }
            if (p == DN_NONE)
                for (int ii = 0; ii < KPT; ii++) Sp[ii] = 0;
            else if (p == DN_CARRY) dn_load<KPT>(Sp, cy.s_in + (size_t)w.h * w.SZ, w);
            else if (p >= c0) dn_load<KPT>(Sp, buf + (size_t)(p - c0) * w.SZ, w);
            else dn_state_after<KPT>(Sp, p, w, chain);
            const float *q = w.qn + ((size_t)t * Hk + w.kh) * Dk, *k = w.kn + ((size_t)t * Hk + w.kh) * Dk;
            const float *St = buf + (size_t)(t - c0) * w.SZ;
            size_t th = (size_t)t * Hv + w.h;
            float eg = expf(w.g[th]), bt = w.beta[th];
            size_t vo = (size_t)t * w.Cc + 2 * Hk * Dk + (size_t)w.h * Dv + w.j;
            float v = w.j < Dv ? __bfloat162float(u[vo]) : 0.0f;
            float dy = w.j < Dv ? __bfloat162float(dout[th * Dv + w.j]) : 0.0f;
            /* dS += q dy^T; dq = S dy; m = S'^T k */
            float m = 0;
            for (int ii = 0; ii < KPT; ii++) {
                int i = w.rg + 4 * ii;
                kr[ii] = i < Dk ? k[i] : 0.0f;
                dS[ii] += (i < Dk ? q[i] : 0.0f) * dy;
                m += eg * Sp[ii] * kr[ii];
            }
            m += __shfl_xor_sync(0xffffffffu, m, 8);
            m += __shfl_xor_sync(0xffffffffu, m, 16);
            float dlt = bt * (v - m), dd = 0;
            for (int ii = 0; ii < KPT; ii++) dd += dS[ii] * kr[ii];
            dd += __shfl_xor_sync(0xffffffffu, dd, 8);
            dd += __shfl_xor_sync(0xffffffffu, dd, 16);
            if (w.rg == 0 && w.j < Dv) du[vo] = __float2bfloat16(bt * dd);
            float dm = -bt * dd, dgs = 0;
            /* per row chunk of 32: this thread's column terms of dq_i and dk_i into shared
             * memory, then 32 threads sum the block's columns in order */
            for (int i0 = 0; i0 < Dk; i0 += 32) {
                __syncthreads();
#pragma unroll
                for (int ii = 0; ii < KPT; ii++) {
                    int i = w.rg + 4 * ii;
                    if (i < i0 || i >= i0 + 32) continue;
                    float st = i < Dk && w.j < Dv ? St[w.at(i)] : 0.0f;
                    red_q[col][i - i0] = st * dy;
                    red_k[col][i - i0] = dS[ii] * dlt + eg * Sp[ii] * dm;
                }
                __syncthreads();
                if (threadIdx.x < 64) {
                    int i = i0 + (threadIdx.x & 31);
                    float acc = 0;
                    if (threadIdx.x < 32)
                        for (int cc = 0; cc < DN_BV; cc++) acc += red_q[cc][i - i0];
                    else
                        for (int cc = 0; cc < DN_BV; cc++) acc += red_k[cc][i - i0];
                    if (i < Dk) (threadIdx.x < 32 ? s.pdq : s.pdk)[((size_t)th * NS + sl) * Dk + i] = acc;
                }
            }
            /* dS' = dS + k dm^T; dg's sum; dS_prev += e^g dS' */
            for (int ii = 0; ii < KPT; ii++) {
                dS[ii] += kr[ii] * dm;
                dgs += dS[ii] * Sp[ii];
                dS[ii] *= eg;
            }
            __syncthreads();
            if (w.rg == 0) red_b[col] = dd * (v - m);
            dgs = warp_sum(dgs);
            if (lane == 0) red_g[threadIdx.x >> 5] = dgs;
            __syncthreads();
            if (threadIdx.x == 0) {
                float sb = 0, sg = 0;
                for (int cc = 0; cc < DN_BV; cc++) sb += red_b[cc];
                for (int x = 0; x < DN_NT / 32; x++) sg += red_g[x];
                s.pdb[th * NS + sl] = sb;
                s.pdg[th * NS + sl] = sg;
            }
            if (p != t - 1) {
                if (p >= 0) { /* hand e^g dS' to p through a pending slot */
                    int x = 0;
                    while (x < DN_PEND && ptok[x] != p) x++;
                    int fresh = x == DN_PEND;
                    if (fresh) {
                        x = 0;
                        while (x < DN_PEND && ptok[x] >= 0) x++;
                        if (x == DN_PEND) __trap(); /* more than DN_PEND prompts awaiting their gradient */
                        ptok[x] = p;
                    }
                    float *pe = s.pend + ((size_t)x * Hv + w.h) * w.SZ;
                    for (int ii = 0; ii < KPT; ii++) {
                        int i = w.rg + 4 * ii;
                        if (i < Dk && w.j < Dv) pe[w.at(i)] = fresh ? dS[ii] : pe[w.at(i)] + dS[ii];
                    }
                } else if (p == DN_CARRY && cy.ds_in) /* the carry's state: its gradient, added up */
                    dn_store_add<KPT>(cy.ds_in + (size_t)w.h * w.SZ, dS, w);
                for (int ii = 0; ii < KPT; ii++) dS[ii] = 0;
            }
        }
    }
}

/* grid (T, Hk): dq, dk of key head kh summed over its value heads and the slices, in order,
 * then the scale and the l2 norms' backward: dx = inv (dy - y (y · dy)), y = x inv */
__global__ void dn_rule_qk_kernel(bf16 *du, dn_scratch s, const bf16 *u, int Hk, int Hv, int Dk, int Dv, int NS) {
    __shared__ float gq[256], gk[256], red[32];
    int t = blockIdx.x, kh = blockIdx.y, G = Hv / Hk, Cc = 2 * Hk * Dk + Hv * Dv;
    for (int i = threadIdx.x; i < Dk; i += blockDim.x) {
        float aq = 0, ak = 0;
        for (int h = kh * G; h < (kh + 1) * G; h++)
            for (int sl = 0; sl < NS; sl++) {
                size_t o = (((size_t)t * Hv + h) * NS + sl) * Dk + i;
                aq += s.pdq[o];
                ak += s.pdk[o];
            }
        gq[i] = aq * rsqrtf((float)Dk);
        gk[i] = ak;
    }
    __syncthreads();
    for (int part = 0; part < 2; part++) {
        const bf16 *x = u + (size_t)t * Cc + (size_t)(part * Hk + kh) * Dk;
        float *gy = part ? gk : gq;
        float ss = 0, yd = 0;
        for (int i = threadIdx.x; i < Dk; i += blockDim.x) {
            float v = __bfloat162float(x[i]);
            ss += v * v;
        }
        float inv = 1.0f / sqrtf(block_sum(ss, red) + 1e-6f);
        for (int i = threadIdx.x; i < Dk; i += blockDim.x) yd += __bfloat162float(x[i]) * inv * gy[i];
        yd = block_sum(yd, red);
        for (int i = threadIdx.x; i < Dk; i += blockDim.x)
            du[(size_t)t * Cc + (size_t)(part * Hk + kh) * Dk + i] = __float2bfloat16(
                inv * (gy[i] - __bfloat162float(x[i]) * inv * yd));
    }
}

/* grid (Hv): per token dg = e^g Σ slices (direct: Σ slices is dg itself), through g = -exp(A_log) softplus(a + dt_bias), and
 * dβ through the sigmoid; dA_log[h], ddt_bias[h] += their sums over tokens (fixed order) */
__global__ void dn_rule_gate_kernel(bf16 *da, bf16 *db, float *dA_log, float *ddt_bias, dn_scratch s, const bf16 *a,
                                    const bf16 *A_log, const bf16 *dt_bias, int T, int Hv, int NS, int direct) {
    __shared__ float red[32];
    int h = blockIdx.x;
    float al = -expf(__bfloat162float(A_log[h])), dt = __bfloat162float(dt_bias[h]), sdt = 0, sal = 0;
    for (int t = threadIdx.x; t < T; t += blockDim.x) {
        size_t th = (size_t)t * Hv + h;
        float sg = 0, sb = 0;
        for (int sl = 0; sl < NS; sl++) {
            sg += s.pdg[th * NS + sl];
            sb += s.pdb[th * NS + sl];
        }
        float g = s.g[th], dg = direct ? sg : expf(g) * sg, bt = s.beta[th];
        float dx = dg * al * dn_sigmoid(__bfloat162float(a[th]) + dt);
        da[th] = __float2bfloat16(dx);
        db[th] = __float2bfloat16(sb * bt * (1.0f - bt));
        sdt += dx;
        sal += dg * g;
    }
    sdt = block_sum(sdt, red);
    sal = block_sum(sal, red);
    if (threadIdx.x == 0) {
        ddt_bias[h] += sdt;
        dA_log[h] += sal;
    }
}

/* ---------------------------------------------------------------- rule: launchers */

/* KPT = rows of the state per thread (Dk / 4 rounded up to a power of two, 4..64) */
static int dn_kpt(int Dk) { return Dk <= 16 ? 4 : Dk <= 32 ? 8 : Dk <= 64 ? 16 : Dk <= 128 ? 32 : Dk <= 256 ? 64 : 0; }

static int dn_rule_ok(cu_ctx *c, const char *op, int Hk, int Hv, int Dk) {
    if (dn_kpt(Dk) && Hk > 0 && Hv % Hk == 0) return 1;
    char m[96];
    snprintf(m, sizeof m, "key head dim %d (1..256), %d value heads over %d key heads", Dk, Hv, Hk);
    cu_fail(c, op, m, __FILE__, __LINE__);
    return 0;
}

static void dn_prep(cu_ctx *c, const dn_scratch &s, const bf16 *u, const bf16 *a, const bf16 *b, const bf16 *A_log,
                    const bf16 *dt_bias, int T, int Hk, int Hv, int Dk, int Dv) {
    dn_prep_kernel<<<T, 256, 0, c->stream>>>(s.qn, s.kn, s.g, s.beta, u, a, b, A_log, dt_bias, Hk, Hv, Dk, Dv);
    CU_LAUNCHED(c, "dn_prep_kernel");
}

static void dn_fwd_walk(cu_ctx *c, bf16 *o, const dn_scratch &s, const bf16 *u, attn_ranges r, const deltanet_carry &cy, int T,
                        int Hk, int Hv, int Dk, int Dv) {
    dim3 grid(Hv, dn_ns(Dv));
    switch (dn_kpt(Dk)) {
    case 4: dn_rule_fwd_kernel<4><<<grid, DN_NT, 0, c->stream>>>(o, s, u, r, cy, T, Hk, Hv, Dk, Dv); break;
    case 8: dn_rule_fwd_kernel<8><<<grid, DN_NT, 0, c->stream>>>(o, s, u, r, cy, T, Hk, Hv, Dk, Dv); break;
    case 16: dn_rule_fwd_kernel<16><<<grid, DN_NT, 0, c->stream>>>(o, s, u, r, cy, T, Hk, Hv, Dk, Dv); break;
    case 32: dn_rule_fwd_kernel<32><<<grid, DN_NT, 0, c->stream>>>(o, s, u, r, cy, T, Hk, Hv, Dk, Dv); break;
    default: dn_rule_fwd_kernel<64><<<grid, DN_NT, 0, c->stream>>>(o, s, u, r, cy, T, Hk, Hv, Dk, Dv); break;
    }
    CU_LAUNCHED(c, "dn_rule_fwd_kernel");
}

void deltanet_rule_fwd_cuda(cu_ctx *c, bf16 *o, float *states, const bf16 *u, const bf16 *a, const bf16 *b, const bf16 *A_log,
                            const bf16 *dt_bias, attn_ranges r, const deltanet_carry *cy, int T, int Hk, int Hv, int Dk, int Dv) {
    if (c->failed || T <= 0 || !dn_rule_ok(c, "deltanet_rule_fwd_cuda", Hk, Hv, Dk)) return;
    dn_scratch s = dn_carve(states, NULL, T, Hk, Hv, Dk, Dv);
    dn_prep(c, s, u, a, b, A_log, dt_bias, T, Hk, Hv, Dk, Dv);
    if (dn_chunked(c, Dk))
        dn_chunk_fwd(c, o, NULL, NULL, 0, states + dn_chunk_at(T, Hk, Hv, Dk, Dv), s.qn, s.kn, s.g, s.beta, u, r, dn_cy(cy), T,
                     Hk, Hv, Dk, Dv);
    else dn_fwd_walk(c, o, s, u, r, dn_cy(cy), T, Hk, Hv, Dk, Dv);
}

void deltanet_rule_bwd_cuda(cu_ctx *c, bf16 *du, bf16 *da, bf16 *db, float *dA_log, float *ddt_bias, float *states,
                            float *dstates, const bf16 *dout, const bf16 *u, const bf16 *a, const bf16 *b, const bf16 *A_log,
                            const bf16 *dt_bias, attn_ranges r, const deltanet_carry *cy, int T, int Hk, int Hv, int Dk, int Dv) {
    if (c->failed || T <= 0 || !dn_rule_ok(c, "deltanet_rule_bwd_cuda", Hk, Hv, Dk)) return;
    dn_scratch s = dn_carve(states, dstates, T, Hk, Hv, Dk, Dv);
    int NS = dn_ns(Dv);
    deltanet_carry k = dn_cy(cy), kin = k;
    kin.s_out = NULL; /* the recompute leaves the forward's outputs alone */
    dn_prep(c, s, u, a, b, A_log, dt_bias, T, Hk, Hv, Dk, Dv);
    if (dn_chunked(c, Dk) && dn_chunk_bwd_ok(Dk, Dv)) { /* chunked (the checkpoints written in any case, in dstates) */
        if (dn_chunk_bwd(c, du, &s.pdq, &s.pdk, &s.pdb, &s.pdg, s.ck, dstates, s.qn, s.kn, s.g, s.beta, dout, u, r, k, T, Hk, Hv,
                         Dk, Dv)) {
            dn_rule_qk_kernel<<<dim3(T, Hk), 128, 0, c->stream>>>(du, s, u, Hk, Hv, Dk, Dv, 1);
            CU_LAUNCHED(c, "dn_rule_qk_kernel");
            dn_rule_gate_kernel<<<Hv, 256, 0, c->stream>>>(da, db, dA_log, ddt_bias, s, a, A_log, dt_bias, T, Hv, 1, 1);
            CU_LAUNCHED(c, "dn_rule_gate_kernel");
            return;
        }
        if (c->failed) return;
        s = dn_carve(states, dstates, T, Hk, Hv, Dk, Dv); /* the recurrent backward's partials again */
    } else if (dn_chunked(c, Dk))
        dn_chunk_fwd(c, NULL, s.ck, NULL, 0, dstates, s.qn, s.kn, s.g, s.beta, u, r, kin, T, Hk, Hv, Dk, Dv);
    else dn_fwd_walk(c, NULL, s, u, r, kin, T, Hk, Hv, Dk, Dv); /* the checkpoints */
    dim3 grid(Hv, NS);
    switch (dn_kpt(Dk)) {
    case 4: dn_rule_bwd_kernel<4><<<grid, DN_NT, 0, c->stream>>>(du, s, dout, u, r, kin, T, Hk, Hv, Dk, Dv); break;
    case 8: dn_rule_bwd_kernel<8><<<grid, DN_NT, 0, c->stream>>>(du, s, dout, u, r, kin, T, Hk, Hv, Dk, Dv); break;
    case 16: dn_rule_bwd_kernel<16><<<grid, DN_NT, 0, c->stream>>>(du, s, dout, u, r, kin, T, Hk, Hv, Dk, Dv); break;
    case 32: dn_rule_bwd_kernel<32><<<grid, DN_NT, 0, c->stream>>>(du, s, dout, u, r, kin, T, Hk, Hv, Dk, Dv); break;
    default: dn_rule_bwd_kernel<64><<<grid, DN_NT, 0, c->stream>>>(du, s, dout, u, r, kin, T, Hk, Hv, Dk, Dv); break;
    }
    CU_LAUNCHED(c, "dn_rule_bwd_kernel");
    dn_rule_qk_kernel<<<dim3(T, Hk), 128, 0, c->stream>>>(du, s, u, Hk, Hv, Dk, Dv, NS);
    CU_LAUNCHED(c, "dn_rule_qk_kernel");
    dn_rule_gate_kernel<<<Hv, 256, 0, c->stream>>>(da, db, dA_log, ddt_bias, s, a, A_log, dt_bias, T, Hv, NS, 0);
    CU_LAUNCHED(c, "dn_rule_gate_kernel");
}

/* ---------------------------------------------------------------- gated norm */

/* a warp per (token, head) row */
__global__ void dn_norm_fwd_kernel(bf16 *y, float *rstd, const bf16 *o, const bf16 *z, const bf16 *w, long long rows, int Dv,
                                   float eps) {
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const bf16 *x = o + row * Dv, *zr = z + row * Dv;
    float ss = 0;
    for (int i = lane; i < Dv; i += 32) {
        float v = __bfloat162float(x[i]);
        ss += v * v;
    }
    float r = rsqrtf(warp_sum(ss) / Dv + eps);
    if (lane == 0) rstd[row] = r;
    for (int i = lane; i < Dv; i += 32) {
        float zv = __bfloat162float(zr[i]);
        y[row * Dv + i] = __float2bfloat16(__bfloat162float(w[i]) * (__bfloat162float(x[i]) * r) * zv * dn_sigmoid(zv));
    }
}

__global__ void dn_norm_bwd_kernel(bf16 *dout, bf16 *dz, const bf16 *dy, const bf16 *o, const bf16 *z, const bf16 *w,
                                   const float *rstd, long long rows, int Dv) {
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const bf16 *x = o + row * Dv, *zr = z + row * Dv, *g = dy + row * Dv;
    float r = rstd[row], s = 0;
    for (int i = lane; i < Dv; i += 32) {
        float n = __bfloat162float(x[i]) * r, zv = __bfloat162float(zr[i]), sg = dn_sigmoid(zv),
              gw = __bfloat162float(g[i]) * __bfloat162float(w[i]);
        dz[row * Dv + i] = __float2bfloat16(gw * n * (sg * (1.0f + zv * (1.0f - sg))));
        s += gw * zv * sg * n;
    }
    float mean = warp_sum(s) / Dv;
    for (int i = lane; i < Dv; i += 32) {
        float n = __bfloat162float(x[i]) * r, zv = __bfloat162float(zr[i]);
        float dn = __bfloat162float(g[i]) * __bfloat162float(w[i]) * zv * dn_sigmoid(zv);
        dout[row * Dv + i] = __float2bfloat16(r * (dn - n * mean));
    }
}

enum { DN_DW_CHUNKS = 128 };

/* dw's partials: block b sums rows [b·per, (b+1)·per) of dy n silu(z), a thread per column */
__global__ void dn_norm_dw_kernel(float *part, const bf16 *dy, const bf16 *o, const bf16 *z, const float *rstd, long long rows,
                                  int Dv, long long per) {
    long long r0 = blockIdx.x * per, r1 = min(rows, r0 + per);
    for (int i = threadIdx.x; i < Dv; i += blockDim.x) {
        float acc = 0;
        for (long long row = r0; row < r1; row++) {
            float zv = __bfloat162float(z[row * Dv + i]);
            acc += __bfloat162float(dy[row * Dv + i]) * (__bfloat162float(o[row * Dv + i]) * rstd[row]) * zv * dn_sigmoid(zv);
        }
        part[(size_t)blockIdx.x * Dv + i] = acc;
    }
}

void deltanet_norm_fwd_cuda(cu_ctx *c, bf16 *y, float *rstd, const bf16 *o, const bf16 *z, const bf16 *w, int T, int Hv, int Dv,
                            float eps) {
    long long rows = (long long)T * Hv;
    if (c->failed || rows <= 0) return;
    dn_norm_fwd_kernel<<<cu_blocks(rows * 32, 256), 256, 0, c->stream>>>(y, rstd, o, z, w, rows, Dv, eps);
    CU_LAUNCHED(c, "dn_norm_fwd_kernel");
}

void deltanet_norm_bwd_cuda(cu_ctx *c, bf16 *dout, bf16 *dz, float *dw, const bf16 *dy, const bf16 *o, const bf16 *z,
                            const bf16 *w, const float *rstd, int T, int Hv, int Dv) {
    long long rows = (long long)T * Hv, per = (rows + DN_DW_CHUNKS - 1) / DN_DW_CHUNKS;
    if (c->failed || rows <= 0) return;
    int nparts = (int)((rows + per - 1) / per);
    float *part = (float *)cu_scratch(c, (size_t)nparts * Dv * sizeof(float));
    if (!part) return;
    dn_norm_bwd_kernel<<<cu_blocks(rows * 32, 256), 256, 0, c->stream>>>(dout, dz, dy, o, z, w, rstd, rows, Dv);
    CU_LAUNCHED(c, "dn_norm_bwd_kernel");
    dn_norm_dw_kernel<<<nparts, 128, 0, c->stream>>>(part, dy, o, z, rstd, rows, Dv, per);
    CU_LAUNCHED(c, "dn_norm_dw_kernel");
    cu_sum_parts_kernel<<<cu_blocks(Dv, 128), 128, 0, c->stream>>>(dw, part, nparts, Dv);
    CU_LAUNCHED(c, "cu_sum_parts_kernel");
}
