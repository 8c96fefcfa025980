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
 *   lock-step   every MoE layer's forward and backward is an exchange among all ranks, so each
 *               rank's pass over the layers meets another's of the same kind (ep_gate: empty
 *               passes fill in, split groups included) and the ranks recompute the same layers
 *               in their micro-batches' backwards (ep_agree_ckpt).
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

enum { EP_DONE = -1 };

/* An empty pass of kind (T = 0): this rank's experts serve the other ranks' rows. A backward
 * (with the policy's gradients) recomputes the layers its kind says, as the others' does. */
static int empty_pass(eng *e, const model_views *w, int kind) {
    int c = kind - MODEL_PASS_BWD, rc = 0;
    model_acts *a = &e->acts_pad;
    if (!a->mem || (kind > MODEL_PASS_FWD && a->n_ckpt != c)) {
        model_acts_free(&e->m, a);
        if ((rc = model_acts_init_ckpt(&e->m, a, 1, 1, c > 0 ? c : 0))) return rc;
    }
    pack_group none = {0};
    pack_batch b;
    if ((rc = pack_build(&b, &none, 0, 0, PACK_PACKED))) return rc;
    model_input in;
    model_input_from_batch(&in, &b);
    float zero = 0;
    e->ep_empty++;
    if (kind == MODEL_PASS_FWD) rc = model_forward(&e->m, w, a, NULL, &in, 1.0f, 0);
    else rc = model_backward(&e->m, w, &e->gv, a, &in, &zero, NULL, 1.0f);
    pack_batch_free(&b);
    return rc;
}

int ep_gate(eng *e, const model_views *w, int kind) {
    if (!e->ep_full) return 0;
    int *all = malloc((size_t)e->W * sizeof(int)), rc = all ? 0 : err_set(GE_NOMEM, "ep: out of memory");
    while (!rc && !(rc = dp_exchange(e, &kind, all, sizeof kind))) {
        int pick = EP_DONE, most = 0;
        for (int q = 0; q < e->W; q++) { /* the kind most ranks want, the lowest on a tie */
            int n = 0;
            for (int r = 0; all[q] != EP_DONE && r < e->W; r++) n += all[r] == all[q];
            if (n > most || (n == most && n && all[q] < pick)) most = n, pick = all[q];
        }
        if (pick == kind) break; /* this rank's own pass runs (or every rank is done) */
        rc = empty_pass(e, w, pick);
    }
    free(all);
    if (rc) comm_abort(e->comm); /* the others may wait inside a layer's exchange: end it */
    return rc;
}

int ep_gate_end(eng *e, const model_views *w, int rc) {
    if (!e->ep_full) return rc;
    if (rc) {
        comm_abort(e->comm);
        return rc;
    }
    return ep_gate(e, w, EP_DONE);
}

int ep_gate_split(void *ud, int kind) {
    ep_gate_ud *g = ud;
    return ep_gate(g->e, g->w, kind);
}

int ep_agree_ckpt(eng *e, model_acts *a) {
    if (!e->ep_full) return 0;
    int *all = malloc((size_t)e->W * sizeof(int)), most = a->n_ckpt;
    int rc = all ? dp_exchange(e, &a->n_ckpt, all, sizeof(int)) : err_set(GE_NOMEM, "ep: out of memory");
    for (int q = 0; !rc && q < e->W; q++) most = all[q] > most ? all[q] : most;
    free(all);
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
