/* test_fused.c — the fused CPU ops of kernels/rmsnorm.h against the ops they fuse, and the
 * q/k norm + RoPE backward against central finite differences of its own forward.
 *   qk_norm_rope_fwd  = rmsnorm_fwd over T*H rows of D, then rope_fwd: bit-identical
 *   qk_norm_rope_bwd  = rope_bwd, then rmsnorm_bwd into zeros: rel L2 <= 1e-6 (dw is summed in
 *                       a different order); and <grad, u> vs finite differences <= 1e-3 (fp32
 *                       forward: the same floor as test_backward.c's FD_TOL)
 *   qkv_rope_fwd      = qk_norm_rope_fwd of q and of k (or rope_fwd alone without norm weights),
 *                       k and v then copied to their cache rows: bit-identical, and the cache
 *                       rows not named are untouched */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/rmsnorm.h"
#include "engine/format/config.h"
#include "kernels/rope.h"

static float *rnd(size_t n, unsigned long long seed, float scale) {
    float *x = malloc(n * sizeof(float));
    check_fill(x, n, seed, scale);
    return x;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

typedef struct {
    float *x, *w, *y, *r, *wy, *f;
    int *pos;
    int T, H, D;
} qk_ctx;
static double qk_loss(qk_ctx *c) {
    qk_norm_rope_fwd_cpu(c->y, c->r, c->x, c->w, c->pos, c->f, c->T, c->H, c->D, 1e-6f);
    double s = 0;
    for (long long i = 0; i < (long long)c->T * c->H * c->D; i++) s += (double)c->wy[i] * c->y[i];
    return s;
}

/* Worst relative error of <grad, u> against central differences (Richardson) over 3 directions.
 * Relative to max(|<grad, u>|, 1e-2 |grad| |u|): the fp32 forward puts an absolute noise of
 * ~1e-4 under the differences here, which a direction almost orthogonal to grad would turn into
 * a large relative error (measured: <grad, u> = -0.0269 vs -0.0273). */
static double fd_err(qk_ctx *c, float *x, const float *grad, long long n, unsigned long long seed) {
    double worst = 0;
    float *x0 = malloc((size_t)n * 4), *u = malloc((size_t)n * 4);
    memcpy(x0, x, (size_t)n * 4);
    for (int dir = 0; dir < 3; dir++) {
        check_fill(u, (size_t)n, seed * 31 + dir, 1.0f);
        double an = 0, gg = 0, uu = 0, D[2];
        for (long long i = 0; i < n; i++) {
            an += (double)grad[i] * u[i];
            gg += (double)grad[i] * grad[i];
            uu += (double)u[i] * u[i];
        }
        for (int k = 0; k < 2; k++) {
            double h = k ? 5e-3 : 1e-2, lp, lm;
            for (long long i = 0; i < n; i++) x[i] = x0[i] + (float)h * u[i];
            lp = qk_loss(c);
            for (long long i = 0; i < n; i++) x[i] = x0[i] - (float)h * u[i];
            lm = qk_loss(c);
            D[k] = (lp - lm) / (2 * h);
        }
        memcpy(x, x0, (size_t)n * 4);
        double fd = (4 * D[1] - D[0]) / 3, scale = fmax(fabs(an), 1e-2 * sqrt(gg * uu));
        double err = fabs(fd - an) / (scale > 1e-6 ? scale : 1e-6);
        if (err > worst) worst = err;
    }
    free(x0);
    free(u);
    return worst;
}

TEST(qk_norm_rope) {
    int T = 6, H = 3, D = 16;
    size_t n = (size_t)T * H * D;
    qk_ctx c = {rnd(n, 11, 1.5f),
                rnd((size_t)D, 12, 1.0f),
                malloc(n * 4),
                malloc((size_t)T * H * 4),
                rnd(n, 13, 1.0f),
                malloc((size_t)D / 2 * 4),
                malloc((size_t)T * 4),
                T,
                H,
                D};
    for (int i = 0; i < D; i++) c.w[i] += 1.0f;
    rope_inv_freq(c.f, D, 10000.0f, 0, 0, 0, 0);
    for (int t = 0; t < T; t++) c.pos[t] = 3 * t + (t % 2) * 100;
    /* forward = the composition, bit for bit */
    float *y_ref = malloc(n * 4), *r_ref = malloc((size_t)T * H * 4);
    rmsnorm_fwd_cpu(y_ref, r_ref, c.x, c.w, T * H, D, 1e-6f);
    rope_fwd_cpu(y_ref, c.pos, c.f, T, H, D);
    qk_loss(&c);
    CHECK(max_abs_diff(c.y, y_ref, n) == 0 && max_abs_diff(c.r, r_ref, (size_t)T * H) == 0);
    /* backward = rope_bwd then rmsnorm_bwd into zeros; dinp is written, not added */
    float *dy = malloc(n * 4), *dx_ref = calloc(n, 4), *dw_ref = calloc((size_t)D, 4);
    memcpy(dy, c.wy, n * 4);
    rope_bwd_cpu(dy, c.pos, c.f, T, H, D);
    rmsnorm_bwd_cpu(dx_ref, dw_ref, dy, c.x, c.w, c.r, T * H, D);
    float *dx = rnd(n, 14, 5.0f), *dw = calloc((size_t)D, 4);
    qk_norm_rope_bwd_cpu(dx, dw, c.wy, c.x, c.w, c.r, c.pos, c.f, T, H, D);
    double ex = rel_l2(dx, dx_ref, n), ew = rel_l2(dw, dw_ref, (size_t)D);
    printf("  qk_norm_rope_bwd vs composition: dx %.2e dw %.2e\n", ex, ew);
    CHECK_MSG(ex <= 1e-6 && ew <= 1e-6, "dx %.3g dw %.3g", ex, ew);
    double fx = fd_err(&c, c.x, dx, (long long)n, 15), fw = fd_err(&c, c.w, dw, D, 16);
    printf("  qk_norm_rope_bwd vs finite differences: dx %.2e dw %.2e\n", fx, fw);
    CHECK_MSG(fx < 1e-3 && fw < 1e-3, "dx %.3g dw %.3g", fx, fw);
    free(c.x);
    free(c.w);
    free(c.y);
    free(c.r);
    free(c.wy);
    free(c.f);
    free(c.pos);
    free(y_ref);
    free(r_ref);
    free(dy);
    free(dx_ref);
    free(dw_ref);
    free(dx);
    free(dw);
}

static void qkv_case(int norm) {
    int T = 5, H = 4, K = 2, D = 16, S = 9, rows[5] = {7, 0, 4, 8, 2};
    size_t nq = (size_t)T * H * D, nk = (size_t)T * K * D, kd = (size_t)K * D;
    float *q = rnd(nq, 21, 1.5f), *k = rnd(nk, 22, 1.5f), *v = rnd(nk, 23, 1.0f), *qw = rnd((size_t)D, 24, 1.0f);
    float *kw = rnd((size_t)D, 25, 1.0f), *f = malloc((size_t)D / 2 * 4);
    float *kc = rnd((size_t)S * kd, 26, 1.0f), *vc = rnd((size_t)S * kd, 27, 1.0f);
    int pos[5] = {3, 90, 4, 17, 1000};
    rope_inv_freq(f, D, 10000.0f, 0, 0, 0, 0);
    /* the reference: the ops apart, then each token's k and v into its row */
    float *q_ref = malloc(nq * 4), *k_all = malloc(nk * 4), *rq_ref = malloc((size_t)T * H * 4),
          *rk_ref = malloc((size_t)T * K * 4);
    float *kc_ref = malloc((size_t)S * kd * 4), *vc_ref = malloc((size_t)S * kd * 4);
    memcpy(kc_ref, kc, (size_t)S * kd * 4);
    memcpy(vc_ref, vc, (size_t)S * kd * 4);
    if (norm) {
        qk_norm_rope_fwd_cpu(q_ref, rq_ref, q, qw, pos, f, T, H, D, 1e-6f);
        qk_norm_rope_fwd_cpu(k_all, rk_ref, k, kw, pos, f, T, K, D, 1e-6f);
    } else {
        memcpy(q_ref, q, nq * 4);
        memcpy(k_all, k, nk * 4);
        rope_fwd_cpu(q_ref, pos, f, T, H, D);
        rope_fwd_cpu(k_all, pos, f, T, K, D);
    }
    for (int t = 0; t < T; t++) {
        memcpy(kc_ref + rows[t] * kd, k_all + t * kd, kd * 4);
        memcpy(vc_ref + rows[t] * kd, v + t * kd, kd * 4);
    }
    float *qo = malloc(nq * 4), *rq = malloc((size_t)T * H * 4), *rk = malloc((size_t)T * K * 4);
    qkv_rope_io io = {.q_out = qo,
                      .k_out = kc,
                      .v_out = vc,
                      .rstd_q = rq,
                      .rstd_k = rk,
                      .q = q,
                      .k = k,
                      .v = v,
                      .qw = norm ? qw : NULL,
                      .kw = norm ? kw : NULL,
                      .rows = rows};
    qkv_rope_fwd_cpu(&io, pos, f, T, H, K, D, 1e-6f);
    CHECK(max_abs_diff(qo, q_ref, nq) == 0);
    CHECK(max_abs_diff(kc, kc_ref, (size_t)S * kd) == 0 && max_abs_diff(vc, vc_ref, (size_t)S * kd) == 0);
    if (norm) CHECK(max_abs_diff(rq, rq_ref, (size_t)T * H) == 0 && max_abs_diff(rk, rk_ref, (size_t)T * K) == 0);
    /* without rows and with k_out == k (training without a cache): k rotated in place, v untouched */
    float *k2 = malloc(nk * 4), *v2 = malloc(nk * 4);
    memcpy(k2, norm ? k_all : k, nk * 4);
    memcpy(v2, v, nk * 4);
    qkv_rope_io io2 = {
        .q_out = qo, .k_out = k2, .v_out = v2, .q = q, .k = norm ? k : k2, .v = v2, .qw = norm ? qw : NULL, .kw = norm ? kw : NULL};
    qkv_rope_fwd_cpu(&io2, pos, f, T, H, K, D, 1e-6f);
    CHECK(max_abs_diff(k2, k_all, nk) == 0 && max_abs_diff(v2, v, nk) == 0 && max_abs_diff(qo, q_ref, nq) == 0);
    free(q);
    free(k);
    free(v);
    free(qw);
    free(kw);
    free(f);
    free(kc);
    free(vc);
    free(q_ref);
    free(k_all);
    free(rq_ref);
    free(rk_ref);
    free(kc_ref);
    free(vc_ref);
    free(qo);
    free(rq);
    free(rk);
    free(k2);
    free(v2);
}

TEST(qkv_rope_equals_parts) {
    qkv_case(1);
    qkv_case(0);
}

int main(void) {
    RUN(qk_norm_rope);
    RUN(qkv_rope_equals_parts);
    return CHECK_DONE();
}
