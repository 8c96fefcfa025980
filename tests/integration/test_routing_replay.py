# test_routing_replay.py — algorithm.routing_replay over HTTP on a tiny random Qwen3-MoE checkpoint
# (tests/fixtures/data/qwen3_moe: layers 0 and 2 MoE, 8 experts, top-2; router weights of scale
# 0.02, so near-tied router logits): a rollout keeps its routes in the store, an update by
# rollout_job_id replays them (its old pass equals the rollout's logprobs bit for bit on the cpu),
# the refusals name the field, and an update replayed after kill -9 reads the same routes.
import json
import os
import shutil
import sqlite3

import pytest

from conftest import ROOT

MOE = os.path.join(ROOT, "tests", "fixtures", "data", "qwen3_moe")
PROMPTS = [[11, 200, 37, 5, 150], [64, 3, 99, 17]]


def moe_daemon(make_daemon, tmp_path, name="data", ranks=1):
    model = tmp_path / "model"
    if not model.exists():
        shutil.copytree(MOE, model)
    return make_daemon(tmp_path / name, args=["--model", str(model), "--ranks", str(ranks)])


def rollout(d, seed=3):
    body = {"groups": [{"prompt_ids": p, "n": 3, "reward": {"type": "regex", "answer": ".*"}} for p in PROMPTS],
            "sampling": {"max_tokens": 8, "seed": seed, "temperature": 1.0}}
    j = d.wait_job(d.submit("/v1/rollouts", body))
    assert j["status"] == "done", j
    assert "routes" not in json.dumps(j["result"])
    return j


def update(d, rid, replay, lr=0.0):
    body = {"rollout_job_id": rid, "algorithm": {"routing_replay": "rollout" if replay else "off", "rollout_is": "token"},
            "optimizer": {"lr": lr}}
    return d.wait_job(d.submit("/v1/updates", body))


@pytest.mark.parametrize("ranks", [1, 2])
def test_replay_gives_the_rollout_logprobs(make_daemon, tmp_path, ranks):
    """With 2 ranks the two groups decode on different ranks (placement by KV rows) and both
    ranks train: the routes of every rank reach the store and every rank replays them."""
    d = moe_daemon(make_daemon, tmp_path, ranks=ranks)
    r = rollout(d)
    u = update(d, r["id"], True)
    assert u["status"] == "done", u
    m = u["result"]["metrics"]
    assert m["rollout_corr/logprob_abs_diff_max"] == 0.0, m
    # the stored rows: one blob for the rollout, none for the update
    d.stop()
    db = sqlite3.connect(os.path.join(tmp_path / "data", "grpod.db"))
    rows = db.execute("SELECT job_id, length(data) FROM routes").fetchall()
    db.close()
    toks = sum(len(x["token_ids"]) for g in r["result"]["groups"] for x in g["responses"])
    want = 4 * (4 + sum(2 + len(g["responses"]) for g in r["result"]["groups"])) + \
        2 * 2 * 2 * (sum(map(len, PROMPTS)) + toks)     # u32 header + u16 ids of 2 layers x top-2
    assert rows == [(r["id"], want)], rows


def test_refusals_name_the_field(make_daemon, tmp_path):
    d = moe_daemon(make_daemon, tmp_path)
    body = {"groups": [{"prompt_ids": [1, 2], "responses": [{"token_ids": [3, 4], "reward": 1.0}]}],
            "algorithm": {"routing_replay": "rollout"}}
    r = d.post("/v1/updates", body)
    assert r.status_code == 400 and r.json()["error"]["field"] == "algorithm.routing_replay", r.text
    r = d.post("/v1/updates", {"rollout_job_id": "j_0123456789abcdef", "algorithm": {"routing_replay": "sometimes"}})
    assert r.status_code == 400 and "routing_replay" in r.json()["error"]["field"], r.text
    dense = make_daemon(tmp_path / "dense")
    r = dense.post("/v1/updates", {"rollout_job_id": "j_0123456789abcdef", "algorithm": {"routing_replay": "rollout"}})
    assert r.status_code == 400 and r.json()["error"]["field"] == "algorithm.routing_replay", r.text
    assert "mixture-of-experts" in r.json()["error"]["message"]
    # a rollout without recorded routes (one from before routing replay: its row deleted here)
    r = rollout(d)
    db = sqlite3.connect(os.path.join(tmp_path / "data", "grpod.db"))
    db.execute("DELETE FROM routes WHERE job_id = ?", (r["id"],))
    db.commit()
    db.close()
    j = update(d, r["id"], True)
    assert j["status"] == "failed" and j["error"]["code"] == "conflict", j
    assert "no recorded routes" in j["error"]["message"], j
    assert update(d, r["id"], False)["status"] == "done"


def test_replay_after_kill9_reads_the_same_routes(make_daemon, tmp_path):
    """The rollout is sampled, then the policy moves (so its routes are not the trainer's own any
    more), then an update replays them; kill -9 and the restart's replay gives the same weights."""
    d = moe_daemon(make_daemon, tmp_path)
    r = rollout(d)
    assert d.wait_job(d.submit("/v1/checkpoints", {}))["status"] == "done"
    moved = update(d, r["id"], False, lr=1e-3)
    assert moved["status"] == "done", moved
    u = update(d, r["id"], True, lr=1e-2)
    assert u["status"] == "done", u
    probe = {"groups": [{"prompt_ids": p, "responses": [{"token_ids": [7, 8, 9, 10]}]} for p in PROMPTS]}
    want = d.post("/v1/logprobs", probe).json()
    d.kill9()
    d2 = moe_daemon(make_daemon, tmp_path)
    got = d2.post("/v1/logprobs", probe).json()
    assert got["policy_version"] == want["policy_version"] == 2
    assert [x["logprobs"] for g in got["groups"] for x in g["responses"]] == \
        [x["logprobs"] for g in want["groups"] for x in g["responses"]]
    ev = [json.loads(x) for x in d2.stderr().splitlines() if x.startswith("{")]
    assert any(e["event"] == "replay_done" and e["updates"] == 2 for e in ev), [e["event"] for e in ev]
    # the control: the same run with the last update routing freely ends elsewhere, so the
    # equality above needs the recorded routes (seeded rollouts: the same tokens and routes)
    c = moe_daemon(make_daemon, tmp_path, "control")
    rc = rollout(c)
    assert [x["token_ids"] for g in rc["result"]["groups"] for x in g["responses"]] == \
        [x["token_ids"] for g in r["result"]["groups"] for x in g["responses"]]
    assert update(c, rc["id"], False, lr=1e-3)["status"] == "done"
    assert update(c, rc["id"], False, lr=1e-2)["status"] == "done"
    free = c.post("/v1/logprobs", probe).json()
    assert [x["logprobs"] for g in free["groups"] for x in g["responses"]] != \
        [x["logprobs"] for g in want["groups"] for x in g["responses"]]
