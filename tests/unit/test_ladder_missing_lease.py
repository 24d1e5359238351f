"""Table tests of the missing-Lease policy (rtj.ladder.missing_lease) through decide().

A pod that heartbeated and whose Lease then disappeared (a user deleted it) is silent from its last
heartbeat the operator kept in status, with the trainer given time to recreate the Lease; it is not
"no first heartbeat since pod start" (issue 13, case 3). Job under test: heartbeat interval 5 s,
timeout 30 s, startup timeout 120 s; pods started 300 s ago."""

from __future__ import annotations

from typing import Any

import pytest
from ladder_testkit import NOW, Case, ago, check, make_job, observe, recorded, running_status
from rtj import reasons
from rtj.api.models import ResilientTrainingJob
from rtj.ladder import DeletePod, Observed, decide

pytestmark = pytest.mark.unit


def job_with_slot1(**slot1: Any) -> ResilientTrainingJob:
    status = running_status(2)
    status["nodeSlots"][1].update(slot1)
    return make_job().nodes(2).status(**status).obj()


def without_lease(pod: str) -> Observed:
    obs = observe().running(2).obj()
    return Observed(
        pods=obs.pods,
        leases={k: v for k, v in obs.leases.items() if k != pod},
        nodes=obs.nodes,
        service_exists=obs.service_exists,
    )


CASES = [
    Case(
        "Lease just went missing after heartbeats: no fault, the time it went missing is kept",
        job_with_slot1(lastHeartbeatTime=ago(50).isoformat()),
        without_lease("train-n1-a0"),
        slots={1: {"leaseMissingSince": NOW, "state": "LeaseMissing", "attempt": 0}},
    ),
    Case(
        "missing within the trainer's recreate grace (2 renew intervals): still no fault",
        job_with_slot1(lastHeartbeatTime=ago(50).isoformat(), leaseMissingSince=ago(9).isoformat()),
        without_lease("train-n1-a0"),
        slots={1: {"leaseMissingSince": ago(9), "attempt": 0}},
    ),
    Case(
        "missing past the grace with the last heartbeat past heartbeatTimeoutSeconds: HeartbeatTimeout",
        job_with_slot1(lastHeartbeatTime=ago(50).isoformat(), leaseMissingSince=ago(11).isoformat()),
        without_lease("train-n1-a0"),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 0), recorded("node-1", reasons.HEARTBEAT_TIMEOUT)],
        restarts=(0, 0, 1),
        events=[reasons.HEARTBEAT_TIMEOUT],
        slots={1: {"attempt": 1, "lastFaultReason": reasons.HEARTBEAT_TIMEOUT, "leaseMissingSince": None}},
    ),
    Case(
        "missing past the grace but the last heartbeat is recent: silence counts from that heartbeat",
        job_with_slot1(lastHeartbeatTime=ago(20).isoformat(), leaseMissingSince=ago(15).isoformat()),
        without_lease("train-n1-a0"),
        slots={1: {"attempt": 0, "leaseMissingSince": ago(15)}},
    ),
    Case(
        "the Lease is back: the gap is forgotten",
        job_with_slot1(leaseMissingSince=ago(5).isoformat()),
        observe().running(2).obj(),
        slots={1: {"leaseMissingSince": None, "state": "Training"}},
    ),
    Case(
        "a pod that never heartbeated still has its startup deadline (from pod start)",
        job_with_slot1(lastHeartbeatTime=None),
        without_lease("train-n1-a0"),
        [DeletePod("train-n1-a0", "uid-train-n1-a0", 5), recorded("node-1", reasons.STARTUP_TIMEOUT)],
        restarts=(0, 0, 1),
        events=[reasons.STARTUP_TIMEOUT],
        slots={1: {"attempt": 1}},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_missing_lease(case: Case) -> None:
    check(case)


def test_the_other_slot_is_untouched() -> None:
    d = decide(job_with_slot1(lastHeartbeatTime=ago(50).isoformat()), without_lease("train-n1-a0"), NOW)
    assert d.status.node_slots[0].state == "Training" and d.status.node_slots[0].lease_missing_since is None
