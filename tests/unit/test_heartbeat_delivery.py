"""How late heartbeat Leases reach the operator: the histogram and the rate-limited warning."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import REGISTRY
from rtj.heartbeat_delivery import LATE_SECONDS, LOG_EVERY_SECONDS, LateDeliveries

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def _count() -> float:
    return REGISTRY.get_sample_value("rtj_heartbeat_delivery_seconds_count") or 0.0


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rtj.heartbeat_delivery"]


def test_every_renewal_is_measured_and_a_timely_one_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    late = LateDeliveries()
    before = _count()
    with caplog.at_level(logging.WARNING):
        assert late.observe("ns", "a", T0, T0 + timedelta(seconds=0.3)) == pytest.approx(0.3)
        assert late.observe("ns", "b", None, T0) is None  # no renewTime yet: nothing to measure
    assert _count() == before + 1
    assert _warnings(caplog) == []


def test_late_leases_log_one_line_per_interval_naming_the_worst(caplog: pytest.LogCaptureFixture) -> None:
    late = LateDeliveries()
    lag = LATE_SECONDS + 1
    with caplog.at_level(logging.WARNING):
        late.observe("ns", "a", T0, T0 + timedelta(seconds=lag))  # the first: logged at once
        for i, extra in enumerate((2.0, 9.0, 4.0)):  # within the interval: counted, not logged
            at = T0 + timedelta(seconds=lag + 1 + i)
            late.observe("ns", f"b{i}", at - timedelta(seconds=LATE_SECONDS + extra), at)
        assert len(_warnings(caplog)) == 1
        # The interval over: a timely event flushes what was counted since.
        at = T0 + timedelta(seconds=lag + LOG_EVERY_SECONDS)
        late.observe("ns", "c", at, at)
    first, second = _warnings(caplog)
    assert first.startswith("1 heartbeat Lease event(s)") and "ns/a" in first
    assert (
        second.startswith("3 heartbeat Lease event(s)") and f"{LATE_SECONDS + 9:.1f} s late (ns/b1)" in second
    )


def test_nothing_late_since_the_last_line_logs_nothing_more(caplog: pytest.LogCaptureFixture) -> None:
    late = LateDeliveries()
    with caplog.at_level(logging.WARNING):
        late.observe("ns", "a", T0, T0 + timedelta(seconds=LATE_SECONDS + 1))
        at = T0 + timedelta(seconds=2 * LOG_EVERY_SECONDS)
        late.observe("ns", "a", at, at)
    assert len(_warnings(caplog)) == 1
