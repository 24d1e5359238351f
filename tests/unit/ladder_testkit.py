"""Test-object builders for the ladder and builders tests (jobset style):
`make_job("j").nodes(4).obj()`, `observe("j").running(4).lease("j-n0-a0", age=40).obj()`."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from rtj import contract
from rtj.api.models import ResilientTrainingJob
from rtj.ladder import LeaseObs, NodeObs, Observed, PodObs, RecordNodeFault, TaintNode, decide

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


class JobBuilder:
    def __init__(self, name: str = "train", namespace: str = "ns") -> None:
        self._meta: dict[str, Any] = {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "generation": 1,
        }
        self._spec: dict[str, Any] = {
            "image": "trainer:1",
            "command": ["python", "train.py"],
            "nodes": 2,
            "checkpoint": {"pvc": {"claimName": "ckpt"}},
            "faultTolerance": {
                "heartbeatIntervalSeconds": 5,
                "heartbeatTimeoutSeconds": 30,
                "startupTimeoutSeconds": 120,
                "maxPodReschedules": 4,
            },
        }
        self._status: dict[str, Any] = {}

    def nodes(self, n: int) -> JobBuilder:
        self._spec["nodes"] = n
        return self

    def spares(self, k: int) -> JobBuilder:
        self._spec["hotSpares"] = k
        return self

    def ft(self, **fields: Any) -> JobBuilder:
        self._spec["faultTolerance"].update(fields)
        return self

    def labels(self, **labels: str) -> JobBuilder:
        self._meta["labels"] = {**self._meta.get("labels", {}), **labels}
        return self

    def spec(self, **fields: Any) -> JobBuilder:
        self._spec.update(fields)
        return self

    def status(self, **fields: Any) -> JobBuilder:
        self._status.update(fields)
        return self

    def obj(self) -> ResilientTrainingJob:
        return ResilientTrainingJob.model_validate(
            {
                "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
                "kind": contract.KIND,
                "metadata": dict(self._meta),
                "spec": self._spec,
                "status": self._status,
            }
        )


def make_job(name: str = "train", namespace: str = "ns") -> JobBuilder:
    return JobBuilder(name, namespace)


def hb(
    state: str = "Training",
    ip: int = 0,
    ij: int = 0,
    step: int = 0,
    ckpt: int | None = None,
    fault: dict[str, Any] | None = None,
    mem: int | None = None,
    persist: float | None = None,
    replica: int | None = None,
    reach_endpoint: str | None = None,
    reach: dict[str, Any] | None = None,
) -> contract.Heartbeat:
    data: dict[str, Any] = {"state": state, "inProcessRestarts": ip, "inJobRestarts": ij, "step": step}
    if reach_endpoint is not None:
        data["reachEndpoint"] = reach_endpoint
    if reach is not None:
        data["reach"] = reach
    if mem is not None:
        data["memorySnapshotStep"] = mem
    if persist is not None:
        data["persistSeconds"] = persist
    if replica is not None:
        data["replicaStep"] = replica
    if ckpt is not None:
        data["checkpoint"] = {"step": ckpt, "time": ago(10).isoformat()}
    if fault is not None:
        data["fault"] = fault
    return contract.Heartbeat.model_validate(data)


class ObservedBuilder:
    def __init__(self, job: str = "train") -> None:
        self.job = job
        self.pods: dict[str, PodObs] = {}
        self.leases: dict[str, LeaseObs] = {}
        self.nodes_: dict[str, NodeObs] = {}
        self.service = True
        self.refused_ = ""
        self.api_failed_at: datetime | None = None

    def node(self, name: str, ready: str = "True", **kw: Any) -> ObservedBuilder:
        self.nodes_[name] = NodeObs(name=name, ready=ready, **kw)
        return self

    def worker(
        self, slot: int, attempt: int = 0, phase: str = "Running", node: str | None = None, **kw: Any
    ) -> ObservedBuilder:
        name = kw.pop("name", contract.worker_pod_name(self.job, slot, attempt))
        node = node if node is not None else f"node-{slot}"
        if node and node not in self.nodes_:
            self.node(node)
        kw.setdefault("cause", "Initial")
        kw.setdefault("created", ago(300))
        kw.setdefault("started", ago(300))
        self.pods[name] = PodObs(
            name=name,
            uid=f"uid-{name}",
            role=contract.ROLE_WORKER,
            slot=slot,
            attempt=attempt,
            phase=phase,
            node=node,
            **kw,
        )
        return self

    def spare(
        self, index: int, attempt: int = 0, phase: str = "Running", node: str = "", **kw: Any
    ) -> ObservedBuilder:
        name = f"{self.job}-spare-{index}-a{attempt}"
        node = node or f"spare-node-{index}"
        self.node(node)
        self.pods[name] = PodObs(
            name=name,
            uid=f"uid-{name}",
            role=contract.ROLE_SPARE,
            spare_index=index,
            attempt=attempt,
            phase=phase,
            node=node,
            created=ago(300),
            started=ago(300),
            cause="HotSpare",
            **kw,
        )
        return self

    def rdzv(
        self, uid: str = "rdzv-1", phase: str = "Running", node: str = "", deleting: bool = False
    ) -> ObservedBuilder:
        name = f"{self.job}-rdzv"
        self.pods[name] = PodObs(
            name=name, uid=uid, role=contract.ROLE_RENDEZVOUS, phase=phase, node=node, deleting=deleting
        )
        return self

    def lease(
        self,
        pod: str,
        age: float = 1.0,
        heartbeat: contract.Heartbeat | None = None,
        assigned: str | None = None,
        fenced: bool = False,
        recreated: bool = False,
        duration: int | None = None,
        renew_period: int | None = None,
        reach_probe: contract.ReachProbe | None = None,
    ) -> ObservedBuilder:
        self.leases[pod] = LeaseObs(
            name=pod,
            renew_time=ago(age),
            heartbeat=heartbeat,
            assigned_slot=assigned,
            fenced=fenced,
            recreated=recreated,
            duration_seconds=duration,
            renew_period=renew_period,
            reach_probe=reach_probe,
        )
        return self

    def running(
        self,
        n: int,
        attempt: int = 0,
        heartbeat: contract.Heartbeat | None = None,
        duration: int | None = None,
        renew_period: int | None = None,
    ) -> ObservedBuilder:
        """n healthy workers heartbeating in Training, plus the rendezvous pod; `duration` and
        `renew_period`: their Leases' (None: not known)."""
        self.rdzv()
        for slot in range(n):
            self.worker(slot, attempt)
            name = contract.worker_pod_name(self.job, slot, attempt)
            self.lease(name, 1.0, heartbeat or hb(), duration=duration, renew_period=renew_period)
        return self

    def no_rdzv(self) -> ObservedBuilder:
        self.pods.pop(f"{self.job}-rdzv", None)
        return self

    def no_service(self) -> ObservedBuilder:
        self.service = False
        return self

    def api_failed(self, seconds_ago: float) -> ObservedBuilder:
        """The operator's own API calls last failed (no API server) this long ago."""
        self.api_failed_at = ago(seconds_ago)
        return self

    def without_pod(self, name: str) -> ObservedBuilder:
        """The pod gone from the API (its Lease, if any, stays)."""
        self.pods.pop(name, None)
        return self

    def without_node(self, name: str) -> ObservedBuilder:
        self.nodes_.pop(name, None)
        return self

    def refused(self, message: str) -> ObservedBuilder:
        self.refused_ = message
        return self

    def obj(self) -> Observed:
        return Observed(
            pods=dict(self.pods),
            leases=dict(self.leases),
            nodes=dict(self.nodes_),
            service_exists=self.service,
            refused=self.refused_,
            api_failed_at=self.api_failed_at,
        )


def observe(job: str = "train") -> ObservedBuilder:
    return ObservedBuilder(job)


def running_status(n: int, attempt: int = 0, **extra: Any) -> dict[str, Any]:
    """A status as a previous pass would have written it for n healthy slots."""
    slots = [
        {
            "slot": s,
            "pod": contract.worker_pod_name("train", s, attempt),
            "node": f"node-{s}",
            "attempt": attempt,
            "state": "Training",
            "lastHeartbeatTime": ago(1).isoformat(),
        }
        for s in range(n)
    ]
    status: dict[str, Any] = {
        "nodeSlots": slots,
        "rendezvousPodUid": "rdzv-1",
        "startTime": ago(3600).isoformat(),
        "conditions": [
            {
                "type": "Running",
                "status": "True",
                "reason": "AllPodsRunning",
                "lastTransitionTime": ago(3600).isoformat(),
            }
        ],
    }
    status.update(extra)
    return status


# --- table rows of decide() (tests/unit/test_ladder_*.py) ------------------------------------------

HARD = {"severity": "Hard", "reason": "GpuXid", "message": "Xid 79", "time": ago(2).isoformat()}
PERMANENT = {
    "severity": "Permanent",
    "reason": "WorldSizeMismatch",
    "message": "/ckpt/step-0000000100 was written by 2 ranks, this job has 3",
    "time": ago(2).isoformat(),
}
SOFT = {"severity": "Soft", "reason": "RankException", "message": "boom", "time": ago(3).isoformat()}


@dataclass
class Case:
    id: str
    job: ResilientTrainingJob
    observed: Observed
    actions: list[Any] = field(default_factory=list)
    state: str = ""
    reason: str = ""
    restarts: tuple[int, int, int] = (0, 0, 0)  # in-process, in-job, pod reschedules
    events: list[str] = field(default_factory=list)
    slots: dict[int, dict[str, Any]] = field(default_factory=dict)
    conditions: dict[str, str] = field(default_factory=dict)
    quarantined: list[str] = field(default_factory=list)


def running_job(n: int = 2, **status: Any) -> Any:
    return make_job().nodes(n).status(**running_status(n, **status))


def slot_status(n: int, overrides: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    base = running_status(n)["nodeSlots"]
    for s, fields in overrides.items():
        base[s].update(fields)
    return base


def replacing(reason: str) -> dict[str, Any]:
    """slot_status overrides of a slot whose first pod was deleted 3 s ago for `reason`."""
    return {
        "attempt": 1,
        "pod": "",
        "state": "Replacing",
        "recoveringSince": ago(3).isoformat(),
        "lastFaultReason": reason,
    }


JOB_KEY = "ns/train"


def quarantined(node: str, reason: str) -> TaintNode:
    """The TaintNode a row expects (its evidence text and check time are not compared: `actions`)."""
    return TaintNode(node, reason, JOB_KEY)


def recorded(node: str, reason: str) -> RecordNodeFault:
    """The RecordNodeFault of a pod fault without node evidence, at NOW."""
    return RecordNodeFault(node, JOB_KEY, reason, NOW)


def actions(decision: Any) -> list[Any]:
    """The decision's actions, TaintNode's evidence text and check time left out (rows compare the
    node, reason and job; the text is checked where it matters)."""
    return [TaintNode(a.node, a.reason, a.job) if isinstance(a, TaintNode) else a for a in decision.actions]


def check(case: Case) -> None:
    """decide() on the row's job and observation gives exactly the row's actions, counts and events."""
    d = decide(case.job, case.observed, NOW)
    assert actions(d) == case.actions
    st = d.status
    if case.state:
        assert st.state == case.state
    if case.reason:
        assert st.reason == case.reason
    assert (st.restarts.in_process, st.restarts.in_job, st.restarts.pod_reschedules) == case.restarts
    assert [e.reason for e in d.events] == case.events
    for slot, fields in case.slots.items():
        got = st.node_slots[slot].model_dump(by_alias=True)
        assert {k: got[k] for k in fields} == fields
    conds = {c.type: c.status for c in st.conditions}
    for type_, value in case.conditions.items():
        assert conds.get(type_) == value
    if case.quarantined:
        assert st.quarantined_nodes == case.quarantined
