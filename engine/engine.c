/* engine.c — the engine's public entry points (engine.h). Placeholder bodies until the
 * model, rollout and update paths land; each returns GE_UNSUPPORTED with a message. */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

#include "engine/err.h"

int eng_open(const eng_open_opts *o, eng **out) { *out = NULL; return err_set(GE_UNSUPPORTED, "engine not built yet"); }
void eng_close(eng *e) {}
void eng_get_info(eng *e, eng_info *out) { memset(out, 0, sizeof *out); }
int eng_tokenize(eng *e, const char *text, size_t len, int add_special, int **ids, int *n) { return err_set(GE_UNSUPPORTED, "not yet"); }
int eng_detokenize(eng *e, const int *ids, int n, int skip_special, char **text, size_t *len) { return err_set(GE_UNSUPPORTED, "not yet"); }
int eng_render_chat(eng *e, const eng_message *m, int n, int agp, char **text) { return err_set(GE_UNSUPPORTED, "not yet"); }
void eng_sampling_default(eng_sampling *s) {
    memset(s, 0, sizeof *s);
    s->temperature = 1.0f; s->top_p = 1.0f; s->max_tokens = 16;
}
int eng_rollout(eng *e, const eng_rollout_group *g, int ng, const eng_sampling *s, eng_group_result *out,
                eng_progress_cb cb, void *ud) { return err_set(GE_UNSUPPORTED, "not yet"); }
void eng_group_result_free(eng_group_result *r) {}
void eng_optim_default(eng_optim *o) {
    memset(o, 0, sizeof *o);
    o->lr = 1e-6f; o->weight_decay = 0.01f; o->beta1 = 0.9f; o->beta2 = 0.999f; o->eps = 1e-8f; o->grad_clip = 1.0f;
}
int eng_update(eng *e, const eng_update_group *g, int ng, const loss_config *a, const eng_optim *o, long long mt,
               eng_update_result *out, eng_progress_cb cb, void *ud) { return err_set(GE_UNSUPPORTED, "not yet"); }
int eng_logprobs(eng *e, const eng_update_group *g, int ng, int ref, float t, long long mt, float ***out) { return err_set(GE_UNSUPPORTED, "not yet"); }
void eng_logprobs_free(float **out, const eng_update_group *g, int ng) {}
int eng_checkpoint_save(eng *e, const char *dir) { return err_set(GE_UNSUPPORTED, "not yet"); }
