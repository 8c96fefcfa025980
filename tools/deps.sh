#!/bin/bash
# make deps: install the Debian and Python packages grpod's build and tests need.
# Idempotent: does nothing when everything is present. tools/deps.sh --test adds what only the
# tests need.
set -euf # -f: no globbing (pip specs hold brackets)
debs="libmicrohttpd-dev libjson-c-dev libuv1-dev libsqlite3-dev libpcre2-dev pkg-config curl clang libclang-rt-14-dev systemd"
pips="tokenizers pytest requests numpy"
# --test (make test, make deps, make sanitize; not make run): chromium, the dashboard test's
# headless browser (tests/integration/test_dashboard.py), libomp-14-dev (OpenMP for clang, which
# builds make sanitize's variants), the official openai client (test_openai.py) and
# lm-evaluation-harness with its API extra (test_lm_eval.py: its OpenAI models need no torch;
# about 1 min and 0.6 GB on a fresh machine).
# A pip entry is MODULES=SPEC where the import names differ from the package's (MODULES: what
# must import, comma-separated), else one name for both.
if [ "${1:-}" = --test ]; then
  debs="$debs chromium libomp-14-dev"
  pips="$pips openai lm_eval.models.openai_completions,tenacity=lm-eval[api]==0.4.13"
fi
missing=""
for p in $debs; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "deps: installing Debian packages:$missing"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
pmissing=""
for p in $pips; do
  python3 -c "import ${p%%=*}" 2>/dev/null || pmissing="$pmissing ${p#*=}"
done
if [ -n "$pmissing" ]; then
  echo "deps: installing Python packages:$pmissing"
  python3 -m pip install -q $pmissing
fi
exit 0
