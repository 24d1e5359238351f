"""What the operator observed about one job, parsed from raw API objects (pure, no I/O).

Parsing is total: any accepted object (malformed labels, a Lease written by a buggy trainer,
a future renewTime) yields an observation, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rtj import contract
from rtj.contract import Heartbeat


def _int(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if 0 <= number < contract.MAX_COUNTER else None


@dataclass(frozen=True)
class ContainerObs:
    """One container's (or init container's) state, as the kubelet reports it."""

    name: str
    init: bool = False
    #: state.waiting.reason / .message (e.g. ImagePullBackOff, CreateContainerConfigError).
    waiting_reason: str = ""
    waiting_message: str = ""
    #: state.terminated, else lastState.terminated (the latest run that ended).
    terminated_reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    restart_count: int = 0
    image: str = ""


@dataclass(frozen=True)
class PodObs:
    name: str
    uid: str = ""
    role: str = contract.ROLE_WORKER
    slot: int | None = None
    spare_index: int | None = None
    attempt: int = 0
    cause: str = ""
    phase: str = "Pending"
    node: str = ""
    deleting: bool = False
    #: metadata.deletionTimestamp: when the grace period of a requested deletion ends.
    delete_by: datetime | None = None
    exit_code: int | None = None
    status_reason: str = ""
    created: datetime | None = None
    started: datetime | None = None
    status_message: str = ""
    containers: tuple[ContainerObs, ...] = ()
    #: The scheduler's message while PodScheduled is False with reason Unschedulable, else "".
    unschedulable: str = ""
    #: The DisruptionTarget condition (True) as "reason: message" (eviction, preemption, a drain,
    #: a node's graceful shutdown), else "".
    disruption: str = ""

    @property
    def trainer(self) -> ContainerObs | None:
        return next((c for c in self.containers if c.name == contract.TRAINER_CONTAINER and not c.init), None)

    @property
    def terminal(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def live(self) -> bool:
        """Could still run a process (not finished, not gone)."""
        return not self.terminal


@dataclass(frozen=True)
class LeaseObs:
    name: str
    #: The heartbeat time, clamped to `now` so a future renewTime cannot keep a dead pod alive.
    renew_time: datetime | None = None
    heartbeat: Heartbeat | None = None
    assigned_slot: str | None = None
    #: The operator fenced this Lease's pod (contract.FENCED_ANNOTATION).
    fenced: bool = False
    #: Owned by the job, not by its pod: its agent recreated it after it vanished (rtj.ladder.fencing).
    recreated: bool = False
    #: The renew period the operator asked of its pod (contract.RENEW_PERIOD_ANNOTATION), if any.
    renew_period: int | None = None
    #: spec.leaseDurationSeconds: 3 renew periods as the agent writes it (contract.lease_duration_seconds).
    duration_seconds: int | None = None
    #: The reach probe the operator last asked of its pod (contract.REACH_PROBE_ANNOTATION), if any.
    reach_probe: contract.ReachProbe | None = None


@dataclass(frozen=True)
class NodeObs:
    name: str
    #: "True", "False" or "Unknown" (the Ready condition's status).
    ready: str = "Unknown"
    taints: tuple[tuple[str, str, str], ...] = ()
    #: Health conditions that say the node is unhealthy, as "Type=Status: reason: message"
    #: (contract.NODE_HEALTH_CONDITIONS False, NODE_PROBLEM_CONDITIONS True).
    problems: tuple[str, ...] = ()
    unschedulable: bool = False
    #: The GPUs the device plugin reports (allocatable, capacity); None where the node has none.
    gpus: tuple[int, int] | None = None
    #: Recent pod faults of our jobs there without evidence against the node (NODE_FAULTS_ANNOTATION).
    faults: tuple[contract.NodeFault, ...] = ()
    #: Our quarantine (QUARANTINE_ANNOTATION), if any; the taint is in `taints`.
    quarantine: contract.Quarantine | None = None
    #: metadata.labels, sorted (which jobs' placements select the node: rtj.ladder.in_place).
    labels: tuple[tuple[str, str], ...] = ()
    #: status.declaredFeatures: what its kubelet declares it supports (e.g.
    #: contract.RESTART_ALL_CONTAINERS_FEATURE).
    declared_features: frozenset[str] = frozenset()
    #: status.nodeInfo.bootID: changes when the machine boots again ("" when not reported).
    boot_id: str = ""

    @property
    def quarantined(self) -> bool:
        return any(key == contract.QUARANTINE_TAINT_KEY for key, _value, _effect in self.taints)


@dataclass(frozen=True)
class CreateRefusal:
    """The API server's latest refusal (a retryable 4xx) of a create for this job (see
    rtj.ladder.create_refusals), as the handler remembers it."""

    status: int
    #: The server's CamelCase reason (Status.reason), e.g. Forbidden.
    reason: str
    #: The server's message (names the object and what refused it).
    message: str
    #: When the latest refusal came back.
    last: datetime
    #: Consecutive passes whose creates were refused.
    failures: int = 1


@dataclass(frozen=True)
class ProgressSeen:
    """The highest training step the operator's Lease watch saw a heartbeat of the job report, and
    the renewTime of the first heartbeat that reported it. Passes run at deadlines and on changes,
    not at every renewal (rtj.ladder.wakeups): only the watch sees when the step last rose. Kept by
    rtj.handlers between passes, in memory only (a restarted operator starts without it); read by
    rtj.ladder.progress_watchdog."""

    step: int
    time: datetime


def progress_seen(
    previous: ProgressSeen | None, step: int | None, renew: datetime | None
) -> ProgressSeen | None:
    """`previous` after a heartbeat reporting `step` renewed at `renew`: a higher step is progress."""
    if step is None or renew is None or (previous is not None and step <= previous.step):
        return previous
    return ProgressSeen(step, renew)


@dataclass(frozen=True)
class Fleet:
    """Heartbeating pods (rtj.ladder.heartbeat_budget): workers renew once per period, standby spares
    every contract.STANDBY_RENEW_SECONDS."""

    workers: int = 0
    spares: int = 0

    def __add__(self, other: Fleet) -> Fleet:
        return Fleet(self.workers + other.workers, self.spares + other.spares)

    @property
    def spare_writes_per_second(self) -> float:
        return self.spares / contract.STANDBY_RENEW_SECONDS


@dataclass(frozen=True)
class Observed:
    pods: dict[str, PodObs] = field(default_factory=dict)
    leases: dict[str, LeaseObs] = field(default_factory=dict)
    nodes: dict[str, NodeObs] = field(default_factory=dict)
    service_exists: bool = True
    #: Nodes are known (the node index is populated); when False, node health is not judged.
    nodes_known: bool = True
    #: Why the API server refused (422) an object built from this job's spec on an earlier pass;
    #: no retry can succeed, so the job fails (InvalidSpec) with this message.
    refused: str = ""
    #: A create the API server refused for a reason that may end (403, ...): retried with backoff.
    create_refusal: CreateRefusal | None = None
    #: When the operator's own last API call failed for want of an API server (connection error,
    #: timeout, 5xx); None: none since it started (rtj.kube.Kube.failed_at).
    api_failed_at: datetime | None = None
    #: Highest Event sequence number this operator process posted for the job (None: none known,
    #: e.g. after a restart); see rtj.ladder.event_outbox.
    events_posted: int | None = None
    #: The highest step the Lease watch saw and when it first saw it (None: none known, e.g. after a
    #: restart); see rtj.ladder.progress_watchdog.
    progress_seen: ProgressSeen | None = None
    #: The job's Kueue Workload (None: none seen; only watched with the Kueue integration on).
    workload: WorkloadObs | None = None
    #: ResourceFlavors named by the Workload's admission, read by the operator (by name).
    flavors: dict[str, FlavorObs] = field(default_factory=dict)
    #: The heartbeating pods of the operator's other running jobs (None: none known); they share
    #: the heartbeat budget with this job's (rtj.ladder.heartbeat_budget).
    fleet: Fleet | None = None
    #: Every node of the cluster the operator knows (not only the job's): whether the job's new pods
    #: can restart in place depends on the nodes its placement selects (rtj.ladder.in_place).
    all_nodes: tuple[NodeObs, ...] = ()


def pod_from_dict(obj: dict[str, Any]) -> PodObs:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    labels = meta.get("labels") or {}
    name = str(meta.get("name", ""))
    attempt = _int(labels.get(contract.LABEL_ATTEMPT))
    slot = _int(labels.get(contract.LABEL_SLOT))
    if attempt is None or slot is None:
        parsed = contract.parse_worker_pod_name(name)
        if parsed is not None:
            slot = slot if slot is not None else parsed[0]
            attempt = attempt if attempt is not None else parsed[1]
    containers = tuple(
        _container(cs, init)
        for key, init in (("initContainerStatuses", True), ("containerStatuses", False))
        for cs in status.get(key) or []
        if isinstance(cs, dict)
    )
    exit_code = None
    for cs in status.get("containerStatuses") or []:
        if isinstance(cs, dict) and cs.get("name") == contract.TRAINER_CONTAINER:
            terminated = ((cs.get("state") or {}).get("terminated")) or {}
            exit_code = _int(terminated.get("exitCode")) if terminated else None
    conditions = {str(c.get("type")): c for c in status.get("conditions") or [] if isinstance(c, dict)}
    scheduled = conditions.get("PodScheduled") or {}
    unschedulable = ""
    if scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        unschedulable = str(scheduled.get("message") or "no node fits the pod")
    target = conditions.get("DisruptionTarget") or {}
    disruption = ""
    if target.get("status") == "True":
        disruption = f"{target.get('reason') or 'DisruptionTarget'}: {target.get('message') or ''}".rstrip(
            ": "
        )
    return PodObs(
        name=name,
        uid=str(meta.get("uid", "")),
        role=str(labels.get(contract.LABEL_ROLE, contract.ROLE_WORKER)),
        slot=slot,
        spare_index=_int(labels.get(contract.LABEL_SPARE_INDEX)),
        attempt=attempt or 0,
        cause=str((meta.get("annotations") or {}).get(contract.CAUSE_ANNOTATION, "")),
        phase=str(status.get("phase") or "Pending"),
        node=str(spec.get("nodeName") or ""),
        deleting=bool(meta.get("deletionTimestamp")),
        delete_by=contract.parse_time(meta.get("deletionTimestamp")),
        exit_code=exit_code,
        status_reason=str(status.get("reason") or ""),
        created=contract.parse_time(meta.get("creationTimestamp")),
        started=contract.parse_time(status.get("startTime")),
        status_message=str(status.get("message") or ""),
        containers=containers,
        unschedulable=unschedulable,
        disruption=disruption,
    )


def _container(cs: dict[str, Any], init: bool) -> ContainerObs:
    state = cs.get("state") or {}
    waiting = state.get("waiting") or {}
    terminated = state.get("terminated") or (cs.get("lastState") or {}).get("terminated") or {}
    return ContainerObs(
        name=str(cs.get("name", "")),
        init=init,
        waiting_reason=str(waiting.get("reason") or "") if isinstance(waiting, dict) else "",
        waiting_message=str(waiting.get("message") or "") if isinstance(waiting, dict) else "",
        terminated_reason=str(terminated.get("reason") or "") if isinstance(terminated, dict) else "",
        exit_code=_int(terminated.get("exitCode")) if isinstance(terminated, dict) else None,
        signal=_int(terminated.get("signal")) if isinstance(terminated, dict) else None,
        restart_count=_int(cs.get("restartCount")) or 0,
        image=str(cs.get("image") or ""),
    )


#: Key the operator's Lease index adds to a Lease it stores: when it received that version of the
#: Lease (operator-internal, never written to the API).
OBSERVED_AT = "observedAt"


def lease_from_dict(obj: dict[str, Any], now: datetime) -> LeaseObs:
    """The heartbeat time is renewTime, but never later than when the operator saw that version of
    the Lease (OBSERVED_AT) nor than `now`: a renewTime in the future (clock skew, a bug) counts as
    a renewal when it arrives and then ages like any other, so it cannot keep a dead pod alive."""
    meta = obj.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    renew = contract.parse_time((obj.get("spec") or {}).get("renewTime"))
    observed = contract.parse_time(obj.get(OBSERVED_AT))
    if renew is not None:
        renew = min(renew, now, observed or now)
    assigned = annotations.get(contract.ASSIGNED_SLOT_ANNOTATION)
    return LeaseObs(
        name=str(meta.get("name", "")),
        renew_time=renew,
        heartbeat=contract.parse_heartbeat(annotations),
        assigned_slot=assigned if isinstance(assigned, str) else None,
        fenced=bool(annotations.get(contract.FENCED_ANNOTATION)),
        renew_period=contract.parse_renew_period(annotations),
        reach_probe=contract.parse_reach_probe(annotations),
        duration_seconds=_int((obj.get("spec") or {}).get("leaseDurationSeconds")),
        recreated=any(
            isinstance(o, dict) and o.get("kind") == contract.KIND for o in meta.get("ownerReferences") or []
        ),
    )


def node_from_dict(obj: dict[str, Any]) -> NodeObs:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    ready = "Unknown"
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            ready = str(cond.get("status", "Unknown"))
    taints = tuple(
        (str(t.get("key", "")), str(t.get("value", "")), str(t.get("effect", "")))
        for t in (obj.get("spec") or {}).get("taints") or []
        if isinstance(t, dict)
    )
    annotations = meta.get("annotations") or {}
    return NodeObs(
        name=str(meta.get("name", "")),
        ready=ready,
        taints=taints,
        problems=_node_problems(status.get("conditions") or []),
        unschedulable=bool((obj.get("spec") or {}).get("unschedulable")),
        gpus=_gpus(status),
        faults=contract.parse_node_faults(annotations.get(contract.NODE_FAULTS_ANNOTATION)),
        quarantine=contract.parse_quarantine(annotations.get(contract.QUARANTINE_ANNOTATION)),
        labels=tuple(sorted((str(k), str(v)) for k, v in (meta.get("labels") or {}).items())),
        declared_features=frozenset(str(f) for f in status.get("declaredFeatures") or [] if f),
        boot_id=node_boot_id(obj),
    )


def node_boot_id(obj: dict[str, Any]) -> str:
    """The node's status.nodeInfo.bootID as its kubelet reports it ("" when absent or not a string;
    cut to contract.MAX_BOOT_ID). A reboot, or a machine re-provisioned under the same name, changes it."""
    info = (obj.get("status") or {}).get("nodeInfo") or {}
    boot = info.get("bootID") if isinstance(info, dict) else None
    return boot[: contract.MAX_BOOT_ID] if isinstance(boot, str) else ""


def _node_problems(conditions: list[Any]) -> tuple[str, ...]:
    out = []
    for c in conditions:
        if not isinstance(c, dict):
            continue
        type_, status = str(c.get("type", "")), str(c.get("status", ""))
        bad = (type_ in contract.NODE_HEALTH_CONDITIONS and status == "False") or (
            type_ in contract.NODE_PROBLEM_CONDITIONS and status == "True"
        )
        if bad:
            detail = ": ".join(str(x) for x in (c.get("reason"), c.get("message")) if x)
            out.append(f"{type_}={status}" + (f": {detail}" if detail else ""))
    return tuple(sorted(out))


def _gpus(status: dict[str, Any]) -> tuple[int, int] | None:
    def count(key: str) -> int | None:
        return _int((status.get(key) or {}).get(contract.GPU_RESOURCE))

    allocatable, capacity = count("allocatable"), count("capacity")
    if capacity is None or capacity == 0:
        return None
    return (allocatable if allocatable is not None else capacity, capacity)


@dataclass(frozen=True)
class PodSetUpdateObs:
    """An admission check's podSetUpdates entry (what Kueue asks to add to a pod set's pods)."""

    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkloadObs:
    """The job's Kueue Workload (kueue.x-k8s.io/v1beta2), as rtj.ladder.kueue_admission reads it."""

    name: str
    resource_version: str = ""
    generation: int | None = None
    deleting: bool = False
    queue_name: str = ""
    quota_reserved: bool = False
    admitted: bool = False
    evicted: bool = False
    evicted_reason: str = ""
    evicted_message: str = ""
    finished: bool = False
    #: QuotaReserved False's message (why Kueue has not admitted it yet), if any.
    pending_message: str = ""
    cluster_queue: str = ""
    #: Pod set name -> the ResourceFlavors its admission assigned (status.admission.podSetAssignments).
    assigned_flavors: dict[str, tuple[str, ...]] = field(default_factory=dict)
    podset_updates: dict[str, PodSetUpdateObs] = field(default_factory=dict)
    #: status.conditions as stored (the policy writes the list back with one condition changed).
    conditions: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class FlavorObs:
    """A Kueue ResourceFlavor: what its admission adds to the pods (spec.nodeLabels, tolerations)."""

    name: str
    node_labels: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()


def _str_map(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _dicts(value: Any) -> tuple[dict[str, Any], ...]:
    return tuple(dict(x) for x in value if isinstance(x, dict)) if isinstance(value, list) else ()


def workload_from_dict(obj: dict[str, Any]) -> WorkloadObs:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    conditions = _dicts(status.get("conditions"))
    by_type = {str(c.get("type")): c for c in conditions}

    def true(type_: str) -> bool:
        return by_type.get(type_, {}).get("status") == "True"

    quota = by_type.get("QuotaReserved", {})
    evicted = by_type.get("Evicted", {})
    admission = status.get("admission") if isinstance(status.get("admission"), dict) else None
    flavors: dict[str, tuple[str, ...]] = {}
    for a in (admission or {}).get("podSetAssignments") or []:
        if isinstance(a, dict) and a.get("name"):
            flavors[str(a["name"])] = tuple(sorted({str(v) for v in _str_map(a.get("flavors")).values()}))
    updates: dict[str, PodSetUpdateObs] = {}
    for check in status.get("admissionChecks") or []:
        for u in (check.get("podSetUpdates") or []) if isinstance(check, dict) else []:
            if isinstance(u, dict) and u.get("name"):
                prev = updates.get(str(u["name"]), PodSetUpdateObs())
                updates[str(u["name"])] = PodSetUpdateObs(
                    {**prev.node_selector, **_str_map(u.get("nodeSelector"))},
                    prev.tolerations + _dicts(u.get("tolerations")),
                    {**prev.labels, **_str_map(u.get("labels"))},
                )
    generation = meta.get("generation")
    return WorkloadObs(
        name=str(meta.get("name", "")),
        resource_version=str(meta.get("resourceVersion", "")),
        generation=generation if isinstance(generation, int) else None,
        deleting=bool(meta.get("deletionTimestamp")),
        queue_name=str((obj.get("spec") or {}).get("queueName") or ""),
        quota_reserved=true("QuotaReserved") and admission is not None,
        admitted=true("Admitted") and admission is not None,
        evicted=true("Evicted"),
        evicted_reason=str(evicted.get("reason") or "") if true("Evicted") else "",
        evicted_message=str(evicted.get("message") or "") if true("Evicted") else "",
        finished=true("Finished"),
        pending_message=str(quota.get("message") or "") if quota.get("status") == "False" else "",
        cluster_queue=str((admission or {}).get("clusterQueue") or ""),
        assigned_flavors=flavors,
        podset_updates=updates,
        conditions=conditions,
    )


def flavor_from_dict(obj: dict[str, Any]) -> FlavorObs:
    spec = obj.get("spec") or {}
    return FlavorObs(
        name=str((obj.get("metadata") or {}).get("name", "")),
        node_labels=_str_map(spec.get("nodeLabels")),
        tolerations=_dicts(spec.get("tolerations")),
    )
