#!/usr/bin/env bash
# OCI-runtime smoke of the CPU trainer image (make images): one "pod" as one container (podman + runc,
# no network): `rtj-trainer rendezvous` and `rtj-trainer launch` -> ft_launcher -> 2 ranks of
# rtj_trainer.examples.fsdp_train, an exception injected before step 30 (in-process restart), 60 steps,
# checkpoints every 20. Passes when the launcher exits 0 having restarted in process once.
# Usage: hack/smoke-trainer-image.sh [IMAGE]
set -euo pipefail
IMAGE="${1:-localhost/rtj-trainer:cpu-local}"
LOG="$(mktemp -t rtj-trainer-smoke.XXXXXX.log)"
CFG='{"jobName":"smoke","command":["python","-m","rtj_trainer.examples.fsdp_train"],"args":["--steps","60"],
"nnodes":1,"nprocPerNode":2,"rdzvEndpoint":"127.0.0.1:29400","rdzvId":"smoke","maxInJobRestarts":2,
"heartbeatIntervalSeconds":1,"rankHeartbeatTimeoutSeconds":20,"rankInitialTimeoutSeconds":90,
"inProcess":{"enabled":true,"softTimeoutSeconds":15,"hardTimeoutSeconds":30,"maxRestarts":5},
"checkpointDir":"/ckpt","checkpointIntervalSteps":20,"checkpointsToKeep":2,"maxNoProgressCycles":2,
"doNotRestartExitCodes":[93,78]}'
# runc, not crun (this host's hybrid cgroups); rlimits within this host's own.
rc=0
timeout 600 podman run --rm --runtime runc --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
  --network none --shm-size 512m --tmpfs /ckpt:mode=1777 \
  -e RTJ_TRAINER_CONFIG="$CFG" -e RTJ_POD_NAME=pod0 -e RTJ_NAMESPACE=default -e RTJ_POD_IP=127.0.0.1 \
  -e RTJ_STATUS_DIR=/tmp/status -e OMP_NUM_THREADS=1 -e RTJ_FAULT_INJECT=exception:1:30 \
  --entrypoint sh "$IMAGE" -c 'rtj-trainer rendezvous >/tmp/rdzv.log 2>&1 & exec rtj-trainer launch' \
  >"$LOG" 2>&1 || rc=$?
grep -E "pod exit code|injecting" "$LOG" || true
if ((rc != 0)) || ! grep -q '"state":"Finished","inProcessRestarts":1' "$LOG"; then
  echo "FAILED (exit $rc); log: $LOG" >&2
  exit 1
fi
echo "trainer image smoke passed (log: $LOG)"
