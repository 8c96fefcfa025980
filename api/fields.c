/* fields.c — the generic half of request validation: api_fail and the limits, strict JSON
 * parsing of a body, the field getters that check one member of an object (type, range,
 * NUL bytes) and name it in the error ("groups[0].n"), api_check_keys for unknown members, the
 * api_put_* helpers for canonical payloads, and UTF-8 sanitizing for text going out. The
 * request kinds built on them are in validate.c; see validate.h and fields.h. */
#include "api/fields.h"

#include <assert.h>
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/packed.h"
#include "api/status.h"
#include "common/err.h"

/* ---------------------------------------------------------------- errors, limits, JSON bodies */

int api_fail(api_error *e, int code, const char *field, const char *fmt, ...) {
    e->code = code;
    e->status = api_http_status(code);
    snprintf(e->field, sizeof e->field, "%s", field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return code;
}

void api_limits_default(api_limits *l) {
    l->max_body_bytes = 8 << 20;
    l->max_n = 64;
    l->max_tokens = 4096;
    l->max_queued_jobs = 1000;
    l->max_groups = 1024;
}

int api_job_id_ok(const char *id) {
    if (!id || strncmp(id, "j_", 2) != 0 || strlen(id) != 18) return 0;
    for (int i = 2; i < 18; i++)
        if (!isxdigit((unsigned char)id[i])) return 0;
    return 1;
}

/* What json-c's tree of body will take, over-estimated from its text: per value the bytes json-c
 * 0.16 allocates on x86-64 (measured with mallinfo2: "{}" 792, "[]" 152, a number or literal
 * 72-104, a string 88 + its length; an object's members within 1.3x). Lenient: it counts what
 * json-c could build before stopping at an error. Packed arrays are placeholders by now. */
static size_t tree_bytes(const char *b, size_t len) {
    size_t est = 0;
    for (size_t i = 0; i < len; i++) {
        char c = b[i];
        if (c == '"') {
            size_t s = i;
            while (++i < len && b[i] != '"')
                if (b[i] == '\\') i++;
            est += 88 + (i - s);
        } else if (c == '{') {
            est += 800;
        } else if (c == '[') {
            est += 160;
        } else if (!strchr("}],: \t\n\r", c)) {
            while (i + 1 < len && !strchr("{}[],:\" \t\n\r", b[i + 1])) i++; /* one number or literal */
            est += 104;
        }
    }
    return est;
}

int api_parse_json_or_reply(char *body, size_t len, const api_limits *l, json_object **out, api_error *e) {
    api_packed_set set = {0};
    *out = NULL;
    if (len <= 0x7fffffff) api_packed_cut(body, len, &set);
    size_t max_tree = l ? (size_t)l->max_body_bytes * 32 : 0, est = max_tree ? tree_bytes(body, len) : 0;
    int rc = est > max_tree
        ? api_fail(e, GE_TOO_LARGE, "",
                   "request body holds too many JSON values: parsing it would take ~%zu MiB, "
                   "over the limit of %zu MiB (32 x --max-body-bytes); token ids and logprobs sent as arrays of "
                   "numbers do not count",
                   est >> 20, max_tree >> 20)
        : api_parse_json_unpacked_or_reply(body, len, out, e);
    api_packed_attach(*out, &set);
    return rc;
}

int api_parse_json_unpacked_or_reply(const char *body, size_t len, json_object **out, api_error *e) {
    *out = NULL;
    if (len == 0) return api_fail(e, GE_BAD_JSON, "", "request body is empty; expected a JSON object");
    if (len > 0x7fffffff) return api_fail(e, GE_TOO_LARGE, "", "request body too large");
    json_tokener *t = json_tokener_new_ex(64);
    if (!t) return api_fail(e, GE_NOMEM, "", "out of memory");
    json_tokener_set_flags(t, JSON_TOKENER_STRICT);
    json_object *o = json_tokener_parse_ex(t, body, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(t);
    size_t used = json_tokener_get_parse_end(t);
    json_tokener_free(t);
    /* json-c waits for more after a bare literal at the end of the buffer ("null" could go on) */
    size_t a = 0, b = len;
    while (a < b && isspace((unsigned char)body[a])) a++;
    while (b > a && isspace((unsigned char)body[b - 1])) b--;
    if (!o && (jerr == json_tokener_success || (b - a == 4 && !memcmp(body + a, "null", 4))))
        return api_fail(e, GE_BAD_JSON, "", "request body is null; expected a JSON object");
    if (!o || jerr != json_tokener_success) {
        json_object_put(o);
        return api_fail(e, GE_BAD_JSON, "", "request body is not valid JSON at byte %zu: %s", used,
                        jerr == json_tokener_continue ? "unexpected end of input" : json_tokener_error_desc(jerr));
    }
    while (used < len && isspace((unsigned char)body[used])) used++;
    if (used < len) {
        json_object_put(o);
        return api_fail(e, GE_BAD_JSON, "", "request body has trailing bytes after the JSON value at byte %zu", used);
    }
    if (!json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        return api_fail(e, GE_BAD_JSON, "", "request body must be a JSON object");
    }
    *out = o;
    return 0;
}

/* ---------------------------------------------------------------- field getters */

void api_path_join(char *out, size_t n, const char *base, const char *key) {
    if (base && *base) snprintf(out, n, "%s.%s", base, key);
    else snprintf(out, n, "%s", key);
}

/* Every key of obj must be in allowed (NULL-terminated). */
int api_check_keys(json_object *obj, const char *path, const char *const *allowed, api_error *e) {
    json_object_object_foreach(obj, key, val) {
        (void)val;
        int ok = 0;
        for (const char *const *a = allowed; *a; a++)
            if (strcmp(*a, key) == 0) {
                ok = 1;
                break;
            }
        if (!ok) {
            char f[128];
            api_path_join(f, sizeof f, path, key);
            return api_fail(e, GE_INVALID, f, "unknown field %s", f);
        }
    }
    return 0;
}

int api_is_num(json_object *v) { return json_object_is_type(v, json_type_int) || json_object_is_type(v, json_type_double); }

int api_get_num(json_object *o, const char *path, const char *key, double lo, double hi, double dflt, double *out, api_error *e) {
    json_object *v;
    *out = dflt;
    if (!json_object_object_get_ex(o, key, &v) || !v) return 0;
    char f[128];
    api_path_join(f, sizeof f, path, key);
    if (!api_is_num(v)) return api_fail(e, GE_INVALID, f, "%s must be a number", f);
    double d = json_object_get_double(v);
    if (!isfinite(d) || d < lo || d > hi) return api_fail(e, GE_INVALID, f, "%s must be %g..%g", f, lo, hi);
    *out = d;
    return 0;
}

int api_get_int(json_object *o, const char *path, const char *key, long long lo, long long hi, long long dflt, long long *out,
                api_error *e) {
    json_object *v;
    *out = dflt;
    if (!json_object_object_get_ex(o, key, &v) || !v) return 0;
    char f[128];
    api_path_join(f, sizeof f, path, key);
    if (!json_object_is_type(v, json_type_int)) return api_fail(e, GE_INVALID, f, "%s must be an integer", f);
    long long x = json_object_get_int64(v);
    if (x < lo || x > hi) return api_fail(e, GE_INVALID, f, "%s must be %lld..%lld", f, lo, hi);
    *out = x;
    return 0;
}

int api_get_bool(json_object *o, const char *path, const char *key, int dflt, int *out, api_error *e) {
    json_object *v;
    *out = dflt;
    if (!json_object_object_get_ex(o, key, &v) || !v) return 0;
    char f[128];
    api_path_join(f, sizeof f, path, key);
    if (!json_object_is_type(v, json_type_boolean)) return api_fail(e, GE_INVALID, f, "%s must be true or false", f);
    *out = json_object_get_boolean(v);
    return 0;
}

/* Member key of o into *v: 1 when present, 0 when absent and optional, the error when absent
 * and required. f (128) receives the member's path for messages. */
static int member(json_object *o, const char *path, const char *key, int required, char *f, json_object **v, api_error *e) {
    api_path_join(f, 128, path, key);
    if (json_object_object_get_ex(o, key, v) && *v) return 1;
    return required ? api_fail(e, GE_INVALID, f, "%s is required", f) : 0;
}

/* *out is NULL when absent (and not required). */
int api_get_str(json_object *o, const char *path, const char *key, int required, const char **out, api_error *e) {
    json_object *v;
    *out = NULL;
    char f[128];
    int rc = member(o, path, key, required, f, &v, e);
    if (rc <= 0) return rc;
    if (!json_object_is_type(v, json_type_string)) return api_fail(e, GE_INVALID, f, "%s must be a string", f);
    *out = json_object_get_string(v);
    if (strlen(*out) != (size_t)json_object_get_string_len(v))
        return api_fail(e, GE_INVALID, f, "%s must not contain NUL characters", f);
    return 0;
}

/* An object member that must be an object (or absent: *out NULL). */
int api_get_obj(json_object *o, const char *path, const char *key, json_object **out, api_error *e) {
    json_object *v;
    *out = NULL;
    if (!json_object_object_get_ex(o, key, &v) || !v) return 0;
    char f[128];
    api_path_join(f, sizeof f, path, key);
    if (!json_object_is_type(v, json_type_object)) return api_fail(e, GE_INVALID, f, "%s must be an object", f);
    *out = v;
    return 0;
}

int api_get_arr(json_object *o, const char *path, const char *key, int required, int min_len, int max_len, json_object **out,
                api_error *e) {
    json_object *v;
    *out = NULL;
    char f[128];
    int rc = member(o, path, key, required, f, &v, e);
    if (rc <= 0) return rc;
    const api_packed *pk = api_packed_of(v);
    if (!pk && !json_object_is_type(v, json_type_array)) return api_fail(e, GE_INVALID, f, "%s must be an array", f);
    int n = pk ? pk->n : (int)json_object_array_length(v);
    if (n < min_len || n > max_len)
        return api_fail(e, GE_INVALID, f, "%s must have %d..%d elements (has %d)", f, min_len, max_len, n);
    *out = v;
    return 0;
}

/* Token ids: an array of integers in [0, vocab). Returns a new json array in *canon and the
 * ids (malloc'd) in *ids when ids != NULL. */
int api_get_ids(json_object *o, const char *path, const char *key, int required, int min_len, int max_len, int vocab,
                json_object **canon, int **ids, int *n, api_error *e) {
    json_object *a;
    char f[128];
    api_path_join(f, sizeof f, path, key);
    *canon = NULL;
    if (ids) *ids = NULL;
    if (n) *n = 0;
    int rc = api_get_arr(o, path, key, required, min_len, max_len, &a, e);
    if (rc || !a) return rc;
    const api_packed *pk = api_packed_of(a);
    assert(!pk || pk->ids); /* packed.c cuts only integer arrays at token-id members */
    int len = pk ? pk->n : (int)json_object_array_length(a);
    int *buf = malloc(sizeof(int) * (size_t)(len ? len : 1));
    if (!buf) return api_fail(e, GE_NOMEM, f, "out of memory");
    for (int i = 0; i < len; i++) {
        json_object *x = pk ? NULL : json_object_array_get_idx(a, (size_t)i);
        if (!pk && !json_object_is_type(x, json_type_int)) {
            free(buf);
            return api_fail(e, GE_INVALID, f, "%s[%d] must be an integer token id", f, i);
        }
        long long t = pk ? pk->ids[i] : json_object_get_int64(x);
        if (t < 0 || t >= vocab) {
            free(buf);
            return api_fail(e, GE_INVALID, f, "%s[%d] = %lld is outside the vocabulary 0..%d", f, i, t, vocab - 1);
        }
        buf[i] = (int)t;
    }
    /* every element is an int in range: the array (json-c's, or a packed one that serializes
     * as one) is its own canonical form, shared */
    *canon = json_object_get(a);
    if (ids) *ids = buf;
    else free(buf);
    if (n) *n = len;
    return 0;
}

void api_put_num(json_object *o, const char *k, double v) { json_object_object_add(o, k, json_object_new_double(v)); }
void api_put_int(json_object *o, const char *k, long long v) { json_object_object_add(o, k, json_object_new_int64(v)); }
void api_put_bool(json_object *o, const char *k, int v) { json_object_object_add(o, k, json_object_new_boolean(v)); }
void api_put_str(json_object *o, const char *k, const char *v) { json_object_object_add(o, k, json_object_new_string(v)); }
void api_put_copy(json_object *o, const char *k, json_object *v) {
    json_object *c = NULL;
    if (json_object_deep_copy(v, &c, NULL) == 0) json_object_object_add(o, k, c);
}

/* ---------------------------------------------------------------- text out */

char *api_utf8_sanitize(const char *s, size_t len, size_t *out_len) {
    char *o = malloc(len * 3 + 1);
    if (!o) return NULL;
    size_t k = 0;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < len;) {
        unsigned c = p[i];
        int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        int ok = n > 0 && i + (size_t)n <= len && !(n == 1 && c == 0);
        for (int t = 1; ok && t < n; t++) ok = (p[i + t] & 0xC0) == 0x80;
        if (ok && n == 2) ok = c >= 0xC2;
        if (ok && n == 3) ok = !(c == 0xE0 && p[i + 1] < 0xA0) && !(c == 0xED && p[i + 1] >= 0xA0);
        if (ok && n == 4) ok = c <= 0xF4 && !(c == 0xF0 && p[i + 1] < 0x90) && !(c == 0xF4 && p[i + 1] >= 0x90);
        if (ok) {
            memcpy(o + k, p + i, (size_t)n);
            k += (size_t)n;
            i += (size_t)n;
        } else {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
            i++;
        }
    }
    o[k] = 0;
    *out_len = k;
    return o;
}
