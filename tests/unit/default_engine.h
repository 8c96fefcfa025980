/* default_engine.h — the unit tests' engine: the embedded default model, written to dir (once),
 * opened on the cpu backend (default_engine_on: another, for the GPU tests). NULL with the
 * reason printed. */
#ifndef GRPOD_TEST_DEFAULT_ENGINE_H
#define GRPOD_TEST_DEFAULT_ENGINE_H

#include <stdio.h>

#include "common/err.h"
#include "engine/engine.h"

static inline eng *default_engine_on(const char *dir, const char *backend) {
    if (eng_ensure_default_model(dir)) {
        printf("default model: %s\n", err_msg());
        return NULL;
    }
    eng *e;
    eng_open_opts o = {.model_dir = dir, .backend = backend};
    return eng_open(&o, &e) ? NULL : e;
}
static inline eng *default_engine(const char *dir) { return default_engine_on(dir, "cpu"); }
#endif
