#!/bin/bash
# tools/gpu/profile.sh — per-kernel time breakdown with Nsight Compute (one metric: kernel
# duration), for deciding what to optimise. Run from the repository root on the GPU machine
# after tests/gpu/run.sh has built build/gpu (or with BUILD_FIRST=1). Writes $OUT/prof_*.txt.
#   decode: bench_rollout 1.7b, 1 group P=1024 N=16, kernels of a few decode steps (decode8: 8 groups)
#   step:   bench_step 1.7b P=4096 N=16 R=512, kernels of the first (warm-up) step
#   layer:  bench_layer (8192, 8, 1024), one Qwen3-8B layer fwd+bwd
#   moe:    bench_layer moe (1024, 16, 512), one Qwen3-30B-A3B layer fwd+bwd
#   moestep: bench_step 30b-a3b-l4 (1024, 16, 512), a 4-layer 30B-A3B update's first step
# Usage: tools/gpu/profile.sh [decode] [decode8] [step] [layer] [moe] [moestep]
# COUNT: moestep's launches (3000); NCU_TIMEOUT: seconds (300). NCU_EXTRA adds ncu flags (e.g. "--cache-control none": small kernels read what the one before
# wrote from L2, as they do in the step, instead of from a flushed cache).
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/gpu/logs}
B=${BIN:-build/gpu}
mkdir -p "$OUT"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
prof() {   # name skip count cmd...
    local name=$1 skip=$2 count=$3; shift 3
    timeout ${NCU_TIMEOUT:-300} "$NCU" --clock-control none ${NCU_EXTRA:-} --metrics gpu__time_duration.sum --print-summary per-kernel \
        --launch-skip "$skip" --launch-count "$count" "$@" >"$OUT/prof_$name.raw" 2>&1
    # name, calls, mean ns -> table sorted by total time
    python3 - "$OUT/prof_$name.raw" >"$OUT/prof_$name.txt" <<'PY'
import re, sys
rows, name, calls = [], None, 0
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"\s{2}(\S.*?) \(\d+, \d+, \d+\)x\(\d+, \d+, \d+\), .*Invocations (\d+)", line)
    if m:
        name, calls = m.group(1)[:110], int(m.group(2))
        continue
    m = re.match(r"\s+gpu__time_duration.sum\s+(\S+)\s+([\d.,]+)\s+([\d.,]+)\s+([\d.,]+)", line)
    if m and name:
        unit = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}.get(m.group(1), 1e-6)
        avg = float(m.group(4).replace(",", "")) * unit
        rows.append((avg * calls, calls, avg, name)); name = None
tot = sum(r[0] for r in rows) or 1
print(f"{'total ms':>9} {'%':>5} {'calls':>6} {'mean us':>9}  kernel")
for t, c, a, n in sorted(rows, reverse=True)[:40]:
    print(f"{t:9.3f} {100*t/tot:5.1f} {c:6d} {a*1e3:9.1f}  {n}")
print(f"{tot:9.3f} total over {sum(r[1] for r in rows)} launches")
PY
    echo "== $name"; head -25 "$OUT/prof_$name.txt"
}
for what in "${@:-decode step layer}"; do
    for w in $what; do
        case $w in
            decode) prof decode 4000 1200 "$B/bench_rollout" 1.7b 1 1024 16 32 ;;
            decode8) prof decode8 4000 1200 "$B/bench_rollout" 1.7b 8 1024 16 32 ;;
            step)   prof step 0 3000 "$B/bench_step" 1.7b 4096 16 512 ;;
            layer)  prof layer 0 400 "$B/bench_layer" 8192 8 1024 ;;
            moe)    prof moe 0 300 "$B/bench_layer" moe 1024 16 512 ;;
            moestep) prof moestep 0 ${COUNT:-3000} "$B/bench_step" 30b-a3b-l4 1024 16 512 ;;
        esac
    done
done
