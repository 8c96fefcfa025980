/* ep.c — expert parallelism in the engine (engine_internal.h; the layer is engine/model/moe_ep.h):
 *
 *   open        e->m holds this rank's experts (model_init_ep, its hooks this engine's comm) and
 *               e->ep_full describes the model without it (the checkpoints' layout).
 *   state       the replicated parameters [0, m.ep_n0) are sharded as data parallelism shards
 *               them (sh_n = ep_n0 / W, reduce-scattered, the act copy all-gathered); this rank's
 *               experts [ep_n0, n_elems) follow in every vector and in the state after the shard
 *               (train/state.c's pieces), their gradients never summed over ranks; with
 *               optimizer offload the shard's and the experts' master and moments are host
 *               memory, stepped there piece by piece (offload.h).
 *   lock-step   every MoE layer's forward and backward is an exchange among all ranks, so every
 *               rank runs as many micro-batches as the rank that runs most (ep_most, ep_pad)
 *               and recomputes the same layers in their backwards (ep_agree_ckpt).
 *   whole       a state vector to the checkpoints' layout on rank 0 (ep_whole), and back
 *               (ep_slice). */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/engine_internal.h"
#include "engine/model/moe_ep.h"
#include "engine/model/pack.h"

/* ---------------------------------------------------------------- open */

/* the comm hooks of model_ep (the model room does not include engine/dist) */
static int a2a_bytes(void *ctx, const void *in, const size_t *send, void *out, const size_t *recv) {
    return comm_all_to_all_v(ctx, in, send, out, recv, COMM_U8);
}
static int gather_bytes(void *ctx, const void *in, void *out, size_t bytes) {
    return comm_all_gather(ctx, in, out, bytes, COMM_U8);
}
static void abort_comm(void *ctx) { comm_abort(ctx); }

void ep_model_free(eng *e) {
    if (e->ep_full && e->ep_full->params) model_free(e->ep_full);
    free(e->ep_full);
    e->ep_full = NULL;
}

int ep_model_init(eng *e, const model_config *cfg, const eng_open_opts *o, int lora) {
    const char *no = !e->comm ? "it needs ranks (--ranks N; a comm)"
        : !config_n_moe(cfg)  ? "the model has no mixture-of-experts layer"
        : lora                ? "LoRA adapters are not built with it"
                              : NULL;
    if (no) return err_set(GE_UNSUPPORTED, "%s: expert parallelism cannot apply: %s", o->model_dir, no);
    model_ep ep = {e->rank, e->W, a2a_bytes, gather_bytes, abort_comm, e->comm};
    int rc = model_init_ep(&e->m, cfg, e->be, &ep); /* E % W: one line there */
    if (!rc && !(e->ep_full = calloc(1, sizeof *e->ep_full))) rc = err_set(GE_NOMEM, "engine: out of memory");
    if (!rc) rc = model_init(e->ep_full, cfg, e->be);
    return rc;
}

/* ---------------------------------------------------------------- lock-step */

int ep_most(eng *e, int n, int *most) {
    *most = n;
    if (!e->ep_full) return 0;
    int *all = malloc((size_t)e->W * sizeof(int));
    if (!all) {
        comm_abort(e->comm);
        return err_set(GE_NOMEM, "ep: out of memory");
    }
    int rc = dp_exchange(e, &n, all, sizeof n);
    for (int q = 0; !rc && q < e->W; q++)
        if (all[q] > *most) *most = all[q];
    free(all);
    return rc;
}

int ep_pad(eng *e, const model_views *w, int n, int most, int grad, int rc) {
    if (!e->ep_full) return rc;
    if (rc) { /* the others may wait inside a layer's exchange: end it */
        comm_abort(e->comm);
        return rc;
    }
    pack_group none = {0};
    float zero = 0;
    model_acts *a = grad ? &e->acts_g : &e->acts_ng;
    for (int k = n; !rc && k < most; k++) { /* T = 0: this rank's experts serve the others' rows */
        pack_batch b;
        if ((rc = pack_build(&b, &none, 0, 0, PACK_PACKED))) break;
        model_input in;
        model_input_from_batch(&in, &b);
        rc = eng_acts_reserve(e, a, 1, 1, grad);
        if (!rc) rc = model_forward(&e->m, w, a, NULL, &in, 1.0f, 0);
        if (!rc && grad) rc = model_backward(&e->m, w, &e->gv, a, &in, &zero, NULL, 1.0f);
        pack_batch_free(&b);
    }
    if (rc) comm_abort(e->comm);
    return rc;
}

int ep_agree_ckpt(eng *e, model_acts *a) {
    int most = 0, rc = e->ep_full ? ep_most(e, a->n_ckpt, &most) : 0;
    if (rc || most <= a->n_ckpt) return rc;
    int T = a->cap_T, M = a->cap_M;
    model_acts_free(&e->m, a);
    return model_acts_init_ckpt(&e->m, a, T, M, most); /* fewer bytes than the rank's own choice */
}

/* ---------------------------------------------------------------- whole vectors */

int ep_whole(eng *e, const float *x, float *whole) {
    size_t n = (size_t)e->m.n_elems, rep = (size_t)(e->sh_n * e->W);
    float *mine = calloc(n + 1, sizeof(float)); /* this rank's layout: the replicated part on rank 0 only */
    int rc = dp_agree(e, mine ? 0 : err_set(GE_NOMEM, "checkpoint: out of memory (%zu MiB)", n * 4 >> 20));
    if (!rc) rc = dp_gather_to_host(e, x, e->rank == 0 ? mine : NULL);
    size_t ex = (size_t)e->ep_n * 4; /* the experts after the shard: host memory with offload */
    if (!rc && e->offload) memcpy(mine + rep, x + e->sh_n, ex);
    if (!rc) rc = dp_agree(e, e->offload ? 0 : e->be->to_host(e->be, mine + rep, x + e->sh_n, ex));
    if (!rc) rc = moe_ep_gather(&e->m, mine, e->ep_full, whole, 0);
    free(mine);
    return rc;
}

void ep_slice(const eng *e, const float *whole, float *mine) {
    memset(mine, 0, (size_t)e->m.n_elems * sizeof(float));
    moe_ep_slice(&e->m, e->ep_full, whole, mine);
}
