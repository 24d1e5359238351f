"""Table tests of the progress watchdog (rtj.ladder.progress_watchdog) through decide(): pods all
running, step frozen -> Stalled (one Event) -> NoProgress; a worker that exited 0 early while the
others wait is named (issue 13, case 2). progressTimeoutSeconds 600 here; resolution 60 s."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from ladder_testkit import NOW, ago, hb, make_job, observe, running_status
from rtj import reasons
from rtj.api.models import ResilientTrainingJob
from rtj.ladder import DeletePod, Observed, decide

pytestmark = pytest.mark.unit


def job(progress_ago: float | None, step: int = 100, stalled: bool = False) -> ResilientTrainingJob:
    status = running_status(2, progressStep=step)
    if progress_ago is not None:
        status["lastProgressTime"] = ago(progress_ago).isoformat()
    if stalled:
        status["conditions"].append(
            {
                "type": "Stalled",
                "status": "True",
                "reason": "Stalled",
                "lastTransitionTime": ago(5).isoformat(),
            }
        )
    return make_job().nodes(2).ft(progressTimeoutSeconds=600).status(**status).obj()


def at_step(step: int) -> Observed:
    return observe().running(2, heartbeat=hb(step=step)).obj()


def early_exit() -> Observed:
    return (
        observe()
        .rdzv()
        .worker(0)
        .lease("train-n0-a0", 1, hb("InJobRestarting", step=100))
        .worker(1, phase="Succeeded", exit_code=0)
        .obj()
    )


def one_pending() -> Observed:
    return (
        observe()
        .rdzv()
        .worker(0)
        .lease("train-n0-a0", 1, hb(step=100))
        .worker(1, phase="Pending", node="")
        .obj()
    )


@dataclass
class Case:
    id: str
    job: ResilientTrainingJob
    observed: Observed
    stalled: str | None  # Stalled condition status (None: absent)
    events: list[str] = field(default_factory=list)
    state: str = "Running"
    progress: tuple[int | None, Any] = (None, None)  # expected (progressStep, lastProgressTime) when set
    actions: list[Any] | None = None


CASES = [
    Case("step advancing: progress recorded", job(120), at_step(150), None, progress=(150, NOW)),
    Case(
        "step advancing within the resolution: not written yet, not stalled",
        job(30),
        at_step(150),
        None,
        progress=(100, ago(30)),
    ),
    Case("frozen, within progressTimeoutSeconds", job(590), at_step(100), None),
    Case("frozen past the timeout: Stalled, one Event", job(601), at_step(100), "True", [reasons.STALLED]),
    Case("still stalled: no second Event", job(900, stalled=True), at_step(100), "True"),
    Case(
        "progress again: Stalled cleared", job(900, stalled=True), at_step(101), "False", progress=(101, NOW)
    ),
    Case(
        "frozen past twice the timeout: the job fails NoProgress",
        job(1201, stalled=True),
        at_step(100),
        "True",
        [reasons.NO_PROGRESS],
        "Failed",
        actions=[
            DeletePod("train-rdzv", "rdzv-1", None),
            DeletePod("train-n0-a0", "uid-train-n0-a0", None),
            DeletePod("train-n1-a0", "uid-train-n1-a0", None),
        ],
    ),
    Case(
        "a worker exited 0 early, the other waits: stalled",
        job(601),
        early_exit(),
        "True",
        [reasons.STALLED],
    ),
    Case(
        "no pod ever reported a step (the script does not report them): never judged",
        job(5000, step=0),
        at_step(0),
        None,
        progress=(0, NOW),
    ),
    Case(
        "pods not all running: the clock does not run",
        job(5000),
        one_pending(),
        None,
        state="Pending",
        progress=(100, NOW),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_progress_watchdog(case: Case) -> None:
    d = decide(case.job, case.observed, NOW)
    cond = next((c for c in d.status.conditions if c.type == "Stalled"), None)
    assert (None if cond is None else cond.status) == case.stalled
    assert [e.reason for e in d.events] == case.events
    assert d.status.state == case.state
    if case.progress != (None, None):
        assert (d.status.progress_step, d.status.last_progress_time) == case.progress
    if case.actions is not None:
        assert d.actions == case.actions


def test_early_exit_is_named_and_never_restarted() -> None:
    d = decide(job(1300, stalled=True), early_exit(), NOW)
    assert d.status.reason == reasons.NO_PROGRESS
    failed = next(c for c in d.status.conditions if c.type == "Failed")
    assert "train-n1-a0 exited 0 while the others had not finished" in failed.message
    assert d.status.restarts.pod_reschedules == 0
