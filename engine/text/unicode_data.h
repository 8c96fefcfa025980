/* unicode_data.h — Unicode tables the tokenizer needs (character classes for the pre-tokenizer
 * regexes, NFC), generated into engine/text/unicode_data.c by tools/gen_unicode.py from the Unicode
 * Character Database: classes at Unicode 16.0, NFC at 9.0, the versions Hugging Face tokenizers
 * 0.23 uses. Lookups are binary searches over sorted ranges, with an ASCII fast path in the
 * callers. */
#ifndef GRPOD_UNICODE_DATA_H
#define GRPOD_UNICODE_DATA_H
#include <stdint.h>

enum { UC_OTHER = 0, UC_L = 1, UC_N = 2, UC_WS = 3 };   /* \p{L}, \p{N}, \s */

extern const char uc_unicode_version[];      /* of the class tables */
extern const char uc_nfc_unicode_version[];  /* of the NFC tables (HF uses 9.0) */
extern const uint32_t uc_class_ranges[][3];    /* lo, hi, class */
extern const int uc_class_ranges_n;
extern const uint32_t uc_ccc_ranges[][3];      /* lo, hi, canonical combining class */
extern const int uc_ccc_ranges_n;
extern const uint32_t uc_decomp[][3];          /* cp, offset into pool, length */
extern const int uc_decomp_n;
extern const uint32_t uc_decomp_pool[];
extern const uint32_t uc_comp[][3];            /* first, second, composite; sorted */
extern const int uc_comp_n;
extern const uint32_t uc_nfc_busy_ranges[][2]; /* code points NFC may touch */
extern const int uc_nfc_busy_ranges_n;
extern const uint32_t uc_fold_s;               /* U+017F: folds to 's' */

/* Value of the range containing cp in a [lo, hi, v] table, or 0. */
static inline uint32_t uc_range_lookup(const uint32_t (*t)[3], int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) >> 1;
        if (cp < t[mid][0]) hi = mid - 1;
        else if (cp > t[mid][1]) lo = mid + 1;
        else return t[mid][2];
    }
    return 0;
}
static inline int uc_class(uint32_t cp) { return (int)uc_range_lookup(uc_class_ranges, uc_class_ranges_n, cp); }
static inline int uc_ccc(uint32_t cp) { return (int)uc_range_lookup(uc_ccc_ranges, uc_ccc_ranges_n, cp); }
#endif
