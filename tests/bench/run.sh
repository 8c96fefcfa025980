#!/bin/bash
# make bench: the CPU benchmarks, one after another; each prints its own table.
# Results worth keeping go to docs/benchmarks.md with the date, CPU and command.
set -eu
cd "$(dirname "$0")/../.."
echo "== tokenizer (single-threaded encode, grpod vs HF tokenizers)"
python3 tests/bench/tokenizer_bench.py "$@"
echo
echo "== one forward+backward pass, packed P+NR vs standard N(P+R) (cpu backend)"
build/bench/step_bench 512 8 64
