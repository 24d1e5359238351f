#!/usr/bin/env bash
# What Kueue, built from its Go module, does in the local cluster with a labelled batch Job and a
# labelled ResilientTrainingJob (docs/kueue.md). Starts a KWOK cluster of one node (its own run dir and
# free ports; no node agent), Kueue's manager as a process (its CRDs applied, webhooks served but not
# registered, so jobs are created suspended by hand, as Kueue's webhook would), one ClusterQueue and
# LocalQueue, then prints whether each job was admitted (spec.suspend false) and the Workloads.
# Everything it started is stopped at the end. Usage: hack/kueue-probe.sh
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
KUEUE_SRC="$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | "$PY" -c \
  'import json,sys; print(json.load(sys.stdin)["Dir"])')"

rm -rf "$RUN" && mkdir -p "$RUN/certs"
export RTJ_RUN_DIR="$RUN/cluster" KUBECONFIG="$RUN/cluster/kubeconfig"
cleanup() {
  [[ -f "$RUN/kueue.pid" ]] && kill "$(cat "$RUN/kueue.pid")" 2>/dev/null || true
  "$PY" -m rtj_local.cluster down >/dev/null 2>&1 || true
  rm -rf "$METRICS_CERTS" && rmdir "${METRICS_CERTS%/*}" "${METRICS_CERTS%/*/*}" 2>/dev/null || true
}
trap cleanup EXIT
"$PY" -m rtj_local.cluster up --nodes 1 >/dev/null
k() { "$KUBECTL" "$@"; }
k apply --server-side -f "$KUEUE_SRC/config/components/crd/bases/" >/dev/null
k apply --server-side -f "$ROOT/crds/" >/dev/null
k create namespace kueue-system >/dev/null
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=kueue -keyout "$RUN/certs/tls.key" \
  -out "$RUN/certs/tls.crt" 2>/dev/null
mkdir -p "$METRICS_CERTS" && cp "$RUN/certs/tls.crt" "$RUN/certs/tls.key" "$METRICS_CERTS/"
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
  externalFrameworks: ["ResilientTrainingJob.$(
    "$PY" -c 'from rtj import contract; print(f"{contract.API_VERSION}.{contract.API_GROUP}")')"]
EOF
"$KUEUE" --config "$RUN/config.yaml" --kubeconfig "$KUBECONFIG" --feature-gates=VisibilityOnDemand=false \
  >"$RUN/kueue.log" 2>&1 &
echo $! >"$RUN/kueue.pid"

k apply -f - >/dev/null <<'EOF'
apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: default}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: cq}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu, memory]
    flavors:
    - name: default
      resources: [{name: cpu, nominalQuota: "100"}, {name: memory, nominalQuota: 1000Gi}]
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
---
apiVersion: training.resilient.dev/v1alpha1
kind: ResilientTrainingJob
metadata: {name: queued, namespace: team-a, labels: {kueue.x-k8s.io/queue-name: team-a}}
spec:
  image: trainer:1
  command: [python, train.py]
  nodes: 2
  suspend: true
  checkpoint: {pvc: {claimName: ckpt}}
EOF
for _ in $(seq 60); do
  [[ "$(k -n team-a get job plain -o jsonpath='{.spec.suspend}')" == false ]] && break
  sleep 1
done
sleep 10 # the RTJ gets the same time again
echo "batch Job plain: suspend=$(k -n team-a get job plain -o jsonpath='{.spec.suspend}')"
echo "ResilientTrainingJob queued: suspend=$(k -n team-a get rtj queued -o jsonpath='{.spec.suspend}')"
k -n team-a get workloads.kueue.x-k8s.io
