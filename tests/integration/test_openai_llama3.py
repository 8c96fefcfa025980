# test_openai_llama3.py — Llama 3.1's tool format through the official openai SDK, against a daemon
# whose model (a copy of the embedded tiny one) carries tests/integration/llama31_tools.jinja, a
# Llama 3.1-style template: grpod's built-in renderer equals jinja2's rendering of that template
# (tools as json.dumps(indent=4) in the first user message, a call as {"name", "parameters"}, a
# result as an ipython turn); tool_choice required / named open the call in Llama's form and the
# grammar closes it with "}"; streamed, a call comes as OpenAI streams it — id, type and name
# first, then the arguments piece by piece — and the pieces add up to the non-streamed reply's
# arguments for the same seed (the Qwen3 format's streams are checked in test_openai_tools.py).
import json
import os

import pytest

from conftest import ROOT, daemon_with_template, rendered

TEMPLATE = os.path.join(ROOT, "tests", "integration", "llama31_tools.jinja")
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather now \u00e9",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
NOOP = {"type": "function", "function": {"name": "noop"}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def llama(grpod_available, tmp_path_factory):
    d = daemon_with_template(tmp_path_factory.mktemp("llama31"), "llama31-tiny", open(TEMPLATE).read())
    yield d
    d.stop()
    if d.proc.poll() is None:
        d.proc.kill()


def jinja_render(messages, tools, bos):
    jinja2 = pytest.importorskip("jinja2")
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # as HF's apply_chat_template
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)

    def raise_exception(msg):  # as HF's: the template refuses what Meta's template refuses
        raise ValueError(msg)
    env.globals["raise_exception"] = raise_exception
    kw = {"messages": messages, "bos_token": bos or "", "add_generation_prompt": True}
    if tools is not None:
        kw["tools"] = tools
    return env.from_string(open(TEMPLATE).read()).render(**kw)


def test_rendered_as_the_template(llama):
    d = llama
    msgs = [{"role": "system", "content": " S "}, {"role": "user", "content": "Weather in Paris?\n"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny \"22\""},
            {"role": "assistant", "content": "It is sunny."}, {"role": "user", "content": "And Rome?"}]
    # the template reads a call's arguments as a dict (vLLM parses the request's JSON text first)
    ref = [dict(m) for m in msgs]
    ref[2] = {"role": "assistant", "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}
    assert rendered(d, {"messages": msgs, "tools": [WEATHER, NOOP]}) == jinja_render(ref, [WEATHER, NOOP], d.bos)
    assert rendered(d, {"messages": ASK}) == jinja_render(ASK, None, d.bos)
    # what the template (as Meta's) refuses, grpod refuses: two calls in one assistant turn, and
    # tools with no user message to carry them
    two = dict(msgs[2], tool_calls=msgs[2]["tool_calls"] * 2)
    ref_two = dict(ref[2], tool_calls=ref[2]["tool_calls"] * 2)
    for sent, ref_sent in ((msgs[:2] + [two], ref[:2] + [ref_two]), (msgs[:1], ref[:1])):
        with pytest.raises(ValueError):
            jinja_render(ref_sent, [WEATHER], d.bos)
        r = d.post("/tokenize", {"messages": sent, "tools": [WEATHER]})
        assert r.status_code == 400, r.text


def stream_calls(client, **kw):
    deltas, content, finish = [], "", None
    for ev in client.chat.completions.create(stream=True, **kw):
        for cc in ev.choices:
            deltas += cc.delta.tool_calls or []
            content += cc.delta.content or ""
            finish = cc.finish_reason or finish
    return deltas, content, finish


def test_forced_calls_streamed_piece_by_piece(llama):
    """required / named: the untaught model's answer is one call in Llama's form whose arguments
    parse (the grammar closes them with "}" before EOS); streamed, the first delta names the call
    and the arguments follow in several pieces that add up to the non-streamed reply's."""
    openai = pytest.importorskip("openai")
    d = llama
    client = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    opening = d.post("/tokenize", {"prompt": '{"name": "get_weather", "parameters": ',
                                   "add_special_tokens": False}).json()["tokens"]
    pieces_seen = 0
    for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):
        for seed in range(6):
            kw = dict(model="llama31-tiny", messages=ASK, tools=[WEATHER, NOOP], tool_choice=choice, max_tokens=40,
                      seed=seed, temperature=1.0)
            c = client.chat.completions.create(extra_body={"return_token_ids": True}, **kw)
            ch = c.choices[0]
            assert ch.finish_reason == "tool_calls" and ch.message.content is None
            call = ch.message.tool_calls[0]
            args = json.loads(call.function.arguments)
            assert isinstance(args, dict), call.function.arguments
            if call.function.name == "get_weather":  # the opening in Llama's form; the arguments keep to the schema
                assert c.model_extra["prompt_token_ids"][-len(opening):] == opening
                assert list(args) == ["city"] and isinstance(args["city"], str), args
            deltas, content, finish = stream_calls(client, **kw)
            assert finish == "tool_calls" and content == ""
            assert deltas[0].index == 0 and deltas[0].id.startswith("chatcmpl-tool-") and deltas[0].type == "function"
            assert deltas[0].function.name == call.function.name
            assert all(t.index == 0 and t.function.name is None for t in deltas[1:])
            assert "".join(t.function.arguments or "" for t in deltas) == call.function.arguments
            pieces_seen = max(pieces_seen, sum(1 for t in deltas if t.function.arguments))
    assert pieces_seen >= 3  # token by token, not one final delta


def test_auto_is_content_unless_it_opens_a_call(llama):
    """auto: the untaught model's text does not open with a call, so it is content, streamed as
    such, equal to the non-streamed reply."""
    openai = pytest.importorskip("openai")
    d = llama
    client = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    kw = dict(model="llama31-tiny", messages=ASK, tools=[WEATHER], max_tokens=16, seed=2, temperature=1.0)
    c = client.chat.completions.create(**kw)
    deltas, content, finish = stream_calls(client, **kw)
    if c.choices[0].finish_reason == "tool_calls":
        assert "".join(t.function.arguments or "" for t in deltas) == c.choices[0].message.tool_calls[0].function.arguments
    else:
        assert content == c.choices[0].message.content and deltas == []
