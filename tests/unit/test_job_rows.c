/* test_job_rows.c — the job-level members of updates, logprobs, rollouts and checkpoints
 * (rollout_job_id, max_tokens_per_micro_batch, expected_policy_version, model, temperature,
 * top_logprobs, a group's n, overlong_buffer, merged) as validated by api/validate.c.
 *
 * Random requests, valid and not, go through the validators; what each returns (the canonical
 * payload the store keeps, byte for byte, or the error's status, code, field and message) is
 * folded into one FNV-1a digest per kind. The digests were taken from the validators that read
 * these members one by one with api/fields.h (main at 348f65a, before their rows in
 * engine/params.c; the rollouts' at b1c49b4, whose sampling section has more rows), so a
 * stored job, a default or an error that changes fails here (DUMP=1 prints each outcome, to
 * diff two builds). The one message left out is the logprobs "model"
 * choice's, whose wording is now the rows' (its field is unchanged); and a bad model is named
 * before the members after it, which the rows check in order (test_model_checked_first).
 *
 * Then the other half: the stored payload decoded through the same rows
 * (api_params_to_struct, what daemon/jobs.c runs) gives back what was sent, or the default. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/params.h"
#include "api/validate.h"
#include "common/err.h"
#include "tests/unit/check.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33) % n;
}
static double urand(void) { return (double)rnd(1u << 30) / (double)(1u << 30); }

static const api_limits limits = {.max_body_bytes = 1 << 20, .max_n = 64, .max_tokens = 4096, .max_groups = 64};
static const api_model model = {.vocab = 1000, .max_pos = 8192, .mb_tokens = 4096, .mb_tokens_max = 65536};

typedef struct {
    uint64_t h;
    int ok, err;
} digest;

static void fold(digest *d, const char *s) {
    if (getenv("DUMP")) puts(s);
    for (; *s; s++) d->h = (d->h ^ (unsigned char)*s) * 0x100000001b3ull;
    d->h = (d->h ^ 0xff) * 0x100000001b3ull;
}

static void outcome(digest *d, int rc, json_object *payload, const api_error *e) {
    char b[768];
    if (!rc) {
        d->ok++;
        fold(d, json_object_to_json_string_ext(payload, JSON_C_TO_STRING_PLAIN));
        json_object_put(payload);
        return;
    }
    d->err++;
    snprintf(b, sizeof b, "%d %d %s %s", e->status, e->code, e->field, strcmp(e->field, "model") ? e->message : "");
    fold(d, b);
}

/* Members drawn among: absent, in range, out of range, the wrong type. */
static void maybe_int(json_object *o, const char *k, long long lo, long long hi) {
    switch (rnd(12)) {
    case 0:
    case 1: break;
    case 2: json_object_object_add(o, k, json_object_new_int64(lo - 1 - rnd(3))); break;
    case 3: json_object_object_add(o, k, json_object_new_string("7")); break;
    default: json_object_object_add(o, k, json_object_new_int64(lo + (long long)(urand() * (double)(hi - lo))));
    }
}
static void maybe_num(json_object *o, const char *k, double lo, double hi) {
    switch (rnd(12)) {
    case 0:
    case 1: break;
    case 2: json_object_object_add(o, k, json_object_new_double(lo - 1 - urand())); break;
    case 3: json_object_object_add(o, k, json_object_new_boolean(1)); break;
    default: json_object_object_add(o, k, json_object_new_double(lo + urand() * (hi - lo)));
    }
}

static json_object *ids(int n) {
    json_object *a = json_object_new_array();
    for (int i = 0; i < n; i++) json_object_array_add(a, json_object_new_int((int)rnd(1000)));
    return a;
}

/* Scored groups (updates: rewards; logprobs: token ids only). */
static json_object *seq_groups(int scored) {
    json_object *gs = json_object_new_array();
    for (int g = 0, ng = 1 + (int)rnd(3); g < ng; g++) {
        json_object *grp = json_object_new_object(), *rs = json_object_new_array();
        json_object_object_add(grp, "prompt_ids", ids(1 + (int)rnd(5)));
        for (int k = 0, nr = 1 + (int)rnd(3); k < nr; k++) {
            json_object *r = json_object_new_object();
            json_object_object_add(r, "token_ids", ids(1 + (int)rnd(6)));
            if (scored) json_object_object_add(r, "reward", json_object_new_double(urand()));
            json_object_array_add(rs, r);
        }
        json_object_object_add(grp, "responses", rs);
        json_object_array_add(gs, grp);
    }
    return gs;
}

static void rollout_id(json_object *o) {
    static const char *const ids_[] = {"j_0123456789abcdef", "j_00ff00ff00ff00ff", "j_xyz", ""};
    int k = (int)rnd(6);
    if (k < 4) json_object_object_add(o, "rollout_job_id", json_object_new_string(ids_[k]));
    else if (k == 4) json_object_object_add(o, "rollout_job_id", json_object_new_int(3));
}

static void updates(digest *d) {
    for (int it = 0; it < 400; it++) {
        json_object *req = json_object_new_object(), *payload = NULL;
        if (rnd(2)) rollout_id(req);
        if (!json_object_object_get_ex(req, "rollout_job_id", NULL) || !rnd(6))
            json_object_object_add(req, "groups", seq_groups(1));
        maybe_int(req, "max_tokens_per_micro_batch", 1, 100000);
        maybe_int(req, "expected_policy_version", 0, 1000000);
        if (rnd(3) == 0) {
            json_object *a = json_object_new_object();
            json_object_object_add(a, "kl_coef", json_object_new_double(urand()));
            json_object_object_add(req, "algorithm", a);
        }
        if (rnd(3) == 0) json_object_object_add(req, "optimizer", json_object_new_object());
        if (rnd(20) == 0) json_object_object_add(req, "n", json_object_new_int(2));
        api_error e = {0};
        const char *rid = NULL;
        long long expected = -2;
        int rc = api_update_or_reply(req, &limits, &model, &payload, &rid, &expected, &e);
        char b[96];
        snprintf(b, sizeof b, "%lld %s", rc ? 0 : expected, rc || !rid ? "-" : rid);
        outcome(d, rc, payload, &e);
        fold(d, b);
        json_object_put(req);
    }
}

static void logprobs(digest *d) {
    static const char *const models[] = {"policy", "reference", "ref", ""};
    for (int it = 0; it < 400; it++) {
        json_object *req = json_object_new_object(), *payload = NULL;
        json_object_object_add(req, "groups", seq_groups(0));
        int k = (int)rnd(12);
        if (k < 4) json_object_object_add(req, "model", json_object_new_string(models[k]));
        else if (k == 4) json_object_object_add(req, "model", json_object_new_int(1));
        else if (k < 8) json_object_object_add(req, "model", json_object_new_string(models[k & 1]));
        if (k < 2 || k > 4) { /* a bad model alone: it is now checked first, with its row */
            maybe_num(req, "temperature", 1e-3, 100);
            maybe_int(req, "max_tokens_per_micro_batch", 1, 100000);
            maybe_int(req, "top_logprobs", 0, 24);
            if (rnd(4) == 0) json_object_object_add(req, "top_logprobs", json_object_new_int(0));
        }
        api_error e = {0};
        int rc = api_logprobs_or_reply(req, &limits, &model, &payload, &e); /* before payload is read */
        outcome(d, rc, payload, &e);
        json_object_put(req);
    }
}

static void rollouts(digest *d) {
    for (int it = 0; it < 400; it++) {
        json_object *req = json_object_new_object(), *gs = json_object_new_array(), *payload = NULL;
        for (int g = 0, ng = 1 + (int)rnd(3); g < ng; g++) {
            json_object *grp = json_object_new_object();
            json_object_object_add(grp, "prompt_ids", ids(1 + (int)rnd(5)));
            maybe_int(grp, "n", 1, 70);
            if (rnd(2)) {
                json_object *r = json_object_new_object();
                json_object_object_add(r, "type", json_object_new_string("exact"));
                json_object_object_add(r, "answer", json_object_new_string("42"));
                json_object_object_add(grp, "reward", r);
            }
            json_object_array_add(gs, grp);
        }
        json_object_object_add(req, "groups", gs);
        json_object *s = json_object_new_object();
        json_object_object_add(s, "max_tokens", json_object_new_int(8 + (int)rnd(60)));
        json_object_object_add(s, "seed", json_object_new_int((int)rnd(1000)));
        json_object_object_add(req, "sampling", s);
        if (rnd(3)) {
            json_object *ol = json_object_new_object();
            maybe_num(ol, "len", 0, 80);
            if (rnd(4) == 0) json_object_object_add(ol, "len", json_object_new_int(0));
            maybe_num(ol, "penalty_factor", 0, 3);
            if (rnd(15) == 0) json_object_object_add(ol, "x", json_object_new_int(1));
            json_object_object_add(req, "overlong_buffer", ol);
        }
        api_error e = {0};
        int rc = api_rollout_or_reply(req, &limits, &model, &payload, &e); /* before payload is read */
        outcome(d, rc, payload, &e);
        json_object_put(req);
    }
}

static void checkpoints(digest *d) {
    for (int it = 0; it < 60; it++) {
        json_object *req = NULL, *payload = NULL;
        int k = (int)rnd(6);
        if (k) req = json_object_new_object();
        if (k == 2 || k == 3) json_object_object_add(req, "merged", json_object_new_boolean(k == 2));
        if (k == 4) json_object_object_add(req, "merged", json_object_new_int(1));
        if (k == 5) json_object_object_add(req, "merge", json_object_new_boolean(1));
        api_error e = {0};
        int rc = api_checkpoint_or_reply(req, &payload, &e); /* before payload is read */
        outcome(d, rc, payload, &e);
        json_object_put(req);
    }
}

TEST(test_job_members_unchanged) {
    static const struct {
        const char *kind;
        void (*run)(digest *);
        uint64_t want;
    } kinds[] = {
        {"updates", updates, 0x05b433eab5bfb947ull},
        {"logprobs", logprobs, 0xfd67193b3ac9bc2cull},
        {"rollouts", rollouts, 0x83b1a09ad3007020ull},
        {"checkpoints", checkpoints, 0x8e849c5f670dfd81ull},
    };
    digest d[4];
    for (int i = 0; i < 4; i++) {
        d[i] = (digest){0xcbf29ce484222325ull, 0, 0};
        kinds[i].run(&d[i]);
        printf("  %-11s %3d valid, %3d refused, digest 0x%016llxull\n", kinds[i].kind, d[i].ok, d[i].err,
               (unsigned long long)d[i].h);
    }
    for (int i = 0; i < 4; i++) {
        CHECK(d[i].ok > 10 && d[i].err > 10); /* both paths taken */
        CHECK_MSG(d[i].h == kinds[i].want, "%s: the canonical payloads or the errors changed", kinds[i].kind);
    }
}

TEST(test_model_checked_first) {
    json_object *req = json_tokener_parse("{\"groups\": [{\"prompt_ids\": [1], \"responses\": [{\"token_ids\": [2]}]}], "
                                          "\"model\": \"x\", \"temperature\": 1000}");
    json_object *payload = NULL;
    api_error e = {0};
    CHECK_EQ_INT(api_logprobs_or_reply(req, &limits, &model, &payload, &e), GE_INVALID);
    CHECK_STR(e.field, "model");
    CHECK_STR(e.message, "model 'x' must be one of policy|reference");
    json_object_put(req);
}

/* Random valid requests: the stored payload, decoded by the rows, is what was sent (or the row's
 * default: the plan's micro-batch, policy, temperature 1, no top_logprobs, n 1, no shaping). */
TEST(test_stored_job_decodes) {
    for (int it = 0; it < 300; it++) {
        api_error e = {0};
        json_object *req = json_object_new_object(), *payload = NULL;
        long long mt = rnd(2) ? 1 + (long long)rnd(60000) : -1, ev = rnd(2) ? (long long)rnd(1u << 30) : -1;
        int rid = rnd(2);
        if (rid) json_object_object_add(req, "rollout_job_id", json_object_new_string("j_0123456789abcdef"));
        else json_object_object_add(req, "groups", seq_groups(1));
        if (mt > 0) json_object_object_add(req, "max_tokens_per_micro_batch", json_object_new_int64(mt));
        if (ev >= 0) json_object_object_add(req, "expected_policy_version", json_object_new_int64(ev));
        const char *r = NULL;
        long long expected;
        CHECK_MSG(api_update_or_reply(req, &limits, &model, &payload, &r, &expected, &e) == 0, "%s", e.message);
        eng_update_job u;
        CHECK_EQ_INT(api_params_to_struct(&eng_update_job_params, payload, &u), 0);
        CHECK(u.max_tokens_per_micro_batch == (mt > 0 ? mt : model.mb_tokens) && u.expected_policy_version == ev);
        CHECK(rid ? u.rollout_job_id && !strcmp(u.rollout_job_id, "j_0123456789abcdef") : !u.rollout_job_id);
        json_object_put(payload);
        json_object_put(req);

        req = json_object_new_object();
        json_object_object_add(req, "groups", seq_groups(0));
        int ref = (int)rnd(3), top = (int)rnd(21);
        double temp = rnd(2) ? 1e-3 + urand() * 50 : 1.0;
        if (ref) json_object_object_add(req, "model", json_object_new_string(ref == 2 ? "reference" : "policy"));
        if (temp != 1.0) json_object_object_add(req, "temperature", json_object_new_double(temp));
        if (top) json_object_object_add(req, "top_logprobs", json_object_new_int(top));
        CHECK_EQ_INT(api_logprobs_or_reply(req, &limits, &model, &payload, &e), 0);
        eng_logprobs_job lj;
        CHECK_EQ_INT(api_params_to_struct(&eng_logprobs_job_params, payload, &lj), 0);
        CHECK(lj.model == (ref == 2 ? ENG_LP_REFERENCE : ENG_LP_POLICY) && lj.temperature == (float)temp);
        CHECK(lj.max_tokens_per_micro_batch == model.mb_tokens && lj.top_logprobs == top);
        json_object_put(payload);
        json_object_put(req);

        req = json_tokener_parse("{\"groups\": [{\"prompt_ids\": [5, 6]}], \"sampling\": {\"seed\": 3, \"max_tokens\": 64}}");
        int n = (int)rnd(65);
        double len = rnd(2) ? 1 + urand() * 60 : 0, pen = rnd(2) ? urand() * 4 : -1;
        if (n)
            json_object_object_add(json_object_array_get_idx(json_object_object_get(req, "groups"), 0), "n",
                                   json_object_new_int(n));
        if (len > 0) {
            json_object *ol = json_object_new_object();
            json_object_object_add(ol, "len", json_object_new_double(len));
            if (pen >= 0) json_object_object_add(ol, "penalty_factor", json_object_new_double(pen));
            json_object_object_add(req, "overlong_buffer", ol);
        }
        CHECK_EQ_INT(api_rollout_or_reply(req, &limits, &model, &payload, &e), 0);
        eng_group_job gj;
        eng_overlong ov;
        CHECK_EQ_INT(api_params_to_struct(&eng_group_job_params,
                                          json_object_array_get_idx(json_object_object_get(payload, "groups"), 0), &gj),
                     0);
        CHECK_EQ_INT(api_params_to_struct(&eng_overlong_params, json_object_object_get(payload, "overlong_buffer"), &ov), 0);
        CHECK(gj.n == (n ? n : 1) && ov.len == (float)len && ov.penalty_factor == (len > 0 && pen >= 0 ? (float)pen : 1.0f));
        json_object_put(payload);
        json_object_put(req);
    }
}

/* An unknown member is named before any error in the members around it, at the top level and in
 * a rollout group, whether the bad member is a row (max_tokens_per_micro_batch, temperature, n)
 * or read by hand (algorithm); the validators' own key lists name only what is not a row. */
TEST(test_unknown_member_named_first) {
    static const struct {
        int kind; /* 0 update, 1 logprobs, 2 rollout */
        const char *req, *field;
    } cases[] = {
        {0, "{\"algorithm\": 5, \"max_tokens_per_micro_batch\": 0, \"zz\": 1, \"rollout_job_id\": \"j_0123456789abcdef\"}", "zz"},
        {0, "{\"expected_policy_version\": -3, \"groups\": 1, \"top_logprobs\": 2}", "top_logprobs"},
        {0, "{\"rollout_job_id\": \"j_0123456789abcdef\", \"max_tokens_per_micro_batch\": 0}", "max_tokens_per_micro_batch"},
        {1, "{\"groups\": 3, \"temperature\": -1, \"max_tokens_per_micro_batch\": 0, \"expected_policy_version\": 1}",
         "expected_policy_version"},
        {1, "{\"temperature\": -1, \"groups\": []}", "temperature"},
        {2, "{\"groups\": [{\"prompt_ids\": [5], \"n\": 0, \"temperature\": 1}], \"sampling\": {\"max_tokens\": 8}}",
         "groups[0].temperature"},
        {2, "{\"groups\": [{\"prompt_ids\": [5], \"n\": 0, \"reward\": 1}], \"sampling\": {\"max_tokens\": 8}}", "groups[0].n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_object *req = json_tokener_parse(cases[i].req), *payload = NULL;
        api_error e = {0};
        const char *rid;
        long long expected;
        int rc = cases[i].kind == 0 ? api_update_or_reply(req, &limits, &model, &payload, &rid, &expected, &e)
            : cases[i].kind == 1    ? api_logprobs_or_reply(req, &limits, &model, &payload, &e)
                                    : api_rollout_or_reply(req, &limits, &model, &payload, &e);
        CHECK_MSG(rc == GE_INVALID && !strcmp(e.field, cases[i].field), "case %zu: rc %d field '%s' (%s), want '%s'", i, rc,
                  e.field, e.message, cases[i].field);
        json_object_put(payload);
        json_object_put(req);
    }
}

int main(void) {
    RUN(test_job_members_unchanged);
    RUN(test_model_checked_first);
    RUN(test_stored_job_decodes);
    RUN(test_unknown_member_named_first);
    return CHECK_DONE();
}
