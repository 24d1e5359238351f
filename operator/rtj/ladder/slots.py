"""Policy: one node slot per pass: observe its pod, count soft restarts (levels 1-2), detect hard
faults and replace that one pod (level 3), or at job level (rtj.ladder.job_level); fill the slot."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from rtj import contract, reasons
from rtj.api.models import (
    NodeSlotStatus,
    NodeWrite,
    NodeWriteKind,
    SlotState,
)
from rtj.ladder import blame, in_place, incidents, job_level, missing_lease, node_writes, spares, suspect_node
from rtj.ladder import predicates as p
from rtj.ladder.actions import (
    AssignLease,
    CreateWorkerPod,
    PromoteSpare,
    RestartObserved,
)
from rtj.ladder.observe import LeaseObs, PodObs
from rtj.ladder.pass_state import NORMAL, WARNING, Pass

#: Faults whose pod is deleted without a grace period (rtj.ladder.blame: a silent pod is hung or
#: cut off, a graceful stop would not be answered; a node that is gone or NotReady has no kubelet).
FORCE = frozenset(c.reason for c in blame.CLASSES.values() if c.force)
#: A deletion still unfinished this long after its grace period ended will not be finished by a
#: kubelet: force it rather than keep the slot empty.
_OVERDUE_SECONDS = 2.0


#: A slot's fault this pass: its pod (None when it has none), the reason and the message.
Found = tuple[PodObs | None, str, str]


def observe(ps: Pass, slot: NodeSlotStatus) -> Found | None:
    """The slot's fault this pass as (pod, reason, message), classified by rtj.ladder.blame; None
    when there is none (the slot's state is updated: training, starting, waiting, ...). Each kind
    of observation has its function below, in the order they are tried."""
    current = current_pod(ps, slot)
    if current is None:
        return vanished(ps, slot)
    slot.pod, slot.node = current.name, current.node or slot.node
    lease = ps.lease(current)
    if current.phase == "Succeeded":
        slot.state = SlotState.SUCCEEDED
        return None
    if reported_permanent(ps, slot, current, lease):
        return None
    if current.phase == "Failed":
        return ended(ps, slot, current, lease)
    node = ps.node_verdict(current.node)
    if current.deleting and node is None:
        return being_deleted(current)
    if node is not None:
        return current, node.reason, node.message
    if waits(ps, slot, current):
        return None
    return live(ps, slot, current, lease)


def current_pod(ps: Pass, slot: NodeSlotStatus) -> PodObs | None:
    """The slot's pod of its current attempt, after adopting a newer one and deleting older ones."""
    pods = ps.workers.get(slot.slot, [])
    adopt_newer(ps, slot, max(pods, key=lambda q: q.attempt, default=None))
    for old in pods:
        if old.attempt < slot.attempt and old.live:
            ps.delete(old, ps.cfg.fault_grace_seconds)
    return next((q for q in pods if q.attempt == slot.attempt), None)


def vanished(ps: Pass, slot: NodeSlotStatus) -> Found | None:
    """No pod of the current attempt: a fault if the slot had one (its node's, else PodDeleted),
    else the slot waits for its pod."""
    if slot.pod:
        node = ps.node_verdict(slot.node)
        if node is not None:
            return None, node.reason, f"pod {slot.pod} disappeared: {node.message}"
        return None, reasons.POD_DELETED, f"pod {slot.pod} disappeared"
    slot.state = SlotState.PENDING if slot.state not in (SlotState.REPLACING,) else slot.state
    return None


def reported_permanent(ps: Pass, slot: NodeSlotStatus, current: PodObs, lease: LeaseObs | None) -> bool:
    """The pod's heartbeat reported a permanent error: the job fails (ps.failed)."""
    permanent = p.reported_permanent_fault(lease)
    if permanent is None:
        return False
    fault = lease.heartbeat.fault if lease is not None and lease.heartbeat is not None else None
    if fault is not None and fault.reason == contract.FaultReason.CONTAINER_OOM_KILLED:
        ps.note_fault(slot, reasons.CONTAINER_OOM_KILLED, current.name, current.node)
        ps.failed = (
            reasons.CONTAINER_OOM_KILLED,
            f"slot {slot.slot}: pod {current.name}: {fault.message} "
            f"({ps.spec.resources.memory or 'no limit set'}): {blame.OOM_ADVICE}",
        )
        return True
    ps.note_fault(slot, reasons.PERMANENT_FAULT, current.name, current.node)
    ps.failed = (
        reasons.PERMANENT_FAULT,
        f"pod {current.name} (slot {slot.slot}) reported a permanent error, which no restart "
        f"can fix: {permanent}",
    )
    return True


def ended(ps: Pass, slot: NodeSlotStatus, current: PodObs, lease: LeaseObs | None) -> Found | None:
    """The pod Failed: a do-not-restart exit code fails the job, else the fault its node or its end
    is blamed on."""
    slot.state = SlotState.FAILED
    if p.is_do_not_restart(current, ps.ft):
        ps.note_fault(slot, reasons.DO_NOT_RESTART_EXIT_CODE, current.name, current.node)
        ps.failed = (
            reasons.DO_NOT_RESTART_EXIT_CODE,
            f"pod {current.name} (slot {slot.slot}) exited with do-not-restart code {current.exit_code}",
        )
        return None
    verdict = ps.node_verdict(current.node) or blame.ended(
        current, lease, ps.spec.resources.memory or "", ps.peers_waiting(slot)
    )
    return current, verdict.reason, verdict.message


def being_deleted(current: PodObs) -> Found:
    """The pod is being deleted on a healthy node: a disruption (eviction, preemption) or a deletion."""
    if current.disruption:
        return current, reasons.POD_DISRUPTED, f"pod {current.name} is being deleted: {current.disruption}"
    return current, reasons.POD_DELETED, f"pod {current.name} is being deleted"


def waits(ps: Pass, slot: NodeSlotStatus, current: PodObs) -> bool:
    """The pod waits for something no restart fixes (rtj.ladder.blame.waiting): the slot waits, or
    the job fails when that class says so (ps.failed). False when it does not wait."""
    waiting = blame.waiting(current, ps.ft, ps.now)
    if waiting is None:
        return False
    if waiting.cls.act == blame.Act.FAIL:
        ps.note_fault(slot, waiting.reason, current.name, current.node)
        ps.failed = (waiting.reason, f"slot {slot.slot}: {waiting.message}")
        return True
    slot.state = SlotState.WAITING
    ps.waiting.append((slot, waiting))
    return True


def adopt_newer(ps: Pass, slot: NodeSlotStatus, newest: PodObs | None) -> None:
    """A pod newer than the status knows was created (or promoted) by a pass whose status write was
    lost: adopt it and count it once, from its cause annotation."""
    if newest is None or newest.attempt <= slot.attempt:
        return
    cls = blame.of(newest.cause)
    lost = (
        f"pod {newest.name} (attempt {newest.attempt}) was created for {newest.cause} by a pass whose "
        "status write was lost: its evidence went with it"
    )
    if newest.cause in reasons.JOB_LEVEL_CAUSES:  # job level: no pod reschedule
        slot.last_fault_reason = newest.cause
        slot.recovering_since = slot.recovering_since or ps.now
        slot.recovering_level = reasons.LEVEL_JOB
        incidents.job_level_fault(ps, slot, slot.pod, slot.node, newest.cause, lost, counted=False)
    elif newest.cause and newest.cause not in reasons.NON_FAULT_CAUSES:
        if cls.disruption:
            ps.st.restarts.disruptions += 1
            ps.d.restarts.append(RestartObserved(reasons.LEVEL_DISRUPTION, newest.cause))
        elif cls.budget:
            ps.st.restarts.pod_reschedules += 1
            ps.d.restarts.append(RestartObserved(reasons.LEVEL_POD, newest.cause))
        slot.last_fault_reason = newest.cause
        slot.recovering_since = slot.recovering_since or ps.now
        slot.recovering_level = reasons.LEVEL_POD
        level = reasons.LEVEL_DISRUPTION if cls.disruption else reasons.LEVEL_POD
        incidents.replaced(ps, slot, slot.pod, slot.node, newest.cause, lost, level)
    slot.attempt, slot.pod = newest.attempt, ""
    slot.in_process_restarts = slot.in_job_restarts = slot.in_place_restarts = 0
    slot.last_heartbeat_time = slot.lease_missing_since = None  # a new pod: its own heartbeats


def live(
    ps: Pass, slot: NodeSlotStatus, current: PodObs, lease: LeaseObs | None
) -> tuple[PodObs, str, str] | None:
    """A pod that runs (or is starting): its in-place and soft restarts, its reported hard fault or
    its silence."""
    in_place.observe(ps, slot, current)
    count_soft(ps, slot, current, lease)
    hold_end = ps.st.heartbeat_hold_end_time
    lease_missing = current.phase == "Running" and missing_lease.applies(
        slot, lease is not None and lease.renew_time is not None
    )
    if lease_missing:
        silence = missing_lease.silence(slot, ps.ft, ps.now, hold_end)
    else:
        slot.lease_missing_since = None
        silence = p.heartbeat_silence(current, lease, ps.ft, ps.now, hold_end)
    if (hard := blame.reported(current, lease)) is not None:
        return current, hard.reason, hard.message
    if silence is not None:
        return current, silence[0], f"pod {current.name}: {silence[1]}"
    # Not silent yet: when it would be (a heartbeat's own deadline is in heartbeat_ages).
    if lease_missing:
        ps.due_at(missing_lease.deadline(slot, ps.ft, hold_end))
    else:
        ps.due_at(p.startup_deadline(current, lease, ps.ft, hold_end))
    if current.phase == "Pending" and current.created is not None:  # a pull or config wait's bound
        ps.due_at(p.after(current.created, ps.ft.container_wait_timeout_seconds + 1))
    renew = lease.renew_time if lease is not None else None
    if renew is not None:
        ps.d.heartbeat_ages[slot.slot] = p.seconds_since(renew, ps.now)  # the true age (a metric too)
        if hold_end is not None and hold_end > renew:  # its deadline counts from the hold's end
            ps.due_at(p.after(hold_end, ps.ft.heartbeat_timeout_seconds))
        if p.restarting_in_place(lease):  # its deadline is a start's (rtj.ladder.predicates)
            ps.due_at(p.after(renew, ps.ft.startup_timeout_seconds + 1))
    if current.phase != "Running":
        slot.state = SlotState.PENDING
    elif lease_missing:
        slot.state = SlotState.LEASE_MISSING
    elif lease is None or lease.heartbeat is None:
        slot.state = SlotState.STARTING
    elif lease.heartbeat.state == contract.PodState.CHECKPOINTING:
        slot.state = contract.PodState.TRAINING.value  # no status write per checkpoint and pod
    else:
        slot.state = lease.heartbeat.state.value
    if current.name in ps.promoted_spares or (
        current.role == contract.ROLE_WORKER
        and lease is not None
        and lease.heartbeat is not None
        and lease.heartbeat.state == contract.PodState.STANDBY
        and lease.assigned_slot != str(slot.slot)
    ):
        ps.d.actions.append(AssignLease(current.name, slot.slot))
    track_recovery(ps, slot, lease)
    refresh_heartbeat_time(ps, slot, lease)
    return None


def count_soft(ps: Pass, slot: NodeSlotStatus, pod: PodObs, lease: LeaseObs | None) -> None:
    """Soft restarts (levels 1-2) from the heartbeat's counters: per slot every one, in
    status.restarts one per incident (`_new_incident`)."""
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
        detected = hb.fault.time if hb.fault is not None and hb.fault.time <= ps.now else ps.now
        if slot.recovering_since is None:
            slot.recovering_since, slot.recovering_level = detected, level
        fault = f" ({hb.fault.reason}: {hb.fault.message})" if hb.fault is not None else ""
        evidence = f"pod {pod.name} reported {delta} {level} restart(s){fault or ', no fault'}"
        soft = SoftRestart(slot, pod.name, pod.node, level, reason, delta, evidence, detected)
        collateral = hb.fault is not None and hb.fault.reason in contract.COLLATERAL_FAULT_REASONS
        counted = False
        if collateral:
            ps.collateral.append(soft)  # counted after the pass's other slots: count_collateral
        elif _new_incident(ps, slot, level, detected):
            _count(ps, soft)
            counted = True
        else:
            incidents.echo(ps, detected)
        ps.note_fault(slot, hb.fault.reason if hb.fault is not None else reason, pod.name, pod.node)
        ps.event(
            NORMAL,
            reason,
            f"slot {slot.slot} pod {pod.name}: {delta} {level} restart(s), "
            f"{now_count} in this pod{fault}; pods untouched"
            + ("" if counted or collateral else "; part of an incident already counted"),
        )
    # Never backwards: a lower count (should not happen within one pod) resets the baseline.
    slot.in_process_restarts = hb.in_process_restarts
    slot.in_job_restarts = hb.in_job_restarts


@dataclass(frozen=True)
class SoftRestart:
    """One slot's soft restarts seen in this pass (rtj.ladder.slots.count_soft)."""

    slot: NodeSlotStatus
    pod: str
    node: str
    level: str
    reason: str
    delta: int
    evidence: str
    detected: datetime


def _count(ps: Pass, soft: SoftRestart) -> None:
    if soft.level == reasons.LEVEL_IN_PROCESS:
        ps.st.restarts.in_process += soft.delta
    else:
        ps.st.restarts.in_job += soft.delta
    ps.d.restarts.append(RestartObserved(soft.level, soft.reason, soft.delta))
    incidents.soft(ps, soft.slot, soft.pod, soft.node, soft.level, soft.evidence, soft.detected)


def count_collateral(ps: Pass) -> None:
    """Collateral reports (a peer failed, the launcher stopped this pod's ranks) are echoes of the
    incident their root cause's pod reports, counted or not yet; one counts only when no incident
    of its level lies within a heartbeat timeout: a hung rank reports nothing, and its peers'
    reports are all there is of that incident. Called once the pass has seen every slot."""
    for soft in sorted(ps.collateral, key=lambda s: s.detected):
        if _new_incident(ps, soft.slot, soft.level, soft.detected):
            _count(ps, soft)
        else:
            incidents.echo(ps, soft.detected)


def _new_incident(ps: Pass, slot: NodeSlotStatus, level: str, detected: datetime) -> bool:
    """Counters count incidents, not the pods that echo them. A soft restart is an echo of an incident
    already counted when it comes within a heartbeat timeout of the level's last counted incident, or
    while a pod or job-level recovery of another slot is under way (the peers of a replaced pod
    restart with it)."""
    around = (reasons.LEVEL_POD, reasons.LEVEL_JOB, reasons.LEVEL_IN_PLACE)
    if any(s is not slot and s.recovering_level in around for s in ps.slots):
        return False
    field = "in_process_incident_time" if level == reasons.LEVEL_IN_PROCESS else "in_job_incident_time"
    last = getattr(ps.st.restarts, field)
    if last is not None and abs((detected - last).total_seconds()) <= ps.ft.heartbeat_timeout_seconds:
        return False
    setattr(ps.st.restarts, field, detected)
    return True


def track_recovery(ps: Pass, slot: NodeSlotStatus, lease: LeaseObs | None) -> None:
    if slot.recovering_since is None or lease is None or lease.heartbeat is None or lease.renew_time is None:
        return
    if lease.heartbeat.state != contract.PodState.TRAINING or lease.renew_time < slot.recovering_since:
        return
    seconds = (lease.renew_time - slot.recovering_since).total_seconds()
    # The metrics observe each incident once, when the slot it began in recovers (rtj.ladder.incidents).
    cost = "".join(
        f"; incident {i.seq} ({i.reason}): "
        + (f"~{i.steps_lost} steps lost (estimate)" if i.steps_lost is not None else "steps lost unknown")
        for i in incidents.recovered(ps, slot, lease)
    )
    ps.event(
        NORMAL,
        reasons.RECOVERED,
        f"slot {slot.slot} back to Training {seconds:.1f}s after the fault ({slot.recovering_level}){cost}",
    )
    slot.recovering_since, slot.recovering_level = None, ""


def refresh_heartbeat_time(ps: Pass, slot: NodeSlotStatus, lease: LeaseObs | None) -> None:
    renew = lease.renew_time if lease is not None else None
    if renew is not None:
        ps.renewals.append((slot, renew))
    if lease is not None and lease.heartbeat is not None:
        ps.steps.append(lease.heartbeat.step)
        if renew is not None:
            ps.step_renewals.append((lease.heartbeat.step, renew))
        ps.memory_steps.append(lease.heartbeat.memory_snapshot_step)
        ps.replica_steps.append(lease.heartbeat.replica_step)


def apply_heartbeat_times(ps: Pass) -> None:
    """Heartbeat times reach status at `heartbeat_status_resolution_seconds`, for all slots at
    once: per-slot refreshes on their own phases would cost one status write per slot per period
    (8x the writes at 8 nodes; measured in bench/operator_scale.py)."""
    resolution = ps.cfg.heartbeat_status_resolution_seconds

    def due(slot: NodeSlotStatus, renew: datetime) -> bool:
        last = slot.last_heartbeat_time
        return last is None or (renew - last).total_seconds() >= resolution

    if any(due(slot, renew) for slot, renew in ps.renewals):
        seen_before = [s.last_heartbeat_time for s, _ in ps.renewals if s.last_heartbeat_time]
        before = max(seen_before, default=None)
        for slot, renew in ps.renewals:
            slot.last_heartbeat_time = renew
        if ps.steps:
            step, seen = max(ps.steps), max(renew for _, renew in ps.renewals)
            ps.st.steps_per_second = p.steps_per_second(ps.st.step, before, step, seen)
            ps.st.step = step
        ps.st.memory_snapshot_step = _every_slot(ps, ps.memory_steps)
        ps.st.replica_step = _every_slot(ps, ps.replica_steps)


def _every_slot(ps: Pass, held: list[int | None]) -> int | None:
    """The newest step every slot's heartbeat reports holding (None until every slot reports one)."""
    complete = len(held) == ps.spec.nodes and None not in held
    return min(s for s in held if s is not None) if complete else None


def _replace_pod(
    ps: Pass, slot: NodeSlotStatus, pod: PodObs | None, reason: str, force: bool, level: str
) -> tuple[str, str]:
    """The slot's pod is deleted and the slot moves to its next attempt (its pod is created by
    fill() once the old one is gone). Returns the old pod's name and node."""
    node = pod.node if pod is not None else slot.node
    ps.note_fault(slot, reason, pod.name if pod is not None else slot.pod, node)
    if pod is not None:
        ps.delete(pod, 0 if force else ps.cfg.fault_grace_seconds)
    old_name = slot.pod
    slot.attempt += 1
    slot.pod, slot.state, slot.last_fault_reason = "", SlotState.REPLACING, reason
    slot.in_process_restarts = slot.in_job_restarts = slot.in_place_restarts = 0
    slot.last_heartbeat_time = slot.lease_missing_since = None
    slot.recovering_since, slot.recovering_level = ps.now, level
    return old_name, node


def job_fault(
    ps: Pass, slot: NodeSlotStatus, pod: PodObs | None, message: str, reason: str, force: bool
) -> None:
    counted = job_level.needs_count(ps.st)
    if counted:
        if ps.st.restarts.job + 1 > ps.ft.max_job_restarts:
            ps.failed = (
                reasons.JOB_RESTART_BUDGET_EXHAUSTED,
                f"{reason}: slot {slot.slot}: {message}; maxJobRestarts={ps.ft.max_job_restarts} "
                "already used",
            )
            return
        ps.st.restarts.job += 1
        ps.st.job_restart_time = ps.now
        ps.d.restarts.append(RestartObserved(reasons.LEVEL_JOB, reason))
        cause = (
            "right after the rendezvous pod was lost"
            if reason == reasons.RENDEZVOUS_RESTART
            else "together with other workers"
        )
        ps.event(
            WARNING,
            reason,
            f"workers failed {cause}: recovered at job level ({ps.st.restarts.job}/"
            f"{ps.ft.max_job_restarts} job restarts); their pods are replaced and rejoin, no pod "
            "budget spent, no node quarantined",
        )
    old_name, node = _replace_pod(ps, slot, pod, reason, force, reasons.LEVEL_JOB)
    incidents.job_level_fault(ps, slot, old_name, node, reason, message, counted)
    ps.event(
        NORMAL,
        reason,
        f"slot {slot.slot}: {message}; replacing {old_name or 'pod'} with attempt {slot.attempt} (job level)",
    )


def hard_fault(
    ps: Pass, slot: NodeSlotStatus, pod: PodObs | None, reason: str, message: str, counted: bool = True
) -> None:
    """Act on the slot's classified fault (rtj.ladder.blame): fail the job, or replace its pod, spending
    the pod budget or counting a disruption; quarantine the node only on evidence against it.
    `counted` False: a pod of an incident already counted (the other end of a partition)."""
    cls = blame.of(reason)
    if cls.act == blame.Act.FAIL:
        ps.note_fault(slot, reason, pod.name if pod is not None else slot.pod, slot.node)
        ps.failed = (reason, f"slot {slot.slot}: {message}")
        return
    if not counted:
        spent = "part of an incident already counted: no budget spent"
    elif cls.budget:
        if p.budget_exhausted(ps.st.restarts.pod_reschedules + 1, ps.ft):
            ps.failed = (
                reasons.POD_RESCHEDULE_BUDGET_EXHAUSTED,
                f"slot {slot.slot}: {message}; maxPodReschedules={ps.ft.max_pod_reschedules} already used",
            )
            return
        ps.st.restarts.pod_reschedules += 1
        ps.d.restarts.append(RestartObserved(reasons.LEVEL_POD, reason))
        spent = f"{ps.st.restarts.pod_reschedules}/{ps.ft.max_pod_reschedules} reschedules"
    elif cls.disruption:
        ps.st.restarts.disruptions += 1
        ps.d.restarts.append(RestartObserved(reasons.LEVEL_DISRUPTION, reason))
        spent = f"a disruption, not a fault: no budget spent, {ps.st.restarts.disruptions} so far"
    else:
        spent = "no budget spent"
    lease = ps.lease(pod) if pod is not None else None
    old_name, node = _replace_pod(ps, slot, pod, reason, cls.force, reasons.LEVEL_POD)
    suspect_node.note(slot, reason, lease, node)
    level = reasons.LEVEL_DISRUPTION if cls.disruption else reasons.LEVEL_POD
    if counted:
        incidents.replaced(ps, slot, old_name, node, reason, message, level)
    else:
        incidents.echo(ps, ps.now)
    ps.event(
        WARNING,
        reason,
        f"slot {slot.slot}: {message}; replacing {old_name or 'pod'} with attempt {slot.attempt} ({spent})",
    )
    if not node:
        return
    if cls.node:
        if not (ps.correlated and reason in (reasons.NODE_NOT_READY, reasons.NODE_LOST)):
            quarantine(ps, node, reason, message)
    elif cls.recorded and not blame.user_code(lease):
        repeated = blame.repeated_on_node(ps.obs.nodes.get(node), ps.job_key, ps.now)
        if repeated is not None:
            quarantine(ps, node, repeated.reason, repeated.message)
        node_writes.decide(
            ps,
            NodeWrite(
                kind=NodeWriteKind.FAULT_RECORD, node=node, reason=reason, time=node_writes.write_time(ps.now)
            ),
        )


def quarantine(ps: Pass, node: str, reason: str, evidence: str) -> None:
    """Taint the node (the node's quarantine: every job's evidence recorded on it, lifted by
    rtj.ladder.quarantine when the node shows none at its check, never by deleting a job)."""
    if not ps.ft.quarantine_faulty_nodes:
        return
    seen = ps.obs.nodes.get(node)
    if seen is not None and seen.quarantined and node in ps.st.quarantined_nodes:
        return  # this job's evidence is on it already
    if node not in ps.st.quarantined_nodes:
        ps.st.quarantined_nodes = [*ps.st.quarantined_nodes, node]
    until = p.after(ps.now, ps.cfg.quarantine_seconds)
    node_writes.decide(
        ps,
        NodeWrite(
            kind=NodeWriteKind.QUARANTINE,
            node=node,
            reason=reason,
            message=evidence[:512],
            time=node_writes.write_time(ps.now),
            until=until,
            boot_id=seen.boot_id if seen is not None else "",
        ),
    )
    extended = seen is not None and seen.quarantined
    ps.event(
        WARNING,
        reasons.NODE_QUARANTINE_EXTENDED if extended else reasons.NODE_QUARANTINED,
        f"node {node} quarantined (taint {contract.QUARANTINE_TAINT_KEY}={reason}:NoSchedule) on "
        f"evidence against it: {evidence}; checked again in {ps.cfg.quarantine_seconds:.0f}s and lifted "
        "if it shows none, not when this job is deleted",
    )


def fill(ps: Pass, slot: NodeSlotStatus, cause: str | None) -> None:
    """Create (or promote a spare into) the slot's pod once no older pod of the slot is alive."""
    if slot.pod:
        return
    if any(q.attempt == slot.attempt for q in ps.workers.get(slot.slot, [])):
        return
    for q in ps.workers.get(slot.slot, []):
        overdue_at = p.after(q.delete_by, _OVERDUE_SECONDS) if q.delete_by is not None else None
        overdue = overdue_at is not None and ps.now > overdue_at
        if q.deleting:
            # No kubelet will finish a deletion whose grace period is long over (nor one on a node
            # that is not Ready or gone): force it, as `kubectl delete --force` would, or the slot
            # waits.
            ps.due_at(overdue_at)
            ps.delete(q, 0, force=overdue)
    if any(q.live or q.deleting for q in ps.workers.get(slot.slot, [])):
        slot.state = SlotState.REPLACING if slot.recovering_since else SlotState.PENDING
        return
    cause = cause or (
        slot.last_fault_reason if slot.recovering_since and slot.attempt > 0 else reasons.CAUSE_INITIAL
    )
    if cause not in reasons.NON_FAULT_CAUSES:
        spare = spares.standby(ps, slot.slot)
        if spare is not None:
            ps.promoted_spares.add(spare.name)
            ps.d.actions.append(PromoteSpare(spare.name, slot.slot, slot.attempt, cause))
            ps.d.actions.append(AssignLease(spare.name, slot.slot))
            ps.event(
                NORMAL,
                reasons.SPARE_PROMOTED,
                f"hot spare {spare.name} on node {spare.node} takes slot {slot.slot} "
                f"(attempt {slot.attempt})",
            )
            # slot.pod stays empty until the relabelled pod is observed in the slot.
            slot.node, slot.state = spare.node, SlotState.STARTING
            return
    budget = in_place.pod_budget(ps.job, ps.st.in_place_restart)
    ps.d.actions.append(
        CreateWorkerPod(slot.slot, slot.attempt, cause, ps.avoid_nodes(), budget, slot.suspect_node)
    )
