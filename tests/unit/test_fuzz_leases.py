"""Malformed heartbeat Leases (the workload writes them) never crash the operator's pure code and
never cause a reschedule on their own (hypothesis).

A Lease's annotation is the trainer's report; its renewTime is the heartbeat itself. So:
- garbage wherever a trainer can put it (the heartbeat JSON with wrong types, huge numbers, unknown
  keys; non-JSON; giant strings; a renewTime far in the future or the past, or none) parses without
  an exception (the API server itself enforces the Lease's shape: string maps, a MicroTime);
- a Lease with a fresh renewTime and a garbage annotation is a live pod: nothing is deleted,
  created, tainted or counted, and no Warning Event is emitted;
- a Lease whose renewTime is unusable (missing, unparsable, a wrong type) is treated exactly as no
  Lease at all: the decision equals the decision without that Lease (the startup deadline applies);
- a renewTime in the future is never fresher than the moment the operator saw it.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ladder_testkit import NOW, ago, hb, make_job, observe, running_status
from rtj import contract, reasons
from rtj.ladder import (
    OBSERVED_AT,
    CreateWorkerPod,
    DeletePod,
    Observed,
    PromoteSpare,
    TaintNode,
    decide,
    lease_from_dict,
)

pytestmark = pytest.mark.unit

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
BIG_INTS = st.sampled_from([-1, 2**53, 2**53 + 1, 2**63, 2**64, -(2**63), 10**30])
HEARTBEAT_KEYS = [
    "state",
    "inProcessRestarts",
    "inJobRestarts",
    "step",
    "checkpoint",
    "checkpointsSkipped",
    "fault",
]


@st.composite
def garbage_heartbeats(draw: st.DrawFn) -> Any:
    """Annotation values: any JSON, non-JSON, giant strings, and heartbeats with wrong types."""
    kind = draw(st.sampled_from(["json", "text", "giant", "fields"]))
    if kind == "json":
        return json.dumps(draw(JSON))
    if kind == "text":
        return draw(st.text(max_size=50))
    if kind == "giant":
        return (
            '{"state": "Training", "fault": {"message": "'
            + "x" * draw(st.sampled_from([16_000, 70_000]))
            + '"}}'
        )
    if kind == "fields":
        data = {"state": draw(st.sampled_from(["Training", "Standby", "Finished", "bogus", 5]))}
        for key in draw(st.lists(st.sampled_from(HEARTBEAT_KEYS), max_size=4)):
            data[key] = draw(st.one_of(JSON, BIG_INTS, st.just("1e400")))
    return json.dumps(data)


#: renewTime as the API server hands it out (a MicroTime, always UTC, years 1..9999), or absent.
RENEW_TIMES = st.one_of(
    st.none(),
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)).map(
        lambda d: d.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    ),
    st.integers(-(10**6), 10**6).map(
        lambda s: (NOW + timedelta(seconds=s)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    ),
)
#: What the index may hold when the API server gave it no usable time.
UNUSABLE_TIMES = st.one_of(st.none(), st.sampled_from(["", "garbage", "2026-13-45T99:99:99Z"]), st.integers())
TEXT_MAPS = st.dictionaries(st.text(min_size=1, max_size=20), st.text(max_size=40), max_size=4)


@st.composite
def garbage_leases(draw: st.DrawFn, name: str, renew: Any) -> dict[str, Any]:
    """A Lease with the shapes the API server enforces (annotations map[string]string, spec typed),
    and garbage wherever the workload can put it: the annotations' values, renewTime's instant."""
    annotations = draw(TEXT_MAPS)
    annotations[contract.HEARTBEAT_ANNOTATION] = draw(
        garbage_heartbeats().filter(lambda v: isinstance(v, str))
    )
    if draw(st.booleans()):
        annotations[contract.ASSIGNED_SLOT_ANNOTATION] = draw(st.text(max_size=5))
    spec: dict[str, Any] = {
        "holderIdentity": draw(st.text(max_size=10)),
        "leaseDurationSeconds": draw(BIG_INTS),
    }
    if renew is not None:
        spec["renewTime"] = renew
    return {"metadata": {"name": name, "annotations": annotations}, "spec": spec}


@FUZZ
@given(st.data(), RENEW_TIMES, st.one_of(st.none(), RENEW_TIMES))
def test_any_lease_parses_without_an_exception(data: st.DataObject, renew: Any, observed: Any) -> None:
    lease = data.draw(garbage_leases("p", renew))
    if observed is not None:
        lease[OBSERVED_AT] = observed
    parsed = lease_from_dict(lease, NOW)
    assert parsed.renew_time is None or parsed.renew_time <= NOW
    assert parsed.heartbeat is None or isinstance(parsed.heartbeat, contract.Heartbeat)


def _healthy(n: int = 3) -> tuple[Any, Any]:
    job = make_job().nodes(n).status(**running_status(n)).obj()
    return job, observe().running(n)


def _replacements(decision: Any) -> list[Any]:
    return [
        a for a in decision.actions if isinstance(a, DeletePod | CreateWorkerPod | PromoteSpare | TaintNode)
    ]


def _with_lease(observed: Observed, name: str, lease: dict[str, Any] | None) -> Observed:
    leases = dict(observed.leases)
    if lease is None:
        leases.pop(name, None)
    else:
        leases[name] = lease_from_dict(lease, NOW)
    return Observed(pods=observed.pods, leases=leases, nodes=observed.nodes, service_exists=True)


@FUZZ
@given(st.integers(0, 2), st.data())
def test_garbage_heartbeat_with_a_fresh_renewal_changes_nothing(slot: int, data: st.DataObject) -> None:
    job, builder = _healthy()
    pod = contract.worker_pod_name("train", slot, 0)
    lease = data.draw(garbage_leases(pod, ago(1).strftime("%Y-%m-%dT%H:%M:%S.%fZ")))  # a fresh heartbeat
    decision = decide(job, _with_lease(builder.obj(), pod, lease), NOW)
    assert _replacements(decision) == []
    # A well-formed report may still count soft restarts (counters up to MAX_COUNTER are legal).
    assert [r for r in decision.restarts if r.level == reasons.LEVEL_POD] == []
    assert decision.status.restarts.pod_reschedules == job.status.restarts.pod_reschedules
    assert [e for e in decision.events if e.type == "Warning"] == []


@FUZZ
@given(st.integers(0, 2), st.data(), st.sampled_from([10.0, 300.0]))
def test_unusable_renew_time_is_the_same_as_no_lease(
    slot: int, data: st.DataObject, started_ago: float
) -> None:
    """Whatever else the Lease holds, without a usable renewTime the pod is judged as one that never
    heartbeated: no earlier and no other reaction than with no Lease at all."""
    renew = data.draw(UNUSABLE_TIMES)
    job = make_job().nodes(3).status(**running_status(3)).obj()
    builder = observe().rdzv()
    for s in range(3):
        builder.worker(s, started=ago(started_ago), created=ago(started_ago))
        builder.lease(contract.worker_pod_name("train", s, 0), 1.0, hb())
    pod = contract.worker_pod_name("train", slot, 0)
    lease = data.draw(garbage_leases(pod, renew))
    with_garbage = decide(job, _with_lease(builder.obj(), pod, lease), NOW)
    without = decide(job, _with_lease(builder.obj(), pod, None), NOW)
    assert _replacements(with_garbage) == _replacements(without)
    assert with_garbage.status.restarts.pod_reschedules == without.status.restarts.pod_reschedules
    if started_ago < job.spec.fault_tolerance.startup_timeout_seconds:
        assert _replacements(with_garbage) == []


@FUZZ
@given(st.integers(1, 10**8), st.floats(0, 120))
def test_future_renew_time_counts_from_when_it_was_seen(ahead: int, seen_ago: float) -> None:
    """A renewTime in the future (skew, a bug) is a renewal when it arrives, then ages: a pod that
    wrote one and died is still found silent heartbeatTimeoutSeconds later."""
    seen = ago(seen_ago)
    future = (NOW + timedelta(seconds=ahead)).isoformat()
    lease = lease_from_dict(
        {"metadata": {"name": "p"}, "spec": {"renewTime": future}, OBSERVED_AT: seen}, NOW
    )
    assert lease.renew_time == seen
    job, builder = _healthy()
    pod = contract.worker_pod_name("train", 0, 0)
    decision = decide(
        job,
        _with_lease(
            builder.obj(), pod, {"metadata": {"name": pod}, "spec": {"renewTime": future}, OBSERVED_AT: seen}
        ),
        NOW,
    )
    timed_out = seen_ago > job.spec.fault_tolerance.heartbeat_timeout_seconds
    assert bool(_replacements(decision)) == timed_out
