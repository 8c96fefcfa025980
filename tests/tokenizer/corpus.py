"""corpus.py — the tokenizer test corpus: fixed hard cases, GSM8K questions, source code, and
seeded random Unicode strings. Shared by test_parity.py and tests/bench/tokenizer_bench.py.

corpus(specials) -> list of str (deterministic). random_strings(n, seed, specials) -> list of str.
sweep() -> strings that together hold every Unicode scalar value, each beside letters, digits,
spaces and marks (catches any class-table or NFC difference)."""
import json
import os
import random
import unicodedata

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SHARED = os.path.abspath(os.path.join(ROOT, "..", "shared", "data"))

FIXED = [
    "", " ", "  ", "\n", "\r\n", "\t", "a", "Hello world", "Hello, world!  How's it going?",
    # contractions in every case, and near misses
    "it's IT'S It'S we'll WE'LL We'Ll they're THEY'RE I've I'VE I'm I'M he'd HE'D don't DON'T",
    "'s 'S 't 'T 're 'RE 'rE 've 'VE 'm 'M 'll 'LL 'lL 'd 'D 'x 'Sx 'llama '' ' s",
    "dogs' toys' 'quoted' x'sy 1's 2'LL", "\u017f'\u017f '\u017fx '\u017f", "'\u212a '\u0130x",
    # digits
    "1234567890" * 5, "3.14159265358979 1e10 0x1F 1,000,000 12:30 -42 +7", "\u0661\u0662\u0663 \u0967\u0968 \uff11\uff12\uff13 \u2460\u2461 \u00bd\u00b2",
    # whitespace runs
    "a  b   c    d\t\te\n\nf\r\n\r\ng \n \n h", " " * 40, "\t" * 9 + "x", "\n" * 12, "x" + " " * 17 + "\n" * 3 + " " * 5 + "y",
    "  \u00a0\u3000 x\u2028y\u2029z\u0085w\u000b\u000c", "end with spaces   ", "   start",
    "\x1c\x1d\x1e\x1f field sep", "tab\tafter\t\tword",
    # code
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    "int main(void) { printf(\"%d\\n\", a[i++]); return 0; } // c\n/* block */",
    "for (let i = 0; i < n; i++) {\n  arr.push(i => i * 2);\n}\n$x = @{ key: 'v' };",
    "    if x != y && z >= 10 || !w:\n        pass\n",
    # CJK, Hangul, Japanese
    "你好，世界！这是一个测试。", "日本語のテキストとカタカナ、ひらがな。", "한국어 텍스트 안녕하세요",
    "\u1100\u1161\u11a8 \u1112\u1161\u11ab\u1100\u1173\u11af",  # conjoining jamo (NFC composes)
    # emoji, ZWJ sequences, skin tones, flags, keycaps
    "👍 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 👩🏾‍💻 🇫🇷🇯🇵 1️⃣ ❤️‍🔥 🧑🏻‍🤝‍🧑🏿", "🙂🙃😀😃😄😁😆",
    # combining marks, NFC
    "e\u0301 a\u0300 o\u0308 n\u0303 \u1e9b\u0323 q\u0307\u0323 A\u030a \u212b \u2126 \u00c5",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA",
    "\u0958 \u09dc \u0344 \u0f73 \u2adc \ufb2c", "cafe\u0301 caf\u00e9 na\u00efve r\u00e9sum\u00e9",
    # right-to-left
    "مرحبا بالعالم! هذا اختبار ١٢٣", "שלום עולם, זה מבחן 123", "\u200fRTL mark\u200e LTR \u202bembed\u202c",
    # other scripts
    "Привет, мир! Ёжик", "Γειά σου Κόσμε ΣΊΣΥΦΟΣ", "नमस्ते दुनिया", "สวัสดีชาวโลก", "ሰላም ዓለም",
    "\u0000 nul \u007f del \u0080\u009f", "\ufeffBOM \ufffd replacement \U0010ffff \U000e0001",
    "𝕳𝖊𝖑𝖑𝖔 𝟙𝟚𝟛 𐍈", "ﬁ ﬂ ﬀ ǅ ß ẞ", "\ud7a3\uac00",
]

SPECIAL_TEXT = [
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<|endoftext|><|endoftext|>", "a <|im_end|> b<|im_end|>c  <|im_end|>  ",
    "<|im_start<|im_end|>|>", "<think>\nreason\n</think>\n\nanswer", "<tool_call>{}</tool_call>",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|reserved_special_token_5|><|reserved_special_token_250|><|reserved_special_token_251|>",
    "<|fim_prefix|>x<|fim_suffix|>y<|fim_middle|>", "< |im_end| > <|IM_END|> <|im_end",
]


def gsm8k(n=300):
    out = []
    with open(os.path.join(SHARED, "gsm8k", "test.jsonl")) as f:
        for i, line in enumerate(f):
            if i >= n:
                break
            d = json.loads(line)
            out.append(d["question"])
            if i < n // 3:
                out.append(d["answer"])
    return out


def source_code():
    out = []
    for rel in ["tools/gen_unicode.py", "engine/text/tok_text.c", "tests/tokenizer/corpus.py"]:
        p = os.path.join(ROOT, rel)
        if os.path.exists(p):
            lines = open(p, encoding="utf-8").read().split("\n")
            out += ["\n".join(lines[i:i + 25]) for i in range(0, len(lines), 25)]
    return out


def _pools():
    marks = [c for c in range(0x300, 0x370)] + [0x0483, 0x0591, 0x05B0, 0x064B, 0x0670, 0x093C, 0x094D,
                                                0x0E31, 0x0E48, 0x1AB0, 0x1DC0, 0x20D0, 0x302A, 0xFE20, 0x1D165]
    return {
        "ascii": "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "digit": "0123456789" + "\u0660\u0661\u0966\uff10\u00b2\u00bd\u2160\U00010d40",
        "punct": "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~\u2019\u201c\u00bf\u00a1\u3002\uff01\u2014\u2026",
        "space": " \t\n\r\u000b\u000c\u0085\u00a0\u1680\u2000\u2007\u200a\u2028\u2029\u202f\u205f\u3000\x1c\x1f\u200b",
        "mark": "".join(map(chr, marks)),
        "cjk": "你好世界中文測試日本語カタカナひらがな한국어\u1100\u1161\u11a8\uac00",
        "emoji": "👍🏽👨\u200d👩\u200d👧🏳️\u200d🌈🇫🇷❤️\u200d🔥🙂🏻🏿\ufe0f\u20e3",
        "rtl": "مرحبا١٢٣שלום\u200f\u200e\u064b",
        "latin": "éèêëàáâäçñöüßæøåœÿĳǅﬁ\u017f\u212a\u212b\u2126",
        "apos": "'",
    }


def random_strings(n, seed, specials=()):
    rng = random.Random(seed)
    pools = _pools()
    names = list(pools)
    out = []
    contractions = ["'s", "'S", "'t", "'re", "'RE", "'Ve", "'m", "'ll", "'LL", "'d", "'D", "'\u017f"]
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 24)):
            r = rng.random()
            if r < 0.05 and specials:
                parts.append(rng.choice(specials))
            elif r < 0.12:
                parts.append(rng.choice(contractions))
            elif r < 0.22:                                   # any scalar value, assigned or not
                c = rng.randrange(0x110000)
                parts.append(chr(c if not 0xD800 <= c < 0xE000 else c + 0x800))
            elif r < 0.26:
                parts.append(rng.choice(" \t\n") * rng.randint(2, 40))
            elif r < 0.28:
                parts.append(rng.choice(pools["ascii"]) * rng.randint(20, 120))
            else:
                pool = pools[rng.choice(names)]
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 8))))
        out.append("".join(parts))
    return out


def sweep(step=96):
    seps = ["a", " ", "1", "'", "\u0301", "x ", "\n"]
    out = []
    for k, lo in enumerate(range(0, 0x110000, step)):
        if 0xD800 <= lo < 0xE000:
            continue
        sep = seps[k % len(seps)]
        out.append("".join(chr(c) + sep for c in range(lo, min(lo + step, 0x110000)) if not 0xD800 <= c < 0xE000))
    return out


def corpus(specials=()):
    return FIXED + SPECIAL_TEXT + gsm8k() + source_code() + random_strings(600, 7, specials)
