"""Table tests of the slot policy (rtj.ladder.slots) through decide(), jobset style: a new job's pods,
soft faults counted with pods untouched (levels 1-2), hard faults replacing one pod (level 3)."""

from __future__ import annotations

import pytest
from ladder_testkit import (
    HARD,
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
from rtj import reasons
from rtj.ladder import (
    CreateRendezvousPod,
    CreateRendezvousService,
    CreateWorkerPod,
    DeletePod,
    Observed,
)

pytestmark = pytest.mark.unit

CASES = [
    Case(
        "new job creates rendezvous, service and one pod per slot",
        make_job().nodes(3).obj(),
        observe().no_service().obj(),
        [
            CreateRendezvousService(),
            CreateRendezvousPod(),
            CreateWorkerPod(0, 0, "Initial"),
            CreateWorkerPod(1, 0, "Initial"),
            CreateWorkerPod(2, 0, "Initial"),
        ],
        state="Pending",
        conditions={"Running": "False", "Degraded": "True"},
    ),
    Case(
        "pods created but not yet observed are created again (AlreadyExists is success)",
        make_job().nodes(1).obj(),
        observe().rdzv().obj(),
        [CreateWorkerPod(0, 0, "Initial")],
        state="Pending",
    ),
    Case(
        "healthy job: nothing to do",
        running_job().obj(),
        observe().running(2).obj(),
        [],
        state="Running",
        reason=reasons.ALL_PODS_RUNNING,
        conditions={"Running": "True", "Recovering": "False", "Degraded": "False"},
    ),
    Case(
        "pending pod (unschedulable) is not a fault",
        make_job().nodes(2).obj(),
        observe().rdzv().worker(0).lease("train-n0-a0", 1, hb()).worker(1, phase="Pending", node="").obj(),
        [],
        state="Pending",
        conditions={"Running": "False", "Degraded": "True"},
    ),
    Case(
        "running pod without heartbeat inside startup timeout is Starting (not Running: 0 heartbeating)",
        make_job().nodes(1).obj(),
        observe().rdzv().worker(0, started=ago(60), created=ago(60)).obj(),
        [],
        state="Starting",
        reason=reasons.PODS_STARTING,
        slots={0: {"state": "Starting"}},
        conditions={"Running": "False", "Degraded": "False"},
    ),
    # --- level 1 / 2: soft faults, counted, pods untouched ---------------------------------------
    Case(
        "in-process restart counted, pods untouched",
        running_job().obj(),
        observe().running(2).lease("train-n1-a0", 1, hb("InProcessRestarting", ip=1, fault=SOFT)).obj(),
        [],
        state="Recovering",
        reason=reasons.IN_PROCESS_RESTART,
        restarts=(1, 0, 0),
        events=[reasons.IN_PROCESS_RESTART],
        slots={1: {"inProcessRestarts": 1, "recoveringLevel": "InProcess"}},
    ),
    Case(
        "in-process restart already counted is not counted again",
        running_job(nodeSlots=slot_status(2, {1: {"inProcessRestarts": 3}}), restarts={"inProcess": 3}).obj(),
        observe().running(2).lease("train-n1-a0", 1, hb(ip=3)).obj(),
        [],
        state="Running",
        restarts=(3, 0, 0),
    ),
    Case(
        "in-job restart counted with its reason",
        running_job().obj(),
        observe().running(2).lease("train-n0-a0", 1, hb("InJobRestarting", ij=2)).obj(),
        [],
        state="Recovering",
        reason=reasons.IN_JOB_RESTART,
        restarts=(0, 2, 0),
        events=[reasons.IN_JOB_RESTART],
    ),
    Case(
        "counter going backwards never decreases the job total",
        running_job(nodeSlots=slot_status(2, {0: {"inJobRestarts": 5}}), restarts={"inJob": 5}).obj(),
        observe().running(2).lease("train-n0-a0", 1, hb(ij=1)).obj(),
        [],
        restarts=(0, 5, 0),
        slots={0: {"inJobRestarts": 1}},
    ),
    Case(
        "back to Training ends the recovery and reports its duration",
        running_job(
            nodeSlots=slot_status(
                2,
                {
                    0: {
                        "recoveringSince": ago(4).isoformat(),
                        "recoveringLevel": "InProcess",
                        "inProcessRestarts": 1,
                    }
                },
            ),
            restarts={"inProcess": 1},
        ).obj(),
        observe().running(2).lease("train-n0-a0", 1, hb(ip=1)).obj(),
        [],
        state="Running",
        restarts=(1, 0, 0),
        events=[reasons.RECOVERED],
        slots={0: {"recoveringSince": None}},
    ),
    Case(
        "malformed heartbeat with fresh renewTime: no info, no fault",
        running_job().obj(),
        observe().running(2).lease("train-n0-a0", 1, None).obj(),
        [],
        state="Starting",  # not known to train: never Running
        slots={0: {"state": "Starting"}},
    ),
    Case(
        "soft fault reported in heartbeat does not touch pods",
        running_job().obj(),
        observe().running(2).lease("train-n0-a0", 1, hb(fault=SOFT)).obj(),
        [],
        state="Running",
    ),
    # --- level 3: hard faults replace ONE pod ------------------------------------------------------
    Case(
        "heartbeat silent past timeout: force-delete that pod; silence is no evidence against the node "
        "(which side of a partition?): recorded on it, not quarantined",
        running_job().obj(),
        observe().running(2).lease("train-n1-a0", 31, hb()).obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 0), recorded("node-1", reasons.HEARTBEAT_TIMEOUT)],
        state="Recovering",
        reason=reasons.HEARTBEAT_TIMEOUT,
        restarts=(0, 0, 1),
        events=[reasons.HEARTBEAT_TIMEOUT],
        slots={
            1: {
                "attempt": 1,
                "pod": "",
                "state": "Replacing",
                "lastFaultReason": reasons.HEARTBEAT_TIMEOUT,
                "lastHeartbeatTime": None,
            }
        },
    ),
    Case(
        "a deletion unfinished well past its grace period is forced, so the slot can be refilled",
        running_job(nodeSlots=slot_status(2, {1: {"attempt": 1, "pod": "", "state": "Replacing"}})).obj(),
        observe().running(2).worker(1, 0, deleting=True, delete_by=ago(3)).obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 0)],
    ),
    Case(
        "a deletion still inside its grace period (plus margin) is left to the kubelet",
        running_job(nodeSlots=slot_status(2, {1: {"attempt": 1, "pod": "", "state": "Replacing"}})).obj(),
        observe().running(2).worker(1, 0, deleting=True, delete_by=ago(1)).obj(),
        [],
    ),
    Case(
        "heartbeat just inside the timeout is fine",
        running_job().obj(),
        observe().running(2).lease("train-n1-a0", 29, hb()).obj(),
        [],
        state="Running",
    ),
    Case(
        "no quarantine when the spec turns it off, even on node evidence",
        running_job().ft(quarantineFaultyNodes=False).obj(),
        observe().running(2).node("node-1", "False").obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 0)],
        restarts=(0, 0, 1),
        events=[reasons.NODE_NOT_READY],
    ),
    Case(
        "no first heartbeat past startupTimeoutSeconds",
        make_job().nodes(1).status(**running_status(1, nodeSlots=[{"slot": 0, "pod": "train-n0-a0"}])).obj(),
        observe().rdzv().worker(0, started=ago(121), created=ago(121)).obj(),
        [DeletePod("train-n0-a0", "uid-train-n0-a0", 5), recorded("node-0", reasons.STARTUP_TIMEOUT)],
        restarts=(0, 0, 1),
        events=[reasons.STARTUP_TIMEOUT],
    ),
    Case(
        "future renewTime is clamped: an old pod cannot look alive forever (parser clamps; age 0 here)",
        running_job().obj(),
        observe().running(2).lease("train-n0-a0", 0, hb()).obj(),
        [],
        state="Running",
    ),
    Case(
        "pod Failed exit 70: LauncherBudgetExhausted, replaced at once (the pod is dead), node not blamed",
        running_job().obj(),
        observe().running(2).worker(0, phase="Failed", exit_code=70).obj(),
        [
            DeletePod("train-n0-a0", "uid-train-n0-a0", 5),
            recorded("node-0", reasons.LAUNCHER_BUDGET_EXHAUSTED),
            CreateWorkerPod(0, 1, reasons.LAUNCHER_BUDGET_EXHAUSTED, suspect_node="node-0"),
        ],
        state="Recovering",
        reason=reasons.LAUNCHER_BUDGET_EXHAUSTED,
        restarts=(0, 0, 1),
        events=[reasons.LAUNCHER_BUDGET_EXHAUSTED],
    ),
    Case(
        "pod Failed exit 1: PodFailed, no quarantine",
        running_job().obj(),
        observe().running(2).worker(1, phase="Failed", exit_code=1).obj(),
        [
            DeletePod("train-n1-a0", "uid-train-n1-a0", 5),
            recorded("node-1", reasons.POD_FAILED),
            CreateWorkerPod(1, 1, reasons.POD_FAILED, suspect_node="node-1"),
        ],
        restarts=(0, 0, 1),
        events=[reasons.POD_FAILED],
    ),
    Case(
        "pod evicted: a disruption, replaced without spending the fault budget",
        running_job().obj(),
        observe().running(2).worker(1, phase="Failed", status_reason="Evicted").obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 5), CreateWorkerPod(1, 1, reasons.POD_EVICTED)],
        restarts=(0, 0, 0),
        events=[reasons.POD_EVICTED],
    ),
    Case(
        "pod deleted (gone) after it was seen, its node fine: a disruption",
        running_job().obj(),
        observe().rdzv().worker(0).lease("train-n0-a0", 1, hb()).node("node-1").obj(),
        [CreateWorkerPod(1, 1, reasons.POD_DELETED)],
        restarts=(0, 0, 0),
        events=[reasons.POD_DELETED],
    ),
    Case(
        "pod being deleted by someone: replaced once it is gone",
        running_job().obj(),
        observe().running(2).worker(1, deleting=True).obj(),
        [],
        restarts=(0, 0, 0),
        events=[reasons.POD_DELETED],
        slots={1: {"attempt": 1, "state": "Replacing"}},
    ),
    Case(
        "node NotReady: force-delete the pod, quarantine",
        running_job().obj(),
        observe().running(2).node("node-1", "Unknown").obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 0), quarantined("node-1", reasons.NODE_NOT_READY)],
        restarts=(0, 0, 1),
        events=[reasons.NODE_NOT_READY, reasons.NODE_QUARANTINED],
    ),
    Case(
        "node gone: NodeLost",
        running_job().obj(),
        Observed(
            pods=observe().running(2).obj().pods,
            leases=observe().running(2).obj().leases,
            nodes={"node-0": observe().node("node-0").nodes_["node-0"]},
        ),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 0), quarantined("node-1", reasons.NODE_LOST)],
        restarts=(0, 0, 1),
        events=[reasons.NODE_LOST, reasons.NODE_QUARANTINED],
    ),
    Case(
        "pod-reported hardware error (an Xid): evidence against its node, quarantined",
        running_job().obj(),
        observe().running(2).lease("train-n0-a0", 1, hb(fault=HARD)).obj(),
        [DeletePod("train-n0-a0", "uid-train-n0-a0", 5), quarantined("node-0", reasons.HARDWARE_FAULT)],
        restarts=(0, 0, 1),
        events=[reasons.HARDWARE_FAULT, reasons.NODE_QUARANTINED],
        quarantined=["node-0"],
    ),
    Case(
        "pod-reported hard fault that is not the hardware's: replaced, recorded on the node only",
        running_job().obj(),
        observe().running(2).lease("train-n0-a0", 1, hb(fault={**HARD, "reason": "EfaTimeoutAtInit"})).obj(),
        [DeletePod("train-n0-a0", "uid-train-n0-a0", 5), recorded("node-0", reasons.POD_REPORTED_HARD_FAULT)],
        restarts=(0, 0, 1),
        events=[reasons.POD_REPORTED_HARD_FAULT],
    ),
    Case(
        "replacement waits while the old pod still terminates (never two live pods per slot)",
        running_job(
            nodeSlots=slot_status(2, {1: replacing("X")}),
            restarts={"podReschedules": 1},
        ).obj(),
        observe().running(2).worker(1, deleting=True).obj(),
        [],
        restarts=(0, 0, 1),
        slots={1: {"state": "Replacing"}},
    ),
    Case(
        "replacement created once the old pod is gone, off quarantined nodes",
        running_job(
            nodeSlots=slot_status(2, {1: replacing(reasons.HEARTBEAT_TIMEOUT)}),
            restarts={"podReschedules": 1},
            quarantinedNodes=["node-1"],
        ).obj(),
        observe().rdzv().worker(0).lease("train-n0-a0", 1, hb()).obj(),
        [CreateWorkerPod(1, 1, reasons.HEARTBEAT_TIMEOUT, ("node-1",))],
        restarts=(0, 0, 1),
    ),
    Case(
        "replacement pod created by a pass whose status write was lost: adopted and counted once",
        running_job().obj(),
        observe()
        .running(2)
        .worker(1, 1, cause=reasons.HEARTBEAT_TIMEOUT, node="node-5")
        .lease("train-n1-a1", 1, hb())
        .obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 5)],
        restarts=(0, 0, 1),
        slots={1: {"attempt": 1, "pod": "train-n1-a1"}},
    ),
    Case(
        "replacement back to Training completes the pod-level recovery",
        running_job(
            nodeSlots=slot_status(
                2,
                {
                    1: {
                        "attempt": 1,
                        "pod": "train-n1-a1",
                        "recoveringLevel": "Pod",
                        "recoveringSince": ago(20).isoformat(),
                    }
                },
            ),
            restarts={"podReschedules": 1},
        ).obj(),
        observe()
        .rdzv()
        .worker(0)
        .lease("train-n0-a0", 1, hb())
        .worker(1, 1, cause="HeartbeatTimeout")
        .lease("train-n1-a1", 2, hb())
        .obj(),
        [],
        state="Running",
        restarts=(0, 0, 1),
        events=[reasons.RECOVERED],
    ),
    Case(
        # issue 13: a fault seen on several pods at once is the job's (rtj.ladder.job_level).
        "two of five slots fault in one pass: both replaced at job level, no pod budget, no quarantine",
        running_job(5).obj(),
        observe().running(5).lease("train-n0-a0", 40, hb()).lease("train-n2-a0", 40, hb()).obj(),
        [DeletePod("train-n0-a0", "uid-train-n0-a0", 0), DeletePod("train-n2-a0", "uid-train-n2-a0", 0)],
        restarts=(0, 0, 0),
        events=[reasons.PODS_FAILED_TOGETHER] * 3,
    ),
    Case(
        "most slots silent at once (API outage, RBAC): replacements held, Degraded HeartbeatsStale",
        running_job(3).obj(),
        observe().running(3).lease("train-n0-a0", 40, hb()).lease("train-n2-a0", 40, hb()).obj(),
        [],
        restarts=(0, 0, 0),
        events=[reasons.HEARTBEATS_STALE],
        slots={0: {"state": "Silent", "attempt": 0}, 1: {"state": "Training"}},
        conditions={"Degraded": "True"},
    ),
    Case(
        "one slot past the deadline, another half-way there: held as correlated",
        running_job(2).obj(),
        observe().running(2).lease("train-n0-a0", 31, hb()).lease("train-n1-a0", 16, hb()).obj(),
        [],
        events=[reasons.HEARTBEATS_STALE],
    ),
    Case(
        "held silence already reported: no second event",
        running_job(
            2, conditions=[{"type": "Degraded", "status": "True", "reason": "HeartbeatsStale"}]
        ).obj(),
        observe().running(2).lease("train-n0-a0", 31, hb()).lease("train-n1-a0", 31, hb()).obj(),
        [],
        events=[],
        conditions={"Degraded": "True"},
    ),
    Case(
        "many nodes NotReady at once (a zone): pods replaced, no node quarantined",
        running_job(3).obj(),
        observe().running(3).node("node-0", "Unknown").node("node-1", "Unknown").obj(),
        [DeletePod("train-n0-a0", "uid-train-n0-a0", 0), DeletePod("train-n1-a0", "uid-train-n1-a0", 0)],
        restarts=(0, 0, 2),
        events=[reasons.NODE_NOT_READY] * 2,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_slots(case: Case) -> None:
    check(case)
