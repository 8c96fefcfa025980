# test_ranks.py — several data-parallel ranks in one daemon (`grpod serve --ranks N`, the CPU
# backend's stand-in for --gpus; daemon/ranks.h): the ranks share one cpu communicator, so an
# update trains each rank's share of the groups and shards the AdamW state (engine/train/dp.c).
# W = 2 and 3 give what one rank gives for the same jobs — the same rollout tokens for the
# same seeds (bit for bit: a response's tokens depend only on its seed, group index and
# response index) and the same rollout logprobs, each equal to /v1/logprobs of its tokens bit
# for bit though four jobs decode together (the CPU kernels sum every row in one order whatever
# the batch: kernels/dot_cpu.h), the same policy_version after updates, and the same probe
# logprobs after them to rounding: |d| <= 1e-5 absolute (fp32 CPU; the ranks split the engine threads, and the
# data-parallel update sums gradients in another order, so bits may differ, never more than a
# few fp32 ulps of these magnitudes). Every rank must have run rollout steps, or the test
# proved nothing. A checkpoint written by 2 ranks (the shards gathered to rank 0) resumes on
# one, and one rank's on 2, with the same probe logprobs and the same next update.
# --gpus is checked here only for its refusals (this machine has no GPU; tests/gpu has the rest).
import re
import subprocess
import pytest

from conftest import GRPOD

PROBE = {"groups": [{"prompt_ids": [5, 6, 7, 8], "responses": [{"token_ids": [9, 10, 11, 12, 13, 14]},
                                                               {"token_ids": [40, 41, 42]}]},
                    {"prompt_ids": [100, 101, 102], "responses": [{"token_ids": [103, 104, 105, 106]}]}]}


def rollout(seed, ng, P):
    return {"groups": [{"prompt_ids": [(seed * 31 + g * 7 + t) % 250 + 1 for t in range(P + g % 3)], "n": 2 + g % 3,
                        "reward": {"type": "contains", "answer": "a"}} for g in range(ng)],
            "sampling": {"temperature": 1.0, "top_p": 0.95, "max_tokens": 6 + seed % 5, "seed": 1000 + seed}}


def scored(result):
    return [{"prompt_ids": g["prompt_ids"],
             "responses": [{"token_ids": r["token_ids"], "reward": float((k + len(r["token_ids"])) % 2)}
                           for k, r in enumerate(g["responses"])]} for g in result["groups"]]


def run_round(d, rnd, out):
    """Four rollouts at once, then an update on their results."""
    ids = [d.submit("/v1/rollouts", rollout(rnd * 4 + i, 3 + i, 4 + i)) for i in range(4)]
    jobs = [d.wait_job(i) for i in ids]
    assert all(j["status"] == "done" for j in jobs), jobs
    out["tokens"].append([[r["token_ids"] for g in j["result"]["groups"] for r in g["responses"]] for j in jobs])
    out.setdefault("logprobs", []).append([[r["logprobs"] for g in j["result"]["groups"] for r in g["responses"]] for j in jobs])
    for j in jobs:   # decoded beside three other jobs, yet the trainer's bits
        lp = d.post("/v1/logprobs", {"groups": [{"prompt_ids": g["prompt_ids"],
                                                  "responses": [{"token_ids": r["token_ids"]} for r in g["responses"]]}
                                                 for g in j["result"]["groups"]], "temperature": 1.0})
        assert lp.status_code == 200, lp.text
        assert [r["logprobs"] for g in lp.json()["groups"] for r in g["responses"]] == \
            [r["logprobs"] for g in j["result"]["groups"] for r in g["responses"]]
    groups = [g for j in jobs for g in scored(j["result"])]
    u = d.wait_job(d.submit("/v1/updates", {"groups": groups, "optimizer": {"lr": 1e-3},
                                            "algorithm": {"ppo_mini_batch_size": 4}}))
    assert u["status"] == "done", u
    out["versions"].append(u["result"]["policy_version_after"])


def probe(d):
    r = d.post("/v1/logprobs", PROBE)
    assert r.status_code == 200, r.text
    return [x for g in r.json()["groups"] for rr in g["responses"] for x in rr["logprobs"]]


def session(d):
    """Two rounds, then the probe."""
    out = {"tokens": [], "logprobs": [], "versions": []}
    for rnd in range(2):
        run_round(d, rnd, out)
    out["probe"] = probe(d)
    out["model"] = d.get("/v1/model").json()
    out["metrics"] = d.get("/metrics").text
    return out


def max_diff(a, b):
    assert len(a) == len(b) == 13
    return max(abs(x - y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def one_rank(grpod_available, tmp_path_factory):
    from conftest import Daemon
    d = Daemon(str(tmp_path_factory.mktemp("r1") / "data")).start()
    try:
        yield session(d)
    finally:
        d.stop()


@pytest.mark.parametrize("W", [2, 3])
def test_ranks_equal_one_rank(one_rank, make_daemon, tmp_path, W):
    d = make_daemon(tmp_path / ("w%d" % W), args=["--ranks", str(W)])
    got = session(d)
    assert d.stop() == 0
    assert got["tokens"] == one_rank["tokens"]
    assert got["logprobs"][0] == one_rank["logprobs"][0]   # round 1 follows an update: rounding (above)
    assert got["versions"] == one_rank["versions"] == [1, 2]
    assert got["model"]["policy_version"] == one_rank["model"]["policy_version"]
    assert len(got["probe"]) == len(one_rank["probe"]) == 13
    assert max(abs(a - b) for a, b in zip(got["probe"], one_rank["probe"])) <= 1e-5
    assert [r["rank"] for r in got["model"]["ranks"]] == list(range(W))
    assert all(r["kv_rows_capacity"] > 0 for r in got["model"]["ranks"])
    assert re.search(r"^grpod_ranks %d$" % W, got["metrics"], re.M)
    steps = [int(re.search(r'^grpod_rank_steps{rank="%d"} (\d+)$' % r, got["metrics"], re.M).group(1)) for r in range(W)]
    assert all(s > 0 for s in steps), steps      # every rank decoded some of the groups


def test_one_job_split_across_ranks(make_daemon, tmp_path):
    """One rollout job's groups are placed each on its own rank (by KV rows), not the whole job on
    one: with 2 ranks and nothing else queued, both decode part of it, and every response is the
    one the job draws on one rank (a part keeps its groups' indices in the request)."""
    job = rollout(7, 6, 5)
    got = {}
    for W in (1, 2):
        d = make_daemon(tmp_path / ("split%d" % W), args=["--ranks", str(W)])
        j = d.wait_job(d.submit("/v1/rollouts", job))
        assert j["status"] == "done", j
        got[W] = [[r["token_ids"] for r in g["responses"]] for g in j["result"]["groups"]]
        metrics = d.get("/metrics").text
        steps = [int(re.search(r'^grpod_rank_steps{rank="%d"} (\d+)$' % r, metrics, re.M).group(1)) for r in range(W)]
        assert all(s > 0 for s in steps), (W, steps)
        assert d.stop() == 0
    assert got[2] == got[1]
    assert sum(len(t) for g in got[1] for t in g) > 0


@pytest.mark.parametrize("first,second", [(2, 1), (1, 2)])
def test_ranks_checkpoint_restart(one_rank, make_daemon, tmp_path, first, second):
    """The session's first round on `first` ranks, a checkpoint (POST /v1/checkpoints), a restart
    on `second` ranks from it (no replay), the second round there: the probe right after the
    restart is the one before it, and the end is the one-rank session's (the AdamW moments
    crossed the restart too, or the second update would differ)."""
    data = tmp_path / "data"
    args = lambda w: ["--ranks", str(w)] if w > 1 else []
    out = {"tokens": [], "logprobs": [], "versions": []}
    d = make_daemon(data, args=args(first))
    run_round(d, 0, out)
    c = d.wait_job(d.submit("/v1/checkpoints", {}))
    assert c["status"] == "done" and c["result"]["policy_version"] == 1, c
    before = probe(d)
    assert d.stop() == 0
    assert re.search(r'"engine_ready".*"ranks":%d,"comm":"%s"' % (first, "cpu" if first > 1 else "none"), d.stderr())
    d = make_daemon(data, args=args(second))
    log = d.stderr()
    assert re.search(r'"engine_opening".*"resume":"[^"]*%s"' % re.escape(c["result"]["id"]), log), log[-3000:]
    assert '"replay_start"' not in log
    after = probe(d)
    assert max_diff(after, before) <= 1e-5
    run_round(d, 1, out)
    out["probe"] = probe(d)
    assert d.stop() == 0
    assert out["tokens"] == one_rank["tokens"]
    assert out["versions"] == one_rank["versions"] == [1, 2]
    assert max_diff(out["probe"], one_rank["probe"]) <= 1e-5


def test_gpus_flag_checks(tmp_path):
    """Refusals of --gpus that need no GPU: each exits 2 with one line naming the flag."""
    def serve(*flags):
        return subprocess.run([GRPOD, "serve", "--data-dir", str(tmp_path / "x"), *flags],
                              capture_output=True, text=True, timeout=30)
    r = serve("--gpus", "0", "--backend", "cpu")
    assert r.returncode == 2 and "--gpus needs the cuda backend" in r.stderr, r.stderr
    r = serve("--gpus", "0", "--ranks", "2")
    assert r.returncode == 2 and "--gpus and --ranks 2" in r.stderr, r.stderr
    for bad, why in [("0,0", "listed twice"), ("x", "expected all or device indices"), ("-1", "negative"),
                     ("0,", "expected all"), ("1,,2", "expected all")]:
        r = serve("--gpus", bad)
        assert r.returncode == 2 and ("--gpus '%s': " % bad) in r.stderr and why in r.stderr, (bad, r.stderr)
    if not have_gpu():
        for flags in (["--gpus", "all"], ["--gpus", "0"], ["--gpus", "0", "--backend", "cuda"]):
            r = serve(*flags)
            assert r.returncode == 2 and "--gpus: no CUDA device is usable" in r.stderr, (flags, r.stderr)
    else:   # a device index past the last one
        r = serve("--gpus", "63")
        assert r.returncode == 2 and ("--gpus: device 63 is not there" in r.stderr   # a CPU-only build sees none
                                      or "--gpus: no CUDA device is usable" in r.stderr), r.stderr
    r = serve("--ranks", "2", "--backend", "cpu", "--lora-rank", "4")
    assert r.returncode == 2 and "LoRA trains on one rank only" in r.stderr, r.stderr
    assert not (tmp_path / "x").exists()        # refused before anything was created


def have_gpu():
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_ranks_flag_checks(make_daemon, tmp_path):
    r = subprocess.run([GRPOD, "serve", "--data-dir", str(tmp_path / "x"), "--backend", "cuda", "--ranks", "2"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--ranks 2 needs --backend cpu" in r.stderr, r.stderr
    r = subprocess.run([GRPOD, "serve", "--data-dir", str(tmp_path / "x"), "--ranks", "0"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--ranks" in r.stderr, r.stderr
