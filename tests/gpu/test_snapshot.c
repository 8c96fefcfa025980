/* test_snapshot.c — the update's safety copy on the CUDA backend, in each place the memory plan
 * can put it (engine/train/snapshot.h): device, pinned host, host (optimizer offload), none.
 * For each, on the embedded default model with random prompts and advantages:
 *   - the same updates give the same bits as the plan's own choice ("auto"): where the copy
 *     lives changes nothing it computes;
 *   - an update that fails after its first optimizer step (a non-finite advantage in its second
 *     mini-batch) leaves the policy bit-equal to before it (probe logprobs, then the next
 *     update equal to an untouched engine's); with none it says GE_STATE_LOST;
 *   - eng_update_undo takes a successful update back bit for bit.
 * Rows: ROW|snapshot_<where>|<check>|0 or 1|0|PASS/FAIL (the value counts differing bits). */
#include <math.h>

#include "engine/engine.h"
#include "tests/gpu/gpu_check.h"

#define MODEL "/tmp/grpod_gpu_snapshot_model"
#define G 3 /* groups, one mini-batch each */
#define NR 4 /* responses a group */
#define PL 24
#define RL 16

static int prompt[G][PL], resp[G][NR][RL];
static const int *resp_p[G][NR];
static int lens[G][NR], nprobe; /* nprobe: the probe's logprobs (sum of lens) */

static void make_inputs(void) {
    uint64_t s = 0x5eed5eedULL;
    for (int g = 0; g < G; g++) {
        for (int t = 0; t < PL; t++)
            prompt[g][t] = (int)((s = s * 6364136223846793005ULL + 1442695040888963407ULL) >> 40) % 250 + 3;
        for (int r = 0; r < NR; r++) {
            lens[g][r] = RL - (r % 3);
            nprobe += lens[g][r];
            for (int t = 0; t < RL; t++)
                resp[g][r][t] = (int)((s = s * 6364136223846793005ULL + 1442695040888963407ULL) >> 40) % 250 + 3;
            resp_p[g][r] = resp[g][r];
        }
    }
}

static eng *open_at(const char *where, const char *offload) {
    eng *e;
    eng_open_opts o = {.model_dir = MODEL, .backend = "cuda", .snapshot = where, .optimizer_offload = offload};
    if (eng_open(&o, &e)) {
        printf("open %s: %s\n", where, err_msg());
        return NULL;
    }
    return e;
}

/* G groups of random advantages (seed k); bad: group 1's first advantage NaN. */
static int update(eng *e, int k, int bad, eng_update_result *u) {
    float adv[G][NR];
    uint64_t s = 0x1234ULL + (uint64_t)k;
    for (int g = 0; g < G; g++)
        for (int r = 0; r < NR; r++)
            adv[g][r] = (float)((int)((s = s * 6364136223846793005ULL + 1442695040888963407ULL) >> 41) % 2001 - 1000) / 1000.0f;
    if (bad) adv[1][0] = NAN;
    eng_update_group gs[G];
    for (int g = 0; g < G; g++)
        gs[g] = (eng_update_group){.prompt = prompt[g], .P = PL, .n = NR, .resp = resp_p[g], .R = lens[g], .advantage = adv[g]};
    loss_config a;
    loss_config_default(&a);
    a.adv = ADV_GIVEN;
    a.kl_coef = 0.01f;
    a.ppo_mini_batch_size = 1;
    eng_optim o;
    eng_optim_default(&o);
    o.lr = 1e-3f;
    return eng_update(e, gs, G, &a, &o, 1 << 20, u, NULL, NULL);
}

#define NPROBE (G * NR * RL)
static int probe(eng *e, float *out) {
    eng_update_group gs[G];
    for (int g = 0; g < G; g++)
        gs[g] = (eng_update_group){.prompt = prompt[g], .P = PL, .n = NR, .resp = resp_p[g], .R = lens[g]};
    float **lp;
    if (eng_logprobs(e, gs, G, 0, 1.0f, 1 << 20, &lp)) return -1;
    int k = 0;
    for (int i = 0; i < G * NR; i++)
        for (int t = 0; t < lens[i / NR][i % NR]; t++) out[k++] = lp[i][t];
    eng_logprobs_free(lp, gs, G);
    return k;
}

static int differ(const float *a, const float *b, int n) { return memcmp(a, b, (size_t)n * sizeof(float)) != 0; }

static void run_place(const char *where, const char *offload, const float *auto_lp) {
    char test[64];
    snprintf(test, sizeof test, "snapshot_%s", where);
    eng *e = open_at(where, offload), *ref = open_at(where, offload);
    if (!e || !ref) {
        gc_row(test, "open", 1, 0);
        eng_close(e);
        eng_close(ref);
        return;
    }
    eng_info in;
    eng_get_info(e, &in);
    printf("%s: plan snapshot %s (%lld MiB), optimizer %s\n", where, in.plan.snapshot_at, in.plan.snapshot >> 20,
           in.plan.optimizer);
    eng_update_result u;
    float before[NPROBE], after[NPROBE], x[NPROBE], y[NPROBE];
    int ok = update(e, 1, 0, &u) == 0 && update(ref, 1, 0, &u) == 0 && update(e, 2, 0, &u) == 0 && update(ref, 2, 0, &u) == 0;
    ok = ok && probe(e, before) == nprobe;
    gc_row(test, "2 updates == snapshot auto (bits)", !ok || differ(before, auto_lp, nprobe), 0);
    int rc = update(e, 3, 1, &u);
    int want = strcmp(where, "none") ? GE_NON_FINITE : GE_STATE_LOST;
    printf("%s: failed update: %s\n", where, err_msg());
    gc_row(test, "failure after a step: its code", rc != want, 0);
    if (want == GE_NON_FINITE) {
        ok = probe(e, after) == nprobe;
        gc_row(test, "failure after a step: policy restored (bits)", !ok || differ(before, after, nprobe), 0);
        ok = update(e, 4, 0, &u) == 0 && update(ref, 4, 0, &u) == 0 && probe(e, x) == nprobe && probe(ref, y) == nprobe;
        gc_row(test, "next update == untouched engine's (bits)", !ok || differ(x, y, nprobe), 0);
        ok = update(e, 5, 0, &u) == 0 && eng_update_undo(e) == 0 && probe(e, after) == nprobe;
        gc_row(test, "undo takes an update back (bits)", !ok || differ(x, after, nprobe), 0);
        printf("%s: snapshot wait %.2f ms of optimizer %.2f ms\n", where, u.ms_snapshot_wait, u.ms_optimizer);
    }
    eng_close(e);
    eng_close(ref);
}

int main(void) {
    if (eng_ensure_default_model(MODEL)) {
        printf("FATAL default model: %s\n", err_msg());
        return 1;
    }
    make_inputs();
    float auto_lp[NPROBE];
    eng *e = open_at(NULL, "off");
    eng_update_result u;
    if (!e || update(e, 1, 0, &u) || update(e, 2, 0, &u) || probe(e, auto_lp) != nprobe) {
        printf("FATAL auto: %s\n", err_msg());
        return 1;
    }
    eng_close(e);
    run_place("device", "off", auto_lp);
    run_place("pinned", "off", auto_lp);
    run_place("none", "off", auto_lp);
    /* offload: host state, copied on the helper thread; compared with offload's own auto (the
     * host AdamW need not give the device AdamW's bits) */
    e = open_at(NULL, "on");
    if (!e || update(e, 1, 0, &u) || update(e, 2, 0, &u) || probe(e, auto_lp) != nprobe) {
        printf("FATAL auto offload: %s\n", err_msg());
        return 1;
    }
    eng_close(e);
    run_place("host", "on", auto_lp);
    printf("%d failures\n", gc_failures);
    return gc_failures != 0;
}
