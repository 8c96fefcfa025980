#!/bin/bash
# make test: runs every unit-test binary (given as arguments), the floors check
# (tools/check_floors.sh), the fuzzer, then the Python tests under tests/ (pytest), then prints
# the one closing line "N passed, N failed".
# Unit binaries print "PASS name" / "FAIL name: why" lines; a binary that crashes or exits
# non-zero without a FAIL line counts as one failure.
set -u
cd "$(dirname "$0")/.."
pass=0; fail=0
log=build/test-logs; mkdir -p "$log"
for bin in "$@"; do
  name=$(basename "$bin")
  out="$log/$name.log"
  timeout 600 "$bin" >"$out" 2>&1; rc=$?
  p=$(grep -c '^PASS ' "$out"); f=$(grep -c '^FAIL ' "$out")
  if [ "$rc" != 0 ] && [ "$f" = 0 ]; then f=1; echo "FAIL $name: exit $rc" >>"$out"; fi
  pass=$((pass + p)); fail=$((fail + f))
  printf '%-28s %3d passed %3d failed\n' "$name" "$p" "$f"
  grep '^FAIL ' "$out" | sed 's/^/    /'
  [ "$rc" != 0 ] && [ "$f" != 0 ] && tail -5 "$out" | sed 's/^/    | /'
done
# Floors: no file includes a floor above its own (tools/check_floors.sh); one row.
if bash tools/check_floors.sh >"$log/floors.log" 2>&1; then
  pass=$((pass + 1)); printf '%-28s %3d passed %3d failed\n' check_floors 1 0
else
  fail=$((fail + 1)); printf '%-28s %3d passed %3d failed\n' check_floors 0 1; sed 's/^/    /' "$log/floors.log"
fi
# Fuzz: each libFuzzer target briefly from its seed corpus (the hostile-input reproducers among
# them): 20000 inputs or 10 s, whichever comes first. `make fuzz` runs them long.
fuzz_names="request reward safetensors config tokenizer"
if command -v clang >/dev/null 2>&1 && make -s $(printf 'build/fuzz_%s ' $fuzz_names) >"$log/fuzz-build.log" 2>&1; then
  for n in $fuzz_names; do
    rm -rf "build/fuzz-corpus/$n"; mkdir -p "build/fuzz-corpus/$n"
    dict=; [ -f "tests/fuzz/$n.dict" ] && dict="-dict=tests/fuzz/$n.dict"
    if timeout 300 "build/fuzz_$n" -runs=20000 -max_total_time=10 -max_len=65536 -timeout=10 $dict \
         "build/fuzz-corpus/$n" "tests/fuzz/corpus/$n" >"$log/fuzz_$n.log" 2>&1; then
      pass=$((pass + 1)); printf '%-28s %3d passed %3d failed\n' "fuzz_$n" 1 0
    else
      fail=$((fail + 1)); printf '%-28s %3d passed %3d failed\n' "fuzz_$n" 0 1
      grep -m3 -E 'ERROR|SUMMARY|runtime error' "$log/fuzz_$n.log" | sed 's/^/    /'
    fi
  done
else
  echo "fuzz: skipped (no clang, or build failed: $log/fuzz-build.log)"
fi
# Python tests (integration, tokenizer parity, lint of deploy files): one pytest run.
if ls tests/*/test_*.py >/dev/null 2>&1; then
  python3 -m pytest -q -p no:cacheprovider tests/ --junitxml="$log/pytest.xml" >"$log/pytest.log" 2>&1
  rc=$?
  tail -15 "$log/pytest.log"
  read -r p f < <(python3 - "$log/pytest.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    r = ET.parse(sys.argv[1]).getroot()
    s = r if r.tag == "testsuite" else r.find("testsuite")
    t, fl, er, sk = (int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    print(t - fl - er - sk, fl + er)
except Exception:
    print(0, 1)
PY
)
  [ "$rc" != 0 ] && [ "$f" = 0 ] && [ "$rc" != 5 ] && f=1
  pass=$((pass + p)); fail=$((fail + f))
fi
echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
