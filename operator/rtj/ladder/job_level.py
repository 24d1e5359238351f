"""Faults that are the job's, not the pods': recovered once, at job level.

When the rendezvous pod dies, every worker's ft_launcher fails (exit 70, RendezvousConnectionError)
within seconds. Before this policy each worker was its own hard fault: a pod reschedule each and
its (healthy) node quarantined each; a 4-node job with the default budget was Failed 8.7 s after
the kill (issue 13, case 1). Likewise several workers failing in the same pass share a cause.

Policy. A worker symptom (pod failed, launcher budget exhausted, heartbeat silent, pod-reported hard
fault) is job-level when
- it comes within `window_seconds` after a job-level fault began (status.jobFaultTime: set when the
  rendezvous pod is seen lost or recreated), reason RendezvousRestart; or
- two or more workers show one in the same pass, reason PodsFailedTogether.
The rendezvous pod's own loss is the job-level fault itself: recreating it is counted here too
(Event RendezvousLost), never as a pod reschedule, and the workers' failures that follow in the
window are the same incident, not counted again.
A job-level fault replaces the pods concerned (their replacements rejoin the recreated rendezvous),
spends no pod budget and quarantines no node; it is counted once in status.restarts.job
(faultTolerance.maxJobRestarts), with one Warning Event and metric level Job. Node faults
(NodeNotReady, NodeLost), deletions and evictions are evidence about that pod or node and stay
per pod. Exactly once: the count is committed with the attempts of the replacements; a lost status
write may lose the job count (their cause annotation, a job-level reason, is never counted as a pod
reschedule), never double it.
"""

from __future__ import annotations

from datetime import datetime

from rtj import reasons
from rtj.api.models import FaultTolerance, JobStatus

#: Worker fault reasons that a job-level cause explains. PeersNotReady too: a worker whose launcher
#: fails in the window while its peers' replacements are still pending is the same incident (the
#: rendezvous pod's loss), not a fault of its own; alone, it never makes PodsFailedTogether.
SYMPTOMS = frozenset(
    {
        reasons.POD_FAILED,
        reasons.LAUNCHER_BUDGET_EXHAUSTED,
        reasons.HEARTBEAT_TIMEOUT,
        reasons.POD_REPORTED_HARD_FAULT,
        reasons.PEERS_NOT_READY,
    }
)


def window_seconds(ft: FaultTolerance) -> float:
    """How long after a job-level fault began worker failures are attributed to it: the workers
    notice a lost store within a heartbeat timeout or two (8.7 s in issue 13)."""
    return 2.0 * ft.heartbeat_timeout_seconds


def in_window(status: JobStatus, ft: FaultTolerance, now: datetime) -> bool:
    began = status.job_fault_time
    return began is not None and 0 <= (now - began).total_seconds() <= window_seconds(ft)


def begin(status: JobStatus, ft: FaultTolerance, now: datetime) -> None:
    """A job-level fault began now (unless one began within the window already)."""
    if not in_window(status, ft, now):
        status.job_fault_time = now


def attribute(fault_reasons: list[str], status: JobStatus, ft: FaultTolerance, now: datetime) -> str | None:
    """The job-level reason for this pass's worker symptoms, or None (they stay per pod)."""
    symptoms = [r for r in fault_reasons if r in SYMPTOMS]
    if not symptoms:
        return None
    if in_window(status, ft, now):
        return reasons.RENDEZVOUS_RESTART
    if len([r for r in symptoms if r != reasons.PEERS_NOT_READY]) >= 2:
        return reasons.PODS_FAILED_TOGETHER
    return None


def needs_count(status: JobStatus) -> bool:
    """The ongoing job-level fault has not been counted yet."""
    return status.job_restart_time is None or (
        status.job_fault_time is not None and status.job_restart_time < status.job_fault_time
    )
