/* test_packed.c — the packed parse of request bodies (api/packed.c) against json-c alone.
 *
 * Random update, logprobs, rollout and detokenize bodies — long token-id and logprob arrays with
 * every literal form JSON allows (signs, zeros, fractions, exponents, big integers, odd spacing),
 * some with one byte changed — parsed both ways (api_parse_json_or_reply and
 * api_parse_json_unpacked_or_reply) and validated: the same error (status, field, message) or
 * the same canonical payload text, byte for byte, in json-c's three output formats. The test
 * also counts the arrays actually packed, so it cannot pass by packing nothing. */
#include <stdarg.h>

#include "api/packed.h"
#include "api/validate.h"
#include "common/err.h"
#include "tests/unit/check.h"

static unsigned long long rng = 20;
static unsigned rnd(unsigned n) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (unsigned)(rng >> 33) % n;
}

typedef struct {
    char *s;
    size_t n, cap;
} buf;
static void put(buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char t[256];
    int k = vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    if (b->n + (size_t)k + 1 > b->cap) {
        b->cap = (b->n + (size_t)k + 1) * 2;
        b->s = realloc(b->s, b->cap);
    }
    memcpy(b->s + b->n, t, (size_t)k + 1);
    b->n += (size_t)k;
}
static const char *ws(void) {
    static const char *const w[] = {"", "", "", " ", "\n", "\t ", "\r\n"};
    return w[rnd(7)];
}

/* A token id literal: mostly in the vocabulary, sometimes not an id json-c and packing agree on
 * without care (negative, -0, fraction, exponent, beyond int32 or int64). */
static void id_lit(buf *b) {
    static const char *const odd[] = {"-1",  "-0",          "1.0", "1e2", "2147483647", "2147483648", "99999999999999999999",
                                      "0.5", "-2147483648", "01",  "1000"};
    if (rnd(400) == 0) put(b, "%s", odd[rnd(11)]);
    else put(b, "%u", rnd(1000));
}
static void lp_lit(buf *b) {
    static const char *const odd[] = {"0",
                                      "-0",
                                      "-0.0",
                                      "-1",
                                      "-123456789012345678",
                                      "-1234567890123456789",
                                      "-1e400",
                                      "-1e-400",
                                      "-2.5E+1",
                                      "0.1",
                                      "1",
                                      "-1e30",
                                      "-9.999999999999999e29",
                                      "-99999999999999999999",
                                      "-9223372036854775809"};
    unsigned k = rnd(10);
    if (rnd(300) == 0) put(b, "%s", odd[rnd(15)]);
    else if (k < 5) put(b, "-%u.%0*u", rnd(20), (int)(1 + rnd(9)), rnd(1000000000));
    else if (k < 7) put(b, "-%u.%ue-%u", 1 + rnd(9), rnd(100000), rnd(30));
    else if (k < 8) put(b, "-%u", rnd(50));
    else put(b, "%.17g", -(double)rnd(1u << 30) / (double)(1u << rnd(31)));
}
/* A loss_mask entry: 0 or 1, sometimes a value the validator refuses. */
static void mask_lit(buf *b) {
    static const char *const odd[] = {"2", "-1", "1.0", "0.0", "true", "-0", "01"};
    if (rnd(150) == 0) put(b, "%s", odd[rnd(7)]);
    else put(b, "%u", rnd(2));
}
static void arr(buf *b, int n, void (*lit)(buf *)) {
    put(b, "[%s", ws());
    for (int i = 0; i < n; i++) {
        lit(b);
        put(b, "%s%s%s", ws(), i + 1 < n ? "," : "", i + 1 < n ? ws() : "");
    }
    put(b, "]");
}

/* One random body of kind k (0 rollout, 1 update, 2 logprobs, 5 detokenize). */
static void body(buf *b, int k) {
    put(b, "{%s", ws());
    if (k == 5) {
        put(b, "\"tokens\":%s", ws());
        arr(b, 1 + (int)rnd(300), id_lit);
        put(b, "}");
        return;
    }
    if (k == 1 && rnd(2)) put(b, "\"algorithm\":{\"old_logprobs\":\"rollout\"},");
    if (k == 0) put(b, "\"sampling\":{\"max_tokens\":%u,\"seed\":7},", 1 + rnd(8));
    put(b, "\"groups\":%s[", ws());
    int G = 1 + (int)rnd(3);
    for (int g = 0; g < G; g++) {
        put(b, "%s{\"prompt_ids\":%s", g ? "," : "", ws());
        arr(b, 1 + (int)rnd(60), id_lit);
        if (k == 0) {
            put(b, ",\"n\":%u}", 1 + rnd(4));
            continue;
        }
        put(b, ",\"responses\":[");
        int N = 1 + (int)rnd(4), R = 1 + (int)rnd(60);
        for (int r = 0; r < N; r++) {
            put(b, "%s{\"token_ids\":", r ? "," : "");
            arr(b, R, id_lit);
            if (k == 1) {
                put(b, ",\"reward\":%u.%u", rnd(3), rnd(100));
                if (rnd(3)) {
                    put(b, ",\"logprobs\":%s", ws());
                    arr(b, rnd(20) ? R : R + 1, lp_lit);
                }
                if (rnd(3) == 0) {
                    put(b, ",\"loss_mask\":%s", ws());
                    arr(b, rnd(20) ? R : R - 1 + 2 * (int)rnd(2), mask_lit);
                }
            }
            put(b, "}");
        }
        put(b, "]}");
    }
    put(b, "]}");
}

static int fake_tokenize(void *ud, const char *text, size_t len, int add_special, int **ids, int *n) {
    int *v = malloc(sizeof(int) * (len + 1));
    for (size_t i = 0; i < len; i++) v[i] = (unsigned char)text[i];
    *ids = v;
    *n = (int)len;
    return 0;
}

/* rc, error and payload texts (PLAIN, SPACED, PRETTY) of kind k over req. */
typedef struct {
    int rc, n;
    api_error e;
    char *txt[3];
    int *ids;
} outcome;
static outcome run(int k, json_object *req) {
    api_limits l;
    api_limits_default(&l);
    api_model m = {.vocab = 1000, .max_pos = 4096, .tokenize = fake_tokenize};
    outcome o = {0};
    json_object *p = NULL;
    const char *rid;
    long long expected;
    int skip;
    if (k == 0) o.rc = api_rollout_or_reply(req, &l, &m, &p, &o.e);
    else if (k == 1) o.rc = api_update_or_reply(req, &l, &m, &p, &rid, &expected, &o.e);
    else if (k == 2) o.rc = api_logprobs_or_reply(req, &l, &m, &p, &o.e);
    else o.rc = api_detokenize_or_reply(req, &m, &o.ids, &o.n, &skip, &o.e);
    static const int flags[3] = {JSON_C_TO_STRING_PLAIN, JSON_C_TO_STRING_SPACED, JSON_C_TO_STRING_PRETTY};
    for (int f = 0; p && f < 3; f++) o.txt[f] = strdup(json_object_to_json_string_ext(p, flags[f]));
    json_object_put(p);
    return o;
}
static int packed_members(json_object *req) {
    int c = api_packed_of(json_object_object_get(req, "tokens")) != NULL;
    json_object *gs = json_object_object_get(req, "groups");
    for (size_t g = 0; json_object_is_type(gs, json_type_array) && g < json_object_array_length(gs); g++) {
        json_object *gr = json_object_array_get_idx(gs, g), *rs = json_object_object_get(gr, "responses");
        c += api_packed_of(json_object_object_get(gr, "prompt_ids")) != NULL;
        for (size_t r = 0; json_object_is_type(rs, json_type_array) && r < json_object_array_length(rs); r++) {
            json_object *x = json_object_array_get_idx(rs, r);
            c += (api_packed_of(json_object_object_get(x, "token_ids")) != NULL) +
                (api_packed_of(json_object_object_get(x, "logprobs")) != NULL) +
                (api_packed_of(json_object_object_get(x, "loss_mask")) != NULL);
        }
    }
    return c;
}

/* Stored JSON read as daemon/jobs.c reads it (api_packed_len/_int/_num) from api_packed_parse
 * and from json_tokener_parse: the same ids and numbers. Returns the arrays packed, or -1. */
static int stored_reads_equal(const char *text) {
    json_object *a = api_packed_parse(text), *b = json_tokener_parse(text);
    int packed = 0, ok = a && b;
    json_object *ga = json_object_object_get(a, "groups"), *gb = json_object_object_get(b, "groups");
    for (int g = 0; ok && g < (int)json_object_array_length(gb); g++) {
        json_object *xa = json_object_array_get_idx(ga, (size_t)g), *xb = json_object_array_get_idx(gb, (size_t)g);
        json_object *ra = json_object_object_get(xa, "responses"), *rb = json_object_object_get(xb, "responses");
        json_object *arrs[2][64];
        int cnt = 0;
        arrs[0][cnt] = json_object_object_get(xa, "prompt_ids"), arrs[1][cnt++] = json_object_object_get(xb, "prompt_ids");
        for (int k = 0; k < (int)json_object_array_length(rb) && cnt < 62; k++) {
            json_object *pa = json_object_array_get_idx(ra, (size_t)k), *pb = json_object_array_get_idx(rb, (size_t)k);
            arrs[0][cnt] = json_object_object_get(pa, "token_ids"), arrs[1][cnt++] = json_object_object_get(pb, "token_ids");
            arrs[0][cnt] = json_object_object_get(pa, "logprobs"), arrs[1][cnt++] = json_object_object_get(pb, "logprobs");
        }
        for (int c = 0; ok && c < cnt; c++) {
            int n = api_packed_len(arrs[1][c]), ids = c == 0 || c % 2 == 1;
            packed += api_packed_of(arrs[0][c]) != NULL;
            ok = api_packed_len(arrs[0][c]) == n;
            for (int i = 0; ok && i < n; i++)
                ok = ids ? api_packed_int(arrs[0][c], i) == api_packed_int(arrs[1][c], i)
                         : (float)api_packed_num(arrs[0][c], i) == (float)api_packed_num(arrs[1][c], i) &&
                        !memcmp(&(double){api_packed_num(arrs[0][c], i)}, &(double){api_packed_num(arrs[1][c], i)}, 8);
        }
    }
    json_object_put(a);
    json_object_put(b);
    return ok ? packed : -1;
}

TEST(test_packed_parse_equals_json_c) {
    static const int kinds[] = {0, 1, 1, 2, 5};
    int accepted = 0, refused = 0, packed = 0, bad_json = 0, stored_packed = 0;
    for (int it = 0; it < 3000; it++) {
        buf b = {0};
        int k = kinds[rnd(5)];
        body(&b, k);
        if (rnd(8) == 0 && b.n) b.s[rnd((unsigned)b.n)] = "0-.e,] \"x{9"[rnd(11)]; /* one byte changed */
        char *scratch = malloc(b.n + 1);
        memcpy(scratch, b.s, b.n + 1);
        json_object *r1, *r2;
        api_error e1, e2;
        api_limits l;
        api_limits_default(&l);
        int rc1 = api_parse_json_or_reply(scratch, b.n, &l, &r1, &e1);
        int rc2 = api_parse_json_unpacked_or_reply(b.s, b.n, &r2, &e2);
        CHECK_MSG(rc1 == rc2, "parse rc %d vs %d: %s", rc1, rc2, b.s);
        if (rc1) {
            CHECK_MSG(!strcmp(e1.message, e2.message), "%s vs %s", e1.message, e2.message);
            bad_json++;
        } else {
            packed += packed_members(r1);
            outcome o1 = run(k, r1), o2 = run(k, r2);
            CHECK_MSG(o1.rc == o2.rc && o1.n == o2.n, "rc %d vs %d: %s", o1.rc, o2.rc, b.s);
            if (o1.rc) {
                CHECK_MSG(!strcmp(o1.e.message, o2.e.message) && !strcmp(o1.e.field, o2.e.field) && o1.e.status == o2.e.status,
                          "\"%s\" vs \"%s\"", o1.e.message, o2.e.message);
                refused++;
            } else {
                accepted++;
                for (int f = 0; f < 3; f++)
                    CHECK_MSG(!o1.txt[f] == !o2.txt[f] && (!o1.txt[f] || !strcmp(o1.txt[f], o2.txt[f])),
                              "payload (format %d) differs for %s", f, b.s);
                CHECK(!o1.n || !memcmp(o1.ids, o2.ids, sizeof(int) * (size_t)o1.n));
                if (o1.txt[0] && k != 0) {
                    int sp = stored_reads_equal(o1.txt[0]);
                    CHECK_MSG(sp >= 0, "stored payload read differently: %s", o1.txt[0]);
                    stored_packed += sp;
                }
            }
            for (int f = 0; f < 3; f++) {
                free(o1.txt[f]);
                free(o2.txt[f]);
            }
            free(o1.ids);
            free(o2.ids);
        }
        json_object_put(r1);
        json_object_put(r2);
        free(scratch);
        free(b.s);
    }
    printf("# %d accepted, %d refused, %d not JSON; %d arrays packed; %d packed reading stored payloads\n", accepted, refused,
           bad_json, packed, stored_packed);
    CHECK(accepted > 500 && refused > 300 && bad_json > 50 && packed > 5000 && stored_packed > 2000);
}

/* Rollout results as daemon/jobs.c writes them (logprobs: floats through json_object_new_double)
 * read back both ways, as an update on a rollout_job_id does. */
TEST(test_packed_rollout_results) {
    int packed = 0;
    for (int it = 0; it < 300; it++) {
        json_object *res = json_object_new_object(), *gs = json_object_new_array();
        json_object_object_add(res, "groups", gs);
        for (int g = 0; g < 1 + (int)rnd(3); g++) {
            json_object *go = json_object_new_object(), *pid = json_object_new_array(), *rs = json_object_new_array();
            for (int t = 0, P = 1 + (int)rnd(40); t < P; t++) json_object_array_add(pid, json_object_new_int((int)rnd(150000)));
            json_object_object_add(go, "prompt_ids", pid);
            json_object_object_add(go, "responses", rs);
            for (int k = 0; k < 1 + (int)rnd(4); k++) {
                json_object *r = json_object_new_object(), *ti = json_object_new_array(), *lp = json_object_new_array();
                for (int t = 0, R = 1 + (int)rnd(50); t < R; t++) {
                    json_object_array_add(ti, json_object_new_int((int)rnd(150000)));
                    float x = rnd(50) ? -(float)rnd(1u << 24) / (float)(1u << rnd(30)) : rnd(2) ? -1e30f : -0.0f;
                    json_object_array_add(lp, json_object_new_double(x));
                }
                json_object_object_add(r, "token_ids", ti);
                json_object_object_add(r, "logprobs", lp);
                json_object_object_add(r, "finish_reason", json_object_new_string("stop"));
                json_object_array_add(rs, r);
            }
            json_object_array_add(gs, go);
        }
        char *text = strdup(json_object_to_json_string_ext(res, JSON_C_TO_STRING_PLAIN));
        json_object_put(res);
        int sp = stored_reads_equal(text);
        CHECK_MSG(sp >= 0, "rollout result read differently: %s", text);
        packed += sp;
        free(text);
    }
    printf("# %d arrays packed reading rollout results\n", packed);
    CHECK(packed > 500);
}

/* The body after the cut: same length, arrays replaced by a placeholder and spaces; short
 * arrays, arrays elsewhere and escaped keys untouched. */
TEST(test_packed_cut_shape) {
    char b[] = "{\"groups\":[{\"prompt_ids\":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15],\"metadata\":{\"prompt_ids\":"
               "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]},\"responses\":[{\"token_ids\":[1,2]},{\"token\\u005fids\":"
               "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]}]}]}";
    char orig[sizeof b];
    memcpy(orig, b, sizeof b);
    api_packed_set set = {0};
    api_packed_cut(b, strlen(b), &set);
    CHECK_EQ_INT(set.n, 1);
    CHECK_EQ_INT(set.v[0]->n, 15);
    CHECK_EQ_INT(set.v[0]->ids[14], 15);
    CHECK(strlen(b) == strlen(orig));
    CHECK(strstr(b, "\"prompt_ids\":\"gp") != NULL);
    CHECK(!strcmp(strstr(b, "\"metadata\""), strstr(orig, "\"metadata\"")));
    json_object *o = json_tokener_parse(b);
    CHECK(o != NULL);
    api_packed_attach(o, &set);
    CHECK_EQ_INT(set.n, 0);
    json_object *g = json_object_array_get_idx(json_object_object_get(o, "groups"), 0);
    CHECK(api_packed_of(json_object_object_get(g, "prompt_ids")) != NULL);
    CHECK_STR(json_object_to_json_string_ext(json_object_object_get(g, "prompt_ids"), JSON_C_TO_STRING_PLAIN),
              "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]");
    json_object_put(o);
    /* a forged placeholder is a string: the nonce is not in the body */
    char f[] = "{\"tokens\":\"gp0000000000000000:0\"}";
    json_object *r;
    api_error e;
    CHECK(api_parse_json_or_reply(f, strlen(f), NULL, &r, &e) == 0);
    CHECK(api_packed_of(json_object_object_get(r, "tokens")) == NULL);
    json_object_put(r);
}

/* What json-c would build is estimated first: 8 MiB of "{}" (2.2 GB in json-c) is refused with
 * 413 before parsing; the most json-c-heavy body the limits allow (1024 groups x 64 responses
 * of short arrays) parses and validates. */
TEST(test_packed_tree_budget) {
    api_limits l;
    api_limits_default(&l);
    api_error e;
    json_object *r;
    buf b = {0};
    put(&b, "{\"groups\":[{}");
    while (b.n < (size_t)l.max_body_bytes - 8) put(&b, ",{}");
    put(&b, "]}");
    CHECK_EQ_INT(api_parse_json_or_reply(b.s, b.n, &l, &r, &e), GE_TOO_LARGE);
    CHECK(r == NULL && e.status == 413 && strstr(e.message, "too many JSON values"));
    b.n = 0;
    put(&b, "{\"groups\":[");
    for (int g = 0; g < l.max_groups; g++) {
        put(&b, "%s{\"prompt_ids\":[1,2],\"responses\":[", g ? "," : "");
        for (int k = 0; k < l.max_n; k++)
            put(&b, "%s{\"token_ids\":[%d,2,3,4,5,6],\"reward\":0.5,\"finish_reason\":\"stop\",\"logprobs\":[-1,-2,-3,-4,-5,-6]}",
                k ? "," : "", k);
        put(&b, "]}");
    }
    put(&b, "]}");
    CHECK_MSG(b.n <= (size_t)l.max_body_bytes, "%zu bytes", b.n);
    CHECK_MSG(api_parse_json_or_reply(b.s, b.n, &l, &r, &e) == 0, "%s", e.message);
    api_model m = {.vocab = 1000, .max_pos = 4096, .tokenize = fake_tokenize};
    json_object *p;
    const char *rid;
    long long expected;
    CHECK_MSG(api_update_or_reply(r, &l, &m, &p, &rid, &expected, &e) == 0, "%s", e.message);
    json_object_put(p);
    json_object_put(r);
    free(b.s);
}

/* loss_mask: accepted as 0/1 of token_ids' length, packed or not; otherwise a 400 naming the
 * field (the response's loss_mask, or the entry). */
TEST(test_loss_mask_fields) {
    static const struct {
        const char *mask, *field, *msg;
    } c[] = {
        {"[1,0,1,1,0,0,1,1,1,1,0,1,1,1,1,1,1,1,1,1]", NULL, NULL},
        {"[1,0,1]", "groups[1].responses[1].loss_mask", "has 3 entries; token_ids has 20"},
        {"[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]", "groups[1].responses[1].loss_mask", "has 21 entries"},
        {"[1,0,1,1,0,0,1,1,1,1,0,1,1,1,1,1,1,1,1,2]", "groups[1].responses[1].loss_mask", "loss_mask[19] must be 0 or 1"},
        {"[1,0,1,1,0,0,1,1,1,1,0,1,1,1,1,1,1,1,1,1.0]", "groups[1].responses[1].loss_mask", "loss_mask[19] must be 0 or 1"},
        {"[1,0,1,1,0,0,1,1,1,1,0,1,1,1,1,1,true,1,1,1]", "groups[1].responses[1].loss_mask", "loss_mask[16] must be 0 or 1"},
        {"\"1101\"", "groups[1].responses[1].loss_mask", "must be an array"},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
        char body[1024];
        const char *ids = "[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20]";
        snprintf(body, sizeof body,
                 "{\"groups\":[{\"prompt_ids\":[1,2],\"responses\":[{\"token_ids\":[3],\"reward\":1}]},"
                 "{\"prompt_ids\":[1,2],\"responses\":[{\"token_ids\":%s,\"reward\":1},"
                 "{\"token_ids\":%s,\"reward\":0,\"loss_mask\":%s}]}]}",
                 ids, ids, c[i].mask);
        for (int packed = 0; packed < 2; packed++) {
            api_limits l;
            api_limits_default(&l);
            api_model m = {.vocab = 1000, .max_pos = 4096, .tokenize = fake_tokenize};
            api_error e;
            json_object *r, *p = NULL;
            const char *rid;
            long long expected;
            char *scratch = strdup(body);
            int rc = packed ? api_parse_json_or_reply(scratch, strlen(scratch), &l, &r, &e)
                            : api_parse_json_unpacked_or_reply(scratch, strlen(scratch), &r, &e);
            CHECK_MSG(rc == 0, "%s", e.message);
            rc = api_update_or_reply(r, &l, &m, &p, &rid, &expected, &e);
            if (!c[i].field) {
                CHECK_MSG(rc == 0, "case %zu: %s", i, e.message);
                json_object *lm = json_object_object_get(
                    json_object_array_get_idx(
                        json_object_object_get(json_object_array_get_idx(json_object_object_get(p, "groups"), 1), "responses"), 1),
                    "loss_mask");
                CHECK(api_packed_len(lm) == 20 && api_packed_int(lm, 1) == 0 && api_packed_int(lm, 0) == 1);
                if (packed)
                    CHECK(api_packed_of(json_object_object_get(
                              json_object_array_get_idx(
                                  json_object_object_get(json_object_array_get_idx(json_object_object_get(r, "groups"), 1),
                                                         "responses"),
                                  1),
                              "loss_mask")) != NULL);
            } else {
                CHECK_MSG(rc != 0 && e.status == 400 && !strcmp(e.field, c[i].field) && strstr(e.message, c[i].msg),
                          "case %zu: rc %d status %d field %s: %s", i, rc, e.status, e.field, e.message);
            }
            json_object_put(p);
            json_object_put(r);
            free(scratch);
        }
    }
}

int main(void) {
    RUN(test_packed_parse_equals_json_c);
    RUN(test_packed_cut_shape);
    RUN(test_packed_tree_budget);
    RUN(test_packed_rollout_results);
    RUN(test_loss_mask_fields);
    return CHECK_DONE();
}
