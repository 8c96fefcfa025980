/* moe_few.cu — the experts' forward (moe.h) for a few slots per expert, the decode step: a
 * weight stream. Each touched expert's weights are read once at full width and multiplied on
 * tensor cores by the rows routed to it; an expert no slot chose costs a block that returns.
 * Everything is decided on the device (the permutation of moe.cu), so a captured graph holds it.
 * Legend as moe.h (T, C, E, k, Fm); S = T·k slots, slot ts = t·k + s.
 *
 * moe_few_kernel<TWO>: block (e, column tile) of FEW_WARPS warps; a warp owns 8 outputs (rows n of
 * W_e) over all of K, and the expert's slots in tiles of 16 rows, MT tiles a pass (more
 * slots: another pass, W re-read, from L2 mostly). Per 32-wide k chunk a lane loads 16 bytes of
 * its W row (n = lane/4, k = 8·(lane%4)..) and 16 bytes of its two slot rows (lane/4 and +8, the
 * same k): the chunk's reduction order is permuted alike in both operands, so these pieces are
 * the m16n8k16 fragments as they are (a lane's 8 k feed two k-steps). FEW_U chunks of W are
 * loaded before the first is used, to keep enough bytes in flight.
 *   TWO = 1: gate and up (K = C, N = Fm, A = the token's x row): eg, eu and the SwiGLU output
 *            a = silu(g)·u (bf16 g, u as the tiled kernel reads them) into act (S, Fm) scratch.
 *   TWO = 0: down (K = Fm, N = C, A = the slot's act row): ey.
 * One warp owns each output, summed in a fixed order: the same bits run to run. */
#include <stdint.h>

#include "kernels/moe.cuh"
#include "kernels/moe_dev.cuh"

/* FEW_WARPS 4, FEW_U 2 measured best on an H200 among 2-16 warps x 1-8 chunks in flight (30B-A3B
 * dims, bench_moe decode: 0.64 of the copy bandwidth at 16 and at 128 rows; 8 x 4 gave 0.56 and
 * 0.45 at 122 registers, 25 % occupancy), and one slot tile a pass (MT = 1) where an expert has
 * few slots: 0.69 / 0.68 against MT = 2's 0.59 / 0.59 in one call. MT = 2 stays for more slots
 * an expert (up to 512 rows a step), where a second pass would read W again. Neither changes
 * the order of any sum: the outputs are the same bits. */
enum { FEW_WARPS = 4, FEW_U = 2, FEW_MT1_SLOTS = 12 /* mean slots an expert up to which MT = 1 */ };

typedef struct {
    const int *perm, *off, *cnt;
    int k, K, N;
    const bf16 *a; /* TWO: x (T, C); else act (S, Fm) */
    const bf16 *w0, *w1; /* stacked (E, N, K): TWO: wg, wu; else wd */
    bf16 *o0, *o1, *act; /* TWO: eg, eu, act (S, Fm); else ey (S, C) */
} moe_few_args;

/* Grid (E, ⌈N / (8·FEW_WARPS)⌉), 32·FEW_WARPS threads. */
template <int TWO, int MT> __global__ void __launch_bounds__(32 * FEW_WARPS) moe_few_kernel(moe_few_args p) {
    int e = blockIdx.x, ne = p.cnt[e], K = p.K, N = p.N;
    int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int nb = (blockIdx.y * FEW_WARPS + (threadIdx.x >> 5)) * 8;
    if (ne == 0 || nb >= N) return;
    size_t wo = (size_t)e * N * K;
    const bf16 *W0 = nb + g < N ? p.w0 + wo + (size_t)(nb + g) * K : NULL;
    const bf16 *W1 = TWO && nb + g < N ? p.w1 + wo + (size_t)(nb + g) * K : NULL;
    const int *slots = p.perm + p.off[e];
    for (int s0 = 0; s0 < ne; s0 += 16 * MT) {
        int ts[MT][2];
        const bf16 *ar[MT][2];
        float acc0[MT][4], acc1[MT][4];
#pragma unroll
        for (int j = 0; j < MT; j++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int i = s0 + 16 * j + 8 * h + g;
                ts[j][h] = i < ne ? slots[i] : -1;
                ar[j][h] = ts[j][h] < 0 ? NULL : p.a + (size_t)(TWO ? ts[j][h] / p.k : ts[j][h]) * K;
            }
#pragma unroll
            for (int r = 0; r < 4; r++) acc0[j][r] = acc1[j][r] = 0.0f;
        }
        for (int k0 = 0; k0 < K; k0 += 32 * FEW_U) {
            uint4 w0[FEW_U], w1[FEW_U];
#pragma unroll
            for (int u = 0; u < FEW_U; u++) {
                int kk = k0 + 32 * u + 8 * q;
                w0[u] = ld8(W0, kk, K);
                if (TWO) w1[u] = ld8(W1, kk, K);
            }
#pragma unroll
            for (int u = 0; u < FEW_U; u++) {
                int kk = k0 + 32 * u + 8 * q;
                if (k0 + 32 * u >= K) break;
#pragma unroll
                for (int j = 0; j < MT; j++) {
                    if (s0 + 16 * j >= ne) break;
                    uint4 lo = ld8(ar[j][0], kk, K), hi = ld8(ar[j][1], kk, K);
                    moe_mma16816(acc0[j], lo.x, hi.x, lo.y, hi.y, w0[u].x, w0[u].y);
                    moe_mma16816(acc0[j], lo.z, hi.z, lo.w, hi.w, w0[u].z, w0[u].w);
                    if (TWO) {
                        moe_mma16816(acc1[j], lo.x, hi.x, lo.y, hi.y, w1[u].x, w1[u].y);
                        moe_mma16816(acc1[j], lo.z, hi.z, lo.w, hi.w, w1[u].z, w1[u].w);
                    }
                }
            }
        }
        /* accumulator r: row g + 8·(r/2), output nb + 2q + r%2 */
#pragma unroll
        for (int j = 0; j < MT; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int t = ts[j][r >> 1], n = nb + 2 * q + (r & 1);
                if (t < 0 || n >= N) continue;
                size_t o = (size_t)t * N + n;
                bf16 gv = __float2bfloat16(acc0[j][r]);
                p.o0[o] = gv;
                if (TWO) {
                    bf16 uv = __float2bfloat16(acc1[j][r]);
                    p.o1[o] = uv;
                    p.act[o] = __float2bfloat16(moe_silu(__bfloat162float(gv)) * __bfloat162float(uv));
                }
            }
    }
}

void moe_experts_fwd_few(cu_ctx *c, bf16 *out, bf16 *eg, bf16 *eu, bf16 *ey, const bf16 *x, const bf16 *res, const int *topi,
                         const float *topw, const bf16 *wg, const bf16 *wu, const bf16 *wd, int T, int C, int E, int k, int Fm) {
    int S = T * k;
    size_t pb = moe_perm_bytes(S, E);
    char *scr = (char *)cu_scratch(c, pb + (size_t)S * Fm * sizeof(bf16));
    if (!scr) return;
    const int *cnt = moe_perm_cuda(c, topi, S, E, scr);
    moe_few_args a = {cnt + 3 * E + 2, cnt + E, cnt, k, C, Fm, x, wg, wu, eg, eu, (bf16 *)(scr + pb)}; /* moe_perm's arrays */
    dim3 grid((unsigned)E, (unsigned)((Fm + 8 * FEW_WARPS - 1) / (8 * FEW_WARPS)));
    int mt1 = S <= FEW_MT1_SLOTS * E; /* the mean expert's slots in one tile */
    if (mt1) moe_few_kernel<1, 1><<<grid, 32 * FEW_WARPS, 0, c->stream>>>(a);
    else moe_few_kernel<1, 2><<<grid, 32 * FEW_WARPS, 0, c->stream>>>(a);
    CU_LAUNCHED(c, "moe_few_kernel<gate, up>");
    moe_few_args d = {cnt + 3 * E + 2, cnt + E, cnt, k, Fm, C, (bf16 *)(scr + pb), wd, NULL, ey, NULL, NULL};
    grid.y = (unsigned)((C + 8 * FEW_WARPS - 1) / (8 * FEW_WARPS));
    if (mt1) moe_few_kernel<0, 1><<<grid, 32 * FEW_WARPS, 0, c->stream>>>(d);
    else moe_few_kernel<0, 2><<<grid, 32 * FEW_WARPS, 0, c->stream>>>(d);
    CU_LAUNCHED(c, "moe_few_kernel<down>");
    if (out) moe_combine_cuda(c, out, res, ey, NULL, NULL, topw, T, C, k);
}
