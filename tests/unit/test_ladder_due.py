"""Table tests of `Decision.due` through decide(): every time-based rule that has not fired yet says
when it will, so the operator wakes the job's pass then instead of at the slow resync (issue 18;
rtj.ladder.wakeups). Job under test: heartbeat interval 5 s, timeout 30 s, startup timeout 120 s."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from ladder_testkit import NOW, ago, hb, make_job, observe, running_status
from rtj.api.models import ResilientTrainingJob
from rtj.ladder import Observed, decide
from rtj.ladder.create_refusals import backoff_seconds
from rtj.ladder.observe import CreateRefusal
from rtj.ladder.slots import _OVERDUE_SECONDS

pytestmark = pytest.mark.unit


def later(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def without_lease(obs: Observed, pod: str) -> Observed:
    return Observed(
        pods=obs.pods,
        leases={k: v for k, v in obs.leases.items() if k != pod},
        nodes=obs.nodes,
        service_exists=obs.service_exists,
    )


def running_job(slot1_heartbeat_ago: float = 1) -> ResilientTrainingJob:
    status = running_status(2)
    status["nodeSlots"][1]["lastHeartbeatTime"] = ago(slot1_heartbeat_ago).isoformat()
    return make_job().nodes(2).status(**status).obj()


def finished_job(completed_ago: float) -> ResilientTrainingJob:
    return (
        make_job()
        .nodes(1)
        .spec(ttlSecondsAfterFinished=60)
        .status(
            completionTime=ago(completed_ago).isoformat(),
            conditions=[{"type": "Succeeded", "status": "True", "reason": "AllPodsSucceeded"}],
        )
        .obj()
    )


def stalled_job(progress_ago: float) -> ResilientTrainingJob:
    status = running_status(2, progressStep=100, lastProgressTime=ago(progress_ago).isoformat())
    return make_job().nodes(2).ft(progressTimeoutSeconds=600).status(**status).obj()


def refused(failures: int, last_ago: float) -> Observed:
    obs = observe().obj()
    return Observed(
        pods=obs.pods,
        nodes=obs.nodes,
        create_refusal=CreateRefusal(403, "Forbidden", "forbidden", ago(last_ago), failures),
    )


@dataclass
class Case:
    id: str
    job: ResilientTrainingJob
    observed: Observed
    due: datetime | None


CASES = [
    Case(
        "healthy heartbeating job: only the progress watchdog is due, progressTimeoutSeconds after the "
        "step was seen (its heartbeat deadlines wake it sooner)",
        running_job(),
        observe().running(2, heartbeat=hb(step=5)).obj(),
        later(1800 - 1),
    ),
    Case(
        "a Running pod with no heartbeat yet: due at its startup deadline (started 100 s ago, 120 s)",
        make_job().nodes(1).obj(),
        observe().rdzv().worker(0, started=ago(100)).obj(),
        later(20),
    ),
    Case(
        "a Lease gone after heartbeats: due when the pod counts as silent (last heartbeat 10 s ago)",
        running_job(slot1_heartbeat_ago=10),
        without_lease(observe().running(2).obj(), "train-n1-a0"),
        later(20),
    ),
    Case(
        "a deleting pod whose slot waits: due when its deletion is overdue and must be forced",
        make_job()
        .nodes(1)
        .status(
            nodeSlots=[{"slot": 0, "attempt": 1, "state": "Replacing", "recoveringSince": ago(5).isoformat()}]
        )
        .obj(),
        observe().rdzv().worker(0, deleting=True, delete_by=ago(1)).obj(),
        later(_OVERDUE_SECONDS - 1),
    ),
    Case(
        "progress frozen 500 s with progressTimeoutSeconds 600: due when it stalls",
        stalled_job(500),
        observe().running(2, heartbeat=hb(step=100)).obj(),
        later(100),
    ),
    Case(
        "stalled for 700 s: due when it fails NoProgress (2 x 600 s)",
        stalled_job(700),
        observe().running(2, heartbeat=hb(step=100)).obj(),
        later(500),
    ),
    Case(
        "finished 30 s ago with a 60 s TTL: due when it is deleted",
        finished_job(30),
        observe().obj(),
        later(30),
    ),
    Case("past its TTL: deleted now, nothing due", finished_job(61), observe().obj(), None),
    Case(
        "creates refused twice, 1 s ago: due when the 2 s backoff ends",
        make_job().nodes(2).obj(),
        refused(2, 1),
        later(backoff_seconds(2) - 1),
    ),
    Case(
        "backoff over: the creates run, nothing due for them", make_job().nodes(2).obj(), refused(1, 5), None
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_due(case: Case) -> None:
    assert decide(case.job, case.observed, NOW).due == case.due


def test_a_time_near_year_9999_is_a_deadline_that_never_comes_not_an_overflow() -> None:
    end = datetime.max.replace(tzinfo=NOW.tzinfo)
    job = make_job().nodes(1).obj()
    observed = observe().rdzv().worker(0, started=end - timedelta(seconds=5), created=end).obj()
    assert decide(job, observed, NOW).due == end
