/* guided_run.h — a guided rollout on an engine (sampling.guided json_object, suffix "}"), and
 * what it must show: every response's bytes are a JSON object and the suffix (the grammar's
 * automaton reads them to completion) and end with an EOS inside max_tokens; and an unguided job
 * sharing the scheduler with it draws what it draws alone. For tests/unit/test_guided.c (cpu)
 * and tests/gpu/test_guided.c (cuda, where the second holds in exact mode only: bf16 logits
 * depend on the batch otherwise). */
#ifndef GRPOD_GUIDED_RUN_H
#define GRPOD_GUIDED_RUN_H
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "engine/text/json_grammar.h"

enum { GR_GROUPS = 2, GR_N = 8, GR_MAX = 40 };

typedef struct {
    int responses, complete; /* guided responses, and those whose text completes the grammar with an EOS */
    int beside, beside_same; /* unguided responses run beside the guided job, and those equal to alone */
} guided_result;

static inline void guided_sampling(eng_sampling *s, int guided, uint64_t seed) {
    static const char *const suffix[] = {"}"};
    eng_sampling_default(s);
    s->temperature = 1.0f;
    s->max_tokens = GR_MAX;
    s->seed = seed;
    s->guided = guided;
    s->guided_suffix = guided ? suffix : NULL;
    s->n_guided_suffix = guided ? 1 : 0;
}

static inline int guided_counts(eng *e, const eng_group_result *out, guided_result *r) {
    eng_info info;
    eng_get_info(e, &info);
    jg_spec g;
    jg_spec_init(&g, 1, "}");
    for (int i = 0; i < GR_GROUPS; i++)
        for (int k = 0; k < out[i].n; k++) {
            const eng_response *x = &out[i].resp[k];
            jg_state s;
            jg_start(&g, &s);
            int eos = 0;
            for (int t = 0; t < info.n_eos; t++) eos |= x->n_tokens && x->tokens[x->n_tokens - 1] == info.eos_ids[t];
            r->responses++;
            r->complete += eos && !jg_feed(&g, &s, x->text, x->text_len) && jg_complete(&g, &s);
        }
    return 0;
}

/* 0, or an engine error code (then r is partial). */
static inline int guided_run(eng *e, guided_result *r) {
    memset(r, 0, sizeof *r);
    static const int p0[] = {72, 105, 33, 10, 123}, p1[] = {9, 200, 31, 77};
    eng_rollout_group groups[GR_GROUPS] = {{p0, 5, GR_N}, {p1, 4, GR_N}};
    eng_sampling sg, su;
    guided_sampling(&sg, ENG_GUIDED_OBJECT, 7);
    guided_sampling(&su, ENG_GUIDED_NONE, 11);
    eng_group_result alone[GR_GROUPS], g_out[GR_GROUPS], u_out[GR_GROUPS];
    int rc = eng_rollout(e, groups, GR_GROUPS, &su, alone, NULL, NULL);
    eng_sched *s = NULL;
    eng_sched_job *jg = NULL, *ju = NULL;
    eng_sched_opts o = {.kv_rows = 4096};
    if (!rc) rc = eng_sched_open(e, &o, &s);
    if (!rc) rc = eng_sched_add(s, groups, GR_GROUPS, &sg, g_out, &jg);
    if (!rc) rc = eng_sched_add(s, groups, GR_GROUPS, &su, u_out, &ju);
    for (int step = 0; !rc && step < 4 * GR_MAX && eng_sched_busy(s); step++) rc = eng_sched_step(s);
    if (!rc && (eng_sched_job_state(jg, NULL, NULL, NULL) != 1 || eng_sched_job_state(ju, NULL, NULL, NULL) != 1))
        rc = GE_INTERNAL;
    if (!rc) {
        guided_counts(e, g_out, r);
        for (int i = 0; i < GR_GROUPS; i++)
            for (int k = 0; k < GR_N; k++) {
                const eng_response *a = &alone[i].resp[k], *b = &u_out[i].resp[k];
                r->beside++;
                r->beside_same += a->n_tokens == b->n_tokens && !memcmp(a->tokens, b->tokens, sizeof(int) * (size_t)a->n_tokens);
            }
    }
    if (jg) eng_sched_job_release(s, jg);
    if (ju) eng_sched_job_release(s, ju);
    eng_sched_close(s);
    for (int i = 0; i < GR_GROUPS; i++) {
        eng_group_result_free(&alone[i]);
        if (jg) eng_group_result_free(&g_out[i]);
        if (ju) eng_group_result_free(&u_out[i]);
    }
    return rc;
}
#endif
