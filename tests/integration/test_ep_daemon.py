# test_ep_daemon.py — rollouts and updates over HTTP under expert parallelism (grpod serve --ranks 2
# --expert-parallel; each rank holds half the experts of the tiny random Qwen3-MoE fixture,
# tests/fixtures/data/qwen3_moe: 8 experts, top-2) against daemons without it: rollout -> update
# (routing replay of the rollout's routes) -> rollout gives the same tokens, logprobs and policy
# versions (the decode copy, engine/rollout/ep_decode.c, follows the update), and an update
# accepted before kill -9 is replayed on restart to the same weights.
import json
import shutil

from test_routing_replay import MOE, PROMPTS

BODY = {"groups": [{"prompt_ids": p, "n": 3, "reward": {"type": "regex", "answer": ".*"}} for p in PROMPTS],
        "sampling": {"max_tokens": 8, "seed": 5, "temperature": 1.0}}
PROBE = {"groups": [{"prompt_ids": p, "responses": [{"token_ids": [7, 8, 9, 10]}]} for p in PROMPTS]}


def daemon(make_daemon, tmp_path, name, ep, ranks=2):
    model = tmp_path / "model"
    if not model.exists():
        shutil.copytree(MOE, model)
    args = ["--model", str(model), "--ranks", str(ranks)] + (["--expert-parallel"] if ep else [])
    return make_daemon(tmp_path / name, args=args)


def rollout(d):
    j = d.wait_job(d.submit("/v1/rollouts", BODY))
    assert j["status"] == "done", j
    return j


def update(d, rid):
    body = {"rollout_job_id": rid, "algorithm": {"routing_replay": "rollout"}, "optimizer": {"lr": 1e-2}}
    j = d.wait_job(d.submit("/v1/updates", body))
    assert j["status"] == "done", j
    return j


def responses(j):
    return [x for g in j["result"]["groups"] for x in g["responses"]]


def close(a, b, tol):
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


def run(d):
    r1 = rollout(d)
    u = update(d, r1["id"])
    r2 = rollout(d)
    return r1, u, r2


def test_rollout_update_rollout_equals_one_rank(make_daemon, tmp_path):
    """Before the update every daemon holds the fixture's weights: the rollouts of 2 ranks with
    expert parallelism are bit-equal to one rank's. The update's reference is 2 ranks without
    expert parallelism: its micro-batches are the same (one rank's differ, and so does the
    balance loss of each: grad_norm 0.042 on one rank, 0.0705 on two, with or without expert
    parallelism), and expert parallelism sums the same terms in another order (test_ep: within
    1e-6 relative), so after it the tokens are equal and the logprobs within 1e-5."""
    first = rollout(daemon(make_daemon, tmp_path, "one", False, ranks=1))
    dp = run(daemon(make_daemon, tmp_path, "dp", False))
    ep = run(daemon(make_daemon, tmp_path, "ep", True))
    for a, b, c in zip(responses(first), responses(dp[0]), responses(ep[0])):
        assert a["token_ids"] == c["token_ids"] and a["logprobs"] == c["logprobs"], (a, c)
        assert b["token_ids"] == c["token_ids"] and b["logprobs"] == c["logprobs"], (b, c)
    assert dp[1]["result"]["policy_version_after"] == ep[1]["result"]["policy_version_after"] == 1
    for a, b in zip(responses(dp[2]), responses(ep[2])):
        assert a["token_ids"] == b["token_ids"], (a, b)
        assert close(a["logprobs"], b["logprobs"], 1e-5), (a["logprobs"], b["logprobs"])
    # the update moved the policy: the second rollout is not the first
    assert [x["logprobs"] for x in responses(ep[0])] != [x["logprobs"] for x in responses(ep[2])]
    for j in (dp[2], ep[2]):
        assert j["result"]["policy_version"] == 1, json.dumps(j["result"])[:300]


def test_replay_after_kill9_under_ep(make_daemon, tmp_path):
    """An update accepted under expert parallelism, then kill -9: the restart replays it from the
    store to the same weights, bit for bit (its logprobs), and rollouts resume."""
    d = daemon(make_daemon, tmp_path, "data", True)
    r = rollout(d)
    assert d.wait_job(d.submit("/v1/checkpoints", {}))["status"] == "done"
    update(d, r["id"])
    want = d.post("/v1/logprobs", PROBE).json()
    after = rollout(d)
    d.kill9()
    d2 = daemon(make_daemon, tmp_path, "data", True)
    got = d2.post("/v1/logprobs", PROBE).json()
    assert got["policy_version"] == want["policy_version"] == 1
    assert [x["logprobs"] for g in got["groups"] for x in g["responses"]] == \
        [x["logprobs"] for g in want["groups"] for x in g["responses"]]
    ev = [json.loads(x) for x in d2.stderr().splitlines() if x.startswith("{")]
    assert any(e["event"] == "replay_done" and e["updates"] == 1 for e in ev), [e["event"] for e in ev]
    again = rollout(d2)
    for a, b in zip(responses(after), responses(again)):
        assert a["token_ids"] == b["token_ids"] and a["logprobs"] == b["logprobs"], (a, b)
