"""Table tests of how a job ends (rtj.ladder.endings) through decide(): budgets spent, do-not-restart
codes, permanent faults, success; and suspend / resume."""

from __future__ import annotations

import pytest
from ladder_testkit import (
    PERMANENT,
    Case,
    ago,
    check,
    hb,
    make_job,
    observe,
    running_job,
)
from rtj import reasons
from rtj.ladder import (
    CreateRendezvousPod,
    CreateWorkerPod,
    DeleteJob,
    DeletePod,
)

pytestmark = pytest.mark.unit

CASES = [
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
        "exit 93 while the rendezvous pod's node is NotReady: that pod is deleted once, forced",
        running_job().obj(),
        observe()
        .running(2)
        .rdzv(node="dead")
        .node("dead", ready="Unknown")
        .worker(0, phase="Failed", exit_code=93)
        .obj(),
        [DeletePod("train-rdzv", "rdzv-1", 0), DeletePod("train-n1-a0", "uid-train-n1-a0", None)],
        state="Failed",
        reason=reasons.DO_NOT_RESTART_EXIT_CODE,
        events=[reasons.RENDEZVOUS_LOST, reasons.DO_NOT_RESTART_EXIT_CODE],
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
        "failed job: a graceful deletion on a node that went NotReady is forced (no kubelet ends it)",
        make_job()
        .nodes(1)
        .status(conditions=[{"type": "Failed", "status": "True", "reason": "DoNotRestartExitCode"}])
        .obj(),
        observe().rdzv(node="dead", deleting=True).node("dead", ready="False").obj(),
        [DeletePod("train-rdzv", "rdzv-1", 0)],
    ),
    Case(
        "failed job: a graceful deletion on a Ready node is left to its kubelet",
        make_job()
        .nodes(1)
        .status(conditions=[{"type": "Failed", "status": "True", "reason": "DoNotRestartExitCode"}])
        .obj(),
        observe().rdzv(node="up", deleting=True).node("up").obj(),
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
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_endings(case: Case) -> None:
    check(case)
