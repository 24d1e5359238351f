"""Table tests of the outage hold's hysteresis (rtj.ladder.outage_hold) through decide().

Heartbeats of most slots going stale together hold replacements (Degraded/HeartbeatsStale). Issue
18: at 300 jobs a slow API server let Lease renewals lag, and the hold flapped (404 Events in 6
minutes, no fault injected). The hold now enters on a majority of stale slots with one past its
deadline and leaves only when at most one slot is stale. Job: 8 slots, heartbeatTimeoutSeconds 30
(stale: older than 15 s; silent: older than 30 s)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from ladder_testkit import NOW, hb, make_job, observe, recorded, running_status
from rtj import reasons
from rtj.api.models import ResilientTrainingJob
from rtj.ladder import DeletePod, Observed, decide

pytestmark = pytest.mark.unit

HELD = {"type": "Degraded", "status": "True", "reason": "HeartbeatsStale", "message": "held"}


def job(held: bool, hold_ended_ago: float | None = None) -> ResilientTrainingJob:
    status = running_status(8)
    if held:
        status["conditions"] = [HELD]
    if hold_ended_ago is not None:
        status["heartbeatHoldEndTime"] = (NOW - timedelta(seconds=hold_ended_ago)).isoformat()
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
    #: status.heartbeatHoldEndTime, seconds before now (None: no hold ended yet).
    hold_ended_ago: float | None = None
    #: Seconds from now of the next pass the decision asks for (None: not checked).
    due_in: float | None = None
    #: status.heartbeatHoldEndTime written by the pass, seconds before now.
    hold_end_after: float | None = None


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
        [DeletePod("train-n0-a0", "uid-train-n0-a0", 0), recorded("node-0", reasons.HEARTBEAT_TIMEOUT)],
        events=[reasons.HEARTBEAT_TIMEOUT],
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
        # make demo, 2026-12-02: slot 0's agent renewed a tick after slot 1's; replacing it at once
        # replaced a pod that trained fine (and quarantined its node).
        "held, one slot still silent after the rest resumed: the hold ends, that slot gets a whole "
        "deadline from now",
        True,
        ages(31, 1, 1, 1, 1, 1, 1, 1),
        due_in=30,
        hold_end_after=0,
    ),
    Case(
        "the hold ended 10 s ago, that slot silent for 41 s: not yet silent, due at the hold's end + 30 s",
        False,
        ages(41, 1, 1, 1, 1, 1, 1, 1),
        hold_ended_ago=10,
        due_in=20,
        hold_end_after=10,
    ),
    Case(
        "the hold ended 31 s ago and that slot never renewed: replaced, the message names both times",
        False,
        ages(62, 1, 1, 1, 1, 1, 1, 1),
        [DeletePod("train-n0-a0", "uid-train-n0-a0", 0), recorded("node-0", reasons.HEARTBEAT_TIMEOUT)],
        events=[reasons.HEARTBEAT_TIMEOUT],
        degraded=("True", reasons.PODS_PENDING),
        hold_ended_ago=31,
    ),
    Case(
        "a hold ended long ago: a slot renewed since is timed from its renewal as usual",
        False,
        ages(31, 1, 1, 1, 1, 1, 1, 1),
        [DeletePod("train-n0-a0", "uid-train-n0-a0", 0), recorded("node-0", reasons.HEARTBEAT_TIMEOUT)],
        events=[reasons.HEARTBEAT_TIMEOUT],
        degraded=("True", reasons.PODS_PENDING),
        hold_ended_ago=600,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_outage_hold(case: Case) -> None:
    d = decide(job(case.held, case.hold_ended_ago), case.observed, NOW)
    assert d.actions == case.actions
    assert [e.reason for e in d.events] == case.events
    degraded = next(c for c in d.status.conditions if c.type == "Degraded")
    assert (degraded.status, degraded.reason) == case.degraded
    if case.due_in is not None:
        assert d.due == NOW + timedelta(seconds=case.due_in)
    if case.hold_end_after is not None:
        assert d.status.heartbeat_hold_end_time == NOW - timedelta(seconds=case.hold_end_after)


def test_silence_after_a_hold_names_both_times() -> None:
    d = decide(job(False, hold_ended_ago=31), ages(62, 1, 1, 1, 1, 1, 1, 1), NOW)
    message = next(e.message for e in d.events if e.reason == reasons.HEARTBEAT_TIMEOUT)
    assert "heartbeat silent for 62s, 31s since the outage hold ended" in message


def test_a_pod_started_during_the_hold_gets_its_startup_deadline_from_the_hold_end() -> None:
    """A pod that started before the hold ended and never heartbeated: startupTimeoutSeconds (600)
    counts from the hold's end, not from its start."""
    obs = observe().rdzv().worker(0, started=NOW - timedelta(seconds=700))
    for slot in range(1, 8):
        obs = obs.worker(slot).lease(f"train-n{slot}-a0", 1, hb())

    def starting(hold_ended_ago: float) -> ResilientTrainingJob:
        rtj = job(False, hold_ended_ago)
        rtj.status.node_slots[0].last_heartbeat_time, rtj.status.node_slots[0].state = None, "Starting"
        return rtj

    d = decide(starting(100), obs.obj(), NOW)
    assert d.actions == []
    assert reasons.STARTUP_TIMEOUT not in [e.reason for e in d.events]
    d = decide(starting(601), obs.obj(), NOW)
    assert [e.reason for e in d.events][:1] == [reasons.STARTUP_TIMEOUT]
    assert "no heartbeat 700s after start, 601s since the outage hold ended" in d.events[0].message
