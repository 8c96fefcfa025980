/* ep_decode.c — the decode views under expert parallelism (engine_internal.h): every rank decodes
 * its own groups with every expert, as without expert parallelism, rather than dispatching each
 * decode step's tokens to the experts' ranks (which would step all ranks together, one MoE layer
 * at a time, and keep decode out of CUDA graphs).
 * The views (e->ep_dv, ep_full's model) are the training weights wherever those hold the whole
 * parameter: the replicated parameters (embedding, attention, norms, routers, head) point into
 * this rank's act weights, whole on every rank. Only each MoE layer's three expert stacks (E
 * experts each) are copies, gathered from every rank's block (one all-gather a stack) when the
 * engine opens and at the end of every update (eng_update, eng_update_undo: all ranks there in
 * lock-step), so a rollout never waits on another rank.
 * Where the stacks lie: in the fp32 gradient buffer, idle between updates, as far as it holds
 * them, and the rest in a buffer of their own (e->ep_dact). At Qwen3-30B-A3B in bf16 the stacks
 * are 58 GB: the gradients (4 bytes a parameter of the rank's) hold all of them at W <= 2 and 35
 * of them at W = 4, so a rank adds 0 and 23 GB to its training state, against 61 GB for a whole
 * copy. An update overwrites the gradient buffer, so with a stack there every update ends with
 * a gather, failed ones too; if that gather fails (the comm down, which stays down once
 * aborted: engine/dist/comm.h), rollouts are refused until the ranks restart (ep_decode_ready). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/engine_internal.h"

enum { STACKS = 3 }; /* gate, up, down */

/* Layer l's stack j in views v (NULL: not a MoE layer). */
static void **stack_of(model_views *v, int l, int j) {
    model_layer_views *L = &v->layers[l];
    void **s[STACKS] = {&L->we_gate, &L->we_up, &L->we_down};
    return *s[j] ? s[j] : NULL;
}

/* Bytes of one expert's matrix (every stack's: Fm x C or C x Fm). */
static size_t expert_bytes(const eng *e) {
    const model_config *c = &e->ep_full->cfg;
    return (size_t)c->Fm * (size_t)c->C * (size_t)e->be->act_bytes;
}

/* The views and where the stacks lie, once (the gradients are allocated before, when training). */
static int place(eng *e) {
    if (e->ep_dv.layers) return 0;
    const model_config *c = &e->ep_full->cfg;
    eng_backend *be = e->be;
    size_t stack = (size_t)c->E * expert_bytes(e), room = e->grad ? (size_t)(e->sh_n * e->W + e->ep_n) * 4 : 0, own = 0;
    model_views *v = &e->ep_dv;
    *v = e->wv; /* the replicated parameters: the training weights themselves */
    if (!(v->layers = malloc((size_t)c->L * sizeof *v->layers))) return err_set(GE_NOMEM, "engine: out of memory");
    memcpy(v->layers, e->wv.layers, (size_t)c->L * sizeof *v->layers);
    /* first pass: count what the gradients cannot hold; second: point every stack */
    for (int pass = 0; pass < 2; pass++) {
        size_t in_grad = 0, in_own = 0;
        for (int l = 0; l < c->L; l++)
            for (int j = 0; j < STACKS; j++) {
                void **s = stack_of(v, l, j);
                if (!s) continue;
                int there = in_grad + stack <= room;
                if (pass) *s = there ? (char *)e->grad + in_grad : (char *)e->ep_dact + in_own;
                *(there ? &in_grad : &in_own) += stack;
            }
        e->ep_dec_grad = (long long)in_grad;
        e->ep_dec_own = (long long)(own = in_own);
        if (!pass && own && !(e->ep_dact = be->alloc(be, own))) {
            free(v->layers);
            v->layers = NULL;
            return err_set(GE_NOMEM,
                           "expert parallelism: the decode copy of the experts (%zu MiB beside %zu MiB in the "
                           "gradient buffer) does not fit on %s",
                           own >> 20, in_grad >> 20, be->name);
        }
    }
    return 0;
}

int ep_decode_refresh(eng *e) {
    if (!e->ep_full) return 0;
    int rc = place(e);
    const model_config *c = &e->ep_full->cfg;
    size_t block = (size_t)e->m.ep_E * expert_bytes(e); /* this rank's experts of a stack */
    /* rank q's block lands at expert q ep_E: its experts [q ep_E, (q + 1) ep_E) */
    for (int l = 0; !rc && l < c->L; l++)
        for (int j = 0; !rc && j < STACKS; j++) {
            void **s = stack_of(&e->ep_dv, l, j);
            if (s) rc = comm_all_gather(e->comm, *stack_of(&e->wv, l, j), *s, block, COMM_U8);
        }
    if (!rc) rc = e->be->sync(e->be);
    if (rc) comm_abort(e->comm); /* the others wait in the gathers */
    e->ep_dec_lost = rc != 0;
    return rc;
}

int ep_decode_after_update(eng *e, int stepped, int rc) {
    if (!e->ep_full) return rc;
    if (!e->ep_dec_grad && (!stepped || rc)) return rc; /* unchanged (or restored) weights, copy untouched */
    if (!rc) return ep_decode_refresh(e); /* every rank: the weights moved, or the update overwrote the gradients */
    char why[512]; /* the refresh's own errors (a comm aborted by this failure) must not hide the cause */
    snprintf(why, sizeof why, "%s", err_msg());
    ep_decode_refresh(e);
    return err_set(rc, "%s", why);
}

int ep_decode_ready(const eng *e) {
    if (!e->ep_full || (e->ep_dv.layers && !e->ep_dec_lost)) return 0;
    return err_set(GE_COMM,
                   "expert parallelism: the decode copy of the experts was not gathered again after an update (%s); "
                   "rollouts need the ranks' comm: restart the ranks",
                   e->ep_dv.layers ? "the comm is down" : "no memory for it");
}

void *ep_decode_param(const eng *e, const model_param *p) {
    size_t eb = (size_t)e->be->act_bytes;
    int l, k;
    char proj[32];
    if (sscanf(p->name, "model.layers.%d.mlp.experts.%d.%31[a-z_]", &l, &k, proj) == 3) {
        static const char *names[STACKS] = {"gate_proj", "up_proj", "down_proj"};
        for (int j = 0; j < STACKS; j++)
            if (!strcmp(proj, names[j])) return (char *)*stack_of((model_views *)&e->ep_dv, l, j) + (size_t)k * expert_bytes(e);
        return NULL;
    }
    for (int i = 0; i < e->m.n_params; i++)
        if (!strcmp(e->m.params[i].name, p->name)) return (char *)e->w_act + (size_t)e->m.params[i].off * eb;
    return NULL;
}

void ep_decode_free(eng *e) {
    free(e->ep_dv.layers);
    memset(&e->ep_dv, 0, sizeof e->ep_dv);
    if (e->ep_dact) e->be->free(e->be, e->ep_dact);
    e->ep_dact = NULL;
    e->ep_dec_grad = e->ep_dec_own = 0;
}
