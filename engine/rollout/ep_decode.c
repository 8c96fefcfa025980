/* ep_decode.c — the decode copy under expert parallelism (engine_internal.h): every rank holds
 * every expert for rollouts, so each decodes its own groups as without expert parallelism
 * rather than dispatching each decode step's tokens to the experts' ranks (which would step all
 * ranks together, one MoE layer at a time). The copy is e->ep_full's layout (the checkpoints'),
 * in the act type and the backend's memory, gathered from every rank's act weights with
 * moe_ep_gather_act when the engine opens and at the end of every update (eng_update,
 * eng_update_undo: all ranks there in lock-step), so a rollout never waits on another rank.
 * Memory: one whole act-typed model per rank (61 GB in bf16 at Qwen3-30B-A3B, on the device
 * with cuda), beside this rank's experts. In the idle fp32 gradient buffer it would cost nothing
 * at W <= 2, but with it there cuda's rollouts after an update differed from the checkpoint's
 * without EP (test_ep_cuda W=1: 118 tokens; the cpu's were equal). Likely the KV pool's
 * never-written rows (NaN on recycled memory, zeroed since by model_kv_clean_to), whose place
 * the copy's own buffer moved; not tried again on a GPU. */
#include "common/err.h"
#include "engine/engine_internal.h"
#include "engine/model/moe_ep.h"

/* The copy's own buffer and its views, once. */
static int place(eng *e) {
    const model *f = e->ep_full;
    eng_backend *be = e->be;
    if (e->ep_dact) return 0;
    size_t need = (size_t)f->n_elems * (size_t)be->act_bytes;
    if (!(e->ep_dact = be->alloc(be, need)))
        return err_set(GE_NOMEM, "expert parallelism: the decode copy (%zu MiB) does not fit on %s", need >> 20, be->name);
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
    if (!e->ep_full || !stepped || rc) return rc; /* unchanged (or restored) weights: the copy holds them */
    return ep_decode_refresh(e); /* every rank: the weights moved */
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
    e->be->free(e->be, e->ep_dact);
    e->ep_dact = NULL;
}
