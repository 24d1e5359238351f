"""The local control plane is real: the scheduler places GPU pods on fake p5 nodes, KWOK runs them,
and the server reports the Kubernetes version we built."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest
from kubernetes import client
from rtj_local.cluster import LocalCluster
from rtj_local.nodes import (
    EFA_RESOURCE,
    GPU_RESOURCE,
    GPU_TOLERATION,
    INSTANCE_TYPE,
    KWOK_ANNOTATION_KEY,
    KWOK_HEARTBEAT_LABEL,
    p5_node,
)
from rtj_local.versions import bin_path, versions
from rtj_local.wait import wait_for

pytestmark = pytest.mark.integration


def gpu_pod(name: str, gpus: int, efa: int) -> dict:
    resources = {GPU_RESOURCE: str(gpus), EFA_RESOURCE: str(efa), "cpu": "4", "memory": "16Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "trainer", "image": "trainer:local", "resources": {"limits": resources}}],
            "tolerations": [GPU_TOLERATION],
        },
    }


def pod_condition(pod: client.V1Pod, type_: str) -> client.V1PodCondition | None:
    return next((c for c in pod.status.conditions or [] if c.type == type_), None)


def test_full_node_gpu_pod_is_scheduled_on_a_p5_node_and_runs(kube: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube)
    core.create_namespaced_pod(namespace, gpu_pod("full-node", gpus=8, efa=32))

    def running() -> client.V1Pod | None:
        pod = core.read_namespaced_pod("full-node", namespace)
        return pod if pod.status.phase == "Running" else None

    pod = wait_for(running, timeout=60, message="pod full-node to be Running")

    scheduled = pod_condition(pod, "PodScheduled")
    assert scheduled is not None and scheduled.status == "True"
    node = core.read_node(pod.spec.node_name)
    assert node.metadata.labels["node.kubernetes.io/instance-type"] == INSTANCE_TYPE
    assert node.metadata.annotations[KWOK_ANNOTATION_KEY] == "fake"
    assert node.status.allocatable[GPU_RESOURCE] == "8"
    assert pod.status.pod_ip  # assigned by KWOK


def test_pod_asking_for_more_gpus_than_a_node_has_stays_pending(
    kube: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube)
    core.create_namespaced_pod(namespace, gpu_pod("too-big", gpus=9, efa=32))

    def unschedulable() -> client.V1PodCondition | None:
        cond = pod_condition(core.read_namespaced_pod("too-big", namespace), "PodScheduled")
        return cond if cond is not None and cond.status == "False" else None

    cond = wait_for(unschedulable, timeout=60, message="PodScheduled=False on pod too-big")
    assert cond.reason == "Unschedulable"
    assert GPU_RESOURCE in (cond.message or "")
    pod = core.read_namespaced_pod("too-big", namespace)
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None


def test_server_reports_the_kubernetes_version_we_built(cluster: LocalCluster) -> None:
    out = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    built = versions()["K8S_VERSION"]
    assert out["serverVersion"]["gitVersion"] == built
    assert out["serverVersion"]["major"] == "1"
    assert out["serverVersion"]["minor"] == built.split(".")[1]


def test_helm_runs_against_the_cluster(cluster: LocalCluster) -> None:
    version = subprocess.run(
        [bin_path("helm"), "version", "--short"], capture_output=True, text=True, check=True
    )
    assert version.stdout.startswith(versions()["HELM_VERSION"])
    releases = subprocess.run(
        [bin_path("helm"), "list", "--all-namespaces", "-o", "json", f"--kubeconfig={cluster.kubeconfig}"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert isinstance(json.loads(releases.stdout), list)


def test_service_account_kubeconfig_authenticates_as_the_service_account(
    cluster: LocalCluster, namespace: str
) -> None:
    kubeconfig = cluster.service_account_kubeconfig(namespace, "default")
    whoami = subprocess.run(
        [bin_path("kubectl"), f"--kubeconfig={kubeconfig}", "auth", "whoami", "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    username = json.loads(whoami.stdout)["status"]["userInfo"]["username"]
    assert username == f"system:serviceaccount:{namespace}:default"
    denied = subprocess.run(
        [bin_path("kubectl"), f"--kubeconfig={kubeconfig}", "get", "nodes"], capture_output=True, text=True
    )
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()


def node_ready_status(core: client.CoreV1Api, name: str) -> str | None:
    node = core.read_node(name)
    return next((c.status for c in node.status.conditions or [] if c.type == "Ready"), None)


def test_node_goes_not_ready_when_its_heartbeat_stops_and_recovers(
    cluster: LocalCluster, kube: client.ApiClient
) -> None:
    core = client.CoreV1Api(kube)
    name = f"hb-{uuid.uuid4().hex[:6]}"
    cluster.create_nodes([p5_node(name)])
    try:
        cluster.stop_node_heartbeat(name)
        # The node lifecycle controller notices the stale Lease after --node-monitor-grace-period.
        wait_for(
            lambda: node_ready_status(core, name) == "Unknown", timeout=60, message=f"{name} Ready=Unknown"
        )
        # The taint follows the condition in a later pass of the same controller.
        wait_for(
            lambda: (
                "node.kubernetes.io/unreachable" in {t.key for t in core.read_node(name).spec.taints or []}
            ),
            timeout=30,
            message=f"{name} tainted unreachable",
        )

        cluster.resume_node_heartbeat(name)
        wait_for(lambda: node_ready_status(core, name) == "True", timeout=60, message=f"{name} Ready again")
    finally:
        core.delete_node(name)


def test_kwok_leaves_nodes_without_its_annotation_alone(
    cluster: LocalCluster, kube: client.ApiClient
) -> None:
    core = client.CoreV1Api(kube)
    suffix = uuid.uuid4().hex[:6]
    # A node of the local node agent: same builder, another annotation.
    other = p5_node(f"agent-{suffix}", annotations={"rtj.local/node-agent": "true"})
    assert KWOK_HEARTBEAT_LABEL not in other["metadata"]["labels"]
    try:
        # create_nodes returns once the KWOK node is Ready: KWOK has processed both by then.
        cluster.create_nodes([other, p5_node(f"kwok-{suffix}")])
        assert node_ready_status(core, f"agent-{suffix}") is None
        assert (
            client.CoordinationV1Api(kube)
            .list_namespaced_lease("kube-node-lease", field_selector=f"metadata.name=agent-{suffix}")
            .items
            == []
        )
    finally:
        core.delete_node(f"agent-{suffix}")
        core.delete_node(f"kwok-{suffix}")
