"""Issue 16, point 2: the real API server classes every trainer pod the operator builds (workers and hot
spares) as Guaranteed, from the instance type's defaults and from `spec.resources`, and keeps the
`/dev/shm` size the spec asks for. The QoS class is the one the API server computes on create
(`status.qosClass` of a server-side dry run), not one we compute ourselves."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from rtj import builders
from test_pod_security import stored_job

pytestmark = pytest.mark.integration

CKPT = {"checkpoint": {"pvc": {"claimName": "ckpt"}}, "hotSpares": 1}
SPECS: dict[str, dict[str, Any]] = {
    "instance-defaults": {**CKPT, "placement": {"instanceType": "p4d.24xlarge"}},
    "spec-resources": {**CKPT, "resources": {"cpu": 8, "memory": "64Gi", "sharedMemorySize": "8Gi"}},
}


def created(core: client.CoreV1Api, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as the API server would store it (admission and defaulting applied), not stored."""
    stored = core.create_namespaced_pod(pod["metadata"]["namespace"], pod, dry_run="All")
    return core.api_client.sanitize_for_serialization(stored)


@pytest.mark.parametrize("case", sorted(SPECS))
def test_api_server_classes_trainer_pods_guaranteed_with_the_spec_shm(
    kube, rtj_api, namespace: str, case: str
) -> None:
    core = client.CoreV1Api(kube)
    # The ServiceAccount admission plugin refuses pods naming a ServiceAccount that does not exist.
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "rtj-trainer"}})
    job = stored_job(rtj_api, namespace, "qos", SPECS[case])
    pods = [builders.worker_pod(job, 0, 0, "Initial"), builders.spare_pod(job, 0, 0)]
    for pod in pods:
        stored = created(core, pod)
        assert stored["status"]["qosClass"] == "Guaranteed", pod["metadata"]["name"]
        shm = next(v for v in stored["spec"]["volumes"] if v["name"] == builders.SHM_VOLUME)
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": job.spec.resources.shared_memory_size}


def test_rendezvous_pod_is_not_best_effort(kube, rtj_api, namespace: str) -> None:
    """The rendezvous pod requests less than it may use (Burstable): the store is small but imports torch."""
    core = client.CoreV1Api(kube)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "rtj-trainer"}})
    job = stored_job(rtj_api, namespace, "qos", CKPT)
    assert created(core, builders.rendezvous_pod(job))["status"]["qosClass"] == "Burstable"
