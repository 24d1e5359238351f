"""End-to-end helpers: the operator, the chart, real trainer processes, on one of two kinds of nodes
(RTJ_E2E_NODES, rtj_local.node_kinds):

- `agent` (default): a node agent with 4 p5-shaped nodes (the kubelet stand-in; pods become process
  groups on the host network), the Helm chart (operator.replicas=0, trainer ServiceAccount in the e2e
  namespace) and the operator as a local process with the chart's RBAC;
- `kubelet` (`make test-e2e-nodes`): 3 kubelet nodes (rtj_local.kubelet_nodes); the chart installed as
  users install it (ci/kubelet-values.yaml: the operator pod from the image `make images` built) and
  every job pod a container of the trainer image.
While it runs, the cluster's other (KWOK) nodes are cordoned so that no pod of ours lands on a node
that only pretends to run it; they are uncordoned afterwards. `E2EStack.agent` is what runs the pods
(the node agent, or the kubelet nodes' driver): rows kill nodes and find a pod's processes through it.

`run_job(name, ...)` (function): creates a job with its own checkpoint volume, returns a `JobRun`
that polls it (a `Timeline`, printed as it goes: pytest shows it for a failing test), and deletes
it afterwards, waiting until every pod is gone (on the agent, pods share the host network: one job
at a time).

Jobs run on 2 cores: 2 nodes x 1 rank, a small model, paced steps.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

import pytest
from kubernetes.client.rest import ApiException
from rtj.api.status_slots import every_slot
from rtj.contract import (
    API_GROUP,
    API_VERSION,
    KIND,
    LABEL_JOB,
    NODE_FAULTS_ANNOTATION,
    PLURAL,
    QUARANTINE_ANNOTATION,
    QUARANTINE_TAINT_KEY,
    NodeFault,
    Quarantine,
    parse_node_faults,
    parse_quarantine,
)
from rtj_local import node_kinds
from rtj_local.cluster import LocalCluster
from rtj_local.images import TRAINER_UID
from rtj_local.nodes import schedulable
from rtj_local.procs import ProcInfo
from rtj_local.rawapi import MERGE, RawApi
from rtj_local.timeline import Snapshot, Timeline
from rtj_local.train_log import StepsLost, fault_times, job_train_logs, steps_lost, train_log_env
from rtj_local.wait import wait_for
from rtj_trainer.checkpoint_format import committed_steps

NAMESPACE = "rtj-e2e"
#: A release of its own, so that the integration tests' release ("rtj" in rtj-system) is untouched.
RELEASE = "rtj-e2e"
OPERATOR_NAMESPACE = "rtj-e2e-system"
AGENT_NODES = [f"e2e-p5-{i}" for i in range(4)]
JOBS_PATH = f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{NAMESPACE}/{PLURAL}"
#: Where fsdp_train writes each rank's step log (`--log-dir`; `{pod}`: the pod's name).
TRAIN_LOG_DIR = next(iter(train_log_env().values()))
#: (job, fault, level, steps lost or None) of every fault a test measured; conftest prints them.
STEPS_LOST_ROWS: list[tuple[str, str, str, StepsLost | None]] = []


@dataclass(frozen=True)
class BlameRow:
    """One fault of the blame matrix (issue 25): what the operator should do and what it did, read
    from the job's incidents (status.incidents) and the nodes' quarantine taints."""

    job: str
    fault: str
    #: the IncidentStatus.action(s) that are right (any one of them); none when no incident is
    expected_actions: tuple[str, ...]
    #: (reason, action) of every incident that began at or after the fault
    incidents: tuple[tuple[str, str], ...]
    expected_quarantined: frozenset[str]
    quarantined: frozenset[str]
    #: fault -> the operator's first incident with the expected action (its own clock, this host's)
    seconds: float | None

    @property
    def right_action(self) -> bool:
        actions = {a for _, a in self.incidents}
        return bool(actions & set(self.expected_actions)) if self.expected_actions else not actions

    @property
    def false_quarantines(self) -> frozenset[str]:
        return self.quarantined - self.expected_quarantined

    @property
    def missed_quarantines(self) -> frozenset[str]:
        return self.expected_quarantined - self.quarantined


#: Every fault a test classed through JobRun.blame; conftest prints the matrix and its totals.
BLAME_ROWS: list[BlameRow] = []


class PodRunner(Protocol):
    """What runs the pods: rtj_local.node_agent.NodeAgent or rtj_local.kubelet_nodes.KubeletNodes."""

    def kill_node(self, name: str) -> list[str]: ...
    def is_dead(self, name: str) -> bool: ...
    def pod_processes(self, namespace: str, name: str) -> list[ProcInfo]: ...


class OperatorLog(Protocol):
    """rtj_local.stack.OperatorProcess (a local process) or OperatorPod (the chart's pod)."""

    def log_tail(self, lines: int = 60) -> str: ...


@dataclass
class E2EStack:
    #: rtj_local.node_kinds.AGENT or KUBELET
    kind: str
    cluster: LocalCluster
    raw: RawApi
    agent: PodRunner
    operator: OperatorLog
    run_dir: Path
    #: the nodes jobs run on (selected by `node_selector`)
    nodes: list[str]
    node_selector: dict[str, str]
    trainer_image: str


#: Rows whose behaviour only a kubelet has: pulling images, enforcing limits, restarting a pod in place.
only_on_kubelet_nodes = pytest.mark.skipif(
    node_kinds.e2e_nodes(os.environ) != node_kinds.KUBELET,
    reason="needs a kubelet: make test-e2e-nodes (the node agent pulls no image, enforces no limit, "
    "restarts no pod in place)",
)


#: Steps of a job whose fault must strike mid-run, after a checkpoint status shows: status shows
#: progress up to RTJ_PROGRESS_REFRESH_SECONDS (5 s, ~25 steps at 0.2 s) late, so the job keeps
#: well over that many steps after it.
FAULT_MID_RUN_STEPS = 100


def set_unschedulable(raw: RawApi, names: list[str], value: bool) -> None:
    for name in names:
        with contextlib.suppress(ApiException):
            raw.request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"unschedulable": value or None}}, MERGE)


def nodes_schedulable(raw: RawApi, names: list[str]) -> bool:
    return all(schedulable(raw.get(f"/api/v1/nodes/{name}")) for name in names)


#: Each pod's resources (spec.resources); a row may override some.
POD_RESOURCES = {"efaPerNode": 0, "cpu": "1", "memory": "2Gi", "sharedMemorySize": "256Mi"}


#: Every job's ranks: one torch thread each. torchrun sets this only for several ranks per pod; a
#: pod's one rank would take a thread per core of the host, which here is every node's 2 cores:
#: two pods' ranks then spin on the same cores (torchtitan's CPU debug model: 85-116 tokens/s on
#: two threads per rank against 2,100 on one, two ranks on this machine). A GPU node runs one pod.
RANK_ENV = {"OMP_NUM_THREADS": "1"}


def job_manifest(
    name: str,
    claim: str,
    *,
    image: str,
    node_selector: dict[str, str],
    nodes: int = 2,
    steps: int = 60,
    interval: int = 10,
    min_step_time: float = 0.2,
    faults: str = "",
    env: dict[str, str] | None = None,
    fault_tolerance: dict[str, Any] | None = None,
    checkpoint: dict[str, Any] | None = None,
    resources: dict[str, Any] | None = None,
    placement: dict[str, Any] | None = None,
) -> dict[str, Any]:
    ft = {
        "heartbeatIntervalSeconds": 1,
        "heartbeatTimeoutSeconds": 12,
        "startupTimeoutSeconds": 90,
        "rankHangTimeoutSeconds": 20,
        "inProcessRestart": {"softTimeoutSeconds": 5, "hardTimeoutSeconds": 10},
        "maxInJobRestarts": 2,
        "maxPodReschedules": 2,
        **(fault_tolerance or {}),
    }
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "image": image,
            "nodes": nodes,
            "gpusPerNode": 0,
            "procsPerNode": 1,
            "resources": {**POD_RESOURCES, **(resources or {})},
            "command": ["python", "-m", "rtj_trainer.examples.fsdp_train"],
            # The ranks' step logs (on the checkpoint volume): steps lost per fault (rtj_local.train_log);
            # faults from the trainer's own hook. Options, not env: RTJ_* env is the runtime's, the
            # API server refuses it in a spec (issue 25).
            "args": [
                *("--steps", str(steps), "--dim", "64", "--min-step-time", str(min_step_time)),
                *("--log-dir", TRAIN_LOG_DIR),
                *(("--fault-inject", faults) if faults else ()),
            ],
            "env": [{"name": k, "value": v} for k, v in {**RANK_ENV, **(env or {})}.items()],
            "placement": {"nodeSelector": node_selector, **(placement or {})},
            "checkpoint": {
                "pvc": {"claimName": claim},
                "intervalSteps": interval,
                "keep": 2,
                **(checkpoint or {}),
            },
            "faultTolerance": ft,
        },
    }


@dataclass
class JobRun:
    """A job under test: polls its Timeline (printed as it goes) and answers questions about it."""

    stack: E2EStack
    name: str
    checkpoint_dir: Path
    timeline: Timeline
    lines: list[str] = field(default_factory=list)
    #: number of Events seen by each poll (index as in `history`)
    events_at: list[int] = field(default_factory=list)
    #: wall time at which each poll had read everything it holds (index as in `history`)
    read_by: list[float] = field(default_factory=list)

    @property
    def raw(self) -> RawApi:
        return self.stack.raw

    def poll(self) -> Snapshot:
        for line in self.timeline.poll():
            print(line, flush=True)
            self.lines.append(line)
        self.events_at.append(len(self.timeline.events))
        self.read_by.append(time.time())
        return self.timeline.history[-1]

    def wait(self, predicate: Callable[[Snapshot], Any], timeout: float, what: str) -> Snapshot:
        """Polls until `predicate(snapshot)` holds; fails on a Failed job unless that is awaited."""

        def check() -> Snapshot | None:
            snap = self.poll()
            if predicate(snap):
                return snap
            return None

        return wait_for(check, timeout=timeout, interval=1.0, message=lambda: f"{what}\n{self.explain()}")

    def explain(self) -> str:
        return "\n".join(
            [
                "--- timeline (last 40 lines)",
                *self.lines[-40:],
                "--- operator log (tail)",
                self.stack.operator.log_tail(30),
            ]
        )

    # --- observations ------------------------------------------------------------------------------
    @property
    def history(self) -> list[Snapshot]:
        return self.timeline.history

    def worker_pods(self, snap: Snapshot | None = None) -> dict[str, str]:
        """Worker pod name -> uid (the rendezvous pod excluded)."""
        snap = snap or self.history[-1]
        return {n: p["uid"] for n, p in snap.pods.items() if not n.endswith("-rdzv")}

    def event_reasons(self) -> set[str]:
        return {ev.get("reason", "") for ev in self.timeline.events}

    def events_about(self, word: str) -> list[str]:
        """ "reason: message" of the Events whose reason or message names `word`."""
        texts = [f"{ev.get('reason', '')}: {ev.get('message', '')}" for ev in self.timeline.events]
        return [t for t in texts if word in t]

    def condition_reasons(self) -> set[tuple[str, str]]:
        """(type, reason) of every condition state seen."""
        return {
            (c.get("type", ""), c.get("reason", ""))
            for snap in self.history
            for c in snap.status.get("conditions") or []
        }

    def status_checkpoint_steps(self) -> list[int]:
        return [s.checkpoint_step for s in self.history if s.checkpoint_step is not None]

    def committed_on_disk(self) -> list[int]:
        return committed_steps(str(self.checkpoint_dir))

    def assert_checkpoints_never_lost_or_backwards(self) -> None:
        """The job's committed checkpoint step never decreases, and the newest one it reported is on
        the volume at the end, or a newer one is (keep-last-k rotates older ones away; a job that
        failed stops reporting while its stopping pods still commit their graceful saves)."""
        steps = self.status_checkpoint_steps()
        assert steps, "no committed checkpoint was ever reported"
        assert all(a <= b for a, b in itertools.pairwise(steps)), f"went backwards: {steps}"
        on_disk = self.committed_on_disk()
        assert max(steps) in on_disk or max(on_disk, default=-1) > max(steps), (
            f"last reported checkpoint {max(steps)} not on disk {on_disk}"
        )
        per_pod: dict[str, list[int]] = {}
        for snap in self.history:
            for pod, hb in snap.leases.items():
                if hb.get("checkpoint") is not None:
                    per_pod.setdefault(pod, []).append(hb["checkpoint"])
        for pod, seen in per_pod.items():
            assert all(a <= b for a, b in itertools.pairwise(seen)), f"{pod}: {seen}"

    def window_polls(self, key: str) -> tuple[int, int]:
        """The polls (indices in `history`) that bound what fault `key` caused: the last one read
        before it fired and the last one read before the next fault fired (or the end). Fault times
        are the ranks' own (their step logs, this host's clock): the next fault's restarts can never
        fall into this window, whenever a poll happens to notice it."""
        fired = fault_times(job_train_logs(self.checkpoint_dir, self.name))
        at = fired[key]
        later = sorted(t for t in fired.values() if t > at)

        def last_read_before(t: float) -> int:
            return max((i for i, read in enumerate(self.read_by) if read < t), default=0)

        start = last_read_before(at)
        return start, last_read_before(later[0]) if later else len(self.history) - 1

    def window(self, key: str) -> tuple[dict[str, int], set[str]]:
        """What fault `key` caused (see window_polls): the restart counters' increase and the Event
        reasons."""
        start, end = self.window_polls(key)
        before, after = self.history[start].restarts, self.history[end].restarts
        delta = {k: after[k] - before[k] for k in after}
        events = self.timeline.events[self.events_at[start] : self.events_at[end]]
        return delta, {ev.get("reason", "") for ev in events}

    def pod_restarts_in_window(self, key: str) -> int:
        """The soft restarts the job's pods made in fault `key`'s window, each pod's own (status
        nodeSlots[].inProcessRestarts + inJobRestarts: every restart, echoes included; a pod
        replaced in the window would start again from 0)."""
        start, end = self.window_polls(key)

        def per_slot(snap: Snapshot) -> dict[int, int]:
            return {
                s.get("slot", -1): int(s.get("inProcessRestarts", 0)) + int(s.get("inJobRestarts", 0))
                for s in every_slot(snap.status)
            }

        before, after = per_slot(self.history[start]), per_slot(self.history[end])
        return sum(n - before.get(slot, 0) for slot, n in after.items())

    def steps_lost(self, fault: str, level: str, at: float | None = None) -> StepsLost | None:
        """What a fault cost, from the ranks' step logs: an injected fault by its key
        (`<kind>-<rank>-<step>`, timed by its rank's log line), an outside one named `fault` and
        timed by `at` (wall time). Recorded for the session's summary of steps lost per fault."""
        logs = job_train_logs(self.checkpoint_dir, self.name)
        when = fault_times(logs).get(fault) if at is None else at
        cost = steps_lost(logs, when) if when is not None else None
        STEPS_LOST_ROWS.append((self.name, fault, level, cost))
        return cost

    def incidents(self) -> list[tuple[dict[str, Any], float]]:
        """Every incident any poll saw (status keeps the last few), oldest first, each with the wall
        time of the first poll that showed it (when a user reading the status would have seen it)."""
        seen: dict[int, tuple[dict[str, Any], float]] = {}
        for snap, read in zip(self.history, self.read_by, strict=True):
            for inc in snap.status.get("incidents") or []:
                seq = int(inc["seq"])
                seen[seq] = (inc, seen[seq][1] if seq in seen else read)
        return [seen[k] for k in sorted(seen)]

    def blame(
        self,
        fault: str,
        at: float,
        expected: str | tuple[str, ...],
        quarantined: Iterable[str] = (),
        until: float | None = None,
    ) -> BlameRow:
        """Classes fault `fault` (wall time `at`) for the blame matrix: the incidents that began
        from it until `until` (the next fault; default: no end), the stack's nodes quarantined now,
        and the seconds until the status showed an incident whose action is one of `expected` (to
        the poll, about a second). An incident's time is its evidence's, which may be stamped in
        whole seconds (a deletion, a Node condition): one up to a second before `at` is this fault's.
        Recorded for the session's summary; the caller asserts on it."""
        expected_actions = (expected,) if isinstance(expected, str) else expected
        end = until if until is not None else float("inf")
        later = [
            (inc, shown)
            for inc, shown in self.incidents()
            if at - 1.0 <= parse_time(inc["time"]).timestamp() < end
        ]
        first = next((shown for inc, shown in later if inc.get("action") in expected_actions), None)
        row = BlameRow(
            job=self.name,
            fault=fault,
            expected_actions=expected_actions,
            incidents=tuple((inc.get("reason", ""), inc.get("action", "")) for inc, _ in later),
            expected_quarantined=frozenset(quarantined),
            quarantined=frozenset(n for n in self.stack.nodes if node_record(self.raw, n).taint),
            seconds=max(0.0, first - at) if first is not None else None,
        )
        BLAME_ROWS.append(row)
        return row

    def fault_time(self, key: str) -> float:
        """Wall time at which injected fault `key` fired (its rank's step log)."""
        return fault_times(job_train_logs(self.checkpoint_dir, self.name))[key]

    def next_fault_time(self, key: str) -> float | None:
        """Wall time of the injected fault after `key`, if any."""
        fired = fault_times(job_train_logs(self.checkpoint_dir, self.name))
        return min((t for t in fired.values() if t > fired[key]), default=None)

    def fault_fired(self, key: str) -> bool:
        """The trainer's fault hook leaves a marker `.fault-<kind>-<rank>-<step>` per fault (once per
        job) in the checkpoint dir."""
        return (self.checkpoint_dir / f".fault-{key}").exists()


def parse_time(text: str) -> datetime:
    """An RFC 3339 time as the API server writes it (a trailing Z)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def operator_leader(raw: RawApi) -> tuple[str, set[str]]:
    """The chart's operator pod holding the leader Lease (identity `<pod name>_<random>`), and every
    operator pod of the release."""
    selector = f"app.kubernetes.io/instance={RELEASE}"
    pods = raw.request("GET", f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/pods", labelSelector=selector)
    names = {p["metadata"]["name"] for p in pods["items"] if not p["metadata"].get("deletionTimestamp")}
    leases = raw.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/{OPERATOR_NAMESPACE}/leases")
    holders = {((x.get("spec") or {}).get("holderIdentity") or "").rsplit("_", 1)[0] for x in leases["items"]}
    leaders = holders & names
    return (next(iter(leaders)) if len(leaders) == 1 else ""), names


def succeeded(snap: Snapshot) -> bool:
    return snap.is_true("Succeeded")


def failed(snap: Snapshot) -> bool:
    return snap.is_true("Failed")


def all_training(snap: Snapshot) -> bool:
    slots = every_slot(snap.status)
    return bool(slots) and all(
        snap.leases.get(s.get("pod", ""), {}).get("state") == "Training" for s in slots
    )


class Jobs:
    """Creates jobs, each with its own checkpoint PV/PVC, and removes them with everything they made."""

    def __init__(self, stack: E2EStack) -> None:
        self.stack = stack
        self.created: list[tuple[str, str, str]] = []  # (job, pv, pvc)

    def start(self, name: str, **kwargs: Any) -> JobRun:
        raw = self.stack.raw
        pv, pvc = f"{NAMESPACE}-{name}-ckpt", f"{name}-ckpt"
        ckpt_dir = self.stack.run_dir / "checkpoints" / name
        # Writable by the trainer image's user: a kubelet creates a missing hostPath as root, 0755.
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        os.chown(ckpt_dir, TRAINER_UID, TRAINER_UID)
        raw.request(
            "POST",
            "/api/v1/persistentvolumes",
            {
                "metadata": {"name": pv},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteMany"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "",
                    "hostPath": {"path": str(ckpt_dir), "type": "DirectoryOrCreate"},
                },
            },
        )
        raw.request(
            "POST",
            f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims",
            {
                "metadata": {"name": pvc},
                "spec": {
                    "accessModes": ["ReadWriteMany"],
                    "storageClassName": "",
                    "volumeName": pv,
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        )
        self.created.append((name, pv, pvc))
        kwargs.setdefault("image", self.stack.trainer_image)
        manifest = job_manifest(name, pvc, node_selector=self.stack.node_selector, **kwargs)
        raw.request("POST", JOBS_PATH, manifest)
        return JobRun(self.stack, name, ckpt_dir, Timeline(raw, NAMESPACE, name, progress_every=15.0))

    def cleanup(self) -> None:
        raw = self.stack.raw
        for name, pv, pvc in self.created:
            with contextlib.suppress(ApiException):
                raw.request("DELETE", f"{JOBS_PATH}/{name}", propagationPolicy="Foreground")

            def gone(name: str = name) -> bool:
                pods = raw.request(
                    "GET", f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector=f"{LABEL_JOB}={name}"
                )
                # Pods on a node that died cannot finish terminating (no kubelet): force-delete them,
                # as an admin does (`kubectl delete pod --force`).
                for pod in pods["items"]:
                    if pod["metadata"].get("deletionTimestamp") and self.stack.agent.is_dead(
                        pod["spec"].get("nodeName", "")
                    ):
                        with contextlib.suppress(ApiException):
                            path = f"/api/v1/namespaces/{NAMESPACE}/pods/{pod['metadata']['name']}"
                            raw.request("DELETE", path, {"gracePeriodSeconds": 0})
                return raw.get(f"{JOBS_PATH}/{name}") is None and not pods["items"]

            wait_for(gone, timeout=90, interval=1.0, message=f"job {name} and its pods gone")
            with contextlib.suppress(ApiException):
                raw.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims/{pvc}")
            with contextlib.suppress(ApiException):
                raw.request("DELETE", f"/api/v1/persistentvolumes/{pv}")
        self.created.clear()
        # A quarantine is the node's and outlives the job (issue 25), and so does the node's record
        # of pod faults (another job's fault there within the hour would quarantine it): tests start
        # from healthy nodes with clean records, as an admin leaves them after repairing them.
        for node in self.stack.nodes:
            lift_quarantine(raw, node)


def lift_quarantine(raw: RawApi, node: str) -> None:
    """What an admin does after repairing `node`: its quarantine taint lifted, its quarantine record and
    its record of pod faults removed (nothing to do when it has none)."""
    obj = raw.get(f"/api/v1/nodes/{node}")
    if obj is None:
        return
    taints = obj.get("spec", {}).get("taints") or []
    kept = [t for t in taints if t["key"] != QUARANTINE_TAINT_KEY]
    annotations = obj["metadata"].get("annotations") or {}
    ours = [a for a in (QUARANTINE_ANNOTATION, NODE_FAULTS_ANNOTATION) if a in annotations]
    if len(kept) != len(taints) or ours:
        patch = {"metadata": {"annotations": dict.fromkeys(ours)}, "spec": {"taints": kept}}
        raw.request("PATCH", f"/api/v1/nodes/{node}", patch, MERGE)


@dataclass(frozen=True)
class NodeRecord:
    """What the operator wrote on a node: its quarantine (taint value = the evidence's reason, "" when
    not quarantined; the QUARANTINE_ANNOTATION record) and its recent pod faults."""

    taint: str
    quarantine: Quarantine | None
    faults: tuple[NodeFault, ...]


def node_record(raw: RawApi, node: str) -> NodeRecord:
    obj = raw.get(f"/api/v1/nodes/{node}") or {}
    taint = next(
        (t for t in obj.get("spec", {}).get("taints") or [] if t["key"] == QUARANTINE_TAINT_KEY), None
    )
    annotations = obj.get("metadata", {}).get("annotations") or {}
    return NodeRecord(
        taint=(taint.get("value") or "?") if taint is not None else "",
        quarantine=parse_quarantine(annotations.get(QUARANTINE_ANNOTATION)),
        faults=parse_node_faults(annotations.get(NODE_FAULTS_ANNOTATION)),
    )
