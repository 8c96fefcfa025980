#!/usr/bin/env python3
"""hostile_inputs.py — the hostile-input reproducers against a fresh daemon, with the time and memory
each costs: the 1 MB math-nesting request, regex bombs (validated, then scored on real
responses), a cross-site text/plain POST, an 8 MiB update body (peak RSS and RSS after), and
each broken model directory of tests/integration/test_hostile.py through `grpod info`
(wall time and max RSS). Prints one line per reproducer.

  python3 tests/bench/hostile_inputs.py [./grpod]"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import requests

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))
import test_hostile as th  # noqa: E402  (the model-directory defects)

GRPOD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "./grpod")
J = {"Content-Type": "application/json"}


def status(pid, key):
    for line in open("/proc/%d/status" % pid):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    return float("nan")


def start(grpod, data):
    """A daemon on a free loopback port over data, ready: (process, url)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    p = subprocess.Popen([grpod, "serve", "--data-dir", data, "--listen", "127.0.0.1:%d" % port,
                          "--backend", "cpu", "--engine-threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = "http://127.0.0.1:%d" % port
    for _ in range(1200):
        try:
            if requests.get(url + "/readyz", timeout=2).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    return p, url


def main():
    tmp = tempfile.mkdtemp(prefix="grpod_hostile_")
    p, url = start(GRPOD, tmp + "/data")
    try:
        print("daemon RSS at start: %.0f MiB" % status(p.pid, "VmRSS:"))

        def timed(name, body, path="/v1/rollouts", headers=J):
            t = time.time()
            r = requests.post(url + path, data=body if isinstance(body, (bytes, str)) else json.dumps(body),
                              headers=headers, timeout=600)
            dt = time.time() - t
            alive = requests.get(url + "/healthz", timeout=10).status_code == 200
            print("%-34s %d in %7.1f ms; RSS %.0f MiB (peak %.0f); /healthz %s  %s" % (
                name, r.status_code, dt * 1e3, status(p.pid, "VmRSS:"), status(p.pid, "VmHWM:"),
                "ok" if alive else "DOWN", r.text[:90].replace("\n", " ")))
            return r

        timed("math \\frac nesting 100,000 (1 MB)", {"groups": [{"prompt": "a", "reward": {
            "type": "math", "answer": th.nested("\\frac{", "1", "}{2}", 100000)}}]})
        timed("math brace nesting 500,000 (1 MB)", {"groups": [{"prompt": "a", "reward": {
            "type": "math", "answer": th.nested("{", "1", "}", 500000)}}]})
        for pat in ["((a{1,100}){1,100}){1,100}", "(((a{100}){100}){100}){100}", "(a+)+$", "(.*a){20}",
                    "((((((((((a*)*)*)*)*)*)*)*)*)*)*$"]:
            r = timed("regex %s" % pat, {"groups": [{"prompt": "aaaaaaaa", "n": 4, "reward": {"type": "regex", "answer": pat}}],
                                         "sampling": {"max_tokens": 64, "ignore_eos": True}})
            if r.status_code == 202:
                jid, t = r.json()["job_id"], time.time()
                j = requests.get(url + "/v1/jobs/%s?wait=60" % jid, timeout=120).json()
                print("%-34s job %s in %.1f s (4 responses x 64 tokens scored); RSS %.0f MiB (peak %.0f)" % (
                    "", j["status"], time.time() - t, status(p.pid, "VmRSS:"), status(p.pid, "VmHWM:")))
        timed("cross-site text/plain POST", json.dumps({"groups": [{"prompt": "a"}]}),
              headers={"Content-Type": "text/plain", "Origin": "http://evil.example"})
        ids = [7] * 2000
        g = {"prompt_ids": ids, "responses": [{"token_ids": ids, "reward": 1.0}]}
        n = int(8.0e6 // len(json.dumps(g)))
        raw = json.dumps({"groups": [g] * n, "expected_policy_version": 999})
        for i in range(3):
            timed("8 MiB update body (%.1f MiB) #%d" % (len(raw) / 2 ** 20, i + 1), raw, path="/v1/updates")
        time.sleep(1)
        print("daemon RSS after: %.0f MiB" % status(p.pid, "VmRSS:"))
    finally:
        p.terminate()
        p.wait(60)
    # model directories
    r = subprocess.run([GRPOD, "info", "--data-dir", tmp + "/dm"], capture_output=True, text=True, timeout=300)
    dm = tmp + "/dm/default-model"
    for name in sorted(th.MODEL_DEFECTS):
        file, fn, words = th.MODEL_DEFECTS[name]
        d = tmp + "/" + name
        shutil.copytree(dm, d)
        (lambda d: th.edit_json(d, file, fn))(d) if file else fn(d)
        r = subprocess.run(["/usr/bin/time", "-f", "@@ %e %M", GRPOD, "info", "--model", d], capture_output=True,
                           text=True, timeout=300)
        err = [l for l in r.stderr.splitlines() if not l.startswith("@@")]
        tm = [l for l in r.stderr.splitlines() if l.startswith("@@")][-1].split()
        print("model %-24s exit %d in %5.2f s, max RSS %4.0f MiB: %s" % (name, r.returncode, float(tm[1]),
                                                                        int(tm[2]) / 1024, (err or ["(loaded)"])[0][:150]))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
