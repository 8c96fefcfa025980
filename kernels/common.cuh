/* common.cuh — what every kernels/NAME.cu shares: the CUDA context the launchers run on (stream,
 * cuBLASLt handle and workspace, a grow-only scratch buffer, the sticky error), the check
 * macros that record a failed call with its text and file:line, bf16 helpers and warp/block
 * reductions. Only the engine thread touches a cu_ctx (STYLE.md: one thread owns the context).
 *
 * Errors: a failed CUDA or cuBLAS call marks the context failed with a message naming the call;
 * later launchers return early (the backend's sync() reports the first failure). Launchers
 * check their launch with CU_LAUNCHED(ctx, "kernel_name"). */
#ifndef GRPOD_KERNELS_COMMON_CUH
#define GRPOD_KERNELS_COMMON_CUH
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>

#include "kernels/tune.h"

typedef __nv_bfloat16 bf16;

#define CU_RED_SLOTS 4096 /* sumsq blocks at most: one partial each */
typedef struct cu_ctx {
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *blas; /* cublasHandle_t for GEMMs cuBLASLt has no algorithm for; lazy */
    void *lt_ws; /* cuBLASLt workspace */
    size_t lt_ws_bytes;
    void *scratch; /* grow-only; stream-ordered reuse by one op at a time */
    size_t scratch_bytes;
    double *red; /* (CU_RED_SLOTS) sumsq's per-block partials */
    void *gemm_cache; /* matmul.cu's plans for this context (gemm_cache_free) */
    void *gg_host; /* gemm_grouped.cu's kept tensor maps and staging (gemm_grouped_free) */
    int rms_smem_raised; /* rmsnorm_bwd_kernel's shared-memory limit raised */
    unsigned *sk_sync; /* (2) device: the few-row kernel's grid-wide counters (matmul.cu), 0 at rest */
    int n_sm;
    const tune_opts *tune; /* the backend's knobs (eng_backend.tune), read at each launch */
    int failed;
    char msg[512];
} cu_ctx;

/* Exact mode (tune.exact): every op computes a row with one order for any row count. */
static inline int cu_exact(const cu_ctx *c) { return c->tune && c->tune->exact; }

/* Records the first failure: "call -> error (file:line)". */
static inline void cu_fail(cu_ctx *c, const char *call, const char *what, const char *file, int line) {
    if (c->failed) return;
    c->failed = 1;
    snprintf(c->msg, sizeof c->msg, "%s -> %s (%s:%d)", call, what, file, line);
}

#define CU_CK(ctx, call) \
    do { \
        cudaError_t e_ = (call); \
        if (e_ != cudaSuccess) cu_fail((ctx), #call, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)
#define LT_CK(ctx, call) \
    do { \
        cublasStatus_t s_ = (call); \
        if (s_ != CUBLAS_STATUS_SUCCESS) cu_fail((ctx), #call, cublasGetStatusString(s_), __FILE__, __LINE__); \
    } while (0)
#define CU_LAUNCHED(ctx, name) \
    do { \
        cudaError_t e_ = cudaGetLastError(); \
        if (e_ != cudaSuccess) cu_fail((ctx), "launch of " name, cudaGetErrorString(e_), __FILE__, __LINE__); \
    } while (0)

/* Scratch of at least `bytes`, 256-byte aligned; grows (synchronously) only when a larger size
 * is first asked for, so steady-state steps allocate nothing. NULL (ctx failed) on failure. */
static inline void *cu_scratch(cu_ctx *c, size_t bytes) {
    if (c->failed) return NULL;
    if (bytes <= c->scratch_bytes) return c->scratch;
    if (c->scratch) {
        CU_CK(c, cudaStreamSynchronize(c->stream));
        CU_CK(c, cudaFree(c->scratch));
    }
    c->scratch = NULL;
    c->scratch_bytes = 0;
    size_t n = (bytes + (1u << 20) - 1) & ~(size_t)((1u << 20) - 1);
    CU_CK(c, cudaMalloc(&c->scratch, n));
    if (c->failed) {
        c->scratch = NULL;
        return NULL;
    }
    c->scratch_bytes = n;
    return c->scratch;
}

static inline unsigned cu_blocks(long long n, int threads) {
    long long b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 2147483647LL ? 2147483647LL : b);
}

#ifdef __CUDACC__
#include <stdlib.h>
/* Programmatic dependent launch (sm_90): a kernel launched by cu_launch_pdl may start while
 * the kernel before it in the stream is still running; it must call pdl_wait() before it reads
 * anything an earlier kernel wrote (what it reads before, such as weights, must be written
 * by nothing in flight) and before it exits, and calls pdl_trigger() to let the next kernel
 * start early. Both are no-ops in a kernel launched the ordinary way. Used on the decode
 * step's chain of short kernels (the few-row GEMM prefetches its weights before the wait), so
 * each one's launch and prologue overlap the one before. GRPOD_TUNE_PDL=0 launches them plainly. */
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

/* A launch with programmatic dependent launch (unless tune.pdl is 0) and, when cluster > 1, thread
 * block clusters of `cluster` blocks along x (grid.x a multiple of it). */
template <typename... KArgs, typename... Args>
static inline void cu_launch_ex(cu_ctx *c, const char *name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                int cluster, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[2];
    unsigned n = 0;
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    if (c->tune->pdl) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster > 1) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = (unsigned)cluster;
        at[n].val.clusterDim.y = at[n].val.clusterDim.z = 1;
        n++;
    }
    cfg.attrs = at;
    cfg.numAttrs = n;
    cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...);
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) cu_fail(c, name, cudaGetErrorString(e), __FILE__, __LINE__);
}
template <typename... KArgs, typename... Args>
static inline void cu_launch_pdl(cu_ctx *c, const char *name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                 Args... args) {
    cu_launch_ex(c, name, kernel, grid, block, smem, 1, args...);
}

/* Raises kernel's dynamic shared-memory limit to bytes, once per device ordinal (done: the
 * caller's static bit set, one per kernel), so it happens before any graph capture. */
template <typename Kernel> static inline void cu_raise_smem(cu_ctx *c, Kernel kernel, size_t bytes, unsigned *done) {
    int dev = 0;
    CU_CK(c, cudaGetDevice(&dev));
    /* done: a bit per device, set with atomics (the ranks of one process set theirs at once) */
    if (c->failed || (__atomic_load_n(done, __ATOMIC_ACQUIRE) & (1u << (dev & 31)))) return;
    CU_CK(c, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    if (!c->failed) __atomic_fetch_or(done, 1u << (dev & 31), __ATOMIC_ACQ_REL);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
 * sh: 32 floats of shared memory. Contains __syncthreads(). */
__device__ __forceinline__ float block_sum(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : 0.0f;
    return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float *sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < nw ? sh[lane] : -INFINITY;
    return warp_max(v);
}
/* dw[i] += Σ_b part[b n + i] over b in order, a thread per i (the second pass of a weight
 * gradient summed over row blocks: a fixed order, no atomics). A template: one per unit. */
template <int = 0> __global__ void cu_sum_parts_kernel(float *dw, const float *part, int nparts, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float acc = 0;
    for (int b = 0; b < nparts; b++) acc += part[(size_t)b * n + i];
    dw[i] += acc;
}
#endif
#endif
