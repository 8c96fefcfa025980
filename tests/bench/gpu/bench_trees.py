"""bench_trees.py — tree-shaped groups through the daemon's update API at real dims: what laying
out a group's shared response trunk once (engine/model/pack.h) saves.

Each update: --groups groups of --n trajectories, a prompt of --prompt random ids; a trajectory is
a trunk of --trunk ids that every trajectory of its group shares (the turns before they branch)
and then --branch ids of its own. The same update is sent flat: the same lengths, but each
trajectory's first id its own (nothing shared past the prompt). Each form runs --reps times,
alternating; the table has the daemon's timings_ms (ref, policy, total) and tokens (packed,
standard) as medians. Random client rewards; the checkpoint and daemon plumbing are
bench_daemon.py's (the same --dims, --model-cache, --serve-arg).

--turns L1,L2,.. --share S1,S2,.. instead makes each trajectory turns of those lengths, turn k shared
by the trajectories i // S_k picks (8,2,1,1 with --n 8: turn 1 by all, turn 2 by pairs, turns 3-4
each its own): a prefix tree deeper than one trunk, which the daemon lays out as its trie.

Usage: LD_LIBRARY_PATH=.devlibs python3 tests/bench/gpu/bench_trees.py ./grpod OUTDIR --dims 1.7b
         [--groups 8 --n 8 --prompt 1024 --trunk 1024 --branch 512 --reps 3]
       on the CPU: python3 tests/bench/gpu/bench_trees.py ./grpod /tmp/bt --dims tiny --backend cpu
The FlexAttention peer of the same update, tree and flat, is tests/gpu/peer_tree_step.py (run
it in the same call: python3 tests/gpu/peer_tree_step.py DIR_OF_PEER_STEP 1.7b).
ROW lines: ROW|tree_update|DIMS ...|ms tree|ms flat|PASS when the tree packed fewer tokens
"""
import argparse, os, random, shutil, statistics, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_daemon as bd  # noqa: E402


def turns_group(a, rnd, hi, tree):
    """--turns/--share: trajectories of shared and own turns; flat: each one's first id its own"""
    rs = [[] for _ in range(a.n)]
    for tl, sh in zip(a.turns, a.share):
        ts = [[rnd.randrange(hi) for _ in range(tl)] for _ in range((a.n + sh - 1) // sh)]
        for i in range(a.n):
            rs[i] += ts[i // sh]
    for i, ids in enumerate(rs):
        if not tree:
            ids[0] = (rs[0][0] + 1 + i) % hi
    return [{"token_ids": ids, "reward": round(rnd.random(), 4)} for ids in rs]


def body(a, rnd, hi, tree):
    groups = []
    for _ in range(a.groups):
        if a.turns:
            groups.append({"prompt_ids": [rnd.randrange(hi) for _ in range(a.prompt)], "responses": turns_group(a, rnd, hi, tree)})
            continue
        trunk = [rnd.randrange(hi) for _ in range(a.trunk)]
        rs = []
        for i in range(a.n):
            ids = (list(trunk) if tree else [rnd.randrange(hi)] + trunk[1:]) + [rnd.randrange(hi) for _ in range(a.branch)]
            if not tree:   # the first id unique within the group: no trunk
                ids[0] = (trunk[0] + 1 + i) % hi
            rs.append({"token_ids": ids, "reward": round(rnd.random(), 4)})
        groups.append({"prompt_ids": [rnd.randrange(hi) for _ in range(a.prompt)], "responses": rs})
    return {"groups": groups, "optimizer": {"lr": 1e-6}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bd.daemon_args(ap, 18840)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--prompt", type=int, help="(1024; tiny 32)")
    ap.add_argument("--trunk", type=int, help="ids every trajectory of a group shares (1024; tiny 32)")
    ap.add_argument("--branch", type=int, help="ids of each trajectory's own (512; tiny 16)")
    ap.add_argument("--turns", help="L1,L2,..: turn lengths (a tree of turns instead of trunk + branch)")
    ap.add_argument("--share", help="S1,S2,..: how many trajectories share each turn (default all, then own)")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    a.turns = [int(x) for x in a.turns.split(",")] if a.turns else None
    if a.turns:
        a.share = [int(x) for x in a.share.split(",")] if a.share else [a.n] + [1] * (len(a.turns) - 1)
        if len(a.share) != len(a.turns):
            ap.error("--share needs one number per turn")
    tiny = a.dims.startswith("tiny")
    a.prompt = a.prompt or (32 if tiny else 1024)
    a.trunk = a.trunk or (32 if tiny else 1024)
    a.branch = a.branch or (16 if tiny else 512)
    d, data, res, err = None, None, {"tree": [], "flat": []}, None
    try:
        d, data, vocab = bd.start_daemon(a, "grpod-trees-data-")
        hi = min(vocab, 151643)
        rnd = random.Random(a.seed)
        for k in range(a.reps + 1):   # the first round warms up
            for form in (("tree", "flat") if k % 2 else ("flat", "tree")):
                j = bd.wait_job(d, bd.submit(d, "/v1/updates", body(a, rnd, hi, form == "tree")), a.job_timeout)
                r = j["result"]
                row = {"total": r["timings_ms"]["total"], "ref": r["timings_ms"].get("ref", 0),
                       "policy": r["timings_ms"].get("policy", 0), "packed": r["tokens"]["packed"],
                       "standard": r["tokens"]["standard"]}
                bd.log("# %s %s: %s" % ("warm-up" if not k else "rep %d" % k, form, row))
                if k:
                    res[form].append(row)
    except Exception as e:
        err = str(e)
        bd.log("# bench_trees: %s" % err)
    finally:
        if d is not None and not d.dead():
            d.stop(120)
        if data:
            shutil.rmtree(data, ignore_errors=True)
    med = {f: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for f, rs in res.items() if rs}
    bd.log("")
    shape = ("turns %s shared by %s" % (a.turns, a.share)) if a.turns else "trunk %d + branch %d ids" % (a.trunk, a.branch)
    bd.log("bench_trees %s on %s: %d groups x %d trajectories, P=%d, %s, median of %d" % (
        a.dims, bd.device_name(), a.groups, a.n, a.prompt, shape, a.reps))
    bd.log("%5s %9s %9s %9s %10s %10s" % ("form", "ref ms", "policy ms", "total ms", "packed", "standard"))
    for f, m in med.items():
        bd.log("%5s %9.1f %9.1f %9.1f %10d %10d" % (f, m["ref"], m["policy"], m["total"], m["packed"], m["standard"]))
    if err or len(med) != 2:
        bd.row("tree_update", "%s %s" % (a.dims, err or "incomplete"), 0, 0, False)
        return 1
    t, f = med["tree"], med["flat"]
    bd.row("tree_update", "%s G%dxN%d P%d %s: packed %d vs %d tokens, flat %.1f ms" % (
        a.dims, a.groups, a.n, a.prompt, shape, t["packed"], f["packed"], f["total"]),
        t["total"], f["total"], t["packed"] < f["packed"], fmt="%.1f")
    return 0


if __name__ == "__main__":
    sys.exit(main())
