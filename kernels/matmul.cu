/* matmul.cu — the linear layer on cuBLASLt: y = x W^T + b with W (O,I) row-major as HF stores
 * it, bf16 operands, fp32 accumulation; the bias rides the GEMM's epilogue. Backward adds dinp
 * (bf16, beta = 1) and accumulates dW into fp32 (beta = 1); dbias is a column-sum kernel.
 *
 * Row-major <-> column-major: a row-major (r,c) matrix is a column-major (c,r) one, so
 *   fwd   y^T (O,T)  = W^T' · x^T     : transa=T, m=O, n=T, k=I
 *   dinp  dx^T (I,T) += W^T · dy^T    : m=I, n=T, k=O
 *   dW    dW^T (I,O) += x^T · dy      : transb=T, m=I, n=O, k=T
 * Matmul descriptors, layouts and the heuristic's algorithm are cached per shape (a few dozen
 * distinct shapes per model), so a step runs no heuristic queries after the first. A shape the
 * heuristic has no algorithm for (leading dimensions that break its alignment rules, e.g. an
 * odd vocabulary) falls back to cublasGemmEx, with the bias added by a kernel.
 *
 * Deterministic: a shape always runs the heuristic's first choice, a function of the shape, the
 * alignment and the workspace size (all fixed), so a GEMM gives the same bits in every process
 * and a replayed update equals the original (docs/api.md "Crashes and replay"). No algorithm is
 * chosen by timing: the 16 candidates differ in their reduction order (13 of 159 on the tiny
 * model gave other bits), so a timed choice differed from one process to the next
 * (tests/gpu/test_determinism.c; docs/benchmarks.md, "CUDA replay bit-equal").
 *
 * Exact mode (tune.exact): the linear layers (matmul_fwd_n, mlp_in_fwd) run the in-house kernels
 * of one reduction order, the few-row kernel for few rows and matmul_exact.cu for many
 * (exact_fwd below). What else calls gemm_lt as a forward x W^T (transa = 1, transb = 0: n = T
 * rows of the row-major activations: the logprob head, the MoE router, a low-rank term's second
 * half) runs ONE algorithm for every n: the heuristic's first choice for the shape at
 * n = GEMM_EXACT_N, without split-K (reduction scheme none, split 1), alignment taken as 16 bytes,
 * so each output row sees one tile shape and one K order whatever the batch beside it. A shape
 * with no such algorithm runs exact_gemm_kernel (one thread an output, K in order), never
 * cublasGemmEx, whose choice depends on n. The backward's GEMMs (transa = 0 or transb = 1) are
 * not on a row's logprob: they run as outside exact mode. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>

#include "kernels/bf16_vec.cuh"
#include "kernels/matmul.cuh"
#include "kernels/matmul_order.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/swiglu.cuh"

typedef struct {
    int transa, transb, m, n, k, lda, ldb, ldd, d_f32, bias, align, exact;
} gemm_key;

typedef struct {
    gemm_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
    int fallback; /* no cuBLASLt algorithm: cublasGemmEx (exact mode: exact_gemm_kernel) */
} gemm_plan;

/* exact mode: the n whose algorithm every n runs. Measured on an H200 when the linear layers ran
 * it too (Qwen3-1.7B dims; decode G=1 P=1024 N=16, update P=4096 N=16 R=512): 4096 kept the update
 * at 590 ms (592 off) but decoded at 6.61 ms/step (1.73 off: its tiles left most SMs idle at 16
 * rows of a 2048-output layer); 256 decoded at 3.06 ms/step with the update at 723 ms; 64 at
 * 6.28 ms/step. */
enum { GEMM_EXACT_N = 256 };
/* the reference n of a wide GEMM (m >= 32768 outputs: the logprob head), whose many m tiles fill
 * the SMs at any n (an experiment's build sets it; the same for every T either way) */
#ifndef GEMM_EXACT_N_WIDE
#define GEMM_EXACT_N_WIDE GEMM_EXACT_N
#endif
static int exact_ref_n(int m) { return m >= 32768 ? GEMM_EXACT_N_WIDE : GEMM_EXACT_N; }

enum { GEMM_CACHE = 128 };
typedef struct {
    gemm_plan p[GEMM_CACHE];
    int n;
} gemm_cache; /* one per cu_ctx: its thread only */

static void plan_destroy(gemm_plan *p) {
    cublasLtMatmulDescDestroy(p->op);
    cublasLtMatrixLayoutDestroy(p->a);
    cublasLtMatrixLayoutDestroy(p->b);
    cublasLtMatrixLayoutDestroy(p->d);
}

void gemm_cache_free(cu_ctx *c) {
    gemm_cache *gc = (gemm_cache *)c->gemm_cache;
    if (!gc) return;
    for (int i = 0; i < gc->n; i++) plan_destroy(&gc->p[i]);
    free(gc);
    c->gemm_cache = NULL;
}

static int align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    int al = 256;
    while (al > 2 && (a % (uintptr_t)al)) al >>= 1;
    return al;
}

/* Exact mode: the algorithm without split-K (one split, no reduction), checked on the reference
 * layouts; *found = 0 when cuBLASLt refuses it (then exact_gemm_kernel runs the shape). */
static void exact_pin(cu_ctx *c, cublasLtMatmulAlgo_t *algo, const gemm_plan *p, cublasLtMatrixLayout_t b,
                      cublasLtMatrixLayout_t d, int *found) {
    int32_t one = 1;
    uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulHeuristicResult_t r;
    if (cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof one) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoConfigSetAttribute(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof none) !=
            CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoCheck(c->lt, p->op, p->a, b, d, d, algo, &r) != CUBLAS_STATUS_SUCCESS || r.workspaceSize > c->lt_ws_bytes)
        *found = 0;
}

static gemm_plan *plan_get(cu_ctx *c, const gemm_key *key) {
    if (!c->gemm_cache && !(c->gemm_cache = calloc(1, sizeof(gemm_cache)))) {
        cu_fail(c, "calloc(gemm_cache)", "out of host memory", __FILE__, __LINE__);
        return NULL;
    }
    gemm_cache *gc = (gemm_cache *)c->gemm_cache;
    for (int i = 0; i < gc->n; i++)
        if (!memcmp(&gc->p[i].key, key, sizeof *key)) return &gc->p[i];
    gemm_plan p;
    memset(&p, 0, sizeof p);
    p.key = *key;
    cublasOperation_t ta = key->transa ? CUBLAS_OP_T : CUBLAS_OP_N, tb = key->transb ? CUBLAS_OP_T : CUBLAS_OP_N;
    cudaDataType_t dt = key->d_f32 ? CUDA_R_32F : CUDA_R_16BF;
    LT_CK(c, cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    if (c->failed) return NULL;
    LT_CK(c, cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CK(c, cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (key->bias) {
        cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = CUDA_R_16BF;
        LT_CK(c, cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof ep));
        LT_CK(c, cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    LT_CK(c, cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, key->transa ? key->k : key->m, key->transa ? key->m : key->k, key->lda));
    LT_CK(c, cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, key->transb ? key->n : key->k, key->transb ? key->k : key->n, key->ldb));
    LT_CK(c, cublasLtMatrixLayoutCreate(&p.d, dt, key->m, key->n, key->ldd));
    /* the layouts the algorithm is chosen on: exact mode's reference n, else the call's own */
    cublasLtMatrixLayout_t hb = p.b, hd = p.d;
    if (key->exact) {
        LT_CK(c, cublasLtMatrixLayoutCreate(&hb, CUDA_R_16BF, key->k, exact_ref_n(key->m), key->ldb));
        LT_CK(c, cublasLtMatrixLayoutCreate(&hd, dt, key->m, exact_ref_n(key->m), key->ldd));
    }
    cublasLtMatmulPreference_t pref;
    LT_CK(c, cublasLtMatmulPreferenceCreate(&pref));
    if (c->failed) return NULL;
    uint32_t al = (uint32_t)key->align;
    LT_CK(c,
          cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &c->lt_ws_bytes,
                                               sizeof c->lt_ws_bytes));
    LT_CK(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al));
    LT_CK(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al));
    LT_CK(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al));
    LT_CK(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al));
    if (key->exact) {
        uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
        LT_CK(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &none, sizeof none));
    }
    cublasLtMatmulHeuristicResult_t h;
    int found = 0;
    LT_CK(c, cublasLtMatmulAlgoGetHeuristic(c->lt, p.op, p.a, hb, hd, hd, pref, 1, &h, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (found >= 1 && key->exact && !c->failed) exact_pin(c, &h.algo, &p, hb, hd, &found);
    if (hb != p.b) cublasLtMatrixLayoutDestroy(hb);
    if (hd != p.d) cublasLtMatrixLayoutDestroy(hd);
    if (c->failed) return NULL;
    if (found < 1) p.fallback = 1;
    else p.algo = h.algo;
    if (gc->n == GEMM_CACHE) { /* full: drop the oldest half */
        for (int i = 0; i < GEMM_CACHE / 2; i++) plan_destroy(&gc->p[i]);
        memmove(gc->p, gc->p + GEMM_CACHE / 2, sizeof(gemm_plan) * (GEMM_CACHE / 2));
        gc->n = GEMM_CACHE / 2;
    }
    gc->p[gc->n] = p;
    return &gc->p[gc->n++];
}

__global__ void add_bias_kernel(bf16 *D, const bf16 *bias, int m, int n, int ldd) {
    long long total = (long long)m * n;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        long long col = i / m, row = i - col * m;
        bf16 *d = D + col * ldd + row;
        *d = __float2bfloat16(__bfloat162float(*d) + __bfloat162float(bias[row]));
    }
}

void *gemm_blas(cu_ctx *c) {
    if (c->failed) return NULL;
    if (!c->blas) {
        cublasHandle_t h;
        LT_CK(c, cublasCreate(&h));
        if (c->failed) return NULL;
        c->blas = h;
    }
    LT_CK(c, cublasSetStream((cublasHandle_t)c->blas, c->stream));
    return c->failed ? NULL : c->blas;
}

/* Exact mode's GEMM for shapes cuBLASLt has no pinned algorithm for: one thread an output of D
 * (column-major, as cuBLAS), K summed in order in fp32, then alpha, beta C and the bias. */
template <typename TD>
__global__ void exact_gemm_kernel(gemm_key k, float alpha, const bf16 *A, const bf16 *B, float beta, const TD *Cm, TD *D,
                                  const bf16 *bias) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= k.m) return;
    const size_t as = k.transa ? 1 : (size_t)k.lda, bs = k.transb ? (size_t)k.ldb : 1;
    const bf16 *a = A + (k.transa ? (size_t)i * k.lda : (size_t)i);
    for (int j = blockIdx.y; j < k.n; j += gridDim.y) {
        const bf16 *b = B + (k.transb ? (size_t)j : (size_t)j * k.ldb);
        float acc = 0;
        for (int q = 0; q < k.k; q++) acc = fmaf(__bfloat162float(a[q * as]), __bfloat162float(b[q * bs]), acc);
        float v = alpha * acc;
        if (beta != 0.0f) v += beta * (float)Cm[(size_t)j * k.ldd + i];
        if (bias) v += __bfloat162float(bias[i]);
        D[(size_t)j * k.ldd + i] = (TD)v;
    }
}

static void exact_gemm(cu_ctx *c, const gemm_key *key, float alpha, const void *A, const void *B, float beta, const void *Cm,
                       void *D, const bf16 *bias) {
    dim3 grid(cu_blocks(key->m, 128), key->n < 65535 ? key->n : 65535);
    if (key->d_f32)
        exact_gemm_kernel<float><<<grid, 128, 0, c->stream>>>(*key, alpha, (const bf16 *)A, (const bf16 *)B, beta,
                                                              (const float *)(Cm ? Cm : D), (float *)D, bias);
    else
        exact_gemm_kernel<bf16><<<grid, 128, 0, c->stream>>>(*key, alpha, (const bf16 *)A, (const bf16 *)B, beta,
                                                             (const bf16 *)(Cm ? Cm : D), (bf16 *)D, bias);
    CU_LAUNCHED(c, "exact_gemm_kernel");
}

static void gemm_fallback(cu_ctx *c, const gemm_key *key, float alpha, const void *A, const void *B, float beta, void *D,
                          const bf16 *bias) {
    cublasHandle_t h = (cublasHandle_t)gemm_blas(c);
    if (!h) return;
    LT_CK(c,
          cublasGemmEx(h, key->transa ? CUBLAS_OP_T : CUBLAS_OP_N, key->transb ? CUBLAS_OP_T : CUBLAS_OP_N, key->m, key->n,
                       key->k, &alpha, A, CUDA_R_16BF, key->lda, B, CUDA_R_16BF, key->ldb, &beta, D,
                       key->d_f32 ? CUDA_R_32F : CUDA_R_16BF, key->ldd, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (bias && !c->failed) {
        long long n = (long long)key->m * key->n;
        unsigned b = cu_blocks(n, 256), cap = (unsigned)c->n_sm * 16;
        add_bias_kernel<<<(b < cap ? b : cap), 256, 0, c->stream>>>((bf16 *)D, bias, key->m, key->n, key->ldd);
        CU_LAUNCHED(c, "add_bias_kernel");
    }
}

/* gemm_lt with C (the beta term) apart from D (NULL: D), laid out as D */
static void gemm_lt_c(cu_ctx *c, int transa, int transb, int m, int n, int k, float alpha, const void *A, int lda, const void *B,
                      int ldb, float beta, const void *Cm, void *D, int ldd, int d_is_f32, const bf16 *bias) {
    if (c->failed || m <= 0 || n <= 0) return;
    int al = align_of(A), x;
    if ((x = align_of(B)) < al) al = x;
    if ((x = align_of(D)) < al) al = x;
    if (bias && (x = align_of(bias)) < al) al = x;
    if (Cm && (x = align_of(Cm)) < al) al = x;
    const int exact = cu_exact(c) && transa && !transb; /* the forward's x W^T (not the backward's) */
    if (exact && al > 16) al = 16; /* one algorithm for every buffer of a shape */
    gemm_key key = {transa, transb, m, n, k, lda, ldb, ldd, d_is_f32, bias != NULL, al, exact};
    gemm_plan *p = plan_get(c, &key);
    if (!p) return;
    if (exact && p->fallback) {
        exact_gemm(c, &p->key, alpha, A, B, beta, Cm, D, bias);
        return;
    }
    if (Cm && Cm != D && p->fallback) { /* GemmEx takes C = D: the beta term copied in first */
        CU_CK(c,
              cudaMemcpy2DAsync(D, (size_t)ldd * (d_is_f32 ? 4 : 2), Cm, (size_t)ldd * (d_is_f32 ? 4 : 2),
                                (size_t)m * (d_is_f32 ? 4 : 2), n, cudaMemcpyDeviceToDevice, c->stream));
        Cm = NULL;
    }
    if (p->fallback) {
        gemm_fallback(c, &p->key, alpha, A, B, beta, D, bias);
        return;
    }
    if (bias) LT_CK(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    LT_CK(c,
          cublasLtMatmul(c->lt, p->op, &alpha, A, p->a, B, p->b, &beta, Cm ? Cm : D, p->d, D, p->d, &p->algo, c->lt_ws,
                         c->lt_ws_bytes, c->stream));
}

void gemm_lt(cu_ctx *c, int transa, int transb, int m, int n, int k, float alpha, const void *A, int lda, const void *B, int ldb,
             float beta, void *D, int ldd, int d_is_f32, const bf16 *bias) {
    gemm_lt_c(c, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, NULL, D, ldd, d_is_f32, bias);
}

/* dbias (O) += column sums of dout (T,O): 32 columns x 32 row-strided threads per block, one
 * block per 32 columns (no atomics: the sum order is fixed, so a replayed update is bit-equal). */
__global__ void bias_grad_kernel(float *dbias, const bf16 *dout, int T, int O) {
    __shared__ float part[32][33];
    int o = blockIdx.x * 32 + threadIdx.x;
    float s = 0;
    if (o < O)
        for (int t = threadIdx.y; t < T; t += 32) s += __bfloat162float(dout[(size_t)t * O + o]);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && o < O) {
        for (int y = 1; y < 32; y++) s += part[y][threadIdx.x];
        dbias[o] += s;
    }
}

/* ---------------------------------------------------------------- few rows (decode) */

/* y (T,O) = x (T,I) W^T + b for T <= 64 rows: reading W is the whole cost, so the kernel is a
 * weight stream. A tile is 8 NT consecutive outputs and all of I (persistent blocks, one an SM,
 * take the tiles round robin); a block's SK_WARPS warps split I
 * into 64-wide chunks. Per chunk a thread copies, with 16-byte cp.async, 2 NT pieces of W (row
 * o0 + 8 n + lane/4, k = c + 8 (lane%4) and c + 32 + 8 (lane%4)) and 4 MT pieces of x (rows
 * 16 m + lane/4 and + 8, same k) into its own slots of an S-stage ring in shared memory: each
 * thread reads back only what it copied, so the stream needs no block barriers. The reduction
 * order inside a chunk is permuted (a thread's 8 contiguous k feed two m16n8k16 k-steps), the
 * same for both operands, so mma.sync's fragments come straight from those 16-byte pieces with
 * the activation rows as the A operand (MT m16 tiles). The warps' fp32 partials are summed in a
 * fixed order through shared memory (deterministic), plus the bias and the residual, into bf16
 * (one rounding). */
enum { SK_MAX_T = 64, SK_AUTO_T = 16, SK_NORM_I = 5120 };

/* 8 bf16 of x -> bf16(w * (x * r)) */
__device__ __forceinline__ uint4 sk_norm8(uint4 xv, uint4 wv, float r) {
    const bf16 *xe = (const bf16 *)&xv, *we = (const bf16 *)&wv;
    uint4 y;
    bf16 *ye = (bf16 *)&y;
#pragma unroll
    for (int j = 0; j < 8; j++) ye[j] = __float2bfloat16(__bfloat162float(we[j]) * (__bfloat162float(xe[j]) * r));
    return y;
}

template <int MT, int NT> struct sk_shape {
    static constexpr int L = 2 * NT + 4 * MT; /* 16-byte slots per thread per stage */
    static constexpr size_t RED = (size_t)SK_WARPS * MT * 16 * NT * 8 * 4; /* the warps' partial sums */
    static constexpr size_t NW = (size_t)SK_NORM_I * 2; /* the norm weight */
    static constexpr int SFIT = (int)((227 * 1024 - RED - NW) / ((size_t)L * 32 * SK_WARPS * 16));
    static constexpr int S0 = 48 / L > 2 ? 48 / L : 2; /* stages: ~48 slots per thread */
    static constexpr int S = S0 < SFIT ? S0 : SFIT;
    static constexpr size_t SMEM = (size_t)S * L * 32 * SK_WARPS * 16 + RED + NW;
};

/* Up to SK_PARTS weights sharing the input x, one launch: part i owns tiles [b0[i], b0[i + 1])
 * of 8 NT outputs each, after the adapter tiles. A part may carry a low-rank term (LoRA: + (x A^T)
 * B^T, rank lr, summed before the one rounding). Its first half x A^T is made by the same launch:
 * the parts' A matrices, stacked (na lr rows), are the launch's first tiles [0, nA), art rows each
 * (art <= 8 NT: as few as fill the SMs the base tiles leave idle in their last round, so an
 * adapter tile reads less of A than a base tile reads of W and is done first), ordinary tiles of
 * the same stream (the same x, the same norm in front, the same reduction order) whose epilogue
 * writes u = x A^T (T, lr) and counts itself done on sync[0]. The second half is one more k-chunk
 * of the tile's own MMA ([x | u] . [W | B]^T): after its chunks, warp w of a tile with a term
 * waits until all nA are done (once a block), loads u rows and the tile's B rows (prefetched into
 * L1 at the tile's start) for k in [32 w, 32 w + 32) and adds their products into its partial
 * sums, which the epilogue then sums as any other. That wait cannot deadlock: the grid has at most
 * one block an SM and one block fits an SM, the adapter tiles are the first tile of the lowest
 * blocks (blocks start in index order, as CUB's decoupled look-back assumes), and the next kernel
 * (PDL) starts only once every block of this one has started. The last block out sets both
 * counters back to 0, so a graph replays the launch as it was captured. (An epilogue that staged
 * u and B in shared memory and summed lr products a thread cost 5-7 us a tile on an H100 at
 * Qwen3-8B decode, docs/benchmarks.md.)
 * SwiGLU mode (act set; parts 0 and 1 the gate and up projections, same O, n = 1 tile range): a
 * tile is 4 NT outputs of both, its first NT / 2 n8 groups gate rows and the rest the same up
 * rows, so the epilogue writes g, u (each with its own low-rank term) and act = silu(g) * u
 * (swiglu_fwd's math on the bf16-rounded g, u) with no SwiGLU kernel after it; adapter tiles
 * stay ordinary tiles. */
enum { SK_PARTS = 3 };
typedef struct {
    bf16 *out[SK_PARTS];
    const bf16 *w[SK_PARTS], *bias[SK_PARTS];
    const bf16 *res[SK_PARTS]; /* the residual added before the one rounding (NULL: none) */
    int O[SK_PARTS], b0[SK_PARTS + 1], n;
    bf16 *act;
    const bf16 *nw; /* RMSNorm of x in front (NULL: none): weight (I), eps */
    float eps;
    /* + (x la^T) lb^T, la (lr, I), lb (O, lr), x la^T written to lu (T, lr) (NULL: none) */
    const bf16 *la[SK_PARTS], *lb[SK_PARTS];
    bf16 *lu[SK_PARTS];
    int lr;
    /* set by skinny_launch: the adapter tiles' A and u, compacted (na of them), their tile count
     * and rows */
    const bf16 *aw[SK_PARTS];
    bf16 *au[SK_PARTS];
    int na, nA, art;
    unsigned *sync; /* (2) adapter tiles done, blocks done; 0 between launches */
} sk_args;

/* rows [o0, o0 + n) of b (O, lr) into L1 (128-byte lines over the block's threads): the cp.async
 * stream bypasses L1, so they stay there until the tile's epilogue */
__device__ __forceinline__ void sk_prefetch_rows(const bf16 *b, int o0, int n, int lr, int tid, int nth) {
    const char *p = (const char *)(b + (size_t)o0 * lr);
    for (int i = tid; i * 128 < n * lr * 2; i += nth) asm volatile("prefetch.global.L1 [%0];\n" ::"l"(p + i * 128));
}

/* Persistent: block b takes tiles b, b + gridDim.x, ... (one block an SM); each warp's ring runs
 * on across the block's tiles, so the loads of the next tile are in flight during a tile's
 * reduction and no SM waits for a second wave to start. */
template <int MT, int NT, bool LORA>
__global__ void __launch_bounds__(32 * SK_WARPS, 1) skinny_kernel(const sk_args a, const bf16 *x, int T, int I) {
    constexpr int L = sk_shape<MT, NT>::L, S = sk_shape<MT, NT>::S, NTH = 32 * SK_WARPS;
    constexpr int RW = MT * 16, CW = NT * 8;
    extern __shared__ uint4 sk_ring[]; /* [S][L][NTH], then red[warp][row RW][col CW] */
    float *red = (float *)(sk_ring + (size_t)S * L * NTH);
    bf16 *nw_s = (bf16 *)(red + (size_t)RW * CW * SK_WARPS); /* [I] when nw */
    const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5, g = lane >> 2, q = lane & 3;
    const int nch = I / SK_KC, c0 = sk_seg0(wp, nch), n = sk_seg0(wp + 1, nch) - c0;
    /* the parts in registers (the lambdas would otherwise take a's address: a local copy) */
    const int np = a.n, b1 = a.b0[1], b2 = a.b0[2], b3 = a.b0[3], O_0 = a.O[0], O_1 = a.O[1], O_2 = a.O[2];
    const bf16 *const w_0 = a.w[0], *const w_1 = a.w[1], *const w_2 = a.w[2];
    const bf16 *const bias_0 = a.bias[0], *const bias_1 = a.bias[1], *const bias_2 = a.bias[2];
    bf16 *const out_0 = a.out[0], *const out_1 = a.out[1], *const out_2 = a.out[2], *const act = a.act;
    const bf16 *const res_0 = a.res[0], *const res_1 = a.res[1], *const res_2 = a.res[2], *const nw = a.nw;
    const bf16 *const lu_0 = a.lu[0], *const lu_1 = a.lu[1], *const lu_2 = a.lu[2];
    const bf16 *const lb_0 = a.lb[0], *const lb_1 = a.lb[1], *const lb_2 = a.lb[2];
    const bf16 *const aw_0 = a.aw[0], *const aw_1 = a.aw[1], *const aw_2 = a.aw[2];
    bf16 *const au_0 = a.au[0], *const au_1 = a.au[1], *const au_2 = a.au[2];
    const int nA = LORA ? a.nA : 0, lr = a.lr, arows = a.na * a.lr, art = a.art;
    bool u_done = false; /* every adapter tile's u written (a term warp waited once) */
    const bool sw = act != nullptr;
    const int ntiles = nA + (np == 1 ? b1 : np == 2 ? b2 : b3);
    const int mine = ntiles > (int)blockIdx.x ? (ntiles - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int total = mine * n; /* this warp's chunks over all its tiles: f = j n + i */
    /* tile j of the block: its part (-1: an adapter tile, rows o0.. of the stacked A's) and first
     * output */
    auto tile = [&](int j, int &pi, int &o0) {
        int tl = (int)blockIdx.x + j * (int)gridDim.x;
        if (LORA) {
            if (tl < nA) {
                pi = -1;
                o0 = tl * art;
                return;
            }
            tl -= nA;
        }
        pi = np > 1 && tl >= b1 ? (np > 2 && tl >= b2 ? 2 : 1) : 0;
        o0 = (tl - (pi == 0 ? 0 : pi == 1 ? b1 : b2)) * (sw ? 4 : 8) * NT;
    };
#define SK_SEL(v, pi) ((pi) == 0 ? v##0 : (pi) == 1 ? v##1 : v##2)
    auto issue_w = [&](int f) {
        int pi, o0;
        tile(f / n, pi, o0);
        const int k = (c0 + f % n) * SK_KC + q * 8;
        uint4 *b = sk_ring + (size_t)(f % S) * L * NTH + tid;
        if (LORA && pi < 0) { /* adapter tile: row o of the stacked A's is row o - ai lr of A number ai (na <= 3) */
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const int o = o0 + nt * 8 + g, in = nt * 8 + g < art && o < arows ? 16 : 0;
                int ro = in ? o : 0, ai = 0;
                if (ro >= lr) {
                    ro -= lr;
                    ai = 1;
                }
                if (ro >= lr) {
                    ro -= lr;
                    ai = 2;
                }
                const bf16 *p = SK_SEL(aw_, ai) + (size_t)ro * I + k;
                sk_cp16(b + (2 * nt) * NTH, p, in);
                sk_cp16(b + (2 * nt + 1) * NTH, p + 32, in);
            }
            return;
        }
        const int O = SK_SEL(O_, pi);
        const bf16 *wp0 = SK_SEL(w_, pi);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const bool up = sw && nt >= NT / 2;
            const int o = o0 + (up ? nt - NT / 2 : nt) * 8 + g;
            const bf16 *p = (up ? w_1 : wp0) + (size_t)(o < O ? o : 0) * I + k;
            sk_cp16(b + (2 * nt) * NTH, p, o < O ? 16 : 0);
            sk_cp16(b + (2 * nt + 1) * NTH, p + 32, o < O ? 16 : 0);
        }
    };
    auto issue_x = [&](int f) {
        const int k = (c0 + f % n) * SK_KC + q * 8;
        uint4 *b = sk_ring + (size_t)(f % S) * L * NTH + tid;
#pragma unroll
        for (int r = 0; r < 2 * MT; r++) {
            const int t = (r >> 1) * 16 + g + 8 * (r & 1);
            const bf16 *p = x + (size_t)(t < T ? t : 0) * I + k;
            sk_cp16(b + (2 * NT + 2 * r) * NTH, p, t < T ? 16 : 0);
            sk_cp16(b + (2 * NT + 2 * r + 1) * NTH, p + 32, t < T ? 16 : 0);
        }
    };

    /* the weights of the first stages go out before the wait for the kernel before (x is its
     * output; W is written by nothing in flight), so they stream in while it finishes */
#pragma unroll
    for (int f = 0; f < S - 1; f++)
        if (f < total) issue_w(f);
    if (nw) /* the norm weight too (first commit group): written by nothing in flight */
        for (int i = tid; i < I / 8; i += NTH) sk_cp16((uint4 *)nw_s + i, nw + (size_t)i * 8, 16);
    pdl_wait();
    pdl_trigger();
#pragma unroll
    for (int f = 0; f < S - 1; f++) {
        if (f < total) issue_x(f);
        asm volatile("cp.async.commit_group;\n" ::);
    }
    /* norm in front: each row's rstd, with rmsnorm_fwd_kernel's arithmetic (a warp a row, lanes
     * on 8-wide chunks, the same sums), so the normed values are those the trainer's norm makes */
    __shared__ float rstd_s[SK_MAX_T];
    if (nw) {
        for (int t = wp; t < T; t += SK_WARPS) {
            constexpr int NC = SK_NORM_I / 256; /* a lane's 8-wide chunks of a row, loaded at once */
            uint4 v[NC];
#pragma unroll
            for (int c = 0; c < NC; c++)
                if (lane * 8 + c * 256 < I) v[c] = *(const uint4 *)(x + (size_t)t * I + lane * 8 + c * 256);
            float ss = 0.0f;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                if (lane * 8 + c * 256 >= I) break;
                const bf16 *e = (const bf16 *)&v[c];
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const float f = __bfloat162float(e[j]);
                    ss += f * f;
                }
            }
            ss = warp_sum(ss);
            if (lane == 0) rstd_s[t] = rsqrtf(ss / I + a.eps);
        }
        asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 2)); /* nw_s (the chunk loop waits as much) */
        __syncthreads();
    }

    float acc[MT][NT][4];
    for (int j = 0; j < mine; j++) {
        if (LORA) { /* the tile's B rows into L1 for its term (the cp.async stream bypasses L1) */
            int pi, o0;
            tile(j, pi, o0);
            const int ow = sw ? 4 * NT : 8 * NT;
            if (pi >= 0 && SK_SEL(lb_, pi)) sk_prefetch_rows(SK_SEL(lb_, pi), o0, min(ow, SK_SEL(O_, pi) - o0), lr, tid, NTH);
            if (pi >= 0 && sw && lb_1) sk_prefetch_rows(lb_1, o0, min(ow, O_1 - o0), lr, tid, NTH);
        }
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[m][nt][e] = 0.0f;
        for (int i = 0; i < n; i++) {
            const int f = j * n + i;
            asm volatile("cp.async.wait_group %0;\n" ::"n"(S - 2));
            const uint4 *b = sk_ring + (size_t)(f % S) * L * NTH + tid;
            uint4 wv[NT][2], xv[2 * MT][2];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                wv[nt][0] = b[(2 * nt) * NTH];
                wv[nt][1] = b[(2 * nt + 1) * NTH];
            }
#pragma unroll
            for (int r = 0; r < 2 * MT; r++) {
                xv[r][0] = b[(2 * NT + 2 * r) * NTH];
                xv[r][1] = b[(2 * NT + 2 * r + 1) * NTH];
            }
            if (nw) { /* x -> w * (x * rstd), rounded to bf16 as the norm kernels store it */
                const int k = (c0 + i) * SK_KC + q * 8;
                const uint4 w0 = *(const uint4 *)(nw_s + k), w1 = *(const uint4 *)(nw_s + k + 32);
#pragma unroll
                for (int r = 0; r < 2 * MT; r++) {
                    const int t = (r >> 1) * 16 + g + 8 * (r & 1);
                    const float rs = t < T ? rstd_s[t] : 0.0f;
                    xv[r][0] = sk_norm8(xv[r][0], w0, rs);
                    xv[r][1] = sk_norm8(xv[r][1], w1, rs);
                }
            }
            /* the stage read for chunk f - 1 is free: its values were consumed by its mma */
            if (f + S - 1 < total) {
                issue_w(f + S - 1);
                issue_x(f + S - 1);
            }
            asm volatile("cp.async.commit_group;\n" ::);
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    const uint4 lo = xv[2 * m][h], hi = xv[2 * m + 1][h];
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) sk_mma8(acc[m][nt], lo, hi, wv[nt][h]);
                }
        }

        if (LORA) { /* the low-rank term: k in [32 wp, 32 wp + 32) of [x | u] . [W | B]^T, same permutation */
            int pi, o0;
            tile(j, pi, o0);
            /* part 0's term (the tile's part; the gate in SwiGLU mode) and the up projection's; an
             * adapter tile has none (its warps must not wait for the adapter tiles) */
            const bf16 *const lbg = pi >= 0 ? SK_SEL(lb_, pi) : nullptr, *const lbu = pi >= 0 && sw ? lb_1 : nullptr;
            const bf16 *const lug = pi >= 0 ? SK_SEL(lu_, pi) : nullptr;
            const int O = pi >= 0 ? SK_SEL(O_, pi) : 0;
            for (int kb = 32 * wp; (lbg || lbu) && kb < lr; kb += 32 * SK_WARPS) {
                if (!u_done) { /* every adapter tile's u written */
                    if (lane == 0) {
                        while ((int)*(volatile unsigned *)a.sync < nA) __nanosleep(32);
                        __threadfence();
                    }
                    __syncwarp();
                    u_done = true;
                }
                const int k = kb + q * 8;
                const uint4 z = make_uint4(0, 0, 0, 0);
                uint4 ug[2 * MT], uu[2 * MT], bv[NT];
#pragma unroll
                for (int r = 0; r < 2 * MT; r++) {
                    const int t = (r >> 1) * 16 + g + 8 * (r & 1);
                    const bool in = k < lr && t < T;
                    ug[r] = lbg && in ? __ldcg((const uint4 *)(lug + (size_t)t * lr + k)) : z;
                    uu[r] = lbu && in ? __ldcg((const uint4 *)(lu_1 + (size_t)t * lr + k)) : z;
                }
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const bool up = sw && nt >= NT / 2;
                    const int o = o0 + (up ? nt - NT / 2 : nt) * 8 + g;
                    const bf16 *const lb = up ? lbu : lbg;
                    bv[nt] = lb && k < lr && o < O ? *(const uint4 *)(lb + (size_t)o * lr + k) : z;
                }
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) {
                        const bool up = sw && nt >= NT / 2;
                        const uint4 lo = up ? uu[2 * m] : ug[2 * m], hi = up ? uu[2 * m + 1] : ug[2 * m + 1];
                        sk_mma8(acc[m][nt], lo, hi, bv[nt]);
                    }
            }
        }

        /* tile j: the warps' partials summed in a fixed order (deterministic), plus the bias (and
         * the low-rank term, in the partials) */
#pragma unroll
        for (int m = 0; m < MT; m++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                float *r0 = red + ((size_t)wp * RW + m * 16 + g) * CW + nt * 8 + 2 * q;
                r0[0] = acc[m][nt][0];
                r0[1] = acc[m][nt][1];
                r0[8 * CW] = acc[m][nt][2];
                r0[8 * CW + 1] = acc[m][nt][3];
            }
        __syncthreads();
        int pi, o0;
        tile(j, pi, o0);
        if (LORA && pi < 0) { /* adapter tile: u = x A^T, rounded to bf16 as the GEMM stores it; then counted done */
            for (int e = tid; e < RW * CW; e += NTH) {
                const int t = e / CW, o = o0 + e % CW;
                if (t >= T || e % CW >= art || o >= arows) continue;
                float s = 0.0f;
#pragma unroll
                for (int k = 0; k < SK_WARPS; k++) s += red[(size_t)k * RW * CW + e];
                const int ai = o / lr;
                SK_SEL(au_, ai)[(size_t)t * lr + o - ai * lr] = __float2bfloat16(s);
            }
            __threadfence();
            __syncthreads(); /* red is free for the next tile */
            if (tid == 0) atomicAdd(a.sync, 1u);
            continue;
        }
        const bf16 *bias = SK_SEL(bias_, pi), *res = SK_SEL(res_, pi);
        const int O = SK_SEL(O_, pi);
        bf16 *out = SK_SEL(out_, pi);
        for (int e = tid; e < RW * CW; e += NTH) {
            const int t = e / CW, o = o0 + e % CW;
            if (t >= T || o >= O || (sw && e % CW >= CW / 2)) continue;
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < SK_WARPS; k++) s += red[(size_t)k * RW * CW + e];
            if (bias) s += __bfloat162float(bias[o]);
            if (res) s += __bfloat162float(res[(size_t)t * O + o]);
            const bf16 y = __float2bfloat16(s);
            out[(size_t)t * O + o] = y;
            if (sw) { /* the up projection of the same output, CW / 2 columns on */
                float su = 0.0f;
#pragma unroll
                for (int k = 0; k < SK_WARPS; k++) su += red[(size_t)k * RW * CW + e + CW / 2];
                const bf16 yu = __float2bfloat16(su);
                out_1[(size_t)t * O + o] = yu;
                const float x = __bfloat162float(y);
                act[(size_t)t * O + o] = __float2bfloat16(x / (1.0f + expf(-x)) * __bfloat162float(yu));
            }
        }
        __syncthreads(); /* red is free for the next tile */
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    if (LORA && tid == 0 && atomicAdd(a.sync + 1, 1u) == gridDim.x - 1) { /* the last block out: no one waits */
        a.sync[0] = 0;
        a.sync[1] = 0;
        __threadfence();
    }
}
#undef SK_SEL

template <int MT, int NT> static void skinny_launch(cu_ctx *c, sk_args a, const bf16 *inp, int T, int I) {
    const size_t smem = sk_shape<MT, NT>::SMEM;
    static unsigned done[2];
    const bool lora = a.la[0] || a.la[1] || a.la[2];
    auto *kern = lora ? skinny_kernel<MT, NT, true> : skinny_kernel<MT, NT, false>;
    cu_raise_smem(c, kern, smem, &done[lora]);
    if (c->failed) return;
    a.b0[0] = 0;
    for (int i = 0; i < a.n; i++) a.b0[i + 1] = a.b0[i] + (a.O[i] + (a.act ? 4 : 8) * NT - 1) / ((a.act ? 4 : 8) * NT);
    a.na = 0;
    for (int i = 0; i < (a.act ? 2 : a.n); i++)
        if (a.la[i]) {
            a.aw[a.na] = a.la[i];
            a.au[a.na++] = a.lu[i];
        }
    /* adapter tiles: as many as the SMs left idle in the base tiles' last round (at least those of
     * 8 NT rows), 8 rows at least */
    const int arows = a.na * a.lr, base = a.b0[a.n], idle = (c->n_sm - base % c->n_sm) % c->n_sm;
    a.nA = (arows + 8 * NT - 1) / (8 * NT);
    if (arows && idle > a.nA) {
        int per = (arows + idle - 1) / idle;
        per = (per + 7) / 8 * 8;
        a.nA = (arows + per - 1) / per;
        a.art = per;
    } else {
        a.art = 8 * NT;
    }
    a.sync = c->sk_sync;
    const int tiles = a.nA + base, blocks = tiles < c->n_sm ? tiles : c->n_sm;
    cu_launch_pdl(c, "skinny_kernel", kern, dim3(blocks), dim3(32 * SK_WARPS), smem, a, inp, T, I);
}

/* Outputs per tile (8 NT): one block per SM runs (the ring fills its shared memory), so the
 * time goes as the most tiles a block takes x the bytes a tile streams: 8 NT rows of W and, from
 * L2, the 16 MT rows of x again; the largest NT of the least such cost. (Counting W alone chose
 * NT = 2 for Qwen3-32B's gate/up, whose tiles then read as much x as W: 27.4 ms a decode step on an
 * H200, 19.5 with this cost, 20.3 when those shapes ran on cuBLASLt.) The tiles counted as skinny_launch lays them out (each
 * part's own, the adapter tiles), so an adapter tile does not push a launch into a second round. */
static int skinny_nt(int n_sm, const sk_args &a, int MT) {
    static const int cand[] = {1, 2, 4, 6, 8};
    int best = 2, arows = 0;
    for (int i = 0; i < (a.act ? 2 : a.n); i++) arows += a.la[i] ? a.lr : 0;
    long long bc = -1;
    for (int i = 0; i < 5; i++) {
        int nt = cand[i], w = a.act ? 4 * nt : 8 * nt;
        if (MT * nt > 8) break;
        if (a.act && nt % 2) continue;
        long long blocks = (arows + 8 * nt - 1) / (8 * nt);
        for (int p = 0; p < a.n; p++) blocks += (a.O[p] + w - 1) / w;
        long long cost = (blocks + n_sm - 1) / n_sm * (8 * nt + 16 * MT);
        if (bc < 0 || cost <= bc) {
            bc = cost;
            best = nt;
        }
    }
    return best;
}

/* 1 when the few-row kernel took y_i = x W_i^T + b_i for the a.n parts: T <= SK_AUTO_T, I a
 * multiple of 64, 16-byte aligned x and W, and each W at most 144M values (Qwen3-32B's down
 * projection, 131M, takes it; the lm heads of Qwen3-0.6B and up stay on cuBLASLt, at its floor
 * there); a norm in front up to SK_NORM_I = 5120 inputs (Qwen3-14B and 32B).
 * H100, Qwen3-1.7B shapes, us per call in a graph (bench_rollout gemm), skinny vs cuBLASLt tuned:
 * T=16: 2048x2048 5.6 vs 6.4, 2048->1024 4.4 vs 5.6, 2048->6144 11.4 vs 11.4, 6144->2048 11.9
 * vs 13.2; T=1 faster still; T=64 slower (9.8 vs 6.6, 25 vs 11: MT=4 limits NT to 2), so
 * T > 16 goes to cuBLASLt. tune.skinny 0 turns it off, 1 takes it up to T = 64 and any size.
 * (The cuBLASLt figures are of an algorithm chosen by timing, since removed for determinism;
 * the heuristic's first choice at T = 17..64 is not measured yet.) */
static int exact_fwd(cu_ctx *c, sk_args a, const bf16 *inp, const cu_norm *norm, int T, int I);
static const bf16 *norm_apart(cu_ctx *c, const cu_norm *nm, const bf16 *inp, int T, int I);
static void skinny_run(cu_ctx *c, const sk_args &a, const bf16 *inp, int T, int I);
static int skinny(cu_ctx *c, const sk_args &a, const bf16 *inp, const cu_norm *norm, int T, int I) {
    if (cu_exact(c)) return exact_fwd(c, a, inp, norm, T, I);
    int force = c->tune->skinny == TUNE_SKINNY_FORCE;
    if (c->tune->skinny == TUNE_SKINNY_OFF || T > SK_MAX_T || I % SK_KC || align_of(inp) < 16) return 0;
    if (T > SK_AUTO_T && !force) return 0;
    if (a.nw && (I > SK_NORM_I || align_of(a.nw) < 16)) return 0; /* nw_s: 16-byte copies */
    int np = a.act ? 2 : a.n;
    for (int i = 0; i < np; i++) /* the low-rank term's 16-byte loads and copies */
        if (a.la[i] && (!c->sk_sync || a.lr % 8 || align_of(a.la[i]) < 16 || align_of(a.lu[i]) < 16 || align_of(a.lb[i]) < 16))
            return 0;
    for (int i = 0; i < np; i++) {
        if (align_of(a.w[i]) < 16 || ((long long)a.O[i] * I > (144LL << 20) && !force)) return 0;
    }
    skinny_run(c, a, inp, T, I);
    return 1;
}

/* the few-row kernel's launch for T <= SK_MAX_T rows: MT m16 tiles, NT by skinny_nt */
static void skinny_run(cu_ctx *c, const sk_args &a, const bf16 *inp, int T, int I) {
    int MT = T <= 16 ? 1 : T <= 32 ? 2 : 4, nt = skinny_nt(c->n_sm, a, MT);
#define SK_L(M, N) skinny_launch<M, N>(c, a, inp, T, I)
    if (MT == 1) {
        if (nt == 1) SK_L(1, 1);
        else if (nt == 2) SK_L(1, 2);
        else if (nt == 4) SK_L(1, 4);
        else if (nt == 6) SK_L(1, 6);
        else SK_L(1, 8);
    } else if (MT == 2) {
        if (nt == 1) SK_L(2, 1);
        else if (nt == 2) SK_L(2, 2);
        else SK_L(2, 4);
    } else {
        if (nt == 1) SK_L(4, 1);
        else SK_L(4, 2);
    }
#undef SK_L
}

/* Exact mode (tune.exact): the parts on the kernels of one reduction order (matmul_order.cuh),
 * so a row's bits do not depend on T: up to SK_AUTO_T rows skinny_kernel, the norm fused
 * (rmsnorm_fwd's values); up to XF_MAX_T rows exact_few_cuda (all parts in one launch, each
 * weight read once), more rows exact_mm_cuda a part, both after the norm apart (the warp kernel,
 * at any T in exact mode) and SwiGLU after them. 0 when the shape is theirs at no T (a low-rank
 * term, I not a multiple of SK_KC, x or a W not 16-byte aligned): the pinned cuBLASLt algorithm
 * runs it at every T. (exact_few_cuda for one group's 16 rows too: 4.10 against 3.56 ms a decode
 * step, Qwen3-1.7B dims on a shared H200.) */
static int exact_fwd(cu_ctx *c, sk_args a, const bf16 *inp, const cu_norm *norm, int T, int I) {
    const int np = a.act ? 2 : a.n;
    if (I % SK_KC || align_of(inp) < 16) return 0;
    for (int i = 0; i < np; i++)
        if (a.la[i] || align_of(a.w[i]) < 16) return 0;
    if (T <= SK_AUTO_T && (!a.nw || (I <= SK_NORM_I && align_of(a.nw) >= 16))) {
        skinny_run(c, a, inp, T, I);
        return 1;
    }
    if (a.nw) { /* the norm apart */
        inp = norm_apart(c, norm, inp, T, I);
        if (align_of(inp) < 16) return 0;
    }
    if (!exact_few_cuda(c, np, a.out, a.w, a.bias, a.res, a.O, inp, T, I))
        for (int i = 0; i < np; i++) exact_mm_cuda(c, a.out[i], inp, a.w[i], a.bias[i], a.res[i], T, I, a.O[i]);
    if (a.act) swiglu_fwd_cuda(c, a.act, a.out[0], a.out[1], (long long)T * a.O[0]);
    return 1;
}

void matmul_fwd_cuda(cu_ctx *c, bf16 *out, const bf16 *inp, const bf16 *w, const bf16 *bias, int T, int I, int O) {
    const bf16 *const res = NULL;
    matmul_fwd_n_cuda(c, &out, &w, &bias, &res, &O, 1, inp, NULL, T, I, NULL);
}

/* The unfused path's norm: ln = rmsnorm(inp) (rmsnorm_fwd_cuda), the projections then read ln. */
static const bf16 *norm_apart(cu_ctx *c, const cu_norm *nm, const bf16 *inp, int T, int I) {
    if (!nm) return inp;
    rmsnorm_fwd_cuda(c, nm->ln, NULL, inp, nm->w, T, I, nm->eps);
    return nm->ln;
}

/* The norm in front, for the skinny kernel (skinny() checks what it needs). */
static void sk_set_norm(sk_args &a, const cu_norm *nm) {
    if (nm) {
        a.nw = nm->w;
        a.eps = nm->eps;
    }
}

/* The parts' low-rank terms (lr NULL: none), for the skinny kernel: 0 when their ranks differ
 * (the kernel takes one). */
static int sk_set_lowrank(sk_args &a, const cu_lowrank *lr, int n) {
    for (int i = 0; lr && i < n; i++) {
        if (!lr[i].a) continue;
        if (a.lr && a.lr != lr[i].r) return 0;
        a.la[i] = lr[i].a;
        a.lb[i] = lr[i].b;
        a.lu[i] = lr[i].u;
        a.lr = lr[i].r;
    }
    return 1;
}

/* The unfused path's first halves of the low-rank terms: u_i = inp A_i^T, one few-row launch
 * for all of them when it takes the shape (the projections' own GEMMs then add u_i B_i^T). */
static void lowrank_first_halves(cu_ctx *c, const cu_lowrank *lr, int n, const bf16 *inp, int T, int I) {
    bf16 *u[SK_PARTS];
    const bf16 *A[SK_PARTS], *none[SK_PARTS] = {NULL, NULL, NULL};
    int r[SK_PARTS], m = 0;
    for (int i = 0; lr && i < n; i++)
        if (lr[i].a) {
            u[m] = lr[i].u;
            A[m] = lr[i].a;
            r[m++] = lr[i].r;
        }
    if (m) matmul_fwd_n_cuda(c, u, A, none, none, r, m, inp, NULL, T, I, NULL);
}

void matmul_fwd_n_cuda(cu_ctx *c, bf16 *const *out, const bf16 *const *w, const bf16 *const *bias, const bf16 *const *res,
                       const int *O, int n, const bf16 *inp, const cu_norm *norm, int T, int I, const cu_lowrank *lr) {
    if (c->failed || T <= 0) return;
    if (n >= 1 && n <= SK_PARTS) {
        sk_args a = {};
        a.n = n;
        sk_set_norm(a, norm);
        for (int i = 0; i < n; i++) {
            a.out[i] = out[i];
            a.w[i] = w[i];
            a.bias[i] = bias[i];
            a.res[i] = res[i];
            a.O[i] = O[i];
        }
        if (sk_set_lowrank(a, lr, n) && skinny(c, a, inp, norm, T, I)) return;
    }
    inp = norm_apart(c, norm, inp, T, I);
    lowrank_first_halves(c, lr, n, inp, T, I);
    for (int i = 0; i < n; i++) { /* the residual as the beta term: one rounding, as the few-row kernel */
        gemm_lt_c(c, 1, 0, O[i], T, I, 1.0f, w[i], I, inp, I, res[i] ? 1.0f : 0.0f, res[i], out[i], O[i], 0, bias[i]);
        if (lr && lr[i].a) /* the low-rank term on top (a second rounding at these sizes) */
            gemm_lt_c(c, 1, 0, O[i], T, lr[i].r, 1.0f, lr[i].b, lr[i].r, lr[i].u, lr[i].r, 1.0f, out[i], out[i], O[i], 0, NULL);
    }
}

/* g = inp wg^T, u = inp wu^T (T, F) (each + its low-rank term, lr[0] and lr[1], when lr is set)
 * and a = silu(g) u: one few-row launch (SwiGLU mode, the adapters' x A^T in it) when the
 * skinny kernel takes the shape, else the GEMMs and swiglu_fwd. */
void mlp_in_fwd_cuda(cu_ctx *c, bf16 *act, bf16 *g, bf16 *u, const bf16 *inp, const cu_norm *norm, const bf16 *wg, const bf16 *wu,
                     int T, int I, int F, const cu_lowrank *lr) {
    if (c->failed || T <= 0) return;
    sk_args a = {};
    a.n = 1;
    a.act = act;
    sk_set_norm(a, norm);
    a.out[0] = g;
    a.out[1] = u;
    a.w[0] = wg;
    a.w[1] = wu;
    a.O[0] = a.O[1] = F;
    if (sk_set_lowrank(a, lr, 2) && skinny(c, a, inp, norm, T, I)) return;
    inp = norm_apart(c, norm, inp, T, I);
    bf16 *const o[2] = {g, u};
    const bf16 *const w[2] = {wg, wu}, *const b[2] = {NULL, NULL};
    const int O[2] = {F, F};
    matmul_fwd_n_cuda(c, o, w, b, b, O, 2, inp, NULL, T, I, lr);
    swiglu_fwd_cuda(c, act, g, u, (long long)T * F);
}

void matmul_bwd_cuda(cu_ctx *c, bf16 *dinp, float *dw, float *dbias, const bf16 *dout, const bf16 *inp, const bf16 *w, int T,
                     int I, int O) {
    if (c->failed || T <= 0) return;
    if (dinp) gemm_lt(c, 0, 0, I, T, O, 1.0f, w, I, dout, O, 1.0f, dinp, I, 0, NULL);
    if (dw) gemm_lt(c, 0, 1, I, O, T, 1.0f, inp, I, dout, O, 1.0f, dw, I, 1, NULL);
    if (dbias && !c->failed) {
        bias_grad_kernel<<<(O + 31) / 32, dim3(32, 32), 0, c->stream>>>(dbias, dout, T, O);
        CU_LAUNCHED(c, "bias_grad_kernel");
    }
}
