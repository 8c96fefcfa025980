/* rmsnorm.cu — CUDA RMSNorm (also Qwen3's per-head q/k norm: rows = T*H, C = D) and its fused
 * neighbours of rmsnorm.h: the q/k norm + RoPE, and qkv_rope_fwd (with the KV-cache writes).
 * One warp per row, V-wide bf16 vector accesses (bf16_vec.cuh), statistics in fp32.
 *
 * Backward, the weight gradient: each warp sums its rows' dy*n into its own slice of shared
 * memory (no atomics: a lane always owns the same columns; the slice is stored lane-major,
 * [chunk][j][lane], so a warp's accesses hit 32 different banks), the block adds its warps'
 * slices into one fp32 row of a (blocks, C) scratch, and a second kernel sums that over the
 * blocks in a fixed order into dw. The result is deterministic for a given device.
 * The q/k norm + RoPE backward keeps each lane's D/32 columns in registers instead. */
#include "kernels/bf16_vec.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "kernels/elementwise.cuh"

enum { RMS_WARPS = 8 };

/* ---------------------------------------------------------------- forward */

/* out = w * inp * rstd: a warp a row, lanes on V-wide chunks (the few-row GEMM of matmul.cu
 * computes rstd with this same arithmetic when it norms its input itself). */
template <int V>
__global__ void rmsnorm_fwd_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int T, int C, float eps) {
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * RMS_WARPS + (threadIdx.x >> 5);
    if (row >= T) return;
    size_t o = (size_t)row * C;
    float ss = 0;
    for (int i = lane * V; i < C; i += 32 * V) {
        float x[V];
        vload<V>(x, inp + o + i);
#pragma unroll
        for (int j = 0; j < V; j++) ss += x[j] * x[j];
    }
    float r = rsqrtf(warp_sum(ss) / C + eps);
    if (rstd && lane == 0) rstd[row] = r;
    for (int i = lane * V; i < C; i += 32 * V) {
        float x[V], wv[V];
        vload<V>(x, inp + o + i);
        vload<V>(wv, w + i);
#pragma unroll
        for (int j = 0; j < V; j++) x[j] = wv[j] * (x[j] * r);
        vstore<V>(out + o + i, x);
    }
}

/* Few rows (decode, T <= RMS_SMALL_T): the same contract with a block of RMS_SMALL_NT threads
 * per row, so a step's handful of rows is spread over as many SMs instead of one warp each;
 * the row's V-chunks stay in registers between the two passes (C <= RMS_SMALL_NT V RMS_SMALL_K).
 * Its sum order is not the warp kernel's: exact mode (tune.exact) runs the warp kernel at any T. */
enum { RMS_SMALL_T = 64, RMS_SMALL_NT = 256, RMS_SMALL_K = 4 };
template <int V>
__global__ void __launch_bounds__(RMS_SMALL_NT)
    rmsnorm_fwd_small_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int C, float eps) {
    __shared__ float part[RMS_SMALL_NT / 32];
    pdl_wait();
    pdl_trigger();
    const int row = blockIdx.x, lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    const size_t o = (size_t)row * C;
    float x[RMS_SMALL_K][V], ss = 0;
#pragma unroll
    for (int k = 0; k < RMS_SMALL_K; k++) {
        const int i = (k * RMS_SMALL_NT + threadIdx.x) * V;
        if (i >= C) break;
        vload<V>(x[k], inp + o + i);
#pragma unroll
        for (int j = 0; j < V; j++) ss += x[k][j] * x[k][j];
    }
    ss = warp_sum(ss);
    if (lane == 0) part[wp] = ss;
    __syncthreads();
    ss = 0;
#pragma unroll
    for (int k = 0; k < RMS_SMALL_NT / 32; k++) ss += part[k];
    const float r = rsqrtf(ss / C + eps);
    if (rstd && threadIdx.x == 0) rstd[row] = r;
#pragma unroll
    for (int k = 0; k < RMS_SMALL_K; k++) {
        const int i = (k * RMS_SMALL_NT + threadIdx.x) * V;
        if (i >= C) break;
        float wv[V];
        vload<V>(wv, w + i);
#pragma unroll
        for (int j = 0; j < V; j++) x[k][j] = wv[j] * (x[k][j] * r);
        vstore<V>(out + o + i, x[k]);
    }
}

/* The RoPE partner of a lane's element j (rotate_half: element i pairs with i + D/2, which is
 * lane ^ 16 when D = 32 V) and the sign of the sin term: out = y cos + sgn * partner sin. */
__device__ __forceinline__ float rope_sgn(int lane) { return lane < 16 ? -1.0f : 1.0f; }

/* qkv_rope_fwd, D = 32 V: one warp a row of D, rows t * per + j: j < H a q head, j < H + K a k
 * head (into row rows[t] of k_out), then (per = H + 2K) the v heads copied to their row; the
 * norm (skipped when its weight is NULL) stays in fp32 into the rotation. */
template <int V>
__global__ void qkv_rope_fwd_kernel(qkv_rope_io io, const int *pos, const float *inv_freq, int T, int H, int K, int D, int per,
                                    float eps) {
    pdl_wait();
    pdl_trigger();
    int lane = threadIdx.x & 31;
    int row = blockIdx.x * RMS_WARPS + (threadIdx.x >> 5);
    if (row >= T * per) return;
    int t = row / per, j = row % per;
    size_t r = io.rows ? (size_t)io.rows[t] : (size_t)t;
    const bf16 *src, *w;
    bf16 *dst;
    float *rs;
    if (j < H) {
        src = (const bf16 *)io.q + ((size_t)t * H + j) * D;
        dst = (bf16 *)io.q_out + ((size_t)t * H + j) * D;
        w = (const bf16 *)io.qw;
        rs = io.rstd_q ? io.rstd_q + (size_t)t * H + j : NULL;
    } else if (j < H + K) {
        j -= H;
        src = (const bf16 *)io.k + ((size_t)t * K + j) * D;
        dst = (bf16 *)io.k_out + (r * K + j) * D;
        w = (const bf16 *)io.kw;
        rs = io.rstd_k ? io.rstd_k + (size_t)t * K + j : NULL;
    } else {
        j -= H + K;
        float x[V];
        vload<V>(x, (const bf16 *)io.v + ((size_t)t * K + j) * D + lane * V);
        vstore<V>((bf16 *)io.v_out + (r * K + j) * D + lane * V, x);
        return;
    }
    float x[V], y[V];
    vload<V>(x, src + lane * V);
    if (w) {
        float wv[V], ss = 0;
        vload<V>(wv, w + lane * V);
#pragma unroll
        for (int i = 0; i < V; i++) ss += x[i] * x[i];
        float rr = rsqrtf(warp_sum(ss) / D + eps);
        if (rs && lane == 0) *rs = rr;
#pragma unroll
        for (int i = 0; i < V; i++) x[i] = wv[i] * (x[i] * rr);
    }
    float p = (float)pos[t], sgn = rope_sgn(lane);
#pragma unroll
    for (int i = 0; i < V; i++) {
        float q = __shfl_xor_sync(0xffffffffu, x[i], 16), sn, co;
        sincosf(p * inv_freq[(lane & 15) * V + i], &sn, &co);
        y[i] = x[i] * co + sgn * q * sn;
    }
    vstore<V>(dst + lane * V, y);
}

/* ---------------------------------------------------------------- backward */

/* dx = r (w dy - n mean(w dy n)), n = x r, added into dinp (accumulate) or written (dinp may
 * then alias dout); partial[block] (C) = the block's sum of dy n.
 * Shared memory: warps * cpad floats, cpad = C rounded up to 32 V. */
template <int V>
__global__ void rmsnorm_bwd_kernel(bf16 *dinp, float *partial, const bf16 *dout, const bf16 *inp, const bf16 *w,
                                   const float *rstd, int T, int C, int accumulate) {
    extern __shared__ float acc[];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int cpad = (C + 32 * V - 1) / (32 * V) * (32 * V);
    float *my = acc + (size_t)warp * cpad; /* my[(k V + j) 32 + lane]: chunk k, element j */
    for (int i = lane; i < cpad; i += 32) my[i] = 0;
    __syncwarp();
    for (int row = blockIdx.x * nw + warp; row < T; row += gridDim.x * nw) {
        size_t o = (size_t)row * C;
        float r = rstd[row], dot = 0;
#pragma unroll 2
        for (int i = lane * V, k = 0; i < C; i += 32 * V, k++) {
            float x[V], g[V], wv[V];
            vload<V>(x, inp + o + i);
            vload<V>(g, dout + o + i);
            vload<V>(wv, w + i);
#pragma unroll
            for (int j = 0; j < V; j++) {
                float gn = g[j] * x[j] * r;
                my[(k * V + j) * 32 + lane] += gn;
                dot += wv[j] * gn;
            }
        }
        float mean = warp_sum(dot) / C;
        for (int i = lane * V; i < C; i += 32 * V) {
            float x[V], g[V], wv[V], d[V];
            vload<V>(x, inp + o + i);
            vload<V>(g, dout + o + i);
            vload<V>(wv, w + i);
            if (accumulate) vload<V>(d, dinp + o + i);
#pragma unroll
            for (int j = 0; j < V; j++) {
                float v = r * (wv[j] * g[j] - x[j] * r * mean);
                d[j] = accumulate ? d[j] + v : v;
            }
            vstore<V>(dinp + o + i, d);
        }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        int k = c / (32 * V), rem = c % (32 * V), idx = (k * V + rem % V) * 32 + rem / V;
        float s = 0;
        for (int q = 0; q < nw; q++) s += acc[(size_t)q * cpad + idx];
        partial[(size_t)blockIdx.x * C + c] = s;
    }
}

/* q/k norm + RoPE backward, D = 32 V: dout is the gradient of the rotated output; it is rotated
 * back (angle -> -angle), then the norm's backward writes dinp. */
template <int V>
__global__ void rmsnorm_rope_bwd_kernel(bf16 *dinp, float *partial, const bf16 *dout, const bf16 *inp, const bf16 *w,
                                        const float *rstd, const int *pos, const float *inv_freq, int rows, int H, int D) {
    __shared__ float acc[RMS_WARPS][32 * V];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float wv[V], f[V], a[V], sgn = rope_sgn(lane);
    vload<V>(wv, w + lane * V);
#pragma unroll
    for (int j = 0; j < V; j++) {
        f[j] = inv_freq[(lane & 15) * V + j];
        a[j] = 0;
    }
    for (int row = blockIdx.x * RMS_WARPS + warp; row < rows; row += gridDim.x * RMS_WARPS) {
        size_t o = (size_t)row * D + lane * V;
        float x[V], g[V], r = rstd[row], p = (float)pos[row / H], dot = 0;
        vload<V>(x, inp + o);
        vload<V>(g, dout + o);
#pragma unroll
        for (int j = 0; j < V; j++) {
            float q = __shfl_xor_sync(0xffffffffu, g[j], 16), s, co;
            sincosf(p * f[j], &s, &co);
            g[j] = g[j] * co - sgn * q * s;
            float gn = g[j] * x[j] * r;
            a[j] += gn;
            dot += wv[j] * gn;
        }
        float mean = warp_sum(dot) / D;
#pragma unroll
        for (int j = 0; j < V; j++) x[j] = r * (wv[j] * g[j] - x[j] * r * mean);
        vstore<V>(dinp + o, x);
    }
#pragma unroll
    for (int j = 0; j < V; j++) acc[warp][lane * V + j] = a[j];
    __syncthreads();
    for (int c = threadIdx.x; c < D; c += blockDim.x) {
        float s = 0;
        for (int q = 0; q < RMS_WARPS; q++) s += acc[q][c];
        partial[(size_t)blockIdx.x * D + c] = s;
    }
}

/* dw (C) += sum over nb rows of partial (nb, C), in a fixed order. Block (32, 8). */
__global__ void rmsnorm_dw_kernel(float *dw, const float *partial, int nb, int C) {
    __shared__ float sh[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0;
    if (c < C)
        for (int b = threadIdx.y; b < nb; b += 8) s += partial[(size_t)b * C + c];
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0;
        for (int k = 0; k < 8; k++) t += sh[k][threadIdx.x];
        dw[c] += t;
    }
}

/* ---------------------------------------------------------------- launchers */

static void fwd_launch(cu_ctx *c, bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int T, int C, float eps) {
    if (c->failed || T <= 0) return;
    int vw = vec_width(C, out, inp, w, NULL, NULL);
    if (T <= RMS_SMALL_T && !cu_exact(c) && vw >= 4 && C <= RMS_SMALL_NT * vw * RMS_SMALL_K) {
        cu_launch_pdl(c, "rmsnorm_fwd_small_kernel", vw == 8 ? rmsnorm_fwd_small_kernel<8> : rmsnorm_fwd_small_kernel<4>, dim3(T),
                      dim3(RMS_SMALL_NT), 0, out, rstd, inp, w, C, eps);
        return;
    }
    unsigned blocks = cu_blocks(T, RMS_WARPS);
    switch (vw) {
    case 8: rmsnorm_fwd_kernel<8><<<blocks, RMS_WARPS * 32, 0, c->stream>>>(out, rstd, inp, w, T, C, eps); break;
    case 4: rmsnorm_fwd_kernel<4><<<blocks, RMS_WARPS * 32, 0, c->stream>>>(out, rstd, inp, w, T, C, eps); break;
    case 2: rmsnorm_fwd_kernel<2><<<blocks, RMS_WARPS * 32, 0, c->stream>>>(out, rstd, inp, w, T, C, eps); break;
    default: rmsnorm_fwd_kernel<1><<<blocks, RMS_WARPS * 32, 0, c->stream>>>(out, rstd, inp, w, T, C, eps);
    }
    CU_LAUNCHED(c, "rmsnorm_fwd_kernel");
}

/* sum the partials of nb blocks into dw */
static void dw_launch(cu_ctx *c, float *dw, const float *partial, int nb, int C) {
    rmsnorm_dw_kernel<<<cu_blocks(C, 32), dim3(32, 8), 0, c->stream>>>(dw, partial, nb, C);
    CU_LAUNCHED(c, "rmsnorm_dw_kernel");
}

template <int V>
static void bwd_launch_v(cu_ctx *c, bf16 *dinp, float *dw, const bf16 *dout, const bf16 *inp, const bf16 *w, const float *rstd,
                         int T, int C, int accumulate) {
    int nw = 12288 / C; /* warps per block: at most 48 KiB of shared memory where C allows */
    nw = nw < 1 ? 1 : nw > RMS_WARPS ? RMS_WARPS : nw;
    size_t cpad = (size_t)(C + 32 * V - 1) / (32 * V) * (32 * V), smem = (size_t)nw * cpad * sizeof(float);
    if (smem > 48 * 1024)
        CU_CK(c, cudaFuncSetAttribute(rmsnorm_bwd_kernel<V>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    int occ = 0;
    CU_CK(c, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, rmsnorm_bwd_kernel<V>, nw * 32, smem));
    unsigned blocks = cu_blocks(T, nw), cap = (unsigned)(c->n_sm * (occ > 0 ? occ : 1));
    if (blocks > cap) blocks = cap;
    float *partial = (float *)cu_scratch(c, (size_t)blocks * C * sizeof(float));
    if (c->failed) return;
    rmsnorm_bwd_kernel<V><<<blocks, nw * 32, smem, c->stream>>>(dinp, partial, dout, inp, w, rstd, T, C, accumulate);
    CU_LAUNCHED(c, "rmsnorm_bwd_kernel");
    dw_launch(c, dw, partial, (int)blocks, C);
}

static void bwd_launch(cu_ctx *c, bf16 *dinp, float *dw, const bf16 *dout, const bf16 *inp, const bf16 *w, const float *rstd,
                       int T, int C, int accumulate) {
    if (c->failed || T <= 0) return;
    switch (vec_width(C, dinp, dout, inp, w, NULL)) {
    case 8: bwd_launch_v<8>(c, dinp, dw, dout, inp, w, rstd, T, C, accumulate); break;
    case 4: bwd_launch_v<4>(c, dinp, dw, dout, inp, w, rstd, T, C, accumulate); break;
    case 2: bwd_launch_v<2>(c, dinp, dw, dout, inp, w, rstd, T, C, accumulate); break;
    default: bwd_launch_v<1>(c, dinp, dw, dout, inp, w, rstd, T, C, accumulate);
    }
}

void rmsnorm_fwd_cuda(cu_ctx *c, bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int T, int C, float eps) {
    fwd_launch(c, out, rstd, inp, w, T, C, eps);
}

void rmsnorm_bwd_cuda(cu_ctx *c, bf16 *dinp, float *dw, const bf16 *dout, const bf16 *inp, const bf16 *w, const float *rstd,
                      int T, int C) {
    bwd_launch(c, dinp, dw, dout, inp, w, rstd, T, C, 1);
}

/* The fused q/k kernels need D = 32 V with V-aligned rows (D = 32, 64, 128); other head dims
 * run the ops apart. */
static int rope_v(int D, const void *a, const void *b, const void *d, const void *w) {
    int v = D / 32;
    return D % 32 == 0 && (v == 1 || v == 2 || v == 4) && vec_width(D, a, b, d, w, NULL) >= v ? v : 0;
}

/* The fallback's q or k: norm (when w) into out, or a copy, then RoPE in place. */
static void norm_rope_apart(cu_ctx *c, bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, const int *pos,
                            const float *inv_freq, int T, int heads, int D, float eps) {
    if (w) rmsnorm_fwd_cuda(c, out, rstd, inp, w, T * heads, D, eps);
    else if (out != inp)
        CU_CK(c, cudaMemcpyAsync(out, inp, (size_t)T * heads * D * sizeof(bf16), cudaMemcpyDeviceToDevice, c->stream));
    rope_fwd_cuda(c, out, pos, inv_freq, T, heads, D);
}

/* One launch when D = 32 V with aligned rows; otherwise the ops apart (k through scratch when
 * it goes to other rows). */
void qkv_rope_fwd_cuda(cu_ctx *c, const qkv_rope_io *io, const int *pos, const float *inv_freq, int T, int H, int K, int D,
                       float eps) {
    if (c->failed || T <= 0) return;
    const int copy_v = io->rows || io->v_out != io->v, per = H + K + (copy_v ? K : 0);
    int v = rope_v(D, io->q_out, io->q, io->k_out, io->k);
    if (v && rope_v(D, io->v_out, io->v, io->qw, io->kw) < v) v = 0;
    if (v) {
        cu_launch_pdl(c, "qkv_rope_fwd_kernel",
                      v == 4       ? qkv_rope_fwd_kernel<4>
                          : v == 2 ? qkv_rope_fwd_kernel<2>
                                   : qkv_rope_fwd_kernel<1>,
                      dim3(cu_blocks((long long)T * per, RMS_WARPS)), dim3(RMS_WARPS * 32), 0, *io, pos, inv_freq, T, H, K, D,
                      per, eps);
        return;
    }
    size_t kn = (size_t)T * K * D;
    bf16 *k_dst = io->rows ? (bf16 *)cu_scratch(c, kn * sizeof(bf16)) : (bf16 *)io->k_out;
    if (c->failed) return;
    norm_rope_apart(c, (bf16 *)io->q_out, io->rstd_q, (const bf16 *)io->q, (const bf16 *)io->qw, pos, inv_freq, T, H, D, eps);
    norm_rope_apart(c, k_dst, io->rstd_k, (const bf16 *)io->k, (const bf16 *)io->kw, pos, inv_freq, T, K, D, eps);
    if (io->rows) {
        scatter_rows_cuda(c, (bf16 *)io->k_out, k_dst, io->rows, T, K * D);
        scatter_rows_cuda(c, (bf16 *)io->v_out, (const bf16 *)io->v, io->rows, T, K * D);
    } else if (copy_v) CU_CK(c, cudaMemcpyAsync(io->v_out, io->v, kn * sizeof(bf16), cudaMemcpyDeviceToDevice, c->stream));
}

template <int V>
static void rope_bwd_launch_v(cu_ctx *c, bf16 *dinp, float *dw, const bf16 *dout, const bf16 *inp, const bf16 *w,
                              const float *rstd, const int *pos, const float *inv_freq, int rows, int H, int D) {
    int occ = 0;
    CU_CK(c, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, rmsnorm_rope_bwd_kernel<V>, RMS_WARPS * 32, 0));
    unsigned blocks = cu_blocks(rows, RMS_WARPS), cap = (unsigned)(c->n_sm * (occ > 0 ? occ : 1));
    if (blocks > cap) blocks = cap;
    float *partial = (float *)cu_scratch(c, (size_t)blocks * D * sizeof(float));
    if (c->failed) return;
    rmsnorm_rope_bwd_kernel<V>
        <<<blocks, RMS_WARPS * 32, 0, c->stream>>>(dinp, partial, dout, inp, w, rstd, pos, inv_freq, rows, H, D);
    CU_LAUNCHED(c, "rmsnorm_rope_bwd_kernel");
    dw_launch(c, dw, partial, (int)blocks, D);
}

void qk_norm_rope_bwd_cuda(cu_ctx *c, bf16 *dinp, float *dw, const bf16 *dout, const bf16 *inp, const bf16 *w, const float *rstd,
                           const int *pos, const float *inv_freq, int T, int H, int D) {
    if (c->failed || T <= 0) return;
    int rows = T * H;
    switch (rope_v(D, dinp, dout, inp, w)) {
    case 4: rope_bwd_launch_v<4>(c, dinp, dw, dout, inp, w, rstd, pos, inv_freq, rows, H, D); break;
    case 2: rope_bwd_launch_v<2>(c, dinp, dw, dout, inp, w, rstd, pos, inv_freq, rows, H, D); break;
    case 1: rope_bwd_launch_v<1>(c, dinp, dw, dout, inp, w, rstd, pos, inv_freq, rows, H, D); break;
    default: /* rotate back in dinp, then the norm's backward in place (overwrite mode allows it) */
        CU_CK(c, cudaMemcpyAsync(dinp, dout, (size_t)rows * D * sizeof(bf16), cudaMemcpyDeviceToDevice, c->stream));
        rope_bwd_cuda(c, dinp, pos, inv_freq, T, H, D);
        bwd_launch(c, dinp, dw, dinp, inp, w, rstd, rows, D, 0);
    }
}
