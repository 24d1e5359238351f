"""What each real node's kubelet, containerd and CNI are configured with (rtj_local.kubelet_nodes):
pure builders, no processes. The settings this cgroup v1 host needs, and the per-node separation."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest
from rtj_local import kubelet_nodes as kn
from rtj_local import nodes as nodes_mod
from rtj_local.cluster import LocalCluster

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


def test_kubelet_registers_its_node_with_the_kubelet_label_zone_and_instance_type() -> None:
    # The e2e stack and the demo select kubelet nodes by this label (KWOK nodes lack it).
    node = layouts()[2]
    labels = kn.kubelet_node_labels(node)
    assert labels[kn.KUBELET_LABEL] == "true"
    assert labels["node.kubernetes.io/instance-type"] == nodes_mod.INSTANCE_TYPE
    assert labels["topology.kubernetes.io/zone"] in nodes_mod.DEFAULT_ZONES
    # NodeRestriction lets a kubelet set its own labels only outside kubernetes.io / k8s.io, except
    # the few well-known ones it allows (zone, instance-type).
    own = [k for k in labels if "kubernetes.io" not in k and "k8s.io" not in k]
    assert own == [kn.KUBELET_LABEL]


def test_container_cgroup_dirs_are_found_under_the_pods_cgroup(tmp_path: Path) -> None:
    # cgroupfs driver layout: <root>/kubepods/<qos>/pod<uid>/<container id> (guaranteed: no qos dir).
    pod = tmp_path / "kubepods" / "burstable" / "pod1234-abcd"
    for cid in ("sandbox0", "c1", "c2"):
        (pod / cid).mkdir(parents=True)
        (pod / cid / "cgroup.procs").write_text({"sandbox0": "7\n", "c1": "11\n12\n", "c2": ""}[cid])
    (tmp_path / "kubepods" / "pod9999" / "c1").mkdir(parents=True)  # another pod, same container id
    (tmp_path / "kubepods" / "pod9999" / "c1" / "cgroup.procs").write_text("99\n")
    assert kn.container_pids(tmp_path, "1234-abcd", {"c1", "c2"}) == [11, 12]
    assert kn.container_pids(tmp_path, "1234-abcd", {"sandbox0"}) == [7]
    assert kn.container_pids(tmp_path, "0000", {"c1"}) == []


def test_a_new_nodes_image_layers_are_hardlinked_to_podmans_and_other_nodes_never_containers_dirs(
    tmp_path: Path,
) -> None:
    nodes = kn.KubeletNodes(LocalCluster(tmp_path))
    first, second = nodes.layout(0), nodes.layout(1)

    def layer(node: kn.NodeLayout, sid: str, text: str) -> Path:
        f = node.snapshots / sid / "fs" / "usr" / "lib" / "libbig.so"
        f.parent.mkdir(parents=True)
        f.write_text(text)
        os.utime(f, (1_000_000, 1_000_000))
        return f

    podman = tmp_path / "podman" / "overlay" / "abc" / "diff"
    (podman / "usr" / "lib").mkdir(parents=True)
    (podman / "usr" / "lib" / "libbig.so").write_text("torch")
    os.utime(podman / "usr" / "lib" / "libbig.so", (1_000_000, 1_000_000))
    a = layer(first, "1", "torch")
    nodes._share_layers(first, [str(podman)])  # podman's committed layer of the image it imported
    assert a.stat().st_ino == (podman / "usr" / "lib" / "libbig.so").stat().st_ino
    upper = layer(first, "9", "torch")  # a container's upper dir on the first node, made later
    b, c = layer(second, "1", "torch"), layer(second, "2", "other")
    nodes._share_layers(second)
    assert b.stat().st_ino == a.stat().st_ino  # one copy on disk
    assert c.stat().st_ino != a.stat().st_ino  # different content
    assert upper.stat().st_ino not in (a.stat().st_ino, b.stat().st_ino)  # never a writable dir


def test_hardlinkable_tries_one_file(tmp_path: Path) -> None:
    src, dst, empty = tmp_path / "src", tmp_path / "dst", tmp_path / "empty"
    for d in (src, dst, empty):
        d.mkdir()
    (src / "sub").mkdir()
    (src / "sub" / "f").write_text("x")
    assert kn.hardlinkable(src, dst)
    assert list(dst.iterdir()) == []  # the probe link is removed
    assert not kn.hardlinkable(empty, dst)  # nothing to try
    assert not kn.hardlinkable(src, tmp_path / "missing")  # cannot link there
