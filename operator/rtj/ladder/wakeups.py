"""When a job's pass must run: cost proportional to change (issue 18).

A pass used to run every second for every job; at 300 jobs that alone was ~0.5 of the operator's
0.75 cores, almost all of it recomputing jobs where nothing had changed. A job's pass now runs
- when the job's spec or one of its pods changes, or the readiness or taints of a node holding
  one of its pods (watch events; the handlers wake it),
- when a heartbeat Lease's content changes, not its renewal: the Heartbeat annotation without what
  advances while a pod trains (`PROGRESS_FIELDS`: the step, the newest memory snapshot and replica,
  the committed checkpoint, the persist time, skipped saves), i.e. its state, restart counters, a
  reported fault or a reach-probe answer (rtj.ladder.partition), or the assigned slot
  (`heartbeat_digest`),
- when a renewal arrives for a slot the last pass found stale or silent (`watched_leases`): that
  renewal can end a stale state or the outage hold,
- at the job's next deadline (`next_deadline`): the first live slot's heartbeat deadline, or the
  first time-based rule that has not fired yet, as the pass published it in `Decision.due` (a
  startup or missing-Lease deadline, an overdue pod deletion, the progress watchdog, the TTL, the
  end of a create refusal's backoff); after 1 s when the pass did not finish (a status-write
  conflict, a failed call),
- when a renewal carries newer progress (`PROGRESS_FIELDS`), at most once per
  RTJ_PROGRESS_REFRESH_SECONDS (5 s by default) after the job's previous pass (the handlers' timer):
  status (the STEP column, lastCheckpoint) is that fresh, whatever the number of pods.
- and at the slow resync interval (RTJ_RECONCILE_INTERVAL_SECONDS), a safety net only.
An ordinary renewal of a healthy slot only moves a deadline later: with the memory tier on, almost
every renewal of a training pod carries a newer memory snapshot step, and every pod reports each
committed checkpoint, so waking on each of those woke a full pass (all of a 512-slot job's Leases
parsed, decide() over 512 slots) once per renewal (issue 30); without any refresh, progress reached
status only at the next deadline (up to a heartbeat timeout late), and a user watching
`kubectl get rtj` or waiting for a checkpoint saw it that late. A pass that acts on a fault reads
every Lease's progress as it is then.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, NamedTuple

from rtj import contract
from rtj.api.models import FaultTolerance, JobStatus, SlotState

#: A pass runs this long after a heartbeat deadline (the ladder's test is "older than", strictly).
DEADLINE_SLACK_SECONDS = 0.02
#: Heartbeat fields that advance while a pod trains: none of them makes the ladder act.
PROGRESS_FIELDS = frozenset(
    {"step", "memorySnapshotStep", "replicaStep", "checkpoint", "persistSeconds", "checkpointsSkipped"}
)


class HeartbeatReading(NamedTuple):
    """What the Lease watch reads of one Lease version (`read_heartbeat`)."""

    #: What the ladder acts on (`heartbeat_digest`): a change wakes the pass at once.
    digest: str
    #: The step the heartbeat reports (None: none, or malformed): feeds rtj.ladder.observe.progress_seen.
    step: int | None
    #: Its `PROGRESS_FIELDS`: a change wakes the pass at the next progress refresh.
    progress: str


def heartbeat_digest(annotations: Mapping[str, Any] | None) -> str:
    """What in a Lease the ladder acts on, without its progress (`PROGRESS_FIELDS`, which change
    with almost every renewal of a training pod)."""
    return read_heartbeat(annotations).digest


def read_heartbeat(annotations: Mapping[str, Any] | None) -> HeartbeatReading:
    """The Lease's digest, step and progress from one parse: the Lease watch calls it on every renewal."""
    annotations = annotations or {}
    raw = annotations.get(contract.HEARTBEAT_ANNOTATION)
    try:
        heartbeat = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        heartbeat = raw  # malformed: its text is the digest (the ladder ignores it)
    step, progress = None, {}
    if isinstance(heartbeat, dict):
        value = heartbeat.get("step")
        if type(value) is int and 0 <= value <= contract.MAX_COUNTER:
            step = value
        progress = {k: v for k, v in heartbeat.items() if k in PROGRESS_FIELDS}
        heartbeat = {k: v for k, v in heartbeat.items() if k not in PROGRESS_FIELDS}
    assigned = annotations.get(contract.ASSIGNED_SLOT_ANNOTATION)
    digest = json.dumps([heartbeat, assigned], sort_keys=True, default=str)
    return HeartbeatReading(digest, step, json.dumps(progress, sort_keys=True, default=str))


def watched_leases(
    status: JobStatus, heartbeat_ages: Mapping[int, float], ft: FaultTolerance
) -> frozenset[str]:
    """Leases whose next renewal must wake the pass: slots held silent, or older than half of the
    timeout (what the outage hold counts as stale)."""
    half = ft.heartbeat_timeout_seconds / 2
    return frozenset(
        contract.lease_name(s.pod)
        for s in status.node_slots
        if s.pod and (s.state == SlotState.SILENT or heartbeat_ages.get(s.slot, 0.0) > half)
    )


def next_deadline(
    heartbeat_ages: Mapping[int, float],
    ft: FaultTolerance,
    due: datetime | None = None,
    now: datetime | None = None,
) -> float | None:
    """Seconds until the first live slot's heartbeat deadline or the pass's `due` time passes (None:
    neither, the resync will do)."""
    timeout = ft.heartbeat_timeout_seconds
    ahead = [timeout - age for age in heartbeat_ages.values() if age <= timeout]
    if due is not None and now is not None:
        ahead.append(max(0.0, (due - now).total_seconds()))
    return min(ahead) + DEADLINE_SLACK_SECONDS if ahead else None
