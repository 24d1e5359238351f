"""Table tests of the progress watchdog (rtj.ladder.progress_watchdog) through decide(): pods all
running, step frozen -> Stalled (one Event) -> NoProgress; a worker that exited 0 early while the
others wait is named (issue 13, case 2). Progress is timed from the first heartbeat seen carrying the
newest step (the Lease watch's ProgressSeen, else this pass's renewals), not from the pass, so a
freeze is Stalled within progressTimeoutSeconds plus one heartbeat interval (issue 25, item 4: it
came 127 s after a freeze with 60 s). progressTimeoutSeconds 600 in the table; resolution 60 s."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from ladder_testkit import NOW, ago, hb, make_job, observe, running_status
from rtj import contract, reasons
from rtj.api.models import FaultTolerance, JobStatus, NodeSlotStatus, ResilientTrainingJob
from rtj.ladder import DeletePod, Observed, decide, progress_watchdog
from rtj.ladder.observe import ProgressSeen, progress_seen
from rtj.ladder.wakeups import read_heartbeat

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


def at_step(step: int, seen: ProgressSeen | None = None) -> Observed:
    """Both pods' heartbeats at `step`, renewed 1 s ago; `seen`: what the Lease watch remembers."""
    obs = observe().running(2, heartbeat=hb(step=step)).obj()
    return Observed(pods=obs.pods, leases=obs.leases, nodes=obs.nodes, progress_seen=seen)


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
    Case(
        "step advancing: progress recorded, timed from the heartbeat that reported it",
        job(120),
        at_step(150),
        None,
        progress=(150, ago(1)),
    ),
    Case(
        "step advancing: timed from the first heartbeat the Lease watch saw carrying it",
        job(120),
        at_step(150, ProgressSeen(150, ago(40))),
        None,
        progress=(150, ago(40)),
    ),
    Case(
        "step advancing within the resolution: not written yet, not stalled",
        job(30),
        at_step(150),
        None,
        progress=(100, ago(30)),
    ),
    Case(
        "frozen at a step above the record since the watch first saw it past the timeout: Stalled "
        "(the pass judges from the heartbeats, not from the coarse record)",
        job(700),
        at_step(150, ProgressSeen(150, ago(601))),
        "True",
        [reasons.STALLED],
        progress=(150, ago(601)),
    ),
    Case(
        "a restarted operator (nothing remembered): timed from this pass's renewals, never earlier",
        job(700),
        at_step(150),
        None,
        progress=(150, ago(1)),
    ),
    Case(
        "the watch remembers a higher step than the pods report (a resume from an older step, a stale "
        "incarnation): not used",
        job(700),
        at_step(150, ProgressSeen(200, ago(900))),
        None,
        progress=(150, ago(1)),
    ),
    Case(
        "the clock started again (pods were not all running) after the step was first seen: from then",
        job(10),
        at_step(150, ProgressSeen(150, ago(900))),
        None,
        progress=(100, ago(10)),
    ),
    Case("frozen, within progressTimeoutSeconds", job(590), at_step(100), None),
    Case("frozen past the timeout: Stalled, one Event", job(601), at_step(100), "True", [reasons.STALLED]),
    Case("still stalled: no second Event", job(900, stalled=True), at_step(100), "True"),
    Case(
        "progress again: Stalled cleared",
        job(900, stalled=True),
        at_step(101),
        "False",
        progress=(101, ago(1)),
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


@pytest.mark.parametrize(
    ("annotation", "step"),
    [
        ('{"state": "Training", "step": 7}', 7),
        ('{"state": "Training"}', None),
        ('{"state": "Training", "step": "7"}', None),
        ('{"state": "Training", "step": true}', None),
        ('{"state": "Training", "step": -1}', None),
        ("not json", None),
    ],
)
def test_the_lease_watch_reads_the_step_with_the_digest(annotation: str, step: int | None) -> None:
    assert read_heartbeat({contract.HEARTBEAT_ANNOTATION: annotation})[1] == step


def test_progress_seen_keeps_the_first_renewal_of_the_highest_step() -> None:
    seen = progress_seen(None, 10, ago(30))
    seen = progress_seen(seen, 10, ago(20))  # the same step again: still first seen 30 s ago
    assert seen == ProgressSeen(10, ago(30))
    assert progress_seen(seen, 9, ago(10)) == seen  # lower (a resume from older): not progress
    assert progress_seen(seen, None, ago(10)) == seen
    assert progress_seen(seen, 11, ago(5)) == ProgressSeen(11, ago(5))


def first_stalled(
    freeze: float, timeout: int, interval: float, pass_every: float, resolution: float
) -> float:
    """Seconds after `freeze` at which the watchdog first reads Stalled, with a step per second until
    the freeze, heartbeats every `interval` (the Lease watch remembering them), and passes every
    `pass_every` seconds (a slot's heartbeat deadline) and whenever the verdict is due."""
    start = NOW - timedelta(seconds=freeze)
    ft = FaultTolerance(progressTimeoutSeconds=timeout, heartbeatIntervalSeconds=int(interval))
    status = JobStatus(progressStep=0, lastProgressTime=start)
    slots = [NodeSlotStatus(slot=0, pod="p", state="Training")]
    seen: ProgressSeen | None = None
    renewals: list[datetime] = []
    t, renew, next_pass, due = 0.0, 0.0, pass_every, None
    while t < freeze + 3 * timeout:
        t = round(t + 0.25, 2)
        if t >= renew + interval:  # the agent renews: the step it read from the rank files
            renew = t
            renewals.append(start + timedelta(seconds=t))
            seen = progress_seen(seen, int(min(t, freeze)), renewals[-1])
        if t >= next_pass or (due is not None and start + timedelta(seconds=t) >= due):
            next_pass = t + pass_every
            now = start + timedelta(seconds=t)
            hb_step = int(min(renew, freeze))
            verdict = progress_watchdog.check(
                status, slots, [(hb_step, renewals[-1])], seen, ft, now, resolution
            )
            due = verdict.due
            if verdict.stalled:
                return t - freeze
    raise AssertionError("never stalled")


@pytest.mark.parametrize(
    ("timeout", "interval", "pass_every"),
    [(60, 5, 25), (60, 10, 55), (600, 10, 55), (60, 5, 120)],
)
@pytest.mark.parametrize("freeze", [300.0, 317.5, 331.25])
def test_a_freeze_is_stalled_within_the_timeout_and_one_heartbeat_interval(
    freeze: float, timeout: int, interval: float, pass_every: float
) -> None:
    late = first_stalled(freeze, timeout, interval, pass_every, resolution=60)
    assert timeout < late <= timeout + interval + 0.5
