#!/usr/bin/env bash
# Fills .whl/ (git-ignored) with what the 2xH200 device image lacks for the trainer runtime, at the
# versions of this repository's venv: NVRx (the pinned one) and the pure-Python packages it and
# rtj_trainer import (the closure of their requirements in .venv, less the packages the device
# image lists). bench/gpu_env.sh installs them there. Usage: bench/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python
NEEDED=(nvidia-resiliency-ext pydantic pydantic-core annotated-types typing-inspection defusedxml fastapi
  starlette uvicorn slowapi limits deprecated pydantic-settings python-dotenv grpcio-tools kubernetes
  aiohttp-retry websocket-client requests-oauthlib oauthlib durationpy opentelemetry-api tzdata)
mkdir -p .whl
pins=()
for name in "${NEEDED[@]}"; do
  pins+=("$name==$($PY -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")")
done
platforms=()
for n in 39 35 34 31 28 27 24 17; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
$PY -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" --platform manylinux2014_x86_64 --platform any -d .whl "${pins[@]}"
ls .whl
