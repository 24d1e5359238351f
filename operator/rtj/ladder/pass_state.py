"""One decide() pass: what it observed, the status it builds and the decision it returns, with the
small helpers every policy module of the ladder uses (events, conditions, deletions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from pydantic import ValidationError

from rtj import contract
from rtj.api.models import FaultStatus, JobStatus, NodeSlotStatus, ResilientTrainingJob
from rtj.ladder.actions import Action, DeletePod, JobEvent, RecoveryObserved, RestartObserved
from rtj.ladder.conditions import set_condition
from rtj.ladder.observe import LeaseObs, Observed, PodObs

NORMAL, WARNING = "Normal", "Warning"


@dataclass(frozen=True)
class LadderConfig:
    #: Grace period when deleting a faulted pod whose node is healthy (node lost: 0, forced).
    fault_grace_seconds: int = 5
    #: lastHeartbeatTime in status is refreshed at most this often (unless something else
    #: changed): per-heartbeat status writes at 1,000 jobs x 8 pods would be ~800 writes/s.
    heartbeat_status_resolution_seconds: float = 60.0
    #: Kueue integration (rtj.ladder.kueue_admission): a job labelled with a queue runs only admitted.
    kueue_enabled: bool = False


@dataclass
class Decision:
    actions: list[Action] = field(default_factory=list)
    status: JobStatus = field(default_factory=JobStatus)
    events: list[JobEvent] = field(default_factory=list)
    restarts: list[RestartObserved] = field(default_factory=list)
    recoveries: list[RecoveryObserved] = field(default_factory=list)
    #: Seconds since each live worker's last heartbeat, by slot (metrics only, never in status).
    heartbeat_ages: dict[int, float] = field(default_factory=dict)


def copy_status(status: JobStatus) -> JobStatus:
    """A deep copy of the status. A dump/validate round trip costs about a seventh of
    model_copy(deep=True) (copy.deepcopy), which was most of decide()'s time: decide() of an
    8-slot job went from ~0.45 to ~0.28 ms CPU (see docs/benchmarks.md, Operator at scale). The deep
    copy stays as the fallback for a status that no longer validates."""
    try:
        return JobStatus.model_validate(status.model_dump(by_alias=True))
    except ValidationError:
        return status.model_copy(deep=True)


class Pass:
    """State of one decide() call; the ladder's policy modules read and update it."""

    def __init__(self, job: ResilientTrainingJob, observed: Observed, now: datetime, config: LadderConfig):
        self.job, self.obs, self.now, self.cfg = job, observed, now, config
        self.name = str(job.metadata.get("name", ""))
        self.generation = job.metadata.get("generation")
        self.spec = job.spec
        self.ft = job.spec.fault_tolerance
        self.old = job.status
        self.st = copy_status(job.status)
        self.d = Decision()
        by_slot: dict[int, NodeSlotStatus] = {
            s.slot: s for s in self.st.node_slots if 0 <= s.slot < self.spec.nodes
        }
        self.slots = [by_slot.get(i) or NodeSlotStatus(slot=i) for i in range(self.spec.nodes)]
        self.workers: dict[int, list[PodObs]] = {}
        self.spares: dict[int, list[PodObs]] = {}
        self.rdzv: PodObs | None = None
        for pod in observed.pods.values():
            if pod.role == contract.ROLE_WORKER and pod.slot is not None and 0 <= pod.slot < self.spec.nodes:
                self.workers.setdefault(pod.slot, []).append(pod)
            elif pod.role == contract.ROLE_SPARE and pod.spare_index is not None:
                self.spares.setdefault(pod.spare_index, []).append(pod)
            elif pod.role == contract.ROLE_RENDEZVOUS and pod.name == contract.rendezvous_name(self.name):
                self.rdzv = pod
        self.failed: tuple[str, str] | None = None
        self.correlated = False
        self.stale_heartbeats = ""
        self.promoted_spares: set[str] = set()
        self.renewals: list[tuple[NodeSlotStatus, datetime]] = []
        #: Training steps the slots' heartbeats report (status.step, refreshed with heartbeat times).
        self.steps: list[int] = []
        #: Per slot with a heartbeat, its pod's newest memory snapshot step (status.memorySnapshotStep).
        self.memory_steps: list[int | None] = []

    # --- helpers ---------------------------------------------------------------------------------
    def event(self, type_: str, reason: str, message: str) -> None:
        self.d.events.append(JobEvent(type_, reason, message))

    def lease(self, pod: PodObs) -> LeaseObs | None:
        return self.obs.leases.get(contract.lease_name(pod.name))

    def delete(self, pod: PodObs, grace: int | None) -> None:
        if not pod.deleting:
            self.d.actions.append(DeletePod(pod.name, pod.uid, grace))

    def delete_live_pods(self, roles: set[str]) -> None:
        for pod in self.obs.pods.values():
            if pod.role in roles and pod.live:
                self.delete(pod, None)

    def avoid_nodes(self) -> tuple[str, ...]:
        return tuple(sorted(set(self.st.quarantined_nodes)))

    def note_fault(self, slot: NodeSlotStatus, reason: str, pod: str, node: str) -> None:
        """The newest fault for status.lastFault (kubectl get rtj -o wide)."""
        self.st.last_fault = FaultStatus(reason=reason, slot=slot.slot, pod=pod, node=node, time=self.now)

    def cond(self, type_: str, status: bool, reason: str, message: str = "") -> None:
        self.st.conditions = set_condition(
            self.st.conditions, type_, status, reason, message, self.now, self.generation
        )
