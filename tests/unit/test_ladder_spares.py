"""Table tests of hot spares (rtj.ladder.spares) through decide(): started ahead, promoted into a
faulted slot, replaced when lost."""

from __future__ import annotations

import pytest
from ladder_testkit import (
    Case,
    check,
    hb,
    observe,
    recorded,
    replacing,
    running_job,
    slot_status,
)
from rtj import reasons
from rtj.ladder import (
    AssignLease,
    CreateSparePod,
    CreateWorkerPod,
    DeletePod,
    PromoteSpare,
)

pytestmark = pytest.mark.unit

CASES = [
    # --- hot spares ---------------------------------------------------------------------------------
    Case(
        "hot spares are created ahead",
        running_job().spares(2).obj(),
        observe().running(2).obj(),
        [CreateSparePod(0, 0), CreateSparePod(1, 0)],
        state="Running",
    ),
    Case(
        "standby spare is promoted into a faulted slot, a new spare is started",
        running_job().spares(1).status(spares=[{"index": 0, "pod": "train-spare-0-a0", "attempt": 0}]).obj(),
        observe()
        .running(2)
        .worker(1, phase="Failed", exit_code=70)
        .spare(0)
        .lease("train-spare-0-a0", 1, hb("Standby"))
        .obj(),
        [
            DeletePod("train-n1-a0", "uid-train-n1-a0", 5),
            recorded("node-1", reasons.LAUNCHER_BUDGET_EXHAUSTED),
            PromoteSpare("train-spare-0-a0", 1, 1, reasons.LAUNCHER_BUDGET_EXHAUSTED),
            AssignLease("train-spare-0-a0", 1),
            CreateSparePod(0, 1),
        ],
        restarts=(0, 0, 1),
        events=[reasons.LAUNCHER_BUDGET_EXHAUSTED, reasons.SPARE_PROMOTED],
    ),
    Case(
        "spare on a NotReady node is replaced (not counted: it was not training)",
        running_job().spares(1).status(spares=[{"index": 0, "pod": "train-spare-0-a0", "attempt": 0}]).obj(),
        observe().running(2).spare(0, node="spare-node-0").node("spare-node-0", "False").obj(),
        [DeletePod("train-spare-0-a0", "uid-train-spare-0-a0", 0), CreateSparePod(0, 1)],
        restarts=(0, 0, 0),
    ),
    Case(
        "spare already signalled for this slot (its relabel was lost) is promoted again, not another one",
        running_job()
        .spares(2)
        .status(
            nodeSlots=slot_status(2, {1: replacing(reasons.POD_FAILED)}),
            restarts={"podReschedules": 1},
            spares=[{"index": 0, "pod": "train-spare-0-a0"}, {"index": 1, "pod": "train-spare-1-a0"}],
        )
        .obj(),
        observe()
        .rdzv()
        .worker(0)
        .lease("train-n0-a0", 1, hb())
        .spare(0)
        .lease("train-spare-0-a0", 1, hb("Standby"))
        .spare(1)
        .lease("train-spare-1-a0", 1, hb("Training"), assigned="1")
        .obj(),
        [
            PromoteSpare("train-spare-1-a0", 1, 1, "PodFailed"),
            AssignLease("train-spare-1-a0", 1),
            CreateSparePod(1, 1),
        ],
        restarts=(0, 0, 1),
        events=[reasons.SPARE_PROMOTED],
    ),
    Case(
        "spare signalled for a slot it did not get is never reused but replaced",
        running_job()
        .spares(1)
        .status(
            nodeSlots=slot_status(2, {1: replacing(reasons.POD_FAILED)}),
            restarts={"podReschedules": 1},
            spares=[{"index": 0, "pod": "train-spare-0-a0"}],
        )
        .obj(),
        observe()
        .rdzv()
        .worker(0)
        .lease("train-n0-a0", 1, hb())
        .spare(0)
        .lease("train-spare-0-a0", 1, hb("Standby"), assigned="0")
        .obj(),
        [
            CreateWorkerPod(1, 1, "PodFailed"),
            DeletePod("train-spare-0-a0", "uid-train-spare-0-a0", 0),
            CreateSparePod(0, 1),
        ],
        restarts=(0, 0, 1),
    ),
    Case(
        "spare not yet standing by is not promoted",
        running_job().spares(1).obj(),
        observe()
        .running(2)
        .worker(1, phase="Failed", exit_code=1)
        .spare(0)
        .lease("train-spare-0-a0", 1, hb("Starting"))
        .obj(),
        [
            DeletePod("train-n1-a0", "uid-train-n1-a0", 5),
            recorded("node-1", reasons.POD_FAILED),
            CreateWorkerPod(1, 1, reasons.POD_FAILED, suspect_node="node-1"),
        ],
        restarts=(0, 0, 1),
        events=[reasons.POD_FAILED],
    ),
    Case(
        "promoted spare whose Lease lacks the signal gets it again (level-based)",
        running_job().obj(),
        observe()
        .rdzv()
        .worker(0)
        .lease("train-n0-a0", 1, hb())
        .worker(1, 1, name="train-spare-0-a0", cause="PodFailed")
        .lease("train-spare-0-a0", 1, hb("Standby"))
        .obj(),
        [AssignLease("train-spare-0-a0", 1)],
        restarts=(0, 0, 1),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_spares(case: Case) -> None:
    check(case)
