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
 * odd vocabulary) falls back to cublasGemmEx, with the bias added by a kernel. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>

#include "kernels/cuda_ops.cuh"

typedef struct {
    int transa, transb, m, n, k, lda, ldb, ldd, d_f32, bias, align;
} gemm_key;

enum { GEMM_CANDS = 16, GEMM_TUNE_N = 64 };

typedef struct {
    gemm_key key;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t a, b, d;
    cublasLtMatmulAlgo_t algo;
    int fallback;               /* no cuBLASLt algorithm: cublasGemmEx */
    int n_algo;                 /* small n: candidates still to time at the next uncaptured beta-0 call */
    cublasLtMatmulAlgo_t cand[GEMM_CANDS];
} gemm_plan;

enum { GEMM_CACHE = 128 };
typedef struct { gemm_plan p[GEMM_CACHE]; int n; } gemm_cache;   /* one per cu_ctx: its thread only */

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
    LT_CK(c, cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, key->transa ? key->k : key->m,
                                        key->transa ? key->m : key->k, key->lda));
    LT_CK(c, cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, key->transb ? key->n : key->k,
                                        key->transb ? key->k : key->n, key->ldb));
    LT_CK(c, cublasLtMatrixLayoutCreate(&p.d, dt, key->m, key->n, key->ldd));
    cublasLtMatmulPreference_t pref;
    LT_CK(c, cublasLtMatmulPreferenceCreate(&pref));
    if (c->failed) return NULL;
    uint32_t al = (uint32_t)key->align;
    LT_CK(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &c->lt_ws_bytes,
                                                  sizeof c->lt_ws_bytes));
    LT_CK(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al));
    LT_CK(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al, sizeof al));
    LT_CK(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al, sizeof al));
    LT_CK(c, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al, sizeof al));
    cublasLtMatmulHeuristicResult_t h[GEMM_CANDS];
    int found = 0, want = key->n <= GEMM_TUNE_N ? GEMM_CANDS : 1;
    LT_CK(c, cublasLtMatmulAlgoGetHeuristic(c->lt, p.op, p.a, p.b, p.d, p.d, pref, want, h, &found));
    cublasLtMatmulPreferenceDestroy(pref);
    if (c->failed) return NULL;
    if (found < 1) p.fallback = 1;
    else p.algo = h[0].algo;
    if (found > 1) {
        p.n_algo = found;
        for (int i = 0; i < found; i++) p.cand[i] = h[i].algo;
    }
    if (gc->n == GEMM_CACHE) {   /* full: drop the oldest half */
        for (int i = 0; i < GEMM_CACHE / 2; i++) plan_destroy(&gc->p[i]);
        memmove(gc->p, gc->p + GEMM_CACHE / 2, sizeof(gemm_plan) * (GEMM_CACHE / 2));
        gc->n = GEMM_CACHE / 2;
    }
    gc->p[gc->n] = p;
    return &gc->p[gc->n++];
}

/* Small n (few rows: decode): the heuristic's first choice is often a large tile far from the
 * weight-read floor, so the first uncaptured call with beta = 0 (D may be overwritten) times
 * every candidate (2 warm-up + 5 timed runs each) and keeps the fastest. */
static void tune(cu_ctx *c, gemm_plan *p, float alpha, const void *A, const void *B, void *D) {
    cudaStreamCaptureStatus cs;
    if (cudaStreamIsCapturing(c->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return;
    cudaEvent_t e0, e1;
    if (cudaEventCreate(&e0) != cudaSuccess || cudaEventCreate(&e1) != cudaSuccess) { cudaGetLastError(); return; }
    float beta = 0.0f, best = 1e30f;
    int bi = 0;
    for (int i = 0; i < p->n_algo; i++) {
        int ok = 1;
        for (int r = 0; r < 7 && ok; r++) {
            if (r == 2) cudaEventRecord(e0, c->stream);
            ok = cublasLtMatmul(c->lt, p->op, &alpha, A, p->a, B, p->b, &beta, D, p->d, D, p->d, &p->cand[i], c->lt_ws,
                                c->lt_ws_bytes, c->stream) == CUBLAS_STATUS_SUCCESS;
        }
        cudaEventRecord(e1, c->stream);
        float ms = 1e30f;
        if (cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&ms, e0, e1) != cudaSuccess) ok = 0;
        if (ok && ms < best) { best = ms; bi = i; }
    }
    cudaGetLastError();
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    p->algo = p->cand[bi];
    p->n_algo = 0;
}

__global__ void add_bias_kernel(bf16 *D, const bf16 *bias, int m, int n, int ldd) {
    long long total = (long long)m * n;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        long long col = i / m, row = i - col * m;
        bf16 *d = D + col * ldd + row;
        *d = __float2bfloat16(__bfloat162float(*d) + __bfloat162float(bias[row]));
    }
}

static void gemm_fallback(cu_ctx *c, const gemm_key *key, float alpha, const void *A, const void *B, float beta,
                          void *D, const bf16 *bias) {
    if (!c->blas) {
        cublasHandle_t h;
        LT_CK(c, cublasCreate(&h));
        if (c->failed) return;
        c->blas = h;
    }
    cublasHandle_t h = (cublasHandle_t)c->blas;
    LT_CK(c, cublasSetStream(h, c->stream));
    LT_CK(c, cublasGemmEx(h, key->transa ? CUBLAS_OP_T : CUBLAS_OP_N, key->transb ? CUBLAS_OP_T : CUBLAS_OP_N, key->m,
                          key->n, key->k, &alpha, A, CUDA_R_16BF, key->lda, B, CUDA_R_16BF, key->ldb, &beta, D,
                          key->d_f32 ? CUDA_R_32F : CUDA_R_16BF, key->ldd, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (bias && !c->failed) {
        long long n = (long long)key->m * key->n;
        unsigned b = cu_blocks(n, 256), cap = (unsigned)c->n_sm * 16;
        add_bias_kernel<<<b < cap ? b : cap, 256, 0, c->stream>>>((bf16 *)D, bias, key->m, key->n, key->ldd);
        CU_LAUNCHED(c, "add_bias_kernel");
    }
}

void gemm_lt(cu_ctx *c, int transa, int transb, int m, int n, int k, float alpha, const void *A, int lda,
             const void *B, int ldb, float beta, void *D, int ldd, int d_is_f32, const bf16 *bias) {
    if (c->failed || m <= 0 || n <= 0) return;
    int al = align_of(A), x;
    if ((x = align_of(B)) < al) al = x;
    if ((x = align_of(D)) < al) al = x;
    if (bias && (x = align_of(bias)) < al) al = x;
    gemm_key key = { transa, transb, m, n, k, lda, ldb, ldd, d_is_f32, bias != NULL, al };
    gemm_plan *p = plan_get(c, &key);
    if (!p) return;
    if (p->fallback) { gemm_fallback(c, &p->key, alpha, A, B, beta, D, bias); return; }
    if (bias) LT_CK(c, cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    if (p->n_algo && beta == 0.0f) tune(c, p, alpha, A, B, D);
    LT_CK(c, cublasLtMatmul(c->lt, p->op, &alpha, A, p->a, B, p->b, &beta, D, p->d, D, p->d, &p->algo, c->lt_ws,
                            c->lt_ws_bytes, c->stream));
}

/* dbias (O) += column sums of dout (T,O): 32 columns x 8 row-strided threads per block. */
__global__ void bias_grad_kernel(float *dbias, const bf16 *dout, int T, int O) {
    __shared__ float part[8][33];
    int o = blockIdx.x * 32 + threadIdx.x;
    float s = 0;
    if (o < O)
        for (int t = blockIdx.y * 8 + threadIdx.y; t < T; t += gridDim.y * 8) s += __bfloat162float(dout[(size_t)t * O + o]);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && o < O) {
        for (int y = 1; y < 8; y++) s += part[y][threadIdx.x];
        atomicAdd(dbias + o, s);
    }
}

/* ---------------------------------------------------------------- few rows (decode) */

/* y (T,O) = x (T,I) W^T + b for T <= TT rows: the weight-read-bound case cuBLASLt serves with
 * large tiles. A warp owns NO consecutive outputs o and all rows; lanes stride I in 8-element
 * (16-byte) pieces, so each weight row is read once, coalesced, and each x piece (L1-resident)
 * feeds NO outputs. Partials are summed through shared memory. */
enum { SM_WARPS = 4 };
template <int TT, int NO>
__global__ void __launch_bounds__(32 * SM_WARPS) small_m_kernel(bf16 *out, const bf16 *x, const bf16 *w,
                                                               const bf16 *bias, int T, int I, int O) {
    __shared__ float red[SM_WARPS][NO * TT][33];
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, o0 = (blockIdx.x * SM_WARPS + wp) * NO;
    float acc[NO][TT];
#pragma unroll
    for (int a = 0; a < NO; a++)
#pragma unroll
        for (int t = 0; t < TT; t++) acc[a][t] = 0.0f;
    for (int i = lane * 8; i < I; i += 256) {
        float wf[NO][8];
#pragma unroll
        for (int a = 0; a < NO; a++) {
            uint4 u = make_uint4(0, 0, 0, 0);
            if (o0 + a < O) u = __ldg((const uint4 *)(w + (size_t)(o0 + a) * I + i));
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
#pragma unroll
            for (int e = 0; e < 4; e++) { float2 f = __bfloat1622float2(h[e]); wf[a][2 * e] = f.x; wf[a][2 * e + 1] = f.y; }
        }
#pragma unroll
        for (int t = 0; t < TT; t++) {
            if (t >= T) break;
            uint4 u = *(const uint4 *)(x + (size_t)t * I + i);
            const __nv_bfloat162 *h = (const __nv_bfloat162 *)&u;
            float xf[8];
#pragma unroll
            for (int e = 0; e < 4; e++) { float2 f = __bfloat1622float2(h[e]); xf[2 * e] = f.x; xf[2 * e + 1] = f.y; }
#pragma unroll
            for (int a = 0; a < NO; a++)
#pragma unroll
                for (int e = 0; e < 8; e++) acc[a][t] = fmaf(wf[a][e], xf[e], acc[a][t]);
        }
    }
#pragma unroll
    for (int a = 0; a < NO; a++)
#pragma unroll
        for (int t = 0; t < TT; t++) red[wp][a * TT + t][lane] = acc[a][t];
    __syncwarp();
    for (int k = lane; k < NO * TT; k += 32) {
        int a = k / TT, t = k % TT, o = o0 + a;
        float sum = 0.0f;
#pragma unroll 8
        for (int l = 0; l < 32; l++) sum += red[wp][k][l];
        if (t < T && o < O) {
            if (bias) sum += __bfloat162float(bias[o]);
            out[(size_t)t * O + o] = __float2bfloat16(sum);
        }
    }
}

/* 1 when the few-row kernel took y = x W^T + b (T <= 32, 16-byte aligned rows). Opt-in with
 * GRPOD_SMALL_M=1: on the H100 it measured 53-88 us per Qwen3-1.7B GEMM at T = 16, slower than
 * cuBLASLt's tuned choice (22-37 us), so it is off until it is made faster. */
static int small_m(cu_ctx *c, bf16 *out, const bf16 *inp, const bf16 *w, const bf16 *bias, int T, int I, int O) {
    const char *e = getenv("GRPOD_SMALL_M");
    if (!(e && e[0] == '1') || T > 32 || I % 8 || align_of(inp) < 16 || align_of(w) < 16) return 0;
    if (T <= 8) {
        small_m_kernel<8, 4><<<(O + 4 * SM_WARPS - 1) / (4 * SM_WARPS), 32 * SM_WARPS, 0, c->stream>>>(out, inp, w, bias, T, I, O);
    } else if (T <= 16) {
        small_m_kernel<16, 2><<<(O + 2 * SM_WARPS - 1) / (2 * SM_WARPS), 32 * SM_WARPS, 0, c->stream>>>(out, inp, w, bias, T, I, O);
    } else {
        small_m_kernel<32, 1><<<(O + SM_WARPS - 1) / SM_WARPS, 32 * SM_WARPS, 0, c->stream>>>(out, inp, w, bias, T, I, O);
    }
    CU_LAUNCHED(c, "small_m_kernel");
    return 1;
}

void matmul_fwd_cuda(cu_ctx *c, bf16 *out, const bf16 *inp, const bf16 *w, const bf16 *bias, int T, int I, int O) {
    if (c->failed || T <= 0) return;
    if (small_m(c, out, inp, w, bias, T, I, O)) return;
    gemm_lt(c, 1, 0, O, T, I, 1.0f, w, I, inp, I, 0.0f, out, O, 0, bias);
}

void matmul_bwd_cuda(cu_ctx *c, bf16 *dinp, float *dw, float *dbias, const bf16 *dout, const bf16 *inp,
                     const bf16 *w, int T, int I, int O) {
    if (c->failed || T <= 0) return;
    if (dinp) gemm_lt(c, 0, 0, I, T, O, 1.0f, w, I, dout, O, 1.0f, dinp, I, 0, NULL);
    if (dw) gemm_lt(c, 0, 1, I, O, T, 1.0f, inp, I, dout, O, 1.0f, dw, I, 1, NULL);
    if (dbias && !c->failed) {
        int gy = (T + 255) / 256;
        dim3 grid((O + 31) / 32, gy < 64 ? gy : 64);
        bias_grad_kernel<<<grid, dim3(32, 8), 0, c->stream>>>(dbias, dout, T, O);
        CU_LAUNCHED(c, "bias_grad_kernel");
    }
}
