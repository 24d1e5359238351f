"""One decide() pass: what it observed, the status it builds and the decision it returns, with the
small helpers every policy module of the ladder uses (events, conditions, deletions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from rtj import contract, reasons
from rtj.api.models import (
    IN_MEMORY,
    FaultStatus,
    IncidentStatus,
    JobStatus,
    NodeSlotStatus,
    NodeWriteKind,
    ResilientTrainingJob,
    SlotState,
)
from rtj.ladder import blame
from rtj.ladder import predicates as p
from rtj.ladder.actions import Action, DeletePod, JobEvent, RecoveryObserved, RestartObserved
from rtj.ladder.blame import Verdict
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
    #: NodeNotReady within this long after the operator's own API calls failed is held (Pass.node_verdict).
    api_recovery_hold_seconds: float = 30.0
    #: A quarantined node is checked again this long after the latest evidence (rtj.ladder.quarantine).
    quarantine_seconds: float = 3600.0
    #: Heartbeat Lease writes/s for all the operator's jobs; 0: none (rtj.ladder.heartbeat_budget).
    heartbeat_writes_per_second: float = 0.0


@dataclass
class Decision:
    actions: list[Action] = field(default_factory=list)
    status: JobStatus = field(default_factory=JobStatus)
    events: list[JobEvent] = field(default_factory=list)
    restarts: list[RestartObserved] = field(default_factory=list)
    recoveries: list[RecoveryObserved] = field(default_factory=list)
    #: Seconds since each live worker's last heartbeat, by slot (metrics only, never in status).
    heartbeat_ages: dict[int, float] = field(default_factory=dict)
    #: When the earliest time-based rule that has not fired yet fires (a startup or missing-Lease
    #: deadline, an overdue deletion, the progress watchdog, the TTL, a create backoff's end): the
    #: pass is due then (rtj.ladder.wakeups). Heartbeat deadlines are in heartbeat_ages.
    due: datetime | None = None


def copy_status(status: JobStatus) -> JobStatus:
    """A deep copy of the status. A dump/validate round trip costs about a seventh of
    model_copy(deep=True) (copy.deepcopy), which was most of decide()'s time: decide() of an
    8-slot job went from ~0.45 to ~0.28 ms CPU (see docs/benchmarks.md, Operator at scale). The deep
    copy stays as the fallback for a status that no longer validates. In memory: every slot as it
    is, not the wire's slotTable (rtj.api.status_slots)."""
    try:
        return JobStatus.model_validate(status.model_dump(by_alias=True, context={IN_MEMORY: True}))
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
        self.job_key = f"{job.metadata.get('namespace', '')}/{self.name}"
        #: Slots whose pods wait for something no restart fixes, with the evidence (condition Waiting).
        self.waiting: list[tuple[NodeSlotStatus, Verdict]] = []
        #: Soft restarts whose pods report a collateral cause, counted once every slot was seen
        #: (rtj.ladder.slots.count_collateral).
        self.collateral: list[Any] = []
        self.failed: tuple[str, str] | None = None
        self.correlated = False
        self.stale_heartbeats = ""
        self.promoted_spares: set[str] = set()
        self.renewals: list[tuple[NodeSlotStatus, datetime]] = []
        #: Training steps the slots' heartbeats report (status.step, refreshed with heartbeat times).
        self.steps: list[int] = []
        #: Per slot with a heartbeat, its pod's newest memory snapshot step (status.memorySnapshotStep).
        self.memory_steps: list[int | None] = []
        #: Per slot with a heartbeat, the newest step its peer holds a replica of (status.replicaStep).
        self.replica_steps: list[int | None] = []
        #: (step, renewTime) of each slot's heartbeat: what the progress watchdog judges from.
        self.step_renewals: list[tuple[int, datetime]] = []
        #: Incidents recorded in this pass by (reason, action): pods replaced for one reason in one
        #: pass are one incident (rtj.ladder.incidents).
        self.incidents_now: dict[tuple[str, str], IncidentStatus] = {}
        #: Soft restarts of this pass taken for echoes before the incident they echo was recorded.
        self.pending_echoes = 0

    # --- helpers ---------------------------------------------------------------------------------
    def event(self, type_: str, reason: str, message: str) -> None:
        self.d.events.append(JobEvent(type_, reason, message))

    def due_at(self, when: datetime | None) -> None:
        """A time-based rule that has not fired will fire at `when`: the next pass must run then."""
        if when is not None and when >= self.now and (self.d.due is None or when < self.d.due):
            self.d.due = when

    def node_verdict(self, node: str) -> Verdict | None:
        """Evidence against a pod's node (rtj.ladder.blame.node_health), except a NotReady seen right
        after the operator's own API calls failed: during an API server outage kubelets cannot renew
        their node Leases either, and the node lifecycle controller may mark healthy nodes NotReady
        until their next renewal (the analogue of its own "full disruption" mode). Held for
        api_recovery_hold_seconds after the last failed call; a node still NotReady then is a fault.
        A node that is gone (NodeLost) is never held."""
        verdict = blame.node_health(self.obs.nodes.get(node), node, self.obs.nodes_known)
        failed = self.obs.api_failed_at
        if verdict is not None and verdict.reason == reasons.NODE_NOT_READY and failed is not None:
            until = p.after(failed, self.cfg.api_recovery_hold_seconds)
            if self.now < until:
                self.due_at(until)
                return None
        return verdict

    @property
    def waiting_reason(self) -> str:
        """The most common reason slots wait for ("" when none waits)."""
        counts: dict[str, int] = {}
        for _slot, verdict in self.waiting:
            counts[verdict.reason] = counts.get(verdict.reason, 0) + 1
        return max(counts, key=lambda r: counts[r]) if counts else ""

    def no_kubelet(self, pod: PodObs) -> bool:
        """No kubelet can finish a graceful deletion of the pod: its node is not Ready or gone."""
        verdict = self.node_verdict(pod.node)
        return verdict is not None and verdict.reason in (reasons.NODE_NOT_READY, reasons.NODE_LOST)

    def peers_waiting(self, slot: NodeSlotStatus) -> bool:
        """Another slot of the job has no pod yet, or one that has not started (pending,
        unschedulable, pulling): its peers' launchers wait for it. A peer that ended (failed in the
        same pass, or exited 0) is not waited for."""
        for other in self.slots:
            if other.slot == slot.slot:
                continue
            current = [q for q in self.workers.get(other.slot, []) if q.attempt == other.attempt]
            if not current and other.state not in (SlotState.SUCCEEDED, SlotState.COMPLETED):
                return True
            if any(q.phase == "Pending" for q in current):
                return True
        return False

    def lease(self, pod: PodObs) -> LeaseObs | None:
        return self.obs.leases.get(contract.lease_name(pod.name))

    def delete(self, pod: PodObs, grace: int | None, force: bool = False) -> None:
        """Deletes the pod with `grace` (None: its own terminationGracePeriodSeconds), or forces it
        (grace 0, also a deletion already requested) when `force` or when no kubelet can finish it:
        its node is not Ready or gone. A graceful deletion there never ends: the pod would stay
        Terminating, even after its job is deleted."""
        force = force or self.no_kubelet(pod)
        if not force and pod.deleting:
            return
        action = DeletePod(pod.name, pod.uid, 0 if force else grace)
        earlier = [a for a in self.d.actions if isinstance(a, DeletePod) and a.name == pod.name]
        if earlier and (earlier[0].grace_seconds == 0 or not force):
            return  # one deletion per pod and pass; a forced one replaces a graceful one
        self.d.actions = [a for a in self.d.actions if a not in earlier] + [action]

    def delete_live_pods(self, roles: set[str]) -> None:
        for pod in self.obs.pods.values():
            if pod.role in roles and pod.live:
                self.delete(pod, None)

    def avoid_nodes(self) -> tuple[str, ...]:
        """The nodes this job's new pods stay off: those it quarantined, until the node index shows
        the quarantine lifted (by its review, a reboot, an admin) with no taint of this job's still
        to be applied (rtj.ladder.node_writes). Only read when a pod is created."""
        lifted = {n.name for n in self.obs.all_nodes if not n.quarantined}
        pending = {w.node for w in self.st.unapplied_node_writes if w.kind == NodeWriteKind.QUARANTINE}
        return tuple(sorted(set(self.st.quarantined_nodes) - (lifted - pending)))

    def note_fault(self, slot: NodeSlotStatus, reason: str, pod: str, node: str) -> None:
        """The newest fault for status.lastFault (kubectl get rtj -o wide)."""
        self.st.last_fault = FaultStatus(reason=reason, slot=slot.slot, pod=pod, node=node, time=self.now)

    def cond(self, type_: str, status: bool, reason: str, message: str = "") -> None:
        self.st.conditions = set_condition(
            self.st.conditions, type_, status, reason, message, self.now, self.generation
        )
