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
 *   PKEY       a schema object's property name after its '"' (cand: the first property whose
 *              name starts with the lat bytes written), then '"'
 *   ENUM       an enum / const value (cand: the first text that starts with the lat bytes)
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

enum {
    M_VALUE,
    M_ARR_FIRST,
    M_OBJ_FIRST,
    M_KEY,
    M_COLON,
    M_AFTER,
    M_STRING,
    M_ESC,
    M_UHEX,
    M_NUM,
    M_LIT,
    M_SUFFIX,
    M_END,
    M_PKEY,
    M_ENUM
};
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
    memset(s, 0, sizeof *s);
    s->mode = M_VALUE;
    s->vnode = g->schema ? (uint16_t)g->schema->root : 0;
}

/* ---------------------------------------------------------------- schema nodes */

static const jg_node any_node = {.types = JG_T_ANY, .min = 1};
static const jg_node *node_of(const jg_spec *g, int i) { return g->schema ? &g->schema->nodes[i] : &any_node; }
static const jg_prop *prop_of(const jg_spec *g, const jg_node *n, int j) { return &g->schema->props[n->prop0 + j]; }
static const jg_lit *lit_of(const jg_spec *g, const jg_node *n, int j) { return &g->schema->lits[n->lit0 + j]; }
static const jg_node *top_node(const jg_spec *g, const jg_state *s) { return node_of(g, s->node[s->depth - 1]); }

/* An object's bytes from its property pos on to its close: the required properties' shortest
 * "key":min, with a comma before each but the first when nothing is written yet, then '}'. */
static int rest(const jg_spec *g, const jg_node *n, int pos, int has_member) {
    int suf = pos < n->n_props ? prop_of(g, n, pos)->suf : 0;
    return suf + 1 - (!has_member && suf > 0);
}
/* The last property index a key may take from pos on: the first required one, or the last. */
static int key_hi(const jg_spec *g, const jg_node *n, int pos) {
    for (int j = pos; j < n->n_props; j++)
        if (prop_of(g, n, j)->required) return j;
    return n->n_props - 1;
}
/* The shortest value of node i (an object when the root must be one). */
static int value_min(const jg_spec *g, const jg_state *s, int i) {
    const jg_node *n = node_of(g, i);
    if (g->object && s->depth == 0 && !n->n_lits) return 1 + rest(g, n, 0, 0);
    return n->min;
}
/* Candidate j of a property name (from) or enum text matches the lat bytes of candidate cand. */
static int same_prefix(const char *a, int alen, const char *b, int lat) { return alen >= lat && !memcmp(a, b, (size_t)lat); }

static int enum_need(const jg_spec *g, const jg_state *s);

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

static int open_container(const jg_spec *g, jg_state *s, unsigned char c) {
    if (s->depth >= JG_DEPTH) return -1;
    s->node[s->depth] = s->vnode;
    s->pos[s->depth] = 0;
    s->stack[s->depth++] = c;
    s->mode = c == '{' ? M_OBJ_FIRST : M_ARR_FIRST;
    if (c == '[') s->vnode = (uint16_t)node_of(g, s->vnode)->items;
    s->ws = 0;
    return 0;
}

/* An enum text's next byte: 1 when c continues a candidate, 0 when the text written is one of
 * them whole and c is not part of it, -1 when c cannot follow. */
static int enum_byte(const jg_spec *g, jg_state *s, unsigned char c) {
    const jg_node *n = node_of(g, s->vnode);
    const jg_lit *cur = lit_of(g, n, s->cand);
    for (int j = s->cand; j < n->n_lits; j++) {
        const jg_lit *l = lit_of(g, n, j);
        if (same_prefix(l->text, l->len, cur->text, s->lat) && l->len > s->lat && (unsigned char)l->text[s->lat] == c) {
            s->cand = (uint16_t)j, s->lat++;
            return 1;
        }
    }
    for (int j = s->cand; j < n->n_lits; j++) {
        const jg_lit *l = lit_of(g, n, j);
        if (l->len == s->lat && same_prefix(l->text, l->len, cur->text, s->lat)) return 0;
    }
    return -1;
}
/* 1 when no candidate goes on past the lat bytes written (the text is whole). */
static int enum_whole(const jg_spec *g, const jg_state *s) {
    const jg_node *n = node_of(g, s->vnode);
    const jg_lit *cur = lit_of(g, n, s->cand);
    if (cur->len != s->lat) return 0;
    for (int j = s->cand + 1; j < n->n_lits; j++) {
        const jg_lit *l = lit_of(g, n, j);
        if (l->len > s->lat && same_prefix(l->text, l->len, cur->text, s->lat)) return 0;
    }
    return 1;
}

/* The first byte of a value (of node vnode: its types, or its enum's texts). */
static int value_byte(const jg_spec *g, jg_state *s, unsigned char c) {
    if (g->object && s->depth == 0 && c != '{') return -1;
    const jg_node *n = node_of(g, s->vnode);
    s->ws = 0;
    if (n->n_lits) {
        s->mode = M_ENUM, s->cand = 0, s->lat = 0;
        if (enum_byte(g, s, c) != 1) return -1;
        if (enum_whole(g, s)) value_done(g, s);
        return 0;
    }
    int t = c == '{'              ? JG_T_OBJ
        : c == '['                ? JG_T_ARR
        : c == '"'                ? JG_T_STR
        : c == '-' || is_digit(c) ? JG_T_INT | JG_T_NUM
        : c == 't' || c == 'f'    ? JG_T_BOOL
        : c == 'n'                ? JG_T_NULL
                                  : 0;
    if (!(n->types & t)) return -1;
    if (c == '{' || c == '[') return open_container(g, s, c);
    if (c == '"') {
        s->mode = M_STRING, s->key = 0, s->sub = 0;
        return 0;
    }
    if (c == '-' || is_digit(c)) {
        s->mode = M_NUM;
        s->sub = c == '-' ? NUM_MINUS : c == '0' ? NUM_ZERO : NUM_INT;
        s->at = !(n->types & JG_T_NUM); /* an integer: no fraction, no exponent */
        return 0;
    }
    for (int i = 0; i < 3; i++)
        if (c == (unsigned char)lits[i][0]) {
            s->mode = M_LIT, s->sub = (uint8_t)i, s->at = 1;
            return 0;
        }
    return -1;
}

/* A key's opening '"' in an object: a property name under a schema with properties (none left
 * to take: refused), any string otherwise (none on a closed object). */
static int key_open(const jg_spec *g, jg_state *s) {
    const jg_node *n = top_node(g, s);
    if (n->closed) return -1;
    if (!n->n_props) {
        s->mode = M_STRING, s->key = 1, s->sub = 0;
        return 0;
    }
    if (s->pos[s->depth - 1] >= n->n_props) return -1;
    s->mode = M_PKEY, s->cand = s->pos[s->depth - 1], s->lat = 0;
    return 0;
}

/* A property name's next byte (PKEY): the closing '"' takes the candidate written whole. */
static int pkey_byte(const jg_spec *g, jg_state *s, unsigned char c) {
    const jg_node *n = top_node(g, s);
    const jg_prop *cur = prop_of(g, n, s->cand);
    int hi = key_hi(g, n, s->pos[s->depth - 1]);
    for (int j = s->cand; j <= hi; j++) {
        const jg_prop *p = prop_of(g, n, j);
        if (!same_prefix(p->key, p->klen, cur->key, s->lat)) continue;
        if (c == '"' && p->klen == s->lat) {
            s->pos[s->depth - 1] = (uint8_t)(j + 1);
            s->vnode = (uint16_t)p->node;
            s->mode = M_COLON, s->ws = 0;
            return 0;
        }
        if (p->klen > s->lat && (unsigned char)p->key[s->lat] == c) { /* a '"' in a name is escaped: never a close */
            s->cand = (uint16_t)j, s->lat++;
            return 0;
        }
    }
    return -1;
}
/* '}' may close the top object: no required property is left. */
static int may_close(const jg_spec *g, const jg_state *s) {
    const jg_node *n = top_node(g, s);
    return rest(g, n, s->pos[s->depth - 1], 1) == 1;
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
        if (s->at && (c == '.' || c == 'e' || c == 'E')) return 0; /* an integer ends here */
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
        if (s->key) s->mode = M_COLON, s->ws = 0, s->vnode = (uint16_t)top_node(g, s)->items;
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
        if (c == '"') return key_open(g, s);
        if (s->mode == M_OBJ_FIRST && c == '}' && may_close(g, s)) {
            s->depth--;
            value_done(g, s);
            return 0;
        }
        return -1;
    case M_PKEY: return pkey_byte(g, s, c);
    case M_ENUM: {
        int r = enum_byte(g, s, c);
        if (r > 0) {
            if (enum_whole(g, s)) value_done(g, s);
            return 0;
        }
        if (r < 0) return -1;
        value_done(g, s); /* c ends the text: read it after the value */
        return feed_byte(g, s, c);
    }
    case M_COLON:
        if (is_ws(c)) return whitespace(s);
        if (c != ':') return -1;
        s->mode = M_VALUE, s->ws = 0;
        return 0;
    case M_AFTER: {
        if (is_ws(c)) return whitespace(s);
        unsigned char top = s->stack[s->depth - 1];
        const jg_node *n = top_node(g, s);
        if (c == ',') {
            if (top == '{' && n->n_props && s->pos[s->depth - 1] >= n->n_props) return -1; /* no property left */
            s->mode = top == '{' ? M_KEY : M_VALUE, s->ws = 0;
            if (top == '[') s->vnode = (uint16_t)n->items;
            return 0;
        }
        if (c != (top == '{' ? '}' : ']') || (top == '{' && !may_close(g, s))) return -1;
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
    return s->mode == M_END || (s->mode == M_NUM && s->depth == 0 && !g->suffix_len && num_complete(s)) ||
        (s->mode == M_ENUM && s->depth == 0 && !g->suffix_len && enum_need(g, s) == 0);
}

/* Bytes that close the open containers (each with a member written) and write the suffix. */
static int close_all(const jg_spec *g, const jg_state *s) {
    int n = g->suffix_len;
    for (int d = 0; d < s->depth; d++) n += s->stack[d] == '[' ? 1 : rest(g, node_of(g, s->node[d]), s->pos[d], 1);
    return n;
}

/* The top object's bytes from a key (the name's lat bytes written, candidates from cand; PKEY)
 * or from a key owed (KEY: lat -1) to its close: the cheapest property to take. */
static int key_need(const jg_spec *g, const jg_state *s, int lat) {
    const jg_node *n = top_node(g, s);
    int pos = s->pos[s->depth - 1], best = 1 << 30;
    if (!n->n_props) return 4 + 1; /* "":0 then '}' */
    const jg_prop *cur = lat >= 0 ? prop_of(g, n, s->cand) : NULL;
    for (int j = lat >= 0 ? s->cand : pos, hi = key_hi(g, n, pos); j <= hi; j++) {
        const jg_prop *p = prop_of(g, n, j);
        if (cur && !same_prefix(p->key, p->klen, cur->key, lat)) continue;
        int c = (lat >= 0 ? p->klen - lat + 1 : p->klen + 2) + 1 + node_of(g, p->node)->min + rest(g, n, j + 1, 1);
        if (c < best) best = c;
    }
    return best;
}

static int enum_need(const jg_spec *g, const jg_state *s) {
    const jg_node *n = node_of(g, s->vnode);
    const jg_lit *cur = lit_of(g, n, s->cand);
    int best = 1 << 30;
    for (int j = s->cand; j < n->n_lits; j++) {
        const jg_lit *l = lit_of(g, n, j);
        if (same_prefix(l->text, l->len, cur->text, s->lat) && l->len - s->lat < best) best = l->len - s->lat;
    }
    return best;
}

int jg_need(const jg_spec *g, const jg_state *s) {
    int close = s->mode == M_SUFFIX || s->mode == M_END ? 0 : close_all(g, s), n;
    int top = s->depth && s->stack[s->depth - 1] == '{' ? rest(g, top_node(g, s), s->pos[s->depth - 1], 1) : 0;
    switch (s->mode) {
    case M_VALUE: n = value_min(g, s, s->vnode) + close; break;
    case M_ARR_FIRST:
    case M_AFTER: n = close; break;
    case M_OBJ_FIRST: n = close - top + rest(g, top_node(g, s), s->pos[s->depth - 1], 0); break;
    case M_KEY: n = close - top + key_need(g, s, -1); break;
    case M_PKEY: n = close - top + key_need(g, s, s->lat); break;
    case M_COLON: n = 1 + node_of(g, s->vnode)->min + close; break;
    case M_STRING: n = s->sub + 1 + (s->key ? 1 + node_of(g, top_node(g, s)->items)->min : 0) + close; break;
    case M_ESC: n = 2 + (s->key ? 1 + node_of(g, top_node(g, s)->items)->min : 0) + close; break;
    case M_UHEX: n = s->sub + 1 + (s->key ? 1 + node_of(g, top_node(g, s)->items)->min : 0) + close; break;
    case M_NUM: n = (num_complete(s) ? 0 : 1) + close; break;
    case M_LIT: n = (int)strlen(lits[s->sub]) - s->at + close; break;
    case M_ENUM: n = enum_need(g, s) + close; break;
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
