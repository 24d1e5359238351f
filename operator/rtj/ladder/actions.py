"""What a decision asks the outside world to do. Intent only: rendering objects is the builders'
job, executing them is rtj.kube's."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rtj import contract


@dataclass(frozen=True)
class CreateWorkerPod:
    slot: int
    attempt: int
    cause: str
    avoid_nodes: tuple[str, ...] = ()
    #: In-place restarts the pod may take (rtj.ladder.in_place.pod_budget); 0: no restart rule.
    in_place_restarts: int = 0
    #: A node the pod prefers not to run on (rtj.ladder.suspect_node); "": none.
    suspect_node: str = ""


@dataclass(frozen=True)
class CreateSparePod:
    index: int
    attempt: int
    avoid_nodes: tuple[str, ...] = ()
    in_place_restarts: int = 0


@dataclass(frozen=True)
class CreateRendezvousPod:
    pass


@dataclass(frozen=True)
class CreateRendezvousService:
    pass


@dataclass(frozen=True)
class DeletePod:
    name: str
    uid: str
    #: None: the pod's own terminationGracePeriodSeconds (a last checkpoint); 0: force (node lost).
    grace_seconds: int | None = None


@dataclass(frozen=True)
class TaintNode:
    """Quarantine the node: QUARANTINE_TAINT_KEY=<reason>:NoSchedule, and this job's evidence added to
    its QUARANTINE_ANNOTATION (checked again, and lifted if healthy, at `until`)."""

    node: str
    reason: str = ""
    #: namespace/name of the job whose evidence this is.
    job: str = ""
    evidence: str = ""
    until: datetime | None = None
    #: When the pass decided it (rtj.ladder.node_writes): the evidence's time on the node.
    time: datetime | None = None


@dataclass(frozen=True)
class RecordNodeFault:
    """Add a pod fault without node evidence to the node's NODE_FAULTS_ANNOTATION record."""

    node: str
    job: str
    reason: str
    time: datetime


@dataclass(frozen=True)
class PromoteSpare:
    """Relabel a standby spare pod into a slot (the commit, as seen by the ladder) and signal its
    trainer through ASSIGNED_SLOT_ANNOTATION on its Lease."""

    pod: str
    slot: int
    attempt: int
    cause: str


@dataclass(frozen=True)
class AssignLease:
    """Ensure the promotion signal is on the Lease of a promoted spare (level-based retry)."""

    lease: str
    slot: int


@dataclass(frozen=True)
class FenceLease:
    """Mark a stale incarnation's Lease with FENCED_ANNOTATION (rtj.ladder.fencing): it stops itself."""

    lease: str
    reason: str


@dataclass(frozen=True)
class SetRenewPeriod:
    """Ask a running pod to renew its Lease every `seconds` (contract.RENEW_PERIOD_ANNOTATION): the
    job's period under the heartbeat budget is not the pod's (rtj.ladder.heartbeat_budget)."""

    lease: str
    seconds: int


@dataclass(frozen=True)
class RequestReachProbe:
    """Ask a running pod to probe its peers' reach endpoints (contract.REACH_PROBE_ANNOTATION; the
    partition policy, rtj.ladder.partition)."""

    lease: str
    probe: contract.ReachProbe


@dataclass(frozen=True)
class DeleteLease:
    """Delete a fenced Lease whose pod is gone and that stopped renewing."""

    lease: str


@dataclass(frozen=True)
class DeleteJob:
    """ttlSecondsAfterFinished expired."""


@dataclass(frozen=True)
class CreateWorkload:
    """Create the job's Kueue Workload (rtj.builders.workload; AlreadyExists is success)."""


@dataclass(frozen=True)
class PatchWorkloadStatus:
    """Merge-patch the job's Workload status (Finished; admission cleared after an eviction),
    under the resourceVersion it was computed from (a conflict: the next pass recomputes)."""

    name: str
    resource_version: str
    status: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)


Action = (
    CreateWorkerPod
    | CreateSparePod
    | CreateRendezvousPod
    | CreateRendezvousService
    | DeletePod
    | TaintNode
    | RecordNodeFault
    | PromoteSpare
    | AssignLease
    | FenceLease
    | SetRenewPeriod
    | RequestReachProbe
    | DeleteLease
    | DeleteJob
    | CreateWorkload
    | PatchWorkloadStatus
)


@dataclass(frozen=True)
class JobEvent:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class RestartObserved:
    """One or more restarts at a ladder level, committed by this decision's status write."""

    level: str
    reason: str
    count: int = 1


@dataclass(frozen=True)
class RecoveryObserved:
    """One incident recovered (rtj.ladder.incidents), committed by this decision's status write."""

    level: str
    seconds: float
    #: The incident's class (rtj.ladder.incidents.label): a fault class reason, InProcessRestart, ...
    reason: str = ""
    #: Steps it lost, an estimate (rtj.ladder.incidents); None when no step was known.
    steps_lost: int | None = None
