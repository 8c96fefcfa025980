#!/usr/bin/env python3
"""torture.py — exactly-once updates under kill -9 (docs/api.md "Crashes and replay").

A seeded stream of jobs (rollouts with rewards, updates on them by rollout_job_id, updates with
inline groups and several mini-batch steps, checkpoints) runs twice on fresh data directories:
once without interruption (the reference), once while `kill -9` hits the daemon at random
moments — while jobs run, while checkpoints are written, while the start-up replay runs — and
it is restarted each time. Jobs are submitted between kills (never during one), so both runs
hold the same jobs in the same order. At the end both runs must agree on: the final
policy_version, every job's status (and error code), every update's policy_version_after,
every rollout's tokens, and the logprobs of a fixed probe set, compared bit for bit.
With --grpod-hooks (build/grpod-test-hooks) some starts also die at exact points through
GRPOD_TEST_KILL_AT (daemon/test_hooks.h): in a checkpoint job after its directory's rename and
before the store indexes it, and after that before its done-write; the job then runs again
and must find its own checkpoint (kept, done).

Standard library only (the GPU image has no `requests`). Prints one FIGURES line (JSON) and
exits 0 when everything agrees.

  python3 tests/integration/torture.py --grpod ./grpod --kills 20           # CI scale, CPU
  python3 tests/integration/torture.py --grpod ./grpod --grpod-hooks build/grpod-test-hooks   # + kill points
  python3 tests/integration/torture.py --grpod ./grpod --kills 200 --rounds 60
  python3 tests/integration/torture.py --grpod ./grpod --backend cuda --kills 10   # on a GPU
  python3 tests/integration/torture.py --grpod ./grpod --ranks 2 --kills 5 --rounds 3   # 2 CPU ranks
"""
import argparse
import json
import os
import random
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

PROBE = {"groups": [{"prompt_ids": [5, 6, 7, 8], "responses": [{"token_ids": [9, 10, 11, 12, 13, 14]},
                                                               {"token_ids": [40, 41, 42]}]},
                    {"prompt_ids": [100, 101, 102], "responses": [{"token_ids": [103, 104, 105, 106]}]}]}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


HOOK_POINTS = ["checkpoint_renamed", "checkpoint_indexed"]


class Daemon:
    def __init__(self, grpod, data, backend, threads, log, ranks=1, hooks=None):
        self.grpod, self.data, self.backend, self.threads, self.log = grpod, data, backend, threads, log
        self.ranks, self.hooks = ranks, hooks
        self.proc = None

    def start(self, kill_at=None):
        """kill_at: a kill point of the hooks binary (HOOK_POINTS), which then runs instead."""
        self.port = free_port()
        self.base = "http://127.0.0.1:%d" % self.port
        self.logf = open(self.log, "a")
        env = dict(os.environ)
        env.pop("NOTIFY_SOCKET", None)
        env.pop("GRPOD_TEST_KILL_AT", None)
        if kill_at:
            env["GRPOD_TEST_KILL_AT"] = kill_at
        self.proc = subprocess.Popen([self.hooks if kill_at else self.grpod, "serve", "--data-dir", self.data, "--listen", "127.0.0.1:%d" % self.port,
                                      "--backend", self.backend, "--engine-threads", str(self.threads)]
                                     + (["--ranks", str(self.ranks)] if self.ranks > 1 else []),
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.logf, env=env)
        self.log_at_start = os.path.getsize(self.log)

    def call(self, method, path, body=None, timeout=120):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def wait_ready(self, timeout):
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("grpod exited %s; see %s" % (self.proc.returncode, self.log))
            try:
                if self.call("GET", "/readyz", timeout=5)[0] == 200:
                    return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.05)
        raise RuntimeError("grpod not ready in %ds; see %s" % (timeout, self.log))

    def kill9(self):
        self.proc.kill()
        self.proc.wait(30)
        self.logf.close()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(300)
        self.logf.close()
        return rc

    def events_since_start(self):
        with open(self.log) as f:
            f.seek(self.log_at_start)
            out = []
            for line in f:
                if line.startswith("{"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        pass        # a line cut by the kill
            return out


def make_stream(seed, rounds):
    """Job specs in submission order; an update names its rollout by index ("ref")."""
    rng = random.Random(seed)
    out = []
    for r in range(rounds):
        groups = [{"prompt_ids": [rng.randrange(3, 250) for _ in range(rng.randrange(2, 9))], "n": rng.randrange(2, 5),
                   "reward": {"type": "contains", "answer": rng.choice("aeiou")}} for _ in range(rng.randrange(1, 3))]
        out.append({"kind": "rollout", "body": {"groups": groups, "sampling": {
            "max_tokens": rng.randrange(4, 24), "temperature": 1.0, "seed": rng.randrange(1 << 30)}}})
        upd = {"algorithm": {"kl_coef": rng.choice([0.0, 0.001]),
                             "old_logprobs": rng.choice(["recompute", "rollout"]),
                             "ppo_mini_batch_size": rng.choice([0, 1])},
               "optimizer": {"lr": rng.choice([3e-3, 1e-2]), "grad_clip": 1.0}}
        out.append({"kind": "update", "body": upd, "ref": len(out) - 1})
        if rng.random() < 0.4:      # inline groups with advantages, two epochs
            g = [{"prompt_ids": [rng.randrange(3, 250) for _ in range(4)],
                  "responses": [{"token_ids": [rng.randrange(3, 250) for _ in range(rng.randrange(1, 12))],
                                 "advantage": rng.uniform(-1, 1)} for _ in range(3)]} for _ in range(2)]
            out.append({"kind": "update", "body": {"groups": g, "algorithm": {"adv_estimator": "given", "ppo_epochs": 2,
                                                                             "ppo_mini_batch_size": 1},
                                                    "optimizer": {"lr": 5e-3}}})
        if rng.random() < 0.3:
            out.append({"kind": "checkpoint", "body": {}})
    return out


PATHS = {"rollout": "/v1/rollouts", "update": "/v1/updates", "checkpoint": "/v1/checkpoints"}


def submit(d, spec, ids):
    body = dict(spec["body"])
    if "ref" in spec:       # the API wants the rollout finished first
        body["rollout_job_id"] = ids[spec["ref"]]
        wait_all(d, [ids[spec["ref"]]], 600)
    code, r = d.call("POST", PATHS[spec["kind"]], body)
    if code != 202:
        raise RuntimeError("submit %s: %s %s" % (spec["kind"], code, r))
    return r["job_id"]


def job_view(j):
    """What must agree between the runs (ids, timings and paths differ)."""
    v = {"kind": j["kind"], "status": j["status"], "error": (j.get("error") or {}).get("code")}
    res = j.get("result") or {}
    if j["kind"] == "update" and j["status"] == "done":
        v["version"] = [res["policy_version_before"], res["policy_version_after"]]
        v["loss"] = res["metrics"]["loss"]
    if j["kind"] == "rollout" and j["status"] == "done":
        v["tokens"] = [x["token_ids"] for g in res["groups"] for x in g["responses"]]
        v["policy_version"] = res["policy_version"]
    if j["kind"] == "checkpoint" and j["status"] == "done":
        v["policy_version"] = res["policy_version"]
    return v


def wait_all(d, ids, timeout):
    end = time.time() + timeout
    out = {}
    for jid in ids:
        while True:
            if time.time() > end:
                raise RuntimeError("jobs not finished in %ds" % timeout)
            code, j = d.call("GET", "/v1/jobs/%s?wait=20" % jid, timeout=60)
            if code == 200 and j["status"] not in ("queued", "running"):
                out[jid] = j
                break
    return out


def final_state(d, ids, timeout):
    jobs = wait_all(d, ids, timeout)
    code, lp = d.call("POST", "/v1/logprobs", PROBE)
    assert code == 200, lp
    code, model = d.call("GET", "/v1/model")
    rollout_lp = [[x.get("logprobs") for g in jobs[i]["result"]["groups"] for x in g["responses"]]
                  for i in ids if jobs[i]["kind"] == "rollout" and jobs[i]["status"] == "done"]
    return {"policy_version": model["policy_version"], "jobs": [job_view(jobs[i]) for i in ids], "rollout_lp": rollout_lp,
            "probe": [x["logprobs"] for g in lp["groups"] for x in g["responses"]], "raw": jobs}


def reference(args, stream, work):
    d = Daemon(args.grpod, os.path.join(work, "ref"), args.backend, args.threads, os.path.join(work, "ref.log"), args.ranks)
    d.start()
    d.wait_ready(args.ready_timeout)
    ids = []
    for spec in stream:
        ids.append(submit(d, spec, ids))
    st = final_state(d, ids, args.job_timeout)
    d.stop()
    return st


def phase_of(events):
    """Where a kill landed, from the last events of the killed process."""
    names = [e.get("event") for e in events]
    if "engine_ready" not in names:
        return "replay" if "replay_start" in names else "start-up"
    running = {}
    for e in events:
        if e.get("event") == "job_start":
            running[e["id"]] = e.get("kind")
        elif e.get("event") in ("job_done", "job_failed", "job_cancelled", "job_requeued"):
            running.pop(e.get("id"), None)
    kinds = set(running.values())
    for k in ("checkpoint", "update", "rollout"):
        if k in kinds:
            return k
    return "idle"


def wait_event(d, pred, timeout):
    end = time.time() + timeout
    while time.time() < end and d.proc.poll() is None:
        if any(pred(e) for e in d.events_since_start()):
            return True
        time.sleep(0.005)
    return False


def unfinished_checkpoints(data):
    """Checkpoint jobs of the dead daemon's store still to run (queued, or running when it died)."""
    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(data, "grpod.db"), uri=True, timeout=30)
    try:
        return [r[0] for r in db.execute("SELECT id FROM jobs WHERE kind = 'checkpoint' AND status IN ('queued','running')")]
    finally:
        db.close()


def hooked_kill(d, args, stream, ids, next_ckpt, pending):
    """A start of the hooks binary that dies at its kill point in a checkpoint job: submits the
    stream up to the next checkpoint unless one is pending already. True when it died there."""
    try:
        d.wait_ready(args.ready_timeout)
        while not pending and next_ckpt is not None and len(ids) <= next_ckpt:
            ids.append(submit(d, stream[len(ids)], ids))
    except (RuntimeError, urllib.error.URLError, ConnectionError, OSError):
        pass                # it died already (a pending checkpoint ran first)
    try:
        d.proc.wait(args.job_timeout)
    except subprocess.TimeoutExpired:
        return False
    return any(e.get("event") == "test_kill" for e in d.events_since_start())


def twice_interrupted(data):
    """Unfinished jobs a kill already interrupted twice (read from the dead daemon's store): a
    third would fail them by the crash-loop guard, and run them later, out of order."""
    db = sqlite3.connect("file:%s?mode=ro" % os.path.join(data, "grpod.db"), uri=True, timeout=30)
    try:
        return [r[0] for r in db.execute("SELECT id FROM jobs WHERE status IN ('queued','running') AND attempts >= 2")]
    finally:
        db.close()


def tortured(args, stream, work, rng):
    data = os.path.join(work, "kill")
    d = Daemon(args.grpod, data, args.backend, args.threads, os.path.join(work, "kill.log"), args.ranks, args.grpod_hooks)
    ids, kills, phases, requeued, hooked = [], 0, {}, 0, 0
    t_end = time.time() + args.budget_s
    while kills < args.kills and time.time() < t_end:
        has_db = os.path.exists(os.path.join(data, "grpod.db"))
        guard = twice_interrupted(data) if has_db else []
        pending = unfinished_checkpoints(data) if has_db else []
        next_ckpt = next((k for k in range(len(ids), len(stream)) if stream[k]["kind"] == "checkpoint"), None)
        # every kill point once first, then now and then
        if (args.grpod_hooks and not guard and (pending or next_ckpt is not None)
                and (hooked < len(HOOK_POINTS) or rng.random() < 0.1)):
            point = HOOK_POINTS[hooked % len(HOOK_POINTS)]
            d.start(kill_at=point)
            died = hooked_kill(d, args, stream, ids, next_ckpt, pending)
            d.kill9()
            kills += 1
            hooked += died
            ph = "hook:" + point if died else "hook-missed"
            phases[ph] = phases.get(ph, 0) + 1
            continue
        d.start()
        mode = rng.random()
        if guard:           # let them finish first (the guard is tested in test_lifecycle / test_exactly_once)
            d.wait_ready(args.ready_timeout)
            wait_all(d, guard, args.job_timeout)
        if mode < 0.15:     # early: start-up and the replay
            time.sleep(rng.uniform(0.05, 1.5))
        elif mode < 0.3:    # during the replay, when there is one
            if wait_event(d, lambda e: e.get("event") == "replay_start", 5):
                time.sleep(rng.uniform(0.0, 0.3))
        else:
            d.wait_ready(args.ready_timeout)
            n = rng.randrange(1, 7)
            ckpt = None
            while n and len(ids) < len(stream):
                ids.append(submit(d, stream[len(ids)], ids))
                if stream[len(ids) - 1]["kind"] == "checkpoint":
                    ckpt = ids[-1]
                    break
                n -= 1
            upd = [i for i, s in zip(ids[-7:], stream[len(ids) - len(ids[-7:]):len(ids)]) if s["kind"] == "update"]
            if ckpt and mode < 0.6:     # during the checkpoint's write
                wait_event(d, lambda e: e.get("event") == "job_start" and e.get("id") == ckpt, 30)
                time.sleep(rng.uniform(0.0, 0.03))
            elif upd and mode < 0.8:    # while an update runs, or between its steps and its done-write
                wait_event(d, lambda e: e.get("event") == "job_start" and e.get("id") == upd[-1], 30)
                time.sleep(rng.uniform(0.0, 0.08))
            else:
                time.sleep(rng.uniform(0.0, args.max_gap_s))
        ev = d.events_since_start()
        d.kill9()
        kills += 1
        ph = phase_of(ev)
        phases[ph] = phases.get(ph, 0) + 1
    d.start()
    d.wait_ready(args.ready_timeout)
    while len(ids) < len(stream):
        ids.append(submit(d, stream[len(ids)], ids))
    # the crash-loop guard may have failed a job hit three times: run it again, as an operator would
    for _ in range(5):
        jobs = wait_all(d, ids, args.job_timeout)
        again = [i for i in ids if jobs[i]["status"] == "failed" and (jobs[i].get("error") or {}).get("code") == "interrupted"]
        if not again:
            break
        for i in again:
            code, r = d.call("POST", "/v1/jobs/%s/requeue" % i, {})
            assert code == 200, (code, r)
            requeued += 1
    st = final_state(d, ids, args.job_timeout)
    d.stop()
    log = open(d.log).read()
    st.update(kills=kills, phases=phases, requeued_interrupted=requeued, hooked_kills=hooked,
              ckpt_kept=log.count('"event":"checkpoint_kept"'),
              replays=log.count('"event":"replay_done"'), replay_starts=log.count('"event":"replay_start"'),
              ckpt_skipped=log.count('"event":"checkpoint_skipped"'), tmp_removed=log.count('"event":"checkpoint_temporary_removed"'))
    # applied twice / lost: every done update's version is distinct and they are 1..final
    versions = sorted(j["result"]["policy_version_after"] for j in st["raw"].values()
                      if j["kind"] == "update" and j["status"] == "done"
                      and j["result"]["policy_version_after"] > j["result"]["policy_version_before"])
    st["applied_twice"] = len(versions) - len(set(versions))
    st["lost"] = st["policy_version"] - len(set(versions)) if versions == list(range(1, len(versions) + 1)) else -1
    return st


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grpod", default="./grpod")
    ap.add_argument("--grpod-hooks", help="build/grpod-test-hooks: also kill at exact points of checkpoint jobs")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--threads", type=int, default=2, help="--engine-threads (cpu)")
    ap.add_argument("--ranks", type=int, default=1, help="--ranks (cpu): both runs use this many ranks")
    ap.add_argument("--kills", type=int, default=int(os.environ.get("GRPOD_TORTURE_KILLS", "20")))
    ap.add_argument("--rounds", type=int, default=int(os.environ.get("GRPOD_TORTURE_ROUNDS", "8")))
    ap.add_argument("--seed", type=int, default=int(os.environ.get("GRPOD_TORTURE_SEED", "19")))
    ap.add_argument("--max-gap-s", type=float, default=1.2, help="longest run between a submit and the kill")
    ap.add_argument("--budget-s", type=float, default=float(os.environ.get("GRPOD_TORTURE_BUDGET_S", "120")),
                    help="stop killing after this long (bounded time on a loaded machine)")
    ap.add_argument("--ready-timeout", type=float, default=180)
    ap.add_argument("--job-timeout", type=float, default=600)
    ap.add_argument("--keep", help="keep data dirs and logs here")
    args = ap.parse_args()
    work = args.keep or tempfile.mkdtemp(prefix="grpod-torture-")
    os.makedirs(work, exist_ok=True)
    rng = random.Random(args.seed * 7919 + 1)
    stream = make_stream(args.seed, args.rounds)
    t0 = time.time()
    try:
        ref = reference(args, stream, work)
        t_ref = time.time() - t0
        got = tortured(args, stream, work, rng)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    diffs = []
    if got["policy_version"] != ref["policy_version"]:
        diffs.append("policy_version %s vs reference %s" % (got["policy_version"], ref["policy_version"]))
    for i, (a, b) in enumerate(zip(got["jobs"], ref["jobs"])):
        if a != b:
            diffs.append("job %d (%s): %s vs reference %s" % (i, stream[i]["kind"], json.dumps(a)[:300], json.dumps(b)[:300]))
    probe_equal = got["probe"] == ref["probe"]
    if not probe_equal:
        d = max(abs(x - y) for p, q in zip(got["probe"], ref["probe"]) for x, y in zip(p, q))
        diffs.append("probe logprobs differ (max |d| %.3g)" % d)
    # not part of the verdict: a rollout that a kill cut short runs again in the new process, and
    # its logprobs are what that process computes (an update that names it reads the stored ones)
    lp_differ = sum(1 for a, b in zip(got["rollout_lp"], ref["rollout_lp"]) if a != b)
    kinds = [s["kind"] for s in stream]
    figures = {"backend": args.backend, "ranks": args.ranks, "seed": args.seed, "kills": got["kills"], "kill_phases": got["phases"],
               "jobs_accepted": len(stream), "rollouts": kinds.count("rollout"), "checkpoints": kinds.count("checkpoint"),
               "updates_done": sum(1 for j in got["jobs"] if j["kind"] == "update" and j["status"] == "done"),
               "final_policy_version": got["policy_version"], "reference_policy_version": ref["policy_version"],
               "lost": got["lost"], "applied_twice": got["applied_twice"], "replays": got["replays"],
               "replay_starts": got["replay_starts"], "checkpoints_skipped": got["ckpt_skipped"],
               "temporaries_removed": got["tmp_removed"], "requeued_interrupted": got["requeued_interrupted"],
               "hooked_kills": got["hooked_kills"], "checkpoints_kept": got["ckpt_kept"],
               "job_states_equal": not any(d.startswith("job ") for d in diffs),
               "probe_logprobs_bit_equal": probe_equal, "rollouts_logprobs_differing": lp_differ, "seconds": round(time.time() - t0, 1), "reference_seconds": round(t_ref, 1)}
    print("FIGURES " + json.dumps(figures), flush=True)
    for d in diffs[:20]:
        print("DIFF " + d, flush=True)
    ok = not diffs and got["lost"] == 0 and got["applied_twice"] == 0
    print("torture: %s" % ("PASS" if ok else "FAIL"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
