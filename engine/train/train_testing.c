/* train_testing.c — the test-only readers of train_testing.h, through the training state
 * (state.h), which knows where each part lives. */
#include "engine/train/train_testing.h"

#include <string.h>

#include "common/err.h"
#include "engine/train/state.h"

int eng_testing_grad(eng *e, float *out) {
    if (!e->grad) return err_set(GE_UNSUPPORTED, "no training state");
    int rc = e->be->sync(e->be);
    return rc ? rc : e->be->to_host(e->be, out, e->grad, (size_t)eng_train_n(e) * 4);
}

int eng_testing_state(eng *e, float *master, float *m, float *v) {
    float *whole[3], *want[3] = {master, m, v};
    int owned[3], moments = m || v;
    if (moments && !e->adam_m) return err_set(GE_UNSUPPORTED, "no training state");
    int rc = e->be->sync(e->be);
    if (!rc) rc = state_whole(e, moments, whole, owned);
    for (int i = 0; i < 3 && !rc; i++)
        if (want[i] && whole[i]) memcpy(want[i], whole[i], (size_t)state_whole_n(e) * 4);
    if (!rc) state_whole_free(whole, owned);
    return rc;
}
