#!/usr/bin/env bash
# `make bench`: quick sizes of every benchmark, each printing its table. Big runs: docs/benchmarks.md.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}

# Operator at scale: 50 jobs x 8 pods on 58+ KWOK p5 nodes, heartbeats live (~3 min on 2 cores).
"$PY" bench/operator_scale.py --jobs 50 --faults 20 --run-dir .run/bench-operator-scale
