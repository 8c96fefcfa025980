/* json_schema.c — a JSON Schema subset compiled into the node table that json_grammar.c's
 * automaton walks (json_grammar.h: jg_schema).
 *
 * Enforced: type (a name or a list: string, integer, number, boolean, null, object, array),
 * properties (written in their order, each at most once; no other key), required, enum and
 * const (the value written as json.dumps writes it), items (one schema for every element),
 * additionalProperties (false, or, on an object without properties, the schema of every value).
 * anyOf whose branches only name types (pydantic's Optional[X]: [{"type": X}, {"type": "null"}])
 * is the union of those types; other anyOf is refused.
 * Ignored (annotations): title, description, default, examples, format, $schema, $id, $comment,
 * deprecated, readOnly, writeOnly, and keywords this table does not know. Refused (GE_INVALID,
 * the keyword's path named): validation keywords the automaton does not enforce — $ref, other
 * anyOf, oneOf, allOf, not, if/then/else, pattern, min/max lengths, items and properties counts, ranges,
 * multipleOf, uniqueItems, prefixItems, patternProperties, ... — so an output never breaks a
 * schema that was accepted. A missing type is inferred: object with properties, array with
 * items, any value otherwise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "engine/format/json.h"
#include "engine/text/json_grammar.h"

enum { MAX_NODES = 4096, MAX_PROPS = 255, MAX_KEY = 255, MAX_LIT = 1024 };

static const char *const refused[] = {"$ref",
                                      "$defs",
                                      "definitions",
                                      "oneOf",
                                      "allOf",
                                      "not",
                                      "if",
                                      "then",
                                      "else",
                                      "pattern",
                                      "patternProperties",
                                      "minLength",
                                      "maxLength",
                                      "minimum",
                                      "maximum",
                                      "exclusiveMinimum",
                                      "exclusiveMaximum",
                                      "multipleOf",
                                      "minItems",
                                      "maxItems",
                                      "uniqueItems",
                                      "prefixItems",
                                      "contains",
                                      "minContains",
                                      "maxContains",
                                      "minProperties",
                                      "maxProperties",
                                      "propertyNames",
                                      "dependentRequired",
                                      "dependentSchemas",
                                      "dependencies",
                                      "unevaluatedProperties",
                                      "unevaluatedItems",
                                      "additionalItems",
                                      NULL};
static const struct {
    const char *name;
    int bits;
} type_names[] = {{"string", JG_T_STR},   {"integer", JG_T_INT}, {"number", JG_T_INT | JG_T_NUM},
                  {"boolean", JG_T_BOOL}, {"null", JG_T_NULL},   {"object", JG_T_OBJ},
                  {"array", JG_T_ARR}};

typedef struct {
    jg_schema *s;
    int cap_nodes, cap_props, cap_lits;
    char path[256];
} build;

/* ---------------------------------------------------------------- canonical texts */

typedef struct {
    char *p;
    size_t n, cap;
    int oom;
} sb;

static void put(sb *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = (b->n + n + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void puts_(sb *b, const char *s) { put(b, s, strlen(s)); }

/* A string's content as json.dumps(ensure_ascii=False) writes it, without the quotes. */
static void escaped(sb *b, const char *s, size_t n) {
    static const char *const esc[32] = {['\b'] = "\\b", ['\f'] = "\\f", ['\n'] = "\\n", ['\r'] = "\\r", ['\t'] = "\\t"};
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char u[8];
        if (c == '"') puts_(b, "\\\"");
        else if (c == '\\') puts_(b, "\\\\");
        else if (c >= 0x20) put(b, s + i, 1);
        else if (esc[c]) puts_(b, esc[c]);
        else snprintf(u, sizeof u, "\\u%04x", c), puts_(b, u);
    }
}

/* A value as json.dumps writes it (integral numbers without a fraction). */
static void dump(sb *b, const js *v) {
    char num[40];
    switch (v->type) {
    case JS_NULL: puts_(b, "null"); break;
    case JS_FALSE: puts_(b, "false"); break;
    case JS_TRUE: puts_(b, "true"); break;
    case JS_NUM:
        if (v->num == (double)(long long)v->num && v->num > -1e15 && v->num < 1e15)
            snprintf(num, sizeof num, "%lld", (long long)v->num);
        else snprintf(num, sizeof num, "%.17g", v->num);
        puts_(b, num);
        break;
    case JS_STR:
        puts_(b, "\"");
        escaped(b, v->str, (size_t)v->n);
        puts_(b, "\"");
        break;
    case JS_ARR:
    case JS_OBJ:
        puts_(b, v->type == JS_ARR ? "[" : "{");
        for (int i = 0; i < v->n; i++) {
            if (i) puts_(b, ", ");
            if (v->type == JS_OBJ) {
                puts_(b, "\"");
                escaped(b, v->keys[i], strlen(v->keys[i]));
                puts_(b, "\": ");
            }
            dump(b, &v->items[i]);
        }
        puts_(b, v->type == JS_ARR ? "]" : "}");
        break;
    }
}

/* ---------------------------------------------------------------- the table */

static int fail(build *b, const char *what) { return err_set(GE_INVALID, "%s%s%s", b->path, *b->path ? ": " : "", what); }

static int grow(void **p, int *cap, int need, size_t size) {
    if (need <= *cap) return 0;
    int c = *cap ? *cap * 2 : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q) return err_set(GE_NOMEM, "guided schema: out of memory");
    *p = q, *cap = c;
    return 0;
}

static int new_node(build *b, int *out) {
    jg_schema *s = b->s;
    if (s->n_nodes >= MAX_NODES) return fail(b, "the schema has too many subschemas");
    if (grow((void **)&s->nodes, &b->cap_nodes, s->n_nodes + 1, sizeof *s->nodes)) return GE_NOMEM;
    s->nodes[s->n_nodes] = (jg_node){.types = JG_T_ANY, .min = 1};
    *out = s->n_nodes++;
    return 0;
}

/* path + "." + key (or "[i]"), restored by the caller. */
static size_t push_path(build *b, const char *key) {
    size_t at = strlen(b->path);
    snprintf(b->path + at, sizeof b->path - at, "%s%s", at ? "." : "", key);
    return at;
}

static int compile(build *b, const js *v, int depth, int *out);

static int types_of(build *b, const js *t, int *bits) {
    *bits = 0;
    int n = t->type == JS_ARR ? t->n : 1;
    for (int i = 0; i < n; i++) {
        const char *name = js_str(t->type == JS_ARR ? &t->items[i] : t);
        int k = -1;
        for (size_t j = 0; name && j < sizeof type_names / sizeof *type_names; j++)
            if (!strcmp(name, type_names[j].name)) k = (int)j;
        if (k < 0) return fail(b, "type must be string, integer, number, boolean, null, object or array (or a list of them)");
        *bits |= type_names[k].bits;
    }
    return *bits ? 0 : fail(b, "type lists no type");
}

static int is_annotation(const char *k) {
    static const char *const names[] = {"title", "description", "default",    "examples", "format",    "$schema",
                                        "$id",   "$comment",    "deprecated", "readOnly", "writeOnly", NULL};
    for (int i = 0; names[i]; i++)
        if (!strcmp(k, names[i])) return 1;
    return 0;
}

/* anyOf [{"type": ...}, ...] (branches that name types and nothing else; true or {} is any):
 * the union of their types. */
static int any_of(build *b, const js *a, int *bits) {
    size_t at = push_path(b, "anyOf");
    int rc = 0;
    *bits = 0;
    if (a->type != JS_ARR || !a->n) rc = fail(b, "anyOf must be a non-empty array of schemas");
    for (int i = 0; !rc && i < a->n; i++) {
        const js *br = &a->items[i];
        int t = JG_T_ANY;
        for (int k = 0; br->type == JS_OBJ && !rc && k < br->n; k++) {
            if (!strcmp(br->keys[k], "type")) rc = types_of(b, &br->items[k], &t);
            else if (!is_annotation(br->keys[k]))
                rc = fail(b, "not supported: anyOf is kept only when each branch names types and nothing else");
        }
        if (!rc && br->type != JS_OBJ && br->type != JS_TRUE) rc = fail(b, "anyOf's branches must be schemas");
        *bits |= t;
    }
    if (!rc) b->path[at] = 0;
    return rc;
}

static int enum_of(build *b, jg_node *nd, const js *vals, int n) {
    jg_schema *s = b->s;
    nd->lit0 = s->n_lits;
    nd->min = 0;
    for (int i = 0; i < n; i++) {
        sb t = {0};
        dump(&t, &vals[i]);
        if (t.oom || grow((void **)&s->lits, &b->cap_lits, s->n_lits + 1, sizeof *s->lits)) {
            free(t.p);
            return err_set(GE_NOMEM, "guided schema: out of memory");
        }
        if (t.n > MAX_LIT) {
            free(t.p);
            return fail(b, "an enum value is longer than 1024 bytes as JSON");
        }
        s->lits[s->n_lits++] = (jg_lit){t.p, (int)t.n};
        nd->n_lits++;
        if (!nd->min || (int)t.n < nd->min) nd->min = (int)t.n;
    }
    return n ? 0 : fail(b, "enum is empty: no value could be written");
}

static int props_of(build *b, int self, const js *props, const js *req, int depth) {
    jg_schema *s = b->s;
    if (props->n > MAX_PROPS) return fail(b, "properties: more than 255");
    int first = s->n_props;
    if (grow((void **)&s->props, &b->cap_props, s->n_props + props->n, sizeof *s->props)) return GE_NOMEM;
    s->n_props += props->n;
    for (int i = 0; i < props->n; i++) s->props[first + i] = (jg_prop){0};
    for (int i = 0; i < props->n; i++) {
        sb k = {0};
        escaped(&k, props->keys[i], strlen(props->keys[i]));
        if (k.oom) return err_set(GE_NOMEM, "guided schema: out of memory");
        s->props[first + i].key = k.p ? k.p : strdup("");
        s->props[first + i].klen = (int)k.n;
        if (k.n > MAX_KEY) return fail(b, "a property name is longer than 255 bytes");
        size_t at = push_path(b, "properties"), at2 = push_path(b, props->keys[i]);
        int node, rc = compile(b, &props->items[i], depth + 1, &node);
        if (rc) return rc;
        b->path[at2] = 0, b->path[at] = 0;
        s->props[first + i].node = node;
    }
    for (int i = 0; req && i < req->n; i++) {
        const char *name = js_str(&req->items[i]);
        int found = -1;
        for (int j = 0; name && j < props->n; j++)
            if (!strcmp(props->keys[j], name)) found = j;
        if (found < 0) return fail(b, "required names a property that is not in properties");
        s->props[first + found].required = 1;
    }
    int suf = 0; /* "key":min, for each required property from here on */
    for (int i = props->n - 1; i >= 0; i--) {
        jg_prop *p = &s->props[first + i];
        if (p->required) suf += p->klen + 4 + s->nodes[p->node].min;
        p->suf = suf;
    }
    jg_node *nd = &s->nodes[self];
    nd->prop0 = first, nd->n_props = props->n;
    return 0;
}

/* The shortest value of nd's types: "" 2, 0 1, true / null 4, [] 2, {required…} (props set). */
static int min_of(const jg_schema *s, const jg_node *nd) {
    int m = 1 << 30, obj = nd->n_props ? 1 + (nd->n_props ? s->props[nd->prop0].suf : 0) + 1 - (s->props[nd->prop0].suf > 0) : 2;
    if (nd->types & (JG_T_INT | JG_T_NUM)) m = 1;
    if ((nd->types & JG_T_STR) && 2 < m) m = 2;
    if ((nd->types & JG_T_ARR) && 2 < m) m = 2;
    if ((nd->types & JG_T_OBJ) && obj < m) m = obj;
    if ((nd->types & (JG_T_BOOL | JG_T_NULL)) && 4 < m) m = 4;
    return m;
}

static int compile(build *b, const js *v, int depth, int *out) {
    int self, rc;
    if (depth >= JG_DEPTH) return fail(b, "nested deeper than the grammar's 32 levels");
    if (v->type == JS_TRUE || (v->type == JS_OBJ && v->n == 0)) { /* any value */
        *out = 0;
        return 0;
    }
    if (v->type != JS_OBJ) return fail(b, "a schema must be an object (or true)");
    for (int i = 0; i < v->n; i++)
        for (int j = 0; refused[j]; j++)
            if (!strcmp(v->keys[i], refused[j])) {
                size_t at = push_path(b, refused[j]);
                rc = fail(b,
                          "not supported: constrained decoding enforces type, properties, required, enum, const, items, "
                          "additionalProperties and anyOf of types only");
                b->path[at] = 0;
                return rc;
            }
    if ((rc = new_node(b, &self))) return rc;
    const js *type = js_get(v, "type"), *props = js_get(v, "properties"), *req = js_get(v, "required");
    const js *items = js_get(v, "items"), *en = js_get(v, "enum"), *cn = js_get(v, "const"),
             *ap = js_get(v, "additionalProperties");
    const js *any = js_get(v, "anyOf");
    int bits = JG_T_ANY, union_bits;
    if (type && (rc = types_of(b, type, &bits))) return rc;
    if (any && (rc = any_of(b, any, &union_bits))) return rc;
    if (any) bits = type ? bits & union_bits : union_bits;
    if (!bits) return fail(b, "type and anyOf leave no type");
    if (!type && !any && props) bits = JG_T_OBJ;
    if (!type && !any && !props && items) bits = JG_T_ARR;
    b->s->nodes[self].types = (unsigned char)bits;
    if (props && props->type != JS_OBJ) return fail(b, "properties must be an object");
    if (req && req->type != JS_ARR) return fail(b, "required must be an array of names");
    if (req && !props && req->n) return fail(b, "required names properties, and there are none");
    if (props && props->n && (rc = props_of(b, self, props, req, depth))) return rc;
    if (ap && ap->type == JS_FALSE && (!props || !props->n)) b->s->nodes[self].closed = 1; /* only {} */
    const js *sub = items ? items : (!props || !props->n) && ap && ap->type == JS_OBJ ? ap : NULL;
    if (sub) {
        size_t at = push_path(b, items ? "items" : "additionalProperties");
        int node;
        if ((rc = compile(b, sub, depth + 1, &node))) return rc;
        b->path[at] = 0;
        b->s->nodes[self].items = node;
    }
    if (en && en->type != JS_ARR) return fail(b, "enum must be an array");
    if (cn && (rc = enum_of(b, &b->s->nodes[self], cn, 1))) return rc;
    else if (!cn && en && (rc = enum_of(b, &b->s->nodes[self], en->items, en->n))) return rc;
    if (!b->s->nodes[self].n_lits) b->s->nodes[self].min = min_of(b->s, &b->s->nodes[self]);
    *out = self;
    return 0;
}

int jg_schema_compile(const char *json, size_t len, jg_schema **out) {
    *out = NULL;
    js_doc *doc = NULL;
    const js *root;
    if (js_parse(json, len, &doc, &root)) return err_set(GE_INVALID, "the schema is not JSON: %s", err_msg());
    jg_schema *s = calloc(1, sizeof *s);
    build b = {.s = s};
    int rc = s ? 0 : err_set(GE_NOMEM, "guided schema: out of memory"), top = 0, any;
    if (!rc) rc = new_node(&b, &any); /* node 0: any value */
    if (!rc) rc = compile(&b, root, 0, &top);
    js_doc_free(doc);
    if (!rc) s->root = top;
    if (rc) {
        jg_schema_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void jg_schema_free(jg_schema *s) {
    if (!s) return;
    for (int i = 0; i < s->n_props; i++) free(s->props[i].key);
    for (int i = 0; i < s->n_lits; i++) free(s->lits[i].text);
    free(s->nodes);
    free(s->props);
    free(s->lits);
    free(s);
}
