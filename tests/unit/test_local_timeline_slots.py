"""rtj_local.timeline.Snapshot.slots: every node slot of a job, also of a big one whose status lists
only the slots that are not plainly healthy (rtj.api.status_slots): the operator's entry where the
status shows one, else the slot's newest worker pod, its node and its heartbeat's state."""

from __future__ import annotations

from typing import Any

import pytest
from rtj_local.timeline import Snapshot

pytestmark = pytest.mark.unit


def pod(slot: int | None, attempt: int | None, node: str) -> dict[str, Any]:
    return {"slot": slot, "attempt": attempt, "phase": "Running", "node": node, "exit_code": None}


def test_slots_the_status_leaves_out_come_from_the_pods_and_leases() -> None:
    shown = {"slot": 1, "pod": "", "node": "n1", "attempt": 2, "state": "Replacing"}
    job = {"spec": {"nodes": 3}, "status": {"nodeSlots": [shown]}}
    pods = {
        "big-n0-a0": pod(0, 0, "n0"),
        "big-n0-a1": pod(0, 1, "n9"),  # the newest attempt of slot 0
        "big-n1-a1": pod(1, 1, "n1"),
        "big-n2-a0": pod(2, 0, "n2"),
        "big-rdzv": pod(None, None, "n0"),
    }
    leases = {"big-n0-a1": {"state": "Training"}, "big-n2-a0": {"state": "Starting"}}
    slots = Snapshot(0.0, job, leases, pods).slots
    assert slots == [
        {"slot": 0, "pod": "big-n0-a1", "node": "n9", "attempt": 1, "state": "Training"},
        shown,
        {"slot": 2, "pod": "big-n2-a0", "node": "n2", "attempt": 0, "state": "Starting"},
    ]


def test_a_slot_without_a_pod_is_listed_empty() -> None:
    slots = Snapshot(0.0, {"spec": {"nodes": 1}, "status": {}}, {}, {}).slots
    assert slots == [{"slot": 0, "pod": "", "node": "", "attempt": 0, "state": ""}]
