#!/bin/bash
# check_floors.sh — fails when a source file includes a floor above its own, or a library that
# its floor must not see. The floors (DESIGN.md): daemon → api → store, daemon → engine → kernels,
# all → common; api reads the engine's public types (engine.h, train/loss.h, params.h) but never
# kernels/. Inside engine/ the rooms have floors of their own (may_room below): a room includes
# only the rooms beneath it, and the engine's own files (engine/*.h, the facade and the engine
# object) are the top. Tests stay outside struct eng (below), and no source names an issue number
# (comments state contracts). Run by tests/run.sh, so `make test` enforces it. Prints each offending line.
# Usage: check_floors.sh [ROOT] — ROOT is the tree to check (default: this repository; the test
# tests/tools/test_check_floors.py checks a copy with an upward include injected).
set -u
cd "${1:-$(dirname "$0")/..}" || exit 2
# floor: the project directories its files may include ("" = only itself and common/)
declare -A may=(
  [common]="common"
  [kernels]="kernels common"
  [engine]="engine kernels common"
  [store]="store common"
  [api]="api store engine common"
  [daemon]="daemon api store engine common"
)
# floor: system headers it must not include (HTTP, SQL, JSON library, event loop stay up top)
declare -A banned=(
  [common]="microhttpd.h sqlite3.h json-c/ uv.h cuda"
  [kernels]="microhttpd.h sqlite3.h json-c/ uv.h"
  [engine]="microhttpd.h sqlite3.h json-c/ uv.h"
  [store]="microhttpd.h json-c/ uv.h cuda"
  [api]="sqlite3.h uv.h cuda"
)
# engine room: the engine rooms (and other floors) its files may include; "top" = engine/*.h
declare -A may_room=(
  [format]="format"
  [text]="text format"
  [backend]="backend"
  [dist]="dist backend"
  [model]="model backend format"
  [rollout]="rollout model backend text format top"
  [train]="train model backend dist format top"
  [top]="top format text backend dist model rollout train"
)
# room_of PATH: the engine room of a path under engine/ (top for engine/x.h)
room_of() { local r=${1#engine/}; case $r in */*) echo "${r%%/*}" ;; *) echo top ;; esac; }
bad=0
for floor in "${!may[@]}"; do
  for f in $(find "$floor" -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' | sort); do
    while IFS=: read -r n inc; do
      dir=${inc%%/*}
      [ "$dir" = "$inc" ] && continue             # "x.h" without a directory: same folder
      case " ${may[$floor]} " in *" $dir "*) ;; *)
        echo "$f:$n: $floor/ may not include $inc (allowed: ${may[$floor]})"; bad=1 ;; esac
      if [ "$floor" = engine ] && [ "$dir" = engine ]; then
        from=$(room_of "$f"); to=$(room_of "$inc")
        case " ${may_room[$from]:-} " in *" $to "*) ;; *)
          echo "$f:$n: engine/$from may not include $inc (allowed rooms: ${may_room[$from]:-none})"; bad=1 ;; esac
      fi
    done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$f" | sed -E 's/^([0-9]+):.*"([^"]+)".*/\1:\2/')
    for lib in ${banned[$floor]:-}; do
      grep -nE "^[[:space:]]*#[[:space:]]*include[[:space:]]+<$lib" "$f" | while IFS=: read -r n _; do
        echo "$f:$n: $floor/ may not include <$lib…>"; done | grep . && bad=1
    done
  done
done
# Tests read the engine through its public headers and the rooms' test-only headers
# (engine/engine_testing.h, engine/train/train_testing.h), never struct eng itself; these
# programs build a model's forward by hand from the engine's buffers and keep the inside view.
inside_ok="tests/gpu/test_greedy.c tests/bench/gpu/bench_grpo.c tests/bench/gpu/bench_rollout.c
  tests/bench/gpu/bench_dp.c tests/bench/gpu/bench_lora.c"
inside_ok="$inside_ok tests/bench/gpu/bench_exact_gap.c" # random engines at 1.7B/8B dims, state compared
for f in $(find tests -name '*.c' -o -name '*.h' | sort); do
  case " $(echo $inside_ok) " in *" $f "*) continue ;; esac
  grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"engine/engine_internal\.h"' "$f" | while IFS=: read -r n _; do
    echo "$f:$n: tests may not include engine/engine_internal.h (use engine/engine_testing.h)"; done | grep . && bad=1
done
# Comments state contracts, not history: no issue numbers in the source (they belong in commit
# messages and docs/benchmarks.md). The committed fixtures' data is generated, not read as code.
hist=$(grep -rnIiE 'issues? #?[0-9]' --include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' \
  --include='*.sh' --include='*.py' --include=Makefile common engine kernels api daemon store tests tools Makefile |
  grep -v '^tests/fixtures/data/')
[ -n "$hist" ] && { echo "$hist" | sed 's/$/   <- an issue number in the source (state the contract)/'; bad=1; }
[ $bad = 0 ] && echo "floors: no upward include, no issue number in the source"
exit $bad
