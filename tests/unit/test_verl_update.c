/* test_verl_update.c — whole updates (eng_update on the CPU backend) against the same updates run
 * by verl 0.9.1 on the same model in float64.
 *
 * tests/fixtures/update_reference.{json,safetensors} come from make_update_reference.py: the
 * tiny Qwen3 of tests/fixtures/data/qwen3, three groups with rewards (one truncated response), and
 * five configurations (grpo / drgrpo / rloo, vanilla / gspo, every loss_agg_mode, k3, k1+, k3+,
 * mse, abs, temperature 0.7, entropy bonus, old logprobs recomputed or given, dual clip, a
 * dropped response, mini-batches, epochs, warm-up, cosine, an active gradient clip, weight
 * decay; five more with a random loss_mask per response — veRL's response_mask — under every
 * loss_agg_mode, vanilla and gspo, one response dropped by its mask alone; seven with veRL's
 * rollout correction against the responses' logprobs — truncated IS per token and per sequence,
 * IcePop, rejection sampling token_k1, seq_sum_k1, seq_mean_k3, seq_max_k2, some together and
 * with loss masks — whose rollout_corr/ metrics are compared too), each run by verl's ppo_loss, clip_grad_norm_, AdamW and verl's scheduler. Each
 * configuration's algorithm and optimizer sections go through the request path
 * (api_params_or_reply, api_params_to_struct), so the defaults are the server's. Compared: the
 * loss and veRL's metrics (means over the steps), the lr of the last step, the mean gradient
 * norm, the last step's clipped gradient (relative L2 over all parameters) and the change the
 * update makes to the weights (relative L2). Tolerance 1e-5 (values, gradients): the fp32 model
 * against float64 differs by ~1e-6 relative in logprobs and gradients (tests/fixtures/README.md);
 * the weight change has its own, below. VERL_UPDATE_DEBUG=1 prints every tensor's figures. */
#include <stdlib.h>
#include <string.h>

#include <json-c/json.h>

#include "api/params.h"
#include "check.h"
#include "common/err.h"
#include "engine/engine.h"
#include "engine/format/safetensors.h"
#include "engine/train/train_testing.h"

#define FIX "tests/fixtures"
#define MODEL FIX "/data/qwen3"
#define PARITY_TOL 1e-5
/* The weight change: Adam's step divides each gradient element by its own size + eps, so the
 * few elements near eps (here |g| ~ 4e-8 among 128k) move their step by a percent of lr under
 * the fp32 model's ~1e-9 absolute gradient noise; measured up to 7.3e-5. */
#define WEIGHT_TOL 2e-4

typedef struct {
    int n;
    eng_update_group g[8];
    int *prompt[8], *resp_ids[8][8], R[8][8], trunc[8][8];
    const int *resp[8][8];
    float rew[8][8];
    float *old[8][8];
    const float *oldp[8][8];
    unsigned char *lm[8][8];
    const unsigned char *lmp[8][8];
} batch;

static int ints(json_object *a, int **out) {
    int n = (int)json_object_array_length(a);
    *out = malloc((size_t)(n ? n : 1) * sizeof(int));
    for (int i = 0; i < n; i++) (*out)[i] = json_object_get_int(json_object_array_get_idx(a, (size_t)i));
    return n;
}

/* The fixture's groups; old logprobs and loss masks (per response, in group order) when the config
 * gives them. */
static void batch_make(batch *b, json_object *groups, json_object *old, json_object *lmask) {
    memset(b, 0, sizeof *b);
    b->n = (int)json_object_array_length(groups);
    for (int i = 0, k = 0; i < b->n; i++) {
        json_object *g = json_object_array_get_idx(groups, (size_t)i), *rs = json_object_object_get(g, "responses");
        int P = ints(json_object_object_get(g, "prompt_ids"), &b->prompt[i]);
        int n = (int)json_object_array_length(rs);
        for (int r = 0; r < n; r++, k++) {
            json_object *x = json_object_array_get_idx(rs, (size_t)r);
            b->R[i][r] = ints(json_object_object_get(x, "token_ids"), &b->resp_ids[i][r]);
            b->resp[i][r] = b->resp_ids[i][r];
            b->rew[i][r] = (float)json_object_get_double(json_object_object_get(x, "reward"));
            b->trunc[i][r] = !strcmp(json_object_get_string(json_object_object_get(x, "finish_reason")), "length");
            if (old) {
                json_object *o = json_object_array_get_idx(old, (size_t)k);
                b->old[i][r] = malloc((size_t)b->R[i][r] * sizeof(float));
                for (int t = 0; t < b->R[i][r]; t++)
                    b->old[i][r][t] = (float)json_object_get_double(json_object_array_get_idx(o, (size_t)t));
                b->oldp[i][r] = b->old[i][r];
            }
            if (lmask) {
                json_object *o = json_object_array_get_idx(lmask, (size_t)k);
                b->lm[i][r] = malloc((size_t)b->R[i][r]);
                for (int t = 0; t < b->R[i][r]; t++)
                    b->lm[i][r][t] = (unsigned char)json_object_get_int(json_object_array_get_idx(o, (size_t)t));
                b->lmp[i][r] = b->lm[i][r];
            }
        }
        b->g[i] = (eng_update_group){.prompt = b->prompt[i],
                                     .P = P,
                                     .n = n,
                                     .resp = b->resp[i],
                                     .R = b->R[i],
                                     .reward = b->rew[i],
                                     .old_logprobs = old ? b->oldp[i] : NULL,
                                     .truncated = b->trunc[i],
                                     .loss_mask = lmask ? b->lmp[i] : NULL};
    }
}

static void batch_free(batch *b) {
    for (int i = 0; i < b->n; i++) {
        free(b->prompt[i]);
        for (int r = 0; r < b->g[i].n; r++) {
            free(b->resp_ids[i][r]);
            free(b->old[i][r]);
            free(b->lm[i][r]);
        }
    }
}

/* A request section through the server's validation and conversion. */
static int section(const eng_params *t, json_object *in, const char *path, void *dst) {
    json_object *canon = NULL;
    api_error e;
    int rc = api_params_or_reply(t, in, path, NULL, NULL, NULL, &canon, &e);
    if (rc) {
        printf("  %s: %s\n", path, e.message);
        return rc;
    }
    rc = api_params_to_struct(t, canon, dst);
    json_object_put(canon);
    return rc;
}

static double mean_of(json_object *steps, const char *key) {
    int n = (int)json_object_array_length(steps);
    double s = 0;
    for (int i = 0; i < n; i++)
        s += json_object_get_double(json_object_object_get(json_object_array_get_idx(steps, (size_t)i), key));
    return s / n;
}

/* Relative L2 of a vector of all parameters against the fixture's tensors "<cfg>.<kind>.<name>";
 * base (or NULL): compare a - base with the fixture's. With skip (the weight change): elements
 * whose last gradient in the fixture is below ADAM_ILL (10 x AdamW's eps) are left out and
 * counted into *skip — there Adam's step g / (|g| + eps) turns the fp32 model's ~1e-9 absolute
 * gradient noise into a sizeable part of lr (one such element among 8k moved a tensor's change
 * by 1.8e-3). */
#define ADAM_ILL 1e-7
static double rel_l2_params(const model *m, const float *a, const float *base, const st_set *st, const char *cfg,
                            const char *kind, int *skip) {
    double num = 0, den = 0;
    for (int p = 0; p < m->n_params; p++) {
        double n0 = num, d0 = den;
        char key[256];
        snprintf(key, sizeof key, "%s.%s.%s", cfg, kind, m->params[p].name);
        const st_tensor *t = st_find(st, key);
        if (!t) {
            printf("  no tensor %s\n", key);
            return 1e30;
        }
        float *ref = malloc((size_t)t->numel * 4);
        if (st_read_f32(t, ref, m->params[p].ndim, m->params[p].shape)) {
            free(ref);
            return 1e30;
        }
        float *g = NULL;
        if (skip) { /* the fixture's last gradient of this tensor */
            snprintf(key, sizeof key, "%s.grad.%s", cfg, m->params[p].name);
            const st_tensor *gt = st_find(st, key);
            g = gt ? malloc((size_t)gt->numel * 4) : NULL;
            if (g && st_read_f32(gt, g, m->params[p].ndim, m->params[p].shape)) {
                free(g);
                g = NULL;
            }
        }
        for (long long i = 0; i < t->numel; i++) {
            if (g && g[i] != 0 && fabsf(g[i]) < ADAM_ILL) { /* 0: no gradient at all (an unseen embedding row), exact */
                (*skip)++;
                continue;
            }
            double x = a[m->params[p].off + i] - (base ? base[m->params[p].off + i] : 0), y = ref[i];
            num += (x - y) * (x - y);
            den += y * y;
        }
        free(ref);
        free(g);
        if (getenv("VERL_UPDATE_DEBUG"))
            printf("  %s %s %s: rel L2 %.2e (err %.2e)\n", cfg, kind, m->params[p].name, sqrt((num - n0) / (den - d0 + 1e-300)),
                   sqrt(num - n0));
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}

TEST(updates_match_verl) {
    json_object *root = json_object_from_file(FIX "/update_reference.json");
    CHECK_MSG(root, "cannot read " FIX "/update_reference.json");
    if (!root) return;
    st_set st = {0};
    CHECK_MSG(st_open_file(&st, FIX "/update_reference.safetensors") == 0, "%s", err_msg());
    json_object *cfgs = json_object_object_get(root, "configs"), *groups = json_object_object_get(root, "groups");
    printf("# update-level, verl %s: | configuration | steps | loss rel | grad rel L2 | weight change rel L2 |\n",
           json_object_get_string(json_object_object_get(root, "verl_version")));
    for (int k = 0; k < (int)json_object_array_length(cfgs); k++) {
        json_object *c = json_object_array_get_idx(cfgs, (size_t)k), *steps = json_object_object_get(c, "steps");
        const char *name = json_object_get_string(json_object_object_get(c, "name"));
        loss_config a;
        eng_optim o;
        CHECK(section(&eng_loss_params, json_object_object_get(c, "algorithm"), "algorithm", &a) == 0);
        CHECK(section(&eng_optim_params, json_object_object_get(c, "optimizer"), "optimizer", &o) == 0);
        json_object *old = json_object_object_get(c, "old_logprobs");
        batch b;
        json_object *lm = json_object_object_get(c, "loss_mask");
        batch_make(&b, groups, old && json_object_is_type(old, json_type_array) ? old : NULL,
                   lm && json_object_is_type(lm, json_type_array) ? lm : NULL);
        eng *e;
        eng_open_opts oo = {.model_dir = MODEL, .backend = "cpu"};
        CHECK_MSG(eng_open(&oo, &e) == 0, "%s", err_msg());
        eng_testing_info ti;
        eng_testing_get(e, &ti);
        size_t n = (size_t)ti.n_train;
        float *w0 = malloc(n * 4), *w1 = malloc(n * 4), *g1 = malloc(n * 4);
        CHECK(eng_testing_state(e, w0, NULL, NULL) == 0);
        eng_update_result u;
        int rc = eng_update(e, b.g, b.n, &a, &o, 1 << 20, &u, NULL, NULL);
        CHECK_MSG(rc == 0, "%s: %s", name, err_msg());
        CHECK(eng_testing_state(e, w1, NULL, NULL) == 0);
        CHECK(eng_testing_grad(e, g1) == 0);
        int ns = (int)json_object_array_length(steps);
        CHECK_EQ_INT(u.optimizer_steps, ns);
        CHECK_EQ_INT(u.loss_scale_factor, json_object_get_int(json_object_object_get(c, "loss_scale_factor")));
        /* values: relative, with an absolute floor at the fp32 model's noise for ones near 0 */
        struct {
            const char *key;
            double got;
            double floor;
        } v[] = {{"loss", u.loss, 1e-6},
                 {"actor/pg_loss", u.pg_loss, 1e-6},
                 {"actor/pg_clipfrac", u.pg_clipfrac, 1e-9},
                 {"actor/pg_clipfrac_lower", u.pg_clipfrac_lower, 1e-9},
                 {"actor/ppo_kl", u.ppo_kl, 1e-6},
                 {"actor/kl_loss", u.kl_loss, 1e-6},
                 {"grad_norm", u.grad_norm, 1e-6}};
        double loss_rel = 0;
        if (getenv("VERL_UPDATE_DEBUG"))
            printf("  %s: loss %.9g pg %.9g kl_loss %.9g steps %d rs %g k3 %g\n", name, u.loss, u.pg_loss, u.kl_loss,
                   u.optimizer_steps, u.rc.rs_masked_fraction, u.rc.k3_kl);
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
            double want = mean_of(steps, v[i].key), err = fabs(v[i].got - want);
            CHECK_MSG(err <= v[i].floor + PARITY_TOL * fabs(want), "%s: %s = %.9g, verl %.9g", name, v[i].key, v[i].got, want);
            if (i == 0) loss_rel = err / fmax(fabs(want), v[i].floor);
        }
        /* the rollout correction's metrics: veRL's rollout_corr/ values, once per update */
        json_object *rcm = json_object_object_get(c, "rollout_corr");
        CHECK(!rcm == !u.rollout_corr);
        if (rcm && json_object_is_type(rcm, json_type_object)) {
            struct {
                const char *key;
                double got;
            } r[] = {{"kl", u.rc.kl},
                     {"k3_kl", u.rc.k3_kl},
                     {"chi2_token", u.rc.chi2_token},
                     {"log_ppl_diff", u.rc.log_ppl_diff},
                     {"training_log_ppl", u.rc.training_log_ppl},
                     {"rollout_log_ppl", u.rc.rollout_log_ppl},
                     {"rollout_is_mean", u.rc.is_mean},
                     {"rollout_is_max", u.rc.is_max},
                     {"rollout_is_ratio_fraction_high", u.rc.is_ratio_fraction_high},
                     {"rollout_is_ratio_fraction_low", u.rc.is_ratio_fraction_low},
                     {"rollout_is_oob_ratio", u.rc.is_oob_ratio},
                     {"rollout_rs_masked_fraction", u.rc.rs_masked_fraction},
                     {"rollout_rs_seq_masked_fraction", u.rc.rs_seq_masked_fraction}};
            int n_checked = 0;
            for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
                char key[96];
                snprintf(key, sizeof key, "rollout_corr/%s", r[i].key);
                json_object *x = json_object_object_get(rcm, key);
                if (!x) continue; /* veRL reports the IS and RS keys only with IS, RS on */
                double want = json_object_get_double(x);
                CHECK_MSG(fabs(r[i].got - want) <= 1e-6 + PARITY_TOL * fabs(want), "%s: %s = %.9g, verl %.9g", name, key,
                          r[i].got, want);
                n_checked++;
            }
            CHECK(n_checked >= 7);
            CHECK(u.rc.abs_diff_max >= u.rc.abs_diff_mean && u.rc.abs_diff_mean > 0);
        }
        double lr_last = json_object_get_double(json_object_object_get(json_object_array_get_idx(steps, (size_t)ns - 1), "lr"));
        CHECK_MSG(fabs(u.lr - lr_last) <= 1e-12 + 1e-6 * lr_last, "%s: lr %.9g, verl %.9g", name, u.lr, lr_last);
        /* veRL's actor/entropy is the old policy's: grpod's equals it unless rollout old logprobs
         * come with several steps (loss.h) */
        if (!a.use_rollout_logprobs || ns == 1) {
            double want = json_object_get_double(json_object_object_get(c, "actor/entropy"));
            CHECK_MSG(fabs(u.verl_entropy - want) <= 1e-6 + PARITY_TOL * fabs(want), "%s: actor/entropy %.9g, verl %.9g", name,
                      u.verl_entropy, want);
        }
        int skipped = 0;
        double eg = rel_l2_params(ti.m, g1, NULL, &st, name, "grad", NULL),
               ew = rel_l2_params(ti.m, w1, w0, &st, name, "delta", &skipped);
        CHECK_MSG(eg <= PARITY_TOL, "%s: gradient rel L2 %.2e", name, eg);
        CHECK_MSG(ew <= WEIGHT_TOL, "%s: weight change rel L2 %.2e", name, ew);
        printf("# | %s | %d | %.1e | %.1e | %.1e (%d of %lld with 0 < |g| < 1e-7 left out) |\n", name, ns, loss_rel, eg, ew,
               skipped, (long long)n);
        free(w0);
        free(w1);
        free(g1);
        eng_close(e);
        batch_free(&b);
    }
    st_close(&st);
    json_object_put(root);
}

int main(void) {
    RUN(updates_match_verl);
    return CHECK_DONE();
}
