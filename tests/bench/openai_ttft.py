#!/usr/bin/env python3
"""openai_ttft.py — time to first token of streamed /v1/completions, alone and under load: LOAD
clients each stream one long completion after another (max_tokens LOAD_TOKENS, ignore_eos) while
a probe streams PROBES short ones in turn (max_tokens TOKENS). For each stream: the time to its
first chunk with text, to its end, and its chunk count. Prints the probes' p50 / p90 alone (no
load) and under load, and the load's tokens/s and its own streams' first chunk and end.

  python3 tests/bench/openai_ttft.py --url http://127.0.0.1:8780 [--load 4] [--probes 10]

A measurement, not a test: it asserts nothing on time (docs/benchmarks.md, "Twentieth session")."""
import argparse
import json
import statistics
import threading
import time

import requests


def stream(url, body, key=None):
    """(seconds to the first text chunk, seconds to the end, text chunks, tokens)."""
    t0 = time.monotonic()
    first, chunks, tokens = None, 0, 0
    hdr = {"Authorization": "Bearer " + key} if key else {}
    with requests.post(url + "/v1/completions", json=dict(body, stream=True, logprobs=0), headers=hdr,
                       stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            for c in json.loads(line[6:])["choices"]:
                if c["text"]:
                    first = time.monotonic() - t0 if first is None else first
                    chunks += 1
                tokens += len((c.get("logprobs") or {}).get("tokens") or [])
    return first, time.monotonic() - t0, chunks, tokens


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def probe_round(a, label, seed0):
    rows = [stream(a.url, {"prompt": "Once upon a time %d" % i, "max_tokens": a.tokens, "ignore_eos": True,
                           "seed": seed0 + i}, a.key) for i in range(a.probes)]
    ttft, total = [r[0] for r in rows], [r[1] for r in rows]
    print("%-12s ttft p50 %7.1f ms  p90 %7.1f ms | whole p50 %7.1f ms | chunks p50 %d of %d tokens"
          % (label, 1e3 * statistics.median(ttft), 1e3 * pct(ttft, 0.9), 1e3 * statistics.median(total),
             statistics.median(r[2] for r in rows), a.tokens), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--key", default=None)
    ap.add_argument("--load", type=int, default=4, help="clients streaming long completions meanwhile")
    ap.add_argument("--load-tokens", type=int, default=256)
    ap.add_argument("--probes", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=32)
    a = ap.parse_args()
    probe_round(a, "alone", 100)
    stop, done = threading.Event(), []

    def load(i):
        k = 0
        while not stop.is_set():
            done.append(stream(a.url, {"prompt": "In a land far away %d %d" % (i, k), "max_tokens": a.load_tokens,
                                       "ignore_eos": True, "seed": 1000 * i + k}, a.key))
            k += 1
    ts = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(a.load)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    time.sleep(1.0)                 # the load's requests are in the scheduler
    probe_round(a, "load %d" % a.load, 200)
    stop.set()
    for t in ts:
        t.join(600)
    el = time.monotonic() - t0
    tok = sum(r[3] for r in done)
    print("load: %d completions, %d tokens in %.1f s (%.0f tok/s, the probes' not counted); each: ttft p50 %.1f ms, "
          "whole p50 %.1f ms, chunks p50 %d" % (len(done), tok, el, tok / el, 1e3 * statistics.median(r[0] for r in done),
                                                1e3 * statistics.median(r[1] for r in done),
                                                statistics.median(r[2] for r in done)))


if __name__ == "__main__":
    main()
