/* run_config.h — the settings the engine tests of ranks share (tests/unit/test_comm_tcp.c,
 * test_ep.c, tests/gpu/test_ep_cuda.c, test_greedy.c): an update that runs every pass and
 * collective, and rollouts of a fixed length. */
#ifndef GRPOD_TEST_RUN_CONFIG_H
#define GRPOD_TEST_RUN_CONFIG_H
#include "engine/engine.h"

/* GRPO advantages, a k3 KL to the reference at kl_coef (0: no reference pass), an entropy bonus
 * of 0.01, mini-batches of 3 groups; AdamW at lr with the grad-norm clip at clip. */
static inline void grpo_update_config(loss_config *a, eng_optim *o, float lr, float clip, float kl_coef) {
    loss_config_default(a);
    eng_optim_default(o);
    o->lr = lr;
    o->grad_clip = clip;
    a->adv = ADV_GRPO;
    a->kl_coef = kl_coef;
    a->kl = KL_K3;
    a->entropy_coeff = 0.01f;
    a->ppo_mini_batch_size = 3;
}

/* Rollouts of exactly max_tokens tokens (EOS ignored) at temperature (0: greedy) from seed. */
static inline void fixed_sampling(eng_sampling *sp, float temperature, int max_tokens, unsigned long long seed) {
    eng_sampling_default(sp);
    sp->temperature = temperature;
    sp->max_tokens = max_tokens;
    sp->ignore_eos = 1;
    sp->seed = seed;
}
#endif
