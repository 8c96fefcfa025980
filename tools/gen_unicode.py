#!/usr/bin/env python3
"""gen_unicode.py — writes engine/text/unicode_data.c, the Unicode tables of the tokenizer.

    pip install unicodedata2==16.0.0 && python3 tools/gen_unicode.py > engine/text/unicode_data.c

Source: the Unicode Character Database as packaged by `unicodedata2` (the same data as Python's
unicodedata module, at a chosen version). The version is 16.0 because Hugging Face `tokenizers`
0.23 (the parity reference) behaves as Unicode 16.0: its Oniguruma regexes treat Garay digits
(U+10D40, new in 16.0) as \p{N} and Unicode 17.0 letters (U+16EA0) as unassigned. Another version
gives different ids for the characters assigned in between, so the script refuses to run on one.

Tables (all sorted, searched by binary search; ranges keep the output compact):
  uc_class_ranges   [lo, hi, class]: class 1 = \\p{L} (Lu Ll Lt Lm Lo), 2 = \\p{N} (Nd Nl No),
                    3 = \\s (the White_Space property). Code points not listed are class 0.
  uc_ccc_ranges     [lo, hi, ccc]: canonical combining class, where not 0 (NFC version).
  uc_decomp         [cp, offset, len] into uc_decomp_pool: full canonical decomposition (recursive,
                    Hangul excluded: it is algorithmic).
  uc_comp           [first, second, composite]: primary composites (canonical pairs whose composite
                    is NFC-stable, i.e. not a composition exclusion), sorted by (first, second).
  uc_nfc_busy_ranges [lo, hi]: code points NFC may change or combine with (ccc != 0, decomposable,
                    second element of a composition, Hangul L/V/T jamo and syllables). A string
                    without any of them is already NFC.
  uc_fold_s         extra code points that fold case-insensitively to an ASCII letter of the
                    contraction alternatives ('s 't 're 've 'm 'll 'd): U+017F folds to 's'.
"""
import sys

try:
    import unicodedata2 as ud
except ImportError:
    sys.exit("gen_unicode.py: needs `pip install unicodedata2==16.0.0`")
if ud.unidata_version != "16.0.0":
    sys.exit(f"gen_unicode.py: unicodedata2 has Unicode {ud.unidata_version}, need 16.0.0")

MAXCP = 0x110000
NFC_AGE = (9, 0)


def icu_age_fn():
    import ctypes
    import glob
    for path in sorted(glob.glob("/usr/lib/*/libicuuc.so.*")) + ["libicuuc.so"]:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ["u_charAge"] + [f"u_charAge_{v}" for v in range(60, 90)]:
            f = getattr(lib, name, None)
            if f is None:
                continue
            f.argtypes = [ctypes.c_int32, ctypes.c_char_p]
            buf = ctypes.create_string_buffer(4)

            def age(c, f=f, buf=buf):
                f(c, buf)
                return tuple(buf.raw[:2])
            return age
    sys.exit("gen_unicode.py: needs ICU (libicuuc, Debian libicu72) for the Age property")


_age = icu_age_fn()
assert _age(0x1E94A) == (9, 0) and _age(0x11A99) == (10, 0) and _age(0x41) == (1, 1)


def in_nfc_version(c):
    a = _age(c)
    return a != (0, 0) and a <= NFC_AGE
# PropList.txt White_Space (unchanged since Unicode 6.3). Cross-checked below against isspace().
WHITE_SPACE = [(0x09, 0x0D), (0x20, 0x20), (0x85, 0x85), (0xA0, 0xA0), (0x1680, 0x1680),
               (0x2000, 0x200A), (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F),
               (0x3000, 0x3000)]
ws = set()
for lo, hi in WHITE_SPACE:
    ws.update(range(lo, hi + 1))
# str.isspace() = White_Space plus U+001C..U+001F (bidi class B/S); check the list with it.
assert ws == {c for c in range(MAXCP) if chr(c).isspace()} - set(range(0x1C, 0x20))


def ranges(values):
    """values: list indexed by code point -> [(lo, hi, v)] for v != 0, merging runs."""
    out, cur = [], None
    for c, v in enumerate(values):
        if cur and cur[2] == v and cur[1] == c - 1:
            cur[1] = c
        else:
            if cur and cur[2]:
                out.append(tuple(cur))
            cur = [c, c, v]
    if cur and cur[2]:
        out.append(tuple(cur))
    return out


cls = [0] * MAXCP
ccc = [0] * MAXCP
for c in range(MAXCP):
    if 0xD800 <= c <= 0xDFFF:
        continue
    ch = chr(c)
    cat = ud.category(ch)
    if c in ws:
        cls[c] = 3
    elif cat[0] == "L":
        cls[c] = 1
    elif cat[0] == "N":
        cls[c] = 2
    if in_nfc_version(c):
        ccc[c] = ud.combining(ch)

SBASE, SCOUNT = 0xAC00, 11172


def canon_pair(c):
    d = ud.decomposition(chr(c))
    if not d or d.startswith("<"):
        return None
    return [int(x, 16) for x in d.split()]


def full_decomp(c):
    d = canon_pair(c)
    if d is None:
        return [c]
    out = []
    for x in d:
        out.extend(full_decomp(x))
    return out


decomp, comp = {}, []
for c in range(MAXCP):
    if 0xD800 <= c <= 0xDFFF or SBASE <= c < SBASE + SCOUNT or not in_nfc_version(c):
        continue
    d = canon_pair(c)
    if d is None:
        continue
    decomp[c] = full_decomp(c)
    assert ud.normalize("NFD", chr(c)) == "".join(map(chr, decomp[c]))
    if len(d) == 2 and ud.normalize("NFC", chr(c)) == chr(c):
        comp.append((d[0], d[1], c))
comp.sort()

busy = [0] * MAXCP
for c in range(MAXCP):
    if ccc[c] or c in decomp:
        busy[c] = 1
for a, b, _ in comp:
    busy[b] = 1
for lo, hi in [(0x1100, 0x1112), (0x1161, 0x1175), (0x11A8, 0x11C2), (SBASE, SBASE + SCOUNT - 1)]:
    for c in range(lo, hi + 1):
        busy[c] = 1

# Case folding onto the contraction letters: only U+017F LATIN SMALL LETTER LONG S (-> 's').
fold = sorted(c for c in range(MAXCP) if not 0xD800 <= c <= 0xDFFF and c >= 0x80
              and len(chr(c).casefold()) == 1 and chr(c).casefold() in "strevmld")
assert fold == [0x17F], fold

w = sys.stdout.write
w("/* unicode_data.c — GENERATED by tools/gen_unicode.py from the Unicode Character Database "
  f"{ud.unidata_version}\n * (unicodedata2; NFC tables restricted to Unicode {NFC_AGE[0]}.{NFC_AGE[1]} by ICU's Age). "
  "Do not edit: change the\n * generator and rerun it. */\n")
w('#include "engine/text/unicode_data.h"\n\n')
w(f'const char uc_unicode_version[] = "{ud.unidata_version}";\n')
w(f'const char uc_nfc_unicode_version[] = "{NFC_AGE[0]}.{NFC_AGE[1]}.0";\n\n')


def table(name, ctype, rows, per_line):
    w(f"const {ctype} {name}[][{len(rows[0])}] = {{\n")
    for i in range(0, len(rows), per_line):
        w("    " + " ".join("{" + ",".join(hex(x) if x > 9 else str(x) for x in r) + "},"
                          for r in rows[i:i + per_line]) + "\n")
    w("};\n")
    w(f"const int {name}_n = {len(rows)};\n\n")


table("uc_class_ranges", "uint32_t", ranges(cls), 5)
table("uc_ccc_ranges", "uint32_t", ranges(ccc), 5)
pool, drows = [], []
for c in sorted(decomp):
    drows.append((c, len(pool), len(decomp[c])))
    pool.extend(decomp[c])
table("uc_decomp", "uint32_t", drows, 5)
w(f"const uint32_t uc_decomp_pool[{len(pool)}] = {{\n")
for i in range(0, len(pool), 10):
    w("    " + " ".join(hex(x) + "," for x in pool[i:i + 10]) + "\n")
w("};\n\n")
table("uc_comp", "uint32_t", comp, 4)
table("uc_nfc_busy_ranges", "uint32_t", [(lo, hi) for lo, hi, _ in ranges(busy)], 6)
w(f"const uint32_t uc_fold_s = {hex(fold[0])};\n")
