"""Hang budgets learned from the job's own section times (pure logic: no clock, no NVRx).

A rank's work is cut into sections: `startup` (entering the training function to its first step),
`step` (one training step, checkpoint sections inside it excluded) and `checkpoint` (a save the script
marks as one). Each section kind has its own budget:

    budget = min(ceiling, max(floor, multiple x median of that kind's recent durations))

and the ceiling (the in-process soft timeout) until `MIN_SAMPLES` durations of that kind were seen.
A checkpoint's budget is a multiple of the longest recent save, not of the median: saves are few and
bimodal (a memory snapshot in 0.04 s, a save that also hands a persist to the writer, one that waits
for a pinned buffer), and a save slower than usual is not a hang (1xH200, 2026-12-04: with the
median of saves, a 0.04 s median set a 5 s budget and a first real snapshot was aborted as hung).
With 0.18 s steps, a floor of 5 s and a multiple of 20 a stalled step is caught after 5 s instead of
the soft timeout; a step that slows down gradually moves the median with it. `other` is work of
unknown length (an evaluation, a final drain): always the ceiling, never learned.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum


class Section(StrEnum):
    STARTUP = "startup"
    STEP = "step"
    CHECKPOINT = "checkpoint"
    OTHER = "other"


#: Durations of a kind needed before its budget is learned (the ceiling applies until then).
MIN_SAMPLES = 5
#: Recent durations per kind that the median is taken over.
WINDOW = 64
DEFAULT_FLOOR_SECONDS = 5.0
DEFAULT_MEDIAN_MULTIPLE = 20.0


@dataclass
class _Window:
    """The last `WINDOW` durations, in arrival order and sorted (median in O(log n) + a list shift)."""

    recent: deque[float] = field(default_factory=deque)
    ordered: list[float] = field(default_factory=list)

    def add(self, seconds: float) -> None:
        if len(self.recent) == WINDOW:
            old = self.recent.popleft()
            del self.ordered[bisect.bisect_left(self.ordered, old)]
        self.recent.append(seconds)
        bisect.insort(self.ordered, seconds)

    def longest(self) -> float:
        return self.ordered[-1]

    def median(self) -> float:
        n = len(self.ordered)
        mid = n // 2
        return self.ordered[mid] if n % 2 else (self.ordered[mid - 1] + self.ordered[mid]) / 2


class HangBudgets:
    """Per-section budgets; `observe` each finished section, `budget` for the one starting.

    `enabled` False: every budget is the ceiling (the fixed soft timeout, as without learning).
    """

    def __init__(
        self,
        ceiling_seconds: float,
        *,
        floor_seconds: float = DEFAULT_FLOOR_SECONDS,
        median_multiple: float = DEFAULT_MEDIAN_MULTIPLE,
        enabled: bool = True,
    ) -> None:
        if ceiling_seconds <= 0 or floor_seconds <= 0 or median_multiple < 1:
            raise ValueError("ceiling and floor must be > 0 and the multiple >= 1")
        self.ceiling = float(ceiling_seconds)
        self.floor = min(float(floor_seconds), self.ceiling)
        self.multiple = float(median_multiple)
        self.enabled = enabled
        self._windows: dict[Section, _Window] = {}

    def observe(self, section: Section, seconds: float) -> None:
        if not self.enabled or section is Section.OTHER or seconds < 0:
            return
        self._windows.setdefault(section, _Window()).add(float(seconds))

    def samples(self, section: Section) -> int:
        window = self._windows.get(section)
        return len(window.recent) if window else 0

    def budget(self, section: Section) -> float:
        window = self._windows.get(section)
        if not self.enabled or window is None or len(window.recent) < MIN_SAMPLES:
            return self.ceiling
        typical = window.longest() if section is Section.CHECKPOINT else window.median()
        return min(self.ceiling, max(self.floor, self.multiple * typical))


#: Seconds between two deadline updates within one section (each is a message to NVRx's monitor
#: process); the deadline lags by at most this, small against any floor.
DEADLINE_UPDATE_INTERVAL = 0.1


@dataclass
class _Open:
    kind: Section
    start: float
    record: bool = True


class SectionClock:
    """Times a rank's sections and moves its hang deadline (`set_deadline(budget_s)`, from now).

    It starts in `startup`. `step()` ends the current step (or start-up) and begins the next step;
    `begin(kind)` / `end()` nest a section inside the current one (a checkpoint inside a step): the
    nested time is not counted to the outer section, whose deadline is renewed when it ends.
    `relax()` sets the ceiling until the next step (an emergency save of unknown length);
    `unsettled()` True sets the ceiling for every section until it turns False.
    """

    def __init__(
        self,
        budgets: HangBudgets,
        set_deadline: Callable[[float], None],
        clock: Callable[[], float],
        unsettled: Callable[[], bool] | None = None,
    ) -> None:
        self.budgets = budgets
        self._set_deadline = set_deadline
        self._clock = clock
        #: True while one-off background work slows the steps (see RankReporter.ceiling_while):
        #: every budget is then the ceiling.
        self._unsettled = unsettled
        #: The open sections, the outermost (start-up or a step) first; the last is the current one.
        self._stack = [_Open(Section.STARTUP, clock())]
        self._last_set = -float("inf")
        #: When the deadline last set expires, and the section and budget it was set for.
        self._deadline: tuple[float, Section, float] = (float("inf"), Section.STARTUP, budgets.ceiling)
        self._set(Section.STARTUP, clock(), force=True)

    @property
    def section(self) -> Section:
        return self._stack[-1].kind

    def _set(self, kind: Section, now: float, force: bool = False) -> None:
        if force or now - self._last_set >= DEADLINE_UPDATE_INTERVAL:
            unsettled = self._unsettled is not None and self._unsettled()
            self._send(kind, self.budgets.ceiling if unsettled else self.budgets.budget(kind), now)

    def _send(self, kind: Section, budget: float, now: float) -> None:
        self._last_set = now
        self._deadline = (now + budget, kind, budget)
        self._set_deadline(budget)

    def overdue(self) -> tuple[Section, float] | None:
        """(section, budget) when the last deadline has passed (the rank was aborted for a hang)."""
        expires, kind, budget = self._deadline
        return (kind, budget) if self._clock() >= expires else None

    def step(self) -> None:
        while len(self._stack) > 1:
            self.end()
        ended = self._stack[0]
        now = self._clock()
        self.budgets.observe(ended.kind, now - ended.start)
        self._stack[0] = _Open(Section.STEP, now)
        self._set(Section.STEP, now, force=ended.kind is not Section.STEP)

    def begin(self, kind: Section) -> None:
        now = self._clock()
        self._stack.append(_Open(kind, now))
        self._set(kind, now, force=True)

    def discard(self) -> None:
        """The current nested section is not a sample (a save that turned out not to be due)."""
        if len(self._stack) > 1:
            self._stack[-1].record = False

    def end(self) -> None:
        if len(self._stack) == 1:
            return
        nested = self._stack.pop()
        now = self._clock()
        if nested.record:
            self.budgets.observe(nested.kind, now - nested.start)
        self._stack[-1].start += now - nested.start  # the outer section excludes the nested one
        self._set(self.section, now, force=True)

    def relax(self) -> None:
        self._send(self.section, self.budgets.ceiling, self._clock())


class NestedSection:
    """What `RankReporter.section` yields (`clock` None: no deadline attached, nothing to time)."""

    def __init__(self, clock: SectionClock | None) -> None:
        self._clock = clock

    def discard(self) -> None:
        if self._clock is not None:
            self._clock.discard()
