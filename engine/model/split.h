/* split.h — one prompt group too large for a micro-batch, in three phases:
 *
 *   A  the prompt's forward once (P tokens, one graph). Each layer's prompt K/V stay in a KV
 *      cache on the device (the hot set, read by every response). The rest of what the prompt's
 *      backward reads (the dormant set) stays on the device when it fits; otherwise (or when
 *      asked) it moves to host memory layer by layer as the forward goes and comes back layer
 *      by layer ahead of the backward, and only `ring` layers of it are on the device at a time
 *      (3, fetching two layers ahead, when the free device memory holds them; else 2). When
 *      neither holds it, each layer keeps its input only (on the device, else through host
 *      memory as above) and runs its forward again in C.
 *   B  the responses, in micro-batches of at most max_tokens response tokens: each attends to
 *      the cached prompt K/V (cache rows [0, P)) and causally to itself (rows P + its tokens);
 *      forward, loss, backward. The gradient of every prompt K/V row accumulates in fp32 dK/dV
 *      sums.
 *   C  the prompt's backward once, its dormant set brought back a few layers ahead of use, dK/dV
 *      cast once from the sums, its own attention backward adding its keys' gradients to them.
 *
 * Hybrid models (gated DeltaNet layers): a DeltaNet layer's past is its recurrent state and
 * conv tail, not K/V rows. A writes each such layer's final state and tail (the carry, model.h
 * model_dn_carry: fp32, beside the hot set); every response micro-batch in B starts from them and
 * adds their gradients into fp32 sums; C's DeltaNet backwards take the sums as the gradient of the
 * prompt's last state and last conv inputs.
 *
 * The prompt's last token predicts each response's first token: those N predictions are made
 * in A and back-propagated in C. The backward is linear in its incoming gradients, so this
 * equals the one-graph packed layout (and the standard one) up to rounding. The forward-only
 * form (old and reference passes) is A and B's forwards on a KV cache.
 * Per-token arrays are in response order (response r's tokens at off_r = R_0 + .. + R_{r-1}),
 * as the one-graph layout's out_* are. Only the engine thread calls these (backend rule).
 * Legend: P prompt tokens, N responses, R response tokens, L layers. */
#ifndef GRPOD_SPLIT_H
#define GRPOD_SPLIT_H
#include "engine/model/model.h"
#include "engine/model/pack.h"

/* Host memory for the dormant set, kept between calls (pinning tens of GB takes seconds): the
 * caller owns it, starts it zeroed and frees it with split_mem_free. */
typedef struct {
    void *host;
    size_t bytes;
} split_mem;
void split_mem_free(eng_backend *be, split_mem *s);

/* split_opts.offload, where the dormant set goes: kept on the device; through host memory;
 * recomputed (each layer keeps its input, C values a token, and runs its forward again before
 * its backward in C: one more prompt forward less the down projections, the same gradients);
 * recomputed with the inputs through host memory. */
enum { SPLIT_DEVICE, SPLIT_HOST, SPLIT_RECOMPUTE, SPLIT_RECOMPUTE_HOST };

typedef struct {
    long long max_tokens; /* response tokens per micro-batch (each R_r <= max_tokens) */
    float temperature;
    int offload; /* SPLIT_DEVICE .. SPLIT_RECOMPUTE_HOST; -1: the first of them that fits */
    split_mem *mem; /* NULL: host memory allocated for the call */
    /* NULL, or called before each pass over the layers with its kind (model.h MODEL_PASS_*): under
     * expert parallelism the ranks' passes meet there (engine/train/ep.c ep_gate); nonzero stops */
    int (*gate)(void *ud, int kind);
    void *gate_ud;
} split_opts;

typedef struct {
    int n_micro; /* response micro-batches */
    int offloaded; /* the dormant set (or the layers' inputs) went to host memory */
    int ring; /* then: its layers on the device at a time (2 or 3: by free memory) */
    int recomputed; /* the layers' inputs were kept, the rest recomputed */
    double hot_mib, dormant_mib; /* prompt K/V (+ dK/dV when training); prompt saved activations (all layers) */
    double ms_prompt_fwd, ms_resp, ms_prompt_bwd; /* phases A, B, C (each ends in a sync) */
    double ms_host_alloc; /* of phase A: allocating (pinning) the dormant set's host memory */
} split_stats;

/* Response micro-batches of g: first[k] .. first[k + 1] for k < return value (first: N + 1). */
int split_resp_batches(const pack_group *g, long long max_tokens, int *first);

/* Forward only: logprobs (and entropies when ent != NULL) of g's response tokens (ΣR each).
 * st may be NULL. A prompt's length is limited by the model's context (P + the longest R) and
 * by the memory of its hot set: GE_TOO_LARGE naming which. */
int split_forward(const model *m, const model_views *w, const pack_group *g, const split_opts *o, float *logp, float *ent,
                  split_stats *st);

/* loss(ud, r0, r1): logp (and ent) of responses [r0, r1) are written; fill their dlogp (and
 * dent when not NULL) = d loss / d logp. Nonzero return stops the step with that code. */
typedef int (*split_loss_cb)(void *ud, int r0, int r1);

/* Forward, loss and backward of g: the gradients of the loss (through dlogp, dent) are ADDED
 * into the fp32 views g_out. logp, ent, dlogp, dent: (ΣR); ent and dent may be NULL. */
int split_train(const model *m, const model_views *w, const model_views *g_out, const pack_group *g, const split_opts *o,
                float *logp, float *ent, float *dlogp, float *dent, split_loss_cb loss, void *ud, split_stats *st);
#endif
