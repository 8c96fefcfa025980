/* train_testing.h — for tests only: the training state of an engine (gradients, fp32 master,
 * AdamW moments) read out as host fp32, wherever state.h placed it, so that a test checks an
 * update without reaching into struct eng. Never called by the daemon. Copies go to host memory
 * the caller owns; the engine thread calls these. The vectors follow the trainable parameters'
 * layout (engine_testing.h: the model's params, or with LoRA the adapters' lparams). */
#ifndef GRPOD_TRAIN_TESTING_H
#define GRPOD_TRAIN_TESTING_H
#include "engine/engine_testing.h"

/* The gradients the last update left, (n_train): with a comm, only this rank's shard is the sum
 * over the ranks. GE_UNSUPPORTED when the engine has no training state (no_training). */
int eng_testing_grad(eng *e, float *out);
/* The whole fp32 master and AdamW m, v, (n_train) each; NULL skips one. With a comm every rank
 * calls it (the shards are gathered) and only rank 0's buffers are written; with expert
 * parallelism in the layout without it (every expert: one rank's n_params). */
int eng_testing_state(eng *e, float *master, float *m, float *v);
#endif
