#!/usr/bin/env bash
# Sourced by the gpu_*.sh scripts on the 2xH200 device machine: NVRx 0.7 (+ the deps the image
# lacks) from the carried wheels in .whl/, our packages on PYTHONPATH, NVLink multicast off.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
export PYTHONPATH="/tmp/site:$PWD/trainer-image:$PWD/operator:$PWD/hack"
export PATH="/tmp/site/bin:$PATH"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
# ~1.07 B params (FACTS anchor): fp32 master weights + AdamW state = 6.4 GB per rank on 2 GPUs.
MODEL="--dim 2048 --layers 20 --heads 16 --vocab 32000 --seq 2048 --batch 4"
