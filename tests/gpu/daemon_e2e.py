"""daemon_e2e.py — the whole daemon on the GPU: `grpod serve --backend cuda` on the embedded
default model, driven over HTTP like an orchestrator (standard library only, as the GPU image
has no `requests`): readiness, a seeded rollout, the rollout/trainer logprob mismatch (the
rollout's logprobs against POST /v1/logprobs of the same tokens, both on the CUDA backend),
an update on the rollout, greedy determinism. Prints ROW lines for tests/gpu/run.sh.

Usage: LD_LIBRARY_PATH=.devlibs python3 tests/gpu/daemon_e2e.py ./grpod OUTDIR
"""
import json, os, subprocess, sys, tempfile, time, urllib.request

GRPOD, OUT = sys.argv[1], sys.argv[2]
BACKEND = os.environ.get("E2E_BACKEND", "cuda")   # cpu: to try the script without a GPU
PORT = 18780
BASE = "http://127.0.0.1:%d" % PORT


def row(test, shape, value, tol, ok=None):
    if ok is None:
        ok = value == value and value <= tol
    print("ROW|%s|%s|%.3e|%.0e|%s" % (test, shape, value, tol, "PASS" if ok else "FAIL"), flush=True)


def call(method, path, body=None, timeout=120):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(BASE + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def job(path, body):
    code, r = call("POST", path, body)
    assert code == 202, (code, r)
    for _ in range(20):
        code, j = call("GET", "/v1/jobs/%s?wait=30" % r["job_id"], timeout=60)
        if j["status"] in ("done", "failed", "cancelled"):
            return j
    raise RuntimeError("job did not finish")


def main():
    data = tempfile.mkdtemp(prefix="grpod-gpu-")
    log = open(os.path.join(OUT, "daemon.log"), "w")
    p = subprocess.Popen([GRPOD, "serve", "--backend", BACKEND, "--data-dir", data,
                          "--listen", "127.0.0.1:%d" % PORT], stderr=log, stdout=log)
    try:
        t0 = time.time()
        while time.time() - t0 < 90:
            try:
                if call("GET", "/readyz", timeout=5)[0] == 200:
                    break
            except Exception:
                pass
            if p.poll() is not None:
                break
            time.sleep(0.5)
        code, model = call("GET", "/v1/model")
        row("daemon ready on cuda", "backend=%s" % (model or {}).get("backend"), 0.0, 0,
            ok=code == 200 and model.get("backend") == BACKEND)
        if code != 200:
            return
        prompts = [[72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100] * 4, [65, 66, 67, 10] * 9]
        groups = [{"prompt_ids": pr, "n": 8} for pr in prompts]
        samp = {"temperature": 1.0, "max_tokens": 64, "seed": 3, "ignore_eos": True}
        j = job("/v1/rollouts", {"groups": groups, "sampling": samp})
        ok = j["status"] == "done"
        row("rollout job on cuda", "2 groups x 8, 64 tokens", 0.0, 0, ok=ok)
        if not ok:
            print("# rollout error:", j.get("error"))
            return
        res = j["result"]
        lgroups = [{"prompt_ids": prompts[g], "responses": [{"token_ids": r["token_ids"]} for r in gr["responses"]]}
                   for g, gr in enumerate(res["groups"])]
        code, lp = call("POST", "/v1/logprobs", {"groups": lgroups, "model": "policy", "temperature": 1.0})
        diffs = []
        for g, gr in enumerate(res["groups"]):
            for i, r in enumerate(gr["responses"]):
                diffs += [abs(a - b) for a, b in zip(r["logprobs"], lp["groups"][g]["responses"][i]["logprobs"])]
        mean = sum(diffs) / max(len(diffs), 1)
        print("# rollout vs trainer logprobs on cuda: mean |d| %.3e, max |d| %.3e over %d tokens" %
              (mean, max(diffs), len(diffs)))
        row("rollout/trainer logprob mean abs diff", "%d tokens" % len(diffs), mean, 1e-2)
        # client-side reward: the fraction of ASCII letters in a response
        ugroups = [{"prompt_ids": prompts[g], "responses": [
            {"token_ids": r["token_ids"], "logprobs": r["logprobs"],
             "reward": sum(65 <= t < 123 for t in r["token_ids"]) / len(r["token_ids"])} for r in gr["responses"]]}
            for g, gr in enumerate(res["groups"])]
        u = job("/v1/updates", {"groups": ugroups, "algorithm": {"kl_coef": 0.001}, "optimizer": {"lr": 1e-4}})
        ok = u["status"] == "done" and u["result"]["policy_version_after"] == 1
        m = (u.get("result") or {}).get("metrics", {})
        print("# update:", json.dumps(u.get("result") or u.get("error"))[:400])
        row("update job on cuda", "grad_norm=%s" % m.get("grad_norm"), 0.0, 0, ok=ok)
        g1 = job("/v1/rollouts", {"groups": groups[:1], "sampling": {"temperature": 0, "max_tokens": 32}})
        g2 = job("/v1/rollouts", {"groups": groups[:1], "sampling": {"temperature": 0, "max_tokens": 32}})
        t1 = [r["token_ids"] for r in g1["result"]["groups"][0]["responses"]]
        t2 = [r["token_ids"] for r in g2["result"]["groups"][0]["responses"]]
        row("greedy rollout deterministic on cuda", "8 x 32 tokens", 0.0, 0, ok=t1 == t2 and all(t == t1[0] for t in t1))
    finally:
        p.terminate()
        try:
            rc = p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = -9
        row("SIGTERM exit status", "", float(rc), 0, ok=rc == 0)


if __name__ == "__main__":
    main()
