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
 *     Dk × 32 columns of S in shared memory: δ = U - W S0 and γ Q S0, o = γ Q S0 + P δ (both
 *     skipped without o: the backward's recompute), S = γ_{n-1} S0 + (e^{G_{n-1}-G} k)^T δ. A
 *     chunk's operands (U's slice, W, q, P, then k) are staged whole in shared memory by cp.async,
 *     each set issued as soon as the chunk before has read its own, so they load while that chunk
 *     computes (the walk had waited for each 32-wide tile: latency-bound). The same sums in the
 *     same order as the tile-by-tile walk: the same bits. A chunk whose first token continues a
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

/* The walk's shared memory (floats, dynamic): the state slice S (DC_DK × DC_BV), δ (DC_C × DC_BV),
 * then the chunk's operands staged whole: U's slice (DC_C × DC_BV), W, q, k (DC_C × DC_DK each), P
 * (DC_C × DC_C), G and the decays (DC_C each). */
enum {
    DW_S = 0,
    DW_D = DW_S + DC_DK * DC_BV,
    DW_U = DW_D + DC_C * DC_BV,
    DW_W = DW_U + DC_C * DC_BV,
    DW_Q = DW_W + DC_C * DC_DK,
    DW_K = DW_Q + DC_C * DC_DK,
    DW_P = DW_K + DC_C * DC_DK,
    DW_G = DW_P + DC_C * DC_C,
    DW_E = DW_G + DC_C,
    DW_FLOATS = DW_E + DC_C
};

/* the loads of chunk c's operands (nothing when c >= nc; o NULL: U, W and k only): `head`, the
 * ones the chunk's first phase reads (U's slice, W, q, P), else k. One cp.async group either way. */
__device__ __forceinline__ void dc_walk_issue(float *sm, const dc_scratch &s, const float *qn, const float *kn, bool out, int c,
                                              int nc, int h, int kh, int jb, int Hk, int Hv, int Dk, int Dv, bool head) {
    if (c < nc) {
        int t0 = s.cst[c], n = s.cst[c + 1] - t0, nv = min(DC_BV, Dv - jb);
        const float *pk = kn + (size_t)kh * Dk, *pu = s.U + (size_t)h * Dv + jb, *pw = s.W + (size_t)h * Dk;
        const float *pq = qn + (size_t)kh * Dk, *pp = s.P + (size_t)h * DC_C;
        size_t lk = (size_t)Hk * Dk, lw = (size_t)Hv * Dk, lu = (size_t)Hv * Dv, lp = (size_t)Hv * DC_C;
        if (head) {
            dc_stage(sm + DW_U, DC_BV, pu, lu, t0, n, nv, dc_vec(pu, lu, nv));
            dc_stage(sm + DW_W, DC_DK, pw, lw, t0, n, Dk, dc_vec(pw, lw, Dk));
            if (out) {
                dc_stage(sm + DW_Q, DC_DK, pq, lk, t0, n, Dk, dc_vec(pq, lk, Dk));
                dc_stage(sm + DW_P, DC_C, pp, lp, t0, n, DC_C, dc_vec(pp, lp, DC_C));
            }
        } else {
            dc_stage(sm + DW_K, DC_DK, pk, lk, t0, n, Dk, dc_vec(pk, lk, Dk));
        }
    }
    fa_commit();
}

static size_t dc_walk_bytes(void) { return DW_FLOATS * sizeof(float); }

__global__ void __launch_bounds__(DC_NT)
    dc_walk_kernel(bf16 *o, float *ck, float *h0, int cap, dc_scratch s, const float *qn, const float *kn, attn_ranges r,
                   deltanet_carry cy, int Hk, int Hv, int Dk, int Dv) {
    extern __shared__ __align__(16) float sm[];
    float(*Ss)[DC_BV] = (float(*)[DC_BV])(sm + DW_S), (*Ds)[DC_BV] = (float(*)[DC_BV])(sm + DW_D);
    float(*Us)[DC_BV] = (float(*)[DC_BV])(sm + DW_U), (*Ws)[DC_DK] = (float(*)[DC_DK])(sm + DW_W);
    float(*Qs)[DC_DK] = (float(*)[DC_DK])(sm + DW_Q), (*Ks)[DC_DK] = (float(*)[DC_DK])(sm + DW_K);
    float(*Ps)[DC_C] = (float(*)[DC_C])(sm + DW_P), *Gs = sm + DW_G, *Dec = sm + DW_E;
    __shared__ int mode_s, slot_tok[DC_SLOTS];
    int h = blockIdx.x, kh = h / (Hv / Hk), tid = threadIdx.x, j = tid & 31, w = tid >> 5, nc = *s.nc;
    int jb = blockIdx.y * DC_BV, jj = jb + j, vj = jj < Dv;
    bool out = o != NULL;
    size_t SZ = (size_t)Dk * Dv;
    for (int e = tid; e < DC_DK * DC_BV; e += DC_NT) Ss[e / DC_BV][e % DC_BV] = 0;
    if (tid < DC_SLOTS) slot_tok[tid] = -1;
    dc_walk_issue(sm, s, qn, kn, out, 0, nc, h, kh, jb, Hk, Hv, Dk, Dv, true);
    dc_walk_issue(sm, s, qn, kn, out, 0, nc, h, kh, jb, Hk, Hv, Dk, Dv, false);
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
        fa_wait<1>(); /* this chunk's U, W, q, P (its k may still be in flight) */
        __syncthreads();
        /* δ = U - W S0 and γ Q S0: rows t = w + 8m, column j (the sums over i in order) */
        float ad[8], ao[8];
#pragma unroll
        for (int m = 0; m < 8; m++) ad[m] = ao[m] = 0;
        if (out) {
#pragma unroll 4
            for (int i = 0; i < Dk; i++) {
                float sv = Ss[i][j];
#pragma unroll
                for (int m = 0; m < 8; m++) {
                    ad[m] += Ws[w + 8 * m][i] * sv;
                    ao[m] += Qs[w + 8 * m][i] * sv;
                }
            }
        } else {
#pragma unroll 4
            for (int i = 0; i < Dk; i++) {
                float sv = Ss[i][j];
#pragma unroll
                for (int m = 0; m < 8; m++) ad[m] += Ws[w + 8 * m][i] * sv;
            }
        }
#pragma unroll
        for (int m = 0; m < 8; m++) {
            int t = w + 8 * m;
            Ds[t][j] = t < n && vj ? Us[t][j] - ad[m] : 0.0f;
            ao[m] *= expf(Gs[t]);
        }
        __syncthreads();
        if (out) { /* o = γ Q S0 + P δ */
#pragma unroll 4
            for (int s0 = 0; s0 < DC_C; s0++) {
                float dv = Ds[s0][j];
#pragma unroll
                for (int m = 0; m < 8; m++) ao[m] += Ps[w + 8 * m][s0] * dv;
            }
#pragma unroll
            for (int m = 0; m < 8; m++) {
                int t = w + 8 * m;
                if (t < n && vj) o[((size_t)(t0 + t) * Hv + h) * Dv + jj] = __float2bfloat16(ao[m]);
            }
        }
        __syncthreads(); /* U, W, q and P are read: the next chunk's go in */
        dc_walk_issue(sm, s, qn, kn, out, c + 1, nc, h, kh, jb, Hk, Hv, Dk, Dv, true);
        /* S = γ_{n-1} S0 + (e^{G_{n-1}-G} k)^T δ: rows w + 8q */
        if (tid < DC_C) Dec[tid] = tid < n ? expf(Gs[n - 1] - Gs[tid]) : 0.0f;
        float gl = expf(Gs[n - 1]);
        fa_wait<1>(); /* this chunk's k (the next chunk's head may be in flight) */
        __syncthreads();
        for (int i = w; i < Dk; i += 8) {
            float a = 0;
#pragma unroll 8
            for (int t = 0; t < DC_C; t++) a += Dec[t] * Ks[t][i] * Ds[t][j];
            Ss[i][j] = gl * Ss[i][j] + a;
        }
        __syncthreads(); /* k is read: the next chunk's goes in */
        dc_walk_issue(sm, s, qn, kn, out, c + 1, nc, h, kh, jb, Hk, Hv, Dk, Dv, false);
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
    fa_wait<0>();
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
    CU_CK(c, cudaFuncSetAttribute(dc_walk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dc_walk_bytes()));
    dc_walk_kernel<<<dim3(Hv, (Dv + DC_BV - 1) / DC_BV), DC_NT, dc_walk_bytes(), c->stream>>>(o, ck, h0, cap, s, qn, kn, r, cy,
                                                                                              Hk, Hv, Dk, Dv);
    CU_LAUNCHED(c, "dc_walk_kernel");
}
