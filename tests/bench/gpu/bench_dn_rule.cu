/* bench_dn_rule.cu — the gated delta rule's training kernels alone (kernels/deltanet.cu,
 * deltanet_chunk.cu, deltanet_chunk_bwd.cu; no engine, built with nvcc from those three files:
 * tests/bench/gpu/dn_rule.sh) on one packed group [P; R_1..R_N] at Qwen3.5-9B's DeltaNet dims
 * (Hk 16, Hv 32, Dk = Dv = 128), random bf16 inputs (u, a, b, A_log, dt_bias, dout).
 *
 * Time (a benchmark: printed, never asserted): ms of the rule's forward and backward on the whole
 * group, chunked and recurrent (GRPOD_TUNE_DELTANET's two values), median of REPS after a warm-up.
 *
 * CHECK rows (exit 1 when one exceeds its tolerance), relative L2 over o, du, da, db, dA_log and
 * dt_bias's gradients:
 *   - chunked vs recurrent on the whole group (1e-2, as test_ops' rows);
 *   - split vs whole, each kernel family: the split schedule (engine/model/split.c) — the prompt's
 *     pass with the carry out (row0 0: s_out), the responses in M micro-batches continuing it
 *     (row0 P: s_in, ds_in summed), then the prompt's backward taking ds_out = the summed ds_in —
 *     against the whole group on the chunked kernels (1e-2: bf16 outputs of sums whose chunks are
 *     cut at other tokens);
 *   - two controls that must exceed the tolerance (the check can fail): the responses started from
 *     zeros instead of the carry's state, and the prompt's backward without ds_out.
 * DN_DUMP=path writes the chunked whole group's o, du, da, db, dA_log and dt_bias grads there (raw
 * floats, in that order): two builds of the kernels compared with cmp (the same bits or not).
 * Usage: bench_dn_rule [P N R [M]]   (default 4096 16 512 4) */
#include <algorithm>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "kernels/deltanet.cuh"

enum { HK = 16, HV = 32, DK = 128, DV = 128, REPS = 3 };

static int failures = 0;

static void die(cu_ctx *c, const char *what) {
    fprintf(stderr, "bench_dn_rule: %s: %s\n", what, c->failed ? c->msg : cudaGetErrorString(cudaGetLastError()));
    exit(2);
}

static unsigned long long rng_s = 88172645463325252ULL;
static float frand(float scale) {
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return scale * (2.0f * (float)((rng_s >> 11) * (1.0 / 9007199254740992.0)) - 1.0f);
}

static bf16 *up_bf16(size_t n, float scale) {
    std::vector<bf16> h(n);
    for (size_t i = 0; i < n; i++) h[i] = __float2bfloat16(frand(scale));
    bf16 *d;
    if (cudaMalloc(&d, n * 2) || cudaMemcpy(d, h.data(), n * 2, cudaMemcpyHostToDevice)) exit(2);
    return d;
}
template <class X> static X *dalloc(size_t n) {
    X *d;
    if (cudaMalloc(&d, n * sizeof(X) + 16) || cudaMemset(d, 0, n * sizeof(X) + 16)) exit(2);
    return d;
}
static std::vector<float> down_bf16(const bf16 *d, size_t n) {
    std::vector<bf16> h(n);
    std::vector<float> f(n);
    if (cudaMemcpy(h.data(), d, n * 2, cudaMemcpyDeviceToHost)) exit(2);
    for (size_t i = 0; i < n; i++) f[i] = __bfloat162float(h[i]);
    return f;
}
static std::vector<float> down_f32(const float *d, size_t n) {
    std::vector<float> f(n);
    if (cudaMemcpy(f.data(), d, n * 4, cudaMemcpyDeviceToHost)) exit(2);
    return f;
}
static double rel_l2(const std::vector<float> &a, const std::vector<float> &b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1e-30));
}

/* device ranges of n tokens: h holds a0, a1, b0, b1 back to back */
static attn_ranges dev_ranges(const std::vector<int> &h, int n) {
    int *d = dalloc<int>(4 * (size_t)n);
    if (cudaMemcpy(d, h.data(), 4 * (size_t)n * 4, cudaMemcpyHostToDevice)) exit(2);
    return attn_ranges{d, d + n, d + 2 * n, d + 3 * n};
}
/* the prompt causal on itself (rows 0..P-1), then responses [i0, i1) at rows row0 + their offset */
static attn_ranges layout(int P, int with_prompt, int row0, const std::vector<int> &lens, int i0, int i1, int *T) {
    int n = with_prompt ? P : 0;
    for (int i = i0; i < i1; i++) n += lens[i];
    std::vector<int> h(4 * (size_t)n);
    int t = 0;
    for (; with_prompt && t < P; t++) h[t] = 0, h[n + t] = t + 1, h[2 * n + t] = h[3 * n + t] = 0;
    for (int i = i0; i < i1; i++)
        for (int j = 0, s0 = t; j < lens[i]; j++, t++)
            h[t] = 0, h[n + t] = P, h[2 * n + t] = row0 + s0, h[3 * n + t] = row0 + t + 1;
    *T = n;
    return dev_ranges(h, n);
}

struct run_in { /* device inputs and outputs of the whole group (token-major: a pass's slice is an offset) */
    bf16 *u, *a, *b, *alog, *dt, *dout;
    bf16 *o, *du, *da, *db;
    float *dal, *ddt, *st, *dst;
};
struct res {
    std::vector<float> o, du, da, db, dal, ddt;
};
static const int CC = 2 * HK * DK + HV * DV;

static void fwd(cu_ctx *c, run_in &x, int t0, int T, attn_ranges r, const deltanet_carry *cy) {
    deltanet_rule_fwd_cuda(c, x.o + (size_t)t0 * HV * DV, x.st, x.u + (size_t)t0 * CC, x.a + (size_t)t0 * HV,
                           x.b + (size_t)t0 * HV, x.alog, x.dt, r, cy, T, HK, HV, DK, DV);
}
static void bwd(cu_ctx *c, run_in &x, int t0, int T, attn_ranges r, const deltanet_carry *cy) {
    size_t th = (size_t)t0 * HV;
    deltanet_rule_bwd_cuda(c, x.du + (size_t)t0 * CC, x.da + th, x.db + th, x.dal, x.ddt, x.st, x.dst, x.dout + th * DV,
                           x.u + (size_t)t0 * CC, x.a + th, x.b + th, x.alog, x.dt, r, cy, T, HK, HV, DK, DV);
}
static res fetch(cu_ctx *c, run_in &x, int T) {
    if (cudaStreamSynchronize(c->stream) || c->failed) die(c, "run");
    res r;
    r.o = down_bf16(x.o, (size_t)T * HV * DV);
    r.du = down_bf16(x.du, (size_t)T * CC);
    r.da = down_bf16(x.da, (size_t)T * HV);
    r.db = down_bf16(x.db, (size_t)T * HV);
    r.dal = down_f32(x.dal, HV);
    r.ddt = down_f32(x.ddt, HV);
    return r;
}
static void zero_grads(run_in &x) {
    cudaMemset(x.dal, 0, HV * 4);
    cudaMemset(x.ddt, 0, HV * 4);
}

static double msince(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms, a, b);
    return ms;
}

static void check(const char *what, const char *shape, const res &g, const res &w, double tol, int control) {
    double e[6] = {rel_l2(g.o, w.o),   rel_l2(g.du, w.du),   rel_l2(g.da, w.da),
                   rel_l2(g.db, w.db), rel_l2(g.dal, w.dal), rel_l2(g.ddt, w.ddt)};
    const char *nm[6] = {"o", "du", "da", "db", "dA_log", "dt_bias"};
    for (int i = 0; i < 6; i++) {
        int bad = control ? 0 : e[i] > tol;
        failures += bad;
        printf("CHECK %-40s %-8s %-22s %.3e  tol %.0e  %s\n", what, nm[i], shape, e[i], tol,
               control   ? (e[i] > tol ? "control: exceeds (good)" : "control")
                   : bad ? "FAIL"
                         : "ok");
    }
    if (control) {
        double mx = *std::max_element(e, e + 6);
        int bad = mx <= tol;
        failures += bad;
        printf("CHECK %-40s %-8s %-22s %.3e  tol %.0e  %s\n", what, "max", shape, mx, tol, bad ? "FAIL (undetected)" : "ok");
    }
}

int main(int argc, char **argv) {
    int P = argc > 3 ? atoi(argv[1]) : 4096, N = argc > 3 ? atoi(argv[2]) : 16, R = argc > 3 ? atoi(argv[3]) : 512;
    int M = argc > 4 ? atoi(argv[4]) : 4;
    if (P < 1 || N < 1 || R < 1 || M < 1 || N % M) {
        fprintf(stderr, "usage: bench_dn_rule [P N R [M]] (M divides N)\n");
        return 2;
    }
    std::vector<int> lens(N);
    for (int i = 0; i < N; i++) lens[i] = i % 3 == 2 ? R - 37 * (i % 5) : R; /* some responses end mid-chunk */
    tune_opts tune = tune_defaults();
    cu_ctx c;
    memset(&c, 0, sizeof c);
    c.tune = &tune;
    if (cudaStreamCreate(&c.stream)) return 2;
    int T;
    attn_ranges rw = layout(P, 1, 0, lens, 0, N, &T);
    char shape[64];
    snprintf(shape, sizeof shape, "P=%d N=%d R=%d T=%d", P, N, R, T);
    long long st, dst;
    deltanet_scratch_cuda(&st, &dst, T, HK, HV, DK, DV);
    run_in x;
    x.u = up_bf16((size_t)T * CC, 1.0f);
    x.a = up_bf16((size_t)T * HV, 2.0f);
    x.b = up_bf16((size_t)T * HV, 2.0f);
    x.alog = up_bf16(HV, 1.0f);
    x.dt = up_bf16(HV, 1.0f);
    x.dout = up_bf16((size_t)T * HV * DV, 1.0f);
    x.o = dalloc<bf16>((size_t)T * HV * DV);
    x.du = dalloc<bf16>((size_t)T * CC);
    x.da = dalloc<bf16>((size_t)T * HV);
    x.db = dalloc<bf16>((size_t)T * HV);
    x.dal = dalloc<float>(HV);
    x.ddt = dalloc<float>(HV);
    x.st = dalloc<float>((size_t)st);
    x.dst = dalloc<float>((size_t)dst);
    cudaEvent_t ev[3];
    for (int i = 0; i < 3; i++) cudaEventCreate(&ev[i]);

    /* time and results of the whole group, each kernel family */
    res whole[2];
    for (int mode = 0; mode < 2; mode++) {
        tune.deltanet = mode ? TUNE_DN_RECURRENT : TUNE_DN_CHUNKED;
        std::vector<double> tf, tb;
        for (int rep = 0; rep <= REPS; rep++) {
            zero_grads(x);
            cudaEventRecord(ev[0], c.stream);
            fwd(&c, x, 0, T, rw, NULL);
            cudaEventRecord(ev[1], c.stream);
            bwd(&c, x, 0, T, rw, NULL);
            cudaEventRecord(ev[2], c.stream);
            if (rep) tf.push_back(msince(ev[0], ev[1])), tb.push_back(msince(ev[1], ev[2]));
        }
        whole[mode] = fetch(&c, x, T);
        std::sort(tf.begin(), tf.end());
        std::sort(tb.begin(), tb.end());
        printf("TIME %-10s %-22s fwd %8.2f ms  bwd %8.2f ms  (median of %d)\n", mode ? "recurrent" : "chunked", shape,
               tf[REPS / 2], tb[REPS / 2], REPS);
    }
    check("chunked vs recurrent (whole)", shape, whole[0], whole[1], 1e-2, 0);
    if (getenv("DN_DUMP")) {
        FILE *f = fopen(getenv("DN_DUMP"), "wb");
        for (const std::vector<float> *v : {&whole[0].o, &whole[0].du, &whole[0].da, &whole[0].db, &whole[0].dal, &whole[0].ddt})
            if (!f || fwrite(v->data(), 4, v->size(), f) != v->size()) die(&c, "DN_DUMP");
        fclose(f);
    }

    /* the split schedule: prompt, M micro-batches of responses, their backwards, the prompt's */
    size_t SZ = (size_t)HV * DK * DV;
    float *s = dalloc<float>(SZ), *ds = dalloc<float>(SZ), *zs = dalloc<float>(SZ);
    int Tp;
    attn_ranges rp = layout(P, 1, 0, lens, 0, 0, &Tp);
    std::vector<attn_ranges> rm(M);
    std::vector<int> tm(M), om(M);
    for (int m = 0, off = P; m < M; m++) {
        rm[m] = layout(P, 0, P, lens, m * (N / M), (m + 1) * (N / M), &tm[m]);
        om[m] = off;
        off += tm[m];
    }
    for (int variant = 0; variant < 4; variant++) { /* chunked, recurrent, control: zeros in, control: no ds_out */
        tune.deltanet = variant == 1 ? TUNE_DN_RECURRENT : TUNE_DN_CHUNKED;
        zero_grads(x);
        cudaMemset(ds, 0, SZ * 4);
        cudaEventRecord(ev[0], c.stream);
        deltanet_carry cp = {0, NULL, NULL, NULL, NULL, s, NULL, NULL, NULL};
        fwd(&c, x, 0, P, rp, &cp);
        for (int m = 0; m < M; m++) {
            deltanet_carry cr = {P, variant == 2 ? zs : s, NULL, ds, NULL, NULL, NULL, NULL, NULL};
            fwd(&c, x, om[m], tm[m], rm[m], &cr);
        }
        for (int m = M - 1; m >= 0; m--) {
            deltanet_carry cr = {P, variant == 2 ? zs : s, NULL, ds, NULL, NULL, NULL, NULL, NULL};
            bwd(&c, x, om[m], tm[m], rm[m], &cr);
        }
        deltanet_carry cb = {0, NULL, NULL, NULL, NULL, NULL, NULL, variant == 3 ? NULL : ds, NULL};
        bwd(&c, x, 0, P, rp, &cb);
        cudaEventRecord(ev[1], c.stream);
        double ms = msince(ev[0], ev[1]);
        res sp = fetch(&c, x, om[M - 1] + tm[M - 1]);
        static const char *nm[4] = {"split vs whole, chunked", "split vs whole, recurrent", "control: responses from zeros",
                                    "control: prompt bwd without ds_out"};
        printf("TIME split %-22s %s: fwd+bwd %8.2f ms (one run, M=%d)\n", shape, nm[variant], ms, M);
        check(nm[variant], shape, sp, whole[variant == 1 ? 1 : 0], 1e-2, variant >= 2);
    }
    printf("bench_dn_rule: %d check(s) failed\n", failures);
    return failures ? 1 : 0;
}
