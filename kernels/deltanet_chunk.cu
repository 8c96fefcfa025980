/* deltanet_chunk.cu — the gated delta rule's forward in chunks (the WY / UT form of
 * transformers' torch_chunk_gated_delta_rule and flash-linear-attention's chunk_gated_delta_rule,
 * rederived here for the packed layout), fp32 state and accumulation, no float atomics.
 *
 * Within a chunk of n <= 64 tokens of one run (local t = 0..n-1) starting from state S0, with
 * G_t = g_0 + .. + g_t (the inclusive sum of the log decays) and γ_t = e^{G_t}, the recurrence of
 * deltanet.h unrolls to
 *   S_t = γ_t S0 + Σ_{s<=t} e^{G_t-G_s} k_s δ_s^T,       δ = U - W S0   (rows δ_t, U_t, W_t), where
 *   U_t = β_t v_t     - Σ_{s<t} A_ts U_s,                A_ts = β_t e^{G_t-G_s} (k_t · k_s)
 *   W_t = β_t γ_t k_t - Σ_{s<t} A_ts W_s                 (forward substitution: (I + A)^{-1})
 *   o_t = γ_t S0^T q_t + Σ_{s<=t} P_ts δ_s,              P_ts = e^{G_t-G_s} (q_t · k_s)
 *   S_end = γ_{n-1} S0 + Σ_s e^{G_{n-1}-G_s} k_s δ_s^T.
 * U, W and P depend on the chunk alone (every chunk and value head in parallel); only S0 → S_end
 * is sequential, a matrix product per chunk instead of 64 dependent token updates.
 *
 *   - dc_plan_kernel (one block): the chunks. A run (deltanet_prev(t) != t - 1 starts one) is cut
 *     at every multiple of 64 (so no chunk is longer, and a token ≡ 63 mod 64 ends a chunk: the
 *     recurrent backward's checkpoints) and after every token some later token continues (a
 *     prompt's last: its responses' first tokens continue it), so such a token ends a chunk and a
 *     prompt whose length is not a multiple of 64 ends in a partial chunk. Chunk starts (cst) and each
 *     continued token's ordinal (ref, -1: none) by a block-wide scan: same layout, same chunks.
 *   - dc_wy_kernel: grid (chunks, Hv): the cumulative G, the Gram matrices k·k and q·k of the
 *     chunk (32-wide tiles in shared memory), A and P, then U and W by forward substitution, one
 *     thread per column of [v | k], the 64 rows in registers.
 *   - dc_walk_kernel: grid (Hv, ⌈Dv/32⌉): a block walks the chunks in token order with its
 *     Dk × 32 columns of S in shared memory: δ = U - W S0 and γ Q S0 (tiles of W and Q), o =
 *     γ Q S0 + P δ, S = γ_{n-1} S0 + (e^{G_{n-1}-G} k)^T δ. A chunk whose first token continues a
 *     token other than its predecessor starts from the state saved after that token (one of
 *     DC_SLOTS slots, by ordinal: a packed batch has one live prompt at a time; a slot reused
 *     before its responses are done traps, a sticky error), from the carry's s_in (a token
 *     continuing a row below the carry's row0: deltanet.h) or from zeros; the carry's s_out gets
 *     the state after the last chunk. With `ck` it also writes
 *     the state after every token ≡ 63 (mod 64) there: the recurrent backward's checkpoints
 *     (deltanet.cu), without the output when o is NULL; with h0, each chunk's initial state (the
 *     chunked backward's, deltanet_chunk_bwd.cu).
 * Scratch (dn_chunk_floats): W (T,Hv,Dk), U (T,Hv,Dv), P (T,Hv,64), G (T,Hv), the slots
 * (DC_SLOTS,Hv,Dk,Dv), then ints cst (T+1), nc, ref (T), flag (T+1). Every sum has one owner and
 * a fixed order (same bits twice). CUDA cores here: the products are small (64 × Dk × 32 a
 * chunk) and the walk's parallelism (Hv × Dv/32 blocks) is what bounds it; the backward's
 * per-chunk products run on tensor cores (dc_mm, deltanet_chunk.cuh). */
#include "kernels/deltanet_chunk.cuh"


int dn_chunk_ok(int Dk) { return Dk >= 1 && Dk <= DC_DK; }

long long dn_chunk_floats(int T, int Hv, int Dk, int Dv) {
    long long TH = (long long)T * Hv;
    return TH * (Dk + Dv + DC_C + 1) + (long long)DC_SLOTS * Hv * Dk * Dv + 3LL * T + 3;
}

dc_scratch dc_carve(float *p, int T, int Hv, int Dk, int Dv) {
    long long TH = (long long)T * Hv;
    dc_scratch s;
    s.W = p;
    s.U = s.W + TH * Dk;
    s.P = s.U + TH * Dv;
    s.G = s.P + TH * DC_C;
    s.slot = s.G + TH;
    s.cst = (int *)(s.slot + (long long)DC_SLOTS * Hv * Dk * Dv);
    s.nc = s.cst + T + 1;
    s.ref = s.nc + 1;
    s.flag = s.ref + T;
    return s;
}

/* ---------------------------------------------------------------- the chunks */

/* row0: the carry's (token t is row row0 + t; the ranges index rows) */
__device__ __forceinline__ int dc_starts(const dc_scratch &s, attn_ranges r, int row0, int t) {
    return t % DC_C == 0 || dn_prev(r, row0, t) != t - 1 || (__ldcg(s.flag + t) & 1);
}

__global__ void __launch_bounds__(DC_PLAN) dc_plan_kernel(dc_scratch s, attn_ranges r, int row0, int T) {
    __shared__ int cnt[DC_PLAN], rcnt[DC_PLAN];
    int tid = threadIdx.x;
    for (int t = tid; t <= T; t += DC_PLAN) s.flag[t] = 0;
    __syncthreads();
    for (int t = tid; t < T; t += DC_PLAN) { /* flag bit 0: a chunk starts here; bit 1: continued */
        int p = dn_prev(r, row0, t);
        if (p >= 0 && p != t - 1) {
            atomicOr(s.flag + p + 1, 1);
            atomicOr(s.flag + p, 2);
        }
    }
    __syncthreads();
    int per = (T + DC_PLAN - 1) / DC_PLAN, a = tid * per, b = min(T, a + per), ns = 0, nr = 0;
    for (int t = a; t < b; t++) {
        ns += dc_starts(s, r, row0, t);
        nr += (__ldcg(s.flag + t) >> 1) & 1; /* L2: the atomics' values */
    }
    cnt[tid] = ns;
    rcnt[tid] = nr;
    __syncthreads();
    if (tid == 0) {
        int x = 0, y = 0;
        for (int i = 0; i < DC_PLAN; i++) {
            int cx = cnt[i], cy = rcnt[i];
            cnt[i] = x;
            rcnt[i] = y;
            x += cx;
            y += cy;
        }
        *s.nc = x;
        s.cst[x] = T;
    }
    __syncthreads();
    ns = cnt[tid];
    nr = rcnt[tid];
    for (int t = a; t < b; t++) {
        if (dc_starts(s, r, row0, t)) s.cst[ns++] = t;
        s.ref[t] = (__ldcg(s.flag + t) & 2) ? nr++ : -1;
    }
}

/* ---------------------------------------------------------------- U, W, P of every chunk */

__global__ void __launch_bounds__(DC_NT) dc_wy_kernel(dc_scratch s, const float *qn, const float *kn, const float *g,
                                                      const float *beta, const bf16 *u, int Hk, int Hv, int Dk, int Dv) {
    __shared__ float Am[DC_C][DC_C + 1], Kt[DC_C][DC_TK + 1], Qt[DC_C][DC_TK + 1], Gs[DC_C], Bs[DC_C];
    int h = blockIdx.y, kh = h / (Hv / Hk), tid = threadIdx.x, tx = tid & 15, ty = tid >> 4, nc = *s.nc;
    int Cc = 2 * Hk * Dk + Hv * Dv;
    for (int c = blockIdx.x; c < nc; c += gridDim.x) {
        int t0 = s.cst[c], n = s.cst[c + 1] - t0;
        __syncthreads();
        if (tid == 0) {
            float acc = 0;
            for (int t = 0; t < n; t++) {
                size_t th = (size_t)(t0 + t) * Hv + h;
                acc += g[th];
                Gs[t] = acc;
                Bs[t] = beta[th];
                s.G[th] = acc;
            }
        }
        float kk[4][4], qk[4][4];
#pragma unroll
        for (int m = 0; m < 4; m++)
#pragma unroll
            for (int l = 0; l < 4; l++) kk[m][l] = qk[m][l] = 0;
        for (int i0 = 0; i0 < Dk; i0 += DC_TK) {
            __syncthreads();
            dc_load_tile(Kt, kn + (size_t)kh * Dk, (size_t)Hk * Dk, t0, n, i0, Dk, NULL, 0);
            dc_load_tile(Qt, qn + (size_t)kh * Dk, (size_t)Hk * Dk, t0, n, i0, Dk, NULL, 0);
            __syncthreads();
            for (int ii = 0; ii < DC_TK; ii++)
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    float kr = Kt[ty + 16 * m][ii], qr = Qt[ty + 16 * m][ii];
#pragma unroll
                    for (int l = 0; l < 4; l++) {
                        float kc = Kt[tx + 16 * l][ii];
                        kk[m][l] += kr * kc;
                        qk[m][l] += qr * kc;
                    }
                }
        }
#pragma unroll
        for (int m = 0; m < 4; m++)
#pragma unroll
            for (int l = 0; l < 4; l++) {
                int t = ty + 16 * m, sx = tx + 16 * l;
                float av = 0, pv = 0;
                if (t < n && sx <= t) {
                    float e = expf(Gs[t] - Gs[sx]);
                    pv = e * qk[m][l];
                    if (sx < t) av = Bs[t] * e * kk[m][l];
                }
                Am[t][sx] = av;
                if (t < n) s.P[((size_t)(t0 + t) * Hv + h) * DC_C + sx] = pv;
            }
        __syncthreads();
        for (int col = tid; col < Dk + Dv; col += DC_NT) { /* col < Dv: U's column; else W's col - Dv */
            float x[DC_C];
#pragma unroll
            for (int t = 0; t < DC_C; t++) {
                float acc = 0;
                size_t th = (size_t)(t0 + t) * Hv + h;
                if (t < n)
                    acc = col < Dv ? Bs[t] * __bfloat162float(u[(size_t)(t0 + t) * Cc + 2 * Hk * Dk + (size_t)h * Dv + col])
                                   : Bs[t] * expf(Gs[t]) * kn[((size_t)(t0 + t) * Hk + kh) * Dk + col - Dv];
#pragma unroll
                for (int sx = 0; sx < t; sx++) acc -= Am[t][sx] * x[sx];
                x[t] = acc;
                if (t < n) {
                    if (col < Dv) s.U[th * Dv + col] = acc;
                    else s.W[th * Dk + col - Dv] = acc;
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- the walk over chunks */

__global__ void __launch_bounds__(DC_NT)
    dc_walk_kernel(bf16 *o, float *ck, float *h0, int cap, dc_scratch s, const float *qn, const float *kn, attn_ranges r,
                   deltanet_carry cy, int Hk, int Hv, int Dk, int Dv) {
    __shared__ float Ss[DC_DK][DC_BV], Ds[DC_C][DC_BV], X[DC_C][DC_TK + 1], Y[DC_C][DC_TK + 1], Gs[DC_C], Dec[DC_C];
    __shared__ int mode_s, slot_tok[DC_SLOTS];
    int h = blockIdx.x, kh = h / (Hv / Hk), tid = threadIdx.x, j = tid & 31, w = tid >> 5, nc = *s.nc;
    int jj = blockIdx.y * DC_BV + j, vj = jj < Dv;
    size_t SZ = (size_t)Dk * Dv;
    for (int e = tid; e < DC_DK * DC_BV; e += DC_NT) Ss[e / DC_BV][e % DC_BV] = 0;
    if (tid < DC_SLOTS) slot_tok[tid] = -1;
    for (int c = 0; c < nc; c++) {
        int t0 = s.cst[c], n = s.cst[c + 1] - t0;
        __syncthreads();
        if (tid == 0) { /* dc_mode's */
            int p, md = dc_mode(s, r, cy.row0, t0, &p);
            if (md >= 0 && slot_tok[md] != p) __trap(); /* the slot was reused: not a packed layout */
            mode_s = md;
        }
        if (tid < DC_C) Gs[tid] = tid < n ? s.G[(size_t)(t0 + tid) * Hv + h] : 0.0f;
        __syncthreads();
        int md = mode_s;
        if (md != DC_CONT) {
            const float *src = md >= 0 ? s.slot + (size_t)(md * Hv + h) * SZ : md == DC_CARRY ? cy.s_in + h * SZ : NULL;
            for (int i = w; i < Dk; i += 8) Ss[i][j] = src && vj ? src[(size_t)i * Dv + jj] : 0.0f;
        }
        if (h0 && c < cap && vj) /* the chunk's initial state, for the chunked backward (own elements) */
            for (int i = w; i < Dk; i += 8) h0[((size_t)c * Hv + h) * SZ + (size_t)i * Dv + jj] = Ss[i][j];
        /* δ = U - W S0 and γ Q S0: rows t = w + 8m, column j */
        float ad[8], ao[8];
#pragma unroll
        for (int m = 0; m < 8; m++) ad[m] = ao[m] = 0;
        for (int i0 = 0; i0 < Dk; i0 += DC_TK) {
            __syncthreads();
            dc_load_tile(X, s.W + (size_t)h * Dk, (size_t)Hv * Dk, t0, n, i0, Dk, NULL, 0);
            dc_load_tile(Y, qn + (size_t)kh * Dk, (size_t)Hk * Dk, t0, n, i0, Dk, NULL, 0);
            __syncthreads();
            dc_rows_acc(ad, X, Ss + i0, w, j);
            dc_rows_acc(ao, Y, Ss + i0, w, j);
        }
#pragma unroll
        for (int m = 0; m < 8; m++) {
            int t = w + 8 * m;
            Ds[t][j] = t < n && vj ? s.U[((size_t)(t0 + t) * Hv + h) * Dv + jj] - ad[m] : 0.0f;
            ao[m] *= expf(Gs[t]);
        }
        /* o = γ Q S0 + P δ */
        for (int s0 = 0; s0 < DC_C; s0 += DC_TK) {
            __syncthreads();
            dc_load_p(X, s, t0, n, h, Hv, s0);
            __syncthreads();
            dc_rows_acc(ao, X, Ds + s0, w, j);
        }
#pragma unroll
        for (int m = 0; m < 8; m++) {
            int t = w + 8 * m;
            if (o && t < n && vj) o[((size_t)(t0 + t) * Hv + h) * Dv + jj] = __float2bfloat16(ao[m]);
        }
        /* S = γ_{n-1} S0 + (e^{G_{n-1}-G} k)^T δ: rows i0 + w + 8q of tile i0 */
        if (tid < DC_C) Dec[tid] = tid < n ? expf(Gs[n - 1] - Gs[tid]) : 0.0f;
        float gl = expf(Gs[n - 1]);
        for (int i0 = 0; i0 < Dk; i0 += DC_TK) {
            __syncthreads();
            dc_load_tile(X, kn + (size_t)kh * Dk, (size_t)Hk * Dk, t0, n, i0, Dk, Dec, 0);
            __syncthreads();
#pragma unroll
            for (int q = 0; q < DC_TK / 8; q++) {
                int ii = w + 8 * q;
                Ss[i0 + ii][j] = gl * Ss[i0 + ii][j] + dc_col_dot(X, Ds, ii, j);
            }
        }
        int last = t0 + n - 1, rf = s.ref[last];
        if (rf >= 0) { /* a later run continues this token: save the state (own elements) */
            int sl = rf % DC_SLOTS;
            if (vj)
                for (int i = w; i < Dk; i += 8) s.slot[(size_t)(sl * Hv + h) * SZ + (size_t)i * Dv + jj] = Ss[i][j];
            if (tid == 0) slot_tok[sl] = last;
        }
        if (ck && last % DC_C == DC_C - 1 && vj) /* the recurrent backward's checkpoint (deltanet.cu) */
            for (int i = w; i < Dk; i += 8) ck[((size_t)(last / DC_C) * Hv + h) * SZ + (size_t)i * Dv + jj] = Ss[i][j];
    }
    if (cy.s_out && vj) /* the state after the call's last token (own elements) */
        for (int i = w; i < Dk; i += 8) cy.s_out[h * SZ + (size_t)i * Dv + jj] = Ss[i][j];
}

void dn_chunk_fwd(cu_ctx *c, bf16 *o, float *ck, float *h0, int cap, float *scr, const float *qn, const float *kn, const float *g,
                  const float *beta, const bf16 *u, attn_ranges r, const deltanet_carry &cy, int T, int Hk, int Hv, int Dk, int Dv) {
    dc_scratch s = dc_carve(scr, T, Hv, Dk, Dv);
    dc_plan_kernel<<<1, DC_PLAN, 0, c->stream>>>(s, r, cy.row0, T);
    CU_LAUNCHED(c, "dc_plan_kernel");
    dc_wy_kernel<<<dim3(T < 4096 ? T : 4096, Hv), DC_NT, 0, c->stream>>>(s, qn, kn, g, beta, u, Hk, Hv, Dk, Dv);
    CU_LAUNCHED(c, "dc_wy_kernel");
    dc_walk_kernel<<<dim3(Hv, (Dv + DC_BV - 1) / DC_BV), DC_NT, 0, c->stream>>>(o, ck, h0, cap, s, qn, kn, r, cy, Hk, Hv, Dk, Dv);
    CU_LAUNCHED(c, "dc_walk_kernel");
}
