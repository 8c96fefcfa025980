/* tok_text.h — the text stages of the tokenizer below BPE: UTF-8 decoding, NFC normalization
 * and the pre-tokenizer split (hand-written matchers for the exact Split regexes that Qwen2/3 and
 * Llama 3 ship). Internal to engine/text/tokenizer.c; not a general Unicode library. All functions
 * are pure and thread-safe. */
#ifndef GRPOD_TOK_TEXT_H
#define GRPOD_TOK_TEXT_H
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/utf8.h" /* utf8_encode: the encoder (shared with engine/format/json.c) */

/* Decode one UTF-8 code point at s[0..n), n >= 1. Returns its byte length, or 0 when the bytes
 * there are not well-formed UTF-8 (overlong, surrogate, beyond U+10FFFF, truncated). */
int tt_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);
/* 1 if s[0..n) is well-formed UTF-8. */
int tt_utf8_valid(const char *s, size_t n);

/* NFC of s[0..n) (valid UTF-8). Returns 0 and *out == NULL when s is already NFC (the common
 * case, found by a quick check), else a malloc'd result in *out (length *out_len); GE_NOMEM on failure. */
int tt_nfc(const char *s, size_t n, char **out, size_t *out_len);

/* The Split pre-tokenizer patterns this code implements; any other pattern string is refused
 * (tt_pattern_id returns -1). */
enum { TT_PAT_QWEN2 = 0, TT_PAT_LLAMA3 = 1 };
int tt_pattern_id(const char *regex);

/* Split s[0..n) (valid UTF-8) into pieces as HF's Split(pattern, Isolated) does: every match is a
 * piece and so is any gap between matches. Piece k is s[bounds[k] .. bounds[k+1]); *npieces
 * pieces. bounds must have room for n + 1 entries. */
typedef struct {
    uint32_t *cp;
    uint8_t *cl;
    int *off;
    size_t cap;
} tt_scratch;
int tt_split(int pattern, const char *s, size_t n, tt_scratch *sc, int *bounds, int *npieces);
void tt_scratch_free(tt_scratch *sc);

/* A growable NUL-terminated byte buffer for building text; oom is sticky, so a caller appends
 * freely and checks it once at the end. The caller frees s. */
typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} tt_buf;
void tt_put(tt_buf *b, const char *s, size_t n);
static inline void tt_str(tt_buf *b, const char *s) { tt_put(b, s, strlen(s)); }
#endif
