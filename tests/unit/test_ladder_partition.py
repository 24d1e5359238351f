"""rtj.ladder.partition through decide(): a stuck job's pods are asked to probe their peers, and the
pod the others cannot reach (nor it them) is replaced, with no node blamed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from ladder_testkit import NOW, ago, hb, make_job, observe, slot_status
from rtj import contract, reasons
from rtj.ladder import DeletePod, RecordNodeFault, RequestReachProbe, TaintNode, decide
from rtj.ladder.observe import ProgressSeen
from rtj.ladder.partition import peers_of

TIMEOUT = 30  # the testkit job's heartbeatTimeoutSeconds
PROBE_ID = f"{ago(8).timestamp():.3f}"  # answered: past its due time (interval 5 + 2 + 1)


def endpoint(slot: int) -> str:
    return f"10.0.0.{slot + 1}:4{slot:04d}"


def stuck_job(n: int, since: float = 40.0, overrides: dict[int, dict[str, Any]] | None = None) -> Any:
    """n slots whose pods restart in job, recovering for `since` seconds."""
    base = {
        s: {"state": "InJobRestarting", "recoveringSince": ago(since).isoformat(), "inJobRestarts": 1}
        for s in range(n)
    }
    for s, fields in (overrides or {}).items():
        base[s].update(fields)
    return make_job().nodes(n).status(nodeSlots=slot_status(n, base), rendezvousPodUid="rdzv-1")


def answer(reached: list[int], unreachable: list[int], probe: str = PROBE_ID) -> dict[str, Any]:
    return {"probe": probe, "reached": reached, "unreachable": unreachable, "time": ago(2).isoformat()}


def pods(
    n: int,
    answers: dict[int, dict[str, Any]] | None = None,
    probe: str | None = PROBE_ID,
    attempts: dict[int, int] | None = None,
    state: str = "InJobRestarting",
) -> Any:
    """n running workers with reach endpoints; `answers` by slot; the probe on every Lease."""
    o = observe().rdzv()
    for s in range(n):
        attempt = (attempts or {}).get(s, 0)
        o.worker(s, attempt)
        name = contract.worker_pod_name("train", s, attempt)
        beat = hb(state, ij=1, step=50, reach_endpoint=endpoint(s), reach=(answers or {}).get(s))
        request = contract.ReachProbe(id=probe, peers={}) if probe and attempt == 0 else None
        o.lease(name, 1.0, beat, reach_probe=request)
    return o.obj()


def probes(d: Any) -> list[RequestReachProbe]:
    return [a for a in d.actions if isinstance(a, RequestReachProbe)]


def deleted(d: Any) -> list[str]:
    return [a.name for a in d.actions if isinstance(a, DeletePod)]


def blamed(d: Any) -> list[Any]:
    return [a for a in d.actions if isinstance(a, (TaintNode, RecordNodeFault))]


def test_each_pod_probes_every_peer_or_its_ring_neighbours() -> None:
    assert peers_of(1, [0, 1, 2]) == [0, 2]
    big = list(range(20))
    assert peers_of(0, big) == [1, 2, 3, 4, 16, 17, 18, 19]
    assert peers_of(10, big) == [6, 7, 8, 9, 11, 12, 13, 14]
    assert all(len(peers_of(s, big)) == contract.REACH_MAX_PEERS for s in big)


def test_a_job_stuck_recovering_past_the_heartbeat_timeout_asks_its_pods_to_probe() -> None:
    d = decide(stuck_job(3).obj(), pods(3, probe=None), NOW)
    asked = probes(d)
    assert [a.lease for a in asked] == [contract.worker_pod_name("train", s, 0) for s in range(3)]
    assert asked[0].probe.peers == {1: endpoint(1), 2: endpoint(2)}
    assert len({a.probe.id for a in asked}) == 1
    assert float(asked[0].probe.id) == pytest.approx(NOW.timestamp())
    assert any(e.reason == reasons.REACH_PROBE for e in d.events)
    assert not deleted(d) and not blamed(d)


@pytest.mark.parametrize(
    "case,job,observed",
    [
        (
            "training",
            make_job().nodes(3).status(nodeSlots=slot_status(3, {})),
            pods(3, probe=None, state="Training"),
        ),
        ("recovering less than the timeout", stuck_job(3, since=10.0), pods(3, probe=None)),
        ("probed less than a timeout ago", stuck_job(3), pods(3, probe=f"{ago(10).timestamp():.3f}")),
        (
            "backing off: probed 60 s into the episode, the next waits 60 s more",
            stuck_job(3, since=100.0),
            pods(3, probe=f"{ago(40).timestamp():.3f}"),
        ),
        ("a pod without a reach endpoint (an older trainer)", stuck_job(2), None),
    ],
)
def test_no_probe(case: str, job: Any, observed: Any) -> None:
    if observed is None:
        o = observe().running(2, heartbeat=hb("InJobRestarting", ij=1, step=50))
        observed = o.obj()
    d = decide(job.obj(), observed, NOW)
    assert not probes(d), case
    assert not deleted(d), case


def test_ranks_stuck_forming_their_process_group_report_no_restart_the_frozen_step_times_it() -> None:
    """No recovery counted (the ranks never got to report a restart), every pod Starting: stuck
    since the step last rose, as the Lease watch saw it."""
    job = make_job().nodes(3).status(nodeSlots=slot_status(3, {s: {"state": "Starting"} for s in range(3)}))
    frozen = dataclasses.replace(
        pods(3, probe=None, state="Starting"), progress_seen=ProgressSeen(50, ago(40))
    )
    assert len(probes(decide(job.obj(), frozen, NOW))) == 3
    recent = dataclasses.replace(frozen, progress_seen=ProgressSeen(50, ago(10)))
    assert not probes(decide(job.obj(), recent, NOW)), "stuck for less than heartbeatTimeoutSeconds"


def test_a_probe_that_found_nothing_is_repeated_later_in_the_episode() -> None:
    """Stuck for 100 s, probed at 30 s (T): probed again from 2T on."""
    d = decide(stuck_job(3, since=100.0).obj(), pods(3, probe=f"{ago(70).timestamp():.3f}"), NOW)
    assert len(probes(d)) == 3


def test_the_pod_nobody_reaches_is_replaced_and_no_node_is_blamed() -> None:
    answers = {0: answer([2], [1]), 1: answer([], [0, 2]), 2: answer([0], [1])}
    d = decide(stuck_job(3).obj(), pods(3, answers), NOW)
    assert deleted(d) == ["train-n1-a0"]
    assert not blamed(d), "a partition is no evidence against a node"
    assert d.status.restarts.pod_reschedules == 1
    slot = d.status.node_slots[1]
    assert slot.last_fault_reason == reasons.POD_PARTITIONED and slot.attempt == 1
    [event] = [e for e in d.events if e.reason == reasons.POD_PARTITIONED]
    assert "slots 0,2 cannot reach it" in event.message and "cannot reach slots 0,2" in event.message
    assert [i.reason for i in d.status.incidents] == [reasons.POD_PARTITIONED]


def test_two_pods_cut_apart_one_is_replaced_then_the_other_as_the_same_incident() -> None:
    mutual = {0: answer([], [1]), 1: answer([], [0])}
    first = decide(stuck_job(2).obj(), pods(2, mutual), NOW)
    assert deleted(first) == ["train-n1-a0"]
    assert first.status.restarts.pod_reschedules == 1

    # Slot 1's replacement runs; a later probe finds the two still cut apart: the other end goes.
    again = {1: {"attempt": 1, "lastFaultReason": reasons.POD_PARTITIONED, "pod": "train-n1-a1"}}
    job = stuck_job(2, overrides=again).status(restarts={"podReschedules": 1})
    later = f"{ago(6).timestamp():.3f}"
    o = pods(2, {0: answer([], [1], later), 1: answer([], [0], later)}, probe=later, attempts={1: 1})
    second = decide(job.obj(), o, NOW)
    assert deleted(second) == ["train-n0-a0"]
    assert second.status.restarts.pod_reschedules == 1, "one incident: no second reschedule"
    [event] = [e for e in second.events if e.reason == reasons.POD_PARTITIONED]
    assert "already counted" in event.message
    assert not blamed(second)


@pytest.mark.parametrize(
    "case,answers",
    [
        (
            "nothing reached at all with three pods: the probe is blocked",
            {s: answer([], [0, 1, 2]) for s in range(3)},
        ),
        (
            "every pod reaches every peer",
            {0: answer([1, 2], []), 1: answer([0, 2], []), 2: answer([0, 1], [])},
        ),
        (
            "one way only: slot 1 reaches slot 0",
            {0: answer([2], [1]), 1: answer([0, 2], []), 2: answer([0, 1], [])},
        ),
        (
            "the answers contradict each other (a busy pod left a probe unanswered)",
            {0: answer([1, 2], []), 1: answer([0], [2]), 2: answer([1], [0])},
        ),
        ("one broken link, slots 0 and 1", {0: answer([2], [1]), 1: answer([2], [0]), 2: answer([0, 1], [])}),
    ],
)
def test_nothing_stands_out_nothing_is_replaced(case: str, answers: dict[int, Any]) -> None:
    d = decide(stuck_job(3).obj(), pods(3, answers), NOW)
    assert not deleted(d), case
    assert not blamed(d), case


def test_answers_are_awaited_until_their_due_time_then_judged_from_those_in() -> None:
    fresh = f"{ago(3).timestamp():.3f}"
    partial = {0: answer([2], [1], fresh), 2: answer([0], [1], fresh)}
    early = decide(stuck_job(3).obj(), pods(3, partial, probe=fresh), NOW)
    assert not deleted(early) and early.due is not None and early.due > NOW

    # Past the due time, the pod that never answered is not a candidate: its own evidence is missing.
    late = decide(stuck_job(3).obj(), pods(3, {0: answer([2], [1]), 2: answer([0], [1])}), NOW)
    assert not deleted(late)
    # With its answer, it is.
    full = {0: answer([2], [1]), 1: answer([], [0, 2]), 2: answer([0], [1])}
    assert deleted(decide(stuck_job(3).obj(), pods(3, full), NOW)) == ["train-n1-a0"]
