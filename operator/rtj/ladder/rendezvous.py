"""Policy: the job's rendezvous pod and Service: created, and recreated when lost as one job-level
recovery (rtj.ladder.job_level): maxJobRestarts, no pod budget, no quarantine."""

from __future__ import annotations

from rtj import contract, reasons
from rtj.ladder import incidents, job_level
from rtj.ladder.actions import (
    CreateRendezvousPod,
    CreateRendezvousService,
    RestartObserved,
)
from rtj.ladder.pass_state import WARNING, Pass


def reconcile(ps: Pass) -> None:
    if not ps.obs.service_exists:
        ps.d.actions.append(CreateRendezvousService())
    pod = ps.rdzv
    lost = pod is None or pod.terminal or ps.no_kubelet(pod)
    if lost and ps.st.rendezvous_pod_uid:
        # Counted when first seen lost; the uid cleared in the same status write, so the
        # replacement is adopted without a second count.
        name = pod.name if pod is not None else contract.rendezvous_name(ps.name)
        if not restart(ps, f"rendezvous pod {name} lost"):
            return
        ps.st.rendezvous_pod_uid = ""
    if pod is None:
        ps.d.actions.append(CreateRendezvousPod())
        return
    if lost:
        ps.delete(pod, 0)
        return
    if pod.uid and pod.uid != ps.st.rendezvous_pod_uid:
        # Another uid than the one counted: replaced by a pass whose status write was lost.
        if ps.st.rendezvous_pod_uid and not restart(ps, f"rendezvous pod {pod.name} was recreated"):
            return
        ps.st.rendezvous_pod_uid = pod.uid


def restart(ps: Pass, what: str) -> bool:
    """The rendezvous pod was lost: one job-level recovery (maxJobRestarts), no pod budget and no
    quarantine; False when the job budget is spent (the job fails)."""
    job_level.begin(ps.st, ps.ft, ps.now)
    if not job_level.needs_count(ps.st):  # this incident is counted already
        return True
    if ps.st.restarts.job + 1 > ps.ft.max_job_restarts:
        ps.failed = (
            reasons.JOB_RESTART_BUDGET_EXHAUSTED,
            f"{what}; maxJobRestarts={ps.ft.max_job_restarts} already used",
        )
        return False
    ps.st.restarts.job += 1
    ps.st.job_restart_time = ps.now
    ps.d.restarts.append(RestartObserved(reasons.LEVEL_JOB, reasons.RENDEZVOUS_LOST))
    incidents.rendezvous_lost(ps, f"{what}: recreated, the workers rejoin it")
    ps.event(
        WARNING,
        reasons.RENDEZVOUS_LOST,
        f"{what}: recreated, the workers rejoin it ({ps.st.restarts.job}/"
        f"{ps.ft.max_job_restarts} job restarts); no pod budget spent, no node quarantined",
    )
    return True
