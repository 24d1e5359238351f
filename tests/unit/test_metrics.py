"""The operator's Prometheus exposition: the training job is job_namespace/job_name (never the scrape
target's `namespace`/`job`), and no `_created` series."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY, generate_latest
from rtj import metrics
from rtj.ladder import RestartObserved

pytestmark = pytest.mark.unit


def test_series_name_the_job_without_target_labels_and_have_no_created() -> None:
    metrics.committed("ns-m", "job-m", [RestartObserved(level="InJob", reason="RankDied", count=2)], [])
    metrics.set_goodput("ns-m", "job-m", 0.5)
    metrics.set_heartbeat_ages("ns-m", "job-m", {0: 1.5})
    try:
        text = generate_latest(REGISTRY).decode()
        assert (
            'rtj_restarts_total{job_name="job-m",job_namespace="ns-m",level="InJob",reason="RankDied"} 2.0'
            in text
        )
        assert 'rtj_goodput_ratio{job_name="job-m",job_namespace="ns-m"} 0.5' in text
        for line in text.splitlines():
            if line.startswith("rtj_"):
                assert "_created" not in line.split("{")[0], line
                assert 'job="' not in line and 'namespace="' not in line.replace("job_namespace", ""), line
    finally:
        metrics.forget("ns-m", "job-m")
