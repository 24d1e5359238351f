"""rtj.metrics: the training job is job_namespace/job_name (never the scrape target's `namespace`/`job`),
no `_created` series; a deleted job's series go away (through prometheus-client's public API only), and
another job's stay."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY, generate_latest
from rtj import metrics
from rtj.ladder import RecoveryObserved, RestartObserved

pytestmark = pytest.mark.unit


def series_of(namespace: str, job: str) -> list[str]:
    return [
        f"{s.name}{s.labels}"
        for family in REGISTRY.collect()
        for s in family.samples
        if s.labels.get("job_namespace") == namespace and s.labels.get("job_name") == job
    ]


def record(namespace: str, job: str) -> None:
    restarts = [RestartObserved("Pod", "HeartbeatTimeout"), RestartObserved("InJob", "InJobRestart", 2)]
    recoveries = [RecoveryObserved("Pod", 3.0, "HeartbeatTimeout", 20), RecoveryObserved("InProcess", 0.5)]
    metrics.committed(namespace, job, restarts, recoveries)
    metrics.set_conditions(namespace, job, frozenset({"Running"}))
    metrics.set_heartbeat_ages(namespace, job, {0: 1.5, 1: 2.5})
    metrics.set_goodput(namespace, job, 0.9)


def test_series_name_the_job_without_target_labels_and_have_no_created() -> None:
    record("ns-labels", "job-m")
    try:
        text = generate_latest(REGISTRY).decode()
        restarts = 'rtj_restarts_total{job_name="job-m",job_namespace="ns-labels",level="InJob",'
        assert f'{restarts}reason="InJobRestart"}} 2.0' in text
        assert 'rtj_goodput_ratio{job_name="job-m",job_namespace="ns-labels"} 0.9' in text
        lost = 'rtj_steps_lost_total{job_name="job-m",job_namespace="ns-labels",level="Pod",'
        assert f'{lost}reason="HeartbeatTimeout"}} 20.0' in text
        assert 'rtj_recovery_seconds_count{level="Pod",reason="HeartbeatTimeout"}' in text
        for line in text.splitlines():
            if line.startswith("rtj_"):
                assert "_created" not in line.split("{")[0], line
                assert 'job="' not in line and 'namespace="' not in line.replace("job_namespace", ""), line
    finally:
        metrics.forget("ns-labels", "job-m")


def test_forget_removes_every_series_of_the_job_and_only_those() -> None:
    record("ns-forget", "gone")
    record("ns-forget", "kept")
    running = REGISTRY.get_sample_value("rtj_jobs", {"condition": "Running"})
    # 2 restarts, 1 steps lost (the recovery whose steps are known), 2 ages, goodput (no _created)
    assert len(series_of("ns-forget", "gone")) == 6
    metrics.forget("ns-forget", "gone")
    assert series_of("ns-forget", "gone") == []
    assert len(series_of("ns-forget", "kept")) == 6
    assert REGISTRY.get_sample_value("rtj_jobs", {"condition": "Running"}) == running - 1
    assert (
        REGISTRY.get_sample_value(
            "rtj_restarts_total",
            {"job_namespace": "ns-forget", "job_name": "kept", "level": "InJob", "reason": "InJobRestart"},
        )
        == 2
    )


def test_forget_of_a_job_never_seen_is_harmless() -> None:
    metrics.forget("ns-forget", "never")
    assert series_of("ns-forget", "never") == []
