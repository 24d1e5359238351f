"""How late heartbeats reach the operator: a Lease's renewTime (the pod's clock) to the moment its
watch event arrives here.

A heartbeat that arrives late makes a healthy pod look silent, and the ladder acts on silence; so
the lag is measured (rtj_heartbeat_delivery_seconds) and, when some Lease arrived later than
LATE_SECONDS, one WARNING at most every LOG_EVERY_SECONDS names the worst of them. The lag includes
the API server's own delay (a write queued behind a slow etcd), the watch's, and any clock skew
between the pod's node and the operator's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from rtj import metrics

logger = logging.getLogger(__name__)

#: Later than this is worth a log line: a few seconds is the most a healthy watch takes.
LATE_SECONDS = 5.0
#: At most one line per this many seconds, whatever the number of late Leases (an outage at
#: 10,000 pods would otherwise log 1,000 lines a second).
LOG_EVERY_SECONDS = 30.0


@dataclass
class LateDeliveries:
    """Late Lease events since the last line logged."""

    count: int = 0
    worst_seconds: float = 0.0
    worst_lease: str = ""
    last_logged: datetime | None = None

    def observe(self, namespace: str, name: str, renewed: datetime | None, arrived: datetime) -> float | None:
        """Record one Lease event; returns its lag in seconds (None: no renewTime)."""
        if renewed is None:
            return None
        lag = (arrived - renewed).total_seconds()
        metrics.HEARTBEAT_DELIVERY.observe(max(0.0, lag))
        if lag > LATE_SECONDS:
            self.count += 1
            if lag > self.worst_seconds:
                self.worst_seconds, self.worst_lease = lag, f"{namespace}/{name}"
        if self.count and (
            self.last_logged is None or (arrived - self.last_logged).total_seconds() >= LOG_EVERY_SECONDS
        ):
            logger.warning(
                "%d heartbeat Lease event(s) arrived more than %.0f s after their renewTime, the worst "
                "%.1f s late (%s): the API server or the watch is slow, or node clocks are skewed",
                self.count, LATE_SECONDS, self.worst_seconds, self.worst_lease,
            )  # fmt: skip
            self.count, self.worst_seconds, self.worst_lease = 0, 0.0, ""
            self.last_logged = arrived
        return lag
