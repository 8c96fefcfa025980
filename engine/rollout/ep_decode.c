/* ep_decode.c — the decode copy under expert parallelism (engine_internal.h): every rank holds
 * every expert for rollouts, so each decodes its own groups as without expert parallelism
 * rather than dispatching each decode step's tokens to the experts' ranks (which would step all
 * ranks together, one MoE layer at a time). The copy is e->ep_full's layout (the checkpoints'),
 * gathered from every rank's act weights with moe_ep_gather(..., all = 1) when the engine
 * opens and whenever the weights change (eng_update, eng_update_undo: all ranks there in
 * lock-step), so a rollout never waits on another rank. Memory: one whole act-typed model per
 * rank (61 GB in bf16 at Qwen3-30B-A3B), beside this rank's experts. The cpu backend only (the
 * act weights are fp32 host memory): on another no copy is made and eng_sched_add refuses. */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/engine_internal.h"
#include "engine/model/moe_ep.h"

int ep_decode_refresh(eng *e) {
    if (!e->ep_full || strcmp(e->be->name, "cpu")) return 0; /* no copy: rollouts refused (rollout.c) */
    const model *f = e->ep_full;
    if (!e->ep_dact) {
        if (!(e->ep_dact = malloc((size_t)f->n_elems * sizeof(float))))
            return err_set(GE_NOMEM, "expert parallelism: out of memory for the decode copy (%lld MiB)", f->n_elems * 4 >> 20);
        int rc = model_views_make(f, e->ep_dact, sizeof(float), &e->ep_dv);
        if (rc) { /* no copy without its views: the next refresh starts again */
            free(e->ep_dact);
            e->ep_dact = NULL;
            return rc;
        }
    }
    int rc = moe_ep_gather(&e->m, (const float *)e->w_act, f, e->ep_dact, 1);
    if (rc) comm_abort(e->comm);
    return rc;
}

void ep_decode_free(eng *e) {
    if (!e->ep_dact) return;
    model_views_free(&e->ep_dv);
    free(e->ep_dact);
    e->ep_dact = NULL;
}
