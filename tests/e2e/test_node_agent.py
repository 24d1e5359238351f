"""The local node agent (kubelet stand-in) against the real control plane: pods become processes with
their exit codes reported, deletion stops them like kubelet, a dead node goes NotReady for real
and a repaired one Ready again."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rtj_local.cluster import LocalCluster
from rtj_local.node_agent import NodeAgent
from rtj_local.rawapi import RawApi
from rtj_local.versions import REPO_ROOT
from rtj_local.wait import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

NODE = "agent-test-0"


@pytest.fixture
def agent(cluster: LocalCluster) -> Iterator[NodeAgent]:
    run_dir = REPO_ROOT / ".run" / f"agent-test-{time.strftime('%H%M%S')}"
    with NodeAgent(cluster.kubeconfig, run_dir, [NODE], lease_duration_seconds=20) as agent:
        yield agent


@pytest.fixture
def raw(cluster: LocalCluster) -> RawApi:
    return cluster.raw()


def pod(name: str, script: str, grace: int = 30) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": NODE,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": grace,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": ["sh", "-c", script],
                    "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                }
            ],
        },
    }


def phase(raw: RawApi, namespace: str, name: str) -> str | None:
    obj = raw.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return obj and obj.get("status", {}).get("phase")


def test_a_pod_runs_as_a_process_in_its_own_namespace_and_its_exit_code_is_reported(
    agent: NodeAgent, raw: RawApi, namespace: str
) -> None:
    script = (
        "echo hi from $POD_NAME; cat /var/run/secrets/kubernetes.io/serviceaccount/namespace; echo;"
        " getent hosts kubernetes.default.svc; df -P /dev/shm | tail -1; exit 3"
    )
    raw.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod("exit3", script))
    wait_for(lambda: phase(raw, namespace, "exit3") == "Failed", timeout=60, message="pod exit3 Failed")
    status = raw.request("GET", f"/api/v1/namespaces/{namespace}/pods/exit3")["status"]
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")
    assert status["podIP"] == "127.0.0.1"
    log = (agent.pod_dir(namespace, "exit3") / "container.log").read_text()
    assert "hi from exit3" in log
    assert namespace in log  # the ServiceAccount volume (TokenRequest token, ca.crt, namespace)
    assert "127.0.0.1" in log and "kubernetes.default.svc" in log  # /etc/hosts names Services
    assert " 65536 " in log  # /dev/shm: a private 64 MiB tmpfs (1K blocks), as a container runtime gives


def test_deleting_a_pod_sigterms_then_sigkills_it_after_the_grace_period(
    agent: NodeAgent, raw: RawApi, namespace: str
) -> None:
    raw.request(
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        pod("stubborn", "trap '' TERM; while :; do sleep 0.2; done", 2),
    )
    wait_for(
        lambda: phase(raw, namespace, "stubborn") == "Running", timeout=60, message="pod stubborn Running"
    )
    pids = [p.pid for p in agent.pod_processes(namespace, "stubborn")]
    assert pids
    t0 = time.monotonic()
    raw.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/stubborn")
    wait_for(lambda: phase(raw, namespace, "stubborn") is None, timeout=30, message="pod stubborn deleted")
    assert time.monotonic() - t0 >= 2.0, (
        "SIGTERM is ignored: only the SIGKILL after the grace period stops it"
    )
    wait_for(lambda: not [pid for pid in pids if _alive(pid)], timeout=10, message="the pod's processes dead")


def test_a_dead_node_goes_not_ready_and_is_tainted_by_the_node_lifecycle_controller(
    agent: NodeAgent, raw: RawApi, namespace: str
) -> None:
    raw.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod("victim", "sleep 1000"))
    wait_for(lambda: phase(raw, namespace, "victim") == "Running", timeout=60, message="pod victim Running")
    pids = [p.pid for p in agent.pod_processes(namespace, "victim")]
    assert agent.kill_node(NODE) == [f"{namespace}/victim"]
    wait_for(lambda: not [pid for pid in pids if _alive(pid)], timeout=10, message="the pod's processes dead")

    def not_ready_and_tainted() -> bool:
        node = raw.request("GET", f"/api/v1/nodes/{NODE}")
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        taints = {t["key"] for t in node["spec"].get("taints") or []}
        return ready["status"] != "True" and "node.kubernetes.io/unreachable" in taints

    wait_for(not_ready_and_tainted, timeout=90, interval=1.0, message=f"node {NODE} NotReady and tainted")
    assert phase(raw, namespace, "victim") == "Running"  # nobody is left to report otherwise

    # Repaired (as an admin does): its old pod deleted, the node back Ready and untainted, running pods.
    raw.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/victim", {"gracePeriodSeconds": 0})
    agent.revive_node(NODE)

    def ready_and_untainted() -> bool:
        node = raw.request("GET", f"/api/v1/nodes/{NODE}")
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        taints = {t["key"] for t in node["spec"].get("taints") or []}
        return ready["status"] == "True" and not taints & {
            "node.kubernetes.io/unreachable",
            "node.kubernetes.io/not-ready",
        }

    wait_for(ready_and_untainted, timeout=90, interval=1.0, message=f"node {NODE} Ready and untainted again")
    raw.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod("after-repair", "exit 0"))
    wait_for(
        lambda: phase(raw, namespace, "after-repair") == "Succeeded",
        timeout=60,
        message="a pod on the repaired node Succeeded",
    )


def _alive(pid: int) -> bool:
    """True for a live process; a zombie (killed, not yet reaped by init) counts as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between open and read
        return False
    return stat[stat.rindex(")") + 2] not in "ZX" and os.path.exists(f"/proc/{pid}")
