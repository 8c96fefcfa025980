# test_openai.py — the OpenAI-compatible routes against a real daemon: the official `openai`
# client (completions, chat, streaming, models), the request shapes lm-evaluation-harness's
# local-completions sends (loglikelihood: echo + logprobs with max_tokens 0 or 1;
# generate_until: stop strings), and the rule that completions' logprobs are /v1/logprobs's for
# the same tokens. The harness itself is not installed (it pulls torch); its requests are.
import json

import pytest
import requests


def lp_of(d, prompt_ids, token_ids):
    r = d.post("/v1/logprobs", {"groups": [{"prompt_ids": prompt_ids, "responses": [{"token_ids": token_ids}]}]})
    assert r.status_code == 200, r.text
    return r.json()["groups"][0]["responses"][0]["logprobs"]


def test_models(shared_daemon):
    r = shared_daemon.get("/v1/models").json()
    assert r["object"] == "list" and r["data"][0]["object"] == "model"
    assert r["data"][0]["id"] == "default-model" and r["data"][0]["policy_version"] >= 0


def test_loglikelihood_echo_equals_v1_logprobs(shared_daemon):
    d = shared_daemon
    ctx = d.post("/v1/tokenize", {"prompt": "Question: 2+2? Answer:"}).json()["tokens"]
    cont = d.post("/v1/tokenize", {"prompt": " 4", "add_special_tokens": False}).json()["tokens"]
    want = lp_of(d, ctx[:1], ctx[1:] + cont)
    for max_tokens in (0, 1):     # old harness: 0; lm-eval 0.4 local-completions: 1 and drops the last
        body = {"model": "default-model", "prompt": [ctx + cont], "temperature": 0, "max_tokens": max_tokens,
                "logprobs": 1, "seed": 1234, "echo": True}
        r = d.post("/v1/completions", body)
        assert r.status_code == 200, r.text
        ch = r.json()["choices"][0]
        lp = ch["logprobs"]
        n = len(ctx) + len(cont)
        assert len(lp["token_logprobs"]) == n + max_tokens
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert lp["token_logprobs"][1:n] == want      # the same numbers as POST /v1/logprobs
        # what the harness computes: the continuation's sum, and is_greedy from top_logprobs
        ctxlen = len(ctx)
        total = sum(lp["token_logprobs"][ctxlen:n])
        assert total == pytest.approx(sum(want[ctxlen - 1:]))
        assert all(max(t.values()) <= 0 for t in lp["top_logprobs"][ctxlen:n])
        assert ch["text"].startswith("Question: 2+2? Answer: 4")
        assert len(lp["text_offset"]) == len(lp["tokens"]) and lp["text_offset"][0] == 0


def test_generate_until_and_sampled_logprobs(shared_daemon):
    d = shared_daemon
    body = {"model": "default-model", "prompt": ["Once upon", "A B C"], "max_tokens": 24, "temperature": 0,
            "stop": ["\n\n", "e"], "seed": 1234}
    r = d.post("/v1/completions", body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "text_completion" and len(out["choices"]) == 2
    assert [c["index"] for c in out["choices"]] == [0, 1]
    for c in out["choices"]:
        assert "e" not in c["text"] and "\n\n" not in c["text"]
        assert c["finish_reason"] in ("stop", "length")
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + out["usage"]["completion_tokens"]
    assert isinstance(out["policy_version"], int)
    # the same request gives the same text (greedy, seeded)
    assert d.post("/v1/completions", body).json()["choices"] == out["choices"]
    # sampled tokens' logprobs (temperature 1) against /v1/logprobs of the same tokens
    r = d.post("/v1/completions", {"prompt": "hello", "max_tokens": 6, "logprobs": 0, "seed": 3, "n": 2,
                                   "ignore_eos": True})
    assert r.status_code == 200, r.text
    ids = d.post("/v1/tokenize", {"prompt": "hello"}).json()["tokens"]
    for c in r.json()["choices"]:
        toks = c["logprobs"]["token_ids"]
        assert len(toks) == 6 == len(c["logprobs"]["tokens"])
        assert c["logprobs"]["token_logprobs"] == pytest.approx(lp_of(d, ids, toks), abs=1e-4)


def test_errors_name_the_field(shared_daemon):
    d = shared_daemon
    cases = [({"prompt": "x", "max_tokens": -1}, "max_tokens"), ({"prompt": "x", "temperature": "hot"}, "temperature"),
             ({"prompt": "x", "n": 0}, "n"), ({"max_tokens": 3}, "prompt"), ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
             ({"prompt": "x", "frequency_penalty": 0.5}, "frequency_penalty"), ({"prompt": "x", "bogus": 1}, "bogus"),
             ({"prompt": [[1, "a"]]}, "prompt[0]"), ({"prompt": [1, 2, 99999]}, "prompt")]
    for body, field in cases:
        r = d.post("/v1/completions", body)
        assert r.status_code == 400, (body, r.text)
        assert r.json()["error"]["field"] == field, (body, r.text)
    r = d.post("/v1/chat/completions", {"messages": []})
    assert r.status_code == 400 and r.json()["error"]["field"] == "messages"


def test_openai_client(shared_daemon):
    openai = pytest.importorskip("openai")
    d = shared_daemon
    client = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    models = client.models.list()
    name = models.data[0].id
    c = client.completions.create(model=name, prompt="Hello", max_tokens=5, temperature=0.7, seed=7, logprobs=1)
    assert c.choices[0].finish_reason in ("stop", "length") and c.usage.completion_tokens <= 5
    assert len(c.choices[0].logprobs.token_logprobs) == c.usage.completion_tokens
    ch = client.chat.completions.create(model=name, messages=[{"role": "system", "content": "Be brief."},
                                                              {"role": "user", "content": "Hi"}],
                                        max_tokens=8, seed=1, n=2, logprobs=True)
    assert len(ch.choices) == 2 and ch.choices[0].message.role == "assistant"
    assert ch.choices[0].logprobs.content is not None
    # streaming gives the same text as the same request without it
    full = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                                          seed=5)
    parts, finish = [], None
    for ev in client.chat.completions.create(model=name, messages=[{"role": "user", "content": "Hi"}], max_tokens=8,
                                             seed=5, stream=True, stream_options={"include_usage": True}):
        for cc in ev.choices:
            parts.append(cc.delta.content or "")
            finish = cc.finish_reason or finish
    assert "".join(parts) == full.choices[0].message.content and finish == full.choices[0].finish_reason
    text = "".join(ev.choices[0].text for ev in client.completions.create(model=name, prompt="Hello", max_tokens=5,
                                                                          seed=7, stream=True) if ev.choices)
    assert text == client.completions.create(model=name, prompt="Hello", max_tokens=5, seed=7).choices[0].text


def test_sse_wire_format(shared_daemon):
    r = requests.post(shared_daemon.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2, "stream": True},
                      timeout=120, stream=True)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    events = [line[6:] for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert all(json.loads(e)["object"] == "text_completion" for e in events[:-1])
