"""Tests of decide() as a whole and of its summary (rtj.ladder.summary) and parsers (rtj.ladder.observe);
the table rows per policy are in test_ladder_slots.py, test_ladder_endings.py, test_ladder_spares.py
and test_ladder_job_level.py."""

from __future__ import annotations

import pytest
from ladder_testkit import (
    NOW,
    ago,
    hb,
    make_job,
    observe,
    running_job,
    slot_status,
)
from rtj import contract, reasons
from rtj.ladder import (
    Observed,
    decide,
    goodput,
)

pytestmark = pytest.mark.unit


def test_decide_is_idempotent_on_its_own_output() -> None:
    """Feeding a pass's status back with the same observation changes nothing and counts nothing."""
    job = running_job().obj()
    obs = observe().running(2).lease("train-n1-a0", 1, hb("InProcessRestarting", ip=2, ij=1)).obj()
    first = decide(job, obs, NOW)
    again = decide(job.model_copy(update={"status": first.status}), obs, NOW)
    assert again.status == first.status
    assert again.restarts == [] and again.events == [] and again.actions == []


def test_soft_restart_delta_carried_across_replacement() -> None:
    """Counts of a replaced pod stay in the job total; the new pod's counts start from zero."""
    job = running_job(
        nodeSlots=slot_status(2, {1: {"inProcessRestarts": 5}}), restarts={"inProcess": 5}
    ).obj()
    d = decide(job, observe().running(2).lease("train-n1-a0", 40, hb(ip=5)).obj(), NOW)
    assert d.status.restarts.in_process == 5
    assert d.status.node_slots[1].in_process_restarts == 0
    job2 = job.model_copy(update={"status": d.status})
    obs2 = (
        observe()
        .rdzv()
        .worker(0)
        .lease("train-n0-a0", 1, hb())
        .worker(1, 1, cause="HeartbeatTimeout")
        .lease("train-n1-a1", 1, hb(ip=1))
        .obj()
    )
    d2 = decide(job2, obs2, NOW)
    assert d2.status.restarts.in_process == 6


def test_condition_transition_time_kept_unless_status_flips() -> None:
    job = running_job().obj()
    d = decide(job, observe().running(2).obj(), NOW)
    running = next(c for c in d.status.conditions if c.type == "Running")
    assert running.last_transition_time == ago(3600)
    assert running.observed_generation == 1


def test_checkpoint_never_goes_backwards() -> None:
    job = running_job(lastCheckpoint={"step": 500, "time": ago(100).isoformat()}).obj()
    d = decide(job, observe().running(2, heartbeat=hb(ckpt=400)).obj(), NOW)
    assert d.status.last_checkpoint is not None and d.status.last_checkpoint.step == 500
    d = decide(job, observe().running(2).lease("train-n0-a0", 1, hb(ckpt=600)).obj(), NOW)
    assert d.status.last_checkpoint is not None and d.status.last_checkpoint.step == 600


def test_memory_snapshot_step_is_the_newest_every_pod_holds_refreshed_with_heartbeat_times() -> None:
    job = running_job().obj()
    both = observe().running(2).lease("train-n0-a0", -100, hb(mem=30)).lease("train-n1-a0", -100, hb(mem=20))
    assert decide(job, both.obj(), NOW).status.memory_snapshot_step == 20
    one = observe().running(2).lease("train-n0-a0", -100, hb(mem=30)).lease("train-n1-a0", -100, hb())
    assert decide(job, one.obj(), NOW).status.memory_snapshot_step is None  # no step every pod holds
    # Between two heartbeat-time refreshes (resolution), status keeps its value: no write per snapshot.
    later = running_job(memorySnapshotStep=10).obj()
    soon = observe().running(2).lease("train-n0-a0", 1, hb(mem=30)).lease("train-n1-a0", 1, hb(mem=30))
    assert decide(later, soon.obj(), NOW).status.memory_snapshot_step == 10


def test_replica_step_is_the_newest_every_pods_peer_holds_next_to_the_memory_snapshot_step() -> None:
    job = running_job().obj()
    both = (
        observe()
        .running(2)
        .lease("train-n0-a0", -100, hb(mem=30, replica=28))
        .lease("train-n1-a0", -100, hb(mem=30, replica=30))
    )
    st = decide(job, both.obj(), NOW).status
    assert (st.memory_snapshot_step, st.replica_step) == (30, 28)
    one = (
        observe()
        .running(2)
        .lease("train-n0-a0", -100, hb(mem=30, replica=30))
        .lease("train-n1-a0", -100, hb())
    )
    assert decide(job, one.obj(), NOW).status.replica_step is None  # a pod without a replica yet


def test_persist_seconds_is_the_longest_any_pod_measured_and_never_shrinks() -> None:
    job = running_job(persistSeconds=12.5).obj()
    obs = (
        observe()
        .running(2)
        .lease("train-n0-a0", 1, hb(persist=20.0))
        .lease("train-n1-a0", 1, hb(persist=3.0))
    )
    assert decide(job, obs.obj(), NOW).status.persist_seconds == 20.0
    assert (
        decide(job, observe().running(2, heartbeat=hb(persist=4.0)).obj(), NOW).status.persist_seconds == 12.5
    )
    assert decide(running_job().obj(), observe().running(2).obj(), NOW).status.persist_seconds is None


def test_heartbeat_time_in_status_is_coarse() -> None:
    """A heartbeat alone does not change status (no write) until the resolution has passed."""
    job = running_job().obj()
    d = decide(job, observe().running(2).obj(), NOW)
    assert d.status == decide(job, observe().running(2).obj(), NOW).status
    assert d.status.node_slots[0].last_heartbeat_time == ago(1)  # status said ago(1): unchanged
    later = job.model_copy(update={"status": d.status})
    d2 = decide(later, observe().running(2).lease("train-n0-a0", -100, hb()).obj(), NOW)
    assert d2.status.node_slots[0].last_heartbeat_time == ago(-100)


def test_heartbeat_times_reach_status_together() -> None:
    """When one slot's heartbeat time is due, every slot's is written in the same pass: one status
    write per resolution period per job, not one per slot."""
    job = running_job().obj()
    obs = observe().running(2).lease("train-n0-a0", -100, hb()).lease("train-n1-a0", -30, hb()).obj()
    slots = decide(job, obs, NOW).status.node_slots
    assert [s.last_heartbeat_time for s in slots] == [ago(-100), ago(-30)]
    quiet = observe().running(2).lease("train-n0-a0", -30, hb()).lease("train-n1-a0", -30, hb()).obj()
    assert [s.last_heartbeat_time for s in decide(job, quiet, NOW).status.node_slots] == [ago(1), ago(1)]


def test_goodput() -> None:
    job = running_job(lostSeconds=360.0).obj()
    assert goodput(job.status, NOW) == pytest.approx(0.9)
    assert goodput(make_job().obj().status, NOW) is None


def test_lease_parser_clamps_future_and_ignores_garbage() -> None:
    from rtj.ladder import lease_from_dict

    future = (NOW.replace(year=2030)).isoformat()
    obs = lease_from_dict(
        {
            "metadata": {"name": "p", "annotations": {contract.HEARTBEAT_ANNOTATION: "{not json"}},
            "spec": {"renewTime": future},
        },
        NOW,
    )
    assert obs.renew_time == NOW and obs.heartbeat is None
    assert lease_from_dict({"metadata": {}, "spec": {"renewTime": 12}}, NOW).renew_time is None


def test_future_renew_time_ages_from_when_it_was_seen() -> None:
    """A Lease stuck at a renewTime in the future (a dead pod with a skewed clock) times out: its
    heartbeat counts from when the operator received that version, not from the future."""
    from rtj.ladder import OBSERVED_AT, lease_from_dict

    future = NOW.replace(year=2030).isoformat()
    raw = {
        "metadata": {
            "name": "train-n1-a0",
            "annotations": {contract.HEARTBEAT_ANNOTATION: hb().to_annotation()},
        },
        "spec": {"renewTime": future},
        OBSERVED_AT: ago(31),
    }
    lease = lease_from_dict(raw, NOW)
    assert lease.renew_time == ago(31)
    obs = observe().running(2).obj()
    d = decide(
        running_job().obj(),
        Observed(pods=obs.pods, leases={**obs.leases, "train-n1-a0": lease}, nodes=obs.nodes),
        NOW,
    )
    assert [e.reason for e in d.events][:1] == [reasons.HEARTBEAT_TIMEOUT]
    fresh = lease_from_dict({**raw, OBSERVED_AT: ago(1)}, NOW)
    assert fresh.renew_time == ago(1)


def test_pod_parser_reads_exit_code_and_labels() -> None:
    from rtj.ladder import pod_from_dict

    pod = pod_from_dict(
        {
            "metadata": {
                "name": "train-n3-a2",
                "uid": "u",
                "labels": {contract.LABEL_ROLE: "worker"},
                "deletionTimestamp": NOW.isoformat(),
            },
            "spec": {"nodeName": "n"},
            "status": {
                "phase": "Failed",
                "containerStatuses": [{"name": "trainer", "state": {"terminated": {"exitCode": 70}}}],
            },
        }
    )
    assert (pod.slot, pod.attempt, pod.exit_code, pod.deleting, pod.phase) == (3, 2, 70, True, "Failed")
    garbage = pod_from_dict(
        {"metadata": {"name": "x", "labels": {contract.LABEL_ATTEMPT: "-4"}}, "status": None}
    )
    assert garbage.attempt == 0 and garbage.slot is None


def test_wide_columns_newest_fault_and_step() -> None:
    """kubectl get rtj -o wide: the newest fault (reason, node) and the newest step reported."""
    d = decide(running_job().obj(), observe().running(2).lease("train-n1-a0", 31, hb()).obj(), NOW)
    fault = d.status.last_fault
    assert fault is not None and (fault.reason, fault.node, fault.slot) == (
        reasons.HEARTBEAT_TIMEOUT,
        "node-1",
        1,
    )
    fresh = make_job().nodes(2).obj()  # first heartbeats: due at once
    obs = (
        observe().running(2).lease("train-n0-a0", 1, hb(step=120)).lease("train-n1-a0", 1, hb(step=118)).obj()
    )
    assert decide(fresh, obs, NOW).status.step == 120


def test_failed_job_keeps_no_stale_degraded() -> None:
    """issue 13, case 1's end state: Failed with Degraded=True PodsPending still set."""
    job = running_job(
        conditions=[
            {
                "type": "Degraded",
                "status": "True",
                "reason": "PodsPending",
                "lastTransitionTime": ago(9).isoformat(),
            },
            {"type": "Failed", "status": "True", "reason": "PodRescheduleBudgetExhausted"},
        ]
    ).obj()
    conds = {c.type: c.status for c in decide(job, observe().obj(), NOW).status.conditions}
    assert conds["Degraded"] == "False" and conds["Failed"] == "True"


@pytest.mark.parametrize(
    ("old_step", "new_steps", "rate"),
    [
        pytest.param(100, (160, 158), 1.0, id="60-steps-in-60s"),
        pytest.param(100, (100, 99), 0.0, id="frozen-step-reads-0"),
        pytest.param(100, (40, 38), None, id="resumed-from-an-older-checkpoint-unknown"),
        pytest.param(None, (160, 158), None, id="first-step-seen-unknown"),
    ],
)
def test_wide_column_steps_per_second(
    old_step: int | None, new_steps: tuple[int, int], rate: float | None
) -> None:
    """kubectl get rtj -o wide: steps/s between two refreshes of status.step (60 s apart here)."""
    slots = slot_status(2, {s: {"lastHeartbeatTime": ago(61).isoformat()} for s in range(2)})
    job = running_job(step=old_step, nodeSlots=slots, stepsPerSecond=3.0).obj()
    obs = observe().running(2)
    for s, step in enumerate(new_steps):
        obs = obs.lease(f"train-n{s}-a0", 1, hb(step=step))
    status = decide(job, obs.obj(), NOW).status
    assert status.step == max(new_steps)
    assert status.steps_per_second == rate


def test_ended_job_shows_no_steps_per_second() -> None:
    job = running_job(stepsPerSecond=3.0, step=100).obj()
    obs = observe().running(2).worker(0, phase="Failed", exit_code=93).obj()
    status = decide(job, obs, NOW).status
    assert status.state == "Failed" and status.steps_per_second is None
