# test_agent_turns.py — an agent's turns over the API, token in / token out: each turn's
# prompt_ids are the previous prompt, one response's token_ids and a tool's output ids, so the
# scheduler's prefix cache (engine/rollout/prefix.h) copies the keys and values it holds and
# prefills only the rest. The result says how many prompt ids came from the cache (per group
# and in usage.prompt_tokens_details.cached_tokens, as OpenAI and vLLM report it), /metrics
# counts them, the tokens and logprobs are those a daemon without the cache gives (bit for bit
# on the cpu), and an update empties the cache. The same turns through the OpenAI completions
# route (ids as the prompt, return_token_ids) are served from the cache too.
import re

P0 = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 32]
TOOL = [[60, 116, 111, 111, 108, 62, 52, 50], [60, 47, 116, 62, 55]]


def rollout(d, prompt, seed):
    j = d.wait_job(d.submit("/v1/rollouts", {
        "groups": [{"prompt_ids": prompt, "n": 2}],
        "sampling": {"temperature": 0.8, "max_tokens": 8, "seed": seed, "ignore_eos": True}}))
    assert j["status"] == "done", j
    return j["result"]


def metric(d, name):
    return int(float(re.search(r"^%s (\S+)$" % name, d.get("/metrics").text, re.M).group(1)))


def test_turns_reuse_the_cached_prefix(make_daemon, tmp_path):
    d = make_daemon(tmp_path / "a")
    prompts, results = [P0], [rollout(d, P0, 5)]
    for turn, tool in enumerate(TOOL):
        prev = results[-1]["groups"][0]
        prompts.append(prompts[-1] + prev["responses"][0]["token_ids"] + tool)
        results.append(rollout(d, prompts[-1], 6 + turn))
    cached = [r["groups"][0]["cached_tokens"] for r in results]
    want = [0] + [len(prompts[i]) + len(results[i]["groups"][0]["responses"][0]["token_ids"]) - 1 for i in range(2)]
    assert cached == want, (cached, want)
    assert [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in results] == cached
    assert metric(d, "grpod_prefix_cache_hits_total") == sum(cached)
    assert metric(d, "grpod_prefix_cache_queries_total") == sum(len(p) for p in prompts)
    assert metric(d, "grpod_prefix_cache_entries") > 0

    # the last turn on a daemon that never saw the earlier ones: a full prefill
    fresh = rollout(make_daemon(tmp_path / "b"), prompts[2], 7)
    assert fresh["groups"][0]["cached_tokens"] == 0
    assert fresh["groups"][0]["responses"] == results[2]["groups"][0]["responses"]

    # an update changes the weights: nothing cached is used after it
    g = results[0]["groups"][0]
    u = d.wait_job(d.submit("/v1/updates", {"groups": [{"prompt_ids": P0, "responses": [
        {"token_ids": r["token_ids"], "reward": float(k)} for k, r in enumerate(g["responses"])]}]}))
    assert u["status"] == "done", u
    assert metric(d, "grpod_prefix_cache_entries") == 0
    again = rollout(d, prompts[2], 7)
    assert again["groups"][0]["cached_tokens"] == 0


def test_openai_turns_reuse_the_cached_prefix(make_daemon, tmp_path):
    """The same turns through the OpenAI completions route, token in / token out: the prompt is
    the previous prompt's ids, the choice's token_ids (return_token_ids) and the tool's ids; the
    cache serves the shared ids (/metrics), and the sampled tokens and logprobs are a fresh
    daemon's, which prefills all of them."""
    def turn(d, prompt, seed):
        r = d.post("/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0.8, "seed": seed,
                                       "logprobs": 0, "return_token_ids": True})
        assert r.status_code == 200, r.text
        ch = r.json()["choices"][0]
        assert ch["prompt_token_ids"] == prompt and len(ch["logprobs"]["token_logprobs"]) == len(ch["token_ids"]) > 0, ch
        cached.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        return ch

    cached = []

    d = make_daemon(tmp_path / "a")
    prompts, choices = [P0], [turn(d, P0, 5)]
    for k, tool in enumerate(TOOL):
        prompts.append(prompts[-1] + choices[-1]["token_ids"] + tool)
        choices.append(turn(d, prompts[-1], 6 + k))
    want = sum(len(prompts[i]) + len(choices[i]["token_ids"]) - 1 for i in range(2))
    assert metric(d, "grpod_prefix_cache_hits_total") == want
    assert metric(d, "grpod_prefix_cache_queries_total") == sum(len(p) for p in prompts)
    # each turn's usage names the ids the cache served: the turn before's prompt and its answer
    # but the answer's last id, whose keys the sampler never computed
    assert cached == [0] + [len(prompts[i]) + len(choices[i]["token_ids"]) - 1 for i in range(2)], cached

    fresh = turn(make_daemon(tmp_path / "b"), prompts[2], 7)
    assert cached[-1] == 0, cached
    assert fresh["token_ids"] == choices[2]["token_ids"] and fresh["logprobs"] == choices[2]["logprobs"], (fresh, choices[2])
