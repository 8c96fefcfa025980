/* tok_internal.h — the tok struct shared by engine/text/tokenizer.c (loading, lookups) and
 * engine/text/tok_encode.c (BPE, encode, decode). Not part of the engine's API. */
#ifndef GRPOD_TOK_INTERNAL_H
#define GRPOD_TOK_INTERNAL_H
#include "engine/text/tokenizer.h"
#include <pthread.h>
#include <stdint.h>

typedef struct {
    uint32_t off, len;
} tok_str; /* a string in tok.pool */
typedef struct {
    uint32_t *slot;
    uint32_t mask;
} smap; /* bytes -> id, open addressing */
typedef struct {
    uint64_t *key;
    int32_t *rank, *val;
    uint32_t mask;
} pmap; /* (a,b) -> rank, id */
typedef struct {
    int child, sibling;
    unsigned char byte;
    int id;
} tok_trie_node;
typedef struct {
    tok_trie_node *node;
    int n, cap;
    uint8_t first[256];
} tok_trie;

/* Word cache: piece bytes -> ids, cleared wholesale when full. */
typedef struct {
    uint32_t *slot; /* entry index + 1 */
    uint32_t mask;
    struct tok_cache_ent {
        uint64_t h;
        uint32_t key, klen, ids, nids;
    } * ent;
    int n_ent, cap_ent;
    char *keys;
    size_t keys_len, keys_cap;
    int *ids;
    size_t ids_len, ids_cap;
} tok_cache;
void tok_cache_free(tok_cache *c);

enum { TOKF_MODEL = 1, TOKF_ADDED = 2, TOKF_SPECIAL = 4, TOKF_LSTRIP = 8, TOKF_RSTRIP = 16 };
enum { TOK_MAX_AFFIX = 8 };

struct tok {
    int n_vocab, cap_vocab; /* ids 0..n_vocab-1 (some may be unused) */
    char *pool;
    size_t pool_len, pool_cap;
    tok_str *raw; /* (V) token string as in the file (added content wins) */
    tok_str *model; /* (V) model token as raw bytes (TOKF_MODEL) */
    tok_str *dec; /* (V) bytes the decoder emits */
    uint8_t *flags; /* (V) TOKF_* */
    smap vocab; /* model bytes -> id */
    smap names; /* raw strings -> id */
    pmap merges;
    int byte_id[256]; /* id of each single byte token, or -1 */
    uint32_t b2u[256];
    int16_t u2b[324];
    int ignore_merges, byte_fallback, fuse_unk, unk_id, nfc, pattern;
    tok_trie trie[2]; /* added tokens: [0] on raw text, [1] on normalized text */
    int prefix[TOK_MAX_AFFIX], n_prefix, suffix[TOK_MAX_AFFIX], n_suffix;
    char *bos, *eos, *chat_template;
    pthread_mutex_t cache_mu; /* guards cache; taken with trylock only */
    tok_cache cache;
};

int tok_vocab_lookup(const tok *t, const char *s, size_t n); /* model bytes -> id or -1 */
int tok_merge_rank(const tok *t, int a, int b, int *new_id); /* INT_MAX if no merge */
#endif
