#!/usr/bin/env bash
# The REAL Kueue manager, built from its Go module, admits ResilientTrainingJobs (docs/kueue.md;
# `make kueue-demo`). Starts a KWOK cluster of 4 fake p5 nodes (its own run dir and free ports; no node
# agent), Kueue's manager as a process (its CRDs applied, webhooks served but not registered, so the
# batch Job is created suspended by hand, as Kueue's webhook would), our operator as a process
# (`python -m rtj`, RTJ_KUEUE_ENABLED=true, default 30 s resync), a ResourceFlavor, a ClusterQueue with
# GPU quota for ONE 2-node job, a LocalQueue `team-a`; then a labelled batch Job and two labelled
# ResilientTrainingJobs (no spec.suspend: the label alone gates them). Shows the first job admitted and
# started while the second waits, then the first deleted and the second admitted, with the Workloads and
# the ClusterQueue's usage at each step. Everything it started is stopped at the end.
# Usage: hack/kueue-probe.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/hack/load-versions.sh"
TOOLS="${RTJ_TOOLS:-$HOME/.cache/rtj-tools}"
PY="$ROOT/.venv/bin/python"
RUN="$ROOT/.run/kueue-probe"
KUEUE="$TOOLS/bin/kueue-$KUEUE_VERSION"
KUBECTL="$("$PY" -c 'from rtj_local.versions import bin_path; print(bin_path("kubectl"))')"
# Kueue's manager reads its metrics certificate from this fixed path when it does not manage certificates.
METRICS_CERTS=/etc/kueue/metrics/certs

[[ -x "$KUEUE" ]] || GOBIN="$TOOLS/bin/.new" go install "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
[[ -x "$KUEUE" ]] || mv "$TOOLS/bin/.new/kueue" "$KUEUE"
# Kueue's CRDs from its Go module (`go mod download`; cached under ~/.cache/rtj/kueue-<version>/crds).
KUEUE_CRDS="$("$PY" -c 'from rtj_local.tools import kueue_crds; print(kueue_crds())')"

rm -rf "$RUN" && mkdir -p "$RUN/certs"
export RTJ_RUN_DIR="$RUN/cluster" KUBECONFIG="$RUN/cluster/kubeconfig"
cleanup() {
  [[ -f "$RUN/operator.pid" ]] && kill "$(cat "$RUN/operator.pid")" 2>/dev/null || true
  [[ -f "$RUN/kueue.pid" ]] && kill "$(cat "$RUN/kueue.pid")" 2>/dev/null || true
  "$PY" -m rtj_local.cluster down >/dev/null 2>&1 || true
  rm -rf "$METRICS_CERTS" && rmdir "${METRICS_CERTS%/*}" "${METRICS_CERTS%/*/*}" 2>/dev/null || true
}
trap cleanup EXIT
"$PY" -m rtj_local.cluster up --nodes 4 >/dev/null
k() { "$KUBECTL" "$@"; }
k apply --server-side -f "$KUEUE_CRDS" >/dev/null
k apply --server-side -f "$ROOT/crds/" >/dev/null
k create namespace kueue-system >/dev/null
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=kueue -keyout "$RUN/certs/tls.key" \
  -out "$RUN/certs/tls.crt" 2>/dev/null
mkdir -p "$METRICS_CERTS" && cp "$RUN/certs/tls.crt" "$RUN/certs/tls.key" "$METRICS_CERTS/"
# externalFrameworks: `Kind.version.group` (Kueue's Configuration API, v1beta2).
cat >"$RUN/config.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health: {healthProbeBindAddress: "127.0.0.1:0"}
metrics: {bindAddress: "0"}
webhook: {port: $("$PY" -c "from rtj_local.procs import free_port; print(free_port())"), host: 127.0.0.1, certDir: $RUN/certs}
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
integrations:
  frameworks: ["batch/job"]
  externalFrameworks: ["$("$PY" -c 'from rtj.ladder.kueue_admission import EXTERNAL_FRAMEWORK as F; print(F)')"]
EOF
"$KUEUE" --config "$RUN/config.yaml" --kubeconfig "$KUBECONFIG" --feature-gates=VisibilityOnDemand=false \
  >"$RUN/kueue.log" 2>&1 &
echo $! >"$RUN/kueue.pid"
# Our operator as the chart runs it with kueue.enabled=true (here with the admin kubeconfig).
RTJ_KUEUE_ENABLED=true RTJ_METRICS_PORT=0 "$PY" -m rtj --namespace=team-a --log-format=plain \
  >"$RUN/operator.log" 2>&1 &
echo $! >"$RUN/operator.pid"

k apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: rtj-trainer, namespace: team-a}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: p5}
spec:
  nodeLabels: {node.kubernetes.io/instance-type: p5.48xlarge}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: cq}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu, memory, nvidia.com/gpu, vpc.amazonaws.com/efa]
    flavors:
    - name: p5
      resources:
      - {name: cpu, nominalQuota: "64"}
      - {name: memory, nominalQuota: 1000Gi}
      - {name: nvidia.com/gpu, nominalQuota: "16"}
      - {name: vpc.amazonaws.com/efa, nominalQuota: "64"}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: team-a, namespace: team-a}
spec: {clusterQueue: cq}
---
apiVersion: batch/v1
kind: Job
metadata: {name: plain, namespace: team-a, labels: {kueue.x-k8s.io/queue-name: team-a}}
spec:
  suspend: true
  template:
    spec:
      restartPolicy: Never
      containers: [{name: c, image: busybox, resources: {requests: {cpu: "1", memory: 1Gi}}}]
EOF

rtj() { # NAME: a labelled 2-node job of 8 GPUs per node (the ClusterQueue has 16), no spec.suspend
  k apply -f - >/dev/null <<EOF
apiVersion: training.resilient.dev/v1alpha1
kind: ResilientTrainingJob
metadata: {name: $1, namespace: team-a, labels: {kueue.x-k8s.io/queue-name: team-a}}
spec:
  image: trainer:1
  command: [python, train.py]
  nodes: 2
  resources: {cpu: "8", memory: 64Gi}
  faultTolerance: {startupTimeoutSeconds: 3600}
  checkpoint:
    fsx: {fileSystemId: fs-0123456789abcdef0, mountName: abcdefgh,
          dnsName: fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com}
EOF
}
field() { k -n team-a get "$1" "$2" -o jsonpath="$3" 2>/dev/null || true; }
until_is() { # SECONDS EXPECTED KIND NAME JSONPATH: poll until the field equals EXPECTED
  for _ in $(seq "$1"); do [[ "$(field "$3" "$4" "$5")" == "$2" ]] && return 0; sleep 1; done
  echo "timed out waiting for $3/$4 $5 == $2 (is: $(field "$3" "$4" "$5"))" >&2
  tail -20 "$RUN/operator.log" >&2
  return 1
}
show() {
  echo "--- $1"
  k -n team-a get rtj -o custom-columns='JOB:.metadata.name,STATE:.status.state,REASON:.status.reason'
  k -n team-a get pods -o custom-columns='POD:.metadata.name,PHASE:.status.phase,NODE:.spec.nodeName,PODSET:.metadata.labels.kueue\.x-k8s\.io/podset'
  k -n team-a get workloads.kueue.x-k8s.io
  k -n team-a get workloads.kueue.x-k8s.io -o jsonpath='{range .items[*]}{.metadata.name}: {range .status.conditions[*]}{.type}={.status}({.reason}) {end}{"\n"}{end}'
  k get clusterqueue cq -o jsonpath='ClusterQueue cq: admittedWorkloads={.status.admittedWorkloads} reservingWorkloads={.status.reservingWorkloads} pendingWorkloads={.status.pendingWorkloads}{"\n"}  usage of flavor p5: {range .status.flavorsUsage[0].resources[*]}{.name}={.total} {end}{"\n"}'
}

until_is 60 false job plain '{.spec.suspend}'
echo "batch Job plain: suspend=$(field job plain '{.spec.suspend}')   # Kueue's own integration"
start=$(date +%s)
rtj first
until_is 90 False rtj first '{.status.conditions[?(@.type=="Suspended")].status}'
echo "first: started $(($(date +%s) - start)) s after it was created (Workload created, admitted by Kueue, pods created)"
rtj second
until_is 60 WaitingForAdmission rtj second '{.status.reason}'
sleep 5 # Kueue has tried the second Workload by now: no GPU quota left
sleep 3 # first's pods run (KWOK)
show "first admitted and started; second queued (the ClusterQueue's 16 GPUs are in use)"
echo "second: $(field rtj second '{.status.conditions[?(@.type=="Suspended")].message}')"
k -n team-a delete rtj first --wait=false >/dev/null
start=$(date +%s)
until_is 120 False rtj second '{.status.conditions[?(@.type=="Suspended")].status}'
echo "second: started $(($(date +%s) - start)) s after first was deleted (its Workload garbage collected, quota released)"
sleep 3
show "first deleted; second admitted and started"

# A real eviction: stopping the ClusterQueue (stopPolicy HoldAndDrain) makes Kueue evict its admitted
# Workloads; the job stops like a suspend and the operator releases the Workload's quota; starting the
# ClusterQueue again re-admits it, and the job starts again with no fault counted.
k patch clusterqueue cq --type=merge -p '{"spec":{"stopPolicy":"HoldAndDrain"}}' >/dev/null
until_is 60 WorkloadEvicted rtj second '{.status.reason}'
for _ in $(seq 60); do
  [[ -z "$(k -n team-a get pods -l training.resilient.dev/job-name=second -o name)" ]] && break
  sleep 1
done
reserved() { k -n team-a get workloads.kueue.x-k8s.io -l training.resilient.dev/job-name=second \
  -o jsonpath='{.items[0].status.conditions[?(@.type=="QuotaReserved")].status}'; }
for _ in $(seq 60); do [[ "$(reserved)" == False ]] && break; sleep 1; done
echo "second's Workload: QuotaReserved=$(reserved) (the operator cleared the admission once no pod was left)"
show "ClusterQueue stopped (HoldAndDrain): second evicted, its pods stopped, its quota released"
echo "second: $(field rtj second '{.status.conditions[?(@.type=="Suspended")].message}')"
k patch clusterqueue cq --type=merge -p '{"spec":{"stopPolicy":"None"}}' >/dev/null
until_is 120 False rtj second '{.status.conditions[?(@.type=="Suspended")].status}'
sleep 3
show "ClusterQueue started again: second re-admitted and started"
echo "second restarts: $(field rtj second '{.status.restarts}')"
k -n team-a get events --field-selector involvedObject.name=second -o custom-columns='REASON:.reason,MESSAGE:.message'
