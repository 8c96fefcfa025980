"""test_parity.py — grpod's tokenizer against Hugging Face `tokenizers`, id for id.

For the Qwen3 and Llama 3 tokenizer.json files in ../shared/data/tokenizers, over the corpus of
corpus.py (fixed hard cases, GSM8K, source code, 600 mixed strings), 10,000 seeded random Unicode
strings and a sweep of every Unicode scalar value: encode must give exactly HF's ids (with and
without special-token parsing), decode must give exactly HF's text (with and without
skip_special_tokens, also for random id sequences that cut UTF-8 apart), and
decode(encode(x)) == normalizer(x). The default model's tokenizer files must load in HF and agree.

The C side runs in one process per batch: `./grpod tokenize --jsonl` when the daemon binary has
the subcommand, else tests/tokenizer/tok_driver.c (built here from the tokenizer sources)."""
import json
import os
import random
import subprocess

import pytest
from tokenizers import Tokenizer

import corpus as C

ROOT = C.ROOT
TOKDIR = os.path.join(C.SHARED, "tokenizers")
MODELS = ["qwen3", "llama3"]
SOURCES = ["tests/tokenizer/tok_driver.c", "engine/text/tok_text.c", "engine/text/tok_encode.c",
           "engine/text/tokenizer.c", "daemon/tokenizer_cli.c", "engine/text/unicode_data.c",
           "engine/format/json.c", "common/err.c", "common/clock.c", "engine/text/chat.c"]


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    exe = str(tmp_path_factory.mktemp("tok") / "tok_driver")
    subprocess.run(["cc", "-O2", "-std=gnu11", "-pthread", "-I.", "-o", exe] + SOURCES,
                   cwd=ROOT, check=True)
    return exe


@pytest.fixture(scope="module")
def cli(driver):
    """argv prefix for tokenize/detokenize: ./grpod if it has the subcommands, else the driver."""
    grpod = os.path.join(ROOT, "grpod")
    if os.path.exists(grpod):
        p = subprocess.run([grpod, "tokenize", "--help"], capture_output=True)
        if p.returncode == 0 and b"--jsonl" in p.stdout:
            return [grpod]
    return [driver]


def run_jsonl(argv, lines):
    inp = "".join(json.dumps(x) + "\n" for x in lines)
    p = subprocess.run(argv, input=inp.encode(), capture_output=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr.decode()
    out = p.stdout.decode().split("\n")[:-1]     # not splitlines(): U+2028 etc. stay inside strings
    assert len(out) == len(lines)
    return [json.loads(o) for o in out]


def hf(model):
    return Tokenizer.from_file(os.path.join(TOKDIR, model, "tokenizer.json"))


def specials_of(t):
    return [a.content for a in t.get_added_tokens_decoder().values()][:40]


def texts_for(t):
    sp = specials_of(t)
    return C.corpus(sp) + C.random_strings(10000, 1234, sp) + C.sweep()


def mismatches(texts, got, want):
    bad = [(texts[i], got[i], want[i]) for i in range(len(texts)) if got[i] != want[i]]
    return len(bad), bad[:3]


@pytest.mark.parametrize("model", MODELS)
def test_encode_matches_hf(cli, model):
    t = hf(model)
    texts = texts_for(t)
    want = [e.ids for e in t.encode_batch(texts)]
    got = run_jsonl(cli + ["tokenize", "--model", os.path.join(TOKDIR, model), "--jsonl"], texts)
    n, ex = mismatches(texts, got, want)
    assert n == 0, f"{n} of {len(texts)} strings differ, e.g. {ex}"


@pytest.mark.parametrize("model", MODELS)
def test_encode_special_as_text_matches_hf(cli, model):
    t = hf(model)
    t.encode_special_tokens = True
    sp = specials_of(t)
    texts = C.SPECIAL_TEXT + C.random_strings(2000, 99, sp)
    want = [e.ids for e in t.encode_batch(texts)]
    got = run_jsonl(cli + ["tokenize", "--model", os.path.join(TOKDIR, model), "--jsonl", "--no-special"], texts)
    n, ex = mismatches(texts, got, want)
    assert n == 0, f"{n} of {len(texts)} strings differ, e.g. {ex}"


@pytest.mark.parametrize("model", MODELS)
def test_decode_matches_hf(cli, model):
    t = hf(model)
    texts = C.corpus(specials_of(t)) + C.random_strings(2000, 5, specials_of(t))
    idss = [e.ids for e in t.encode_batch(texts)]
    rng = random.Random(3)
    V = t.get_vocab_size(with_added_tokens=True)
    for _ in range(1000):   # random ids: byte tokens split UTF-8; specials; out-of-range ids
        idss.append([rng.choice([rng.randrange(V), rng.randrange(300), V - rng.randrange(300), V + 5])
                     for _ in range(rng.randint(1, 12))])
    dm = os.path.join(TOKDIR, model)
    for skip in (False, True):
        want = t.decode_batch(idss, skip_special_tokens=skip)
        got = run_jsonl(cli + ["detokenize", "--model", dm, "--jsonl"] + (["--skip-special"] if skip else []), idss)
        n, ex = mismatches(idss, got, want)
        assert n == 0, f"skip_special={skip}: {n} of {len(idss)} differ, e.g. {ex}"
    # Round trip: exact for every string the normalizer leaves alone (all of them for Llama 3;
    # for Qwen3 the NFC ones: NFC runs on the pieces between added tokens, so a string that is
    # not NFC may come back neither as itself nor as its NFC).
    got = run_jsonl(cli + ["detokenize", "--model", dm, "--jsonl"], idss[:len(texts)])
    keep = [i for i, x in enumerate(texts) if not t.normalizer or t.normalizer.normalize_str(x) == x]
    bad = [texts[i] for i in keep if got[i] != texts[i]]
    assert len(keep) > len(texts) // 3 and not bad, f"decode(encode(x)) != x for {len(bad)}, e.g. {bad[:2]!r}"


def test_default_tokenizer_loads_in_hf_and_agrees(driver, tmp_path):
    subprocess.run([driver, "default-tokenizer", str(tmp_path)], check=True)
    t = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    cfg = json.load(open(tmp_path / "tokenizer_config.json"))
    assert cfg["eos_token"] == "<|im_end|>" and "<|im_start|>" in cfg["chat_template"]
    assert t.get_vocab_size(with_added_tokens=True) == 259
    assert t.token_to_id("<|im_end|>") == 258
    texts = C.corpus(["<|im_end|>", "<|im_start|>", "<|endoftext|>"]) + C.random_strings(500, 11)
    want = [e.ids for e in t.encode_batch(texts)]
    got = run_jsonl([driver, "tokenize", "--model", str(tmp_path), "--jsonl"], texts)
    n, ex = mismatches(texts, got, want)
    assert n == 0, f"{n} differ, e.g. {ex}"
    assert all(i < 256 or i in (256, 257, 258) for ids in got for i in ids)
    back = run_jsonl([driver, "detokenize", "--model", str(tmp_path), "--jsonl"], got)
    assert back == texts
