/* fuzz_request.c — libFuzzer target over grpod's request parsing and validation (api/validate.c):
 * the bytes are a request body; the first byte picks the endpoint. A fake model (byte-level
 * tokenizer, vocab 259, context 256) stands in for the engine. Every call must either return 0
 * with a payload or an error with a 4xx status and a message; never crash, leak or overflow.
 * Each body is parsed twice, with the token-id and logprob arrays packed (api/packed.c) and by
 * json-c alone, and both must give the same error or the same payload byte for byte.
 * Built by `make fuzz` (clang -fsanitize=fuzzer,address,undefined); tests/run.sh runs it briefly. */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/validate.h"

static int fake_tokenize(void *ud, const char *text, size_t len, int add_special, int **ids, int *n) {
    int *v = malloc(sizeof(int) * (len + 1));
    if (!v) return -1;
    for (size_t i = 0; i < len; i++) v[i] = (unsigned char)text[i];
    *ids = v;
    *n = (int)len;
    return 0;
}

static int fake_chat(void *ud, const char *const *roles, const char *const *contents, int n, int agp, char **text) {
    size_t len = 1;
    for (int i = 0; i < n; i++) len += strlen(roles[i]) + strlen(contents[i]) + 2;
    char *s = malloc(len + 16);
    if (!s) return -1;
    s[0] = 0;
    for (int i = 0; i < n; i++) {
        strcat(s, roles[i]);
        strcat(s, ":");
        strcat(s, contents[i]);
        strcat(s, "\n");
    }
    if (agp) strcat(s, "assistant:");
    *text = s;
    return 0;
}

static void check_error(int rc, const api_error *e) {
    if (rc == 0) return;
    assert(e->status >= 400 && e->status < 600);
    assert(e->message[0]);
}

/* One request kind over one parse: rc, the error, the payload text (malloc'd) and ids. */
typedef struct {
    int rc, n;
    api_error e;
    char *payload;
    int *ids;
} outcome;

static outcome validate(int which, json_object *req) {
    api_limits l;
    api_limits_default(&l);
    l.max_n = 8;
    l.max_tokens = 64;
    l.max_groups = 16;
    api_model m = {.vocab = 259, .max_pos = 256, .tokenize = fake_tokenize, .render_chat = fake_chat};
    outcome o = {0};
    json_object *payload = NULL;
    const char *rid;
    long long expected;
    int skip;
    switch (which) {
    case 0: o.rc = api_rollout_or_reply(req, &l, &m, &payload, &o.e); break;
    case 1: o.rc = api_update_or_reply(req, &l, &m, &payload, &rid, &expected, &o.e); break;
    case 2: o.rc = api_logprobs_or_reply(req, &l, &m, &payload, &o.e); break;
    case 3: o.rc = api_checkpoint_or_reply(req, &payload, &o.e); break;
    case 4: o.rc = api_tokenize_or_reply(req, &m, &o.ids, &o.n, &o.e); break;
    default: o.rc = api_detokenize_or_reply(req, &m, &o.ids, &o.n, &skip, &o.e); break;
    }
    check_error(o.rc, &o.e);
    if (payload) {
        json_object *samp = json_object_object_get(payload, "sampling");
        if (samp) json_object_object_del(samp, "seed"); /* random when not given */
        const char *t = json_object_to_json_string_ext(payload, JSON_C_TO_STRING_PLAIN);
        assert(t);
        o.payload = strdup(t);
        /* the other formats go through packed.c's serializer too */
        assert(json_object_to_json_string_ext(payload, JSON_C_TO_STRING_PRETTY) != NULL);
    }
    json_object_put(payload);
    return o;
}

/* The packed parse (api_parse_json_or_reply) and json-c's alone must give the same error or
 * the same payload, byte for byte. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    int which = data[0] % 7;
    if (which == 6) {
        size_t ol;
        char *s = api_utf8_sanitize((const char *)data + 1, size - 1, &ol);
        assert(s && strlen(s) == ol);
        free(s);
        return 0;
    }
    char *body = malloc(size);
    assert(body);
    memcpy(body, data + 1, size - 1);
    api_error e1, e2;
    json_object *r1 = NULL, *r2 = NULL;
    api_limits l;
    api_limits_default(&l); /* 256 MiB of json-c tree: beyond what 64 KiB inputs reach */
    int rc1 = api_parse_json_or_reply(body, size - 1, &l, &r1, &e1);
    int rc2 = api_parse_json_unpacked_or_reply((const char *)data + 1, size - 1, &r2, &e2);
    check_error(rc1, &e1);
    assert(rc1 == rc2);
    if (rc1) {
        assert(!strcmp(e1.message, e2.message) && !strcmp(e1.field, e2.field) && e1.status == e2.status);
    } else {
        outcome a = validate(which, r1), b = validate(which, r2);
        assert(a.rc == b.rc && a.n == b.n);
        if (a.rc) assert(!strcmp(a.e.message, b.e.message) && !strcmp(a.e.field, b.e.field) && a.e.status == b.e.status);
        assert(!a.payload == !b.payload && (!a.payload || !strcmp(a.payload, b.payload)));
        assert(!a.n || !memcmp(a.ids, b.ids, sizeof(int) * (size_t)a.n));
        free(a.payload);
        free(b.payload);
        free(a.ids);
        free(b.ids);
    }
    json_object_put(r1);
    json_object_put(r2);
    free(body);
    return 0;
}
