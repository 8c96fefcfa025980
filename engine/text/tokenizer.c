/* tokenizer.c — byte-level BPE from a Hugging Face tokenizer.json, id-for-id with the
 * `tokenizers` library (see tokenizer.h for what is supported).
 *
 * Pipeline of tok_encode, as HF runs it:
 *   text ─► split out added tokens with normalized=false (leftmost-longest, on the raw text)
 *        ─► NFC each remaining piece (if the file has the normalizer)
 *        ─► split out added tokens with normalized=true
 *        ─► pre-tokenizer split (tok_text.c) ─► BPE per piece ─► post-processor ids.
 * BPE works on raw bytes: the ByteLevel pre-tokenizer maps each byte to one character and every
 * vocab string is mapped back to bytes at load, which is the same computation without the
 * per-call character mapping. The merge loop is HF's (lowest rank first, leftmost on ties).
 *
 * Layout: hash maps · loading · BPE · encode · decode · lookups. */
#include "engine/text/tokenizer.h"
#include "common/err.h"
#include "engine/format/json.h"
#include "engine/text/tok_internal.h"
#include "engine/text/tok_text.h"
#include "engine/text/unicode_data.h"
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- hash maps ---------------------------------------------------------------------------- */

static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (n * 0xff51afd7ed558ccdULL);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 29);
}

/* strmap: bytes -> id; slots hold id + 1; keys live in the tok's pool (key_of). */
static int smap_init(smap *m, int n) {
    uint32_t cap = 16;
    while (cap < (uint32_t)n * 2) cap <<= 1;
    m->slot = calloc(cap, sizeof *m->slot);
    m->mask = cap - 1;
    return m->slot ? 0 : err_set(GE_NOMEM, "tokenizer: out of memory");
}

static int smap_get(const smap *m, const char *pool, const tok_str *keys, const char *s, size_t n) {
    uint32_t i = (uint32_t)hash_bytes(s, n) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        uint32_t v = m->slot[i];
        if (!v) return -1;
        const tok_str *k = &keys[v - 1];
        if (k->len == n && !memcmp(pool + k->off, s, n)) return (int)v - 1;
    }
}

static void smap_put(smap *m, const char *pool, const tok_str *keys, int id) {
    const tok_str *k = &keys[id];
    uint32_t i = (uint32_t)hash_bytes(pool + k->off, k->len) & m->mask;
    for (;; i = (i + 1) & m->mask) {
        uint32_t v = m->slot[i];
        if (!v) {
            m->slot[i] = (uint32_t)id + 1;
            return;
        }
        const tok_str *o = &keys[v - 1];
        if (o->len == k->len && !memcmp(pool + o->off, pool + k->off, k->len)) return; /* first wins */
    }
}

/* pair map: (a, b) -> (rank, new id) */
static uint32_t pair_hash(uint64_t key) {
    key *= 0x9E3779B97F4A7C15ULL;
    return (uint32_t)(key >> 32);
}

static int pmap_get(const pmap *m, int a, int b, int *new_id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint32_t i = pair_hash(key) & m->mask;; i = (i + 1) & m->mask) {
        if (m->rank[i] < 0) return INT_MAX;
        if (m->key[i] == key) {
            *new_id = m->val[i];
            return m->rank[i];
        }
    }
}

static void pmap_put(pmap *m, int a, int b, int rank, int new_id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint32_t i = pair_hash(key) & m->mask;; i = (i + 1) & m->mask) {
        if (m->rank[i] < 0 || m->key[i] == key) { /* a repeated pair: the later one wins, as in HF */
            m->key[i] = key;
            m->rank[i] = rank;
            m->val[i] = new_id;
            return;
        }
    }
}

/* ---- byte-level alphabet ---------------------------------------------------------------- */

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to U+0100.. in order. */
static void byte_level_tables(uint32_t b2u[256], int16_t u2b[324]) {
    int n = 0;
    for (int i = 0; i < 324; i++) u2b[i] = -1;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        b2u[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
        u2b[b2u[b]] = (int16_t)b;
    }
}

/* Bytes of a byte-level string (every char in the alphabet) into out; -1 if some char is not. */
static int byte_level_decode(const int16_t u2b[324], const char *s, size_t n, char *out) {
    int k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = tt_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (!l || cp >= 324 || u2b[cp] < 0) return -1;
        out[k++] = (char)u2b[cp];
        i += (size_t)l;
    }
    return k;
}

/* ---- pool of strings ---------------------------------------------------------------------- */

static int pool_add(tok *t, const char *s, size_t n, tok_str *dst) {
    if (t->pool_len + n + 1 > t->pool_cap) {
        size_t cap = t->pool_cap ? t->pool_cap * 2 : 1 << 20;
        while (cap < t->pool_len + n + 1) cap *= 2;
        char *p = realloc(t->pool, cap);
        if (!p) return err_set(GE_NOMEM, "tokenizer: out of memory");
        t->pool = p;
        t->pool_cap = cap;
    }
    memcpy(t->pool + t->pool_len, s, n);
    t->pool[t->pool_len + n] = 0;
    dst->off = (uint32_t)t->pool_len;
    dst->len = (uint32_t)n;
    t->pool_len += n + 1;
    return 0;
}

/* ---- loading ---------------------------------------------------------------------------- */

static int load_post_processor(tok *t, const js *pp) {
    if (!pp || pp->type == JS_NULL) return 0;
    const char *type = js_get_str(pp, "type");
    if (type && !strcmp(type, "ByteLevel")) return 0; /* offsets only */
    if (type && !strcmp(type, "Sequence")) {
        const js *list = js_get(pp, "processors");
        for (int i = 0; list && list->type == JS_ARR && i < list->n; i++) {
            int rc = load_post_processor(t, &list->items[i]);
            if (rc) return rc;
        }
        return 0;
    }
    if (type && !strcmp(type, "TemplateProcessing")) {
        const js *single = js_get(pp, "single"), *sp = js_get(pp, "special_tokens");
        int after = 0;
        for (int i = 0; single && single->type == JS_ARR && i < single->n; i++) {
            const js *it = &single->items[i], *st = js_get(it, "SpecialToken");
            if (js_get(it, "Sequence")) {
                after = 1;
                continue;
            }
            const char *name = js_get_str(st, "id");
            const js *ids = js_get(js_get(sp, name ? name : ""), "ids");
            if (!name || !ids || ids->type != JS_ARR)
                return err_set(GE_FORMAT, "tokenizer.json: post_processor special token %.64s has no ids", name ? name : "?");
            for (int k = 0; k < ids->n; k++) {
                int *cnt = after ? &t->n_suffix : &t->n_prefix;
                int *arr = after ? t->suffix : t->prefix;
                if (*cnt >= TOK_MAX_AFFIX) return err_set(GE_UNSUPPORTED, "tokenizer.json: post_processor adds too many tokens");
                arr[(*cnt)++] = (int)js_num(&ids->items[k], -1);
            }
        }
        return 0;
    }
    return err_set(GE_UNSUPPORTED,
                   "tokenizer.json: post_processor type %.64s is not supported "
                   "(only ByteLevel, TemplateProcessing)",
                   type ? type : "?");
}

static int load_pre_tokenizer(tok *t, const js *pt) {
    const char *type = js_get_str(pt, "type");
    const js *list = js_get(pt, "pretokenizers");
    if (!type || strcmp(type, "Sequence") || !list || list->type != JS_ARR || list->n != 2)
        return err_set(GE_UNSUPPORTED,
                       "tokenizer.json: pre_tokenizer %.64s is not supported (only "
                       "Sequence[Split(regex), ByteLevel(use_regex=false)] as Qwen2/3 and Llama 3 ship)",
                       type ? type : "null");
    const js *sp = &list->items[0], *bl = &list->items[1];
    const char *t0 = js_get_str(sp, "type"), *t1 = js_get_str(bl, "type");
    const char *re = js_get_str(js_get(sp, "pattern"), "Regex");
    const char *beh = js_get_str(sp, "behavior");
    if (!t0 || strcmp(t0, "Split") || !t1 || strcmp(t1, "ByteLevel"))
        return err_set(GE_UNSUPPORTED,
                       "tokenizer.json: pre_tokenizer Sequence[%.64s, %.64s] is not supported "
                       "(only Split then ByteLevel)",
                       t0 ? t0 : "?", t1 ? t1 : "?");
    if (!re || (t->pattern = tt_pattern_id(re)) < 0)
        return err_set(GE_UNSUPPORTED,
                       "tokenizer.json: Split pattern %.80s is not one of the supported "
                       "regexes (Qwen2/3, Llama 3)",
                       re ? re : "(not a Regex)");
    if (!beh || strcmp(beh, "Isolated") || js_get_bool(sp, "invert", 0))
        return err_set(GE_UNSUPPORTED,
                       "tokenizer.json: Split behavior %.64s/invert is not supported "
                       "(only Isolated)",
                       beh ? beh : "?");
    if (js_get_bool(bl, "use_regex", 1) || js_get_bool(bl, "add_prefix_space", 1))
        return err_set(GE_UNSUPPORTED,
                       "tokenizer.json: ByteLevel pre-tokenizer with use_regex or "
                       "add_prefix_space is not supported");
    return 0;
}

/* Checks every component and sets the flags; refuses what the encoder does not implement. */
static int load_components(tok *t, const js *root) {
    const js *model = js_get(root, "model");
    const char *mt = js_get_str(model, "type");
    if (!mt || strcmp(mt, "BPE"))
        return err_set(GE_UNSUPPORTED, "tokenizer.json: model type %.64s is not supported (only BPE)", mt ? mt : "(missing)");
    const js *drop = js_get(model, "dropout");
    if (drop && drop->type == JS_NUM && drop->num > 0)
        return err_set(GE_UNSUPPORTED, "tokenizer.json: BPE dropout is not supported");
    const char *pre = js_get_str(model, "continuing_subword_prefix"), *suf = js_get_str(model, "end_of_word_suffix");
    if ((pre && *pre) || (suf && *suf))
        return err_set(GE_UNSUPPORTED,
                       "tokenizer.json: BPE continuing_subword_prefix/end_of_word_suffix "
                       "is not supported");
    t->ignore_merges = js_get_bool(model, "ignore_merges", 0);
    t->byte_fallback = js_get_bool(model, "byte_fallback", 0);
    t->fuse_unk = js_get_bool(model, "fuse_unk", 0);
    const js *norm = js_get(root, "normalizer");
    if (norm && norm->type != JS_NULL) {
        const char *nt = js_get_str(norm, "type");
        if (!nt || strcmp(nt, "NFC"))
            return err_set(GE_UNSUPPORTED, "tokenizer.json: normalizer %.64s is not supported (only NFC)", nt ? nt : "?");
        t->nfc = 1;
    }
    int rc = load_pre_tokenizer(t, js_get(root, "pre_tokenizer"));
    if (rc) return rc;
    const js *dec = js_get(root, "decoder");
    const char *dt = js_get_str(dec, "type");
    if (!dt || strcmp(dt, "ByteLevel"))
        return err_set(GE_UNSUPPORTED, "tokenizer.json: decoder %.64s is not supported (only ByteLevel)", dt ? dt : "null");
    return load_post_processor(t, js_get(root, "post_processor"));
}

static int grow_ids(tok *t, int id) {
    if (id < t->n_vocab) return 0;
    int cap = t->cap_vocab ? t->cap_vocab : 1024;
    while (cap <= id) cap *= 2;
    if (cap != t->cap_vocab) {
        tok_str *a = realloc(t->raw, cap * sizeof *a), *b = a ? realloc(t->model, cap * sizeof *b) : NULL;
        if (a) t->raw = a;
        if (b) t->model = b;
        tok_str *c = b ? realloc(t->dec, cap * sizeof *c) : NULL;
        if (c) t->dec = c;
        uint8_t *f = c ? realloc(t->flags, cap) : NULL;
        if (!f) return err_set(GE_NOMEM, "tokenizer: out of memory");
        t->flags = f;
        t->cap_vocab = cap;
    }
    for (int i = t->n_vocab; i <= id; i++) {
        t->raw[i] = t->model[i] = t->dec[i] = (tok_str){0, 0};
        t->flags[i] = 0;
    }
    t->n_vocab = id + 1;
    return 0;
}

/* The decoder's bytes for a token string: byte-level mapped if every char is in the alphabet,
 * else the string's own bytes (HF's ByteLevel decoder does the same). */
static int set_decode_form(tok *t, int id, const char *s, size_t n, char *tmp) {
    int k = byte_level_decode(t->u2b, s, n, tmp);
    return k >= 0 ? pool_add(t, tmp, (size_t)k, &t->dec[id]) : pool_add(t, s, n, &t->dec[id]);
}

static int load_vocab(tok *t, const js *model, char *tmp) {
    const js *vocab = js_get(model, "vocab");
    if (!vocab || vocab->type != JS_OBJ) return err_set(GE_FORMAT, "tokenizer.json: model.vocab is not an object");
    for (int i = 0; i < vocab->n; i++) {
        int id = (int)js_num(&vocab->items[i], -1);
        const char *s = vocab->keys[i];
        size_t n = strlen(s);
        if (id < 0 || id > (1 << 24)) return err_set(GE_FORMAT, "tokenizer.json: vocab id %d out of range", id);
        int rc = grow_ids(t, id);
        if (rc) return rc;
        if ((rc = pool_add(t, s, n, &t->raw[id])) || (rc = set_decode_form(t, id, s, n, tmp))) return rc;
        int k = byte_level_decode(t->u2b, s, n, tmp);
        if (k >= 0) {
            t->flags[id] |= TOKF_MODEL;
            if ((rc = pool_add(t, tmp, (size_t)k, &t->model[id]))) return rc;
        }
    }
    return 0;
}

static int load_merges(tok *t, const js *model, char *tmp) {
    const js *merges = js_get(model, "merges");
    if (!merges || merges->type != JS_ARR) return err_set(GE_FORMAT, "tokenizer.json: model.merges is not a list");
    uint32_t cap = 16;
    while (cap < (uint32_t)merges->n * 2 + 16) cap <<= 1;
    t->merges.key = malloc(cap * sizeof *t->merges.key);
    t->merges.rank = malloc(cap * sizeof *t->merges.rank);
    t->merges.val = malloc(cap * sizeof *t->merges.val);
    if (!t->merges.key || !t->merges.rank || !t->merges.val) return err_set(GE_NOMEM, "tokenizer: out of memory");
    for (uint32_t i = 0; i < cap; i++) t->merges.rank[i] = -1;
    t->merges.mask = cap - 1;
    for (int r = 0; r < merges->n; r++) {
        const js *m = &merges->items[r];
        const char *a, *b;
        size_t al, bl;
        if (m->type == JS_STR) {
            const char *sp = strchr(m->str, ' ');
            if (!sp) return err_set(GE_FORMAT, "tokenizer.json: merge %d \"%.64s\" has no space", r, m->str);
            a = m->str;
            al = (size_t)(sp - a);
            b = sp + 1;
            bl = strlen(b);
        } else if (m->type == JS_ARR && m->n == 2 && js_str(&m->items[0]) && js_str(&m->items[1])) {
            a = m->items[0].str;
            al = (size_t)m->items[0].n;
            b = m->items[1].str;
            bl = (size_t)m->items[1].n;
        } else {
            return err_set(GE_FORMAT, "tokenizer.json: merge %d is neither \"a b\" nor [a, b]", r);
        }
        int ka = byte_level_decode(t->u2b, a, al, tmp);
        int kb = ka >= 0 ? byte_level_decode(t->u2b, b, bl, tmp + ka) : -1;
        if (kb < 0) continue; /* outside the byte alphabet: can never fire */
        int ia = smap_get(&t->vocab, t->pool, t->model, tmp, (size_t)ka);
        int ib = smap_get(&t->vocab, t->pool, t->model, tmp + ka, (size_t)kb);
        int in = smap_get(&t->vocab, t->pool, t->model, tmp, (size_t)(ka + kb));
        if (ia < 0 || ib < 0 || in < 0)
            return err_set(GE_FORMAT, "tokenizer.json: merge %d (%.*s %.*s) uses a token missing from the vocab", r,
                           al > 64 ? 64 : (int)al, a, bl > 64 ? 64 : (int)bl, b);
        pmap_put(&t->merges, ia, ib, r, in);
    }
    return 0;
}

static int trie_add(tok *t, int which, const char *s, size_t n, int id) {
    tok_trie *tr = &t->trie[which];
    if (!tr->n) {
        tr->cap = 256;
        tr->node = calloc((size_t)tr->cap, sizeof *tr->node);
        if (!tr->node) return err_set(GE_NOMEM, "tokenizer: out of memory");
        tr->node[0] = (tok_trie_node){-1, -1, 0, -1};
        tr->n = 1;
    }
    int cur = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        int ch = tr->node[cur].child;
        while (ch >= 0 && tr->node[ch].byte != c) ch = tr->node[ch].sibling;
        if (ch < 0) {
            if (tr->n == tr->cap) {
                tok_trie_node *nn = realloc(tr->node, (size_t)tr->cap * 2 * sizeof *nn);
                if (!nn) return err_set(GE_NOMEM, "tokenizer: out of memory");
                tr->node = nn;
                tr->cap *= 2;
            }
            ch = tr->n++;
            tr->node[ch] = (tok_trie_node){-1, tr->node[cur].child, c, -1};
            tr->node[cur].child = ch;
        }
        cur = ch;
    }
    if (tr->node[cur].id < 0) tr->node[cur].id = id;
    tr->first[(unsigned char)s[0]] = 1;
    return 0;
}

static int load_added(tok *t, const js *root, char *tmp) {
    const js *added = js_get(root, "added_tokens");
    for (int i = 0; added && added->type == JS_ARR && i < added->n; i++) {
        const js *a = &added->items[i];
        const char *s = js_get_str(a, "content");
        int id = (int)js_get_num(a, "id", -1);
        if (!s || id < 0 || id > (1 << 24)) return err_set(GE_FORMAT, "tokenizer.json: added token %d is malformed", i);
        if (!*s) continue;
        if (js_get_bool(a, "single_word", 0))
            return err_set(GE_UNSUPPORTED, "tokenizer.json: added token %.64s has single_word, which is not supported", s);
        size_t n = strlen(s);
        int rc = grow_ids(t, id);
        if (rc || (rc = pool_add(t, s, n, &t->raw[id])) || (rc = set_decode_form(t, id, s, n, tmp))) return rc;
        int normalized = js_get_bool(a, "normalized", 0);
        t->flags[id] |= TOKF_ADDED | (js_get_bool(a, "special", 0) ? TOKF_SPECIAL : 0) |
            (js_get_bool(a, "lstrip", 0) ? TOKF_LSTRIP : 0) | (js_get_bool(a, "rstrip", 0) ? TOKF_RSTRIP : 0);
        if (normalized && t->nfc) {
            char *nf = NULL;
            size_t nl = 0;
            if ((rc = tt_nfc(s, n, &nf, &nl))) return rc;
            rc = nf ? trie_add(t, 1, nf, nl, id) : trie_add(t, 1, s, n, id);
            free(nf);
        } else {
            rc = trie_add(t, normalized ? 1 : 0, s, n, id);
        }
        if (rc) return rc;
    }
    return 0;
}

static char *cfg_token(const js *cfg, const char *key) {
    const js *v = js_get(cfg, key);
    const char *s = js_str(v) ? js_str(v) : js_get_str(v, "content");
    return s ? strdup(s) : NULL;
}

int tok_load_json_cfg(const char *json, size_t len, const char *cfg, size_t cfg_len, tok **out) {
    js_doc *doc = NULL, *cdoc = NULL;
    const js *root, *croot = NULL;
    char *tmp = NULL;
    *out = NULL;
    int rc = js_parse(json, len, &doc, &root);
    if (rc) return err_set(rc, "tokenizer.json: %s", err_msg());
    if (cfg && (rc = js_parse(cfg, cfg_len, &cdoc, &croot))) {
        js_doc_free(doc);
        return err_set(rc, "tokenizer_config.json: %s", err_msg());
    }
    tok *t = calloc(1, sizeof *t);
    if (!t) {
        rc = err_set(GE_NOMEM, "tokenizer: out of memory");
        goto fail;
    }
    pthread_mutex_init(&t->cache_mu, NULL);
    byte_level_tables(t->b2u, t->u2b);
    if ((rc = load_components(t, root))) goto fail;
    const js *model = js_get(root, "model");
    tmp = malloc(len + 16); /* scratch for any key or merge: each is a part of the text */
    if (!tmp) {
        rc = err_set(GE_NOMEM, "tokenizer: out of memory");
        goto fail;
    }
    if ((rc = load_vocab(t, model, tmp))) goto fail;
    int n_model = t->n_vocab;
    if ((rc = smap_init(&t->vocab, n_model))) goto fail;
    for (int id = 0; id < n_model; id++)
        if (t->flags[id] & TOKF_MODEL) smap_put(&t->vocab, t->pool, t->model, id);
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = smap_get(&t->vocab, t->pool, t->model, &c, 1);
    }
    if ((rc = load_merges(t, model, tmp))) goto fail;
    const char *unk = js_get_str(model, "unk_token");
    t->unk_id = -1;
    if (unk) {
        int k = byte_level_decode(t->u2b, unk, strlen(unk), tmp);
        t->unk_id = k >= 0 ? smap_get(&t->vocab, t->pool, t->model, tmp, (size_t)k) : -1;
        if (t->unk_id < 0) {
            rc = err_set(GE_FORMAT, "tokenizer.json: unk_token %.64s is not in the vocab", unk);
            goto fail;
        }
    }
    if ((rc = load_added(t, root, tmp))) goto fail;
    if ((rc = smap_init(&t->names, t->n_vocab))) goto fail;
    for (int id = t->n_vocab - 1; id >= 0; id--) /* added tokens override vocab strings */
        if (t->raw[id].len || (t->flags[id] & TOKF_ADDED)) smap_put(&t->names, t->pool, t->raw, id);
    for (int i = 0; i < t->n_prefix + t->n_suffix; i++) {
        int id = i < t->n_prefix ? t->prefix[i] : t->suffix[i - t->n_prefix];
        if (id < 0 || id >= t->n_vocab) {
            rc = err_set(GE_FORMAT, "tokenizer.json: post_processor id %d out of range", id);
            goto fail;
        }
    }
    if (croot) {
        t->bos = cfg_token(croot, "bos_token");
        t->eos = cfg_token(croot, "eos_token");
        const char *ct = js_get_str(croot, "chat_template");
        t->chat_template = ct ? strdup(ct) : NULL;
    }
    free(tmp);
    js_doc_free(doc);
    js_doc_free(cdoc);
    *out = t;
    return 0;
fail:
    free(tmp);
    tok_free(t);
    js_doc_free(doc);
    js_doc_free(cdoc);
    return rc;
}

int tok_load_json(const char *json, size_t len, tok **out) { return tok_load_json_cfg(json, len, NULL, 0, out); }

static int read_file(const char *path, char **buf, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return GE_NOT_FOUND;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *buf = malloc((size_t)(n < 0 ? 0 : n) + 1);
    if (!*buf) {
        fclose(f);
        return err_set(GE_NOMEM, "%s: out of memory", path);
    }
    *len = fread(*buf, 1, (size_t)n, f);
    (*buf)[*len] = 0;
    int bad = ferror(f);
    fclose(f);
    if (bad || n < 0) {
        free(*buf);
        *buf = NULL;
        return err_set(GE_IO, "%s: read failed", path);
    }
    return 0;
}

int tok_load(const char *dir, tok **out) {
    char path[4096];
    char *json = NULL, *cfg = NULL;
    size_t jl = 0, cl = 0;
    *out = NULL;
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    int rc = read_file(path, &json, &jl);
    if (rc == GE_NOT_FOUND) return err_set(GE_NOT_FOUND, "%s: no such file", path);
    if (rc) return rc;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    rc = read_file(path, &cfg, &cl);
    if (rc && rc != GE_NOT_FOUND) {
        free(json);
        return rc;
    }
    rc = tok_load_json_cfg(json, jl, cfg, cl, out);
    if (rc) err_set(rc, "%s: %s", dir, err_msg());
    free(json);
    free(cfg);
    return rc;
}

void tok_free(tok *t) {
    if (!t) return;
    free(t->pool);
    free(t->raw);
    free(t->model);
    free(t->dec);
    free(t->flags);
    free(t->vocab.slot);
    free(t->names.slot);
    free(t->merges.key);
    free(t->merges.rank);
    free(t->merges.val);
    free(t->trie[0].node);
    free(t->trie[1].node);
    free(t->bos);
    free(t->eos);
    free(t->chat_template);
    tok_cache_free(&t->cache);
    pthread_mutex_destroy(&t->cache_mu);
    free(t);
}

/* ---- lookups ---------------------------------------------------------------------------- */

int tok_vocab_size(const tok *t) { return t->n_vocab; }
const char *tok_bos(const tok *t) { return t->bos; }
const char *tok_eos(const tok *t) { return t->eos; }
const char *tok_chat_template(const tok *t) { return t->chat_template; }
int tok_is_special(const tok *t, int id) { return id >= 0 && id < t->n_vocab && (t->flags[id] & TOKF_SPECIAL); }
const char *tok_token_bytes(const tok *t, int id, size_t *n) {
    if (id < 0 || id >= t->n_vocab || !t->raw[id].len) return NULL;
    *n = t->dec[id].len;
    return t->pool + t->dec[id].off;
}
int tok_token_id(const tok *t, const char *s) { return smap_get(&t->names, t->pool, t->raw, s, strlen(s)); }
int tok_vocab_lookup(const tok *t, const char *s, size_t n) { return smap_get(&t->vocab, t->pool, t->model, s, n); }
int tok_merge_rank(const tok *t, int a, int b, int *new_id) { return pmap_get(&t->merges, a, b, new_id); }
