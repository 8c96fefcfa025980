/* fuzz_tokenizer.c — libFuzzer target over the tokenizer (engine/text/tokenizer.c, tok_encode.c,
 * tok_text.c, chat.c). Byte 0 picks the mode:
 *   0  the rest is a tokenizer.json: load it (then encode and decode a short text with it)
 *   1  the rest is text: encode with the embedded default tokenizer, decode the ids back
 *   2  the rest is token ids (little-endian u16 pairs, some out of range): decode them
 *   3  the rest is messages "role\x1fcontent\x1e...": render the chat template, encode it
 *   4  the rest is a tokenizer_config.json beside the default tokenizer.json: load, render
 * Errors must carry a message; nothing may crash, leak or overflow. */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text/chat.h"
#include "common/err.h"
#include "engine/text/tokenizer.h"

static tok *dflt;
static char *dflt_json;

static void roundtrip(const tok *t, const char *text, size_t len) {
    int *ids = NULL, n = 0;
    if (tok_encode(t, text, len, 1, 1, &ids, &n)) {
        assert(err_msg()[0]);
        return;
    }
    for (int i = 0; i < n; i++) assert(ids[i] >= 0 && ids[i] < tok_vocab_size(t));
    char *s = NULL;
    size_t sl;
    if (!tok_decode(t, ids, n, 0, &s, &sl)) free(s);
    free(ids);
}

static void render(const tok *t, const char *p, size_t len) {
    chat_msg m[16] = {{0}};
    char *buf = malloc(len + 1);
    memcpy(buf, p, len);
    buf[len] = 0;
    int n = 0;
    for (char *q = buf; n < 16 && q;) {
        char *end = strchr(q, '\x1e'), *sep;
        if (end) *end = 0;
        sep = strchr(q, '\x1f');
        if (sep) *sep = 0;
        m[n].role = q;
        m[n].content = sep ? sep + 1 : "";
        n++;
        q = end ? end + 1 : NULL;
    }
    char *out = NULL;
    if (!chat_render(t, m, n, n & 1, &out)) {
        roundtrip(t, out, strlen(out));
        free(out);
    }
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!dflt) {
        char *c = tok_default_tokenizer_config_json();
        dflt_json = tok_default_tokenizer_json();
        if (tok_load_json_cfg(dflt_json, strlen(dflt_json), c, strlen(c), &dflt)) abort();
        free(c);
    }
    if (size < 1) return 0;
    const char *p = (const char *)data + 1;
    size_t len = size - 1;
    tok *t = NULL;
    switch (data[0] % 5) {
    case 0:
        if (tok_load_json(p, len, &t)) {
            assert(err_msg()[0]);
            break;
        }
        roundtrip(t, "Hello, world! 12 3", 18);
        tok_free(t);
        break;
    case 1: roundtrip(dflt, p, len); break;
    case 2: {
        int n = (int)(len / 2);
        int *ids = malloc(sizeof(int) * (size_t)(n + 1));
        for (int i = 0; i < n; i++) ids[i] = (int)(data[1 + 2 * i] | data[2 + 2 * i] << 8) - 300;
        char *s = NULL;
        size_t sl;
        if (!tok_decode(dflt, ids, n, data[0] & 8, &s, &sl)) {
            assert(strlen(s) <= sl);
            free(s);
        }
        free(ids);
        break;
    }
    case 3: render(dflt, p, len); break;
    default:
        if (tok_load_json_cfg(dflt_json, strlen(dflt_json), p, len, &t)) {
            assert(err_msg()[0]);
            break;
        }
        render(t, "system\x1fS\x1euser\x1fhi", 15);
        tok_free(t);
        break;
    }
    return 0;
}
