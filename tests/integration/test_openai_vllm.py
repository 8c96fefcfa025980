# test_openai_vllm.py — what a client written for vLLM meets, against a real daemon (CPU, the
# embedded tiny model, random prompts): vLLM's routes (/health, /version, /tokenize, /detokenize,
# /tokenizer_info, GET /v1/models/{id}) in vLLM's shapes, with the calls lm-evaluation-harness's
# remote tokenizer makes from base_url alone; an unknown model is 404; response ids are unique;
# errors carry OpenAI's type and param and name the request's own fields; max_completion_tokens,
# top_logprobs, text_offset; vLLM's extra fields (skip_special_tokens,
# include_stop_str_in_output, chat_template_kwargs, add_generation_prompt) honoured, and the ones
# grpod cannot honour accepted at their neutral value only.
import random

import pytest
import requests


def words(rng, n):
    return " ".join("".join(rng.choice("abcdefghij") for _ in range(rng.randint(1, 6))) for _ in range(n))


def test_health_version_models(shared_daemon):
    d = shared_daemon
    r = requests.get(d.url + "/health", timeout=10)
    assert r.status_code == 200 and r.content == b""
    assert requests.get(d.url + "/version", timeout=10).json()["version"]
    name = d.get("/v1/models").json()["data"][0]["id"]
    card = d.get("/v1/models/" + name)
    assert card.status_code == 200 and card.json()["id"] == name and card.json()["object"] == "model"
    r = d.get("/v1/models/not-" + name)
    assert r.status_code == 404
    err = r.json()["error"]
    assert err["param"] == "model" and err["type"] == "not_found_error" and "not-" + name in err["message"]


def test_remote_tokenizer_from_base_url(shared_daemon):
    """The calls lm-eval's local-completions makes for its tokenizer when given only base_url."""
    d = shared_daemon
    base = (d.url + "/v1/completions").replace("/v1/completions", "")
    info = requests.get(base + "/tokenizer_info", timeout=10).json()
    assert "eos_token" in info and info["tokenizer_class"] and info["chat_template"]
    assert isinstance(info["eos_token"], str)
    rng = random.Random(37)
    for _ in range(5):
        text = words(rng, rng.randint(1, 8))
        toks = requests.post(base + "/tokenize", json={"prompt": text, "add_special_tokens": False}, timeout=10).json()
        assert toks["tokens"] == d.post("/v1/tokenize", {"prompt": text, "add_special_tokens": False}).json()["tokens"]
        assert toks["count"] == len(toks["tokens"]) and toks["max_model_len"] > 0 and toks["token_strs"] is None
        back = requests.post(base + "/detokenize", json={"tokens": toks["tokens"]}, timeout=10).json()["prompt"]
        assert back == text
    eos = requests.post(base + "/tokenize", json={"prompt": info["eos_token"], "add_special_tokens": False},
                        timeout=10).json()["tokens"]
    assert len(eos) == 1 and eos[0] in d.get("/v1/model").json()["eos_token_ids"]
    r = requests.post(base + "/tokenize", json={"prompt": "ab", "return_token_strs": True}, timeout=10).json()
    assert "".join(r["token_strs"]) == "ab"


def test_tokenize_chat_as_chat_completions(shared_daemon):
    d = shared_daemon
    msgs = [{"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}]
    t = d.post("/tokenize", {"messages": msgs}).json()
    c = d.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1}).json()
    assert c["usage"]["prompt_tokens"] == t["count"]
    text = d.post("/detokenize", {"tokens": t["tokens"]}).json()["prompt"]
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>") and "Hi there" in text
    assert text.endswith("<|im_start|>assistant\n")
    no_gen = d.post("/tokenize", {"messages": msgs, "add_generation_prompt": False}).json()
    assert t["tokens"][:no_gen["count"]] == no_gen["tokens"] and no_gen["count"] < t["count"]
    cont = d.post("/tokenize", {"messages": msgs + [{"role": "assistant", "content": "Hel"}],
                                "add_generation_prompt": False, "continue_final_message": True}).json()
    assert d.post("/detokenize", {"tokens": cont["tokens"]}).json()["prompt"].endswith("<|im_start|>assistant\nHel")
    # a history with tool calls cannot be rendered by a template without a tool format: refused, not dropped
    r = d.post("/tokenize", {"messages": msgs + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]})
    assert r.status_code == 400 and "tool" in r.json()["error"]["message"]


def test_unknown_model_is_404(shared_daemon):
    d = shared_daemon
    for path, body in [("/v1/completions", {"prompt": "x", "max_tokens": 1}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}),
                       ("/tokenize", {"prompt": "x"}), ("/detokenize", {"tokens": [72]})]:
        r = d.post(path, dict(body, model="gpt-4o"))
        assert r.status_code == 404 and r.json()["error"]["param"] == "model", (path, r.text)
        name = d.get("/v1/models").json()["data"][0]["id"]
        assert d.post(path, dict(body, model=name)).status_code == 200, path


def test_ids_are_unique(shared_daemon):
    d = shared_daemon
    ids = set()
    for path, body, prefix in [("/v1/completions", {"prompt": "x", "max_tokens": 1}, "cmpl-"),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                                                         "max_tokens": 1}, "chatcmpl-")]:
        for _ in range(3):
            i = d.post(path, body).json()["id"]
            assert i.startswith(prefix) and len(i) > len(prefix) + 8
            ids.add(i)
    assert len(ids) == 6


def test_errors_are_openai_errors(shared_daemon):
    d = shared_daemon
    cases = [("/v1/completions", {"prompt": "x", "temperature": 500}, "temperature"),
             ("/v1/completions", {"prompt": "x", "max_tokens": 10 ** 9}, "max_tokens"),
             ("/v1/completions", {"prompt": [1, 2, 10 ** 6]}, "prompt"),
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_p": 2}, "top_p"),
             ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
              "messages[0].content"),
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
              "top_logprobs"),
             ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "repetition_penalty": 1.2},
              "repetition_penalty"),
             ("/v1/completions", {"prompt": "x", "prompt_logprobs": 1}, "prompt_logprobs"),
             ("/v1/completions", {"prompt": "x", "use_beam_search": True}, "use_beam_search")]
    for path, body, field in cases:
        r = d.post(path, body)
        assert r.status_code == 400, (body, r.text)
        e = r.json()["error"]
        assert e["param"] == field and e["field"] == field and e["type"] == "invalid_request_error", (body, e)
        assert "sampling." not in e["message"] and "groups[" not in e["message"], e
    # neutral values are accepted
    r = d.post("/v1/completions", {"prompt": "x", "max_tokens": 1, "repetition_penalty": 1, "presence_penalty": 0,
                                   "length_penalty": 1, "use_beam_search": False, "prompt_logprobs": None})
    assert r.status_code == 200, r.text


def test_openai_sdk_error_param(shared_daemon):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=shared_daemon.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="default-model", prompt="x", temperature=500)
    assert e.value.param == "temperature" and e.value.type == "invalid_request_error"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("nope")
    assert e.value.param == "model"


def test_max_completion_tokens_wins(shared_daemon):
    d = shared_daemon
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 7, "max_completion_tokens": 3,
            "ignore_eos": True, "seed": 1}
    assert d.post("/v1/chat/completions", body).json()["usage"]["completion_tokens"] == 3


def test_text_offset_counts_characters(shared_daemon):
    d = shared_daemon
    r = d.post("/v1/completions", {"prompt": "h\u00e9llo w\u00f6rld", "max_tokens": 0, "echo": True, "logprobs": 0})
    lp = r.json()["choices"][0]["logprobs"]
    assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(len(lp["tokens"]))]


def test_skip_special_tokens_and_stop_string(shared_daemon):
    d = shared_daemon
    rng = random.Random(7)
    for trial in range(3):
        prompt = words(rng, 3)
        base = {"prompt": prompt, "max_tokens": 12, "temperature": 1.5, "seed": trial, "logprobs": 0,
                "ignore_eos": True}
        for skip in (True, False):
            c = d.post("/v1/completions", dict(base, skip_special_tokens=skip)).json()["choices"][0]
            want = d.post("/detokenize", {"tokens": c["logprobs"]["token_ids"], "skip_special_tokens": skip}).json()
            assert c["text"] == want["prompt"]
        greedy = d.post("/v1/completions", {"prompt": prompt, "max_tokens": 16, "temperature": 0,
                                            "ignore_eos": True}).json()["choices"][0]["text"]
        stop = greedy[3:5]
        if len(stop) < 2 or "\ufffd" in greedy[:5]:
            continue
        at = greedy.index(stop)
        for include in (False, True):
            c = d.post("/v1/completions", {"prompt": prompt, "max_tokens": 16, "temperature": 0, "stop": [stop],
                                           "include_stop_str_in_output": include}).json()["choices"][0]
            assert c["finish_reason"] == "stop"
            assert c["text"] == greedy[:at + (len(stop) if include else 0)]


def test_chat_template_kwargs_ignored_by_a_template_without_them(shared_daemon):
    d = shared_daemon
    msgs = [{"role": "user", "content": "x"}]
    a = d.post("/tokenize", {"messages": msgs}).json()["tokens"]
    b = d.post("/tokenize", {"messages": msgs, "chat_template_kwargs": {"enable_thinking": False, "other": 1}}).json()
    assert b["tokens"] == a     # grpod's default ChatML template reads neither (Qwen3's: test_openai_tools.py)
    r = d.post("/tokenize", {"messages": msgs, "chat_template_kwargs": {"enable_thinking": "no"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs.enable_thinking"


def test_return_token_ids_continue_as_ids(shared_daemon):
    """vLLM's return_token_ids: chat gives prompt_token_ids once and token_ids per choice,
    completions both per choice; an agent's next turn is then those ids plus the tool's, sent as
    ids to /v1/rollouts (the prefix cache holds the chat turn's keys and values)."""
    d = shared_daemon
    msgs = [{"role": "user", "content": "Look up the letter"}]
    t = d.post("/tokenize", {"messages": msgs}).json()["tokens"]
    c = d.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 6, "n": 2, "seed": 3,
                                        "return_token_ids": True}).json()
    assert c["prompt_token_ids"] == t
    for ch in c["choices"]:
        assert len(ch["token_ids"]) == c["usage"]["completion_tokens"] // 2 or ch["finish_reason"] == "stop"
        assert d.post("/detokenize", {"tokens": ch["token_ids"]}).json()["prompt"].startswith(ch["message"]["content"] or "")
    p = d.post("/v1/completions", {"prompt": "abc", "max_tokens": 4, "return_token_ids": True}).json()
    ch = p["choices"][0]
    assert ch["prompt_token_ids"] == d.post("/tokenize", {"prompt": "abc"}).json()["tokens"]
    assert len(ch["token_ids"]) == p["usage"]["completion_tokens"]
    plain = d.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 2}).json()
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
    tool = d.post("/tokenize", {"prompt": "\n= x", "add_special_tokens": False}).json()["tokens"]
    nxt = c["prompt_token_ids"] + c["choices"][0]["token_ids"] + tool
    j = d.wait_job(d.submit("/v1/rollouts", {"groups": [{"prompt_ids": nxt, "n": 1}],
                                             "sampling": {"max_tokens": 2, "seed": 1}}))
    assert j["status"] == "done", j
    assert j["result"]["groups"][0]["cached_tokens"] >= len(t)
