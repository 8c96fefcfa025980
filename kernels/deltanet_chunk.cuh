/* deltanet_chunk.cuh — the chunked forward of the gated delta rule (deltanet_chunk.cu), called by
 * deltanet_rule_fwd_cuda (deltanet.cu) after its prep kernel. Not a public op: include it from
 * deltanet.cu only. Legend as deltanet.h (T, Hk, Hv, Dk, Dv). */
#ifndef GRPOD_KERNELS_DELTANET_CHUNK_CUH
#define GRPOD_KERNELS_DELTANET_CHUNK_CUH
#include "kernels/common.cuh"
#include "kernels/deltanet.h"
#include "kernels/mma.cuh"

/* deltanet_prev_row() on device ranges, token t at row row0 + t (a carry's, deltanet.h): the
 * token of the call it continues, DC_NONE, or DC_CARRY (a row below row0: the carry's state) */
enum { DC_NONE = -1, DC_CARRY = -2 };
__device__ __forceinline__ int dn_prev(attn_ranges r, int row0, int t) {
    int b0 = r.b0[t], b1 = r.b1[t], a0 = r.a0[t], a1 = r.a1[t], row = row0 + t, p;
    if (b1 > b0) p = row > b0 ? row - 1 : (a1 > a0 ? a1 - 1 : -1);
    else p = row > a0 ? row - 1 : -1;
    return p < 0 ? DC_NONE : p >= row0 ? p - row0 : DC_CARRY;
}

enum { DC_C = 64, DC_NT = 256, DC_BV = 32, DC_TK = 32, DC_DK = 128, DC_SLOTS = 8, DC_PLAN = 1024, DC_EXTRA = 64 };

/* the chunked forward's scratch (deltanet_chunk.cu's top comment) */
typedef struct {
    float *W, *U, *P, *G, *slot;
    int *cst, *nc, *ref, *flag;
} dc_scratch;
dc_scratch dc_carve(float *p, int T, int Hv, int Dk, int Dv);

/* where the chunk starting at t0 starts from: DC_CONT (the state the walk holds), DC_NONE
 * (zeros), DC_CARRY (the carry's s_in), else the slot holding the state after token *pp */
enum { DC_CONT = -3 };
__device__ __forceinline__ int dc_mode(const dc_scratch &s, attn_ranges r, int row0, int t0, int *pp) {
    int p = dn_prev(r, row0, t0);
    *pp = p;
    return t0 > 0 && p == t0 - 1 ? DC_CONT : p < 0 ? p : s.ref[p] % DC_SLOTS;
}

/* ---------------------------------------------------------------- tensor cores, fp32-exact
 * C = A B on the block's warps with mma.sync m16n8k8 tf32 and fp32 accumulation, each operand
 * split into a tf32 head and a tf32 tail (x = h + l, |l| <= 2^-11 |x|) and the three products
 * that matter summed (l_a h_b + h_a l_b, then h_a h_b): fp32's accuracy (the tail's own product,
 * 2^-22 relative, is dropped) at tensor-core speed. A(m, k), B(k, n) are functors returning the
 * element (0 outside the matrices: they check their bounds), out(m, n, v) is called once per
 * element of the padded M x N (16 x 8 tiles, a warp's task NB of them side by side: the A
 * fragment's loads and tf32 split serve NB tiles, and NB tiles' loads are in flight at once; it
 * checks its bounds); K is stepped by 8. A tile's owner and its order over k depend only on
 * (M, N): an element's sum is the same bits every run, and two calls of the same M, N give an
 * element to the same thread. */
__device__ __forceinline__ unsigned dc_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ void dc_mma8(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <class FA, class FB, class FO> __device__ __forceinline__ void dc_mm(int M, int N, int K, FA A, FB B, FO out) {
    constexpr int NB = 4; /* a warp's task: 16 rows x NB 8-column tiles, each A fragment feeding NB tiles */
    int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3, tn = (N + 7) / 8, tg = (tn + NB - 1) / NB;
    int ntask = (M + 15) / 16 * tg;
    for (int task = threadIdx.x >> 5; task < ntask; task += blockDim.x >> 5) {
        int m0 = task / tg * 16, b0 = task % tg * NB, nb = min(NB, tn - b0);
        float c[NB][4] = {};
#pragma unroll 2
        for (int k0 = 0; k0 < K; k0 += 8) {
            float av[4] = {A(m0 + g, k0 + q), A(m0 + g + 8, k0 + q), A(m0 + g, k0 + q + 4), A(m0 + g + 8, k0 + q + 4)};
            float bv[NB][2];
#pragma unroll
            for (int b = 0; b < NB; b++)
                if (b < nb) {
                    bv[b][0] = B(k0 + q, (b0 + b) * 8 + g);
                    bv[b][1] = B(k0 + q + 4, (b0 + b) * 8 + g);
                }
            unsigned ah[4], al[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                ah[e] = dc_tf32(av[e]);
                al[e] = dc_tf32(av[e] - __uint_as_float(ah[e]));
            }
#pragma unroll
            for (int b = 0; b < NB; b++)
                if (b < nb) {
                    unsigned bh[2], bl[2];
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        bh[e] = dc_tf32(bv[b][e]);
                        bl[e] = dc_tf32(bv[b][e] - __uint_as_float(bh[e]));
                    }
                    dc_mma8(c[b], al, bh);
                    dc_mma8(c[b], ah, bl);
                    dc_mma8(c[b], ah, bh);
                }
        }
#pragma unroll
        for (int b = 0; b < NB; b++)
            if (b < nb) {
                int n0 = (b0 + b) * 8;
                out(m0 + g, n0 + 2 * q, c[b][0]);
                out(m0 + g, n0 + 2 * q + 1, c[b][1]);
                out(m0 + g + 8, n0 + 2 * q, c[b][2]);
                out(m0 + g + 8, n0 + 2 * q + 1, c[b][3]);
            }
    }
}

/* The walks' two products on shared-memory tiles (X: 64 rows × a 32-wide tile; V: rows × 32
 * columns, this thread's column j). Rows: acc[m] += Σ_ii X[w + 8m][ii] V[ii][j] (rows w + 8m of
 * the 64, V the tile's 32 rows). Columns: Σ_t X[t][ii] V[t][j] over the 64 rows. */
__device__ __forceinline__ void dc_rows_acc(float *acc, const float (*X)[DC_TK + 1], const float (*V)[DC_BV], int w, int j) {
#pragma unroll 4
    for (int ii = 0; ii < DC_TK; ii++) {
        float sv = V[ii][j];
#pragma unroll
        for (int m = 0; m < 8; m++) acc[m] += X[w + 8 * m][ii] * sv;
    }
}
__device__ __forceinline__ float dc_col_dot(const float (*X)[DC_TK + 1], const float (*V)[DC_BV], int ii, int j) {
    float a = 0;
#pragma unroll 8
    for (int t = 0; t < DC_C; t++) a += X[t][ii] * V[t][j];
    return a;
}

/* X[t][ii] = f_t · src[(t0 + t) ld + i0 + ii] for t < n and i0 + ii < D, else 0; f_t = 1 (f NULL),
 * f[t], or e^{f[t]} (fexp): a 32-wide tile of a chunk's rows of q, k or W */
__device__ __forceinline__ void dc_load_tile(float (*X)[DC_TK + 1], const float *src, size_t ld, int t0, int n, int i0, int D,
                                             const float *f, int fexp) {
    for (int e = threadIdx.x; e < DC_C * DC_TK; e += blockDim.x) {
        int t = e / DC_TK, ii = e % DC_TK, i = i0 + ii;
        float v = 0;
        if (t < n && i < D) {
            v = src[(size_t)(t0 + t) * ld + i];
            if (f) v = (fexp ? expf(f[t]) : f[t]) * v;
        }
        X[t][ii] = v;
    }
}

/* X[t][ss] = P[t][c0 + ss] of the chunk at t0 (n rows, zeros below), value head h */
__device__ __forceinline__ void dc_load_p(float (*X)[DC_TK + 1], const dc_scratch &s, int t0, int n, int h, int Hv, int c0) {
    for (int e = threadIdx.x; e < DC_C * DC_TK; e += blockDim.x) {
        int t = e / DC_TK, ss = e % DC_TK;
        X[t][ss] = t < n ? s.P[((size_t)(t0 + t) * Hv + h) * DC_C + c0 + ss] : 0.0f;
    }
}

/* dst[t][i] = src[(t0 + t) ld + i] for t < n, i < D (dst's rows ldd apart), zeros for rows t >= n:
 * 16-byte cp.async when `vec` (D, ld and src 16-byte aligned, the caller's check), else plain
 * loads. The copies land at the caller's next cp.async wait (the walks' staged operands). */
template <class E>
__device__ __forceinline__ void dc_stage(E *dst, int ldd, const E *src, size_t ld, int t0, int n, int D, bool vec) {
    if (vec) {
        int per = 16 / (int)sizeof(E), q4 = D / per;
        for (int e = threadIdx.x; e < DC_C * q4; e += blockDim.x) {
            int t = e / q4, i = e % q4 * per;
            if (t < n) fa_cp16((bf16 *)(dst + t * ldd + i), (const bf16 *)(src + (size_t)(t0 + t) * ld + i), true);
            else *(float4 *)(dst + t * ldd + i) = make_float4(0, 0, 0, 0);
        }
    } else {
        for (int e = threadIdx.x; e < DC_C * D; e += blockDim.x) {
            int t = e / D, i = e % D;
            dst[t * ldd + i] = t < n ? src[(size_t)(t0 + t) * ld + i] : (E)0.0f;
        }
    }
}
/* 16-byte copies of rows of `D` elements `ld` apart from p */
template <class E> __device__ __forceinline__ bool dc_vec(const E *p, size_t ld, int D) {
    return (D * sizeof(E)) % 16 == 0 && (ld * sizeof(E)) % 16 == 0 && !((uintptr_t)p & 15);
}

/* 1 when the chunked forward takes these dims (Dk <= 128; else the recurrent walk runs) */
int dn_chunk_ok(int Dk);
/* the floats of its scratch at T tokens (laid out by dn_chunk_fwd from `scr`) */
long long dn_chunk_floats(int T, int Hv, int Dk, int Dv);
/* o (T,Hv,Dv) written (unless NULL) from qn, kn (T,Hk,Dk), g, beta (T,Hv) (dn_prep_kernel's) and
 * u's v slice; ck (unless NULL): the state after each token ≡ 63 (mod 64), (T/64+1, Hv, Dk, Dv);
 * h0 (unless NULL): chunk c's initial state for c < cap, (cap, Hv, Dk, Dv); cy (deltanet.h, every
 * pointer NULL and row0 0 without one): row0, s_in read, s_out written */
void dn_chunk_fwd(cu_ctx *c, bf16 *o, float *ck, float *h0, int cap, float *scr, const float *qn, const float *kn, const float *g,
                  const float *beta, const bf16 *u, attn_ranges r, const deltanet_carry &cy, int T, int Hk, int Hv, int Dk, int Dv);

/* The chunked backward (deltanet_chunk_bwd.cu): 1 when it takes these dims (Dk, Dv <= 128) */
int dn_chunk_bwd_ok(int Dk, int Dv);
/* the floats of its scratch (dstates) at T tokens */
long long dn_chunk_bwd_floats(int T, int Hv, int Dk, int Dv);
/* The forward again (ck: the recurrent backward's checkpoints, written in any case), then, when the
 * layout's chunks fit the scratch (else 0 is returned: the caller runs the recurrent backward),
 * dv into du's v slice and the partials the recurrent backward's reductions take with one slice:
 * *pdq, *pdk (T,Hv,Dk) the gradients of qn and kn; *pdb (T,Hv) of β; *pdg (T,Hv) of g itself.
 * cy: row0, s_in read, ds_out taken, ds_in += (s_out not written) */
int dn_chunk_bwd(cu_ctx *c, bf16 *du, float **pdq, float **pdk, float **pdb, float **pdg, float *ck, float *scr, const float *qn,
                 const float *kn, const float *g, const float *beta, const bf16 *dout, const bf16 *u, attn_ranges r,
                 const deltanet_carry &cy, int T, int Hk, int Hv, int Dk, int Dv);
#endif
