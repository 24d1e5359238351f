"""Small named predicates the ladder is built from (each one table-tested through decide)."""

from __future__ import annotations

from datetime import datetime, timedelta

from rtj import contract, reasons
from rtj.api.models import FaultTolerance
from rtj.ladder.observe import LeaseObs, PodObs


def seconds_since(then: datetime, now: datetime) -> float:
    return max(0.0, (now - then).total_seconds())


def after(then: datetime, seconds: float) -> datetime:
    """`then` + `seconds`, or the last representable time for a `then` near year 9999 (a deadline
    that never comes, not an OverflowError: the fuzz test draws such times)."""
    try:
        return then + timedelta(seconds=seconds)
    except OverflowError:
        return datetime.max.replace(tzinfo=then.tzinfo)


def is_do_not_restart(pod: PodObs, ft: FaultTolerance) -> bool:
    return (
        pod.phase == "Failed" and pod.exit_code is not None and pod.exit_code in ft.do_not_restart_exit_codes
    )


def failed_pod_reason(pod: PodObs) -> str:
    """Reason for a Failed pod whose exit code allows a restart."""
    if pod.status_reason == "Evicted":
        return reasons.POD_EVICTED
    if pod.exit_code == contract.ExitCode.LAUNCHER_BUDGET_EXHAUSTED:
        return reasons.LAUNCHER_BUDGET_EXHAUSTED
    return reasons.POD_FAILED


def timed_from(heard: datetime | None, hold_end: datetime | None) -> datetime | None:
    """When a slot's silence starts counting: its last sign of life, or the end of the last outage
    hold if that is later (no pod could renew while the heartbeat path was down; see
    rtj.ladder.outage_hold)."""
    if heard is None or hold_end is None:
        return heard
    return max(heard, hold_end)


def startup_deadline(
    pod: PodObs, lease: LeaseObs | None, ft: FaultTolerance, hold_end: datetime | None = None
) -> datetime | None:
    """When a Running pod that never heartbeated counts as silent (None: not Running, or it heartbeats)."""
    if pod.phase != "Running" or (lease is not None and lease.renew_time is not None):
        return None
    since = timed_from(pod.started or pod.created, hold_end)
    return after(since, ft.startup_timeout_seconds) if since is not None else None


def heartbeat_silence(
    pod: PodObs, lease: LeaseObs | None, ft: FaultTolerance, now: datetime, hold_end: datetime | None = None
) -> tuple[str, str] | None:
    """(reason, message) when a Running pod's heartbeat is overdue, else None.

    Before the first heartbeat the deadline is startupTimeoutSeconds from the pod's start; after
    it, heartbeatTimeoutSeconds from the last renewal (already clamped to now by the parser), or
    startupTimeoutSeconds from it when that renewal said the pod restarts in place. Both
    count from the end of the last outage hold instead when that is later (`timed_from`).
    """
    if pod.phase != "Running":
        return None
    renew = lease.renew_time if lease is not None else None
    heard = renew or pod.started or pod.created
    if heard is None:
        return None
    since = timed_from(heard, hold_end)
    assert since is not None  # heard is not None
    restarting = renew is not None and restarting_in_place(lease)
    limit = (
        ft.heartbeat_timeout_seconds if renew is not None and not restarting else ft.startup_timeout_seconds
    )
    if seconds_since(since, now) <= limit:
        return None
    held = f", {seconds_since(since, now):.0f}s since the outage hold ended" if since != heard else ""
    if restarting:
        return reasons.STARTUP_TIMEOUT, (
            f"no heartbeat {seconds_since(heard, now):.0f}s after the pod said it restarts in place{held} "
            f"(startupTimeoutSeconds={ft.startup_timeout_seconds})"
        )
    if renew is None:
        return reasons.STARTUP_TIMEOUT, (
            f"no heartbeat {seconds_since(heard, now):.0f}s after start{held} "
            f"(startupTimeoutSeconds={ft.startup_timeout_seconds})"
        )
    return reasons.HEARTBEAT_TIMEOUT, (
        f"heartbeat silent for {seconds_since(heard, now):.0f}s{held} "
        f"(heartbeatTimeoutSeconds={ft.heartbeat_timeout_seconds})"
    )


def restarting_in_place(lease: LeaseObs | None) -> bool:
    """The pod's last heartbeat says its container restarts in place (level 2b): until the new
    container's first heartbeat its silence is a start's, bounded by startupTimeoutSeconds."""
    hb = lease.heartbeat if lease is not None else None
    return (
        hb is not None
        and hb.fault is not None
        and hb.fault.reason == contract.FaultReason.RESTARTING_IN_PLACE
    )


def reported_hard_fault(lease: LeaseObs | None) -> tuple[str, str] | None:
    hb = lease.heartbeat if lease is not None else None
    if hb is None or hb.fault is None or hb.fault.severity != contract.FaultSeverity.HARD:
        return None
    return (
        reasons.POD_REPORTED_HARD_FAULT,
        f"pod reported a hard fault: {hb.fault.reason}: {hb.fault.message}",
    )


def reported_permanent_fault(lease: LeaseObs | None) -> str | None:
    """The message of a Permanent fault the pod reported (retrying cannot help), else None."""
    hb = lease.heartbeat if lease is not None else None
    if hb is None or hb.fault is None or hb.fault.severity != contract.FaultSeverity.PERMANENT:
        return None
    return f"{hb.fault.reason}: {hb.fault.message}"


def heartbeat_fresh(lease: LeaseObs | None, ft: FaultTolerance, now: datetime) -> bool:
    return (
        lease is not None
        and lease.renew_time is not None
        and seconds_since(lease.renew_time, now) <= ft.heartbeat_timeout_seconds
    )


def is_standby_spare(pod: PodObs, lease: LeaseObs | None, ft: FaultTolerance, now: datetime) -> bool:
    return (
        pod.role == contract.ROLE_SPARE
        and pod.phase == "Running"
        and not pod.deleting
        and heartbeat_fresh(lease, ft, now)
        and lease is not None
        and lease.heartbeat is not None
        and lease.heartbeat.state == contract.PodState.STANDBY
    )


def budget_exhausted(reschedules_after: int, ft: FaultTolerance) -> bool:
    """True when one more pod replacement would exceed maxPodReschedules."""
    return reschedules_after > ft.max_pod_reschedules


def ttl_deadline(completion: datetime | None, ttl: int | None) -> datetime | None:
    """When a finished job is deleted (ttlSecondsAfterFinished), None while it runs or without a TTL."""
    return after(completion, ttl) if completion is not None and ttl is not None else None


def ttl_expired(completion: datetime | None, ttl: int | None, now: datetime) -> bool:
    deadline = ttl_deadline(completion, ttl)
    return deadline is not None and now >= deadline


def steps_per_second(
    old_step: int | None, old_time: datetime | None, step: int, time: datetime
) -> float | None:
    """Training rate between two readings of the newest step; None when unknown (no earlier reading)
    or meaningless (the step went back: a resume from an older checkpoint)."""
    if old_step is None or old_time is None or step < old_step or time <= old_time:
        return None
    return round((step - old_step) / (time - old_time).total_seconds(), 3)
