"""rtj.ladder.suspect_node: a slot whose pod was replaced for a fault not proven its own keeps that
pod's node as its suspect (status nodeSlots[].suspectNode), and its new pods prefer other nodes; no
taint, nothing counted for it. Rows through decide(), jobset style; then the same pod built again by a
restarted operator from the status as written."""

from __future__ import annotations

from typing import Any

import pytest
from ladder_testkit import (
    HARD,
    NOW,
    SOFT,
    Case,
    ago,
    check,
    hb,
    make_job,
    observe,
    quarantined,
    recorded,
    replacing,
    running_job,
    running_status,
    slot_status,
)
from rtj import builders, creations, reasons
from rtj.api.models import NodeSlotStatus, ResilientTrainingJob
from rtj.api.status_slots import NODE_SLOTS_SHOWN
from rtj.ladder import CreateWorkerPod, DeletePod, blame, decide, suspect_node
from rtj.ladder.observe import LeaseObs

pytestmark = pytest.mark.unit

HOSTNAME = builders.HOSTNAME_LABEL


def suspect(node: str) -> dict[str, Any]:
    return {"suspectNode": node}


CASES = [
    Case(
        "a silent pod: its node is the slot's suspect, not quarantined (recorded, as before)",
        running_job().obj(),
        observe().running(2).lease("train-n1-a0", 31, hb()).obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 0), recorded("node-1", reasons.HEARTBEAT_TIMEOUT)],
        restarts=(0, 0, 1),
        events=[reasons.HEARTBEAT_TIMEOUT],
        slots={1: {"attempt": 1, **suspect("node-1")}, 0: suspect("")},
    ),
    Case(
        "silent after an exception it recovered from: the silence is still not proven the pod's own "
        "(not recorded on the node: the user's code was its last report)",
        running_job(nodeSlots=slot_status(2, {1: {"inProcessRestarts": 1}})).obj(),
        observe().running(2).lease("train-n1-a0", 31, hb(ip=1, fault=SOFT)).obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 0)],
        restarts=(0, 0, 1),
        events=[reasons.HEARTBEAT_TIMEOUT],
        slots={1: suspect("node-1")},
    ),
    Case(
        "the silent pod's replacement prefers other nodes once the old pod is gone",
        running_job(
            nodeSlots=slot_status(2, {1: {**replacing(reasons.HEARTBEAT_TIMEOUT), **suspect("node-1")}}),
            restarts={"podReschedules": 1},
        ).obj(),
        observe().rdzv().worker(0).lease("train-n0-a0", 1, hb()).obj(),
        [CreateWorkerPod(1, 1, reasons.HEARTBEAT_TIMEOUT, suspect_node="node-1")],
        restarts=(0, 0, 1),
    ),
    Case(
        "no first heartbeat within the startup timeout: a suspect too",
        make_job().nodes(1).status(**running_status(1, nodeSlots=[{"slot": 0, "pod": "train-n0-a0"}])).obj(),
        observe().rdzv().worker(0, started=ago(121), created=ago(121)).obj(),
        [DeletePod("train-n0-a0", "uid-train-n0-a0", 5), recorded("node-0", reasons.STARTUP_TIMEOUT)],
        restarts=(0, 0, 1),
        events=[reasons.STARTUP_TIMEOUT],
        slots={0: suspect("node-0")},
    ),
    Case(
        "the launcher gave up on the training script's own exception: proven the pod's, no suspect",
        running_job().obj(),
        observe()
        .running(2)
        .worker(1, phase="Failed", exit_code=70)
        .lease("train-n1-a0", 1, hb(fault=SOFT))
        .obj(),
        [
            DeletePod("train-n1-a0", "uid-train-n1-a0", 5),
            CreateWorkerPod(1, 1, reasons.LAUNCHER_BUDGET_EXHAUSTED),
        ],
        restarts=(0, 0, 1),
        events=[reasons.LAUNCHER_BUDGET_EXHAUSTED],
        slots={1: suspect("")},
    ),
    Case(
        "a hardware error: quarantined (required), and the suspect (left out of the pod while quarantined)",
        running_job().obj(),
        observe().running(2).lease("train-n0-a0", 1, hb(fault=HARD)).obj(),
        [DeletePod("train-n0-a0", "uid-train-n0-a0", 5), quarantined("node-0", reasons.HARDWARE_FAULT)],
        restarts=(0, 0, 1),
        events=[reasons.HARDWARE_FAULT, reasons.NODE_QUARANTINED],
        slots={0: suspect("node-0")},
    ),
    Case(
        "an eviction is a disruption, nothing about the node: the slot keeps the suspect it had",
        running_job(nodeSlots=slot_status(2, {1: suspect("node-7")})).obj(),
        observe().running(2).worker(1, phase="Failed", status_reason="Evicted").obj(),
        [
            DeletePod("train-n1-a0", "uid-train-n1-a0", 5),
            CreateWorkerPod(1, 1, reasons.POD_EVICTED, suspect_node="node-7"),
        ],
        events=[reasons.POD_EVICTED],
        slots={1: suspect("node-7")},
    ),
    Case(
        "a launcher that gave up on a pending peer: the peers' absence, no suspect",
        running_job().obj(),
        observe().rdzv().worker(0, phase="Failed", exit_code=1).worker(1, phase="Pending", node="").obj(),
        [DeletePod("train-n0-a0", "uid-train-n0-a0", 5), CreateWorkerPod(0, 1, reasons.PEERS_NOT_READY)],
        events=[reasons.PEERS_NOT_READY],
        slots={0: suspect("")},
    ),
    Case(
        "the slot's next silent pod, on another node: one suspect per slot, the latest",
        running_job(
            nodeSlots=slot_status(2, {1: {"attempt": 1, "pod": "train-n1-a1", **suspect("node-1")}})
        ).obj(),
        observe()
        .rdzv()
        .worker(0)
        .lease("train-n0-a0", 1, hb())
        .worker(1, 1, node="node-5", cause=reasons.HEARTBEAT_TIMEOUT)
        .lease("train-n1-a1", 31, hb())
        .obj(),
        [DeletePod("train-n1-a1", "uid-train-n1-a1", 0), recorded("node-5", reasons.HEARTBEAT_TIMEOUT)],
        restarts=(0, 0, 1),
        events=[reasons.HEARTBEAT_TIMEOUT],
        slots={1: {"attempt": 2, **suspect("node-5")}},
    ),
    Case(
        "workers failing together are the job's fault (job level): no suspect",
        running_job(4).obj(),
        observe()
        .running(4)
        .worker(1, phase="Failed", exit_code=70)
        .worker(3, phase="Failed", exit_code=70)
        .obj(),
        [
            DeletePod("train-n1-a0", "uid-train-n1-a0", 5),
            DeletePod("train-n3-a0", "uid-train-n3-a0", 5),
            CreateWorkerPod(1, 1, reasons.PODS_FAILED_TOGETHER),
            CreateWorkerPod(3, 1, reasons.PODS_FAILED_TOGETHER),
        ],
        events=[reasons.PODS_FAILED_TOGETHER] * 3,
        slots={1: suspect(""), 3: suspect("")},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_suspect_node(case: Case) -> None:
    check(case)


#: The classes whose replacement makes the old pod's node a suspect (when not the user's code).
SUSPECTING = {
    reasons.NODE_NOT_READY,
    reasons.NODE_LOST,
    reasons.NODE_UNHEALTHY,
    reasons.HARDWARE_FAULT,
    reasons.REPEATED_NODE_FAULTS,
    reasons.HEARTBEAT_TIMEOUT,
    reasons.STARTUP_TIMEOUT,
    reasons.LAUNCHER_BUDGET_EXHAUSTED,
    reasons.POD_REPORTED_HARD_FAULT,
    reasons.POD_FAILED,
    reasons.POD_PARTITIONED,
    reasons.UNCLASSIFIED,
}


def user_code_lease() -> LeaseObs:
    return LeaseObs(name="train-n0-a0", renew_time=NOW, heartbeat=hb(fault=SOFT))


@pytest.mark.parametrize("reason", sorted(blame.CLASSES))
def test_which_classes_make_a_suspect(reason: str) -> None:
    assert suspect_node.suspects(reason, None) == (reason in SUSPECTING)
    # The training script's own exception as the last report: only a silence still makes one.
    proven = reason in SUSPECTING and reason not in suspect_node.SILENCE
    assert suspect_node.suspects(reason, user_code_lease()) == (reason in SUSPECTING and not proven)


def test_job_level_and_unknown_reasons_make_no_suspect() -> None:
    for reason in (reasons.PODS_FAILED_TOGETHER, reasons.RENDEZVOUS_RESTART, "SomethingElse"):
        assert not suspect_node.suspects(reason, None)


def test_a_replacement_without_a_node_keeps_the_slots_suspect() -> None:
    slot = NodeSlotStatus(slot=0, suspect_node="node-3")
    suspect_node.note(slot, reasons.HEARTBEAT_TIMEOUT, None, "")
    assert slot.suspect_node == "node-3"


# --- the same pod from the same status, after an operator restart ----------------------------------
def restarted(status: Any, nodes: int) -> ResilientTrainingJob:
    """The job as a restarted operator reads it: the status as the last pass wrote it, from the wire."""
    return running_job(nodes).status(**status.model_dump(by_alias=True, mode="json")).obj()


def worker_pods(job: ResilientTrainingJob, decision: Any) -> list[dict[str, Any]]:
    return [
        obj
        for a in decision.actions
        if isinstance(a, CreateWorkerPod)
        for obj in creations.objects_to_create(job, a)
        if obj["kind"] == "Pod"
    ]


@pytest.mark.parametrize("nodes", [2, NODE_SLOTS_SHOWN + 4], ids=["nodeSlots", "slotTable"])
def test_a_restarted_operator_builds_the_same_replacement(nodes: int) -> None:
    silent = decide(
        running_job(nodes).obj(), observe().running(nodes).lease("train-n1-a0", 31, hb()).obj(), NOW
    )
    wire = silent.status.model_dump(by_alias=True, mode="json")
    if nodes > NODE_SLOTS_SHOWN:
        assert wire["slotTable"]["suspectNode"][1] == "node-1"
    gone = observe().running(nodes).without_pod("train-n1-a0").obj()  # the old pod deleted
    # The pass after the replacement, by this operator (status in memory) and by a restarted one.
    job = running_job(nodes).obj()
    job.status = silent.status.model_copy(deep=True)
    here = decide(job, gone, NOW)
    again = restarted(silent.status, nodes)
    there = decide(again, gone, NOW)
    [pod] = worker_pods(job, here)
    assert worker_pods(again, there) == [pod]
    # And once more from what that pass wrote (its create not yet seen: created again, the same pod).
    later = restarted(there.status, nodes)
    assert worker_pods(later, decide(later, gone, NOW)) == [pod]
    assert pod["metadata"]["name"] == "train-n1-a1"
    assert pod["spec"]["affinity"]["nodeAffinity"] == {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {
                "weight": builders.SUSPECT_NODE_WEIGHT,
                "preference": {
                    "matchExpressions": [{"key": HOSTNAME, "operator": "NotIn", "values": ["node-1"]}]
                },
            }
        ]
    }
