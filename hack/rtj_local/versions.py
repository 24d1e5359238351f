"""Versions and cached binary paths of the local control plane (single source: hack/versions.env)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSIONS_FILE = REPO_ROOT / "hack" / "versions.env"
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-cluster.sh"

# Binary name -> key in versions.env holding its version.
BINARIES: dict[str, str] = {
    "etcd": "ETCD_VERSION",
    "kube-apiserver": "K8S_VERSION",
    "kube-controller-manager": "K8S_VERSION",
    "kube-scheduler": "K8S_VERSION",
    "kwok": "KWOK_VERSION",
    "kubectl": "KUBECTL_VERSION",
    "helm": "HELM_VERSION",
}


# What real worker nodes run (rtj_local.kubelet_nodes; `hack/build-cluster.sh --nodes`). Not needed by a
# cluster of KWOK nodes, so not in BINARIES (missing_binaries() gates every cluster start).
NODE_BINARIES: dict[str, str] = {
    "kubelet": "K8S_VERSION",
    "kube-proxy": "K8S_VERSION",
    "containerd": "CONTAINERD_VERSION",
    "containerd-shim-runc-v2": "CONTAINERD_VERSION",
    "ctr": "CONTAINERD_VERSION",
    "coredns": "COREDNS_VERSION",
    "pause": "K8S_VERSION",
}


def versions() -> dict[str, str]:
    """versions.env, with environment variables of the same name taking precedence (as in the script)."""
    out: dict[str, str] = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        out[key] = os.environ.get(key) or value
    return out


def cache_dir() -> Path:
    return Path(os.environ.get("RTJ_CACHE", Path.home() / ".cache" / "rtj"))


def bin_path(name: str) -> Path:
    """Cached binary, e.g. ~/.cache/rtj/bin/kube-apiserver-v1.37.2."""
    key = BINARIES.get(name) or NODE_BINARIES[name]
    return cache_dir() / "bin" / f"{name}-{versions()[key]}"


def kwok_stages_path() -> Path:
    return cache_dir() / "share" / f"kwok-{versions()['KWOK_VERSION']}" / "stages.yaml"


def missing_node_binaries() -> list[str]:
    return [n for n in NODE_BINARIES if not os.access(bin_path(n), os.X_OK)]


def missing_binaries() -> list[str]:
    missing = [n for n in BINARIES if not os.access(bin_path(n), os.X_OK)]
    if not kwok_stages_path().is_file():
        missing.append("kwok stages")
    return missing
