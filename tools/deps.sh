#!/bin/bash
# make deps: install the Debian and Python packages grpod's build and tests need.
# Idempotent: does nothing when everything is present. tools/deps.sh --test adds what only the
# tests need.
set -eu
debs="libmicrohttpd-dev libjson-c-dev libuv1-dev libsqlite3-dev libpcre2-dev pkg-config curl clang libclang-rt-14-dev systemd"
pips="tokenizers pytest requests numpy"
# --test (make test, make deps, make sanitize; not make run): chromium, the dashboard test's
# headless browser (tests/integration/test_dashboard.py), libomp-14-dev (OpenMP for clang, which
# builds make sanitize's variants) and the official openai client (test_openai.py)
if [ "${1:-}" = --test ]; then
  debs="$debs chromium libomp-14-dev"
  pips="$pips openai"
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
  python3 -c "import $p" 2>/dev/null || pmissing="$pmissing $p"
done
if [ -n "$pmissing" ]; then
  echo "deps: installing Python packages:$pmissing"
  python3 -m pip install -q $pmissing
fi
exit 0
