/* state.h — the training state: what an update changes, and the one place that knows where
 * each part of it lives.
 *
 *   part                      device (default)     host (optimizer offload)   shard (a comm of W ranks)
 *   fp32 master, AdamW m, v   backend memory       host memory                this rank's 1/W (device or host)
 *   fp32 gradients            backend memory       backend memory             whole, padded to W shards
 *   act-typed weights         backend memory       backend memory             whole; the rank steps its shard,
 *                                                                             then all are gathered
 * With --optimizer-moments bf16 (eng_open_opts.optimizer_moments; host memory only) m and v are
 * held as bf16 bits (adamw_m16_cpu): 8 bytes a parameter of host state, not 12; checkpoints and
 * every function below still see them as fp32 (exact: bf16 widens exactly, and a value read
 * back rounds to itself).
 * A split (one rank, no comm; --optimizer-offload FRACTION, or auto when the host cannot hold all
 * of it, engine/plan.c): elements [0, d) of the master and moments in backend memory, stepped by
 * be->adamw, [d, n) in host memory, stepped by the offload (offload.h); the act weights whole
 * (apart from the master, on cpu too). Each function below handles the two parts.
 * With expert parallelism (a comm, engine/train/ep.c) each rank's vectors end with its experts,
 * whose gradients, master and moments the rank holds whole (after its shard), never summed.
 * The trainable parameters are the model's (full fine-tuning) or the adapters' (LoRA; one rank,
 * no offload). The update's safety copy of this state is snapshot.h; the memory plan that places
 * it is engine/plan.c. The update (update.c) and the checkpoints (checkpoint.c) call these and
 * never ask where the state lives. With a comm every rank calls each function, in the same
 * order, and each returns the same result on every rank. Only the engine thread calls these. */
#ifndef GRPOD_TRAIN_STATE_H
#define GRPOD_TRAIN_STATE_H
#include "engine/engine_internal.h"

/* The parts of the trainable vector this rank steps: elements [vec, vec + n) of the vector
 * (weights, gradients), held at element st of the master and moments. One (all of it, or with a
 * comm this rank's shard), or two with expert parallelism (the replicated shard, then this
 * rank's experts, engine/train/ep.c). Returns the count. */
typedef struct {
    long long vec, st, n;
} state_piece;
int state_pieces(const eng *e, state_piece p[2]);
/* At open, before the weights are read (full-parameter training): GE_NOMEM, saying what to do,
 * when one rank's device cannot hold the whole model's policy, reference and gradients (with a
 * comm each rank's state is a shard: the plan checks it once placed). */
int state_fits(eng *e, const char *model_dir);
/* At open (full-parameter training): the fp32 master and the act-typed weights from the
 * weights loaded (or resumed) as host fp32 (host: the model's n_elems, experts after the
 * replicated elements), placed where the plan's offload choice (offload_mode: eng_open_opts'
 * optimizer_offload) and the comm put them; the shard geometry (sh_n, sh_off, ep_n) is set here.
 * With a comm and offload the buffer becomes this rank's master (*host set to NULL; the caller
 * frees *host after). 0, GE_NOMEM, GE_UNSUPPORTED or the backend's error. */
int state_open(eng *e, float **host, const char *offload_mode);
/* Frees the master and moments where they live and the offload's buffers (eng_close; the act
 * weights and gradients are the engine's, freed by it before). */
void state_free(eng *e);
/* The memory plan's rows of the state (p->weights, gradients, master, moments, host_state,
 * optimizer): what it occupies, and where. Returns 1 when the master and moments are in device
 * memory (a backend that reports it), 0 when in host memory. */
int state_footprint(const eng *e, eng_plan *p);
/* Gradients and moments (zeroed), made once (the plan calls it at open); 0 or GE_NOMEM. */
int state_alloc(eng *e);
/* Zeroes the gradients before a mini-batch's micro-batches accumulate into them. */
void state_grad_zero(eng *e);
/* After the micro-batches (rc: this rank's result so far): the gradient made the one the state
 * steps (LoRA's B part scaled: its parametrization, lora.h), the backend synced, and with a comm
 * every rank's gradients summed into each rank's shard, once every rank passed. */
int state_grad_reduce(eng *e, int rc);
/* The global gradient norm squared (shards' sums in rank order with a comm). */
int state_grad_sumsq(eng *e, double *ss);
void state_grad_scale(eng *e, float s);
/* One AdamW step over the state with lr; the act weights rewritten from the new master (with a
 * comm, gathered from every rank's shard). 0 or the backend's, the offload's or the comm's error. */
int state_step(eng *e, const eng_optim *opt, float lr);
/* After the master was written from elsewhere (a restore; rc: the result so far): this rank's act
 * weights from it, then with a comm every rank's gathered. rc, or the backend's or comm's error. */
int state_act_from_master(eng *e, int rc);
/* Whether the last step left any master weight (*bad_w) or second moment (*bad_v) not finite, on
 * any rank (a step can overflow them): the parts in host memory as their step counted them
 * (offload.h eng_offload.bad, no second pass), the others by the backend's sum of squares. */
int state_check_after_step(eng *e, int *bad_w, int *bad_v);
/* Bytes of master and moments an element of the state holds: 12, or 8 with bf16 moments. */
int state_elem_bytes(const eng *e);
/* Elements of the whole trainable vector as the checkpoints hold it: eng_train_n, or with expert
 * parallelism every expert's (the model without it, engine/train/ep.c). */
long long state_whole_n(const eng *e);
/* The whole master, m and v as host fp32 (state_whole_n each) on rank 0, for a checkpoint: out[i]
 * points into the state itself where it is host memory of one rank, else into buffers this
 * allocates (owned[i] = 1; free them with state_whole_free). Other ranks get NULLs. moments = 0:
 * the master only. */
int state_whole(eng *e, int moments, float *out[3], int owned[3]);
void state_whole_free(float *out[3], const int owned[3]);
/* A checkpoint's moments into the state: state_moments_in gives two host buffers of
 * eng_train_n floats to read the whole m and v into (the state's own where it is host memory
 * of one rank: no copy), state_set_moments takes this rank's part of them and frees what
 * state_moments_in allocated. */
int state_moments_in(eng *e, float *buf[2], int owned[2]);
int state_set_moments(eng *e, float *buf[2], const int owned[2]);
#endif
