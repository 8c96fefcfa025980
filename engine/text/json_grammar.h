/* json_grammar.h — constrained decoding's grammar: a JSON value (any value, or an object), then a
 * fixed suffix text, then the end of the sequence, as a byte automaton; and, for a state, the
 * mask of the vocabulary's tokens that keep the output inside the grammar.
 *
 * The automaton reads UTF-8 bytes: RFC 8259 JSON with at most JG_DEPTH nested containers, at
 * most JG_WS_MAX whitespace bytes in a row (none before the value: the answer starts with it),
 * strings of valid UTF-8 (RFC 3629: no overlong forms, no surrogates) without control characters,
 * and \u escapes that are not surrogates (so every decoder reads the text back). A state is a small value: copy it to try a token.
 *
 * Always finishing: jg_need is the length in bytes of the shortest completion from a state (the
 * value closed, the suffix written). The mask allows a token only when its state's need, plus
 * one for the end-of-sequence token, still fits in the tokens left, so a response always
 * completes within max_tokens when the vocabulary has every single byte as a token (byte-level
 * BPE does: Qwen, Llama 3, grpod's default model). The need is exact along its own completion
 * (each of its bytes lowers it by one), so the budget never leaves a state with no way out.
 *
 * With a schema (json_schema.c: a JSON Schema subset compiled into nodes) the automaton also
 * keeps each value to its node: the types its first byte may open, an object's keys (its
 * properties in their order, each at most once, the required ones never skipped) and an enum's
 * texts; the shortest completion then writes the required properties' shortest values, so the
 * need stays exact.
 * Threading: a jg_vocab and a jg_schema are immutable once built; everything else is the caller's. */
#ifndef GRPOD_JSON_GRAMMAR_H
#define GRPOD_JSON_GRAMMAR_H
#include <stddef.h>
#include <stdint.h>

#include "engine/text/tokenizer.h"

enum { JG_DEPTH = 32, JG_WS_MAX = 8, JG_SUFFIX_MAX = 256 };

/* A compiled schema (json_schema.c). Node 0 is any value. */
enum { JG_T_STR = 1, JG_T_INT = 2, JG_T_NUM = 4, JG_T_BOOL = 8, JG_T_NULL = 16, JG_T_OBJ = 32, JG_T_ARR = 64, JG_T_ANY = 127 };
typedef struct {
    unsigned char types; /* JG_T_* a value may be (JG_T_NUM: a fraction or exponent allowed) */
    unsigned char closed; /* an object with no properties that takes no key ({} only) */
    int items; /* an array's elements' node; an object without properties: its values' node */
    int prop0, n_props; /* an object's properties (props[prop0, +n_props)); none: any keys */
    int lit0, n_lits; /* enum / const: the texts a value may be (lits[lit0, +n_lits)) */
    int min; /* bytes of the node's shortest value */
} jg_node;
typedef struct {
    char *key; /* the name as written between its quotes (json.dumps' escapes) */
    int klen, node, required;
    int suf; /* bytes of "key":min, for each required property from this one on */
} jg_prop;
typedef struct {
    char *text; /* a value as json.dumps writes it */
    int len;
} jg_lit;
typedef struct {
    jg_node *nodes;
    jg_prop *props;
    jg_lit *lits;
    int n_nodes, n_props, n_lits, root;
} jg_schema;
/* GE_INVALID naming the keyword's path (properties.city.anyOf) for what the subset refuses. */
int jg_schema_compile(const char *json, size_t len, jg_schema **out);
void jg_schema_free(jg_schema *s);

typedef struct {
    int object; /* 1: the value must be an object */
    const jg_schema *schema; /* NULL: any value; not owned */
    char suffix[JG_SUFFIX_MAX + 1]; /* written after the value */
    int suffix_len;
} jg_spec;

typedef struct {
    uint8_t stack[JG_DEPTH]; /* open containers, '{' or '[' */
    uint8_t depth;
    uint8_t mode; /* what the next byte may be (json_grammar.c's M_*) */
    uint8_t sub; /* the mode's progress: UTF-8 bytes owed, hex digits owed, number part, literal */
    uint8_t at; /* a literal's letters matched; in a string, the UTF-8 lead whose first continuation is owed */
    uint8_t key; /* in a string: 1 when it is an object's key */
    uint8_t ws; /* whitespace bytes in a row */
    uint16_t suffix_at; /* suffix bytes written */
    /* with a schema: each open container's node and (objects) the index of its next property;
     * the next value's node; a property name's or an enum text's candidate and bytes matched */
    uint16_t node[JG_DEPTH];
    uint8_t pos[JG_DEPTH];
    uint16_t vnode, cand, lat;
} jg_state;

/* spec's suffix is copied (GE_INVALID past JG_SUFFIX_MAX bytes). */
int jg_spec_init(jg_spec *g, int object, const char *suffix);
void jg_start(const jg_spec *g, jg_state *s);
/* Feeds n bytes: 0, or -1 when they leave the grammar (s then allows only the end). */
int jg_feed(const jg_spec *g, jg_state *s, const char *bytes, size_t n);
/* 1 when the output is complete: the value and the suffix written (only the end may follow). */
int jg_complete(const jg_spec *g, const jg_state *s);
/* Bytes of the shortest completion from s (0 when complete). */
int jg_need(const jg_spec *g, const jg_state *s);

/* A tokenizer's tokens as bytes, decoded once (the engine keeps one per tokenizer). */
typedef struct jg_vocab jg_vocab;
int jg_vocab_build(const tok *t, int V, jg_vocab **out); /* V: the model's vocabulary (>= the tokenizer's) */
void jg_vocab_free(jg_vocab *v);

/* mask ((V + 31) / 32 words, id j at bit j % 32 of word j / 32: the sampler's allow mask): the tokens allowed after s with `left` tokens left to
 * draw (this one included): those whose bytes keep the output in the grammar with room left to
 * complete it, and end ids[0, n_end) (the sequence's end: EOS, stop ids) exactly when s is
 * complete. When the budget allows nothing (left below the shortest completion), the tokens the
 * grammar allows; when even those are none, the end ids. Returns the count allowed. */
int jg_mask(const jg_spec *g, const jg_state *s, const jg_vocab *v, int left, const int *end, int n_end, uint32_t *mask);
#endif
