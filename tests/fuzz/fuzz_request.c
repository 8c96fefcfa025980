/* fuzz_request.c — libFuzzer target over grpod's request parsing and validation (api/validate.c):
 * the bytes are a request body; the first byte picks the endpoint. A fake model (byte-level
 * tokenizer, vocab 259, context 256) stands in for the engine. Every call must either return 0
 * with a payload or an error with a 4xx status and a message; never crash, leak or overflow.
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
    for (int i = 0; i < n; i++) { strcat(s, roles[i]); strcat(s, ":"); strcat(s, contents[i]); strcat(s, "\n"); }
    if (agp) strcat(s, "assistant:");
    *text = s;
    return 0;
}

static void check_error(int rc, const api_error *e) {
    if (rc == 0) return;
    assert(e->status >= 400 && e->status < 600);
    assert(e->message[0]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    api_limits l;
    api_limits_default(&l);
    l.max_n = 8;
    l.max_tokens = 64;
    l.max_groups = 16;
    api_model m = {.vocab = 259, .max_pos = 256, .tokenize = fake_tokenize, .render_chat = fake_chat};
    api_error e;
    json_object *req = NULL, *payload = NULL;
    int which = data[0] % 7;
    int rc = api_parse_json_or_reply((const char *)data + 1, size - 1, &req, &e);
    check_error(rc, &e);
    if (rc) return 0;
    const char *rid;
    long long expected;
    int *ids = NULL, n = 0, skip;
    switch (which) {
    case 0: rc = api_rollout_or_reply(req, &l, &m, &payload, &e); break;
    case 1: rc = api_update_or_reply(req, &l, &m, &payload, &rid, &expected, &e); break;
    case 2: rc = api_logprobs_or_reply(req, &l, &m, &payload, &e); break;
    case 3: rc = api_checkpoint_or_reply(req, &payload, &e); break;
    case 4: rc = api_tokenize_or_reply(req, &m, &ids, &n, &e); break;
    case 5: rc = api_detokenize_or_reply(req, &m, &ids, &n, &skip, &e); break;
    default: {
        size_t ol;
        char *s = api_utf8_sanitize((const char *)data + 1, size - 1, &ol);
        assert(s && strlen(s) == ol);
        free(s);
        break;
    }
    }
    check_error(rc, &e);
    if (payload) assert(json_object_to_json_string(payload) != NULL);
    json_object_put(payload);
    json_object_put(req);
    free(ids);
    return 0;
}
