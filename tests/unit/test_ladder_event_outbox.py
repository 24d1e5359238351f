"""Events that survive an operator crash (rtj.ladder.event_outbox): each Event a pass decides is
written with that pass's status, posted afterwards under a deterministic name, and dropped from
status once posted; a restarted operator posts what status still holds (issue 13, case 7)."""

from __future__ import annotations

import pytest
from ladder_testkit import NOW, make_job, observe, running_status
from rtj import reasons
from rtj.ladder import Observed, decide
from rtj.ladder.actions import JobEvent
from rtj.ladder.event_outbox import MAX_UNPOSTED, event_name, record

pytestmark = pytest.mark.unit


def with_posted(obs: Observed, posted: int | None) -> Observed:
    return Observed(pods=obs.pods, leases=obs.leases, nodes=obs.nodes, events_posted=posted)


def faulted() -> Observed:
    return observe().running(2).worker(1, phase="Failed", exit_code=1).obj()


def test_the_pass_that_decides_an_event_writes_it_into_status() -> None:
    job = make_job().nodes(2).status(**running_status(2)).obj()
    d = decide(job, faulted(), NOW)
    assert [e.reason for e in d.events] == [reasons.POD_FAILED]
    assert [(e.seq, e.reason) for e in d.status.unposted_events] == [(1, reasons.POD_FAILED)]
    assert d.status.last_event_seq == 1


@pytest.mark.parametrize(
    "posted,left",
    [(None, [1]), (0, [1]), (1, [])],
    ids=["restarted operator: unknown, kept", "not yet posted: kept", "posted: dropped"],
)
def test_crash_between_status_write_and_event(posted: int | None, left: list[int]) -> None:
    """The operator wrote status with the PodFailed Event and died before posting it: the next
    pass (of a restarted operator) keeps it for posting and decides no second PodFailed."""
    job = make_job().nodes(2).status(**running_status(2)).obj()
    first = decide(job, faulted(), NOW)
    after = job.model_copy(update={"status": first.status})
    obs = observe().running(2).worker(1, phase="Failed", exit_code=1, deleting=True).obj()
    d = decide(after, with_posted(obs, posted), NOW)
    assert [e.seq for e in d.status.unposted_events] == left
    assert d.events == [] and d.status.restarts.pod_reschedules == 1, "counted and evented once"


def test_outbox_is_bounded_and_numbers_keep_increasing() -> None:
    status = make_job().obj().status
    record(status, [JobEvent("Normal", "R", str(i)) for i in range(MAX_UNPOSTED + 5)], None, NOW)
    assert len(status.unposted_events) == MAX_UNPOSTED
    assert status.unposted_events[-1].seq == status.last_event_seq == MAX_UNPOSTED + 5
    record(status, [JobEvent("Normal", "R", "next")], MAX_UNPOSTED + 5, NOW)
    assert [e.seq for e in status.unposted_events] == [MAX_UNPOSTED + 6]


def test_event_names_are_deterministic_per_job_incarnation() -> None:
    a = event_name("train", "0b9c1c1e-1111-2222-3333-444455556666", 7)
    assert a == event_name("train", "0b9c1c1e-1111-2222-3333-444455556666", 7) == "train.0b9c1c1e1111.7"
    assert a != event_name("train", "ffff1c1e-1111-2222-3333-444455556666", 7)
