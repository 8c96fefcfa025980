# test_learns.py — "it learns": examples/train_toy.py, run as a user runs it against a fresh
# daemon (temp data dir, the embedded tiny model with random weights, CPU backend), must lift the
# mean reward clearly. Short versions of the README run (docs/train_toy.md, 300 steps): its first
# 100 steps of the 26-letter task through the exact verifier + rollout_job_id (~15 s on 2
# cores), and 40 steps of a 4-letter task with rewards scored by the client and sent back as
# groups (~5 s).
import csv
import os
import re
import subprocess
import sys
import time

import requests

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "train_toy.py")


def run_toy(daemon, out, *args):
    r = subprocess.run([sys.executable, EXAMPLE, "--url", daemon.url, "--out", str(out), *args],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, "train_toy.py failed:\n%s\n%s\n%s" % (r.stdout[-4000:], r.stderr[-4000:],
                                                                   daemon.stderr()[-4000:])
    with open(os.path.join(str(out), "train_toy.csv")) as f:
        rows = list(csv.DictReader(f))
    rewards = [float(row["mean_reward"]) for row in rows]
    m = re.search(r"^final mean reward (\d\.\d{3})$", r.stdout, re.M)
    assert m, r.stdout[-2000:]
    return r.stdout, rows, rewards, float(m.group(1))


def check_rise(rewards, steps, margin=0.3):
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print("mean reward: first 5 steps %.3f, last 5 steps %.3f (rise %.3f, need %.2f)"
          % (first, last, last - first, margin))
    assert len(rewards) == steps
    assert first < 0.15, "a random policy should rarely answer right: %.3f" % first
    assert last >= first + margin, "no clear rise: %.3f -> %.3f" % (first, last)


def test_learns_repeat_letter_verifier(make_daemon, tmp_path):
    d = make_daemon()
    out = tmp_path / "out"
    stdout, rows, rewards, final = run_toy(d, out, "--steps", "100")
    print(stdout.splitlines()[0])
    print("\n".join(stdout.splitlines()[-3:]))
    check_rise(rewards, 100)
    assert abs(final - sum(rewards[-10:]) / 10) < 1e-3, (final, rewards[-10:])
    # one line per step with the columns the README promises
    assert len(re.findall(r"^step +\d+  mean reward \d\.\d{3}  kl .*tokens packed \d+ / standard \d+", stdout, re.M)) == 100
    # the policy moved once per step and packing shared each prompt across its group
    assert int(rows[-1]["policy_version"]) == 100
    assert all(int(r["tokens_packed"]) < int(r["tokens_standard"]) for r in rows)
    svg = (out / "train_toy_curve.svg").read_text()
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>") and svg.count("<polyline") == 2
    assert d.stop() == 0


def test_learns_client_rewards(make_daemon, tmp_path):
    d = make_daemon()
    stdout, rows, rewards, final = run_toy(d, tmp_path / "out", "--steps", "40", "--letters", "abcd",
                                           "--rewards", "client")
    print("\n".join(stdout.splitlines()[-2:]))
    check_rise(rewards, 40)
    assert d.stop() == 0


def test_learns_with_lora(make_daemon, tmp_path):
    """grpod serve --lora-rank 8: adapters over the frozen base learn the task (at temperature
    0.2: the frozen tied head caps p(answer) near 5 % at temperature 1, train_toy.py says why);
    /v1/model reports the adapter and a checkpoint is a PEFT adapter."""
    d = make_daemon(args=["--lora-rank", "8"])
    lora = d.get("/v1/model").json()["lora"]
    assert lora["r"] == 8 and lora["lora_alpha"] == 16 and len(lora["target_modules"]) == 7, lora
    stdout, rows, rewards, final = run_toy(d, tmp_path / "out", "--steps", "40", "--temperature", "0.2")
    print("\n".join(stdout.splitlines()[-2:]))
    first, last = sum(rewards[:3]) / 3, sum(rewards[-5:]) / 5
    print("mean reward: first 3 steps %.3f, last 5 steps %.3f" % (first, last))
    assert last >= 0.7 and last >= first + 0.3, (first, last)
    ck = d.wait_job(d.submit("/v1/checkpoints", {}))
    assert ck["status"] == "done", ck
    path = ck["result"]["path"]
    assert os.path.exists(os.path.join(path, "adapter_model.safetensors"))
    assert os.path.exists(os.path.join(path, "adapter_config.json"))
    merged = d.wait_job(d.submit("/v1/checkpoints", {"merged": True}))
    assert merged["status"] == "done" and merged["result"]["path"].endswith("-merged"), merged
    assert os.path.exists(os.path.join(merged["result"]["path"], "model.safetensors"))
    assert d.stop() == 0


def test_lora_bad_settings(make_daemon, tmp_path):
    """A bad --lora-targets is a one-line start-up error naming the flag; a --lora-init that is not
    a PEFT adapter leaves the daemon up, not ready, saying why on /readyz."""
    d = make_daemon(args=["--lora-rank", "8", "--lora-targets", "q,lm_head"], start=False)
    d.start(wait_ready=False)
    assert d.proc.wait(30) != 0
    err = d.stderr()
    assert "--lora-targets" in err and "lm_head" in err, err
    d = make_daemon(data_dir=tmp_path / "data2", args=["--lora-init", str(tmp_path / "nope")], start=False)
    d.start(wait_ready=False)
    end, r = time.time() + 60, None
    while time.time() < end:
        try:
            r = requests.get(d.url + "/readyz", timeout=2)
            if r.status_code == 503 and "nope" in r.text:
                break
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    assert r is not None and r.status_code == 503 and "adapter_config.json" in r.text, r and r.text
    assert d.get("/healthz").status_code == 200
    assert d.stop() == 0


AGENT = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "agent_lookup.py")


def test_agent_learns_to_read_the_tool(make_daemon):
    """examples/agent_lookup.py, two turns a trajectory: turn 2's prompts come from the prefix cache
    (ids copied, not prefilled), the update masks the tool's ids, and the policy learns to repeat
    the tool's letter — past the 1/4 that ignoring the tool can reach with 4 letters."""
    d = make_daemon()
    r = subprocess.run([sys.executable, AGENT, "--url", d.url, "--steps", "50", "--decay-steps", "50",
                        "--letters", "abcd", "--batch", "8", "--lr", "3e-3"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, "agent_lookup.py failed:\n%s\n%s\n%s" % (r.stdout[-4000:], r.stderr[-4000:], d.stderr()[-4000:])
    print("\n".join(r.stdout.splitlines()[-3:]))
    cached = int(re.search(r"^prompt ids copied from the prefix cache in turn 2: (\d+)$", r.stdout, re.M).group(1))
    first = float(re.search(r"^first mean reward (\d\.\d{3})$", r.stdout, re.M).group(1))
    final = float(re.search(r"^final mean reward (\d\.\d{3})$", r.stdout, re.M).group(1))
    assert cached == 50 * 8 * 16 * 9, cached     # every turn-2 prompt: its 9 prompt ids from turn 1
    assert first < 0.15 and final >= 0.6, (first, final)
    assert d.stop() == 0
