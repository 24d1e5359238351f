"""The progress watchdog: a job whose pods all run but whose training step does not advance.

Heartbeats carry each pod's step. Before this policy a job could sit `Running AllPodsRunning` for
7+ minutes with the step frozen and no Event (issue 13, case 2: one worker's command returned 0
early, the other waited in an in-job restart for a rendezvous round that could never complete; the
same after a save slower than softTimeoutSeconds).

Policy. The watchdog is armed while every slot's pod runs or has Succeeded and at least one still
runs (pending or replacing pods are the ladder's business, not a stall), once some pod has reported
a step above 0 (a script that never reports steps is never judged). Progress is a new highest
step reported by any pod's heartbeat, beyond status.progressStep. Its time is the renewTime of the
first heartbeat seen reporting that step: the operator's Lease watch sees every renewal and keeps
the highest step with that time (rtj.ladder.observe.ProgressSeen, in memory), as passes run at
deadlines, not at every renewal; without it (a restarted operator) the earliest renewal of this
pass's heartbeats that report it (later, never earlier: a stall is never declared early). So a
freeze is timed from the first heartbeat after its last step, at most one heartbeat interval late.
status.lastProgressTime is when the step last rose, or when the watchdog was last not armed (the
clock starts again then); progressStep and lastProgressTime are written at most every `resolution`
seconds (the heartbeat-status resolution) or with the Stalled condition, so the watchdog costs no
status write per step.
- no progress for progressTimeoutSeconds: condition Stalled=True and one Warning Event Stalled,
  within progressTimeoutSeconds plus one heartbeat interval of the last step (the pass is due then);
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
from rtj.ladder.observe import ProgressSeen


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


def reached_at(
    step: int, seen: list[tuple[int, datetime]], remembered: ProgressSeen | None, now: datetime
) -> datetime:
    """When `step` was first seen: the remembered first heartbeat reporting it, else the earliest
    renewal of this pass reporting it (never after `now`)."""
    times = [renew for s, renew in seen if s == step]
    if remembered is not None and remembered.step == step:
        times.append(remembered.time)
    return min([*times, now])


def check(
    status: JobStatus,
    slots: list[NodeSlotStatus],
    seen: list[tuple[int, datetime]],
    remembered: ProgressSeen | None,
    ft: FaultTolerance,
    now: datetime,
    resolution: float,
) -> Verdict:
    """Update status.progressStep/lastProgressTime and judge the job. `seen`: (step, renewTime) of
    each slot's heartbeat in this pass; `remembered`: the highest step the Lease watch saw, and when."""
    newest = max((step for step, _renew in seen), default=None)
    last = status.last_progress_time
    due = last is None or (now - last).total_seconds() >= resolution
    if not armed(slots) or not (newest or status.progress_step):
        # Not judged: pods not all up, or no pod ever reported a step (a script that does not call
        # the reporter's step(): the watchdog cannot tell progress, so it never fails such a job).
        if due:
            status.last_progress_time = now  # the clock runs only while armed
        return Verdict(False, False)
    rose = newest is not None and (status.progress_step is None or newest > status.progress_step)
    since = last
    if rose and newest is not None:
        # Progress beyond the record: timed from when its step was first seen, not from this pass
        # (nor before the clock last started).
        reached = reached_at(newest, seen, remembered, now)
        since = reached if last is None else max(last, reached)
        if due:
            status.progress_step, status.last_progress_time = newest, since
    if since is None:
        status.last_progress_time = now
        return Verdict(False, False)
    silent = (now - since).total_seconds()
    stalls_at = p.after(since, ft.progress_timeout_seconds)
    if silent <= ft.progress_timeout_seconds:
        return Verdict(False, False, due=stalls_at)
    if rose:  # written with the Stalled condition: the record says what the verdict read
        status.progress_step, status.last_progress_time = newest, since
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
    fails_at = p.after(since, 2 * ft.progress_timeout_seconds)
    return Verdict(True, silent > 2 * ft.progress_timeout_seconds, message, due=fails_at)
