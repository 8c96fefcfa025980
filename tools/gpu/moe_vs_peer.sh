#!/bin/bash
# tools/gpu/moe_vs_peer.sh — the 30B-A3B-dims update (4 layers, 8 groups of P 1024, N 16, R 512)
# beside the packed FlexAttention peer (tests/gpu/peer_moe_step.py) in one call, and the ratio.
# Ours from bench_step's per-group phases: 8 x (ref + policy) + optimizer (the daemon's update
# with --old-logprobs recompute runs no old pass; its HTTP and batching time is not in it). The
# peer's: ref + policy + optimizer over its 8 groups (its old pass left out, as ours). Run from the
# repository root after tests/gpu/run.sh (or a build of bench_step in $BIN). Prints three lines.
set -u
B=${BIN:-build/gpu}
t=$(mktemp)
timeout ${STEP_S:-25} "$B/bench_step" 30b-a3b-l4 1024 16 512 >"$t" 2>&1
s=$(grep -o 'total [0-9]* ms  old [0-9]*  ref [0-9]*  policy [0-9]*  optim [0-9]*' "$t")
echo "grpod bench_step 30b-a3b-l4, a group: ${s:-none: $(tail -1 "$t" | cut -c1-120)}"
PEER_MOE_ONLY=flex-packed PEER_MOE_REPS=${PEER_REPS:-1} timeout ${PEER_S:-40} python3 tests/gpu/peer_moe_step.py 4 >"$t" 2>&1
p=$(grep -o '^flex-packed: total [0-9]* ms  old [0-9]*  ref [0-9]*  policy [0-9]*  optim [0-9]*' "$t")
echo "peer ${p:-none: $(tail -1 "$t" | cut -c1-120)}"
rm -f "$t"
python3 - "$s" "$p" <<'PY'
import re, sys
def ph(t): return {k: float(v) for k, v in re.findall(r"(old|ref|policy|optim) (\d+)", t)}
g, q = ph(sys.argv[1]), ph(sys.argv[2])
if len(g) < 4 or len(q) < 4: print("moe vs peer: missing figures"); sys.exit(1)
ours, peer = 8 * (g["ref"] + g["policy"]) + g["optim"], q["ref"] + q["policy"] + q["optim"]
print(f"moe vs peer: ours {ours:.0f} ms (8 x (ref {g['ref']:.0f} + policy {g['policy']:.0f}) + optim {g['optim']:.0f}), "
      f"peer {peer:.0f} ms (ref {q['ref']:.0f} + policy {q['policy']:.0f} + optim {q['optim']:.0f}): {ours / peer:.2f}x (target 0.6x)")
PY
