/* tok_driver.c — a stand-alone `tokenize`/`detokenize` for the tokenizer tests, so they do not
 * depend on the daemon binary: `tok_driver tokenize ...` runs tok_cli_tokenize. Built by
 * tests/tokenizer/test_parity.py from the engine's tokenizer sources only. */
#include "engine/tokenizer.h"
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "tokenize")) return tok_cli_tokenize(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "detokenize")) return tok_cli_detokenize(argc - 1, argv + 1);
    fprintf(stderr, "usage: tok_driver tokenize|detokenize ...\n");
    return 2;
}
