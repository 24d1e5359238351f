"""The escalation ladder as one pure function: `decide(job, observed, now) -> Decision`.

Levels (each with a budget, a condition reason, an Event and a metric):
1. In-process restart (NVRx inprocess.Wrapper) and 2. in-job restart (ft_launcher): soft faults,
   seen only as heartbeat counters going up; counted, pods untouched.
3. Hard fault (heartbeat silent past its deadline, pod Failed with a restartable exit code, pod
   evicted/deleted, node NotReady/lost, a pod-reported hard fault): replace that ONE pod (attempt+1);
   the others keep running and re-rendezvous. The old pod is deleted first and its replacement is
   created only once it is gone, so a slot never has two live pods. A standby hot spare is promoted
   instead of creating a pod when one is ready.
4. maxPodReschedules exceeded or a do-not-restart exit code: the job Fails; nothing is restarted and
   every pod that still runs is deleted (GPUs freed; pods that already ended are kept for `kubectl
   logs`). All workers Succeeded: the job Succeeded (the rendezvous pod and spares are deleted).

Exactly-once counting: every counter is committed by the status write of the pass that observed
it. Soft restarts are deltas against the per-slot "last seen" counts stored in the same status;
pod reschedules are derived from attempts (a pod whose attempt is newer than the status knows and
whose cause annotation names a fault counts once), so a crash between creating a pod and writing
status neither loses nor doubles a count. The handler writes status with a resourceVersion
precondition, so a pass computed from a stale copy cannot commit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from pydantic import ValidationError

from rtj import contract, reasons
from rtj.api.models import (
    SLOT_STATES_WITHOUT_POD,
    CheckpointStatus,
    Condition,
    ConditionType,
    FaultStatus,
    JobState,
    JobStatus,
    NodeSlotStatus,
    ResilientTrainingJob,
    SlotState,
    SpareStatus,
)
from rtj.contract import PodState
from rtj.ladder import (
    create_refusals,
    event_outbox,
    job_level,
    kueue_admission,
    missing_lease,
    outage_hold,
    progress_watchdog,
)
from rtj.ladder import predicates as p
from rtj.ladder.actions import (
    Action,
    AssignLease,
    CreateRendezvousPod,
    CreateRendezvousService,
    CreateSparePod,
    CreateWorkerPod,
    DeleteJob,
    DeletePod,
    JobEvent,
    PromoteSpare,
    RecoveryObserved,
    RestartObserved,
    TaintNode,
)
from rtj.ladder.conditions import get_condition, is_true, set_condition
from rtj.ladder.observe import LeaseObs, Observed, PodObs

NORMAL, WARNING = "Normal", "Warning"
#: Faults whose pod is deleted without a grace period. A pod silent past heartbeatTimeoutSeconds is
#: hung or cut off: a graceful stop would not be answered, and waiting for it (or for the node to
#: turn NotReady, 40 s+ upstream) is exactly the delay the heartbeat deadline exists to avoid.
_FORCE = frozenset({reasons.NODE_NOT_READY, reasons.NODE_LOST, reasons.HEARTBEAT_TIMEOUT})
#: A deletion still unfinished this long after its grace period ended will not be finished by a
#: kubelet: force it rather than keep the slot empty.
_OVERDUE_SECONDS = 2.0


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


def _copy_status(status: JobStatus) -> JobStatus:
    """A deep copy of the status. A dump/validate round trip costs about a seventh of
    model_copy(deep=True) (copy.deepcopy), which was most of decide()'s time: decide() of an
    8-slot job went from ~0.45 to ~0.28 ms CPU (see docs/benchmarks.md, Operator at scale). The deep
    copy stays as the fallback for a status that no longer validates."""
    try:
        return JobStatus.model_validate(status.model_dump(by_alias=True))
    except ValidationError:
        return status.model_copy(deep=True)


class _Pass:
    """State of one decide() call; methods are the ladder's steps."""

    def __init__(self, job: ResilientTrainingJob, observed: Observed, now: datetime, config: LadderConfig):
        self.job, self.obs, self.now, self.cfg = job, observed, now, config
        self.name = str(job.metadata.get("name", ""))
        self.generation = job.metadata.get("generation")
        self.spec = job.spec
        self.ft = job.spec.fault_tolerance
        self.old = job.status
        self.st = _copy_status(job.status)
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

    # --- the pass --------------------------------------------------------------------------------
    def run(self) -> Decision:
        self.st.observed_generation = self.generation
        self.st.nodes_desired = self.spec.nodes
        if is_true(self.old.conditions, ConditionType.SUCCEEDED) or is_true(
            self.old.conditions, ConditionType.FAILED
        ):
            self.finished()
        elif self.spec.suspend:
            self.suspended()
        elif (held := kueue_admission.hold(self.job, self.obs.workload, self.cfg.kueue_enabled)) is not None:
            self.suspended(held.reason, held.message, JobState.QUEUED)
        else:
            self.active()
            self.apply_heartbeat_times()
            if self.st.state not in (JobState.FAILED, JobState.SUCCEEDED):
                self.create_refusal()
        if self.st.state in (JobState.FAILED, JobState.SUCCEEDED, JobState.SUSPENDED, JobState.QUEUED):
            self.st.steps_per_second = None  # no pod trains: a last rate would read as training
        self.st.node_slots = self.slots
        self.d.actions += kueue_admission.workload_actions(
            self.job, self.obs.workload, self.st, self.obs.pods, self.cfg.kueue_enabled, self.now
        )
        event_outbox.record(self.st, self.d.events, self.obs.events_posted, self.now)
        self.d.status = self.st
        return self.d

    def finished(self) -> None:
        failed = is_true(self.old.conditions, ConditionType.FAILED)
        roles = (
            {contract.ROLE_WORKER, contract.ROLE_SPARE, contract.ROLE_RENDEZVOUS}
            if failed
            else {contract.ROLE_SPARE, contract.ROLE_RENDEZVOUS}
        )
        self.delete_live_pods(roles)
        if is_true(self.old.conditions, ConditionType.DEGRADED):  # consistent with the job's end
            self.cond(ConditionType.DEGRADED, False, reasons.FINISHED, "")
        if p.ttl_expired(self.st.completion_time, self.spec.ttl_seconds_after_finished, self.now):
            self.d.actions.append(DeleteJob())

    def suspended(
        self,
        reason: str = reasons.SUSPENDED,
        message: str = "spec.suspend is true",
        state: str = JobState.SUSPENDED,
    ) -> None:
        self.delete_live_pods({contract.ROLE_WORKER, contract.ROLE_SPARE, contract.ROLE_RENDEZVOUS})
        for slot in self.slots:
            slot.pod, slot.node, slot.state = "", "", SlotState.SUSPENDED
            slot.recovering_since, slot.recovering_level = None, ""
        self.st.spares = []
        self.st.rendezvous_pod_uid = ""  # the one recreated on resume is not a recovery
        self.close_degraded()
        if _condition_reason(self.old.conditions, ConditionType.SUSPENDED) != reason:
            kept = "job suspended: pods removed; status and checkpoints kept"
            self.event(NORMAL, reason, kept if reason == reasons.SUSPENDED else message)
        self.cond(ConditionType.SUSPENDED, True, reason, message)
        self.cond(ConditionType.RUNNING, False, reason, "")
        self.cond(ConditionType.RECOVERING, False, reason, "")
        self.cond(ConditionType.DEGRADED, False, reason, "")
        self.st.nodes_ready = 0
        self.st.state, self.st.reason = JobState(state), reason

    def active(self) -> None:
        if self.obs.refused:
            self.fail(reasons.INVALID_SPEC, self.obs.refused)
            return
        causes: dict[int, str] = {}
        if is_true(self.old.conditions, ConditionType.SUSPENDED):
            for slot in self.slots:
                slot.attempt += 1
                slot.pod, slot.state, slot.last_heartbeat_time = "", SlotState.PENDING, None
                slot.lease_missing_since = None
                slot.in_process_restarts = slot.in_job_restarts = 0
                causes[slot.slot] = reasons.CAUSE_RESUME
            self.cond(ConditionType.SUSPENDED, False, reasons.RESUMED, "")
            self.event(NORMAL, reasons.RESUMED, "job resumed: pods recreated (attempt numbers continue)")
        self.rendezvous()
        faults: list[tuple[NodeSlotStatus, PodObs | None, str, str]] = []
        for slot in self.slots:
            fault = self.observe_slot(slot)
            if fault is not None:
                faults.append((slot, *fault))
        faults = self.hold_correlated_silence(faults)
        # Many slots failing in one pass is a correlated fault (network, a zone), not several bad
        # nodes: replace the pods, quarantine no node.
        self.correlated = len(faults) > 1 and len(faults) * 2 > self.spec.nodes
        job_reason = job_level.attribute([f[2] for f in faults], self.st, self.ft, self.now)
        if job_reason == reasons.PODS_FAILED_TOGETHER:
            job_level.begin(self.st, self.ft, self.now)
        if self.failed is None:
            for slot, pod, reason, message in faults:
                if job_reason is not None and reason in job_level.SYMPTOMS:
                    self.job_fault(slot, pod, message, job_reason, reason in _FORCE)
                else:
                    self.hard_fault(slot, pod, reason, message)
                if self.failed is not None:
                    break
        if self.failed is not None:
            self.fail(*self.failed)
            return
        if all(s.state == SlotState.SUCCEEDED for s in self.slots):
            self.succeed()
            return
        for slot in self.slots:
            self.fill_slot(slot, causes.get(slot.slot))
        self.keep_spares()
        self.summarize()
        self.watch_progress()

    def watch_progress(self) -> None:
        """rtj.ladder.progress_watchdog: Stalled, then NoProgress."""
        verdict = progress_watchdog.check(
            self.st, self.slots, self.steps, self.ft, self.now, self.cfg.heartbeat_status_resolution_seconds
        )
        if verdict.failed:
            self.fail(reasons.NO_PROGRESS, verdict.message)
            return
        if verdict.stalled:
            if not is_true(self.old.conditions, ConditionType.STALLED):
                self.event(
                    WARNING,
                    reasons.STALLED,
                    f"{verdict.message}; the job fails NoProgress if this lasts as long again",
                )
            self.cond(ConditionType.STALLED, True, reasons.STALLED, verdict.message)
            self.st.reason = reasons.STALLED
        elif get_condition(self.old.conditions, ConditionType.STALLED) is not None:
            self.cond(ConditionType.STALLED, False, reasons.PROGRESSING, "")

    def hold_correlated_silence(
        self, faults: list[tuple[NodeSlotStatus, PodObs | None, str, str]]
    ) -> list[tuple[NodeSlotStatus, PodObs | None, str, str]]:
        """rtj.ladder.outage_hold: silence of most slots at once is held, with hysteresis."""
        silent = [f for f in faults if f[2] in (reasons.HEARTBEAT_TIMEOUT, reasons.STARTUP_TIMEOUT)]
        stale = outage_hold.stale_count(len(silent), self.d.heartbeat_ages, self.ft)
        was_held = _condition_reason(self.old.conditions, ConditionType.DEGRADED) == reasons.HEARTBEATS_STALE
        if not outage_hold.holds(was_held, len(silent), stale, self.spec.nodes):
            return faults
        for slot, _pod, _reason, _message in silent:
            slot.state = SlotState.SILENT
        self.stale_heartbeats = outage_hold.message(stale, self.spec.nodes)
        return [f for f in faults if f not in silent]

    # --- creates the API server refuses (rtj.ladder.create_refusals) -------------------------------
    def create_refusal(self) -> None:
        refusal = self.obs.create_refusal
        old = get_condition(self.old.conditions, ConditionType.CREATE_REFUSED)
        if refusal is None:
            if old is not None and old.status == "True":
                self.cond(ConditionType.CREATE_REFUSED, False, reasons.CREATES_ACCEPTED, "")
            return
        self.d.actions = create_refusals.held_back(self.d.actions, refusal, self.now)
        message = f"the API server refused to create the job's objects ({refusal.status}): {refusal.message}"
        if old is None or old.status != "True" or old.message != message[:1024]:
            self.event(
                WARNING,
                reasons.CREATE_REFUSED,
                f"{message}; retried with backoff until it is accepted",
            )
        self.cond(ConditionType.CREATE_REFUSED, True, refusal.reason or reasons.CREATE_REFUSED, message)
        if self.st.state == JobState.PENDING:
            self.st.reason = reasons.CREATE_REFUSED

    # --- rendezvous ------------------------------------------------------------------------------
    def rendezvous(self) -> None:
        if not self.obs.service_exists:
            self.d.actions.append(CreateRendezvousService())
        pod = self.rdzv
        lost = pod is None or pod.terminal or p.node_fault(pod, self.obs.nodes, self.obs.nodes_known)
        if lost and self.st.rendezvous_pod_uid:
            # Counted when first seen lost; the uid cleared in the same status write, so the
            # replacement is adopted without a second count.
            name = pod.name if pod is not None else contract.rendezvous_name(self.name)
            if not self.rendezvous_restart(f"rendezvous pod {name} lost"):
                return
            self.st.rendezvous_pod_uid = ""
        if pod is None:
            self.d.actions.append(CreateRendezvousPod())
            return
        if lost:
            self.delete(pod, 0)
            return
        if pod.uid and pod.uid != self.st.rendezvous_pod_uid:
            # Another uid than the one counted: replaced by a pass whose status write was lost.
            if self.st.rendezvous_pod_uid and not self.rendezvous_restart(
                f"rendezvous pod {pod.name} was recreated"
            ):
                return
            self.st.rendezvous_pod_uid = pod.uid

    def rendezvous_restart(self, what: str) -> bool:
        """The rendezvous pod was lost: one job-level recovery (maxJobRestarts), no pod budget and no
        quarantine; False when the job budget is spent (the job fails)."""
        job_level.begin(self.st, self.ft, self.now)
        if not job_level.needs_count(self.st):  # this incident is counted already
            return True
        if self.st.restarts.job + 1 > self.ft.max_job_restarts:
            self.failed = (
                reasons.JOB_RESTART_BUDGET_EXHAUSTED,
                f"{what}; maxJobRestarts={self.ft.max_job_restarts} already used",
            )
            return False
        self.st.restarts.job += 1
        self.st.job_restart_time = self.now
        self.d.restarts.append(RestartObserved(reasons.LEVEL_JOB, reasons.RENDEZVOUS_LOST))
        self.event(
            WARNING,
            reasons.RENDEZVOUS_LOST,
            f"{what}: recreated, the workers rejoin it ({self.st.restarts.job}/"
            f"{self.ft.max_job_restarts} job restarts); no pod budget spent, no node quarantined",
        )
        return True

    # --- one slot: observe, count soft restarts, detect hard faults --------------------------------
    def observe_slot(self, slot: NodeSlotStatus) -> tuple[PodObs | None, str, str] | None:
        pods = self.workers.get(slot.slot, [])
        newest = max(pods, key=lambda q: q.attempt, default=None)
        if newest is not None and newest.attempt > slot.attempt:
            # Created (or promoted) by a pass whose status write was lost: adopt, count once.
            if newest.cause in reasons.JOB_LEVEL_CAUSES:  # job level: no pod reschedule
                slot.last_fault_reason = newest.cause
                slot.recovering_since = slot.recovering_since or self.now
                slot.recovering_level = reasons.LEVEL_JOB
            elif newest.cause and newest.cause not in reasons.NON_FAULT_CAUSES:
                self.st.restarts.pod_reschedules += 1
                self.d.restarts.append(RestartObserved(reasons.LEVEL_POD, newest.cause))
                slot.last_fault_reason = newest.cause
                slot.recovering_since = slot.recovering_since or self.now
                slot.recovering_level = reasons.LEVEL_POD
            slot.attempt, slot.pod = newest.attempt, ""
            slot.in_process_restarts = slot.in_job_restarts = 0
            slot.last_heartbeat_time = slot.lease_missing_since = None  # a new pod: its own heartbeats
        for old in pods:
            if old.attempt < slot.attempt and old.live:
                self.delete(
                    old,
                    0
                    if p.node_fault(old, self.obs.nodes, self.obs.nodes_known)
                    else self.cfg.fault_grace_seconds,
                )
        current = next((q for q in pods if q.attempt == slot.attempt), None)
        if current is None:
            if slot.pod:
                return None, reasons.POD_DELETED, f"pod {slot.pod} disappeared"
            slot.state = SlotState.PENDING if slot.state not in (SlotState.REPLACING,) else slot.state
            return None
        slot.pod, slot.node = current.name, current.node or slot.node
        lease = self.lease(current)
        if current.phase == "Succeeded":
            slot.state = SlotState.SUCCEEDED
            return None
        permanent = p.reported_permanent_fault(lease)
        if permanent is not None:
            self.note_fault(slot, reasons.PERMANENT_FAULT, current.name, current.node)
            self.failed = (
                reasons.PERMANENT_FAULT,
                f"pod {current.name} (slot {slot.slot}) reported a permanent error, which no restart "
                f"can fix: {permanent}",
            )
            return None
        if current.phase == "Failed":
            slot.state = SlotState.FAILED
            if p.is_do_not_restart(current, self.ft):
                self.note_fault(slot, reasons.DO_NOT_RESTART_EXIT_CODE, current.name, current.node)
                self.failed = (
                    reasons.DO_NOT_RESTART_EXIT_CODE,
                    f"pod {current.name} (slot {slot.slot}) exited with do-not-restart code "
                    f"{current.exit_code}",
                )
                return None
            return (
                current,
                p.failed_pod_reason(current),
                (
                    f"pod {current.name} failed (exit code {current.exit_code}, "
                    f"{current.status_reason or 'no reason'})"
                ),
            )
        if current.deleting:
            return current, reasons.POD_DELETED, f"pod {current.name} is being deleted"
        node_reason = p.node_fault(current, self.obs.nodes, self.obs.nodes_known)
        if node_reason is not None:
            return current, node_reason, f"node {current.node} of pod {current.name} is not Ready or gone"
        self.count_soft(slot, current, lease)
        lease_missing = current.phase == "Running" and missing_lease.applies(
            slot, lease is not None and lease.renew_time is not None
        )
        if lease_missing:
            silence = missing_lease.silence(slot, self.ft, self.now)
        else:
            slot.lease_missing_since = None
            silence = p.heartbeat_silence(current, lease, self.ft, self.now)
        for check in (p.reported_hard_fault(lease), silence):
            if check is not None:
                return current, check[0], f"pod {current.name}: {check[1]}"
        if lease is not None and lease.renew_time is not None:
            self.d.heartbeat_ages[slot.slot] = p.seconds_since(lease.renew_time, self.now)
        if current.phase != "Running":
            slot.state = SlotState.PENDING
        elif lease_missing:
            slot.state = missing_lease.STATE_LEASE_MISSING
        elif lease is None or lease.heartbeat is None:
            slot.state = SlotState.STARTING
        elif lease.heartbeat.state == contract.PodState.CHECKPOINTING:
            slot.state = contract.PodState.TRAINING.value  # no status write per checkpoint and pod
        else:
            slot.state = lease.heartbeat.state.value
        if current.name in self.promoted_spares or (
            current.role == contract.ROLE_WORKER
            and lease is not None
            and lease.heartbeat is not None
            and lease.heartbeat.state == contract.PodState.STANDBY
            and lease.assigned_slot != str(slot.slot)
        ):
            self.d.actions.append(AssignLease(current.name, slot.slot))
        self.track_recovery(slot, lease)
        self.refresh_heartbeat_time(slot, lease)
        return None

    def count_soft(self, slot: NodeSlotStatus, pod: PodObs, lease: LeaseObs | None) -> None:
        hb = lease.heartbeat if lease is not None else None
        if hb is None:  # absent or malformed: no information, never a fault by itself
            return
        for level, reason, seen, now_count in (
            (
                reasons.LEVEL_IN_PROCESS,
                reasons.IN_PROCESS_RESTART,
                slot.in_process_restarts,
                hb.in_process_restarts,
            ),
            (reasons.LEVEL_IN_JOB, reasons.IN_JOB_RESTART, slot.in_job_restarts, hb.in_job_restarts),
        ):
            delta = now_count - seen
            if delta <= 0:
                continue
            if level == reasons.LEVEL_IN_PROCESS:
                self.st.restarts.in_process += delta
            else:
                self.st.restarts.in_job += delta
            self.d.restarts.append(RestartObserved(level, reason, delta))
            detected = hb.fault.time if hb.fault is not None and hb.fault.time <= self.now else self.now
            if slot.recovering_since is None:
                slot.recovering_since, slot.recovering_level = detected, level
            fault = f" ({hb.fault.reason}: {hb.fault.message})" if hb.fault is not None else ""
            self.note_fault(slot, hb.fault.reason if hb.fault is not None else reason, pod.name, pod.node)
            self.event(
                NORMAL,
                reason,
                f"slot {slot.slot} pod {pod.name}: {delta} {level} restart(s), "
                f"{now_count} in this pod{fault}; pods untouched",
            )
        # Never backwards: a lower count (should not happen within one pod) resets the baseline.
        slot.in_process_restarts = hb.in_process_restarts
        slot.in_job_restarts = hb.in_job_restarts

    def track_recovery(self, slot: NodeSlotStatus, lease: LeaseObs | None) -> None:
        if (
            slot.recovering_since is None
            or lease is None
            or lease.heartbeat is None
            or lease.renew_time is None
        ):
            return
        if lease.heartbeat.state != contract.PodState.TRAINING or lease.renew_time < slot.recovering_since:
            return
        seconds = (lease.renew_time - slot.recovering_since).total_seconds()
        self.d.recoveries.append(RecoveryObserved(slot.recovering_level or reasons.LEVEL_POD, seconds))
        self.event(
            NORMAL,
            reasons.RECOVERED,
            f"slot {slot.slot} back to Training {seconds:.1f}s after the fault ({slot.recovering_level})",
        )
        slot.recovering_since, slot.recovering_level = None, ""

    def refresh_heartbeat_time(self, slot: NodeSlotStatus, lease: LeaseObs | None) -> None:
        renew = lease.renew_time if lease is not None else None
        if renew is not None:
            self.renewals.append((slot, renew))
        if lease is not None and lease.heartbeat is not None:
            self.steps.append(lease.heartbeat.step)
            self.memory_steps.append(lease.heartbeat.memory_snapshot_step)

    def apply_heartbeat_times(self) -> None:
        """Heartbeat times reach status at `heartbeat_status_resolution_seconds`, for all slots at
        once: per-slot refreshes on their own phases would cost one status write per slot per period
        (8x the writes at 8 nodes; measured in bench/operator_scale.py)."""
        resolution = self.cfg.heartbeat_status_resolution_seconds

        def due(slot: NodeSlotStatus, renew: datetime) -> bool:
            last = slot.last_heartbeat_time
            return last is None or (renew - last).total_seconds() >= resolution

        if any(due(slot, renew) for slot, renew in self.renewals):
            seen_before = [s.last_heartbeat_time for s, _ in self.renewals if s.last_heartbeat_time]
            before = max(seen_before, default=None)
            for slot, renew in self.renewals:
                slot.last_heartbeat_time = renew
            if self.steps:
                step, seen = max(self.steps), max(renew for _, renew in self.renewals)
                self.st.steps_per_second = p.steps_per_second(self.st.step, before, step, seen)
                self.st.step = step
            held = self.memory_steps
            complete = len(held) == self.spec.nodes and None not in held
            self.st.memory_snapshot_step = min(s for s in held if s is not None) if complete else None

    # --- job level: one recovery for the job's fault (rtj.ladder.job_level) -----------------------------
    def job_fault(
        self, slot: NodeSlotStatus, pod: PodObs | None, message: str, reason: str, force: bool
    ) -> None:
        if job_level.needs_count(self.st):
            if self.st.restarts.job + 1 > self.ft.max_job_restarts:
                self.failed = (
                    reasons.JOB_RESTART_BUDGET_EXHAUSTED,
                    f"{reason}: slot {slot.slot}: {message}; maxJobRestarts={self.ft.max_job_restarts} "
                    "already used",
                )
                return
            self.st.restarts.job += 1
            self.st.job_restart_time = self.now
            self.d.restarts.append(RestartObserved(reasons.LEVEL_JOB, reason))
            cause = (
                "right after the rendezvous pod was lost"
                if reason == reasons.RENDEZVOUS_RESTART
                else "together with other workers"
            )
            self.event(
                WARNING,
                reason,
                f"workers failed {cause}: recovered at job level ({self.st.restarts.job}/"
                f"{self.ft.max_job_restarts} job restarts); their pods are replaced and rejoin, no pod "
                "budget spent, no node quarantined",
            )
        node = pod.node if pod is not None else slot.node
        self.note_fault(slot, reason, pod.name if pod is not None else slot.pod, node)
        if pod is not None:
            self.delete(pod, 0 if force else self.cfg.fault_grace_seconds)
        old_name = slot.pod
        slot.attempt += 1
        slot.pod, slot.state, slot.last_fault_reason = "", SlotState.REPLACING, reason
        slot.in_process_restarts = slot.in_job_restarts = 0
        slot.last_heartbeat_time = slot.lease_missing_since = None
        slot.recovering_since, slot.recovering_level = self.now, reasons.LEVEL_JOB
        self.event(
            NORMAL,
            reason,
            f"slot {slot.slot}: {message}; replacing {old_name or 'pod'} with attempt {slot.attempt} "
            "(job level)",
        )

    # --- level 3: replace one pod ----------------------------------------------------------------
    def hard_fault(self, slot: NodeSlotStatus, pod: PodObs | None, reason: str, message: str) -> None:
        if p.budget_exhausted(self.st.restarts.pod_reschedules + 1, self.ft):
            self.failed = (
                reasons.POD_RESCHEDULE_BUDGET_EXHAUSTED,
                f"slot {slot.slot}: {message}; maxPodReschedules={self.ft.max_pod_reschedules} already used",
            )
            return
        node = pod.node if pod is not None else slot.node
        self.note_fault(slot, reason, pod.name if pod is not None else slot.pod, node)
        if pod is not None:
            self.delete(pod, 0 if reason in _FORCE else self.cfg.fault_grace_seconds)
        self.st.restarts.pod_reschedules += 1
        self.d.restarts.append(RestartObserved(reasons.LEVEL_POD, reason))
        old_name = slot.pod
        slot.attempt += 1
        slot.pod, slot.state, slot.last_fault_reason = "", SlotState.REPLACING, reason
        slot.in_process_restarts = slot.in_job_restarts = 0
        slot.last_heartbeat_time = slot.lease_missing_since = None
        slot.recovering_since, slot.recovering_level = self.now, reasons.LEVEL_POD
        self.event(
            WARNING,
            reason,
            f"slot {slot.slot}: {message}; replacing {old_name or 'pod'} with attempt "
            f"{slot.attempt} ({self.st.restarts.pod_reschedules}/"
            f"{self.ft.max_pod_reschedules} reschedules)",
        )
        if (
            self.ft.quarantine_faulty_nodes
            and not self.correlated
            and node
            and reason in reasons.NODE_SUSPECT
            and node not in self.st.quarantined_nodes
        ):
            self.st.quarantined_nodes = [*self.st.quarantined_nodes, node]
            self.d.actions.append(TaintNode(node))
            self.event(
                WARNING,
                reasons.NODE_QUARANTINED,
                f"node {node} tainted {contract.QUARANTINE_TAINT_KEY}={self.name}:NoSchedule after {reason}",
            )

    def fill_slot(self, slot: NodeSlotStatus, cause: str | None) -> None:
        """Create (or promote a spare into) the slot's pod once no older pod of the slot is alive."""
        if slot.pod:
            return
        if any(q.attempt == slot.attempt for q in self.workers.get(slot.slot, [])):
            return
        for q in self.workers.get(slot.slot, []):
            overdue = q.delete_by is not None and (self.now - q.delete_by).total_seconds() > _OVERDUE_SECONDS
            if q.deleting and (overdue or p.node_fault(q, self.obs.nodes, self.obs.nodes_known) is not None):
                # No kubelet will finish this deletion (its node is not Ready or gone, or its grace
                # period is long over): force it, as `kubectl delete --force` would, or the slot waits.
                self.d.actions.append(DeletePod(q.name, q.uid, 0))
        if any(q.live or q.deleting for q in self.workers.get(slot.slot, [])):
            slot.state = SlotState.REPLACING if slot.recovering_since else SlotState.PENDING
            return
        cause = cause or (
            slot.last_fault_reason if slot.recovering_since and slot.attempt > 0 else reasons.CAUSE_INITIAL
        )
        if cause not in reasons.NON_FAULT_CAUSES:
            spare = self.standby_spare(slot.slot)
            if spare is not None:
                self.promoted_spares.add(spare.name)
                self.d.actions.append(PromoteSpare(spare.name, slot.slot, slot.attempt, cause))
                self.d.actions.append(AssignLease(spare.name, slot.slot))
                self.event(
                    NORMAL,
                    reasons.SPARE_PROMOTED,
                    f"hot spare {spare.name} on node {spare.node} takes slot {slot.slot} "
                    f"(attempt {slot.attempt})",
                )
                # slot.pod stays empty until the relabelled pod is observed in the slot.
                slot.node, slot.state = spare.node, SlotState.STARTING
                return
        self.d.actions.append(CreateWorkerPod(slot.slot, slot.attempt, cause, self.avoid_nodes()))

    # --- hot spares ---------------------------------------------------------------------------------
    def standby_spare(self, slot: int) -> PodObs | None:
        """A ready spare for `slot`: one already signalled for this slot first (its relabel was
        lost), then any unsignalled one; a spare signalled for another slot is never reused."""
        candidates: list[PodObs] = []
        for index in sorted(self.spares):
            for pod in sorted(self.spares[index], key=lambda q: q.attempt, reverse=True):
                lease = self.lease(pod)
                if (
                    lease is not None
                    and lease.assigned_slot == str(slot)
                    and pod.phase == "Running"
                    and not pod.deleting
                    and pod.name not in self.promoted_spares
                ):
                    return pod  # signalled already (it may have left Standby): finish its promotion
                if (
                    pod.name not in self.promoted_spares
                    and p.is_standby_spare(pod, lease, self.ft, self.now)
                    and lease is not None
                    and lease.assigned_slot is None
                    and pod.node not in self.st.quarantined_nodes
                ):
                    candidates.append(pod)
        return candidates[0] if candidates else None

    def keep_spares(self) -> None:
        by_index = {s.index: s for s in self.st.spares}
        out: list[SpareStatus] = []
        for index in range(self.spec.hot_spares):
            entry = by_index.get(index) or SpareStatus(index=index)
            pods = [q for q in self.spares.get(index, []) if q.name not in self.promoted_spares]
            entry.attempt = max([entry.attempt, *(q.attempt for q in pods)])
            current = next((q for q in pods if q.attempt == entry.attempt), None)
            signalled = self.lease(current) if current is not None else None
            lost = current is not None and (
                p.node_fault(current, self.obs.nodes, self.obs.nodes_known) is not None
                # Signalled to join a slot but not promoted into one (a lost relabel whose slot was
                # filled otherwise): it must not stay, or two pods would serve that slot.
                or (signalled is not None and signalled.assigned_slot is not None)
            )
            if current is not None and (current.terminal or lost):
                self.delete(current, 0)
            if current is None or current.terminal or current.deleting or lost:
                if entry.pod or current is not None:  # that attempt was used: promoted, failed, deleted
                    entry.attempt += 1
                entry.pod, entry.node, entry.state = "", "", SlotState.PENDING
                if not any(q.live and not q.deleting and q is not current for q in pods):
                    self.d.actions.append(CreateSparePod(index, entry.attempt, self.avoid_nodes()))
            else:
                entry.pod, entry.node = current.name, current.node
                entry.state = (
                    PodState.STANDBY
                    if p.is_standby_spare(current, self.lease(current), self.ft, self.now)
                    else (SlotState.STARTING if current.phase == "Running" else SlotState.PENDING)
                )
            out.append(entry)
        for index, pods in self.spares.items():
            if index >= self.spec.hot_spares:
                for pod in pods:
                    if pod.live:
                        self.delete(pod, None)
        self.st.spares = out

    # --- endings -----------------------------------------------------------------------------------
    def fail(self, reason: str, message: str) -> None:
        self.delete_live_pods({contract.ROLE_WORKER, contract.ROLE_SPARE, contract.ROLE_RENDEZVOUS})
        self.close_degraded()
        self.cond(ConditionType.FAILED, True, reason, message)
        self.cond(ConditionType.RUNNING, False, reason, "")
        self.cond(ConditionType.RECOVERING, False, reason, "")
        self.cond(ConditionType.DEGRADED, False, reason, "")  # no stale Degraded on a failed job
        if reason != reasons.NO_PROGRESS and is_true(self.st.conditions, ConditionType.STALLED):
            self.cond(ConditionType.STALLED, False, reason, "")
        for slot in self.slots:
            slot.recovering_since, slot.recovering_level = None, ""
        self.st.completion_time = self.st.completion_time or self.now
        self.st.state, self.st.reason = JobState.FAILED, reason
        self.st.nodes_ready = 0
        self.event(WARNING, reason, f"job failed: {message}; running pods deleted, nothing restarted")

    def succeed(self) -> None:
        self.delete_live_pods({contract.ROLE_SPARE, contract.ROLE_RENDEZVOUS})
        self.close_degraded()
        self.collect_checkpoint()
        self.cond(ConditionType.SUCCEEDED, True, reasons.ALL_PODS_SUCCEEDED, "every worker pod succeeded")
        self.cond(ConditionType.RUNNING, False, reasons.FINISHED, "")
        self.cond(ConditionType.RECOVERING, False, reasons.FINISHED, "")
        self.cond(ConditionType.DEGRADED, False, reasons.FINISHED, "")
        self.st.completion_time = self.st.completion_time or self.now
        self.st.state, self.st.reason = JobState.SUCCEEDED, reasons.ALL_PODS_SUCCEEDED
        self.st.nodes_ready = 0
        for slot in self.slots:
            slot.recovering_since, slot.recovering_level = None, ""
        self.event(NORMAL, reasons.ALL_PODS_SUCCEEDED, "job succeeded: every worker pod exited 0")

    # --- summary ---------------------------------------------------------------------------------
    def collect_checkpoint(self) -> None:
        best = self.st.last_checkpoint
        for lease in self.obs.leases.values():
            ref = lease.heartbeat.checkpoint if lease.heartbeat is not None else None
            if ref is not None and (best is None or ref.step > best.step):
                best = CheckpointStatus(step=ref.step, time=ref.time)
        self.st.last_checkpoint = best
        measured = [
            lease.heartbeat.persist_seconds
            for lease in self.obs.leases.values()
            if lease.heartbeat is not None and lease.heartbeat.persist_seconds is not None
        ]
        if measured:
            self.st.persist_seconds = max(self.st.persist_seconds or 0.0, *measured)

    def close_degraded(self) -> None:
        if self.st.degraded_since is not None:
            self.st.lost_seconds = round(
                self.st.lost_seconds + p.seconds_since(self.st.degraded_since, self.now), 3
            )
            self.st.degraded_since = None

    def summarize(self) -> None:
        self.collect_checkpoint()
        training = {contract.PodState.TRAINING.value, contract.PodState.CHECKPOINTING.value}
        ready = sum(1 for s in self.slots if s.state in training)
        running = sum(1 for s in self.slots if s.state not in SLOT_STATES_WITHOUT_POD)
        self.st.nodes_ready = ready
        # A pod that runs but has not heartbeated (or whose Lease is gone) is not known to train.
        renewing = {slot.slot for slot, _renew in self.renewals}
        starting = sum(1 for s in self.slots if s.state == SlotState.STARTING and s.slot not in renewing)
        if running and self.st.start_time is None:
            self.st.start_time = self.now
        recovering = [s for s in self.slots if s.recovering_since is not None]
        if recovering and self.st.degraded_since is None:
            self.st.degraded_since = min(s.recovering_since for s in recovering if s.recovering_since)
        if not recovering:
            self.close_degraded()
        nodes = self.spec.nodes
        all_running = running == nodes
        all_heartbeating = all_running and len(renewing) == nodes
        self.cond(
            ConditionType.RUNNING,
            all_heartbeating,
            reasons.ALL_PODS_RUNNING
            if all_heartbeating
            else (reasons.PODS_STARTING if all_running else reasons.PODS_PENDING),
            f"{running}/{nodes} pods running, {len(renewing)} heartbeating, {ready} training",
        )
        if recovering:
            latest = max(recovering, key=lambda s: s.recovering_since or self.now)
            reason = {
                reasons.LEVEL_IN_PROCESS: reasons.IN_PROCESS_RESTART,
                reasons.LEVEL_IN_JOB: reasons.IN_JOB_RESTART,
            }.get(latest.recovering_level, latest.last_fault_reason or reasons.POD_RESCHEDULED)
            self.cond(
                ConditionType.RECOVERING,
                True,
                reason,
                "slots recovering: " + ", ".join(str(s.slot) for s in recovering),
            )
        else:
            self.cond(ConditionType.RECOVERING, False, reasons.NOT_RECOVERING, "")
        if self.stale_heartbeats:
            if _condition_reason(self.old.conditions, ConditionType.DEGRADED) != reasons.HEARTBEATS_STALE:
                self.event(WARNING, reasons.HEARTBEATS_STALE, self.stale_heartbeats)
            self.cond(ConditionType.DEGRADED, True, reasons.HEARTBEATS_STALE, self.stale_heartbeats)
        else:
            degraded = not all_running
            self.cond(
                ConditionType.DEGRADED,
                degraded,
                reasons.PODS_PENDING if degraded else reasons.ALL_PODS_RUNNING,
                f"{nodes - running} of {nodes} slots without a running pod" if degraded else "",
            )
        if recovering:
            self.st.state, self.st.reason = (
                JobState.RECOVERING,
                next(c.reason for c in self.st.conditions if c.type == ConditionType.RECOVERING),
            )
        elif all_heartbeating:
            self.st.state, self.st.reason = JobState.RUNNING, reasons.ALL_PODS_RUNNING
        elif all_running and starting:
            self.st.state, self.st.reason = JobState.STARTING, reasons.PODS_STARTING
        elif all_running:
            self.st.state, self.st.reason = JobState.RUNNING, reasons.PODS_NOT_HEARTBEATING
        else:
            self.st.state, self.st.reason = JobState.PENDING, reasons.PODS_PENDING


def _condition_reason(conditions: list[Condition], type_: str) -> str:
    """The reason of a True condition of this type, else ""."""
    c = get_condition(conditions, type_)
    return c.reason if c is not None and c.status == "True" else ""


def decide(
    job: ResilientTrainingJob, observed: Observed, now: datetime, config: LadderConfig | None = None
) -> Decision:
    """The next actions, the new status and the events for one job. Pure: no I/O, clock passed in."""
    return _Pass(job, observed, now, config or LadderConfig()).run()


def goodput(status: JobStatus, now: datetime) -> float | None:
    """Productive fraction of wall time since the job first ran: 1 - lost / elapsed, where lost is
    the time some slot spent recovering (fault detected -> back to Training). Work redone from the
    last checkpoint after a restart is not subtracted (the heartbeat steps would show it; a later
    refinement)."""
    if status.start_time is None:
        return None
    end = status.completion_time or now
    elapsed = (end - status.start_time).total_seconds()
    if elapsed <= 0:
        return None
    lost = status.lost_seconds
    if status.degraded_since is not None:
        lost += p.seconds_since(status.degraded_since, end)
    return max(0.0, min(1.0, 1.0 - lost / elapsed))
