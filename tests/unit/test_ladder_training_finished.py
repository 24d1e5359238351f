"""Table tests of rtj.ladder.training_finished through decide(): once a worker pod exited 0, no pod
is created again; a slot that faults, or has no pod, is stopped (Finished when its ranks had
finished); running pods are waited for and judged by the progress watchdog. `make demo`,
2026-12-02: a replacement created while the job finished waited alone."""

from __future__ import annotations

from datetime import timedelta

import pytest
from ladder_testkit import (
    NOW,
    Case,
    ObservedBuilder,
    ago,
    check,
    hb,
    make_job,
    observe,
    running_job,
    running_status,
    slot_status,
)
from rtj import reasons
from rtj.api.models import ResilientTrainingJob
from rtj.ladder import DeletePod, decide
from rtj.ladder.pass_state import LadderConfig

pytestmark = pytest.mark.unit

#: The grace a finished pod's release is deleted with (the operator's fault grace).
FAULT_GRACE = LadderConfig().fault_grace_seconds


def with_slot_0(**fields: object) -> ResilientTrainingJob:
    return make_job().nodes(2).status(**running_status(2, nodeSlots=slot_status(2, {0: fields}))).obj()


def finished_slot_1() -> ObservedBuilder:
    """Slot 1's pod exited 0; slot 0's pod is added by each row."""
    return observe().rdzv().worker(1, phase="Succeeded", exit_code=0)


CASES = [
    Case(
        "a peer exited 0, then slot 0's pod failed before its ranks finished: stopped, not replaced; "
        "the job Failed TrainingIncomplete",
        running_job().obj(),
        finished_slot_1().worker(0, phase="Failed", exit_code=1).obj(),
        [DeletePod("train-rdzv", "rdzv-1", None)],
        state="Failed",
        reason=reasons.TRAINING_INCOMPLETE,
        events=[reasons.POD_FAILED, reasons.TRAINING_INCOMPLETE],
        slots={0: {"state": "Failed", "lastFaultReason": reasons.POD_FAILED}, 1: {"state": "Succeeded"}},
        conditions={"Failed": "True"},
    ),
    Case(
        "a peer exited 0, slot 0's pod failed after its ranks reported Finished: the job Succeeded "
        "TrainingFinished",
        running_job().obj(),
        finished_slot_1()
        .worker(0, phase="Failed", exit_code=1)
        .lease("train-n0-a0", 1, hb("Finished"))
        .obj(),
        [DeletePod("train-rdzv", "rdzv-1", None)],
        state="Succeeded",
        reason=reasons.TRAINING_FINISHED,
        events=[reasons.POD_FAILED, reasons.TRAINING_FINISHED],
        slots={0: {"state": "Completed"}, 1: {"state": "Succeeded"}},
        conditions={"Succeeded": "True"},
    ),
    Case(
        "a peer exited 0, slot 0's finished pod went silent: deleted at once, no node quarantined",
        running_job().obj(),
        finished_slot_1().worker(0).lease("train-n0-a0", 400, hb("Finished")).obj(),
        [DeletePod("train-n0-a0", "uid-train-n0-a0", 0), DeletePod("train-rdzv", "rdzv-1", None)],
        state="Succeeded",
        reason=reasons.TRAINING_FINISHED,
        events=[reasons.HEARTBEAT_TIMEOUT, reasons.TRAINING_FINISHED],
    ),
    Case(
        "a peer exited 0, slot 0 has no pod (its replacement not created yet): none is; TrainingIncomplete",
        with_slot_0(attempt=1, pod="", state="Replacing"),
        finished_slot_1().obj(),
        [DeletePod("train-rdzv", "rdzv-1", None)],
        state="Failed",
        reason=reasons.TRAINING_INCOMPLETE,
        events=[reasons.TRAINING_INCOMPLETE, reasons.TRAINING_INCOMPLETE],
    ),
    Case(
        # kubelet tier, 2026-12-02: "Finished" (a live pod's ranks done, the pod exiting) was taken for
        # a stopped slot and the job Succeeded with that pod still running.
        "a peer exited 0, slot 0's ranks finished and its pod is exiting: waited for",
        running_job().obj(),
        finished_slot_1().worker(0).lease("train-n0-a0", 1, hb("Finished")).obj(),
        [],
        slots={0: {"state": "Finished"}, 1: {"state": "Succeeded"}},
    ),
    Case(
        "a peer exited 0, slot 0 still training: waited for, nothing deleted or created",
        running_job().obj(),
        finished_slot_1().worker(0).lease("train-n0-a0", 1, hb()).obj(),
        [],
        slots={0: {"state": "Training"}, 1: {"state": "Succeeded"}},
    ),
    Case(
        "a peer exited 0, slot 0's replacement still Starting: waited for (the progress watchdog judges it)",
        with_slot_0(attempt=1, pod="train-n0-a1", lastHeartbeatTime=None, state="Starting"),
        finished_slot_1().worker(0, attempt=1, cause="HeartbeatTimeout", started=ago(10)).obj(),
        [],
        slots={0: {"state": "Starting"}, 1: {"state": "Succeeded"}},
    ),
    # e2e, 2026-12-04: a pod deleted as the job finished was replaced, the replacement waited alone
    # and the peer lingered in ft_launcher's exit barrier for 300 s.
    Case(
        "slot 1's ranks Finished (its pod lingers), slot 0's pod deleted after its ranks finished: not "
        "replaced, slot 1's pod released; Succeeded TrainingFinished",
        running_job().obj(),
        observe()
        .rdzv()
        .worker(1)
        .lease("train-n1-a0", 1, hb("Finished"))
        .worker(0, deleting=True)
        .lease("train-n0-a0", 1, hb("Finished"))
        .obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", FAULT_GRACE), DeletePod("train-rdzv", "rdzv-1", None)],
        state="Succeeded",
        reason=reasons.TRAINING_FINISHED,
        events=[reasons.POD_DELETED, reasons.TRAINING_FINISHED, reasons.TRAINING_FINISHED],
        slots={0: {"state": "Completed"}, 1: {"state": "Completed"}},
    ),
    Case(
        "slot 1's ranks Finished, slot 0's pod (last seen Finished) vanished: not replaced, Completed",
        with_slot_0(state="Finished"),
        observe().rdzv().node("node-0").worker(1).lease("train-n1-a0", 1, hb("Finished")).obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", FAULT_GRACE), DeletePod("train-rdzv", "rdzv-1", None)],
        state="Succeeded",
        reason=reasons.TRAINING_FINISHED,
        events=[reasons.POD_DELETED, reasons.TRAINING_FINISHED, reasons.TRAINING_FINISHED],
        slots={0: {"state": "Completed"}, 1: {"state": "Completed"}},
    ),
    Case(
        "slot 1's ranks Finished, slot 0's pod deleted while its ranks trained: not replaced; Failed "
        "TrainingIncomplete",
        running_job().obj(),
        observe()
        .rdzv()
        .worker(1)
        .lease("train-n1-a0", 1, hb("Finished"))
        .worker(0, deleting=True)
        .lease("train-n0-a0", 1, hb())
        .obj(),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", FAULT_GRACE), DeletePod("train-rdzv", "rdzv-1", None)],
        state="Failed",
        reason=reasons.TRAINING_INCOMPLETE,
        events=[reasons.POD_DELETED, reasons.TRAINING_FINISHED, reasons.TRAINING_INCOMPLETE],
        slots={0: {"state": "Failed"}, 1: {"state": "Completed"}},
    ),
    Case(
        "slot 1's ranks Finished, slot 0 still training, no fault: waited for, nothing deleted",
        running_job().obj(),
        observe()
        .rdzv()
        .worker(1)
        .lease("train-n1-a0", 1, hb("Finished"))
        .worker(0)
        .lease("train-n0-a0", 1, hb())
        .obj(),
        [],
        slots={0: {"state": "Training"}, 1: {"state": "Finished"}},
    ),
    Case(
        "every worker exited 0: AllPodsSucceeded",
        running_job().obj(),
        finished_slot_1().worker(0, phase="Succeeded", exit_code=0).obj(),
        [DeletePod("train-rdzv", "rdzv-1", None)],
        state="Succeeded",
        reason=reasons.ALL_PODS_SUCCEEDED,
        events=[reasons.ALL_PODS_SUCCEEDED],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_training_finished(case: Case) -> None:
    check(case)


def test_a_stopped_slot_is_announced_once_and_does_not_disarm_the_watchdog() -> None:
    """3 slots: slot 2 exited 0, slot 1 failed (stopped), slot 0 still trains. The next pass, with
    the status the first wrote, posts no second Event and creates nothing, even with the succeeded
    pod gone; later, slot 0's step frozen past twice progressTimeoutSeconds ends the job NoProgress."""
    job = (
        make_job().nodes(3).ft(progressTimeoutSeconds=600).status(**running_status(3, progressStep=100)).obj()
    )
    first = observe().rdzv().worker(2, phase="Succeeded", exit_code=0).worker(1, phase="Failed", exit_code=1)
    first = first.worker(0).lease("train-n0-a0", 1, hb(step=100))
    d = decide(job, first.obj(), NOW)
    assert [e.reason for e in d.events] == [reasons.POD_FAILED]
    assert d.status.training_finished_time == NOW
    assert d.actions == []
    job.status = d.status
    later = observe().rdzv().worker(0).lease("train-n0-a0", 1, hb(step=100))
    d = decide(job, later.obj(), NOW)
    assert [s.state for s in d.status.node_slots] == ["Training", "Failed", "Succeeded"]
    assert d.actions == []
    assert reasons.POD_FAILED not in [e.reason for e in d.events]
    assert d.status.restarts.pod_reschedules == 0
    job.status = d.status
    job.status.last_progress_time = NOW - timedelta(seconds=1300)
    d = decide(job, later.obj(), NOW)
    assert d.status.reason == reasons.NO_PROGRESS
