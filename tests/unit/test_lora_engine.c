/* test_lora_engine.c — LoRA through the engine on the embedded default model (cpu): fresh
 * adapters (B = 0) give the base's logprobs bit for bit; updates move the policy the right
 * way while the base — which is also the reference — stays bit-identical and only A and B
 * change; rollouts sample with the adapters (their logprobs match the training path's); the
 * PEFT checkpoint reloads (as a resume and as --lora-init) to identical logprobs; a merged
 * checkpoint opens as a plain model with the policy's logprobs. */
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "engine/engine.h"
#include "engine/train/train_testing.h"
#include "common/err.h"

#define MODEL TEST_TMP "/grpod_test_lora_model"
#define CKPT TEST_TMP "/grpod_test_lora_ckpt"
#define MERGED TEST_TMP "/grpod_test_lora_merged"

static eng *open_with(int rank, const char *resume, const char *init) {
    if (eng_ensure_default_model(MODEL)) {
        printf("default model: %s\n", err_msg());
        return NULL;
    }
    eng *e;
    eng_open_opts o = {
        .model_dir = MODEL, .backend = "cpu", .lora_rank = rank, .lora_alpha = 16, .resume_dir = resume, .lora_init = init};
    if (eng_open(&o, &e)) {
        printf("open: %s\n", err_msg());
        return NULL;
    }
    return e;
}

/* Host copies of e's base weights (n_params) and of its trainable master, the adapters (n_train). */
static float *weights_copy(eng *e, long long n) {
    float *h = malloc((size_t)n * 4);
    if (eng_testing_weights(e, h)) printf("  weights: %s\n", err_msg());
    return h;
}
static float *master_copy(eng *e, long long n) {
    float *h = malloc((size_t)n * 4);
    if (eng_testing_state(e, h, NULL, NULL)) printf("  master: %s\n", err_msg());
    return h;
}

static int same(float **a, float **b, const int *R, int n) {
    int s = 1;
    for (int r = 0; r < n; r++) s &= !memcmp(a[r], b[r], (size_t)R[r] * 4);
    return s;
}

static const int prompt[] = {72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100};
#define NP ((int)(sizeof prompt / sizeof prompt[0]))

TEST(lora_trains_adapters_over_a_frozen_reference) {
    eng *e0 = open_with(0, NULL, NULL), *e = open_with(8, NULL, NULL);
    CHECK(e0 && e);
    eng_info in;
    eng_get_info(e, &in);
    CHECK_EQ_INT(in.lora_rank, 8);
    CHECK_STR(in.lora_targets, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
    eng_testing_info ti;
    eng_testing_get(e, &ti);
    CHECK(!ti.own_reference && ti.n_train > 0 && ti.n_train < ti.n_params && ti.n_lora_a > 0);
    int good[6] = {65, 66, 67, 68, 69, 70}, bad[5] = {97, 98, 99, 100, 101}, mid[4] = {48, 49, 50, 51};
    const int *resp[3] = {good, bad, mid};
    int R[3] = {6, 5, 4};
    float rew[3] = {1.0f, 0.0f, 0.5f};
    eng_update_group g = {.prompt = prompt, .P = NP, .n = 3, .resp = resp, .R = R, .reward = rew};
    float **base, **before, **after, **ref;
    CHECK(eng_logprobs(e0, &g, 1, 0, 1.0f, 1 << 20, &base) == 0);
    CHECK(eng_logprobs(e, &g, 1, 0, 1.0f, 1 << 20, &before) == 0);
    CHECK_MSG(same(base, before, R, 3), "fresh adapters (B = 0) changed the logprobs");
    float *w0 = weights_copy(e, ti.n_params), *l0 = master_copy(e, ti.n_train);
    loss_config a;
    loss_config_default(&a);
    a.kl_coef = 0.05f; /* the reference pass runs (on the base) */
    eng_optim o;
    eng_optim_default(&o);
    o.lr = 3e-3f;
    eng_update_result u;
    for (int i = 0; i < 3; i++) CHECK_MSG(eng_update(e, &g, 1, &a, &o, 1 << 20, &u, NULL, NULL) == 0, "%s", err_msg());
    CHECK(eng_logprobs(e, &g, 1, 0, 1.0f, 1 << 20, &after) == 0);
    CHECK(eng_logprobs(e, &g, 1, 1, 1.0f, 1 << 20, &ref) == 0);
    double d[3] = {0};
    for (int r = 0; r < 3; r++)
        for (int t = 0; t < R[r]; t++) d[r] += after[r][t] - before[r][t];
    printf("  Δ sum logprob: good %+.3f bad %+.3f mid %+.3f; kl %.4f grad_norm %.3f\n", d[0], d[1], d[2], u.kl, u.grad_norm);
    CHECK_MSG(d[0] > 0.5 && d[1] < -0.5, "good moved %+.3f, bad %+.3f", d[0], d[1]);
    CHECK_MSG(u.kl > 0, "kl %.3g: the reference pass did not see the base", u.kl);
    CHECK_MSG(same(ref, base, R, 3), "the reference (base, adapters off) moved");
    float *w1 = weights_copy(e, ti.n_params), *l1 = master_copy(e, ti.n_train);
    CHECK_MSG(!memcmp(w0, w1, (size_t)ti.n_params * 4), "the base weights changed");
    long long na = ti.n_lora_a, changed_a = 0, changed_b = 0;
    for (long long i = 0; i < ti.n_train; i++)
        if (l1[i] != l0[i]) *(i < na ? &changed_a : &changed_b) += 1;
    printf("  changed: %lld of %lld A, %lld of %lld B elements\n", changed_a, na, changed_b, ti.n_train - na);
    CHECK_MSG(changed_a > na / 2 && changed_b > (ti.n_train - na) / 2, "A %lld B %lld changed", changed_a, changed_b);
    free(w1);
    free(l1);

    /* rollouts decode with the adapters: their logprobs are the trained policy's */
    eng_rollout_group rg = {prompt, NP, 3};
    eng_sampling s;
    eng_sampling_default(&s);
    s.max_tokens = 10;
    s.seed = 3;
    eng_group_result gr;
    CHECK(eng_rollout(e, &rg, 1, &s, &gr, NULL, NULL) == 0);
    double worst = 0;
    for (int r = 0; r < 3; r++) {
        eng_response *x = &gr.resp[r];
        const int *rr[1] = {x->tokens};
        eng_update_group ug = {.prompt = prompt, .P = NP, .n = 1, .resp = rr, .R = &x->n_tokens};
        float **lp;
        CHECK(eng_logprobs(e, &ug, 1, 0, 1.0f, 1 << 20, &lp) == 0);
        for (int t = 0; t < x->n_tokens; t++) worst = fmax(worst, fabs(lp[0][t] - x->logprobs[t]));
        eng_logprobs_free(lp, &ug, 1);
    }
    eng_group_result_free(&gr);
    printf("  rollout vs training logprobs with adapters: max |Δ| %.2e\n", worst);
    CHECK_MSG(worst <= 1e-5, "rollout logprobs differ from the training path by %.3g", worst);

    /* PEFT checkpoint: resume and --lora-init both reload the same policy */
    CHECK(system("rm -rf " CKPT " " MERGED) == 0);
    CHECK_MSG(eng_checkpoint_save(e, CKPT) == 0, "%s", err_msg());
    CHECK_MSG(eng_checkpoint_save_ex(e, MERGED, 1) == 0, "%s", err_msg());
    eng *r1 = open_with(0, CKPT, NULL), *r2 = open_with(0, NULL, CKPT);
    CHECK(r1 && r2);
    float **lr1, **lr2, **lm;
    CHECK(eng_logprobs(r1, &g, 1, 0, 1.0f, 1 << 20, &lr1) == 0);
    CHECK(eng_logprobs(r2, &g, 1, 0, 1.0f, 1 << 20, &lr2) == 0);
    eng_info i1;
    eng_get_info(r1, &i1);
    CHECK_EQ_INT(i1.policy_version, 3);
    CHECK_EQ_INT(i1.lora_rank, 8);
    CHECK_MSG(same(lr1, after, R, 3) && same(lr2, after, R, 3), "the reloaded adapter gives other logprobs");
    /* merged: a plain HF directory */
    eng *em;
    eng_open_opts om = {.model_dir = MERGED, .backend = "cpu"};
    CHECK_MSG(eng_open(&om, &em) == 0, "%s", err_msg());
    CHECK(eng_logprobs(em, &g, 1, 0, 1.0f, 1 << 20, &lm) == 0);
    double wm = 0;
    for (int r = 0; r < 3; r++)
        for (int t = 0; t < R[r]; t++) wm = fmax(wm, fabs(lm[r][t] - after[r][t]));
    printf("  merged checkpoint vs adapters: max |Δ logprob| %.2e\n", wm);
    CHECK_MSG(wm < 1e-4, "merged weights give logprobs %.3g away", wm);
    /* a flag that contradicts the adapter is a clear error */
    eng *bad_e;
    eng_open_opts ob = {.model_dir = MODEL, .backend = "cpu", .lora_rank = 4, .lora_init = CKPT};
    CHECK(eng_open(&ob, &bad_e) == GE_INVALID);
    CHECK(strstr(err_msg(), "rank 8") != NULL);

    eng_logprobs_free(lr1, &g, 1);
    eng_logprobs_free(lr2, &g, 1);
    eng_logprobs_free(lm, &g, 1);
    eng_logprobs_free(base, &g, 1);
    eng_logprobs_free(before, &g, 1);
    eng_logprobs_free(after, &g, 1);
    eng_logprobs_free(ref, &g, 1);
    free(w0);
    free(l0);
    eng_close(em);
    eng_close(r1);
    eng_close(r2);
    eng_close(e0);
    eng_close(e);
    CHECK(system("rm -rf " CKPT " " MERGED) == 0);
}

int main(void) {
    RUN(lora_trains_adapters_over_a_frozen_reference);
    return CHECK_DONE();
}
