/* engine_internal.h — the engine object shared by engine.c, rollout.c and update.c.
 * Not for use outside engine/. */
#ifndef GRPOD_ENGINE_INTERNAL_H
#define GRPOD_ENGINE_INTERNAL_H
#include <stdatomic.h>

#include "engine/engine.h"
#include "engine/model.h"
#include "engine/tokenizer.h"

struct eng {
    eng_backend *be;
    model m;
    tok *tok;                   /* NULL when the directory has no tokenizer.json */
    char model_dir[512];
    /* policy: act-typed weights used by the ops, fp32 master (== act on the cpu backend) */
    void *w_act; float *w_master;
    model_views wv;             /* views into w_act */
    model_views mv;             /* views into w_master (fp32) */
    /* frozen reference (act-typed) */
    void *ref_act; model_views rv;
    /* training state, allocated on the first update */
    float *grad, *adam_m, *adam_v;
    model_views gv;             /* views into grad */
    int opt_step;               /* AdamW steps taken (1-based bias correction) */
    _Atomic long long policy_version;
    /* activations, grown on demand (no-grad and grad) */
    model_acts acts_ng, acts_g;
    struct dec_state *dec;      /* generation step buffers (decode.c), made on first use */
};

/* Make sure acts has room for T tokens and M predictions (grad or not); reallocates to the
 * larger size when needed. */
int eng_acts_reserve(eng *e, model_acts *a, int T, int M, int grad);
/* Logprobs (and entropies when ent != NULL) of every predicted token of a set of groups under
 * views w, micro-batch by micro-batch; out is (M_total) in response order (group, response,
 * token). */
int eng_score(eng *e, const model_views *w, const pack_group *groups, int n, long long max_tokens,
              float temperature, float *out, float *ent);
#endif
