"""What each real node's kubelet, containerd and CNI are configured with (rtj_local.kubelet_nodes):
pure builders, no processes. The settings this cgroup v1 host needs, and the per-node separation."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from rtj_local import kubelet_nodes as kn
from rtj_local import nodes as nodes_mod

pytestmark = pytest.mark.unit

RUN = Path("/run-dir")


def layouts() -> list[kn.NodeLayout]:
    return [kn.NodeLayout(i, RUN) for i in range(kn.MAX_NODES)]


def test_nodes_are_kept_apart() -> None:
    nodes = layouts()
    for attr in ("name", "dir", "socket", "subnet", "bridge", "kubelet_port", "healthz_port", "cgroup_root"):
        values = [getattr(n, attr) for n in nodes]
        assert len(set(values)) == len(values), attr
    assert not any(n.subnet.startswith("10.244.") for n in nodes)  # KWOK's fake pod IPs


def test_kubelet_runs_on_cgroup_v1_with_the_nodes_own_runtime() -> None:
    node = layouts()[1]
    cfg = kn.kubelet_config(node, RUN / "ca.crt")
    assert cfg["failCgroupV1"] is False and cfg["cgroupDriver"] == "cgroupfs"
    assert cfg["cgroupRoot"] == node.cgroup_root and cfg["cgroupRoot"].endswith("/rtj-node-1")
    assert cfg["containerRuntimeEndpoint"] == f"unix://{node.socket}"
    assert cfg["clusterDNS"] == [kn.NODE_HOST_IP] and cfg["readOnlyPort"] == 0
    assert cfg["authentication"]["anonymous"]["enabled"] is False
    assert cfg["registerWithTaints"] == [nodes_mod.GPU_TAINT]


def test_containerd_uses_runc_the_local_pause_image_and_clamps_oom_scores() -> None:
    node = layouts()[2]
    cfg = tomllib.loads(kn.containerd_config(node))
    assert cfg["version"] == 3 and cfg["grpc"]["address"] == str(node.socket)
    runtime = cfg["plugins"]["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert runtime["cni"]["conf_dir"] == str(node.dir / "cni")
    assert cfg["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == kn.pause_image()


def test_cni_bridge_per_node_without_masquerading() -> None:
    node = layouts()[3]
    bridge = kn.cni_config(node)["plugins"][0]
    assert bridge["bridge"] == node.bridge and bridge["ipMasq"] is False
    assert bridge["ipam"]["ranges"] == [[{"subnet": node.subnet}]]
