"""Every pod the operator builds is admitted by the real API server's Pod Security admission in a
namespace enforcing `restricted` (server-side dry-run creates, as rtj.kube sends them): workers, hot
spares and the rendezvous pod, with the CRD's defaults and with a securityContext override. A plain pod
is refused there (the control: the namespace really enforces)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from rtj import builders, contract
from rtj.api.models import ResilientTrainingJob

pytestmark = pytest.mark.integration

FSX = {
    "fileSystemId": "fs-0123456789abcdef0",
    "dnsName": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
    "mountName": "abcdefgh",
}
SPECS: dict[str, dict[str, Any]] = {
    "defaults-pvc": {"checkpoint": {"pvc": {"claimName": "ckpt"}}, "hotSpares": 1},
    "defaults-fsx": {"checkpoint": {"fsx": FSX}},
    "override": {
        "checkpoint": {"pvc": {"claimName": "ckpt"}},
        "podTemplate": {
            "securityContext": {
                "runAsUser": 4242,
                "runAsGroup": 0,
                "fsGroup": 5000,
                "supplementalGroups": [7],
                "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/trainer.json"},
            },
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        },
    },
}


def enforce_restricted(core: client.CoreV1Api, namespace: str) -> None:
    labels = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    core.patch_namespace(namespace, {"metadata": {"labels": labels}})


def stored_job(rtj_api, namespace: str, name: str, spec: dict[str, Any]) -> ResilientTrainingJob:
    """The job as the API server stores it (its defaults applied), without storing it."""
    body = {
        "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
        "kind": contract.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"image": "trainer:1", "command": ["python", "train.py"], "nodes": 2, **spec},
    }
    created = rtj_api.api.create_namespaced_custom_object(
        contract.API_GROUP, contract.API_VERSION, namespace, contract.PLURAL, body, dry_run="All"
    )
    created["metadata"]["uid"] = "00000000-0000-0000-0000-000000000001"  # a dry run assigns none
    return ResilientTrainingJob.model_validate(created)


def dry_run_create(core: client.CoreV1Api, pod: dict[str, Any]) -> None:
    core.create_namespaced_pod(pod["metadata"]["namespace"], pod, dry_run="All")


def test_plain_pod_is_refused_in_the_restricted_namespace(kube, namespace: str) -> None:
    core = client.CoreV1Api(kube)
    enforce_restricted(core, namespace)
    pod = {"metadata": {"name": "plain"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(namespace, pod, dry_run="All")
    assert err.value.status == 403 and "restricted" in err.value.body


@pytest.mark.parametrize("case", sorted(SPECS))
def test_restricted_admits_every_pod_the_operator_builds(kube, rtj_api, namespace: str, case: str) -> None:
    core = client.CoreV1Api(kube)
    enforce_restricted(core, namespace)
    # The ServiceAccount admission plugin refuses pods naming a ServiceAccount that does not exist.
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "rtj-trainer"}})
    job = stored_job(rtj_api, namespace, "secure", SPECS[case])
    pods = [
        builders.worker_pod(job, 0, 0, "Initial"),
        builders.worker_pod(job, 1, 3, "HeartbeatTimeout", ("bad-node",), suspect_node="silent-node"),
        builders.worker_pod(job, 1, 4, "Initial", in_place_restarts=2),  # with the in-place rule
        builders.rendezvous_pod(job),
        *(builders.spare_pod(job, i, 0) for i in range(job.spec.hot_spares)),
    ]
    for pod in pods:
        try:
            dry_run_create(core, pod)
        except ApiException as exc:
            pytest.fail(f"{pod['metadata']['name']} refused: {exc.body}")


def test_the_api_server_keeps_the_in_place_restart_rule(kube, rtj_api, namespace: str) -> None:
    """The rule a pod restarts in place with (rtj.ladder.in_place) is stored as built: an API server
    whose ContainerRestartRules or RestartAllContainersOnContainerExits gate is off drops it
    silently (this one, v1.37, has both on by default)."""
    core = client.CoreV1Api(kube)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "rtj-trainer"}})
    job = stored_job(rtj_api, namespace, "inplace", SPECS["defaults-pvc"])
    pod = builders.worker_pod(job, 0, 0, "Initial", in_place_restarts=2)
    stored = core.api_client.sanitize_for_serialization(
        core.create_namespaced_pod(namespace, pod, dry_run="All")
    )
    container = stored["spec"]["containers"][0]
    assert container["restartPolicy"] == "Never"
    assert container["restartPolicyRules"] == [builders.IN_PLACE_RESTART_RULE]
