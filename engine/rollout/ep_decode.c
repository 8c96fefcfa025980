/* ep_decode.c — the decode copy under expert parallelism (engine_internal.h): every rank holds
 * every expert for rollouts, so each decodes its own groups as without expert parallelism
 * rather than dispatching each decode step's tokens to the experts' ranks (which would step all
 * ranks together, one MoE layer at a time). The copy is e->ep_full's layout (the checkpoints'),
 * in the act type and the backend's memory, gathered from every rank's act weights with
 * moe_ep_gather_act when the engine opens and at the end of every update (eng_update,
 * eng_update_undo: all ranks there in lock-step), so a rollout never waits on another rank.
 * Where: a buffer of its own, one whole act-typed model per rank beside its experts. place()
 * can put it in the fp32 gradient buffer (4 bytes a parameter of this rank's against 2 of the
 * whole model at W <= 2; rollouts and updates never overlap, and each update then ends with a
 * gather), but does not yet (see place). */
#include "common/err.h"
#include "engine/engine_internal.h"
#include "engine/model/moe_ep.h"

/* The copy's bytes in place: the gradient buffer when it holds them, else its own buffer. */
static int place(eng *e) {
    const model *f = e->ep_full;
    eng_backend *be = e->be;
    size_t need = (size_t)f->n_elems * (size_t)be->act_bytes;
    /* Not the gradient buffer for now: with the copy there, cuda's rollouts after an update
     * differed from the checkpoint's without EP (test_ep_cuda W=1: 118 tokens; the cpu's are
     * equal); the cause is not found. */
    size_t room = 0;
    void *to = room >= need ? (void *)e->grad : NULL;
    if (e->ep_dact && (e->ep_dact == to || (!to && !e->ep_dec_grad))) return 0;
    ep_decode_free(e); /* its own buffer, now that the gradients hold it */
    if (!to && !(to = be->alloc(be, need)))
        return err_set(GE_NOMEM, "expert parallelism: the decode copy (%zu MiB) does not fit on %s", need >> 20, be->name);
    e->ep_dact = to;
    e->ep_dec_grad = to == (void *)e->grad;
    int rc = model_views_make(f, e->ep_dact, (size_t)be->act_bytes, &e->ep_dv);
    if (rc) ep_decode_free(e); /* no copy without its views: the next refresh starts again */
    return rc;
}

int ep_decode_refresh(eng *e) {
    if (!e->ep_full) return 0;
    int rc = place(e);
    if (rc) {
        comm_abort(e->comm); /* the others wait in the gather */
        return rc;
    }
    rc = moe_ep_gather_act(&e->m, e->w_act, e->ep_full, e->ep_dact); /* aborts the comm on failure */
    e->ep_dec_lost = rc != 0;
    return rc;
}

int ep_decode_after_update(eng *e, int stepped, int rc) {
    if (!e->ep_full || !(stepped || e->ep_dec_grad)) return rc; /* its own buffer holds the weights still */
    if (rc && !e->ep_dec_grad) return rc; /* restored weights, unchanged copy */
    int r2 = ep_decode_refresh(e); /* every rank: the backward overwrote it, or the weights moved */
    return rc ? rc : r2;
}

int ep_decode_ready(const eng *e) {
    if (!e->ep_full || (e->ep_dact && !e->ep_dec_lost)) return 0;
    return err_set(GE_COMM,
                   "expert parallelism: the decode copy was not gathered again after an update failed (%s); "
                   "rollouts need the ranks' comm: restart the ranks",
                   e->ep_dact ? "the comm is down" : "no memory for it");
}

void ep_decode_free(eng *e) {
    if (!e->ep_dact) return;
    model_views_free(&e->ep_dv);
    if (!e->ep_dec_grad) e->be->free(e->be, e->ep_dact);
    e->ep_dact = NULL;
    e->ep_dec_grad = 0;
}
