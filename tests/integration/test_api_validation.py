"""The real API server enforces the CRD: every invalid job is rejected with a message naming the
offending field (fieldValidation=Strict, so unknown fields are errors rather than silently pruned),
image and nodes are immutable, and the examples are accepted with defaults filled in."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from rtj import contract

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
API_VERSION = f"{contract.API_GROUP}/{contract.API_VERSION}"


def job(name: str = "job", **spec_overrides: Any) -> dict[str, Any]:
    spec = {
        "image": "trainer:1",
        "command": ["python", "train.py"],
        "nodes": 2,
        "checkpoint": {"pvc": {"claimName": "ckpt"}},
    }
    spec.update(spec_overrides)
    return {"apiVersion": API_VERSION, "kind": contract.KIND, "metadata": {"name": name}, "spec": spec}


def edit(fn: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    obj = job()
    fn(obj)
    return obj


FSX = {
    "fileSystemId": "fs-0123456789abcdef0",
    "dnsName": "fs-0123.fsx.us-east-1.amazonaws.com",
    "mountName": "abc",
}

# (id, manifest, text the server's message must contain: the offending field's path)
INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("zero-nodes", job(nodes=0), "spec.nodes"),
    ("missing-nodes", edit(lambda o: o["spec"].pop("nodes")), "spec.nodes"),
    ("nodes-not-a-number", job(nodes="four"), "spec.nodes"),
    ("missing-spec", edit(lambda o: o.pop("spec")), "spec"),
    ("gpus-per-node-9", job(gpusPerNode=9), "spec.gpusPerNode"),
    ("procs-exceed-gpus", job(gpusPerNode=4, procsPerNode=8), "spec.procsPerNode"),
    ("efa-33", job(resources={"efaPerNode": 33}), "spec.resources.efaPerNode"),
    (
        "negative-pod-reschedules",
        job(faultTolerance={"maxPodReschedules": -1}),
        "spec.faultTolerance.maxPodReschedules",
    ),
    (
        "negative-in-job-restarts",
        job(faultTolerance={"maxInJobRestarts": -1}),
        "spec.faultTolerance.maxInJobRestarts",
    ),
    (
        "negative-in-process-restarts",
        job(faultTolerance={"inProcessRestart": {"maxRestarts": -3}}),
        "spec.faultTolerance.inProcessRestart.maxRestarts",
    ),
    ("negative-hot-spares", job(hotSpares=-1), "spec.hotSpares"),
    ("unknown-spec-field", job(gpus=8), 'unknown field "spec.gpus"'),
    ("unknown-root-field", edit(lambda o: o.update(specification={})), 'unknown field "specification"'),
    (
        "unknown-nested-field",
        job(faultTolerance={"heartbeatSeconds": 5}),
        'unknown field "spec.faultTolerance.heartbeatSeconds"',
    ),
    (
        "unknown-field-in-list-item",
        job(env=[{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]),
        'unknown field "spec.env[0].valueFrom"',
    ),
    (
        "heartbeat-timeout-equals-interval",
        job(faultTolerance={"heartbeatIntervalSeconds": 10, "heartbeatTimeoutSeconds": 10}),
        "spec.faultTolerance.heartbeatTimeoutSeconds",
    ),
    (
        "startup-timeout-below-heartbeat-timeout",
        job(faultTolerance={"heartbeatTimeoutSeconds": 120, "startupTimeoutSeconds": 60}),
        "spec.faultTolerance.startupTimeoutSeconds",
    ),
    (
        "hard-timeout-not-above-soft",
        job(faultTolerance={"inProcessRestart": {"softTimeoutSeconds": 60, "hardTimeoutSeconds": 60}}),
        "spec.faultTolerance.inProcessRestart.hardTimeoutSeconds",
    ),
    ("both-pvc-and-fsx", job(checkpoint={"pvc": {"claimName": "ckpt"}, "fsx": FSX}), "spec.checkpoint"),
    ("neither-pvc-nor-fsx", job(checkpoint={"intervalSteps": 10}), "spec.checkpoint"),
    (
        "bad-fsx-id",
        job(checkpoint={"fsx": {**FSX, "fileSystemId": "fsx-123"}}),
        "spec.checkpoint.fsx.fileSystemId",
    ),
    (
        "fsx-without-mount-name",
        job(checkpoint={"fsx": {**FSX, "mountName": None}}),
        "spec.checkpoint.fsx.mountName",
    ),
    ("bad-claim-name", job(checkpoint={"pvc": {"claimName": "Bad_Name"}}), "spec.checkpoint.pvc.claimName"),
    (
        "relative-mount-path",
        job(checkpoint={"pvc": {"claimName": "c"}, "mountPath": "ckpt"}),
        "spec.checkpoint.mountPath",
    ),
    (
        "zero-interval",
        job(checkpoint={"pvc": {"claimName": "c"}, "intervalSteps": 0}),
        "spec.checkpoint.intervalSteps",
    ),
    ("bad-memory-quantity", job(resources={"memory": "12XB"}), "spec.resources.memory"),
    ("bad-shm-quantity", job(resources={"sharedMemorySize": "lots"}), "spec.resources.sharedMemorySize"),
    ("negative-integer-quantity", job(resources={"cpu": -1}), "spec.resources.cpu"),
    (
        "bad-toleration-effect",
        job(placement={"tolerations": [{"key": "k", "effect": "Sometimes"}]}),
        "spec.placement.tolerations[0].effect",
    ),
    (
        "bad-toleration-operator",
        job(placement={"tolerations": [{"key": "k", "operator": "In"}]}),
        "spec.placement.tolerations[0].operator",
    ),
    ("empty-command", job(command=[]), "spec.command"),
    ("empty-command-word", job(command=[""]), "spec.command[0]"),
    ("empty-image", job(image=""), "spec.image"),
    ("bad-env-name", job(env=[{"name": "1 BAD=NAME", "value": "x"}]), "spec.env[0].name"),
    (
        "exit-code-out-of-range",
        job(faultTolerance={"doNotRestartExitCodes": [0]}),
        "spec.faultTolerance.doNotRestartExitCodes[0]",
    ),
    (
        "hostpath-volume",
        job(podTemplate={"volumes": [{"name": "host", "hostPath": {"path": "/"}}]}),
        "spec.podTemplate.volumes[0].hostPath",
    ),
    (
        "volume-without-name",
        job(podTemplate={"volumes": [{"emptyDir": {}}]}),
        "spec.podTemplate.volumes[0].name",
    ),
    (
        "volume-with-empty-name",
        job(podTemplate={"volumes": [{"name": "", "emptyDir": {}}]}),
        "spec.podTemplate.volumes[0].name",
    ),
    ("too-many-nodes", job(nodes=10001), "spec.nodes"),
    # Pod security: only what the `restricted` Pod Security Standard admits can be expressed.
    (
        "run-as-root",
        job(podTemplate={"securityContext": {"runAsUser": 0}}),
        "spec.podTemplate.securityContext.runAsUser",
    ),
    (
        "run-as-non-root-false",
        job(podTemplate={"securityContext": {"runAsNonRoot": False}}),
        "spec.podTemplate.securityContext.runAsNonRoot",
    ),
    (
        "seccomp-unconfined",
        job(podTemplate={"securityContext": {"seccompProfile": {"type": "Unconfined"}}}),
        "spec.podTemplate.securityContext.seccompProfile.type",
    ),
    (
        "seccomp-localhost-without-profile",
        job(podTemplate={"securityContext": {"seccompProfile": {"type": "Localhost"}}}),
        "spec.podTemplate.securityContext.seccompProfile.localhostProfile",
    ),
]


def rejection(call: Callable[[], Any]) -> str:
    with pytest.raises(ApiException) as err:
        call()
    assert err.value.status in (400, 422), err.value
    return json.loads(err.value.body)["message"]


def test_table_has_at_least_twenty_cases() -> None:
    assert len(INVALID) >= 20
    assert len({case_id for case_id, _, _ in INVALID}) == len(INVALID)


@pytest.mark.parametrize("manifest,field", [(m, f) for _, m, f in INVALID], ids=[i for i, _, _ in INVALID])
def test_invalid_job_is_rejected_naming_the_field(
    rtj_api, namespace: str, manifest: dict, field: str
) -> None:
    message = rejection(lambda: rtj_api.create(namespace, copy.deepcopy(manifest)))
    assert field in message, message


def test_hostpath_message_says_why(rtj_api, namespace: str) -> None:
    manifest = job(podTemplate={"volumes": [{"name": "host", "hostPath": {"path": "/"}}]})
    message = rejection(lambda: rtj_api.create(namespace, manifest))
    assert "hostPath volumes are not allowed in podTemplate.volumes" in message


def test_cel_messages_are_ours(rtj_api, namespace: str) -> None:
    message = rejection(lambda: rtj_api.create(namespace, job(gpusPerNode=4, procsPerNode=8)))
    assert "procsPerNode must not exceed gpusPerNode" in message
    message = rejection(lambda: rtj_api.create(namespace, job(checkpoint={"intervalSteps": 10})))
    assert "exactly one of checkpoint.pvc or checkpoint.fsx must be set" in message
    no_snapshots = {"pvc": {"claimName": "ckpt"}, "peerReplica": True}
    message = rejection(lambda: rtj_api.create(namespace, job(checkpoint=no_snapshots)))
    assert "checkpoint.peerReplica needs checkpoint.memorySnapshotIntervalSteps > 0" in message
    on = {"pvc": {"claimName": "ckpt"}, "peerReplica": True, "memorySnapshotIntervalSteps": 10}
    assert rtj_api.create(namespace, job("peer", checkpoint=on))["spec"]["checkpoint"]["peerReplica"] is True


@pytest.mark.parametrize(
    "change,field",
    [
        ({"image": "trainer:2"}, "spec.image"),
        ({"nodes": 3}, "spec.nodes"),
        # issue 13, case 4: accepted silently before, then a replacement pod joined with another world.
        ({"procsPerNode": 3}, "spec.procsPerNode"),
        ({"gpusPerNode": 4}, "spec.gpusPerNode"),
        ({"checkpoint": {"pvc": {"claimName": "other"}}}, "spec.checkpoint.pvc"),
        ({"checkpoint": {"mountPath": "/elsewhere"}}, "spec.checkpoint.mountPath"),
        ({"checkpoint": {"pvc": None, "fsx": FSX}}, "spec.checkpoint.pvc"),
        ({"command": ["python", "other.py"]}, "spec.command"),
        ({"args": ["--lr", "1"]}, "spec.args"),
        ({"env": [{"name": "SEED", "value": "2"}]}, "spec.env"),
    ],
    ids=[
        "image",
        "nodes",
        "procsPerNode",
        "gpusPerNode",
        "claimName",
        "mountPath",
        "pvc-to-fsx",
        "command",
        "args",
        "env",
    ],
)
def test_fields_that_define_the_job_are_immutable(rtj_api, namespace: str, change: dict, field: str) -> None:
    rtj_api.create(namespace, job("immutable"))
    before = rtj_api.get(namespace, "immutable")
    message = rejection(lambda: rtj_api.patch(namespace, "immutable", {"spec": change}))
    assert field in message, message
    assert "is immutable" in message or "only together with suspend" in message, message
    after = rtj_api.get(namespace, "immutable")
    assert after["spec"] == before["spec"]  # nothing was lost or changed
    assert after["metadata"]["generation"] == before["metadata"]["generation"]


def test_program_changes_together_with_suspend(rtj_api, namespace: str) -> None:
    """command/args/env change through a whole-job restart: with suspend (all pods go), then resume."""
    rtj_api.create(namespace, job("restart"))
    change = {"suspend": True, "args": ["--lr", "1"], "command": ["python", "b.py"]}
    updated = rtj_api.patch(namespace, "restart", {"spec": change})
    assert updated["spec"]["args"] == ["--lr", "1"] and updated["spec"]["command"] == ["python", "b.py"]
    resumed = rtj_api.patch(namespace, "restart", {"spec": {"suspend": False}})
    assert resumed["spec"]["suspend"] is False
    message = rejection(lambda: rtj_api.patch(namespace, "restart", {"spec": {"args": []}}))
    assert "spec.args" in message and "only together with suspend" in message, message


def test_mutable_fields_can_change(rtj_api, namespace: str) -> None:
    rtj_api.create(namespace, job("mutable"))
    updated = rtj_api.patch(
        namespace, "mutable", {"spec": {"suspend": True, "faultTolerance": {"maxPodReschedules": 9}}}
    )
    assert updated["spec"]["suspend"] is True
    assert updated["spec"]["faultTolerance"]["maxPodReschedules"] == 9
    assert updated["metadata"]["generation"] == 2


def example_jobs() -> list[tuple[str, dict[str, Any]]]:
    return [
        (p.name, d)
        for p in sorted(EXAMPLES.glob("*.yaml"))
        for d in yaml.safe_load_all(p.read_text())
        if d and d["kind"] == contract.KIND
    ]


@pytest.mark.parametrize("name,manifest", example_jobs(), ids=[n for n, _ in example_jobs()])
def test_examples_are_accepted(rtj_api, namespace: str, name: str, manifest: dict) -> None:
    created = rtj_api.create(namespace, copy.deepcopy(manifest))
    assert created["spec"]["nodes"] == manifest["spec"]["nodes"]


def test_server_fills_in_defaults(rtj_api, namespace: str) -> None:
    created = rtj_api.create(namespace, job("defaults"))
    spec = created["spec"]
    assert spec["gpusPerNode"] == 8
    # cpu/memory: no schema default (they follow placement.instanceType in the operator).
    assert spec["resources"] == {"efaPerNode": 32, "sharedMemorySize": "64Gi"}
    ft = spec["faultTolerance"]
    assert (ft["heartbeatIntervalSeconds"], ft["heartbeatTimeoutSeconds"], ft["maxPodReschedules"]) == (
        10,
        60,
        4,
    )
    assert ft["inProcessRestart"]["hardTimeoutSeconds"] == 90
    assert spec["checkpoint"]["mountPath"] == "/checkpoints"
    assert spec["checkpoint"]["memorySnapshotGpuStaging"] is True
    assert spec["podTemplate"]["securityContext"] == {
        "fsGroup": 10001,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_pod_security_override_is_accepted(rtj_api, namespace: str) -> None:
    security = {
        "runAsUser": 4242,
        "runAsGroup": 0,
        "fsGroup": 5000,
        "supplementalGroups": [7],
        "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/trainer.json"},
    }
    created = rtj_api.create(namespace, job("secure", podTemplate={"securityContext": security}))
    assert created["spec"]["podTemplate"]["securityContext"] == {
        **security,
        "fsGroupChangePolicy": "OnRootMismatch",
    }


def test_integer_quantities_are_accepted(rtj_api, namespace: str) -> None:
    created = rtj_api.create(namespace, job("ints", resources={"cpu": 180, "memory": "1800Gi"}))
    assert created["spec"]["resources"]["cpu"] == 180


def test_status_is_a_subresource_with_a_typed_schema(rtj_api, namespace: str) -> None:
    rtj_api.create(namespace, job("status"))
    # Writes to the main resource ignore status ...
    rtj_api.patch(namespace, "status", {"status": {"state": "Hacked"}})
    assert rtj_api.get(namespace, "status").get("status", {}).get("state", "") != "Hacked"
    # ... the status subresource takes it ...
    patched = rtj_api.patch_status(
        namespace, "status", {"status": {"state": "Running", "nodesReady": 2, "restarts": {"inJob": 1}}}
    )
    assert patched["status"]["state"] == "Running" and patched["status"]["restarts"]["podReschedules"] == 0
    # ... and checks it against the schema.
    message = rejection(lambda: rtj_api.patch_status(namespace, "status", {"status": {"bogus": 1}}))
    assert 'unknown field "status.bogus"' in message
    message = rejection(
        lambda: rtj_api.patch_status(
            namespace, "status", {"status": {"conditions": [{"type": "Running", "status": "Maybe"}]}}
        )
    )
    assert "status.conditions[0].status" in message
