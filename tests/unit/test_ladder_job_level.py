"""Table tests of job-level attribution (rtj.ladder.job_level) through decide(): the rendezvous pod
lost, and workers failing right after it or together, are recovered once at job level: no pod
budget, no quarantine (issue 13, case 1). heartbeatTimeoutSeconds 30 here: window 60 s."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from ladder_testkit import NOW, actions, ago, make_job, observe, quarantined, recorded, running_status
from rtj import reasons
from rtj.api.models import ResilientTrainingJob
from rtj.ladder import CreateRendezvousPod, CreateWorkerPod, DeletePod, Observed, TaintNode, decide

pytestmark = pytest.mark.unit


def job(nodes: int = 4, **status: Any) -> ResilientTrainingJob:
    return make_job().nodes(nodes).status(**running_status(nodes, **status)).obj()


def exit70(*slots: int, rdzv_uid: str = "rdzv-1", nodes: int = 4) -> Observed:
    b = observe().running(nodes)
    b.rdzv(uid=rdzv_uid)
    for s in slots:
        b.worker(s, phase="Failed", exit_code=70)
    return b.obj()


@dataclass
class Case:
    id: str
    job: ResilientTrainingJob
    observed: Observed
    actions: list[Any]
    pod: int  # status.restarts.podReschedules
    job_restarts: int  # status.restarts.job
    events: list[str] = field(default_factory=list)
    state: str = ""
    rendezvous_uid: str = "rdzv-1"  # status.rendezvousPodUid after the pass


R, T = reasons.RENDEZVOUS_RESTART, reasons.PODS_FAILED_TOGETHER
L = reasons.RENDEZVOUS_LOST
CASES = [
    # --- the rendezvous pod itself ----------------------------------------------------------------------
    Case(
        "rendezvous pod failed: one job restart, deleted (recreated next pass), uid cleared",
        job(),
        observe().running(4).rdzv(phase="Failed").obj(),
        [DeletePod("train-rdzv", "rdzv-1", 0)],
        0,
        1,
        [L],
        rendezvous_uid="",
    ),
    Case(
        "rendezvous pod gone: one job restart, recreated",
        job(),
        observe().running(4).no_rdzv().obj(),
        [CreateRendezvousPod()],
        0,
        1,
        [L],
        rendezvous_uid="",
    ),
    Case(
        "the recreated rendezvous pod (uid cleared when counted): adopted, not counted again",
        job(rendezvousPodUid="", restarts={"job": 1}),
        observe().running(4).rdzv(uid="rdzv-2").obj(),
        [],
        0,
        1,
        rendezvous_uid="rdzv-2",
    ),
    Case(
        "rendezvous pod on a NotReady node: one job restart, force-deleted, no node quarantined",
        job(),
        observe().running(4).rdzv(node="cpu-9").node("cpu-9", "False").obj(),
        [DeletePod("train-rdzv", "rdzv-1", 0)],
        0,
        1,
        [L],
        rendezvous_uid="",
    ),
    Case(
        "rendezvous pod replaced by a pass whose status write was lost: counted once here",
        job(),
        observe().running(4).rdzv(uid="rdzv-2").obj(),
        [],
        0,
        1,
        [L],
        rendezvous_uid="rdzv-2",
    ),
    Case(
        "rendezvous pod lost within the window of a counted job fault: the same incident, not counted",
        job(jobFaultTime=ago(20).isoformat(), jobRestartTime=ago(20).isoformat(), restarts={"job": 1}),
        observe().running(4).rdzv(phase="Failed").obj(),
        [DeletePod("train-rdzv", "rdzv-1", 0)],
        0,
        1,
        rendezvous_uid="",
    ),
    Case(
        "rendezvous pod lost with the job restart budget spent: Failed, not recreated",
        job(restarts={"job": 4}),
        observe().running(4).rdzv(phase="Failed").obj(),
        [
            DeletePod("train-n0-a0", "uid-train-n0-a0", None),
            DeletePod("train-n1-a0", "uid-train-n1-a0", None),
            DeletePod("train-n2-a0", "uid-train-n2-a0", None),
            DeletePod("train-n3-a0", "uid-train-n3-a0", None),
        ],
        0,
        4,
        [reasons.JOB_RESTART_BUDGET_EXHAUSTED],
        "Failed",
    ),
    # --- workers after the rendezvous loss, or together --------------------------------------------------
    Case(
        "rendezvous pod recreated and a worker exits 70 in the same pass: one job restart for both",
        job(),
        exit70(0, rdzv_uid="rdzv-2"),
        [DeletePod("train-n0-a0", "uid-train-n0-a0", 5), CreateWorkerPod(0, 1, R)],
        0,
        1,
        [L, R],
        rendezvous_uid="rdzv-2",
    ),
    Case(
        "a worker exits 70 within the window after the rendezvous loss: job level, counted once already",
        job(jobFaultTime=ago(20).isoformat(), jobRestartTime=ago(15).isoformat(), restarts={"job": 1}),
        exit70(2),
        [DeletePod("train-n2-a0", "uid-train-n2-a0", 5), CreateWorkerPod(2, 1, R)],
        0,
        1,
        [R],
    ),
    Case(
        "a worker exits 70 within the window while a peer's pod is still pending: the same incident "
        "(RendezvousRestart), not PeersNotReady",
        job(jobFaultTime=ago(5).isoformat(), jobRestartTime=ago(5).isoformat(), restarts={"job": 1}),
        observe().running(4).rdzv().worker(2, phase="Failed", exit_code=70).worker(1, phase="Pending").obj(),
        [DeletePod("train-n2-a0", "uid-train-n2-a0", 5), CreateWorkerPod(2, 1, R)],
        0,
        1,
        [R],
    ),
    Case(
        "the same exit 70 long after the window: that pod's own fault, recorded on its node (no evidence "
        "against it)",
        job(jobFaultTime=ago(61).isoformat(), jobRestartTime=ago(55).isoformat(), restarts={"job": 1}),
        exit70(2),
        [
            DeletePod("train-n2-a0", "uid-train-n2-a0", 5),
            recorded("node-2", reasons.LAUNCHER_BUDGET_EXHAUSTED),
            CreateWorkerPod(2, 1, "LauncherBudgetExhausted", suspect_node="node-2"),
        ],
        1,
        1,
        [reasons.LAUNCHER_BUDGET_EXHAUSTED],
    ),
    Case(
        "two workers exit 70 in one pass: PodsFailedTogether, one job restart",
        job(),
        exit70(1, 3),
        [
            DeletePod("train-n1-a0", "uid-train-n1-a0", 5),
            DeletePod("train-n3-a0", "uid-train-n3-a0", 5),
            CreateWorkerPod(1, 1, T),
            CreateWorkerPod(3, 1, T),
        ],
        0,
        1,
        [T, T, T],
    ),
    Case(
        "job restart budget spent: the job fails",
        job(restarts={"job": 4}),
        exit70(1, 3),
        [
            DeletePod("train-rdzv", "rdzv-1", None),
            DeletePod("train-n0-a0", "uid-train-n0-a0", None),
            DeletePod("train-n2-a0", "uid-train-n2-a0", None),
        ],
        0,
        4,
        [reasons.JOB_RESTART_BUDGET_EXHAUSTED],
        "Failed",
    ),
    Case(
        "a replacement created at job level whose status write was lost: no pod reschedule counted",
        job(),
        observe().running(4).worker(1, 1, cause=R).lease("train-n1-a1", 1).obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 5)],
        0,
        0,
    ),
    Case(
        "a node fault right after the rendezvous loss stays that pod's (evidence about its node)",
        job(jobFaultTime=ago(5).isoformat()),
        observe().running(4).node("node-1", "False").obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 0), quarantined("node-1", reasons.NODE_NOT_READY)],
        1,
        0,
        [reasons.NODE_NOT_READY, reasons.NODE_QUARANTINED],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_job_level(case: Case) -> None:
    d = decide(case.job, case.observed, NOW)
    assert actions(d) == case.actions
    assert (d.status.restarts.pod_reschedules, d.status.restarts.job) == (case.pod, case.job_restarts)
    assert [e.reason for e in d.events] == case.events
    if case.state:
        assert d.status.state == case.state
    else:
        assert d.status.rendezvous_pod_uid == case.rendezvous_uid
    assert not any(isinstance(a, TaintNode) for a in d.actions) or case.events[-1] == reasons.NODE_QUARANTINED
