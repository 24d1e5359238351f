#!/usr/bin/env bash
# One device call (one GPU; 6-8 min on an H100 host on 2026-12-06, before persist_copy) for the rows of
# docs/benchmarks.md "Recovery at the hardware's limit": the GPU staging path's parts next to their
# floors (bench/snapshot_paths.py), how long a slot's populate holds other threads' mmaps
# (bench/populate_lock.py), the persisted copy of a 13.7 GB snapshot against the loop it replaced
# (bench/persist_copy.py),
# the GPU smoke with the memory tier on (exception, stall, SIGKILL; its `memory_snapshots` says how
# many writes were staged on the GPU), throughput with memory snapshots every 10 steps staged /
# pinned / none in the same call, and a SIGTERM with a 15 s grace. Each part has its own time limit,
# so a part cut short leaves the others' results; the call returns at most 8 files, so the logs come
# back as one archive.
#
# Here first: `bash bench/gpu_wheels.sh`. The call: carry [".whl"], command
# `bash bench/gpu_hardware_limit.sh`. PARTS (default all: paths,populate,persist,smoke,norollback)
# picks parts when one call must fit fewer; THREADS=n adds a throughput row with n snapshot copy
# threads (`snapshot_write_threads`) to the norollback part; PINNED= (empty) leaves out its row with GPU
# staging off; MEMORY_ONLY=1 adds a throughput row with no persist during its steps; NORB_RUNS
# (default throughput,sigterm) picks the norollback part's runs;
# HANG_KIND=hang makes the smoke's hang a rank blocked in a system call (default: a stall);
# PARTS=goodput (not in the default) runs the product's goodput window alone; PARTS=prepare (not
# in the default) times the memory tier's slot preparation (bench/slot_prepare.py, PREPARE_RUNS
# rounds); PARTS=drain (not in
# the default) times the snapshot drain's cost to the training thread (DRAIN_ARGS="--no-drain
# --rounds 2": only a persist in a thread of the rank against one in a child process); PARTS=copier (not in
# the default) times a SIGKILLed rank's teardown, its drains and a restarted rank's load with and
# without the pod's slot copier (bench/slot_copier.py, 13.7 GB, COPIER_RUNS rounds, default 2).
# THREAD_STATES=1: while the smoke, goodput and norollback parts run, bench/thread_states.py
# records what the trainer's threads wait on in the kernel (threads-<part>.jsonl in the archive).
set -u
source bench/gpu_env.sh
RESULTS=$OUT
PARTS=",${PARTS:-paths,populate,persist,smoke,norollback},"
part() { [[ "$PARTS" == *",$1,"* ]]; }
SAMPLER=
sample_threads() {  # $1: the part; until stop_sampling
    [[ -n "${THREAD_STATES:-}" ]] || return 0
    python3 bench/thread_states.py record --match rtj_trainer --seconds 900 --interval 0.005 --out "/tmp/threads-$1.jsonl" &
    SAMPLER=$!
}
stop_sampling() { [[ -n "$SAMPLER" ]] && kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null; SAMPLER=; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$RESULTS/gpu.txt"
rm -rf /dev/shm/rtj-*
part paths && timeout 70 python3 bench/snapshot_paths.py --gb 13.7 --dir /dev/shm --threads 1,4,8 \
    --out "$RESULTS/snapshot_paths.json" > /tmp/snapshot_paths.log 2>&1
echo "snapshot_paths rc $?"
rm -rf /dev/shm/rtj-*
# drain: the memory tier's drain beside small GPU ops, by chunk size and copy threads, and a
# 13 GiB persist in a thread of the process against one in a child process (not in the default PARTS).
if part drain; then
    timeout "${DRAIN_TIMEOUT:-240}" python3 bench/drain_interference.py --device cuda --gib 13 --rounds 3 --persist /tmp ${DRAIN_ARGS:-} \
        --out "$RESULTS/drain_interference.json" > /tmp/drain_interference.log 2>&1
    echo "drain_interference rc $? (124: timed out)"; cat /tmp/drain_interference.log
fi
rm -rf /dev/shm/rtj-*
if part copier; then
    timeout "${COPIER_TIMEOUT:-240}" python3 bench/slot_copier.py --device cuda --gb 13.7 --runs "${COPIER_RUNS:-2}" \
        --dir /dev/shm > "$RESULTS/slot_copier.json" 2> /tmp/slot_copier.log
    echo "slot_copier rc $? (124: timed out)"; cat "$RESULTS/slot_copier.json"; tail -5 /tmp/slot_copier.log
fi
rm -rf /dev/shm/rtj-*
# prepare (not in the default): how soon the first memory snapshot can be taken (bench/slot_prepare.py).
if part prepare; then
    timeout "${PREPARE_TIMEOUT:-120}" python3 bench/slot_prepare.py --gb 13.7 --runs "${PREPARE_RUNS:-2}" \
        --out "$RESULTS/slot_prepare.json" > /tmp/slot_prepare.log 2>&1
    echo "slot_prepare rc $? (124: timed out)"; tail -3 /tmp/slot_prepare.log
fi
rm -rf /dev/shm/rtj-*
part populate && timeout 40 python3 bench/populate_lock.py --gb 13.7 --dir /dev/shm --out "$RESULTS/populate_lock.json" \
    > /tmp/populate_lock.log 2>&1
echo "populate_lock rc $?"; cat "$RESULTS/populate_lock.json"
part persist && timeout "${PERSIST_TIMEOUT:-150}" python3 bench/persist_copy.py --gb 13.7 --src /dev/shm --dst /tmp \
    --threads "${PERSIST_THREADS:-1,4,8}" ${PERSIST_NO_LOOP:+--no-loop} --out "$RESULTS/persist_copy.json" > /tmp/persist_copy.log 2>&1
echo "persist_copy rc $?"; cat "$RESULTS/persist_copy.json"
rm -rf /dev/shm/rtj-*
part smoke && sample_threads smoke
part smoke && timeout 150 python3 bench/gpu_smoke.py --nproc 1 --steps 200 --hang-step 100 --sigkill-step 150 \
    --hang-kind "${HANG_KIND:-stall}" --memory-dir /dev/shm/rtj-smoke --timeout 145 --out "$RESULTS/gpu_smoke.json" > /tmp/gpu_smoke.log 2>&1
echo "gpu_smoke rc $?"
stop_sampling
mkdir -p /tmp/smoke-logs && cp /tmp/rtj-smoke-*/logs/*.jsonl /tmp/smoke-logs/ 2>/dev/null
# The smoke's persisted checkpoints (13.7 GB each) would leave the next part no disk.
rm -rf /dev/shm/rtj-* /tmp/rtj-smoke-*
# goodput: the product's goodput run alone (the seed's approach beside it: RUNS=goodput bash
# bench/gpu_norollback.sh, a call of its own); not in the default PARTS.
part goodput && sample_threads goodput
part goodput && mkdir -p /tmp/goodput && OUT=/tmp/goodput NPROC=1 RUNS=goodput-product BENCH_TIMEOUT=330 \
    bash bench/gpu_norollback.sh > /tmp/goodput/summary.txt 2>&1
stop_sampling
part goodput && { tail -8 /tmp/goodput/summary.txt; cp /tmp/goodput/norollback.json "$RESULTS/goodput.json"; \
    cp /tmp/goodput/goodput-product-steps.jsonl /tmp/goodput/goodput-product-launch.log "$RESULTS/"; \
    rm -rf /tmp/rtj-norollback-bench; }
part smoke && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d)[:3000])" \
    "$RESULTS/gpu_smoke.json"
df -h / | tail -1
mkdir -p /tmp/norollback
part norollback && sample_threads norollback
part norollback && OUT=/tmp/norollback THREADS=${THREADS:-0} NPROC=1 RUNS=${NORB_RUNS:-throughput,sigterm} THROUGHPUT_STEPS=120 PINNED=${PINNED-1} MEMORY_ONLY=${MEMORY_ONLY:-} GRACE_SECONDS=15 \
    BENCH_TIMEOUT=300 bash bench/gpu_norollback.sh > /tmp/norollback/summary.txt 2>&1
echo "norollback rc $?"
stop_sampling
cp /tmp/norollback/norollback.json "$RESULTS/" 2>/dev/null
tail -40 /tmp/norollback/summary.txt
tar czf "$RESULTS/logs.tgz" -C /tmp slot_prepare.log snapshot_paths.log drain_interference.log slot_copier.log populate_lock.log persist_copy.log gpu_smoke.log smoke-logs norollback $(cd /tmp && ls threads-*.jsonl 2>/dev/null) \
    2>/dev/null
ls -la "$RESULTS"
