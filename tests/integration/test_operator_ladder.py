"""The escalation ladder end to end against the real API server: the operator runs as a process,
the test plays the trainers (Leases through rtj.contract) and the kubelet (pod exit codes)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from operator_harness import (
    TRAINER_SERVICE_ACCOUNT,
    OperatorEnv,
    condition,
    counters,
    end_pod,
    events,
    is_true,
    make_node_not_ready,
    metric_value,
    node_faults,
    node_quarantine,
    quarantine_taint,
    reasons_of,
    running,
    set_node_condition,
    until,
)
from rtj import contract, reasons
from rtj.api.status_slots import every_slot

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def restarts(e: OperatorEnv, job: str) -> dict[str, int]:
    return e.status(job).get("restarts") or {}


def quarantined(e: OperatorEnv, node: str) -> str:
    """The reason of the node's quarantine (the taint's value: the evidence against the node, e.g.
    NodeUnhealthy; never the job's name), "" when it has none."""
    taint = quarantine_taint(e.core, node)
    return (taint.value or "?") if taint is not None else ""


def test_children_and_soft_faults_counted_without_touching_pods(env: Callable[..., OperatorEnv]) -> None:
    e = env(nodes=3)
    e.create_job("train", 3)
    t = e.trainers("train")
    until(running(e, "train", 3), t, 90, e.explain("train"))

    pods = e.workers("train")
    uids = {s: p.metadata.uid for s, p in pods.items()}
    assert sorted(p.metadata.name for p in pods.values()) == ["train-n0-a0", "train-n1-a0", "train-n2-a0"]
    assert len({p.spec.node_name for p in pods.values()}) == 3, "one pod per node"
    svc = e.core.read_namespaced_service("train-rdzv", e.namespace)
    assert svc.spec.cluster_ip == "None" and [(p.name, p.port) for p in svc.spec.ports] == [("rdzv", 29400)]
    rdzv = e.core.read_namespaced_pod("train-rdzv", e.namespace)
    assert rdzv.spec.containers[0].command == ["rtj-trainer", "rendezvous"]
    env_vars = {v.name: v.value for v in pods[0].spec.containers[0].env}
    config = contract.TrainerConfig.from_env(env_vars[contract.ENV_TRAINER_CONFIG])
    assert config.rdzv_endpoint == f"train-rdzv.{e.namespace}.svc:29400" and config.nnodes == 3

    # Level 1: two in-process restarts in slot 1.
    fault = contract.Fault(
        severity=contract.FaultSeverity.SOFT,
        reason=contract.FaultReason.RANK_EXCEPTION,
        message="boom",
        time=datetime.now(UTC),
    )
    t.heartbeats["train-n1-a0"] = contract.Heartbeat(
        state=contract.PodState.IN_PROCESS_RESTARTING, in_process_restarts=2, fault=fault
    )
    until(
        lambda: (
            restarts(e, "train").get("inProcess") == 2
            and e.status("train").get("reason") == reasons.IN_PROCESS_RESTART
        ),
        t,
        30,
        e.explain("train"),
    )
    t.heartbeats["train-n1-a0"] = contract.Heartbeat(state=contract.PodState.TRAINING, in_process_restarts=2)
    until(running(e, "train", 3), t, 30, e.explain("train"))

    # Level 2: one in-job restart in slot 0, with a committed checkpoint.
    t.heartbeats["train-n0-a0"] = contract.Heartbeat(
        state=contract.PodState.TRAINING,
        in_job_restarts=1,
        step=120,
        checkpoint=contract.CheckpointRef(step=100, time="2026-01-01T00:00:00Z"),
    )
    until(lambda: restarts(e, "train").get("inJob") == 1, t, 30, e.explain("train"))
    until(
        lambda: (e.status("train").get("lastCheckpoint") or {}).get("step") == 100, t, 30, e.explain("train")
    )

    assert {s: p.metadata.uid for s, p in e.workers("train").items()} == uids, "soft faults never touch pods"
    assert counters(e.status("train")) == {
        "inProcess": 2,
        "inJob": 1,
        "podReschedules": 0,
        "disruptions": 0,
        "job": 0,
    }
    evs = reasons_of(events(e.core, e.namespace, "train"))
    assert evs.count(reasons.IN_PROCESS_RESTART) == 1 and evs.count(reasons.IN_JOB_RESTART) == 1
    assert reasons.RECOVERED in evs
    # Metrics follow the status write and the Events in the same pass: wait for them, not race them.
    counted = (
        f'rtj_restarts_total{{job_name="train",job_namespace="{e.namespace}",level="InProcess",'
        f'reason="InProcessRestart"}} 2.0'
    )
    until(
        lambda: (
            counted in (text := e.operator.metrics())
            and metric_value(text, "rtj_recovery_seconds_count", level="InProcess") == 1.0
        ),
        t,
        30,
        lambda: e.operator.metrics()[-2000:],
    )


def test_silence_replaces_one_pod_and_records_its_node_without_quarantine(
    env: Callable[..., OperatorEnv], kubectl: Any
) -> None:
    """A silent pod is no evidence against its node (issue 25: a hung rank, a partition whose side
    is unknown): the pod is replaced, one reschedule spent, and the fault is recorded on the node
    (recent-faults) for another job's fault there to make the case; nothing is quarantined. The
    replacement only prefers another node (rtj.ladder.suspect_node): with a third node free, the
    scheduler puts it there."""
    e = env(nodes=3)
    e.create_job("train", 2)
    t = e.trainers("train")
    until(running(e, "train", 2), t, 90, e.explain("train"))
    before = e.workers("train")
    victim, survivor = before[1], before[0]
    node = victim.spec.node_name

    t.silent.add(victim.metadata.name)  # the pod hangs: no more heartbeats

    def replaced() -> bool:
        pod = e.workers("train").get(1)
        return pod is not None and pod.metadata.name == "train-n1-a1" and bool(pod.spec.node_name)

    until(replaced, t, 60, e.explain("train"))
    new = e.workers("train")
    assert new[0].metadata.uid == survivor.metadata.uid, "the other pod keeps running"
    st = e.status("train")
    assert st["restarts"]["podReschedules"] == 1 and not st.get("quarantinedNodes"), st
    slot1 = next(s for s in every_slot(st) if s["slot"] == 1)
    assert slot1["attempt"] == 1 and slot1["lastFaultReason"] == reasons.HEARTBEAT_TIMEOUT
    assert slot1["suspectNode"] == node, slot1
    node_affinity = new[1].spec.affinity.node_affinity
    assert node_affinity.required_during_scheduling_ignored_during_execution is None, "never required"
    [prefer] = node_affinity.preferred_during_scheduling_ignored_during_execution
    elsewhere = [(x.key, x.operator, x.values) for x in prefer.preference.match_expressions]
    assert prefer.weight == 100 and elsewhere == [("kubernetes.io/hostname", "NotIn", [node])]
    assert new[1].spec.node_name not in (node, survivor.spec.node_name), "the free third node"
    # The node's record names the job and the fault (the write follows the pass that replaced it).
    job_key = f"{e.namespace}/train"
    until(
        lambda: (
            [(f.job, f.reason) for f in node_faults(e.core, node)] == [(job_key, reasons.HEARTBEAT_TIMEOUT)]
        ),
        t,
        30,
        lambda: f"recent-faults of {node}: {node_faults(e.core, node)}",
    )
    until(running(e, "train", 2), t, 60, e.explain("train"))
    assert not any(quarantined(e, n) for n in e.nodes), "silence is no evidence against a node"
    assert node_quarantine(e.core, node) is None
    evs = reasons_of(events(e.core, e.namespace, "train"))
    assert evs.count(reasons.HEARTBEAT_TIMEOUT) == 1 and reasons.RECOVERED in evs, evs
    assert reasons.NODE_QUARANTINED not in evs, evs
    # One recovery, labelled with its fault class.
    until(
        lambda: (
            metric_value(
                e.operator.metrics(),
                "rtj_recovery_seconds_count",
                level="Pod",
                reason=reasons.HEARTBEAT_TIMEOUT,
            )
            == 1.0
        ),
        t,
        30,
        lambda: e.operator.metrics()[-2000:],
    )
    # What a user sees (shown with pytest -rP).
    print(kubectl("get", "rtj", "-n", e.namespace, "-o", "wide").stdout)
    print(kubectl("get", "pods", "-n", e.namespace, "-o", "wide").stdout)
    print(kubectl("describe", "rtj", "train", "-n", e.namespace).stdout)


def test_unhealthy_node_condition_replaces_its_pod_and_quarantines_the_node(
    env: Callable[..., OperatorEnv],
) -> None:
    """Node evidence (issue 25): a health agent reports AcceleratedHardwareReady=False on a Ready
    node whose pod still heartbeats. The pod is replaced off it, one reschedule spent, and the node
    quarantined: taint value NodeUnhealthy and the evidence recorded on the node."""
    e = env(nodes=3)
    e.create_job("train", 2)
    t = e.trainers("train")
    until(running(e, "train", 2), t, 90, e.explain("train"))
    before = e.workers("train")
    victim, survivor = before[1], before[0]
    bad = victim.spec.node_name

    set_node_condition(
        e.core, bad, "AcceleratedHardwareReady", "False", "NvidiaXID79Error", "GPU has fallen off the bus"
    )

    def replaced() -> bool:
        pod = e.workers("train").get(1)
        return pod is not None and pod.metadata.name == "train-n1-a1" and bool(pod.spec.node_name)

    until(replaced, t, 60, e.explain("train"))
    assert e.workers("train")[1].spec.node_name != bad, "the replacement is kept off the quarantined node"
    assert e.workers("train")[0].metadata.uid == survivor.metadata.uid, "the other pod keeps running"
    assert quarantined(e, bad) == reasons.NODE_UNHEALTHY
    assert [n for n in e.nodes if quarantined(e, n)] == [bad]
    record = node_quarantine(e.core, bad)
    assert record is not None and record.reason == reasons.NODE_UNHEALTHY, record
    assert [(ev.job, ev.reason) for ev in record.evidence] == [
        (f"{e.namespace}/train", reasons.NODE_UNHEALTHY)
    ]
    assert "AcceleratedHardwareReady=False" in record.evidence[0].message, record
    assert record.until > record.since, record
    st = e.status("train")
    assert st["restarts"]["podReschedules"] == 1 and st["quarantinedNodes"] == [bad], st
    slot1 = next(s for s in every_slot(st) if s["slot"] == 1)
    assert slot1["lastFaultReason"] == reasons.NODE_UNHEALTHY, slot1
    until(running(e, "train", 2), t, 60, e.explain("train"))
    evs = events(e.core, e.namespace, "train")
    assert reasons_of(evs).count(reasons.NODE_UNHEALTHY) == 1, reasons_of(evs)
    quarantine_events = [ev.message for ev in evs if ev.reason == reasons.NODE_QUARANTINED]
    assert len(quarantine_events) == 1, reasons_of(evs)
    assert f"{contract.QUARANTINE_TAINT_KEY}={reasons.NODE_UNHEALTHY}:NoSchedule" in quarantine_events[0]


class _Beats:
    """The heartbeats of several jobs' pods, renewed together (`until` renews one Trainers)."""

    def __init__(self, *trainers: Any) -> None:
        self.trainers = trainers

    def beat(self) -> None:
        for t in self.trainers:
            t.beat()


def test_a_node_two_jobs_share_is_quarantined_once_with_both_jobs_evidence(
    env: Callable[..., OperatorEnv],
) -> None:
    """Two jobs have a pod on a node whose GPU fails (issue 25: the quarantine is the node's). One
    taint, whose value is the evidence's reason; one record carrying each job's evidence; one Event
    per job; deleting one job leaves the quarantine and both entries."""
    e = env(nodes=2)  # one pod per node: each job has a pod on each node
    # Half a p5 each (4 of its 8 GPUs, 16 of its 32 EFA devices): the two jobs fit side by side.
    half = {"gpusPerNode": 4, "resources": {"cpu": "4", "memory": "16Gi", "efaPerNode": 16}}
    e.create_job("a", 2, **half)
    e.create_job("b", 2, **half)
    beats = _Beats(e.trainers("a"), e.trainers("b"))
    until(lambda: running(e, "a", 2)() and running(e, "b", 2)(), beats, 90, e.explain("a"))
    bad = e.workers("a")[1].spec.node_name
    set_node_condition(
        e.core, bad, "AcceleratedHardwareReady", "False", "NvidiaXID79Error", "GPU has fallen off the bus"
    )

    def both_recorded() -> bool:
        record = node_quarantine(e.core, bad)
        return record is not None and {ev.job for ev in record.evidence} == {
            f"{e.namespace}/a",
            f"{e.namespace}/b",
        }

    until(both_recorded, beats, 60, e.explain("b"))
    taints = [t for t in e.core.read_node(bad).spec.taints or [] if t.key == contract.QUARANTINE_TAINT_KEY]
    assert [(t.value, t.effect) for t in taints] == [(reasons.NODE_UNHEALTHY, "NoSchedule")], taints
    record = node_quarantine(e.core, bad)
    assert record is not None and record.reason == reasons.NODE_UNHEALTHY, record
    assert {ev.reason for ev in record.evidence} == {reasons.NODE_UNHEALTHY}, record
    # Each job replaced its own pod there (the replacement waits: no other node is free of the job)
    # and names the node in one Event: NodeQuarantined, or NodeQuarantineExtended when its pass saw
    # the other job's taint already there (both passes may see the node untainted in the same
    # instant: each job's Event then says NodeQuarantined, and the node still has one taint).
    for job in ("a", "b"):
        st = e.status(job)
        assert st["restarts"]["podReschedules"] == 1 and st["quarantinedNodes"] == [bad], (job, st)
    said = {job: reasons_of(events(e.core, e.namespace, job)) for job in ("a", "b")}
    told = {reasons.NODE_QUARANTINED, reasons.NODE_QUARANTINE_EXTENDED}
    assert all(len([r for r in rs if r in told]) == 1 for rs in said.values()), said
    assert any(reasons.NODE_QUARANTINED in rs for rs in said.values()), said
    # The quarantine outlives the job that took it.
    e.rtj.api.delete_namespaced_custom_object(
        contract.API_GROUP, contract.API_VERSION, e.namespace, contract.PLURAL, "a"
    )

    until(lambda: e.job_gone("a"), beats, 60, e.explain("a"))
    assert quarantined(e, bad) == reasons.NODE_UNHEALTHY
    after = node_quarantine(e.core, bad)
    assert after is not None and len(after.evidence) == 2, after


def test_exit_70_is_replaced_and_exit_93_fails_the_job(env: Callable[..., OperatorEnv]) -> None:
    e = env(nodes=3)
    e.create_job("train", 2)
    t = e.trainers("train")
    until(running(e, "train", 2), t, 90, e.explain("train"))

    end_pod(e.core, e.namespace, "train-n0-a0", contract.ExitCode.LAUNCHER_BUDGET_EXHAUSTED)
    until(
        lambda: (
            (p := e.workers("train").get(0)) is not None
            and p.metadata.name == "train-n0-a1"
            and p.status.phase == "Running"
        ),
        t,
        60,
        e.explain("train"),
    )
    assert every_slot(e.status("train"))[0]["lastFaultReason"] == reasons.LAUNCHER_BUDGET_EXHAUSTED
    until(running(e, "train", 2), t, 60, e.explain("train"))

    end_pod(e.core, e.namespace, "train-n1-a0", contract.ExitCode.DO_NOT_RESTART)
    until(lambda: is_true(e.job("train"), "Failed"), t, 60, e.explain("train"))
    st = e.status("train")
    assert st["reason"] == reasons.DO_NOT_RESTART_EXIT_CODE and st["restarts"]["podReschedules"] == 1
    until(
        lambda: (
            all(p.status.phase in ("Succeeded", "Failed") for p in e.workers("train").values())
            and "train-rdzv" not in {p.metadata.name for p in t.pods() if not p.metadata.deletion_timestamp}
        ),
        None,
        60,
        e.explain("train"),
    )
    assert "train-n1-a1" not in {p.metadata.name for p in t.pods()}, "nothing restarted after exit 93"


def test_reschedule_budget_exhausted_fails_the_job(env: Callable[..., OperatorEnv]) -> None:
    e = env(nodes=4)
    e.create_job("train", 2, faultTolerance={"maxPodReschedules": 1})
    t = e.trainers("train")
    until(running(e, "train", 2), t, 90, e.explain("train"))
    end_pod(e.core, e.namespace, "train-n0-a0", 1)
    until(
        lambda: (p := e.workers("train").get(0)) is not None and p.metadata.name == "train-n0-a1",
        t,
        60,
        e.explain("train"),
    )
    end_pod(e.core, e.namespace, "train-n1-a0", 1)
    until(lambda: is_true(e.job("train"), "Failed"), t, 60, e.explain("train"))
    st = e.status("train")
    assert st["reason"] == reasons.POD_RESCHEDULE_BUDGET_EXHAUSTED and st["restarts"]["podReschedules"] == 1
    assert "train-n1-a1" not in {p.metadata.name for p in t.pods()}


def test_node_not_ready_replaces_its_pod(env: Callable[..., OperatorEnv]) -> None:
    e = env(nodes=3)
    e.create_job("train", 2)
    t = e.trainers("train")
    until(running(e, "train", 2), t, 90, e.explain("train"))
    rdzv_node = e.core.read_namespaced_pod("train-rdzv", e.namespace).spec.node_name
    # A worker whose node does not also host the rendezvous pod (that one is covered below).
    slot, lost = next((s, p) for s, p in sorted(e.workers("train").items()) if p.spec.node_name != rdzv_node)
    make_node_not_ready(e.core, lost.spec.node_name)
    until(
        lambda: (
            (p := e.workers("train").get(slot)) is not None
            and p.metadata.name == f"train-n{slot}-a1"
            and bool(p.spec.node_name)
        ),
        t,
        60,
        e.explain("train"),
    )
    assert e.workers("train")[slot].spec.node_name != lost.spec.node_name
    assert reasons_of(events(e.core, e.namespace, "train")).count(reasons.NODE_NOT_READY) == 1
    assert e.status("train")["restarts"]["podReschedules"] == 1
    # A node NotReady is evidence against it: quarantined, the taint's value saying why.
    assert quarantined(e, lost.spec.node_name) == reasons.NODE_NOT_READY
    assert e.status("train")["quarantinedNodes"] == [lost.spec.node_name]
    until(running(e, "train", 2), t, 60, e.explain("train"))


def test_rendezvous_pod_on_a_lost_node_is_recreated_and_counted(env: Callable[..., OperatorEnv]) -> None:
    e = env(nodes=3)
    e.create_job("train", 2)
    t = e.trainers("train")
    until(running(e, "train", 2), t, 90, e.explain("train"))
    old = e.core.read_namespaced_pod("train-rdzv", e.namespace)
    workers_on_node = [s for s, p in e.workers("train").items() if p.spec.node_name == old.spec.node_name]
    make_node_not_ready(e.core, old.spec.node_name)

    def recreated() -> bool:
        pods = e.core.list_namespaced_pod(e.namespace, field_selector="metadata.name=train-rdzv").items
        return bool(pods) and pods[0].metadata.uid != old.metadata.uid and pods[0].status.phase == "Running"

    until(recreated, t, 60, e.explain("train"))
    until(lambda: e.status("train")["rendezvousPodUid"] != old.metadata.uid, t, 30, e.explain("train"))
    assert e.core.read_namespaced_pod("train-rdzv", e.namespace).spec.node_name != old.spec.node_name
    evs = reasons_of(events(e.core, e.namespace, "train"))
    assert evs.count(reasons.RENDEZVOUS_LOST) == 1
    # The rendezvous pod is one job restart; a worker that shared its node is its own pod reschedule.
    until(
        lambda: e.status("train")["restarts"]["podReschedules"] == len(workers_on_node),
        t,
        30,
        e.explain("train"),
    )
    assert e.status("train")["restarts"]["job"] == 1, e.status("train")


def test_rendezvous_pod_terminating_on_a_node_that_died_is_forced_and_recreated(
    env: Callable[..., OperatorEnv],
) -> None:
    """A graceful deletion (a drain, `kubectl delete pod`) that its node's death leaves unfinished:
    no kubelet will end it, so the operator forces it rather than wait for it to replace the pod."""
    e = env(nodes=3)
    e.create_job("train", 2)
    t = e.trainers("train")
    until(running(e, "train", 2), t, 90, e.explain("train"))
    old = e.core.read_namespaced_pod("train-rdzv", e.namespace)
    e.operator.stop()
    make_node_not_ready(e.core, old.spec.node_name)
    e.core.delete_namespaced_pod("train-rdzv", e.namespace, grace_period_seconds=30)
    assert e.core.read_namespaced_pod("train-rdzv", e.namespace).metadata.deletion_timestamp
    e.operator.start(tick=t.beat)

    def recreated() -> bool:
        pods = e.core.list_namespaced_pod(e.namespace, field_selector="metadata.name=train-rdzv").items
        return bool(pods) and pods[0].metadata.uid != old.metadata.uid and pods[0].status.phase == "Running"

    until(recreated, t, 60, e.explain("train"))
    assert reasons_of(events(e.core, e.namespace, "train")).count(reasons.RENDEZVOUS_LOST) == 1


def test_deleted_pod_is_replaced_once_as_a_disruption(env: Callable[..., OperatorEnv]) -> None:
    """A pod deleted by someone else (a person, a drain) is a disruption, not a fault (issue 25):
    replaced once, counted in restarts.disruptions, no pod reschedule spent, no node blamed."""
    e = env(nodes=2)
    e.create_job("train", 2)
    t = e.trainers("train")
    until(running(e, "train", 2), t, 90, e.explain("train"))
    e.core.delete_namespaced_pod("train-n1-a0", e.namespace)
    until(
        lambda: (p := e.workers("train").get(1)) is not None and p.metadata.name == "train-n1-a1",
        t,
        60,
        e.explain("train"),
    )
    until(running(e, "train", 2), t, 60, e.explain("train"))
    st = e.status("train")
    assert counters(st) == {"inProcess": 0, "inJob": 0, "podReschedules": 0, "disruptions": 1, "job": 0}, st
    assert not st.get("quarantinedNodes") and not any(quarantined(e, n) for n in e.nodes), st
    assert reasons_of(events(e.core, e.namespace, "train")).count(reasons.POD_DELETED) == 1


def test_hot_spare_takes_over_a_failed_slot(env: Callable[..., OperatorEnv]) -> None:
    e = env(nodes=4)
    e.create_job("train", 2, hotSpares=1)
    t = e.trainers("train")
    until(
        lambda: (
            running(e, "train", 2)()
            and [s.get("state") for s in e.status("train").get("spares", [])] == ["Standby"]
        ),
        t,
        90,
        e.explain("train"),
    )
    spare = e.core.read_namespaced_pod("train-spare-0-a0", e.namespace)
    env_vars = {v.name: v.value for v in spare.spec.containers[0].env}
    assert contract.TrainerConfig.from_env(env_vars[contract.ENV_TRAINER_CONFIG]).standby is True

    end_pod(e.core, e.namespace, "train-n0-a0", contract.ExitCode.LAUNCHER_BUDGET_EXHAUSTED)
    until(
        lambda: (p := e.workers("train").get(0)) is not None and p.metadata.name == "train-spare-0-a0",
        t,
        60,
        e.explain("train"),
    )
    promoted = e.core.read_namespaced_pod("train-spare-0-a0", e.namespace)
    assert promoted.metadata.uid == spare.metadata.uid, "the spare itself took the slot (no new pod)"
    assert promoted.metadata.labels[contract.LABEL_ATTEMPT] == "1"
    lease = client.CoordinationV1Api(e.kube).read_namespaced_lease("train-spare-0-a0", e.namespace)
    until(
        lambda: (
            client.CoordinationV1Api(e.kube)
            .read_namespaced_lease("train-spare-0-a0", e.namespace)
            .metadata.annotations.get(contract.ASSIGNED_SLOT_ANNOTATION)
            == "0"
        ),
        t,
        30,
        e.explain("train"),
    )
    assert lease.metadata.labels[contract.LABEL_JOB] == "train"
    until(
        lambda: (
            e.core.list_namespaced_pod(e.namespace, field_selector="metadata.name=train-spare-0-a1").items
        ),
        t,
        30,
        e.explain("train"),
    )
    until(running(e, "train", 2), t, 60, e.explain("train"))
    assert e.status("train")["restarts"]["podReschedules"] == 1
    assert reasons.SPARE_PROMOTED in reasons_of(events(e.core, e.namespace, "train"))


def slot_status(e: OperatorEnv, job: str, slot: int) -> dict[str, Any]:
    return next((s for s in every_slot(e.status(job)) if s["slot"] == slot), {})


def test_deleted_heartbeat_lease_is_not_silence_from_pod_start(env: Callable[..., OperatorEnv]) -> None:
    """issue 13, case 3: a user deletes a healthy pod's Lease; the trainer recreates it on its next
    renewal. Before: replaced and its node quarantined in the same second (StartupTimeout)."""
    e = env(nodes=3)
    ft = {"heartbeatIntervalSeconds": 2, "heartbeatTimeoutSeconds": 6, "startupTimeoutSeconds": 6}
    e.create_job("train", 2, faultTolerance=ft)
    t = e.trainers("train")
    until(running(e, "train", 2), t, 90, e.explain("train"))
    victim = e.workers("train")[1]
    name, node = victim.metadata.name, victim.spec.node_name
    coord = client.CoordinationV1Api(e.kube)
    # Older than startupTimeoutSeconds: the old fallback (silence from pod start) replaced it at once.
    until(
        lambda: (datetime.now(UTC) - e.workers("train")[1].status.start_time).total_seconds() > 7,
        t,
        30,
        e.explain("train"),
    )
    t.silent.add(name)  # between two renewals of its trainer
    coord.delete_namespaced_lease(name, e.namespace)
    until(lambda: slot_status(e, "train", 1).get("leaseMissingSince"), t, 30, e.explain("train"))
    t.silent.discard(name)  # the trainer's next renewal recreates the Lease
    until(
        lambda: (
            slot_status(e, "train", 1).get("leaseMissingSince") is None
            and slot_status(e, "train", 1).get("state") == "Training"
        ),
        t,
        30,
        e.explain("train"),
    )
    assert e.workers("train")[1].metadata.uid == victim.metadata.uid, "the pod was kept"
    assert restarts(e, "train").get("podReschedules", 0) == 0 and not quarantined(e, node)
    evs = reasons_of(events(e.core, e.namespace, "train"))
    assert reasons.STARTUP_TIMEOUT not in evs and reasons.HEARTBEAT_TIMEOUT not in evs, evs

    # A Lease that is not recreated: silence (from the last heartbeat), not a startup timeout.
    t.silent.add(name)
    coord.delete_namespaced_lease(name, e.namespace)
    until(
        lambda: (p := e.workers("train").get(1)) is not None and p.metadata.name == "train-n1-a1",
        t,
        60,
        e.explain("train"),
    )
    assert slot_status(e, "train", 1)["lastFaultReason"] == reasons.HEARTBEAT_TIMEOUT


def test_permanent_error_fails_the_job_at_once_without_quarantine(env: Callable[..., OperatorEnv]) -> None:
    """issue 13, case 4: a checkpoint of another world size is deterministic; before, 66 restarts
    and a healthy node quarantined, the cause never named."""
    e = env(nodes=3)
    e.create_job("train", 2)
    t = e.trainers("train")
    until(running(e, "train", 2), t, 90, e.explain("train"))
    message = "/checkpoints/step-0000000100 was written by 2 ranks, this job has 3"
    t.heartbeats["train-n1-a0"] = contract.Heartbeat(
        state=contract.PodState.IN_PROCESS_RESTARTING,
        fault=contract.Fault(
            severity=contract.FaultSeverity.PERMANENT,
            reason="WorldSizeMismatch",
            message=message,
            time=datetime.now(UTC),
        ),
    )
    until(lambda: is_true(e.job("train"), "Failed"), t, 30, e.explain("train"))
    st = e.status("train")
    assert st["reason"] == reasons.PERMANENT_FAULT and message in st["conditions"][-1]["message"]
    assert st["restarts"]["podReschedules"] == 0 and st.get("quarantinedNodes", []) == []
    assert not any(quarantined(e, n) for n in e.nodes)
    assert not is_true(e.job("train"), "Degraded")
    until(
        lambda: reasons_of(events(e.core, e.namespace, "train")).count(reasons.PERMANENT_FAULT) == 1,
        None,
        30,
        e.explain("train"),
    )


def refused_creates(e: OperatorEnv) -> float:
    lines = [ln for ln in e.operator.metrics().splitlines() if ln.startswith("rtj_create_refused_total{")]
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)


def test_forbidden_pod_shows_on_the_job_and_is_retried(env: Callable[..., OperatorEnv]) -> None:
    """issue 13, case 5: a namespace without the trainer ServiceAccount (403). Before: Pending
    PodsPending forever, no Event, ~3 log lines a second."""
    e = env(nodes=3)
    e.core.delete_namespaced_service_account(TRAINER_SERVICE_ACCOUNT, e.namespace)
    e.create_job("train", 2)
    refused = lambda: condition(e.job("train"), "CreateRefused") or {}  # noqa: E731
    until(lambda: refused().get("status") == "True", None, 60, e.explain("train"))
    assert refused()["reason"] == "Forbidden" and "service account" in refused()["message"], refused()
    assert e.status("train")["reason"] == reasons.CREATE_REFUSED
    until(lambda: refused_creates(e) >= 4, None, 60, e.explain("train"))  # retried (backoff 1, 2, 4 s)
    evs = events(e.core, e.namespace, "train")
    assert reasons_of(evs).count(reasons.CREATE_REFUSED) == 1, reasons_of(evs)
    assert "service account" in next(ev.message for ev in evs if ev.reason == reasons.CREATE_REFUSED)
    assert e.operator.log_tail(10_000).count("refused a create") == 1, "one log line per refusal"

    e.core.create_namespaced_service_account(e.namespace, {"metadata": {"name": TRAINER_SERVICE_ACCOUNT}})
    t = e.trainers("train")
    until(running(e, "train", 2), t, 120, e.explain("train"))
    assert refused()["status"] == "False" and refused()["reason"] == reasons.CREATES_ACCEPTED


@pytest.mark.parametrize("early_exit", [False, True], ids=["frozen-step", "worker-exits-0-early"])
def test_progress_watchdog_stalls_then_fails(env: Callable[..., OperatorEnv], early_exit: bool) -> None:
    """issue 13, case 2: one worker's command returned 0 early and the other waited forever for a
    rendezvous round; for 7+ minutes the job read `Running AllPodsRunning`, step frozen, no Event."""
    e = env(nodes=3, RTJ_HEARTBEAT_STATUS_RESOLUTION_SECONDS="1")
    e.create_job("train", 2, faultTolerance={"progressTimeoutSeconds": 10})
    t = e.trainers("train")
    until(running(e, "train", 2), t, 90, e.explain("train"))
    for pod in ("train-n0-a0", "train-n1-a0"):  # both at step 7, and no further
        t.heartbeats[pod] = contract.Heartbeat(state=contract.PodState.TRAINING, step=7)
    if early_exit:
        end_pod(e.core, e.namespace, "train-n1-a0", 0)
        t.heartbeats["train-n0-a0"] = contract.Heartbeat(state=contract.PodState.IN_JOB_RESTARTING, step=7)
    until(lambda: is_true(e.job("train"), "Stalled"), t, 60, e.explain("train"))
    assert e.status("train")["progressStep"] == 7
    until(lambda: is_true(e.job("train"), "Failed"), t, 60, e.explain("train"))
    st = e.status("train")
    assert st["reason"] == reasons.NO_PROGRESS and st["restarts"]["podReschedules"] == 0
    failed = condition(e.job("train"), "Failed") or {}
    assert ("train-n1-a0 exited 0" in failed["message"]) is early_exit, failed
    evs = reasons_of(events(e.core, e.namespace, "train"))
    assert evs.count(reasons.STALLED) == 1, evs
    until(
        lambda: reasons_of(events(e.core, e.namespace, "train")).count(reasons.NO_PROGRESS) == 1,
        None,
        30,
        e.explain("train"),
    )


def test_workers_failing_after_the_rendezvous_pod_died_are_one_job_level_recovery(
    env: Callable[..., OperatorEnv],
) -> None:
    """issue 13, case 1: the rendezvous pod dies, every worker's launcher exits 70. Before: each a
    pod reschedule with its healthy node quarantined; Failed/PodRescheduleBudgetExhausted in 8.7 s.
    Now the whole incident is one job restart: no pod budget (here none at all) is needed."""
    e = env(nodes=4)
    e.create_job("train", 3, faultTolerance={"maxPodReschedules": 0})
    t = e.trainers("train")
    until(running(e, "train", 3), t, 90, e.explain("train"))
    end_pod(e.core, e.namespace, "train-rdzv", 1)
    until(lambda: e.status("train").get("jobFaultTime"), t, 30, e.explain("train"))
    for slot in range(3):
        end_pod(e.core, e.namespace, f"train-n{slot}-a0", contract.ExitCode.LAUNCHER_BUDGET_EXHAUSTED)
    until(
        lambda: (
            sorted(p.metadata.name for p in e.workers("train").values())
            == ["train-n0-a1", "train-n1-a1", "train-n2-a1"]
        ),
        t,
        60,
        e.explain("train"),
    )
    until(running(e, "train", 3), t, 60, e.explain("train"))
    st = e.status("train")
    assert st["restarts"]["podReschedules"] == 0, st
    assert st["restarts"]["job"] == 1 and not st.get("quarantinedNodes"), st
    assert not any(quarantined(e, n) for n in e.nodes)
    # One Warning for the incident (the rendezvous pod), one Normal per replaced worker pod.
    until(
        lambda: reasons_of(events(e.core, e.namespace, "train")).count(reasons.RENDEZVOUS_RESTART) == 3,
        None,
        30,
        e.explain("train"),
    )
    assert reasons_of(events(e.core, e.namespace, "train")).count(reasons.RENDEZVOUS_LOST) == 1
    counted = (
        f'rtj_restarts_total{{job_name="train",job_namespace="{e.namespace}",level="Job",'
        'reason="RendezvousLost"} 1.0'
    )
    until(lambda: counted in e.operator.metrics(), t, 30, lambda: e.operator.metrics()[-2000:])
    assert 'reason="RendezvousRestart"} 1.0' not in e.operator.metrics(), "counted once, not per symptom"
