# test_join.py — ranks in several processes (docs/data-parallel.md "Several hosts"): a
# leader (`grpod serve --ranks 1 --followers 1`) and a follower (`grpod serve --ranks 1 --join
# URL`) on loopback, their two ranks in one tcp communicator (engine/dist/comm_tcp.c), the leader
# driving every update, logprobs and checkpoint on the follower's rank (daemon/cluster.h).
#
# The same jobs as test_ranks.py's session give what one daemon with --ranks 2 gives, bit for
# bit: the tcp comm sums in rank order exactly as the cpu comm does, each rank has one engine
# thread in both set-ups, and a rollout's groups are placed on both ranks in both, the
# follower's share sent to it as a part and its groups sent back (a response's tokens depend
# only on its seed, its group's index in the request and its index), so nothing differs in
# the arithmetic.
#
# A follower killed with SIGKILL: the update that needs it fails rank_lost (or, when the leader
# had already noticed the loss, is refused 503), /readyz says 503 naming the follower; a
# follower joining again makes the leader stop and exec itself again (crash-only, in place: no
# service manager needed), the new image replays, the follower's retried join gets the new
# epoch, and the failed update, requeued, runs.
import json
import os
import re
import signal
import subprocess
import time

import pytest
import requests

from conftest import GRPOD, ROOT, Daemon
from test_ranks import probe, rollout, run_round, session

HOOKS = os.path.join(ROOT, "build", "grpod-test-hooks")


def leader(make_daemon, data, *extra):
    """Started, not waited for: it is ready only once its follower joined."""
    d = make_daemon(data, args=["--engine-threads", "1", "--followers", "1", *extra], start=False)
    d.start(wait_ready=False)
    wait_for(lambda: _up(d), "the leader's HTTP")
    return d


def follower(tmp_path, name, url, *extra):
    d = Daemon(str(tmp_path / name), ["--engine-threads", "1", "--join", url, *extra])
    d.start(wait_ready=False)
    return d


def readyz(d):
    r = d.get("/readyz", timeout=10)
    return r.status_code, r.text


def wait_for(pred, what, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError("timed out waiting for " + what)


@pytest.fixture(scope="module")
def two_ranks(grpod_available, tmp_path_factory):
    d = Daemon(str(tmp_path_factory.mktemp("r2") / "data"), ["--ranks", "2"]).start()
    try:
        yield session(d)
    finally:
        d.stop()


def test_join_equals_two_ranks(two_ranks, make_daemon, tmp_path):
    L = leader(make_daemon, tmp_path / "leader")
    code, text = readyz(L)
    assert code == 503 and "waiting for 1 of 1 followers to join" in text, text
    F = follower(tmp_path, "follower", L.url)
    try:
        L.wait_ready()
        got = session(L)
        assert got["tokens"] == two_ranks["tokens"]
        assert got["versions"] == two_ranks["versions"] == [1, 2]
        assert got["probe"] == two_ranks["probe"]        # bit-equal: see the header
        # a checkpoint is collective too: every rank calls the save, the leader's rank writes it
        c = L.wait_job(L.submit("/v1/checkpoints", {}))
        assert c["status"] == "done" and c["result"]["policy_version"] == 2, c
        assert L.stop() == 0
        log = L.stderr()
        assert re.search(r'"engine_ready".*"ranks":1,"comm":"tcp"', log), log[-3000:]
        assert re.search(r'"follower_joined".*"joined":1,"of":1', log)
        flog = F.stderr()
        assert '"follower_ready"' in flog and '"comm":"tcp"' in flog, flog[-3000:]
        assert len(re.findall(r'"call_done".*"code":"ok"', flog)) >= 4, flog[-3000:]   # updates, logprobs, checkpoint
        # rollouts: groups placed on the follower's rank went there, and came back bit-equal
        assert len(re.findall(r'"part_done".*"code":"ok"', flog)) >= 4, flog[-3000:]
    finally:
        F.stop()
        if F.proc.poll() is None:
            F.kill9()


def _up(d):
    try:
        d.get("/healthz", timeout=2)
        return True
    except Exception:
        return False


SMALL_UPDATE = {"groups": [{"prompt_ids": [1, 2, 3], "responses": [
    {"token_ids": [4, 5], "reward": 1.0}, {"token_ids": [6], "reward": 0.0}]}], "optimizer": {"lr": 1e-3}}


def test_follower_lost_and_back(make_daemon, tmp_path):
    data = tmp_path / "leader"
    L = leader(make_daemon, data, "--follower-timeout", "3")
    F = follower(tmp_path, "f1", L.url)
    F2 = None
    try:
        L.wait_ready()
        out = {"tokens": [], "versions": []}
        run_round(L, 0, out)
        assert out["versions"] == [1]
        F.kill9()
        r = L.post("/v1/updates", SMALL_UPDATE)
        failed = None
        if r.status_code == 202:
            j = L.wait_job(r.json()["job_id"])
            assert j["status"] == "failed" and j["error"]["code"] == "rank_lost", j
            assert "follower" in j["error"]["message"] and "lost" in j["error"]["message"], j
            failed = j["id"]
        else:       # the leader noticed the loss first: new work is refused
            assert r.status_code == 503, r.text
        code, text = wait_for(lambda: (lambda c: c if c[0] == 503 and "lost" in c[1] else None)(readyz(L)),
                              "/readyz to name the lost follower")
        assert re.search(r"follower \d+ \(ranks 1\.\.1\) lost", text), text
        # the follower is back: the leader stops and starts again as a fresh image of itself (a
        # new epoch, crash-only: the same process, its store, port and lock released between),
        # and the follower's retried join finds it
        F2 = follower(tmp_path, "f1", L.url)
        wait_for(lambda: '"reexec"' in L.stderr() or L.proc.poll() is not None, "the leader's re-exec")
        assert L.proc.poll() is None, L.stderr()[-3000:]
        L2 = L
        L2.wait_ready(timeout=120)
        log = L2.stderr()
        log = log[log.index('"reexec"'):]
        assert '"replay_done"' in log and '"updates":1' in log, log[-3000:]
        assert L2.get("/v1/model").json()["policy_version"] == 1
        if failed:
            assert L2.post("/v1/jobs/%s/requeue" % failed).status_code == 200
            j = L2.wait_job(failed)
        else:
            j = L2.wait_job(L2.submit("/v1/updates", SMALL_UPDATE))
        assert j["status"] == "done" and j["result"]["policy_version_after"] == 2, j
        got = probe(L2)
        assert L2.stop() == 0
        # the follower replayed the leader's update 1 (its shard of the optimizer state), then ran
        # the update and the probe: the policy is the uninterrupted run's, bit for bit
        assert len(re.findall(r'"call_done".*"code":"ok"', F2.stderr())) >= 3, F2.stderr()[-3000:]
        ref = make_daemon(tmp_path / "ref", args=["--ranks", "2"])
        run_round(ref, 0, {"tokens": [], "versions": []})
        assert ref.wait_job(ref.submit("/v1/updates", SMALL_UPDATE))["status"] == "done"
        assert got == probe(ref)
        assert ref.stop() == 0
    finally:
        for d in (F, F2):
            if d and d.proc.poll() is None:
                d.stop()
                if d.proc.poll() is None:
                    d.kill9()


def start_long_rollout(L):
    """A rollout long enough to be running on both ranks (8 groups of 4 x 3000 tokens, no early
    stop); returns its id once it runs."""
    big = {"groups": [{"prompt_ids": [3 + g, 4, 5], "n": 4} for g in range(8)],
           "sampling": {"temperature": 1.0, "max_tokens": 3000, "min_tokens": 3000, "seed": 5}}
    jid = L.submit("/v1/rollouts", big)
    wait_for(lambda: L.get("/v1/jobs/" + jid).json()["status"] == "running", "the rollout to start")
    return jid


def test_follower_lost_during_rollout(make_daemon, tmp_path):
    """A follower killed while it decodes its share of a rollout: the job fails rank_lost (its
    part can never come back) instead of waiting, and the leader stays up."""
    L = leader(make_daemon, tmp_path / "leader", "--follower-timeout", "3")
    F = follower(tmp_path, "f1", L.url)
    try:
        L.wait_ready()
        jid = start_long_rollout(L)
        F.kill9()
        j = L.wait_job(jid)
        assert j["status"] == "failed" and j["error"]["code"] == "rank_lost", j
        assert L.get("/healthz").status_code == 200
    finally:
        if F.proc.poll() is None:
            F.kill9()


def test_rollout_cancelled_on_follower(make_daemon, tmp_path):
    """A rollout cancelled while the follower decodes its share: the leader tells the follower,
    which drops the part (its rows freed), and the next rollout runs on both ranks."""
    L = leader(make_daemon, tmp_path / "leader")
    F = follower(tmp_path, "f1", L.url)
    try:
        L.wait_ready()
        jid = start_long_rollout(L)
        assert L.delete("/v1/jobs/" + jid).status_code in (200, 202)
        assert L.wait_job(jid)["status"] == "cancelled"
        wait_for(lambda: '"part_cancelled"' in F.stderr(), "the follower to drop its part")
        small = rollout(3, 4, 5)
        j = L.wait_job(L.submit("/v1/rollouts", small))
        assert j["status"] == "done", j
        assert len(re.findall(r'"part_done".*"code":"ok"', F.stderr())) >= 1, F.stderr()[-3000:]
        assert L.stop() == 0
    finally:
        F.stop()
        if F.proc.poll() is None:
            F.kill9()


def test_join_auth(make_daemon, tmp_path):
    """The cluster routes are authenticated like every /v1 route: a follower with the wrong key
    never joins; with the key it does."""
    key = tmp_path / "key"
    key.write_text("s3cret-key-123\n")
    bad = tmp_path / "bad"
    bad.write_text("wrong-key-4567\n")
    L = leader(make_daemon, tmp_path / "leader", "--api-key-file", str(key))
    assert L.post("/v1/cluster/join", {"ranks": 1, "backend": "cpu"}).status_code == 401
    F = follower(tmp_path, "fbad", L.url, "--api-key-file", str(bad))
    try:
        wait_for(lambda: '"status":401' in F.stderr(), "the follower's 401")
        code, text = readyz(L)
        assert code == 503 and "waiting for 1 of 1" in text, text
        F.stop()
        F = follower(tmp_path, "fgood", L.url, "--api-key-file", str(key))
        L.wait_ready()
        assert L.stop() == 0
    finally:
        if F.proc.poll() is None:
            F.stop()


def test_join_flag_checks(tmp_path):
    def serve(*flags):
        return subprocess.run([GRPOD, "serve", "--data-dir", str(tmp_path / "x"), *flags],
                              capture_output=True, text=True, timeout=30)
    r = serve("--backend", "cpu", "--followers", "1", "--join", "http://127.0.0.1:1")
    assert r.returncode == 2 and "--join and --followers" in r.stderr, r.stderr
    r = serve("--backend", "cpu", "--join", "127.0.0.1:1")
    assert r.returncode == 2 and "expected http://HOST:PORT" in r.stderr, r.stderr
    r = serve("--followers", "1")
    assert r.returncode == 2 and "--followers needs --backend cpu" in r.stderr, r.stderr
    r = serve("--join", "http://127.0.0.1:1")
    assert r.returncode == 2 and "--join needs --backend cpu" in r.stderr, r.stderr
    r = serve("--backend", "cpu", "--followers", "1", "--listen", "0.0.0.0:0", "--insecure-no-auth")
    assert r.returncode == 2 and "pass --cluster-host" in r.stderr, r.stderr
    r = serve("--backend", "cpu", "--followers", "1", "--lora-rank", "4")
    assert r.returncode == 2 and "LoRA trains on one rank only" in r.stderr, r.stderr


@pytest.mark.skipif(not os.path.exists(HOOKS), reason="build/grpod-test-hooks is not built")
def test_stream_from_follower(make_daemon, tmp_path):
    """A streamed completion whose groups are placed on both ranks: the follower's share streams
    too — once the reply taps the job the leader asks the follower (in `next`) to post its part's
    tokens as it samples them, and the reply hands them out as rank 0's — and the chunks add up to
    the non-streamed reply (same seed), the logprobs' top_logprobs included (the follower posts each
    token's alternatives with it). Ordered, not timed: the follower (build/grpod-test-hooks) holds
    once it posted 4 tokens (GRPOD_TEST_HOLD_AT=follower_stream_tokens) until the client has them,
    so its share (group 1, placed on rank 1) comes in at least two chunks whatever the machine's
    speed. (Rank 0's own share streams as test_openai_stream checks.)"""
    go = tmp_path / "go"
    L = leader(make_daemon, tmp_path / "leader")
    F = Daemon(str(tmp_path / "f1"), ["--engine-threads", "1", "--join", L.url],
               env={"GRPOD_TEST_HOLD_AT": "follower_stream_tokens", "GRPOD_TEST_HOLD_FILE": str(go)})
    F.binary = HOOKS
    F.start(wait_ready=False)
    try:
        L.wait_ready()
        body = {"prompt": ["Once upon a time", "The weather"], "max_tokens": 400, "ignore_eos": True, "seed": 3,
                "temperature": 1.0, "logprobs": 3}
        whole = L.post("/v1/completions", body)    # not streamed: the follower posts no progress, no hold
        assert whole.status_code == 200, whole.text
        r = requests.post(L.url + "/v1/completions", json=dict(body, stream=True), stream=True, timeout=120)
        pieces, tops = {0: [], 1: []}, {0: [], 1: []}
        held = 0
        for line in r.iter_lines():
            if line.startswith(b"data: {"):
                for ch in json.loads(line[6:])["choices"]:
                    if ch["text"]:
                        pieces[ch["index"]].append(ch["text"])
                        tops[ch["index"]] += ch["logprobs"]["top_logprobs"]
            if pieces[1] and not go.exists():   # the follower's first post came while it is held
                held = len(pieces[1])
                go.touch()
        assert [c["text"] for c in whole.json()["choices"]] == ["".join(pieces[0]), "".join(pieces[1])]
        # the non-streamed reply's alternatives come from a logprobs job over the prompt and the
        # completion; the stream's from the follower's sampler, as it sampled. Bit-equal when the
        # leader is the default build (cc, as the hooks build); under make sanitize the leader is
        # the sanitizer's build (clang), whose fp32 sums round apart: the same tokens, values to 1e-5
        want = [c["logprobs"]["top_logprobs"] for c in whole.json()["choices"]]
        if "GRPOD_BIN" not in os.environ:
            assert want == [tops[0], tops[1]]
        else:
            got = [tops[0], tops[1]]
            assert [[list(t) for t in c] for c in want] == [[list(t) for t in c] for c in got]
            assert max(abs(a[k] - b[k]) for cw, cg in zip(want, got) for a, b in zip(cw, cg) for k in a) <= 1e-5
        assert len(re.findall(r'"part_done".*"code":"ok"', F.stderr())) >= 2, F.stderr()[-3000:]  # one share each
        assert '"test_hold"' in F.stderr(), F.stderr()[-3000:]                  # the follower held its share
        assert held >= 1 and len(pieces[1]) > held, {k: len(v) for k, v in pieces.items()}  # text after the hold too
        assert L.stop() == 0
    finally:
        F.stop()
        if F.proc.poll() is None:
            F.kill9()
