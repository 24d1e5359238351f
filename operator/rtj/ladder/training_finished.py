"""Policy: once a worker pod has exited 0, no pod is created for the job again.

A worker pod exits 0 only when its launcher's ranks returned from the training script, and rank 0
returns only once every rank has (rtj_trainer.inprocess.finish_together). A pod created after that
would wait for a rendezvous no peer joins again. `make demo`, 2026-12-02: a healthy pod was replaced
during an API server stall, the job finished without it, and the replacement waited alone (the job
stayed Recovering until the progress watchdog's hour).

A pod whose heartbeat says Finished (every one of its ranks returned from the training script) is
as final: its ranks can only have returned after the last step's collectives, which every rank of the
job took part in, and its launcher now waits in ft_launcher's exit barrier, not in a rendezvous a new
pod could join (e2e, 2026-12-04: a pod deleted as the job finished was replaced; the replacement
waited alone and the peer lingered in the exit barrier for its 300 s).

So, from the first pass that sees a worker Succeeded, or a live worker's ranks Finished
(status.trainingFinishedTime):
- a fault in another slot (silence, a failed, deleted or evicted pod, a lost node) stops that slot:
  its pod is deleted if still live, nothing is created, no budget is spent, no node is quarantined.
  The slot shows Completed when its pod had reported its ranks finished (only its exit failed),
  else Failed;
- a slot without a pod gets none (Failed);
- pods still running are waited for, and the progress watchdog judges them as before: a job whose
  workers wait for a peer that exited 0 early still ends NoProgress (issue 13);
- once a slot is stopped, a pod whose ranks Finished is deleted (Completed): it would otherwise wait
  out the exit barrier (300 s) for the stopped slot's launcher, which never arrives;
- once no slot runs, the job ends: Succeeded/AllPodsSucceeded when every worker exited 0,
  Succeeded/TrainingFinished when the others had finished their training, else
  Failed/TrainingIncomplete (a slot stopped before its ranks finished: a replacement could not
  have rejoined).
"""

from __future__ import annotations

from rtj import reasons
from rtj.api.models import NodeSlotStatus, SlotState
from rtj.contract import PodState
from rtj.ladder import slots
from rtj.ladder.observe import PodObs
from rtj.ladder.pass_state import NORMAL, WARNING, Pass

#: Slot states of a finished job's slots: exited 0, or stopped (after its ranks finished, or before).
ENDED = frozenset({SlotState.SUCCEEDED, SlotState.COMPLETED, SlotState.FAILED})


def applies(ps: Pass) -> bool:
    """A worker has Succeeded or reported its ranks Finished (seen in this pass or before): record
    when training finished."""
    if ps.st.training_finished_time is None and any(
        s.state == SlotState.SUCCEEDED or _ranks_finished(ps, _current(ps, s)) for s in ps.slots
    ):
        ps.st.training_finished_time = ps.now
    return ps.st.training_finished_time is not None


def settle(ps: Pass, faults: list[tuple[NodeSlotStatus, PodObs | None, str, str]]) -> bool:
    """Stop the slots that can no longer finish. True when no slot is left running (the job ends)."""
    done = [s.slot for s in ps.slots if s.state == SlotState.SUCCEEDED]
    faulted = {slot.slot for slot, *_ in faults}
    finished = [s.slot for s in ps.slots if s.state == PodState.FINISHED and s.slot not in faulted]
    if done:
        why = f"slot {done[0]}'s pod exited 0"
    elif finished:
        why = f"slot {finished[0]}'s ranks finished training"
    else:
        why = "a worker finished training"
    for slot, pod, reason, message in faults:
        _stop(ps, slot, pod, reason, f"slot {slot.slot}: {message}; not replaced: {why}")
    for slot in ps.slots:
        if slot.state not in ENDED and _current(ps, slot) is None:
            _stop(
                ps,
                slot,
                None,
                reasons.TRAINING_INCOMPLETE,
                f"slot {slot.slot} has no pod; none created: {why}",
            )
    if any(s.state in (SlotState.COMPLETED, SlotState.FAILED) for s in ps.slots):
        for slot in ps.slots:
            pod = _current(ps, slot) if slot.state not in ENDED else None
            if pod is not None and _ranks_finished(ps, pod):
                _release(ps, slot, pod)
    return all(s.state in ENDED for s in ps.slots)


def outcome(ps: Pass) -> tuple[str, str]:
    """(reason, message) of the ended job: who was stopped, and whether it had finished."""
    finished = [str(s.slot) for s in ps.slots if s.state == SlotState.COMPLETED]
    failed = [str(s.slot) for s in ps.slots if s.state == SlotState.FAILED]
    if failed:
        return reasons.TRAINING_INCOMPLETE, (
            f"a worker finished training while slot(s) {', '.join(failed)} had not; they were stopped, "
            "not replaced (a new pod cannot join a finished rendezvous)"
        )
    if finished:
        return reasons.TRAINING_FINISHED, (
            f"every worker finished training; the pod(s) of slot(s) {', '.join(finished)} were stopped "
            "after their ranks finished (a fault, or a peer's launcher waiting for a stopped slot), not "
            "replaced"
        )
    return reasons.ALL_PODS_SUCCEEDED, "every worker pod exited 0"


def running_slots(ps: Pass) -> list[NodeSlotStatus]:
    """The slots the progress watchdog judges: a stopped slot does not disarm it."""
    return [s for s in ps.slots if s.state not in (SlotState.COMPLETED, SlotState.FAILED)]


def _current(ps: Pass, slot: NodeSlotStatus) -> PodObs | None:
    return next((q for q in ps.workers.get(slot.slot, []) if q.attempt == slot.attempt and q.live), None)


def _ranks_finished(ps: Pass, pod: PodObs | None) -> bool:
    """The pod's heartbeat says every one of its ranks returned from the training script."""
    lease = ps.lease(pod) if pod is not None else None
    return lease is not None and lease.heartbeat is not None and lease.heartbeat.state == PodState.FINISHED


def _release(ps: Pass, slot: NodeSlotStatus, pod: PodObs) -> None:
    """A finished pod whose launcher waits in the exit barrier for a stopped slot: deleted, Completed
    (not a fault: nothing is counted, no node named)."""
    ps.delete(pod, ps.cfg.fault_grace_seconds)
    slot.state = SlotState.COMPLETED
    slot.recovering_since, slot.recovering_level = None, ""
    ps.event(
        NORMAL,
        reasons.TRAINING_FINISHED,
        f"slot {slot.slot}: pod {pod.name}'s ranks finished and its launcher waits for a stopped slot in "
        "ft_launcher's exit barrier: deleted",
    )


def _stop(ps: Pass, slot: NodeSlotStatus, pod: PodObs | None, reason: str, message: str) -> None:
    was = next((s.state for s in ps.old.node_slots if s.slot == slot.slot), "")
    if was == SlotState.SUCCEEDED:  # exited 0 before (its pod deleted since): it stays so
        slot.state = SlotState.SUCCEEDED
        return
    if pod is not None and pod.live:
        ps.delete(pod, 0 if reason in slots.FORCE else ps.cfg.fault_grace_seconds)
    ranks_done = _ranks_finished(ps, pod) or was == PodState.FINISHED
    slot.state = SlotState.COMPLETED if ranks_done or was == SlotState.COMPLETED else SlotState.FAILED
    slot.last_fault_reason = reason
    slot.recovering_since, slot.recovering_level = None, ""
    if was not in ENDED:  # one Event per stopped slot (a later pass sees the same fault again)
        ps.note_fault(slot, reason, pod.name if pod is not None else slot.pod, slot.node)
        ps.event(WARNING, reason, message)
