/* json.h — a small read-only JSON DOM for the engine's own files (config.json, safetensors
 * headers, tokenizer.json). The engine builds without json-c (the GPU image lacks it), so it
 * carries this reader; the daemon's API uses json-c. Not a general library: no writer beyond
 * string escaping, no streaming, numbers as double.
 *
 * One arena owns every value of a document: js_doc_free releases all of it at once. */
#ifndef GRPOD_JSON_H
#define GRPOD_JSON_H
#include <stddef.h>
#include <stdio.h>

typedef enum { JS_NULL, JS_FALSE, JS_TRUE, JS_NUM, JS_STR, JS_ARR, JS_OBJ } js_type;

typedef struct js js;
struct js {
    js_type type;
    int n; /* ARR/OBJ: element count; STR: byte length (may hold NUL) */
    union {
        double num; /* NUM */
        char *str; /* STR: UTF-8, NUL-terminated */
        js *items; /* ARR/OBJ: n values */
    };
    char **keys; /* OBJ: n keys, NUL-terminated, in document order */
};

typedef struct js_doc js_doc;

/* Parse text[0..len). On success *doc owns the tree and *root points into it; returns 0.
 * On failure returns GE_FORMAT with err_msg() "line L col C: what" and *doc is NULL. */
int js_parse(const char *text, size_t len, js_doc **doc, const js **root);
/* Read and parse a whole file; errors name the path. */
int js_parse_file(const char *path, js_doc **doc, const js **root);
void js_doc_free(js_doc *doc);

const js *js_get(const js *obj, const char *key); /* NULL if absent or obj not an object */
const char *js_str(const js *v); /* NULL unless a string */
double js_num(const js *v, double dflt); /* dflt unless a number */
int js_bool(const js *v, int dflt); /* dflt unless true/false */
/* Object member helpers: js_num(js_get(o, k), dflt) and so on. */
static inline double js_get_num(const js *o, const char *k, double d) { return js_num(js_get(o, k), d); }
static inline const char *js_get_str(const js *o, const char *k) { return js_str(js_get(o, k)); }
static inline int js_get_bool(const js *o, const char *k, int d) { return js_bool(js_get(o, k), d); }

/* Write s[0..len) as a quoted JSON string with escapes. */
void js_write_str(FILE *f, const char *s, size_t len);
#endif
