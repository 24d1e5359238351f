"""rtj.ladder.node_writes: a quarantine or node fault record decided by a pass is written into the
status with the pass's decision, issued again by later passes until the node shows it, and applied
once however often it is issued (rtj.ladder.quarantine's patches are idempotent)."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from ladder_testkit import JOB_KEY, NOW, ago, hb, observe, running_job, running_status
from rtj import contract, reasons
from rtj.api.models import NodeWriteKind
from rtj.ladder import CreateWorkerPod, LadderConfig, NodeObs, Observed, RecordNodeFault, TaintNode, decide
from rtj.ladder import quarantine as q

pytestmark = pytest.mark.unit


def with_index(obs: Observed, *nodes: NodeObs) -> Observed:
    """The observation with the operator's node index filled (Observed.all_nodes)."""
    return dataclasses.replace(obs, all_nodes=nodes or tuple(obs.nodes.values()))


def node_death() -> Observed:
    return with_index(observe().running(2).node("node-0").node("node-1", "Unknown").obj())


def after(decision: Any) -> Any:
    """The job as the next pass reads it: the first pass's status, through the wire."""
    return running_job().status(**decision.status.model_dump(by_alias=True, mode="json")).obj()


def taints(decision: Any) -> list[TaintNode]:
    return [a for a in decision.actions if isinstance(a, TaintNode)]


def test_a_quarantine_is_written_into_status_with_the_decision() -> None:
    d = decide(running_job().obj(), node_death(), NOW)
    [w] = d.status.unapplied_node_writes
    assert (w.kind, w.node, w.reason, w.time) == (
        NodeWriteKind.QUARANTINE,
        "node-1",
        reasons.NODE_NOT_READY,
        NOW,
    )
    assert "not Ready" in w.message and w.until == NOW + timedelta(seconds=LadderConfig().quarantine_seconds)
    [taint] = taints(d)
    assert (taint.node, taint.reason, taint.job, taint.time, taint.until) == (
        "node-1",
        reasons.NODE_NOT_READY,
        JOB_KEY,
        NOW,
        w.until,
    )


def test_an_operator_killed_before_the_taint_taints_at_the_next_pass_counting_nothing_again() -> None:
    first = decide(running_job().obj(), node_death(), NOW)
    # The status was written; the taint was not (the operator was killed in between).
    later = NOW + timedelta(seconds=7)
    second = decide(after(first), node_death(), later)
    [taint] = taints(second)
    assert (taint.node, taint.time) == ("node-1", NOW)  # the same write: the node takes it once
    assert second.status.restarts.pod_reschedules == first.status.restarts.pod_reschedules == 1
    assert reasons.NODE_QUARANTINED not in [e.reason for e in second.events]
    assert [w.node for w in second.status.unapplied_node_writes] == ["node-1"]


def applied_node(decision: Any) -> NodeObs:
    """node-1 as the node index shows it once the decision's taint is applied."""
    [taint] = taints(decision)
    patch = q.taint_patch({"metadata": {}, "spec": {}}, taint.reason, taint.job, taint.evidence, NOW, NOW)
    assert patch is not None
    record = contract.parse_quarantine(patch["metadata"]["annotations"][contract.QUARANTINE_ANNOTATION])
    keys = tuple((t["key"], t["value"], t["effect"]) for t in patch["spec"]["taints"])
    return NodeObs(name="node-1", ready="Unknown", taints=keys, quarantine=record)


def test_the_write_is_dropped_once_the_node_shows_it() -> None:
    first = decide(running_job().obj(), node_death(), NOW)
    obs = node_death()
    shown = with_index(obs, obs.nodes["node-0"], applied_node(first))
    second = decide(after(first), shown, NOW)
    assert taints(second) == [] and second.status.unapplied_node_writes == []


def test_another_jobs_evidence_on_the_node_does_not_count_as_this_write() -> None:
    first = decide(running_job().obj(), node_death(), NOW)
    other = applied_node(first)
    assert other.quarantine is not None
    evidence = tuple(e.model_copy(update={"job": "ns/other"}) for e in other.quarantine.evidence)
    record = other.quarantine.model_copy(update={"evidence": evidence})
    foreign = dataclasses.replace(other, quarantine=record)
    obs = node_death()
    second = decide(after(first), with_index(obs, obs.nodes["node-0"], foreign), NOW)
    assert [t.node for t in taints(second)] == ["node-1"]


@pytest.mark.parametrize(
    ("why", "index", "seconds", "kept"),
    [
        ("node gone from a filled index", ("node-0",), 5, False),
        ("index not filled yet (nothing known)", (), 5, True),
        ("older than a quarantine period", ("node-0", "node-1"), 3601, False),
        ("younger than a quarantine period", ("node-0", "node-1"), 3599, True),
    ],
)
def test_when_a_write_is_given_up(why: str, index: tuple[str, ...], seconds: float, kept: bool) -> None:
    first = decide(running_job().obj(), node_death(), NOW)
    obs = node_death()
    shown = dataclasses.replace(obs, all_nodes=tuple(obs.nodes[n] for n in index))
    second = decide(after(first), shown, NOW + timedelta(seconds=seconds))
    # (An hour on, the other pod's heartbeat has timed out too: its own fault record is another write.)
    quarantines = [w for w in second.status.unapplied_node_writes if w.kind == NodeWriteKind.QUARANTINE]
    assert bool(quarantines) == kept, why
    assert bool(taints(second)) == kept, why


def test_a_fault_record_is_issued_again_until_the_node_shows_it() -> None:
    # A pod that failed with a restartable exit code on a healthy node: recorded, not quarantined.
    failed = observe().running(2).worker(1, phase="Failed", exit_code=1)
    obs = with_index(failed.node("node-0").node("node-1").obj())
    first = decide(running_job().obj(), obs, NOW)
    records = [a for a in first.actions if isinstance(a, RecordNodeFault)]
    assert records == [RecordNodeFault("node-1", JOB_KEY, records[0].reason, NOW)]
    [w] = first.status.unapplied_node_writes
    assert w.kind == NodeWriteKind.FAULT_RECORD
    again = decide(after(first), obs, NOW + timedelta(seconds=3))
    assert [a for a in again.actions if isinstance(a, RecordNodeFault)] == records
    fault = contract.NodeFault(job=JOB_KEY, reason=w.reason, time=w.time)
    shown = dataclasses.replace(obs.nodes["node-1"], faults=(fault,))
    done = decide(after(first), with_index(obs, obs.nodes["node-0"], shown), NOW + timedelta(seconds=3))
    assert not [a for a in done.actions if isinstance(a, RecordNodeFault)]
    assert done.status.unapplied_node_writes == []


def test_the_taint_patch_is_applied_once_whatever_the_number_of_issues() -> None:
    foreign = {"key": "x", "effect": "NoSchedule"}
    node: dict[str, Any] = {"metadata": {"resourceVersion": "7"}, "spec": {"taints": [foreign]}}
    until, why = NOW + timedelta(hours=1), "node node-1 is not Ready"
    patch = q.taint_patch(node, reasons.NODE_NOT_READY, JOB_KEY, why, until, NOW)
    assert patch is not None and patch["spec"]["taints"][0] == foreign
    tainted = {"metadata": {"resourceVersion": "8", **patch["metadata"]}, "spec": patch["spec"]}
    assert q.taint_patch(tainted, reasons.NODE_NOT_READY, JOB_KEY, why, until, NOW) is None
    # Another job's evidence, or this job's at another time, is still added.
    for job, time in (("ns/other", NOW), (JOB_KEY, ago(-5))):
        more = q.taint_patch(tainted, reasons.NODE_NOT_READY, job, "evidence", until, time)
        assert more is not None
        record = contract.parse_quarantine(more["metadata"]["annotations"][contract.QUARANTINE_ANNOTATION])
        assert record is not None and len(record.evidence) == 2


def replacing_slot_1(**status: Any) -> Any:
    """Slot 1's pod is gone after its node failed; the job quarantined node-1."""
    slots = running_status(2)["nodeSlots"]
    slots[1].update({"attempt": 1, "pod": "", "state": "Replacing", "recoveringSince": ago(3).isoformat()})
    return running_job().status(nodeSlots=slots, quarantinedNodes=["node-1"], **status).obj()


def tainted(name: str, on: bool) -> NodeObs:
    taints = ((contract.QUARANTINE_TAINT_KEY, reasons.NODE_NOT_READY, "NoSchedule"),) if on else ()
    return NodeObs(name=name, ready="True", taints=taints)


@pytest.mark.parametrize(
    ("why", "index", "pending", "avoided"),
    [
        ("still quarantined", (tainted("node-0", False), tainted("node-1", True)), False, ("node-1",)),
        ("quarantine lifted", (tainted("node-0", False), tainted("node-1", False)), False, ()),
        ("lifted, this job's taint not applied yet", (tainted("node-1", False),), True, ("node-1",)),
        ("node index not filled", (), False, ("node-1",)),
    ],
)
def test_a_replacement_stays_off_the_nodes_the_job_quarantined_until_lifted(
    why: str, index: tuple[NodeObs, ...], pending: bool, avoided: tuple[str, ...]
) -> None:
    write = {
        "kind": "Quarantine",
        "node": "node-1",
        "reason": reasons.NODE_NOT_READY,
        "time": ago(3).isoformat(),
    }
    job = replacing_slot_1(**({"unappliedNodeWrites": [write]} if pending else {}))
    obs = dataclasses.replace(observe().rdzv().worker(0).lease("train-n0-a0", 1, hb()).obj(), all_nodes=index)
    [create] = [a for a in decide(job, obs, NOW).actions if isinstance(a, CreateWorkerPod)]
    assert create.avoid_nodes == avoided, why


@pytest.mark.parametrize(("now_boot", "kept"), [("boot-a", True), ("boot-b", False), ("", True)])
def test_a_node_booted_again_since_the_decision_is_not_tainted_for_it(now_boot: str, kept: bool) -> None:
    before = observe().running(2).node("node-0").node("node-1", "Unknown", boot_id="boot-a").obj()
    first = decide(running_job().obj(), with_index(before), NOW)
    assert [w.boot_id for w in first.status.unapplied_node_writes] == ["boot-a"]
    after_reboot = observe().running(2).node("node-0").node("node-1", "True", boot_id=now_boot).obj()
    second = decide(after(first), with_index(after_reboot), NOW + timedelta(seconds=5))
    assert bool(taints(second)) == kept
    assert bool(second.status.unapplied_node_writes) == kept
