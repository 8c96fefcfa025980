#!/bin/bash
# tree_step.sh — an agent's tree of turns at Qwen3-1.7B dims: one update step (old + ref + policy
# fwd/bwd + AdamW, random weights) laid out as the trie, as the trunk alone and flat, then the
# FlexAttention peer on the flat layout, one after another in one call; a table last.
# The workload: P 1024, 8 trajectories x 4 turns of 512 ids, turn 1 shared by all eight, turn 2 by
# pairs, turns 3-4 each its own (standard N(P+R): 24,576 tokens).
#   tree  : bench_step LAYOUT=tree, the trie (PACK_TREE): 11,776 tokens
#   trunk : LAYOUT=trunk, turn 1 once (PACK_PACKED): 13,824
#   flat  : LAYOUT=flat, P + NR with nothing shared past P: 17,408
#   peer  : tests/gpu/peer_tree_step.py's flex-flat (../shared/bench/peer_step.py's packed model, a
#           FlexAttention shared-prefix mask): the same 17,408 tokens
# Usage: bash tests/bench/gpu/tree_step.sh [BIN (build/gpu, holding bench_step)]
#   PEER_TREE  the folder of peer_step.py (else the first of shared/bench, ../shared/bench,
#              .carry/bench, /work/shared/bench that has it; none: the peer's row says so)
#   OUT        where tree_step.log goes (default: build/gpu/logs)
# Exit status: 0 when every layout and the peer printed a step time, 1 otherwise.
set -u
BIN=${1:-build/gpu}
OUT=${OUT:-build/gpu/logs}
mkdir -p "$OUT"
LOG=$OUT/tree_step.log
PEER=${PEER_TREE:-}
if [ -z "$PEER" ]; then
    for d in shared/bench ../shared/bench .carry/bench /work/shared/bench; do
        [ -f "$d/peer_step.py" ] && { PEER=$d; break; }
    done
fi
: >"$LOG"
for lay in tree trunk flat; do
    s=$SECONDS
    TURNS=512,512,512,512 SHARE=8,2,1,1 LAYOUT=$lay timeout ${T_BENCH:-40} "$BIN/bench_step" 1.7b 1024 8 2048 >>"$LOG" 2>&1
    echo "bench_step $lay exit $? in $((SECONDS - s)) s" >>"$LOG"
done
if [ -n "$PEER" ]; then
    s=$SECONDS
    PEER_FORMS=flat PYTHONUNBUFFERED=1 timeout ${T_PEER:-100} python3 tests/gpu/peer_tree_step.py "$PEER" 1.7b 1 8 1024 512 1536 >>"$LOG" 2>&1
    echo "peer exit $? in $((SECONDS - s)) s" >>"$LOG"
else
    echo "peer: peer_step.py not found (set PEER_TREE)" >>"$LOG"
fi
grep -E 'exit|imports|warm-up|OOM|FATAL|rror' "$LOG" | grep -v '^rep'

# the table: one row a layout; "vs flat" is the step time over grpod's flat step
awk '
/layout (tree|trunk|flat): T=/ { match($0, /layout [a-z]+/); lay = substr($0, RSTART + 7, RLENGTH - 7) }
/grpod-cuda .* T=[0-9]+: total/ {
    match($0, /T=[0-9]+:/); tok[lay] = substr($0, RSTART + 2, RLENGTH - 3)
    for (i = 1; i <= NF; i++) if ($i == "total" || $i == "old" || $i == "ref" || $i == "policy" || $i == "optim") v[lay, $i] = $(i + 1)
}
/^flex-flat: total/ {
    lay = "peer"
    for (i = 1; i <= NF; i++) if ($i == "total" || $i == "old" || $i == "ref" || $i == "policy" || $i == "optim") v[lay, $i] = $(i + 1)
    match($0, /\([0-9]+ tokens\)/); tok[lay] = substr($0, RSTART + 1, RLENGTH - 9)
}
END {
    n = split("tree trunk flat peer", L, " ")
    name["tree"] = "grpod tree (trie)"; name["trunk"] = "grpod trunk only"; name["flat"] = "grpod flat P+NR"; name["peer"] = "FlexAttention peer, flat"
    printf "%-26s %7s %8s %6s %6s %7s %6s %8s\n", "layout (1.7B, 8 x 4 turns)", "tokens", "step ms", "old", "ref", "policy", "optim", "vs flat"
    bad = 0
    for (k = 1; k <= n; k++) {
        l = L[k]
        if (!((l, "total") in v)) { printf "%-26s %7s %8s\n", name[l], "-", "missing"; bad = 1; continue }
        r = ((("flat", "total") in v) && v["flat", "total"] > 0) ? sprintf("%.2fx", v[l, "total"] / v["flat", "total"]) : "-"
        printf "%-26s %7s %8s %6s %6s %7s %6s %8s\n", name[l], tok[l], v[l, "total"], v[l, "old"], v[l, "ref"], v[l, "policy"], v[l, "optim"], r
    }
    if (("tree", "total") in v && ("peer", "total") in v) printf "tree / peer %.2fx, flat / peer %.2fx\n", v["tree", "total"] / v["peer", "total"], v["flat", "total"] / v["peer", "total"]
    exit bad
}' "$LOG"
