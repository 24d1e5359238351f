"""Table tests of the incident policy (rtj.ladder.incidents) through decide(): each fault is one entry
of status.incidents however many pods echo it (issue 25, item 8), with its class, evidence, action and
cost; written by the pass that acts, exactly once; closed (recoverySeconds, stepsLost, one
RecoveryObserved labelled with its class) when the slot it began in trains again."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from ladder_testkit import NOW, SOFT, ago, hb, make_job, observe, running_job, running_status, slot_status
from rtj import contract, reasons
from rtj.api.models import INCIDENT_MESSAGE_MAX, INCIDENTS_KEPT, ResilientTrainingJob
from rtj.ladder import Observed, RecoveryObserved, decide
from rtj.ladder import incidents as inc

pytestmark = pytest.mark.unit

PEER = {"severity": "Soft", "reason": "PeerFailure", "message": "gloo timeout", "time": ago(3).isoformat()}
EXITED = {"severity": "Soft", "reason": "RankExited", "message": "SIGKILL", "time": ago(3).isoformat()}


def incident(**fields: Any) -> dict[str, Any]:
    """An incident as a previous pass wrote it (wire names)."""
    base = {"seq": 1, "time": ago(20).isoformat(), "reason": "HeartbeatTimeout", "action": "Replaced"}
    return {**base, **fields}


def recovering(slot: int, since: float, level: str, **fields: Any) -> dict[int, dict[str, Any]]:
    return {slot: {"recoveringSince": ago(since).isoformat(), "recoveringLevel": level, **fields}}


@dataclass
class Case:
    id: str
    job: ResilientTrainingJob
    observed: Observed
    #: Expected status.incidents, each compared on the keys it names (wire names).
    incidents: list[dict[str, Any]]
    recoveries: list[RecoveryObserved] = field(default_factory=list)


def two_pods_restart(root: int, fault_root: dict[str, Any], echo: dict[str, Any]) -> Observed:
    b = observe().running(2)
    for slot in (0, 1):
        fault = fault_root if slot == root else echo
        b.lease(f"train-n{slot}-a0", 1, hb("InProcessRestarting", ip=1, step=120, fault=fault))
    return b.obj()


CASES = [
    Case(
        "one exception echoed by both pods in one pass (collateral first): one entry, two pods",
        running_job().obj(),
        two_pods_restart(1, SOFT, PEER),
        [
            {
                "seq": 1,
                "reason": reasons.IN_PROCESS_RESTART,
                "level": reasons.LEVEL_IN_PROCESS,
                "action": inc.RESTARTED_IN_PROCESS,
                "slot": 1,
                "pod": "train-n1-a0",
                "node": "node-1",
                "pods": 2,
                "message": "pod train-n1-a0 reported 1 InProcess restart(s) (RankException: boom)",
                "step": 120,
                "resumeStep": 120,
                "recoverySeconds": None,
            }
        ],
    ),
    Case(
        "one exception echoed by both pods in one pass (root first): one entry, two pods",
        running_job().obj(),
        two_pods_restart(0, SOFT, PEER),
        [{"slot": 0, "pods": 2, "action": inc.RESTARTED_IN_PROCESS}],
    ),
    Case(
        "the same exception seen on both pods, within a heartbeat timeout: one entry, two pods",
        running_job().obj(),
        two_pods_restart(0, SOFT, SOFT),
        [{"slot": 0, "pods": 2}],
    ),
    Case(
        "an echo in a later pass adds a pod to the open incident, no entry",
        running_job(
            nodeSlots=slot_status(2, recovering(1, 3, "InProcess", inProcessRestarts=1)),
            restarts={"inProcess": 1, "inProcessIncidentTime": ago(3).isoformat()},
            incidents=[
                incident(
                    reason="InProcessRestart", action="RestartedInProcess", slot=1, time=ago(3).isoformat()
                )
            ],
        ).obj(),
        observe()
        .running(2)
        .lease("train-n0-a0", 1, hb("InProcessRestarting", ip=1, fault=PEER))
        .lease("train-n1-a0", 1, hb("InProcessRestarting", ip=1, fault=SOFT))
        .obj(),
        [{"seq": 1, "pods": 2}],
    ),
    Case(
        "an in-job restart: resumable from the newest memory snapshot every pod holds",
        running_job(lastCheckpoint={"step": 100, "time": ago(60).isoformat()}).obj(),
        observe()
        .running(2)
        .lease("train-n0-a0", 1, hb("InJobRestarting", ij=1, step=140, mem=130, fault=EXITED))
        .lease("train-n1-a0", 1, hb(step=140, mem=125))
        .obj(),
        [
            {
                "reason": reasons.IN_JOB_RESTART,
                "action": inc.RESTARTED_IN_JOB,
                "slot": 0,
                "step": 140,
                "resumeStep": 125,
                "message": "pod train-n0-a0 reported 1 InJob restart(s) (RankExited: SIGKILL)",
            }
        ],
    ),
    Case(
        "heartbeat silence: Replaced, its class, the peers' step, resumable from the peer replica",
        running_job(lastCheckpoint={"step": 100, "time": ago(60).isoformat()}).obj(),
        observe()
        .running(2)
        .lease("train-n0-a0", 1, hb(step=140, mem=130, replica=120))
        .lease("train-n1-a0", 31, hb(step=135, mem=130, replica=125))
        .obj(),
        [
            {
                "reason": reasons.HEARTBEAT_TIMEOUT,
                "level": reasons.LEVEL_POD,
                "action": inc.REPLACED,
                "slot": 1,
                "pod": "train-n1-a0",
                "node": "node-1",
                "pods": 1,
                "step": 140,
                "resumeStep": 120,
                "time": NOW,
            }
        ],
    ),
    Case(
        "two nodes lost in one pass: one entry, two pods (each pod still spends the budget)",
        make_job().nodes(4).status(**running_status(4)).obj(),
        observe().running(4).without_node("node-1").without_node("node-3").obj(),
        [{"reason": reasons.NODE_LOST, "action": inc.REPLACED, "slot": 1, "pods": 2}],
    ),
    Case(
        "a disruption: Replaced at level Disruption",
        running_job().obj(),
        observe().running(2).worker(1, deleting=True, disruption="EvictionByEvictionAPI: drain").obj(),
        [{"reason": reasons.POD_DISRUPTED, "level": reasons.LEVEL_DISRUPTION, "action": inc.REPLACED}],
    ),
    Case(
        "a replacement pod from a pass whose status write was lost: recorded from its cause",
        running_job().obj(),
        observe()
        .running(2)
        .worker(1, 1, cause=reasons.HEARTBEAT_TIMEOUT, node="node-5")
        .lease("train-n1-a1", 1, hb())
        .obj(),
        [{"reason": reasons.HEARTBEAT_TIMEOUT, "action": inc.REPLACED, "slot": 1, "pod": "train-n1-a0"}],
    ),
    Case(
        "the rendezvous pod lost, a worker failing with it: one job-level entry, timed by the worker",
        make_job().nodes(4).status(**running_status(4)).obj(),
        observe().running(4).rdzv(uid="rdzv-2").worker(2, phase="Failed", exit_code=70).obj(),
        [
            {
                "reason": reasons.RENDEZVOUS_LOST,
                "level": reasons.LEVEL_JOB,
                "action": inc.RECREATED_RENDEZVOUS,
                "slot": 2,
                "pod": "train-n2-a0",
                "pods": 2,  # the rendezvous pod and the worker
            }
        ],
    ),
    Case(
        "a worker failing in the window after the rendezvous pod's loss: a pod of that incident",
        make_job()
        .nodes(4)
        .status(
            **running_status(
                4,
                jobFaultTime=ago(10).isoformat(),
                jobRestartTime=ago(10).isoformat(),
                restarts={"job": 1},
                incidents=[
                    incident(
                        reason="RendezvousLost",
                        action="RecreatedRendezvous",
                        level="Job",
                        time=ago(10).isoformat(),
                    )
                ],
            )
        )
        .obj(),
        observe().running(4).worker(2, phase="Failed", exit_code=70).obj(),
        [{"seq": 1, "reason": reasons.RENDEZVOUS_LOST, "slot": 2, "pod": "train-n2-a0", "pods": 2}],
    ),
    Case(
        "workers failing together: one job-level entry",
        make_job().nodes(4).status(**running_status(4)).obj(),
        observe()
        .running(4)
        .worker(0, phase="Failed", exit_code=70)
        .worker(3, phase="Failed", exit_code=70)
        .obj(),
        [{"reason": reasons.PODS_FAILED_TOGETHER, "action": inc.REPLACED_AT_JOB_LEVEL, "slot": 0, "pods": 2}],
    ),
    Case(
        "pods unschedulable: one Waited entry for the slots that wait",
        make_job().nodes(3).obj(),
        observe()
        .rdzv()
        .worker(0, phase="Pending", node="", unschedulable="0/3 nodes are available")
        .worker(1, phase="Pending", node="", unschedulable="0/3 nodes are available")
        .worker(2)
        .lease("train-n2-a0", 1, hb())
        .obj(),
        [{"reason": reasons.UNSCHEDULABLE, "action": inc.WAITED, "slot": 0, "pods": 2, "level": ""}],
    ),
    Case(
        "still waiting for the same reason: no new entry",
        make_job()
        .nodes(1)
        .status(
            conditions=[{"type": "Waiting", "status": "True", "reason": "Unschedulable"}],
            incidents=[incident(reason="Unschedulable", action="Waited")],
        )
        .obj(),
        observe().rdzv().worker(0, phase="Pending", node="", unschedulable="0/3 nodes").obj(),
        [{"seq": 1, "reason": reasons.UNSCHEDULABLE}],
    ),
    Case(
        "the budget spent: Failed, with the reason the job failed with",
        running_job(restarts={"podReschedules": 4}).obj(),
        observe().running(2).lease("train-n1-a0", 31, hb()).obj(),
        [{"reason": reasons.POD_RESCHEDULE_BUDGET_EXHAUSTED, "action": inc.FAILED, "level": ""}],
    ),
    Case(
        "a permanent error: Failed, naming the slot, pod and node",
        running_job().obj(),
        observe()
        .running(2)
        .lease(
            "train-n1-a0",
            1,
            hb(
                fault={
                    "severity": "Permanent",
                    "reason": "WorldSizeMismatch",
                    "message": "2 vs 3",
                    "time": ago(2).isoformat(),
                }
            ),
        )
        .obj(),
        [
            {
                "reason": reasons.PERMANENT_FAULT,
                "action": inc.FAILED,
                "slot": 1,
                "pod": "train-n1-a0",
                "node": "node-1",
            }
        ],
    ),
    Case(
        f"the last {INCIDENTS_KEPT} kept, numbered on",
        running_job(incidents=[incident(seq=s) for s in range(3, 3 + INCIDENTS_KEPT)]).obj(),
        observe().running(2).lease("train-n1-a0", 31, hb()).obj(),
        [{"seq": s} for s in range(4, 4 + INCIDENTS_KEPT)],
    ),
    # --- recovery: closed when the slot it began in trains again -----------------------------------
    Case(
        "replacement back to Training: recovery seconds and steps lost (from the peer replica)",
        running_job(
            nodeSlots=slot_status(
                2, {1: {"attempt": 1, "pod": "train-n1-a1", **recovering(1, 20, "Pod")[1]}}
            ),
            restarts={"podReschedules": 1},
            incidents=[incident(slot=1, level="Pod", step=140, resumeStep=120)],
        ).obj(),
        observe().running(2).worker(1, 1).lease("train-n1-a1", 1, hb(step=0)).obj(),
        [{"recoverySeconds": 19.0, "resumeStep": 120, "stepsLost": 20}],
        [RecoveryObserved(reasons.LEVEL_POD, 19.0, reasons.HEARTBEAT_TIMEOUT, 20)],
    ),
    Case(
        "its worker back to Training closes the rendezvous pod's loss (begun before the worker's recovery)",
        running_job(
            nodeSlots=slot_status(2, {1: {"attempt": 1, "pod": "train-n1-a1", **recovering(1, 5, "Job")[1]}}),
            incidents=[
                incident(
                    slot=1,
                    reason="RendezvousLost",
                    action="RecreatedRendezvous",
                    level="Job",
                    time=ago(10).isoformat(),
                )
            ],
        ).obj(),
        observe().running(2).worker(1, 1).lease("train-n1-a1", 1, hb()).obj(),
        [{"recoverySeconds": 9.0}],
        [RecoveryObserved(reasons.LEVEL_JOB, 9.0, reasons.RENDEZVOUS_LOST, None)],
    ),
    Case(
        "an emergency save committed before the recovery counts as resumable: 0 steps lost",
        running_job(
            nodeSlots=slot_status(
                2, {1: {"attempt": 1, "pod": "train-n1-a1", **recovering(1, 20, "Pod")[1]}}
            ),
            incidents=[incident(slot=1, level="Disruption", reason="PodDeleted", step=140, resumeStep=120)],
        ).obj(),
        observe().running(2).worker(1, 1).lease("train-n1-a1", 1, hb(step=0, ckpt=140)).obj(),
        [{"recoverySeconds": 19.0, "resumeStep": 140, "stepsLost": 0}],
        [RecoveryObserved(reasons.LEVEL_DISRUPTION, 19.0, reasons.POD_DELETED, 0)],
    ),
    Case(
        "an in-process restart that did resume older than its step (the pod reports it): counted",
        running_job(
            nodeSlots=slot_status(2, recovering(0, 4, "InProcess", inProcessRestarts=1)),
            incidents=[
                incident(
                    slot=0,
                    level="InProcess",
                    reason="InProcessRestart",
                    action="RestartedInProcess",
                    step=140,
                    resumeStep=140,
                    time=ago(4).isoformat(),
                )
            ],
        ).obj(),
        observe().running(2).lease("train-n0-a0", 1, hb(ip=1, step=131)).obj(),
        [{"recoverySeconds": 3.0, "resumeStep": 131, "stepsLost": 9}],
        [RecoveryObserved(reasons.LEVEL_IN_PROCESS, 3.0, reasons.IN_PROCESS_RESTART, 9)],
    ),
    Case(
        "a slot that only echoed an incident closes nothing (no second recovery observed)",
        running_job(
            nodeSlots=slot_status(2, recovering(0, 4, "InProcess", inProcessRestarts=1)),
            incidents=[
                incident(
                    slot=1,
                    level="InProcess",
                    reason="InProcessRestart",
                    action="RestartedInProcess",
                    time=ago(4).isoformat(),
                )
            ],
        ).obj(),
        observe().running(2).lease("train-n0-a0", 1, hb(ip=1)).obj(),
        [{"recoverySeconds": None}],
    ),
    Case(
        "an incident of the slot from before its recovery began (superseded) stays open",
        running_job(
            nodeSlots=slot_status(
                2, {1: {"attempt": 1, "pod": "train-n1-a1", **recovering(1, 20, "Pod")[1]}}
            ),
            incidents=[
                incident(
                    seq=1,
                    slot=1,
                    level="InJob",
                    reason="InJobRestart",
                    action="RestartedInJob",
                    time=ago(50).isoformat(),
                ),
                incident(seq=2, slot=1, level="Pod"),
            ],
        ).obj(),
        observe().running(2).worker(1, 1).lease("train-n1-a1", 1, hb()).obj(),
        [{"seq": 1, "recoverySeconds": None}, {"seq": 2, "recoverySeconds": 19.0}],
        [RecoveryObserved(reasons.LEVEL_POD, 19.0, reasons.HEARTBEAT_TIMEOUT, None)],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_incidents(case: Case) -> None:
    d = decide(case.job, case.observed, NOW)
    got = [i.model_dump(by_alias=True) for i in d.status.incidents]
    assert len(got) == len(case.incidents), got
    for want, have in zip(case.incidents, got, strict=True):
        assert {k: have[k] for k in want} == want
    assert d.recoveries == case.recoveries


def test_a_pass_computed_again_after_a_lost_write_records_once_and_the_next_adds_nothing() -> None:
    job, obs = running_job().obj(), two_pods_restart(1, SOFT, PEER)
    first = decide(job, obs, NOW)
    again = decide(job, obs, NOW)  # the write of `first` was lost: the same pass again
    assert first.status.incidents == again.status.incidents and len(first.status.incidents) == 1
    committed = job.model_copy(update={"status": first.status})
    assert decide(committed, obs, NOW).status.incidents == first.status.incidents


def test_the_evidence_is_truncated() -> None:
    long = {**SOFT, "message": "x" * 1000}
    d = decide(
        running_job().obj(), observe().running(2).lease("train-n0-a0", 1, hb(ip=1, fault=long)).obj(), NOW
    )
    (only,) = d.status.incidents
    assert len(only.message) == INCIDENT_MESSAGE_MAX and only.message.endswith("…")


def test_the_recovered_event_names_the_cost() -> None:
    (case,) = [c for c in CASES if c.id.startswith("replacement back to Training")]
    d = decide(case.job, case.observed, NOW)
    (event,) = [e for e in d.events if e.reason == reasons.RECOVERED]
    assert event.message.endswith("; incident 1 (HeartbeatTimeout): ~20 steps lost (estimate)")


@pytest.mark.parametrize(
    ("reason", "label"),
    [
        (reasons.HEARTBEAT_TIMEOUT, reasons.HEARTBEAT_TIMEOUT),
        (reasons.IN_JOB_RESTART, reasons.IN_JOB_RESTART),
        (reasons.PODS_FAILED_TOGETHER, reasons.PODS_FAILED_TOGETHER),
        ("SomethingATrainingScriptMadeUp", reasons.UNCLASSIFIED),
        (contract.FaultReason.RANK_EXCEPTION, reasons.UNCLASSIFIED),
    ],
)
def test_metric_labels_are_bounded(reason: str, label: str) -> None:
    assert inc.label(reason) == label
