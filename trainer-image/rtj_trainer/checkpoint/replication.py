"""The hook between the memory tier and the peer replica (`rtj_trainer.peer_replica`).

Each memory snapshot this rank commits (and that all ranks agreed to replicate) is offered to a
`Replicator`, which streams it to the replica server of another pod in the background (coalesced:
the newest wins). The snapshot being streamed and the ones the peer committed since the ranks last
settled are protected from pruning and recycling, so a survivor still holds the step a lost pod's
replica is of: the ranks replicate the same steps, but each rank's stream ends when it ends. Until
every rank's stream of step S has ended, a lost pod's replica may still be of the step replicated
before S, so both stay protected; once the ranks agree that no rank is writing or streaming
(`settle`), every peer holds a replica of S and only S stays protected.
"""

from __future__ import annotations

import logging
import os
import threading

from ..checkpoint_format import LOCAL_META
from ..peer_replica import Offer, Replicator
from .events import CheckpointEvent, EventLog, now

log = logging.getLogger(__name__)

#: Seconds `cancel` waits for the stream in flight to stop (it stops between two 64 MiB chunks);
#: past it the stream goes on and the next save is not offered.
CANCEL_TIMEOUT_S = 1.0

#: Replicated snapshots kept protected until the ranks settle: the step every peer may hold (the
#: one before) and the newest one.
MAX_UNSETTLED = 2


class ReplicationHook:
    def __init__(self, peer_endpoint: str, rank: int, lock: threading.Lock, events: EventLog) -> None:
        self._lock = lock  # the memory tier's: protection vs. pruning and recycling
        self._events = events
        self.replica_source: str | None = None  # being streamed
        #: The snapshots the peer committed since the ranks last settled, oldest first (at most two:
        #: a rank offers a new step only once every rank's stream has ended).
        self.replicated_sources: list[str] = []
        self.replicate_failures = 0
        self.replicator = Replicator(peer_endpoint, rank, self._protect, self._done)

    @property
    def busy(self) -> bool:
        return self.replicator.busy

    def protected(self) -> tuple[str | None, ...]:
        return (self.replica_source, *self.replicated_sources)

    def settle(self) -> None:
        """Every rank agreed that no rank is writing a snapshot or streaming one: each peer holds a
        replica of the newest step replicated, so the older ones need no protection."""
        with self._lock:
            del self.replicated_sources[:-1]

    def offer(self, step: int, nonce: int, path: str) -> None:
        self.replicator.offer(step, nonce, path)

    def wait(self, timeout: float | None) -> bool:
        return self.replicator.wait(timeout)

    def cancel(self, timeout: float) -> bool:
        """Cut the stream in flight and drop the pending offer (an emergency save replaces them with
        its own step), waiting at most `timeout` and CANCEL_TIMEOUT_S seconds; True once nothing is
        streaming, so the next save may be offered."""
        return self.replicator.cancel(min(timeout, CANCEL_TIMEOUT_S))

    def _protect(self, path: str | None) -> bool:
        """The replicator's hold on the snapshot it streams: not pruned nor recycled meanwhile."""
        with self._lock:
            if path is not None and not os.path.isfile(os.path.join(path, LOCAL_META)):
                return False  # pruned or recycled before its turn
            self.replica_source = path
            return True

    def _done(self, offer: Offer, seconds: float, error: BaseException | None) -> None:
        if error is None:
            with self._lock:
                if offer.path not in self.replicated_sources:
                    self.replicated_sources.append(offer.path)
                del self.replicated_sources[:-MAX_UNSETTLED]
            self._events.put(CheckpointEvent("replicated", offer.step, now(), seconds=seconds))
            return
        self.replicate_failures += 1
        if self.replicate_failures in (1, 10) or self.replicate_failures % 100 == 0:
            log.warning(
                "replica of step %d not sent (%d failures): %r", offer.step, self.replicate_failures, error
            )
