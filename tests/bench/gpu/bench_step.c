/* bench_step.c — one full GRPO update step on the CUDA backend with random weights, timed per
 * phase: old pass (policy, no grad), ref pass (reference bf16 weights), policy forward+backward,
 * optimizer (grad norm, clip, fused AdamW on the fp32 master). One group [P; R_1..R_N] packed
 * (P + NR tokens), Qwen3 dims with tied embeddings as ../shared/bench/peer_step.py builds them.
 * Prints ms per phase (median of 3 after a warm-up), tokens/s, useful TFLOP/s with the peer's
 * FLOP count and its "% of 793" (measured bf16 GEMM rate), and device memory in use.
 * OFFLOAD=1 keeps the fp32 master and moments in host memory (engine/train/offload.h; the
 * optimizer phase is then the clip on the device plus the host AdamW pipeline, split into host
 * compute and waiting for copies); BUDGET_GIB=x caps the device memory of the whole step, the
 * activations taking what is left (layers recomputed as model_acts_init_budget picks). 8b is
 * Qwen3-8B's dims (36 layers, 4096, 32/8 heads, 12288, untied), random weights made here.
 * 30b-a3b[-lL] is Qwen3-30B-A3B's dims on L layers (4 by default; untied; 128 experts top-8, FLOPs
 * counted on the active parameters). qwen3.5-9b[-d128][-lL] is the HF default Qwen3.5 text config
 * (Qwen3.5-9B) on L layers (4 by default), every fourth a gated attention layer, the rest gated
 * DeltaNet (layer_types' 3:1); -d128 gives the gated layers H 32, K 8, D 128 (the q, k, v widths
 * and attention FLOPs of H 16, K 4, D 256, on the tensor-core attention kernels); no FLOP line.
 * TURNS=t1,t2,.. makes each response turns of those lengths (R their sum) and SHARE=s1,s2,.. says
 * how many responses share each turn (turn k of response i is shared by the responses i / s_k
 * picks: 8,2,1,1 = turn 1 shared by all eight, turn 2 by pairs, turns 3-4 each its own); LAYOUT=
 * tree (the trie once, engine/model/pack.h PACK_TREE), trunk (the turns all share, once: PACK_PACKED)
 * or flat (P + NR: the same lengths, each response's first id its own, so nothing is shared past
 * the prompt). The FLOP count is the flat form's in every layout (the work the step stands for).
 * Usage: bench_step [0.6b|1.7b|4b|8b|30b-a3b[-lL]|qwen3.5-9b[-d128][-lL]] [P N R] */
#include <cuda_runtime_api.h>
#include <time.h>

#include "engine/model/model.h"
#include "engine/train/offload.h"
#include "engine/model/pack.h"
#include "tests/gpu/gpu_check.h"

/* VmRSS / VmHWM of this process in GiB */
static void host_rss(double *rss, double *hwm) {
    *rss = *hwm = 0;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "VmRSS:", 6)) *rss = atof(line + 6) / 1048576.0;
        if (!strncmp(line, "VmHWM:", 6)) *hwm = atof(line + 6) / 1048576.0;
    }
    if (f) fclose(f);
}


int main(int argc, char **argv) {
    const char *size = argc > 1 ? argv[1] : "1.7b";
    int P = argc > 4 ? atoi(argv[2]) : 4096, N = argc > 4 ? atoi(argv[3]) : 16, R = argc > 4 ? atoi(argv[4]) : 512;
    int C = 2048, F = 6144, L = 28, H = 16, K = 8, tied = 1;
    if (!strcmp(size, "0.6b")) {
        C = 1024;
        F = 3072;
    }
    if (!strcmp(size, "4b")) {
        C = 2560;
        F = 9728;
        L = 36;
        H = 32;
    }
    if (!strcmp(size, "8b")) {
        C = 4096;
        F = 12288;
        L = 36;
        H = 32;
        tied = 0;
    }
    int moe = !strncmp(size, "30b-a3b", 7);
    if (moe) {
        L = !strncmp(size, "30b-a3b-l", 9) ? atoi(size + 9) : 4;
        if (L < 1 || L > 48) gc_die(NULL, "30b-a3b-lL: L in 1..48");
        tied = 0;
    }
    int offload = getenv("OFFLOAD") && atoi(getenv("OFFLOAD"));
    double budget_gib = getenv("BUDGET_GIB") ? atof(getenv("BUDGET_GIB")) : 0;
    model_config c = {.arch = ARCH_QWEN3,
                      .L = L,
                      .C = C,
                      .H = H,
                      .K = K,
                      .D = 128,
                      .F = F,
                      .V = 151936,
                      .max_pos = 40960,
                      .eps = 1e-6f,
                      .rope_theta = 1000000.0f,
                      .qk_norm = 1,
                      .tied = tied,
                      .bos_id = -1};
    snprintf(c.arch_name, sizeof c.arch_name, "qwen3");
    if (moe) {
        gc_moe_30b_a3b(&c, L);
        C = c.C, H = c.H, K = c.K;
    }
    int hyb = !strncmp(size, "qwen3.5-9b", 10);
    if (hyb) {
        const char *l = strstr(size, "-l");
        gc_qwen3_5_9b(&c, l ? atoi(l + 2) : 4, strstr(size, "-d128") != NULL);
        C = c.C, H = c.H, K = c.K, L = c.L;
    }
    eng_backend *be;
    if (backend_cuda_create(&be, 0)) gc_die(NULL, "backend_cuda_create");
    size_t free0, total;
    cudaMemGetInfo(&free0, &total);
    model m;
    if (model_init(&m, &c, be)) gc_die(be, "model_init");
    size_t n = (size_t)m.n_elems;
    void *w = be->alloc(be, n * 2), *wref = be->alloc(be, n * 2);
    float *g = be->alloc(be, n * 4), *master, *mo, *ve;
    if (offload) {
        master = offload_host_alloc((long long)n);
        mo = offload_host_alloc((long long)n);
        ve = offload_host_alloc((long long)n);
    } else {
        master = be->alloc(be, n * 4);
        mo = be->alloc(be, n * 4);
        ve = be->alloc(be, n * 4);
    }
    if (!w || !wref || !master || !g || !mo || !ve) gc_die(be, "weights");
    /* random weights: one 16M-value random block tiled over the buffer (through g on the way
     * to the bf16 copies when the master is on the host) */
    size_t blk = (size_t)1 << 24;
    float *hb = gc_rand(blk, 0.02f, 7);
    double tinit = gc_now();
    for (size_t off = 0; off < n; off += blk) {
        size_t k = n - off < blk ? n - off : blk;
        if (offload) {
            memcpy(master + off, hb, k * 4);
            if (be->to_dev(be, g, hb, k * 4)) gc_die(be, "upload");
            be->f32_to_act(be, (char *)w + off * 2, g, k);
            be->f32_to_act(be, (char *)wref + off * 2, g, k);
        } else if (be->to_dev(be, master + off, hb, k * 4)) {
            gc_die(be, "upload");
        }
    }
    free(hb);
    if (!offload) {
        be->f32_to_act(be, w, master, n);
        be->f32_to_act(be, wref, master, n);
        be->zero(be, mo, n * 4);
        be->zero(be, ve, n * 4);
    }
    eng_offload off;
    if (offload && offload_init(&off, be, (long long)n, 0)) gc_die(be, "offload_init");
    if (be->sync(be)) gc_die(be, "init");
    fprintf(stderr, "init %.1f s (%zu parameters)\n", gc_now() - tinit, n);
    if (offload) {
        /* the floors of the offloaded optimizer: host memory (a parallel copy, read + write
         * counted) and PCIe each way and both at once, through the pinned stages */
        long long k = n < (1LL << 29) ? (long long)n : 1LL << 29;
        double t0 = gc_now();
#pragma omp parallel for schedule(static)
        for (long long i = 0; i < k; i += 1 << 20) memcpy(mo + i, ve + i, (size_t)(k - i < (1 << 20) ? k - i : 1 << 20) * 4);
        double host_gbs = 2.0 * k * 4 / (gc_now() - t0) / 1e9;
        double gbs[3];
        size_t cb = (size_t)off.chunk * 4;
        for (int mode = 0; mode < 3; mode++) {
            if (be->sync(be)) gc_die(be, "sync");
            t0 = gc_now();
            for (int i = 0; i < 16; i++) {
                if (mode != 1) be->copy_async(be, BE_LANE_D2H, off.gstage[0], g, cb);
                if (mode != 0) be->copy_async(be, BE_LANE_H2D, (char *)g + cb, off.gstage[1], cb);
            }
            be->mark(be, BE_LANE_D2H, 15);
            be->mark(be, BE_LANE_H2D, 14);
            if (be->wait(be, BE_LANE_HOST, 15) || be->wait(be, BE_LANE_HOST, 14)) gc_die(be, "copy probe");
            gbs[mode] = 16.0 * cb * (mode == 2 ? 2 : 1) / (gc_now() - t0) / 1e9;
        }
        double p = (double)n;
        printf("grpod-cuda %s: floors: host memory %.0f GB/s (parallel copy) -> host AdamW (30 B a parameter) >= %.0f ms; "
               "PCIe D2H %.1f, H2D %.1f, both %.1f GB/s -> host path (4 B down, 2 up) >= %.0f ms, GPU-streamed AdamW "
               "(12 B down, 12 up) >= %.0f ms\n",
               size, host_gbs, 30 * p / host_gbs / 1e6, gbs[0], gbs[1], gbs[2], fmax(4 * p / gbs[0], 2 * p / gbs[1]) / 1e6,
               24 * p / gbs[2] / 1e6);
    }
    model_views wv, rv, gv;
    model_views_make(&m, w, 2, &wv);
    model_views_make(&m, wref, 2, &rv);
    model_views_make(&m, g, 4, &gv);

    int tl[16], sh[16], nt = 0, k_ = 0;
    const char *lay = getenv("LAYOUT") ? getenv("LAYOUT") : "flat";
    for (char *e = getenv("TURNS"), *q; e && *e && nt < 16; e = *q ? q + 1 : q) tl[nt++] = (int)strtol(e, &q, 10);
    for (int k = 0; k < nt; k++) sh[k] = 1;
    for (char *e = getenv("SHARE"), *q; e && *e && k_ < nt; e = *q ? q + 1 : q) sh[k_++] = (int)strtol(e, &q, 10);
    if (nt) {
        R = 0;
        for (int k = 0; k < nt; k++) R += tl[k];
    }
    int *prompt = malloc((size_t)P * 4), **resp = malloc((size_t)N * sizeof(int *)), *Rs = malloc((size_t)N * 4);
    unsigned long long s = 5;
    gc_random_ids(prompt, P, &s);
    for (int r = 0; r < N; r++) {
        Rs[r] = R;
        resp[r] = malloc((size_t)R * 4);
        gc_random_ids(resp[r], R, &s);
        for (int k = 0, off = 0; k < nt; off += tl[k], k++) /* a shared turn: its first sharer's ids */
            if (r % sh[k]) memcpy(resp[r] + off, resp[r - r % sh[k]] + off, (size_t)tl[k] * 4);
        if (!strcmp(lay, "flat") && R > 0) resp[r][0] = (resp[0][0] + r) % 151643; /* nothing shared past P */
    }
    pack_group pg = {.prompt = prompt, .P = P, .N = N, .resp = (const int *const *)resp, .R = Rs};
    pack_batch b;
    if (pack_build(&b, &pg, 0, 1, !strcmp(lay, "tree") ? PACK_TREE : PACK_PACKED)) gc_die(NULL, "pack_build");
    if (nt)
        printf("grpod-cuda %s: %d turns, layout %s: T=%d packed tokens (flat P + NR %d, standard %d), %d extra key ranges\n",
               size, nt, lay, b.T, P + N * R, N * (P + R), b.nx);
    model_acts a;
    size_t fr_now, act_budget = 0;
    cudaMemGetInfo(&fr_now, &total);
    if (budget_gib > 0) {
        double left = budget_gib * 1073741824.0 - (double)(free0 - fr_now) - 1.5 * 1073741824.0;
        act_budget = left > 1 ? (size_t)left : 1;
    }
    if (model_acts_init_budget(&m, &a, b.T, b.M, act_budget)) gc_die(be, "model_acts_init");
    size_t full = model_acts_bytes(&m, b.T, b.M, 1, 0), ck = model_acts_bytes(&m, b.T, b.M, 1, L);
    printf("grpod-cuda %s: activations %.2f GiB with %d of %d layers recomputed (all kept: %.2f GiB, all recomputed: "
           "%.2f GiB; %.1f KiB a token a layer kept, %.1f recomputed)\n",
           size, model_acts_bytes(&m, b.T, b.M, 1, a.n_ckpt) / 1073741824.0, a.n_ckpt, L, full / 1073741824.0, ck / 1073741824.0,
           (double)(full - ck) / (L - 1) / b.T / 1024 + 2.0 * C / 1024, 2.0 * C / 1024);
    model_input in;
    model_input_from_batch(&in, &b);
    float *old = malloc((size_t)b.M * 4), *dlogp = malloc((size_t)b.M * 4);
    for (int i = 0; i < b.M; i++) dlogp[i] = (i % 3 - 1) * 1.0f / b.M; /* a PPO-like advantage-weighted mean */

    enum { REPS = 3 };
    double t[REPS + 1][6];
    size_t used_peak = 0;
    for (int rep = 0; rep <= REPS; rep++) {
        double t0 = gc_now();
        if (model_forward(&m, &wv, &a, NULL, &in, 1.0f, 0) || be->to_host(be, old, a.logp, (size_t)b.M * 4)) gc_die(be, "old");
        double t1 = gc_now();
        if (model_forward(&m, &rv, &a, NULL, &in, 1.0f, 0)) gc_die(be, "ref");
        double t2 = gc_now();
        be->zero(be, g, n * 4);
        if (model_forward(&m, &wv, &a, NULL, &in, 1.0f, 0)) gc_die(be, "policy fwd");
        if (model_backward(&m, &wv, &gv, &a, &in, dlogp, NULL, 1.0f)) gc_die(be, "policy bwd");
        double t3 = gc_now();
        double norm = sqrt(be->sumsq(be, g, (long long)n));
        if (norm > 1.0) be->scale(be, g, (long long)n, (float)(1.0 / (norm + 1e-6)));
        if (offload) {
            if (offload_adamw(&off, n, master, mo, ve, w, g, 1e-6f, 0.9f, 0.999f, 1e-8f, 0.01f, rep + 1)) gc_die(be, "offload");
        } else {
            be->adamw(be, master, w, g, mo, ve, (long long)n, 1e-6f, 0.9f, 0.999f, 1e-8f, 0.01f, rep + 1);
        }
        if (be->sync(be)) gc_die(be, "adamw");
        double t4 = gc_now();
        t[rep][0] = t1 - t0;
        t[rep][1] = t2 - t1;
        t[rep][2] = t3 - t2;
        t[rep][3] = t4 - t3;
        t[rep][4] = offload ? off.ms_host / 1e3 : 0;
        t[rep][5] = offload ? off.ms_wait / 1e3 : 0;
        size_t fr;
        cudaMemGetInfo(&fr, &total);
        if (free0 - fr > used_peak) used_peak = free0 - fr;
        fprintf(stderr, "rep %d: old %.0f ref %.0f policy %.0f optim %.0f ms (host AdamW %.0f, waiting %.0f; grad norm %.3g)\n",
                rep, t[rep][0] * 1e3, t[rep][1] * 1e3, t[rep][2] * 1e3, t[rep][3] * 1e3, t[rep][4] * 1e3, t[rep][5] * 1e3, norm);
    }
    double med[6], tot = 0;
    for (int k = 0; k < 6; k++) {
        double v[REPS];
        for (int r = 0; r < REPS; r++) v[r] = t[r + 1][k];
        qsort(v, REPS, sizeof(double), gc_cmpd);
        med[k] = v[REPS / 2];
        if (k < 4) tot += med[k];
    }
    double mlp = moe ? 3.0 * C * c.Fm * c.top_k + (double)C * c.E : 3.0 * C * F; /* active */
    double nonemb = (double)L * ((double)C * H * 128 + 2.0 * C * K * 128 + (double)H * 128 * C + mlp);
    double att = 2.0 * P * P * H * 128 + 4.0 * N * R * (P + R / 2.0) * H * 128;
    double fwd = 2 * nonemb * (P + (double)N * R) + 2.0 * C * c.V * N * R + L * att;
    double flops = 5 * fwd;
    printf("grpod-cuda %s P=%d N=%d R=%d T=%d: total %.0f ms  old %.0f  ref %.0f  policy %.0f  optim %.0f  "
           "peak %.1f GiB (device memory in use)\n",
           size, P, N, R, b.T, tot * 1e3, med[0] * 1e3, med[1] * 1e3, med[2] * 1e3, med[3] * 1e3, used_peak / 1073741824.0);
    double rss, hwm, comp = med[0] + med[1] + med[2];
    host_rss(&rss, &hwm);
    printf("grpod-cuda %s: optimizer %s, %d/%d layers recomputed: compute-only (old+ref+policy) %.0f ms, step/compute "
           "%.2fx; optim %.0f ms = host AdamW %.0f + waiting for copies %.0f + clip/tail %.0f; host RSS %.1f GiB (peak %.1f)\n",
           size, offload ? "offloaded" : "on device", a.n_ckpt, L, comp * 1e3, tot / comp, med[3] * 1e3, med[4] * 1e3,
           med[5] * 1e3, (med[3] - med[4] - med[5]) * 1e3, rss, hwm);
    if (hyb) printf("grpod-cuda %s: %.0f packed tokens/s per pass-set\n", size, b.T / tot);
    else
        printf("grpod-cuda %s: %.0f packed tokens/s per pass-set; useful %.0f TFLOP -> %.0f TFLOP/s (%.0f%% of 793)\n", size,
               b.T / tot, flops / 1e12, flops / tot / 1e12, flops / tot / 793e12 * 100);
    /* where the time goes: one layer's attention forward and backward on this batch */
    if (!hyb) {
        int T = b.T;
        struct model_layer_acts *A = &a.l[0];
        attn_ranges rg = {0};
        int *ints = a.ints;
        rg.a0 = ints + 2 * a.cap_T;
        rg.a1 = ints + 3 * a.cap_T;
        rg.b0 = ints + 4 * a.cap_T;
        rg.b1 = ints + 5 * a.cap_T;
        rg.x0 = b.nx ? ints + 9 * a.cap_T + 2 * a.cap_M : NULL; /* model_input_upload's places */
        rg.x1 = b.nx ? rg.x0 + (size_t)ATTN_XR_MAX * a.cap_T : NULL;
        rg.nx = b.nx;
        double f0 = gc_now();
        for (int i = 0; i < 3; i++) be->attention_fwd(be, A->att, A->lse, A->q, A->k, A->v, rg, T, H, K, 128);
        be->sync(be);
        double f1 = gc_now();
        for (int i = 0; i < 3; i++)
            be->attention_bwd(be, a.dq, a.dk, a.dv, a.datt, A->q, A->k, A->v, A->att, A->lse, rg, T, T, H, K, 128);
        if (be->sync(be)) gc_die(be, "attention");
        double f2 = gc_now();
        double pairs = (double)P * (P + 1) / 2 + (double)N * R * P + (double)N * R * (R + 1) / 2;
        printf("grpod-cuda %s: attention per layer: fwd %.1f ms, bwd %.1f ms (%.0f M query-key pairs x %d heads; "
               "x%d layers = %.0f ms fwd, %.0f ms bwd)\n",
               size, (f1 - f0) / 3 * 1e3, (f2 - f1) / 3 * 1e3, pairs / 1e6, H, L, (f1 - f0) / 3 * 1e3 * L, (f2 - f1) / 3 * 1e3 * L);
    }
    model_acts_free(&m, &a);
    pack_batch_free(&b);
    if (offload) offload_free(&off);
    be->destroy(be);
    return 0;
}
