/* loaded_model.h — the unit tests' model from a checkpoint folder (tests/fixtures/data/...):
 * config, a cpu backend of its own, the model and its weights as host fp32 with views on them.
 * Failures are CHECKs (check.h). */
#ifndef GRPOD_TEST_LOADED_MODEL_H
#define GRPOD_TEST_LOADED_MODEL_H

#include <stdlib.h>

#include "check.h"
#include "common/err.h"
#include "engine/model/model.h"

typedef struct {
    model_config cfg;
    eng_backend *be;
    model m;
    float *w;
    model_views wv;
} loaded;

static inline void loaded_open(loaded *x, const char *dir) {
    CHECK_MSG(config_load(dir, &x->cfg) == 0, "%s", err_msg());
    backend_cpu_create(&x->be, 0);
    CHECK(model_init(&x->m, &x->cfg, x->be) == 0);
    x->w = malloc((size_t)x->m.n_elems * 4);
    CHECK_MSG(model_load_host(&x->m, dir, x->w) == 0, "%s", err_msg());
    model_views_make(&x->m, x->w, 4, &x->wv);
}

static inline void loaded_close(loaded *x) {
    free(x->w);
    model_views_free(&x->wv);
    model_free(&x->m);
    x->be->destroy(x->be);
}
#endif
