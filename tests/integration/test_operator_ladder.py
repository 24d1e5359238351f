"""The escalation ladder end to end against the real API server: the operator runs as a process,
the test plays the trainers (Leases through rtj.contract) and the kubelet (pod exit codes)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from operator_harness import (
    OperatorEnv,
    end_pod,
    events,
    is_true,
    make_node_not_ready,
    reasons_of,
    running,
    until,
)
from rtj import contract, reasons

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def restarts(e: OperatorEnv, job: str) -> dict[str, int]:
    return e.status(job).get("restarts") or {}


def has_taint(e: OperatorEnv, node: str, job: str) -> bool:
    taints = e.core.read_node(node).spec.taints or []
    return any(
        t.key == contract.QUARANTINE_TAINT_KEY and t.value == job and t.effect == "NoSchedule" for t in taints
    )


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
        severity=contract.FaultSeverity.SOFT, reason="RankException", message="boom", time=datetime.now(UTC)
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
    assert restarts(e, "train") == {"inProcess": 2, "inJob": 1, "podReschedules": 0}
    evs = reasons_of(events(e.core, e.namespace, "train"))
    assert evs.count(reasons.IN_PROCESS_RESTART) == 1 and evs.count(reasons.IN_JOB_RESTART) == 1
    assert reasons.RECOVERED in evs
    # Metrics follow the status write and the Events in the same pass: wait for them, not race them.
    counted = (
        f'rtj_restarts_total{{job_name="train",job_namespace="{e.namespace}",level="InProcess",'
        f'reason="InProcessRestart"}} 2.0'
    )
    recovered = 'rtj_recovery_seconds_count{level="InProcess"} 1.0'
    until(
        lambda: counted in (text := e.operator.metrics()) and recovered in text,
        t,
        30,
        lambda: e.operator.metrics()[-2000:],
    )


def test_silence_replaces_one_pod_and_quarantines_its_node(
    env: Callable[..., OperatorEnv], kubectl: Any
) -> None:
    e = env(nodes=3)
    e.create_job("train", 2)
    t = e.trainers("train")
    until(running(e, "train", 2), t, 90, e.explain("train"))
    before = e.workers("train")
    victim, survivor = before[1], before[0]
    bad_node = victim.spec.node_name

    t.silent.add(victim.metadata.name)  # the pod hangs: no more heartbeats

    def replaced() -> bool:
        pod = e.workers("train").get(1)
        return pod is not None and pod.metadata.name == "train-n1-a1" and bool(pod.spec.node_name)

    until(replaced, t, 60, e.explain("train"))
    new = e.workers("train")
    assert new[1].spec.node_name != bad_node, "replacement kept off the quarantined node"
    assert new[0].metadata.uid == survivor.metadata.uid, "the other pod keeps running"
    assert has_taint(e, bad_node, "train")
    st = e.status("train")
    assert st["restarts"]["podReschedules"] == 1 and st["quarantinedNodes"] == [bad_node]
    slot1 = next(s for s in st["nodeSlots"] if s["slot"] == 1)
    assert slot1["attempt"] == 1 and slot1["lastFaultReason"] == reasons.HEARTBEAT_TIMEOUT
    until(running(e, "train", 2), t, 60, e.explain("train"))
    evs = reasons_of(events(e.core, e.namespace, "train"))
    assert (
        evs.count(reasons.HEARTBEAT_TIMEOUT) == 1
        and reasons.NODE_QUARANTINED in evs
        and reasons.RECOVERED in evs
    )
    recovered = 'rtj_recovery_seconds_count{level="Pod"} 1.0'
    until(lambda: recovered in e.operator.metrics(), t, 30, lambda: e.operator.metrics()[-2000:])
    # What a user sees (shown with pytest -rP).
    print(kubectl("get", "rtj", "-n", e.namespace, "-o", "wide").stdout)
    print(kubectl("get", "pods", "-n", e.namespace, "-o", "wide").stdout)
    print(kubectl("describe", "rtj", "train", "-n", e.namespace).stdout)


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
    assert e.status("train")["nodeSlots"][0]["lastFaultReason"] == reasons.LAUNCHER_BUDGET_EXHAUSTED
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
    # The rendezvous pod counts as one pod-level recovery, plus the worker that shared its node.
    until(
        lambda: e.status("train")["restarts"]["podReschedules"] == 1 + len(workers_on_node),
        t,
        30,
        e.explain("train"),
    )


def test_deleted_pod_is_replaced_once(env: Callable[..., OperatorEnv]) -> None:
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
    assert e.status("train")["restarts"]["podReschedules"] == 1
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
