/* moe_ep.h — expert parallelism for a mixture-of-experts layer (kernels/moe.h): the experts of
 * every MoE layer are split over the W ranks of model.ep, rank r holding [r E/W, (r+1) E/W)
 * (model.ep_e0, model.ep_E), and the tokens travel to them.
 *
 *   forward   each token's k slots, in (token, slot) order, are sent to their experts' ranks
 *             (its ln2 row and the expert); each rank runs its experts on the rows it received
 *             (sources in rank order), sends each output back, and the token's rank writes it
 *             into ey (T,k,C) at the slot it came from, so the combine sums the slots in the
 *             one-rank order: the forward gives the bits one rank with every expert gives.
 *   backward  d ey's routing-weight gradient dtopw is the token's rank's (it holds ey); each
 *             slot's row, its dout row and its routing weight go to the expert's rank, which
 *             recomputes the expert's forward on them, adds the experts' weight gradients
 *             (its rows in the order received: one rank's token order when the ranks' tokens
 *             are read rank after rank) and sends each slot's dx back; the token's rank adds
 *             them into dx in slot order (fp32 rounding from the one-rank sum, which
 *             accumulates the slots' terms into dx directly).
 * Each call is a collective: every rank of the group runs every MoE layer's forward and
 * backward, in the same order, with any number of tokens (0 too). The rows stay in the
 * backend's memory (packed and put back by backend ops: gather_rows, moe_combine_rows,
 * moe_dtopw; only the routes, counts and routing weights visit the host), so the calls run on
 * cuda with a comm on device pointers (NCCL) as on the cpu.
 * Errors (memory, the comm's) are returned, the comm aborted on the failing rank so that the
 * others' exchanges end too; the caller keeps the first (model_acts.ep_rc). */
#ifndef GRPOD_MOE_EP_H
#define GRPOD_MOE_EP_H
#include "engine/model/model.h"

/* The experts of layer l on A->ln2 with A->topi, A->topw: A->ey written; out (T,C) = A->xm +
 * Σ_s w_s ey_s when out is not NULL. */
/* The exchanges' buffers in the backend's memory (model.ep_ws): a plan's and a call's, each
 * grown to the largest call so far and kept until released (moe_ep_ws_release: the memory
 * back, as an update's end gives its activations back to the plan) or model_free
 * (moe_ep_ws_free). */
struct moe_ep_ws {
    void *mem[2];
    size_t cap[2];
};
void moe_ep_ws_release(const model *m);
/* The most a layer's exchange buffers take at T tokens on this rank (a call's workspace): the
 * backward's, with twice this rank's share of rows received (routing is never even), and
 * ws_take's eighth more. eng_acts_reserve keeps it free beside the activations. */
size_t moe_ep_call_bytes(const model *m, long long T);
/* That and the experts' backward scratch on the rows received (kernels/moe_gemm.cu's S (4C + 10
 * Fm) bytes, S = 2 T k: twice this rank's share): what an update keeps free beside its
 * activations at T tokens (engine/plan.c plan_ep_beside). */
size_t moe_ep_beside_bytes(const model *m, long long T);
void moe_ep_ws_free(const model *m);

int moe_ep_fwd(const model *m, const model_layer_views *W, struct model_layer_acts *A, void *out, int T);
/* dx (T,C) += the experts' part of d ln2 for dout (T,C); dtopw (T,k) written; G's expert
 * gradients (this rank's experts; NULL: frozen) += theirs. */
int moe_ep_bwd(const model *m, const model_layer_views *W, const model_layer_views *G, const struct model_layer_acts *A,
               const void *dout, void *dx, float *dtopw, int T);

/* Checkpoints: one whole parameter-shaped vector (the weights, or an optimizer moment) in the
 * layout of `full`, the same config without expert parallelism, which a checkpoint writes and
 * any W reads by name (model_save_host, model_load_host).
 * moe_ep_gather: whole (full->n_elems, host; on rank 0, or on every rank with all; NULL
 * elsewhere) = this rank's replicated parameters and every rank's experts from mine
 * (m->n_elems, host, each rank's). A collective; the experts go through the backend's memory
 * (the comm's) in chunks of 16 MiB a rank.
 * moe_ep_gather_act: the same for act-typed weights in the backend's memory, all of it there:
 * whole (full->n_elems act elements, on every rank) from act (m->n_elems, each rank's), one
 * all-gather per MoE layer and projection straight into place. How rollouts run under expert
 * parallelism (each rank decodes its own groups with the whole model, as without it, rather
 * than dispatching every decode step's tokens, which would step all ranks together).
 * moe_ep_slice: mine = this rank's part of whole (no comm). */
int moe_ep_gather(const model *m, const float *mine, const model *full, float *whole, int all);
int moe_ep_gather_act(const model *m, const void *act, const model *full, void *whole);
void moe_ep_slice(const model *m, const model *full, const float *whole, float *mine);
#endif
