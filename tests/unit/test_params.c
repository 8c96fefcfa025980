/* test_params.c — the request sections' rows (engine/params.c) and what api/params.c does
 * with them: the defaults are the ones the engine had before the table, enum choices are the
 * C enums' values, random valid sections survive validation → canonical JSON → engine struct
 * unchanged, bad values are refused naming the field, the OpenAPI schema lists every row. */
#include <stdint.h>

#include "api/params.h"
#include "common/err.h"
#include "engine/engine.h"
#include "engine/train/loss.h"
#include "tests/unit/check.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static double urand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * (1.0 / 9007199254740992.0);
}

static const api_limits limits = {.max_body_bytes = 1 << 20, .max_n = 64, .max_tokens = 4096, .max_groups = 64};
static const api_model model = {.vocab = 1000, .max_pos = 8192};

TEST(test_defaults_are_the_engines) {
    eng_sampling s;
    eng_sampling_default(&s);
    CHECK(s.temperature == 1.0f && s.top_p == 1.0f && s.top_k == 0 && s.min_p == 0.0f);
    CHECK(s.max_tokens == 16 && s.min_tokens == 0 && !s.ignore_eos && s.seed == 0);
    CHECK(!s.stop && !s.n_stop && !s.stop_token_ids && !s.n_stop_token_ids);
    loss_config c;
    loss_config_default(&c);
    CHECK(c.adv == ADV_GRPO && c.norm_adv_by_std == 1 && c.mode == LOSS_VANILLA && c.agg == AGG_TOKEN_MEAN);
    CHECK(c.clip_ratio_low == 0.2f && c.clip_ratio_high == 0.28f && c.clip_ratio_c == 3.0f);
    CHECK(c.kl_coef == 0.001f && c.kl == KL_K3 && c.entropy_coeff == 0.0f && c.ppo_epochs == 1);
    CHECK(c.ppo_mini_batch_size == 0 && c.temperature == 1.0f && !c.use_rollout_logprobs);
    CHECK(!c.mask_truncated && !c.filter_groups && !c.loss_scale_factor);
    eng_optim o;
    eng_optim_default(&o);
    CHECK(o.lr == 1e-6f && o.weight_decay == 0.01f && o.beta1 == 0.9f && o.beta2 == 0.999f);
    CHECK(o.eps == 1e-8f && o.grad_clip == 1.0f && o.warmup_steps == 0 && o.schedule == SCHED_CONSTANT);
    CHECK(o.total_steps == 0 && o.min_lr_ratio == 0.0f);
}

TEST(test_choices_are_the_enums) {
    const eng_param *kl = eng_param_find(&eng_loss_params, "kl_type");
    CHECK(kl != NULL);
    const char *names[] = {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "k4", ""};
    const int want[] = {KL_K1, KL_K1, KL_ABS, KL_K2, KL_K2, KL_K3, KL_K3, -1, -1};
    for (int i = 0; i < 9; i++) CHECK_EQ_INT(eng_param_choice(kl, names[i]), want[i]);
    char b[32];
    CHECK_STR(eng_param_choice_name(kl, KL_K3, b, sizeof b), "low_var_kl");
    CHECK_EQ_INT(eng_param_choice(eng_param_find(&eng_loss_params, "loss_agg_mode"), "seq-mean-token-sum-norm"),
                 AGG_SEQ_MEAN_TOKEN_SUM_NORM);
    CHECK_EQ_INT(eng_param_choice(eng_param_find(&eng_loss_params, "adv_estimator"), "given"), ADV_GIVEN);
    CHECK_EQ_INT(eng_param_choice(eng_param_find(&eng_loss_params, "old_logprobs"), "rollout"), 1);
    CHECK_EQ_INT(eng_param_choice(eng_param_find(&eng_optim_params, "lr_schedule"), "cosine"), SCHED_COSINE);
}

/* Random valid sampling sections: canonical JSON → eng_sampling gives back what was sent. */
TEST(test_sampling_round_trip) {
    for (int it = 0; it < 200; it++) {
        double temp = urand() * 2, top_p = 0.05 + urand() * 0.95, min_p = urand() * 0.5;
        int top_k = (int)(urand() * 50) - 1, max_tokens = 1 + (int)(urand() * 4000);
        int min_tokens = (int)(urand() * max_tokens), ignore = urand() < 0.5, n_ids = (int)(urand() * 5);
        long long seed = (long long)(urand() * 1e15);
        json_object *in = json_object_new_object(), *ids = json_object_new_array(), *stop = json_object_new_array();
        json_object_object_add(in, "temperature", json_object_new_double(temp));
        json_object_object_add(in, "top_p", json_object_new_double(top_p));
        json_object_object_add(in, "top_k", json_object_new_int(top_k));
        json_object_object_add(in, "min_p", json_object_new_double(min_p));
        json_object_object_add(in, "max_tokens", json_object_new_int(max_tokens));
        json_object_object_add(in, "min_tokens", json_object_new_int(min_tokens));
        json_object_object_add(in, "ignore_eos", json_object_new_boolean(ignore));
        json_object_object_add(in, "seed", json_object_new_int64(seed));
        json_object_object_add(in, "logprobs", json_object_new_boolean(1));
        int want_ids[5];
        for (int i = 0; i < n_ids; i++) {
            want_ids[i] = (int)(urand() * model.vocab);
            json_object_array_add(ids, json_object_new_int(want_ids[i]));
        }
        json_object_object_add(in, "stop_token_ids", ids);
        json_object_array_add(stop, json_object_new_string("\n\n"));
        json_object_array_add(stop, json_object_new_string("END"));
        json_object_object_add(in, "stop", urand() < 0.5 ? stop : (json_object_put(stop), json_object_new_string("\n\n")));
        json_object *canon = NULL;
        api_error e = {0};
        int rc = api_params_or_reply(&eng_sampling_params, in, "sampling", NULL, &limits, &model, &canon, &e);
        CHECK_MSG(rc == 0, "it %d: %s", it, e.message);
        CHECK_EQ_INT(json_object_object_length(canon), eng_sampling_params.n - 2); /* logprobs not stored, guided_schema absent */
        /* the stored text, parsed again, as the engine thread does */
        json_object *stored = json_tokener_parse(json_object_to_json_string_ext(canon, JSON_C_TO_STRING_PLAIN));
        eng_sampling s;
        CHECK_EQ_INT(api_params_to_struct(&eng_sampling_params, stored, &s), 0);
        CHECK(s.temperature == (float)temp && s.top_p == (float)top_p && s.min_p == (float)min_p);
        CHECK_EQ_INT(s.top_k, top_k < 0 ? 0 : top_k);
        CHECK_EQ_INT(s.max_tokens, max_tokens);
        CHECK_EQ_INT(s.min_tokens, min_tokens);
        CHECK_EQ_INT(s.ignore_eos, ignore);
        CHECK_EQ_INT((long long)s.seed, seed);
        CHECK_EQ_INT(s.n_stop_token_ids, n_ids);
        for (int i = 0; i < n_ids; i++) CHECK_EQ_INT(s.stop_token_ids[i], want_ids[i]);
        CHECK(s.n_stop >= 1);
        CHECK_STR(s.stop[0], "\n\n");
        if (s.n_stop == 2) CHECK_STR(s.stop[1], "END");
        api_params_free(&eng_sampling_params, &s);
        json_object_put(stored);
        json_object_put(canon);
        json_object_put(in);
    }
}

/* An absent section takes the rows' defaults, a seed is drawn, max_tokens is capped by the
 * server's limit; bad values are refused naming the field as before. */
TEST(test_sampling_defaults_and_errors) {
    json_object *canon = NULL;
    api_error e = {0};
    api_limits small = limits;
    small.max_tokens = 8;
    CHECK_EQ_INT(api_params_or_reply(&eng_sampling_params, NULL, "sampling", NULL, &small, &model, &canon, &e), 0);
    eng_sampling s;
    CHECK_EQ_INT(api_params_to_struct(&eng_sampling_params, canon, &s), 0);
    CHECK_EQ_INT(s.max_tokens, 8);
    CHECK(s.temperature == 1.0f && s.top_p == 1.0f && s.n_stop == 0 && s.n_stop_token_ids == 0);
    CHECK(json_object_object_get_ex(canon, "seed", NULL));
    api_params_free(&eng_sampling_params, &s);
    json_object_put(canon);
    const char *bad[][3] = {
        {"{\"top_p\": 0}", "sampling.top_p", "sampling.top_p must be > 0 and <= 1"},
        {"{\"top_p\": 1.5}", "sampling.top_p", "sampling.top_p must be 0..1"},
        {"{\"temperature\": \"hot\"}", "sampling.temperature", "sampling.temperature must be a number"},
        {"{\"top_k\": 1001}", "sampling.top_k", "sampling.top_k must be -1..1000"},
        {"{\"max_tokens\": 5000}", "sampling.max_tokens", "sampling.max_tokens must be 1..4096"},
        {"{\"max_tokens\": 4, \"min_tokens\": 5}", "sampling.min_tokens", "sampling.min_tokens must be 0..4"},
        {"{\"stop\": \"\"}", "sampling.stop", "sampling.stop must not be empty"},
        {"{\"stop\": [\"a\", 3]}", "sampling.stop[1]", "sampling.stop[1] must be a non-empty string of at most 256 bytes"},
        {"{\"stop_token_ids\": [1000]}", "sampling.stop_token_ids",
         "sampling.stop_token_ids[0] = 1000 is outside the vocabulary 0..999"},
        {"{\"logprobs\": 2}", "sampling.logprobs", "sampling.logprobs must be 0..1"},
        {"{\"seed\": -1}", "sampling.seed", "sampling.seed must be 0..9223372036854775807"},
        {"{\"top_q\": 1}", "sampling.top_q", "unknown field sampling.top_q"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_object *in = json_tokener_parse(bad[i][0]);
        memset(&e, 0, sizeof e);
        CHECK_EQ_INT(api_params_or_reply(&eng_sampling_params, in, "sampling", NULL, &limits, &model, &canon, &e), GE_INVALID);
        CHECK_STR(e.field, bad[i][1]);
        CHECK_STR(e.message, bad[i][2]);
        CHECK_EQ_INT(e.status, 400);
        json_object_put(in);
    }
}

/* The algorithm and optimizer sections: enum names, aliases kept as sent, betas, errors. */
TEST(test_update_sections) {
    json_object *in = json_tokener_parse("{\"kl_type\": \"k3\", \"adv_estimator\": \"rloo\", \"old_logprobs\": \"rollout\","
                                         " \"clip_ratio_high\": 0.3, \"ppo_epochs\": 2}");
    json_object *canon = NULL;
    api_error e = {0};
    CHECK_EQ_INT(api_params_or_reply(&eng_loss_params, in, "algorithm", NULL, NULL, NULL, &canon, &e), 0);
    CHECK_STR(json_object_get_string(json_object_object_get(canon, "kl_type")), "k3");
    CHECK_STR(json_object_get_string(json_object_object_get(canon, "loss_agg_mode")), "token-mean");
    loss_config c;
    CHECK_EQ_INT(api_params_to_struct(&eng_loss_params, canon, &c), 0);
    CHECK(c.kl == KL_K3 && c.adv == ADV_RLOO && c.use_rollout_logprobs == 1 && c.ppo_epochs == 2);
    CHECK(c.clip_ratio_high == 0.3f && c.clip_ratio_low == 0.2f);
    json_object_put(canon);
    json_object_put(in);
    in = json_tokener_parse("{\"kl_type\": \"full\"}");
    CHECK_EQ_INT(api_params_or_reply(&eng_loss_params, in, "algorithm", NULL, NULL, NULL, &canon, &e), GE_INVALID);
    CHECK_STR(e.message, "algorithm.kl_type 'full' must be one of kl|abs|mse|low_var_kl|k1+|k3+");
    json_object_put(in);
    /* the straight-through kl types (names and veRL's aliases), loss_scale_factor's range */
    const char *st[4][2] = {{"k1+", "1"}, {"kl+", "1"}, {"k3+", "0"}, {"low_var_kl+", "0"}};
    for (int i = 0; i < 4; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"kl_type\": \"%s\", \"loss_scale_factor\": 4096}", st[i][0]);
        in = json_tokener_parse(body);
        CHECK_EQ_INT(api_params_or_reply(&eng_loss_params, in, "algorithm", NULL, NULL, NULL, &canon, &e), 0);
        CHECK_EQ_INT(api_params_to_struct(&eng_loss_params, canon, &c), 0);
        CHECK_EQ_INT(c.kl, st[i][1][0] == '1' ? KL_K1_ST : KL_K3_ST);
        CHECK_EQ_INT(c.loss_scale_factor, 4096);
        json_object_put(canon);
        json_object_put(in);
    }
    in = json_tokener_parse("{\"loss_scale_factor\": null}");
    CHECK_EQ_INT(api_params_or_reply(&eng_loss_params, in, "algorithm", NULL, NULL, NULL, &canon, &e), 0);
    CHECK_EQ_INT(json_object_get_int(json_object_object_get(canon, "loss_scale_factor")), 0);
    json_object_put(canon);
    json_object_put(in);
    const char *bad_scale[3][2] = {{"{\"loss_scale_factor\": -1}", "algorithm.loss_scale_factor must be 0..16777216"},
                                   {"{\"loss_scale_factor\": 2.5}", "algorithm.loss_scale_factor must be an integer"},
                                   {"{\"loss_scale_factor\": \"max\"}", "algorithm.loss_scale_factor must be an integer"}};
    for (int i = 0; i < 3; i++) {
        in = json_tokener_parse(bad_scale[i][0]);
        CHECK_EQ_INT(api_params_or_reply(&eng_loss_params, in, "algorithm", NULL, NULL, NULL, &canon, &e), GE_INVALID);
        CHECK_STR(e.field, "algorithm.loss_scale_factor");
        CHECK_STR(e.message, bad_scale[i][1]);
        CHECK_EQ_INT(e.status, 400);
        json_object_put(in);
    }
    in = json_tokener_parse("{\"betas\": [0.8, 0.95], \"lr_schedule\": \"cosine\", \"lr\": 3e-6}");
    CHECK_EQ_INT(api_params_or_reply(&eng_optim_params, in, "optimizer", NULL, NULL, NULL, &canon, &e), 0);
    eng_optim o;
    CHECK_EQ_INT(api_params_to_struct(&eng_optim_params, canon, &o), 0);
    CHECK(o.beta1 == 0.8f && o.beta2 == 0.95f && o.schedule == SCHED_COSINE && o.lr == 3e-6f && o.eps == 1e-8f);
    json_object_put(canon);
    json_object_put(in);
    in = json_tokener_parse("{\"betas\": [0.9, 1]}");
    CHECK_EQ_INT(api_params_or_reply(&eng_optim_params, in, "optimizer", NULL, NULL, NULL, &canon, &e), GE_INVALID);
    CHECK_STR(e.message, "optimizer.betas[1] must be a number in [0, 1)");
    json_object_put(in);
}

/* Top-level members (an OpenAI-style route): path "", other members allowed by name. */
TEST(test_top_level_section) {
    static const char *const extra[] = {"model", "prompt", NULL};
    json_object *in = json_tokener_parse("{\"model\": \"x\", \"prompt\": \"hi\", \"temperature\": 0, \"top_p\": 2}");
    json_object *canon = NULL;
    api_error e = {0};
    CHECK_EQ_INT(api_params_or_reply(&eng_sampling_params, in, "", extra, &limits, &model, &canon, &e), GE_INVALID);
    CHECK_STR(e.field, "top_p");
    json_object_put(in);
    in = json_tokener_parse("{\"model\": \"x\", \"prompt\": \"hi\", \"temperature\": 0}");
    CHECK_EQ_INT(api_params_or_reply(&eng_sampling_params, in, "", extra, &limits, &model, &canon, &e), 0);
    json_object_put(canon);
    json_object_put(in);
}

TEST(test_schema_lists_every_row) {
    const eng_params *ts[] = {&eng_sampling_params,     &eng_loss_params,      &eng_optim_params,    &eng_update_job_params,
                              &eng_logprobs_job_params, &eng_group_job_params, &eng_overlong_params, &eng_checkpoint_job_params};
    for (int k = 0; k < (int)(sizeof ts / sizeof ts[0]); k++) {
        json_object *s = api_params_schema(ts[k]), *props = json_object_object_get(s, "properties");
        CHECK_EQ_INT(json_object_object_length(props), ts[k]->n);
        for (int i = 0; i < ts[k]->n; i++) {
            const eng_param *p = &ts[k]->rows[i];
            json_object *o = json_object_object_get(props, p->name);
            CHECK_MSG(o != NULL, "%s.%s missing", ts[k]->name, p->name);
            CHECK_STR(json_object_get_string(json_object_object_get(o, "description")), p->doc);
            CHECK(p->off < (int)ts[k]->size && p->off2 < (int)ts[k]->size);
        }
        json_object_put(s);
    }
}

int main(void) {
    RUN(test_defaults_are_the_engines);
    RUN(test_choices_are_the_enums);
    RUN(test_sampling_round_trip);
    RUN(test_sampling_defaults_and_errors);
    RUN(test_update_sections);
    RUN(test_top_level_section);
    RUN(test_schema_lists_every_row);
    return CHECK_DONE();
}
