"""Table tests of the hold on node faults right after an API server outage (Pass.node_verdict) through
decide(): while the API server was unreachable, kubelets could not renew their node Leases either,
so a node seen NotReady within api_recovery_hold_seconds (30 s) of the operator's own last failed
call is not yet a fault; one still NotReady afterwards is, and a node that is gone always is
(docs/reliability.md, item 9: the rendezvous pod's node seen NotReady after a slow API restart
once turned a pod's own fault into a job-level restart)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from ladder_testkit import NOW, Case, JobBuilder, ago, check, make_job, observe, quarantined, running_status
from rtj import reasons
from rtj.ladder import DeletePod, decide

pytestmark = pytest.mark.unit


def running_job() -> JobBuilder:
    return make_job().nodes(2).status(**running_status(2))


NOT_READY_REPLACED = (
    [DeletePod("train-n1-a0", "uid-train-n1-a0", 0), quarantined("node-1", reasons.NODE_NOT_READY)],
    (0, 0, 1),
)

CASES = [
    Case(
        "node NotReady 10 s after the operator's calls failed: held, nothing done",
        running_job().obj(),
        observe().running(2).node("node-1", "Unknown").api_failed(10).obj(),
        [],
        slots={1: {"state": "Training", "attempt": 0}},
    ),
    Case(
        "still NotReady 31 s after: a node fault (force-delete, quarantine)",
        running_job().obj(),
        observe().running(2).node("node-1", "Unknown").api_failed(31).obj(),
        NOT_READY_REPLACED[0],
        restarts=NOT_READY_REPLACED[1],
        events=[reasons.NODE_NOT_READY, reasons.NODE_QUARANTINED],
    ),
    Case(
        "no failed call: NotReady is a node fault at once, as before",
        running_job().obj(),
        observe().running(2).node("node-1", "Unknown").obj(),
        NOT_READY_REPLACED[0],
        restarts=NOT_READY_REPLACED[1],
        events=[reasons.NODE_NOT_READY, reasons.NODE_QUARANTINED],
    ),
    Case(
        "node gone 10 s after a failed call: NodeLost is never held",
        running_job().obj(),
        observe().running(2).without_node("node-1").api_failed(10).obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 0), quarantined("node-1", reasons.NODE_LOST)],
        restarts=NOT_READY_REPLACED[1],
        events=[reasons.NODE_LOST, reasons.NODE_QUARANTINED],
    ),
    Case(
        "the rendezvous pod's node NotReady 10 s after: no job-level restart",
        running_job().obj(),
        observe()
        .running(2)
        .no_rdzv()
        .rdzv(node="rdzv-node")
        .node("rdzv-node", "Unknown")
        .api_failed(10)
        .obj(),
        [],
    ),
    Case(
        "the rendezvous pod's node still NotReady 31 s after: one job-level restart",
        running_job().obj(),
        observe()
        .running(2)
        .no_rdzv()
        .rdzv(node="rdzv-node")
        .node("rdzv-node", "Unknown")
        .api_failed(31)
        .obj(),
        [DeletePod("train-rdzv", "rdzv-1", 0)],
        restarts=(0, 0, 0),
        events=[reasons.RENDEZVOUS_LOST],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_api_recovery_hold(case: Case) -> None:
    check(case)


def test_a_held_node_fault_wakes_the_pass_when_the_hold_ends() -> None:
    d = decide(running_job().obj(), observe().running(2).node("node-1", "Unknown").api_failed(10).obj(), NOW)
    assert d.due == ago(10) + timedelta(seconds=30)
