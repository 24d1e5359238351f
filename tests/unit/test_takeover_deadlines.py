"""A takeover never reads as silence of healthy pods (operator failover, rtj.leader_election).

A new leader starts with nothing in memory: its Lease index is a fresh list (every Lease "arrives"
now), its memo is empty (no progress seen, no renewTime remembered), and the job's status was written
by the old leader, whose lastHeartbeatTime is up to RTJ_HEARTBEAT_STATUS_RESOLUTION_SECONDS old. Its
first pass must judge each pod by its Lease's renewTime: the Lease index as kopf fills it
(handlers.rtj_leases), read back as the pass reads it (ladder.lease_from_dict), then decide(). Job of
ladder_testkit: heartbeat interval 5 s, timeout 30 s, startup timeout 120 s, pods 300 s old."""

from __future__ import annotations

from typing import Any

import pytest
from ladder_testkit import NOW, ago, hb, make_job, observe, running_status
from rtj import contract, handlers, reasons
from rtj.contract import micro_time
from rtj.ladder import DeletePod, Observed, decide, lease_from_dict

pytestmark = pytest.mark.unit


def listed(pod: str, renewed_ago: float, step: int) -> Any:
    """The pod's Lease as the new leader's index stores it from its first list, read as a pass does."""
    meta = {"name": pod, "annotations": {contract.HEARTBEAT_ANNOTATION: hb(step=step).to_annotation()}}
    spec = {"holderIdentity": pod, "renewTime": micro_time(ago(renewed_ago))}
    # kopf passes its read-only views of the Lease; the handler reads them as mappings.
    (stored,) = handlers.rtj_leases("ns", {contract.LABEL_JOB: "train"}, meta, spec).values()  # type: ignore[arg-type]
    return lease_from_dict(stored, NOW)


def after_takeover(renewed_ago: dict[int, float]) -> Any:
    # The old leader last wrote status long ago (beyond heartbeatTimeoutSeconds): heartbeat times and
    # progress as it kept them. The pods went on training meanwhile (step 40 -> 41).
    status = running_status(2, progressStep=40, lastProgressTime=ago(200).isoformat())
    for slot in status["nodeSlots"]:
        slot["lastHeartbeatTime"] = ago(50).isoformat()
    job = make_job().nodes(2).status(**status).obj()
    obs = observe().running(2).obj()
    leases = {
        name: listed(name, renewed_ago[slot], 41)
        for slot, name in enumerate(contract.worker_pod_name("train", s, 0) for s in range(2))
    }
    return decide(job, Observed(pods=obs.pods, leases=leases, nodes=obs.nodes, service_exists=True), NOW)


def test_the_first_pass_of_a_new_leader_judges_healthy_pods_by_their_renew_time() -> None:
    d = after_takeover({0: 1.0, 1: 1.0})
    assert d.actions == []
    assert [e.reason for e in d.events if e.reason in (reasons.HEARTBEAT_TIMEOUT, reasons.STALLED)] == []


def test_a_pod_silent_across_the_takeover_is_still_replaced_at_once() -> None:
    """The same pass sees a Lease 50 s old as the silence it is (the test above can fail)."""
    d = after_takeover({0: 1.0, 1: 50.0})
    assert [a for a in d.actions if isinstance(a, DeletePod)] == [
        DeletePod("train-n1-a0", "uid-train-n1-a0", 0)
    ]
    assert [e.reason for e in d.events].count(reasons.HEARTBEAT_TIMEOUT) == 1
