/* engine_testing.c — the test-only readers of engine_testing.h. */
#include "engine/engine_testing.h"

#include <string.h>

#include "engine/engine_internal.h"

void eng_testing_get(eng *e, eng_testing_info *out) {
    memset(out, 0, sizeof *out);
    out->n_params = e->m.n_elems;
    out->n_train = eng_train_n(e);
    out->n_lora_a = e->m.l_elems_a; /* 0 without LoRA */
    out->offload = e->offload;
    out->own_reference = e->ref_act != NULL;
    out->rank = e->rank;
    out->world = e->W;
    out->dec_in_grad = e->ep_dact && e->ep_dact == (void *)e->grad;
    out->m = &e->m;
}

int eng_testing_weights(eng *e, float *out) {
    int rc = e->be->sync(e->be);
    return rc ? rc : e->be->act_to_f32(e->be, out, e->w_act, (size_t)e->m.n_elems);
}

int eng_testing_dec_weights(eng *e, float *out) {
    int rc = e->be->sync(e->be);
    const void *w = e->ep_full ? e->ep_dact : e->w_act;
    return rc ? rc : e->be->act_to_f32(e->be, out, w, (size_t)eng_dec_model(e)->n_elems);
}

tune_opts *eng_testing_tune(eng *e) { return &e->be->tune; }

int eng_testing_full_fits(long long n, int act_bytes, long long dev_total, const char *dev_name) {
    return plan_full_fits(n, act_bytes, dev_total, dev_name, "MODEL");
}
