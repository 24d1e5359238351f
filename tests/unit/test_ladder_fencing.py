"""Table tests of fencing (rtj.ladder.fencing) through decide(): one live incarnation per slot. A
stale attempt that still heartbeats (its pod replaced while its node's kubelet was down) is fenced
through its Lease; once it stopped and its pod is gone, its Lease is deleted."""

from __future__ import annotations

import pytest
from ladder_testkit import Case, check, hb, observe, running_job, slot_status
from rtj import reasons
from rtj.ladder import DeleteLease, DeletePod, FenceLease

pytestmark = pytest.mark.unit

STALE = "slot 1 is attempt 1 now; pod train-n1-a0 (attempt 0) is stale"
REPLACED = {1: {"attempt": 1, "pod": "train-n1-a1", "node": "node-5"}}


def replaced_job():
    return running_job(nodeSlots=slot_status(2, REPLACED), restarts={"podReschedules": 1})


def replacement():
    return observe().running(2).worker(1, 1, cause=reasons.NODE_NOT_READY, node="node-5")


CASES = [
    Case(
        "the replaced pod is gone from the API but its agent recreated its Lease and heartbeats: fenced",
        replaced_job().obj(),
        replacement()
        .lease("train-n1-a1", 1, hb())
        .lease("train-n1-a0", 1, hb(), recreated=True)
        .without_pod("train-n1-a0")
        .obj(),
        [FenceLease("train-n1-a0", STALE)],
        restarts=(0, 0, 1),
        events=[reasons.STALE_POD_FENCED],
    ),
    Case(
        "the old pod of an ordinary replacement (its own Lease, still fresh): deleted, not fenced",
        replaced_job().obj(),
        replacement().lease("train-n1-a1", 1, hb()).obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 5)],
        restarts=(0, 0, 1),
    ),
    Case(
        "a stale Lease no longer renewed needs no fence",
        replaced_job().obj(),
        replacement()
        .lease("train-n1-a1", 1, hb())
        .lease("train-n1-a0", 120, hb(), recreated=True)
        .without_pod("train-n1-a0")
        .obj(),
        [],
        restarts=(0, 0, 1),
    ),
    Case(
        "fenced, stopped and its pod gone: the Lease is deleted",
        replaced_job().obj(),
        replacement()
        .lease("train-n1-a1", 1, hb())
        .lease("train-n1-a0", 120, hb(), fenced=True)
        .without_pod("train-n1-a0")
        .obj(),
        [DeleteLease("train-n1-a0")],
        restarts=(0, 0, 1),
    ),
    Case(
        "fenced and still renewing: not fenced twice, not deleted",
        replaced_job().obj(),
        replacement()
        .lease("train-n1-a1", 1, hb())
        .lease("train-n1-a0", 1, hb(), fenced=True, recreated=True)
        .obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 5)],
        restarts=(0, 0, 1),
    ),
    Case(
        "the current attempt's Lease is never fenced",
        running_job().obj(),
        observe().running(2).obj(),
        [],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_fencing(case: Case) -> None:
    check(case)
