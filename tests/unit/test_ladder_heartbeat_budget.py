"""rtj.ladder.heartbeat_budget: the Lease renew period of a job's new pods, from the operator's budget
of heartbeat writes per second and the spec's deadline; the status field, the condition and Event
when the bound binds, and the period reaching the pods' TrainerConfig (issue 30)."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from typing import Any

import pytest
from ladder_testkit import NOW, hb, make_job, observe, running_status
from rtj import contract, creations, executor, reasons
from rtj.ladder import CreateWorkerPod, LadderConfig, SetRenewPeriod, decide
from rtj.ladder import heartbeat_budget as hbb
from rtj.ladder.observe import Fleet

pytestmark = pytest.mark.unit


def ft(interval: int = 10, timeout: int = 60) -> Any:
    return (
        make_job()
        .ft(heartbeatIntervalSeconds=interval, heartbeatTimeoutSeconds=timeout)
        .obj()
        .spec.fault_tolerance
    )


@pytest.mark.parametrize(
    ("interval", "timeout", "workers", "spares", "budget", "expected"),
    [
        # (seconds, needed, bound, exceeded)
        (10, 60, 2048, 0, 0, (10, 0, 20, False)),
        (10, 60, 8, 0, 200, (10, 1, 20, False)),
        (10, 60, 1200, 0, 120, (10, 10, 20, False)),
        (10, 60, 2048, 0, 200, (11, 11, 20, False)),
        (10, 60, 2048, 0, 120, (18, 18, 20, False)),
        (10, 60, 2400, 0, 120, (20, 20, 20, False)),
        (10, 60, 4096, 0, 120, (20, 35, 20, True)),
        (10, 30, 2048, 0, 120, (10, 18, 10, True)),
        (10, 20, 2048, 0, 120, (10, 18, 6, True)),
        (30, 120, 2048, 0, 120, (30, 18, 40, False)),
        (10, 60, 2048, 20, 120, (20, 26, 20, True)),
        (10, 60, 512, 20, 120, (10, 7, 20, False)),
        (10, 60, 512, 60, 120, (20, None, 20, True)),
        (1, 3, 2048, 0, 120, (1, 18, 1, True)),
    ],
    ids=[
        "no budget: the spec's interval",
        "a small job: the spec's interval",
        "exactly the budget at the spec's interval",
        "4 x 512 workers at 200/s: 11 s",
        "4 x 512 workers at 120/s: 18 s",
        "lengthened up to the bound, not past it",
        "beyond the bound: the bound, exceeded",
        "timeout 30: bound 10 = the spec's interval, exceeded",
        "the spec's interval above the bound is kept, exceeded",
        "a spec interval longer than needed is kept",
        "20 standby spares take 40 of 120 writes/s: exceeded",
        "spares leave room: the spec's interval",
        "the spares alone take the whole budget",
        "the shortest timeout: bound 1 s",
    ],
)
def test_renew_period(
    interval: int, timeout: int, workers: int, spares: int, budget: float, expected: tuple[Any, ...]
) -> None:
    period = hbb.renew_period(ft(interval, timeout), Fleet(workers, spares), budget)
    assert (period.seconds, period.needed, period.bound, period.exceeded) == expected


def test_the_period_keeps_the_budget_or_says_so_and_never_risks_the_deadline() -> None:
    """Over a grid of specs, fleets and budgets: the budget only lengthens the spec's interval, at most
    to a third of the timeout; within the bound the writes fit the budget, beyond it it says so."""
    grid = itertools.product(
        [3, 7, 20, 31, 60, 300, 3600],
        [1, 2, 10, 30],
        [1, 64, 512, 2048, 8000, 20000],
        [0, 16],
        [50, 120, 200, 1000],
    )
    for timeout, interval, workers, spares, budget in grid:
        if interval >= timeout:
            continue  # the CRD refuses it (heartbeatTimeoutSeconds must be greater)
        case = (timeout, interval, workers, spares, budget)
        period = hbb.renew_period(ft(interval, timeout), Fleet(workers, spares), budget)
        assert period.seconds >= interval, case
        if period.seconds > interval:
            assert 3 * period.seconds <= timeout, case
        if period.exceeded:
            assert period.seconds == max(interval, timeout // 3), case
        else:
            assert workers / period.seconds + spares / contract.STANDBY_RENEW_SECONDS <= budget + 1e-9, case


def body(nodes: int = 512, spares: int = 0, suspend: bool = False, state: str = "") -> dict[str, Any]:
    return {"spec": {"nodes": nodes, "hotSpares": spares, "suspend": suspend}, "status": {"state": state}}


def test_the_fleet_counts_the_pods_of_running_jobs_only() -> None:
    jobs = [
        body(512, 2, state="Running"),
        body(512, state="Recovering"),
        body(64),  # new: no status yet
        body(512, suspend=True),
        body(512, state="Queued"),
        body(512, state="Succeeded"),
        body(512, state="Failed"),
        {"spec": {"nodes": "x"}},  # malformed: counts nothing
        {},
    ]
    assert hbb.fleet(jobs) == Fleet(workers=512 + 512 + 64, spares=2)


def big_job(nodes: int = 512, timeout: int = 60, **status: Any) -> Any:
    return (
        make_job()
        .nodes(nodes)
        .ft(heartbeatIntervalSeconds=10, heartbeatTimeoutSeconds=timeout, startupTimeoutSeconds=600)
        .status(**status)
        .obj()
    )


def conditions(decision: Any) -> dict[str, tuple[str, str, str]]:
    return {c.type: (c.status, c.reason, c.message) for c in decision.status.conditions}


def events(decision: Any) -> list[tuple[str, str, str]]:
    return [(e.type, e.reason, e.message) for e in decision.events]


def test_a_new_job_under_a_small_budget_creates_its_pods_with_the_longer_period() -> None:
    """3 other jobs of 512 pods run; a 4th of 512 at 120 writes/s: every new pod renews every 18 s."""
    job = big_job()
    others = Fleet(workers=3 * 512)
    decision = decide(job, observe().obj(), NOW, LadderConfig(heartbeat_writes_per_second=120))
    assert decision.status.heartbeat_interval_seconds == 10  # alone: 512 / 120 -> 5 s, the spec's 10
    decision = decide(
        job, replace(observe().obj(), fleet=others), NOW, LadderConfig(heartbeat_writes_per_second=120)
    )
    assert decision.status.heartbeat_interval_seconds == 18
    assert reasons.HEARTBEAT_BUDGET_EXCEEDED not in conditions(decision)
    creates = [a for a in decision.actions if isinstance(a, CreateWorkerPod)]
    assert len(creates) == 512
    decided = executor._as_decided(job, decision)
    pod = creations.objects_to_create(decided, creates[0])[-1]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    config = contract.TrainerConfig.from_env(env[contract.ENV_TRAINER_CONFIG])
    assert config.heartbeat_interval_seconds == 18
    # Without a decision's period (no pass yet): the spec's.
    pod = creations.objects_to_create(job, creates[0])[-1]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert json.loads(env[contract.ENV_TRAINER_CONFIG])["heartbeatIntervalSeconds"] == 10


def test_the_bound_binds_a_condition_and_one_event_name_the_budget_pods_and_period() -> None:
    cfg = LadderConfig(heartbeat_writes_per_second=120)
    job = big_job(timeout=30, **running_status(512))
    obs = observe().running(512, heartbeat=hb(step=100)).obj()
    busy = replace(obs, fleet=Fleet(workers=3 * 512))
    first = decide(job, busy, NOW, cfg)
    assert first.status.heartbeat_interval_seconds == 10  # bound: 30 / 3
    status, reason, message = conditions(first)[reasons.HEARTBEAT_BUDGET_EXCEEDED]
    assert (status, reason) == ("True", reasons.HEARTBEAT_BUDGET_EXCEEDED)
    for part in (
        "120 Lease writes/s",
        "2048 worker pods",
        "18s",
        "heartbeatTimeoutSeconds=30",
        "512 pods",
        "every 10s",
    ):
        assert part in message, (part, message)
    assert events(first) == [("Warning", reasons.HEARTBEAT_BUDGET_EXCEEDED, message)]
    # The next pass, the same fleet: the condition stays, no second Event.
    again = decide(job.model_copy(update={"status": first.status}), busy, NOW, cfg)
    assert conditions(again)[reasons.HEARTBEAT_BUDGET_EXCEEDED][0] == "True"
    assert [e for e in events(again) if e[1].startswith("HeartbeatBudget")] == []
    # Two jobs ended: the budget is met again (condition False, one Normal Event).
    alone = replace(obs, fleet=Fleet(workers=512))
    met = decide(job.model_copy(update={"status": again.status}), alone, NOW, cfg)
    assert met.status.heartbeat_interval_seconds == 10
    assert conditions(met)[reasons.HEARTBEAT_BUDGET_EXCEEDED][:2] == ("False", reasons.HEARTBEAT_BUDGET_MET)
    assert [e[:2] for e in events(met) if e[1].startswith("HeartbeatBudget")] == [
        ("Normal", reasons.HEARTBEAT_BUDGET_MET)
    ]


def test_no_budget_keeps_the_spec_and_no_condition() -> None:
    decision = decide(big_job(), observe().obj(), NOW, LadderConfig())
    assert decision.status.heartbeat_interval_seconds == 10
    assert reasons.HEARTBEAT_BUDGET_EXCEEDED not in conditions(decision)


def renew_asks(decision: Any) -> dict[str, int]:
    return {a.lease: a.seconds for a in decision.actions if isinstance(a, SetRenewPeriod)}


def test_running_pods_follow_the_budget_on_their_lease_once_and_back_when_it_frees() -> None:
    """512 pods created alone renew every 10 s (Leases of 30 s); 3 more jobs of 512 start: at 120
    writes/s each running pod is asked, on its Lease, to renew every 18 s, once."""
    cfg = LadderConfig(heartbeat_writes_per_second=120)
    job = big_job(**running_status(512))
    busy = Fleet(workers=3 * 512)
    created_alone = replace(observe().running(512, duration=30).obj(), fleet=busy)
    asks = renew_asks(decide(job, created_alone, NOW, cfg))
    assert len(asks) == 512 and set(asks.values()) == {18}
    # Asked (the annotation is there), or created with 18 s (Leases of 54 s): nothing more to write.
    asked = replace(observe().running(512, duration=30, renew_period=18).obj(), fleet=busy)
    assert renew_asks(decide(job, asked, NOW, cfg)) == {}
    created_at_18 = replace(observe().running(512, duration=54).obj(), fleet=busy)
    assert renew_asks(decide(job, created_at_18, NOW, cfg)) == {}
    # The other jobs ended: back to the spec's 10 s.
    alone = replace(observe().running(512, duration=30, renew_period=18).obj(), fleet=Fleet())
    assert set(renew_asks(decide(job, alone, NOW, cfg)).values()) == {10}
    # No budget, pods at the spec's period: no write at all; a fenced Lease is never asked.
    assert renew_asks(decide(job, observe().running(512, duration=30).obj(), NOW, LadderConfig())) == {}
    fenced = observe().running(1, duration=30).obj()
    lease = next(iter(fenced.leases.values()))
    fenced = replace(fenced, leases={lease.name: replace(lease, fenced=True)}, fleet=busy)
    assert renew_asks(decide(big_job(nodes=1, **running_status(1)), fenced, NOW, cfg)) == {}


@pytest.mark.parametrize(
    ("value", "expected"),
    [("18", 18), ("1", 1), ("300", 300), ("0", None), ("301", None), ("-5", None), ("x", None), (None, None)],
)
def test_the_renew_period_annotation_is_a_period_in_range_or_nothing(
    value: Any, expected: int | None
) -> None:
    annotations = {} if value is None else {contract.RENEW_PERIOD_ANNOTATION: value}
    assert contract.parse_renew_period(annotations) == expected


def test_the_period_a_lease_says_is_the_asked_one_else_its_duration_over_three() -> None:
    lease = observe().running(1, duration=30).obj().leases
    (one,) = lease.values()
    assert hbb.lease_period(one) == 10
    assert hbb.lease_period(replace(one, renew_period=18)) == 18
    assert hbb.lease_period(replace(one, duration_seconds=None)) is None
