"""Table tests of the escalation ladder (rtj.ladder.decide), jobset style: one row per situation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from ladder_testkit import NOW, ago, hb, make_job, observe, running_status
from rtj import contract, reasons
from rtj.api.models import ResilientTrainingJob
from rtj.ladder import (
    AssignLease,
    CreateRendezvousPod,
    CreateRendezvousService,
    CreateSparePod,
    CreateWorkerPod,
    DeleteJob,
    DeletePod,
    Observed,
    PromoteSpare,
    TaintNode,
    decide,
    goodput,
)

pytestmark = pytest.mark.unit

HARD = {"severity": "Hard", "reason": "GpuXid", "message": "Xid 79", "time": ago(2).isoformat()}
PERMANENT = {
    "severity": "Permanent",
    "reason": "WorldSizeMismatch",
    "message": "/ckpt/step-0000000100 was written by 2 ranks, this job has 3",
    "time": ago(2).isoformat(),
}
SOFT = {"severity": "Soft", "reason": "RankException", "message": "boom", "time": ago(3).isoformat()}


@dataclass
class Case:
    id: str
    job: ResilientTrainingJob
    observed: Observed
    actions: list[Any] = field(default_factory=list)
    state: str = ""
    reason: str = ""
    restarts: tuple[int, int, int] = (0, 0, 0)  # in-process, in-job, pod reschedules
    events: list[str] = field(default_factory=list)
    slots: dict[int, dict[str, Any]] = field(default_factory=dict)
    conditions: dict[str, str] = field(default_factory=dict)
    quarantined: list[str] = field(default_factory=list)


def running_job(n: int = 2, **status: Any) -> Any:
    return make_job().nodes(n).status(**running_status(n, **status))


def slot_status(n: int, overrides: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    base = running_status(n)["nodeSlots"]
    for s, fields in overrides.items():
        base[s].update(fields)
    return base


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
        state="Running",
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
        "heartbeat silent past timeout: delete that pod, quarantine node",
        running_job().obj(),
        observe().running(2).lease("train-n1-a0", 31, hb()).obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 0), TaintNode("node-1")],
        state="Recovering",
        reason=reasons.HEARTBEAT_TIMEOUT,
        restarts=(0, 0, 1),
        events=[reasons.HEARTBEAT_TIMEOUT, reasons.NODE_QUARANTINED],
        slots={
            1: {
                "attempt": 1,
                "pod": "",
                "state": "Replacing",
                "lastFaultReason": reasons.HEARTBEAT_TIMEOUT,
                "lastHeartbeatTime": None,
            }
        },
        quarantined=["node-1"],
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
        "no quarantine when the spec turns it off",
        running_job().ft(quarantineFaultyNodes=False).obj(),
        observe().running(2).lease("train-n1-a0", 31, hb()).obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 0)],
        restarts=(0, 0, 1),
        events=[reasons.HEARTBEAT_TIMEOUT],
    ),
    Case(
        "no first heartbeat past startupTimeoutSeconds",
        make_job().nodes(1).status(**running_status(1, nodeSlots=[{"slot": 0, "pod": "train-n0-a0"}])).obj(),
        observe().rdzv().worker(0, started=ago(121), created=ago(121)).obj(),
        [DeletePod("train-n0-a0", "uid-train-n0-a0", 5), TaintNode("node-0")],
        restarts=(0, 0, 1),
        events=[reasons.STARTUP_TIMEOUT, reasons.NODE_QUARANTINED],
    ),
    Case(
        "future renewTime is clamped: an old pod cannot look alive forever (parser clamps; age 0 here)",
        running_job().obj(),
        observe().running(2).lease("train-n0-a0", 0, hb()).obj(),
        [],
        state="Running",
    ),
    Case(
        "pod Failed exit 70: LauncherBudgetExhausted, replaced at once (the pod is dead)",
        running_job().obj(),
        observe().running(2).worker(0, phase="Failed", exit_code=70).obj(),
        [
            DeletePod("train-n0-a0", "uid-train-n0-a0", 5),
            TaintNode("node-0"),
            CreateWorkerPod(0, 1, reasons.LAUNCHER_BUDGET_EXHAUSTED, ("node-0",)),
        ],
        state="Recovering",
        reason=reasons.LAUNCHER_BUDGET_EXHAUSTED,
        restarts=(0, 0, 1),
        events=[reasons.LAUNCHER_BUDGET_EXHAUSTED, reasons.NODE_QUARANTINED],
    ),
    Case(
        "pod Failed exit 1: PodFailed, no quarantine",
        running_job().obj(),
        observe().running(2).worker(1, phase="Failed", exit_code=1).obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 5), CreateWorkerPod(1, 1, reasons.POD_FAILED)],
        restarts=(0, 0, 1),
        events=[reasons.POD_FAILED],
    ),
    Case(
        "pod evicted",
        running_job().obj(),
        observe().running(2).worker(1, phase="Failed", status_reason="Evicted").obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 5), CreateWorkerPod(1, 1, reasons.POD_EVICTED)],
        restarts=(0, 0, 1),
        events=[reasons.POD_EVICTED],
    ),
    Case(
        "pod deleted (gone) after it was seen",
        running_job().obj(),
        observe().rdzv().worker(0).lease("train-n0-a0", 1, hb()).obj(),
        [CreateWorkerPod(1, 1, reasons.POD_DELETED)],
        restarts=(0, 0, 1),
        events=[reasons.POD_DELETED],
    ),
    Case(
        "pod being deleted by someone: replaced once it is gone",
        running_job().obj(),
        observe().running(2).worker(1, deleting=True).obj(),
        [],
        restarts=(0, 0, 1),
        events=[reasons.POD_DELETED],
        slots={1: {"attempt": 1, "state": "Replacing"}},
    ),
    Case(
        "node NotReady: force-delete the pod, quarantine",
        running_job().obj(),
        observe().running(2).node("node-1", "Unknown").obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 0), TaintNode("node-1")],
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
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 0), TaintNode("node-1")],
        restarts=(0, 0, 1),
        events=[reasons.NODE_LOST, reasons.NODE_QUARANTINED],
    ),
    Case(
        "pod-reported hard fault",
        running_job().obj(),
        observe().running(2).lease("train-n0-a0", 1, hb(fault=HARD)).obj(),
        [DeletePod("train-n0-a0", "uid-train-n0-a0", 5), TaintNode("node-0")],
        restarts=(0, 0, 1),
        events=[reasons.POD_REPORTED_HARD_FAULT, reasons.NODE_QUARANTINED],
    ),
    Case(
        "replacement waits while the old pod still terminates (never two live pods per slot)",
        running_job(
            nodeSlots=slot_status(
                2,
                {
                    1: {
                        "attempt": 1,
                        "pod": "",
                        "state": "Replacing",
                        "recoveringSince": ago(3).isoformat(),
                        "lastFaultReason": "X",
                    }
                },
            ),
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
            nodeSlots=slot_status(
                2,
                {
                    1: {
                        "attempt": 1,
                        "pod": "",
                        "state": "Replacing",
                        "recoveringSince": ago(3).isoformat(),
                        "lastFaultReason": reasons.HEARTBEAT_TIMEOUT,
                    }
                },
            ),
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
    # --- level 4: the job ends -----------------------------------------------------------------------
    Case(
        "exit 93 fails the job: nothing restarted, running pods deleted",
        running_job().obj(),
        observe().running(2).worker(0, phase="Failed", exit_code=93).obj(),
        [DeletePod("train-rdzv", "rdzv-1", None), DeletePod("train-n1-a0", "uid-train-n1-a0", None)],
        state="Failed",
        reason=reasons.DO_NOT_RESTART_EXIT_CODE,
        events=[reasons.DO_NOT_RESTART_EXIT_CODE],
        conditions={"Failed": "True", "Running": "False"},
    ),
    Case(
        "the API server refused a pod built from the spec: InvalidSpec, nothing retried",
        running_job().obj(),
        observe().running(1).refused('Pod "train-n1-a0" is invalid: spec.volumes[2]: Forbidden').obj(),
        [DeletePod("train-rdzv", "rdzv-1", None), DeletePod("train-n0-a0", "uid-train-n0-a0", None)],
        state="Failed",
        reason=reasons.INVALID_SPEC,
        events=[reasons.INVALID_SPEC],
        conditions={"Failed": "True", "Running": "False"},
    ),
    Case(
        "a permanent error reported by a pod fails the job at once: nothing replaced, no quarantine",
        running_job().obj(),
        observe().running(2).lease("train-n1-a0", 1, hb("InProcessRestarting", ip=1, fault=PERMANENT)).obj(),
        [
            DeletePod("train-rdzv", "rdzv-1", None),
            DeletePod("train-n0-a0", "uid-train-n0-a0", None),
            DeletePod("train-n1-a0", "uid-train-n1-a0", None),
        ],
        state="Failed",
        reason=reasons.PERMANENT_FAULT,
        events=[reasons.PERMANENT_FAULT],
        conditions={"Failed": "True", "Running": "False", "Degraded": "False"},
    ),
    Case(
        "a permanent error on the Lease of a pod that then exited 70 fails the job (not a reschedule)",
        running_job().obj(),
        observe()
        .running(2)
        .worker(1, phase="Failed", exit_code=70)
        .lease("train-n1-a0", 1, hb("InJobRestarting", fault=PERMANENT))
        .obj(),
        [DeletePod("train-rdzv", "rdzv-1", None), DeletePod("train-n0-a0", "uid-train-n0-a0", None)],
        state="Failed",
        reason=reasons.PERMANENT_FAULT,
        events=[reasons.PERMANENT_FAULT],
        quarantined=[],
    ),
    Case(
        "custom do-not-restart exit code",
        running_job().ft(doNotRestartExitCodes=[42]).obj(),
        observe().running(2).worker(0, phase="Failed", exit_code=42).obj(),
        [DeletePod("train-rdzv", "rdzv-1", None), DeletePod("train-n1-a0", "uid-train-n1-a0", None)],
        state="Failed",
        reason=reasons.DO_NOT_RESTART_EXIT_CODE,
        events=[reasons.DO_NOT_RESTART_EXIT_CODE],
    ),
    Case(
        "reschedule budget exhausted fails the job",
        running_job(restarts={"podReschedules": 4}).obj(),
        observe().running(2).lease("train-n1-a0", 45, hb()).obj(),
        [
            DeletePod("train-rdzv", "rdzv-1", None),
            DeletePod("train-n0-a0", "uid-train-n0-a0", None),
            DeletePod("train-n1-a0", "uid-train-n1-a0", None),
        ],
        state="Failed",
        reason=reasons.POD_RESCHEDULE_BUDGET_EXHAUSTED,
        restarts=(0, 0, 4),
        events=[reasons.POD_RESCHEDULE_BUDGET_EXHAUSTED],
    ),
    Case(
        "maxPodReschedules 0: first hard fault fails the job",
        running_job().ft(maxPodReschedules=0).obj(),
        observe().running(2).worker(1, phase="Failed", exit_code=70).obj(),
        [DeletePod("train-rdzv", "rdzv-1", None), DeletePod("train-n0-a0", "uid-train-n0-a0", None)],
        state="Failed",
        reason=reasons.POD_RESCHEDULE_BUDGET_EXHAUSTED,
        events=[reasons.POD_RESCHEDULE_BUDGET_EXHAUSTED],
    ),
    Case(
        "all workers Succeeded: job Succeeded, rendezvous removed",
        running_job().obj(),
        observe()
        .rdzv()
        .worker(0, phase="Succeeded", exit_code=0)
        .worker(1, phase="Succeeded", exit_code=0)
        .obj(),
        [DeletePod("train-rdzv", "rdzv-1", None)],
        state="Succeeded",
        reason=reasons.ALL_PODS_SUCCEEDED,
        events=[reasons.ALL_PODS_SUCCEEDED],
        conditions={"Succeeded": "True", "Running": "False"},
    ),
    Case(
        "one worker Succeeded, one still training: wait",
        running_job().obj(),
        observe().running(2).worker(0, phase="Succeeded", exit_code=0).obj(),
        [],
        state="Running",
        slots={0: {"state": "Succeeded"}},
    ),
    Case(
        "finished job inside its TTL: nothing",
        make_job()
        .nodes(1)
        .spec(ttlSecondsAfterFinished=60)
        .status(
            completionTime=ago(30).isoformat(),
            conditions=[{"type": "Succeeded", "status": "True", "reason": "AllPodsSucceeded"}],
        )
        .obj(),
        observe().obj(),
        [],
    ),
    Case(
        "finished job past its TTL is deleted",
        make_job()
        .nodes(1)
        .spec(ttlSecondsAfterFinished=60)
        .status(
            completionTime=ago(61).isoformat(),
            conditions=[{"type": "Succeeded", "status": "True", "reason": "AllPodsSucceeded"}],
        )
        .obj(),
        observe().obj(),
        [DeleteJob()],
    ),
    # --- suspend / resume ----------------------------------------------------------------------------------
    Case(
        "suspend deletes every pod gracefully, keeps counters",
        running_job(restarts={"inJob": 2}).spec(suspend=True).obj(),
        observe().running(2).obj(),
        [
            DeletePod("train-rdzv", "rdzv-1", None),
            DeletePod("train-n0-a0", "uid-train-n0-a0", None),
            DeletePod("train-n1-a0", "uid-train-n1-a0", None),
        ],
        state="Suspended",
        restarts=(0, 2, 0),
        events=[reasons.SUSPENDED],
        conditions={"Suspended": "True"},
        slots={0: {"pod": "", "state": "Suspended"}},
    ),
    Case(
        "resume recreates pods with the next attempt, not counted as reschedules",
        make_job()
        .nodes(2)
        .status(
            nodeSlots=[
                {"slot": 0, "attempt": 0, "state": "Suspended"},
                {"slot": 1, "attempt": 2, "state": "Suspended"},
            ],
            restarts={"podReschedules": 2},
            conditions=[{"type": "Suspended", "status": "True", "reason": "Suspended"}],
        )
        .obj(),
        observe().obj(),
        [
            CreateRendezvousPod(),
            CreateWorkerPod(0, 1, reasons.CAUSE_RESUME),
            CreateWorkerPod(1, 3, reasons.CAUSE_RESUME),
        ],
        restarts=(0, 0, 2),
        events=[reasons.RESUMED],
        conditions={"Suspended": "False"},
    ),
    Case(
        "resumed pod adopted after a lost status write is not a reschedule",
        make_job().nodes(1).status(nodeSlots=[{"slot": 0, "attempt": 0}]).obj(),
        observe().rdzv().worker(0, 1, cause=reasons.CAUSE_RESUME).lease("train-n0-a1", 1, hb()).obj(),
        [],
        restarts=(0, 0, 0),
        slots={0: {"attempt": 1, "pod": "train-n0-a1"}},
    ),
    # (rendezvous pod cases: tests/unit/test_ladder_job_level.py, the rendezvous is job level)
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
            TaintNode("node-1"),
            PromoteSpare("train-spare-0-a0", 1, 1, reasons.LAUNCHER_BUDGET_EXHAUSTED),
            AssignLease("train-spare-0-a0", 1),
            CreateSparePod(0, 1, ("node-1",)),
        ],
        restarts=(0, 0, 1),
        events=[reasons.LAUNCHER_BUDGET_EXHAUSTED, reasons.NODE_QUARANTINED, reasons.SPARE_PROMOTED],
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
            nodeSlots=slot_status(
                2,
                {
                    1: {
                        "attempt": 1,
                        "pod": "",
                        "state": "Replacing",
                        "recoveringSince": ago(3).isoformat(),
                        "lastFaultReason": "PodFailed",
                    }
                },
            ),
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
            nodeSlots=slot_status(
                2,
                {
                    1: {
                        "attempt": 1,
                        "pod": "",
                        "state": "Replacing",
                        "recoveringSince": ago(3).isoformat(),
                        "lastFaultReason": "PodFailed",
                    }
                },
            ),
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
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 5), CreateWorkerPod(1, 1, reasons.POD_FAILED)],
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
def test_ladder(case: Case) -> None:
    d = decide(case.job, case.observed, NOW)
    assert d.actions == case.actions
    st = d.status
    if case.state:
        assert st.state == case.state
    if case.reason:
        assert st.reason == case.reason
    assert (st.restarts.in_process, st.restarts.in_job, st.restarts.pod_reschedules) == case.restarts
    assert [e.reason for e in d.events] == case.events
    for slot, fields in case.slots.items():
        got = st.node_slots[slot].model_dump(by_alias=True)
        assert {k: got[k] for k in fields} == fields
    conds = {c.type: c.status for c in st.conditions}
    for type_, value in case.conditions.items():
        assert conds.get(type_) == value
    if case.quarantined:
        assert st.quarantined_nodes == case.quarantined


def test_decide_is_idempotent_on_its_own_output() -> None:
    """Feeding a pass's status back with the same observation changes nothing and counts nothing."""
    job = running_job().obj()
    obs = observe().running(2).lease("train-n1-a0", 1, hb("InProcessRestarting", ip=2, ij=1)).obj()
    first = decide(job, obs, NOW)
    again = decide(job.model_copy(update={"status": first.status}), obs, NOW)
    assert again.status == first.status
    assert again.restarts == [] and again.events == [] and again.actions == []


def test_soft_restart_delta_carried_across_replacement() -> None:
    """Counts of a replaced pod stay in the job total; the new pod's counts start from zero."""
    job = running_job(
        nodeSlots=slot_status(2, {1: {"inProcessRestarts": 5}}), restarts={"inProcess": 5}
    ).obj()
    d = decide(job, observe().running(2).lease("train-n1-a0", 40, hb(ip=5)).obj(), NOW)
    assert d.status.restarts.in_process == 5
    assert d.status.node_slots[1].in_process_restarts == 0
    job2 = job.model_copy(update={"status": d.status})
    obs2 = (
        observe()
        .rdzv()
        .worker(0)
        .lease("train-n0-a0", 1, hb())
        .worker(1, 1, cause="HeartbeatTimeout")
        .lease("train-n1-a1", 1, hb(ip=1))
        .obj()
    )
    d2 = decide(job2, obs2, NOW)
    assert d2.status.restarts.in_process == 6


def test_condition_transition_time_kept_unless_status_flips() -> None:
    job = running_job().obj()
    d = decide(job, observe().running(2).obj(), NOW)
    running = next(c for c in d.status.conditions if c.type == "Running")
    assert running.last_transition_time == ago(3600)
    assert running.observed_generation == 1


def test_checkpoint_never_goes_backwards() -> None:
    job = running_job(lastCheckpoint={"step": 500, "time": ago(100).isoformat()}).obj()
    d = decide(job, observe().running(2, heartbeat=hb(ckpt=400)).obj(), NOW)
    assert d.status.last_checkpoint is not None and d.status.last_checkpoint.step == 500
    d = decide(job, observe().running(2).lease("train-n0-a0", 1, hb(ckpt=600)).obj(), NOW)
    assert d.status.last_checkpoint is not None and d.status.last_checkpoint.step == 600


def test_memory_snapshot_step_is_the_newest_every_pod_holds_refreshed_with_heartbeat_times() -> None:
    job = running_job().obj()
    both = observe().running(2).lease("train-n0-a0", -100, hb(mem=30)).lease("train-n1-a0", -100, hb(mem=20))
    assert decide(job, both.obj(), NOW).status.memory_snapshot_step == 20
    one = observe().running(2).lease("train-n0-a0", -100, hb(mem=30)).lease("train-n1-a0", -100, hb())
    assert decide(job, one.obj(), NOW).status.memory_snapshot_step is None  # no step every pod holds
    # Between two heartbeat-time refreshes (resolution), status keeps its value: no write per snapshot.
    later = running_job(memorySnapshotStep=10).obj()
    soon = observe().running(2).lease("train-n0-a0", 1, hb(mem=30)).lease("train-n1-a0", 1, hb(mem=30))
    assert decide(later, soon.obj(), NOW).status.memory_snapshot_step == 10


def test_persist_seconds_is_the_longest_any_pod_measured_and_never_shrinks() -> None:
    job = running_job(persistSeconds=12.5).obj()
    obs = (
        observe()
        .running(2)
        .lease("train-n0-a0", 1, hb(persist=20.0))
        .lease("train-n1-a0", 1, hb(persist=3.0))
    )
    assert decide(job, obs.obj(), NOW).status.persist_seconds == 20.0
    assert (
        decide(job, observe().running(2, heartbeat=hb(persist=4.0)).obj(), NOW).status.persist_seconds == 12.5
    )
    assert decide(running_job().obj(), observe().running(2).obj(), NOW).status.persist_seconds is None


def test_heartbeat_time_in_status_is_coarse() -> None:
    """A heartbeat alone does not change status (no write) until the resolution has passed."""
    job = running_job().obj()
    d = decide(job, observe().running(2).obj(), NOW)
    assert d.status == decide(job, observe().running(2).obj(), NOW).status
    assert d.status.node_slots[0].last_heartbeat_time == ago(1)  # status said ago(1): unchanged
    later = job.model_copy(update={"status": d.status})
    d2 = decide(later, observe().running(2).lease("train-n0-a0", -100, hb()).obj(), NOW)
    assert d2.status.node_slots[0].last_heartbeat_time == ago(-100)


def test_heartbeat_times_reach_status_together() -> None:
    """When one slot's heartbeat time is due, every slot's is written in the same pass: one status
    write per resolution period per job, not one per slot."""
    job = running_job().obj()
    obs = observe().running(2).lease("train-n0-a0", -100, hb()).lease("train-n1-a0", -30, hb()).obj()
    slots = decide(job, obs, NOW).status.node_slots
    assert [s.last_heartbeat_time for s in slots] == [ago(-100), ago(-30)]
    quiet = observe().running(2).lease("train-n0-a0", -30, hb()).lease("train-n1-a0", -30, hb()).obj()
    assert [s.last_heartbeat_time for s in decide(job, quiet, NOW).status.node_slots] == [ago(1), ago(1)]


def test_goodput() -> None:
    job = running_job(lostSeconds=360.0).obj()
    assert goodput(job.status, NOW) == pytest.approx(0.9)
    assert goodput(make_job().obj().status, NOW) is None


def test_lease_parser_clamps_future_and_ignores_garbage() -> None:
    from rtj.ladder import lease_from_dict

    future = (NOW.replace(year=2030)).isoformat()
    obs = lease_from_dict(
        {
            "metadata": {"name": "p", "annotations": {contract.HEARTBEAT_ANNOTATION: "{not json"}},
            "spec": {"renewTime": future},
        },
        NOW,
    )
    assert obs.renew_time == NOW and obs.heartbeat is None
    assert lease_from_dict({"metadata": {}, "spec": {"renewTime": 12}}, NOW).renew_time is None


def test_future_renew_time_ages_from_when_it_was_seen() -> None:
    """A Lease stuck at a renewTime in the future (a dead pod with a skewed clock) times out: its
    heartbeat counts from when the operator received that version, not from the future."""
    from rtj.ladder import OBSERVED_AT, lease_from_dict

    future = NOW.replace(year=2030).isoformat()
    raw = {
        "metadata": {
            "name": "train-n1-a0",
            "annotations": {contract.HEARTBEAT_ANNOTATION: hb().to_annotation()},
        },
        "spec": {"renewTime": future},
        OBSERVED_AT: ago(31),
    }
    lease = lease_from_dict(raw, NOW)
    assert lease.renew_time == ago(31)
    obs = observe().running(2).obj()
    d = decide(
        running_job().obj(),
        Observed(pods=obs.pods, leases={**obs.leases, "train-n1-a0": lease}, nodes=obs.nodes),
        NOW,
    )
    assert [e.reason for e in d.events][:1] == [reasons.HEARTBEAT_TIMEOUT]
    fresh = lease_from_dict({**raw, OBSERVED_AT: ago(1)}, NOW)
    assert fresh.renew_time == ago(1)


def test_pod_parser_reads_exit_code_and_labels() -> None:
    from rtj.ladder import pod_from_dict

    pod = pod_from_dict(
        {
            "metadata": {
                "name": "train-n3-a2",
                "uid": "u",
                "labels": {contract.LABEL_ROLE: "worker"},
                "deletionTimestamp": NOW.isoformat(),
            },
            "spec": {"nodeName": "n"},
            "status": {
                "phase": "Failed",
                "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 70}}}],
            },
        }
    )
    assert (pod.slot, pod.attempt, pod.exit_code, pod.deleting, pod.phase) == (3, 2, 70, True, "Failed")
    garbage = pod_from_dict(
        {"metadata": {"name": "x", "labels": {contract.LABEL_ATTEMPT: "-4"}}, "status": None}
    )
    assert garbage.attempt == 0 and garbage.slot is None


def test_wide_columns_newest_fault_and_step() -> None:
    """kubectl get rtj -o wide: the newest fault (reason, node) and the newest step reported."""
    d = decide(running_job().obj(), observe().running(2).lease("train-n1-a0", 31, hb()).obj(), NOW)
    fault = d.status.last_fault
    assert fault is not None and (fault.reason, fault.node, fault.slot) == (
        reasons.HEARTBEAT_TIMEOUT,
        "node-1",
        1,
    )
    fresh = make_job().nodes(2).obj()  # first heartbeats: due at once
    obs = (
        observe().running(2).lease("train-n0-a0", 1, hb(step=120)).lease("train-n1-a0", 1, hb(step=118)).obj()
    )
    assert decide(fresh, obs, NOW).status.step == 120


def test_failed_job_keeps_no_stale_degraded() -> None:
    """issue 13, case 1's end state: Failed with Degraded=True PodsPending still set."""
    job = running_job(
        conditions=[
            {
                "type": "Degraded",
                "status": "True",
                "reason": "PodsPending",
                "lastTransitionTime": ago(9).isoformat(),
            },
            {"type": "Failed", "status": "True", "reason": "PodRescheduleBudgetExhausted"},
        ]
    ).obj()
    conds = {c.type: c.status for c in decide(job, observe().obj(), NOW).status.conditions}
    assert conds["Degraded"] == "False" and conds["Failed"] == "True"


@pytest.mark.parametrize(
    ("old_step", "new_steps", "rate"),
    [
        pytest.param(100, (160, 158), 1.0, id="60-steps-in-60s"),
        pytest.param(100, (100, 99), 0.0, id="frozen-step-reads-0"),
        pytest.param(100, (40, 38), None, id="resumed-from-an-older-checkpoint-unknown"),
        pytest.param(None, (160, 158), None, id="first-step-seen-unknown"),
    ],
)
def test_wide_column_steps_per_second(
    old_step: int | None, new_steps: tuple[int, int], rate: float | None
) -> None:
    """kubectl get rtj -o wide: steps/s between two refreshes of status.step (60 s apart here)."""
    slots = slot_status(2, {s: {"lastHeartbeatTime": ago(61).isoformat()} for s in range(2)})
    job = running_job(step=old_step, nodeSlots=slots, stepsPerSecond=3.0).obj()
    obs = observe().running(2)
    for s, step in enumerate(new_steps):
        obs = obs.lease(f"train-n{s}-a0", 1, hb(step=step))
    status = decide(job, obs.obj(), NOW).status
    assert status.step == max(new_steps)
    assert status.steps_per_second == rate


def test_ended_job_shows_no_steps_per_second() -> None:
    job = running_job(stepsPerSecond=3.0, step=100).obj()
    obs = observe().running(2).worker(0, phase="Failed", exit_code=93).obj()
    status = decide(job, obs, NOW).status
    assert status.state == "Failed" and status.steps_per_second is None
