/* tokenizer_cli.c — `grpod tokenize` and `grpod detokenize`, the command-line face of
 * engine/text/tokenizer.h (daemon/main.c dispatches here). They need only a directory holding
 * tokenizer.json (and tokenizer_config.json when present), no weights.
 *
 *   grpod tokenize --model DIR [--text TEXT | --jsonl] [--no-special] [--no-add-special] [--bench N]
 *   grpod detokenize --model DIR (--ids 1,2,3 | --jsonl) [--skip-special]
 *
 * Exit codes: 0 ok, 1 runtime error, 2 usage; errors are one line on stderr. */
#include "common/clock.h"
#include "common/err.h"
#include "engine/format/json.h"
#include "engine/text/tokenizer.h"
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char tokenize_usage[] =
    "usage: grpod tokenize --model DIR [--text TEXT | --jsonl] [--no-special] [--no-add-special] [--bench N]\n"
    "  Prints the token ids of TEXT (or of stdin) as a JSON array.\n"
    "  --model DIR       directory with tokenizer.json (and tokenizer_config.json)\n"
    "  --text TEXT       text to encode (default: all of stdin)\n"
    "  --jsonl           stdin holds one JSON string per line; prints one JSON array per line\n"
    "  --no-special      special tokens written in the text are encoded as plain text\n"
    "  --no-add-special  do not add the post-processor's tokens (e.g. BOS)\n"
    "  --bench N         with --jsonl: encode all lines N times in-process, print MB/s as JSON\n";

static const char detokenize_usage[] =
    "usage: grpod detokenize --model DIR (--ids 1,2,3 | --jsonl) [--skip-special]\n"
    "  Prints the text of the token ids.\n"
    "  --model DIR       directory with tokenizer.json (and tokenizer_config.json)\n"
    "  --ids LIST        comma-separated ids (a JSON array works too)\n"
    "  --jsonl           stdin holds one JSON array of ids per line; prints one JSON string per line\n"
    "  --skip-special    leave out special tokens\n";

static int usage_error(const char *cmd, const char *usage, const char *what) {
    fprintf(stderr, "grpod %s: %s\n%s", cmd, what, usage);
    return 2;
}

/* getopt_long over argv (argv[0] is the command), as daemon/main.c's commands parse theirs.
 * Returns the next option's val, -1 at the end, or '?' after printing the usage error for an
 * unknown or incomplete option or a stray argument. */
static int next_opt(int argc, char **argv, const struct option *lo, const char *cmd, const char *usage, int *status) {
    opterr = 0;
    int c = getopt_long(argc, argv, "h", lo, NULL);
    const char *bad = c == '?' ? argv[optind - 1] : c == -1 && optind < argc ? argv[optind] : NULL;
    if (!bad) return c;
    char what[256];
    snprintf(what, sizeof what, "unknown or incomplete option %s", bad);
    *status = usage_error(cmd, usage, what);
    return '?';
}

static void write_ids(FILE *f, const int *ids, int n) {
    fputc('[', f);
    for (int i = 0; i < n; i++) fprintf(f, i ? ",%d" : "%d", ids[i]);
    fputs("]\n", f);
}

static char *read_all(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        char *nb = realloc(buf, cap *= 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
    }
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

/* Lines of stdin as JSON strings, parsed into one array of (text, len). */
typedef struct {
    char **s;
    size_t *len;
    int n;
} lines;

static int read_jsonl_strings(lines *L) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    int cap_n = 0, lineno = 0;
    memset(L, 0, sizeof *L);
    while ((got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) got--;
        if (!got) continue;
        js_doc *doc;
        const js *v;
        int rc = js_parse(line, (size_t)got, &doc, &v);
        if (rc || v->type != JS_STR) {
            if (!rc) js_doc_free(doc);
            free(line);
            return err_set(GE_INVALID, "stdin line %d: %s", lineno, rc ? err_msg() : "not a JSON string");
        }
        if (L->n == cap_n) {
            cap_n = cap_n ? cap_n * 2 : 256;
            L->s = realloc(L->s, (size_t)cap_n * sizeof *L->s);
            L->len = realloc(L->len, (size_t)cap_n * sizeof *L->len);
            if (!L->s || !L->len) {
                js_doc_free(doc);
                free(line);
                return err_set(GE_NOMEM, "out of memory");
            }
        }
        L->s[L->n] = malloc((size_t)v->n + 1);
        if (!L->s[L->n]) {
            js_doc_free(doc);
            free(line);
            return err_set(GE_NOMEM, "out of memory");
        }
        memcpy(L->s[L->n], v->str, (size_t)v->n + 1);
        L->len[L->n++] = (size_t)v->n;
        js_doc_free(doc);
    }
    free(line);
    return 0;
}

static void lines_free(lines *L) {
    for (int i = 0; i < L->n; i++) free(L->s[i]);
    free(L->s);
    free(L->len);
}

static int run_jsonl(const tok *t, int add_special, int parse_special, int bench) {
    lines L;
    int rc = read_jsonl_strings(&L);
    if (rc) {
        lines_free(&L);
        return rc;
    }
    if (bench > 0) {
        size_t bytes = 0;
        long long ntok = 0;
        for (int i = 0; i < L.n; i++) bytes += L.len[i];
        double t0 = clock_mono_s();
        for (int r = 0; r < bench && !rc; r++)
            for (int i = 0; i < L.n && !rc; i++) {
                int *ids, n;
                rc = tok_encode(t, L.s[i], L.len[i], add_special, parse_special, &ids, &n);
                if (!rc) {
                    ntok += n;
                    free(ids);
                }
            }
        double dt = clock_mono_s() - t0;
        if (!rc)
            printf("{\"lines\": %d, \"bytes\": %zu, \"repeats\": %d, \"tokens\": %lld, \"seconds\": %.4f, "
                   "\"mb_per_s\": %.3f}\n",
                   L.n, bytes, bench, ntok, dt, (double)bytes * bench / dt / 1e6);
    } else {
        for (int i = 0; i < L.n && !rc; i++) {
            int *ids, n;
            rc = tok_encode(t, L.s[i], L.len[i], add_special, parse_special, &ids, &n);
            if (!rc) {
                write_ids(stdout, ids, n);
                free(ids);
            }
        }
    }
    lines_free(&L);
    return rc;
}

int tok_cli_tokenize(int argc, char **argv) {
    const char *cmd = argc > 0 ? argv[0] : "tokenize", *model = NULL, *text = NULL;
    int jsonl = 0, parse_special = 1, add_special = 1, bench = 0, c, st = 0;
    static const struct option lo[] = {
        {"help", no_argument, 0, 'h'},           {"model", required_argument, 0, 'm'},
        {"text", required_argument, 0, 't'},     {"bench", required_argument, 0, 'b'},
        {"jsonl", no_argument, 0, 'j'},          {"no-special", no_argument, 0, 's'},
        {"no-add-special", no_argument, 0, 'a'}, {0, 0, 0, 0},
    };
    optind = 0; /* glibc: start over (tests call this more than once) */
    while ((c = next_opt(argc, argv, lo, cmd, tokenize_usage, &st)) != -1) {
        switch (c) {
        case 'h': fputs(tokenize_usage, stdout); return 0;
        case 'm': model = optarg; break;
        case 't': text = optarg; break;
        case 'b': bench = atoi(optarg); break;
        case 'j': jsonl = 1; break;
        case 's': parse_special = 0; break;
        case 'a': add_special = 0; break;
        default: return st;
        }
    }
    if (!model) return usage_error(cmd, tokenize_usage, "--model DIR is required");
    if (bench && !jsonl) return usage_error(cmd, tokenize_usage, "--bench needs --jsonl");
    tok *t;
    int rc = tok_load(model, &t);
    if (rc) {
        fprintf(stderr, "grpod %s: %s\n", cmd, err_msg());
        return 1;
    }
    if (jsonl) {
        rc = run_jsonl(t, add_special, parse_special, bench);
    } else {
        size_t len = text ? strlen(text) : 0;
        char *buf = text ? NULL : read_all(stdin, &len);
        int *ids, n;
        if (!text && !buf) rc = err_set(GE_NOMEM, "out of memory reading stdin");
        else rc = tok_encode(t, text ? text : buf, len, add_special, parse_special, &ids, &n);
        if (!rc) {
            write_ids(stdout, ids, n);
            free(ids);
        }
        free(buf);
    }
    tok_free(t);
    if (rc) {
        fprintf(stderr, "grpod %s: %s\n", cmd, err_msg());
        return 1;
    }
    return fflush(stdout) ? 1 : 0;
}

/* Parse "1,2,3" or "[1, 2, 3]" into a malloc'd array. */
static int parse_ids(const char *s, int **ids, int *n) {
    int cap = 16;
    *n = 0;
    *ids = malloc((size_t)cap * sizeof **ids);
    if (!*ids) return err_set(GE_NOMEM, "out of memory");
    while (*s) {
        if (*s == ',' || *s == ' ' || *s == '[' || *s == ']' || *s == '\n' || *s == '\t' || *s == '\r') {
            s++;
            continue;
        }
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v > 1 << 30) return err_set(GE_INVALID, "bad token id near \"%.20s\"", s);
        if (*n == cap) {
            int *p = realloc(*ids, (size_t)(cap *= 2) * sizeof *p);
            if (!p) return err_set(GE_NOMEM, "out of memory");
            *ids = p;
        }
        (*ids)[(*n)++] = (int)v;
        s = end;
    }
    return 0;
}

/* vocab: the model's vocab_size (config.json) or 0 when the directory has none. As POST
 * /v1/detokenize, an id at or above it is an error; below it, an id the tokenizer does not
 * know decodes to nothing (Hugging Face tokenizers' rule, which the parity tests hold us to). */
static int detok_one(const tok *t, const char *list, int skip, int as_json, int vocab) {
    int *ids = NULL, n;
    char *text;
    size_t len;
    int rc = parse_ids(list, &ids, &n);
    for (int i = 0; !rc && vocab > 0 && i < n; i++)
        if (ids[i] >= vocab) rc = err_set(GE_INVALID, "token id %d is outside the model's vocabulary (size %d)", ids[i], vocab);
    if (!rc) rc = tok_decode(t, ids, n, skip, &text, &len);
    free(ids);
    if (rc) return rc;
    if (as_json) {
        js_write_str(stdout, text, len);
        fputc('\n', stdout);
    } else fwrite(text, 1, len, stdout);
    free(text);
    return 0;
}

int tok_cli_detokenize(int argc, char **argv) {
    const char *cmd = argc > 0 ? argv[0] : "detokenize", *model = NULL, *idlist = NULL;
    int jsonl = 0, skip = 0, c, st = 0;
    static const struct option lo[] = {
        {"help", no_argument, 0, 'h'},  {"model", required_argument, 0, 'm'},  {"ids", required_argument, 0, 'i'},
        {"jsonl", no_argument, 0, 'j'}, {"skip-special", no_argument, 0, 's'}, {0, 0, 0, 0},
    };
    optind = 0;
    while ((c = next_opt(argc, argv, lo, cmd, detokenize_usage, &st)) != -1) {
        switch (c) {
        case 'h': fputs(detokenize_usage, stdout); return 0;
        case 'm': model = optarg; break;
        case 'i': idlist = optarg; break;
        case 'j': jsonl = 1; break;
        case 's': skip = 1; break;
        default: return st;
        }
    }
    if (!model) return usage_error(cmd, detokenize_usage, "--model DIR is required");
    if (!idlist && !jsonl) return usage_error(cmd, detokenize_usage, "--ids LIST or --jsonl is required");
    tok *t;
    int rc = tok_load(model, &t);
    if (rc) {
        fprintf(stderr, "grpod %s: %s\n", cmd, err_msg());
        return 1;
    }
    int vocab = 0;
    char cfg[1100];
    snprintf(cfg, sizeof cfg, "%s/config.json", model);
    js_doc *doc;
    const js *root;
    if (!js_parse_file(cfg, &doc, &root)) {
        vocab = (int)js_get_num(root, "vocab_size", 0);
        js_doc_free(doc);
    }
    err_clear();
    if (jsonl) {
        char *line = NULL;
        size_t cap = 0;
        while (!rc && getline(&line, &cap, stdin) >= 0) rc = detok_one(t, line, skip, 1, vocab);
        free(line);
    } else {
        rc = detok_one(t, idlist, skip, 0, vocab);
        if (!rc) fputc('\n', stdout);
    }
    tok_free(t);
    if (rc) {
        fprintf(stderr, "grpod %s: %s\n", cmd, err_msg());
        return 1;
    }
    return fflush(stdout) ? 1 : 0;
}
