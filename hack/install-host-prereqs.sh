#!/usr/bin/env bash
# Installs what `make images` and real kubelet nodes need on the host, from Debian's packages (checked on
# Debian 12 bookworm); everything else (kubelet, kube-proxy, containerd, CoreDNS, pause) is built from Go
# modules by hack/build-cluster.sh --nodes.
#   podman, buildah          make images (daemonless builds; conmon and containers-common come with them)
#   debootstrap              make images (the local Debian base: no image registry is reachable)
#   crun                     podman's default runtime (runc runs the containers on this cgroup-v1 host)
#   runc                     the OCI runtime of the nodes' containerd and of `podman run --runtime runc`
#   containernetworking-plugins  bridge, host-local, loopback, portmap for the nodes' pod networks
#   iptables, iproute2       kube-proxy's Service rules and the nodes' bridges
#   conntrack                kube-proxy clears stale UDP entries (DNS) with it
#   ca-certificates, curl    debootstrap over https mirrors, pip inside image builds
# (and util-linux's hardlink, always installed: kubelet nodes share their image layers' files through it)
# Idempotent: packages already installed are left alone. Needs root (apt-get). Usage:
#   hack/install-host-prereqs.sh [--check]   --check: only say what is missing (exit 1 if anything is)
set -euo pipefail

PACKAGES=(podman buildah debootstrap crun runc containernetworking-plugins iptables iproute2 conntrack
  ca-certificates curl)
# The binaries that the build scripts and rtj_local.kubelet_nodes call, each checked after the install.
BINARIES=(podman buildah debootstrap crun runc iptables ip conntrack hardlink /usr/lib/cni/bridge
  /usr/lib/cni/host-local /usr/lib/cni/loopback /usr/lib/cni/portmap)

log() { echo "[host-prereqs] $*" >&2; }

missing_packages() {
  local p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${db:Status-Status}\n' "$p" 2>/dev/null | grep -qx installed || echo "$p"
  done
}

main() {
  command -v dpkg-query >/dev/null || { log "not a Debian-based system: install ${PACKAGES[*]} by hand"; exit 1; }
  local missing
  mapfile -t missing < <(missing_packages)
  if ((${#missing[@]} == 0)); then
    log "all installed: ${PACKAGES[*]}"
  elif [[ "${1:-}" == "--check" ]]; then
    log "missing: ${missing[*]} (run hack/install-host-prereqs.sh as root)"
    exit 1
  else
    ((EUID == 0)) || { log "needs root for apt-get (missing: ${missing[*]})"; exit 1; }
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  local b bad=()
  for b in "${BINARIES[@]}"; do
    if [[ "$b" == /* ]]; then [[ -x "$b" ]] || bad+=("$b"); else command -v "$b" >/dev/null || bad+=("$b"); fi
  done
  ((${#bad[@]} == 0)) || { log "still missing after the install: ${bad[*]}"; exit 1; }
  log "podman $(podman --version | awk '{print $3}'), buildah $(buildah --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1{print $3}')"
}

main "$@"
