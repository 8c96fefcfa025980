/* main.c — grpod's one binary: subcommand dispatch, and the small model subcommands
 * (info, logprobs). The daemon is `serve` (daemon/serve.c); tokenize/detokenize live beside
 * the tokenizer. Exit codes: 0 ok, 1 runtime error (one line on stderr), 2 usage. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/version.h"
#include "daemon/serve.h"
#include "engine/engine.h"
#include "engine/text/tokenizer.h"

#define DEFAULT_DATA_DIR "./grpod-data"

static const char *usage_top =
    "grpod — GPU back end for GRPO-family RL post-training (C + CUDA)\n"
    "\n"
    "usage: grpod COMMAND [options]   (grpod COMMAND --help for each)\n"
    "\n"
    "commands:\n"
    "  serve        run the daemon: HTTP+JSON API, durable job queue, rollouts and updates\n"
    "  info         print a model's architecture, dimensions, parameter count and dtype\n"
    "  logprobs     print the logprob of each token given the ones before it (JSON)\n"
    "  tokenize     print the token ids of a text (JSON array)\n"
    "  detokenize   print the text of token ids\n"
    "  --version    print the version and the backends this binary has\n"
    "\n"
    "With no --model, commands use the embedded default (a tiny Qwen3 with a byte-level\n"
    "tokenizer), created once in DATA_DIR/default-model (DATA_DIR: --data-dir, default ./grpod-data).\n";

static int fail(const char *what) {
    fprintf(stderr, "grpod: %s%s%s\n", what, *err_msg() ? ": " : "", err_msg());
    return 1;
}

/* tokenize/detokenize without --model: the default model's directory is appended as --model
 * (--data-dir DIR picks where it lives, as for the other commands). */
static int tok_cli_default(int (*cli)(int, char **), int argc, char **argv) {
    const char *data = DEFAULT_DATA_DIR;
    char **av = calloc((size_t)argc + 3, sizeof *av);
    if (!av) return fail("out of memory");
    int n = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--model") || !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            free(av);
            return cli(argc, argv);
        }
        if (!strcmp(argv[i], "--data-dir") && i + 1 < argc) {
            data = argv[++i];
            continue;
        }
        av[n++] = argv[i];
    }
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/default-model", data);
    int rc = fs_mkdirs(data);
    if (!rc) rc = eng_ensure_default_model(dir);
    if (rc) {
        free(av);
        return fail("cannot create the default model");
    }
    av[n++] = "--model";
    av[n++] = dir;
    rc = cli(n, av);
    free(av);
    return rc;
}

/* --model DIR or the default model under --data-dir (created on first use). */
static int resolve_model(const char *model, const char *data_dir, char *out, size_t n) {
    if (model) {
        snprintf(out, n, "%s", model);
        return 0;
    }
    snprintf(out, n, "%s/default-model", data_dir);
    int rc = fs_mkdirs(data_dir);
    return rc ? rc : eng_ensure_default_model(out);
}

static const struct option model_opts[] = {
    {"model", required_argument, 0, 'm'},
    {"data-dir", required_argument, 0, 'd'},
    {"backend", required_argument, 0, 'b'},
    {"ids", required_argument, 0, 'i'},
    {"temperature", required_argument, 0, 't'},
    {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0},
};

static int cmd_info(int argc, char **argv) {
    const char *model = NULL, *data = DEFAULT_DATA_DIR, *backend = "cpu";
    int c;
    while ((c = getopt_long(argc, argv, "h", model_opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'd': data = optarg; break;
        case 'b': backend = optarg; break;
        case 'h':
            puts("usage: grpod info [--model DIR] [--data-dir DIR] [--backend cpu|cuda|auto]\n\n"
                 "Loads the checkpoint and prints its architecture, dimensions, parameter count, dtype and\n"
                 "the backend as JSON. Errors (missing tensor, corrupt safetensors, unsupported\n"
                 "architecture) print one line naming the file and exit 1.");
            return 0;
        default: return 2;
        }
    }
    char dir[1024];
    if (resolve_model(model, data, dir, sizeof dir)) return fail("cannot create the default model");
    eng *e;
    eng_open_opts o = {.model_dir = dir, .backend = backend, .no_training = 1};
    if (eng_open(&o, &e)) return fail("cannot open the model");
    eng_info i;
    eng_get_info(e, &i);
    printf("{\"model_dir\": \"%s\", \"architecture\": \"%s\", \"layers\": %d, \"hidden_size\": %d, "
           "\"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"intermediate_size\": %d, \"vocab_size\": %d, "
           "\"max_position_embeddings\": %d, \"parameters\": %lld, \"dtype\": \"%s\", \"backend\": \"%s\"}\n",
           i.model_dir, i.arch, i.n_layers, i.d_model, i.n_heads, i.n_kv_heads, i.head_dim, i.d_ff, i.vocab, i.max_pos,
           i.n_params, i.dtype, i.backend);
    eng_close(e);
    return 0;
}

static int parse_ids(const char *s, int **ids, int *n) {
    int cap = 16, k = 0;
    int *v = malloc((size_t)cap * sizeof *v);
    while (v && *s) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 0 || x > 1 << 30) {
            free(v);
            return err_set(GE_INVALID, "--ids must be comma-separated token ids");
        }
        if (k == cap) {
            int *w = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!w) {
                free(v);
                return err_set(GE_NOMEM, "out of memory");
            }
            v = w;
        }
        v[k++] = (int)x;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') {
            free(v);
            return err_set(GE_INVALID, "--ids: unexpected '%c'", *end);
        }
    }
    if (!v) return err_set(GE_NOMEM, "out of memory");
    *ids = v;
    *n = k;
    return 0;
}

static int cmd_logprobs(int argc, char **argv) {
    const char *model = NULL, *data = DEFAULT_DATA_DIR, *backend = "cpu", *ids_s = NULL;
    float temp = 1.0f;
    int c;
    while ((c = getopt_long(argc, argv, "h", model_opts, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'd': data = optarg; break;
        case 'b': backend = optarg; break;
        case 'i': ids_s = optarg; break;
        case 't': temp = strtof(optarg, NULL); break;
        case 'h':
            puts("usage: grpod logprobs [--model DIR] --ids 1,2,3,... [--backend cpu|cuda|auto] [--temperature T]\n\n"
                 "Prints {\"ids\": [...], \"logprobs\": [...]}: logprobs[i] = log p(ids[i+1] | ids[0..i]) under\n"
                 "logits / T (one entry per token after the first).");
            return 0;
        default: return 2;
        }
    }
    if (!ids_s) {
        fprintf(stderr, "grpod logprobs: --ids is required\n");
        return 2;
    }
    if (!(temp > 0)) {
        fprintf(stderr, "grpod logprobs: --temperature must be > 0\n");
        return 2;
    }
    int *ids = NULL, n = 0;
    if (parse_ids(ids_s, &ids, &n)) return fail("bad --ids");
    if (n < 2) {
        free(ids);
        fprintf(stderr, "grpod logprobs: need at least 2 ids\n");
        return 2;
    }
    char dir[1024];
    if (resolve_model(model, data, dir, sizeof dir)) {
        free(ids);
        return fail("cannot create the default model");
    }
    eng *e;
    eng_open_opts o = {.model_dir = dir, .backend = backend, .no_training = 1};
    if (eng_open(&o, &e)) {
        free(ids);
        return fail("cannot open the model");
    }
    eng_info info;
    eng_get_info(e, &info);
    for (int i = 0; i < n; i++)
        if (ids[i] >= info.vocab) {
            fprintf(stderr, "grpod: --ids: id %d is outside the vocabulary (size %d)\n", ids[i], info.vocab);
            eng_close(e);
            free(ids);
            return 1;
        }
    /* One group: prompt = the first id, one response = the rest. */
    const int *resp[1] = {ids + 1};
    int R = n - 1;
    eng_update_group g = {.prompt = ids, .P = 1, .n = 1, .resp = resp, .R = &R};
    float **lp;
    int rc = eng_logprobs(e, &g, 1, 0, temp, 1LL << 40, &lp);
    if (rc) {
        eng_close(e);
        free(ids);
        return fail("forward failed");
    }
    printf("{\"ids\": [");
    for (int i = 0; i < n; i++) printf("%s%d", i ? ", " : "", ids[i]);
    printf("], \"logprobs\": [");
    for (int i = 0; i < R; i++) printf("%s%.9g", i ? ", " : "", lp[0][i]);
    printf("]}\n");
    eng_logprobs_free(lp, &g, 1);
    eng_close(e);
    free(ids);
    return 0;
}

/* The CPU backend's OpenMP threads wait passively (they sleep at barriers and between jobs
 * instead of spinning), so grpod shares a machine with its client and other work: a spinning
 * waiter burns the core that the thread it waits for needs. libgomp reads OMP_WAIT_POLICY when
 * it loads, before main, so the default is set here and the binary re-executes itself once.
 * Either variable set by the user wins (OMP_WAIT_POLICY=active for a dedicated machine). */
static void omp_wait_passive(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1)) return;
    execv("/proc/self/exe", argv); /* on failure: carry on with the spinning default */
}

int main(int argc, char **argv) {
    omp_wait_passive(argv);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(usage_top, argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
#ifdef GRPOD_CUDA
        puts("grpod " GRPOD_VERSION " (backends: cpu, cuda)");
#else
        puts("grpod " GRPOD_VERSION " (backends: cpu)");
#endif
        return 0;
    }
    const char *cmd = argv[1];
    char **all = argv;
    argc--;
    argv++;
    if (!strcmp(cmd, "serve")) {
        int rc = serve_main(argc, argv);
        if (rc != SERVE_REEXEC) return rc;
        /* a new epoch of a leader (daemon/serve.h): everything released, the same command again */
        log_event(LOG_WARN, "reexec", "\"reason\":\"a lost follower joined again: a new epoch\"");
        fflush(NULL);
        execv("/proc/self/exe", all);
        fprintf(stderr, "grpod: re-exec for a new epoch failed (%s); exiting 75 for the service manager\n", strerror(errno));
        return 75;
    }
    if (!strcmp(cmd, "info")) return cmd_info(argc, argv);
    if (!strcmp(cmd, "logprobs")) return cmd_logprobs(argc, argv);
    if (!strcmp(cmd, "tokenize")) return tok_cli_default(tok_cli_tokenize, argc, argv);
    if (!strcmp(cmd, "detokenize")) return tok_cli_default(tok_cli_detokenize, argc, argv);
    fprintf(stderr, "grpod: unknown command \"%s\"\n\n%s", cmd, usage_top);
    return 2;
}
