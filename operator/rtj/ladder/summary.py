"""Policy: the job's summary: nodesReady, Running/Recovering/Degraded conditions, the one-word
state, the newest checkpoint, lost time and goodput."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from rtj import contract, reasons
from rtj.api.models import (
    SLOT_STATES_WITHOUT_POD,
    CheckpointStatus,
    Condition,
    ConditionType,
    JobState,
    JobStatus,
    NodeSlotStatus,
    SlotState,
)
from rtj.ladder import incidents
from rtj.ladder import predicates as p
from rtj.ladder.conditions import get_condition
from rtj.ladder.pass_state import WARNING, Pass

#: The Recovering condition names at most this many slots (status.slotCounts counts them all).
RECOVERING_LISTED = 32


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


@dataclass(frozen=True)
class Counts:
    """How many slots are where, counted once per pass for every part of the summary."""

    nodes: int
    running: int  # slots with a pod
    ready: int  # slots whose pod trains (Training or Checkpointing)
    renewing: int  # slots whose Lease was renewed this pass
    starting: int  # slots with no heartbeat yet, or whose ranks have not begun training
    recovering: list[NodeSlotStatus]

    @property
    def all_running(self) -> bool:
        return self.running == self.nodes

    @property
    def all_training(self) -> bool:
        """Running only once the ranks train: every pod heartbeats and none is still starting."""
        return self.all_running and self.renewing == self.nodes and not self.starting


def count(ps: Pass) -> Counts:
    training = {contract.PodState.TRAINING.value, contract.PodState.CHECKPOINTING.value}
    return Counts(
        nodes=ps.spec.nodes,
        running=sum(1 for s in ps.slots if s.state not in SLOT_STATES_WITHOUT_POD),
        ready=sum(1 for s in ps.slots if s.state in training),
        # A pod that runs but has not heartbeated (or whose Lease is gone) is not known to train.
        renewing=len({slot.slot for slot, _renew in ps.renewals}),
        # "Starting": no heartbeat yet, or the pod's heartbeat says its ranks have not begun training.
        starting=sum(1 for s in ps.slots if s.state == SlotState.STARTING),
        recovering=[s for s in ps.slots if s.recovering_since is not None],
    )


def summarize(ps: Pass) -> None:
    collect_checkpoint(ps)
    c = count(ps)
    ps.st.nodes_ready = c.ready
    if c.running and ps.st.start_time is None:
        ps.st.start_time = ps.now
    track_degraded_time(ps, c.recovering)
    running_condition(ps, c)
    waiting_condition(ps)
    recovering_condition(ps, c.recovering)
    degraded_condition(ps, c)
    job_state(ps, c)


def track_degraded_time(ps: Pass, recovering: list[NodeSlotStatus]) -> None:
    """Degraded time opens when the first slot starts recovering and closes once none does."""
    if recovering and ps.st.degraded_since is None:
        ps.st.degraded_since = min(s.recovering_since for s in recovering if s.recovering_since)
    if not recovering:
        close_degraded(ps)


def running_condition(ps: Pass, c: Counts) -> None:
    if c.all_training:
        reason = reasons.ALL_PODS_RUNNING
    elif c.all_running:
        reason = reasons.PODS_STARTING
    else:
        reason = ps.waiting_reason or reasons.PODS_PENDING
    ps.cond(
        ConditionType.RUNNING,
        c.all_training,
        reason,
        f"{c.running}/{c.nodes} pods running, {c.renewing} heartbeating, {c.ready} training",
    )


def recovering_condition(ps: Pass, recovering: list[NodeSlotStatus]) -> None:
    """Condition Recovering: its reason is the level of the newest recovery (or that slot's fault)."""
    if not recovering:
        ps.cond(ConditionType.RECOVERING, False, reasons.NOT_RECOVERING, "")
        return
    latest = max(recovering, key=lambda s: s.recovering_since or ps.now)
    reason = {
        reasons.LEVEL_IN_PROCESS: reasons.IN_PROCESS_RESTART,
        reasons.LEVEL_IN_JOB: reasons.IN_JOB_RESTART,
    }.get(latest.recovering_level, latest.last_fault_reason or reasons.POD_RESCHEDULED)
    listed = ", ".join(str(s.slot) for s in recovering[:RECOVERING_LISTED])
    more = f" and {len(recovering) - RECOVERING_LISTED} more" if len(recovering) > RECOVERING_LISTED else ""
    ps.cond(ConditionType.RECOVERING, True, reason, f"slots recovering: {listed}{more}")


def degraded_condition(ps: Pass, c: Counts) -> None:
    """Condition Degraded: stale heartbeats (with an Event when that begins), else slots without a pod."""
    if ps.stale_heartbeats:
        if condition_reason(ps.old.conditions, ConditionType.DEGRADED) != reasons.HEARTBEATS_STALE:
            ps.event(WARNING, reasons.HEARTBEATS_STALE, ps.stale_heartbeats)
        ps.cond(ConditionType.DEGRADED, True, reasons.HEARTBEATS_STALE, ps.stale_heartbeats)
        return
    degraded = not c.all_running
    ps.cond(
        ConditionType.DEGRADED,
        degraded,
        (ps.waiting_reason or reasons.PODS_PENDING) if degraded else reasons.ALL_PODS_RUNNING,
        f"{c.nodes - c.running} of {c.nodes} slots without a running pod" if degraded else "",
    )


def job_state(ps: Pass, c: Counts) -> None:
    """The one-word state and its reason, after the conditions of this pass are set."""
    if c.recovering:
        ps.st.state, ps.st.reason = (
            JobState.RECOVERING,
            next(cond.reason for cond in ps.st.conditions if cond.type == ConditionType.RECOVERING),
        )
    elif c.all_training:
        ps.st.state, ps.st.reason = JobState.RUNNING, reasons.ALL_PODS_RUNNING
    elif c.all_running and c.starting:
        ps.st.state, ps.st.reason = JobState.STARTING, reasons.PODS_STARTING
    elif c.all_running:
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
