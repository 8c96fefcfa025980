#!/bin/bash
# make sanitize: the tests again under the sanitizers, on binaries that `make sanitize` built
# first with clang and CUDA=0 (the CPU backend) in build directories of their own:
#   build/asan  AddressSanitizer + UndefinedBehaviorSanitizer (-fno-sanitize-recover=all) and
#               LeakSanitizer: every unit test, then the integration tests in ASAN_TESTS.
#   build/tsan  ThreadSanitizer: the unit tests in TSAN_UNITS and the integration tests in
#               TSAN_TESTS (the Makefile says which and why).
# Every report goes to a file of its own (log_path: build/sanitize-logs/SUITE/asan.PID, ubsan.PID
# or tsan.PID), so a report from a daemon that a test kills, or whose exit status no test reads,
# still fails the run: any report file is a failure, and its first lines are printed here.
# OpenMP under TSan: the OpenMP runtime (libomp, as libgomp) is not instrumented, so TSan cannot
# see its barriers and reports what a region hands between its pool threads as races (false
# positives: the runtime's own memory inside kernels/attention_cpu.c's region, the engine thread's
# writes after another). OMP_THREAD_LIMIT=1 runs every region on one thread (OMP_NUM_THREADS would
# not do: the cpu backend sets its thread count with omp_set_num_threads); the threads the daemon
# and the comms start themselves stay checked.
# Prints a row a suite and ends with "sanitize: N passed, N failed"; exit 1 on any failure.
set -u
cd "$(dirname "$0")/.."
: "${ASAN_TESTS:?} ${TSAN_UNITS:?} ${TSAN_TESTS:?}"
logs=build/sanitize-logs
rm -rf "$logs"; mkdir -p "$logs"
pass=0; fail=0

# reports DIR: 0 when the sanitizers wrote no report under DIR; else prints the first of them.
# A file that holds only LeakSanitizer's own crash ("Tracer caught signal", "LeakSanitizer has
# encountered a fatal error": its stop-the-world tracer failing at a process's exit on a busy
# machine, no finding about grpod) is printed and not counted; any other line in it counts.
reports() {
  local files r found=0
  files=$(find "$1" -name 'asan.*' -o -name 'ubsan.*' -o -name 'tsan.*' 2>/dev/null | sort)
  [ -z "$files" ] && return 0
  for r in $files; do
    if ! grep -q -v -E '^Tracer caught signal|^==[0-9]+==(LeakSanitizer has encountered a fatal error|HINT: )|^$' "$r"; then
      echo "    not counted, LeakSanitizer's own crash: $r"
      continue
    fi
    found=1
    echo "    report $r:"
    grep -m1 -E 'ERROR|WARNING|runtime error' "$r" | sed 's/^/    | /'
    grep -m6 -E '^ *#[0-9]' "$r" | sed 's/^/    | /'
  done
  return $found
}

# row NAME PASSED FAILED: one line of the summary, added to the totals.
row() {
  printf '%-34s %3d passed %3d failed\n' "$1" "$2" "$3"
  pass=$((pass + $2)); fail=$((fail + $3))
}

# unit SAN BIN: one unit-test binary; a non-zero exit or a report is a failure even without a
# FAIL line, except the exit of LeakSanitizer's own crash (reports' "not counted").
unit() {
  local san=$1 bin=$2 name dir p f rc
  name=$(basename "$bin"); dir=$logs/$san-$name; mkdir -p "$dir"
  timeout 900 "$bin" >"$dir/out.log" 2>&1; rc=$?
  p=$(grep -c '^PASS ' "$dir/out.log"); f=$(grep -c '^FAIL ' "$dir/out.log")
  reports "$dir" >"$dir/reports.txt" || { [ "$f" = 0 ] && f=1; }
  # a non-zero exit counts unless LeakSanitizer's own crash at exit is what set it
  [ "$rc" != 0 ] && [ "$f" = 0 ] && ! grep -q "not counted, LeakSanitizer's own crash" "$dir/reports.txt" && f=1
  row "$san $name" "$p" "$f"
  grep '^FAIL ' "$dir/out.log" | sed 's/^/    /'
  [ "$rc" != 0 ] && echo "    exit $rc" && tail -3 "$dir/out.log" | sed 's/^/    | /'
  cat "$dir/reports.txt"
}

# integration SAN GRPOD FILES: the integration test files against the daemon GRPOD (pytest's
# summary gives the counts; a report from any daemon fails the suite).
integration() {
  local san=$1 bin=$2 dir p f rc; shift 2
  dir=$logs/$san-integration; mkdir -p "$dir"
  # 40 minutes: asan's 202 tests passed 20 minutes at the 168th on two idle cores (2026-11-29)
  GRPOD_BIN=$PWD/$bin timeout 2400 python3 -m pytest -q -p no:cacheprovider "$@" >"$dir/out.log" 2>&1; rc=$?
  p=$(grep -oE '[0-9]+ passed' "$dir/out.log" | tail -1 | cut -d' ' -f1)
  f=$(grep -oE '[0-9]+ (failed|error)' "$dir/out.log" | awk '{ s += $1 } END { print s + 0 }')
  [ "$rc" != 0 ] && [ "$f" = 0 ] && f=1
  reports "$dir" >"$dir/reports.txt" || f=$((f + 1))
  row "$san integration ($#)" "${p:-0}" "$f"
  [ "$rc" != 0 ] && grep -E '^(FAILED|ERROR) ' "$dir/out.log" | sed 's/^/    /'
  cat "$dir/reports.txt"
}

t0=$(date +%s)
for bin in build/asan/tests/test_*; do
  case $bin in *.d) continue ;; esac
  ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:log_path=$PWD/$logs/asan-$(basename "$bin")/asan" \
  UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$PWD/$logs/asan-$(basename "$bin")/ubsan" \
    unit asan "$bin"
done
ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:log_path=$PWD/$logs/asan-integration/asan" \
UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$PWD/$logs/asan-integration/ubsan" \
  integration asan build/asan/grpod $ASAN_TESTS
t1=$(date +%s)
for name in $TSAN_UNITS; do
  OMP_THREAD_LIMIT=1 TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:log_path=$PWD/$logs/tsan-$name/tsan" \
    unit tsan "build/tsan/tests/$name"
done
OMP_THREAD_LIMIT=1 TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:log_path=$PWD/$logs/tsan-integration/tsan" \
  integration tsan build/tsan/grpod $TSAN_TESTS
t2=$(date +%s)
echo "asan+ubsan $((t1 - t0)) s, tsan $((t2 - t1)) s (logs: $logs)"
echo "sanitize: $pass passed, $fail failed"
[ "$fail" = 0 ]
