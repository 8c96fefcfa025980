/* deltanet_chunk_bwd.cu — the gated delta rule's backward in chunks, the adjoint of
 * deltanet_chunk.cu's forward (whose notation this follows: per chunk G, γ, A, U, W, δ = U - W S0,
 * P, K̃_s = e^{G_{n-1}-G_s} k_s; o = γ Q S0 + P δ, S_end = γ_{n-1} S0 + K̃^T δ). Given dO and dS_end:
 *   dδ = P^T dO + K̃ dS_end,   dS0 = γ_{n-1} dS_end + (γ Q)^T dO - W^T dδ
 *   dP = dO δ^T (lower),  dW = -dδ S0^T,  dK̃ = δ dS_end^T,  dq (direct) = γ dO S0^T
 *   Ū = (I + A)^{-T} dδ,  W̄ = (I + A)^{-T} dW   (backward substitution),  dA = -(Ū U^T + W̄ W^T) (strictly lower)
 *   dv = β Ū,  dβ = v·Ū + γ k·W̄ + Σ_s dA_ts e^{G_t-G_s} k_t·k_s,  dk, dq through A, P, W and K̃,
 *   dG_t from γ in o and W, A, P, K̃ and (last token) γ_{n-1} S0, then dg = the reverse cumsum of dG.
 *   - the forward again (deltanet_chunk.cu with ck and h0): U, W, P, G, every chunk's initial
 *     state S0 (h0) and the recurrent backward's checkpoints (ck); the host reads the chunk count
 *     (one stream sync) and takes the recurrent backward instead when the chunks exceed the
 *     scratch (T/64 + T/128 + 1 + DC_EXTRA of them: a run's start or a continued token cuts
 *     one more, so a packed batch of many short runs may have more) or the stream is
 *     being captured.
 *   - dc_rev_kernel: grid (Hv, ⌈Dv/32⌉), the mirror of the forward's walk: the chunks in reverse
 *     token order carrying dS (Dk × 32 columns in shared memory), each chunk's operands (dO's
 *     slice, P, k, then q, W) staged whole by cp.async while the chunk after it computes; a chunk's dS_end (saved: dSe) is
 *     its successor's dS0 plus, for a token other runs continue (a prompt's last), the sum of those
 *     runs' dS0 collected in a slot in reverse token order. With a carry (deltanet.h) the last
 *     chunk's dS_end starts from ds_out, and a chunk continuing the carry's state adds its dS0 into
 *     ds_in (its own elements, in reverse token order).
 *   - dc_grad_kernel: grid (chunks, Hv), every chunk at once from S0 and dS_end: the rest of the
 *     list above (dynamic shared memory: δ, dδ→Ū, dW→W̄, dK̃, k·k, A, dA, dP), its matrix
 *     products on tensor cores at fp32 accuracy (dc_mm: 3xTF32), the backward substitution and
 *     the per-token sums on CUDA cores.
 * Outputs are the recurrent backward's partials with one slice (deltanet.cu reduces them over the
 * value heads of a key head and runs the norms', softplus' and sigmoid's backward), except that
 * pdg is the gradient of g itself. Every sum has one owner and a fixed order (same bits twice). */
#include "kernels/deltanet_chunk.cuh"

int dn_chunk_bwd_ok(int Dk, int Dv) { return dn_chunk_ok(Dk) && Dv >= 1 && Dv <= DC_DK; }

static int dc_cap(int T) { return T / DC_C + T / (2 * DC_C) + 1 + DC_EXTRA; }

long long dn_chunk_bwd_floats(int T, int Hv, int Dk, int Dv) {
    long long SZ = (long long)Hv * Dk * Dv, TH = (long long)T * Hv;
    return dn_chunk_floats(T, Hv, Dk, Dv) + 2LL * dc_cap(T) * SZ + 2 * TH * Dk + 2 * TH;
}

/* ---------------------------------------------------------------- the reverse walk */

/* The reverse walk's shared memory (floats, dynamic): dS (DC_DK × DC_BV), dδ and dO's slice (DC_C ×
 * DC_BV each), dO's slice as loaded (bf16), then the chunk's operands staged whole: P (DC_C × DC_C),
 * k, q, W (DC_C × DC_DK each); G, the decays e^{G_{n-1}-G} and e^{G} (DC_C each). */
enum {
    DR_S = 0,
    DR_D = DR_S + DC_DK * DC_BV,
    DR_O = DR_D + DC_C * DC_BV,
    DR_OB = DR_O + DC_C * DC_BV,
    DR_P = DR_OB + DC_C * DC_BV / 2,
    DR_K = DR_P + DC_C * DC_C,
    DR_Q = DR_K + DC_C * DC_DK,
    DR_W = DR_Q + DC_C * DC_DK,
    DR_G = DR_W + DC_C * DC_DK,
    DR_E = DR_G + DC_C,
    DR_EG = DR_E + DC_C,
    DR_FLOATS = DR_EG + DC_C
};
static size_t dc_rev_bytes(void) { return DR_FLOATS * sizeof(float); }

/* the loads of chunk c's operands (nothing when c < 0): `head`, the ones the chunk's first phase
 * reads (dO's slice, P, k), else q and W. One cp.async group either way. */
__device__ __forceinline__ void dc_rev_issue(float *sm, const dc_scratch &s, const float *qn, const float *kn, const bf16 *dout,
                                             int c, int h, int kh, int jb, int Hk, int Hv, int Dk, int Dv, bool head) {
    if (c >= 0) {
        int t0 = s.cst[c], n = s.cst[c + 1] - t0, nv = min(DC_BV, Dv - jb);
        if (head) {
            const bf16 *po = dout + (size_t)h * Dv + jb;
            dc_stage((bf16 *)(sm + DR_OB), DC_BV, po, (size_t)Hv * Dv, t0, n, nv, dc_vec(po, (size_t)Hv * Dv, nv));
            const float *pp = s.P + (size_t)h * DC_C, *pk = kn + (size_t)kh * Dk;
            dc_stage(sm + DR_P, DC_C, pp, (size_t)Hv * DC_C, t0, n, DC_C, dc_vec(pp, (size_t)Hv * DC_C, DC_C));
            dc_stage(sm + DR_K, DC_DK, pk, (size_t)Hk * Dk, t0, n, Dk, dc_vec(pk, (size_t)Hk * Dk, Dk));
        } else {
            const float *pq = qn + (size_t)kh * Dk, *pw = s.W + (size_t)h * Dk;
            dc_stage(sm + DR_Q, DC_DK, pq, (size_t)Hk * Dk, t0, n, Dk, dc_vec(pq, (size_t)Hk * Dk, Dk));
            dc_stage(sm + DR_W, DC_DK, pw, (size_t)Hv * Dk, t0, n, Dk, dc_vec(pw, (size_t)Hv * Dk, Dk));
        }
    }
    fa_commit();
}

__global__ void __launch_bounds__(DC_NT) dc_rev_kernel(float *dSe, dc_scratch s, const float *qn, const float *kn, const bf16 *dout,
                                                       attn_ranges r, deltanet_carry cy, int Hk, int Hv, int Dk, int Dv) {
    extern __shared__ __align__(16) float sm[];
    float(*dS)[DC_BV] = (float(*)[DC_BV])(sm + DR_S), (*Dd)[DC_BV] = (float(*)[DC_BV])(sm + DR_D);
    float(*Do)[DC_BV] = (float(*)[DC_BV])(sm + DR_O), (*Ps)[DC_C] = (float(*)[DC_C])(sm + DR_P);
    float(*Ks)[DC_DK] = (float(*)[DC_DK])(sm + DR_K), (*Qs)[DC_DK] = (float(*)[DC_DK])(sm + DR_Q);
    float(*Ws)[DC_DK] = (float(*)[DC_DK])(sm + DR_W), *Gs = sm + DR_G, *Dec = sm + DR_E, *Eg = sm + DR_EG;
    const bf16(*Ob)[DC_BV] = (const bf16(*)[DC_BV])(sm + DR_OB);
    __shared__ int ptok[DC_SLOTS], info[3];
    int h = blockIdx.x, kh = h / (Hv / Hk), tid = threadIdx.x, j = tid & 31, w = tid >> 5, nc = *s.nc;
    int jb = blockIdx.y * DC_BV, jj = jb + j, vj = jj < Dv;
    size_t SZ = (size_t)Dk * Dv;
    for (int e = tid; e < DC_DK * DC_BV; e += DC_NT) dS[e / DC_BV][e % DC_BV] = 0;
    if (tid < DC_SLOTS) ptok[tid] = -1;
    dc_rev_issue(sm, s, qn, kn, dout, nc - 1, h, kh, jb, Hk, Hv, Dk, Dv, true);
    dc_rev_issue(sm, s, qn, kn, dout, nc - 1, h, kh, jb, Hk, Hv, Dk, Dv, false);
    __syncthreads();
    if (cy.ds_out && vj) /* the last state's gradient from outside (own elements) */
        for (int i = w; i < Dk; i += 8) dS[i][j] = cy.ds_out[h * SZ + (size_t)i * Dv + jj];
    for (int c = nc - 1; c >= 0; c--) {
        int t0 = s.cst[c], n = s.cst[c + 1] - t0, last = t0 + n - 1, rf = s.ref[last];
        __syncthreads();
        if (tid == 0) { /* md as the forward's; fresh: the first run to hand its dS0 to slot md */
            int p, md = dc_mode(s, r, cy.row0, t0, &p), fresh = 0;
            if (rf >= 0) {
                if (ptok[rf % DC_SLOTS] != last) __trap(); /* a continued token none continued */
                ptok[rf % DC_SLOTS] = -1;
            }
            if (md >= 0) {
                if (ptok[md] >= 0 && ptok[md] != p) __trap(); /* the slot is taken: not a packed layout */
                fresh = ptok[md] < 0;
                ptok[md] = p;
            }
            info[0] = md;
            info[1] = fresh;
        }
        if (tid < DC_C) Gs[tid] = tid < n ? s.G[(size_t)(t0 + tid) * Hv + h] : 0.0f;
        fa_wait<1>(); /* this chunk's dO, P and k (its q and W may still be in flight) */
        __syncthreads();
        for (int e = tid; e < DC_C * DC_BV; e += DC_NT) {
            int t = e / DC_BV, jx = e % DC_BV;
            Do[t][jx] = t < n && jb + jx < Dv ? __bfloat162float(Ob[t][jx]) : 0.0f;
        }
        int md = info[0], fresh = info[1];
        if (rf >= 0 && vj) /* the other runs' dS0, collected in the slot (own elements) */
            for (int i = w; i < Dk; i += 8) dS[i][j] += s.slot[((size_t)(rf % DC_SLOTS) * Hv + h) * SZ + (size_t)i * Dv + jj];
        if (vj)
            for (int i = w; i < Dk; i += 8) dSe[((size_t)c * Hv + h) * SZ + (size_t)i * Dv + jj] = dS[i][j];
        if (tid < DC_C) {
            Dec[tid] = tid < n ? expf(Gs[n - 1] - Gs[tid]) : 0.0f;
            Eg[tid] = expf(Gs[tid]);
        }
        float gl = expf(Gs[n - 1]), acc[8];
#pragma unroll
        for (int m = 0; m < 8; m++) acc[m] = 0;
        __syncthreads();
        /* dδ = P^T dO + K̃ dS: rows t = w + 8m, column j (sums over s, then i, in order) */
#pragma unroll
        for (int m = 0; m < 8; m++)
            for (int sx = 0; sx < DC_C; sx++) acc[m] += Ps[sx][w + 8 * m] * Do[sx][j];
#pragma unroll 4
        for (int i = 0; i < Dk; i++) {
            float sv = dS[i][j];
#pragma unroll
            for (int m = 0; m < 8; m++) acc[m] += Dec[w + 8 * m] * Ks[w + 8 * m][i] * sv;
        }
#pragma unroll
        for (int m = 0; m < 8; m++) Dd[w + 8 * m][j] = w + 8 * m < n && vj ? acc[m] : 0.0f;
        __syncthreads(); /* dO's bf16 slice, P and k are read: the next chunk's go in */
        dc_rev_issue(sm, s, qn, kn, dout, c - 1, h, kh, jb, Hk, Hv, Dk, Dv, true);
        fa_wait<1>(); /* this chunk's q and W */
        __syncthreads();
        /* dS0 = γ_{n-1} dS + (γ Q)^T dO - W^T dδ: rows w + 8q (sums over t in order) */
        for (int i = w; i < Dk; i += 8) {
            float a = 0, b = 0;
#pragma unroll 8
            for (int t = 0; t < DC_C; t++) a += Eg[t] * Qs[t][i] * Do[t][j];
#pragma unroll 8
            for (int t = 0; t < DC_C; t++) b += Ws[t][i] * Dd[t][j];
            dS[i][j] = gl * dS[i][j] + (a - b);
        }
        __syncthreads(); /* q and W are read: the next chunk's go in */
        dc_rev_issue(sm, s, qn, kn, dout, c - 1, h, kh, jb, Hk, Hv, Dk, Dv, false);
        if (md != DC_CONT) { /* dS0 is not the predecessor's: into token p's slot, the carry's ds_in, or dropped (zeros) */
            if (md >= 0 && vj)
                for (int i = w; i < Dk; i += 8) {
                    float *pe = s.slot + ((size_t)md * Hv + h) * SZ + (size_t)i * Dv + jj;
                    *pe = fresh ? dS[i][j] : *pe + dS[i][j];
                }
            if (md == DC_CARRY && cy.ds_in && vj)
                for (int i = w; i < Dk; i += 8) cy.ds_in[h * SZ + (size_t)i * Dv + jj] += dS[i][j];
            for (int i = w; i < DC_DK; i += 8) dS[i][j] = 0;
        }
    }
    fa_wait<0>();
}

/* ---------------------------------------------------------------- every chunk's gradients */

struct dc_grad_smem { /* carved from dynamic shared memory; Mx = max(Dk, Dv) */
    float *D, *Ub, *Wb, *KT, *KK, *Am, *dA, *dP, *Gs, *Bs, *dGo, *rk, *dB, *dGr, *red;
};
static size_t dc_grad_bytes(int Dk, int Dv) {
    int Mx = Dk > Dv ? Dk : Dv;
    return sizeof(float) * ((size_t)DC_C * (2 * Dv + Dk + Mx) + 4 * DC_C * (DC_C + 1) + 6 * DC_C + 32);
}

__global__ void __launch_bounds__(DC_NT, 1)
    dc_grad_kernel(bf16 *du, float *pdq, float *pdk, float *pdb, float *pdg, const float *h0, const float *dSe, dc_scratch s,
                   const float *qn, const float *kn, const float *beta, const bf16 *dout, const bf16 *u, int Hk, int Hv, int Dk,
                   int Dv) {
    extern __shared__ float sm[];
    const int L = DC_C + 1, Mx = Dk > Dv ? Dk : Dv;
    dc_grad_smem z;
    z.D = sm;
    z.Ub = z.D + DC_C * Dv;
    z.Wb = z.Ub + DC_C * Dv;
    z.KT = z.Wb + DC_C * Dk;
    z.KK = z.KT + DC_C * Mx;
    z.Am = z.KK + DC_C * L;
    z.dA = z.Am + DC_C * L;
    z.dP = z.dA + DC_C * L;
    z.Gs = z.dP + DC_C * L;
    z.Bs = z.Gs + DC_C;
    z.dGo = z.Bs + DC_C;
    z.rk = z.dGo + DC_C;
    z.dB = z.rk + DC_C;
    z.dGr = z.dB + DC_C;
    z.red = z.dGr + DC_C;
    int h = blockIdx.y, kh = h / (Hv / Hk), tid = threadIdx.x, lane = tid & 31, wp = tid >> 5, nc = *s.nc;
    int Cc = 2 * Hk * Dk + Hv * Dv;
    size_t SZ = (size_t)Dk * Dv;
    for (int c = blockIdx.x; c < nc; c += gridDim.x) {
        int t0 = s.cst[c], n = s.cst[c + 1] - t0;
        const float *S0 = h0 + ((size_t)c * Hv + h) * SZ, *dS = dSe + ((size_t)c * Hv + h) * SZ;
#define TH(t) ((size_t)(t0 + (t)) * Hv + h)
#define KQ(t, i) (((size_t)(t0 + (t)) * Hk + kh) * Dk + (i))
#define DO(t, j) __bfloat162float(dout[TH(t) * Dv + (j)])
        __syncthreads();
        if (tid < DC_C) {
            z.Gs[tid] = tid < n ? s.G[TH(tid)] : 0.0f;
            z.Bs[tid] = tid < n ? beta[TH(tid)] : 0.0f;
        }
        __syncthreads();
        /* the products on tensor cores (dc_mm); operands from global memory (L2) and shared */
        auto Kr = [&](int t, int i) { return t < n && i < Dk ? __ldg(kn + KQ(t, i)) : 0.0f; }; /* K (t, i) */
        auto Kc = [&](int i, int t) { return t < n && i < Dk ? __ldg(kn + KQ(t, i)) : 0.0f; }; /* K^T (i, t) */
        auto S0r = [&](int i, int j) { return i < Dk && j < Dv ? __ldg(S0 + (size_t)i * Dv + j) : 0.0f; }; /* S0 (i, j) */
        auto S0c = [&](int j, int i) { return i < Dk && j < Dv ? __ldg(S0 + (size_t)i * Dv + j) : 0.0f; }; /* S0^T (j, i) */
        auto dSr = [&](int i, int j) { return i < Dk && j < Dv ? __ldg(dS + (size_t)i * Dv + j) : 0.0f; };
        auto dSc = [&](int j, int i) { return i < Dk && j < Dv ? __ldg(dS + (size_t)i * Dv + j) : 0.0f; };
        auto dOr = [&](int t, int j) { return t < n && j < Dv ? DO(t, j) : 0.0f; };
        /* k·k and A */
        dc_mm(DC_C, DC_C, Dk, Kr, Kc, [&](int t, int sx, float kk) {
            z.KK[t * L + sx] = kk;
            z.Am[t * L + sx] = sx < t && t < n ? z.Bs[t] * expf(z.Gs[t] - z.Gs[sx]) * kk : 0.0f;
        });
        /* δ = U - W S0; dO ⊙ γ Q S0 (into KT, summed by rows below); dδ = P^T dO + K̃ dS */
        dc_mm(
            DC_C, Dv, Dk, [&](int t, int i) { return t < n && i < Dk ? __ldg(s.W + TH(t) * Dk + i) : 0.0f; }, S0r,
            [&](int t, int j, float ws) {
                if (j < Dv) z.D[t * Dv + j] = t < n ? s.U[TH(t) * Dv + j] - ws : 0.0f;
            });
        dc_mm(
            DC_C, Dv, Dk, [&](int t, int i) { return t < n && i < Dk ? __ldg(qn + KQ(t, i)) : 0.0f; }, S0r,
            [&](int t, int j, float qs) {
                if (j < Dv) z.KT[t * Dv + j] = t < n ? DO(t, j) * (expf(z.Gs[t]) * qs) : 0.0f;
            });
        dc_mm(
            DC_C, Dv, DC_C, [&](int t, int sx) { return sx < n && t < DC_C ? __ldg(s.P + TH(sx) * DC_C + t) : 0.0f; }, dOr,
            [&](int t, int j, float pd) {
                if (j < Dv) z.Ub[t * Dv + j] = t < n ? pd : 0.0f;
            });
        dc_mm(DC_C, Dv, Dk, Kr, dSr, [&](int t, int j, float ks) { /* the same owners as the product before */
                                                                   if (j < Dv && t < n)
                                                                       z.Ub[t * Dv + j] += expf(z.Gs[n - 1] - z.Gs[t]) * ks;
        });
        __syncthreads();
        for (int t = wp; t < DC_C; t += DC_NT / 32) {
            float a = 0;
            for (int j = lane; j < Dv; j += 32) a += z.KT[t * Dv + j];
            a = warp_sum(a);
            if (lane == 0) z.dGo[t] = a;
        }
        __syncthreads();
        /* dP (lower), dW = -dδ S0^T (into Wb), dK̃ = δ dS^T (into KT), dq's direct part γ dO S0^T (pdq) */
        dc_mm(
            DC_C, DC_C, Dv, dOr, [&](int j, int sx) { return j < Dv ? z.D[sx * Dv + j] : 0.0f; },
            [&](int t, int sx, float a) { z.dP[t * L + sx] = sx <= t && t < n ? a : 0.0f; });
        dc_mm(
            DC_C, Dk, Dv, [&](int t, int j) { return j < Dv ? z.Ub[t * Dv + j] : 0.0f; }, S0c,
            [&](int t, int i, float a) {
                if (i < Dk) z.Wb[t * Dk + i] = t < n ? -a : 0.0f;
            });
        dc_mm(
            DC_C, Dk, Dv, [&](int t, int j) { return j < Dv ? z.D[t * Dv + j] : 0.0f; }, dSc,
            [&](int t, int i, float a) {
                if (i < Dk) z.KT[t * Dk + i] = t < n ? a : 0.0f;
            });
        dc_mm(DC_C, Dk, Dv, dOr, S0c, [&](int t, int i, float a) {
            if (i < Dk && t < n) pdq[TH(t) * Dk + i] = expf(z.Gs[t]) * a;
        });
        float sse = 0;
        for (size_t e = tid; e < SZ; e += DC_NT) sse += dS[e] * S0[e];
        sse = block_sum(sse, z.red);
        __syncthreads();
        /* Ū, W̄: backward substitution, a thread per column of [dδ | dW], the rows in registers */
        for (int col = tid; col < Dv + Dk; col += DC_NT) {
            float x[DC_C];
            float *y = col < Dv ? z.Ub + col : z.Wb + (col - Dv);
            int ld = col < Dv ? Dv : Dk;
#pragma unroll
            for (int t = DC_C - 1; t >= 0; t--) {
                float a = t < n ? y[t * ld] : 0.0f;
#pragma unroll
                for (int sx = t + 1; sx < DC_C; sx++) a -= z.Am[sx * L + t] * x[sx];
                x[t] = a;
                if (t < n) y[t * ld] = a;
            }
        }
        __syncthreads();
        /* dA = -(Ū U^T + W̄ W^T), strictly lower: one product over [Ū | W̄] and [U | W] */
        dc_mm(
            DC_C, DC_C, Dv + Dk,
            [&](int t, int k) { return k < Dv     ? z.Ub[t * Dv + k]
                                    : k < Dv + Dk ? z.Wb[t * Dk + k - Dv]
                                                  : 0.0f; },
            [&](int k, int sx) {
                return sx >= n    ? 0.0f
                    : k < Dv      ? __ldg(s.U + TH(sx) * Dv + k)
                    : k < Dv + Dk ? __ldg(s.W + TH(sx) * Dk + k - Dv)
                                  : 0.0f;
            },
            [&](int t, int sx, float a) { z.dA[t * L + sx] = sx < t && t < n ? -a : 0.0f; });
        __syncthreads();
        /* per token: dv, dβ, dG (a warp a row) */
        for (int t = wp; t < n; t += DC_NT / 32) {
            float uv = 0, kw = 0, ak = 0, aa = 0, pp = 0, kk2 = 0, gt = expf(z.Gs[t]), dec = expf(z.Gs[n - 1] - z.Gs[t]);
            for (int j = lane; j < Dv; j += 32) {
                size_t vo = (size_t)(t0 + t) * Cc + 2 * Hk * Dk + (size_t)h * Dv + j;
                float ub = z.Ub[t * Dv + j];
                uv += __bfloat162float(u[vo]) * ub;
                du[vo] = __float2bfloat16(z.Bs[t] * ub);
            }
            for (int i = lane; i < Dk; i += 32) {
                kw += kn[KQ(t, i)] * z.Wb[t * Dk + i];
                kk2 += z.KT[t * Dk + i] * dec * kn[KQ(t, i)];
            }
            for (int sx = lane; sx < n; sx += 32) {
                if (sx < t) ak += z.dA[t * L + sx] * expf(z.Gs[t] - z.Gs[sx]) * z.KK[t * L + sx];
                aa += z.dA[t * L + sx] * z.Am[t * L + sx] - z.dA[sx * L + t] * z.Am[sx * L + t];
                pp += z.dP[t * L + sx] * s.P[TH(t) * DC_C + sx] - z.dP[sx * L + t] * s.P[TH(sx) * DC_C + t];
            }
            uv = warp_sum(uv);
            kw = warp_sum(kw);
            ak = warp_sum(ak);
            aa = warp_sum(aa);
            pp = warp_sum(pp);
            kk2 = warp_sum(kk2);
            if (lane == 0) {
                z.dB[t] = uv + gt * kw + ak;
                z.dGr[t] = z.dGo[t] + z.Bs[t] * gt * kw + aa + pp - kk2;
                z.rk[t] = kk2;
            }
        }
        __syncthreads();
        if (tid == 0) { /* the last token's G scales S0 and every K̃; dg = the reverse cumsum of dG */
            float ex = expf(z.Gs[n - 1]) * sse, a = 0;
            for (int t = 0; t < n; t++) ex += z.rk[t];
            z.dGr[n - 1] += ex;
            for (int t = n - 1; t >= 0; t--) {
                a += z.dGr[t];
                pdg[TH(t)] = a;
                pdb[TH(t)] = z.dB[t];
            }
        }
        __syncthreads();
        /* dk, dq through A, P, W and K̃: the coefficients of K and Q in dk (KK, Am: free now), of K in dq (dA) */
        for (int e = tid; e < DC_C * DC_C; e += DC_NT) {
            int t = e / DC_C, sx = e % DC_C;
            float m1 = 0, m2 = 0;
            if (t < n && sx < n) {
                if (sx < t) m1 = z.dA[t * L + sx] * z.Bs[t] * expf(z.Gs[t] - z.Gs[sx]);
                if (sx > t) m1 = z.dA[sx * L + t] * z.Bs[sx] * expf(z.Gs[sx] - z.Gs[t]);
                if (sx >= t) m2 = z.dP[sx * L + t] * expf(z.Gs[sx] - z.Gs[t]);
            }
            z.KK[t * L + sx] = m1;
            z.Am[t * L + sx] = m2;
        }
        __syncthreads();
        for (int e = tid; e < DC_C * DC_C; e += DC_NT) {
            int t = e / DC_C, sx = e % DC_C;
            z.dA[t * L + sx] = t < n && sx <= t ? z.dP[t * L + sx] * expf(z.Gs[t] - z.Gs[sx]) : 0.0f;
        }
        __syncthreads();
        dc_mm(
            DC_C, Dk, 2 * DC_C, [&](int t, int s2) { return s2 < DC_C ? z.KK[t * L + s2] : z.Am[t * L + s2 - DC_C]; },
            [&](int s2, int i) { return s2 < DC_C              ? Kr(s2, i)
                                     : s2 - DC_C < n && i < Dk ? __ldg(qn + KQ(s2 - DC_C, i))
                                                               : 0.0f; },
            [&](int t, int i, float a) {
                if (t < n && i < Dk)
                    pdk[TH(t) * Dk + i] = a + z.Bs[t] * expf(z.Gs[t]) * z.Wb[t * Dk + i] +
                        expf(z.Gs[n - 1] - z.Gs[t]) * z.KT[t * Dk + i];
            });
        dc_mm(
            DC_C, Dk, DC_C, [&](int t, int sx) { return z.dA[t * L + sx]; }, Kr,
            [&](int t, int i, float a) {
                if (t < n && i < Dk) pdq[TH(t) * Dk + i] += a; /* the owner of the direct part's product (same M, N) */
            });
#undef TH
#undef KQ
#undef DO
    }
}

int dn_chunk_bwd(cu_ctx *c, bf16 *du, float **pdq, float **pdk, float **pdb, float **pdg, float *ck, float *scr, const float *qn,
                 const float *kn, const float *g, const float *beta, const bf16 *dout, const bf16 *u, attn_ranges r,
                 const deltanet_carry &cy, int T, int Hk, int Hv, int Dk, int Dv) {
    long long SZ = (long long)Hv * Dk * Dv, TH = (long long)T * Hv;
    int cap = dc_cap(T), nc = 0;
    float *h0 = scr + dn_chunk_floats(T, Hv, Dk, Dv), *dSe = h0 + cap * SZ;
    *pdq = dSe + cap * SZ;
    *pdk = *pdq + TH * Dk;
    *pdb = *pdk + TH * Dk;
    *pdg = *pdb + TH;
    deltanet_carry kin = cy;
    kin.s_out = NULL; /* the recompute leaves the forward's outputs alone */
    dn_chunk_fwd(c, NULL, ck, h0, cap, scr, qn, kn, g, beta, u, r, kin, T, Hk, Hv, Dk, Dv);
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    CU_CK(c, cudaStreamIsCapturing(c->stream, &cs));
    if (c->failed || cs != cudaStreamCaptureStatusNone) return 0;
    dc_scratch s = dc_carve(scr, T, Hv, Dk, Dv);
    CU_CK(c, cudaMemcpyAsync(&nc, s.nc, sizeof nc, cudaMemcpyDeviceToHost, c->stream));
    CU_CK(c, cudaStreamSynchronize(c->stream));
    if (c->failed || nc > cap) return 0;
    CU_CK(c, cudaFuncSetAttribute(dc_rev_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dc_rev_bytes()));
    dc_rev_kernel<<<dim3(Hv, (Dv + DC_BV - 1) / DC_BV), DC_NT, dc_rev_bytes(), c->stream>>>(dSe, s, qn, kn, dout, r, cy, Hk, Hv,
                                                                                            Dk, Dv);
    CU_LAUNCHED(c, "dc_rev_kernel");
    size_t bytes = dc_grad_bytes(Dk, Dv);
    CU_CK(c, cudaFuncSetAttribute(dc_grad_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    dc_grad_kernel<<<dim3(nc < 4096 ? nc : 4096, Hv), DC_NT, bytes, c->stream>>>(du, *pdq, *pdk, *pdb, *pdg, h0, dSe, s, qn, kn,
                                                                                 beta, dout, u, Hk, Hv, Dk, Dv);
    CU_LAUNCHED(c, "dc_grad_kernel");
    return !c->failed;
}
