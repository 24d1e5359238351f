"""Policy: how a job ends: Failed (pods deleted, nothing restarted), Succeeded, and what a
finished job still does (pods cleaned up, TTL)."""

from __future__ import annotations

from rtj import contract, reasons
from rtj.api.models import (
    ConditionType,
    JobState,
)
from rtj.ladder import incidents, summary
from rtj.ladder import predicates as p
from rtj.ladder.actions import (
    DeleteJob,
)
from rtj.ladder.conditions import is_true
from rtj.ladder.pass_state import NORMAL, WARNING, Pass


def fail(ps: Pass, reason: str, message: str) -> None:
    incidents.failed(ps, reason, message)
    ps.delete_live_pods({contract.ROLE_WORKER, contract.ROLE_SPARE, contract.ROLE_RENDEZVOUS})
    summary.close_degraded(ps)
    ps.cond(ConditionType.FAILED, True, reason, message)
    ps.cond(ConditionType.RUNNING, False, reason, "")
    ps.cond(ConditionType.RECOVERING, False, reason, "")
    ps.cond(ConditionType.DEGRADED, False, reason, "")  # no stale Degraded on a failed job
    if reason != reasons.NO_PROGRESS and is_true(ps.st.conditions, ConditionType.STALLED):
        ps.cond(ConditionType.STALLED, False, reason, "")
    for slot in ps.slots:
        slot.recovering_since, slot.recovering_level = None, ""
    ps.st.completion_time = ps.st.completion_time or ps.now
    ps.st.state, ps.st.reason = JobState.FAILED, reason
    ps.st.nodes_ready = 0
    ps.event(WARNING, reason, f"job failed: {message}; running pods deleted, nothing restarted")


def succeed(ps: Pass, reason: str, message: str) -> None:
    """Every worker pod exited 0, or (rtj.ladder.training_finished) one did and the others' ranks had
    finished before their pods were stopped."""
    ps.delete_live_pods({contract.ROLE_SPARE, contract.ROLE_RENDEZVOUS})
    summary.close_degraded(ps)
    summary.collect_checkpoint(ps)
    ps.cond(ConditionType.SUCCEEDED, True, reason, message)
    ps.cond(ConditionType.RUNNING, False, reasons.FINISHED, "")
    ps.cond(ConditionType.RECOVERING, False, reasons.FINISHED, "")
    ps.cond(ConditionType.DEGRADED, False, reasons.FINISHED, "")
    ps.st.completion_time = ps.st.completion_time or ps.now
    ps.st.state, ps.st.reason = JobState.SUCCEEDED, reason
    ps.st.nodes_ready = 0
    for slot in ps.slots:
        slot.recovering_since, slot.recovering_level = None, ""
    ps.event(NORMAL, reason, f"job succeeded: {message}")


def finished(ps: Pass) -> None:
    failed = is_true(ps.old.conditions, ConditionType.FAILED)
    roles = (
        {contract.ROLE_WORKER, contract.ROLE_SPARE, contract.ROLE_RENDEZVOUS}
        if failed
        else {contract.ROLE_SPARE, contract.ROLE_RENDEZVOUS}
    )
    ps.delete_live_pods(roles)
    if is_true(ps.old.conditions, ConditionType.DEGRADED):  # consistent with the job's end
        ps.cond(ConditionType.DEGRADED, False, reasons.FINISHED, "")
    if p.ttl_expired(ps.st.completion_time, ps.spec.ttl_seconds_after_finished, ps.now):
        ps.d.actions.append(DeleteJob())
    else:
        ps.due_at(p.ttl_deadline(ps.st.completion_time, ps.spec.ttl_seconds_after_finished))
