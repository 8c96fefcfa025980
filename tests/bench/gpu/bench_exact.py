"""bench_exact.py — rollout logprobs against the trainer's through the daemon's API:
--jobs rollout jobs of --groups x --n responses are submitted at once (their groups share decode
steps: a mixed batch), then every group's sampled tokens are scored by POST /v1/logprobs (the
training forward, packed [P; R_1..R_N]) at the rollout's temperature. json-c prints doubles with
17 digits, so two logprobs parse equal exactly when their float bits are equal.
With GRPOD_TUNE_EXACT=1 in the daemon's environment the row asserts 0 differing tokens; else it
prints the gap. The checkpoint and daemon plumbing are bench_daemon.py's.

Usage: GRPOD_TUNE_EXACT=1 LD_LIBRARY_PATH=.devlibs python3 tests/bench/gpu/bench_exact.py ./grpod OUT
         --dims 1.7b [--jobs 2 --groups 8 --n 16 --prompt 1024 --max-tokens 512]
       on the CPU: python3 tests/bench/gpu/bench_exact.py ./grpod /tmp/be --dims tiny --backend cpu
ROW lines: ROW|exact_rollout_vs_logprobs|DIMS tokens|max abs diff|limit|PASS/FAIL
"""
import argparse, hashlib, os, random, shutil, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_daemon as bd  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    bd.daemon_args(ap, 18900)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--temperature", type=float, default=1.0)
    a = ap.parse_args()
    exact = os.environ.get("GRPOD_TUNE_EXACT") == "1"
    d, data, vocab = bd.start_daemon(a, "grpod-exact-")
    try:
        hi = min(vocab, 151643)
        ids = []
        for j in range(a.jobs):
            rnd = random.Random(a.seed * 1009 + j)
            groups = [{"prompt_ids": [rnd.randrange(hi) for _ in range(a.prompt + 37 * g)], "n": a.n}
                      for g in range(a.groups - j)]          # jobs of other sizes and prompt lengths
            body = {"groups": groups, "sampling": {"temperature": a.temperature, "max_tokens": a.max_tokens - a.max_tokens // 8 * j,
                                                   "ignore_eos": True, "seed": a.seed * 7919 + j}}
            ids.append(bd.submit(d, "/v1/rollouts", body))
        total = differ = 0
        mx = 0.0
        sha = hashlib.sha256()
        for jid in ids:
            res = bd.wait_job(d, jid, a.job_timeout)["result"]
            for g in res["groups"]:
                for r in g["responses"]:
                    sha.update(repr(r["token_ids"]).encode())
                req = {"groups": [{"prompt_ids": g["prompt_ids"],
                                   "responses": [{"token_ids": r["token_ids"]} for r in g["responses"]]}],
                       "temperature": a.temperature}
                code, lp = d.api.call("POST", "/v1/logprobs", req, timeout=300)
                if code != 200:
                    raise bd.JobError("POST /v1/logprobs: %d %s" % (code, str(lp)[:300]))
                for r, t in zip(g["responses"], lp["groups"][0]["responses"]):
                    for x, y in zip(r["logprobs"], t["logprobs"]):
                        total += 1
                        if x != y:
                            differ += 1
                            mx = max(mx, abs(x - y))
        bd.log("# %d sampled tokens from %d jobs at once: %d differ from /v1/logprobs, max |d| %.3e (exact %s)"
               % (total, a.jobs, differ, mx, "on" if exact else "off"))
        bd.log("# sampled token ids sha256 %s (equal across runs = the same tokens)" % sha.hexdigest()[:16])
        lim = 0.0 if exact else float("inf")
        bd.row("exact_rollout_vs_logprobs", "%s %d tokens, %d differ, exact %s" % (a.dims, total, differ,
               "on" if exact else "off"), mx, lim, mx <= lim, fmt="%.3e")
    finally:
        d.stop(60)
        shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
