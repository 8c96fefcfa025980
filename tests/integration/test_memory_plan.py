# test_memory_plan.py — the engine's memory plan as the API shows it (GET /v1/model memory_plan,
# engine/plan.c), the micro-batch default it sets, and the start-up check of what checkpoints
# need on the data directory's disk (daemon/worker.c disk_plan).
import os
import subprocess
import time

import pytest
import requests

from conftest import GRPOD

KEYS = {"device_total_bytes", "weights_bytes", "reference_bytes", "master_bytes", "gradients_bytes", "moments_bytes",
        "snapshot_bytes", "host_state_bytes", "headroom_bytes", "kv_budget_bytes", "activations_bytes",
        "max_tokens_per_micro_batch", "max_tokens_per_micro_batch_limit", "optimizer", "snapshot"}


def test_model_shows_the_memory_plan(make_daemon):
    d = make_daemon()
    m = d.get("/v1/model").json()
    p = m["memory_plan"]
    assert set(p) == KEYS
    # the cpu backend: the state in host memory, its safety copy in host memory, no device budgets
    assert p["optimizer"] == "device" and p["snapshot"] == "host"
    n = m["n_params"]
    assert p["weights_bytes"] == 4 * n and p["reference_bytes"] == 4 * n and p["gradients_bytes"] == 4 * n
    assert p["moments_bytes"] == 8 * n and p["master_bytes"] == 0      # the fp32 weights are the master
    assert p["snapshot_bytes"] == 12 * n
    assert p["device_total_bytes"] == 0 and p["kv_budget_bytes"] == 0 and p["max_tokens_per_micro_batch_limit"] == 0
    assert p["max_tokens_per_micro_batch"] == 32768
    # an update without max_tokens_per_micro_batch runs with the plan's default
    jid = d.submit("/v1/updates", {"groups": [{"prompt_ids": [5, 6, 7],
                                               "responses": [{"token_ids": [8, 9], "reward": 1.0},
                                                             {"token_ids": [10, 11, 12], "reward": 0.0}]}]})
    j = d.wait_job(jid)
    assert j["status"] == "done", j
    # on the cpu the plan sets no limit (a device's is a 413 naming the field): the field's own
    # range applies
    r = d.post("/v1/updates", {"max_tokens_per_micro_batch": 1 << 25, "groups": [
        {"prompt_ids": [5], "responses": [{"token_ids": [8], "reward": 1.0}, {"token_ids": [9], "reward": 0.0}]}]})
    assert r.status_code == 400 and r.json()["error"]["field"] == "max_tokens_per_micro_batch", r.text
    d.stop()


def test_exit_checkpoint_that_cannot_fit_is_refused_at_start(make_daemon, tmp_path):
    model_home = tmp_path / "home"
    r = subprocess.run([GRPOD, "info", "--data-dir", str(model_home)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    small = tmp_path / "small"
    small.mkdir()
    # a 1 MiB file system: the embedded model's checkpoint (~10 MB) cannot fit; needs mount rights
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], capture_output=True, text=True)
    if m.returncode != 0:
        pytest.skip("cannot mount a small tmpfs here: %s" % m.stderr.strip())
    try:
        args = ["--model", str(model_home / "default-model")]
        d = make_daemon(data_dir=small / "data", args=args, start=False).start(wait_ready=False)
        msg = ""
        end = time.time() + 60
        while time.time() < end:
            assert d.proc.poll() is None, d.stderr()
            try:
                r = requests.get(d.url + "/readyz", timeout=2)
                msg = r.text
                if "checkpoint-on-exit" in msg:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.05)
        assert r.status_code == 503 and "--checkpoint-on-exit=false" in msg and "MiB" in msg, msg
        assert d.get("/healthz").status_code == 200      # the daemon stays up and says why
        d.stop()
        # told not to checkpoint at exit, the same disk serves
        d2 = make_daemon(data_dir=small / "data", args=args + ["--checkpoint-on-exit=false"])
        assert d2.get("/v1/model").status_code == 200
        d2.stop()
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)


def test_split_optimizer_state_shows_in_the_plan(make_daemon, tmp_path):
    # --optimizer-offload 0.25: the last quarter of the fp32 master and AdamW moments in host
    # memory, the rest in the backend's (engine/train/state.h's split); a split has no safety copy
    d = make_daemon(args=["--optimizer-offload", "0.25"])
    m = d.get("/v1/model").json()
    p, n = m["memory_plan"], m["n_params"]
    h = int(0.25 * n + 0.5)
    assert p["optimizer"] == "split" and p["host_state_bytes"] == 12 * h, p
    assert p["master_bytes"] == 4 * (n - h) and p["moments_bytes"] == 8 * (n - h) and p["snapshot"] == "none", p
    jid = d.submit("/v1/updates", {"groups": [{"prompt_ids": [5, 6, 7],
                                               "responses": [{"token_ids": [8, 9], "reward": 1.0},
                                                             {"token_ids": [10, 11, 12], "reward": 0.0}]}]})
    assert d.wait_job(jid)["status"] == "done"
    d.stop()
    # a bad fraction: refused at start, naming the flag
    for bad in ("1.5", "-0.1", "half"):
        r = subprocess.run([GRPOD, "serve", "--optimizer-offload", bad, "--data-dir", str(tmp_path / "bad")],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "--optimizer-offload" in r.stderr, (bad, r.returncode, r.stderr)


def test_bf16_moments_show_in_the_plan(make_daemon, tmp_path):
    # --optimizer-moments bf16: the optimizer in host memory (auto means on) at 8 bytes a
    # parameter (fp32 master, bf16 m and v); an update runs on it, and a bad value or a state
    # kept on the device is refused at start, naming the flag
    d = make_daemon(args=["--optimizer-moments", "bf16"])
    m = d.get("/v1/model").json()
    p, n = m["memory_plan"], m["n_params"]
    assert p["optimizer"] == "host" and p["host_state_bytes"] == 8 * n, p
    jid = d.submit("/v1/updates", {"groups": [{"prompt_ids": [5, 6, 7],
                                               "responses": [{"token_ids": [8, 9], "reward": 1.0},
                                                             {"token_ids": [10, 11, 12], "reward": 0.0}]}]})
    assert d.wait_job(jid)["status"] == "done"
    d.stop()
    r = subprocess.run([GRPOD, "serve", "--optimizer-moments", "fp16", "--data-dir", str(tmp_path / "bad")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "--optimizer-moments" in r.stderr, (r.returncode, r.stderr)
