#!/usr/bin/env python3
"""tokenizer_bench.py — single-threaded encode speed (MB/s of UTF-8 input) of grpod's tokenizer
beside Hugging Face `tokenizers` on the same strings, for the Qwen3 and Llama 3 files.

    python3 tests/bench/tokenizer_bench.py [--repeats N]      (make bench runs it)

grpod: `tokenize --jsonl --bench N` encodes every line N times in one process and reports its own
time (load and I/O excluded). HF: encode_batch (and encode_batch_fast, no offsets; the
faster counts) over the same list N times with RAYON_NUM_THREADS=1 (one thread), timed around the
call; its per-call Python overhead is included but small next to a batch. Both keep their word caches warm across repeats, as a server would.
Corpora: gsm8k = all 1,319 GSM8K test questions and answers (English with numbers); mixed = the
parity-test corpus (code, CJK, emoji, marks, RTL, whitespace runs) plus 2,000 random strings."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "tokenizer"))
import corpus as C  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

SOURCES = ["tests/tokenizer/tok_driver.c", "engine/text/tok_text.c", "engine/text/tok_encode.c", "engine/text/tokenizer.c",
           "daemon/tokenizer_cli.c", "engine/text/unicode_data.c", "engine/format/json.c", "common/err.c", "common/clock.c", "engine/text/chat.c"]


def grpod_cmd(tmp):
    g = os.path.join(ROOT, "grpod")
    if os.path.exists(g):
        p = subprocess.run([g, "tokenize", "--help"], capture_output=True)
        if p.returncode == 0 and b"--bench" in p.stdout:
            return [g]
    exe = os.path.join(tmp, "tok_driver")
    subprocess.run(["cc", "-O2", "-std=gnu11", "-pthread", "-I.", "-o", exe] + SOURCES, cwd=ROOT, check=True)
    return [exe]


def gsm8k_all():
    out = []
    with open(os.path.join(C.SHARED, "gsm8k", "test.jsonl")) as f:
        for line in f:
            d = json.loads(line)
            out += [d["question"], d["answer"]]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cmd = grpod_cmd(tmp)
        for model in ["qwen3", "llama3"]:
            d = os.path.join(C.SHARED, "tokenizers", model)
            t = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
            sp = [x.content for x in t.get_added_tokens_decoder().values()][:40]
            for name, texts in [("gsm8k", gsm8k_all()), ("mixed", C.corpus(sp) + C.random_strings(2000, 42, sp))]:
                nbytes = sum(len(x.encode()) for x in texts)
                inp = "".join(json.dumps(x) + "\n" for x in texts).encode()
                p = subprocess.run(cmd + ["tokenize", "--model", d, "--jsonl", "--bench", str(a.repeats)],
                                   input=inp, capture_output=True, check=True)
                g = json.loads(p.stdout)
                hf = 0.0
                for fn in [t.encode_batch, getattr(t, "encode_batch_fast", None)]:   # the faster one counts
                    if fn is None:
                        continue
                    fn(texts)                              # warm, as grpod's first repeat is
                    t0 = time.perf_counter()
                    for _ in range(a.repeats):
                        fn(texts)
                    hf = max(hf, nbytes * a.repeats / (time.perf_counter() - t0) / 1e6)
                rows.append((model, name, nbytes, g["mb_per_s"], hf))
    print(f"{'model':8} {'corpus':6} {'MB':>6} {'grpod MB/s':>11} {'HF MB/s':>8} {'ratio':>6}")
    for model, name, nbytes, g, hf in rows:
        print(f"{model:8} {name:6} {nbytes / 1e6:6.2f} {g:11.2f} {hf:8.2f} {g / hf:6.2f}")


if __name__ == "__main__":
    main()
