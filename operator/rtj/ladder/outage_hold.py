"""The outage hold: heartbeats of most slots going stale together are the heartbeat path's fault
(API server outage or overload, trainer RBAC, a network partition), not the pods'. Replacing them
all would turn a control-plane blip into a job-wide restart, so their replacement is held
(Degraded/HeartbeatsStale) until heartbeats resume; real deaths still surface as pod exits or
node status.

Hysteresis (issue 18). At 300 jobs on a 2-core host, a slow API server let Lease renewals lag
behind: the hold began and ended with every renewal that caught up, 404 HeartbeatsStale Events in
6 minutes with no fault injected. So the hold
- begins when a majority of slots (at least 2) are stale and one of them is silent past its
  deadline, and
- ends only when at most one slot is stale (a single silent pod is then replaced as usual).
A stale slot is one silent past its deadline or older than half of heartbeatTimeoutSeconds. While
held, the job stays Degraded/HeartbeatsStale with one Event per episode (posted when it begins).
"""

from __future__ import annotations

from rtj.api.models import FaultTolerance


def stale_count(silent: int, heartbeat_ages: dict[int, float], ft: FaultTolerance) -> int:
    """Slots silent past their deadline plus live slots whose last heartbeat is older than half
    of the timeout."""
    half = ft.heartbeat_timeout_seconds / 2
    return silent + sum(1 for age in heartbeat_ages.values() if age > half)


def begins(silent: int, stale: int, nodes: int) -> bool:
    return silent > 0 and stale >= 2 and stale * 2 > nodes


def holds(was_held: bool, silent: int, stale: int, nodes: int) -> bool:
    """Whether replacements of silent pods are held in this pass."""
    return stale >= 2 if was_held else begins(silent, stale, nodes)


def message(stale: int, nodes: int) -> str:
    return (
        f"{stale} of {nodes} slots' heartbeats are stale at once; holding replacements until "
        "heartbeats resume (pod exits and node failures still act)"
    )
