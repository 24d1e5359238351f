"""Policy: a fault is classified from its evidence before anything acts on it (pure).

Everything the operator can read about a pod that stopped, or never started, is mapped to one
fault class (`CLASSES`): the condition/Event reason, a message quoting the evidence, what the ladder
does (wait, fail the job, replace the pod), whether a budget is spent, and whether the evidence is
against the pod's node. Only node evidence quarantines a node: the node NotReady or gone, a Node
condition saying its hardware is unhealthy (the EKS node monitoring agent's, node-problem-detector's),
its GPU count dropping, a hardware error its ranks report, or the node failing pods of different
jobs within contract.NODE_FAULT_WINDOW_SECONDS. A peer that did not arrive, an OOM of the
container's own limit, an image or config error, an unschedulable pod, the user's code raising, a
silent pod whose side of a partition is unknown: none of these is evidence against a node.

Evidence no rule knows is its own class (Unclassified): the pod is replaced like a failed pod and
the class says so; it is never silently a node fault.

The order the slot policy (rtj.ladder.slots) asks in: a permanent report, then the node
(`node_health`), then how the pod ended (`ended`) or why it waits (`waiting`), then what it reported
(`reported`) and its silence (`silent`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from rtj import contract, reasons
from rtj.api.models import FaultTolerance
from rtj.ladder import predicates as p
from rtj.ladder.observe import ContainerObs, LeaseObs, NodeObs, PodObs


class Act(StrEnum):
    #: Nothing restarted, no budget spent: the job shows condition Waiting with the evidence.
    WAIT = "Wait"
    #: No restart can fix it: the job fails with the evidence.
    FAIL = "Fail"
    #: The one pod is replaced (attempt + 1).
    REPLACE = "Replace"


@dataclass(frozen=True)
class FaultClass:
    reason: str
    act: Act
    #: Spends faultTolerance.maxPodReschedules.
    budget: bool
    #: The evidence is against the pod's node: it is quarantined (faultTolerance.quarantineFaultyNodes).
    node: bool
    #: What the class means, for the docs' table (docs/fault-classes.md holds `markdown_table()`).
    means: str
    #: A disruption, not a fault: counted in status.restarts.disruptions, no budget.
    disruption: bool = False
    #: Deleted without a grace period (a silent or cut-off pod would not answer a graceful stop).
    force: bool = False
    #: Recorded on the node (NODE_FAULTS_ANNOTATION): the same node failing pods of different jobs
    #: is evidence against it (RepeatedNodeFaults).
    recorded: bool = False


_CLASSES = (
    FaultClass(
        reasons.UNSCHEDULABLE, Act.WAIT, False, False, "no node fits the pod (the scheduler's message)"
    ),
    FaultClass(reasons.IMAGE_PULL_RETRYING, Act.WAIT, False, False, "the kubelet retries pulling the image"),
    FaultClass(
        reasons.IMAGE_PULL_FAILED,
        Act.FAIL,
        False,
        False,
        "invalid image name, or the pull still failing after containerWaitTimeoutSeconds",
    ),
    FaultClass(reasons.CONFIG_WAITING, Act.WAIT, False, False, "a Secret/ConfigMap the pod needs is missing"),
    FaultClass(reasons.CONFIG_FAILED, Act.FAIL, False, False, "still so after containerWaitTimeoutSeconds"),
    FaultClass(
        reasons.CONTAINER_OOM_KILLED,
        Act.FAIL,
        False,
        False,
        "killed by its own memory limit: the job's sizing; raise resources.limits.memory",
    ),
    FaultClass(
        reasons.PEERS_NOT_READY,
        Act.REPLACE,
        False,
        False,
        "the launcher gave up waiting for peers that were not running",
    ),
    FaultClass(
        reasons.POD_EVICTED,
        Act.REPLACE,
        False,
        False,
        "evicted (node pressure, API eviction)",
        disruption=True,
    ),
    FaultClass(
        reasons.POD_DELETED,
        Act.REPLACE,
        False,
        False,
        "deleted by someone else (a drain, a person)",
        disruption=True,
    ),
    FaultClass(
        reasons.POD_DISRUPTED,
        Act.REPLACE,
        False,
        False,
        "DisruptionTarget: preemption, node shutdown",
        disruption=True,
    ),
    FaultClass(reasons.NODE_NOT_READY, Act.REPLACE, True, True, "the node is not Ready", force=True),
    FaultClass(reasons.NODE_LOST, Act.REPLACE, True, True, "the node is gone", force=True),
    FaultClass(
        reasons.NODE_UNHEALTHY,
        Act.REPLACE,
        True,
        True,
        "a Node condition says its hardware is unhealthy, or GPUs were lost",
    ),
    FaultClass(
        reasons.HARDWARE_FAULT,
        Act.REPLACE,
        True,
        True,
        "a rank reported a hardware error (CUDA, NCCL/EFA, Xid)",
    ),
    FaultClass(
        reasons.REPEATED_NODE_FAULTS,
        Act.REPLACE,
        True,
        True,
        "the node failed pods of different jobs within the window",
    ),
    FaultClass(
        reasons.HEARTBEAT_TIMEOUT,
        Act.REPLACE,
        True,
        False,
        "the pod's heartbeat went silent",
        force=True,
        recorded=True,
    ),
    FaultClass(
        reasons.STARTUP_TIMEOUT,
        Act.REPLACE,
        True,
        False,
        "no first heartbeat within startupTimeoutSeconds",
        recorded=True,
    ),
    FaultClass(
        reasons.LAUNCHER_BUDGET_EXHAUSTED,
        Act.REPLACE,
        True,
        False,
        "ft_launcher spent its in-job restarts (and the pod its in-place restarts, where it has them)",
        recorded=True,
    ),
    FaultClass(
        reasons.POD_REPORTED_HARD_FAULT,
        Act.REPLACE,
        True,
        False,
        "the pod reported a hard fault",
        recorded=True,
    ),
    FaultClass(
        reasons.POD_FAILED,
        Act.REPLACE,
        True,
        False,
        "the pod failed with a restartable exit code",
        recorded=True,
    ),
    FaultClass(
        reasons.POD_PARTITIONED,
        Act.REPLACE,
        True,
        False,
        "its peers cannot reach it, nor it them (the reach probe); which end is at fault is unknown",
    ),
    FaultClass(reasons.UNCLASSIFIED, Act.REPLACE, True, False, "evidence no rule knows (reported as such)"),
)
CLASSES: dict[str, FaultClass] = {c.reason: c for c in _CLASSES}


def of(reason: str) -> FaultClass:
    """The class of a fault reason; job-level reasons and unknown ones are Unclassified's kind."""
    return CLASSES.get(reason, CLASSES[reasons.UNCLASSIFIED])


@dataclass(frozen=True)
class Verdict:
    reason: str
    message: str

    @property
    def cls(self) -> FaultClass:
        return of(self.reason)


#: Waiting reasons of a container the kubelet retries, and those it never will.
_PULL_RETRY = frozenset({"ErrImagePull", "ImagePullBackOff", "RegistryUnavailable", "ErrImageInspect"})
_PULL_NEVER = frozenset({"InvalidImageName", "ErrImageNeverPull"})
_CONFIG = frozenset({"CreateContainerConfigError", "CreateContainerError"})


def waiting(pod: PodObs, ft: FaultTolerance, now: datetime) -> Verdict | None:
    """Why a pod that has not started waits, when that is something the operator cannot fix by
    restarting (the scheduler finds no node; the image or the container's config is wrong)."""
    if pod.phase != "Pending" or pod.deleting:
        return None
    if pod.unschedulable:
        return Verdict(reasons.UNSCHEDULABLE, f"pod {pod.name} is unschedulable: {pod.unschedulable}")
    waited = p.seconds_since(pod.created, now) if pod.created is not None else 0.0
    bound = ft.container_wait_timeout_seconds
    for c in pod.containers:
        what = f"pod {pod.name} container {c.name}"
        detail = f"{c.waiting_reason}: {c.waiting_message}" if c.waiting_message else c.waiting_reason
        if c.waiting_reason in _PULL_NEVER:
            return Verdict(reasons.IMAGE_PULL_FAILED, f"{what} cannot pull image {c.image or '?'}: {detail}")
        if c.waiting_reason in _PULL_RETRY:
            if waited > bound:
                return Verdict(
                    reasons.IMAGE_PULL_FAILED,
                    f"{what}: image {c.image or '?'} still not pulled {waited:.0f}s after the pod was "
                    f"created (containerWaitTimeoutSeconds={bound}): {detail}",
                )
            return Verdict(reasons.IMAGE_PULL_RETRYING, f"{what} is pulling image {c.image or '?'}: {detail}")
        if c.waiting_reason in _CONFIG:
            if waited > bound:
                return Verdict(
                    reasons.CONFIG_FAILED,
                    f"{what} still cannot be created {waited:.0f}s after the pod was created "
                    f"(containerWaitTimeoutSeconds={bound}): {detail}",
                )
            return Verdict(reasons.CONFIG_WAITING, f"{what} cannot be created: {detail}")
    return None


def node_health(node: NodeObs | None, name: str, nodes_known: bool) -> Verdict | None:
    """Evidence against the node a pod is bound to (None: none, or nodes not known yet)."""
    if not name or not nodes_known:
        return None
    if node is None:
        return Verdict(reasons.NODE_LOST, f"node {name} is gone")
    if node.ready != "True":
        return Verdict(reasons.NODE_NOT_READY, f"node {name} is not Ready (Ready={node.ready})")
    if node.problems:
        return Verdict(reasons.NODE_UNHEALTHY, f"node {name} reports " + "; ".join(node.problems))
    if node.gpus is not None and node.gpus[0] < node.gpus[1]:
        return Verdict(
            reasons.NODE_UNHEALTHY,
            f"node {name} lost GPUs: {node.gpus[0]} of {node.gpus[1]} {contract.GPU_RESOURCE} allocatable",
        )
    return None


#: What a job whose ranks its own memory limit killed should do (its Failed condition says it).
OOM_ADVICE = "raise resources.limits.memory or lower the job's memory use; no node is blamed"


def oom_killed(pod: PodObs, limit: str) -> Verdict | None:
    """A container of the pod whose last run was OOMKilled by its own memory limit (`limit`, as the
    spec sets it): the job's sizing, which no restart fixes and no node is blamed for."""
    oom = next((c for c in pod.containers if c.terminated_reason == "OOMKilled"), None)
    if oom is None:
        return None
    return Verdict(
        reasons.CONTAINER_OOM_KILLED,
        f"pod {pod.name} container {oom.name} was OOMKilled by its memory limit "
        f"({limit or 'no limit set'}; exit code {oom.exit_code}): {OOM_ADVICE}",
    )


def _exit(c: ContainerObs | None, pod: PodObs) -> str:
    if c is None:
        return f"exit code {pod.exit_code}"
    signal = f", signal {c.signal}" if c.signal else ""
    return f"exit code {c.exit_code}{signal}, {c.terminated_reason or 'no reason'}"


def ended(pod: PodObs, lease: LeaseObs | None, limit: str, peers_waiting: bool) -> Verdict:
    """How a Failed pod (restartable exit code) ended. `limit`: the trainer's memory limit as the
    spec sets it, for the OOM message; `peers_waiting`: another slot of the job has no running pod."""
    if pod.disruption:
        return Verdict(reasons.POD_DISRUPTED, f"pod {pod.name} was disrupted: {pod.disruption}")
    if pod.status_reason == "Evicted":
        return Verdict(
            reasons.POD_EVICTED, f"pod {pod.name} was evicted: {pod.status_message or 'no message'}"
        )
    oom = oom_killed(pod, limit)
    if oom is not None:
        return oom
    trainer = pod.trainer
    how = _exit(trainer, pod)
    if peers_waiting and pod.exit_code in (1, contract.ExitCode.LAUNCHER_BUDGET_EXHAUSTED):
        return Verdict(
            reasons.PEERS_NOT_READY,
            f"pod {pod.name} failed ({how}) while peers of the job were not running (its launcher's "
            "rendezvous wait ended): recreated, no budget spent",
        )
    if pod.exit_code == contract.ExitCode.LAUNCHER_BUDGET_EXHAUSTED:
        return Verdict(
            reasons.LAUNCHER_BUDGET_EXHAUSTED, f"pod {pod.name} failed ({how}): {_last_fault(lease)}"
        )
    if pod.exit_code == contract.ExitCode.RESTART_IN_PLACE:  # the pod had no restart rule after all
        return Verdict(
            reasons.LAUNCHER_BUDGET_EXHAUSTED,
            f"pod {pod.name} failed ({how}: asked for an in-place restart its kubelet did not make): "
            f"{_last_fault(lease)}",
        )
    if pod.exit_code is None and trainer is None:
        return Verdict(
            reasons.UNCLASSIFIED,
            f"pod {pod.name} failed with no container status ({pod.status_reason or 'no reason'}: "
            f"{pod.status_message or 'no message'})",
        )
    return Verdict(
        reasons.POD_FAILED, f"pod {pod.name} failed ({how}, {pod.status_reason or 'no pod reason'})"
    )


def _last_fault(lease: LeaseObs | None) -> str:
    hb = lease.heartbeat if lease is not None else None
    if hb is None or hb.fault is None:
        return "in-job restart budget spent, no fault reported"
    return f"in-job restart budget spent; last fault {hb.fault.reason}: {hb.fault.message}"


def reported(pod: PodObs, lease: LeaseObs | None) -> Verdict | None:
    """A hard fault the pod reported: a hardware error is evidence against its node, others are not."""
    hb = lease.heartbeat if lease is not None else None
    if hb is None or hb.fault is None or hb.fault.severity != contract.FaultSeverity.HARD:
        return None
    what = f"pod {pod.name} reported {hb.fault.reason}: {hb.fault.message}"
    if contract.is_hardware_fault(hb.fault.reason):
        return Verdict(reasons.HARDWARE_FAULT, what)
    return Verdict(reasons.POD_REPORTED_HARD_FAULT, what)


def user_code(lease: LeaseObs | None) -> bool:
    """The pod's last reported fault is the training script's own (an exception it raised, a
    permanent error): no evidence about the node, never recorded on it."""
    hb = lease.heartbeat if lease is not None else None
    return (
        hb is not None
        and hb.fault is not None
        and (
            hb.fault.reason == contract.FaultReason.RANK_EXCEPTION
            or hb.fault.severity == contract.FaultSeverity.PERMANENT
        )
    )


def repeated_on_node(node: NodeObs | None, job: str, now: datetime) -> Verdict | None:
    """The node failed pods of other jobs within the window (its NODE_FAULTS_ANNOTATION record)."""
    if node is None:
        return None
    window = contract.NODE_FAULT_WINDOW_SECONDS
    others = sorted(
        {
            f"{f.job} ({f.reason})"
            for f in node.faults
            if f.job != job and 0 <= (now - f.time).total_seconds() <= window
        }
    )
    if not others:
        return None
    return Verdict(
        reasons.REPEATED_NODE_FAULTS,
        f"node {node.name} also failed pods of " + ", ".join(others) + f" within {window}s",
    )


def markdown_table() -> str:
    """The classes as docs/fault-classes.md shows them (a unit test keeps the two equal)."""
    rows = [
        "| reason | evidence | the ladder | budget | the node |",
        "|---|---|---|---|---|",
    ]
    for c in _CLASSES:
        act = {
            Act.WAIT: "waits (condition Waiting)",
            Act.FAIL: "fails the job",
            Act.REPLACE: "replaces the pod",
        }[c.act]
        budget = "maxPodReschedules" if c.budget else ("disruptions (no limit)" if c.disruption else "none")
        node = "quarantined" if c.node else ("recorded" if c.recorded else "untouched")
        rows.append(f"| `{c.reason}` | {c.means} | {act} | {budget} | {node} |")
    return "\n".join(rows) + "\n"
