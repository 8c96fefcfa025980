/* default_model.c — grpod's embedded default: a tiny Qwen3-architecture model with a
 * byte-level tokenizer, made once from a fixed seed so that `make run` needs no download.
 * It is an ordinary Hugging Face directory (config.json, model.safetensors, tokenizer.json,
 * tokenizer_config.json), readable by transformers. Weights follow transformers' init:
 * normal(0, 0.02) matrices, unit norm weights. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "engine/engine.h"
#include "engine/model/model.h"
#include "engine/text/tokenizer.h"

enum { DEFAULT_SEED = 20261122 };

/* Box-Muller over a 64-bit LCG: deterministic across machines. */
static double gauss(unsigned long long *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    double u1 = ((*s >> 11) + 1.0) / 9007199254740993.0;
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    double u2 = (*s >> 11) / 9007199254740992.0;
    return sqrt(-2.0 * log(u1)) * cos(2 * M_PI * u2);
}

static int write_str(const char *dir, const char *name, const char *text) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return err_set(GE_IO, "%s: cannot create: %s", path, strerror(errno));
    int ok = fputs(text, f) >= 0;
    if (fclose(f) || !ok) return err_set(GE_IO, "%s: write failed", path);
    return 0;
}

int eng_ensure_default_model(const char *dir) {
    char path[PATH_MAX], tmp[PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (access(path, R_OK) == 0) return 0;
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
    if (mkdir(tmp, 0755) && errno != EEXIST) return err_set(GE_IO, "%s: cannot create: %s", tmp, strerror(errno));
    char *tj = tok_default_tokenizer_json(), *tc = tok_default_tokenizer_config_json();
    tok *t = NULL;
    int rc = tj && tc ? 0 : err_set(GE_NOMEM, "default model: out of memory");
    if (!rc) rc = write_str(tmp, "tokenizer.json", tj);
    if (!rc) rc = write_str(tmp, "tokenizer_config.json", tc);
    if (!rc) rc = tok_load(tmp, &t);
    model_config c = {
        .arch = ARCH_QWEN3,
        .arch_name = "qwen3",
        .L = 4,
        .C = 128,
        .H = 4,
        .K = 2,
        .D = 32,
        .F = 384,
        .max_pos = 4096,
        .eps = 1e-6f,
        .rope_theta = 1e6f,
        .tied = 1,
        .qk_norm = 1,
        .bos_id = -1,
        .dtype = "float32",
    };
    if (!rc) {
        c.V = tok_vocab_size(t);
        const char *eos = tok_eos(t);
        c.eos_ids[0] = eos ? tok_token_id(t, eos) : c.V - 1;
        c.n_eos = 1;
        rc = config_write(tmp, &c);
    }
    model m = {0};
    eng_backend *be = NULL;
    float *w = NULL;
    if (!rc) rc = backend_cpu_create(&be, 0);
    if (!rc) rc = model_init(&m, &c, be);
    if (!rc && !(w = calloc((size_t)m.n_elems, sizeof(float)))) rc = err_set(GE_NOMEM, "default model: out of memory");
    if (!rc) {
        unsigned long long s = DEFAULT_SEED;
        for (int i = 0; i < m.n_params; i++) {
            const model_param *p = &m.params[i];
            for (long long j = 0; j < p->numel; j++) w[p->off + j] = p->ndim == 1 ? 1.0f : (float)(0.02 * gauss(&s));
        }
        rc = model_save_host(&m, tmp, w, 0);
    }
    if (!rc && rename(tmp, dir)) rc = err_set(GE_IO, "%s: cannot rename to %s: %s", tmp, dir, strerror(errno));
    free(w);
    if (m.params) model_free(&m);
    if (be) be->destroy(be);
    if (t) tok_free(t);
    free(tj);
    free(tc);
    return rc;
}
