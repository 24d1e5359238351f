"""rtj_trainer.hang_timeouts: per-section budgets learned from the rank's own times (pure logic)."""

from __future__ import annotations

import pytest
from rtj_trainer.hang_timeouts import MIN_SAMPLES, WINDOW, HangBudgets, Section, SectionClock

pytestmark = pytest.mark.unit


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _budgets(**kw: float) -> HangBudgets:
    return HangBudgets(60.0, floor_seconds=kw.get("floor", 5.0), median_multiple=kw.get("multiple", 20.0))


@pytest.mark.parametrize(
    ("durations", "expected"),
    [
        pytest.param([0.2] * (MIN_SAMPLES - 1), 60.0, id="too-few-samples-ceiling"),
        pytest.param([0.2] * MIN_SAMPLES, 5.0, id="fast-steps-floor"),
        pytest.param([0.5] * MIN_SAMPLES, 10.0, id="multiple-of-median"),
        pytest.param([10.0] * MIN_SAMPLES, 60.0, id="capped-by-ceiling"),
        pytest.param([0.5, 0.5, 0.5, 30.0, 40.0], 10.0, id="median-ignores-outliers"),
    ],
)
def test_budget(durations: list[float], expected: float) -> None:
    b = _budgets()
    for d in durations:
        b.observe(Section.STEP, d)
    assert b.budget(Section.STEP) == pytest.approx(expected)


def test_sections_learn_separately_and_other_is_never_learned() -> None:
    b = _budgets()
    for _ in range(MIN_SAMPLES):
        b.observe(Section.STEP, 0.2)
        b.observe(Section.CHECKPOINT, 2.0)
        b.observe(Section.OTHER, 0.1)
    assert b.budget(Section.STEP) == 5.0
    assert b.budget(Section.CHECKPOINT) == 40.0
    assert b.budget(Section.STARTUP) == b.budget(Section.OTHER) == 60.0


def test_a_checkpoint_budget_follows_the_longest_recent_save() -> None:
    """Saves are bimodal (snapshots, persisting saves): one slow save among fast ones sets the budget."""
    b = _budgets()
    for d in (0.04, 0.04, 0.04, 0.04, 1.5):
        b.observe(Section.CHECKPOINT, d)
    assert b.budget(Section.CHECKPOINT) == pytest.approx(30.0)
    for d in (0.04, 0.04, 0.04, 0.04, 0.04):
        b.observe(Section.STEP, d)
    assert b.budget(Section.STEP) == 5.0  # steps: the median (and the floor)


def test_the_median_follows_the_recent_window() -> None:
    b = _budgets()
    for _ in range(WINDOW):
        b.observe(Section.STEP, 0.1)
    for _ in range(WINDOW // 2 + 1):
        b.observe(Section.STEP, 1.0)
    assert b.samples(Section.STEP) == WINDOW
    assert b.budget(Section.STEP) == 20.0


def test_disabled_is_the_ceiling_and_bad_settings_are_refused() -> None:
    b = HangBudgets(60.0, enabled=False)
    for _ in range(MIN_SAMPLES):
        b.observe(Section.STEP, 0.1)
    assert b.budget(Section.STEP) == 60.0
    with pytest.raises(ValueError):
        HangBudgets(0)
    assert HangBudgets(3.0, floor_seconds=5.0).floor == 3.0  # never above the ceiling


def test_a_checkpoint_inside_a_step_gets_its_own_budget_and_is_not_counted_to_the_step() -> None:
    clock, deadlines = FakeClock(), []
    budgets = _budgets()
    sections = SectionClock(budgets, deadlines.append, clock)
    assert deadlines == [60.0]  # start-up: the ceiling
    clock.now += 3.0
    sections.step()  # start-up ended (one sample), the first step begins
    for _ in range(MIN_SAMPLES + 1):
        clock.now += 0.2
        sections.begin(Section.CHECKPOINT)
        clock.now += 1.5
        sections.end()
        sections.step()
    assert budgets.samples(Section.STARTUP) == 1
    assert budgets.budget(Section.STEP) == pytest.approx(5.0)  # 0.2 s steps: the 1.5 s saves excluded
    assert budgets.budget(Section.CHECKPOINT) == pytest.approx(30.0)
    deadlines.clear()
    sections.begin(Section.CHECKPOINT)
    sections.end()
    assert deadlines == [pytest.approx(30.0), pytest.approx(5.0)]  # the save's budget, then the step's again


def test_a_discarded_section_is_no_sample_and_relax_sets_the_ceiling() -> None:
    clock, deadlines = FakeClock(), []
    budgets = _budgets()
    sections = SectionClock(budgets, deadlines.append, clock)
    for _ in range(MIN_SAMPLES):
        sections.begin(Section.CHECKPOINT)
        sections.discard()
        sections.end()
    assert budgets.samples(Section.CHECKPOINT) == 0
    sections.relax()
    assert deadlines[-1] == 60.0


def test_deadline_updates_within_a_step_kind_are_throttled() -> None:
    clock, deadlines = FakeClock(), []
    sections = SectionClock(_budgets(), deadlines.append, clock)
    sections.step()  # start-up -> step: always sent
    for _ in range(10):
        clock.now += 0.01
        sections.step()
    assert len(deadlines) == 3  # start-up, the first step, one more after 0.1 s


def test_the_reporter_moves_the_deadline_per_section(monkeypatch: pytest.MonkeyPatch) -> None:
    from rtj_trainer import report

    clock = FakeClock()
    monkeypatch.setattr(report.time, "monotonic", clock)
    reporter, deadlines = report.RankReporter(None), []
    budgets = _budgets()
    reporter.attach_deadline(deadlines.append, budgets)
    for n in range(1, MIN_SAMPLES + 2):
        clock.now += 0.2
        with reporter.section(Section.CHECKPOINT):
            clock.now += 2.0
        with reporter.section(Section.CHECKPOINT) as nothing_due:
            nothing_due.discard()
        reporter.step(n)
    assert budgets.samples(Section.CHECKPOINT) == MIN_SAMPLES + 1
    deadlines.clear()
    with reporter.section(Section.CHECKPOINT):
        pass
    assert deadlines == [pytest.approx(40.0), pytest.approx(5.0)]
    reporter.detach_deadline()
    with reporter.section(Section.CHECKPOINT) as detached:
        detached.discard()
    reporter.step(99)
    assert len(deadlines) == 2


def test_overdue_names_the_section_past_its_deadline_and_survives_the_detach(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rtj_trainer import report

    clock = FakeClock()
    monkeypatch.setattr(report.time, "monotonic", clock)
    reporter = report.RankReporter(None)
    reporter.attach_deadline(lambda _: None, _budgets())
    for n in range(1, MIN_SAMPLES + 2):
        clock.now += 0.2
        reporter.step(n)
    clock.now += 4.9
    assert reporter.overdue() is None
    clock.now += 0.2
    assert reporter.overdue() == (Section.STEP, pytest.approx(5.0))
    reporter.detach_deadline()  # the abort unwinds the training function before on_restart runs
    assert reporter.overdue() == (Section.STEP, pytest.approx(5.0))
    reporter.attach_deadline(lambda _: None, _budgets())
    assert reporter.overdue() is None


def test_while_unsettled_every_budget_is_the_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """The memory tier allocating its buffers in the background slows steps for seconds: no hang."""
    from rtj_trainer import report

    clock = FakeClock()
    monkeypatch.setattr(report.time, "monotonic", clock)
    reporter, deadlines = report.RankReporter(None), []
    reporter.attach_deadline(deadlines.append, _budgets())
    preparing = [True]
    reporter.ceiling_while(lambda: preparing[0])
    for n in range(1, MIN_SAMPLES + 3):
        clock.now += 0.2
        reporter.step(n)
    assert deadlines[-1] == 60.0  # learned (5 s), but the buffers are still being allocated
    clock.now += 5.5
    assert reporter.overdue() is None
    preparing[0] = False
    clock.now += 0.2
    reporter.step(99)
    assert deadlines[-1] == pytest.approx(5.0)
    preparing[0] = True  # once settled, the predicate is no longer asked
    clock.now += 0.2
    reporter.step(100)
    assert deadlines[-1] == pytest.approx(5.0)
