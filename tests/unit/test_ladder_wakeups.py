"""rtj.ladder.wakeups (what wakes a job's pass) and its use by the handlers' Lease index: a renewal
that changes nothing but renewTime and the step wakes nothing at once (newer progress: one pass at the
next progress refresh); a changed state, fault or assigned slot does, and so does the renewal of a
slot the last pass found stale (issue 18)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest
from ladder_testkit import SOFT, hb, make_job, running_status
from prometheus_client import REGISTRY
from rtj import contract, handlers
from rtj.api.models import JobStatus
from rtj.ladder import wakeups

pytestmark = pytest.mark.unit

FT = make_job().obj().spec.fault_tolerance  # heartbeatTimeoutSeconds 30


def annotations(state: str = "Training", step: int = 5, progress: Any = None, **extra: str) -> dict[str, str]:
    heartbeat = json.loads((progress or hb(state, step=step)).to_annotation())
    return {contract.HEARTBEAT_ANNOTATION: json.dumps(heartbeat), **extra}


def training(step: int, ckpt: int | None = None, fault: dict[str, Any] | None = None) -> contract.Heartbeat:
    """What a training pod's agent renews with, the memory tier and peer replica on: every renewal
    carries a newer step and memory snapshot, every commit a newer checkpoint."""
    return hb(step=step, mem=step - 2, replica=step - 4, ckpt=ckpt, persist=3.5 + step / 1000, fault=fault)


@pytest.mark.parametrize(
    ("after", "changed"),
    [
        (annotations(step=6), False),
        (annotations(progress=training(60, ckpt=50)), False),
        (annotations(progress=training(5, fault=SOFT)), True),
        (annotations(state="InJobRestarting"), True),
        (annotations(**{contract.ASSIGNED_SLOT_ANNOTATION: "1"}), True),
        ({contract.HEARTBEAT_ANNOTATION: "{not json"}, True),
        ({}, True),
    ],
    ids=[
        "step only",
        "progress: step, memory snapshot, replica, checkpoint, persist time",
        "a fault",
        "state",
        "assigned slot",
        "malformed",
        "annotation gone",
    ],
)
def test_heartbeat_digest_ignores_the_step_only(after: dict[str, Any], changed: bool) -> None:
    assert (wakeups.heartbeat_digest(annotations()) != wakeups.heartbeat_digest(after)) is changed


def test_the_digest_keeps_every_heartbeat_field_but_progress() -> None:
    """A canary: a new Heartbeat field must be placed on one side (acted on: wakes; progress: not)."""
    fields = {f.alias or name for name, f in contract.Heartbeat.model_fields.items()}
    assert fields >= wakeups.PROGRESS_FIELDS
    assert fields - wakeups.PROGRESS_FIELDS == {
        "state",
        "inProcessRestarts",
        "inJobRestarts",
        "fault",
        "reachEndpoint",
        "reach",
    }


def test_watched_leases_are_the_silent_and_the_half_stale_slots() -> None:
    status = JobStatus.model_validate(running_status(3))
    status.node_slots[0].state = "Silent"
    watched = wakeups.watched_leases(status, {1: 16.0, 2: 14.0}, FT)
    assert watched == {contract.lease_name("train-n0-a0"), contract.lease_name("train-n1-a0")}


NOW = datetime(2026, 1, 1, tzinfo=UTC)
SLACK = wakeups.DEADLINE_SLACK_SECONDS


@pytest.mark.parametrize(
    ("ages", "due_in", "expected"),
    [
        ({}, None, None),
        ({0: 31.0}, None, None),
        ({0: 10.0, 1: 25.0}, None, 5.0 + SLACK),
        ({}, 12.0, 12.0 + SLACK),
        ({0: 10.0, 1: 25.0}, 2.0, 2.0 + SLACK),
        ({0: 10.0, 1: 25.0}, 9.0, 5.0 + SLACK),
    ],
    ids=[
        "no heartbeats",
        "all past the deadline",
        "the oldest live one",
        "only a rule's due time",
        "a rule due before the heartbeat deadline",
        "the heartbeat deadline before the rule",
    ],
)
def test_next_deadline(ages: dict[int, float], due_in: float | None, expected: float | None) -> None:
    due = NOW + timedelta(seconds=due_in) if due_in is not None else None
    assert wakeups.next_deadline(ages, FT, due, NOW) == pytest.approx(expected)


def lease_event(
    annotations: dict[str, str], name: str = "train-n0-a0", renew_time: str = "2026-01-01T00:00:00.000000Z"
) -> None:
    handlers.rtj_leases(
        namespace="ns",
        labels={contract.LABEL_JOB: "train"},
        meta={"name": contract.lease_name(name), "annotations": annotations},
        spec={"renewTime": renew_time},
    )


def test_the_lease_index_wakes_the_pass_on_content_changes_not_on_renewals() -> None:
    async def scenario() -> list[bool]:
        job_loop = handlers._JobLoop("uid", kopf.Body({}), kopf.Memo())
        handlers._LOOPS[("ns", "train")] = job_loop
        woken = []
        try:
            for event in (annotations(step=1), annotations(step=2), annotations("InJobRestarting", 3)):
                job_loop.wake.clear()
                lease_event(event)
                woken.append(job_loop.wake.is_set())
            job_loop.memo.watched_leases = frozenset({contract.lease_name("train-n0-a0")})
            job_loop.wake.clear()
            lease_event(annotations("InJobRestarting", 4))
            woken.append(job_loop.wake.is_set())
        finally:
            handlers._LOOPS.clear()
        return woken

    # first version seen, a renewal, a state change, a renewal of a slot found stale
    assert asyncio.run(scenario()) == [True, False, True, True]


def test_renewals_of_a_512_slot_job_wake_no_pass() -> None:
    """Issue 30: 512 pods training with the memory tier, peer replica and checkpoints renew three
    times (1,536 Lease events, one of them rounds committing a checkpoint): not one wakes the job's
    pass (which parses 512 Leases and decides over 512 slots); one pod's in-job restart does."""
    slots = 512

    async def scenario() -> tuple[int, int, bool]:
        job_loop = handlers._JobLoop("uid", kopf.Body({}), kopf.Memo())
        handlers._LOOPS[("ns", "train")] = job_loop
        names = [contract.worker_pod_name("train", s, 0) for s in range(slots)]
        try:
            for name in names:  # first sightings (the operator's list)
                lease_event(annotations(progress=training(100, ckpt=50)), name, "2026-01-01T00:00:00.000000Z")
            woken = 0
            for round_, step in enumerate((110, 120, 130), start=1):
                renewed = f"2026-01-01T00:00:{10 * round_:02d}.000000Z"
                for name in names:
                    job_loop.wake.clear()
                    lease_event(
                        annotations(progress=training(step, ckpt=50 if round_ < 2 else 120)), name, renewed
                    )
                    woken += job_loop.wake.is_set()
            job_loop.wake.clear()
            lease_event(annotations("InJobRestarting", 131), names[7], "2026-01-01T00:00:31.000000Z")
            return woken, len(job_loop.lease_digests), job_loop.wake.is_set()
        finally:
            handlers._LOOPS.clear()

    assert asyncio.run(scenario()) == (0, slots, True)


def test_progress_only_renewals_run_one_pass_a_refresh_after_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Renewals carrying newer progress (steps, a committed checkpoint) wake the pass once, at
    RTJ_PROGRESS_REFRESH_SECONDS after the previous pass, however many arrive; a pass meanwhile
    serves them (no second pass); a renewal with the same progress arms nothing."""
    refresh = 0.2
    monkeypatch.setattr(
        handlers, "SETTINGS", handlers.SETTINGS.model_copy(update={"progress_refresh_seconds": refresh})
    )

    async def scenario() -> tuple[bool, float, bool, bool]:
        job_loop = handlers._JobLoop("uid", kopf.Body({}), kopf.Memo())
        handlers._LOOPS[("ns", "train")] = job_loop
        names = [contract.worker_pod_name("train", s, 0) for s in range(64)]
        try:
            for name in names:  # first sightings: woken at once
                lease_event(annotations(progress=training(100, ckpt=50)), name)
            job_loop.wake.clear()
            job_loop.pass_started()
            started = job_loop.loop.time()
            for step in range(101, 111):
                for name in names:
                    lease_event(annotations(progress=training(step, ckpt=110 if step == 110 else 50)), name)
            await asyncio.sleep(0)  # the timer is armed in the loop
            early = job_loop.wake.is_set()
            await asyncio.wait_for(job_loop.wake.wait(), 5)
            waited = job_loop.loop.time() - started

            # Newer progress, then a pass before the refresh is due: that pass served it.
            job_loop.wake.clear()
            job_loop.pass_started()
            lease_event(annotations(progress=training(111, ckpt=110)), names[0])
            await asyncio.sleep(0)
            job_loop.pass_started()
            await asyncio.sleep(refresh * 1.5)
            served = not job_loop.wake.is_set()

            # The same progress again (a plain renewal): nothing armed.
            lease_event(annotations(progress=training(111, ckpt=110)), names[0])
            await asyncio.sleep(refresh * 1.5)
            return early, waited, served, job_loop.wake.is_set()
        finally:
            handlers._LOOPS.clear()

    early, waited, served, woken_by_same = asyncio.run(scenario())
    assert not early, "progress woke the pass before the refresh was due"
    assert waited >= refresh, waited
    assert served, "a pass after the progress left a second pass armed"
    assert not woken_by_same, "a renewal with unchanged progress armed a refresh"


def node_event(ready: str) -> None:
    body = {"metadata": {"name": "node-1"}, "status": {"conditions": [{"type": "Ready", "status": ready}]}}
    handlers.rtj_nodes(name="node-1", body=kopf.Body(body))


def test_a_node_changing_readiness_wakes_the_jobs_with_pods_on_it() -> None:
    async def scenario() -> list[bool]:
        job_loop = handlers._JobLoop("uid", kopf.Body({}), kopf.Memo())
        handlers._LOOPS[("ns", "train")] = job_loop
        pod = {
            "metadata": {"name": "train-n0-a0", "labels": {contract.LABEL_JOB: "train"}},
            "spec": {"nodeName": "node-1"},
            "status": {"phase": "Running"},
        }
        handlers.rtj_pods(namespace="ns", labels={contract.LABEL_JOB: "train"}, body=kopf.Body(pod))
        woken = []
        try:
            for ready in ("True", "True", "Unknown"):
                job_loop.wake.clear()
                node_event(ready)
                woken.append(job_loop.wake.is_set())
        finally:
            handlers._LOOPS.clear()
            handlers._JOBS_ON_NODE.clear()
            handlers._NODE_STATE.clear()
        return woken

    # first seen, a status report that changes nothing, NotReady
    assert asyncio.run(scenario()) == [True, False, True]


def test_delivery_is_measured_on_renewals_not_on_a_leases_first_sighting() -> None:
    """An operator (re)listing Leases sees each as old as it is: only a renewal seen after an
    earlier version counts as a delivery (rtj.heartbeat_delivery)."""

    def delivered() -> float:
        return REGISTRY.get_sample_value("rtj_heartbeat_delivery_seconds_count") or 0.0

    def renewed(seconds_ago: float) -> str:
        return contract.micro_time(datetime.now(UTC) - timedelta(seconds=seconds_ago))

    async def scenario() -> list[float]:
        handlers._LOOPS[("ns", "train")] = handlers._JobLoop("uid", kopf.Body({}), kopf.Memo())
        counts, start, silent = [], delivered(), renewed(600)
        try:
            lease_event(annotations(step=1), renew_time=silent)  # first sighting: a Lease long silent
            counts.append(delivered() - start)
            lease_event(annotations(step=1), renew_time=silent)  # the same version again (a re-list)
            counts.append(delivered() - start)
            lease_event(annotations(step=2), renew_time=renewed(0.2))  # a renewal
            counts.append(delivered() - start)
        finally:
            handlers._LOOPS.clear()
        return counts

    assert asyncio.run(scenario()) == [0, 0, 1]
