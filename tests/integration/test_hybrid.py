"""A GRPO loop over HTTP on a tiny random Qwen3.5 text model (gated DeltaNet and gated attention
layers, tests/fixtures/data/qwen3_5_text): rollouts decode from recurrent state rows, their
logprobs are /v1/logprobs' and the update's old pass bit for bit (CPU), the update trains on them,
and the next rollout decodes with the new weights. The pool reports its state rows."""
import os

from conftest import ROOT

MODEL = os.path.join(ROOT, "tests", "fixtures", "data", "qwen3_5_text")
PROMPTS = [[11, 200, 37, 5, 150, 64, 3], [290, 77], [18]]  # P 7, 2 and 1: beyond and within the 4-tap conv


def rollout(d, seed):
    j = d.wait_job(d.submit("/v1/rollouts", {
        "groups": [{"prompt_ids": p, "n": 4} for p in PROMPTS],
        "sampling": {"max_tokens": 8, "seed": seed, "temperature": 1.0}}))
    assert j["status"] == "done", j
    return j["result"]


def scored(d, res):
    req = {"groups": [{"prompt_ids": g["prompt_ids"], "responses": [{"token_ids": x["token_ids"]} for x in g["responses"]]}
                      for g in res["groups"]]}
    r = d.post("/v1/logprobs", req)
    assert r.status_code == 200, r.text
    return [[x["logprobs"] for x in g["responses"]] for g in r.json()["groups"]]


def test_hybrid_grpo_loop(make_daemon):
    d = make_daemon(args=["--model", MODEL])
    text = d.get("/metrics").text
    gauges = {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines() if ln.startswith("grpod_state_row")}
    assert gauges["grpod_state_rows_capacity"] > 0 and gauges["grpod_state_row_bytes"] > 0, gauges
    ranks = d.get("/v1/model").json()["ranks"]
    assert ranks[0]["state_rows_capacity"] == gauges["grpod_state_rows_capacity"]

    first = rollout(d, 3)
    lps = [[x["logprobs"] for x in g["responses"]] for g in first["groups"]]
    assert all(len(x["token_ids"]) == len(x["logprobs"]) > 0 for g in first["groups"] for x in g["responses"])
    assert scored(d, first) == lps  # the trainer's bits
    assert rollout(d, 3)["groups"] == first["groups"]  # a seed decides the tokens

    # GRPO on rewards the client computes from the ids (even ids are good), the rollout's own
    # logprobs given beside the old pass: their difference is exactly 0
    groups = [{"prompt_ids": g["prompt_ids"],
               "responses": [{"token_ids": x["token_ids"], "logprobs": x["logprobs"],
                              "reward": sum(t % 2 == 0 for t in x["token_ids"]) / len(x["token_ids"])}
                             for x in g["responses"]]} for g in first["groups"]]
    u = d.wait_job(d.submit("/v1/updates", {"groups": groups, "algorithm": {"adv_estimator": "grpo", "rollout_is": "token"},
                                            "optimizer": {"lr": 1e-2}}))
    assert u["status"] == "done", u
    m = u["result"]["metrics"]
    assert m["rollout_corr/logprob_abs_diff_max"] == 0 and m["rollout_corr/rollout_is_mean"] == 1, m
    assert u["result"]["policy_version_after"] == 1

    # the next rollout decodes with the new weights, again the trainer's bits
    second = rollout(d, 3)
    assert second["policy_version"] == 1
    lp2 = [[x["logprobs"] for x in g["responses"]] for g in second["groups"]]
    assert scored(d, second) == lp2
    assert lp2 != lps
    # and an update straight from it (old pass recomputed, the on-policy way)
    groups2 = [{"prompt_ids": g["prompt_ids"],
                "responses": [{"token_ids": x["token_ids"], "reward": float(x["token_ids"][0] % 2 == 0)}
                              for x in g["responses"]]} for g in second["groups"]]
    u2 = d.wait_job(d.submit("/v1/updates", {"groups": groups2, "optimizer": {"lr": 1e-2}}))
    assert u2["status"] == "done", u2


def test_hybrid_state_rows_bound_n(make_daemon):
    # 1 MiB of budget: half of it holds 21 state rows of 24,192 bytes (3 DeltaNet layers), so a
    # group takes at most n = 20 (its prompt takes one more)
    d = make_daemon(args=["--model", MODEL, "--kv-budget-mib", "1"])
    assert d.get("/v1/model").json()["ranks"][0]["state_rows_capacity"] == 21
    body = {"groups": [{"prompt_ids": [5, 6, 7], "n": 21}], "sampling": {"max_tokens": 2}}
    r = d.post("/v1/rollouts", body)
    assert r.status_code == 413, r.text
    assert r.json()["error"]["message"].startswith("groups[0].n needs 22 recurrent-state rows"), r.text
    body["groups"][0]["n"] = 20
    j = d.wait_job(d.submit("/v1/rollouts", body))
    assert j["status"] == "done" and len(j["result"]["groups"][0]["responses"]) == 20, j
