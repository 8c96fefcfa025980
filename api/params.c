/* params.c — request sections driven by their rows (engine/params.c); see params.h.
 * Layers: bounds and choices, validation → canonical JSON, canonical JSON → engine struct,
 * OpenAPI schema. */
#include "api/params.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/fields.h"
#include "common/err.h"

#define SEED_MAX 0x7fffffffffffffffLL

/* ---------------------------------------------------------------- bounds, choices */

static double hi_of(const eng_param *p, const api_limits *l, const api_model *m, long long prev) {
    switch (p->hi_from) {
    case PB_VOCAB: return m ? m->vocab : p->hi;
    case PB_MAX_TOKENS: return l ? l->max_tokens : p->hi;
    case PB_PREV: return (double)prev;
    case PB_MAX_N: return l ? l->max_n : p->hi;
    default: return p->hi;
    }
}

/* "a|b|c" with the aliases left out: the names a message or a schema lists. */
static void primary_names(const eng_param *p, char *buf, size_t n) {
    size_t k = 0;
    int alias = 0;
    for (const char *c = p->choices; *c && k + 1 < n; c++) {
        if (*c == ',') alias = 1;
        else if (*c == '|') alias = 0;
        if (!alias) buf[k++] = *c;
    }
    buf[k] = 0;
}

/* ---------------------------------------------------------------- validation */

/* stop: a non-empty string, or an array of lo..hi non-empty strings of at most
 * ENG_PARAM_STR_MAX bytes → a canonical array. */
static int strs_or_reply(const eng_param *p, json_object *in, const char *path, json_object *c, api_error *e) {
    json_object *v = NULL, *out = json_object_new_array();
    char f[128];
    api_path_join(f, sizeof f, path, p->name);
    int rc = 0;
    json_object_object_get_ex(in, p->name, &v);
    if (v && json_object_is_type(v, json_type_string)) {
        int len = json_object_get_string_len(v);
        if (len == 0) {
            rc = api_fail(e, GE_INVALID, f, "%s must not be empty", f);
            goto done;
        }
        json_object_array_add(out, json_object_new_string(json_object_get_string(v)));
    } else if (v) {
        json_object *a;
        if ((rc = api_get_arr(in, path, p->name, 0, (int)p->lo, (int)p->hi, &a, e))) goto done;
        for (int i = 0; i < (int)json_object_array_length(a); i++) {
            json_object *x = json_object_array_get_idx(a, (size_t)i);
            int len = json_object_is_type(x, json_type_string) ? json_object_get_string_len(x) : -1;
            if (len < 1 || len > ENG_PARAM_STR_MAX || (int)strlen(json_object_get_string(x)) != len) {
                char fi[144];
                snprintf(fi, sizeof fi, "%s[%d]", f, i);
                rc = api_fail(e, GE_INVALID, fi, "%s must be a non-empty string of at most %d bytes", fi, ENG_PARAM_STR_MAX);
                goto done;
            }
            json_object_array_add(out, json_object_new_string(json_object_get_string(x)));
        }
    }
    json_object_object_add(c, p->name, out);
    return 0;
done:
    json_object_put(out);
    return rc;
}

/* betas: [a, b], each a number in [lo, hi). */
static int pair_or_reply(const eng_param *p, json_object *in, const char *path, json_object *c, api_error *e) {
    json_object *a;
    double b[2] = {p->dflt, p->dflt2};
    int rc = api_get_arr(in, path, p->name, 0, 2, 2, &a, e);
    if (rc) return rc;
    for (int i = 0; a && i < 2; i++) {
        json_object *x = json_object_array_get_idx(a, (size_t)i);
        b[i] = api_is_num(x) ? json_object_get_double(x) : p->lo - 1;
        if (!(b[i] >= p->lo && b[i] < p->hi)) {
            char f[128], fi[144];
            api_path_join(f, sizeof f, path, p->name);
            snprintf(fi, sizeof fi, "%s[%d]", f, i);
            return api_fail(e, GE_INVALID, fi, "%s must be a number in [%g, %g)", fi, p->lo, p->hi);
        }
    }
    json_object *o = json_object_new_array();
    json_object_array_add(o, json_object_new_double(b[0]));
    json_object_array_add(o, json_object_new_double(b[1]));
    json_object_object_add(c, p->name, o);
    return 0;
}

/* veRL's threshold spec "lower_upper" (or "upper"): 0 and the bounds, or -1. */
static int bounds_parse(const char *s, double *lower, double *upper) {
    char *end;
    const char *us = strchr(s, '_');
    *lower = 0;
    if (us) {
        *lower = strtod(s, &end);
        if (end != us || end == s) return -1;
        s = us + 1;
    }
    *upper = strtod(s, &end);
    return end == s || *end ? -1 : 0;
}

/* rollout_is_threshold / rollout_rs_threshold: a number (the upper bound) or "lower_upper", each
 * in (lo, hi], lower <= upper; stored as given (a number, or the string). */
static int bounds_or_reply(const eng_param *p, json_object *in, const char *path, json_object *c, api_error *e) {
    json_object *v;
    char f[128];
    api_path_join(f, sizeof f, path, p->name);
    if (!json_object_object_get_ex(in, p->name, &v) || !v) {
        if (p->dflt > 0) api_put_num(c, p->name, p->dflt);
        return 0;
    }
    double lower = 0, upper = -1;
    int ok = api_is_num(v) || json_object_is_type(v, json_type_string);
    if (api_is_num(v)) upper = json_object_get_double(v);
    else if (ok) ok = bounds_parse(json_object_get_string(v), &lower, &upper) == 0;
    ok = ok && upper > p->lo && upper <= p->hi && (lower == 0 || (lower > p->lo && lower <= upper)) &&
        !(json_object_is_type(v, json_type_string) && strchr(json_object_get_string(v), '_') && lower == 0);
    if (!ok)
        return api_fail(e, GE_INVALID, f, "%s must be a number in (%g, %g] or a string \"lower_upper\" of two, lower <= upper", f,
                        p->lo, p->hi);
    json_object_object_add(c, p->name, json_object_get(v));
    return 0;
}

/* One row of in → its canonical member in c. prev: the value of the row before (PB_PREV). */
static int row_or_reply(const eng_param *p, json_object *in, const char *path, const api_limits *l, const api_model *m,
                        long long *prev, json_object *c, api_error *e) {
    double hi = hi_of(p, l, m, *prev), d;
    long long x;
    int b, rc;
    char f[128];
    api_path_join(f, sizeof f, path, p->name);
    switch (p->type) {
    case PT_NUM:
        if ((rc = api_get_num(in, path, p->name, p->lo, hi, p->dflt, &d, e))) return rc;
        if ((p->flags & PF_LO_OPEN) && d <= p->lo) return api_fail(e, GE_INVALID, f, "%s must be > %g and <= %g", f, p->lo, hi);
        api_put_num(c, p->name, d);
        return 0;
    case PT_INT: {
        long long dflt = (long long)p->dflt;
        if (p->hi_from == PB_MAX_TOKENS && dflt > (long long)hi) dflt = (long long)hi;
        if (p->hi_from == PB_PLAN_MB && m && m->mb_tokens > 0) dflt = m->mb_tokens;
        if ((rc = api_get_int(in, path, p->name, (long long)p->lo, (long long)hi, dflt, &x, e))) return rc;
        if ((p->flags & PF_NEG_OFF) && x < 0) x = 0;
        /* written into the stored job, so a replay micro-batches as the first run did */
        if (p->hi_from == PB_PLAN_MB && m && m->mb_tokens_max > 0 && x > m->mb_tokens_max)
            return api_fail(e, GE_TOO_LARGE, f,
                            "%s %lld is more than one micro-batch's activations can hold on this device "
                            "(%lld tokens with every layer recomputed, GET /v1/model memory_plan): lower it or leave it out",
                            f, x, m->mb_tokens_max);
        if (!(p->flags & PF_OMIT_DFLT) || x != (long long)p->dflt) api_put_int(c, p->name, x);
        *prev = x;
        return 0;
    }
    case PT_STR: {
        const char *s;
        if ((rc = api_get_str(in, path, p->name, 0, &s, e))) return rc;
        if (s) api_put_str(c, p->name, s);
        return 0;
    }
    case PT_BOOL:
        if ((rc = api_get_bool(in, path, p->name, (int)p->dflt, &b, e))) return rc;
        if (!(p->flags & PF_OMIT_DFLT) || b != (int)p->dflt) api_put_bool(c, p->name, b);
        return 0;
    case PT_ENUM: {
        const char *s;
        char names[256], dflt[64];
        if ((rc = api_get_str(in, path, p->name, 0, &s, e))) return rc;
        if (!s) s = eng_param_choice_name(p, (int)p->dflt, dflt, sizeof dflt);
        if (eng_param_choice(p, s) < 0) {
            primary_names(p, names, sizeof names);
            return api_fail(e, GE_INVALID, f, "%s '%.64s' must be one of %s", f, s, names);
        }
        api_put_str(c, p->name, s);
        return 0;
    }
    case PT_SEED:
        /* No seed: draw one now and store it, so a job re-run after a crash samples the same tokens. */
        if ((rc = api_get_int(in, path, p->name, (long long)p->lo, SEED_MAX, -1, &x, e))) return rc;
        if (x < 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            x = (long long)(((unsigned long long)ts.tv_nsec * 2654435761ull ^ (unsigned long long)ts.tv_sec) & 0x7fffffff);
        }
        api_put_int(c, p->name, x);
        return 0;
    case PT_PAIR: return pair_or_reply(p, in, path, c, e);
    case PT_BOUNDS: return bounds_or_reply(p, in, path, c, e);
    case PT_STRS: return strs_or_reply(p, in, path, c, e);
    case PT_IDS: {
        json_object *ids = NULL;
        if ((rc = api_get_ids(in, path, p->name, 0, (int)p->lo, (int)p->hi, m ? m->vocab : 0x7fffffff, &ids, NULL, NULL, e)))
            return rc;
        json_object_object_add(c, p->name, ids ? ids : json_object_new_array());
        return 0;
    }
    case PT_COMPAT: {
        json_object *v = NULL;
        if (json_object_object_get_ex(in, p->name, &v) && v && !json_object_is_type(v, json_type_boolean))
            return api_get_int(in, path, p->name, (long long)p->lo, (long long)p->hi, 0, &x, e);
        return 0;
    }
    }
    return 0;
}

int api_params_check_keys(const eng_params *t, json_object *in, const char *path, const char *const *also_allowed, api_error *e) {
    const char *keys[64];
    int k = 0;
    for (int i = 0; i < t->n && k < 63; i++) keys[k++] = t->rows[i].name;
    for (int i = 0; also_allowed && also_allowed[i] && k < 63; i++) keys[k++] = also_allowed[i];
    keys[k] = NULL;
    return api_check_keys(in, path, keys, e);
}

int api_params_or_reply(const eng_params *t, json_object *in, const char *path, const char *const *also_allowed,
                        const api_limits *l, const api_model *m, json_object **out, api_error *e) {
    int rc = 0;
    json_object *empty = NULL, *c = json_object_new_object();
    if (!in) in = empty = json_object_new_object();
    *out = NULL;
    long long prev = 0;
    if ((rc = api_params_check_keys(t, in, path, also_allowed, e))) goto done;
    for (int i = 0; i < t->n; i++)
        if ((rc = row_or_reply(&t->rows[i], in, path, l, m, &prev, c, e))) goto done;
    *out = c;
    c = NULL;
done:
    json_object_put(c);
    json_object_put(empty);
    return rc;
}

void api_params_move(json_object *dst, json_object *canon) {
    json_object_object_foreach(canon, k, v) json_object_object_add(dst, k, json_object_get(v));
    json_object_put(canon);
}

/* ---------------------------------------------------------------- canonical JSON → struct */

int api_params_to_struct(const eng_params *t, json_object *in, void *dst) {
    char *d = dst;
    eng_params_default(t, dst);
    for (int i = 0; in && i < t->n; i++) {
        const eng_param *p = &t->rows[i];
        json_object *v = NULL;
        if (!json_object_object_get_ex(in, p->name, &v) || !v || p->off < 0) continue;
        switch (p->type) {
        case PT_NUM: *(float *)(d + p->off) = (float)json_object_get_double(v); break;
        case PT_INT:
            if (p->flags & PF_I64) *(long long *)(d + p->off) = json_object_get_int64(v);
            else *(int *)(d + p->off) = (int)json_object_get_int64(v);
            break;
        case PT_BOOL: *(int *)(d + p->off) = (int)json_object_get_int64(v); break;
        case PT_STR: *(const char **)(d + p->off) = json_object_get_string(v); break;
        case PT_SEED: *(uint64_t *)(d + p->off) = (uint64_t)json_object_get_int64(v); break;
        case PT_ENUM: {
            int x = eng_param_choice(p, json_object_get_string(v));
            if (x < 0)
                return err_set(GE_INVALID, "%s%s%s: '%.64s' is not a known choice", t->name, *t->name ? "." : "", p->name,
                               json_object_get_string(v));
            *(int *)(d + p->off) = x;
            break;
        }
        case PT_PAIR:
            if (json_object_is_type(v, json_type_array) && json_object_array_length(v) == 2) {
                *(float *)(d + p->off) = (float)json_object_get_double(json_object_array_get_idx(v, 0));
                *(float *)(d + p->off2) = (float)json_object_get_double(json_object_array_get_idx(v, 1));
            }
            break;
        case PT_BOUNDS: {
            double lower = 0, upper = json_object_get_double(v);
            if (json_object_is_type(v, json_type_string) && bounds_parse(json_object_get_string(v), &lower, &upper))
                return err_set(GE_INVALID, "%s%s%s: '%.64s' is not a threshold", t->name, *t->name ? "." : "", p->name,
                               json_object_get_string(v));
            *(float *)(d + p->off) = (float)upper;
            *(float *)(d + p->off2) = (float)lower;
            break;
        }
        case PT_STRS:
        case PT_IDS: {
            int str = p->type == PT_STRS, one = str && json_object_is_type(v, json_type_string);
            int n = one ? 1 : json_object_is_type(v, json_type_array) ? (int)json_object_array_length(v) : 0;
            void *a = calloc((size_t)n + 1, str ? sizeof(char *) : sizeof(int));
            if (!a) return err_set(GE_NOMEM, "out of memory");
            for (int j = 0; j < n; j++) {
                json_object *x = one ? v : json_object_array_get_idx(v, (size_t)j);
                if (str) ((const char **)a)[j] = json_object_get_string(x);
                else ((int *)a)[j] = json_object_get_int(x);
            }
            *(void **)(d + p->off) = a;
            *(int *)(d + p->off2) = n;
            break;
        }
        case PT_COMPAT: break;
        }
    }
    return 0;
}

void api_params_free(const eng_params *t, void *dst) {
    char *d = dst;
    for (int i = 0; i < t->n; i++) {
        const eng_param *p = &t->rows[i];
        if (p->type != PT_STRS && p->type != PT_IDS) continue;
        free(*(void **)(d + p->off));
        *(void **)(d + p->off) = NULL;
        *(int *)(d + p->off2) = 0;
    }
}

/* ---------------------------------------------------------------- OpenAPI */

static json_object *typed(const char *type) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "type", json_object_new_string(type));
    return o;
}

json_object *api_params_schema(const eng_params *t) {
    json_object *s = typed("object"), *props = json_object_new_object();
    for (int i = 0; i < t->n; i++) {
        const eng_param *p = &t->rows[i];
        json_object *o = NULL;
        switch (p->type) {
        case PT_NUM:
        case PT_INT:
        case PT_SEED:
        case PT_COMPAT:
            o = typed(p->type == PT_NUM ? "number" : "integer");
            if (p->flags & PF_LO_OPEN) api_put_num(o, "exclusiveMinimum", p->lo);
            else api_put_num(o, "minimum", p->lo);
            if ((p->hi_from == PB_ROW || p->hi_from == PB_PLAN_MB) && p->type != PT_SEED) api_put_num(o, "maximum", p->hi);
            if ((p->type == PT_NUM || p->type == PT_INT) && p->hi_from != PB_PLAN_MB && p->dflt >= p->lo)
                api_put_num(o, "default", p->dflt);
            break;
        case PT_STR: o = typed("string"); break;
        case PT_BOOL:
            o = typed("boolean");
            api_put_bool(o, "default", (int)p->dflt);
            break;
        case PT_ENUM: {
            char names[256], name[64];
            primary_names(p, names, sizeof names);
            o = typed("string");
            json_object *en = json_object_new_array();
            for (char *c = names, *end; *c; c = *end ? end + 1 : end) {
                end = c + strcspn(c, "|");
                json_object_array_add(en, json_object_new_string_len(c, (int)(end - c)));
            }
            json_object_object_add(o, "enum", en);
            api_put_str(o, "default", eng_param_choice_name(p, (int)p->dflt, name, sizeof name));
            break;
        }
        case PT_PAIR: {
            o = typed("array");
            json_object *it = typed("number"), *df = json_object_new_array();
            api_put_num(it, "minimum", p->lo);
            api_put_num(it, "exclusiveMaximum", p->hi);
            json_object_object_add(o, "items", it);
            api_put_int(o, "minItems", 2);
            api_put_int(o, "maxItems", 2);
            json_object_array_add(df, json_object_new_double(p->dflt));
            json_object_array_add(df, json_object_new_double(p->dflt2));
            json_object_object_add(o, "default", df);
            break;
        }
        case PT_STRS: {
            json_object *one = json_object_new_array(), *str = typed("string"), *arr = typed("array"), *it = typed("string");
            api_put_int(str, "minLength", 1);
            api_put_int(it, "minLength", 1);
            api_put_int(it, "maxLength", ENG_PARAM_STR_MAX);
            api_put_int(arr, "maxItems", (long long)p->hi);
            json_object_object_add(arr, "items", it);
            json_object_array_add(one, str);
            json_object_array_add(one, arr);
            o = json_object_new_object();
            json_object_object_add(o, "oneOf", one);
            break;
        }
        case PT_BOUNDS: {
            json_object *one = json_object_new_array(), *num = typed("number"), *str = typed("string");
            api_put_num(num, "exclusiveMinimum", p->lo);
            api_put_str(str, "pattern", "^[0-9.eE+-]+(_[0-9.eE+-]+)?$");
            json_object_array_add(one, num);
            json_object_array_add(one, str);
            o = json_object_new_object();
            json_object_object_add(o, "oneOf", one);
            if (p->dflt > 0) api_put_num(o, "default", p->dflt);
            break;
        }
        case PT_IDS: {
            json_object *it = typed("integer");
            api_put_int(it, "minimum", 0);
            o = typed("array");
            api_put_int(o, "maxItems", (long long)p->hi);
            json_object_object_add(o, "items", it);
            break;
        }
        }
        api_put_str(o, "description", p->doc);
        json_object_object_add(props, p->name, o);
    }
    json_object_object_add(s, "properties", props);
    return s;
}
