#!/usr/bin/env bash
# Fills .whl/ (git-ignored) with what the 2xH200 device image lacks for the trainer runtime, at the
# versions of this repository's venv: NVRx (the pinned one) and the pure-Python packages it and
# rtj_trainer import (the closure of their requirements in .venv, less the packages the device
# image lists). bench/gpu_env.sh installs them there. Usage: bench/gpu_wheels.sh [--titan]
#
# --titan: also torchtitan (the `titan` extra's pin, for bench/titan_smoke.py) and what it imports
# that the device image lacks, all pure Python: the closure of torchtitan 0.2.2's requirements as pip
# resolved it on 2026-12-03 (`pip install --dry-run --report`, torch 2.11.0 and the image's
# huggingface-hub 1.33.0, tokenizers 0.23.2 and numpy 2.5.2 as constraints), less the packages the
# device image lists. Left out: tomli (Python 3.12 has tomllib) and
# wandb (imported only when enabled).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python
NEEDED=(nvidia-resiliency-ext pydantic pydantic-core annotated-types typing-inspection defusedxml fastapi
  starlette uvicorn slowapi limits deprecated pydantic-settings python-dotenv grpcio-tools kubernetes
  aiohttp-retry websocket-client requests-oauthlib oauthlib durationpy opentelemetry-api tzdata)
TITAN_DEPS=(torchdata==0.11.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 tyro==1.0.17
  docstring-parser==0.18.0 typeguard==4.6.1)
titan=0
for arg in "$@"; do
  case "$arg" in
    --titan) titan=1 ;;
    *) echo "usage: $0 [--titan]" >&2; exit 2 ;;
  esac
done
mkdir -p .whl
pins=()
for name in "${NEEDED[@]}"; do
  pins+=("$name==$($PY -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")")
done
if [[ $titan == 1 ]]; then
  # torchtitan at the venv's version (the pin of the `titan` and `dev` extras).
  pins+=("torchtitan==$($PY -c "import importlib.metadata as m; print(m.version('torchtitan'))")" "${TITAN_DEPS[@]}")
fi
platforms=()
for n in 39 35 34 31 28 27 24 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
$PY -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" --platform manylinux2014_x86_64 --platform any -d .whl "${pins[@]}"
ls .whl
