#!/bin/bash
# toy_shared.sh — the toy task (examples/train_toy.py, 40 steps) on the CPU backend, once on
# an otherwise idle machine and once next to one busy process (`yes > /dev/null`), each
# repeated; prints the wall seconds of every run and the busy / idle ratio of the medians.
# The engine runs with the daemon's defaults unless GRPOD_ARGS adds flags
# (e.g. GRPOD_ARGS="--engine-threads 2"); OMP_* in the environment pass through.
#   tests/bench/toy_shared.sh [REPEATS=3] [STEPS=40]
# On a machine shared with other work, `nice -n -10 tests/bench/toy_shared.sh` (root) runs the
# daemon, the client and the busy process above the rest, which approximates an idle machine.
set -eu
cd "$(dirname "$0")/../.."
reps=${1:-3}
steps=${2:-40}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
tmp=$(mktemp -d)
pid=""; hog=""
cleanup() { [ -n "$hog" ] && kill "$hog" 2>/dev/null; [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

run_once() {   # one fresh daemon (policy version 0), one toy run; prints seconds
    rm -rf "$tmp/data"
    ./grpod serve --data-dir "$tmp/data" --listen 127.0.0.1:$port --backend cpu --log-level warn ${GRPOD_ARGS:-} 2>"$tmp/log" &
    pid=$!
    for _ in $(seq 600); do curl -fs 127.0.0.1:$port/readyz >/dev/null 2>&1 && break; sleep 0.1; done
    local t0 t1
    t0=$(date +%s.%N)
    python3 examples/train_toy.py --url http://127.0.0.1:$port --steps "$steps" --out "$tmp/out" >"$tmp/toy.log"
    t1=$(date +%s.%N)
    kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
    python3 -c "print('%.2f' % ($t1 - $t0))"
}

idle=(); busy=()
for i in $(seq "$reps"); do
    idle+=("$(run_once)")
    yes >/dev/null & hog=$!
    busy+=("$(run_once)")
    kill "$hog"; wait "$hog" 2>/dev/null || true; hog=""
    echo "run $i: idle ${idle[-1]} s, with one busy process ${busy[-1]} s"
done
python3 - "${idle[*]}" "${busy[*]}" <<'PY'
import statistics, sys
i = [float(x) for x in sys.argv[1].split()]; b = [float(x) for x in sys.argv[2].split()]
mi, mb = statistics.median(i), statistics.median(b)
print("median idle %.2f s, busy %.2f s, ratio %.2f" % (mi, mb, mb / mi))
PY
