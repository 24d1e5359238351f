"""Real worker nodes of the local cluster: per node a containerd and a kubelet, and for the host one
kube-proxy (Services) and one CoreDNS (cluster DNS). Pods run as containers from images loaded straight
into each node's containerd (no registry), on a CNI bridge of their own.

    python -m rtj_local.kubelet_nodes up [--nodes N]    # after `python -m rtj_local.cluster up`
    python -m rtj_local.kubelet_nodes load IMAGE...      # podman image -> every node's containerd
    python -m rtj_local.kubelet_nodes kill NODE          # node death: kubelet, containerd, containers
    python -m rtj_local.kubelet_nodes stop-kubelet NODE  # the kubelet alone: containers keep running
    python -m rtj_local.kubelet_nodes down

All the nodes share this machine's network namespace; what keeps them apart:
- each its own root directories (containerd root/state/socket, kubelet root, pod logs) under
  <run dir>/nodes/<name>, its own cgroup parent (/<name>), its own kubelet ports;
- each its own pod subnet (10.245.<i>.0/24) on its own bridge (rtjbr<i>); the bridges' subnets are all
  routes of the one host, so pods reach each other across nodes without an overlay;
- one address of ours, NODE_HOST_IP on a link of ours (rtj0), on which every kubelet, CoreDNS and the
  API server (for pods, through the `kubernetes` Service) are reached.
What this host needs (checked 2026-11-30): cgroup v1 controllers (kubelet >= 1.35 refuses v1 unless
`failCgroupV1: false`, set below), a cgroup2 hierarchy holding hugetlb (crun refuses that "hybrid"
layout; containerd runs runc, which accepts it), overlayfs, iptables, root.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rtj_local import nodes as nodes_mod
from rtj_local.cluster import ClusterError, LocalCluster, default_run_dir
from rtj_local.components import (
    COREDNS_USER,
    KUBE_PROXY_USER,
    MAX_REAL_NODES,
    NODE_HOST_IP,
    REAL_NODE_PREFIX,
)
from rtj_local.kubeconfig import build_kubeconfig, write_kubeconfig
from rtj_local.procs import ProcInfo, log_tail, read_pidfile, read_process, spawn, stop
from rtj_local.versions import bin_path, versions
from rtj_local.wait import WaitTimeout, wait_for

HOST_LINK = "rtj0"
REAL_POD_CIDR = "10.245.0.0/16"  # KWOK's fake pod IPs are 10.244.0.0/16
MAX_NODES = MAX_REAL_NODES
NODE_PREFIX = REAL_NODE_PREFIX
CNI_BIN_DIR = "/usr/lib/cni"
CLUSTER_DOMAIN = "cluster.local"
#: Every kubelet node registers with it (KWOK's nodes lack it): the e2e stack selects its nodes by it.
KUBELET_LABEL = "rtj.local/kubelet"


def node_name(index: int) -> str:
    return f"{NODE_PREFIX}{index}"


def node_user(index: int) -> str:
    """The identity of a node's kubelet: the Node authorizer and NodeRestriction key on it."""
    return f"system:node:{node_name(index)}"


def own_memory_cgroup() -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path
    raise ClusterError("no cgroup v1 memory hierarchy: real nodes need this host's cgroup v1 controllers")


def make_cgroup(path: str) -> None:
    """Creates `path` in every cgroup v1 hierarchy (kubelet checks that its cgroupRoot exists in each).
    A new cpuset cgroup starts with no CPUs or memory nodes: it gets its parent's."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        if hierarchy.name == "unified" or not (hierarchy / "cgroup.procs").exists():
            continue
        parts = [p for p in path.split("/") if p]
        current = hierarchy
        for part in parts:
            child = current / part
            if not child.exists():
                child.mkdir()
                if hierarchy.name == "cpuset":
                    for knob in ("cpuset.cpus", "cpuset.mems"):
                        (child / knob).write_text((current / knob).read_text())
            current = child


def kubelet_node_labels(node: NodeLayout) -> dict[str, str]:
    """The labels a kubelet registers its node with (--node-labels): only those NodeRestriction lets
    a kubelet set on itself; the p5 labels it may not set are patched in by `_label_as_p5`."""
    return {
        "topology.kubernetes.io/zone": nodes_mod.DEFAULT_ZONES[node.index % len(nodes_mod.DEFAULT_ZONES)],
        "node.kubernetes.io/instance-type": nodes_mod.INSTANCE_TYPE,
        KUBELET_LABEL: "true",
    }


def container_pids(cgroup_root: Path, pod_uid: str, container_ids: set[str]) -> list[int]:
    """Processes of the given containers of pod `pod_uid`, from a node's cgroup tree (cgroupfs driver:
    <root>/kubepods[/<qos>]/pod<uid>/<container id>/cgroup.procs)."""
    pids: set[int] = set()
    for pod_dir in cgroup_root.rglob(f"pod{pod_uid}"):
        for cid in container_ids:
            with contextlib.suppress(FileNotFoundError):
                pids.update(int(p) for p in (pod_dir / cid / "cgroup.procs").read_text().split())
    return sorted(pids)


def podman_layer_dirs(image: str) -> list[str]:
    """The directories of podman's committed layers of `image` (its overlay driver's diff dirs)."""
    fmt = "{{.GraphDriver.Data.UpperDir}}:{{.GraphDriver.Data.LowerDir}}"
    cmd = ["podman", "image", "inspect", "--format", fmt, image]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return [d for d in out.strip().split(":") if d and d != "<no value>"]


def pause_image() -> str:
    return f"localhost/rtj-pause:{versions()['K8S_VERSION']}"


@dataclass(frozen=True)
class NodeLayout:
    index: int
    run_dir: Path

    @property
    def name(self) -> str:
        return node_name(self.index)

    @property
    def dir(self) -> Path:
        return self.run_dir / "nodes" / self.name

    @property
    def socket(self) -> Path:
        return self.dir / "containerd.sock"

    @property
    def snapshots(self) -> Path:
        """containerd's overlayfs snapshots (snapshots/<id>/fs: image layers, containers' upper dirs)."""
        return self.dir / "containerd-root" / "io.containerd.snapshotter.v1.overlayfs" / "snapshots"

    @property
    def committed_list(self) -> Path:
        """The snapshot dirs this node had right after its first image import, before its kubelet
        ever ran: all committed image layers, which nothing writes to again."""
        return self.dir / "images" / "committed-snapshots"

    @property
    def subnet(self) -> str:
        return f"10.245.{self.index}.0/24"

    @property
    def bridge(self) -> str:
        return f"rtjbr{self.index}"

    @property
    def kubelet_port(self) -> int:
        return 10250 + 10 * self.index

    @property
    def healthz_port(self) -> int:
        return 10248 + 10 * self.index

    @property
    def cgroup_root(self) -> str:
        """The node's cgroup parent, inside the memory cgroup this machine runs us in (so its pods count
        against the same limit as everything else here), the same path in every v1 hierarchy."""
        return f"{own_memory_cgroup().rstrip('/')}/{self.name}"


COREDNS_RBAC = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": "rtj:coredns"},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["endpoints", "services", "pods", "namespaces"],
                "verbs": ["list", "watch"],
            },
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "rtj:coredns"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "rtj:coredns"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": COREDNS_USER}],
    },
]


def containerd_config(node: NodeLayout) -> str:
    """containerd 2.x (config version 3): its own root, state and socket; CRI with runc (cgroupfs), the
    node's CNI config directory, and the locally made pause image as the sandbox image. runc, not crun:
    crun refuses this host's hybrid cgroup layout (hugetlb on the cgroup2 hierarchy)."""
    d = node.dir
    return f"""version = 3
root = "{d / "containerd-root"}"
state = "{d / "containerd-state"}"

[grpc]
  address = "{node.socket}"

[ttrpc]
  address = "{node.socket}.ttrpc"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause_image()}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # Lowering oom_score_adj (kubelet asks -998 for sandboxes, -997 for Guaranteed pods) needs
  # CAP_SYS_RESOURCE, which this machine withholds: clamp to containerd's own score instead.
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{shutil.which("runc") or "runc"}"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{d / "cni"}"
    max_conf_num = 1

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def cni_config(node: NodeLayout) -> dict:
    """A bridge per node, IPs from the node's subnet; no masquerading (every destination is local)."""
    return {
        "cniVersion": "1.0.0",
        "name": f"rtj-{node.name}",
        "plugins": [
            {
                "type": "bridge",
                "bridge": node.bridge,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": node.subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(node.dir / "cni-ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(node: NodeLayout, ca_file: Path) -> dict:
    d = node.dir
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This host has cgroup v1 controllers only; kubelet >= 1.35 refuses them unless told not to.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.cgroup_root,
        "address": NODE_HOST_IP,
        "port": node.kubelet_port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": node.healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [NODE_HOST_IP],
        # Pods resolve only cluster names (CoreDNS does not forward): no host resolver in their resolv.conf.
        "resolvConf": str(d / "resolv.conf"),
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        "imageServiceEndpoint": f"unix://{node.socket}",
        "podLogsDir": str(d / "pod-logs"),
        # One disk shared by every node and by the rest of the machine: evict on memory only.
        "evictionHard": {"memory.available": "200Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "registerWithTaints": [dict(nodes_mod.GPU_TAINT)],
        "nodeStatusUpdateFrequency": "4s",
        "nodeLeaseDurationSeconds": 20,
        "rotateCertificates": False,
        "protectKernelDefaults": False,
        "localStorageCapacityIsolation": True,
    }


def corefile(kubeconfig: Path) -> str:
    return f""".:53 {{
    bind {NODE_HOST_IP}
    errors
    health 127.0.0.1:{8180}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
    }}
    cache 5
}}
"""


def kube_proxy_config(kubeconfig: Path) -> dict:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "mode": "iptables",
        "clusterCIDR": REAL_POD_CIDR,
        # Every node shares this host's network namespace: masquerade Service traffic so that replies
        # from a backend on the same bridge go back through the host's NAT.
        "iptables": {"masqueradeAll": True, "localhostNodePorts": False},
        # Leave the host's conntrack sysctls alone (this machine is a container).
        "conntrack": {"maxPerCore": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "hostnameOverride": node_name(0),
        "nodePortAddresses": [f"{NODE_HOST_IP}/32"],
    }


def hardlinkable(source_dir: Path, target_dir: Path) -> bool:
    """Whether a file under `source_dir` can be hardlinked into `target_dir` (tried on one file)."""
    probe = next((p for p in source_dir.rglob("*") if p.is_file() and not p.is_symlink()), None)
    if probe is None:
        return False
    link = target_dir / f".hardlink-probe-{os.getpid()}"
    try:
        os.link(probe, link)
    except OSError:
        return False
    link.unlink()
    return True


class KubeletNodes:
    """The real nodes of the LocalCluster in `cluster.run_dir` (state on disk, like LocalCluster)."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.run_dir = cluster.run_dir
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    # ---- paths --------------------------------------------------------------------------------------
    def layout(self, index: int) -> NodeLayout:
        return NodeLayout(index, self.run_dir)

    def _pidfile(self, name: str) -> Path:
        return self.run_dir / "pids" / f"{name}.pid"

    def _log(self, name: str) -> Path:
        return self.run_dir / "logs" / f"{name}.log"

    def _kubeconfig(self, user: str) -> Path:
        path = self.run_dir / "kubeconfigs" / f"{user.replace(':', '-')}.kubeconfig"
        token = self.cluster._state()["tokens"][user]
        config = build_kubeconfig(self.cluster.server, self.cluster.ca_file.read_bytes(), token, user)
        return write_kubeconfig(path, config)

    # ---- host ---------------------------------------------------------------------------------------
    @staticmethod
    def ensure_host_link() -> None:
        """A link of ours holding NODE_HOST_IP: an address of ours that pods can route to."""
        show_cmd = ["ip", "-o", "-4", "addr", "show", "dev", HOST_LINK]
        show = subprocess.run(show_cmd, capture_output=True, text=True)
        if f"inet {NODE_HOST_IP}/" in show.stdout:
            return
        if show.returncode != 0:
            # A bridge without ports: this kernel has no dummy link type.
            subprocess.run(["ip", "link", "add", HOST_LINK, "type", "bridge"], check=True)
        subprocess.run(["ip", "addr", "add", f"{NODE_HOST_IP}/32", "dev", HOST_LINK], check=True)
        subprocess.run(["ip", "link", "set", HOST_LINK, "up"], check=True)

    def ensure_pause_image(self) -> None:
        image = pause_image()
        if subprocess.run(["podman", "image", "exists", image]).returncode == 0:
            return
        ctr = subprocess.run(["buildah", "from", "scratch"], capture_output=True, text=True, check=True)
        name = ctr.stdout.strip()
        try:
            subprocess.run(
                ["buildah", "copy", "--quiet", name, str(bin_path("pause")), "/pause"],
                check=True,
                capture_output=True,
            )
            config = ["buildah", "config", "--entrypoint", '["/pause"]', "--user", "65535:65535", name]
            subprocess.run(config, check=True)
            subprocess.run(["buildah", "commit", "--quiet", name, image], check=True, capture_output=True)
        finally:
            subprocess.run(["buildah", "rm", name], capture_output=True)

    def start_host_services(self) -> None:
        """CoreDNS (on NODE_HOST_IP:53, the nodes' clusterDNS) and kube-proxy (Service IPs)."""
        self.cluster.apply(COREDNS_RBAC)
        svc = self.run_dir / "host-services"
        svc.mkdir(parents=True, exist_ok=True)
        if read_pidfile(self._pidfile("coredns")) is None:
            (svc / "Corefile").write_text(corefile(self._kubeconfig(COREDNS_USER)))
            self._spawn("coredns", [bin_path("coredns"), "-conf", str(svc / "Corefile")], cwd=svc)
        if read_pidfile(self._pidfile("kube-proxy")) is None:
            cfg = svc / "kube-proxy.json"
            cfg.write_text(json.dumps(kube_proxy_config(self._kubeconfig(KUBE_PROXY_USER)), indent=2))
            self._spawn("kube-proxy", [bin_path("kube-proxy"), f"--config={cfg}"])

    def _spawn(self, name: str, argv: Sequence[str | os.PathLike[str]], cwd: Path | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        env["PATH"] = f"{self._shim_dir()}:{env.get('PATH', '')}"
        proc = spawn(argv, self._log(name), self._pidfile(name), env=env, cwd=cwd)
        self._children[proc.pid] = proc

    def _shim_dir(self) -> Path:
        """containerd finds its shim (containerd-shim-runc-v2) on PATH: unversioned links to the cache."""
        d = self.run_dir / "nodes" / "bin"
        d.mkdir(parents=True, exist_ok=True)
        for name in ("containerd-shim-runc-v2", "ctr"):
            link = d / name
            if not link.exists():
                link.symlink_to(bin_path(name))
        return d

    # ---- nodes --------------------------------------------------------------------------------------
    def up(self, count: int, images: Sequence[str] = (), timeout: float = 180) -> list[str]:
        if not 1 <= count <= MAX_NODES:
            raise ValueError(f"1 to {MAX_NODES} real nodes, not {count}")
        self.ensure_host_link()
        self.ensure_pause_image()
        self.start_host_services()
        layouts = [self.layout(i) for i in range(count)]
        for node in layouts:
            self.start_containerd(node)
        for node in layouts:
            self.load_images(node, [pause_image(), *images])
            self.start_kubelet(node)
        for node in layouts:
            self._wait_ready(node, timeout)
            self._label_as_p5(node)
        return [n.name for n in layouts]

    def start_containerd(self, node: NodeLayout) -> None:
        if read_pidfile(self._pidfile(f"{node.name}-containerd")) is not None:
            return
        for sub in ("cni", "pod-logs", "kubelet", "cni-ipam"):
            (node.dir / sub).mkdir(parents=True, exist_ok=True)
        (node.dir / "containerd.toml").write_text(containerd_config(node))
        (node.dir / "cni" / "10-rtj.conflist").write_text(json.dumps(cni_config(node), indent=2))
        (node.dir / "resolv.conf").write_text("")
        self._spawn(
            f"{node.name}-containerd",
            [bin_path("containerd"), f"--config={node.dir / 'containerd.toml'}", "--log-level=warn"],
        )
        try:
            wait_for(lambda: self._ctr(node, "version", check=False).returncode == 0, 60, 0.2,
                     f"containerd of {node.name}")  # fmt: skip
        except WaitTimeout:
            raise ClusterError(
                f"containerd of {node.name} did not start:\n{log_tail(self._log(f'{node.name}-containerd'))}"
            ) from None

    def _ctr(self, node: NodeLayout, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(bin_path("ctr")), f"--address={node.socket}", "--namespace=k8s.io", *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise ClusterError(f"ctr {' '.join(args)} on {node.name}: {proc.stderr.strip()}")
        return proc

    def load_images(self, node: NodeLayout, images: Sequence[str]) -> None:
        """podman's images -> the node's containerd: `podman save | ctr import` (a stream: no archive on
        disk), the layers' blobs dropped once unpacked (the trainer image is ~6 GB per copy). A marker
        per node and image ID skips what the node already has."""
        for image in images:
            inspect = ["podman", "image", "inspect", "--format", "{{.Id}}", image]
            image_id = subprocess.run(inspect, capture_output=True, text=True, check=True).stdout.strip()
            marker = node.dir / "images" / image_id
            if marker.exists():
                continue
            save = subprocess.Popen(
                ["podman", "save", "--format", "docker-archive", image], stdout=subprocess.PIPE
            )
            ctr = [str(bin_path("ctr")), f"--address={node.socket}", "--namespace=k8s.io"]
            imported = subprocess.run(
                [*ctr, "images", "import", "--local", "--discard-unpacked-layers", "-"],
                stdin=save.stdout, capture_output=True, text=True, timeout=1800,
            )  # fmt: skip
            assert save.stdout is not None
            save.stdout.close()
            if save.wait() != 0 or imported.returncode != 0:
                raise ClusterError(f"loading {image} into {node.name}: {imported.stderr.strip()}")
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(image + "\n")
        if read_pidfile(self._pidfile(f"{node.name}-kubelet")) is None and not node.committed_list.exists():
            self._share_layers(node, [d for image in images for d in podman_layer_dirs(image)])

    def _share_layers(self, node: NodeLayout, sources: Sequence[str] = ()) -> None:
        """Every node unpacks the same images: hardlink its committed layers' identical files (content,
        owner, mode, mtime) to those of podman's image layers (`sources`) and of the other nodes, so
        the nodes take no second copy of disk (6 GB each otherwise). Only committed layers are linked
        (overlayfs lower dirs, never written to: a write in a container copies the file up into its
        own upper dir); containers' upper dirs never are."""
        node.committed_list.parent.mkdir(parents=True, exist_ok=True)
        dirs = sorted(str(d) for d in node.snapshots.glob("*/fs")) if node.snapshots.exists() else []
        node.committed_list.write_text("".join(f"{d}\n" for d in dirs))
        others = [
            d
            for i in range(MAX_NODES)
            if i != node.index and self.layout(i).committed_list.exists()
            for d in self.layout(i).committed_list.read_text().split()
            if Path(d).is_dir()
        ]
        # podman's layers may sit where this host cannot hardlink to (EXDEV from overlayfs: seen
        # 2026-12-02, one error line per file): then the nodes share their files among themselves.
        others += [d for d in sources if Path(d).is_dir() and hardlinkable(Path(d), node.dir)]
        if dirs and others:
            subprocess.run(["hardlink", "--quiet", *others, *dirs], check=True, timeout=1800)

    def start_kubelet(self, node: NodeLayout) -> None:
        if read_pidfile(self._pidfile(f"{node.name}-kubelet")) is not None:
            return
        make_cgroup(node.cgroup_root)
        cfg = node.dir / "kubelet.json"
        cfg.write_text(json.dumps(kubelet_config(node, self.cluster.ca_file), indent=2))
        labels = kubelet_node_labels(node)
        zone = labels["topology.kubernetes.io/zone"]
        self._spawn(
            f"{node.name}-kubelet",
            [
                bin_path("kubelet"),
                f"--config={cfg}",
                f"--kubeconfig={self._kubeconfig(node_user(node.index))}",
                f"--root-dir={node.dir / 'kubelet'}",
                f"--cert-dir={node.dir / 'kubelet' / 'pki'}",
                f"--hostname-override={node.name}",
                f"--node-ip={NODE_HOST_IP}",
                f"--provider-id=aws:///{zone}/{nodes_mod._instance_id(node.name)}",
                "--node-labels=" + ",".join(f"{k}={v}" for k, v in labels.items()),
                "--v=1",
            ],
        )

    def _wait_ready(self, node: NodeLayout, timeout: float) -> None:
        raw = self.cluster.raw()

        def ready() -> bool:
            if read_pidfile(self._pidfile(f"{node.name}-kubelet")) is None:
                raise ClusterError(
                    f"kubelet of {node.name} exited:\n{log_tail(self._log(f'{node.name}-kubelet'), 40)}"
                )
            obj = raw.get(f"/api/v1/nodes/{node.name}") or {}
            conds = obj.get("status", {}).get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

        try:
            wait_for(ready, timeout, 0.5, f"node {node.name} Ready")
        except WaitTimeout:
            tail = log_tail(self._log(f"{node.name}-kubelet"), 40)
            raise ClusterError(f"{node.name} not Ready:\n{tail}") from None

    def _label_as_p5(self, node: NodeLayout) -> None:
        """The labels of an EKS p5 node (those NodeRestriction does not let a kubelet set itself) and
        nvidia.com/gpu / vpc.amazonaws.com/efa capacity without devices (as the device plugins would
        advertise them; kubelet keeps extended resources it does not manage)."""
        want = nodes_mod.p5_node(
            node.name, zone=nodes_mod.DEFAULT_ZONES[node.index % len(nodes_mod.DEFAULT_ZONES)], annotations={}
        )
        labels = {"metadata": {"labels": want["metadata"]["labels"]}}
        self.cluster.kubectl("patch", "node", node.name, "--type=merge", "-p", json.dumps(labels))
        extended = {k: v for k, v in nodes_mod.P5_RESOURCES.items() if "/" in k}
        capacity = json.dumps({"status": {"capacity": extended}})
        self.cluster.kubectl(
            "patch", "node", node.name, "--subresource=status", "--type=merge", "-p", capacity
        )

    # ---- node death ----------------------------------------------------------------------------------
    def node_names(self) -> list[str]:
        """The nodes this run dir has (dead ones included)."""
        return [node_name(i) for i in range(MAX_NODES) if self.layout(i).dir.exists()]

    def _node(self, name: str) -> NodeLayout:
        if name not in self.node_names():
            raise ValueError(f"{name!r} is not a kubelet node of {self.run_dir} ({self.node_names()})")
        return self.layout(int(name.removeprefix(NODE_PREFIX)))

    def is_dead(self, name: str) -> bool:
        """Its kubelet is not running (killed, or never started)."""
        return read_pidfile(self._pidfile(f"{self._node(name).name}-kubelet")) is None

    def _app_containers(self, node: NodeLayout) -> dict[str, dict[str, str]]:
        """Container id -> labels of the app containers (not sandboxes) the node's containerd has; the
        CRI plugin labels each with its pod's namespace, name and UID. {} when containerd is down."""
        if read_pidfile(self._pidfile(f"{node.name}-containerd")) is None:
            return {}
        kind = 'labels."io.cri-containerd.kind"==container'
        ids = self._ctr(node, "containers", "ls", "--quiet", kind).stdout.split()
        containers = {}
        for cid in ids:
            info = self._ctr(node, "containers", "info", cid, check=False)
            if info.returncode == 0:
                containers[cid] = json.loads(info.stdout)["Labels"]
            elif "not found" not in info.stderr:  # else removed since the listing (the kubelet's GC)
                raise ClusterError(f"ctr containers info {cid} on {node.name}: {info.stderr.strip()}")
        return containers

    def pod_processes(self, namespace: str, name: str) -> list[ProcInfo]:
        """Every live process of the pod's containers on any live node (its pause sandbox excluded),
        found through the node's containerd and cgroup tree: [] once its containers are gone."""
        procs: list[ProcInfo] = []
        for node in map(self._node, self.node_names()):
            by_uid: dict[str, set[str]] = {}
            for cid, labels in self._app_containers(node).items():
                pod = (labels["io.kubernetes.pod.namespace"], labels["io.kubernetes.pod.name"])
                if pod == (namespace, name):
                    by_uid.setdefault(labels["io.kubernetes.pod.uid"], set()).add(cid)
            root = Path("/sys/fs/cgroup/pids") / node.cgroup_root.lstrip("/")
            for uid, ids in by_uid.items():
                procs += [p for p in map(read_process, container_pids(root, uid, ids)) if p is not None]
        return procs

    def kill_node(self, name: str) -> list[str]:
        """A node dies: its kubelet and containerd are SIGKILLed, then every process of its containers
        and their shims. The node lifecycle controller then marks it NotReady (no more Lease renewals).
        Returns the pods ("namespace/name") whose containers it ran."""
        node = self._node(name)
        pods = {
            f"{labels['io.kubernetes.pod.namespace']}/{labels['io.kubernetes.pod.name']}"
            for labels in self._app_containers(node).values()
        }
        stop(self._pidfile(f"{name}-kubelet"), grace=0, children=self._children)
        stop(self._pidfile(f"{name}-containerd"), grace=0, children=self._children)
        for pid in self._node_pids(node):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # What the dead machine had mounted (container root filesystems, pod volumes) goes with it.
        for mount in self._node_mounts(node):
            subprocess.run(["umount", "--lazy", mount], capture_output=True)
        return sorted(pods)

    def stop_kubelet(self, name: str) -> None:
        """A kubelet crashes, or its node is cut off from the control plane: the kubelet is SIGKILLed,
        containerd and every container keep running. The node goes NotReady like a dead one; its
        pods' processes live on, unknown to the API server once their pods are deleted. `up` starts
        the kubelet again (which then kills the containers of pods the API server no longer has)."""
        stop(self._pidfile(f"{self._node(name).name}-kubelet"), grace=0, children=self._children)

    @staticmethod
    def _node_mounts(node: NodeLayout) -> list[str]:
        """Mount points under the node's directory, deepest first."""
        prefix = f"{node.dir}/"
        points = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        return sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True)

    def _node_pids(self, node: NodeLayout) -> list[int]:
        """Processes in the node's cgroup tree, and the containerd shims serving its socket."""
        pids: set[int] = set()
        root = Path("/sys/fs/cgroup/pids") / node.cgroup_root.lstrip("/")
        if root.exists():
            for procs in root.rglob("cgroup.procs"):
                pids.update(int(p) for p in procs.read_text().split())
        needle = str(node.socket).encode()
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                with contextlib.suppress(OSError):
                    cmd = (proc / "cmdline").read_bytes()
                    if b"containerd-shim" in cmd and needle in cmd:
                        pids.add(int(proc.name))
        return sorted(pids)

    def down(self) -> None:
        for i in range(MAX_NODES):
            if (self.run_dir / "nodes" / node_name(i)).exists():
                self.kill_node(node_name(i))
        for name in ("kube-proxy", "coredns"):
            stop(self._pidfile(name), children=self._children)
        # kube-proxy's iptables rules outlive it: remove them (they would still DNAT Service IPs).
        subprocess.run([str(bin_path("kube-proxy")), "--cleanup"], capture_output=True, timeout=60)
        # The kubelets' own chains: an empty canary, a hint, and the localnet firewall hooked into
        # INPUT and OUTPUT (drops non-loopback packets to 127/8).
        for table, chain in (("nat", "INPUT"), ("filter", "INPUT"), ("filter", "OUTPUT")):
            subprocess.run(["iptables", "-t", table, "-D", chain, "-j", "KUBE-FIREWALL"], capture_output=True)
        for table in ("nat", "filter", "mangle"):
            for chain in ("KUBE-KUBELET-CANARY", "KUBE-FIREWALL", "KUBE-IPTABLES-HINT"):
                subprocess.run(["iptables", "-t", table, "-F", chain], capture_output=True)
                subprocess.run(["iptables", "-t", table, "-X", chain], capture_output=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rtj_local.kubelet_nodes", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--run-dir", type=Path, default=None)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--image", action="append", default=[], help="podman image to load into every node")
    load = sub.add_parser("load")
    load.add_argument("images", nargs="+")
    kill = sub.add_parser("kill")
    kill.add_argument("node")
    sub.add_parser("stop-kubelet").add_argument("node")
    sub.add_parser("down")
    args = parser.parse_args(argv)
    nodes = KubeletNodes(LocalCluster(args.run_dir or default_run_dir()))
    t0 = time.monotonic()
    try:
        if args.command == "up":
            names = nodes.up(args.nodes, args.image)
            print(f"nodes Ready in {time.monotonic() - t0:.1f}s: {', '.join(names)}", file=sys.stderr)
        elif args.command == "load":
            for i in range(MAX_NODES):
                layout = nodes.layout(i)
                if read_pidfile(nodes._pidfile(f"{layout.name}-containerd")) is not None:
                    nodes.load_images(layout, args.images)
        elif args.command == "kill":
            print("\n".join(nodes.kill_node(args.node)))
        elif args.command == "stop-kubelet":
            nodes.stop_kubelet(args.node)
        elif args.command == "down":
            nodes.down()
    except ClusterError as e:
        print(f"{args.command} failed: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
