# test_openai_top_logprobs.py — top_logprobs = k: each position's k most likely tokens, from a
# logprobs job over prompt + completion (daemon/jobs.c run_logprobs with top_logprobs; the kernel
# is kernels/logprob.h logprob_top). Each listed alternative's logprob must be what POST
# /v1/logprobs gives that token at that position: bit-equal in the same pass (the scored token's
# own logprob), within fp32 rounding when /v1/logprobs scores it in a batch of another shape
# (the CPU matmul's blocking follows the token count: ~1e-7 relative). The chosen
# token of a greedy answer must be the first alternative, and lm-eval's is_greedy (the max of a
# position's top_logprobs is the continuation's token) must match greedy decoding.
import json

import openai
import pytest


def client_of(d):
    return openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def native_top(d, seq, k):
    """/v1/logprobs of seq[1:] given seq[0], with each position's k most likely ids."""
    r = d.post("/v1/logprobs", {"groups": [{"prompt_ids": seq[:1], "responses": [{"token_ids": seq[1:]}]}],
                                "top_logprobs": k})
    assert r.status_code == 200, r.text
    return r.json()["groups"][0]["responses"][0]


def alternatives_lp(d, seq, t, alts):
    """/v1/logprobs of each alternative id at position t (after seq[:t]), one group, one response each."""
    r = d.post("/v1/logprobs", {"groups": [{"prompt_ids": seq[:1],
                                            "responses": [{"token_ids": seq[1:t] + [a]} for a in alts]}]})
    assert r.status_code == 200, r.text
    return [resp["logprobs"][-1] for resp in r.json()["groups"][0]["responses"]]


def text_of(d, i):
    return d.post("/detokenize", {"tokens": [i]}).json()["prompt"]


def test_native_top_logprobs_are_each_alternatives_logprob(shared_daemon):
    d = shared_daemon
    seq = d.post("/v1/tokenize", {"prompt": "Question: 2+2? Answer: 4"}).json()["tokens"]
    k = 5
    got = native_top(d, seq, k)
    assert len(got["top_ids"]) == len(got["top_logprobs"]) == len(seq) - 1
    for t in range(1, len(seq)):
        ids, lps = got["top_ids"][t - 1], got["top_logprobs"][t - 1]
        assert len(ids) == k and len(set(ids)) == k
        assert lps == sorted(lps, reverse=True)
        assert alternatives_lp(d, seq, t, ids) == pytest.approx(lps, rel=1e-5, abs=1e-6)
        # the actual token: listed when more likely than the k-th, with its own logprob
        lp_tok = got["logprobs"][t - 1]
        if lp_tok > lps[-1]:
            assert seq[t] in ids
        if seq[t] in ids:
            assert lps[ids.index(seq[t])] == lp_tok
    r = d.post("/v1/logprobs", {"groups": [{"prompt_ids": seq[:1], "responses": [{"token_ids": seq[1:]}]}],
                                "top_logprobs": 21})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"


def test_echo_top_logprobs_and_is_greedy(shared_daemon):
    d = shared_daemon
    client = client_of(d)
    ctx = d.post("/v1/tokenize", {"prompt": "Once upon a"}).json()["tokens"]
    # a continuation greedy decoding reproduces, and one it does not
    greedy = client.completions.create(model="default-model", prompt=[ctx], max_tokens=3, temperature=0, logprobs=1)
    g_ids = greedy.choices[0].logprobs.model_extra["token_ids"]
    # (texts key the top_logprobs, as lm-eval reads them: a printable letter, not the greedy one)
    a = d.post("/v1/tokenize", {"prompt": "A", "add_special_tokens": False}).json()["tokens"]
    b = d.post("/v1/tokenize", {"prompt": "B", "add_special_tokens": False}).json()["tokens"]
    other = (b if g_ids[:1] == a else a) + g_ids[1:]
    for cont, want_greedy in ((g_ids, True), (other, False)):
        seq = ctx + cont
        c = client.completions.create(model="default-model", prompt=[seq], max_tokens=0, echo=True, logprobs=5)
        lp = c.choices[0].logprobs
        native = native_top(d, seq, 5)
        assert lp.token_logprobs[1:] == native["logprobs"]
        for t in range(1, len(seq)):
            top = lp.top_logprobs[t]
            want = {}
            for i, v in zip(native["top_ids"][t - 1], native["top_logprobs"][t - 1]):
                want.setdefault(text_of(d, i), v)
            want.setdefault(lp.tokens[t], lp.token_logprobs[t])     # the chosen token, as OpenAI adds it
            assert top == want
        # lm-eval's is_greedy over the continuation
        is_greedy = all(max(lp.top_logprobs[t], key=lp.top_logprobs[t].get) == lp.tokens[t]
                        for t in range(len(ctx), len(seq)))
        assert is_greedy == want_greedy


def test_sampled_top_logprobs(shared_daemon):
    d = shared_daemon
    client = client_of(d)
    prompt = d.post("/v1/tokenize", {"prompt": "Hello"}).json()["tokens"]
    c = client.completions.create(model="default-model", prompt=[prompt], max_tokens=6, temperature=0, logprobs=3)
    lp = c.choices[0].logprobs
    gen = lp.model_extra["token_ids"]
    native = native_top(d, prompt + gen, 3)
    P = len(prompt)
    for t, tok in enumerate(gen):
        ids, lps = native["top_ids"][P - 1 + t], native["top_logprobs"][P - 1 + t]
        assert ids[0] == tok                                   # greedy: the chosen token is the most likely
        assert lp.token_logprobs[t] == pytest.approx(lps[0], abs=1e-4)   # sampler vs scoring pass: fp32 rounding
        assert alternatives_lp(d, prompt + gen, P + t, ids) == pytest.approx(lps, rel=1e-5, abs=1e-6)
        assert max(lp.top_logprobs[t], key=lp.top_logprobs[t].get) == lp.tokens[t]
    # chat: logprobs true, top_logprobs k — k entries, the greedy token first
    ch = client.chat.completions.create(model="default-model", messages=[{"role": "user", "content": "Hi"}],
                                        max_tokens=5, temperature=0, logprobs=True, top_logprobs=4)
    for e in ch.choices[0].logprobs.content:
        assert len(e.top_logprobs) == 4
        assert [a.logprob for a in e.top_logprobs] == sorted((a.logprob for a in e.top_logprobs), reverse=True)
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == pytest.approx(e.logprob, abs=1e-4)
    r = d.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_logprobs"


def test_streamed_top_logprobs_per_chunk(shared_daemon):
    """stream: true with logprobs k: each chunk carries its tokens' k alternatives, sampled beside
    them (sampling.top_logprobs: the decode step's hidden state through the logprob head), so
    every chunk has them as it arrives; they add up to the non-streamed reply's (a logprobs job
    after the rollout) and are each alternative's POST /v1/logprobs at the sampling temperature."""
    d = shared_daemon
    client = client_of(d)
    prompt = d.post("/v1/tokenize", {"prompt": "Once upon"}).json()["tokens"]
    body = dict(model="default-model", prompt=[prompt], max_tokens=16, temperature=0.8, seed=4, logprobs=3)
    full = client.completions.create(**body).choices[0].logprobs
    chunks = [c.choices[0].logprobs for c in client.completions.create(stream=True, **body) if c.choices and
              c.choices[0].logprobs]
    assert len(chunks) > 1                                     # several chunks, each with its own tokens' alternatives
    tops = [t for c in chunks for t in c.top_logprobs]
    assert all(len(c.top_logprobs) == len(c.tokens) for c in chunks)
    assert [t for c in chunks for t in c.tokens] == full.tokens
    assert tops == full.top_logprobs                           # bit-equal on the cpu backend
    gen = full.model_extra["token_ids"]
    r = d.post("/v1/logprobs", {"groups": [{"prompt_ids": prompt, "responses": [{"token_ids": gen}]}],
                                "top_logprobs": 3, "temperature": 0.8}).json()["groups"][0]["responses"][0]
    for t in range(len(gen)):
        want = {}
        for i, v in zip(r["top_ids"][t], r["top_logprobs"][t]):
            want.setdefault(text_of(d, i), v)
        want.setdefault(full.tokens[t], full.token_logprobs[t])
        assert tops[t] == pytest.approx(want, abs=1e-6)
    # chat: logprobs true, top_logprobs 4, streamed: each content entry with 4 alternatives
    msgs = [{"role": "user", "content": "Hi"}]
    ch = dict(model="default-model", messages=msgs, max_tokens=8, temperature=0.8, seed=2, logprobs=True, top_logprobs=4)
    want = [(e.token, [(a.token, a.logprob) for a in e.top_logprobs]) for e in
            client.chat.completions.create(**ch).choices[0].logprobs.content]
    got = [(e.token, [(a.token, a.logprob) for a in e.top_logprobs]) for c in client.chat.completions.create(stream=True, **ch)
           if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert got == want and all(len(a) == 4 for _, a in got)
