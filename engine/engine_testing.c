/* engine_testing.c — the test-only readers of engine_testing.h. */
#include "engine/engine_testing.h"

#include <string.h>

#include "common/err.h"

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
    out->dec_grad_bytes = e->ep_dec_grad;
    out->dec_own_bytes = e->ep_dec_own;
    out->host_peers = e->host_peers;
    out->ep_empty = e->ep_empty;
    out->m = &e->m;
}

int eng_testing_weights(eng *e, float *out) {
    int rc = e->be->sync(e->be);
    return rc ? rc : e->be->act_to_f32(e->be, out, e->w_act, (size_t)e->m.n_elems);
}

int eng_testing_dec_weights(eng *e, float *out) {
    int rc = e->be->sync(e->be);
    if (rc || !e->ep_full) return rc ? rc : e->be->act_to_f32(e->be, out, e->w_act, (size_t)e->m.n_elems);
    const model *f = e->ep_full; /* parameter by parameter from where the decode views hold it */
    memset(out, 0, (size_t)f->n_elems * sizeof(float));
    for (int i = 0; i < f->n_params && !rc; i++) {
        const void *w = ep_decode_param(e, &f->params[i]);
        rc = w ? e->be->act_to_f32(e->be, out + f->params[i].off, w, (size_t)f->params[i].numel)
               : err_set(GE_INTERNAL, "decode views: no %s", f->params[i].name);
    }
    return rc;
}

tune_opts *eng_testing_tune(eng *e) { return &e->be->tune; }

int eng_testing_full_fits(long long n, int act_bytes, long long dev_total, const char *dev_name) {
    return plan_full_fits(n, act_bytes, dev_total, dev_name, "MODEL");
}

int eng_testing_host_state_fits(long long need, int ranks, long long avail) { return plan_host_state_fits(need, ranks, avail); }
int eng_testing_split_fits(long long n, int act_bytes, long long fr, long long avail, long long mb, long long *host_n) {
    return plan_split_fits(n, act_bytes, fr, avail, mb, "the device", host_n);
}
long long eng_testing_ep_beside(const eng *e, long long T, size_t held) { return plan_ep_beside(e, T, held); }
void eng_testing_acts_ckpt(eng *e, int n) { e->test_ckpt = n + 1; }
