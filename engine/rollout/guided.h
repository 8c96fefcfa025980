/* guided.h — constrained decoding in the scheduler (rollout.c): a job's grammar from its
 * sampling (eng_sampling.guided), each response's grammar state, and the allow masks of a step
 * (kernels/sampling.h), one per guided row. The masks are computed on the host from the
 * engine's token bytes (engine/text/json_grammar.h, built once per engine) and go to the
 * device with the step, so the same path serves the cpu and cuda backends.
 * Threading: the engine thread (the scheduler's). */
#ifndef GRPOD_GUIDED_H
#define GRPOD_GUIDED_H
#include <stdint.h>

#include "engine/text/json_grammar.h"

typedef struct eng eng;

/* A step's masks: n of them, W words each. Owned by the scheduler. */
typedef struct {
    uint32_t *m;
    int n, cap, W;
} gd_masks;
void gd_masks_free(gd_masks *k);

/* The grammar of a job whose sampling has guided (*out NULL when it has none): malloc'd, or
 * GE_UNSUPPORTED when the model has no tokenizer. Builds the engine's token bytes once. */
int gd_spec_of(eng *e, int guided, const char *suffix, const char *schema, jg_spec **out);
void gd_spec_free(jg_spec *g); /* with its schema */
/* The next mask of the step for a row in state st with `left` tokens left (this one included)
 * and end ids end[0, n_end): its index + 1 (a sample_params.allow), or < 0 (out of memory). */
int gd_row(eng *e, gd_masks *k, const jg_spec *g, const jg_state *st, int left, const int *end, int n_end);
/* The state after token id (an end id or another special token changes nothing). */
void gd_advance(eng *e, const jg_spec *g, jg_state *st, int id);
#endif
