/* attention_flash.cuh — tensor-core attention (FlashAttention-2 style) for attention.h's two key
 * ranges per query, head dim D = 64 or 128; included by attention.cu only.
 *
 * Every product is mma.sync m16n8k16 (bf16 in, fp32 accumulate) on ldmatrix fragments from
 * shared memory with rows padded by 16 bytes (D + 8 elements: ldmatrix rows land on distinct
 * banks). A block is NW warps (8; 4 with GRPOD_ATTN_NW=4); a warp owns 16 rows of
 * the block's 16 NW-row tile (queries in fwd/dq, keys in dkdv); the other operand streams in
 * 64-row tiles. Two helpers do all the math:
 *   mma_abt: acc (16 x 8NT) += A (16 x KD, smem rows) · B^T, B (8NT x KD, smem rows)
 *   mma_pb:  acc (16 x 8ND) += P (16 x 16KB, fp32 accumulators of an mma_abt, rounded to bf16)
 *            · B (16KB x 8ND, smem rows, read transposed by ldmatrix.trans)
 * Keys of a tile are streamed pass by pass (range a, then range b, as the reference does, so a
 * key inside both ranges counts twice); a tile no query of the block needs is skipped (a block
 * vote), a tile inside every query's range needs no mask (a second vote), others are masked per
 * element with the query's own range — queries of one tile may belong to different responses
 * or groups. K/V tiles are double-buffered with cp.async.
 *   fwd:  block = 16 NW queries x one head; online softmax in fp32 (log2 domain); writes out, lse.
 *   dq:   same blocking; recomputes P from lse, dP = dO·V^T, dS = P(dP - Dsum), dq = scale dS·K;
 *         also writes Dsum = rowsum(dO∘O) for dkdv. No atomics: deterministic.
 *   dkdv: block = 16 NW keys x one kv head; walks every (query tile, head of the group) pair that
 *         sees the tile (qlo/qhi from a scan), S^T = K·Q^T, dP^T = V·dO^T, dV += P^T·dO,
 *         dK += dS^T·Q in fp32 registers — the prompt's dK/dV is the sum over all N responses
 *         and all H/K heads — then one += into the bf16 dk/dv. Deterministic.
 * Legend: T queries (== key rows in backward), H query heads, K kv heads, D head dim. */
#include <limits.h>

/* FA_Q: query rows of a dkdv pair; FA_BN: keys of a fwd/dq tile. A block of NW warps owns
 * 16 NW rows: queries in fwd/dq, keys in dkdv (NW = 8 unless GRPOD_ATTN_NW=4). */
enum { FA_Q = 64, FA_BN = 64 };

__device__ __forceinline__ unsigned fa_smem(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void fa_ldsm4(unsigned (&r)[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(fa_smem(p)));
}
__device__ __forceinline__ void fa_ldsm4t(unsigned (&r)[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(fa_smem(p)));
}
__device__ __forceinline__ void fa_mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* 16 bytes global -> shared; zero-filled when !ok (src is then not read). */
__device__ __forceinline__ void fa_cp16(bf16 *dst, const bf16 *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(fa_smem(dst)), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void fa_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void fa_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
__device__ __forceinline__ float fa_ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ unsigned fa_pack(float lo, float hi) {
    bf162 v = __floats2bfloat162_rn(lo, hi);
    return *(unsigned *)&v;
}

template <int NT, int KD>
__device__ __forceinline__ void mma_abt(float (&acc)[NT][4], const bf16 *a, const bf16 *b, int st) {
    int lane = threadIdx.x & 31, m = lane >> 3, rr = lane & 7;
    #pragma unroll
    for (int kk = 0; kk < KD / 16; kk++) {
        unsigned af[4];
        fa_ldsm4(af, a + (lane & 15) * st + kk * 16 + (lane >> 4) * 8);
        #pragma unroll
        for (int n = 0; n < NT; n += 2) {
            unsigned bf[4];
            fa_ldsm4(bf, b + (n * 8 + (m >> 1) * 8 + rr) * st + kk * 16 + (m & 1) * 8);
            fa_mma(acc[n], af, bf[0], bf[1]);
            fa_mma(acc[n + 1], af, bf[2], bf[3]);
        }
    }
}

template <int KB, int ND>
__device__ __forceinline__ void mma_pb(float (&acc)[ND][4], const float (&p)[2 * KB][4], const bf16 *b, int st) {
    int lane = threadIdx.x & 31, m = lane >> 3, rr = lane & 7;
    #pragma unroll
    for (int kb = 0; kb < KB; kb++) {
        unsigned af[4] = { fa_pack(p[2 * kb][0], p[2 * kb][1]), fa_pack(p[2 * kb][2], p[2 * kb][3]),
                           fa_pack(p[2 * kb + 1][0], p[2 * kb + 1][1]), fa_pack(p[2 * kb + 1][2], p[2 * kb + 1][3]) };
        #pragma unroll
        for (int n = 0; n < ND; n += 2) {
            unsigned bf[4];
            fa_ldsm4t(bf, b + (kb * 16 + (m & 1) * 8 + rr) * st + n * 8 + (m >> 1) * 8);
            fa_mma(acc[n], af, bf[0], bf[1]);
            fa_mma(acc[n + 1], af, bf[2], bf[3]);
        }
    }
}

/* rows [r0, r0 + ROWS) of a (rows, heads, D) tensor at head `hd` into smem (stride D + 8);
 * rows >= end are zero-filled. */
template <int D, int ROWS>
__device__ __forceinline__ void fa_load_rows(bf16 *dst, const bf16 *src, int r0, int end, int heads, int hd) {
    constexpr int C = D / 8;
    for (int i = threadIdx.x; i < ROWS * C; i += blockDim.x) {
        int row = i / C, c = i % C, j = r0 + row;
        bool ok = j < end;
        fa_cp16(dst + row * (D + 8) + c * 8, ok ? src + ((size_t)j * heads + hd) * D + c * 8 : src, ok);
    }
}

/* The key tiles of a query block, pass by pass: per pass s the union [blo[s], bhi[s]) of its
 * queries' ranges; row ranges lo/hi (64 per pass) in shared memory. fa_next advances (s, j0) to
 * the first tile at or after it that some query needs and says whether every query needs all
 * of it (no mask). Every thread calls it (block votes). */
template <int BM>
struct fa_sched {
    int lo[2][BM], hi[2][BM], blo[2], bhi[2];
};
template <int BM>
__device__ __forceinline__ bool fa_next(const fa_sched<BM> &sc, int &s, int &j0, int &full) {
    int row = threadIdx.x & (BM - 1);   /* blockDim = 2 BM */
    while (s < 2) {
        if (j0 < sc.bhi[s]) {
            int lo = sc.lo[s][row], hi = sc.hi[s][row];
            if (__syncthreads_or(max(lo, j0) < min(hi, j0 + FA_BN))) {
                full = __syncthreads_and(lo <= j0 && j0 + FA_BN <= hi);
                return true;
            }
            j0 += FA_BN;
        } else if (++s < 2) {
            j0 = sc.blo[s];
        }
    }
    return false;
}
template <int BM>
__device__ __forceinline__ void fa_sched_load(fa_sched<BM> &sc, attn_ranges r, int t0, int T) {
    if (threadIdx.x < BM) {
        int t = t0 + threadIdx.x, a0 = 0, a1 = 0, b0 = 0, b1 = 0;
        if (t < T) { a0 = r.a0[t]; a1 = r.a1[t]; b0 = r.b0[t]; b1 = r.b1[t]; }
        sc.lo[0][threadIdx.x] = a0; sc.hi[0][threadIdx.x] = a1;
        sc.lo[1][threadIdx.x] = b0; sc.hi[1][threadIdx.x] = b1;
    }
    __syncthreads();
    if (threadIdx.x < 64) {   /* two warps: pass = warp, lanes split the 64 rows */
        int s = threadIdx.x >> 5, lane = threadIdx.x & 31, lo = INT_MAX, hi = INT_MIN;
        for (int i = lane; i < BM; i += 32)
            if (sc.lo[s][i] < sc.hi[s][i]) { lo = min(lo, sc.lo[s][i]); hi = max(hi, sc.hi[s][i]); }
        lo = __reduce_min_sync(FULL, lo);
        hi = __reduce_max_sync(FULL, hi);
        if (lane == 0) { sc.blo[s] = lo; sc.bhi[s] = hi; }
    }
    __syncthreads();
}

/* Scale and mask one 16 x 64 score tile in place (log2 domain): keys outside the row's range of
 * pass s become -inf. Rows of this thread: 16w + g and 16w + g + 8. */
template <int BM>
__device__ __forceinline__ void fa_mask(float (&sacc)[8][4], const fa_sched<BM> &sc, int s, int j0, int full, float sc2) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, r0 = w * 16 + (lane >> 2), c2 = 2 * (lane & 3);
    int lo0 = sc.lo[s][r0], hi0 = sc.hi[s][r0], lo1 = sc.lo[s][r0 + 8], hi1 = sc.hi[s][r0 + 8];
    #pragma unroll
    for (int n = 0; n < 8; n++)
        #pragma unroll
        for (int e = 0; e < 4; e++) {
            float x = sacc[n][e] * sc2;
            if (!full) {
                int j = j0 + n * 8 + c2 + (e & 1), lo = e < 2 ? lo0 : lo1, hi = e < 2 ? hi0 : hi1;
                if (j < lo || j >= hi) x = -INFINITY;
            }
            sacc[n][e] = x;
        }
}

template <int D, int NW>
__global__ void __launch_bounds__(32 * NW) fa_fwd_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                                                       const bf16 *v, attn_ranges r, int T, int H, int K, float sc2) {
    constexpr int ST = D + 8, BM = 16 * NW, TILE = FA_BN * ST;
    extern __shared__ __align__(16) unsigned char fa_dyn[];
    bf16 *q_s = (bf16 *)fa_dyn, *k_s = q_s + BM * ST, *v_s = k_s + 2 * TILE;
    __shared__ fa_sched<BM> sc;
    int h = blockIdx.y, g = h / (H / K), t0 = (gridDim.x - 1 - blockIdx.x) * BM;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    fa_load_rows<D, BM>(q_s, q, t0, T, H, h);
    fa_sched_load(sc, r, t0, T);
    float o[D / 8][4], m0 = -INFINITY, m1 = -INFINITY, l0 = 0, l1 = 0;
    #pragma unroll
    for (int n = 0; n < D / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0;
    int s = 0, j0 = sc.blo[0], full = 0, buf = 0;
    bool have = fa_next(sc, s, j0, full);
    if (have) {
        fa_load_rows<D, FA_BN>(k_s, k, j0, sc.bhi[s], K, g);
        fa_load_rows<D, FA_BN>(v_s, v, j0, sc.bhi[s], K, g);
    }
    fa_commit();
    while (have) {
        int ns = s, nj = j0 + FA_BN, nfull = 0;
        bool nhave = fa_next(sc, ns, nj, nfull);
        if (nhave) {
            fa_load_rows<D, FA_BN>(k_s + (buf ^ 1) * TILE, k, nj, sc.bhi[ns], K, g);
            fa_load_rows<D, FA_BN>(v_s + (buf ^ 1) * TILE, v, nj, sc.bhi[ns], K, g);
        }
        fa_commit();
        fa_wait<1>();
        __syncthreads();
        float sacc[8][4];
        #pragma unroll
        for (int n = 0; n < 8; n++) sacc[n][0] = sacc[n][1] = sacc[n][2] = sacc[n][3] = 0;
        mma_abt<8, D>(sacc, q_s + w * 16 * ST, k_s + buf * TILE, ST);
        fa_mask(sacc, sc, s, j0, full, sc2);
        float mx0 = m0, mx1 = m1;
        #pragma unroll
        for (int n = 0; n < 8; n++) {
            mx0 = fmaxf(mx0, fmaxf(sacc[n][0], sacc[n][1]));
            mx1 = fmaxf(mx1, fmaxf(sacc[n][2], sacc[n][3]));
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(FULL, mx0, 1)); mx0 = fmaxf(mx0, __shfl_xor_sync(FULL, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(FULL, mx1, 1)); mx1 = fmaxf(mx1, __shfl_xor_sync(FULL, mx1, 2));
        float c0 = mx0 == -INFINITY ? 1.0f : fa_ex2(m0 - mx0), c1 = mx1 == -INFINITY ? 1.0f : fa_ex2(m1 - mx1);
        float u0 = mx0 == -INFINITY ? 0.0f : mx0, u1 = mx1 == -INFINITY ? 0.0f : mx1;
        m0 = mx0; m1 = mx1;
        l0 *= c0; l1 *= c1;
        #pragma unroll
        for (int n = 0; n < 8; n++) {
            sacc[n][0] = fa_ex2(sacc[n][0] - u0); sacc[n][1] = fa_ex2(sacc[n][1] - u0);
            sacc[n][2] = fa_ex2(sacc[n][2] - u1); sacc[n][3] = fa_ex2(sacc[n][3] - u1);
            l0 += sacc[n][0] + sacc[n][1];
            l1 += sacc[n][2] + sacc[n][3];
        }
        #pragma unroll
        for (int n = 0; n < D / 8; n++) { o[n][0] *= c0; o[n][1] *= c0; o[n][2] *= c1; o[n][3] *= c1; }
        mma_pb<4, D / 8>(o, sacc, v_s + buf * TILE, ST);
        __syncthreads();
        s = ns; j0 = nj; full = nfull; have = nhave; buf ^= 1;
    }
    fa_wait<0>();
    __syncthreads();   /* q_s is reused below: every thread's copies have landed */
    l0 += __shfl_xor_sync(FULL, l0, 1); l0 += __shfl_xor_sync(FULL, l0, 2);
    l1 += __shfl_xor_sync(FULL, l1, 1); l1 += __shfl_xor_sync(FULL, l1, 2);
    float i0 = l0 > 0 ? 1.0f / l0 : 0.0f, i1 = l1 > 0 ? 1.0f / l1 : 0.0f;
    /* stage the warp's 16 rows in its own rows of q_s, then 16-byte stores */
    bf16 *ow = q_s + w * 16 * ST;
    int gr = lane >> 2, c2 = 2 * (lane & 3);
    #pragma unroll
    for (int n = 0; n < D / 8; n++) {
        *(bf162 *)(ow + gr * ST + n * 8 + c2) = __floats2bfloat162_rn(o[n][0] * i0, o[n][1] * i0);
        *(bf162 *)(ow + (gr + 8) * ST + n * 8 + c2) = __floats2bfloat162_rn(o[n][2] * i1, o[n][3] * i1);
    }
    if ((lane & 3) == 0) {
        int t = t0 + w * 16 + gr;
        if (t < T) lse[(size_t)t * H + h] = l0 > 0 ? (m0 + log2f(l0)) * LN2 : -INFINITY;
        if (t + 8 < T) lse[(size_t)(t + 8) * H + h] = l1 > 0 ? (m1 + log2f(l1)) * LN2 : -INFINITY;
    }
    __syncwarp();
    for (int i = lane; i < 16 * (D / 8); i += 32) {
        int row = i / (D / 8), c = i % (D / 8), t = t0 + w * 16 + row;
        if (t < T) *(uint4 *)(out + ((size_t)t * H + h) * D + c * 8) = *(const uint4 *)(ow + row * ST + c * 8);
    }
}

/* dq = scale Σ_j dS_j k_j with P from lse; writes Dsum (T, H) = rowsum(dO ∘ O) first. */
template <int D, int NW>
__global__ void __launch_bounds__(32 * NW) fa_dq_kernel(bf16 *dq, float *dsum, const bf16 *dout, const bf16 *q,
                                                      const bf16 *k, const bf16 *v, const bf16 *out,
                                                      const float *lse, attn_ranges r, int T, int H, int K,
                                                      float sc2, float scale) {
    constexpr int ST = D + 8, BM = 16 * NW, TILE = FA_BN * ST;
    extern __shared__ __align__(16) unsigned char fa_dyn[];
    bf16 *q_s = (bf16 *)fa_dyn, *do_s = q_s + BM * ST, *k_s = do_s + BM * ST, *v_s = k_s + 2 * TILE;
    __shared__ fa_sched<BM> sc;
    __shared__ float l2_s[BM], ds_s[BM];
    int h = blockIdx.y, g = h / (H / K), t0 = (gridDim.x - 1 - blockIdx.x) * BM;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    fa_load_rows<D, BM>(q_s, q, t0, T, H, h);
    fa_load_rows<D, BM>(do_s, dout, t0, T, H, h);
    for (int i = 0; i < 16; i++) {   /* warp w: rows 16w .. 16w+15 */
        int row = w * 16 + i, t = t0 + row;
        float acc = 0;
        if (t < T) {
            const bf162 *o2 = (const bf162 *)(out + ((size_t)t * H + h) * D), *d2 = (const bf162 *)(dout + ((size_t)t * H + h) * D);
            for (int d = lane; d < D / 2; d += 32) {
                float2 a = __bfloat1622float2(o2[d]), b = __bfloat1622float2(d2[d]);
                acc += a.x * b.x + a.y * b.y;
            }
        }
        acc = warp_sum(acc);
        if (lane == 0) {
            ds_s[row] = acc;
            float L = t < T ? lse[(size_t)t * H + h] : 0.0f;
            l2_s[row] = L == -INFINITY ? INFINITY : L * LOG2E;   /* a query with no keys: P = 0 */
            if (t < T) dsum[(size_t)t * H + h] = acc;
        }
    }
    fa_sched_load(sc, r, t0, T);
    int gr = lane >> 2, r0 = w * 16 + gr;
    float L0 = l2_s[r0], L1 = l2_s[r0 + 8], D0 = ds_s[r0], D1 = ds_s[r0 + 8];
    float acc[D / 8][4];
    #pragma unroll
    for (int n = 0; n < D / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0;
    int s = 0, j0 = sc.blo[0], full = 0, buf = 0;
    bool have = fa_next(sc, s, j0, full);
    if (have) {
        fa_load_rows<D, FA_BN>(k_s, k, j0, sc.bhi[s], K, g);
        fa_load_rows<D, FA_BN>(v_s, v, j0, sc.bhi[s], K, g);
    }
    fa_commit();
    while (have) {
        int ns = s, nj = j0 + FA_BN, nfull = 0;
        bool nhave = fa_next(sc, ns, nj, nfull);
        if (nhave) {
            fa_load_rows<D, FA_BN>(k_s + (buf ^ 1) * TILE, k, nj, sc.bhi[ns], K, g);
            fa_load_rows<D, FA_BN>(v_s + (buf ^ 1) * TILE, v, nj, sc.bhi[ns], K, g);
        }
        fa_commit();
        fa_wait<1>();
        __syncthreads();
        float sa[8][4], dp[8][4];
        #pragma unroll
        for (int n = 0; n < 8; n++)
            #pragma unroll
            for (int e = 0; e < 4; e++) sa[n][e] = dp[n][e] = 0;
        mma_abt<8, D>(sa, q_s + w * 16 * ST, k_s + buf * TILE, ST);
        mma_abt<8, D>(dp, do_s + w * 16 * ST, v_s + buf * TILE, ST);
        fa_mask(sa, sc, s, j0, full, sc2);
        #pragma unroll
        for (int n = 0; n < 8; n++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                float P = fa_ex2(sa[n][e] - (e < 2 ? L0 : L1));
                sa[n][e] = P * (dp[n][e] - (e < 2 ? D0 : D1));
            }
        mma_pb<4, D / 8>(acc, sa, k_s + buf * TILE, ST);
        __syncthreads();
        s = ns; j0 = nj; full = nfull; have = nhave; buf ^= 1;
    }
    fa_wait<0>();
    int c2 = 2 * (lane & 3), t = t0 + r0;
    #pragma unroll
    for (int n = 0; n < D / 8; n++) {
        if (t < T) *(bf162 *)(dq + ((size_t)t * H + h) * D + n * 8 + c2) = __floats2bfloat162_rn(acc[n][0] * scale, acc[n][1] * scale);
        if (t + 8 < T)
            *(bf162 *)(dq + ((size_t)(t + 8) * H + h) * D + n * 8 + c2) = __floats2bfloat162_rn(acc[n][2] * scale, acc[n][3] * scale);
    }
}

/* Per (query tile, head) pair of a dkdv block: row scalars (lse in log2 units, Dsum, ranges). */
struct fa_qrows {
    float l2[FA_Q], ds[FA_Q];
    int rg[FA_Q][4];
};

template <int D, int NW>
__global__ void __launch_bounds__(32 * NW) fa_dkdv_kernel(bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q,
                                                        const bf16 *k, const bf16 *v, const float *lse,
                                                        const float *dsum, const int *qlo, const int *qhi,
                                                        attn_ranges r, int T, int H, int K, float sc2, float scale) {
    constexpr int ST = D + 8, BK = 16 * NW, TILE = FA_Q * ST;
    extern __shared__ __align__(16) unsigned char fa_dyn[];
    bf16 *k_s = (bf16 *)fa_dyn, *v_s = k_s + BK * ST, *q_s = v_s + BK * ST, *do_s = q_s + 2 * TILE;
    __shared__ fa_qrows qr[2];
    int kt = blockIdx.x, g = blockIdx.y, j0 = kt * BK, rep = H / K;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, gr = lane >> 2, c2 = 2 * (lane & 3);
    int t_lo = qlo[kt], t_hi = qhi[kt], ntile = (t_hi - t_lo + FA_Q - 1) / FA_Q, npair = ntile * rep;
    fa_load_rows<D, BK>(k_s, k, j0, T, K, g);
    fa_load_rows<D, BK>(v_s, v, j0, T, K, g);
    float dka[D / 8][4], dva[D / 8][4];
    #pragma unroll
    for (int n = 0; n < D / 8; n++)
        #pragma unroll
        for (int e = 0; e < 4; e++) dka[n][e] = dva[n][e] = 0;
    /* pair i: query tile i / rep, head g*rep + i % rep; loads the Q/dO tile (cp.async) and the
     * row scalars; returns whether this thread's row covers the whole key tile. */
    auto load_pair = [&](int i, int b) -> int {
        int tb = t_lo + (i / rep) * FA_Q, h = g * rep + i % rep;
        fa_load_rows<D, FA_Q>(q_s + b * TILE, q, tb, t_hi, H, h);
        fa_load_rows<D, FA_Q>(do_s + b * TILE, dout, tb, t_hi, H, h);
        int cover = 1;
        if (threadIdx.x < FA_Q) {
            int t = tb + threadIdx.x, a0 = 0, a1 = 0, b0 = 0, b1 = 0;
            float l2 = INFINITY, ds = 0;
            if (t < t_hi) {
                a0 = r.a0[t]; a1 = r.a1[t]; b0 = r.b0[t]; b1 = r.b1[t];
                l2 = lse[(size_t)t * H + h] * LOG2E;
                ds = dsum[(size_t)t * H + h];
            }
            fa_qrows &x = qr[b];
            x.l2[threadIdx.x] = l2; x.ds[threadIdx.x] = ds;
            x.rg[threadIdx.x][0] = a0; x.rg[threadIdx.x][1] = a1; x.rg[threadIdx.x][2] = b0; x.rg[threadIdx.x][3] = b1;
            cover = (a0 <= j0 && j0 + BK <= a1) != (b0 <= j0 && j0 + BK <= b1) &&
                    !(max(a0, j0) < min(a1, j0 + BK) && max(b0, j0) < min(b1, j0 + BK));
        }
        return cover;
    };
    int cover = npair > 0 ? load_pair(0, 0) : 1;
    fa_commit();
    for (int i = 0; i < npair; i++) {
        int b = i & 1, ncover = 1;
        if (i + 1 < npair) ncover = load_pair(i + 1, b ^ 1);   /* buffer b^1 was released by the last barrier */
        fa_commit();
        fa_wait<1>();
        int full = __syncthreads_and(cover);
        const fa_qrows &x = qr[b];
        float sa[8][4], dp[8][4];
        #pragma unroll
        for (int n = 0; n < 8; n++)
            #pragma unroll
            for (int e = 0; e < 4; e++) sa[n][e] = dp[n][e] = 0;
        mma_abt<8, D>(sa, k_s + w * 16 * ST, q_s + b * TILE, ST);    /* S^T: rows keys, cols queries */
        mma_abt<8, D>(dp, v_s + w * 16 * ST, do_s + b * TILE, ST);
        int key0 = j0 + w * 16 + gr;
        #pragma unroll
        for (int n = 0; n < 8; n++)
            #pragma unroll
            for (int e = 0; e < 4; e++) {
                int qc = n * 8 + c2 + (e & 1), j = key0 + (e >> 1) * 8;
                float mult = 1.0f;
                if (!full)
                    mult = (float)((j >= x.rg[qc][0] && j < x.rg[qc][1]) + (j >= x.rg[qc][2] && j < x.rg[qc][3]));
                float P = mult != 0.0f ? fa_ex2(sa[n][e] * sc2 - x.l2[qc]) * mult : 0.0f;
                sa[n][e] = P;
                dp[n][e] = P * (dp[n][e] - x.ds[qc]);
            }
        mma_pb<4, D / 8>(dva, sa, do_s + b * TILE, ST);
        mma_pb<4, D / 8>(dka, dp, q_s + b * TILE, ST);
        __syncthreads();
        cover = ncover;
    }
    fa_wait<0>();
    #pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        int j = j0 + w * 16 + gr + hf * 8;
        if (j >= T) continue;
        bf16 *dkr = dk + ((size_t)j * K + g) * D, *dvr = dv + ((size_t)j * K + g) * D;
        #pragma unroll
        for (int n = 0; n < D / 8; n++) {
            bf162 *pk = (bf162 *)(dkr + n * 8 + c2), *pv = (bf162 *)(dvr + n * 8 + c2);
            float2 a = __bfloat1622float2(*pk), bb = __bfloat1622float2(*pv);
            *pk = __floats2bfloat162_rn(a.x + dka[n][2 * hf] * scale, a.y + dka[n][2 * hf + 1] * scale);
            *pv = __floats2bfloat162_rn(bb.x + dva[n][2 * hf], bb.y + dva[n][2 * hf + 1]);
        }
    }
}
