/* tok_driver.c — a stand-alone `tokenize`/`detokenize` for the tokenizer tests, so they do not
 * depend on the daemon binary: `tok_driver tokenize ...` runs tok_cli_tokenize. Built by
 * tests/tokenizer/test_parity.py from the engine's tokenizer sources only. */
#include "engine/tokenizer.h"
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

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "tokenize")) return tok_cli_tokenize(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "detokenize")) return tok_cli_detokenize(argc - 1, argv + 1);
    if (argc == 3 && !strcmp(argv[1], "default-tokenizer")) return write_default(argv[2]);
    fprintf(stderr, "usage: tok_driver tokenize|detokenize ... | default-tokenizer DIR\n");
    return 2;
}
