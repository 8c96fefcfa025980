/* tok_driver.c — a stand-alone `tokenize`/`detokenize` for the tokenizer tests, so they do not
 * depend on the daemon binary: `tok_driver tokenize ...` runs tok_cli_tokenize. Built by
 * tests/tokenizer/test_parity.py from the engine's tokenizer sources only. */
#include "common/err.h"
#include "engine/text/chat.h"
#include "engine/format/json.h"
#include "engine/text/tokenizer.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* default-tokenizer DIR: write the default model's tokenizer.json and tokenizer_config.json. */
static int write_default(const char *dir) {
    char path[4096];
    char *files[2] = {tok_default_tokenizer_json(), tok_default_tokenizer_config_json()};
    const char *names[2] = {"tokenizer.json", "tokenizer_config.json"};
    int rc = 0;
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        FILE *f = fopen(path, "w");
        if (!f || !files[i] || fputs(files[i], f) < 0) rc = 1;
        if (f && fclose(f)) rc = 1;
        free(files[i]);
    }
    return rc;
}

/* chat DIR [--gen]: each stdin line is a JSON list of {role, content}; prints the rendered prompt
 * as one JSON string per line (or {"error": ...}). */
static int chat(const char *dir, int gen) {
    tok *t;
    if (tok_load(dir, &t)) {
        fprintf(stderr, "chat: %s\n", err_msg());
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, stdin)) > 0) {
        js_doc *doc;
        const js *v;
        if (js_parse(line, (size_t)len, &doc, &v) || v->type != JS_ARR) {
            fprintf(stderr, "chat: bad line\n");
            return 1;
        }
        chat_msg m[64];
        int n = v->n < 64 ? v->n : 64;
        for (int i = 0; i < n; i++)
            m[i] = (chat_msg){.role = js_get_str(&v->items[i], "role"), .content = js_get_str(&v->items[i], "content")};
        char *out;
        if (chat_render(t, m, n, gen, &out)) {
            printf("{\"error\": ");
            js_write_str(stdout, err_msg(), strlen(err_msg()));
            printf("}\n");
        } else {
            js_write_str(stdout, out, strlen(out));
            putchar('\n');
            free(out);
        }
        js_doc_free(doc);
    }
    free(line);
    tok_free(t);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "tokenize")) return tok_cli_tokenize(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "detokenize")) return tok_cli_detokenize(argc - 1, argv + 1);
    if (argc >= 3 && !strcmp(argv[1], "chat")) return chat(argv[2], argc > 3 && !strcmp(argv[3], "--gen"));
    if (argc == 3 && !strcmp(argv[1], "default-tokenizer")) return write_default(argv[2]);
    fprintf(stderr, "usage: tok_driver tokenize|detokenize ... | default-tokenizer DIR\n");
    return 2;
}
