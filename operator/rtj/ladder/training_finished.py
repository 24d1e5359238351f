"""Policy: once a worker pod has exited 0, training is over: no pod is created for the job again.

A worker pod exits 0 only when its launcher's ranks returned from the training script, and rank 0
returns only once every rank has (rtj_trainer.inprocess.finish_together): the other pods are in
their own teardown. A pod created now would wait for a rendezvous no peer joins again. `make demo`,
2026-12-02: a healthy pod was replaced during an API server stall, the job finished without it, and
the replacement waited alone (the job stayed Recovering).

So, from the first pass that sees a worker Succeeded (status.trainingFinishedTime):
- a fault in another slot (silence, a failed, deleted or evicted pod, a lost node) stops that slot:
  its pod is deleted if still live, nothing is created, no budget is spent, no node is quarantined;
- a slot without a pod gets none, and a pod still Starting (it never joined the finished round) is
  stopped;
- pods still running are waited for; the progress watchdog still ends a job whose workers wait for
  a peer that exited 0 early (issue 13), as before;
- once no slot runs, the job Succeeded: AllPodsSucceeded, or TrainingFinished naming the slots
  that were stopped (a training script exits 0 only when it is done).
"""

from __future__ import annotations

from rtj import reasons
from rtj.api.models import NodeSlotStatus, SlotState
from rtj.ladder import slots
from rtj.ladder.observe import PodObs
from rtj.ladder.pass_state import NORMAL, WARNING, Pass


def applies(ps: Pass) -> bool:
    """A worker has Succeeded (seen in this pass or before): record when training finished."""
    if ps.st.training_finished_time is None and any(s.state == SlotState.SUCCEEDED for s in ps.slots):
        ps.st.training_finished_time = ps.now
    return ps.st.training_finished_time is not None


def settle(ps: Pass, faults: list[tuple[NodeSlotStatus, PodObs | None, str, str]]) -> bool:
    """Stop the slots that can no longer finish. True when no slot is left running (the job ends)."""
    done = [s.slot for s in ps.slots if s.state == SlotState.SUCCEEDED]
    why = f"training finished (slot {done[0]}'s pod exited 0)" if done else "training finished"
    for slot, pod, reason, message in faults:
        _stop(ps, slot, pod, reason, f"slot {slot.slot}: {message}; not replaced: {why}")
    for slot in ps.slots:
        if slot.state in (SlotState.SUCCEEDED, SlotState.FAILED):
            continue
        pod = _current(ps, slot)
        if pod is None or not pod.live:
            message = f"slot {slot.slot} has no pod; none created: {why}"
            _stop(ps, slot, None, reasons.TRAINING_FINISHED, message)
        elif slot.state in (SlotState.STARTING, SlotState.PENDING):
            message = f"slot {slot.slot}: pod {pod.name} never joined the finished round: deleted ({why})"
            _stop(ps, slot, pod, reasons.TRAINING_FINISHED, message)
    return all(s.state in (SlotState.SUCCEEDED, SlotState.FAILED) for s in ps.slots)


def stopped_slots(ps: Pass) -> list[int]:
    return [s.slot for s in ps.slots if s.state != SlotState.SUCCEEDED]


def _current(ps: Pass, slot: NodeSlotStatus) -> PodObs | None:
    return next((q for q in ps.workers.get(slot.slot, []) if q.attempt == slot.attempt), None)


def _stop(ps: Pass, slot: NodeSlotStatus, pod: PodObs | None, reason: str, message: str) -> None:
    if pod is not None and pod.live:
        ps.delete(pod, 0 if reason in slots.FORCE else ps.cfg.fault_grace_seconds)
    was = next((s.state for s in ps.old.node_slots if s.slot == slot.slot), "")
    slot.state, slot.last_fault_reason = SlotState.FAILED, reason
    slot.recovering_since, slot.recovering_level = None, ""
    if was != SlotState.FAILED:  # one Event per stopped slot (a later pass sees the same fault again)
        ps.note_fault(slot, reason, pod.name if pod is not None else slot.pod, slot.node)
        ps.event(NORMAL if reason == reasons.TRAINING_FINISHED else WARNING, reason, message)
