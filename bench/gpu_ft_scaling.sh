#!/usr/bin/env bash
# Device call 2 (2xH200): issue 9.2 bench/inprocess_recovery.py (stock vs tuned), issue 5
# (fsdp_train.py under the trainer runtime = ft_launcher, NVRx 0.7, NCCL, 2 GPUs, with an
# in-process restart and an in-job restart), issue 8 bench/scaling.py. Everything lands in $OUT.
set -u
source bench/gpu_env.sh
port=29600
for c in tuned stock; do
  port=$((port + 10))
  timeout 85 torchrun --nproc-per-node 2 --master-port $port bench/inprocess_recovery.py --config $c $MODEL \
      --out "$OUT/inproc_$c.json" > "$OUT/inproc_$c.log" 2>&1
  echo "inproc $c rc $?"; grep "RESULT" "$OUT/inproc_$c.log" | tail -1
  grep "fn_ex\|Error" "$OUT/inproc_$c.log" | cut -c1-300 | head -4
done

# --- issue 5: the product path (rtj-trainer rendezvous + launch -> ft_launcher -> fsdp_train) ----
A=/tmp/issue5; rm -rf $A; mkdir -p $A
export RTJ_TRAINER_CONFIG=$(python3 - <<PY
import json
print(json.dumps({"jobName": "gpu-issue5", "command": ["python3", "-m", "rtj_trainer.examples.fsdp_train"],
  "args": "$MODEL --steps 120 --log-dir $A/logs".split(), "nnodes": 1, "nprocPerNode": 2,
  "rdzvEndpoint": "127.0.0.1:29800", "rdzvId": "gpu5", "maxInJobRestarts": 3, "heartbeatIntervalSeconds": 1,
  "rankHeartbeatTimeoutSeconds": 60, "rankInitialTimeoutSeconds": 180,
  "inProcess": {"enabled": True, "softTimeoutSeconds": 60, "hardTimeoutSeconds": 90, "maxRestarts": 3},
  "checkpointDir": "$A/ckpt", "checkpointIntervalSteps": 40, "checkpointsToKeep": 2, "maxNoProgressCycles": 3}))
PY
)
export RTJ_POD_NAME=gpu-issue5-n0-a0 RTJ_NAMESPACE=default RTJ_POD_IP=127.0.0.1 RTJ_STATUS_DIR=$A/status
export RTJ_COLLECTIVE_TIMEOUT_SECONDS=20 RTJ_FAULT_INJECT="exception:1:50;sigkill:1:90"
python3 -m rtj_trainer.entrypoint rendezvous > $OUT/issue5_rdzv.log 2>&1 &
RDZV=$!
sleep 3
timeout 165 python3 -m rtj_trainer.entrypoint launch > $OUT/issue5_launch.log 2>&1
echo "issue5 launch rc $?"
kill $RDZV 2>/dev/null
unset RTJ_TRAINER_CONFIG RTJ_FAULT_INJECT RTJ_STATUS_DIR RTJ_POD_NAME
cat $A/logs/rank-0.jsonl $A/logs/rank-1.jsonl > $OUT/issue5_steps.jsonl 2>/dev/null
ls $A/ckpt; cat $A/status/*.json 2>/dev/null | head -c 1500; echo
python3 - "$A/logs" <<'PY'
import json, os, statistics, sys
d = sys.argv[1]
for r in (0, 1):
    recs = [json.loads(x) for x in open(os.path.join(d, f"rank-{r}.jsonl"))]
    steps = [x for x in recs if "loss" in x]
    resumes = [(x["step"], x["iteration"], x["restart"]) for x in recs if x.get("event") == "resume"]
    med = statistics.median(x["dt"] for x in steps)
    by = {}
    for x in steps:
        by[(x["restart"], x["iteration"], x["step"])] = x
    rows = []
    for i, x in enumerate(steps):
        if x["save"] == "saved":
            nxt = steps[i + 1] if i + 1 < len(steps) else None
            stall = x["dt"] + (nxt["dt"] if nxt else med) - 2 * med
            rows.append((x["step"], round(stall, 3), x["snap"], nxt.get("copy") if nxt else None))
    print(f"rank {r}: resumes (step, in-process iteration, in-job restart) {resumes}; median step {med:.3f} s; "
          f"loss first {steps[0]['loss']} last {steps[-1]['loss']}; skipped {sum(x['save']=='skipped' for x in steps)}")
    print(f"rank {r}: saves (step, stall s, snapshot cpu s, gpu copy s): {rows}")
PY

# --- issue 8 ----------------------------------------------------------------------------------
timeout 215 python3 bench/scaling.py --gpus 1,2 --steps 40 --interval 20 --timeout 100 --out "$OUT/scaling.json" \
    -- $MODEL > "$OUT/scaling.log" 2>&1
echo "scaling rc $?"; grep -v "^W1\|^I1" "$OUT/scaling.log" | grep "^\[scaling\]\|^|\|scaling eff" | tail -12
