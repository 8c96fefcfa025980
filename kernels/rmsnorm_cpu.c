/* rmsnorm_cpu.c — fp32 reference of rmsnorm.h.
 * Backward: with n = x * r (r = rstd), y = w * n:
 *   dw += dy * n;   dx = r * (w*dy - n * mean(w*dy * n)). */
#include "kernels/rmsnorm.h"

#include "kernels/rope.h"

#include <math.h>
#include <string.h>
#include <stdlib.h>

void rmsnorm_fwd_cpu(float *out, float *rstd, const float *inp, const float *w, int T, int C, float eps) {
#pragma omp parallel for
    for (int t = 0; t < T; t++) {
        const float *x = inp + (size_t)t * C;
        float *y = out + (size_t)t * C;
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        float r = 1.0f / sqrtf((float)(ss / C) + eps);
        if (rstd) rstd[t] = r;
        for (int c = 0; c < C; c++) y[c] = w[c] * (x[c] * r);
    }
}

/* dw is summed over rows: rows are cut into DW_BLOCKS fixed blocks, each summed in order
 * into its own partial, then the partials in block order — bit-identical for any number of
 * threads (a replayed update must equal the original; see docs/api.md "Replay"). */
#define DW_BLOCKS 32
static void dw_reduce(float *dw, const float *part, int C) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        float s = 0;
        for (int b = 0; b < DW_BLOCKS; b++) s += part[(size_t)b * C + c];
        dw[c] += s;
    }
}

void rmsnorm_bwd_cpu(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd, int T, int C) {
    float *part = calloc((size_t)DW_BLOCKS * C, sizeof(float));
    int bs = (T + DW_BLOCKS - 1) / DW_BLOCKS;
#pragma omp parallel for schedule(static)
    for (int b = 0; b < DW_BLOCKS; b++) {
        float *dw_local = part + (size_t)b * C;
        int t1 = (b + 1) * bs < T ? (b + 1) * bs : T;
        for (int t = b * bs; t < t1; t++) {
            const float *x = inp + (size_t)t * C, *dy = dout + (size_t)t * C;
            float *dx = dinp + (size_t)t * C;
            float r = rstd[t];
            double dot = 0;
            for (int c = 0; c < C; c++) {
                float n = x[c] * r;
                dw_local[c] += dy[c] * n;
                dot += (double)w[c] * dy[c] * n;
            }
            float mean = (float)(dot / C);
            for (int c = 0; c < C; c++) dx[c] += r * (w[c] * dy[c] - x[c] * r * mean);
        }
    }
    dw_reduce(dw, part, C);
    free(part);
}

void qk_norm_rope_fwd_cpu(float *out, float *rstd, const float *inp, const float *w, const int *pos, const float *inv_freq, int T,
                          int H, int D, float eps) {
    rmsnorm_fwd_cpu(out, rstd, inp, w, T * H, D, eps);
    rope_fwd_cpu(out, pos, inv_freq, T, H, D);
}

void qkv_rope_fwd_cpu(const qkv_rope_io *io, const int *pos, const float *inv_freq, int T, int H, int K, int D, float eps) {
    size_t hd = (size_t)H * D, kd = (size_t)K * D;
    const float *q = io->q, *k = io->k, *v = io->v;
    float *qo = io->q_out, *ko = io->k_out, *vo = io->v_out;
    if (io->qw) qk_norm_rope_fwd_cpu(qo, io->rstd_q, q, io->qw, pos, inv_freq, T, H, D, eps);
    else {
        if (qo != q) memcpy(qo, q, (size_t)T * hd * sizeof(float));
        rope_fwd_cpu(qo, pos, inv_freq, T, H, D);
    }
    if (!io->rows) { /* all of k at once */
        if (io->kw) qk_norm_rope_fwd_cpu(ko, io->rstd_k, k, io->kw, pos, inv_freq, T, K, D, eps);
        else {
            if (ko != k) memcpy(ko, k, (size_t)T * kd * sizeof(float));
            rope_fwd_cpu(ko, pos, inv_freq, T, K, D);
        }
        if (vo != v) memcpy(vo, v, (size_t)T * kd * sizeof(float));
        return;
    }
    for (int t = 0; t < T; t++) { /* a KV cache: token by token into its row */
        float *kr = ko + (size_t)io->rows[t] * kd, *vr = vo + (size_t)io->rows[t] * kd;
        float *rk = io->rstd_k ? io->rstd_k + (size_t)t * K : NULL;
        if (io->kw) qk_norm_rope_fwd_cpu(kr, rk, k + t * kd, io->kw, pos + t, inv_freq, 1, K, D, eps);
        else {
            memmove(kr, k + t * kd, kd * sizeof(float));
            rope_fwd_cpu(kr, pos + t, inv_freq, 1, K, D);
        }
        memmove(vr, v + t * kd, kd * sizeof(float));
    }
}

/* Row by row (one head of one token): rotate dout back as rope_bwd_cpu does, then the
 * backward of rmsnorm_bwd_cpu, written instead of added. */
void qk_norm_rope_bwd_cpu(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd,
                          const int *pos, const float *inv_freq, int T, int H, int D) {
    int half = D / 2;
    long long rows = (long long)T * H, bs = (rows + DW_BLOCKS - 1) / DW_BLOCKS;
    float *part = calloc((size_t)DW_BLOCKS * D, sizeof(float));
#pragma omp parallel for schedule(static)
    for (int b = 0; b < DW_BLOCKS; b++) {
        float *dw_local = part + (size_t)b * D, dy[D];
        long long r1 = (b + 1) * bs < rows ? (b + 1) * bs : rows;
        for (long long row = b * bs; row < r1; row++) {
            const float *g = dout + row * D, *x = inp + row * D;
            float *dx = dinp + row * D, r = rstd[row];
            for (int i = 0; i < half; i++) {
                float ang = (float)pos[row / H] * inv_freq[i];
                float c = (float)cos((double)ang), s = -(float)sin((double)ang);
                dy[i] = g[i] * c - g[i + half] * s;
                dy[i + half] = g[i + half] * c + g[i] * s;
            }
            double dot = 0;
            for (int c = 0; c < D; c++) {
                float n = x[c] * r;
                dw_local[c] += dy[c] * n;
                dot += (double)w[c] * dy[c] * n;
            }
            float mean = (float)(dot / D);
            for (int c = 0; c < D; c++) dx[c] = r * (w[c] * dy[c] - x[c] * r * mean);
        }
    }
    dw_reduce(dw, part, D);
    free(part);
}
