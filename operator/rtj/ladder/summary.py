"""Policy: the job's summary: nodesReady, Running/Recovering/Degraded conditions, the one-word
state, the newest checkpoint, lost time and goodput."""

from __future__ import annotations

from datetime import datetime

from rtj import contract, reasons
from rtj.api.models import (
    SLOT_STATES_WITHOUT_POD,
    CheckpointStatus,
    Condition,
    ConditionType,
    JobState,
    JobStatus,
    SlotState,
)
from rtj.ladder import incidents
from rtj.ladder import predicates as p
from rtj.ladder.conditions import get_condition
from rtj.ladder.pass_state import WARNING, Pass


def collect_checkpoint(ps: Pass) -> None:
    best = ps.st.last_checkpoint
    for lease in ps.obs.leases.values():
        ref = lease.heartbeat.checkpoint if lease.heartbeat is not None else None
        if ref is not None and (best is None or ref.step > best.step):
            best = CheckpointStatus(step=ref.step, time=ref.time)
    ps.st.last_checkpoint = best
    measured = [
        lease.heartbeat.persist_seconds
        for lease in ps.obs.leases.values()
        if lease.heartbeat is not None and lease.heartbeat.persist_seconds is not None
    ]
    if measured:
        ps.st.persist_seconds = max(ps.st.persist_seconds or 0.0, *measured)


def close_degraded(ps: Pass) -> None:
    if ps.st.degraded_since is not None:
        ps.st.lost_seconds = round(ps.st.lost_seconds + p.seconds_since(ps.st.degraded_since, ps.now), 3)
        ps.st.degraded_since = None


def summarize(ps: Pass) -> None:
    collect_checkpoint(ps)
    training = {contract.PodState.TRAINING.value, contract.PodState.CHECKPOINTING.value}
    ready = sum(1 for s in ps.slots if s.state in training)
    running = sum(1 for s in ps.slots if s.state not in SLOT_STATES_WITHOUT_POD)
    ps.st.nodes_ready = ready
    # A pod that runs but has not heartbeated (or whose Lease is gone) is not known to train.
    renewing = {slot.slot for slot, _renew in ps.renewals}
    # "Starting": no heartbeat yet, or the pod's heartbeat says its ranks have not begun training.
    starting = sum(1 for s in ps.slots if s.state == SlotState.STARTING)
    if running and ps.st.start_time is None:
        ps.st.start_time = ps.now
    recovering = [s for s in ps.slots if s.recovering_since is not None]
    if recovering and ps.st.degraded_since is None:
        ps.st.degraded_since = min(s.recovering_since for s in recovering if s.recovering_since)
    if not recovering:
        close_degraded(ps)
    nodes = ps.spec.nodes
    all_running = running == nodes
    # Running only once the ranks train: every pod heartbeats and none is still starting.
    all_training = all_running and len(renewing) == nodes and not starting
    ps.cond(
        ConditionType.RUNNING,
        all_training,
        reasons.ALL_PODS_RUNNING
        if all_training
        else (reasons.PODS_STARTING if all_running else ps.waiting_reason or reasons.PODS_PENDING),
        f"{running}/{nodes} pods running, {len(renewing)} heartbeating, {ready} training",
    )
    waiting_condition(ps)
    if recovering:
        latest = max(recovering, key=lambda s: s.recovering_since or ps.now)
        reason = {
            reasons.LEVEL_IN_PROCESS: reasons.IN_PROCESS_RESTART,
            reasons.LEVEL_IN_JOB: reasons.IN_JOB_RESTART,
        }.get(latest.recovering_level, latest.last_fault_reason or reasons.POD_RESCHEDULED)
        ps.cond(
            ConditionType.RECOVERING,
            True,
            reason,
            "slots recovering: " + ", ".join(str(s.slot) for s in recovering),
        )
    else:
        ps.cond(ConditionType.RECOVERING, False, reasons.NOT_RECOVERING, "")
    if ps.stale_heartbeats:
        if condition_reason(ps.old.conditions, ConditionType.DEGRADED) != reasons.HEARTBEATS_STALE:
            ps.event(WARNING, reasons.HEARTBEATS_STALE, ps.stale_heartbeats)
        ps.cond(ConditionType.DEGRADED, True, reasons.HEARTBEATS_STALE, ps.stale_heartbeats)
    else:
        degraded = not all_running
        ps.cond(
            ConditionType.DEGRADED,
            degraded,
            (ps.waiting_reason or reasons.PODS_PENDING) if degraded else reasons.ALL_PODS_RUNNING,
            f"{nodes - running} of {nodes} slots without a running pod" if degraded else "",
        )
    if recovering:
        ps.st.state, ps.st.reason = (
            JobState.RECOVERING,
            next(c.reason for c in ps.st.conditions if c.type == ConditionType.RECOVERING),
        )
    elif all_training:
        ps.st.state, ps.st.reason = JobState.RUNNING, reasons.ALL_PODS_RUNNING
    elif all_running and starting:
        ps.st.state, ps.st.reason = JobState.STARTING, reasons.PODS_STARTING
    elif all_running:
        ps.st.state, ps.st.reason = JobState.RUNNING, reasons.PODS_NOT_HEARTBEATING
    else:
        ps.st.state, ps.st.reason = JobState.PENDING, ps.waiting_reason or reasons.PODS_PENDING


def waiting_condition(ps: Pass) -> None:
    """Condition Waiting: pods wait for something no restart fixes (rtj.ladder.blame), with how many
    slots wait and the evidence; an Event when the reason changes. No budget spent, nothing restarted."""
    if not ps.waiting:
        if condition_reason(ps.old.conditions, ConditionType.WAITING):
            ps.cond(ConditionType.WAITING, False, reasons.NOT_WAITING, "")
        return
    reason = ps.waiting_reason
    message = f"{len(ps.waiting)} of {ps.spec.nodes} slots wait: " + "; ".join(
        f"slot {slot.slot}: {verdict.message}" for slot, verdict in ps.waiting
    )
    if condition_reason(ps.old.conditions, ConditionType.WAITING) != reason:
        ps.event(WARNING, reason, f"{message}; nothing restarted, no budget spent")
        incidents.waited(ps, reason, message)
    ps.cond(ConditionType.WAITING, True, reason, message[:1024])


def condition_reason(conditions: list[Condition], type_: str) -> str:
    """The reason of a True condition of this type, else ""."""
    c = get_condition(conditions, type_)
    return c.reason if c is not None and c.status == "True" else ""


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
