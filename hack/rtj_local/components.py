"""What each control-plane component runs with (command lines) and how its health is probed."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rtj_local import nodes as nodes_mod
from rtj_local.versions import bin_path, kwok_stages_path

# Start order; stopped in reverse.
COMPONENTS: tuple[str, ...] = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
SERVICE_CIDR = "10.96.0.0/16"
POD_CIDR = "10.244.0.0/16"  # KWOK hands out pod IPs from here
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMIN_USER = "rtj-admin"
LOOPBACK = "127.0.0.1"
# Real worker nodes (rtj_local.kubelet_nodes): an address of ours on a link of ours (rtj0), through which pods
# reach the API server (the `kubernetes` Service's endpoint), CoreDNS and every kubelet.
NODE_HOST_IP = "10.246.0.1"
MAX_REAL_NODES = 4
REAL_NODE_PREFIX = "rtj-node-"
COREDNS_USER = "rtj:coredns"
KUBE_PROXY_USER = "system:kube-proxy"


def real_node_token_users() -> dict[str, str]:
    """User -> groups of the identities real nodes use: each kubelet as system:node:<name> (the Node
    authorizer and NodeRestriction key on it), kube-proxy (bound to system:node-proxier by the bootstrap
    RBAC) and CoreDNS (bound by kubelet_nodes.COREDNS_RBAC). Their tokens exist in every cluster."""
    users = {f"system:node:{REAL_NODE_PREFIX}{i}": "system:nodes" for i in range(MAX_REAL_NODES)}
    users[KUBE_PROXY_USER] = ""
    users[COREDNS_USER] = ""
    return users


@dataclass(frozen=True)
class ClusterOptions:
    # How long the node lifecycle controller waits for a node's Lease/heartbeat before marking it
    # NotReady (upstream default 50s). Shortened so outage tests run quickly.
    node_monitor_grace_period: str = "20s"
    node_monitor_period: str = "2s"
    # KWOK renews each fake node's Lease every quarter of this (upstream default 40s).
    node_lease_duration_seconds: int = 20
    start_timeout: float = 120.0


def component_kubeconfig(run_dir: Path, user: str) -> Path:
    """Kubeconfig of a component's own identity (a token in the apiserver's token file)."""
    return run_dir / "kubeconfigs" / f"{user.removeprefix('system:')}.kubeconfig"


def _control_loop_flags(component: str, run_dir: Path, port: int, cert_dir: str) -> list[str]:
    """The binary and flags that kube-controller-manager and kube-scheduler share: their own client
    identity (system:<component>) for every API use, a loopback secure port, and one instance."""
    kc = component_kubeconfig(run_dir, f"system:{component}")
    return [
        str(bin_path(component)),
        f"--kubeconfig={kc}",
        f"--authentication-kubeconfig={kc}",
        f"--authorization-kubeconfig={kc}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={port}",
        f"--cert-dir={run_dir / 'pki' / cert_dir}",
        "--leader-elect=false",
    ]


def argv(
    component: str, run_dir: Path, ports: Mapping[str, int], opts: ClusterOptions, real_nodes: bool = False
) -> list[str]:
    """Command line of `component` for the cluster in `run_dir`. With `real_nodes`, the API server also
    listens where pods can reach it and publishes NODE_HOST_IP as the `kubernetes` Service's endpoint."""
    p, pki = ports, run_dir / "pki"
    b = str(bin_path(component))
    loop = LOOPBACK
    if component == "etcd":
        peer = f"http://{loop}:{p['etcd-peer']}"
        client = f"http://{loop}:{p['etcd']}"
        return [
            b,
            "--name=rtj",
            f"--data-dir={run_dir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=rtj={peer}",
            "--initial-cluster-state=new",
            # A throwaway test store: skip fsync (much faster on slow disks).
            "--unsafe-no-fsync",
            "--log-level=warn",
        ]
    if component == "kube-apiserver":
        if real_nodes:
            listen = ["--bind-address=0.0.0.0", f"--advertise-address={NODE_HOST_IP}"]
            # Reach kubelets at their InternalIP (the nodes' names resolve nowhere).
            listen += ["--endpoint-reconciler-type=lease", "--kubelet-preferred-address-types=InternalIP"]
            listen += [
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
            ]
        else:
            # The endpoint reconciler refuses a loopback advertise address; nothing here needs the
            # `kubernetes` Service's endpoints (clients reach 127.0.0.1 directly).
            listen = [f"--bind-address={loop}", f"--advertise-address={loop}"]
            listen.append("--endpoint-reconciler-type=none")
        return [
            b,
            f"--etcd-servers=http://{loop}:{p['etcd']}",
            *listen,
            f"--secure-port={p[component]}",
            f"--cert-dir={pki / 'apiserver-certs'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-account-issuer={SA_ISSUER}",
            f"--api-audiences={SA_ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allow-privileged=true",
            "--profiling=false",
            # Default admission plugins (ServiceAccount, DefaultTolerationSeconds, ResourceQuota,
            # PodSecurity, TaintNodesByCondition, webhooks, ...) plus NodeRestriction.
            "--enable-admission-plugins=NodeRestriction",
        ]
    if component == "kube-controller-manager":
        return [
            *_control_loop_flags(component, run_dir, p[component], "kcm-certs"),
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--allocate-node-cidrs=false",
            "--cluster-name=rtj-local",
            "--controllers=*",
            f"--node-monitor-grace-period={opts.node_monitor_grace_period}",
            f"--node-monitor-period={opts.node_monitor_period}",
            "--profiling=false",
        ]
    if component == "kube-scheduler":
        return [
            *_control_loop_flags(component, run_dir, p[component], "scheduler-certs"),
            "--profiling=false",
        ]
    if component == "kwok":
        selector = f"{nodes_mod.KWOK_ANNOTATION_KEY}={nodes_mod.KWOK_ANNOTATION_VALUE}"
        return [
            b,
            f"--kubeconfig={component_kubeconfig(run_dir, 'kwok')}",
            f"--config={kwok_stages_path()}",
            # Only nodes carrying the annotation: nodes of the local node agent are left alone.
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={selector}",
            f"--manage-nodes-with-label-selector={nodes_mod.KWOK_HEARTBEAT_LABEL}=true",
            f"--server-address={loop}:{p[component]}",
            f"--cidr={POD_CIDR}",
            f"--node-ip={loop}",
            f"--node-lease-duration-seconds={opts.node_lease_duration_seconds}",
        ]
    raise ValueError(component)


def probe(component: str, port: int, ca_file: Path, admin_token: str) -> bool:
    """One health check of `component`: /health (etcd), /readyz (apiserver) or /healthz."""
    p = port
    if component == "etcd":
        url, ctx, token = f"http://127.0.0.1:{p}/health", None, None
    elif component == "kube-apiserver":
        url, token = f"https://127.0.0.1:{p}/readyz", admin_token
        ctx = ssl.create_default_context(cafile=str(ca_file))
    elif component == "kwok":
        url, ctx, token = f"http://127.0.0.1:{p}/healthz", None, None
    else:  # controller-manager and scheduler serve /healthz with a self-signed cert of their own
        url, token = f"https://127.0.0.1:{p}/healthz", None
        ctx = ssl._create_unverified_context()
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=2, context=ctx) as resp:
            body = resp.read()
    except (urllib.error.URLError, OSError):
        return False
    return b'"health":"true"' in body if component == "etcd" else True
