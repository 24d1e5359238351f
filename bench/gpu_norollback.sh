#!/usr/bin/env bash
# Device call (2xH200), issue 14: recovery without rollback on the product path (rtj-trainer
# rendezvous + launch -> ft_launcher 0.7 -> fsdp_train, 1.14 B params, NCCL). Per fault (exception,
# rank SIGKILL, SIGTERM): seconds to the first step and steps lost, with the memory tier (every 10
# steps, /dev/shm) and without it; throughput with memory snapshots every 10 steps vs none.
# ~7 min; split with RUNS=faults,faults-persist-only then RUNS=sigterm,throughput if needed.
# RUNS=goodput: a fault a minute, the product next to the seed's approach, GOODPUT_SECONDS each
# (default 240: two runs must fit in one 10-minute device call; the issue's 480 needs two calls).
# THROUGHPUT_STEPS: steps of each throughput run (default 100). GRACE_SECONDS: the pod's grace period
# in the sigterm run (default 30).
# NPROC=1 on one GPU (the faults then hit rank 0, which holds the whole state). BENCH_TIMEOUT: seconds
# for the benchmark (default 580). RUNS=faults,faults-plain-ranks: in-job restart phases with and without
# the rank forkserver.
set -u
source bench/gpu_env.sh
{ df -h /dev/shm /tmp; free -g; } 2>&1 | tee "$OUT/norollback_env.txt"
RUNS=${RUNS:-faults,faults-persist-only,sigterm,throughput}
# THREADS=n: the throughput run also writes memory snapshots with n threads (another row); PINNED=1:
# also a row with GPU staging off (snapshots through pinned buffers), in the same call; MEMORY_ONLY=1:
# also a row with memory snapshots and no persist during its steps (the memory tier's own cost);
# RUNS=write-threads: the memory-tier write time for 1..16 threads (bench/snapshot_write_threads.py).
THREADS=${THREADS:-0}
if [[ ",$RUNS," == *",write-threads,"* ]]; then
  timeout 300 python3 bench/snapshot_write_threads.py --device cuda --gb 6.85 --threads 1,2,4,8,16 \
      --out "$OUT/snapshot_write_threads.json" 2>&1 | tail -12 | tee "$OUT/snapshot_write_threads.txt"
  RUNS=$(echo ",$RUNS," | sed 's/,write-threads,/,/; s/^,//; s/,$//')
fi
[[ -z "$RUNS" ]] && exit 0
# The memory tier needs up to 3 snapshots x 6.85 GB x 2 ranks of tmpfs: /dev/shm, or our own tmpfs
# when a container's /dev/shm is smaller than that.
MEMDIR=/dev/shm/rtj-norollback-bench
if (( $(df --output=avail -k /dev/shm | tail -1) < 48 * 1024 * 1024 )); then
  mkdir -p /tmp/rtj-shm && mount -t tmpfs -o size=64g tmpfs /tmp/rtj-shm && MEMDIR=/tmp/rtj-shm/bench
  echo "memory tier on $MEMDIR"; df -h /tmp/rtj-shm | tail -1
fi
timeout "${BENCH_TIMEOUT:-580}" python3 bench/norollback_recovery.py --nproc "${NPROC:-2}" --only "$RUNS" --memory-interval 10 --memory-dir "$MEMDIR" \
    --persist-interval 40 --steps 150 --exception-step 50 --sigkill-step 100 --sigterm-step 60 --grace-seconds "${GRACE_SECONDS:-30}" \
    --throughput-steps "${THROUGHPUT_STEPS:-100}" --snapshot-write-threads "$THREADS" ${PINNED:+--pinned-row} ${MEMORY_ONLY:+--memory-only-row} --timeout 240 \
    --goodput-seconds "${GOODPUT_SECONDS:-240}" --goodput-step-s 0.19 --out "$OUT/norollback.json" $MODEL > "$OUT/norollback.log" 2>&1
echo "norollback rc $?"
grep -v "^\[rank\|^W1\|^I1\|socket.cpp" "$OUT/norollback.log" | grep "^|\|relative\|phases\|RESULT\|Error" | tail -20
for d in /tmp/rtj-norollback-bench/*/; do  # launcher logs (tails) and the ranks' step logs
  n=$(basename "$d")
  for f in "$d"launch*.log; do tail -c 200000 "$f" > "$OUT/$n-$(basename "$f")"; done
  cat "$d"logs/rank-*.jsonl > "$OUT/$n-steps.jsonl" 2>/dev/null
done
rm -rf "$MEMDIR"; mountpoint -q /tmp/rtj-shm && umount /tmp/rtj-shm
