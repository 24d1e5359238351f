"""Policy: the job's incidents: each fault once, however many pods echo it, with its class, its
evidence, what the ladder did and what it cost (status.incidents keeps the last INCIDENTS_KEPT;
`kubectl describe rtj` shows them). Their recoveries feed the metrics by class: rtj_recovery_seconds
{level, reason} and rtj_steps_lost_total (badput by cause).

An incident is what the counters count ("Counters count incidents", docs/fault-classes.md):
- a soft restart counted in status.restarts (rtj.ladder.slots): RestartedInProcess or RestartedInJob,
  reason InProcessRestart or InJobRestart, the pod's own fault in the message. A restart the counters
  take for an echo of it (a collateral cause, within a heartbeat timeout, a peer of a pod being
  replaced) adds a pod to the incident it echoes (`echo`), never an entry;
- pods replaced for one reason in one pass: Replaced (a fault, or a disruption: level Disruption),
  reason its fault class (rtj.ladder.blame), one entry however many pods;
- a job-level recovery (rtj.ladder.job_level): RecreatedRendezvous or ReplacedAtJobLevel, one entry;
  workers replaced in its window are pods of it (the first of them, for a rendezvous pod's loss, is
  the slot it is timed by);
- a new reason of condition Waiting: Waited, with the slots waiting;
- the job failing: Failed, with the reason it failed with.

Exactly once, by the rule of the counters (rtj.ladder.decide): an incident is written by the status
write of the pass that acts on it, with the counts and attempts that pass changes; a pass computed
again after a lost write observes the same fault again and records it once. A pod adopted from a
pass whose write was lost (rtj.ladder.slots.adopt_newer) is recorded from its cause annotation (the
evidence went with the lost write).

Recovery. When the pod of the slot an incident began in is back in Training (the slot's recovery
ends, rtj.ladder.slots.track_recovery), every incident of that slot recorded since its recovery
began (a job-level one: up to the job-level window before) is closed: recoverySeconds = that
heartbeat's renewTime - the incident's time, and stepsLost; each closed incident is one
RecoveryObserved for the metrics, labelled with its level and class. Pods that only echo an
incident close nothing: one exception in a 128-pod job is one recovery. An incident whose slot
faults again before it trained stays open (the newer incident is timed from its own fault), and so
does one pushed out of the list before it recovered.

Steps lost are an estimate: the heartbeats carry a pod's step, its newest memory snapshot, its peer
replica and its newest persisted checkpoint, not the step it resumed from. stepsLost = step -
resumeStep, where `step` is the newest step the job's pods reported when the fault was seen and
`resumeStep` the newest step its recovery could load: for an in-process restart the step itself (the
ranks keep their state); for an in-job restart the newest memory snapshot every pod held; for a
replaced pod the newest peer replica every pod held (for a rendezvous pod's loss, whose workers
restart in their pods, the memory snapshot); in every case at least the newest persisted
checkpoint known when it recovered (an emergency save of a graceful stop included), and at most the
step the recovered pod's heartbeat reports once it trains (when it reports one).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from rtj import reasons
from rtj.api.models import (
    INCIDENT_MESSAGE_MAX,
    INCIDENTS_KEPT,
    IncidentStatus,
    NodeSlotStatus,
)
from rtj.ladder import blame, job_level
from rtj.ladder.actions import RecoveryObserved
from rtj.ladder.observe import LeaseObs
from rtj.ladder.pass_state import Pass

RESTARTED_IN_PROCESS = "RestartedInProcess"
RESTARTED_IN_JOB = "RestartedInJob"
RESTARTED_IN_PLACE = "RestartedInPlace"
REPLACED = "Replaced"
REPLACED_AT_JOB_LEVEL = "ReplacedAtJobLevel"
RECREATED_RENDEZVOUS = "RecreatedRendezvous"
WAITED = "Waited"
FAILED = "Failed"
#: Actions whose incident recovers when the pod of its slot trains again.
RECOVERING = frozenset(
    {
        RESTARTED_IN_PROCESS,
        RESTARTED_IN_JOB,
        RESTARTED_IN_PLACE,
        REPLACED,
        REPLACED_AT_JOB_LEVEL,
        RECREATED_RENDEZVOUS,
    }
)
_SOFT = {reasons.LEVEL_IN_PROCESS: RESTARTED_IN_PROCESS, reasons.LEVEL_IN_JOB: RESTARTED_IN_JOB}

#: The reasons a metric is labelled with: the fault classes, the soft levels and the job-level
#: reasons (bounded; a training script's own fault reasons are in the incident's message).
LABELS = frozenset(blame.CLASSES) | {
    reasons.IN_PROCESS_RESTART,
    reasons.IN_JOB_RESTART,
    reasons.IN_PLACE_RESTART,
    reasons.RENDEZVOUS_LOST,
    reasons.RENDEZVOUS_RESTART,
    reasons.PODS_FAILED_TOGETHER,
}


def label(reason: str) -> str:
    """The metric label of an incident's reason (one LABELS knows not: Unclassified)."""
    return reason if reason in LABELS else reasons.UNCLASSIFIED


def _truncate(message: str) -> str:
    return message if len(message) <= INCIDENT_MESSAGE_MAX else message[: INCIDENT_MESSAGE_MAX - 1] + "…"


def job_step(ps: Pass) -> int | None:
    """The newest step the job's pods report in this pass (the pods of each slot's attempt as the
    pass found it, so that an older attempt's Lease from before a resume does not count), else the
    step in status."""
    attempts = {s.slot: s.attempt for s in ps.old.node_slots}
    steps = [
        lease.heartbeat.step
        for slot, pods in ps.workers.items()
        for pod in pods
        if pod.attempt >= attempts.get(slot, 0)
        and (lease := ps.lease(pod)) is not None
        and lease.heartbeat is not None
    ]
    return max(steps, default=ps.st.step)


def _every_pod(ps: Pass, held: list[int | None], fallback: int | None) -> int | None:
    """The newest step every slot's pod holds (`held`: one per slot's heartbeat); `fallback` (the
    status's, refreshed with the heartbeat times) while some slot's is unknown."""
    if len(held) < ps.spec.nodes or None in held:
        return fallback
    return min(s for s in held if s is not None)


def persisted_step(ps: Pass) -> int | None:
    """The newest persisted checkpoint known: in status, or in a heartbeat of this pass."""
    steps = [ps.st.last_checkpoint.step] if ps.st.last_checkpoint is not None else []
    steps += [
        lease.heartbeat.checkpoint.step
        for lease in ps.obs.leases.values()
        if lease.heartbeat is not None and lease.heartbeat.checkpoint is not None
    ]
    return max(steps, default=None)


def resumable_step(ps: Pass, level: str, step: int | None) -> int | None:
    """The newest step a recovery at `level` can load, as this pass's heartbeats show it (before the
    persisted tier, which `recovered` reads again when it recovers)."""
    if level == reasons.LEVEL_IN_PROCESS:
        return step  # the ranks keep their state (rtj_trainer.kept_state)
    attempts = {s.slot: s.attempt for s in ps.old.node_slots}
    hbs = [
        lease.heartbeat
        for slot, pods in ps.workers.items()
        for pod in pods
        if pod.attempt == attempts.get(slot, 0)
        and (lease := ps.lease(pod)) is not None
        and lease.heartbeat is not None
    ]
    if level in (reasons.LEVEL_IN_JOB, reasons.LEVEL_IN_PLACE):  # the pods' memory is kept
        tier = _every_pod(ps, [hb.memory_snapshot_step for hb in hbs], ps.st.memory_snapshot_step)
    else:  # a replaced pod's memory is gone: its peer's replica of it
        tier = _every_pod(ps, [hb.replica_step for hb in hbs], ps.st.replica_step)
    candidates = [s for s in (tier, persisted_step(ps)) if s is not None]
    return max(candidates) if candidates else None


def record(
    ps: Pass,
    reason: str,
    action: str,
    message: str,
    *,
    level: str = "",
    slot: NodeSlotStatus | None = None,
    pod: str = "",
    node: str = "",
    when: datetime | None = None,
    pods: int = 1,
) -> IncidentStatus:
    """A new incident, the newest of status.incidents (the oldest beyond INCIDENTS_KEPT dropped)."""
    kept = ps.st.incidents
    step = job_step(ps)
    incident = IncidentStatus(
        seq=kept[-1].seq + 1 if kept else 1,
        time=when or ps.now,
        reason=reason,
        level=level,
        action=action,
        slot=slot.slot if slot is not None else None,
        pod=pod,
        node=node,
        pods=pods,
        message=_truncate(message),
        step=step,
        # The rendezvous pod's loss restarts the workers' launchers in their pods: memory is kept.
        resume_step=resumable_step(
            ps, reasons.LEVEL_IN_JOB if action == RECREATED_RENDEZVOUS else level, step
        )
        if action in RECOVERING
        else None,
    )
    if action in _SOFT.values() and ps.pending_echoes:
        incident.pods += ps.pending_echoes  # echoes seen earlier in this pass
        ps.pending_echoes = 0
    ps.st.incidents = [*kept, incident][-INCIDENTS_KEPT:]
    ps.incidents_now[(reason, action)] = incident
    return incident


def soft(
    ps: Pass, slot: NodeSlotStatus, pod: str, node: str, level: str, evidence: str, when: datetime
) -> None:
    """A soft restart the counters counted (rtj.ladder.slots.count_soft)."""
    reason = reasons.IN_PROCESS_RESTART if level == reasons.LEVEL_IN_PROCESS else reasons.IN_JOB_RESTART
    if slot.recovering_since is not None and when < slot.recovering_since:
        when = slot.recovering_since  # part of the slot's recovery under way: closed with it
    record(ps, reason, _SOFT[level], evidence, level=level, slot=slot, pod=pod, node=node, when=when)


def _open(ps: Pass, incident: IncidentStatus) -> bool:
    """Its slot is still recovering since before it began."""
    return (
        incident.action in RECOVERING
        and incident.recovery_seconds is None
        and any(
            s.slot == incident.slot and s.recovering_since is not None and incident.time >= s.recovering_since
            for s in ps.slots
        )
    )


def echo(ps: Pass, when: datetime) -> None:
    """A soft restart the counters took for an echo: one more pod of the incident it echoes (the
    newest still open, or within a heartbeat timeout of it); if none is known yet, of the next soft
    incident this pass records (its root cause in a slot observed later); else of none."""
    timeout = ps.ft.heartbeat_timeout_seconds
    for incident in reversed(ps.st.incidents):
        near = incident.action in RECOVERING and abs((incident.time - when).total_seconds()) <= timeout
        if near or _open(ps, incident):
            incident.pods += 1
            return
    ps.pending_echoes += 1


def replaced(
    ps: Pass, slot: NodeSlotStatus, pod: str, node: str, reason: str, message: str, level: str
) -> None:
    """A pod replaced for a fault or a disruption (rtj.ladder.slots.hard_fault, adopt_newer): pods
    replaced for the same reason in the same pass are one incident."""
    same = ps.incidents_now.get((reason, REPLACED))
    if same is not None:
        same.pods += 1
        return
    record(ps, reason, REPLACED, message, level=level, slot=slot, pod=pod, node=node)


def job_level_fault(
    ps: Pass, slot: NodeSlotStatus, pod: str, node: str, reason: str, message: str, counted: bool
) -> None:
    """A worker replaced at job level (rtj.ladder.slots.job_fault): a new incident when the job
    restart was counted in this pass, else a pod of the job-level incident it belongs to (the
    rendezvous pod's loss, or workers that failed together, within the job-level window)."""
    if not counted:
        window = job_level.window_seconds(ps.ft)
        for incident in reversed(ps.st.incidents):
            if (
                incident.level == reasons.LEVEL_JOB
                and 0 <= (ps.now - incident.time).total_seconds() <= window
            ):
                incident.pods += 1
                if incident.slot is None:  # the rendezvous pod's loss: its first worker times it
                    incident.slot, incident.pod, incident.node = slot.slot, pod, node
                return
    same = ps.incidents_now.get((reason, REPLACED_AT_JOB_LEVEL))
    if same is not None:
        same.pods += 1
        return
    record(ps, reason, REPLACED_AT_JOB_LEVEL, message, level=reasons.LEVEL_JOB, slot=slot, pod=pod, node=node)


def rendezvous_lost(ps: Pass, message: str) -> None:
    """The rendezvous pod lost and recreated, one job-level recovery (rtj.ladder.rendezvous)."""
    record(ps, reasons.RENDEZVOUS_LOST, RECREATED_RENDEZVOUS, message, level=reasons.LEVEL_JOB)


def waited(ps: Pass, reason: str, message: str) -> None:
    """Condition Waiting took a new reason (rtj.ladder.summary.waiting_condition)."""
    first = ps.waiting[0][0] if ps.waiting else None
    record(
        ps,
        reason,
        WAITED,
        message,
        slot=first,
        pod=first.pod if first is not None else "",
        node=first.node if first is not None else "",
        pods=len(ps.waiting) or 1,
    )


def failed(ps: Pass, reason: str, message: str) -> None:
    """The job failed (rtj.ladder.endings.fail); the slot, pod and node of a fault noted in this pass."""
    fault = ps.st.last_fault if ps.st.last_fault is not None and ps.st.last_fault.time == ps.now else None
    slot = next((s for s in ps.slots if fault is not None and s.slot == fault.slot), None)
    record(
        ps,
        reason,
        FAILED,
        message,
        slot=slot,
        pod=fault.pod if fault is not None else "",
        node=fault.node if fault is not None else "",
    )


def recovered(ps: Pass, slot: NodeSlotStatus, lease: LeaseObs) -> list[IncidentStatus]:
    """The slot's pod is back in Training (its heartbeat renewed at lease.renew_time): close the
    incidents of the slot recorded since its recovery began, each one RecoveryObserved."""
    since, renew, hb = slot.recovering_since, lease.renew_time, lease.heartbeat
    if since is None or renew is None or hb is None:
        return []
    closed = []
    persisted = persisted_step(ps)
    window = timedelta(seconds=job_level.window_seconds(ps.ft))
    for incident in ps.st.incidents:
        # A job-level incident may have begun before its worker's recovery (the rendezvous pod's
        # loss, the worker replaced within the window after it).
        began = since - window if incident.level == reasons.LEVEL_JOB else since
        if (
            incident.slot != slot.slot
            or incident.action not in RECOVERING
            or incident.recovery_seconds is not None
            or incident.time < began
        ):
            continue
        seconds = max(0.0, (renew - incident.time).total_seconds())
        incident.recovery_seconds = round(seconds, 3)
        if incident.step is not None:
            resume = max(s for s in (incident.resume_step, persisted, 0) if s is not None)
            if hb.step > 0:  # the pod cannot have resumed later than the step it reports
                resume = min(resume, hb.step)
            incident.resume_step = min(resume, incident.step)
            incident.steps_lost = incident.step - incident.resume_step
        level = incident.level or reasons.LEVEL_POD
        ps.d.recoveries.append(RecoveryObserved(level, seconds, label(incident.reason), incident.steps_lost))
        closed.append(incident)
    return closed
