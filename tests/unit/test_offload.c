/* test_offload.c — the optimizer with its state in host memory (engine/train/offload.h).
 *   host AdamW: adamw_bf16_cpu is adamw_cpu bit for bit and its bf16 copy rounds as CUDA's
 *     __float2bfloat16 (nearest even; ties, NaN, infinities);
 *   the staging pipeline: offload_adamw over several chunks (the stage ring wraps) equals one
 *     be->adamw call bit for bit after several steps, on the cpu backend;
 *   the engine: updates with --optimizer-offload on and off give byte-identical checkpoints
 *     (master weights and both moments) over several optimizer steps with clipping, and a
 *     checkpoint written with offload resumes to the same place with or without it;
 *   a split state (--optimizer-offload FRACTION: elements [0, d) on the device, [d, n) in host
 *     memory): byte-identical checkpoints and act weights to the unsplit state at d = n, 0,
 *     inside a tensor and at a tensor's edge, on the default model and on a Qwen3.5 model whose
 *     zero-centred norm gains (their decay's correction) straddle d; a checkpoint saved split
 *     resumes unsplit and the other way round, byte-identical; the plan says "split" with the
 *     host's bytes and no safety copy (an explicit one refused); bad values refused, naming the
 *     field.
 * bf16 moments (--optimizer-moments bf16): adamw_m16_cpu equals adamw_cpu on moments rounded to
 *   bf16 before each step, bit for bit (weights, and the moments it stores are that reference's
 *   rounded), through the staging pipeline too; the engine's plan counts 8 bytes a parameter,
 *   its checkpoint's moments are bf16 values near the fp32 engine's, a resume continues bit for
 *   bit, an undo restores the state bit for bit; where the state is not in host memory it is
 *   refused, naming the field.
 * Bit-equality is the contract on the cpu backend (the same element math on the same inputs);
 * the CUDA comparison (<= 1e-6 relative) is tests/gpu/test_offload.c. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/backend/backend.h"
#include "engine/engine.h"
#include "engine/engine_testing.h"
#include "common/err.h"
#include "engine/train/offload.h"
#include "engine/train/train_testing.h"
#include "common/bf16.h"
#include "kernels/adamw.h"

#define MODEL TEST_TMP "/grpod_test_offload_model"
#define CK TEST_TMP "/grpod_test_offload_ck"

static uint64_t rng = 88172645463325252ULL;
static float frand(float scale) { /* xorshift, uniform in [-scale, scale) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) / (double)(1ULL << 24) * 2 - 1) * scale;
}

TEST(bf16_rounding_matches_cuda) {
    union {
        uint32_t u;
        float f;
    } x;
    struct {
        uint32_t in;
        uint16_t out;
    } cases[] = {
        {0x3f800000u, 0x3f80}, /* 1.0 exact */
        {0x3f808000u, 0x3f80}, /* tie, even below: stays */
        {0x3f818000u, 0x3f82}, /* tie, odd below: rounds up */
        {0x3f808001u, 0x3f81}, /* above the tie */
        {0x7f7fffffu, 0x7f80}, /* max float rounds to inf, as CUDA */
        {0x7f800000u, 0x7f80}, {0xff800000u, 0xff80}, /* +-inf */
        {0x7fc00001u, 0x7fc0}, {0x7f800001u, 0x7fc0}, /* NaNs stay NaN (quiet) */
        {0x80000000u, 0x8000}, /* -0 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        x.u = cases[i].in;
        CHECK_MSG(bf16_from_f32(x.f) == cases[i].out, "0x%08x -> 0x%04x, expected 0x%04x", cases[i].in, bf16_from_f32(x.f),
                  cases[i].out);
    }
}

TEST(host_adamw_equals_reference) {
    enum { N = 4099 };
    static float p1[N], p2[N], g[N], m1[N], m2[N], v1[N], v2[N];
    static uint16_t act[N];
    for (int i = 0; i < N; i++) {
        p1[i] = p2[i] = frand(0.5f);
        m1[i] = m2[i] = v1[i] = v2[i] = 0;
    }
    for (int step = 1; step <= 4; step++) {
        for (int i = 0; i < N; i++) g[i] = frand(1e-2f) * (i % 97 == 0 ? 100 : 1);
        adamw_cpu(p1, g, m1, v1, N, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step);
        adamw_bf16_cpu(p2, act, g, m2, v2, N, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, step);
        CHECK(!memcmp(p1, p2, sizeof p1) && !memcmp(m1, m2, sizeof m1) && !memcmp(v1, v2, sizeof v1));
        for (int i = 0; i < N; i++) CHECK_MSG(act[i] == bf16_from_f32(p2[i]), "act[%d]", i);
    }
}

/* The reference for bf16 moments: adamw_cpu on fp32 moments rounded to bf16 before each step. */
static void round_bf16(float *x, long long n) {
    for (long long i = 0; i < n; i++) x[i] = f32_from_bf16(bf16_from_f32(x[i]));
}
TEST(host_adamw_bf16_moments) {
    enum { N = 4099 };
    static float p1[N], p2[N], p3[N], g[N], m1[N], v1[N];
    static uint16_t m2[N], v2[N], m3[N], v3[N], act[N];
    for (int i = 0; i < N; i++) {
        p1[i] = p2[i] = p3[i] = frand(0.5f);
        m1[i] = v1[i] = 0;
        m2[i] = v2[i] = m3[i] = v3[i] = 0;
    }
    int moved = 0;
    for (int step = 1; step <= 5; step++) {
        for (int i = 0; i < N; i++) g[i] = frand(1e-2f) * (i % 97 == 0 ? 100 : 1);
        round_bf16(m1, N);
        round_bf16(v1, N);
        adamw_cpu(p1, g, m1, v1, N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.01f, step);
        adamw_m16_cpu(p2, act, g, m2, v2, N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.01f, step);
        adamw_m16_cpu(p3, NULL, g, m3, v3, N, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.01f, step);
        CHECK_MSG(!memcmp(p1, p2, sizeof p1) && !memcmp(p2, p3, sizeof p2), "step %d: weights", step);
        for (int i = 0; i < N; i++) {
            CHECK_MSG(m2[i] == bf16_from_f32(m1[i]) && v2[i] == bf16_from_f32(v1[i]), "step %d, element %d: moments", step, i);
            CHECK_MSG(act[i] == bf16_from_f32(p2[i]) && m3[i] == m2[i] && v3[i] == v2[i], "step %d, element %d", step, i);
            moved += m1[i] != f32_from_bf16(m2[i]); /* the rounding acts: the test could fail */
        }
    }
    CHECK_MSG(moved > N, "only %d moments were changed by their rounding", moved);
}

/* offload_adamw over 11 chunks of 1000 through 3 stages (the ring wraps) against one call of the
 * reference: be->adamw with fp32 moments, adamw_m16_cpu with bf16 ones (mb: bytes a moment). */
static void pipeline_case(int mb) {
    eng_backend *be;
    CHECK(backend_cpu_create(&be, 0) == 0);
    const long long n = 10007;
    float *p1 = malloc(n * 4), *p2 = malloc(n * 4), *act = malloc(n * 4), *g = malloc(n * 4);
    void *m1 = calloc(n, mb), *m2 = calloc(n, mb), *v1 = calloc(n, mb), *v2 = calloc(n, mb);
    CHECK(p1 && p2 && act && g && m1 && m2 && v1 && v2);
    for (long long i = 0; i < n; i++) p1[i] = p2[i] = act[i] = frand(0.3f);
    eng_offload o;
    CHECK(offload_init(&o, be, n, 1000) == 0);
    o.m16 = mb == 2;
    for (int step = 1; step <= 5; step++) {
        for (long long i = 0; i < n; i++) g[i] = frand(3e-2f);
        if (o.m16) adamw_m16_cpu(p1, NULL, g, m1, v1, n, 2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
        else be->adamw(be, p1, NULL, g, m1, v1, n, 2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
        CHECK(offload_adamw(&o, n, p2, m2, v2, act, g, 2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step) == 0);
    }
    CHECK_MSG(!memcmp(p1, p2, n * 4) && !memcmp(m1, m2, n * mb) && !memcmp(v1, v2, n * mb), "%d-byte moments", mb);
    CHECK(!memcmp(act, p2, n * 4)); /* the act copy (fp32 on cpu) is the new master */
    offload_free(&o);
    be->destroy(be);
    void *all[] = {p1, p2, act, g, m1, m2, v1, v2};
    for (int i = 0; i < 8; i++) free(all[i]);
}
TEST(pipeline_equals_backend_adamw) { pipeline_case(4); }
TEST(pipeline_bf16_moments) { pipeline_case(2); }

/* two groups over the default model's byte vocabulary: one shared prompt tail, ragged responses */
static const int prompt[] = {71, 114, 97, 100, 105, 101, 110, 116, 115, 32, 103, 111, 32, 100, 111, 119, 110, 58};
#define NP ((int)(sizeof prompt / sizeof prompt[0]))
static const int ra[4] = {49, 50, 51, 10}, rb[6] = {97, 98, 99, 100, 101, 102}, rc_[2] = {33, 63}, rd[5] = {111, 107, 46, 32, 257};
static const int *resp[4] = {ra, rb, rc_, rd};
static int R[4] = {4, 6, 2, 5};
static float rew1[4] = {1.0f, 0.0f, 0.7f, 0.2f}, rew2[4] = {0.1f, 0.9f, 0.0f, 0.5f};

static const char *moments_; /* optimizer_moments of the engines opened next (NULL: fp32) */
static eng *open_model(const char *dir, const char *offload, const char *resume) {
    eng *e;
    eng_open_opts o = {
        .model_dir = dir, .backend = "cpu", .optimizer_offload = offload, .resume_dir = resume, .optimizer_moments = moments_};
    if (eng_open(&o, &e)) {
        printf("open: %s\n", err_msg());
        return NULL;
    }
    return e;
}
static eng *open_engine(const char *offload, const char *resume) { return open_model(MODEL, offload, resume); }

/* `updates` updates of two groups, one optimizer step per group, two epochs: 4 steps each */
static int train(eng *e, int updates) {
    eng_update_group g[2] = {{.prompt = prompt, .P = NP, .n = 4, .resp = resp, .R = R, .reward = rew1},
                             {.prompt = prompt + 3, .P = NP - 3, .n = 4, .resp = resp, .R = R, .reward = rew2}};
    loss_config a;
    loss_config_default(&a);
    a.kl_coef = 0.01f;
    a.ppo_mini_batch_size = 1;
    a.ppo_epochs = 2;
    eng_optim o;
    eng_optim_default(&o);
    o.lr = 2e-3f;
    o.grad_clip = 0.05f; /* small: the clip acts */
    for (int k = 0; k < updates; k++) {
        eng_update_result u;
        if (eng_update(e, g, 2, &a, &o, 1 << 20, &u, NULL, NULL)) {
            printf("update: %s\n", err_msg());
            return -1;
        }
        if (u.optimizer_steps != 4) return -1;
    }
    return 0;
}

static long file_bytes(const char *path, char **out) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc((size_t)n + 1);
    if (!*out || fread(*out, 1, (size_t)n, f) != (size_t)n) n = -1;
    fclose(f);
    return n;
}

/* 1 when dir a's and dir b's weights and optimizer files hold the same bytes (say = print the first difference) */
static int same_checkpoint(const char *a, const char *b, int say) {
    const char *files[] = {"model.safetensors", "optimizer.safetensors", "grpod_state.json"};
    for (int i = 0; i < 3; i++) {
        char pa[256], pb[256], *da = NULL, *db = NULL;
        snprintf(pa, sizeof pa, "%s/%s", a, files[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, files[i]);
        long na = file_bytes(pa, &da), nb = file_bytes(pb, &db);
        int same = na > 0 && na == nb && !memcmp(da, db, (size_t)na);
        free(da);
        free(db);
        if (!same && say) printf("  %s differs (%ld vs %ld bytes)\n", files[i], na, nb);
        if (!same) return 0;
    }
    return 1;
}

TEST(engine_offload_on_equals_off) {
    system("rm -rf " CK "*");
    CHECK(eng_ensure_default_model(MODEL) == 0);
    eng *on = open_engine("on", NULL), *off = open_engine("off", NULL), *autom = open_engine(NULL, NULL);
    CHECK(on && off && autom);
    eng_close(autom); /* auto on cpu: off, and opening must work */
    CHECK(train(on, 2) == 0 && train(off, 2) == 0);
    CHECK(eng_checkpoint_save(on, CK "_on") == 0 && eng_checkpoint_save(off, CK "_off") == 0);
    CHECK(same_checkpoint(CK "_on", CK "_off", 1));
    eng_close(on);
    eng_close(off);
    /* resume the offloaded checkpoint with and without offload: one more update each */
    eng *r_on = open_engine("on", CK "_on"), *r_off = open_engine("off", CK "_on");
    CHECK(r_on && r_off);
    CHECK(train(r_on, 1) == 0 && train(r_off, 1) == 0);
    CHECK(eng_checkpoint_save(r_on, CK "_r_on") == 0 && eng_checkpoint_save(r_off, CK "_r_off") == 0);
    CHECK(same_checkpoint(CK "_r_on", CK "_r_off", 1));
    CHECK(!same_checkpoint(CK "_r_on", CK "_on", 0));
    eng_close(r_on);
    eng_close(r_off);
    eng *bad;
    eng_open_opts o = {.model_dir = MODEL, .backend = "cpu", .optimizer_offload = "sometimes"};
    CHECK(eng_open(&o, &bad) == GE_INVALID);
    CHECK(strstr(err_msg(), "optimizer_offload") != NULL);
    system("rm -rf " CK "*");
}

/* The whole master and moments of e (n each) into st[3]. */
static int state_of(eng *e, float *st[3], long long *n) {
    eng_testing_info ti;
    eng_testing_get(e, &ti);
    *n = ti.n_params;
    for (int i = 0; i < 3; i++) st[i] = malloc((size_t)*n * 4);
    return !st[0] || !st[1] || !st[2] || eng_testing_state(e, st[0], st[1], st[2]);
}

TEST(engine_bf16_moments) {
    system("rm -rf " CK "*");
    CHECK(eng_ensure_default_model(MODEL) == 0);
    eng *f = open_engine("on", NULL);
    moments_ = "bf16";
    eng *b = open_engine("on", NULL), *a = open_engine(NULL, NULL); /* auto: on, for bf16 moments */
    CHECK(f && b && a);
    eng_info in;
    eng_testing_info ti;
    eng_testing_get(b, &ti);
    eng_get_info(b, &in);
    CHECK_MSG(in.plan.host_state == 8 * ti.n_params && !strcmp(in.plan.optimizer, "host"), "plan: %s, host_state %lld of %lld",
              in.plan.optimizer, in.plan.host_state, ti.n_params);
    eng_get_info(a, &in);
    CHECK_MSG(!strcmp(in.plan.optimizer, "host"), "auto with bf16 moments: the optimizer is on the %s", in.plan.optimizer);
    eng_close(a);
    /* two updates each: the moments are bf16 values, near the fp32 engine's, and so is the step */
    float *sf[3], *sb[3], *s0[3], *s1[3];
    long long n;
    CHECK(state_of(f, s0, &n) == 0);
    CHECK(train(f, 2) == 0 && train(b, 2) == 0);
    CHECK(state_of(f, sf, &n) == 0 && state_of(b, sb, &n) == 0);
    double moved = 0, off = 0; /* |master - fp32's| against |fp32's - the initial weights| */
    for (long long k = 0; k < n; k++) {
        moved += ((double)sf[0][k] - s0[0][k]) * ((double)sf[0][k] - s0[0][k]);
        off += ((double)sb[0][k] - sf[0][k]) * ((double)sb[0][k] - sf[0][k]);
    }
    long long not_bf16 = 0, nonzero = 0;
    for (int i = 1; i < 3; i++)
        for (long long k = 0; k < n; k++) {
            not_bf16 += sb[i][k] != f32_from_bf16(bf16_from_f32(sb[i][k]));
            nonzero += sb[i][k] != 0;
        }
    double e_w = sqrt(off / moved), e_m = rel_l2(sb[1], sf[1], (size_t)n), e_v = rel_l2(sb[2], sf[2], (size_t)n);
    printf("  bf16 moments vs fp32 after 8 steps: the weights' change %.2e off (rel L2), m %.2e, v %.2e; %lld moments not "
           "bf16 values, %lld nonzero\n",
           e_w, e_m, e_v, not_bf16, nonzero);
    CHECK(not_bf16 == 0 && nonzero > n);
    CHECK(e_w > 0 && e_w < 1e-2 && e_m < 2e-2 && e_v < 2e-2);
    for (int i = 0; i < 3; i++) {
        free(sf[i]);
        free(s0[i]);
    }
    eng_close(f);
    /* a checkpoint resumes bit for bit: one more update on the engine and on its resumed copy */
    CHECK(eng_checkpoint_save(b, CK "_b") == 0);
    eng *r = open_engine("on", CK "_b");
    CHECK(r && train(b, 1) == 0 && train(r, 1) == 0);
    CHECK(eng_checkpoint_save(b, CK "_b1") == 0 && eng_checkpoint_save(r, CK "_r1") == 0);
    CHECK(same_checkpoint(CK "_b1", CK "_r1", 1));
    eng_close(r);
    /* the same checkpoint on an engine with fp32 moments: the moments it holds are those values */
    moments_ = NULL;
    eng *r32 = open_engine("on", CK "_b");
    float *s32[3];
    CHECK(r32 && state_of(r32, s32, &n) == 0);
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(!memcmp(s32[i], sb[i], (size_t)n * 4), "the bf16 checkpoint on fp32 moments: array %d differs", i);
        free(s32[i]);
    }
    eng_close(r32);
    moments_ = "bf16";
    /* an undo restores the state (the safety copy holds bf16 moments) */
    CHECK(state_of(b, s0, &n) == 0);
    CHECK(train(b, 1) == 0 && eng_update_undo(b) == 0);
    CHECK(state_of(b, s1, &n) == 0);
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(!memcmp(s0[i], s1[i], (size_t)n * 4), "undo: array %d differs", i);
        free(s0[i]);
        free(s1[i]);
        free(sb[i]);
    }
    eng_close(b);
    /* refused where the moments would not be in host memory; a bad value names the field */
    eng *bad;
    const char *where[2] = {"off", "0.5"};
    for (int k = 0; k < 2; k++) {
        eng_open_opts o = {.model_dir = MODEL, .backend = "cpu", .optimizer_offload = where[k], .optimizer_moments = "bf16"};
        CHECK_MSG(eng_open(&o, &bad) == GE_UNSUPPORTED && strstr(err_msg(), "optimizer_moments"), "offload %s: %s", where[k],
                  err_msg());
    }
    eng_open_opts o = {.model_dir = MODEL, .backend = "cpu", .optimizer_moments = "fp16"};
    CHECK(eng_open(&o, &bad) == GE_INVALID && strstr(err_msg(), "optimizer_moments"));
    moments_ = NULL;
    system("rm -rf " CK "*");
}

#define QWEN35 "tests/fixtures/data/qwen3_5_text"

/* The fraction string that puts the last n - d of n elements in host memory (d: the device's). */
static void frac_of(char out[24], long long n, long long d) { snprintf(out, 24, "%.12g", (double)(n - d) / (double)n); }

/* Opened split at d: 1 when the plan says so (host_state 12 (n - d), no safety copy). */
static eng *open_split(const char *dir, long long n, long long d, const char *resume) {
    char f[24];
    frac_of(f, n, d);
    eng *e = open_model(dir, f, resume);
    if (!e) return NULL;
    eng_info in;
    eng_get_info(e, &in);
    int split = d > 0 && d < n,
        ok = in.plan.host_state == 12 * (n - d) &&
        !strcmp(in.plan.optimizer,
                split   ? "split"
                    : d ? "device"
                        : "host") &&
        (!split || !strcmp(in.plan.snapshot_at, "none"));
    if (!ok)
        printf("  d=%lld of %lld (%s): plan %s, host_state %lld, snapshot %s\n", d, n, f, in.plan.optimizer, in.plan.host_state,
               in.plan.snapshot_at);
    if (!ok) eng_close(e);
    return ok ? e : NULL;
}

/* 1 when a's and b's act weights are the same bytes */
static int same_weights(eng *a, eng *b) {
    eng_testing_info ti;
    eng_testing_get(a, &ti);
    size_t n = (size_t)ti.n_params;
    float *wa = malloc(n * 4), *wb = malloc(n * 4);
    int same = wa && wb && !eng_testing_weights(a, wa) && !eng_testing_weights(b, wb) && !memcmp(wa, wb, n * 4);
    free(wa);
    free(wb);
    return same;
}

/* The model's n and the d's to try: n, 0, inside the parameter named `in` (a third of the way),
 * at its start. */
static int split_points(const char *dir, const char *in, long long *n, long long d[4]) {
    eng *e = open_model(dir, "off", NULL);
    if (!e) return -1;
    eng_testing_info ti;
    eng_testing_get(e, &ti);
    *n = ti.n_params;
    int found = 0;
    for (int i = 0; i < ti.m->n_params; i++)
        if (!strcmp(ti.m->params[i].name, in)) {
            d[2] = ti.m->params[i].off + ti.m->params[i].numel / 3;
            d[3] = ti.m->params[i].off;
            found = ti.m->params[i].numel >= 3 && d[3] > 0;
        }
    d[0] = *n;
    d[1] = 0;
    eng_close(e);
    return found ? 0 : -1;
}

/* the unsplit state's checkpoint after two updates, and each split's beside it */
static void split_equals_unsplit(const char *dir, const char *param) {
    long long n, d[4];
    CHECK(split_points(dir, param, &n, d) == 0);
    eng *ref = open_model(dir, "off", NULL);
    system("rm -rf " CK "_ref " CK "_split"); /* a save keeps a folder of its version: each its own */
    CHECK(ref && train(ref, 2) == 0 && eng_checkpoint_save(ref, CK "_ref") == 0);
    for (int k = 0; k < 4; k++) {
        eng *s = open_split(dir, n, d[k], NULL);
        CHECK_MSG(s != NULL, "%s: open at d=%lld", dir, d[k]);
        if (!s) continue;
        system("rm -rf " CK "_split");
        CHECK(train(s, 2) == 0 && eng_checkpoint_save(s, CK "_split") == 0);
        CHECK_MSG(same_checkpoint(CK "_ref", CK "_split", 1), "%s: d=%lld of %lld", dir, d[k], n);
        CHECK_MSG(same_weights(ref, s), "%s: act weights, d=%lld", dir, d[k]);
        eng_close(s);
    }
    eng_close(ref);
}

TEST(engine_split_equals_unsplit) {
    system("rm -rf " CK "*");
    CHECK(eng_ensure_default_model(MODEL) == 0);
    split_equals_unsplit(MODEL, "model.layers.0.mlp.up_proj.weight");
    split_equals_unsplit(QWEN35, "model.layers.1.input_layernorm.weight"); /* a zero-centred gain */
    system("rm -rf " CK "*");
}

TEST(engine_split_checkpoints_cross) {
    system("rm -rf " CK "*");
    long long n, d[4];
    CHECK(split_points(QWEN35, "model.layers.2.post_attention_layernorm.weight", &n, d) == 0);
    eng *s = open_split(QWEN35, n, d[2], NULL), *u = open_model(QWEN35, "off", NULL);
    CHECK(s && u && train(s, 1) == 0 && train(u, 1) == 0);
    CHECK(eng_checkpoint_save(s, CK "_s") == 0 && eng_checkpoint_save(u, CK "_u") == 0);
    CHECK(same_checkpoint(CK "_s", CK "_u", 1));
    eng_close(s);
    eng_close(u);
    /* split -> unsplit, unsplit -> split (elsewhere), split -> host: one more update each */
    eng *r[3] = {open_model(QWEN35, "off", CK "_s"), open_split(QWEN35, n, d[3], CK "_u"), open_model(QWEN35, "on", CK "_s")};
    const char *out[3] = {CK "_r0", CK "_r1", CK "_r2"};
    for (int i = 0; i < 3; i++) {
        CHECK_MSG(r[i] && train(r[i], 1) == 0 && eng_checkpoint_save(r[i], out[i]) == 0, "resume %d", i);
        if (i) CHECK_MSG(same_checkpoint(out[0], out[i], 1), "resume %d", i);
        if (i) CHECK_MSG(r[0] && r[i] && same_weights(r[0], r[i]), "resume %d: act weights", i);
    }
    CHECK(!same_checkpoint(out[0], CK "_s", 0));
    for (int i = 0; i < 3; i++) eng_close(r[i]);
    system("rm -rf " CK "*");
}

TEST(engine_split_refusals) {
    CHECK(eng_ensure_default_model(MODEL) == 0);
    static const char *bad[] = {"1.5", "-0.25", "0.5x", "nan", "abc", "1e400", "0.5 ", "0.1234567890123456"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        eng *e = NULL;
        eng_open_opts o = {.model_dir = MODEL, .backend = "cpu", .optimizer_offload = bad[i]};
        CHECK_MSG(eng_open(&o, &e) == GE_INVALID, "\"%s\" accepted", bad[i]);
        CHECK_MSG(strstr(err_msg(), "optimizer_offload") != NULL, "\"%s\": %s", bad[i], err_msg());
        eng_close(e);
    }
    static const char *good[] = {"0", "1", "0.5", "1e-3", "auto", "on", "off", ""};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        double f;
        CHECK_MSG(eng_offload_mode_check(good[i], &f) == 0, "\"%s\" refused", good[i]);
    }
    /* a split has no safety copy: asking for one is refused, naming why */
    eng *e = NULL;
    eng_open_opts o = {.model_dir = MODEL, .backend = "cpu", .optimizer_offload = "0.5", .snapshot = "host"};
    CHECK(eng_open(&o, &e) == GE_INVALID);
    CHECK(strstr(err_msg(), "split") != NULL);
    eng_close(e);
}

/* The auto rule at Qwen3.5-9B dims on one H200 (139.8 GiB, the reference placed) and the
 * 125 GiB host where the whole host state was refused (90 GiB available): the host takes what
 * it holds less 9 GiB, the device the rest with room for a 4096-token micro-batch (30.5 GiB,
 * model_acts_bytes at these dims); a host with less room, or a smaller device, that would leave
 * the device without that micro-batch's room is refused naming both; a host that holds it all
 * takes it; a host without room at all gives the host's refusal. */
TEST(engine_split_auto_rule) {
    const long long G = 1LL << 30, n = 8953803264LL, fr = (long long)(139.8 * G) - G - 2 * n, mb = (long long)(30.52 * G);
    long long hn = -1;
    CHECK(eng_testing_split_fits(n, 2, fr, 90 * G, mb, &hn) == 0);
    CHECK_MSG(hn == (90 * G - 9 * G) / 12 && hn < n, "host_n %lld", hn);
    long long d = n - hn, left = fr - (2 * n + 4 * n + 12 * d) - 4 * G;
    printf("  9B: %.2fB elements on the host (%lld GiB), %.2fB on the device (%lld GiB), %lld GiB left for activations\n",
           hn / 1e9, 12 * hn / G, d / 1e9, 12 * d / G, left / G);
    CHECK(left >= mb);
    CHECK(eng_testing_split_fits(n, 2, fr, 60 * G, mb, &hn) == GE_NOMEM); /* the device part would crowd out the micro-batch */
    CHECK(strstr(err_msg(), "micro-batch") != NULL && strstr(err_msg(), "host holds") != NULL);
    CHECK(eng_testing_split_fits(n, 2, 6 * n + 40 * G, 90 * G, mb, &hn) == GE_NOMEM); /* a smaller device: 40 GiB spare */
    CHECK(eng_testing_split_fits(n, 2, fr, 125 * G, mb, &hn) == 0 && hn == n); /* 100 GiB + 8 fits: all on the host */
    CHECK(eng_testing_split_fits(n, 2, fr, 5 * G, mb, &hn) == GE_NOMEM); /* no host room at all: the host's refusal */
    CHECK(strstr(err_msg(), "host memory") != NULL);
}

int main(void) {
    system("rm -rf " MODEL);
    RUN(bf16_rounding_matches_cuda);
    RUN(host_adamw_equals_reference);
    RUN(host_adamw_bf16_moments);
    RUN(pipeline_bf16_moments);
    RUN(pipeline_equals_backend_adamw);
    RUN(engine_offload_on_equals_off);
    RUN(engine_split_equals_unsplit);
    RUN(engine_split_checkpoints_cross);
    RUN(engine_split_refusals);
    RUN(engine_split_auto_rule);
    RUN(engine_bf16_moments);
    system("rm -rf " MODEL);
    return CHECK_DONE();
}
