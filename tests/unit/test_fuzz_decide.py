"""The ladder on arbitrary observations (hypothesis): for any valid spec and any status a previous
pass wrote, any mix of pods (any phase, slot, attempt, labels edited by hand, being deleted), Leases
(fresh, stale, future, malformed) and nodes (Ready, NotReady, unknown, gone), decide() and the
builders never raise, the status it writes parses back, and it never creates or promotes a pod into
a slot that still has a live or terminating pod."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reliability.specgen import manifest, oracle, valid_spec
from reliability.states import exercise, observed_states, scenario_states
from rtj.api.models import ResilientTrainingJob
from rtj.ladder import decide

pytestmark = pytest.mark.unit

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def job_from(spec: dict[str, Any], status: dict[str, Any] | None = None) -> ResilientTrainingJob:
    spec = {**spec, "nodes": min(spec["nodes"], 8), "hotSpares": min(spec.get("hotSpares", 0), 3)}
    obj = manifest("train", spec)
    obj["metadata"].update(namespace="ns", uid="uid-train", generation=1)
    obj["status"] = status or {}
    return ResilientTrainingJob.model_validate(obj)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(valid_spec())
def test_the_valid_spec_strategy_draws_only_valid_specs(spec: dict[str, Any]) -> None:
    # Every property below assumes it; a new API rule must be followed by the strategy.
    assert oracle(spec) == (True, ""), oracle(spec)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(valid_spec(), st.data())
def test_decide_never_raises_and_never_doubles_a_slot(spec: dict[str, Any], data: st.DataObject) -> None:
    job = job_from(spec)
    # Three passes over changing observations, each starting from the status the last one wrote.
    for tick in range(3):
        now = NOW + timedelta(seconds=tick * 7)
        observed = data.draw(observed_states(job, now))
        decision = exercise(job, observed, now)
        job = job.model_copy(update={"status": decision.status})


def test_decide_handles_the_widest_job() -> None:
    """nodes=10000 (the CRD's maximum): one pass decides every slot (it creates every pod)."""
    job = job_from({"image": "i", "command": ["c"], "nodes": 1, "checkpoint": {"pvc": {"claimName": "c"}}})
    job = job.model_copy(update={"spec": job.spec.model_copy(update={"nodes": 10000})})
    first = decide(job, scenario_states(job, NOW)[0], NOW)
    assert sum(type(a).__name__ == "CreateWorkerPod" for a in first.actions) == 10000
    assert len(first.status.node_slots) == 10000
