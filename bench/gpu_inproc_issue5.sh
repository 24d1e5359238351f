#!/usr/bin/env bash
# Device call 3 (2xH200): after the fix (poll instead of a blocking CUDA sync in the training loop),
# issue 9.2 stock config again and issue 5 under ft_launcher with an in-process and an in-job restart.
set -u
source bench/gpu_env.sh
timeout 80 torchrun --nproc-per-node 2 --master-port 29610 bench/inprocess_recovery.py --config stock $MODEL \
    --out "$OUT/inproc_stock.json" > "$OUT/inproc_stock.log" 2>&1
echo "inproc stock rc $?"; grep "RESULT" "$OUT/inproc_stock.log" | tail -1
# issue 5 section only (lines between the markers of gpu_ft_scaling.sh)
sed -n '/^# --- issue 5/,/^# --- issue 8/p' bench/gpu_ft_scaling.sh > /tmp/issue5.sh
source /tmp/issue5.sh
