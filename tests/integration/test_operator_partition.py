"""A partitioned pod is found and replaced (issue 25, item 4), against the real API server: the
operator runs as a process; the test plays the trainers, whose ranks keep restarting in job while one
pod's traffic to its peers is dropped (its Lease still renews), and answers the operator's reach
probe as the pods' heartbeat agents would (rtj_trainer.reach: the agent reads the request from the
Lease its renewal returns and publishes what it reached)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from kubernetes import client
from operator_harness import (
    OperatorEnv,
    events,
    node_faults,
    quarantine_taint,
    reasons_of,
    running,
    until,
)
from rtj import contract, reasons
from rtj.api.status_slots import every_slot

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CUT = 1  # the slot whose pod is cut off from its peers


def test_the_pod_its_peers_cannot_reach_is_replaced_and_no_node_is_blamed(
    env: Callable[..., OperatorEnv],
) -> None:
    e = env(nodes=4)
    e.create_job("train", 3)
    t = e.trainers("train")
    until(running(e, "train", 3), t, 90, e.explain("train"))
    before = e.workers("train")
    victim = before[CUT]
    slot_of = {p.metadata.name: s for s, p in before.items()}
    endpoint = {s: f"10.9.0.{s + 1}:40{s:02d}" for s in before}

    def stuck(name: str, reach: contract.ReachReport | None = None) -> contract.Heartbeat:
        return contract.Heartbeat(
            state=contract.PodState.IN_JOB_RESTARTING,
            in_job_restarts=1,
            step=20,
            reach_endpoint=endpoint[slot_of[name]],
            reach=reach,
        )

    # The ranks time out in their collectives and restart, again and again; no heartbeat is silent.
    for name in slot_of:
        t.heartbeats[name] = stuck(name)
    asked: dict[str, str] = {}

    def answer_probes() -> None:
        """Each agent answers its Lease's probe: slot CUT reaches no peer, and no peer reaches it."""
        for name, slot in slot_of.items():
            try:
                lease = t.coord.read_namespaced_lease(contract.lease_name(name), e.namespace)
            except client.ApiException as exc:  # the replaced pod's Lease goes with it
                if exc.status == 404:
                    continue
                raise
            probe = contract.parse_reach_probe(lease.metadata.annotations)
            if probe is None:
                continue
            asked[name] = probe.id
            peers = set(probe.peers)
            down = peers if slot == CUT else peers & {CUT}
            report = contract.ReachReport(
                probe=probe.id,
                reached=sorted(peers - down),
                unreachable=sorted(down),
                time=datetime.now(UTC),
            )
            t.heartbeats[name] = stuck(name, report)

    def replaced() -> bool:
        answer_probes()
        t.beat()
        pod = e.workers("train").get(CUT)
        return pod is not None and pod.metadata.name == f"train-n{CUT}-a1"

    until(replaced, t, 90, e.explain("train"))
    first = t.coord.read_namespaced_lease(contract.lease_name(before[0].metadata.name), e.namespace)
    probe = contract.parse_reach_probe(first.metadata.annotations)
    assert probe is not None and probe.peers == {1: endpoint[1], 2: endpoint[2]}, probe
    assert set(asked) == set(slot_of), "every pod was asked, each with its peers' endpoints"

    after = e.workers("train")
    assert after[0].metadata.uid == before[0].metadata.uid and after[2].metadata.uid == before[2].metadata.uid
    st = e.status("train")
    slot = next(s for s in every_slot(st) if s["slot"] == CUT)
    assert slot["lastFaultReason"] == reasons.POD_PARTITIONED, slot
    assert st["restarts"]["podReschedules"] == 1, st["restarts"]
    evs = events(e.core, e.namespace, "train")
    assert reasons.REACH_PROBE in reasons_of(evs)
    [cut] = [ev for ev in evs if ev.reason == reasons.POD_PARTITIONED]
    assert "slots 0,2 cannot reach it" in cut.message, cut.message
    # No node blamed: no taint, no fault recorded against the cut-off pod's node.
    node = victim.spec.node_name
    assert all(quarantine_taint(e.core, n) is None for n in e.nodes)
    assert not st.get("quarantinedNodes")
    assert node_faults(e.core, node) == (), node_faults(e.core, node)
