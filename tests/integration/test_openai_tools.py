# test_openai_tools.py — tool calling through the official openai SDK against a real daemon whose
# model (the embedded tiny one) carries a Qwen3 chat template: the tools and a tool-call history
# (assistant tool_calls, tool results) rendered into the prompt in Qwen3's format, never dropped;
# enable_thinking; tool_choice none / auto; required and a named function (the call's opening
# forced, the name drawn by the policy's probabilities when several tools may be called, the
# arguments decoded under a JSON grammar so they always parse); response_format json_object. Then the policy is taught, through /v1/updates with given advantages, to
# answer one prompt with a <tool_call>: its answer comes back parsed into tool_calls (as vLLM's
# hermes parser parses it), streamed too (name first, then the arguments piece by piece), and as
# plain content under tool_choice none.
import json

import pytest
import requests

from conftest import daemon_with_template, rendered

TOOLS = [{"type": "function", "function": {"name": "f"}}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
ASK = [{"role": "user", "content": "Call f."}]
CALL = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'


@pytest.fixture(scope="module")
def qwen3(grpod_available, tmp_path_factory):
    """A daemon on a copy of the embedded model whose chat_template is Qwen3's (grpod recognises a
    template by its markers and renders it with built-in code: engine/text/chat.h)."""
    d = daemon_with_template(tmp_path_factory.mktemp("qwen3"), "qwen3-tiny",
                             "{#- Qwen3: <|im_start|>, message.reasoning_content, tools, <tool_call>, "
                             "enable_thinking; rendered by grpod's built-in Qwen3 renderer #}")
    yield d
    d.stop()
    if d.proc.poll() is None:
        d.proc.kill()


def test_tools_and_history_rendered(qwen3):
    d = qwen3
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    text = rendered(d, {"messages": msgs, "tools": [WEATHER]})
    assert text == (
        "<|im_start|>system\nS\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        + json.dumps(WEATHER, ensure_ascii=False) +
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    off = rendered(d, {"messages": ASK, "chat_template_kwargs": {"enable_thinking": False}})
    assert off == "<|im_start|>user\nCall f.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    bad = dict(msgs[2], tool_calls=[{"function": {"name": "get_weather", "arguments": "{not json"}}])
    r = d.post("/tokenize", {"messages": msgs[:2] + [bad], "tools": [WEATHER]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[2].tool_calls[0].function.arguments"


def test_tool_choice_with_the_sdk(qwen3):
    openai = pytest.importorskip("openai")
    d = qwen3
    client = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    history = ASK + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"}]
    for choice in ("auto", "none"):
        c = client.chat.completions.create(model="qwen3-tiny", messages=history, tools=TOOLS, tool_choice=choice,
                                           max_tokens=4, seed=1, parallel_tool_calls=False)
        want = d.post("/tokenize", {"messages": history, "tools": TOOLS}).json()["count"]
        assert c.usage.prompt_tokens == want          # the history's calls and results are in the prompt
        assert c.choices[0].message.role == "assistant"
    with pytest.raises(openai.BadRequestError) as e:  # a named function must be one of the tools
        client.chat.completions.create(model="qwen3-tiny", messages=ASK, tools=TOOLS, max_tokens=4,
                                       tool_choice={"type": "function", "function": {"name": "g"}})
    assert e.value.param == "tool_choice" and '"g"' in str(e.value)


def opening(d, name):
    return d.post("/tokenize", {"prompt": '<tool_call>\n{"name": "%s", "arguments": ' % name,
                                "add_special_tokens": False}).json()["tokens"]


def test_forced_tool_choice(qwen3):
    """required and a named function: the untaught model's answer is always a call of a listed tool
    (the opening appended to the prompt, the arguments the model's, as written when not JSON);
    required over two tools draws the name from the policy's probabilities of the openings, the
    same with the same seed; streamed, the call comes whole at the end with no content."""
    openai = pytest.importorskip("openai")
    d = qwen3
    client = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    prompt = d.post("/tokenize", {"messages": ASK, "tools": [WEATHER] + TOOLS}).json()["tokens"]
    for choice, seed in ((({"type": "function", "function": {"name": "get_weather"}}), 3), ("required", 3), ("required", 4)):
        c = client.chat.completions.create(model="qwen3-tiny", messages=ASK, tools=[WEATHER] + TOOLS, tool_choice=choice,
                                           max_tokens=12, seed=seed, temperature=1.0, extra_body={"return_token_ids": True})
        ch = c.choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.content is None
        assert len(ch.message.tool_calls) >= 1 and ch.message.tool_calls[0].function.name in ("get_weather", "f")
        name = ch.message.tool_calls[0].function.name
        if isinstance(choice, dict):
            assert name == "get_weather"
        ids = c.model_extra["prompt_token_ids"]
        assert ids == prompt + opening(d, name)          # the call's opening follows the prompt
        assert c.usage.prompt_tokens == len(ids)
        again = client.chat.completions.create(model="qwen3-tiny", messages=ASK, tools=[WEATHER] + TOOLS,
                                               tool_choice=choice, max_tokens=12, seed=seed, temperature=1.0)
        assert again.choices[0].message.tool_calls[0].function.name == name
        assert again.choices[0].message.tool_calls[0].function.arguments == ch.message.tool_calls[0].function.arguments
    # greedy picks the likeliest opening: the one /v1/logprobs scores highest
    lps = d.post("/v1/logprobs", {"groups": [{"prompt_ids": prompt, "responses": [
        {"token_ids": opening(d, n)} for n in ("get_weather", "f")]}]})
    assert lps.status_code == 200, lps.text
    res = lps.json()["groups"][0]["responses"]
    best = ("get_weather", "f")[max(range(2), key=lambda i: sum(res[i]["logprobs"]))]
    c = client.chat.completions.create(model="qwen3-tiny", messages=ASK, tools=[WEATHER] + TOOLS, tool_choice="required",
                                       max_tokens=6, temperature=0)
    assert c.choices[0].message.tool_calls[0].function.name == best
    calls, content, finish = [], "", None
    kw = dict(model="qwen3-tiny", messages=ASK, tools=TOOLS, max_tokens=8, seed=1,
              tool_choice={"type": "function", "function": {"name": "f"}})
    for ev in client.chat.completions.create(stream=True, **kw):
        for cc in ev.choices:
            calls += cc.delta.tool_calls or []
            content += cc.delta.content or ""
            finish = cc.finish_reason or finish
    # the call's first delta names it, then its arguments come piece by piece, adding up to the reply's
    assert finish == "tool_calls" and [(t.index, t.function.name) for t in calls if t.function.name] == [(0, "f")]
    assert calls[0].function.name == "f" and content == "" and all(t.index == 0 for t in calls)
    whole = client.chat.completions.create(**kw).choices[0].message.tool_calls[0].function.arguments
    assert "".join(t.function.arguments or "" for t in calls) == whole


def test_forced_arguments_always_parse(qwen3):
    """required and a named function decode the arguments under a JSON grammar (sampling.guided
    json_object, then the call's close): the untaught model, which writes garbage unconstrained,
    answers 20 seeds each with a call whose arguments are a JSON object that keeps to the tool's
    parameters schema, the response's text being exactly arguments + "}\\n</tool_call>" + EOS;
    the grammar closes them inside max_tokens."""
    openai = pytest.importorskip("openai")
    d = qwen3
    client = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    eos = d.get("/v1/model").json()["eos_token_ids"]
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        for seed in range(20):
            c = client.chat.completions.create(model="qwen3-tiny", messages=ASK, tools=[WEATHER] + TOOLS,
                                               tool_choice=choice, max_tokens=40, seed=seed, temperature=1.0,
                                               extra_body={"return_token_ids": True})
            ch = c.choices[0]
            assert ch.finish_reason == "tool_calls", (choice, seed)
            call = ch.message.tool_calls[0]
            args = json.loads(call.function.arguments)
            assert isinstance(args, dict), (choice, seed, call.function.arguments)
            if call.function.name == "get_weather":  # the tool's parameters schema: city, a string, required, alone
                assert list(args) == ["city"] and isinstance(args["city"], str), (seed, args)
            ids = ch.model_extra["token_ids"]
            assert ids[-1] in eos and len(ids) <= 40
            text = d.post("/detokenize", {"tokens": ids[:-1]}).json()["prompt"]
            assert text.endswith("}\n</tool_call>") and json.loads(text[:-len("}\n</tool_call>")]) == args
    # the same request unconstrained (auto) writes no call: the grammar is what makes it parse
    c = client.chat.completions.create(model="qwen3-tiny", messages=ASK, tools=[WEATHER], max_tokens=40, seed=0,
                                       temperature=1.0)
    assert c.choices[0].finish_reason != "tool_calls"


# sha256 of the token ids below, as main drew them before guided decoding existed (348f65a): rows
# without a grammar draw the same tokens as before, bit for bit
UNGUIDED_SHA256 = "df2138cb9e95bd04253678d87aca23273da422c24eba529686d926e6c368d309"


def test_unguided_tokens_unchanged(qwen3):
    import hashlib
    d = qwen3
    got = []
    for seed in range(10):
        c = d.post("/v1/chat/completions", {"messages": ASK, "tools": [WEATHER] + TOOLS, "max_tokens": 24, "seed": seed,
                                            "n": 2, "return_token_ids": True})
        assert c.status_code == 200, c.text
        got += [ch["token_ids"] for ch in c.json()["choices"]]
        c = d.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 24, "seed": seed, "top_p": 0.9,
                                       "return_token_ids": True, "temperature": 0 if seed == 9 else 0.8})
        got += [ch["token_ids"] for ch in c.json()["choices"]]
    h = hashlib.sha256(json.dumps(got).encode()).hexdigest()
    assert h == UNGUIDED_SHA256, h


def test_json_mode(qwen3):
    """response_format json_object: every answer is a JSON object (OpenAI's JSON mode), 20 seeds,
    streamed too; a schema outside the grammar's subset is refused by name (json_schema's, a
    forced tool's parameters)."""
    openai = pytest.importorskip("openai")
    d = qwen3
    client = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    for seed in range(20):
        c = client.chat.completions.create(model="qwen3-tiny", messages=ASK, max_tokens=32, seed=seed,
                                           response_format={"type": "json_object"})
        assert isinstance(json.loads(c.choices[0].message.content), dict), c.choices[0].message.content
        assert c.choices[0].finish_reason == "stop"
    text = "".join(ev.choices[0].delta.content or "" for ev in client.chat.completions.create(
        model="qwen3-tiny", messages=ASK, max_tokens=32, seed=5, stream=True, response_format={"type": "json_object"})
        if ev.choices)
    assert isinstance(json.loads(text), dict)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="qwen3-tiny", messages=ASK, max_tokens=4, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
                "a": {"$ref": "#/$defs/a"}}}}})
    assert e.value.param == "response_format.json_schema.schema" and "properties.a.$ref" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="qwen3-tiny", messages=ASK, max_tokens=4, tools=[dict(WEATHER, function=dict(
            WEATHER["function"], parameters={"type": "object", "properties": {"city": {"type": "string", "minLength": 2}}}))],
            tool_choice="required")
    assert e.value.param == "tools[0].function.parameters" and "properties.city.minLength" in str(e.value)


SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b", 3]}},
                                           "ok": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}},
          "required": ["age", "tags"]}


def test_json_schema(qwen3):
    """response_format json_schema: every answer keeps to the schema (the grammar's subset: types,
    properties in their order, required, enum, items, anyOf of types), 20 seeds, streamed too."""
    openai = pytest.importorskip("openai")
    d = qwen3
    client = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}

    def check(text):
        v = json.loads(text)
        assert isinstance(v, dict) and set(v) <= set(SCHEMA["properties"]) and {"age", "tags"} <= set(v), text
        keys = [k for k in SCHEMA["properties"] if k in v]
        assert list(v) == keys, text  # in the schema's order
        assert isinstance(v["age"], int) and all(t in ("a", "b", 3) for t in v["tags"]), text
        assert isinstance(v.get("name", ""), str) and v.get("ok") in (True, False, None), text
    for seed in range(20):
        c = client.chat.completions.create(model="qwen3-tiny", messages=ASK, max_tokens=64, seed=seed, response_format=rf)
        check(c.choices[0].message.content)
    check("".join(ev.choices[0].delta.content or "" for ev in client.chat.completions.create(
        model="qwen3-tiny", messages=ASK, max_tokens=64, seed=5, stream=True, response_format=rf) if ev.choices))


def teach_the_call(d):
    """Given-advantage updates on [prompt; CALL eos] until greedy decoding answers CALL."""
    prompt = d.post("/tokenize", {"messages": ASK, "tools": TOOLS}).json()["tokens"]
    target = d.post("/tokenize", {"prompt": CALL, "add_special_tokens": False}).json()["tokens"]
    target.append(d.get("/v1/model").json()["eos_token_ids"][0])
    body = {"groups": [{"prompt_ids": prompt, "responses": [{"token_ids": target, "advantage": 1.0}]}],
            "algorithm": {"adv_estimator": "given", "kl_coef": 0.0}, "optimizer": {"lr": 2e-2}}
    for step in range(300):
        job = d.post("/v1/updates", body).json()["job_id"]
        if step % 5 == 4:
            assert d.wait_job(job)["status"] == "done"
            c = d.post("/v1/chat/completions", {"messages": ASK, "tools": TOOLS, "temperature": 0,
                                                "max_tokens": len(target) + 4}).json()
            if c["choices"][0]["finish_reason"] == "tool_calls":
                return step
    pytest.fail("the policy did not learn to answer with the call")


def test_learned_tool_call_parsed_and_streamed(qwen3):
    openai = pytest.importorskip("openai")
    d = qwen3
    teach_the_call(d)
    client = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    c = client.chat.completions.create(model="qwen3-tiny", messages=ASK, tools=TOOLS, temperature=0, max_tokens=64)
    ch = c.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.content is None
    assert [(t.type, t.function.name, json.loads(t.function.arguments)) for t in ch.message.tool_calls] == [
        ("function", "f", {})]
    assert ch.message.tool_calls[0].id.startswith("chatcmpl-tool-")
    # streamed: the call arrives in a delta, with its index, before the finish_reason; its markup
    # never leaks into the streamed content
    calls, finish, content = [], None, ""
    for ev in client.chat.completions.create(model="qwen3-tiny", messages=ASK, tools=TOOLS, temperature=0,
                                             max_tokens=64, stream=True):
        for cc in ev.choices:
            assert finish is None
            calls += cc.delta.tool_calls or []
            content += cc.delta.content or ""
            finish = cc.finish_reason or finish
    assert finish == "tool_calls" and [(t.index, t.function.name) for t in calls if t.function.name] == [(0, "f")]
    assert "".join(t.function.arguments or "" for t in calls) == "{}"
    assert "<tool_call>" not in content and content.strip() == ""
    # required (one tool: the call forced): the learned arguments, parsed
    c = client.chat.completions.create(model="qwen3-tiny", messages=ASK, tools=TOOLS, tool_choice="required",
                                       temperature=0, max_tokens=64)
    assert [(t.function.name, json.loads(t.function.arguments)) for t in c.choices[0].message.tool_calls] == [("f", {})]
    # tool_choice none: the same answer as content, unparsed
    c = client.chat.completions.create(model="qwen3-tiny", messages=ASK, tools=TOOLS, tool_choice="none",
                                       temperature=0, max_tokens=64)
    assert c.choices[0].message.content == CALL and not c.choices[0].message.tool_calls
    assert c.choices[0].finish_reason == "stop"
