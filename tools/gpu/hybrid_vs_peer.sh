#!/bin/bash
# tools/gpu/hybrid_vs_peer.sh — the Qwen3.5-9B-dims GRPO update step (4 layers: 3 gated DeltaNet +
# 1 gated attention at head dim 256; P 4096, N 16, R 512) beside the transformers +
# flash-linear-attention peer (tests/gpu/peer_hybrid_step.py step) in one call, one after the
# other (ours first: the two do not fit the device together beside other work), and the ratio.
# Both steps include their old pass. FLA_WHEELS: a folder with the fla-core and einops wheels
# (pure Python; unpacked to a temporary folder). The image's Triton is in fla's known-bad range on
# Hopper, so the peer runs with PEER_FLA_TIMING_ONLY=1 (its time, not its gradients). Its Triton
# compile and autotune take ~160 s: give PEER_S >= 240. Run from the repository root after
# tests/gpu/run.sh (or a build of bench_step in $BIN). Prints three lines.
set -u
B=${BIN:-build/gpu}
t=$(mktemp)
d=$(mktemp -d)
timeout ${STEP_S:-40} "$B/bench_step" qwen3.5-9b-l4 4096 16 512 >"$t" 2>&1
s=$(grep -o 'total [0-9]* ms  old [0-9]*  ref [0-9]*  policy [0-9]*  optim [0-9]*' "$t")
echo "grpod bench_step qwen3.5-9b-l4: ${s:-none: $(tail -1 "$t" | cut -c1-120)}"
for w in "${FLA_WHEELS:-.carry/wheels}"/fla_core-*.whl "${FLA_WHEELS:-.carry/wheels}"/einops-*.whl; do
    python3 -m zipfile -e "$w" "$d" 2>/dev/null
done
PYTHONPATH=$d PEER_FLA_TIMING_ONLY=1 timeout ${PEER_S:-260} python3 tests/gpu/peer_hybrid_step.py step 4 4096 16 512 4 >"$t" 2>&1
p=$(grep -o 'total [0-9]* ms  old [0-9]*  ref [0-9]*  policy [0-9]*  optim [0-9]*' "$t" | tail -1)
echo "peer transformers + fla: ${p:-none: $(tail -1 "$t" | cut -c1-120)}"
rm -rf "$t" "$d"
python3 - "$s" "$p" <<'PY'
import re, sys
def total(t):
    m = re.search(r"total (\d+) ms", t)
    return float(m.group(1)) if m else None
g, q = total(sys.argv[1]), total(sys.argv[2])
if g is None or q is None: print("hybrid vs peer: missing figures"); sys.exit(1)
print(f"hybrid vs peer: ours {g:.0f} ms, peer {q:.0f} ms: {g / q:.2f}x (target 0.5x)")
PY
