#!/bin/bash
# tests/gpu/ep_multi.sh — expert parallelism's multi-GPU figures (step time, tokens/s/GPU, MFU,
# device peak) on the GPUs of one host, from the repository root: `OUT=dir bash tests/gpu/ep_multi.sh`.
#
# Engine (build/gpu/test_ep_cuda scale W L V G P N R NEW; one engine a GPU on its own thread,
# one NCCL comm; random weights at Qwen3-30B-A3B's dims, every layer MoE, V 151936):
#   weak    W = 1, 2, 4 (as many as there are GPUs) with L = 4 W layers: the same experts a GPU,
#           so the step's tokens/s/GPU should hold as W grows (W = 1 also without EP)
#   strong  L = 4 on W = 2, 4: the same model spread wider
#   long    the largest W with P = 4096 (the longer-prompt case)
#   full    all 48 layers (full-parameter Qwen3-30B-A3B dims, 30.5 B parameters) on the largest W
#           (FULL_W; FULL_L layers, 48) with the optimizer offloaded (EP_OFFLOAD=on: each rank's
#           shard and experts' fp32 master and moments in host memory) and the decode views'
#           expert stacks in the gradient buffer; its `SCALE plan|` line is the engine's memory
#           plan of rank 0. Where the host cannot hold the ranks' host state (2 H200s with 256 GiB:
#           366 GB of master and moments) the engine refuses naming both figures, and the line
#           says so (tests/unit/test_ep_plan.c prints the whole plan for W = 1, 2, 4, 8). The model
#           is drawn on every core (~100 s) and written to /tmp (~110 s for 61 GB).
#   Each prints a SCALE| line: update time (8 groups, P 1024, N 16, R 512 unless long), tokens/s/GPU
#   counted P + NR and N(P + R), MFU on the active parameters against 989 TFLOP/s a GPU, the
#   rollout (each rank its share of the groups, 64 tokens) and the most device memory in use.
# Daemon (when ./grpod and .devlibs are here): tests/bench/gpu/bench_daemon.py --dims 30b-a3b-l4,
#   one GPU without EP, then --gpus 0..W-1 --expert-parallel on every W > 1: the GRPO loop over
#   HTTP (rollout 8 x 16, P 1024, 512 tokens, then the update), tokens/s/GPU beside NeMo-RL's
#   published 1,102 tokens/s/GPU (Qwen3-30B-A3B, 32 H100s, 4K, on-policy, all 48 layers).
# The weak and strong cases keep the optimizer on the device (4 W layers a GPU fit beside a
#   9,216-token micro-batch); the full case writes a 61 GB bf16 model (122 GB of host memory
#   while written) to /tmp first.
# daemon-full (not in the default cases): bench_daemon.py --dims 30b-a3b (all 48 layers, a 61 GB
#   checkpoint written first) over --gpus 0..W-1 --expert-parallel on the largest W, FULL_STEPS (2).
# MOMENTS=bf16: the full and daemon-full cases hold AdamW's moments as bf16 (--optimizer-moments bf16:
#   8 bytes of host state a parameter, 227 GiB at 48 layers, which 2 H200s' 256 GiB host holds).
# Knobs: GPUS (default: all visible), CASES ("weak strong long full daemon"), SKIP_BUILD=1, FULL_W, FULL_L,
#   STEPS (daemon steps, 4); LPG (layers a GPU, 4), G (8), R (512), NEW (64), V (151936) make a quick check
#   smaller. Every figure here is a benchmark: nothing is asserted on time.
# Exit 0 when the build and every run succeeded, 1 otherwise; a summary table is printed last.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/gpu/ep_multi}
mkdir -p "$OUT"
B=build/gpu
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
NGPU=${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
CASES=${CASES:-weak strong long full daemon}
STEPS=${STEPS:-4}
LPG=${LPG:-4}
G=${G:-8}
R=${R:-512}
NEW=${NEW:-64}
V=${V:-151936}
T=$B/test_ep_cuda
rc_all=0
sum="$OUT/ep_multi_summary.txt"
: >"$sum"
echo "ep_multi: $NGPU GPU(s), cases: $CASES" | tee -a "$sum"

if [ "${SKIP_BUILD:-0}" != 1 ]; then
    NF=$(make -s NVCC="$NVCC" nccl-flags 2>/dev/null)
    NCF=${NF%%|*}
    NLD=${NF#*|}
    [ -n "$NCF" ] || { echo "ep_multi: NCCL not found (NCCL_HOME)" | tee -a "$sum"; exit 1; }
    {
        make -j"${NPROC:-$(nproc)}" BUILD=$B NVCC="$NVCC" $B/libengine.a &&
            ${CC:-cc} -O2 -std=gnu11 -fopenmp -pthread -I. -DGRPOD_CUDA -I"$CUDA_HOME/include" $NCF -o $T tests/gpu/test_ep_cuda.c \
                $B/libengine.a -fopenmp -lm -L"$CUDA_HOME/lib64" -Wl,-rpath,"$CUDA_HOME/lib64" -lcublasLt -lcublas $NLD -lcudart -lstdc++
    } >"$OUT/ep_multi_build.log" 2>&1 || {
        tail -5 "$OUT/ep_multi_build.log"
        echo "ep_multi: build FAILED" | tee -a "$sum"
        exit 1
    }
fi

# scale NAME W L [V G P N R NEW]: one engine run, its SCALE| lines into the summary
scale() {
    local name=$1
    shift
    timeout "${T_SCALE:-900}" "$T" scale "$@" >"$OUT/ep_$name.log" 2>&1
    local rc=$?
    grep -h '^SCALE|\|^scale ' "$OUT/ep_$name.log" >>"$sum"
    if [ $rc -ne 0 ] || grep -q '|failed$' "$OUT/ep_$name.log"; then
        echo "$name: exit $rc (see ep_$name.log)" | tee -a "$sum"
        rc_all=1
    fi
}
ws=""
for w in 1 2 4; do [ "$w" -le "$NGPU" ] && ws="$ws $w"; done
wmax=${ws##* }
for c in $CASES; do
    case $c in
    weak) for w in $ws; do scale "weak_w$w" "$w" $((LPG * w)) "$V" "$G" 1024 16 "$R" "$NEW"; done ;;
    strong) for w in $ws; do [ "$w" -gt 1 ] && scale "strong_w$w" "$w" "$LPG" "$V" "$G" 1024 16 "$R" "$NEW"; done ;;
    long) scale "long_w$wmax" "$wmax" $((LPG * wmax)) "$V" "$G" 4096 16 "$R" "$NEW" ;;
    full)
        fw=${FULL_W:-$wmax}
        EP_OFFLOAD=on EP_MOMENTS=${MOMENTS:-fp32} scale "full_w$fw" "$fw" "${FULL_L:-48}" "$V" "$G" 1024 16 "$R" "$NEW"
        grep -h '^SCALE plan|' "$OUT/ep_full_w$fw.log" >>"$sum"
        ;;
    daemon)
        if [ ! -x ./grpod ] || [ ! -d .devlibs ]; then
            echo "daemon: ./grpod and .devlibs not here (carry them): skipped" | tee -a "$sum"
            continue
        fi
        for w in $ws; do
            gp=$(seq -s, 0 $((w - 1)))
            args=(--dims 30b-a3b-l4 --steps "$STEPS" --port $((18900 + w)) --serve-arg=--checkpoint-on-exit=false)
            [ "$w" -gt 1 ] && args+=(--serve-arg=--gpus="$gp" --serve-arg=--expert-parallel)
            LD_LIBRARY_PATH=.devlibs timeout "${T_DAEMON:-900}" python3 tests/bench/gpu/bench_daemon.py ./grpod "$OUT/daemon_w$w" \
                "${args[@]}" >"$OUT/ep_daemon_w$w.log" 2>&1
            r=$?
            s=$(grep -h 'steady tokens/s/GPU' "$OUT/ep_daemon_w$w.log" | tail -1)
            echo "daemon W=$w${gp:+ (gpus $gp)}: exit $r; ${s:-no steady figure} (NeMo-RL: 1,102 tok/s/GPU, 48 layers, 32 H100s, 4K)" |
                tee -a "$sum"
            [ $r -eq 0 ] || rc_all=1
        done
        ;;
    daemon-full) # all 48 layers through the daemon on the largest W (its plan puts the optimizer in host memory)
        if [ ! -x ./grpod ] || [ ! -d .devlibs ]; then
            echo "daemon-full: ./grpod and .devlibs not here (carry them): skipped" | tee -a "$sum"
            continue
        fi
        gp=$(seq -s, 0 $((wmax - 1)))
        LD_LIBRARY_PATH=.devlibs timeout "${T_DAEMON:-900}" python3 tests/bench/gpu/bench_daemon.py ./grpod "$OUT/daemon_full" \
            --dims 30b-a3b --steps "${FULL_STEPS:-2}" --port 18910 --ready-timeout 600 --job-timeout 600 \
            --serve-arg=--checkpoint-on-exit=false --serve-arg=--gpus="$gp" --serve-arg=--expert-parallel \
            --serve-arg=--optimizer-moments="${MOMENTS:-fp32}" \
            >"$OUT/ep_daemon_full.log" 2>&1
        r=$?
        s=$(grep -h 'steady tokens/s/GPU' "$OUT/ep_daemon_full.log" | tail -1)
        echo "daemon-full W=$wmax (48 layers): exit $r; ${s:-no steady figure} (NeMo-RL: 1,102 tok/s/GPU, 48 layers, 32 H100s, 4K)" |
            tee -a "$sum"
        [ $r -eq 0 ] || rc_all=1
        ;;
    *) echo "unknown case $c" | tee -a "$sum" ;;
    esac
done
echo "---- ep_multi summary (benchmarks; $(date -u +%FT%TZ))"
cat "$sum"
exit $rc_all
