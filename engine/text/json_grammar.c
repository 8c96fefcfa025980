/* json_grammar.c — the byte automaton of json_grammar.h, its shortest completion, and token masks.
 *
 * Modes (jg_state.mode), each naming what the next byte may be:
 *   VALUE      a value (whitespace first); ARR_FIRST: a value or ']'
 *   OBJ_FIRST  a key's '"' or '}';  KEY: a key's '"' (after a ',');  COLON: ':'
 *   AFTER      after a value inside a container: ',' or the container's close
 *   STRING     string bytes (sub: UTF-8 continuation bytes owed), '"' ends it, '\' escapes
 *   ESC        the escaped byte;  UHEX: sub hex digits owed
 *   NUM        a number (sub: its part, NUM_*); a byte that cannot continue it ends it and is
 *              read again after the value
 *   LIT        true / false / null (sub: which, at: letters matched)
 *   SUFFIX     the suffix's next byte;  END: nothing (the sequence's end)
 * A value that ends with the stack empty goes to SUFFIX (and, with an empty suffix, END), so the
 * suffix follows the value at once: no whitespace between them.
 *
 * The shortest completion (jg_need) of each mode, whose first byte always leads to a state whose
 * completion is the rest: a value owed is "0" (the root object "{}"), a key owed "\"\":0", each
 * open container one close byte, a string its owed UTF-8 bytes and '"' (a key then ":0"), an
 * escape "n", hex digits "0", a number's missing digit "0", a literal its letters, then the
 * suffix. */
#include "engine/text/json_grammar.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"

enum { M_VALUE, M_ARR_FIRST, M_OBJ_FIRST, M_KEY, M_COLON, M_AFTER, M_STRING, M_ESC, M_UHEX, M_NUM, M_LIT, M_SUFFIX, M_END };
enum { NUM_MINUS, NUM_ZERO, NUM_INT, NUM_DOT, NUM_FRAC, NUM_E, NUM_ESIGN, NUM_EXP };
static const char *const lits[] = {"true", "false", "null"};

/* mask bits: id j is bit j % 32 of word j / 32 (kernels/sampling.h's allow masks) */
static int words_of(int V) { return (V + 31) / 32; }
static int bit_get(const uint32_t *m, int j) { return (m[j >> 5] >> (j & 31)) & 1u; }
static void bit_set(uint32_t *m, int j) { m[j >> 5] |= 1u << (j & 31); }

int jg_spec_init(jg_spec *g, int object, const char *suffix) {
    size_t n = suffix ? strlen(suffix) : 0;
    memset(g, 0, sizeof *g);
    if (n > JG_SUFFIX_MAX) return err_set(GE_INVALID, "guided suffix: %zu bytes (at most %d)", n, JG_SUFFIX_MAX);
    g->object = object;
    memcpy(g->suffix, suffix ? suffix : "", n);
    g->suffix_len = (int)n;
    return 0;
}

void jg_start(const jg_spec *g, jg_state *s) {
    (void)g;
    memset(s, 0, sizeof *s);
    s->mode = M_VALUE;
}

/* ---------------------------------------------------------------- the automaton */

static int is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* UTF-8 (RFC 3629): a lead byte's count of continuation bytes (-1: not a lead), and the range of
 * the first continuation, which excludes overlong forms, surrogates and code points past
 * U+10FFFF: lead E0 A0..BF, ED 80..9F, F0 90..BF, F4 80..8F, others 80..BF. */
static int utf8_lead(unsigned char c) { return c < 0x80 ? 0 : c < 0xC2 ? -1 : c < 0xE0 ? 1 : c < 0xF0 ? 2 : c < 0xF5 ? 3 : -1; }
static int utf8_first_ok(unsigned char lead, unsigned char c) {
    unsigned char lo = lead == 0xE0 ? 0xA0 : lead == 0xF0 ? 0x90 : 0x80, hi = lead == 0xED ? 0x9F : lead == 0xF4 ? 0x8F : 0xBF;
    return c >= lo && c <= hi;
}
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static int is_hex(unsigned char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* A value has ended: the container's next separator, or the suffix at the root. */
static void value_done(const jg_spec *g, jg_state *s) {
    s->ws = 0;
    if (s->depth) s->mode = M_AFTER;
    else s->mode = g->suffix_len ? M_SUFFIX : M_END;
}

static int open_container(jg_state *s, unsigned char c) {
    if (s->depth >= JG_DEPTH) return -1;
    s->stack[s->depth++] = c;
    s->mode = c == '{' ? M_OBJ_FIRST : M_ARR_FIRST;
    s->ws = 0;
    return 0;
}

/* The first byte of a value. */
static int value_byte(const jg_spec *g, jg_state *s, unsigned char c) {
    if (g->object && s->depth == 0 && c != '{') return -1;
    s->ws = 0;
    if (c == '{' || c == '[') return open_container(s, c);
    if (c == '"') {
        s->mode = M_STRING, s->key = 0, s->sub = 0;
        return 0;
    }
    if (c == '-' || is_digit(c)) {
        s->mode = M_NUM;
        s->sub = c == '-' ? NUM_MINUS : c == '0' ? NUM_ZERO : NUM_INT;
        return 0;
    }
    for (int i = 0; i < 3; i++)
        if (c == (unsigned char)lits[i][0]) {
            s->mode = M_LIT, s->sub = (uint8_t)i, s->at = 1;
            return 0;
        }
    return -1;
}

/* Whitespace: at most JG_WS_MAX bytes in a row, none before the root value (the answer starts
 * with it) and none after it (the suffix follows at once). */
static int whitespace(jg_state *s) { return s->ws < JG_WS_MAX && (s->depth || s->mode != M_VALUE) ? (s->ws++, 0) : -1; }

/* A number's next byte: 1 when c continues it, 0 when the number is complete and c is not
 * part of it, -1 when c cannot follow. */
static int num_byte(jg_state *s, unsigned char c) {
    switch (s->sub) {
    case NUM_MINUS: return is_digit(c) ? (s->sub = c == '0' ? NUM_ZERO : NUM_INT, 1) : -1;
    case NUM_ZERO:
    case NUM_INT:
        if (s->sub == NUM_INT && is_digit(c)) return 1;
        if (c == '.') return s->sub = NUM_DOT, 1;
        if (c == 'e' || c == 'E') return s->sub = NUM_E, 1;
        return is_digit(c) ? -1 : 0; /* no leading zeros */
    case NUM_DOT: return is_digit(c) ? (s->sub = NUM_FRAC, 1) : -1;
    case NUM_FRAC:
        if (is_digit(c)) return 1;
        if (c == 'e' || c == 'E') return s->sub = NUM_E, 1;
        return 0;
    case NUM_E:
        if (c == '+' || c == '-') return s->sub = NUM_ESIGN, 1;
        return is_digit(c) ? (s->sub = NUM_EXP, 1) : -1;
    case NUM_ESIGN: return is_digit(c) ? (s->sub = NUM_EXP, 1) : -1;
    default: return is_digit(c) ? 1 : 0; /* NUM_EXP */
    }
}
static int num_complete(const jg_state *s) {
    return s->sub == NUM_ZERO || s->sub == NUM_INT || s->sub == NUM_FRAC || s->sub == NUM_EXP;
}

static int string_byte(const jg_spec *g, jg_state *s, unsigned char c) {
    if (s->sub) { /* a continuation byte owed; at: the lead, while the first is owed */
        if (s->at ? !utf8_first_ok(s->at, c) : (c & 0xC0) != 0x80) return -1;
        s->sub--, s->at = 0;
        return 0;
    }
    if (c == '"') {
        if (s->key) s->mode = M_COLON, s->ws = 0;
        else value_done(g, s);
        return 0;
    }
    if (c == '\\') return s->mode = M_ESC, 0;
    int k = utf8_lead(c);
    if (c < 0x20 || k < 0) return -1; /* controls, stray continuations, bad leads */
    s->sub = (uint8_t)k, s->at = k ? c : 0;
    return 0;
}

static int feed_byte(const jg_spec *g, jg_state *s, unsigned char c) {
    switch (s->mode) {
    case M_VALUE:
    case M_ARR_FIRST:
        if (is_ws(c)) return whitespace(s);
        if (s->mode == M_ARR_FIRST && c == ']') {
            s->depth--;
            value_done(g, s);
            return 0;
        }
        return value_byte(g, s, c);
    case M_OBJ_FIRST:
    case M_KEY:
        if (is_ws(c)) return whitespace(s);
        if (c == '"') {
            s->mode = M_STRING, s->key = 1, s->sub = 0;
            return 0;
        }
        if (s->mode == M_OBJ_FIRST && c == '}') {
            s->depth--;
            value_done(g, s);
            return 0;
        }
        return -1;
    case M_COLON:
        if (is_ws(c)) return whitespace(s);
        if (c != ':') return -1;
        s->mode = M_VALUE, s->ws = 0;
        return 0;
    case M_AFTER: {
        if (is_ws(c)) return whitespace(s);
        unsigned char top = s->stack[s->depth - 1];
        if (c == ',') {
            s->mode = top == '{' ? M_KEY : M_VALUE, s->ws = 0;
            return 0;
        }
        if (c != (top == '{' ? '}' : ']')) return -1;
        s->depth--;
        value_done(g, s);
        return 0;
    }
    case M_STRING: return string_byte(g, s, c);
    case M_ESC:
        if (c == 'u') {
            s->mode = M_UHEX, s->sub = 4;
            return 0;
        }
        if (!strchr("\"\\/bfnrt", c) || !c) return -1;
        s->mode = M_STRING, s->sub = 0;
        return 0;
    case M_UHEX:
        if (!is_hex(c) || (s->sub == 4 && (c == 'd' || c == 'D'))) return -1; /* no surrogates */
        if (--s->sub == 0) s->mode = M_STRING;
        return 0;
    case M_NUM: {
        int r = num_byte(s, c);
        if (r) return r > 0 ? 0 : -1;
        value_done(g, s); /* c ends the number: read it after the value */
        return feed_byte(g, s, c);
    }
    case M_LIT:
        if (c != (unsigned char)lits[s->sub][s->at]) return -1;
        if (!lits[s->sub][++s->at]) value_done(g, s);
        return 0;
    case M_SUFFIX:
        if (c != (unsigned char)g->suffix[s->suffix_at]) return -1;
        if (++s->suffix_at == g->suffix_len) s->mode = M_END;
        return 0;
    default: return -1; /* M_END */
    }
}

int jg_feed(const jg_spec *g, jg_state *s, const char *bytes, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (feed_byte(g, s, (unsigned char)bytes[i])) {
            s->mode = M_END;
            return -1;
        }
    return 0;
}

int jg_complete(const jg_spec *g, const jg_state *s) {
    /* a number at the root with no suffix ends wherever the sequence does */
    return s->mode == M_END || (s->mode == M_NUM && s->depth == 0 && !g->suffix_len && num_complete(s));
}

int jg_need(const jg_spec *g, const jg_state *s) {
    int close = s->depth + g->suffix_len, n;
    switch (s->mode) {
    case M_VALUE: n = (g->object && s->depth == 0 ? 2 : 1) + close; break;
    case M_ARR_FIRST:
    case M_OBJ_FIRST:
    case M_AFTER: n = close; break;
    case M_KEY: n = 4 + close; break;
    case M_COLON: n = 2 + close; break;
    case M_STRING: n = s->sub + 1 + (s->key ? 2 : 0) + close; break;
    case M_ESC: n = 2 + (s->key ? 2 : 0) + close; break;
    case M_UHEX: n = s->sub + 1 + (s->key ? 2 : 0) + close; break;
    case M_NUM: n = (num_complete(s) ? 0 : 1) + close; break;
    case M_LIT: n = (int)strlen(lits[s->sub]) - s->at + close; break;
    case M_SUFFIX: n = g->suffix_len - s->suffix_at; break;
    default: n = 0;
    }
    return n;
}

/* ---------------------------------------------------------------- the vocabulary */

/* Plain string content: bytes >= 0x20 but '"' and '\', whole UTF-8 characters. Inside a string
 * with no UTF-8 byte owed such a token leaves the state (and its need) as it was. */
static int plain_content(const unsigned char *b, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned char c = b[i];
        int k = utf8_lead(c);
        if (c < 0x20 || c == '"' || c == '\\' || k < 0 || i + (size_t)k + 1 > n) return 0;
        if (k && !utf8_first_ok(c, b[i + 1])) return 0;
        for (int j = 2; j <= k; j++)
            if ((b[i + (size_t)j] & 0xC0) != 0x80) return 0;
        i += (size_t)k + 1;
    }
    return n > 0;
}

struct jg_vocab {
    int V, W;
    const tok *t;
    uint32_t *plain; /* (W) plain string content (plain_content) */
    /* ids with bytes by first byte: all of them, and those not plain (what a string still needs
     * to look at one by one) */
    int *all, all_at[257];
    int *rest, rest_at[257];
};

/* The bytes id decodes to; NULL for special tokens and unused ids (never inside the grammar). */
static const unsigned char *token_bytes(const tok *t, int id, size_t *n) {
    const char *b = tok_token_bytes(t, id, n);
    return b && *n && !tok_is_special(t, id) ? (const unsigned char *)b : NULL;
}

/* ids of the vocabulary with bytes, bucketed by their first byte (counting sort). */
static int *bucket(const jg_vocab *v, int plain_too, int *at) {
    int count[257] = {0}, *ids;
    size_t n;
    for (int id = 0; id < v->V; id++) {
        const unsigned char *b = token_bytes(v->t, id, &n);
        if (b && (plain_too || !bit_get(v->plain, id))) count[b[0] + 1]++;
    }
    for (int c = 0; c < 256; c++) count[c + 1] += count[c];
    memcpy(at, count, sizeof count);
    if (!(ids = malloc(sizeof *ids * ((size_t)count[256] + 1)))) return NULL;
    for (int id = 0; id < v->V; id++) {
        const unsigned char *b = token_bytes(v->t, id, &n);
        if (b && (plain_too || !bit_get(v->plain, id))) ids[count[b[0]]++] = id;
    }
    return ids;
}

int jg_vocab_build(const tok *t, int V, jg_vocab **out) {
    *out = NULL;
    jg_vocab *v = calloc(1, sizeof *v);
    if (!v) return err_set(GE_NOMEM, "guided decoding: out of memory");
    v->V = V;
    v->W = words_of(V);
    v->t = t;
    if (!(v->plain = calloc((size_t)v->W, sizeof *v->plain))) goto oom;
    for (int id = 0; id < V; id++) {
        size_t n;
        const unsigned char *b = token_bytes(t, id, &n);
        if (b && plain_content(b, n)) bit_set(v->plain, id);
    }
    if (!(v->all = bucket(v, 1, v->all_at)) || !(v->rest = bucket(v, 0, v->rest_at))) goto oom;
    *out = v;
    return 0;
oom:
    jg_vocab_free(v);
    return err_set(GE_NOMEM, "guided decoding: out of memory for the vocabulary's bytes");
}

void jg_vocab_free(jg_vocab *v) {
    if (!v) return;
    free(v->plain);
    free(v->all);
    free(v->rest);
    free(v);
}

/* ---------------------------------------------------------------- masks */

/* Sets the bits of ids[at[c], at[c + 1]) for every first byte c that s accepts, then every id
 * whose bytes all keep s in the grammar with need + tail <= room. */
static int mask_ids(const jg_spec *g, const jg_state *s, const jg_vocab *v, const int *ids, const int *at, long room, int tail,
                    uint32_t *mask) {
    int n = 0;
    for (int c = 0; c < 256; c++) {
        if (at[c] == at[c + 1]) continue;
        jg_state one = *s;
        unsigned char b = (unsigned char)c;
        if (feed_byte(g, &one, b)) continue;
        for (int i = at[c]; i < at[c + 1]; i++) {
            int id = ids[i];
            size_t len;
            const unsigned char *bytes = token_bytes(v->t, id, &len);
            jg_state x = one;
            if (jg_feed(g, &x, (const char *)bytes + 1, len - 1) || jg_need(g, &x) + tail > room) continue;
            bit_set(mask, id);
            n++;
        }
    }
    return n;
}

static int grammar_mask(const jg_spec *g, const jg_state *s, const jg_vocab *v, long room, int tail, uint32_t *mask) {
    memset(mask, 0, sizeof *mask * (size_t)v->W);
    if (s->mode == M_STRING && !s->sub && jg_need(g, s) + tail <= room) { /* plain content keeps the need */
        int n = 0;
        for (int w = 0; w < v->W; w++) {
            mask[w] = v->plain[w];
            n += __builtin_popcount(mask[w]);
        }
        return n + mask_ids(g, s, v, v->rest, v->rest_at, room, tail, mask);
    }
    return mask_ids(g, s, v, v->all, v->all_at, room, tail, mask);
}

int jg_mask(const jg_spec *g, const jg_state *s, const jg_vocab *v, int left, const int *end, int n_end, uint32_t *mask) {
    int tail = n_end > 0, n = 0; /* the end id after the completion */
    if (jg_complete(g, s)) {
        memset(mask, 0, sizeof *mask * (size_t)v->W);
    } else {
        n = grammar_mask(g, s, v, (long)left - 1, tail, mask);
        if (!n) n = grammar_mask(g, s, v, 0x7fffffffL, 0, mask); /* too few tokens left: stay in the grammar */
        if (n) return n;
    }
    for (int i = 0; i < n_end; i++)
        if (end[i] >= 0 && end[i] < v->V && !bit_get(mask, end[i])) {
            bit_set(mask, end[i]);
            n++;
        }
    return n;
}
