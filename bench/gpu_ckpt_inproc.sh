#!/usr/bin/env bash
# Device call 1 (2xH200): environment, issue 9.1 bench/ckpt_stall.py, issue 9.2
# bench/inprocess_recovery.py (stock vs tuned). Everything lands in $OUT.
set -u
source bench/gpu_env.sh
{
  date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, importlib.metadata as m; print('torch', torch.__version__, 'gpus', torch.cuda.device_count(), 'nvrx', m.version('nvidia-resiliency-ext'))"
  nproc; df -h /tmp | tail -1
  dd if=/dev/zero of=/tmp/ddtest bs=1M count=4096 oflag=direct 2>&1 | tail -1; rm -f /tmp/ddtest
} 2>&1 | tee "$OUT/env.txt"
timeout 340 torchrun --nproc-per-node 2 --master-port 29500 bench/ckpt_stall.py $MODEL --steps 60 --interval 20 \
    --dir /tmp/ckbench --out "$OUT/ckpt_stall.json" > "$OUT/ckpt_stall.log" 2>&1
echo "ckpt_stall rc $?"; grep -v "^\[rank\|^W1\|^I1" "$OUT/ckpt_stall.log" | grep "ckpt_stall\]\|^|\|floor\|params\|rank0\|Error\|error" | tail -30
port=29600
for c in stock tuned; do
  port=$((port + 10))
  timeout 100 torchrun --nproc-per-node 2 --master-port $port bench/inprocess_recovery.py --config $c $MODEL \
      --out "$OUT/inproc_$c.json" > "$OUT/inproc_$c.log" 2>&1
  echo "inproc $c rc $?"; grep "RESULT\|Error" "$OUT/inproc_$c.log" | tail -5
done
