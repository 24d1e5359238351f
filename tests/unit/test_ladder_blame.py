"""Table tests of the fault classifier (rtj.ladder.blame) on pods and nodes as the API server returns
them (several containers, init containers), and of its classes through decide(): waiting is not
failing, a node is quarantined only on evidence against it, a disruption spends no fault budget,
and counters count incidents."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from ladder_testkit import (
    HARD,
    NOW,
    SOFT,
    Case,
    ago,
    check,
    hb,
    make_job,
    observe,
    quarantined,
    recorded,
    replacing,
    running_job,
    slot_status,
)
from rtj import contract, reasons
from rtj.api.models import FaultTolerance
from rtj.ladder import CreateWorkerPod, DeletePod, blame, decide
from rtj.ladder import quarantine as q
from rtj.ladder.observe import ContainerObs, node_from_dict, pod_from_dict

pytestmark = pytest.mark.unit

FT = FaultTolerance(containerWaitTimeoutSeconds=600)


def pod(
    phase: str = "Pending",
    *,
    created: int = 30,
    containers: list[Any] = (),
    init: list[Any] = (),
    **status: Any,
):
    meta = {"name": "train-n0-a0", "creationTimestamp": ago(created).isoformat()}
    body = {
        "phase": phase,
        "containerStatuses": list(containers),
        "initContainerStatuses": list(init),
        **status,
    }
    return pod_from_dict({"metadata": meta, "spec": {"nodeName": "node-0"}, "status": body})


def waiting(name: str, reason: str, message: str = "", image: str = "repo/trainer:1") -> dict[str, Any]:
    return {"name": name, "image": image, "state": {"waiting": {"reason": reason, "message": message}}}


def ended(name: str, reason: str, code: int, signal: int | None = None) -> dict[str, Any]:
    terminated: dict[str, Any] = {"reason": reason, "exitCode": code}
    if signal is not None:
        terminated["signal"] = signal
    return {"name": name, "state": {"terminated": terminated}}


UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
}

WAITING_ROWS = [
    (
        "unschedulable: the scheduler's message",
        pod(conditions=[UNSCHEDULABLE]),
        reasons.UNSCHEDULABLE,
        "Insufficient",
    ),
    (
        "an init container's pull retrying",
        pod(init=[waiting("fetch", "ImagePullBackOff", "Back-off pulling image")]),
        reasons.IMAGE_PULL_RETRYING,
        "container fetch is pulling image repo/trainer:1",
    ),
    (
        "a pull still failing past containerWaitTimeoutSeconds",
        pod(created=601, containers=[waiting("trainer", "ErrImagePull", "not found")]),
        reasons.IMAGE_PULL_FAILED,
        "still not pulled 601s",
    ),
    (
        "an invalid image name fails at once",
        pod(containers=[waiting("trainer", "InvalidImageName", "couldn't parse", image="Repo//x")]),
        reasons.IMAGE_PULL_FAILED,
        "cannot pull image Repo//x",
    ),
    (
        "a sidecar's missing Secret",
        pod(
            containers=[
                {"name": "trainer", "state": {"waiting": {"reason": "ContainerCreating"}}},
                waiting("sidecar", "CreateContainerConfigError", 'secret "creds" not found'),
            ]
        ),
        reasons.CONFIG_WAITING,
        'container sidecar cannot be created: CreateContainerConfigError: secret "creds" not found',
    ),
    (
        "a config error past the bound",
        pod(created=700, containers=[waiting("trainer", "CreateContainerConfigError", "no cm")]),
        reasons.CONFIG_FAILED,
        "(containerWaitTimeoutSeconds=600)",
    ),
]


@pytest.mark.parametrize(("why", "seen", "reason", "quoted"), WAITING_ROWS, ids=[r[0] for r in WAITING_ROWS])
def test_why_a_pod_waits(why: str, seen: Any, reason: str, quoted: str) -> None:
    verdict = blame.waiting(seen, FT, NOW)
    assert verdict is not None and verdict.reason == reason and quoted in verdict.message
    assert not verdict.cls.budget and not verdict.cls.node


def test_a_pod_creating_its_containers_or_running_does_not_wait() -> None:
    creating = pod(containers=[{"name": "trainer", "state": {"waiting": {"reason": "ContainerCreating"}}}])
    assert blame.waiting(creating, FT, NOW) is None
    assert blame.waiting(pod("Running", conditions=[UNSCHEDULABLE]), FT, NOW) is None


ENDED_ROWS = [
    (
        "a sidecar OOMKilled by its limit, the trainer Error: the container's own limit",
        pod("Failed", containers=[ended("trainer", "Error", 1), ended("sidecar", "OOMKilled", 137)]),
        False,
        reasons.CONTAINER_OOM_KILLED,
    ),
    (
        "evicted by the kubelet",
        pod("Failed", reason="Evicted", message="low on memory"),
        False,
        reasons.POD_EVICTED,
    ),
    (
        "a DisruptionTarget (preemption)",
        pod(
            "Failed",
            containers=[ended("trainer", "Error", 143)],
            conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}],
        ),
        False,
        reasons.POD_DISRUPTED,
    ),
    (
        "the launcher gave up its rendezvous while a peer was pending",
        pod("Failed", containers=[ended("trainer", "Error", 1)]),
        True,
        reasons.PEERS_NOT_READY,
    ),
    (
        "the same exit with every peer running: a pod failure",
        pod("Failed", containers=[ended("trainer", "Error", 1)]),
        False,
        reasons.POD_FAILED,
    ),
    (
        "launcher budget spent",
        pod("Failed", containers=[ended("trainer", "Error", 70)]),
        False,
        reasons.LAUNCHER_BUDGET_EXHAUSTED,
    ),
    (
        "no container status at all: unclassified, said so",
        pod("Failed", reason="Weird"),
        False,
        reasons.UNCLASSIFIED,
    ),
]


@pytest.mark.parametrize(("why", "seen", "peers", "reason"), ENDED_ROWS, ids=[r[0] for r in ENDED_ROWS])
def test_how_a_failed_pod_ended(why: str, seen: Any, peers: bool, reason: str) -> None:
    verdict = blame.ended(seen, None, "64Gi", peers)
    assert verdict.reason == reason
    assert not verdict.cls.node  # none of these is evidence against the node


def node(conditions: list[dict[str, Any]] = (), gpus: tuple[int, int] | None = None) -> Any:
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True"}, *conditions]}
    if gpus is not None:
        status["allocatable"] = {contract.GPU_RESOURCE: str(gpus[0])}
        status["capacity"] = {contract.GPU_RESOURCE: str(gpus[1])}
    return node_from_dict({"metadata": {"name": "node-0"}, "status": status})


NODE_ROWS = [
    ("healthy, all GPUs", node(gpus=(8, 8)), None),
    (
        "EKS: AcceleratedHardwareReady=False",
        node(
            [
                {
                    "type": "AcceleratedHardwareReady",
                    "status": "False",
                    "reason": "XidError",
                    "message": "Xid 79",
                }
            ]
        ),
        "AcceleratedHardwareReady=False: XidError: Xid 79",
    ),
    (
        "node-problem-detector: KernelDeadlock=True",
        node([{"type": "KernelDeadlock", "status": "True"}]),
        "KernelDeadlock",
    ),
    ("the device plugin lost a GPU", node(gpus=(7, 8)), "7 of 8 nvidia.com/gpu allocatable"),
    ("an unknown condition is not evidence", node([{"type": "SomethingNew", "status": "False"}]), None),
]


@pytest.mark.parametrize(("why", "seen", "quoted"), NODE_ROWS, ids=[r[0] for r in NODE_ROWS])
def test_node_health(why: str, seen: Any, quoted: str | None) -> None:
    verdict = blame.node_health(seen, "node-0", nodes_known=True)
    if quoted is None:
        assert verdict is None
    else:
        assert verdict is not None and verdict.reason == reasons.NODE_UNHEALTHY and quoted in verdict.message
        assert verdict.cls.node


def test_only_node_evidence_blames_a_node() -> None:
    """The table's invariant: waiting, failing the job, disruptions and a pod's own faults never
    blame the node; only the classes built on node evidence do."""
    node_classes = {c.reason for c in blame.CLASSES.values() if c.node}
    assert node_classes == {
        reasons.NODE_NOT_READY,
        reasons.NODE_LOST,
        reasons.NODE_UNHEALTHY,
        reasons.HARDWARE_FAULT,
        reasons.REPEATED_NODE_FAULTS,
    }
    for c in blame.CLASSES.values():
        assert not (c.act != blame.Act.REPLACE and (c.budget or c.node)), c
        assert not (c.disruption and c.budget), c
    assert blame.of("SomethingNoRuleKnows").reason == reasons.UNCLASSIFIED


def test_repeated_faults_on_a_node_across_jobs() -> None:
    faults = (
        contract.NodeFault(job="ns/train", reason="PodFailed", time=NOW - timedelta(minutes=1)),
        contract.NodeFault(job="other/big", reason="HeartbeatTimeout", time=NOW - timedelta(minutes=20)),
        contract.NodeFault(job="old/gone", reason="PodFailed", time=NOW - timedelta(hours=2)),
    )
    seen = node_from_dict(
        {
            "metadata": {
                "name": "node-0",
                "annotations": {contract.NODE_FAULTS_ANNOTATION: contract.format_node_faults(faults)},
            },
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
    )
    verdict = blame.repeated_on_node(seen, "ns/train", NOW)
    assert (
        verdict is not None
        and "other/big (HeartbeatTimeout)" in verdict.message
        and "old/gone" not in verdict.message
    )
    assert blame.repeated_on_node(seen, "other/big", NOW) is not None  # ns/train's fault counts for it
    only_ours = seen.__class__(name="node-0", ready="True", faults=faults[:1])
    assert blame.repeated_on_node(only_ours, "ns/train", NOW) is None


# --- through decide(): what each class does to the job, its pods and the node ---------------------------
def blame_create(slot: int, cause: str, avoid: tuple[str, ...] = (), suspect: str = "") -> CreateWorkerPod:
    return CreateWorkerPod(slot, 1, cause, avoid, suspect_node=suspect)


def _pending(**kw: Any) -> Any:
    return observe().rdzv().worker(0).lease("train-n0-a0", 1, hb()).worker(1, phase="Pending", node="", **kw)


OTHER_JOBS_FAULT = contract.NodeFault(job="other/job", reason="PodFailed", time=NOW - timedelta(minutes=10))
XID = {"type": "AcceleratedHardwareReady", "status": "False", "reason": "XidError"}

CASES = [
    Case(
        "unschedulable: Waiting with the scheduler's message, an Event, nothing restarted, never Running",
        make_job().nodes(2).obj(),
        _pending(unschedulable="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.").obj(),
        [],
        state="Pending",
        reason=reasons.UNSCHEDULABLE,
        events=[reasons.UNSCHEDULABLE],
        slots={1: {"state": "Waiting"}},
        conditions={"Waiting": "True", "Running": "False"},
    ),
    Case(
        "an image that never pulls: Failed ImagePullFailed after the bound, no node blamed",
        make_job().nodes(2).obj(),
        _pending(
            created=ago(700),
            containers=(ContainerObs("trainer", waiting_reason="ImagePullBackOff", image="typo:1"),),
        ).obj(),
        [
            DeletePod("train-rdzv", "rdzv-1", None),
            DeletePod("train-n0-a0", "uid-train-n0-a0", None),
            DeletePod("train-n1-a0", "uid-train-n1-a0", None),
        ],
        state="Failed",
        reason=reasons.IMAGE_PULL_FAILED,
        events=[reasons.IMAGE_PULL_FAILED],
        quarantined=[],
    ),
    Case(
        "OOMKilled by the container's own limit: Failed ContainerOOMKilled, no pod budget, no quarantine",
        running_job().obj(),
        observe()
        .running(2)
        .worker(
            1,
            phase="Failed",
            exit_code=1,
            containers=(ContainerObs("trainer", terminated_reason="OOMKilled", exit_code=1),),
        )
        .obj(),
        [DeletePod("train-rdzv", "rdzv-1", None), DeletePod("train-n0-a0", "uid-train-n0-a0", None)],
        state="Failed",
        reason=reasons.CONTAINER_OOM_KILLED,
        events=[reasons.CONTAINER_OOM_KILLED],
    ),
    Case(
        "a launcher that gave up on a peer still pending: recreated, no budget, nothing recorded on the node",
        running_job().ft(maxPodReschedules=0).obj(),
        observe().rdzv().worker(0, phase="Failed", exit_code=1).worker(1, phase="Pending", node="").obj(),
        [DeletePod("train-n0-a0", "uid-train-n0-a0", 5), blame_create(0, reasons.PEERS_NOT_READY)],
        restarts=(0, 0, 0),
        events=[reasons.PEERS_NOT_READY],
    ),
    Case(
        "graceful disruptions beyond maxPodReschedules: each replaced, the job keeps running",
        running_job(restarts={"disruptions": 5}).ft(maxPodReschedules=0).obj(),
        observe().running(2).worker(1, phase="Failed", status_reason="Evicted").obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 5), blame_create(1, reasons.POD_EVICTED)],
        state="Recovering",
        restarts=(0, 0, 0),
        events=[reasons.POD_EVICTED],
    ),
    Case(
        "the node failed another job's pod 10 minutes ago: evidence against it, quarantined",
        running_job().obj(),
        observe()
        .running(2)
        .worker(1, phase="Failed", exit_code=1)
        .node("node-1", faults=(OTHER_JOBS_FAULT,))
        .obj(),
        [
            DeletePod("train-n1-a0", "uid-train-n1-a0", 5),
            quarantined("node-1", reasons.REPEATED_NODE_FAULTS),
            recorded("node-1", reasons.POD_FAILED),
            blame_create(1, reasons.POD_FAILED, ("node-1",), suspect="node-1"),
        ],
        restarts=(0, 0, 1),
        events=[reasons.POD_FAILED, reasons.NODE_QUARANTINED],
        quarantined=["node-1"],
    ),
    Case(
        "the training script raised until the launcher gave up: the user's code, never recorded on the node",
        running_job().obj(),
        observe()
        .running(2)
        .worker(1, phase="Failed", exit_code=70)
        .lease("train-n1-a0", 1, hb(fault=SOFT))
        .node("node-1", faults=(OTHER_JOBS_FAULT,))
        .obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 5), blame_create(1, reasons.LAUNCHER_BUDGET_EXHAUSTED)],
        restarts=(0, 0, 1),
        events=[reasons.LAUNCHER_BUDGET_EXHAUSTED],
    ),
    Case(
        "a training pod on a node whose GPU turned unhealthy: replaced and the node quarantined",
        running_job().obj(),
        observe().running(2).node("node-1", problems=("AcceleratedHardwareReady=False: XidError",)).obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 5), quarantined("node-1", reasons.NODE_UNHEALTHY)],
        restarts=(0, 0, 1),
        events=[reasons.NODE_UNHEALTHY, reasons.NODE_QUARANTINED],
    ),
    Case(
        "a node another job quarantined already: this job's evidence is added (one quarantine, the node's)",
        running_job().obj(),
        observe()
        .running(2)
        .lease("train-n1-a0", 1, hb(fault=HARD))
        .node("node-1", taints=((contract.QUARANTINE_TAINT_KEY, "NodeNotReady", "NoSchedule"),))
        .obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 5), quarantined("node-1", reasons.HARDWARE_FAULT)],
        restarts=(0, 0, 1),
        events=[reasons.HARDWARE_FAULT, reasons.NODE_QUARANTINE_EXTENDED],
    ),
    Case(
        "one exception in a 2-pod job is one incident: the peer's collateral restart is not counted",
        running_job().obj(),
        observe()
        .running(2)
        .lease("train-n0-a0", 1, hb("InProcessRestarting", ip=1, fault=SOFT))
        .lease("train-n1-a0", 1, hb("InProcessRestarting", ip=1, fault={**SOFT, "reason": "PeerFailure"}))
        .obj(),
        [],
        restarts=(1, 0, 0),
        events=[reasons.IN_PROCESS_RESTART, reasons.IN_PROCESS_RESTART],
        slots={0: {"inProcessRestarts": 1}, 1: {"inProcessRestarts": 1}},
    ),
    Case(
        "a hang: the hung rank reports nothing, both pods report only collateral stops: one incident",
        running_job().obj(),
        observe()
        .running(2)
        .lease("train-n0-a0", 1, hb("InJobRestarting", ij=1, fault={**SOFT, "reason": "RankStopped"}))
        .lease("train-n1-a0", 1, hb("InJobRestarting", ij=1, fault={**SOFT, "reason": "RankStopped"}))
        .obj(),
        [],
        restarts=(0, 1, 0),
        events=[reasons.IN_JOB_RESTART, reasons.IN_JOB_RESTART],
    ),
    Case(
        "the same incident seen on the peer a pass later (within a heartbeat timeout): still one",
        running_job(
            nodeSlots=slot_status(2, {0: {"inProcessRestarts": 1}}),
            restarts={"inProcess": 1, "inProcessIncidentTime": ago(3).isoformat()},
        ).obj(),
        observe()
        .running(2)
        .lease("train-n0-a0", 1, hb(ip=1))
        .lease("train-n1-a0", 1, hb(ip=1, fault=SOFT))
        .obj(),
        [],
        restarts=(1, 0, 0),
        events=[reasons.IN_PROCESS_RESTART, reasons.RECOVERED],
    ),
    Case(
        "a replaced pod's peers restarting in-job are part of that replacement",
        running_job(
            nodeSlots=slot_status(2, {1: {**replacing(reasons.NODE_LOST), "recoveringLevel": "Pod"}}),
            restarts={"podReschedules": 1},
        ).obj(),
        observe().rdzv().worker(0).lease("train-n0-a0", 1, hb("InJobRestarting", ij=1, fault=SOFT)).obj(),
        [blame_create(1, reasons.NODE_LOST)],
        restarts=(0, 0, 1),  # inJob stays 0
        events=[reasons.IN_JOB_RESTART],
    ),
    Case(
        "every pod heartbeats but one is still starting its ranks: Starting, not Running",
        running_job().obj(),
        observe().running(2).lease("train-n1-a0", 1, hb("Starting")).obj(),
        [],
        state="Starting",
        conditions={"Running": "False"},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_blame_through_decide(case: Case) -> None:
    check(case)


def test_the_job_is_named_by_what_it_waits_for_and_the_event_is_posted_once() -> None:
    job = make_job().nodes(2).obj()
    seen = _pending(unschedulable="0/3 nodes are available: 3 Insufficient nvidia.com/gpu.").obj()
    first = decide(job, seen, NOW)
    waiting = next(c for c in first.status.conditions if c.type == "Waiting")
    assert waiting.message.startswith("1 of 2 slots wait: slot 1: pod train-n1-a0 is unschedulable: 0/3")
    job.status = first.status
    again = decide(job, seen, NOW)
    assert reasons.UNSCHEDULABLE not in [e.reason for e in again.events]
    assert again.status.restarts.pod_reschedules == 0


# --- the node's quarantine record (rtj.ladder.quarantine) ---------------------------------------------
def raw_node(
    taints: list[dict[str, Any]] = (), annotations: dict[str, str] | None = None, ready: str = "True"
):
    return {
        "metadata": {"name": "node-0", "resourceVersion": "7", "annotations": annotations or {}},
        "spec": {"taints": list(taints)},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }


def applied(obj: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """A merge patch applied as the API server would (annotations merged, a null removes one)."""
    annotations = {**obj["metadata"]["annotations"], **patch["metadata"].get("annotations", {})}
    annotations = {k: v for k, v in annotations.items() if v is not None}
    spec = {**obj["spec"], **patch.get("spec", {})}
    return {**obj, "metadata": {**obj["metadata"], "annotations": annotations}, "spec": spec}


def test_one_quarantine_per_node_with_every_jobs_evidence_then_lifted_when_healthy() -> None:
    until = NOW + timedelta(hours=1)
    first = q.taint_patch(raw_node(), "NodeNotReady", "a/one", "node not Ready", until, NOW)
    assert first["metadata"]["resourceVersion"] == "7"
    node = applied(raw_node(), first)
    second = q.taint_patch(node, "HardwareFault", "b/two", "Xid 79", until + timedelta(minutes=5), NOW)
    node = applied(node, second)
    (taint,) = node["spec"]["taints"]
    assert (taint["key"], taint["value"], taint["effect"]) == (
        contract.QUARANTINE_TAINT_KEY,
        "NodeNotReady",
        "NoSchedule",
    )
    record = contract.parse_quarantine(node["metadata"]["annotations"][contract.QUARANTINE_ANNOTATION])
    assert record is not None and [e.job for e in record.evidence] == ["a/one", "b/two"]
    assert record.until == until + timedelta(minutes=5)
    seen = node_from_dict(node)
    assert q.review(seen, NOW).action == ""  # not due yet
    assert q.review(seen, until + timedelta(minutes=6)).action == "lift"
    sick = node_from_dict({**node, "status": {"conditions": [{"type": "Ready", "status": "True"}, XID]}})
    assert q.review(sick, until + timedelta(minutes=6)).action == "extend"
    lifted = applied(node, q.lift_patch(node))
    assert (
        lifted["spec"]["taints"] == []
        and contract.QUARANTINE_ANNOTATION not in lifted["metadata"]["annotations"]
    )
    assert q.lift_patch(lifted) is None


def test_a_taint_without_our_record_is_not_ours_to_lift() -> None:
    admins = raw_node([{"key": contract.QUARANTINE_TAINT_KEY, "value": "by-hand", "effect": "NoSchedule"}])
    assert q.review(node_from_dict(admins), NOW + timedelta(days=30)).action == ""


def test_the_fault_record_keeps_the_window_and_is_idempotent() -> None:
    old = contract.NodeFault(job="x/old", reason="PodFailed", time=NOW - timedelta(hours=2))
    node = raw_node(annotations={contract.NODE_FAULTS_ANNOTATION: contract.format_node_faults([old])})
    patch = q.fault_record_patch(node, "ns/train", "PodFailed", NOW)
    assert patch is not None
    node = applied(node, patch)
    kept = contract.parse_node_faults(node["metadata"]["annotations"][contract.NODE_FAULTS_ANNOTATION])
    assert [(f.job, f.time) for f in kept] == [("ns/train", NOW)]
    assert q.fault_record_patch(node, "ns/train", "PodFailed", NOW) is None  # a retried action adds nothing
    garbage = raw_node(annotations={contract.NODE_FAULTS_ANNOTATION: "{not json"})
    assert node_from_dict(garbage).faults == ()


def test_the_docs_table_is_the_classifiers() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "fault-classes.md").read_text()
    assert blame.markdown_table() in doc, "docs/fault-classes.md: paste rtj.ladder.blame.markdown_table()"
