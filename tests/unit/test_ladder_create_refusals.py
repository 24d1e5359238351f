"""Table tests of the create-refusal policy (rtj.ladder.create_refusals) through decide(): a create
the API server refuses with a 403 shows on the job (condition + one Event), is retried with backoff,
and clears once a create is accepted (issue 13, case 5)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest
from ladder_testkit import NOW, ago, make_job, observe
from rtj import reasons
from rtj.api.models import ResilientTrainingJob
from rtj.ladder import CreateRendezvousPod, CreateWorkerPod, Observed, decide
from rtj.ladder.create_refusals import backoff_seconds, is_retryable_refusal
from rtj.ladder.observe import CreateRefusal

pytestmark = pytest.mark.unit

SA_MISSING = 'pods "train-n0-a0" is forbidden: error looking up service account ns/rtj-trainer: not found'
MESSAGE = f"the API server refused to create the job's objects (403): {SA_MISSING}"


def refused(failures: int, last: datetime, message: str = SA_MISSING) -> Observed:
    obs = observe().obj()
    return Observed(
        pods=obs.pods,
        nodes=obs.nodes,
        create_refusal=CreateRefusal(403, "Forbidden", message, last, failures),
    )


def job(condition: str | None = None, message: str = MESSAGE) -> ResilientTrainingJob:
    b = make_job().nodes(2)
    if condition is not None:
        b = b.status(
            conditions=[
                {
                    "type": "CreateRefused",
                    "status": condition,
                    "reason": "Forbidden",
                    "message": message if condition == "True" else "",
                    "lastTransitionTime": ago(30).isoformat(),
                }
            ]
        )
    return b.obj()


ALL_CREATES = [CreateRendezvousPod(), CreateWorkerPod(0, 0, "Initial"), CreateWorkerPod(1, 0, "Initial")]


@dataclass
class Case:
    id: str
    job: ResilientTrainingJob
    observed: Observed
    actions: list[Any]
    events: list[str] = field(default_factory=list)
    condition: tuple[str, str] | None = None  # (status, reason) of CreateRefused; None: absent
    reason: str = reasons.PODS_PENDING


CASES = [
    Case(
        "first refusal: condition and one Event with the server's message; creates wait 1 s",
        job(),
        refused(1, ago(0.5)),
        [],
        [reasons.CREATE_REFUSED],
        ("True", "Forbidden"),
        reasons.CREATE_REFUSED,
    ),
    Case(
        "same refusal again after the backoff: creates retried, no second Event",
        job("True"),
        refused(1, ago(1.5)),
        ALL_CREATES,
        [],
        ("True", "Forbidden"),
        reasons.CREATE_REFUSED,
    ),
    Case(
        "7th refusal in a row: backoff capped at 60 s, still waiting at 59 s",
        job("True"),
        refused(7, ago(59)),
        [],
        [],
        ("True", "Forbidden"),
        reasons.CREATE_REFUSED,
    ),
    Case(
        "7th refusal in a row: retried after 60 s",
        job("True"),
        refused(7, ago(61)),
        ALL_CREATES,
        [],
        ("True", "Forbidden"),
        reasons.CREATE_REFUSED,
    ),
    Case(
        "a different refusal (Pod Security now): a new Event",
        job("True"),
        refused(2, ago(0.5), 'pods "train-n0-a0" is forbidden: violates PodSecurity "restricted:latest"'),
        [],
        [reasons.CREATE_REFUSED],
        ("True", "Forbidden"),
        reasons.CREATE_REFUSED,
    ),
    Case(
        "creates accepted again: condition False, no Event",
        job("True"),
        observe().obj(),
        ALL_CREATES,
        [],
        ("False", reasons.CREATES_ACCEPTED),
    ),
    Case("never refused: no condition at all", job(), observe().obj(), ALL_CREATES, [], None),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_create_refusals(case: Case) -> None:
    d = decide(case.job, case.observed, NOW)
    assert d.actions == case.actions
    assert [e.reason for e in d.events] == case.events
    cond = next((c for c in d.status.conditions if c.type == "CreateRefused"), None)
    assert (None if cond is None else (cond.status, cond.reason)) == case.condition
    if cond is not None and cond.status == "True":
        assert SA_MISSING in cond.message or "PodSecurity" in cond.message
    assert (d.status.state, d.status.reason) == ("Pending", case.reason)


def test_event_carries_the_servers_message() -> None:
    d = decide(job(), refused(1, ago(0.5)), NOW)
    assert SA_MISSING in d.events[0].message and d.events[0].type == "Warning"


@pytest.mark.parametrize(
    "failures,seconds", [(1, 1), (2, 2), (3, 4), (6, 32), (7, 60), (50, 60)], ids=lambda v: str(v)
)
def test_backoff(failures: int, seconds: float) -> None:
    assert backoff_seconds(failures) == seconds


@pytest.mark.parametrize(
    "status,retryable",
    [
        (400, True),
        (401, True),
        (403, True),
        (404, True),
        (409, False),
        (422, False),
        (429, False),
        (500, False),
    ],
)
def test_which_refusals_are_retried(status: int, retryable: bool) -> None:
    assert is_retryable_refusal(status) is retryable
