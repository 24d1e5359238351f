"""The status of a big job stays small (issue 30, item 2): status.nodeSlots shows at most
NODE_SLOTS_SHOWN slots, every slot's bookkeeping is in the compact status.slotTable, and what the
operator reads back after a restart is exactly what it wrote.

The sizes are of the status as the pass writes it (decide() through the real ladder, then the write's
model_dump), in compact JSON as the API server stores it. The figures (8, 64, 512 slots; healthy,
16 slots faulted, a job-wide in-process restart, every field at its longest):

    .venv/bin/python -m pytest -m unit tests/unit/test_status_size.py -q -s
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ladder_testkit import NOW, SOFT, hb, make_job, observe, running_status
from rtj import contract, reasons
from rtj.api import status_slots
from rtj.api.models import (
    INCIDENT_MESSAGE_MAX,
    INCIDENTS_KEPT,
    EventRecord,
    IncidentStatus,
    JobStatus,
    NodeSlotStatus,
    ResilientTrainingJob,
)
from rtj.ladder import Observed, decide
from rtj.ladder.event_outbox import MAX_UNPOSTED
from rtj.ladder.summary import RECOVERING_LISTED

pytestmark = pytest.mark.unit

#: The goal of the benchmark row "status of a 512-node job".
GOAL_BYTES = 64 * 1024
#: etcd's default request limit (--max-request-bytes), which bounds the whole object.
ETCD_LIMIT_BYTES = int(1.5 * 1024 * 1024)
JOB = "llama-fsdp-512"


def eks_node(slot: int) -> str:
    """An EKS node name as long as they are (ip-10-0-12-34.us-west-2.compute.internal: 41 characters)."""
    return f"ip-10-{slot // 4096}-{slot // 64 % 64 + 100}-{slot % 64 + 100}.us-west-2.compute.internal"


def wire(status: JobStatus) -> dict[str, Any]:
    """What the pass's status write sends (rtj.job_pass._write_status)."""
    return status.model_dump(by_alias=True, mode="json")


def size(status: JobStatus) -> int:
    return len(json.dumps(wire(status), separators=(",", ":")))


def with_status(job: ResilientTrainingJob, status: JobStatus) -> ResilientTrainingJob:
    """The job as the next pass reads it: its status parsed back from the wire."""
    return job.model_copy(update={"status": JobStatus.model_validate(wire(status))})


def healthy(
    n: int, age: float = 1.0, soft: set[int] | None = None, silent: set[int] | None = None
) -> Observed:
    """n workers on EKS-named nodes heartbeating in Training (steps, checkpoint, memory tier, replica);
    `soft` slots report an in-process restart, `silent` ones last heartbeated 40 s ago."""
    obs = observe(JOB).rdzv()
    for slot in range(n):
        pod = contract.worker_pod_name(JOB, slot, 0)
        obs.worker(slot, 0, node=eks_node(slot))
        beat = hb(step=123_456, ckpt=123_400, mem=123_450, persist=41.5, replica=123_440)
        if soft and slot in soft:
            beat = hb("InProcessRestarting", ip=1, step=123_456, fault=SOFT)
        obs.lease(pod, 40.0 if silent and slot in silent else age, beat)
    return obs.obj()


def steady(n: int) -> tuple[ResilientTrainingJob, JobStatus]:
    """A job of n slots after two passes found every pod training (the second reads the first's write)."""
    job = make_job(JOB).nodes(n).obj()
    first = decide(job, healthy(n, age=61.0), NOW - timedelta(seconds=60))
    job = with_status(job, first.status)
    return job, decide(job, healthy(n), NOW).status


def faulted(n: int, faults: int) -> JobStatus:
    """`faults` slots at fault in one pass: half of them silent (replaced), half in an in-process restart."""
    job, status = steady(n)
    half = faults // 2
    silent = set(range(1, 2 * half, 2))
    soft = set(range(n - 2 * half, n, 2))
    return decide(
        with_status(job, status), healthy(n, soft=soft, silent=silent), NOW + timedelta(seconds=5)
    ).status


def full_history(status: JobStatus, event_chars: int | None = None) -> JobStatus:
    """The status with its incident list full (messages at their longest) and its Event outbox full:
    MAX_UNPOSTED Events as long as the longest the pass decided (the Events API refusing them all),
    or of `event_chars` characters."""
    out = status.model_copy(deep=True)
    longest = max((len(e.message) for e in status.unposted_events), default=200)
    out.incidents = [
        IncidentStatus(
            seq=i + 1,
            time=NOW,
            reason=reasons.HEARTBEAT_TIMEOUT,
            level=reasons.LEVEL_POD,
            action="Replaced",
            slot=i,
            pod=contract.worker_pod_name(JOB, i, 3),
            node=eks_node(i),
            pods=512,
            message="x" * INCIDENT_MESSAGE_MAX,
            step=123_456,
            resume_step=123_400,
            recovery_seconds=12.5,
            steps_lost=56,
        )
        for i in range(INCIDENTS_KEPT)
    ]
    out.unposted_events = [
        EventRecord(
            seq=i,
            type="Warning",
            reason=reasons.HEARTBEAT_TIMEOUT,
            message="y" * (event_chars or longest),
            time=NOW,
        )
        for i in range(MAX_UNPOSTED)
    ]
    return out


def record(name: str, n: int, status: JobStatus) -> int:
    """The status's size, printed (`-s` shows the figures)."""
    got = size(status)
    print(f"\nstatus of {n:4d} slots: {got:8,d} B = {got / 1024:6.1f} KiB  ({name})", end="")
    return got


@pytest.mark.parametrize("n", [64, 512])
def test_a_healthy_big_job_writes_no_slot_entry_and_stays_under_64_kib(n: int) -> None:
    _job, status = steady(n)
    sent = wire(status)
    assert sent["nodeSlots"] == [] and sent["nodeSlotsNotShown"] == 0
    assert sent["slotCounts"] == [{"state": "Training", "slots": n}]
    assert sent["slotTable"]["size"] == n
    assert record("healthy", n, status) < GOAL_BYTES


@pytest.mark.parametrize("n", [8, status_slots.NODE_SLOTS_SHOWN])
def test_a_small_job_is_written_whole(n: int) -> None:
    """At most NODE_SLOTS_SHOWN slots: every slot in nodeSlots, as before the slot table, none in it."""
    _job, status = steady(n)
    sent = wire(status)
    assert [s["slot"] for s in sent["nodeSlots"]] == list(range(n)) and sent["slotTable"] is None
    assert {s["state"] for s in sent["nodeSlots"]} == {"Training"} and sent["nodeSlotsNotShown"] == 0
    assert JobStatus.model_validate(sent) == status
    record("healthy", n, status)


@pytest.mark.parametrize("n", [64, 512])
def test_sixteen_slots_at_fault_are_shown_whole_and_the_status_stays_under_64_kib(n: int) -> None:
    status = faulted(n, 16)
    sent = wire(status)
    shown = {s["slot"]: s for s in sent["nodeSlots"]}
    assert len(shown) == 16 and sent["nodeSlotsNotShown"] == 0
    # Eight silent at once read as failing together: a job-level recovery (rtj.ladder.job_level).
    assert shown[1]["state"] == "Replacing" and shown[1]["lastFaultReason"] == reasons.PODS_FAILED_TOGETHER
    assert shown[n - 2]["recoveringLevel"] == reasons.LEVEL_IN_PROCESS
    assert {c["state"]: c["slots"] for c in sent["slotCounts"]}["Training"] == n - 16
    assert record("16 faulted", n, status) < GOAL_BYTES
    assert record("16 faulted, incidents and Event outbox full", n, full_history(status)) < GOAL_BYTES


@pytest.mark.parametrize("n", [8, 64, 512])
def test_a_job_wide_in_process_restart_stays_under_64_kib(n: int) -> None:
    """Every slot recovering at once (one rank's exception restarts every pod's ranks): the largest
    status a real pass writes, with the Event outbox and incidents full."""
    job, status = steady(n)
    status = decide(
        with_status(job, status), healthy(n, soft=set(range(n))), NOW + timedelta(seconds=5)
    ).status
    sent = wire(status)
    assert len(sent["nodeSlots"]) == min(n, status_slots.NODE_SLOTS_SHOWN)
    assert sent["nodeSlotsNotShown"] == n - len(sent["nodeSlots"])
    recovering = next(c for c in sent["conditions"] if c["type"] == "Recovering")
    more = n - RECOVERING_LISTED
    assert recovering["message"].endswith(
        f", {min(n, RECOVERING_LISTED) - 1}" + (f" and {more} more" if more > 0 else "")
    )
    assert record("every slot recovering, history full", n, full_history(status)) < GOAL_BYTES


def test_every_field_at_its_longest_is_far_below_etcds_limit() -> None:
    """The bound: 512 slots, every field of every slot set and at its longest (253-character node
    names, 63-character pod names not named after their slot), plus full incidents and Event outbox."""
    n = 512
    _job, base = steady(n)
    slots = [
        NodeSlotStatus(
            slot=i,
            pod=f"{'p' * 55}-{i:07d}",
            node=f"{'n' * 240}-{i:012d}",
            attempt=99_999,
            state="InProcessRestarting",
            last_heartbeat_time=NOW - timedelta(days=30, microseconds=i),
            lease_missing_since=NOW - timedelta(days=20, microseconds=i),
            in_process_restarts=contract.MAX_COUNTER,
            in_job_restarts=contract.MAX_COUNTER,
            last_fault_reason=reasons.POD_RESCHEDULE_BUDGET_EXHAUSTED,
            recovering_since=NOW - timedelta(days=10, microseconds=i),
            recovering_level=reasons.LEVEL_DISRUPTION,
        )
        for i in range(n)
    ]
    status = full_history(base, event_chars=1024)
    status.set_slots(slots)
    got = record("every field at its longest (bound)", n, status)
    assert got < ETCD_LIMIT_BYTES / 4
    assert JobStatus.model_validate(wire(status)).node_slots == slots


def test_the_status_read_back_is_the_status_written() -> None:
    """An operator that restarts reads the same slots it wrote: its next pass decides exactly what
    the running operator's would, counting nothing twice."""
    n = 64
    job, status = steady(n)
    status = faulted(n, 16)
    read_back = JobStatus.model_validate(wire(status))
    assert read_back == status
    later = NOW + timedelta(seconds=10)
    obs = healthy(n, soft=set(range(n - 16, n, 2)))
    in_memory = decide(job.model_copy(update={"status": status}), obs, later)
    restarted = decide(with_status(job, status), obs, later)
    assert restarted.status == in_memory.status and restarted.actions == in_memory.actions
    assert restarted.status.restarts == status.restarts  # the counts seen before are not counted again


def test_a_status_written_before_the_slot_table_is_read_from_its_node_slots() -> None:
    """An older operator's status lists every slot in nodeSlots and has no slotTable: read as before."""
    old = running_status(3)
    old["nodeSlots"][1].update(attempt=2, pod="train-n1-a2", inProcessRestarts=4)
    status = JobStatus.model_validate(old)
    assert [s.slot for s in status.node_slots] == [0, 1, 2]
    assert (status.node_slots[1].attempt, status.node_slots[1].in_process_restarts) == (2, 4)
    assert JobStatus.model_validate(wire(status)).node_slots == status.node_slots


def test_node_slots_shows_recovering_slots_first_then_by_slot_at_most_the_cap() -> None:
    cap = status_slots.NODE_SLOTS_SHOWN
    slots = [NodeSlotStatus(slot=i, state="Pending") for i in range(cap + 10)] + [
        NodeSlotStatus(slot=cap + 10 + i, state="Training") for i in range(5)
    ]
    slots[cap + 5] = NodeSlotStatus(slot=cap + 5, state="Replacing", recovering_since=NOW)
    status = JobStatus(node_slots=slots)
    sent = wire(status)
    listed = [s["slot"] for s in sent["nodeSlots"]]
    assert listed == [*range(cap - 1), cap + 5] and sent["nodeSlotsNotShown"] == 10
    assert sent["slotCounts"] == [
        {"state": "Pending", "slots": cap + 9},
        {"state": "Replacing", "slots": 1},
        {"state": "Training", "slots": 5},
    ]


_times = st.none() | st.datetimes(
    min_value=NOW.replace(tzinfo=None) - timedelta(days=400), max_value=NOW.replace(tzinfo=None)
).map(lambda t: t.replace(tzinfo=NOW.tzinfo))
_slot = st.builds(
    NodeSlotStatus,
    slot=st.integers(0, 600),
    pod=st.sampled_from(["", "train-n1-a0", "train-spare-0-a1", "other-n2-a3"]),
    node=st.sampled_from(["", "node-a", "ip-10-0-1-2.ec2.internal", "ip-10-0-1-3.ec2.internal", "a.b.c"]),
    attempt=st.integers(0, 5),
    state=st.sampled_from(["", "Training", "Replacing", "InProcessRestarting", "Silent"]),
    last_heartbeat_time=_times,
    lease_missing_since=_times,
    in_process_restarts=st.integers(0, 3),
    in_job_restarts=st.integers(0, 3),
    last_fault_reason=st.sampled_from(["", reasons.HEARTBEAT_TIMEOUT]),
    recovering_since=_times,
    recovering_level=st.sampled_from(["", reasons.LEVEL_POD]),
    suspect_node=st.sampled_from(["", "node-a", "ip-10-0-1-2.ec2.internal", "a.b.c"]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_slot, max_size=3 * status_slots.NODE_SLOTS_SHOWN))
def test_the_slot_table_is_lossless(slots: list[NodeSlotStatus]) -> None:
    """Whatever the slots hold (numbers out of order, pods named after their slot or not, any times),
    the wire's slotTable gives them back exactly."""
    named = [
        s.model_copy(update={"pod": f"train-n{s.slot}-a{s.attempt}"}) if s.pod == "train-n1-a0" else s
        for s in slots
    ]
    assert status_slots.decode(status_slots.encode(named)) == named
    assert JobStatus.model_validate(wire(JobStatus(node_slots=named))).node_slots == named
