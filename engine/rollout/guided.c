/* guided.c — see guided.h. */
#include "engine/rollout/guided.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/engine_internal.h"

void gd_masks_free(gd_masks *k) {
    free(k->m);
    *k = (gd_masks){0};
}

void gd_spec_free(jg_spec *g) {
    if (g) jg_schema_free((jg_schema *)g->schema);
    free(g);
}

int gd_spec_of(eng *e, int guided, const char *suffix, const char *schema, jg_spec **out) {
    *out = NULL;
    if (guided == ENG_GUIDED_NONE) return 0;
    if (!e->tok) return err_set(GE_UNSUPPORTED, "sampling.guided needs the model's tokenizer (tokenizer.json)");
    int V = eng_dec_model(e)->cfg.V, rc;
    if (!e->jg_vocab && (rc = jg_vocab_build(e->tok, V, &e->jg_vocab))) return rc;
    jg_spec *g = malloc(sizeof *g);
    if (!g) return err_set(GE_NOMEM, "guided decoding: out of memory");
    jg_schema *sc = NULL;
    if ((rc = jg_spec_init(g, guided == ENG_GUIDED_OBJECT, suffix)) ||
        (schema && (rc = jg_schema_compile(schema, strlen(schema), &sc)))) {
        free(g);
        return schema && rc == GE_INVALID ? err_set(GE_INVALID, "sampling.guided_schema: %s", err_msg()) : rc;
    }
    g->schema = sc;
    *out = g;
    return 0;
}

int gd_row(eng *e, gd_masks *k, const jg_spec *g, const jg_state *st, int left, const int *end, int n_end) {
    int W = (eng_dec_model(e)->cfg.V + 31) / 32;
    if (k->n == k->cap || k->W != W) {
        int cap = k->W == W && k->cap ? 2 * k->cap : 16;
        uint32_t *m = realloc(k->W == W ? k->m : NULL, sizeof *m * (size_t)cap * W);
        if (!m) return err_set(GE_NOMEM, "guided decoding: out of memory for %d masks", cap);
        if (k->W != W) free(k->m), k->n = 0;
        k->m = m, k->cap = cap, k->W = W;
    }
    jg_mask(g, st, e->jg_vocab, left, end, n_end, k->m + (size_t)k->n * W);
    return ++k->n;
}

void gd_advance(eng *e, const jg_spec *g, jg_state *st, int id) {
    size_t n;
    const char *b = tok_token_bytes(e->tok, id, &n);
    if (b && !tok_is_special(e->tok, id)) jg_feed(g, st, b, n); /* outside the grammar (no mask allows that): only the end */
}
