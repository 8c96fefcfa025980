/* validate.c — request bodies → canonical job payloads, or a 4xx naming the field.
 * See validate.h for the contract. Layers: prompts, then one function per request kind
 * (rollouts, updates and logprobs, checkpoints, the tokenizer endpoints). The field getters
 * they use (fields.h) treat an absent key as "use the default" and a present key of the
 * wrong type or range as an error; unknown keys are errors (api_check_keys). */
#include "api/validate.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/fields.h"
#include "api/packed.h"
#include "api/params.h"
#include "api/reward.h"
#include "common/err.h"
#include "engine/engine.h"

/* ---------------------------------------------------------------- prompts */

/* messages: [{"role","content"}] → chat-template text (add_generation_prompt) → ids. */
static int messages_to_ids(json_object *arr, const char *path, const api_model *m, int agp, int add_special, int **ids, int *n,
                           api_error *e) {
    int cnt = (int)json_object_array_length(arr);
    const char **roles = calloc((size_t)cnt + 1, sizeof *roles), **contents = calloc((size_t)cnt + 1, sizeof *contents);
    int rc = 0;
    if (!roles || !contents) {
        rc = api_fail(e, GE_NOMEM, path, "out of memory");
        goto done;
    }
    static const char *const keys[] = {"role", "content", "name", NULL};
    static const char *const known_roles[] = {"system", "user", "assistant", "tool", NULL};
    for (int i = 0; i < cnt; i++) {
        char p[96];
        snprintf(p, sizeof p, "%s[%d]", path, i);
        json_object *msg = json_object_array_get_idx(arr, (size_t)i);
        if (!json_object_is_type(msg, json_type_object)) {
            rc = api_fail(e, GE_INVALID, p, "%s must be an object", p);
            goto done;
        }
        const char *name;
        if ((rc = api_check_keys(msg, p, keys, e)) || (rc = api_get_str(msg, p, "role", 1, &roles[i], e)) ||
            (rc = api_get_str(msg, p, "content", 1, &contents[i], e)) || (rc = api_get_str(msg, p, "name", 0, &name, e)))
            goto done;
        int ok = 0;
        for (const char *const *r = known_roles; *r; r++) ok |= strcmp(*r, roles[i]) == 0;
        if (!ok) {
            char f[128];
            snprintf(f, sizeof f, "%s.role", p);
            rc = api_fail(e, GE_INVALID, f, "%s must be system|user|assistant|tool", f);
            goto done;
        }
    }
    char *text = NULL;
    if (m->render_chat(m->ud, roles, contents, cnt, agp, &text)) {
        rc = api_fail(e, GE_INVALID, path, "%s: cannot apply the chat template: %s", path, err_msg());
        goto done;
    }
    if (m->tokenize(m->ud, text, strlen(text), add_special, ids, n))
        rc = api_fail(e, GE_INVALID, path, "%s: cannot tokenize: %s", path, err_msg());
    free(text);
done:
    free(roles);
    free(contents);
    return rc;
}

/* A group's prompt: exactly one of prompt | prompt_ids | messages. Returns the ids. */
static int prompt_or_reply(json_object *g, const char *path, const api_model *m, int **ids, int *n, api_error *e) {
    json_object *a;
    int have = json_object_object_get_ex(g, "prompt", NULL) + json_object_object_get_ex(g, "prompt_ids", NULL) +
        json_object_object_get_ex(g, "messages", NULL);
    char f[128];
    if (have != 1) {
        snprintf(f, sizeof f, "%s.prompt", path);
        return api_fail(e, GE_INVALID, f, "%s needs exactly one of prompt, prompt_ids, messages", path);
    }
    int rc;
    const char *text;
    if ((rc = api_get_str(g, path, "prompt", 0, &text, e))) return rc;
    if (text) {
        snprintf(f, sizeof f, "%s.prompt", path);
        if (!*text) return api_fail(e, GE_INVALID, f, "%s must not be empty", f);
        if (m->tokenize(m->ud, text, strlen(text), 1, ids, n))
            return api_fail(e, GE_INVALID, f, "%s cannot be tokenized: %s", f, err_msg());
    } else if (json_object_object_get_ex(g, "messages", NULL)) {
        snprintf(f, sizeof f, "%s.messages", path);
        if ((rc = api_get_arr(g, path, "messages", 1, 1, 4096, &a, e))) return rc;
        if ((rc = messages_to_ids(a, f, m, 1, 0, ids, n, e))) return rc;
    } else {
        json_object *canon;
        if ((rc = api_get_ids(g, path, "prompt_ids", 1, 1, m->max_pos, m->vocab, &canon, ids, n, e))) return rc;
        json_object_put(canon);
    }
    snprintf(f, sizeof f, "%s.prompt", path);
    if (*n < 1) {
        free(*ids);
        *ids = NULL;
        return api_fail(e, GE_INVALID, f, "%s tokenizes to no tokens", path);
    }
    for (int i = 0; i < *n; i++) /* the tokenizer's ids index the embedding: checked, not trusted */
        if ((*ids)[i] < 0 || (*ids)[i] >= m->vocab) {
            int id = (*ids)[i];
            free(*ids);
            *ids = NULL;
            return api_fail(e, GE_INVALID, f, "%s tokenizes to id %d, outside the vocabulary (size %d)", path, id, m->vocab);
        }
    return 0;
}

static json_object *ids_json(const int *ids, int n) {
    json_object *a = json_object_new_array_ext(n);
    for (int i = 0; i < n; i++) json_object_array_add(a, json_object_new_int(ids[i]));
    return a;
}

/* ---------------------------------------------------------------- rollouts */

static int reward_or_reply(json_object *r, const char *path, double ol_len, double ol_pen, int max_tokens, json_object **out,
                           api_error *e) {
    static const char *const keys[] = {"type", "answer", "case_sensitive", NULL};
    const char *type, *answer;
    int cs, rc;
    char f[128];
    if ((rc = api_check_keys(r, path, keys, e)) || (rc = api_get_str(r, path, "type", 1, &type, e)) ||
        (rc = api_get_str(r, path, "answer", 0, &answer, e)) || (rc = api_get_bool(r, path, "case_sensitive", 1, &cs, e)))
        return rc;
    reward_spec spec = {0};
    snprintf(f, sizeof f, "%s.type", path);
    if (reward_parse_type(type, &spec.type))
        return api_fail(e, GE_INVALID, f, "%s '%.64s' is not a known reward type (exact|math|regex|contains|none)", f, type);
    spec.answer = answer;
    spec.case_sensitive = cs;
    spec.overlong_len = (float)ol_len;
    spec.overlong_penalty = (float)ol_pen;
    spec.max_tokens = max_tokens;
    char why[256] = "";
    if (reward_check_spec(&spec, why, sizeof why)) {
        snprintf(f, sizeof f, "%s.answer", path);
        return api_fail(e, GE_INVALID, f, "%s: %s", path, why[0] ? why : "invalid reward spec");
    }
    json_object *c = json_object_new_object();
    api_put_str(c, "type", type);
    if (answer) api_put_str(c, "answer", answer);
    api_put_bool(c, "case_sensitive", cs);
    *out = c;
    return 0;
}

int api_rollout_or_reply(json_object *req, const api_limits *l, const api_model *m, json_object **payload, api_error *e) {
    static const char *const keys[] = {"groups", "sampling", "overlong_buffer", "metadata", NULL};
    static const char *const gkeys[] = {"prompt", "prompt_ids", "messages", "reward", "metadata", NULL}; /* and the rows' */
    json_object *groups, *samp_in, *ol_in, *ol = NULL, *sampling = NULL, *out_groups = NULL, *gc = NULL, *meta;
    eng_overlong ov;
    int rc;
    *payload = NULL;
    if ((rc = api_check_keys(req, "", keys, e)) || (rc = api_get_arr(req, "", "groups", 1, 1, l->max_groups, &groups, e)) ||
        (rc = api_get_obj(req, "", "sampling", &samp_in, e)) || (rc = api_get_obj(req, "", "overlong_buffer", &ol_in, e)) ||
        (ol_in && (rc = api_params_or_reply(&eng_overlong_params, ol_in, "overlong_buffer", NULL, l, m, &ol, e))) ||
        (rc = api_params_or_reply(&eng_sampling_params, samp_in, "sampling", NULL, l, m, &sampling, e)))
        goto fail;
    api_params_to_struct(&eng_overlong_params, ol, &ov); /* no enums: cannot fail */
    int max_tokens = json_object_get_int(json_object_object_get(sampling, "max_tokens"));
    out_groups = json_object_new_array();
    for (int i = 0; i < (int)json_object_array_length(groups); i++) {
        char p[64];
        snprintf(p, sizeof p, "groups[%d]", i);
        json_object *g = json_object_array_get_idx(groups, (size_t)i), *rw, *reward = NULL;
        if (!json_object_is_type(g, json_type_object)) {
            rc = api_fail(e, GE_INVALID, p, "%s must be an object", p);
            goto fail;
        }
        eng_group_job gs;
        if ((rc = api_params_or_reply(&eng_group_job_params, g, p, gkeys, l, m, &gc, e)) ||
            (rc = api_get_obj(g, p, "reward", &rw, e)))
            goto fail;
        api_params_to_struct(&eng_group_job_params, gc, &gs);
        long long n = gs.n;
        if (rw) {
            char rp[80];
            snprintf(rp, sizeof rp, "%s.reward", p);
            if ((rc = reward_or_reply(rw, rp, ov.len, ov.penalty_factor, max_tokens, &reward, e))) goto fail;
        }
        int *ids = NULL, P = 0;
        if ((rc = prompt_or_reply(g, p, m, &ids, &P, e))) {
            json_object_put(reward);
            goto fail;
        }
        if ((long long)P + max_tokens > m->max_pos) {
            free(ids);
            json_object_put(reward);
            rc = api_fail(e, GE_INVALID, p,
                          "%s: prompt (%d tokens) + sampling.max_tokens (%d) exceeds the model context of %d tokens", p, P,
                          max_tokens, m->max_pos);
            goto fail;
        }
        if (m->kv_rows > 0 && (long long)P + n * max_tokens > m->kv_rows) {
            free(ids);
            json_object_put(reward);
            rc = api_fail(e, GE_TOO_LARGE, p,
                          "%s needs %lld KV cache rows (prompt %d + n %lld x sampling.max_tokens %d) "
                          "but the rollout KV pool holds %lld; lower n or max_tokens, or raise --kv-budget-mib",
                          p, (long long)P + n * max_tokens, P, n, max_tokens, m->kv_rows);
            goto fail;
        }
        if (m->state_rows > 0 && n + 1 > m->state_rows) {
            free(ids);
            json_object_put(reward);
            char pn[80];
            snprintf(pn, sizeof pn, "%s.n", p);
            rc = api_fail(e, GE_TOO_LARGE, pn,
                          "%s needs %lld recurrent-state rows (n %lld + its prompt) but the rollout pool holds %lld; lower n, "
                          "or raise --kv-budget-mib",
                          pn, n + 1, n, m->state_rows);
            goto fail;
        }
        json_object *cg = json_object_new_object();
        json_object_object_add(cg, "prompt_ids", ids_json(ids, P));
        free(ids);
        api_params_move(cg, gc); /* n */
        gc = NULL;
        if (reward) json_object_object_add(cg, "reward", reward);
        if (json_object_object_get_ex(g, "metadata", &meta)) api_put_copy(cg, "metadata", meta);
        json_object_array_add(out_groups, cg);
    }
    json_object *c = json_object_new_object();
    json_object_object_add(c, "groups", out_groups);
    json_object_object_add(c, "sampling", sampling);
    if (ol && json_object_get_double(json_object_object_get(ol, "len")) > 0) { /* len 0: shaping off, not stored */
        json_object_object_add(c, "overlong_buffer", ol);
        ol = NULL;
    }
    json_object_put(ol);
    if (json_object_object_get_ex(req, "metadata", &meta)) api_put_copy(c, "metadata", meta);
    *payload = c;
    return 0;
fail:
    json_object_put(out_groups);
    json_object_put(sampling);
    json_object_put(ol);
    json_object_put(gc);
    return rc;
}

/* ---------------------------------------------------------------- updates */

/* r's loss_mask (optional): R integers, each 0 or 1 (veRL's response_mask); into c as given.
 * The 4xx names the field, e.g. groups[2].responses[1].loss_mask. */
static int loss_mask_or_reply(json_object *r, const char *rp, int R, json_object *c, api_error *e) {
    json_object *a;
    char f[160];
    api_path_join(f, sizeof f, rp, "loss_mask");
    if (!json_object_object_get_ex(r, "loss_mask", &a)) return 0;
    int n = api_packed_len(a);
    if (!api_packed_of(a) && !json_object_is_type(a, json_type_array))
        return api_fail(e, GE_INVALID, f, "%s must be an array of 0/1, one per token of token_ids", f);
    if (n != R) return api_fail(e, GE_INVALID, f, "%s has %d entries; token_ids has %d", f, n, R);
    const api_packed *pk = api_packed_of(a);
    for (int t = 0; t < n; t++) {
        json_object *x = pk ? NULL : json_object_array_get_idx(a, (size_t)t);
        long long v = pk ? pk->ids[t] : json_object_is_type(x, json_type_int) ? json_object_get_int64(x) : -1;
        if (v != 0 && v != 1) return api_fail(e, GE_INVALID, f, "%s[%d] must be 0 or 1", f, t);
    }
    json_object_object_add(c, "loss_mask", json_object_get(a)); /* 0/1 ints: its own canonical form */
    return 0;
}

/* The rollout correction's knobs together (algo: the canonical algorithm section): it needs the
 * old logprobs recomputed (veRL's decoupled mode: with the rollout's as old, every ratio is 1);
 * rollout_rs needs rollout_rs_threshold, "lower_upper" only for its k1 options. */
static int rollout_corr_or_reply(json_object *algo, int old_from_rollout, api_error *e) {
    const char *ris = json_object_get_string(json_object_object_get(algo, "rollout_is"));
    const char *rrs = json_object_get_string(json_object_object_get(algo, "rollout_rs"));
    json_object *th = json_object_object_get(algo, "rollout_rs_threshold");
    int on_is = strcmp(ris, "none") != 0, on_rs = strcmp(rrs, "none") != 0;
    if ((on_is || on_rs) && old_from_rollout)
        return api_fail(e, GE_INVALID, on_is ? "algorithm.rollout_is" : "algorithm.rollout_rs",
                        "algorithm.%s needs old_logprobs recompute: it weighs the old policy against the rollout's "
                        "logprobs (veRL's decoupled mode)",
                        on_is ? "rollout_is" : "rollout_rs");
    if (on_rs && !th)
        return api_fail(e, GE_INVALID, "algorithm.rollout_rs_threshold",
                        "algorithm.rollout_rs_threshold is required with rollout_rs");
    if (on_rs && json_object_is_type(th, json_type_string) && strchr(json_object_get_string(th), '_') && rrs[strlen(rrs) - 1] != '1')
        return api_fail(e, GE_INVALID, "algorithm.rollout_rs_threshold",
                        "algorithm.rollout_rs_threshold: %s takes one upper bound; \"lower_upper\" is for the k1 options", rrs);
    return 0;
}

/* groups of scored sequences (updates: with_scores = 1; logprobs: 0). */
static int seq_groups_or_reply(json_object *req, const api_limits *l, const api_model *m, int with_scores, int need_logprobs,
                               json_object **out, api_error *e) {
    static const char *const gkeys[] = {"prompt_ids", "responses", "metadata", "reward_mean", "reward_std", NULL};
    static const char *const rkeys[] = {"token_ids",     "reward", "advantage", "logprobs",
                                        "finish_reason", "text",   "loss_mask", NULL};
    static const char *const rkeys_lp[] = {"token_ids", NULL};
    json_object *groups, *og = json_object_new_array();
    int rc;
    if ((rc = api_get_arr(req, "", "groups", 1, 1, l->max_groups, &groups, e))) goto fail;
    for (int i = 0; i < (int)json_object_array_length(groups); i++) {
        char p[64];
        snprintf(p, sizeof p, "groups[%d]", i);
        json_object *g = json_object_array_get_idx(groups, (size_t)i), *resps, *pid, *meta;
        if (!json_object_is_type(g, json_type_object)) {
            rc = api_fail(e, GE_INVALID, p, "%s must be an object", p);
            goto fail;
        }
        int P;
        if ((rc = api_check_keys(g, p, gkeys, e)) ||
            (rc = api_get_ids(g, p, "prompt_ids", 1, 1, m->max_pos, m->vocab, &pid, NULL, &P, e)))
            goto fail;
        json_object *cg = json_object_new_object(), *cr = json_object_new_array();
        json_object_object_add(cg, "prompt_ids", pid);
        json_object_object_add(cg, "responses", cr);
        json_object_array_add(og, cg);
        if (with_scores && json_object_object_get_ex(g, "metadata", &meta)) api_put_copy(cg, "metadata", meta);
        if ((rc = api_get_arr(g, p, "responses", 1, 1, l->max_n, &resps, e))) goto fail;
        int uses_adv = -1;
        for (int k = 0; k < (int)json_object_array_length(resps); k++) {
            char rp[96], f[128];
            snprintf(rp, sizeof rp, "%s.responses[%d]", p, k);
            json_object *r = json_object_array_get_idx(resps, (size_t)k), *tid, *lpa;
            if (!json_object_is_type(r, json_type_object)) {
                rc = api_fail(e, GE_INVALID, rp, "%s must be an object", rp);
                goto fail;
            }
            int R;
            if ((rc = api_check_keys(r, rp, with_scores ? rkeys : rkeys_lp, e)) ||
                (rc = api_get_ids(r, rp, "token_ids", 1, 1, m->max_pos, m->vocab, &tid, NULL, &R, e)))
                goto fail;
            json_object *c = json_object_new_object();
            json_object_object_add(c, "token_ids", tid);
            json_object_array_add(cr, c);
            if ((long long)P + R > m->max_pos) {
                rc = api_fail(e, GE_INVALID, rp, "%s: prompt (%d) + response (%d) tokens exceed the model context of %d", rp, P,
                              R, m->max_pos);
                goto fail;
            }
            if (!with_scores) continue;
            int has_r = json_object_object_get_ex(r, "reward", NULL), has_a = json_object_object_get_ex(r, "advantage", NULL);
            snprintf(f, sizeof f, "%s.reward", rp);
            if (has_r == has_a) {
                rc = api_fail(e, GE_INVALID, f, "%s needs exactly one of reward, advantage", rp);
                goto fail;
            }
            if (uses_adv >= 0 && uses_adv != has_a) {
                rc = api_fail(e, GE_INVALID, f, "%s: all responses of a group must give reward, or all advantage", rp);
                goto fail;
            }
            uses_adv = has_a;
            double x;
            if ((rc = api_get_num(r, rp, has_a ? "advantage" : "reward", -1e9, 1e9, 0, &x, e))) goto fail;
            api_put_num(c, has_a ? "advantage" : "reward", x);
            const char *fin;
            if ((rc = api_get_str(r, rp, "finish_reason", 0, &fin, e))) goto fail;
            snprintf(f, sizeof f, "%s.finish_reason", rp);
            if (fin && strcmp(fin, "stop") && strcmp(fin, "length")) {
                rc = api_fail(e, GE_INVALID, f, "%s must be stop or length", f);
                goto fail;
            }
            api_put_bool(c, "truncated", fin && strcmp(fin, "length") == 0);
            if ((rc = loss_mask_or_reply(r, rp, R, c, e))) goto fail;
            if ((rc = api_get_arr(r, rp, "logprobs", 0, R, R, &lpa, e))) goto fail;
            snprintf(f, sizeof f, "%s.logprobs", rp);
            if (!lpa && need_logprobs) {
                rc = api_fail(e, GE_INVALID, f, "%s is required when %s", f,
                              need_logprobs == 2 ? "algorithm.rollout_is or rollout_rs is set"
                                                 : "algorithm.old_logprobs is rollout");
                goto fail;
            }
            if (lpa) {
                /* a packed array prints its doubles as json_object_new_double's: shared */
                const api_packed *pk = api_packed_of(lpa);
                assert(!pk || pk->nums);
                json_object *cl = pk ? json_object_get(lpa) : json_object_new_array_ext(R);
                json_object_object_add(c, "logprobs", cl);
                for (int t = 0; t < R; t++) {
                    json_object *x1 = pk ? NULL : json_object_array_get_idx(lpa, (size_t)t);
                    double d = pk ? pk->nums[t] : api_is_num(x1) ? json_object_get_double(x1) : NAN;
                    if (!(d <= 0 && d > -1e30)) {
                        rc = api_fail(e, GE_INVALID, f, "%s[%d] must be a finite number <= 0", f, t);
                        goto fail;
                    }
                    if (!pk) json_object_array_add(cl, json_object_new_double(d));
                }
            }
        }
    }
    *out = og;
    return 0;
fail:
    json_object_put(og);
    return rc;
}

int api_update_or_reply(json_object *req, const api_limits *l, const api_model *m, json_object **payload,
                        const char **rollout_job_id, long long *expected, api_error *e) {
    static const char *const keys[] = {"groups", "algorithm", "optimizer", NULL}; /* and the rows' */
    json_object *a, *o, *algo = NULL, *opt = NULL, *job = NULL, *groups = NULL;
    eng_update_job u;
    int rc;
    *payload = NULL;
    *rollout_job_id = NULL;
    if ((rc = api_params_check_keys(&eng_update_job_params, req, "", keys, e)) ||
        (rc = api_get_obj(req, "", "algorithm", &a, e)) || (rc = api_get_obj(req, "", "optimizer", &o, e)) ||
        (rc = api_params_or_reply(&eng_loss_params, a, "algorithm", NULL, NULL, NULL, &algo, e)) ||
        (rc = api_params_or_reply(&eng_optim_params, o, "optimizer", NULL, NULL, NULL, &opt, e)) ||
        (rc = api_params_or_reply(&eng_update_job_params, req, "", keys, l, m, &job, e)))
        goto fail;
    api_params_to_struct(&eng_update_job_params, job, &u); /* no enums: cannot fail */
    const char *rid = u.rollout_job_id;
    *expected = u.expected_policy_version;
    int has_g = json_object_object_get_ex(req, "groups", NULL);
    if ((rid != NULL) == has_g) {
        rc = api_fail(e, GE_INVALID, "groups", "give exactly one of groups, rollout_job_id");
        goto fail;
    }
    if (rid && !api_job_id_ok(rid)) {
        rc = api_fail(e, GE_INVALID, "rollout_job_id", "rollout_job_id must look like j_ + 16 hex digits");
        goto fail;
    }
    if (!strcmp(json_object_get_string(json_object_object_get(algo, "routing_replay")), "rollout") &&
        (!rid || (m && !m->moe_layers))) {
        rc = api_fail(e, GE_INVALID, "algorithm.routing_replay",
                      !rid ? "algorithm.routing_replay \"rollout\" replays the routes a rollout recorded: it needs rollout_job_id"
                           : "algorithm.routing_replay \"rollout\" needs a mixture-of-experts model; this one has no MoE layers");
        goto fail;
    }
    int need_lp = strcmp(json_object_get_string(json_object_object_get(algo, "old_logprobs")), "rollout") == 0;
    if ((rc = rollout_corr_or_reply(algo, need_lp, e))) goto fail;
    const char *ris = json_object_get_string(json_object_object_get(algo, "rollout_is"));
    const char *rrs = json_object_get_string(json_object_object_get(algo, "rollout_rs"));
    if (!need_lp && (strcmp(ris, "none") || strcmp(rrs, "none"))) need_lp = 2;
    if (has_g && (rc = seq_groups_or_reply(req, l, m, 1, need_lp, &groups, e))) goto fail;
    /* the stored order: groups, rollout_job_id, algorithm, optimizer, max_tokens_per_micro_batch,
     * expected_policy_version */
    json_object *c = json_object_new_object(), *id = NULL;
    if (groups) json_object_object_add(c, "groups", groups);
    if (json_object_object_get_ex(job, "rollout_job_id", &id)) json_object_object_add(c, "rollout_job_id", json_object_get(id));
    json_object_object_del(job, "rollout_job_id"); /* rid still points into id, now c's */
    json_object_object_add(c, "algorithm", algo);
    json_object_object_add(c, "optimizer", opt);
    api_params_move(c, job);
    if (rid) *rollout_job_id = json_object_get_string(json_object_object_get(c, "rollout_job_id"));
    *payload = c;
    return 0;
fail:
    json_object_put(algo);
    json_object_put(opt);
    json_object_put(job);
    return rc;
}

int api_logprobs_or_reply(json_object *req, const api_limits *l, const api_model *m, json_object **payload, api_error *e) {
    static const char *const keys[] = {"groups", NULL}; /* and the rows' */
    json_object *groups = NULL, *job = NULL;
    int rc;
    *payload = NULL;
    if ((rc = api_params_or_reply(&eng_logprobs_job_params, req, "", keys, l, m, &job, e))) return rc;
    if ((rc = seq_groups_or_reply(req, l, m, 0, 0, &groups, e))) {
        json_object_put(job);
        return rc;
    }
    json_object *c = json_object_new_object();
    json_object_object_add(c, "groups", groups);
    api_params_move(c, job); /* model, temperature, max_tokens_per_micro_batch, top_logprobs (when > 0) */
    *payload = c;
    return 0;
}

int api_checkpoint_or_reply(json_object *req, json_object **payload, api_error *e) {
    return api_params_or_reply(&eng_checkpoint_job_params, req, "", NULL, NULL, NULL, payload, e); /* {} or {"merged": true} */
}

/* ---------------------------------------------------------------- tokenizer endpoints */

int api_tokenize_or_reply(json_object *req, const api_model *m, int **ids, int *n, api_error *e) {
    static const char *const keys[] = {"prompt", "messages", "add_special_tokens", "add_generation_prompt", NULL};
    const char *text;
    json_object *msgs;
    int add_special, agp, rc;
    *ids = NULL;
    *n = 0;
    if ((rc = api_check_keys(req, "", keys, e)) || (rc = api_get_str(req, "", "prompt", 0, &text, e)) ||
        (rc = api_get_arr(req, "", "messages", 0, 1, 4096, &msgs, e)) ||
        (rc = api_get_bool(req, "", "add_special_tokens", text ? 1 : 0, &add_special, e)) ||
        (rc = api_get_bool(req, "", "add_generation_prompt", 1, &agp, e)))
        return rc;
    if ((text != NULL) == (msgs != NULL)) return api_fail(e, GE_INVALID, "prompt", "give exactly one of prompt, messages");
    if (msgs) return messages_to_ids(msgs, "messages", m, agp, add_special, ids, n, e);
    if (m->tokenize(m->ud, text, strlen(text), add_special, ids, n))
        return api_fail(e, GE_INVALID, "prompt", "prompt cannot be tokenized: %s", err_msg());
    return 0;
}

int api_detokenize_or_reply(json_object *req, const api_model *m, int **ids, int *n, int *skip_special, api_error *e) {
    static const char *const keys[] = {"tokens", "skip_special_tokens", NULL};
    json_object *canon;
    int rc;
    *ids = NULL;
    if ((rc = api_check_keys(req, "", keys, e)) || (rc = api_get_bool(req, "", "skip_special_tokens", 0, skip_special, e)) ||
        (rc = api_get_ids(req, "", "tokens", 1, 0, 1 << 20, m->vocab, &canon, ids, n, e)))
        return rc;
    json_object_put(canon);
    return 0;
}
