# test_openai_stream.py — stream: true token by token (api/openai_stream.c): chunks are written as
# the scheduler samples the tokens, never all at the end. Measured by order, not by the clock:
# build/grpod-test-hooks holds the worker (GRPOD_TEST_HOLD_AT=stream_tokens) once a streamed
# response has 4 tokens, and text must reach the client while the job still runs. Also: what the
# chunks add up to is the non-streaming reply (text, logprobs, finish_reason, usage) for n > 1,
# stop strings and chat; with --ranks 2 a group on rank 1 streams while rank 1 is held mid-way
# (GRPOD_TEST_HOLD_AT=peer_stream_tokens); a client that goes away mid-stream leaves the daemon
# serving.
import json
import os
import socket

import openai
import pytest
import requests

from conftest import ROOT

HOOKS = os.path.join(ROOT, "build", "grpod-test-hooks")


def client_of(d):
    return openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def sse_events(resp):
    """The data of each server-sent event, [DONE] included, in order."""
    for line in resp.iter_lines():
        if line.startswith(b"data: "):
            yield line[6:].decode("utf-8")


def rollout_jobs(d):
    return d.get("/v1/jobs?kind=rollout").json()["jobs"]


@pytest.mark.skipif(not os.path.exists(HOOKS), reason="build/grpod-test-hooks is not built")
def test_first_chunk_arrives_while_the_job_runs(make_daemon, tmp_path):
    go = tmp_path / "go"
    d = make_daemon(start=False, env={"GRPOD_TEST_HOLD_AT": "stream_tokens", "GRPOD_TEST_HOLD_FILE": str(go)})
    d.binary = HOOKS
    d.start()
    body = {"prompt": "Once upon a time", "max_tokens": 32, "ignore_eos": True, "seed": 11, "n": 2, "stream": True}
    r = requests.post(d.url + "/v1/completions", json=body, timeout=120, stream=True)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    assert "Content-Length" not in r.headers and r.headers.get("Transfer-Encoding") == "chunked"
    events = sse_events(r)
    before = []
    for e in events:                      # the worker is held: whatever arrives now came mid-generation
        ev = json.loads(e)
        before.append(ev)
        if any(c["text"] for c in ev["choices"]):
            break
    assert all(c["finish_reason"] is None for ev in before for c in ev["choices"])
    assert [j["status"] for j in rollout_jobs(d)] == ["running"]
    go.touch()
    after = [e for e in events]
    assert after[-1] == "[DONE]"
    after = [json.loads(e) for e in after[:-1]]
    texts = {0: "", 1: ""}
    for ev in before + after:
        for c in ev["choices"]:
            texts[c["index"]] += c["text"]
    assert sum(1 for ev in after for c in ev["choices"] if c["text"]) >= 1      # more text followed
    assert sorted(c["index"] for ev in after for c in ev["choices"] if c["finish_reason"]) == [0, 1]
    full = d.post("/v1/completions", dict(body, stream=False)).json()
    assert [texts[0], texts[1]] == [c["text"] for c in full["choices"]]
    assert [j["status"] for j in rollout_jobs(d)] == ["done", "done"]


@pytest.mark.skipif(not os.path.exists(HOOKS), reason="build/grpod-test-hooks is not built")
def test_stream_from_a_peer_rank(make_daemon, tmp_path):
    """--ranks 2: two prompts, one group on each rank; rank 1's thread is held
    (GRPOD_TEST_HOLD_AT=peer_stream_tokens) once its response has 4 tokens, and its text must
    reach the client meanwhile, while the job runs (a peer's part streams as rank 0's does)."""
    go = tmp_path / "go"
    d = make_daemon(start=False, args=["--ranks", "2"],
                    env={"GRPOD_TEST_HOLD_AT": "peer_stream_tokens", "GRPOD_TEST_HOLD_FILE": str(go)})
    d.binary = HOOKS
    d.start()
    body = {"prompt": ["Once upon a time", "In a land far"], "max_tokens": 32, "ignore_eos": True, "seed": 5,
            "stream": True, "logprobs": 2}
    r = requests.post(d.url + "/v1/completions", json=body, timeout=120, stream=True)
    events = sse_events(r)
    before = []
    for e in events:                      # rank 1 is held: its text now came mid-generation
        ev = json.loads(e)
        before.append(ev)
        if any(c["index"] == 1 and c["text"] for c in ev["choices"]):
            break
    assert all(c["finish_reason"] is None for ev in before for c in ev["choices"])
    assert [j["status"] for j in rollout_jobs(d)] == ["running"]
    ranks = {x["rank"]: x["running_groups"] for x in d.get("/v1/model").json()["ranks"]}
    assert ranks[1] == 1                  # the group is on rank 1, still running
    go.touch()
    after = [json.loads(e) for e in events if e != "[DONE]"]
    texts, tops = {0: "", 1: ""}, {0: [], 1: []}
    for ev in before + after:
        for c in ev["choices"]:
            texts[c["index"]] += c["text"]
            tops[c["index"]] += (c["logprobs"] or {}).get("top_logprobs") or []
    full = d.post("/v1/completions", dict(body, stream=False)).json()
    assert [texts[0], texts[1]] == [c["text"] for c in full["choices"]]
    assert [tops[0], tops[1]] == [c["logprobs"]["top_logprobs"] for c in full["choices"]]   # the peer's alternatives too


def test_n2_stream_adds_up_to_the_reply(shared_daemon):
    d = shared_daemon
    client = client_of(d)
    kw = dict(model="default-model", prompt=["Once upon", "A B C"], max_tokens=24, seed=3, n=2, logprobs=1,
              extra_body={"ignore_eos": True})
    full = client.completions.create(**kw)
    texts, lps, finish, order = {}, {}, {}, []
    usage = None
    for ev in client.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        if ev.usage:
            assert not ev.choices      # usage comes alone, after every choice finished
            usage = ev.usage
        for c in ev.choices:
            assert c.index not in finish            # nothing after a choice's finish_reason
            order.append(c.index)
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.logprobs:
                lps.setdefault(c.index, []).extend(c.logprobs.token_logprobs)
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert sorted(texts) == [0, 1, 2, 3]
    for c in full.choices:
        assert texts[c.index] == c.text and finish[c.index] == c.finish_reason == "length"
        assert lps[c.index] == c.logprobs.token_logprobs
    assert usage.completion_tokens == full.usage.completion_tokens == 4 * 24
    assert usage.prompt_tokens == full.usage.prompt_tokens
    # token by token: more chunks than choices, each choice's content in several of them
    assert len(order) > 2 * 4 and max(order.count(i) for i in range(4)) >= 3


def test_chat_stream_with_stop_strings(shared_daemon):
    client = client_of(shared_daemon)
    msgs = [{"role": "user", "content": "Say something"}]
    for stop in (["e"], ["ab", "\n"], None):
        kw = dict(model="default-model", messages=msgs, max_tokens=40, seed=21, stop=stop, temperature=1.0)
        full = client.chat.completions.create(**kw)
        role, parts, fin = None, [], None
        for ev in client.chat.completions.create(stream=True, **kw):
            for c in ev.choices:
                role = role or c.delta.role
                parts.append(c.delta.content or "")
                fin = c.finish_reason or fin
        assert role == "assistant"
        assert "".join(parts) == full.choices[0].message.content and fin == full.choices[0].finish_reason
        for s in stop or []:
            assert s not in "".join(parts)


def test_chat_stream_logprobs(shared_daemon):
    client = client_of(shared_daemon)
    kw = dict(model="default-model", messages=[{"role": "user", "content": "Hi"}], max_tokens=16, seed=4,
              logprobs=True)
    full = client.chat.completions.create(**kw)
    got = []
    for ev in client.chat.completions.create(stream=True, **kw):
        for c in ev.choices:
            if c.logprobs and c.logprobs.content:
                got.extend(t.logprob for t in c.logprobs.content)
    assert got == [t.logprob for t in full.choices[0].logprobs.content]


@pytest.mark.parametrize("route", ["chat", "completions"])
def test_stream_return_token_ids(shared_daemon, route):
    """vLLM's return_token_ids streamed: the prompt's ids in each choice's first chunk (a chat's on
    the chunk), the choice's ids concatenated over its chunks equal the non-streamed reply's."""
    d = shared_daemon
    body = {"max_tokens": 12, "n": 2, "seed": 9, "return_token_ids": True}
    if route == "chat":
        body["messages"] = [{"role": "user", "content": "Count"}]
    else:
        body["prompt"] = "Count:"
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    full = d.post(path, body).json()
    r = requests.post(d.url + path, json=dict(body, stream=True), stream=True, timeout=120)
    ids, prompt = {0: [], 1: []}, {}
    for ev in sse_events(r):
        if ev == "[DONE]":
            break
        o = json.loads(ev)
        for c in o["choices"]:
            p = o.get("prompt_token_ids") if route == "chat" else c.get("prompt_token_ids")
            if p is not None:
                prompt.setdefault(c["index"], p)
            ids[c["index"]] += c.get("token_ids") or []
    want_prompt = full["prompt_token_ids"] if route == "chat" else full["choices"][0]["prompt_token_ids"]
    assert prompt == {0: want_prompt, 1: want_prompt}
    assert [ids[0], ids[1]] == [c["token_ids"] for c in full["choices"]]


def test_disconnect_mid_stream_leaves_the_daemon_serving(shared_daemon):
    d = shared_daemon
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 2000, "ignore_eos": True, "n": 4,
                       "stream": True}).encode()
    for _ in range(4):      # read a little, then hang up without a word
        s = socket.create_connection(("127.0.0.1", d.port), timeout=60)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        got = b""
        while b"data: " not in got:
            chunk = s.recv(4096)
            assert chunk
            got += chunk
        assert b"200" in got.split(b"\r\n")[0]
        s.close()
    # the next write finds each client gone: its job is cancelled (2000 tokens would take seconds)
    jobs = rollout_jobs(d)[:4]
    assert [d.wait_job(j["id"])["status"] for j in jobs] == ["cancelled"] * 4
    assert d.get("/readyz").status_code == 200
    r = d.post("/v1/completions", {"prompt": "x", "max_tokens": 3, "seed": 1})
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    text = "".join(ev.choices[0].text for ev in client_of(d).completions.create(
        model="default-model", prompt="x", max_tokens=3, seed=1, stream=True) if ev.choices)
    assert text == r.json()["choices"][0]["text"]
