"""rtj.metrics: a deleted job's series go away (through prometheus-client's public API only), and
another job's stay."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY
from rtj import metrics
from rtj.ladder import RecoveryObserved, RestartObserved

pytestmark = pytest.mark.unit


def series_of(namespace: str, job: str) -> list[str]:
    return [
        f"{s.name}{s.labels}"
        for family in REGISTRY.collect()
        for s in family.samples
        if s.labels.get("namespace") == namespace and s.labels.get("job") == job
    ]


def record(namespace: str, job: str) -> None:
    restarts = [RestartObserved("Pod", "HeartbeatTimeout"), RestartObserved("InJob", "InJobRestart", 2)]
    metrics.committed(namespace, job, restarts, [RecoveryObserved("Pod", 3.0)])
    metrics.set_conditions(namespace, job, frozenset({"Running"}))
    metrics.set_heartbeat_ages(namespace, job, {0: 1.5, 1: 2.5})
    metrics.set_goodput(namespace, job, 0.9)


def test_forget_removes_every_series_of_the_job_and_only_those() -> None:
    record("ns-forget", "gone")
    record("ns-forget", "kept")
    running = REGISTRY.get_sample_value("rtj_jobs", {"condition": "Running"})
    assert len(series_of("ns-forget", "gone")) == 7  # 2 restarts and their _created, 2 ages, goodput
    metrics.forget("ns-forget", "gone")
    assert series_of("ns-forget", "gone") == []
    assert len(series_of("ns-forget", "kept")) == 7
    assert REGISTRY.get_sample_value("rtj_jobs", {"condition": "Running"}) == running - 1
    assert (
        REGISTRY.get_sample_value(
            "rtj_restarts_total",
            {"namespace": "ns-forget", "job": "kept", "level": "InJob", "reason": "InJobRestart"},
        )
        == 2
    )


def test_forget_of_a_job_never_seen_is_harmless() -> None:
    metrics.forget("ns-forget", "never")
    assert series_of("ns-forget", "never") == []
