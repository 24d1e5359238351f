"""The progress watchdog: a job whose pods all run but whose training step does not advance.

Heartbeats carry each pod's step. Before this policy a job could sit `Running AllPodsRunning` for
7+ minutes with the step frozen and no Event (issue 13, case 2: one worker's command returned 0
early, the other waited in an in-job restart for a rendezvous round that could never complete; the
same after a save slower than softTimeoutSeconds).

Policy. The watchdog is armed while every slot's pod runs or has Succeeded and at least one still
runs (pending or replacing pods are the ladder's business, not a stall), once some pod has reported
a step above 0 (a script that never reports steps is never judged). Progress is a new highest
step reported by any pod (status.progressStep). status.lastProgressTime is when it last rose, or
when the watchdog was last not armed; both are refreshed at most every `resolution` seconds (the
heartbeat-status resolution), so the watchdog costs no status write per step.
- no progress for progressTimeoutSeconds: condition Stalled=True and one Warning Event Stalled;
- for twice that: the job fails (reason NoProgress): nothing restarted, pods deleted. Its message
  names the workers that exited 0 while the others had not finished.

A worker pod that exits 0 is the training script finishing on that pod: never a fault and never
restarted (its slot is Succeeded). The job Succeeds when every worker has; workers that keep
running after a peer finished are watched like any others, so a job that cannot finish without
the missing peer ends NoProgress instead of hanging.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from rtj.api.models import SLOT_STATES_WITHOUT_POD, FaultTolerance, JobStatus, NodeSlotStatus, SlotState
from rtj.ladder import predicates as p


@dataclass(frozen=True)
class Verdict:
    stalled: bool
    failed: bool
    message: str = ""
    #: When the verdict next changes if no pod reports progress (Stalled, then failed).
    due: datetime | None = None


def armed(slots: list[NodeSlotStatus]) -> bool:
    """Every slot's pod runs or has finished, and one still runs."""
    return all(s.state not in SLOT_STATES_WITHOUT_POD for s in slots) and any(
        s.state != SlotState.SUCCEEDED for s in slots
    )


def check(
    status: JobStatus,
    slots: list[NodeSlotStatus],
    steps: list[int],
    ft: FaultTolerance,
    now: datetime,
    resolution: float,
) -> Verdict:
    """Update status.progressStep/lastProgressTime and judge the job."""
    newest = max(steps, default=None)
    last = status.last_progress_time
    due = last is None or (now - last).total_seconds() >= resolution
    if not armed(slots) or not (newest or status.progress_step):
        # Not judged: pods not all up, or no pod ever reported a step (a script that does not call
        # the reporter's step(): the watchdog cannot tell progress, so it never fails such a job).
        if due:
            status.last_progress_time = now  # the clock runs only while armed
        return Verdict(False, False)
    if newest is not None and (status.progress_step is None or newest > status.progress_step):
        if due:
            status.progress_step, status.last_progress_time = newest, now
        return Verdict(False, False)  # progress, perhaps not yet written
    if last is None:
        status.last_progress_time = now
        return Verdict(False, False)
    silent = (now - last).total_seconds()
    stalls_at = p.after(last, ft.progress_timeout_seconds)
    if silent <= ft.progress_timeout_seconds:
        return Verdict(False, False, due=stalls_at)
    finished = [s for s in slots if s.state == SlotState.SUCCEEDED]
    early = (
        f"; pod(s) {', '.join(s.pod or f'of slot {s.slot}' for s in finished)} exited 0 while the "
        "others had not finished"
        if finished
        else ""
    )
    beyond = status.progress_step if status.progress_step is not None else "none"
    message = (
        f"no pod reported a step beyond {beyond} for {silent:.0f}s "
        f"(progressTimeoutSeconds={ft.progress_timeout_seconds}){early}"
    )
    fails_at = p.after(last, 2 * ft.progress_timeout_seconds)
    return Verdict(True, silent > 2 * ft.progress_timeout_seconds, message, due=fails_at)
