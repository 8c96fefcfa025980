/* engine_testing.h — for tests only: what an engine object holds (its model, its weights, its
 * backend's tuning knobs), read without reaching into struct eng. Never called by the daemon.
 * Copies go to host memory the caller owns; the engine thread calls these, like every eng_*
 * call. The training state (gradients, master, moments) is engine/train/train_testing.h. */
#ifndef GRPOD_ENGINE_TESTING_H
#define GRPOD_ENGINE_TESTING_H
#include "engine/engine.h"
#include "engine/model/model.h"
#include "kernels/tune.h"

typedef struct {
    long long n_params; /* elements of the model's weights (eng_testing_weights) */
    long long n_train; /* trainable elements: the adapters' with LoRA, else n_params */
    long long n_lora_a; /* with LoRA: the first n_lora_a of n_train are the A matrices */
    int offload; /* 1: master and moments in host memory (optimizer offload) */
    int own_reference; /* 1: a frozen reference copy of its own (0 with LoRA: the base is it) */
    int rank, world; /* this rank and the world size (0 and 1 without a comm) */
    long long dec_grad_bytes, dec_own_bytes; /* expert parallelism: the decode views' expert
                                              * stacks in the gradient buffer, in their own */
    int host_peers; /* the other ranks on this rank's host, as the memory plan counts them */
    long long ep_empty; /* expert parallelism: the empty passes its lock-step ran (train/ep.c) */
    const model *m; /* the model: its parameters' names, shapes and offsets into the
                                 * flat vectors (params[p].off; with LoRA lparams, A before B) */
} eng_testing_info;

void eng_testing_get(eng *e, eng_testing_info *out);
/* The act-typed weights (bf16 on cuda; fp32 on cpu, bit for bit) as fp32, (n_params). */
int eng_testing_weights(eng *e, float *out);
/* The weights rollouts decode with, as fp32: under expert parallelism the decode views' (every
 * expert, in the layout without it: that model's n_elems), else eng_testing_weights'. */
int eng_testing_dec_weights(eng *e, float *out);
/* plan.c's refusal of full-parameter training on a device of dev_total bytes (engine_internal.h
 * plan_full_fits), for a test without such a device. */
int eng_testing_full_fits(long long n, int act_bytes, long long dev_total, const char *dev_name);
/* plan.c's refusal of host state (optimizer offload) beyond a host's available memory
 * (engine_internal.h plan_host_state_fits), for a test without such a host. */
int eng_testing_host_state_fits(long long need, int ranks, long long avail);
/* plan.c's auto split of the optimizer state (engine_internal.h plan_split_fits), for a test
 * without such a device and host. */
int eng_testing_split_fits(long long n, int act_bytes, long long fr, long long avail, long long mb, long long *host_n);
/* What an update keeps free beside its activations at T tokens under expert parallelism when the
 * backend already holds `held` bytes of ops' scratch (engine_internal.h plan_ep_beside). */
long long eng_testing_ep_beside(const eng *e, long long T, size_t held);
/* The gradient activations' checkpointed layers forced to n (-1: chosen by memory, the default),
 * for a test of ranks whose memory chose differently. */
void eng_testing_acts_ckpt(eng *e, int n);
/* The backend's tuning knobs (kernels/tune.h), which a test may change between calls. */
tune_opts *eng_testing_tune(eng *e);
#endif
