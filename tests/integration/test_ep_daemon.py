# test_ep_daemon.py — rollouts and updates over HTTP under expert parallelism (grpod serve --ranks 2
# --expert-parallel; each rank holds half the experts of the tiny random Qwen3-MoE fixture,
# tests/fixtures/data/qwen3_moe: 8 experts, top-2) against daemons without it: rollout -> update
# (routing replay of the rollout's routes) -> rollout gives the same tokens, logprobs and policy
# versions (the decode copy, engine/rollout/ep_decode.c, follows the update), an update
# accepted before kill -9 is replayed on restart to the same weights, and a leader with one
# follower process (--followers / --join, a tcp comm) equals the two ranks in one process.
import json
import os
import shutil

import pytest

from conftest import ROOT
from test_routing_replay import MOE, PROMPTS

BODY = {"groups": [{"prompt_ids": p, "n": 3, "reward": {"type": "regex", "answer": ".*"}} for p in PROMPTS],
        "sampling": {"max_tokens": 8, "seed": 5, "temperature": 1.0}}
PROBE = {"groups": [{"prompt_ids": p, "responses": [{"token_ids": [7, 8, 9, 10]}]} for p in PROMPTS]}


def daemon(make_daemon, tmp_path, name, ep, ranks=2, extra=()):
    model = tmp_path / "model"
    if not model.exists():
        shutil.copytree(MOE, model)
    args = ["--model", str(model), "--ranks", str(ranks)] + (["--expert-parallel"] if ep else []) + list(extra)
    return make_daemon(tmp_path / name, args=args)


def rollout(d):
    j = d.wait_job(d.submit("/v1/rollouts", BODY))
    assert j["status"] == "done", json.dumps(j)[:1500]
    return j


def update(d, rid, replay=True):
    body = {"rollout_job_id": rid, "algorithm": {"routing_replay": "rollout" if replay else "off"}, "optimizer": {"lr": 1e-2}}
    j = d.wait_job(d.submit("/v1/updates", body))
    assert j["status"] == "done", json.dumps(j)[:1500]
    return j


def responses(j):
    return [x for g in j["result"]["groups"] for x in g["responses"]]


def close(a, b, tol):
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


def run(d, replay=True):
    r1 = rollout(d)
    u = update(d, r1["id"], replay)
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


def test_ep_with_the_optimizer_offloaded(make_daemon, tmp_path):
    """--expert-parallel with --optimizer-offload on (each rank's shard and experts' fp32 master
    and moments in host memory, AdamW there): rollout -> update -> rollout bit-equal to expert
    parallelism with the state in the backend's memory (the cpu backend's host AdamW is its own
    arithmetic), the update's loss and grad norm too; /v1/model's memory plan says where the
    optimizer is."""
    dev = daemon(make_daemon, tmp_path, "dev", True)
    off = daemon(make_daemon, tmp_path, "off", True, extra=["--optimizer-offload", "on"])
    a, b = run(dev), run(off)
    for x, y in zip(responses(a[0]) + responses(a[2]), responses(b[0]) + responses(b[2])):
        assert x["token_ids"] == y["token_ids"] and x["logprobs"] == y["logprobs"], (x, y)
    for k in ("loss", "grad_norm"):
        assert a[1]["result"]["metrics"][k] == b[1]["result"]["metrics"][k], (k, a[1]["result"], b[1]["result"])
    assert [x["logprobs"] for x in responses(b[0])] != [x["logprobs"] for x in responses(b[2])]
    assert dev.get("/v1/model").json()["memory_plan"]["optimizer"] == "device"
    assert off.get("/v1/model").json()["memory_plan"]["optimizer"] == "host"


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


def test_leader_and_follower_equal_two_ranks(make_daemon, tmp_path):
    """A leader (`--ranks 1 --followers 1 --expert-parallel`) and a follower (`--ranks 1 --join
    URL`: the world it joins carries the leader's --expert-parallel) on loopback, one tcp comm of
    two ranks, each holding half the experts: rollout -> update -> rollout and the logprobs after
    are bit-equal to one process with `--ranks 2 --expert-parallel` (the tcp comm moves the
    experts' rows as bytes and sums in rank order as the cpu comm does, each rank has one engine
    thread in both). The update does not replay the rollout's routes: those of the groups decoded
    on the follower's rank are not sent back to the leader (a conflict naming the rollout job).
    A follower given --expert-parallel itself is refused with one line."""
    from test_join import follower, leader
    ref_d = daemon(make_daemon, tmp_path, "ref", True)
    ref = run(ref_d, replay=False)
    ref_lp = ref_d.post("/v1/logprobs", PROBE).json()
    model = str(tmp_path / "model")
    L = leader(make_daemon, tmp_path / "leader", "--model", model, "--expert-parallel")
    F = follower(tmp_path, "follower", L.url, "--model", model)
    try:
        L.wait_ready()
        got = run(L, replay=False)
        for a, b in zip(ref, got):
            if a is ref[1]:
                assert a["result"]["policy_version_after"] == b["result"]["policy_version_after"] == 1
                continue
            for x, y in zip(responses(a), responses(b)):
                assert x["token_ids"] == y["token_ids"] and x["logprobs"] == y["logprobs"], (x, y)
        assert ref[1]["result"]["metrics"] == got[1]["result"]["metrics"], (ref[1]["result"], got[1]["result"])
        lp = L.post("/v1/logprobs", PROBE).json()
        assert lp["groups"] == ref_lp["groups"] and lp["policy_version"] == 1
        flog = F.stderr()
        assert '"follower_opening"' in flog and '"expert_parallel":true' in flog, flog[-3000:]
        assert '"follower_ready"' in flog, flog[-3000:]
    finally:
        F.stop()
        if F.proc.poll() is None:
            F.kill9()
    bad = follower(tmp_path, "bad", L.url, "--model", model, "--expert-parallel")
    assert bad.proc.wait(timeout=30) != 0
    assert "--expert-parallel is the leader's flag" in bad.stderr(), bad.stderr()[-2000:]


HOOKS = os.path.join(ROOT, "build", "grpod-test-hooks")


@pytest.mark.skipif(not os.path.exists(HOOKS), reason="build/grpod-test-hooks is not built")
def test_comm_down_stops_work_until_the_restart(make_daemon, tmp_path):
    """An update whose ranks' communicator goes down (the test-hooks daemon has rank 1 abort it as
    the update starts, as a rank whose collective failed would) fails naming the comm. A comm once
    aborted stays down (engine/dist/comm.h), and under expert parallelism every update gathers the
    decode copy of the experts again, so no update and no rollout can run until the ranks restart:
    the daemon says so on /readyz (503, naming the cause and the restart) and refuses new jobs
    (503), stays up, and the rollout accepted behind the update stays queued. Restarted (no hook),
    it runs that rollout to the same tokens as the first one: the failed update changed nothing."""
    data = tmp_path / "data"
    shutil.copytree(MOE, tmp_path / "model")
    args = ["--model", str(tmp_path / "model"), "--ranks", "2", "--expert-parallel"]
    hold = tmp_path / "hold"  # the peer rank takes the comm down only once `behind` is queued
    env = {"GRPOD_TEST_COMM_DOWN_AT": "update", "GRPOD_TEST_HOLD_AT": "comm_down", "GRPOD_TEST_HOLD_FILE": str(hold)}
    d = make_daemon(data, args=args, env=env, start=False)
    d.binary = HOOKS
    d.start()
    first = rollout(d)
    up = d.submit("/v1/updates", {"rollout_job_id": first["id"], "optimizer": {"lr": 1e-2}})
    behind = d.submit("/v1/rollouts", BODY)
    hold.write_text("")
    u = d.wait_job(up)
    assert u["status"] == "failed" and u["error"]["code"] == "comm_error", json.dumps(u)[:1500]
    r = d.get("/readyz")
    assert r.status_code == 503 and "communicator is down" in r.text and "restart" in r.text, r.text
    assert d.get("/healthz").status_code == 200
    assert d.post("/v1/rollouts", BODY).status_code == 503
    assert d.get("/v1/jobs/" + behind).json()["status"] == "queued"
    assert '"halted"' in d.stderr(), d.stderr()[-3000:]
    print("the update: %s\n/readyz: %s" % (u["error"]["message"], r.text))
    assert d.stop() == 0
    d2 = make_daemon(data, args=args)
    again = d2.wait_job(behind)
    assert again["status"] == "done", json.dumps(again)[:1500]
    assert again["result"]["policy_version"] == 0
    # the same tokens; the logprobs to fp32 rounding, not bit for bit: the restart runs GRPOD_BIN,
    # which under make sanitize is the ASan build (clang), not the hooks build (cc) that ran the
    # first rollout, and their fp32 sums round apart (5e-7 there, the same tokens)
    for a, b in zip(responses(first), responses(again)):
        assert a["token_ids"] == b["token_ids"], (a, b)
        assert max(abs(x - y) for x, y in zip(a["logprobs"], b["logprobs"])) < 1e-5, (a, b)


SCORED = {"groups": [{"prompt_ids": p, "responses": [{"token_ids": r, "reward": w} for r, w in (
    ([4, 5, 6], 1.0), ([7, 8], 0.0), ([9, 10, 11, 12], 0.5))]} for p in PROMPTS], "optimizer": {"lr": 1e-2}}


def test_balance_loss_is_per_micro_batch(make_daemon, tmp_path):
    """The balance loss is transformers' load_balancing_loss_func of each micro-batch (Megatron's
    "aux_loss"), the micro-batches' losses weighted by their logical tokens: one rank packs the two
    groups into one micro-batch, two ranks into one each, so their balance losses are different
    functions and so are the updates (grad_norm 4.4771 vs 4.4913 here; 0.042 vs 0.0705 in the
    first test's update, whose rewards are all equal: its advantages are 0 and the balance loss is
    the whole gradient). Without the balance loss (output_router_logits false) the same update on
    one rank and on two with expert parallelism agrees to fp32 rounding (2e-8 relative): the
    difference is the definition of the loss, not expert parallelism (docs/data-parallel.md).
    Scored responses with unequal rewards, so the policy loss has a gradient of its own."""
    got = {}
    for aux in (True, False):
        model = tmp_path / ("aux" if aux else "noaux")
        shutil.copytree(MOE, model)
        cfg = json.loads((model / "config.json").read_text())
        cfg["output_router_logits"] = aux
        (model / "config.json").write_text(json.dumps(cfg))
        for ranks in (1, 2):
            args = ["--model", str(model), "--ranks", str(ranks)] + (["--expert-parallel"] if ranks == 2 else [])
            d = make_daemon(tmp_path / ("d%d%d" % (aux, ranks)), args=args)
            j = d.wait_job(d.submit("/v1/updates", SCORED))
            assert j["status"] == "done", json.dumps(j)[:1500]
            m = j["result"]["metrics"]
            got[aux, ranks] = m
            d.stop()
    on1, on2, off1, off2 = got[True, 1], got[True, 2], got[False, 1], got[False, 2]
    assert (on1["micro_batches"], on2["micro_batches"]) == (1, 2), (on1, on2)
    assert abs(on1["grad_norm"] - on2["grad_norm"]) > 1e-3 * on2["grad_norm"], (on1, on2)
    assert abs(off1["grad_norm"] - off2["grad_norm"]) <= 1e-5 * off2["grad_norm"], (off1, off2)
    assert abs(off1["loss"] - off2["loss"]) <= 1e-5 * abs(off2["loss"]) + 1e-7, (off1, off2)
    print("grad_norm with the balance loss: 1 rank %.9g, 2 ranks %.9g; without: %.9g, %.9g"
          % (on1["grad_norm"], on2["grad_norm"], off1["grad_norm"], off2["grad_norm"]))


def test_split_group_beside_a_whole_one(make_daemon, tmp_path):
    """max_tokens_per_micro_batch 8: the first group (14 tokens) splits over micro-batches (its
    prompt once, its responses in chunks: engine/model/split.h), the second (7) stays whole, one
    on each rank, so the ranks run passes of different kinds and counts and meet through ep_gate
    (empty passes fill in). Two ranks with expert parallelism against two without: the same loss
    and grad norm to fp32 rounding and the logprobs after within 1e-5. Before the gate the update
    was refused under expert parallelism."""
    body = {"groups": [{"prompt_ids": PROMPTS[0], "responses": [{"token_ids": r, "reward": w} for r, w in (
        ([4, 5, 6], 1.0), ([7, 8], 0.0), ([9, 10, 11, 12], 0.5))]},
                       {"prompt_ids": PROMPTS[1], "responses": [{"token_ids": r, "reward": w} for r, w in (
                           ([13, 14], 1.0), ([15], 0.0))]}],
            "optimizer": {"lr": 1e-2}, "max_tokens_per_micro_batch": 8}
    got = {}
    for ep in (False, True):
        d = daemon(make_daemon, tmp_path, "ep" if ep else "dp", ep)
        j = d.wait_job(d.submit("/v1/updates", body))
        assert j["status"] == "done", json.dumps(j)[:1500]
        got[ep] = (j["result"]["metrics"], d.post("/v1/logprobs", PROBE).json())
        d.stop()
    (m0, p0), (m1, p1) = got[False], got[True]
    assert m1["micro_batches"] == m0["micro_batches"] >= 3, (m0, m1)
    for k in ("loss", "grad_norm"):
        assert abs(m0[k] - m1[k]) <= 1e-5 * abs(m0[k]) + 1e-7, (k, m0, m1)
    a = [x for g in p0["groups"] for r in g["responses"] for x in r["logprobs"]]
    b = [x for g in p1["groups"] for r in g["responses"] for x in r["logprobs"]]
    assert p0["policy_version"] == p1["policy_version"] == 1 and close(a, b, 1e-5), (a, b)
