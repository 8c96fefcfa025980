/* tok_encode.c — BPE, tok_encode and tok_decode over a loaded tok (engine/text/tokenizer.c), and the
 * default model's tokenizer files.
 *
 * BPE follows HF's Word::merge_all: repeatedly merge the adjacent pair with the lowest merge rank,
 * the leftmost one on ties. Short words use a plain scan over a compact array (fast for the
 * usual < 20 bytes); long ones (runs of spaces, long words) HF's heap with lazy deletion. Both
 * pick the same pair at every step, so they give the same ids.
 *
 * Layout: id vectors · word cache · BPE · encode · decode · default tokenizer files. */
#include "common/err.h"
#include "engine/text/tok_internal.h"
#include "engine/text/tok_text.h"
#include "engine/text/unicode_data.h"
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- id vectors ------------------------------------------------------------------------- */

typedef struct {
    int *v;
    int n, cap;
} ivec;

static int ivec_reserve(ivec *a, int extra) {
    if (a->n + extra <= a->cap) return 0;
    int cap = a->cap ? a->cap : 64;
    while (cap < a->n + extra) cap *= 2;
    int *v = realloc(a->v, (size_t)cap * sizeof *v);
    if (!v) return err_set(GE_NOMEM, "tokenizer: out of memory");
    a->v = v;
    a->cap = cap;
    return 0;
}

static int ivec_push(ivec *a, int x) {
    int rc = ivec_reserve(a, 1);
    if (!rc) a->v[a->n++] = x;
    return rc;
}

/* ---- word cache ------------------------------------------------------------------------- */

enum { CACHE_MAX_KEY = 64, CACHE_SLOTS = 1 << 17, CACHE_ENTS = CACHE_SLOTS / 2, CACHE_KEYS = 4 << 20, CACHE_IDS = 1 << 20 };

static uint64_t cache_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h ^ (h >> 31);
}

static const int *cache_get(const tok_cache *c, const char *s, size_t n, uint64_t h, int *nids) {
    if (!c->slot) return NULL;
    for (uint32_t i = (uint32_t)h & c->mask;; i = (i + 1) & c->mask) {
        uint32_t v = c->slot[i];
        if (!v) return NULL;
        const struct tok_cache_ent *e = &c->ent[v - 1];
        if (e->h == h && e->klen == n && !memcmp(c->keys + e->key, s, n)) {
            *nids = (int)e->nids;
            return c->ids + e->ids;
        }
    }
}

static void cache_put(tok_cache *c, const char *s, size_t n, uint64_t h, const int *ids, int nids) {
    if (!c->slot) {
        c->slot = calloc(CACHE_SLOTS, sizeof *c->slot);
        c->ent = malloc(CACHE_ENTS * sizeof *c->ent);
        c->keys = malloc(CACHE_KEYS);
        c->ids = malloc(CACHE_IDS * sizeof *c->ids);
        if (!c->slot || !c->ent || !c->keys || !c->ids) {
            tok_cache_free(c);
            return;
        }
        c->mask = CACHE_SLOTS - 1;
    }
    if (c->n_ent == CACHE_ENTS || c->keys_len + n > CACHE_KEYS || c->ids_len + (size_t)nids > CACHE_IDS) {
        memset(c->slot, 0, CACHE_SLOTS * sizeof *c->slot);
        c->n_ent = 0;
        c->keys_len = c->ids_len = 0;
    }
    struct tok_cache_ent *e = &c->ent[c->n_ent];
    *e = (struct tok_cache_ent){h, (uint32_t)c->keys_len, (uint32_t)n, (uint32_t)c->ids_len, (uint32_t)nids};
    memcpy(c->keys + c->keys_len, s, n);
    c->keys_len += n;
    memcpy(c->ids + c->ids_len, ids, (size_t)nids * sizeof *ids);
    c->ids_len += (size_t)nids;
    uint32_t i = (uint32_t)h & c->mask;
    while (c->slot[i]) i = (i + 1) & c->mask;
    c->slot[i] = (uint32_t)++c->n_ent;
}

void tok_cache_free(tok_cache *c) {
    free(c->slot);
    free(c->ent);
    free(c->keys);
    free(c->ids);
    memset(c, 0, sizeof *c);
}

/* ---- BPE -------------------------------------------------------------------------------- */

/* Initial symbols of a word: one per byte; bytes without a token go through byte_fallback
 * ("<0xXX>" of the byte's alphabet character) or unk, as HF's BPE::merge_word. */
static int bpe_symbols(const tok *t, const unsigned char *s, int n, ivec *sym) {
    int rc = ivec_reserve(sym, n * 4);
    if (rc) return rc;
    int last_unk = 0;
    for (int i = 0; i < n; i++) {
        int id = t->byte_id[s[i]];
        if (id >= 0) {
            sym->v[sym->n++] = id;
            last_unk = 0;
            continue;
        }
        if (t->byte_fallback) {
            char ch[4], name[8];
            int k = utf8_encode(t->b2u[s[i]], ch), ids[4], ok = 1;
            for (int j = 0; j < k && ok; j++) {
                snprintf(name, sizeof name, "<0x%02X>", (unsigned char)ch[j]);
                ids[j] = tok_vocab_lookup(t, name, strlen(name));
                ok = ids[j] >= 0;
            }
            if (ok) {
                for (int j = 0; j < k; j++) sym->v[sym->n++] = ids[j];
                last_unk = 0;
                continue;
            }
        }
        if (t->unk_id >= 0 && !(t->fuse_unk && last_unk)) {
            sym->v[sym->n++] = t->unk_id;
            last_unk = 1;
        }
    }
    return 0;
}

/* Merge in place over a compact array: sym[0..n), rank[i] of the pair (i, i+1). */
static int bpe_merge_scan(const tok *t, int *sym, int n) {
    int rank[CACHE_MAX_KEY * 4], nid[CACHE_MAX_KEY * 4];
    for (int i = 0; i + 1 < n; i++) rank[i] = tok_merge_rank(t, sym[i], sym[i + 1], &nid[i]);
    while (n > 1) {
        int best = 0;
        for (int i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == INT_MAX) break;
        sym[best] = nid[best];
        memmove(sym + best + 1, sym + best + 2, (size_t)(n - best - 2) * sizeof *sym);
        memmove(rank + best, rank + best + 1, (size_t)(n - best - 2) * sizeof *rank);
        memmove(nid + best, nid + best + 1, (size_t)(n - best - 2) * sizeof *nid);
        n--;
        if (best > 0) rank[best - 1] = tok_merge_rank(t, sym[best - 1], sym[best], &nid[best - 1]);
        if (best + 1 < n) rank[best] = tok_merge_rank(t, sym[best], sym[best + 1], &nid[best]);
    }
    return n;
}

typedef struct {
    int rank, pos, id;
} bpe_ent;
static int ent_less(bpe_ent a, bpe_ent b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void heap_push(bpe_ent *h, int *n, bpe_ent e) {
    int i = (*n)++;
    while (i > 0 && ent_less(e, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = e;
}

static bpe_ent heap_pop(bpe_ent *h, int *n) {
    bpe_ent top = h[0], last = h[--*n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && ent_less(h[c + 1], h[c])) c++;
        if (!ent_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

/* HF's merge_all with a heap of (rank, pos) and stale entries skipped; result compacted. */
static int bpe_merge_heap(const tok *t, int *sym, int n) {
    int *prev = malloc((size_t)n * 3 * sizeof *prev);
    bpe_ent *h = malloc((size_t)n * 3 * sizeof *h); /* <= n-1 initial + 2 per merge */
    if (!prev || !h) {
        free(prev);
        free(h);
        return err_set(GE_NOMEM, "tokenizer: out of memory");
    }
    int *next = prev + n, *alive = prev + 2 * n, nh = 0;
    for (int i = 0; i < n; i++) {
        prev[i] = i - 1;
        next[i] = i + 1 < n ? i + 1 : -1;
        alive[i] = 1;
    }
    for (int i = 0; i + 1 < n; i++) {
        int id, r = tok_merge_rank(t, sym[i], sym[i + 1], &id);
        if (r != INT_MAX) heap_push(h, &nh, (bpe_ent){r, i, id});
    }
    while (nh) {
        bpe_ent e = heap_pop(h, &nh);
        int p = e.pos, q = next[p], id;
        if (!alive[p] || q < 0) continue;
        if (tok_merge_rank(t, sym[p], sym[q], &id) == INT_MAX || id != e.id) continue;
        sym[p] = e.id;
        alive[q] = 0;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        if (prev[p] >= 0) {
            int r = tok_merge_rank(t, sym[prev[p]], sym[p], &id);
            if (r != INT_MAX) heap_push(h, &nh, (bpe_ent){r, prev[p], id});
        }
        if (next[p] >= 0) {
            int r = tok_merge_rank(t, sym[p], sym[next[p]], &id);
            if (r != INT_MAX) heap_push(h, &nh, (bpe_ent){r, p, id});
        }
    }
    int m = 0;
    for (int i = 0; i < n; i++)
        if (alive[i]) sym[m++] = sym[i];
    free(prev);
    free(h);
    return m;
}

/* ---- encode ------------------------------------------------------------------------------ */

typedef struct {
    const tok *t;
    tok_cache *cache; /* NULL when another thread holds it */
    int parse_special;
    ivec out, sym;
    tt_scratch sc;
    int *bounds;
    size_t bcap;
} enc;

static int encode_word(enc *e, const char *s, int n) {
    const tok *t = e->t;
    if (n == 1 && t->byte_id[(unsigned char)s[0]] >= 0) return ivec_push(&e->out, t->byte_id[(unsigned char)s[0]]);
    if (t->ignore_merges) {
        int id = tok_vocab_lookup(t, s, (size_t)n);
        if (id >= 0) return ivec_push(&e->out, id);
    }
    uint64_t h = 0;
    if (e->cache && n <= CACHE_MAX_KEY) {
        int k;
        h = cache_hash(s, (size_t)n);
        const int *ids = cache_get(e->cache, s, (size_t)n, h, &k);
        if (ids) {
            int rc = ivec_reserve(&e->out, k);
            if (!rc) {
                memcpy(e->out.v + e->out.n, ids, (size_t)k * sizeof *ids);
                e->out.n += k;
            }
            return rc;
        }
    }
    e->sym.n = 0;
    int rc = bpe_symbols(t, (const unsigned char *)s, n, &e->sym);
    if (rc) return rc;
    int m = e->sym.n <= 64 ? bpe_merge_scan(t, e->sym.v, e->sym.n) : bpe_merge_heap(t, e->sym.v, e->sym.n);
    if (m < 0) return m;
    if (e->cache && n <= CACHE_MAX_KEY) cache_put(e->cache, s, (size_t)n, h, e->sym.v, m);
    if ((rc = ivec_reserve(&e->out, m))) return rc;
    memcpy(e->out.v + e->out.n, e->sym.v, (size_t)m * sizeof *e->sym.v);
    e->out.n += m;
    return 0;
}

static int encode_pretok(enc *e, const char *s, size_t n) {
    if (!n) return 0;
    if (e->bcap < n + 2) {
        int *b = realloc(e->bounds, (n + 2) * sizeof *b);
        if (!b) return err_set(GE_NOMEM, "tokenizer: out of memory");
        e->bounds = b;
        e->bcap = n + 2;
    }
    int np, rc = tt_split(e->t->pattern, s, n, &e->sc, e->bounds, &np);
    for (int k = 0; !rc && k < np; k++) rc = encode_word(e, s + e->bounds[k], e->bounds[k + 1] - e->bounds[k]);
    return rc;
}

static size_t ws_len_before(const char *s, size_t start, size_t floor) {
    /* start of the whitespace run that ends at start (White_Space chars), not before floor */
    size_t i = start;
    while (i > floor) {
        size_t j = i - 1;
        while (j > floor && ((unsigned char)s[j] & 0xC0) == 0x80) j--;
        uint32_t cp;
        if (!tt_utf8_decode((const unsigned char *)s + j, i - j, &cp) || uc_class(cp) != UC_WS) break;
        i = j;
    }
    return i;
}

static size_t ws_len_after(const char *s, size_t i, size_t n) {
    while (i < n) {
        uint32_t cp;
        int k = tt_utf8_decode((const unsigned char *)s + i, n - i, &cp);
        if (!k || uc_class(cp) != UC_WS) break;
        i += (size_t)k;
    }
    return i;
}

typedef int (*enc_next)(enc *e, const char *s, size_t n);

/* Split s by the added tokens of trie[which] (leftmost-longest, non-overlapping, as HF's
 * aho-corasick), passing the text between matches to next. */
static int split_added(enc *e, int which, const char *s, size_t n, enc_next next) {
    const tok *t = e->t;
    const tok_trie *tr = &t->trie[which];
    if (!tr->n) return next(e, s, n);
    size_t start_off = 0, i = 0;
    while (i < n) {
        if (!tr->first[(unsigned char)s[i]]) {
            i++;
            continue;
        }
        int cur = 0, id = -1;
        size_t end = 0;
        for (size_t j = i; j < n; j++) {
            int ch = tr->node[cur].child;
            while (ch >= 0 && tr->node[ch].byte != (unsigned char)s[j]) ch = tr->node[ch].sibling;
            if (ch < 0) break;
            cur = ch;
            if (tr->node[cur].id >= 0) {
                id = tr->node[cur].id;
                end = j + 1;
            }
        }
        if (id < 0) {
            i++;
            continue;
        }
        if (!e->parse_special && (t->flags[id] & TOKF_SPECIAL)) {
            i = end;
            continue;
        }
        size_t start = i, stop = end;
        if (t->flags[id] & TOKF_LSTRIP) start = ws_len_before(s, start, start_off);
        if (t->flags[id] & TOKF_RSTRIP) stop = ws_len_after(s, stop, n);
        int rc = start > start_off ? next(e, s + start_off, start - start_off) : 0;
        if (rc || (rc = ivec_push(&e->out, id))) return rc;
        start_off = stop;
        i = stop;
    }
    return start_off < n ? next(e, s + start_off, n - start_off) : 0;
}

static int encode_normalized(enc *e, const char *s, size_t n) { return split_added(e, 1, s, n, encode_pretok); }

static int encode_raw(enc *e, const char *s, size_t n) {
    if (!e->t->nfc) return encode_normalized(e, s, n);
    char *nf = NULL;
    size_t nl = 0;
    int rc = tt_nfc(s, n, &nf, &nl);
    if (rc) return rc;
    rc = nf ? encode_normalized(e, nf, nl) : encode_normalized(e, s, n);
    free(nf);
    return rc;
}

int tok_encode(const tok *t, const char *text, size_t len, int add_special, int parse_special, int **ids, int *n) {
    *ids = NULL;
    *n = 0;
    if (!tt_utf8_valid(text, len)) return err_set(GE_INVALID, "tokenize: text is not valid UTF-8");
    if (len > INT_MAX / 2) return err_set(GE_TOO_LARGE, "tokenize: text of %zu bytes is too long", len);
    tok *mt = (tok *)t; /* only the cache is mutated, under its lock */
    enc e = {.t = t, .parse_special = parse_special};
    if (!pthread_mutex_trylock(&mt->cache_mu)) e.cache = &mt->cache;
    int rc = 0;
    for (int i = 0; add_special && !rc && i < t->n_prefix; i++) rc = ivec_push(&e.out, t->prefix[i]);
    if (!rc) rc = split_added(&e, 0, text, len, encode_raw);
    for (int i = 0; add_special && !rc && i < t->n_suffix; i++) rc = ivec_push(&e.out, t->suffix[i]);
    if (e.cache) pthread_mutex_unlock(&mt->cache_mu);
    free(e.sym.v);
    free(e.bounds);
    tt_scratch_free(&e.sc);
    if (rc) {
        free(e.out.v);
        return rc;
    }
    if (!e.out.v && !(e.out.v = malloc(sizeof(int)))) return err_set(GE_NOMEM, "tokenizer: out of memory");
    *ids = e.out.v;
    *n = e.out.n;
    return 0;
}

/* ---- decode ------------------------------------------------------------------------------ */

/* Length of the well-formed prefix of a UTF-8 sequence at s (Rust's Utf8Chunks rule: an invalid
 * sequence is replaced by one U+FFFD for its longest valid prefix, or for one byte). */
static int utf8_valid_prefix(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    int need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 1;
    int k = 1;
    for (; k <= need && (size_t)k < n; k++) {
        unsigned b = s[k];
        if (k == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80) break;
    }
    return k;
}

int tok_decode(const tok *t, const int *ids, int n, int skip_special, char **text, size_t *len) {
    size_t total = 0;
    *text = NULL;
    *len = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < t->n_vocab) total += t->dec[ids[i]].len;
    unsigned char *b = malloc(total + 1);
    char *o = malloc(total * 3 + 1); /* each invalid byte becomes 3 bytes at most */
    if (!b || !o) {
        free(b);
        free(o);
        return err_set(GE_NOMEM, "detokenize: out of memory");
    }
    size_t m = 0;
    for (int i = 0; i < n; i++) {
        int id = ids[i];
        if (id < 0 || id >= t->n_vocab || !t->raw[id].len) continue; /* unknown ids: skipped */
        if (skip_special && (t->flags[id] & TOKF_SPECIAL)) continue;
        memcpy(b + m, t->pool + t->dec[id].off, t->dec[id].len);
        m += t->dec[id].len;
    }
    size_t ol = 0;
    for (size_t i = 0; i < m;) {
        if (b[i] < 0x80) {
            o[ol++] = (char)b[i++];
            continue;
        }
        uint32_t cp;
        int k = tt_utf8_decode(b + i, m - i, &cp);
        if (k) {
            memcpy(o + ol, b + i, (size_t)k);
            ol += (size_t)k;
            i += (size_t)k;
            continue;
        }
        memcpy(o + ol, "\xEF\xBF\xBD", 3);
        ol += 3;
        i += (size_t)utf8_valid_prefix(b + i, m - i);
    }
    o[ol] = 0;
    free(b);
    *text = o;
    *len = ol;
    return 0;
}

/* ---- default model's tokenizer files ---------------------------------------------------- */


/* s as a JSON string literal (quotes included). */
static void sb_json(tt_buf *b, const char *s) {
    tt_put(b, "\"", 1);
    for (; *s; s++) {
        switch (*s) {
        case '"': tt_str(b, "\\\""); break;
        case '\\': tt_str(b, "\\\\"); break;
        case '\n': tt_str(b, "\\n"); break;
        case '\r': tt_str(b, "\\r"); break;
        case '\t': tt_str(b, "\\t"); break;
        default: tt_put(b, s, 1);
        }
    }
    tt_put(b, "\"", 1);
}

static const char *default_specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};

char *tok_default_tokenizer_json(void) {
    static const char qwen2_re[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
                                   " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    static const char bl[] = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, "
                             "\"use_regex\": false}";
    tt_buf b = {0};
    char tmp[64];
    tt_str(&b, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [");
    for (int i = 0; i < 3; i++) {
        snprintf(tmp, sizeof tmp, "%s\n    {\"id\": %d, \"content\": ", i ? "," : "", 256 + i);
        tt_str(&b, tmp);
        sb_json(&b, default_specials[i]);
        tt_str(&b,
               ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
               "\"normalized\": false, \"special\": true}");
    }
    tt_str(&b,
           "\n  ],\n  \"normalizer\": null,\n  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": "
           "[{\"type\": \"Split\", \"pattern\": {\"Regex\": ");
    sb_json(&b, qwen2_re);
    tt_str(&b, "}, \"behavior\": \"Isolated\", \"invert\": false}, ");
    tt_str(&b, bl);
    tt_str(&b, "]},\n  \"post_processor\": ");
    tt_str(&b, bl);
    tt_str(&b, ",\n  \"decoder\": ");
    tt_str(&b, bl);
    tt_str(&b,
           ",\n  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
           "\"continuing_subword_prefix\": null, \"end_of_word_suffix\": null, \"fuse_unk\": false, "
           "\"byte_fallback\": false, \"ignore_merges\": false, \"vocab\": {");
    uint32_t b2u[256];
    int16_t u2b[324];
    int n = 0;
    for (int i = 0; i < 324; i++) u2b[i] = -1;
    for (int c = 0; c < 256; c++) { /* GPT-2 bytes_to_unicode */
        int keep = (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || (c >= 174);
        b2u[c] = keep ? (uint32_t)c : (uint32_t)(256 + n++);
    }
    (void)u2b;
    for (int c = 0; c < 256; c++) {
        char ch[5] = {0};
        ch[utf8_encode(b2u[c], ch)] = 0;
        tt_str(&b, c ? ", " : "");
        sb_json(&b, ch);
        snprintf(tmp, sizeof tmp, ": %d", c);
        tt_str(&b, tmp);
    }
    tt_str(&b, "}, \"merges\": []}\n}\n");
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

char *tok_default_tokenizer_config_json(void) {
    static const char chatml[] =
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\\\n' + message['content'] + "
        "'<|im_end|>' + '\\\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\\\n' }}{% endif %}";
    tt_buf b = {0};
    tt_str(&b,
           "{\n  \"add_bos_token\": false,\n  \"bos_token\": null,\n  \"eos_token\": \"<|im_end|>\",\n"
           "  \"pad_token\": \"<|endoftext|>\",\n  \"unk_token\": null,\n"
           "  \"tokenizer_class\": \"PreTrainedTokenizerFast\",\n  \"model_max_length\": 131072,\n"
           "  \"chat_template\": \"");
    tt_str(&b, chatml);
    tt_str(&b, "\"\n}\n");
    if (b.oom) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
