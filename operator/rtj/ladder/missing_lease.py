"""A heartbeat Lease that disappears is not silence from pod start.

Writer of the Lease: the trainer's heartbeat agent, which recreates it on its next renewal (every
heartbeatIntervalSeconds) when it is gone (a user or a cleanup script deleted it). Before this
policy, a missing Lease fell back to the startup deadline counted from pod start, so deleting the
Lease of any pod older than startupTimeoutSeconds replaced it and quarantined its node at once,
although the trainer recreated the Lease seconds later (issue 13, case 3).

Policy, for a Running pod whose Lease is missing (or has no usable renewTime):
- it never heartbeated (the slot's lastHeartbeatTime is unset): the startup deadline applies as before;
- it did: the operator keeps when it first saw the Lease missing (slot.leaseMissingSince, in status,
  so a restarted operator keeps counting) and the pod is silent only once BOTH its last heartbeat
  kept in status is older than heartbeatTimeoutSeconds AND the trainer had RECREATE_INTERVALS renew
  intervals to recreate the Lease.
"""

from __future__ import annotations

from datetime import datetime

from rtj import reasons
from rtj.api.models import FaultTolerance, NodeSlotStatus
from rtj.ladder import predicates as p

#: Renew intervals the trainer gets to recreate a deleted Lease: one renewal, plus one retry for a
#: failed write (the agent retries on its next tick).
RECREATE_INTERVALS = 2


def applies(slot: NodeSlotStatus, renewing: bool) -> bool:
    """The pod heartbeated before (its first heartbeat is always written to status at once) and its
    Lease is gone now (or holds no usable renewTime, which is judged the same as no Lease)."""
    return not renewing and slot.last_heartbeat_time is not None


def deadline(slot: NodeSlotStatus, ft: FaultTolerance, hold_end: datetime | None = None) -> datetime:
    """When the pod counts as silent: both its last heartbeat (or the end of the last outage hold,
    if later) and the Lease's absence are old enough."""
    heard = p.timed_from(slot.last_heartbeat_time, hold_end)
    assert heard is not None and slot.lease_missing_since is not None
    return max(
        p.after(heard, ft.heartbeat_timeout_seconds),
        p.after(slot.lease_missing_since, RECREATE_INTERVALS * ft.heartbeat_interval_seconds),
    )


def silence(
    slot: NodeSlotStatus, ft: FaultTolerance, now: datetime, hold_end: datetime | None = None
) -> tuple[str, str] | None:
    """Record when the Lease was first seen missing; (reason, message) once the pod counts as silent."""
    if slot.lease_missing_since is None:
        slot.lease_missing_since = now
    last = slot.last_heartbeat_time
    assert last is not None  # applies() checked it
    grace = RECREATE_INTERVALS * ft.heartbeat_interval_seconds
    if now <= deadline(slot, ft, hold_end):
        return None
    return reasons.HEARTBEAT_TIMEOUT, (
        f"heartbeat Lease missing for {(now - slot.lease_missing_since).total_seconds():.0f}s (not "
        f"recreated within {grace}s) and last heartbeat {(now - last).total_seconds():.0f}s ago "
        f"(heartbeatTimeoutSeconds={ft.heartbeat_timeout_seconds})"
    )
