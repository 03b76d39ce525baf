#!/usr/bin/env bash
# The natural far share of text (REPORT.md section 4): the commands that made
# results/far_share/*.json. Run from the repository root; about 10 minutes on 2 cores.
# pystdlib is this Python's standard library: its numbers depend on the Python version, which
# each JSON records.
set -euo pipefail
SWAX=${SWAX:-.venv/bin/swax}
OUT=experiments/regime_study/results/far_share
for source in kjv pystdlib; do
  for tok in byte gpt2; do
    "$SWAX" data far-share "$source" --tokenizer "$tok" --seq-lens 256,4k,16k \
      --divisors 128,32,8,4 --out "$OUT/$source-$tok.json"
  done
done
