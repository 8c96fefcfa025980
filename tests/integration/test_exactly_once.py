# test_exactly_once.py — a completed update is never lost or applied twice, and a failed one
# changes nothing (docs/api.md "Crashes and replay"): replay after kill -9, a corrupt newest
# checkpoint, a diverging run, a failed done-write, a full disk (a checkpoint on it, a start on
# it), one daemon per data dir and port, the database deleted under the daemon, the inputs of
# checkpointed updates dropped.
import json
import os
import resource
import shutil
import signal
import socket
import sqlite3
import subprocess
import time

import pytest

from conftest import GRPOD, ROOT, free_port

PROBE = {"groups": [{"prompt_ids": [5, 6, 7, 8], "responses": [{"token_ids": [9, 10, 11, 12, 13]},
                                                               {"token_ids": [40, 41, 42]}]},
                    {"prompt_ids": [100, 101], "responses": [{"token_ids": [102, 103, 104, 105]}]}]}


def update_body(i, lr=1e-2, **opt):
    return {"groups": [{"prompt_ids": [1 + i, 2, 3], "responses": [{"token_ids": [4, 5 + i, 6], "reward": 1.0},
                                                                  {"token_ids": [7, 8], "reward": 0.0},
                                                                  {"token_ids": [9 + i], "reward": 0.5}]},
                       {"prompt_ids": [20, 21 + i], "responses": [{"token_ids": [22, 23], "reward": 0.0},
                                                                 {"token_ids": [24], "reward": 1.0}]}],
            "algorithm": {"ppo_mini_batch_size": 1}, "optimizer": dict({"lr": lr}, **opt)}


def probe(d):
    r = d.post("/v1/logprobs", PROBE)
    assert r.status_code == 200, r.text
    j = r.json()
    return j["policy_version"], [x["logprobs"] for g in j["groups"] for x in g["responses"]]


def events(d):
    return [json.loads(line) for line in d.stderr().splitlines() if line.startswith("{")]


def run_updates(d, n, start=0):
    for i in range(start, start + n):
        j = d.wait_job(d.submit("/v1/updates", update_body(i)))
        assert j["status"] == "done", j
        assert j["result"]["policy_version_after"] == j["result"]["policy_version_before"] + 1


def test_replay_after_kill9_is_bit_equal(make_daemon, tmp_path):
    """Updates after the newest checkpoint are re-applied at start: same version, same logprobs."""
    data = tmp_path / "data"
    d = make_daemon(data)
    run_updates(d, 2)
    assert d.wait_job(d.submit("/v1/checkpoints", {}))["status"] == "done"
    run_updates(d, 3, start=2)
    want = probe(d)
    assert want[0] == 5
    d.kill9()
    d2 = make_daemon(data)
    assert probe(d2) == want
    ev = events(d2)
    assert any(e["event"] == "replay_done" and e["updates"] == 3 for e in ev), [e["event"] for e in ev]
    m = d2.get("/metrics").text
    assert "grpod_replay_updates_done 3" in m and "grpod_replay_updates_total 3" in m
    # versions are one per update, never shared
    jobs = d2.get("/v1/jobs?kind=update").json()["jobs"]
    assert sorted(j["policy_version"] for j in jobs) == [1, 2, 3, 4, 5]
    # and a further update continues from the replayed state exactly like an uninterrupted run
    run_updates(d2, 1, start=5)
    after_restart = probe(d2)
    ref = make_daemon(tmp_path / "ref")
    run_updates(ref, 6)
    assert probe(ref) == after_restart


def test_corrupt_newest_checkpoint_falls_back(make_daemon, tmp_path):
    data = tmp_path / "data"
    d = make_daemon(data)
    run_updates(d, 1)
    assert d.wait_job(d.submit("/v1/checkpoints", {}))["status"] == "done"
    run_updates(d, 1, start=1)
    c = d.wait_job(d.submit("/v1/checkpoints", {}))
    want = probe(d)
    d.kill9()
    newest = c["result"]["path"]
    with open(os.path.join(newest, "model.safetensors"), "r+b") as f:
        f.seek(-64, os.SEEK_END)
        f.write(b"\x7f" * 16)
    open(os.path.join(newest, "grpod_state.json"), "w").close()     # and an empty state file
    os.makedirs(os.path.join(data, "checkpoints", "ckpt-9-leftover.tmp"))
    open(os.path.join(data, "checkpoints", "ckpt-9-leftover.tmp", "model.safetensors"), "wb").write(b"x" * 1000)
    d2 = make_daemon(data)
    assert probe(d2) == want
    ev = events(d2)
    assert any(e["event"] == "checkpoint_skipped" and e["path"] == newest for e in ev)
    assert any(e["event"] == "replay_done" and e["updates"] == 1 for e in ev)
    assert not os.path.exists(os.path.join(data, "checkpoints", "ckpt-9-leftover.tmp"))


def test_diverging_run_fails_cleanly(make_daemon, tmp_path):
    """lr 1, weight_decay 10 grows the weights 9x per step: the step that overflows fails the
    job (non_finite) and the policy stays the last good one."""
    d = make_daemon(tmp_path / "data")
    last = None
    failed = None
    for i in range(80):
        j = d.wait_job(d.submit("/v1/updates", update_body(i % 5, lr=1.0, weight_decay=10.0, grad_clip=0)))
        if j["status"] == "failed":
            failed = j
            break
        last = j["result"]["policy_version_after"]
    assert failed, "the diverging run never failed"
    assert failed["error"]["code"] == "non_finite", failed["error"]
    v, lp = probe(d)
    assert v == last
    # nothing moves on a second failing update either, and the daemon still serves
    j = d.wait_job(d.submit("/v1/updates", update_body(1, lr=1.0, weight_decay=10.0, grad_clip=0)))
    assert j["status"] == "failed" and j["error"]["code"] == "non_finite"
    assert probe(d) == (v, lp)
    assert d.get("/readyz").status_code == 200
    # a failed job can be queued again through the API (a done one cannot)
    r = d.post("/v1/jobs/%s/requeue" % j["id"], {})
    assert r.status_code == 200 and r.json()["status"] == "queued", r.text
    assert d.wait_job(j["id"])["error"]["code"] == "non_finite"
    assert d.post("/v1/jobs/%s/requeue" % failed["id"].replace("j_", "j_f"), {}).status_code == 404


def test_one_daemon_per_data_dir_and_port(make_daemon, tmp_path):
    d = make_daemon(tmp_path / "data")
    # same data dir, another port
    r = subprocess.run([GRPOD, "serve", "--data-dir", str(tmp_path / "data"), "--listen", "127.0.0.1:%d" % free_port(),
                        "--backend", "cpu"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode != 0 and "in use by another grpod" in r.stderr, r.stderr
    # same port, another data dir
    r = subprocess.run([GRPOD, "serve", "--data-dir", str(tmp_path / "other"), "--listen", "127.0.0.1:%d" % d.port,
                        "--backend", "cpu"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode != 0 and "address is in use" in r.stderr, r.stderr
    assert d.get("/readyz").status_code == 200
    assert oct(os.stat(tmp_path / "data" / "grpod.db").st_mode & 0o777) == "0o600"
    assert oct(os.stat(tmp_path / "data").st_mode & 0o777) == "0o700"


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_database_deleted_while_running(make_daemon, tmp_path, how):
    """The file moved away (new connections would make a fresh database), or another file put
    at its path (a copy: another inode, the same bytes): either way 503, nothing acknowledged."""
    data = tmp_path / "data"
    d = make_daemon(data)
    run_updates(d, 1)
    if how == "deleted":
        os.rename(data / "grpod.db", tmp_path / "moved.db")
    else:
        shutil.copyfile(data / "grpod.db", tmp_path / "copy.db")
        os.rename(tmp_path / "copy.db", data / "grpod.db")
    end = time.time() + 30
    while d.get("/readyz").status_code == 200 and time.time() < end:
        time.sleep(0.1)
    r = d.get("/readyz")
    assert r.status_code == 503 and "grpod.db" in r.text, r.text
    if how == "replaced":
        assert "replaced" in r.text, r.text
    r = d.post("/v1/updates", update_body(1))
    assert r.status_code == 503, r.text     # never acknowledged into a file nobody reads


def test_failed_done_write_applies_once(make_daemon, tmp_path):
    """The done-write of an update fails (another connection holds the write lock past the busy
    timeout): the update is taken back, the job requeued or the daemon halts; after the lock
    goes, the job ends done exactly once: version 0 -> 1, not 2."""
    data = tmp_path / "data"
    d = make_daemon(data)
    big = {"groups": [{"prompt_ids": list(range(1, 40)), "responses": [
        {"token_ids": list(range(50 + k, 250 + k)), "reward": float(k % 2)} for k in range(8)]}],
        "optimizer": {"lr": 1e-3}}
    jid = d.submit("/v1/updates", big)
    end = time.time() + 30
    while d.get("/v1/jobs/" + jid).json()["status"] == "queued" and time.time() < end:
        time.sleep(0.01)
    db = sqlite3.connect(str(data / "grpod.db"), timeout=30, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    end = time.time() + 120
    while time.time() < end and not any(e["event"] in ("update_taken_back",) for e in events(d)):
        time.sleep(0.2)
    time.sleep(0.5)
    db.execute("ROLLBACK")
    db.close()
    assert any(e["event"] == "update_taken_back" for e in events(d)), [e["event"] for e in events(d)][-10:]
    if d.get("/readyz").status_code != 200:     # halted: recover by restarting
        d.kill9()
        d = make_daemon(data)
    j = d.wait_job(jid)
    assert j["status"] == "done" and j["result"]["policy_version_after"] == 1, j
    assert d.get("/v1/model").json()["policy_version"] == 1


def test_checkpoint_on_full_disk_fails_cleanly(make_daemon, tmp_path):
    """A file-size limit stands in for a full disk: the checkpoint job fails, its temporary
    directory is gone, the daemon serves on, and restarts."""
    data = tmp_path / "data"
    d = make_daemon(data)
    run_updates(d, 1)
    want = probe(d)
    assert d.stop() == 0
    limit = 256 * 1024      # above the database, below the tiny model's safetensors

    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    size = os.path.getsize(next(os.path.join(r, f) for r, _, fs in os.walk(data / "default-model") for f in fs
                                if f.endswith(".safetensors")))
    assert size > limit
    d2 = make_daemon(data, args=["--checkpoint-on-exit=false"], start=False)
    d2.start(wait_ready=False, preexec_fn=small_disk)
    d2.wait_ready()
    j = d2.wait_job(d2.submit("/v1/checkpoints", {}))
    assert j["status"] == "failed" and j["error"]["code"] == "io_error", j
    assert [p for p in os.listdir(data / "checkpoints") if p.endswith(".tmp")] == []
    assert d2.get("/v1/checkpoints").json()["checkpoints"] == [c for c in d2.get("/v1/checkpoints").json()["checkpoints"]
                                                            if os.path.isdir(c["path"])]
    assert probe(d2) == want
    assert d2.stop() == 0
    d3 = make_daemon(data)
    assert probe(d3) == want


def test_checkpoints_managed(make_daemon, tmp_path):
    """--keep-checkpoints, DELETE /v1/checkpoints/{id}, no exit checkpoint for a saved version."""
    data = tmp_path / "data"
    d = make_daemon(data, args=["--keep-checkpoints", "2"])
    paths = []
    for i in range(3):
        run_updates(d, 1, start=i)
        paths.append(d.wait_job(d.submit("/v1/checkpoints", {}))["result"]["path"])
    cks = d.get("/v1/checkpoints").json()["checkpoints"]
    assert [c["path"] for c in cks] == paths[:0:-1] and not os.path.exists(paths[0])
    r = d.delete("/v1/checkpoints/%s" % cks[1]["id"])
    assert r.status_code == 200, r.text
    assert not os.path.exists(paths[1]) and len(d.get("/v1/checkpoints").json()["checkpoints"]) == 1
    assert d.delete("/v1/checkpoints/nope").status_code == 404
    done = d.get("/v1/jobs/%s" % d.submit("/v1/checkpoints", {})).json()
    assert d.post("/v1/jobs/%s/requeue" % done["id"], {}).status_code in (409, 200)   # 409 once done
    d.wait_job(done["id"])
    assert d.post("/v1/jobs/%s/requeue" % done["id"], {}).status_code == 409
    assert d.stop() == 0
    assert not any(e["event"] == "checkpoint_saved" and "exit" in e["id"] for e in events(d)), "redundant exit checkpoint"


def update_payloads(data):
    db = sqlite3.connect("file:%s?mode=ro" % (data / "grpod.db"), uri=True, timeout=30)
    try:
        return {v: p for v, p in db.execute("SELECT policy_version, payload FROM jobs WHERE kind = 'update'")}
    finally:
        db.close()


def test_inputs_dropped_once_two_checkpoints_cover_them(make_daemon, tmp_path):
    """An update's stored inputs go when two checkpoints cover it (replay from the newest, or the
    one before when the newest is damaged, never reads them); its result stays."""
    data = tmp_path / "data"
    d = make_daemon(data)
    run_updates(d, 2)
    assert d.wait_job(d.submit("/v1/checkpoints", {}))["status"] == "done"
    run_updates(d, 2, start=2)
    c = d.wait_job(d.submit("/v1/checkpoints", {}))
    run_updates(d, 1, start=4)
    want = probe(d)
    p = update_payloads(data)
    assert sorted(p) == [1, 2, 3, 4, 5]
    assert p[1] == p[2] == "{}" and all(len(p[v]) > 100 for v in (3, 4, 5)), p
    assert any(e["event"] == "inputs_pruned" and e["updates"] == 2 and e["up_to_version"] == 2 for e in events(d))
    for j in d.get("/v1/jobs?kind=update").json()["jobs"]:
        full = d.get("/v1/jobs/%s" % j["id"]).json()
        assert full["result"]["policy_version_after"] == full["policy_version"], full
    # the newest checkpoint damaged: the one before it plus the kept inputs replay exactly
    d.kill9()
    with open(os.path.join(c["result"]["path"], "model.safetensors"), "r+b") as f:
        f.seek(-64, os.SEEK_END)
        f.write(b"\x7f" * 16)
    d2 = make_daemon(data)
    assert probe(d2) == want
    assert any(e["event"] == "replay_done" and e["updates"] == 3 for e in events(d2))


def test_start_on_a_full_disk(make_daemon, tmp_path):
    """A disk that filled while grpod was down: the start frees the reserve and serves; a
    checkpoint fails cleanly. A tmpfs in a user and mount namespace stands in for the disk."""
    if subprocess.run(["unshare", "-rm", "true"], stderr=subprocess.DEVNULL).returncode != 0:
        pytest.skip("no user and mount namespaces here (unshare -rm)")
    src = tmp_path / "src"
    src.mkdir()
    d = make_daemon(src / "data")
    run_updates(d, 1)
    want = probe(d)
    assert d.stop() == 0
    assert os.path.getsize(src / "data" / "grpod.reserve") == 1 << 20
    mnt = tmp_path / "full"
    mnt.mkdir()
    # room for the data directory and 64 KiB; then a filler takes the rest
    size_kib = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(src) for f in fs) // 1024 + 512
    script = ('mount -t tmpfs -o size=%dk tmpfs "$0" && cp -a "%s"/. "$0"/ && '
              '{ dd if=/dev/zero of="$0/filler" bs=4k 2>/dev/null; true; } && exec "$@"' % (size_kib, src))
    full = make_daemon(mnt / "data", args=["--checkpoint-on-exit=false"], start=False)
    full.wrap = ["unshare", "-rm", "sh", "-c", script, str(mnt)]
    full.start()
    ev = events(full)
    assert any(e["event"] == "disk_reserve_released" for e in ev), [e["event"] for e in ev]
    assert probe(full) == want
    j = full.wait_job(full.submit("/v1/checkpoints", {}))
    assert j["status"] == "failed" and j["error"]["code"] == "io_error", j
    assert probe(full) == want
    assert full.stop() == 0, full.stderr()[-4000:]


def test_replay_with_lora(make_daemon, tmp_path):
    """With LoRA the checkpoint is the adapter (PEFT layout) plus its optimizer state; replay
    after kill -9 lands on the same adapter bits."""
    data = tmp_path / "data"
    d = make_daemon(data, args=["--lora-rank", "4"])
    run_updates(d, 1)
    assert d.wait_job(d.submit("/v1/checkpoints", {}))["status"] == "done"
    run_updates(d, 2, start=1)
    want = probe(d)
    d.kill9()
    d2 = make_daemon(data, args=["--lora-rank", "4"])
    assert probe(d2) == want
    assert any(e["event"] == "replay_done" and e["updates"] == 2 for e in events(d2))


HOOKS = os.path.join(ROOT, "build", "grpod-test-hooks")


@pytest.mark.skipif(not os.path.exists(HOOKS), reason="build/grpod-test-hooks is not built")
def test_checkpoint_written_beside_rollouts(make_daemon, tmp_path):
    """A checkpoint's files are written after its state is captured, beside the jobs behind it:
    with the writer held (a test hook), a rollout behind the checkpoint runs to its end and an
    update waits; released, the checkpoint holds the version it captured and the update applies
    after it. A restart resumes from that checkpoint bit-equal."""
    gate = tmp_path / "gate"
    data = tmp_path / "data"
    d = make_daemon(data, env={"GRPOD_TEST_HOLD_AT": "checkpoint_write", "GRPOD_TEST_HOLD_FILE": str(gate)}, start=False)
    d.binary = HOOKS
    d.start()
    run_updates(d, 1)
    want = probe(d)
    ck = d.submit("/v1/checkpoints", {})
    ro = d.submit("/v1/rollouts", {"groups": [{"prompt_ids": [5, 6, 7], "n": 3}], "sampling": {"max_tokens": 6, "seed": 3}})
    assert d.wait_job(ro)["status"] == "done"
    assert d.get("/v1/jobs/%s" % ck).json()["status"] == "running"
    assert probe(d) == want                       # logprobs run beside the write too
    up = d.submit("/v1/updates", update_body(1))  # held (and what comes behind it) until the write ends
    assert d.get("/v1/jobs/%s" % up).json()["status"] in ("queued", "running")
    gate.write_text("go")
    c, u = d.wait_job(ck), d.wait_job(up)
    assert c["status"] == "done" and c["result"]["policy_version"] == 1, c
    assert u["status"] == "done" and u["result"]["policy_version_before"] == 1, u
    assert u["started_at"] >= c["finished_at"]
    assert d.stop() == 0
    shutil.rmtree(os.path.join(str(data), "checkpoints", [e for e in os.listdir(os.path.join(str(data), "checkpoints"))
                                                         if "exit" in e][0]))
    d2 = make_daemon(data)
    assert probe(d2)[0] == 2
    assert d2.stop() == 0
