/* mask_bench.c — host time of one guided-decoding mask (engine/text/json_grammar.h jg_mask) over
 * a tokenizer's whole vocabulary, for five states of a tool call's arguments, without and with a
 * schema (min of 60 runs per state). Not part of the build (its tokenizer links pcre2):
 *   make CUDA=0 BUILD=build/cpu build/cpu/libengine.a
 *   cc -O2 -I. -o /tmp/mask_bench tools/mask_bench.c build/cpu/libengine.a -fopenmp -pthread -lm -lpcre2-8
 *   /tmp/mask_bench ../shared/data/tokenizers/qwen3 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/text/json_grammar.h"
#include "engine/text/tokenizer.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    tok *t;
    jg_vocab *v;
    jg_schema *sc;
    if (argc < 2 || tok_load(argv[1], &t)) return fprintf(stderr, "usage: mask_bench TOKENIZER_DIR\n"), 2;
    int V = tok_vocab_size(t), end[1] = {0};
    const char *schema = "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"unit\": {\"enum\": "
                         "[\"c\", \"f\"]}, \"n\": {\"type\": \"integer\"}}, \"required\": [\"city\"]}";
    const char *pre[] = {"", "{", "{\"city\": \"Par", "{\"city\": \"Paris\"", "{\"city\": \"Paris\", \"n\": 1"};
    if (jg_vocab_build(t, V, &v) || jg_schema_compile(schema, strlen(schema), &sc)) return 1;
    uint32_t *m = malloc(sizeof *m * (size_t)((V + 31) / 32));
    printf("vocabulary %d; ms per mask, min of 60, at: start | { | in a string | after it | after a number\n", V);
    for (int use = 0; use < 2; use++) {
        jg_spec g;
        jg_spec_init(&g, 1, "}");
        g.schema = use ? sc : NULL;
        double best[5] = {1e9, 1e9, 1e9, 1e9, 1e9}, tot = 0;
        for (int r = 0; r < 60; r++)
            for (int i = 0; i < 5; i++) {
                jg_state s;
                jg_start(&g, &s);
                jg_feed(&g, &s, pre[i], strlen(pre[i]));
                double t0 = now();
                jg_mask(&g, &s, v, 100, end, 1, m);
                if (now() - t0 < best[i]) best[i] = now() - t0;
            }
        printf("%-9s", use ? "schema" : "no schema");
        for (int i = 0; i < 5; i++) printf(" %.3f", best[i] * 1e3), tot += best[i];
        printf("  mean %.3f\n", tot * 1e3 / 5);
    }
    free(m);
    jg_schema_free(sc);
    jg_vocab_free(v);
    tok_free(t);
    return 0;
}
