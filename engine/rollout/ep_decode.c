/* ep_decode.c — the decode copy under expert parallelism (engine_internal.h): every rank holds
 * every expert for rollouts, so each decodes its own groups as without expert parallelism
 * rather than dispatching each decode step's tokens to the experts' ranks (which would step all
 * ranks together, one MoE layer at a time). The copy is e->ep_full's layout (the checkpoints'),
 * in the act type and the backend's memory, gathered from every rank's act weights with
 * moe_ep_gather_act when the engine opens and whenever the weights change (eng_update,
 * eng_update_undo: all ranks there in lock-step), so a rollout never waits on another rank.
 * Memory: one whole act-typed model per rank (61 GB in bf16 at Qwen3-30B-A3B, on the device
 * with cuda), beside this rank's experts. */
#include "common/err.h"
#include "engine/engine_internal.h"
#include "engine/model/moe_ep.h"

int ep_decode_refresh(eng *e) {
    if (!e->ep_full) return 0;
    const model *f = e->ep_full;
    eng_backend *be = e->be;
    size_t eb = (size_t)be->act_bytes;
    if (!e->ep_dact) {
        if (!(e->ep_dact = be->alloc(be, (size_t)f->n_elems * eb))) {
            comm_abort(e->comm);
            return err_set(GE_NOMEM, "expert parallelism: the decode copy (%lld MiB) does not fit on %s",
                           f->n_elems * (long long)eb >> 20, be->name);
        }
        int rc = model_views_make(f, e->ep_dact, eb, &e->ep_dv);
        if (rc) { /* no copy without its views: the next refresh starts again */
            be->free(be, e->ep_dact);
            e->ep_dact = NULL;
            comm_abort(e->comm);
            return rc;
        }
    }
    return moe_ep_gather_act(&e->m, e->w_act, f, e->ep_dact); /* aborts the comm on failure */
}

void ep_decode_free(eng *e) {
    if (!e->ep_dact) return;
    model_views_free(&e->ep_dv);
    e->be->free(e->be, e->ep_dact);
    e->ep_dact = NULL;
}
