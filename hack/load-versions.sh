# shellcheck shell=bash
# Sourced by the hack/ scripts: exports hack/versions.env, where an environment variable of the same name
# wins (e.g. K8S_VERSION=v1.36.3 hack/build-cluster.sh).
while IFS='=' read -r key value; do
  if [[ -n "$key" && "$key" != \#* && -z "${!key:-}" ]]; then export "$key=$value"; fi
done <"$(dirname "${BASH_SOURCE[0]}")/versions.env"
