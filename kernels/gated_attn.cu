/* gated_attn.cu — the gated full attention's extra ops (gated_attn.h) on CUDA: bf16 in and
 * out, fp32 math. Legend as gated_attn.h (T, H, K, D, R).
 *
 * q/k: a warp per (token, head) row, q rows then k rows in one grid: the per-head RMSNorm, the
 * gain, then the rotation of the first R dims (angle pos·inv_freq in fp32, cos/sin in double,
 * as the CPU reference). Backward: a warp per row un-rotates dy into shared memory, then the
 * norm's backward; dw sums rows in a fixed order (blocks of 512 rows per 32 columns, then their
 * parts in order): no atomics, the same bits twice. The gate is elementwise (its backward may
 * run in place: datt == dy). */
#include "kernels/gated_attn.cuh"

enum { GA_NT = 256, GA_DMAX = 256 };

__device__ __forceinline__ float ga_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* cos, sin of the angle of pair i at position p */
__device__ __forceinline__ void ga_angle(float *c, float *s, int p, const float *inv_freq, int i) {
    double sd, cd;
    sincos((double)((float)p * inv_freq[i]), &sd, &cd);
    *c = (float)cd;
    *s = (float)sd;
}

/* Row `row` of the q rows (T·H, from qg with stride 2D) or the k rows (T·K, from k0). */
struct ga_row {
    const bf16 *x;
    int t, is_q;
    size_t o; /* row index within its kind */
};
__device__ __forceinline__ ga_row ga_pick(long long row, const bf16 *qg, const bf16 *k0, int T, int H, int K, int D) {
    ga_row r;
    long long nq = (long long)T * H;
    r.is_q = row < nq;
    r.o = (size_t)(r.is_q ? row : row - nq);
    r.t = (int)(r.is_q ? r.o / H : r.o / K);
    r.x = r.is_q ? qg + r.o * 2 * D : k0 + r.o * D;
    return r;
}

__global__ void ga_qk_fwd_kernel(bf16 *q, bf16 *k, float *rstdq, float *rstdk, const bf16 *qg, const bf16 *k0, const bf16 *wq,
                                 const bf16 *wk, const int *pos, const float *inv_freq, int T, int H, int K, int D, int R,
                                 float eps) {
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31, half = R / 2;
    if (row >= (long long)T * (H + K)) return;
    ga_row g = ga_pick(row, qg, k0, T, H, K, D);
    const bf16 *w = g.is_q ? wq : wk;
    bf16 *y = (g.is_q ? q : k) + g.o * D;
    float ss = 0;
    for (int i = lane; i < D; i += 32) {
        float v = __bfloat162float(g.x[i]);
        ss += v * v;
    }
    float r = rsqrtf(warp_sum(ss) / D + eps);
    if (lane == 0) (g.is_q ? rstdq : rstdk)[g.o] = r;
    int p = pos[g.t];
    for (int i = lane; i < half; i += 32) {
        float c, s, x1 = __bfloat162float(w[i]) * (__bfloat162float(g.x[i]) * r);
        float x2 = __bfloat162float(w[i + half]) * (__bfloat162float(g.x[i + half]) * r);
        ga_angle(&c, &s, p, inv_freq, i);
        y[i] = __float2bfloat16(x1 * c - x2 * s);
        y[i + half] = __float2bfloat16(x2 * c + x1 * s);
    }
    for (int i = R + lane; i < D; i += 32) y[i] = __float2bfloat16(__bfloat162float(w[i]) * (__bfloat162float(g.x[i]) * r));
}

/* dy of row un-rotated into d (D) */
__device__ __forceinline__ void ga_unrotate(float *d, const bf16 *dy, int p, const float *inv_freq, int D, int R, int lane) {
    int half = R / 2;
    for (int i = lane; i < half; i += 32) {
        float c, s, d1 = __bfloat162float(dy[i]), d2 = __bfloat162float(dy[i + half]);
        ga_angle(&c, &s, p, inv_freq, i);
        d[i] = d1 * c + d2 * s;
        d[i + half] = d2 * c - d1 * s;
    }
    for (int i = R + lane; i < D; i += 32) d[i] = __bfloat162float(dy[i]);
}

__global__ void ga_qk_bwd_kernel(bf16 *dqg, bf16 *dk0, const bf16 *dq, const bf16 *dk, const bf16 *qg, const bf16 *k0,
                                 const bf16 *wq, const bf16 *wk, const float *rstdq, const float *rstdk, const int *pos,
                                 const float *inv_freq, int T, int H, int K, int D, int R) {
    __shared__ float sd[GA_NT / 32][GA_DMAX];
    long long row = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int lane = threadIdx.x & 31;
    if (row >= (long long)T * (H + K)) return;
    ga_row g = ga_pick(row, qg, k0, T, H, K, D);
    const bf16 *w = g.is_q ? wq : wk, *dy = (g.is_q ? dq : dk) + g.o * D;
    float *d = sd[threadIdx.x >> 5], r = (g.is_q ? rstdq : rstdk)[g.o], s = 0;
    ga_unrotate(d, dy, pos[g.t], inv_freq, D, R, lane);
    __syncwarp();
    for (int i = lane; i < D; i += 32) s += (__bfloat162float(w[i]) * d[i]) * (__bfloat162float(g.x[i]) * r);
    float mean = warp_sum(s) / D;
    bf16 *dx = g.is_q ? dqg + g.o * 2 * D : dk0 + g.o * D;
    for (int i = lane; i < D; i += 32)
        dx[i] = __float2bfloat16(r * (__bfloat162float(w[i]) * d[i] - __bfloat162float(g.x[i]) * r * mean));
}

/* dw (D) += Σ_rows un-rotated dy ⊙ x r over NH heads of each token, in two passes (the rows are
 * T·NH, 393,216 for a 9B-class q at T 12,288: one block per 32 columns walking all of them was
 * most of the gated layer's backward). Pass 1, block (32, 8) of grid (⌈D/32⌉, ⌈rows/GA_DW_RB⌉):
 * columns blockIdx.x·32 + x over the block's GA_DW_RB rows, row lane y taking rows y, y + 8, ...,
 * the 8 lanes summed in order into part[blockIdx.y][column]; pass 2 adds the parts in block
 * order. A fixed order: the same bits twice. */
enum { GA_DW_RB = 512 };
__global__ void ga_dw_kernel(float *part, const bf16 *dy, const bf16 *x, const float *rstd, const int *pos, const float *inv_freq,
                             int T, int NH, int D, int R, int xstride) {
    __shared__ float acc[8][32];
    int i = blockIdx.x * 32 + threadIdx.x, half = R / 2;
    float s = 0;
    if (i < D) {
        long long rows = (long long)T * NH, r0 = (long long)blockIdx.y * GA_DW_RB, r1 = r0 + GA_DW_RB < rows ? r0 + GA_DW_RB : rows;
        for (long long row = r0 + threadIdx.y; row < r1; row += 8) {
            const bf16 *d = dy + row * D;
            float v;
            if (i < R) {
                float c, sn;
                int j = i < half ? i : i - half;
                ga_angle(&c, &sn, pos[row / NH], inv_freq, j);
                float d1 = __bfloat162float(d[j]), d2 = __bfloat162float(d[j + half]);
                v = i < half ? d1 * c + d2 * sn : d2 * c - d1 * sn;
            } else {
                v = __bfloat162float(d[i]);
            }
            s += v * (__bfloat162float(x[row * xstride + i]) * rstd[row]);
        }
    }
    acc[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && i < D) {
        float t = 0;
        for (int y = 0; y < 8; y++) t += acc[y][threadIdx.x];
        part[(size_t)blockIdx.y * D + i] = t;
    }
}
static void ga_dw(cu_ctx *c, float *dw, const bf16 *dy, const bf16 *x, const float *rstd, const int *pos, const float *inv_freq,
                  int T, int NH, int D, int R, int xstride) {
    int nb = (int)(((long long)T * NH + GA_DW_RB - 1) / GA_DW_RB);
    float *part = (float *)cu_scratch(c, (size_t)nb * D * sizeof(float));
    if (!part) return;
    ga_dw_kernel<<<dim3((D + 31) / 32, nb), dim3(32, 8), 0, c->stream>>>(part, dy, x, rstd, pos, inv_freq, T, NH, D, R, xstride);
    CU_LAUNCHED(c, "ga_dw_kernel");
    cu_sum_parts_kernel<<<cu_blocks(D, 128), 128, 0, c->stream>>>(dw, part, nb, D);
    CU_LAUNCHED(c, "cu_sum_parts_kernel");
}

__global__ void ga_gate_fwd_kernel(bf16 *y, const bf16 *att, const bf16 *qg, long long n, int D) {
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    long long row = e / D;
    int i = (int)(e % D);
    y[e] = __float2bfloat16(__bfloat162float(att[e]) * ga_sigmoid(__bfloat162float(qg[row * 2 * D + D + i])));
}

__global__ void ga_gate_bwd_kernel(bf16 *datt, bf16 *dqg, const bf16 *dy, const bf16 *att, const bf16 *qg, long long n, int D) {
    long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= n) return;
    long long row = e / D;
    int i = (int)(e % D);
    float sg = ga_sigmoid(__bfloat162float(qg[row * 2 * D + D + i])), g = __bfloat162float(dy[e]), a = __bfloat162float(att[e]);
    datt[e] = __float2bfloat16(g * sg);
    dqg[row * 2 * D + D + i] = __float2bfloat16(g * a * sg * (1.0f - sg));
}

/* ---------------------------------------------------------------- launchers */

static int ga_ok(cu_ctx *c, const char *op, int D, int R) {
    if (D > 0 && D <= GA_DMAX && R >= 0 && R <= D && R % 2 == 0) return 1;
    char m[80];
    snprintf(m, sizeof m, "head dim %d (1..%d), rotary dims %d (even, <= D)", D, GA_DMAX, R);
    cu_fail(c, op, m, __FILE__, __LINE__);
    return 0;
}

void gated_attn_qk_fwd_cuda(cu_ctx *c, bf16 *q, bf16 *k, float *rstdq, float *rstdk, const bf16 *qg, const bf16 *k0, const bf16 *wq,
                            const bf16 *wk, const int *pos, const float *inv_freq, int T, int H, int K, int D, int R, float eps) {
    long long rows = (long long)T * (H + K);
    if (c->failed || rows <= 0 || !ga_ok(c, "gated_attn_qk_fwd_cuda", D, R)) return;
    ga_qk_fwd_kernel<<<cu_blocks(rows * 32, GA_NT), GA_NT, 0, c->stream>>>(q, k, rstdq, rstdk, qg, k0, wq, wk, pos, inv_freq, T,
                                                                           H, K, D, R, eps);
    CU_LAUNCHED(c, "ga_qk_fwd_kernel");
}

void gated_attn_qk_bwd_cuda(cu_ctx *c, bf16 *dqg, bf16 *dk0, float *dwq, float *dwk, const bf16 *dq, const bf16 *dk,
                            const bf16 *qg, const bf16 *k0, const bf16 *wq, const bf16 *wk, const float *rstdq,
                            const float *rstdk, const int *pos, const float *inv_freq, int T, int H, int K, int D, int R) {
    long long rows = (long long)T * (H + K);
    if (c->failed || rows <= 0 || !ga_ok(c, "gated_attn_qk_bwd_cuda", D, R)) return;
    ga_qk_bwd_kernel<<<cu_blocks(rows * 32, GA_NT), GA_NT, 0, c->stream>>>(dqg, dk0, dq, dk, qg, k0, wq, wk, rstdq, rstdk, pos,
                                                                           inv_freq, T, H, K, D, R);
    CU_LAUNCHED(c, "ga_qk_bwd_kernel");
    ga_dw(c, dwq, dq, qg, rstdq, pos, inv_freq, T, H, D, R, 2 * D);
    ga_dw(c, dwk, dk, k0, rstdk, pos, inv_freq, T, K, D, R, D);
}

void gated_attn_gate_fwd_cuda(cu_ctx *c, bf16 *y, const bf16 *att, const bf16 *qg, int T, int H, int D) {
    long long n = (long long)T * H * D;
    if (c->failed || n <= 0) return;
    ga_gate_fwd_kernel<<<cu_blocks(n, 256), 256, 0, c->stream>>>(y, att, qg, n, D);
    CU_LAUNCHED(c, "ga_gate_fwd_kernel");
}

void gated_attn_gate_bwd_cuda(cu_ctx *c, bf16 *datt, bf16 *dqg, const bf16 *dy, const bf16 *att, const bf16 *qg, int T, int H,
                              int D) {
    long long n = (long long)T * H * D;
    if (c->failed || n <= 0) return;
    ga_gate_bwd_kernel<<<cu_blocks(n, 256), 256, 0, c->stream>>>(datt, dqg, dy, att, qg, n, D);
    CU_LAUNCHED(c, "ga_gate_bwd_kernel");
}
