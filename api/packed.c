/* packed.c — the scan that cuts token-id and logprob arrays out of a request body, and the
 * placeholders that carry them through json-c. See packed.h for the contract. Layers: JSON
 * lexing (strict, no recursion), cutting one array, the scan, then attaching and serializing. */
#include "api/packed.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <json-c/printbuf.h>

#define PACKED_MAGIC 0x9acced1du
#define SCAN_DEPTH 64 /* json-c's own depth limit (fields.c) */

/* ---------------------------------------------------------------- the nonce */

static char nonce[17]; /* 16 hex digits, fixed for the process */
static pthread_once_t nonce_once = PTHREAD_ONCE_INIT;

static void nonce_init(void) {
    unsigned long long r = 0;
    if (getrandom(&r, sizeof r, 0) != (ssize_t)sizeof r)
        r = (unsigned long long)time(NULL) * 6364136223846793005ULL ^ (unsigned long long)getpid() ^ (uintptr_t)&r;
    snprintf(nonce, sizeof nonce, "%016llx", r);
}

/* ---------------------------------------------------------------- lexing (strict JSON) */

static int is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_digit(char c) { return c >= '0' && c <= '9'; }

static size_t skip_ws(const char *b, size_t i, size_t len) {
    while (i < len && is_ws(b[i])) i++;
    return i;
}

/* The string at b[i] == '"': the index after its closing quote, or 0 when it is not a valid
 * string (json-c accepts raw control bytes in strings; so does this). */
static size_t skip_string(const char *b, size_t i, size_t len) {
    for (i++; i < len; i++) {
        if (b[i] == '"') return i + 1;
        if (b[i] != '\\') continue;
        if (++i >= len) return 0;
        if (b[i] == 'u') {
            for (int k = 1; k <= 4; k++) {
                char h = i + (size_t)k < len ? b[i + (size_t)k] : 0;
                if (!is_digit(h) && !((h | 0x20) >= 'a' && (h | 0x20) <= 'f')) return 0;
            }
            i += 4;
        } else if (!b[i] || !strchr("\"\\/bfnrt", b[i])) {
            return 0;
        }
    }
    return 0;
}

/* The number at b[i]: the index after it, or 0. *integer: no fraction, no exponent. */
static size_t skip_number(const char *b, size_t i, size_t len, int *integer) {
    if (i < len && b[i] == '-') i++;
    if (i >= len || !is_digit(b[i])) return 0;
    if (b[i] == '0') i++;
    else
        while (i < len && is_digit(b[i])) i++;
    *integer = 1;
    if (i < len && b[i] == '.') {
        *integer = 0;
        if (++i >= len || !is_digit(b[i])) return 0;
        while (i < len && is_digit(b[i])) i++;
    }
    if (i < len && (b[i] == 'e' || b[i] == 'E')) {
        *integer = 0;
        if (++i < len && (b[i] == '+' || b[i] == '-')) i++;
        if (i >= len || !is_digit(b[i])) return 0;
        while (i < len && is_digit(b[i])) i++;
    }
    return i;
}

/* ---------------------------------------------------------------- cutting one array */

enum { CUT_NONE, CUT_IDS, CUT_NUMS };

/* Whether json-c reads the literal s (n bytes) to the value this cut would store. */
static int literal_ok(const char *s, size_t n, int integer, int kind) {
    if (kind == CUT_NUMS) return !integer || n - (s[0] == '-') <= 18; /* int64 exactly, then (double) */
    if (!integer || s[0] == '-' || n > 10) return 0;
    return n < 10 || memcmp(s, "2147483647", 10) <= 0;
}

static void *set_push(api_packed_set *set, api_packed *p) {
    if (set->n == set->cap) {
        int nc = set->cap ? set->cap * 2 : 16;
        api_packed **nv = realloc(set->v, sizeof *nv * (size_t)nc);
        if (!nv) return NULL;
        set->v = nv;
        set->cap = nc;
    }
    return set->v[set->n++] = p;
}

/* The array at b[i] == '[' of kind CUT_IDS or CUT_NUMS: cut it (return the index after its ']')
 * or leave it (return 0). */
static size_t cut_array(char *b, size_t i, size_t len, int kind, api_packed_set *set) {
    int n = 0, integer;
    size_t j = skip_ws(b, i + 1, len);
    if (j >= len || b[j] == ']') return 0;
    for (;;) {
        size_t e = skip_number(b, j, len, &integer);
        if (!e || !literal_ok(b + j, e - j, integer, kind) || n == INT32_MAX) return 0;
        n++;
        j = skip_ws(b, e, len);
        if (j >= len) return 0;
        if (b[j] == ']') break;
        if (b[j] != ',') return 0;
        j = skip_ws(b, j + 1, len);
    }
    size_t end = j + 1;
    char ph[48];
    int pl = snprintf(ph, sizeof ph, "\"gp%s:%d\"", nonce, set->n);
    if ((size_t)pl > end - i) return 0; /* shorter than its placeholder */
    size_t el = kind == CUT_IDS ? sizeof(int32_t) : sizeof(double);
    api_packed *p = malloc(sizeof *p + el * (size_t)n);
    if (!p) return 0;
    *p = (api_packed){.magic = PACKED_MAGIC, .n = n};
    if (kind == CUT_IDS) p->ids = (int32_t *)(p + 1);
    else p->nums = (double *)(p + 1);
    j = i + 1;
    for (int k = 0; k < n; k++) {
        j = skip_ws(b, j, len);
        size_t e = skip_number(b, j, len, &integer);
        if (kind == CUT_IDS) {
            int32_t v = 0;
            for (size_t t = j; t < e; t++) v = v * 10 + (b[t] - '0');
            p->ids[k] = v;
        } else {
            p->nums[k] = integer ? (double)strtoll(b + j, NULL, 10) : strtod(b + j, NULL);
        }
        j = skip_ws(b, e, len) + 1; /* past ',' (or the final ']') */
    }
    if (!set_push(set, p)) {
        free(p);
        return 0;
    }
    memcpy(b + i, ph, (size_t)pl);
    memset(b + i + pl, ' ', end - i - (size_t)pl);
    return end;
}

/* ---------------------------------------------------------------- the scan */

/* Where a container sits: the request's top level, its groups array, a group, a group's
 * responses array, a response, or anywhere else. */
enum { R_OTHER, R_ROOT, R_GROUPS, R_GROUP, R_RESPS, R_RESP };
enum { K_OTHER, K_GROUPS, K_TOKENS, K_PROMPT_IDS, K_RESPONSES, K_TOKEN_IDS, K_LOGPROBS, K_LOSS_MASK };

typedef struct {
    char obj, role, key; /* key: the member being read (an object's) */
} frame;

static int key_id(const char *k, size_t n) {
    static const char *const names[] = {"", "groups", "tokens", "prompt_ids", "responses", "token_ids", "logprobs", "loss_mask"};
    for (int i = 1; i < (int)(sizeof names / sizeof *names); i++)
        if (strlen(names[i]) == n && !memcmp(names[i], k, n)) return i;
    return K_OTHER; /* escaped keys too: they stay json-c's */
}

/* A value about to be read under st[d-1] (d = 0: the body itself): its role if it is a
 * container, and whether an array there is cut. */
static int value_role(const frame *st, int d, int *cut) {
    *cut = CUT_NONE;
    if (d == 0) return R_ROOT;
    const frame *p = &st[d - 1];
    if (p->obj && p->role == R_ROOT) {
        if (p->key == K_TOKENS) *cut = CUT_IDS;
        return p->key == K_GROUPS ? R_GROUPS : R_OTHER;
    }
    if (!p->obj && p->role == R_GROUPS) return R_GROUP;
    if (p->obj && p->role == R_GROUP) {
        if (p->key == K_PROMPT_IDS) *cut = CUT_IDS;
        return p->key == K_RESPONSES ? R_RESPS : R_OTHER;
    }
    if (!p->obj && p->role == R_RESPS) return R_RESP;
    if (p->obj && p->role == R_RESP) {
        if (p->key == K_TOKEN_IDS || p->key == K_LOSS_MASK) *cut = CUT_IDS;
        if (p->key == K_LOGPROBS) *cut = CUT_NUMS;
    }
    return R_OTHER;
}

void api_packed_cut(char *b, size_t len, api_packed_set *set) {
    pthread_once(&nonce_once, nonce_init);
    frame st[SCAN_DEPTH];
    int d = 0, cut;
    enum { VALUE, AFTER, KEY } want = VALUE;
    size_t i = skip_ws(b, 0, len), e;
    int integer;
    for (;;) {
        if (i >= len) return;
        if (want == VALUE) {
            int role = value_role(st, d, &cut);
            char c = b[i];
            want = AFTER;
            if (c == '[' && cut && (e = cut_array(b, i, len, cut, set))) {
                i = e;
            } else if (c == '{' || c == '[') {
                if (d == SCAN_DEPTH) return;
                st[d++] = (frame){c == '{', (char)role, K_OTHER};
                i = skip_ws(b, i + 1, len);
                if (i < len && b[i] == (c == '{' ? '}' : ']')) {
                    d--;
                    i++;
                } else want = c == '{' ? KEY : VALUE;
            } else if (c == '"') {
                if (!(i = skip_string(b, i, len))) return;
            } else if (c == '-' || is_digit(c)) {
                if (!(i = skip_number(b, i, len, &integer))) return;
            } else if (len - i >= 4 && (!memcmp(b + i, "true", 4) || !memcmp(b + i, "null", 4))) {
                i += 4;
            } else if (len - i >= 5 && !memcmp(b + i, "false", 5)) {
                i += 5;
            } else {
                return;
            }
        } else if (want == AFTER) {
            if (d == 0) return; /* the body's value is whole */
            i = skip_ws(b, i, len);
            if (i >= len) return;
            frame *f = &st[d - 1];
            if (b[i] == ',') {
                i = skip_ws(b, i + 1, len);
                want = f->obj ? KEY : VALUE;
            } else if (b[i] == (f->obj ? '}' : ']')) {
                d--;
                i++;
            } else {
                return;
            }
        } else {
            if (b[i] != '"' || !(e = skip_string(b, i, len))) return;
            st[d - 1].key = (char)key_id(b + i + 1, e - i - 2);
            i = skip_ws(b, e, len);
            if (i >= len || b[i] != ':') return;
            i = skip_ws(b, i + 1, len);
            want = VALUE;
        }
    }
}

/* ---------------------------------------------------------------- attaching, serializing */

static void packed_delete(json_object *jso, void *ud) { free(ud); }

static void indent(struct printbuf *pb, int level, int flags) {
    if (!(flags & JSON_C_TO_STRING_PRETTY)) return;
    if (flags & JSON_C_TO_STRING_PRETTY_TAB) printbuf_memset(pb, -1, '\t', level);
    else printbuf_memset(pb, -1, ' ', level * 2);
}

/* json-c's array serializer (json_object.c) over the packed elements, each printed as json-c
 * prints an int (ids) or a double made by json_object_new_double (logprobs). */
static int packed_to_json(json_object *jso, struct printbuf *pb, int level, int flags) {
    const api_packed *p = json_object_get_userdata(jso);
    int pretty = flags & JSON_C_TO_STRING_PRETTY, spaced = (flags & JSON_C_TO_STRING_SPACED) && !pretty;
    json_object *d = p->nums ? json_object_new_double(0) : NULL;
    if (p->nums && !d) return -1;
    printbuf_strappend(pb, "[");
    if (pretty) printbuf_strappend(pb, "\n");
    for (int i = 0; i < p->n; i++) {
        if (i) {
            printbuf_strappend(pb, ",");
            if (pretty) printbuf_strappend(pb, "\n");
        }
        if (spaced) printbuf_strappend(pb, " ");
        indent(pb, level + 1, flags);
        if (p->ids) {
            char t[16];
            printbuf_memappend(pb, t, snprintf(t, sizeof t, "%d", p->ids[i]));
        } else {
            json_object_set_double(d, p->nums[i]);
            if (json_object_double_to_json_string(d, pb, level + 1, flags) < 0) {
                json_object_put(d);
                return -1;
            }
        }
    }
    json_object_put(d);
    if (pretty) {
        if (p->n) printbuf_strappend(pb, "\n");
        indent(pb, level, flags);
    }
    return spaced ? printbuf_strappend(pb, " ]") : printbuf_strappend(pb, "]");
}

static void attach_one(json_object *o, const char *key, api_packed_set *set) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string)) return;
    const char *s = json_object_get_string(v);
    int sl = json_object_get_string_len(v), idx = 0, k = 19;
    if (sl < 20 || sl > 28 || memcmp(s, "gp", 2) || memcmp(s + 2, nonce, 16) || s[18] != ':') return;
    for (; k < sl && is_digit(s[k]); k++) idx = idx * 10 + (s[k] - '0');
    if (k != sl || idx >= set->n || !set->v[idx]) return;
    json_object_set_serializer(v, packed_to_json, set->v[idx], packed_delete);
    set->v[idx] = NULL;
}

void api_packed_attach(json_object *root, api_packed_set *set) {
    json_object *groups, *resps;
    if (set->n && json_object_is_type(root, json_type_object)) {
        attach_one(root, "tokens", set);
        if (json_object_object_get_ex(root, "groups", &groups) && json_object_is_type(groups, json_type_array))
            for (size_t i = 0; i < json_object_array_length(groups); i++) {
                json_object *g = json_object_array_get_idx(groups, i);
                if (!json_object_is_type(g, json_type_object)) continue;
                attach_one(g, "prompt_ids", set);
                if (!json_object_object_get_ex(g, "responses", &resps) || !json_object_is_type(resps, json_type_array)) continue;
                for (size_t k = 0; k < json_object_array_length(resps); k++) {
                    json_object *r = json_object_array_get_idx(resps, k);
                    if (!json_object_is_type(r, json_type_object)) continue;
                    attach_one(r, "token_ids", set);
                    attach_one(r, "logprobs", set);
                    attach_one(r, "loss_mask", set);
                }
            }
    }
    for (int i = 0; i < set->n; i++) free(set->v[i]);
    free(set->v);
    *set = (api_packed_set){0};
}

const api_packed *api_packed_of(json_object *v) {
    if (!json_object_is_type(v, json_type_string)) return NULL;
    const api_packed *p = json_object_get_userdata(v);
    return p && p->magic == PACKED_MAGIC ? p : NULL;
}

/* ---------------------------------------------------------------- stored JSON */

json_object *api_packed_parse(const char *text) {
    size_t len = strlen(text);
    char *b = malloc(len + 1);
    if (!b) return NULL;
    memcpy(b, text, len + 1);
    api_packed_set set = {0};
    api_packed_cut(b, len, &set);
    json_object *o = json_tokener_parse(b);
    api_packed_attach(o, &set);
    free(b);
    return o;
}

int api_packed_len(json_object *v) {
    const api_packed *p = api_packed_of(v);
    if (p) return p->n;
    return json_object_is_type(v, json_type_array) ? (int)json_object_array_length(v) : 0;
}

int api_packed_int(json_object *v, int i) {
    const api_packed *p = api_packed_of(v);
    if (!p) return json_object_get_int(json_object_array_get_idx(v, (size_t)i));
    assert(p->ids);
    return p->ids[i];
}

double api_packed_num(json_object *v, int i) {
    const api_packed *p = api_packed_of(v);
    if (!p) return json_object_get_double(json_object_array_get_idx(v, (size_t)i));
    return p->nums ? p->nums[i] : p->ids[i];
}
