"""Run the operator as a real subprocess (`python -m rtj`, rtj_local.stack.OperatorProcess) against
the test cluster, and act as the trainer would (heartbeat Leases written through rtj.contract, pod
exits as pod status).

Used by tests/integration/test_operator_*.py through `operator_env_factory()` (their conftest.py).
Each test gets its own namespace, its own KWOK p5 nodes (labelled with a node group named after the
namespace, which the job selects) and its own operator process watching only that namespace, so tests
never see each other's pods, nodes or taints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from rtj import builders, contract
from rtj.contract import micro_time
from rtj_local.nodes import KWOK_ANNOTATION_KEY, KWOK_HEARTBEAT_LABEL, p5_node
from rtj_local.rawapi import RawApi
from rtj_local.stack import OperatorProcess
from rtj_local.wait import wait_for

NODEGROUP_LABEL = "eks.amazonaws.com/nodegroup"
TRAINER_SERVICE_ACCOUNT = "rtj-trainer"


def make_nodes(core: client.CoreV1Api, nodegroup: str, count: int, timeout: float = 60) -> list[str]:
    names = [f"{nodegroup[:40]}-n{i}" for i in range(count)]
    for name in names:  # raw POST: the typed client would drop/refuse parts of the fake status
        RawApi(core.api_client).request(
            "POST", "/api/v1/nodes", p5_node(name, labels={NODEGROUP_LABEL: nodegroup})
        )

    def ready() -> bool:
        for name in names:
            node = core.read_node(name)
            if not any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or []):
                return False
        return True

    wait_for(ready, timeout=timeout, message=f"nodes {names} Ready")
    return names


def make_node_not_ready(core: client.CoreV1Api, name: str) -> None:
    """Take the node away from KWOK (no more heartbeats), then report it NotReady as a dead kubelet
    would be seen by the node lifecycle controller."""
    # KWOK reads its annotation only when it first sees a node; the heartbeat label is what it
    # re-checks (hack/rtj_local/nodes.py), so both go.
    released = {"annotations": {KWOK_ANNOTATION_KEY: None}, "labels": {KWOK_HEARTBEAT_LABEL: None}}
    core.patch_node(name, {"metadata": released})
    node = core.read_node(name)
    conditions = [
        {
            "type": c.type,
            "status": "False" if c.type == "Ready" else c.status,
            "reason": "KubeletStopped",
            "message": "test: kubelet stopped",
            "lastHeartbeatTime": micro_time(datetime.now(UTC))[:19] + "Z",
            "lastTransitionTime": micro_time(datetime.now(UTC))[:19] + "Z",
        }
        for c in node.status.conditions or []
    ]
    core.patch_node_status(name, {"status": {"conditions": conditions}})


def set_node_condition(
    core: client.CoreV1Api, name: str, type_: str, status: str, reason: str, message: str
) -> None:
    """Report a Node condition as a node health agent would (the EKS node monitoring agent,
    node-problem-detector): a strategic merge of status.conditions, keyed by type."""
    now = micro_time(datetime.now(UTC))[:19] + "Z"
    condition = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    core.patch_node_status(name, {"status": {"conditions": [condition]}})


def set_boot_id(core: client.CoreV1Api, name: str, boot_id: str) -> None:
    """Report the node's boot ID as its kubelet does when it starts (status.nodeInfo.bootID): a new
    one after each boot of the machine. KWOK keeps what is written."""
    core.patch_node_status(name, {"status": {"nodeInfo": {"bootID": boot_id}}})


def quarantine_taint(core: client.CoreV1Api, node: str) -> client.V1Taint | None:
    """The node's quarantine taint (contract.QUARANTINE_TAINT_KEY, NoSchedule), if any."""
    taints = core.read_node(node).spec.taints or []
    return next(
        (t for t in taints if t.key == contract.QUARANTINE_TAINT_KEY and t.effect == "NoSchedule"), None
    )


def node_annotations(core: client.CoreV1Api, node: str) -> dict[str, str]:
    return core.read_node(node).metadata.annotations or {}


def node_quarantine(core: client.CoreV1Api, node: str) -> contract.Quarantine | None:
    """The node's quarantine record (contract.QUARANTINE_ANNOTATION)."""
    return contract.parse_quarantine(node_annotations(core, node).get(contract.QUARANTINE_ANNOTATION))


def node_faults(core: client.CoreV1Api, node: str) -> tuple[contract.NodeFault, ...]:
    """The node's record of pod faults without evidence against it (contract.NODE_FAULTS_ANNOTATION)."""
    return contract.parse_node_faults(node_annotations(core, node).get(contract.NODE_FAULTS_ANNOTATION))


def lift_quarantine(core: client.CoreV1Api, node: str) -> None:
    """What an admin does after repairing a node: the quarantine taint and its record removed."""
    try:
        obj = core.read_node(node)
    except client.ApiException as exc:
        if exc.status == 404:
            return
        raise
    kept = [
        core.api_client.sanitize_for_serialization(t)
        for t in obj.spec.taints or []
        if t.key != contract.QUARANTINE_TAINT_KEY
    ]
    patch = {"metadata": {"annotations": {contract.QUARANTINE_ANNOTATION: None}}, "spec": {"taints": kept}}
    core.patch_node(node, patch)


def read_pv(core: client.CoreV1Api, name: str) -> client.V1PersistentVolume | None:
    """The PV, or None once it is gone (404)."""
    try:
        return core.read_persistent_volume(name)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of metric `name` (Prometheus text) whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        series, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in series for k, v in labels.items()):
            total += float(value)
    return total


#: The restart counters of status.restarts (without the incident times kept beside them).
COUNTERS = ("inProcess", "inJob", "podReschedules", "disruptions", "job")


def counters(status: dict[str, Any]) -> dict[str, int]:
    restarts = status.get("restarts") or {}
    return {k: int(restarts.get(k, 0)) for k in COUNTERS}


def job_manifest(name: str, nodegroup: str, nodes: int, **spec: Any) -> dict[str, Any]:
    ft = {
        "heartbeatIntervalSeconds": 1,
        "heartbeatTimeoutSeconds": 4,
        "startupTimeoutSeconds": 30,
        "maxPodReschedules": 4,
    }
    ft.update(spec.pop("faultTolerance", {}))
    return {
        "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
        "kind": contract.KIND,
        "metadata": {"name": name},
        "spec": {
            "image": "rtj-trainer:local",
            "command": ["python", "train.py"],
            "nodes": nodes,
            "placement": {"nodeSelector": {NODEGROUP_LABEL: nodegroup}},
            "resources": {"cpu": "4", "memory": "16Gi"},
            # FSx: the operator creates the static PV and its PVC (the PV controller binds them, so
            # the scheduler accepts the pods; KWOK mounts nothing).
            "checkpoint": {
                "fsx": {
                    "fileSystemId": "fs-0123456789abcdef0",
                    "mountName": "abcdefgh",
                    "dnsName": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
                }
            },
            "faultTolerance": ft,
            **spec,
        },
    }


@dataclass
class Trainers:
    """Plays the trainers of one job: renews each running pod's Lease as the heartbeat agent would.

    `heartbeats[pod]` is what that pod reports (default: Training); pods in `silent` stop renewing.
    Call `beat()` from inside wait predicates: no background thread, no sleep.
    """

    core: client.CoreV1Api
    coord: client.CoordinationV1Api
    namespace: str
    job: str
    heartbeats: dict[str, contract.Heartbeat] = field(default_factory=dict)
    silent: set[str] = field(default_factory=set)

    def pods(self) -> list[client.V1Pod]:
        return self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{contract.LABEL_JOB}={self.job}"
        ).items

    def beat(self) -> None:
        for pod in self.pods():
            role = pod.metadata.labels.get(contract.LABEL_ROLE)
            if (
                role == contract.ROLE_RENDEZVOUS
                or pod.status.phase != "Running"
                or pod.metadata.deletion_timestamp
            ):
                continue
            if pod.metadata.name in self.silent:
                continue
            default = contract.PodState.STANDBY if role == contract.ROLE_SPARE else contract.PodState.TRAINING
            hb = self.heartbeats.get(pod.metadata.name) or contract.Heartbeat(state=default)
            self.write_lease(pod, hb)

    def write_lease(self, pod: client.V1Pod, hb: contract.Heartbeat) -> None:
        name = contract.lease_name(pod.metadata.name)
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "labels": {contract.LABEL_JOB: self.job},
                "annotations": {contract.HEARTBEAT_ANNOTATION: hb.to_annotation()},
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name, "uid": pod.metadata.uid}
                ],
            },
            "spec": {
                "holderIdentity": pod.metadata.name,
                "leaseDurationSeconds": contract.lease_duration_seconds(1),  # heartbeatIntervalSeconds 1
                "renewTime": micro_time(datetime.now(UTC)),
            },
        }
        try:  # merge patch keeps annotations the operator added (assigned-slot), as the agent must
            self.coord.patch_namespaced_lease(
                name, self.namespace, {"metadata": body["metadata"], "spec": body["spec"]}
            )
        except client.ApiException as exc:
            if exc.status != 404:
                raise
            RawApi(self.core.api_client).request(
                "POST",
                f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases",
                body,
            )


def end_pod(core: client.CoreV1Api, namespace: str, name: str, exit_code: int) -> None:
    """The trainer container exited: what a kubelet would report."""
    phase = "Succeeded" if exit_code == 0 else "Failed"
    pod = core.read_namespaced_pod(name, namespace)
    now = micro_time(datetime.now(UTC))[:19] + "Z"
    status = {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}],
        "containerStatuses": [
            {
                "name": "trainer",
                "image": pod.spec.containers[0].image,
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": exit_code,
                        "reason": "Error" if exit_code else "Completed",
                        "startedAt": now,
                        "finishedAt": now,
                    }
                },
            }
        ],
    }
    core.patch_namespaced_pod_status(name, namespace, {"status": status})


def condition(job: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next(
        (c for c in (job.get("status") or {}).get("conditions") or [] if c.get("type") == type_), None
    )


def is_true(job: dict[str, Any], type_: str) -> bool:
    cond = condition(job, type_)
    return cond is not None and cond.get("status") == "True"


def events(core: client.CoreV1Api, namespace: str, job: str) -> list[client.CoreV1Event]:
    items = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={job}").items
    return sorted(items, key=lambda e: e.last_timestamp or e.event_time or datetime.min.replace(tzinfo=UTC))


def reasons_of(evs: list[client.CoreV1Event]) -> list[str]:
    return [e.reason for e in evs]


def until(
    predicate: Callable[[], Any], trainers: Trainers | None, timeout: float, message: str | Callable[[], str]
) -> Any:
    """wait_for, renewing the heartbeats of the job's running pods on every poll."""

    def step() -> Any:
        if trainers is not None:
            trainers.beat()
        return predicate()

    return wait_for(step, timeout=timeout, interval=0.3, message=message)


@dataclass
class OperatorEnv:
    """Everything one operator test needs: clients, its namespace, nodes and operator process."""

    kube: client.ApiClient
    namespace: str
    nodes: list[str]
    operator: OperatorProcess
    rtj: Any  # tests/integration/conftest.py RtjApi

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.kube)

    @property
    def nodegroup(self) -> str:
        return self.namespace

    def trainers(self, job: str) -> Trainers:
        return Trainers(self.core, client.CoordinationV1Api(self.kube), self.namespace, job)

    def create_job(self, name: str, nodes: int, **spec: Any) -> dict[str, Any]:
        return self.rtj.create(self.namespace, job_manifest(name, self.nodegroup, nodes, **spec))

    def job(self, name: str) -> dict[str, Any]:
        return self.rtj.get(self.namespace, name)

    def job_gone(self, name: str) -> bool:
        """The job is deleted (404); any other error is raised."""
        try:
            self.job(name)
        except client.ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    def status(self, name: str) -> dict[str, Any]:
        return self.job(name).get("status") or {}

    def workers(self, job: str) -> dict[int, client.V1Pod]:
        """Live (not deleting) worker pods by slot."""
        pods = self.core.list_namespaced_pod(
            self.namespace,
            label_selector=f"{contract.LABEL_JOB}={job},{contract.LABEL_ROLE}={contract.ROLE_WORKER}",
        ).items
        return {
            int(p.metadata.labels[contract.LABEL_SLOT]): p for p in pods if not p.metadata.deletion_timestamp
        }

    def explain(self, job: str) -> Callable[[], str]:
        def text() -> str:
            pods = self.core.list_namespaced_pod(self.namespace).items
            lines = [
                f"{p.metadata.name} {p.status.phase} node={p.spec.node_name} "
                f"deleting={bool(p.metadata.deletion_timestamp)}"
                for p in pods
            ]
            return (
                f"job {job} status: {self.status(job)}\npods:\n"
                + "\n".join(lines)
                + f"\nevents: {reasons_of(events(self.core, self.namespace, job))}\n"
                f"operator log:\n{self.operator.log_tail(40)}"
            )

        return text


def operator_env_factory(
    kube: client.ApiClient, kubeconfig: Path, namespace: str, rtj_api: Any, log_dir: Path
) -> tuple[Callable[..., OperatorEnv], Callable[[], None]]:
    """(start(nodes=4, also=(), **env), teardown). `also`: more namespaces the operator watches (the
    test creates them, with their trainer ServiceAccount, and deletes them)."""
    created: list[OperatorEnv] = []

    def start(nodes: int = 4, also: Sequence[str] = (), **env: str) -> OperatorEnv:
        core = client.CoreV1Api(kube)
        # The trainer ServiceAccount the chart creates per trainer namespace (pods need it to exist).
        core.create_namespaced_service_account(namespace, {"metadata": {"name": TRAINER_SERVICE_ACCOUNT}})
        names = make_nodes(core, namespace, nodes)
        op = OperatorProcess.for_namespace(kubeconfig, namespace, log_dir / "operator.log", also, **env)
        created.append(OperatorEnv(kube, namespace, names, op, rtj_api))
        op.start()
        return created[-1]

    def teardown() -> None:
        core = client.CoreV1Api(kube)
        for env in created:
            env.operator.stop()
            for name in env.nodes:
                try:
                    core.delete_node(name)
                except client.ApiException as exc:
                    if exc.status != 404:
                        raise
        # A job left behind keeps its finalizer (the operator is gone): release it so the namespace
        # can go; its cluster-scoped PV is removed here.
        custom = client.CustomObjectsApi(kube)
        for job in custom.list_namespaced_custom_object(
            contract.API_GROUP, contract.API_VERSION, namespace, contract.PLURAL
        )["items"]:
            custom.patch_namespaced_custom_object(
                contract.API_GROUP,
                contract.API_VERSION,
                namespace,
                contract.PLURAL,
                job["metadata"]["name"],
                {"metadata": {"finalizers": None}},
            )
            # Its FSx PVs: those whose labels name it, whatever their names.
            selector = builders.fsx_pv_selector(namespace, job["metadata"]["name"])
            core.delete_collection_persistent_volume(label_selector=selector)

    return start, teardown


def running(e: OperatorEnv, job: str, n: int) -> Callable[[], bool]:
    def check() -> bool:
        st = e.status(job)
        return is_true(e.job(job), "Running") and st.get("nodesReady") == n and st.get("state") == "Running"

    return check
