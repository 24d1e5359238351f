"""Faults in our own parts lose nothing: the real operator process on the real API server, with the
trainers' heartbeats written as the trainer writes them (rtj.contract) and KWOK's fake p5 nodes.

- Garbage heartbeat Leases for a running job's pods: no pod replaced, the operator stays up and logs
  no traceback.
- Crash-only: the operator is SIGKILLed at random points while 50 jobs churn through injected faults
  (pod deleted, heartbeat stopped, exit 70, exit 93, node NotReady, soft restarts) and restarted each
  time. Watched all along: never two live pods in one slot. At the end: every job in the state its
  fault implies, restart counters equal to the injected faults, at most one Event per transition,
  nothing left behind after deletion (pods, Services, Leases, PVCs, PVs, taints), and neither the
  admin token nor the operator's token in its log or in any Event.
- Control-plane outage: etcd and kube-apiserver stopped past the heartbeat timeout and restarted; a
  pod that went silent during the outage is replaced exactly once after it, the others not at all,
  counters and Events exact, the operator still up.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from integration.operator_harness import (
    Trainers,
    events,
    job_manifest,
    make_node_not_ready,
    make_nodes,
    until,
)
from kubernetes import client
from reliability.harness import Fleet, Script, SlotWatch, leaks, quarantine_taints
from rtj import contract, reasons
from rtj.api.status_slots import every_slot
from rtj.contract import micro_time
from rtj_local.cluster import LocalCluster
from rtj_local.stack import OperatorProcess
from rtj_local.wait import wait_for

pytestmark = pytest.mark.integration

CHURN_JOBS = int(os.environ.get("RTJ_CHURN_JOBS", "50"))
KILLS = os.environ.get("RTJ_CHURN_KILLS", "1") != "0"
SEED = int(os.environ.get("RTJ_CHURN_SEED", str(random.SystemRandom().randrange(10**6))))
#: Pods small enough for many jobs to share KWOK's p5 nodes (GPU/EFA requests would allow one per node).
SMALL = {"gpusPerNode": 0, "resources": {"efaPerNode": 0, "cpu": "1", "memory": "1Gi"}}
#: Deadlines loose enough that the test's own heartbeat writer (one process for every pod of 50 jobs
#: on 2 busy cores) never misses one: a spurious HeartbeatTimeout would be the harness's fault.
FT = {
    "heartbeatIntervalSeconds": 5,
    "heartbeatTimeoutSeconds": 45,
    "startupTimeoutSeconds": 120,
    "maxPodReschedules": 3,
}


def create(kube: client.ApiClient, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    return client.CustomObjectsApi(kube).create_namespaced_custom_object(
        contract.API_GROUP, contract.API_VERSION, namespace, contract.PLURAL, body, field_validation="Strict"
    )


def delete_job(kube: client.ApiClient, namespace: str, name: str) -> None:
    client.CustomObjectsApi(kube).delete_namespaced_custom_object(
        contract.API_GROUP, contract.API_VERSION, namespace, contract.PLURAL, name
    )


class Nodes:
    """KWOK p5 nodes of one test (deleted afterwards), in node groups of its own."""

    def __init__(self, kube: client.ApiClient) -> None:
        self.core = client.CoreV1Api(kube)
        self.names: list[str] = []
        self.prefix = f"rel{uuid.uuid4().hex[:6]}"

    def group(self, suffix: str, count: int) -> str:
        group = f"{self.prefix}-{suffix}"
        self.names += make_nodes(self.core, group, count)
        return group

    def delete(self) -> None:
        for name in self.names:
            try:
                self.core.delete_node(name)
            except client.ApiException as exc:
                if exc.status != 404:
                    raise


@pytest.fixture
def nodes(kube: client.ApiClient) -> Iterator[Nodes]:
    made = Nodes(kube)
    try:
        yield made
    finally:
        made.delete()


@pytest.fixture
def operator(
    kubeconfig: Path, rel_namespace: str, crd: str, tmp_path: Path, kube: client.ApiClient
) -> Iterator[OperatorProcess]:
    op = OperatorProcess.for_namespace(
        kubeconfig, rel_namespace, tmp_path / "operator.log", RTJ_RECONCILE_INTERVAL_SECONDS="1.0"
    )
    op.start()
    try:
        yield op
    finally:
        # Jobs left behind keep their finalizer: let the operator remove them, then stop it.
        custom = client.CustomObjectsApi(kube)
        for job in custom.list_namespaced_custom_object(
            contract.API_GROUP, contract.API_VERSION, rel_namespace, contract.PLURAL
        )["items"]:
            custom.patch_namespaced_custom_object(
                contract.API_GROUP, contract.API_VERSION, rel_namespace, contract.PLURAL,
                job["metadata"]["name"], {"metadata": {"finalizers": None}},
            )  # fmt: skip
        op.stop()


def passes(op: OperatorProcess) -> float:
    match = re.search(r"^rtj_reconcile_duration_seconds_count (\S+)$", op.metrics(), re.M)
    return float(match.group(1)) if match else 0.0


def tracebacks(op: OperatorProcess) -> list[str]:
    text = op.log_path.read_text(errors="replace")
    return [line for line in text.splitlines() if "Traceback" in line or " ERROR " in line]


def worker_uids(core: client.CoreV1Api, namespace: str, job: str) -> dict[str, str]:
    pods = core.list_namespaced_pod(
        namespace, label_selector=f"{contract.LABEL_JOB}={job},{contract.LABEL_ROLE}={contract.ROLE_WORKER}"
    ).items
    return {p.metadata.name: p.metadata.uid for p in pods if not p.metadata.deletion_timestamp}


# --- 2. garbage Leases -------------------------------------------------------------------------------------
GARBAGE = [
    "{not json",
    "",
    "null",
    "[]",
    '{"state": 5}',
    '{"state": "Training", "inProcessRestarts": -1}',
    '{"state": "Training", "inJobRestarts": 1e400}',
    '{"state": "Training", "step": 99999999999999999999999999}',
    '{"state": "Training", "fault": {"severity": "Apocalyptic"}}',
    json.dumps({"state": "Training", "fault": {"message": "x" * 100_000}}),
    "x" * 200_000,
]


def test_garbage_leases_never_replace_pods_or_crash_the_operator(
    kube: client.ApiClient, rel_namespace: str, operator: OperatorProcess, nodes: Nodes
) -> None:
    core, coord = client.CoreV1Api(kube), client.CoordinationV1Api(kube)
    group = nodes.group("garbage", 2)
    create(kube, rel_namespace, job_manifest("garbage", group, 2, faultTolerance=FT))
    trainers = Trainers(core, coord, rel_namespace, "garbage")

    def status() -> dict[str, Any]:
        return (
            client.CustomObjectsApi(kube)
            .get_namespaced_custom_object(
                contract.API_GROUP, contract.API_VERSION, rel_namespace, contract.PLURAL, "garbage"
            )
            .get("status")
            or {}
        )

    until(lambda: status().get("nodesReady") == 2, trainers, 90, lambda: f"{status()}\n{operator.log_tail()}")
    before = worker_uids(core, rel_namespace, "garbage")
    rounds = 0
    # Each garbage value on every pod's Lease, with a fresh renewTime, none, or one far in the
    # future; each state stays until the operator has run two passes over it.
    for value in GARBAGE:
        for renew in ("now", None, "2999-01-01T00:00:00.000000Z"):
            for pod in before:
                when = micro_time(datetime.now(UTC)) if renew == "now" else renew
                body = {
                    "metadata": {"annotations": {contract.HEARTBEAT_ANNOTATION: value}},
                    "spec": {"renewTime": when},
                }
                coord.patch_namespaced_lease(pod, rel_namespace, body)
                rounds += 1
            seen = passes(operator)
            wait_for(
                lambda seen=seen: passes(operator) >= seen + 2, timeout=30, message="two operator passes"
            )
    until(lambda: status().get("nodesReady") == 2, trainers, 60, lambda: f"{status()}\n{operator.log_tail()}")
    assert worker_uids(core, rel_namespace, "garbage") == before, "a pod was replaced"
    st = status()
    assert st["restarts"]["podReschedules"] == 0, st
    assert operator.proc is not None and operator.proc.poll() is None, "operator died"
    assert tracebacks(operator) == [], operator.log_tail()
    print(f"garbage Lease writes: {rounds} ({len(GARBAGE)} values x 3 renewTimes x 2 pods)")


# --- 3. crash-only: SIGKILL during churn ---------------------------------------------------------
#: fault -> (end state, (in-process, in-job, pod reschedules))
SCENARIOS: dict[str, tuple[str, tuple[int, int, int]]] = {
    "none": ("Succeeded", (0, 0, 0)),
    "soft": ("Succeeded", (2, 1, 0)),
    "delete": ("Succeeded", (0, 0, 1)),
    "silence": ("Succeeded", (0, 0, 1)),
    "exit70": ("Succeeded", (0, 0, 1)),
    "exit93": ("Failed", (0, 0, 0)),
    "node": ("Succeeded", (0, 0, 1)),
}
FAULT_EVENT = {
    "delete": reasons.POD_DELETED,
    "silence": reasons.HEARTBEAT_TIMEOUT,
    "exit70": reasons.LAUNCHER_BUDGET_EXHAUSTED,
    "node": reasons.NODE_NOT_READY,
}


@pytest.mark.timeout(900)
def test_operator_sigkilled_during_churn_loses_and_doubles_nothing(
    kube: client.ApiClient,
    rel_namespace: str,
    operator: OperatorProcess,
    nodes: Nodes,
    cluster: LocalCluster,
    kubeconfig: Path,
) -> None:
    rng = random.Random(SEED)
    print(f"seed {SEED} (RTJ_CHURN_SEED to replay)")
    core = client.CoreV1Api(kube)
    shared = nodes.group("shared", 6)
    kinds = list(SCENARIOS)
    faulted: set[str] = set()  # the nodes made NotReady: evidence against them
    fleet = Fleet(
        kube,
        rel_namespace,
        on_node_fault=lambda node: (faulted.add(node), make_node_not_ready(core, node)),
        heartbeat_timeout=FT["heartbeatTimeoutSeconds"],
    )
    for i in range(CHURN_JOBS):
        fault = kinds[i % len(kinds)]
        name = f"churn-{i}-{fault}"
        # A node fault hits every pod on the node: such jobs get node groups of their own.
        # Quarantine taints keep every job off a node: only those jobs quarantine.
        group = nodes.group(f"nf{i}", 3) if fault == "node" else shared
        ft = {**FT, "quarantineFaultyNodes": fault == "node"}
        state, counts = SCENARIOS[fault]
        fleet.scripts[name] = Script(name, fault, state, counts, fault_delay=rng.uniform(0, 20))
        create(kube, rel_namespace, job_manifest(name, group, 2, faultTolerance=ft, **SMALL))
    watcher = SlotWatch(kube, rel_namespace).start()
    kills = 0
    next_kill = time.monotonic() + rng.uniform(3, 10)
    t0 = time.monotonic()

    def progress() -> str:
        steps = Counter(s.step for s in fleet.scripts.values())
        jobs = fleet.jobs()
        pods = fleet.pods()

        def describe(s: Script) -> str:
            st = (jobs.get(s.name) or {}).get("status") or {}
            mine = [
                f"{p.metadata.name}:{p.status.phase}:{p.spec.node_name}:{bool(p.metadata.deletion_timestamp)}"
                for p in pods
                if p.metadata.labels.get(contract.LABEL_JOB) == s.name
            ]
            slots = [(x.get("slot"), x.get("state"), x.get("attempt")) for x in every_slot(st)]
            summary = (
                f"{st.get('state')}/{st.get('reason')} ready={st.get('nodesReady')} {st.get('restarts')}"
            )
            return f"{s.name}: {s.step} {s.log} | {summary} {slots} | {mine}"

        stuck = [describe(s) for s in fleet.scripts.values() if s.step != "done"][:10]
        return f"{dict(steps)} after {kills} kills\n" + "\n".join(stuck) + f"\n{operator.log_tail(30)}"

    try:
        deadline = t0 + 600
        while not fleet.tick():
            assert time.monotonic() < deadline, progress()
            if KILLS and time.monotonic() >= next_kill:
                operator.stop(kill=True)
                kills += 1
                operator.start(tick=fleet.tick)
                next_kill = time.monotonic() + rng.uniform(3, 10)
        churn_seconds = time.monotonic() - t0
        # Converged: each job in its state, counters equal to what was injected, one Event each.
        wrong = []
        for name, s in fleet.scripts.items():
            st = fleet.job(name).get("status") or {}
            r = st.get("restarts") or {}
            replaced = (r.get("podReschedules") or 0) + (r.get("disruptions") or 0)  # a delete: a disruption
            got = (r.get("inProcess"), r.get("inJob"), replaced, r.get("job"))
            i, j, k = s.expect_restarts
            lost = s.rendezvous_lost
            counted = (
                got[:2] == (i, j)
                and got[2] in range(k - s.own_fault_slack, k + 1)
                and got[3] in range(min(1, lost), lost + s.job_slack + 1)
            )
            if st.get("state") != s.expect_state or not counted:
                wrong.append(f"{name}: state {st.get('state')}/{st.get('reason')} restarts {got}; {s.log}")
            evs = Counter(e.reason for e in events(core, rel_namespace, name) if e.type == "Warning")
            if s.fault in FAULT_EVENT and evs[FAULT_EVENT[s.fault]] > 1:
                wrong.append(f"{name}: {evs[FAULT_EVENT[s.fault]]} {FAULT_EVENT[s.fault]} Events")
        assert not wrong, "\n".join(wrong) + f"\n{operator.log_tail(40)}"
        assert watcher.violations == [], watcher.violations[:10]
        # Deleted jobs leave nothing behind (the operator keeps getting killed meanwhile).
        for name in fleet.scripts:
            delete_job(kube, rel_namespace, name)
        operator.stop(kill=True)
        kills += 1
        operator.start()
        wait_for(
            lambda: not fleet.jobs(), timeout=120, message=lambda: f"jobs deleted\n{operator.log_tail()}"
        )
        # A quarantine belongs to the node, not the job: the nodes made NotReady keep theirs (the
        # review lifts it once the node is healthy for RTJ_QUARANTINE_SECONDS); no other node has one.
        healthy = [n for n in nodes.names if n not in faulted]
        left = wait_for(
            lambda: not leaks(kube, rel_namespace, healthy) or None,
            timeout=120,
            message=lambda: f"no leftovers: {leaks(kube, rel_namespace, healthy)[:20]}",
        )
        assert left
        kept = {n: quarantine_taints(core, n) for n in faulted}
        assert all(v == ["NodeNotReady"] for v in kept.values()), kept
    finally:
        watcher.stop()
        fleet.close()
    assert operator.proc is not None and operator.proc.poll() is None
    # 5. No secrets in the operator's log or in any Event.
    secrets = {"admin token": cluster.admin_token}
    op_token = _kubeconfig_token(kubeconfig)
    if op_token:
        secrets["operator token"] = op_token
    log = operator.log_path.read_text(errors="replace")
    all_events = json.dumps(
        [e.to_dict() for e in core.list_namespaced_event(rel_namespace).items], default=str
    )
    found = [f"{what} in {where}" for what, s in secrets.items() for where, text in
             (("operator log", log), ("Events", all_events)) if s in text]  # fmt: skip
    assert found == []
    figures = {
        "jobs": len(fleet.scripts),
        "faults": dict(Counter(s.fault for s in fleet.scripts.values())),
        "operator SIGKILLs survived": kills,
        "churn seconds": round(churn_seconds, 1),
        "heartbeats written": fleet.beats,
        "pod watch events checked": watcher.events,
    }
    print("CHURN FIGURES", json.dumps(figures))


def _kubeconfig_token(path: Path) -> str:
    import yaml

    cfg = yaml.safe_load(path.read_text())
    for user in cfg.get("users") or []:
        token = (user.get("user") or {}).get("token")
        if token:
            return str(token)
    return ""


# --- 4. control-plane outage ------------------------------------------------------------------------------
OUTAGE_FT = {"heartbeatIntervalSeconds": 1, "heartbeatTimeoutSeconds": 6, "startupTimeoutSeconds": 60}


@pytest.mark.timeout(300)
def test_control_plane_outage_loses_and_repeats_no_transition(
    kube: client.ApiClient, rel_namespace: str, operator: OperatorProcess, nodes: Nodes, cluster: LocalCluster
) -> None:
    """etcd and kube-apiserver stop for longer than heartbeatTimeoutSeconds. Every trainer's renewals
    fail meanwhile (nobody's fault: no pod may be replaced for it); one pod's trainer dies during the
    outage (its heartbeat never resumes): that one is replaced, once, after the outage."""
    core = client.CoreV1Api(kube)
    group = nodes.group("outage", 4)
    create(kube, rel_namespace, job_manifest("outage", group, 3, faultTolerance=OUTAGE_FT))
    trainers = Trainers(core, client.CoordinationV1Api(kube), rel_namespace, "outage")
    custom = client.CustomObjectsApi(kube)

    def status() -> dict[str, Any]:
        try:
            obj = custom.get_namespaced_custom_object(
                contract.API_GROUP, contract.API_VERSION, rel_namespace, contract.PLURAL, "outage"
            )
        except Exception:
            return {}
        return obj.get("status") or {}

    until(lambda: status().get("nodesReady") == 3, trainers, 90, lambda: f"{status()}\n{operator.log_tail()}")
    before = worker_uids(core, rel_namespace, "outage")
    victim = sorted(before)[0]
    t0 = time.monotonic()
    cluster.stop_component("kube-apiserver")
    cluster.stop_component("etcd")
    trainers.silent.add(victim)  # this trainer dies while the API is unreachable
    # The outage lasts past the heartbeat timeout (the operator keeps running, its calls failing).
    wait_for(lambda: time.monotonic() - t0 > OUTAGE_FT["heartbeatTimeoutSeconds"] + 3, timeout=30)
    cluster.start_component("etcd")
    cluster.start_component("kube-apiserver")
    outage = time.monotonic() - t0

    def replaced_once() -> bool:
        st = status()
        now = worker_uids(core, rel_namespace, "outage")
        return (
            st.get("restarts", {}).get("podReschedules") == 1 and len(now) == 3 and st.get("nodesReady") == 3
        )

    until(replaced_once, trainers, 120, lambda: f"{status()}\n{operator.log_tail()}")
    after = worker_uids(core, rel_namespace, "outage")
    assert victim not in after
    assert {k: v for k, v in before.items() if k != victim}.items() <= after.items(), (
        "only the victim is replaced"
    )
    # A few more passes change nothing: acted on once, not repeated.
    seen = passes(operator)
    until(lambda: passes(operator) >= seen + 5, trainers, 60, "five more passes")
    st = status()
    kinds = ("inProcess", "inJob", "podReschedules", "disruptions", "job")
    counts = {k: st["restarts"].get(k, 0) for k in kinds}
    assert counts == {"inProcess": 0, "inJob": 0, "podReschedules": 1, "disruptions": 0, "job": 0}, st
    warnings = Counter(e.reason for e in events(core, rel_namespace, "outage") if e.type == "Warning")
    assert warnings[reasons.HEARTBEAT_TIMEOUT] == 1, warnings
    assert operator.proc is not None and operator.proc.poll() is None
    print(f"OUTAGE FIGURES outage_seconds={outage:.1f} warnings={dict(warnings)}")
