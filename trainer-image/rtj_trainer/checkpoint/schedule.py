"""When a save is due, whether it persists or only snapshots into memory, and the skip/coalesce rule.

Pure bookkeeping on the training thread (the figures it decides on are agreed by all ranks first,
`agreement.SaveAgreement`), so every rank takes the same decision at the same step:

- a persist due while some rank's previous one still drains is skipped, reported once, and
  coalesced: the next step at which every writer is idle persists instead; with the memory tier,
  the next memory snapshot's step, so that the coalesced persist takes no snapshot off the memory
  tier's schedule (one that would keep the writer busy when the next one falls due);
- a memory snapshot due while some rank's host buffers are still being written is taken at the
  first step after it; with `adapt` the interval widens to the multiple of the configured one that
  the measured write fits in (`snapshot_every`), so snapshots are on schedule rather than late.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .agreement import SaveAgreement

#: A memory snapshot's interval leaves this margin over the measured write time (writes vary). A
#: write slower than its interval takes the next snapshot a step or two late; a margin that widens
#: the interval costs up to a whole configured interval of steps at every restart. On an H100 host
#: one copy thread drained 13.7 GB in 1.07-1.32 s (1.45-1.55 s on a slower one) against 10 steps of
#: 0.18-0.19 s: 1.5 widened 10 steps to 20 whenever a drain passed 1.2 s.
SNAPSHOT_WRITE_MARGIN = 1.1
#: The memory tier's interval grows to at most this many times the configured one.
MAX_SNAPSHOT_WIDENING = 64


def snapshot_every(configured: int, write_s: float, step_s: float) -> int:
    """The memory tier's interval in steps: the configured one, or the smallest multiple of it that
    a snapshot write (with SNAPSHOT_WRITE_MARGIN) fits in, so a due snapshot does not wait for the
    previous one to be written (taken late) and the steps a restart loses stay within one interval."""
    if write_s <= 0 or step_s <= 0:
        return configured
    factor = math.ceil(SNAPSHOT_WRITE_MARGIN * write_s / step_s / configured)
    return configured * min(MAX_SNAPSHOT_WIDENING, max(1, factor))


@dataclass(frozen=True)
class SaveDecision:
    go: bool  # take a snapshot now
    persist: bool  # ... and persist it
    skipped: bool  # a persist fell due and is skipped (report it)


class SaveSchedule:
    def __init__(self, interval_steps: int, memory_interval_steps: int, *, memory: bool, adapt: bool) -> None:
        self.interval_steps = interval_steps
        self.memory_interval_steps = memory_interval_steps
        self.memory = memory
        self.adapt = adapt
        #: The memory tier's interval in effect (agreed by the ranks at each save).
        self.memory_every = memory_interval_steps
        self.pending = False  # a persist was skipped: the next possible step persists
        self.pending_memory = False  # a memory snapshot was due while the buffers were busy
        self.step_s = 0.0  # this rank's step time (moving average of the maybe_save cadence)
        self._last_call: float | None = None

    def tick(self, t: float) -> None:
        """A `maybe_save` call at monotonic time `t`: measures the step (one without a save in it)."""
        if self._last_call is not None:
            dt = t - self._last_call
            self.step_s = dt if self.step_s == 0 else 0.9 * self.step_s + 0.1 * dt
        self._last_call = t

    def saving(self) -> None:
        """A save is taken at this call: its stall is not a step."""
        self._last_call = None

    def is_due(self, step: int) -> bool:
        if self.pending or step % self.interval_steps == 0:
            return True
        return self.memory and (self.pending_memory or step % self.memory_every == 0)

    def persist_due(self, step: int, force: bool = False) -> bool:
        return force or not self.memory or self.pending or step % self.interval_steps == 0

    def memory_due(self, step: int) -> bool:
        return self.memory and (self.pending_memory or step % self.memory_every == 0)

    def decide(
        self, step: int, persist_due: bool, memory_due: bool, agreed: SaveAgreement, *, force: bool = False
    ) -> SaveDecision:
        """Apply the agreed figures; updates the pending flags and the memory interval. `force`: a
        persist asked for now (an emergency save), which waits for no memory snapshot's step."""
        if self.memory and self.adapt:  # the same agreed figures on every rank
            self.memory_every = snapshot_every(self.memory_interval_steps, agreed.write_s, agreed.step_s)
        persist = persist_due and not agreed.any_persisting and not agreed.any_busy
        if persist and not force and self._waits_for_memory_step(step, memory_due):
            return SaveDecision(False, False, False)
        skipped = False
        if persist_due and not persist:
            skipped = not self.pending or step % self.interval_steps == 0
            self.pending = True
        if agreed.any_busy:
            self.pending_memory = memory_due
            return SaveDecision(False, False, skipped)
        if not persist and not memory_due:
            return SaveDecision(False, False, skipped)  # only a coalesced persist was due, still draining
        if persist:
            self.pending = False
        self.pending_memory = False
        return SaveDecision(True, persist, skipped)

    def _waits_for_memory_step(self, step: int, memory_due: bool) -> bool:
        """A coalesced persist (the memory tier on) waits for the next memory snapshot's step when
        that comes within a configured memory interval: it persists that snapshot."""
        if not (self.memory and self.pending) or memory_due or step % self.interval_steps == 0:
            return False
        return -step % self.memory_every < self.memory_interval_steps
