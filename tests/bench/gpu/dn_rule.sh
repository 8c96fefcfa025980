#!/bin/bash
# tests/bench/gpu/dn_rule.sh — builds bench_dn_rule (the gated delta rule's kernels alone, nvcc on
# kernels/deltanet*.cu, or linked with tests/gpu/run.sh's libengine.a when it is there: no engine
# library needed, a minute's build) and runs it; NCU=1 adds a per-kernel
# time breakdown of one chunked forward + backward under Nsight Compute. Logs to $OUT.
# Usage: OUT=dir [NCU=1] tests/bench/gpu/dn_rule.sh [P N R [M]]
set -u
cd "$(dirname "$0")/../../.."
OUT=${OUT:-build/gpu/logs}
B=build/dn
mkdir -p "$OUT" "$B"
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc)
NF="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I. -Xcompiler -Wall"
LIB=${ENGINE_LIB:-build/gpu/libengine.a} # tests/gpu/run.sh's build: link its deltanet objects, compile the bench alone
{
    if [ -f "$LIB" ]; then
        "$NVCC" $NF -o "$B/bench_dn_rule" tests/bench/gpu/bench_dn_rule.cu "$LIB"
    else
    pids=""
    for f in kernels/deltanet.cu kernels/deltanet_chunk.cu kernels/deltanet_chunk_bwd.cu tests/bench/gpu/bench_dn_rule.cu; do
        "$NVCC" $NF -c -o "$B/$(basename "$f" .cu).o" "$f" & pids="$pids $!"
    done
    rc=0
    for p in $pids; do wait "$p" || rc=1; done
    [ $rc = 0 ] && "$NVCC" $NF -o "$B/bench_dn_rule" "$B"/deltanet.o "$B"/deltanet_chunk.o "$B"/deltanet_chunk_bwd.o "$B"/bench_dn_rule.o
    fi
} >"$OUT/dn_build.log" 2>&1
rc=$?
echo "bench_dn_rule build exit $rc"
if [ $rc != 0 ]; then tail -20 "$OUT/dn_build.log"; exit 1; fi
timeout 60 "$B/bench_dn_rule" "$@" >"$OUT/dn_rule.log" 2>&1
rc=$?
echo "bench_dn_rule exit $rc" >>"$OUT/dn_rule.log"
if [ "${NCU:-0}" = 1 ]; then
    NCU_BIN=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    # the chunked forward (prep, plan, wy, walk) then backward (prep, plan, wy, walk, rev, grad, qk, gate)
    timeout ${NCU_S:-90} "$NCU_BIN" --clock-control none --metrics gpu__time_duration.sum --launch-count 12 \
        "$B/bench_dn_rule" "$@" >"$OUT/dn_ncu.log" 2>&1
    echo "ncu exit $?" >>"$OUT/dn_ncu.log"
    grep -E "^  [a-z_]+.*\(|gpu__time_duration" "$OUT/dn_ncu.log" | paste - - | \
        sed -E 's/^  (void )?([a-zA-Z_0-9]+).*gpu__time_duration.sum +([a-z]+) +([0-9.,]+).*/\2 \4 \3/' >"$OUT/dn_ncu.txt"
    cat "$OUT/dn_ncu.txt"
fi
cat "$OUT/dn_rule.log"
exit $rc
