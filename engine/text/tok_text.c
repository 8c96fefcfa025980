/* tok_text.c — UTF-8, NFC and the pre-tokenizer split for engine/text/tokenizer.c.
 *
 * The split implements, by hand, the two regexes Hugging Face tokenizer.json files of Qwen2/3 and
 * Llama 3 carry, with Oniguruma's leftmost-first backtracking semantics:
 *
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *   \s*[\r\n]+|\s+(?!\S)|\s+                                      (Qwen2/3; Llama 3: \p{N}{1,3})
 *
 * Each alternative is tried in order at the current position; what each one matches after
 * backtracking is worked out in tt_match below. Character classes come from the generated
 * Unicode 16.0 tables (engine/text/unicode_data.c); NFC uses the Unicode 9.0 tables there, because the
 * reference normalizes with Unicode 9.0 data (see tools/gen_unicode.py). */
#include "engine/text/tok_text.h"
#include "common/err.h"
#include "common/utf8.h"
#include "engine/text/unicode_data.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- UTF-8 ---------------------------------------------------------------------------- */

int tt_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c < 0xC2) return 0;
    if (c < 0xE0) {
        if (n < 2 || (s[1] & 0xC0) != 0x80) return 0;
        *cp = ((c & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (c < 0xF0) {
        if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
        if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] > 0x9F)) return 0;
        *cp = ((c & 0x0F) << 12) | ((s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    if (c < 0xF5) {
        if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
        if ((c == 0xF0 && s[1] < 0x90) || (c == 0xF4 && s[1] > 0x8F)) return 0;
        *cp = ((c & 0x07) << 18) | ((s[1] & 0x3F) << 12) | ((s[2] & 0x3F) << 6) | (s[3] & 0x3F);
        return 4;
    }
    return 0;
}

int tt_utf8_valid(const char *s, size_t n) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int k = tt_utf8_decode(p + i, n - i, &cp);
        if (!k) return 0;
        i += (size_t)k;
    }
    return 1;
}

/* ---- NFC -------------------------------------------------------------------------------- */

enum {
    SBASE = 0xAC00,
    LBASE = 0x1100,
    VBASE = 0x1161,
    TBASE = 0x11A7,
    LCOUNT = 19,
    VCOUNT = 21,
    TCOUNT = 28,
    NCOUNT = VCOUNT * TCOUNT,
    SCOUNT = LCOUNT * NCOUNT
};

static int nfc_busy(uint32_t cp) {
    if (cp < 0x300) return 0;
    int lo = 0, hi = uc_nfc_busy_ranges_n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) >> 1;
        if (cp < uc_nfc_busy_ranges[mid][0]) hi = mid - 1;
        else if (cp > uc_nfc_busy_ranges[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}

/* Full canonical decomposition of cp appended to out; returns the count (1..). */
static int nfc_decompose(uint32_t cp, uint32_t *out) {
    if (cp >= SBASE && cp < SBASE + SCOUNT) {
        uint32_t s = cp - SBASE, t = s % TCOUNT;
        out[0] = LBASE + s / NCOUNT;
        out[1] = VBASE + (s % NCOUNT) / TCOUNT;
        if (t) {
            out[2] = TBASE + t;
            return 3;
        }
        return 2;
    }
    int lo = 0, hi = uc_decomp_n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) >> 1;
        if (cp < uc_decomp[mid][0]) hi = mid - 1;
        else if (cp > uc_decomp[mid][0]) lo = mid + 1;
        else {
            for (uint32_t k = 0; k < uc_decomp[mid][2]; k++) out[k] = uc_decomp_pool[uc_decomp[mid][1] + k];
            return (int)uc_decomp[mid][2];
        }
    }
    out[0] = cp;
    return 1;
}

static uint32_t nfc_compose(uint32_t a, uint32_t b) {
    if (a >= LBASE && a < LBASE + LCOUNT && b >= VBASE && b < VBASE + VCOUNT)
        return SBASE + ((a - LBASE) * VCOUNT + (b - VBASE)) * TCOUNT;
    if (a >= SBASE && a < SBASE + SCOUNT && (a - SBASE) % TCOUNT == 0 && b > TBASE && b < TBASE + TCOUNT) return a + (b - TBASE);
    int lo = 0, hi = uc_comp_n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) >> 1;
        const uint32_t *e = uc_comp[mid];
        if (a < e[0] || (a == e[0] && b < e[1])) hi = mid - 1;
        else if (a > e[0] || b > e[1]) lo = mid + 1;
        else return e[2];
    }
    return 0;
}

int tt_nfc(const char *s, size_t n, char **out, size_t *out_len) {
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    *out = NULL;
    for (; i < n; i++) {
        if (p[i] < 0xCC) continue; /* lead bytes below U+0300 */
        uint32_t cp;
        int k = tt_utf8_decode(p + i, n - i, &cp);
        if (k && nfc_busy(cp)) break;
    }
    if (i == n) return 0;
    /* Decompose + reorder + compose over the whole string (as the reference does). */
    uint32_t *d = malloc((n * 4 + 4) * sizeof *d); /* a code point decomposes to <= 4 here */
    uint8_t *cc = malloc(n * 4 + 4);
    if (!d || !cc) {
        free(d);
        free(cc);
        return err_set(GE_NOMEM, "nfc: out of memory");
    }
    size_t nd = 0;
    for (size_t j = 0; j < n;) {
        uint32_t cp;
        int k = tt_utf8_decode(p + j, n - j, &cp);
        if (!k) {
            cp = 0xFFFD;
            k = 1;
        }
        j += (size_t)k;
        int m = nfc_decompose(cp, d + nd);
        for (int q = 0; q < m; q++) { /* canonical ordering: stable insertion by ccc */
            uint32_t x = d[nd];
            uint8_t c = (uint8_t)uc_ccc(x);
            size_t r = nd;
            while (c && r > 0 && cc[r - 1] > c) {
                d[r] = d[r - 1];
                cc[r] = cc[r - 1];
                r--;
            }
            d[r] = x;
            cc[r] = c;
            nd++;
        }
    }
    size_t no = 0;
    long starter = -1;
    int last_cc = 0;
    for (size_t j = 0; j < nd; j++) {
        uint32_t c = d[j];
        int ccj = cc[j];
        if (starter >= 0) {
            int adjacent = (long)no - 1 == starter;
            if (adjacent || (last_cc != 0 && last_cc < ccj)) {
                uint32_t k = nfc_compose(d[starter], c);
                if (k) {
                    d[starter] = k;
                    continue;
                }
            }
        }
        if (ccj == 0) starter = (long)no;
        last_cc = ccj;
        d[no] = c;
        cc[no] = (uint8_t)ccj;
        no++;
    }
    char *o = malloc(no * 4 + 1);
    if (!o) {
        free(d);
        free(cc);
        return err_set(GE_NOMEM, "nfc: out of memory");
    }
    size_t ol = 0;
    for (size_t j = 0; j < no; j++) ol += (size_t)utf8_encode(d[j], o + ol);
    o[ol] = 0;
    free(d);
    free(cc);
    *out = o;
    *out_len = ol;
    return 0;
}

/* ---- pre-tokenizer split ------------------------------------------------------------------ */

int tt_pattern_id(const char *re) {
    static const char qwen2[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
                                " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    static const char llama3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
                                 " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
    if (!strcmp(re, qwen2)) return TT_PAT_QWEN2;
    if (!strcmp(re, llama3)) return TT_PAT_LLAMA3;
    return -1;
}

/* Class codes in sc->cl: the Unicode class plus a bit for \r and \n. */
enum { CL_O = UC_OTHER, CL_L = UC_L, CL_N = UC_N, CL_WS = UC_WS, CL_NL = 4 };
#define IS_WS(c) (((c)&3) == CL_WS)
#define IS_P(c) (((c)&3) == CL_O) /* [^\s\p{L}\p{N}] */

static uint8_t ascii_cl[128];
static void ascii_init(void) {
    for (int c = 0; c < 128; c++) ascii_cl[c] = (uint8_t)uc_class((uint32_t)c);
    ascii_cl['\r'] |= CL_NL;
    ascii_cl['\n'] |= CL_NL;
}

static int fold_letter(uint32_t c) {
    if (c < 128) return (c >= 'A' && c <= 'Z') ? (int)c + 32 : (int)c;
    return c == uc_fold_s ? 's' : 0;
}

/* Length in code points of the match at i (n code points); 0 if none (never, for these
 * patterns, but a gap is handled anyway). */
static int tt_match(const uint32_t *cp, const uint8_t *cl, int i, int n, int maxdig) {
    /* (?i:'s|'t|'re|'ve|'m|'ll|'d) */
    if (cp[i] == '\'' && i + 1 < n) {
        int a = fold_letter(cp[i + 1]);
        if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
        if (i + 2 < n) {
            int b = fold_letter(cp[i + 2]);
            if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
        }
    }
    uint8_t c = cl[i];
    /* [^\r\n\p{L}\p{N}]?\p{L}+ : the optional char is anything but \r \n L N */
    {
        int j = i;
        if ((c & 3) != CL_L && (c & 3) != CL_N && !(c & CL_NL)) j++;
        if (j < n && (cl[j] & 3) == CL_L) {
            while (j < n && (cl[j] & 3) == CL_L) j++;
            return j - i;
        }
    }
    /* \p{N} or \p{N}{1,3} */
    if ((c & 3) == CL_N) {
        int j = i + 1;
        while (j < n && j - i < maxdig && (cl[j] & 3) == CL_N) j++;
        return j - i;
    }
    /*  ?[^\s\p{L}\p{N}]+[\r\n]* */
    {
        int j = -1;
        if (cp[i] == ' ' && i + 1 < n && IS_P(cl[i + 1])) j = i + 1;
        else if (IS_P(c)) j = i;
        if (j >= 0) {
            while (j < n && IS_P(cl[j])) j++;
            while (j < n && (cl[j] & CL_NL)) j++;
            return j - i;
        }
    }
    if (!IS_WS(c)) return 0;
    int e = i;
    while (e < n && IS_WS(cl[e])) e++;
    /* \s*[\r\n]+ : ends after the last \r or \n of the whitespace run */
    for (int j = e - 1; j >= i; j--)
        if (cl[j] & CL_NL) return j + 1 - i;
    /* \s+(?!\S) then \s+ */
    if (e == n || e - i == 1) return e - i;
    return e - 1 - i;
}

int tt_split(int pattern, const char *s, size_t n, tt_scratch *sc, int *bounds, int *npieces) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, ascii_init);
    if (sc->cap < n + 1) {
        size_t cap = n + 1 > 2 * sc->cap ? n + 1 : 2 * sc->cap;
        uint32_t *cp = realloc(sc->cp, cap * sizeof *cp);
        if (cp) sc->cp = cp;
        uint8_t *cl = realloc(sc->cl, cap);
        if (cl) sc->cl = cl;
        int *off = realloc(sc->off, (cap + 1) * sizeof *off);
        if (off) sc->off = off;
        if (!cp || !cl || !off) return err_set(GE_NOMEM, "tokenizer: out of memory splitting %zu bytes", n);
        sc->cap = cap;
    }
    const unsigned char *p = (const unsigned char *)s;
    int m = 0;
    for (size_t i = 0; i < n; m++) {
        sc->off[m] = (int)i;
        if (p[i] < 0x80) {
            sc->cp[m] = p[i];
            sc->cl[m] = ascii_cl[p[i]];
            i++;
            continue;
        }
        uint32_t c;
        int k = tt_utf8_decode(p + i, n - i, &c);
        if (!k) {
            c = 0xFFFD;
            k = 1;
        } /* callers pass valid UTF-8 */
        sc->cp[m] = c;
        sc->cl[m] = (uint8_t)uc_class(c);
        i += (size_t)k;
    }
    sc->off[m] = (int)n;
    int maxdig = pattern == TT_PAT_LLAMA3 ? 3 : 1;
    int np = 0, gap = -1;
    for (int i = 0; i < m;) {
        int len = tt_match(sc->cp, sc->cl, i, m, maxdig);
        if (!len) {
            if (gap < 0) gap = i;
            i++;
            continue;
        }
        if (gap >= 0) {
            bounds[np++] = sc->off[gap];
            gap = -1;
        }
        bounds[np++] = sc->off[i];
        i += len;
    }
    if (gap >= 0) bounds[np++] = sc->off[gap];
    bounds[np] = (int)n;
    *npieces = np;
    return 0;
}

void tt_scratch_free(tt_scratch *sc) {
    free(sc->cp);
    free(sc->cl);
    free(sc->off);
    memset(sc, 0, sizeof *sc);
}

void tt_put(tt_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 1024;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
