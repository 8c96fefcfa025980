/* json.c — recursive-descent JSON reader into an arena (see json.h).
 *
 * Values of an array or object are first gathered on a shared scratch stack, then copied into
 * the arena in one piece, so a 10 MB tokenizer.json parses with a handful of mallocs. */
#include "engine/format/json.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/utf8.h"

/* ---------------------------------------------------------------- arena */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    char data[];
} chunk;

struct js_doc {
    chunk *head;
    js root;
};

static void *arena_alloc(js_doc *d, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!d->head || d->head->used + n > d->head->cap) {
        size_t cap = n > (1u << 20) ? n : (1u << 20);
        chunk *c = malloc(sizeof *c + cap);
        if (!c) return NULL;
        c->next = d->head;
        c->used = 0;
        c->cap = cap;
        d->head = c;
    }
    void *p = d->head->data + d->head->used;
    d->head->used += n;
    return p;
}

void js_doc_free(js_doc *d) {
    if (!d) return;
    for (chunk *c = d->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    free(d);
}

/* ---------------------------------------------------------------- parser */

typedef struct {
    const char *p, *end, *start;
    js_doc *doc;
    js *stack;
    char **kstack;
    size_t sp, scap; /* scratch for array/object members */
    int depth;
    int failed;
} parser;

static int fail(parser *ps, const char *what) {
    if (ps->failed) return -1;
    int line = 1, col = 1;
    for (const char *q = ps->start; q < ps->p && q < ps->end; q++) {
        if (*q == '\n') {
            line++;
            col = 1;
        } else col++;
    }
    err_set(GE_FORMAT, "line %d col %d: %s", line, col, what);
    ps->failed = 1;
    return -1;
}

static void skip_ws(parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\n' || *ps->p == '\r' || *ps->p == '\t')) ps->p++;
}

static int push(parser *ps, js v, char *key) {
    if (ps->sp == ps->scap) {
        size_t cap = ps->scap ? ps->scap * 2 : 1024;
        js *s = realloc(ps->stack, cap * sizeof *s);
        if (!s) return fail(ps, "out of memory");
        ps->stack = s;
        char **k = realloc(ps->kstack, cap * sizeof *k);
        if (!k) return fail(ps, "out of memory");
        ps->kstack = k;
        ps->scap = cap;
    }
    ps->stack[ps->sp] = v;
    ps->kstack[ps->sp] = key;
    ps->sp++;
    return 0;
}

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

/* Parses a string at ps->p (on the opening quote) into the arena. */
static int parse_string(parser *ps, char **out, int *outlen) {
    const char *q = ++ps->p;
    while (q < ps->end && *q != '"') {
        if (*q == '\\') q++;
        q++;
    }
    if (q >= ps->end) return fail(ps, "unterminated string");
    /* Escapes never lengthen the text (\uXXXX is 6 bytes for at most 3; a surrogate pair is 12
     * for 4), so the raw length bounds the decoded one. */
    char *o = arena_alloc(ps->doc, (size_t)(q - ps->p) + 1);
    if (!o) return fail(ps, "out of memory");
    size_t n = 0;
    const char *s = ps->p;
    while (s < q) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20) {
            ps->p = s;
            return fail(ps, "control character in string");
        }
        if (c != '\\') {
            o[n++] = (char)c;
            s++;
            continue;
        }
        s++;
        switch (*s) {
        case '"': o[n++] = '"'; break;
        case '\\': o[n++] = '\\'; break;
        case '/': o[n++] = '/'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'n': o[n++] = '\n'; break;
        case 'r': o[n++] = '\r'; break;
        case 't': o[n++] = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (q - s < 5 || hex4(s + 1, &cp)) {
                ps->p = s;
                return fail(ps, "bad \\u escape");
            }
            s += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && q - s >= 7 && s[1] == '\\' && s[2] == 'u' && !hex4(s + 3, &lo) && lo >= 0xDC00 &&
                lo < 0xE000) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                s += 6;
            } else if (cp >= 0xD800 && cp < 0xE000) {
                cp = 0xFFFD; /* lone surrogate: as Python's json with errors="replace" would not, but safely */
            }
            n += (size_t)utf8_encode(cp, o + n);
            break;
        }
        default: ps->p = s; return fail(ps, "bad escape in string");
        }
        s++;
    }
    o[n] = 0;
    ps->p = q + 1;
    *out = o;
    *outlen = (int)n;
    return 0;
}

static int parse_value(parser *ps, js *v);

static int parse_members(parser *ps, js *v, int is_obj) {
    char close = is_obj ? '}' : ']';
    size_t base = ps->sp;
    ps->p++;
    if (++ps->depth > 512) return fail(ps, "nesting too deep");
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        goto done;
    }
    for (;;) {
        char *key = NULL;
        skip_ws(ps);
        if (is_obj) {
            int klen;
            if (ps->p >= ps->end || *ps->p != '"') return fail(ps, "expected a string key");
            if (parse_string(ps, &key, &klen)) return -1;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return fail(ps, "expected ':'");
            ps->p++;
        }
        js item;
        if (parse_value(ps, &item)) return -1;
        if (push(ps, item, key)) return -1;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            break;
        }
        return fail(ps, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
done:
    ps->depth--;
    size_t n = ps->sp - base;
    v->type = is_obj ? JS_OBJ : JS_ARR;
    v->n = (int)n;
    v->items = NULL;
    v->keys = NULL;
    if (n) {
        v->items = arena_alloc(ps->doc, n * sizeof(js));
        if (!v->items) return fail(ps, "out of memory");
        memcpy(v->items, ps->stack + base, n * sizeof(js));
        if (is_obj) {
            v->keys = arena_alloc(ps->doc, n * sizeof(char *));
            if (!v->keys) return fail(ps, "out of memory");
            memcpy(v->keys, ps->kstack + base, n * sizeof(char *));
        }
    }
    ps->sp = base;
    return 0;
}

static int parse_value(parser *ps, js *v) {
    skip_ws(ps);
    memset(v, 0, sizeof *v);
    if (ps->p >= ps->end) return fail(ps, "unexpected end of input");
    char c = *ps->p;
    if (c == '{') return parse_members(ps, v, 1);
    if (c == '[') return parse_members(ps, v, 0);
    if (c == '"') {
        v->type = JS_STR;
        return parse_string(ps, &v->str, &v->n);
    }
    size_t rest = (size_t)(ps->end - ps->p);
    if (rest >= 4 && !memcmp(ps->p, "null", 4)) {
        v->type = JS_NULL;
        ps->p += 4;
        return 0;
    }
    if (rest >= 4 && !memcmp(ps->p, "true", 4)) {
        v->type = JS_TRUE;
        ps->p += 4;
        return 0;
    }
    if (rest >= 5 && !memcmp(ps->p, "false", 5)) {
        v->type = JS_FALSE;
        ps->p += 5;
        return 0;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        char buf[64];
        size_t k = 0;
        while (ps->p + k < ps->end && k < sizeof buf - 1 && strchr("+-0123456789.eE", ps->p[k])) {
            buf[k] = ps->p[k];
            k++;
        }
        buf[k] = 0;
        char *e;
        v->type = JS_NUM;
        v->num = strtod(buf, &e);
        if (e != buf + k || k == 0) return fail(ps, "bad number");
        ps->p += k;
        return 0;
    }
    /* NaN / Infinity appear in some Python-written configs; accept them as numbers. */
    if (rest >= 3 && !memcmp(ps->p, "NaN", 3)) {
        v->type = JS_NUM;
        v->num = 0.0 / 0.0;
        ps->p += 3;
        return 0;
    }
    if (rest >= 8 && !memcmp(ps->p, "Infinity", 8)) {
        v->type = JS_NUM;
        v->num = 1.0 / 0.0;
        ps->p += 8;
        return 0;
    }
    return fail(ps, "unexpected character");
}

int js_parse(const char *text, size_t len, js_doc **doc, const js **root) {
    *doc = NULL;
    js_doc *d = calloc(1, sizeof *d);
    if (!d) return err_set(GE_NOMEM, "out of memory parsing JSON");
    parser ps = {.p = text, .end = text + len, .start = text, .doc = d};
    int rc = parse_value(&ps, &d->root);
    if (!rc) {
        skip_ws(&ps);
        if (ps.p != ps.end) rc = fail(&ps, "trailing characters after the value");
    }
    free(ps.stack);
    free(ps.kstack);
    if (rc) {
        js_doc_free(d);
        return GE_FORMAT;
    }
    *doc = d;
    *root = &d->root;
    return 0;
}

int js_parse_file(const char *path, js_doc **doc, const js **root) {
    *doc = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return err_set(GE_IO, "%s: cannot open", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!buf) {
        fclose(f);
        return err_set(GE_NOMEM, "%s: cannot read", path);
    }
    size_t got = fread(buf, 1, (size_t)n, f);
    fclose(f);
    if (got != (size_t)n) {
        free(buf);
        return err_set(GE_IO, "%s: short read", path);
    }
    int rc = js_parse(buf, (size_t)n, doc, root);
    free(buf);
    if (rc) {
        char detail[900];
        snprintf(detail, sizeof detail, "%s", err_msg());
        return err_set(rc, "%s: invalid JSON at %s", path, detail);
    }
    return 0;
}

/* ---------------------------------------------------------------- access */

const js *js_get(const js *o, const char *key) {
    if (!o || o->type != JS_OBJ) return NULL;
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->keys[i], key)) return &o->items[i];
    return NULL;
}
const char *js_str(const js *v) { return v && v->type == JS_STR ? v->str : NULL; }
double js_num(const js *v, double d) { return v && v->type == JS_NUM ? v->num : d; }
int js_bool(const js *v, int d) { return !v ? d : v->type == JS_TRUE ? 1 : v->type == JS_FALSE ? 0 : d; }

void js_write_str(FILE *f, const char *s, size_t len) {
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (c < 0x20) fprintf(f, "\\u%04x", c);
            else fputc(c, f);
        }
    }
    fputc('"', f);
}
