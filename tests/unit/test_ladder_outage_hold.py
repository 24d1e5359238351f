"""Table tests of the outage hold's hysteresis (rtj.ladder.outage_hold) through decide().

Heartbeats of most slots going stale together hold replacements (Degraded/HeartbeatsStale). Issue
18: at 300 jobs a slow API server let Lease renewals lag, and the hold flapped (404 Events in 6
minutes, no fault injected). The hold now enters on a majority of stale slots with one past its
deadline and leaves only when at most one slot is stale. Job: 8 slots, heartbeatTimeoutSeconds 30
(stale: older than 15 s; silent: older than 30 s)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from ladder_testkit import hb, make_job, observe, running_status
from rtj import reasons
from rtj.api.models import ResilientTrainingJob
from rtj.ladder import DeletePod, Observed, TaintNode, decide

pytestmark = pytest.mark.unit

HELD = {"type": "Degraded", "status": "True", "reason": "HeartbeatsStale", "message": "held"}


def job(held: bool) -> ResilientTrainingJob:
    status = running_status(8)
    if held:
        status["conditions"] = [HELD]
    return make_job().nodes(8).status(**status).obj()


def ages(*seconds: float) -> Observed:
    """8 running slots whose Leases were renewed these many seconds ago (slot 0 first)."""
    obs = observe().rdzv()
    for slot, age in enumerate(seconds):
        obs = obs.worker(slot).lease(f"train-n{slot}-a0", age, hb())
    return obs.obj()


@dataclass
class Case:
    id: str
    held: bool
    observed: Observed
    actions: list[Any] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    degraded: tuple[str, str] = ("False", reasons.ALL_PODS_RUNNING)


CASES = [
    Case(
        "5 of 8 stale, one past its deadline: the hold begins, one Event",
        False,
        ages(31, 20, 20, 20, 20, 1, 1, 1),
        events=[reasons.HEARTBEATS_STALE],
        degraded=("True", reasons.HEARTBEATS_STALE),
    ),
    Case(
        "4 of 8 stale (not a majority), one past its deadline: no hold, that pod is replaced",
        False,
        ages(31, 20, 20, 20, 1, 1, 1, 1),
        [DeletePod("train-n0-a0", "uid-train-n0-a0", 0), TaintNode("node-0")],
        events=[reasons.HEARTBEAT_TIMEOUT, reasons.NODE_QUARANTINED],
        degraded=("True", reasons.PODS_PENDING),
    ),
    Case(
        "held, renewals catching up (3 of 8 still stale, none silent): still held, no Event",
        True,
        ages(20, 20, 20, 1, 1, 1, 1, 1),
        degraded=("True", reasons.HEARTBEATS_STALE),
    ),
    Case(
        "held, 2 stale and one of them silent: its replacement is still held",
        True,
        ages(31, 20, 1, 1, 1, 1, 1, 1),
        degraded=("True", reasons.HEARTBEATS_STALE),
    ),
    Case(
        "held, at most one slot stale: the hold ends",
        True,
        ages(20, 1, 1, 1, 1, 1, 1, 1),
    ),
    Case(
        "held, one slot still silent after the rest resumed: the hold ends and that pod is replaced",
        True,
        ages(31, 1, 1, 1, 1, 1, 1, 1),
        [DeletePod("train-n0-a0", "uid-train-n0-a0", 0), TaintNode("node-0")],
        events=[reasons.HEARTBEAT_TIMEOUT, reasons.NODE_QUARANTINED],
        degraded=("True", reasons.PODS_PENDING),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_outage_hold(case: Case) -> None:
    from ladder_testkit import NOW

    d = decide(job(case.held), case.observed, NOW)
    assert d.actions == case.actions
    assert [e.reason for e in d.events] == case.events
    degraded = next(c for c in d.status.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == case.degraded
