/* tune.c — a backend's tuning knobs (kernels/tune.h) from the GRPOD_TUNE_* environment, read
 * once when the backend is created. An unknown GRPOD_TUNE_ name or a value out of range is an
 * error naming the variable (a typo never silently leaves the default in place). */
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "engine/backend/backend.h"

extern char **environ;

#define TUNE_PREFIX "GRPOD_TUNE_"
enum { TUNE_WORDS = 4 };

/* One knob: its name after the prefix, where it goes, the accepted words and their values. */
typedef struct {
    const char *name;
    int *field;
    const char *words[TUNE_WORDS];
    int values[TUNE_WORDS];
} tune_knob;

int tune_from_env(tune_opts *t) {
    *t = tune_defaults();
    int attn = (int)t->attn;
    const tune_knob knobs[] = {
        {"GRAPHS", &t->graphs, {"0", "1"}, {0, 1}},
        {"PDL", &t->pdl, {"0", "1"}, {0, 1}},
        {"ATTN_DECODE", &t->attn_decode, {"0", "1"}, {0, 1}},
        {"ATTN", &attn, {"auto", "simt"}, {TUNE_ATTN_AUTO, TUNE_ATTN_SIMT}},
        {"SKINNY", &t->skinny, {"auto", "0", "1"}, {TUNE_SKINNY_AUTO, TUNE_SKINNY_OFF, TUNE_SKINNY_FORCE}},
        {"MOE", &t->moe, {"auto", "tiles", "grouped", "cublas"}, {TUNE_MOE_AUTO, TUNE_MOE_TILES, TUNE_MOE_GROUPED, TUNE_MOE_CUBLAS}},
        {"EXACT", &t->exact, {"0", "1"}, {0, 1}},
        {"DELTANET", &t->deltanet, {"chunked", "recurrent"}, {TUNE_DN_CHUNKED, TUNE_DN_RECURRENT}},
    };
    const size_t nk = sizeof knobs / sizeof knobs[0], np = strlen(TUNE_PREFIX);
    for (char **e = environ; e && *e; e++) {
        if (strncmp(*e, TUNE_PREFIX, np)) continue;
        const char *name = *e + np, *eq = strchr(name, '=');
        if (!eq) continue;
        const tune_knob *k = NULL;
        for (size_t i = 0; i < nk && !k; i++)
            if (strlen(knobs[i].name) == (size_t)(eq - name) && !strncmp(knobs[i].name, name, (size_t)(eq - name))) k = &knobs[i];
        if (!k)
            return err_set(GE_INVALID,
                           "unknown tuning knob %.*s (GRPOD_TUNE_: GRAPHS, PDL, ATTN_DECODE, ATTN, SKINNY, MOE, EXACT, DELTANET)",
                           (int)(eq - *e), *e);
        int j = 0;
        while (j < TUNE_WORDS && k->words[j] && strcmp(k->words[j], eq + 1)) j++;
        if (j == TUNE_WORDS || !k->words[j]) {
            char ok[48] = "";
            for (int w = 0; w < TUNE_WORDS && k->words[w]; w++)
                snprintf(ok + strlen(ok), sizeof ok - strlen(ok), "%s%s", w ? "|" : "", k->words[w]);
            return err_set(GE_INVALID, "%s%s=%s: expected %s", TUNE_PREFIX, k->name, eq + 1, ok);
        }
        *k->field = k->values[j];
    }
    t->attn = (tune_attn)attn;
    return 0;
}
