"""What the checkpoint parts report, and how it reaches the training thread and the rank's reporter.

The background threads only `put` events; the training thread `drain`s them (`CheckpointManager.poll`),
so the reporter and `on_event` are only ever called from the training thread.
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from rtj.contract import FaultSeverity


class Reporter(Protocol):
    """The part of `rtj_trainer.report.RankReporter` used here."""

    def checkpoint_committed(self, step: int, when: datetime | None = None) -> None: ...
    def checkpoint_skipped(self) -> None: ...
    def memory_snapshot(self, step: int) -> None: ...
    def replicated(self, step: int) -> None: ...
    def persisted(self, seconds: float) -> None: ...
    def fault(self, severity: Any, reason: str, message: str = "") -> None: ...


@dataclass(frozen=True)
class CheckpointEvent:
    #: "committed" | "skipped" | "fault" | "snapshot" (a local memory snapshot) | "persisted" |
    #: "replicated" (the peer committed its replica of this rank's memory snapshot)
    kind: str
    step: int
    time: datetime
    reason: str = ""
    message: str = ""
    #: "persisted": seconds this rank took to write its shard to the volume (before the commit);
    #: "snapshot" (a new one, not a resume): seconds its write into the memory tier took;
    #: "replicated": seconds the stream to the peer took.
    seconds: float | None = None


def now() -> datetime:
    return datetime.now(UTC)


class EventLog:
    """A queue of events (any thread puts) and the steps they tell of (the training thread drains)."""

    def __init__(
        self, reporter: Reporter | None = None, on_event: Callable[[CheckpointEvent], None] | None = None
    ) -> None:
        self._queue: queue.SimpleQueue[CheckpointEvent] = queue.SimpleQueue()
        self._reporter = reporter
        self._on_event = on_event
        self.last_committed: int | None = None
        self.last_local: int | None = None
        self.last_replicated: int | None = None

    def put(self, ev: CheckpointEvent) -> None:
        self._queue.put(ev)

    def fault(self, step: int, reason: str, message: str) -> None:
        self.put(CheckpointEvent("fault", step, now(), reason, message))

    def drain(self) -> list[CheckpointEvent]:
        """Every queued event, dispatched in order (training thread only)."""
        out: list[CheckpointEvent] = []
        while True:
            try:
                ev = self._queue.get_nowait()
            except queue.Empty:
                return out
            out.append(ev)
            self._dispatch(ev)

    def _dispatch(self, ev: CheckpointEvent) -> None:
        if ev.kind == "committed":
            self.last_committed = ev.step
        elif ev.kind == "snapshot":
            self.last_local = ev.step
        elif ev.kind == "replicated":
            self.last_replicated = ev.step
        if self._on_event is not None:
            self._on_event(ev)
        if self._reporter is not None:
            _report(self._reporter, ev)


def _report(r: Reporter, ev: CheckpointEvent) -> None:
    if ev.kind == "committed":
        r.checkpoint_committed(ev.step, ev.time)
    elif ev.kind == "skipped":
        r.checkpoint_skipped()
    elif ev.kind == "snapshot":
        r.memory_snapshot(ev.step)
    elif ev.kind == "persisted" and ev.seconds is not None:
        r.persisted(ev.seconds)
    elif ev.kind == "replicated":
        r.replicated(ev.step)
    elif ev.kind == "fault":
        r.fault(FaultSeverity.SOFT, ev.reason, ev.message)
