"""bench_turns.py — an agent's turns through the daemon's API at real dims, token in / token out:
what the rollout scheduler's prefix cache (engine/rollout/prefix.h) saves.

Turn 1: --groups trajectories of --prompt random ids, one response each (--max-tokens, ignore_eos).
Each later turn's prompt is the previous prompt, its response's token_ids and --tool-ids random
ids (a tool's output). Before running a turn, its prefill is timed as two jobs of max_tokens 1
(a job's time is then its prefill and one draw): the prompts as sent (the cache holds all but the
new ids: cached_tokens says how many) and the same prompts with the first id changed (nothing
cached, the same length). Their difference is the prefill the cache saves; the floor of the
cached job is the prefill of its uncached ids alone. The checkpoint and daemon plumbing are
bench_daemon.py's (the same --dims, --model-cache, --serve-arg).

Usage: LD_LIBRARY_PATH=.devlibs python3 tests/bench/gpu/bench_turns.py ./grpod OUTDIR --dims 1.7b
         [--turns 4 --groups 8 --prompt 2048 --max-tokens 256 --tool-ids 64 --reps 3]
       on the CPU: python3 tests/bench/gpu/bench_turns.py ./grpod /tmp/bt --dims tiny --backend cpu
ROW lines: ROW|turn_prefill|DIMS turn T ...|ms cached|ms uncached|PASS when ids were cached
"""
import argparse, os, random, shutil, statistics, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_daemon as bd  # noqa: E402


def job(a, d, prompts, max_tokens, seed):
    body = {"groups": [{"prompt_ids": p, "n": 1} for p in prompts],
            "sampling": {"temperature": 1.0, "max_tokens": max_tokens, "ignore_eos": True, "seed": seed}}
    r = bd.wait_job(d, bd.submit(d, "/v1/rollouts", body), a.job_timeout)["result"]
    return r, r["timings_ms"]["total"], r["usage"]["prompt_tokens_details"]["cached_tokens"]


def turns(a, d, vocab):
    rnd = random.Random(a.seed)
    hi = min(vocab, 151643)
    tool = lambda: [rnd.randrange(hi) for _ in range(a.tool_ids)]
    prompts = [[rnd.randrange(hi) for _ in range(a.prompt)] for _ in range(a.groups)]
    base, out = None, []
    for t in range(1, a.turns + 1):
        if t > 1:   # each rep its own tool output: the cache holds only the previous turn's ids
            hit, miss, cached = [], [], []
            for k in range(a.reps):
                tk = [b + tool() for b in base]
                if k == 0:
                    prompts = tk
                _, ms, c = job(a, d, tk, 1, 1000 * t + k)
                hit.append(ms)
                cached.append(c)
                other = [[(p[0] + 1 + t * a.reps + k) % hi] + p[1:] for p in tk]   # never sent before
                _, ms, c = job(a, d, other, 1, 1000 * t + k)
                if c:
                    raise RuntimeError("the changed prompts of turn %d hit the cache (%d ids)" % (t, c))
                miss.append(ms)
            row = {"turn": t, "prompt_ids": sum(len(p) for p in prompts), "cached_ids": min(cached),
                   "ms_cached": statistics.median(hit), "ms_uncached": statistics.median(miss)}
            out.append(row)
            bd.log("# turn %d: %d prompt ids, %s cached; prefill job %.1f ms cached vs %.1f ms uncached" % (
                t, row["prompt_ids"], cached, row["ms_cached"], row["ms_uncached"]))
        res, ms, c = job(a, d, prompts, a.max_tokens, 100 + t)
        bd.log("# turn %d ran: %.1f ms" % (t, ms))
        base = [p + g["responses"][0]["token_ids"] for p, g in zip(prompts, res["groups"])]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bd.daemon_args(ap, 18830)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--prompt", type=int, help="turn 1's prompt ids (2048; tiny 64)")
    ap.add_argument("--max-tokens", type=int, help="ids sampled a turn (256; tiny 16)")
    ap.add_argument("--tool-ids", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    tiny = a.dims.startswith("tiny")
    a.prompt = a.prompt or (64 if tiny else 2048)
    a.max_tokens = a.max_tokens or (16 if tiny else 256)
    d, data, rows, err = None, None, [], None
    try:
        d, data, vocab = bd.start_daemon(a, "grpod-turns-data-")
        rows = turns(a, d, vocab)
    except Exception as e:
        err = str(e)
        bd.log("# bench_turns: %s" % err)
    finally:
        if d is not None and not d.dead():
            d.stop(60)
        if data:
            shutil.rmtree(data, ignore_errors=True)
    bd.log("")
    bd.log("bench_turns %s on %s: %d trajectories, turn 1 P=%d, %d ids sampled and %d tool ids a turn" % (
        a.dims, bd.device_name(), a.groups, a.prompt, a.max_tokens, a.tool_ids))
    bd.log("%5s %11s %11s %14s %16s %8s" % ("turn", "prompt ids", "cached ids", "prefill cached", "prefill uncached", "saved"))
    for r in rows:
        bd.log("%5d %11d %11d %11.1f ms %13.1f ms %7.1f%%" % (
            r["turn"], r["prompt_ids"], r["cached_ids"], r["ms_cached"], r["ms_uncached"],
            100.0 * (1 - r["ms_cached"] / r["ms_uncached"]) if r["ms_uncached"] else 0.0))
    for r in rows:
        bd.row("turn_prefill", "%s turn %d %d of %d ids cached, uncached %.1f ms" % (
            a.dims, r["turn"], r["cached_ids"], r["prompt_ids"], r["ms_uncached"]), r["ms_cached"], r["ms_uncached"],
            r["cached_ids"] > 0, fmt="%.1f")
    if err or len(rows) != a.turns - 1:
        bd.row("turn_prefill", "%s %s" % (a.dims, err or "incomplete"), len(rows), a.turns - 1, False)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
