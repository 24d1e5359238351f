"""rtj.ladder.quarantine.review: a quarantine is lifted by a decision about the node. At its check
time (`until`) a node that shows no evidence is lifted and one that does is extended; before it, a
node that booted again since it was quarantined (status.nodeInfo.bootID changed: node auto repair's
reboot, or a machine re-provisioned under the same name) is lifted as soon as it is healthy, and
nothing else happens. The boot ID is recorded when the node is first tainted; records written
without one still parse and keep the old behaviour."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import kopf
import pytest
from ladder_testkit import NOW
from rtj import contract, handlers, reasons
from rtj.ladder import quarantine as q
from rtj.ladder.observe import node_from_dict

pytestmark = pytest.mark.unit

UNTIL = NOW + timedelta(hours=1)
OLD_BOOT = "5f6c1c1e-0000-4000-8000-000000000001"
NEW_BOOT = "5f6c1c1e-0000-4000-8000-000000000002"
XID = {"type": "AcceleratedHardwareReady", "status": "False", "reason": "NvidiaXID79Error"}
TAINT = {"key": contract.QUARANTINE_TAINT_KEY, "value": reasons.NODE_UNHEALTHY, "effect": "NoSchedule"}


def record(boot_id: str | None) -> str:
    """A quarantine record as the annotation holds it; None: one written before records had a boot ID."""
    evidence = contract.QuarantineEvidence(
        job="ns/train", reason=reasons.NODE_UNHEALTHY, message="GPU has fallen off the bus", time=NOW
    )
    rec = contract.Quarantine(reason=reasons.NODE_UNHEALTHY, since=NOW, until=UNTIL, evidence=(evidence,))
    raw = json.loads(rec.model_dump_json())
    if boot_id is None:
        raw.pop("bootID")
    else:
        raw["bootID"] = boot_id
    return json.dumps(raw)


def node(
    *,
    boot: str = OLD_BOOT,
    recorded: str | None = OLD_BOOT,
    ready: str = "True",
    problems: tuple[dict[str, str], ...] = (),
    gpus: tuple[int, int] = (8, 8),
    tainted: bool = True,
) -> dict[str, Any]:
    """A quarantined node as the API server returns it."""
    return {
        "metadata": {
            "name": "node-0",
            "resourceVersion": "7",
            "annotations": {contract.QUARANTINE_ANNOTATION: record(recorded)},
        },
        "spec": {"taints": [dict(TAINT)] if tainted else []},
        "status": {
            "conditions": [{"type": "Ready", "status": ready}, *problems],
            "allocatable": {contract.GPU_RESOURCE: str(gpus[0])},
            "capacity": {contract.GPU_RESOURCE: str(gpus[1])},
            "nodeInfo": {"bootID": boot} if boot else {},
        },
    }


@dataclass(frozen=True)
class Case:
    id: str
    node: dict[str, Any]
    minutes: float  # after NOW; the check is due at 60
    action: str
    says: tuple[str, ...] = ()


CASES = [
    Case(
        "rebooted and healthy: lifted before its check, naming both boot IDs",
        node(boot=NEW_BOOT),
        12,
        "lift",
        (reasons.NODE_QUARANTINE_LIFTED, f"boot ID {OLD_BOOT} -> {NEW_BOOT}", "ns/train"),
    ),
    Case(
        "rebooted, still an unhealthy condition: nothing before its check",
        node(boot=NEW_BOOT, problems=(XID,)),
        12,
        "",
    ),
    Case("rebooted, NotReady yet: nothing before its check", node(boot=NEW_BOOT, ready="False"), 12, ""),
    Case(
        "rebooted, GPUs not all allocatable: nothing before its check",
        node(boot=NEW_BOOT, gpus=(0, 8)),
        12,
        "",
    ),
    Case("the same boot, healthy: nothing before its check", node(), 12, ""),
    Case(
        "a record without a boot ID (an earlier operator's): nothing before its check",
        node(boot=NEW_BOOT, recorded=None),
        12,
        "",
    ),
    Case(
        "a record with an empty boot ID: nothing before its check", node(boot=NEW_BOOT, recorded=""), 12, ""
    ),
    Case("the node reports no boot ID now: nothing before its check", node(boot=""), 12, ""),
    Case("at its check, the same boot, healthy: lifted", node(), 60, "lift", ("shows no evidence now",)),
    Case(
        "at its check, the same boot, unhealthy: extended",
        node(problems=(XID,)),
        60,
        "extend",
        (reasons.NODE_UNHEALTHY,),
    ),
    Case("at its check, a record without a boot ID, healthy: lifted", node(recorded=None), 60, "lift"),
    Case(
        "at its check, a record without a boot ID, unhealthy: extended",
        node(recorded=None, ready="False"),
        60,
        "extend",
        (reasons.NODE_NOT_READY,),
    ),
    Case("at its check, rebooted, unhealthy: extended", node(boot=NEW_BOOT, problems=(XID,)), 60, "extend"),
    Case("at its check, rebooted, healthy: lifted", node(boot=NEW_BOOT), 61, "lift"),
    Case(
        "our record without our taint (an admin lifted the taint): not ours",
        node(boot=NEW_BOOT, tainted=False),
        12,
        "",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_review(case: Case) -> None:
    outcome = q.review(node_from_dict(case.node), NOW + timedelta(minutes=case.minutes))
    assert outcome.action == case.action, outcome
    for text in case.says:
        assert text in outcome.message, outcome.message


def test_a_taint_without_our_record_is_never_lifted_whatever_its_boot() -> None:
    admins = node(boot=NEW_BOOT)
    del admins["metadata"]["annotations"][contract.QUARANTINE_ANNOTATION]
    seen = node_from_dict(admins)
    assert not q.rebooted(seen) and q.review(seen, NOW + timedelta(days=30)).action == ""


def test_the_boot_id_is_recorded_when_first_tainted_and_kept_by_later_evidence() -> None:
    healthy = node(recorded=None, tainted=False)
    del healthy["metadata"]["annotations"][contract.QUARANTINE_ANNOTATION]
    first = q.taint_patch(healthy, reasons.NODE_UNHEALTHY, "a/one", "Xid 79", UNTIL, NOW)
    assert first is not None
    written = json.loads(first["metadata"]["annotations"][contract.QUARANTINE_ANNOTATION])
    assert written["bootID"] == OLD_BOOT  # the API's own name, readable in `kubectl describe node`
    # Evidence of another job after the node booted again keeps the boot ID of the first taint.
    tainted = {
        **healthy,
        "metadata": {**healthy["metadata"], "annotations": first["metadata"]["annotations"]},
        "spec": first["spec"],
        "status": {**healthy["status"], "nodeInfo": {"bootID": NEW_BOOT}},
    }
    later = NOW + timedelta(minutes=5)
    second = q.taint_patch(tainted, reasons.NODE_NOT_READY, "b/two", "NotReady", UNTIL, later)
    assert second is not None
    kept = contract.parse_quarantine(second["metadata"]["annotations"][contract.QUARANTINE_ANNOTATION])
    assert kept is not None and kept.boot_id == OLD_BOOT and len(kept.evidence) == 2
    # An extension keeps it too.
    extended = q.extend_patch(node(), UNTIL + timedelta(hours=1))
    assert extended is not None
    again = contract.parse_quarantine(extended["metadata"]["annotations"][contract.QUARANTINE_ANNOTATION])
    assert again is not None and again.boot_id == OLD_BOOT


def test_records_with_and_without_a_boot_id_parse_and_a_bad_one_is_not_ours() -> None:
    old = contract.parse_quarantine(record(None))
    assert old is not None and old.boot_id == ""
    new = contract.parse_quarantine(record(OLD_BOOT))
    assert new is not None and new.boot_id == OLD_BOOT
    assert contract.parse_quarantine(record("x" * (contract.MAX_BOOT_ID + 1))) is None
    strange = node(boot="y" * 500)
    assert len(node_from_dict(strange).boot_id) == contract.MAX_BOOT_ID
    assert node_from_dict({**strange, "status": {"nodeInfo": {"bootID": 7}}}).boot_id == ""
    assert node_from_dict({**strange, "status": {"nodeInfo": "garbage"}}).boot_id == ""


def test_the_lift_is_decided_again_on_the_node_read_for_the_patch() -> None:
    """The review loop decides on its cached copy; the patch is made from the node read just before
    it: a node unhealthy again, or healthy but not rebooted before its check, is not lifted."""
    soon = NOW + timedelta(minutes=12)
    lift = q.lift_if_due(node(boot=NEW_BOOT), soon)
    assert lift is not None and lift["spec"]["taints"] == []
    assert lift["metadata"] == {"resourceVersion": "7", "annotations": {contract.QUARANTINE_ANNOTATION: None}}
    assert q.lift_if_due(node(boot=NEW_BOOT, problems=(XID,)), soon) is None
    assert q.lift_if_due(node(), soon) is None


def test_a_rebooted_quarantined_node_wakes_the_review_and_no_other_node_change_does() -> None:
    async def scenario() -> list[bool]:
        event = handlers._REVIEW_WAKE.start()
        woken = []
        try:
            for body in (
                node(),  # quarantined, the same boot
                node(boot=NEW_BOOT, ready="False"),  # booted again, not Ready yet
                node(boot=NEW_BOOT, ready="False"),  # the same again: no change, no wake
                node(boot=NEW_BOOT),  # Ready
                node(boot=NEW_BOOT, tainted=False, recorded=None),  # lifted
            ):
                event.clear()
                handlers.rtj_nodes(name="node-0", body=kopf.Body(body))
                await asyncio.sleep(0)  # the wake is posted to the loop (from kopf's threads)
                woken.append(event.is_set())
        finally:
            handlers._NODE_STATE.clear()
            handlers._REVIEW_WAKE.loop = handlers._REVIEW_WAKE.event = None
        return woken

    assert asyncio.run(scenario()) == [False, True, False, True, False]
