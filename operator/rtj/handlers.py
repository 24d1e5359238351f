"""kopf wiring: level-based. `kopf run -m rtj.handlers` or `python -m rtj`.

- Indexes of our pods, heartbeat Leases, rendezvous Services (label-selected: only objects
  carrying LABEL_JOB are watched) and Nodes, so a pass needs no LIST call.
- One loop per job (an asyncio task that `track_job` starts, feeds and stops from the job's watch
  events; not a kopf daemon, which would put a finalizer on every job) runs a pass: observe
  (indexes) -> decide (pure) -> ONE status write (resourceVersion precondition) -> act -> Events
  (from the status's outbox) -> metrics. It runs on change, not on a clock (rtj.ladder.wakeups,
  issue 18): when the job or one of its pods changes, when a Lease's content (not its renewal)
  changes, when a stale slot renews, at the job's next heartbeat deadline, and at the slow resync
  RTJ_RECONCILE_INTERVAL_SECONDS (default 30 s). Measured by bench/operator_scale.py: a 1 s timer
  per job was most of the operator's CPU at 300 jobs, and a timer alone put 1-2 intervals between
  a missed heartbeat deadline and the replacement pod.
  Status first: a pass computed from a stale copy conflicts and has no side effect at all; a pass
  whose actions fail half-way is completed by the next pass (every action is level-based).
- create/resume: validate the spec (PermanentError + Failed/InvalidSpec) and ensure the checkpoint
  volume; delete: remove what garbage collection cannot (the cluster-scoped FSx PV and our node
  taints), hence kopf's finalizer, on jobs that have those only (`holds_cluster_state`). Everything
  else is owned by the job and garbage collected.

Why Leases for heartbeats, at 10,000 pods: one Lease update per pod per heartbeatIntervalSeconds
(default 10 s) is 1,000 writes/s of a ~1 KB object, the same load and mechanism as kubelet node
leases (10,000 nodes renew every 10 s), which the API server and etcd are sized for; the operator
reads them from one label-selected watch, never by polling. Status, in contrast, is written only
when something other than heartbeat times changes (lastHeartbeatTime is refreshed at most every
RTJ_HEARTBEAT_STATUS_RESOLUTION_SECONDS).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
from pydantic import ValidationError

from rtj import builders, contract, heartbeat_delivery, kube, metrics, reasons, watch_guard
from rtj.api.models import ConditionType, JobState, JobStatus, ResilientTrainingJob
from rtj.ladder import (
    OBSERVED_AT,
    AssignLease,
    CreateRendezvousPod,
    CreateRendezvousService,
    CreateSparePod,
    CreateWorkerPod,
    CreateWorkload,
    Decision,
    DeleteJob,
    DeleteLease,
    DeletePod,
    FenceLease,
    LadderConfig,
    Observed,
    PatchWorkloadStatus,
    PromoteSpare,
    RecordNodeFault,
    TaintNode,
    create_refusals,
    decide,
    event_outbox,
    goodput,
    kueue_admission,
    lease_from_dict,
    node_from_dict,
    pod_from_dict,
    quarantine,
    wakeups,
)
from rtj.ladder.conditions import set_condition
from rtj.ladder.observe import (
    CreateRefusal,
    FlavorObs,
    NodeObs,
    WorkloadObs,
    flavor_from_dict,
    progress_seen,
    workload_from_dict,
)
from rtj.settings import Settings

SETTINGS = Settings.from_env()
#: Actions that create an object the builders made from the spec.
CREATES = create_refusals.CREATES
GROUP, VERSION, PLURAL = contract.API_GROUP, contract.API_VERSION, contract.PLURAL
OURS = {contract.LABEL_JOB: kopf.PRESENT}
PARALLEL_CALLS = 16
#: Events of a job's pods arriving within this window wake its pass once.
WAKE_DEBOUNCE_SECONDS = 0.02
#: A pass that did not finish (a conflict, a failed call) runs again this soon, not at the resync.
RETRY_SECONDS = 1.0
logger = logging.getLogger("rtj.operator")


# --- startup / shutdown / probes -------------------------------------------------------------------
@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    logging.getLogger("rtj").setLevel(SETTINGS.log_level)
    # kopf logs "Handler 'track_job' succeeded." at INFO for every event of every job (our own
    # status writes included), with `kopf run` as with `python -m rtj`: its per-object log keeps
    # warnings and errors only.
    if SETTINGS.log_level != "DEBUG":
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    settings.watching.server_timeout = int(SETTINGS.watch_server_timeout_seconds)  # the API wants an int
    settings.watching.client_timeout = SETTINGS.watch_server_timeout_seconds + 30
    settings.watching.connect_timeout = 10
    settings.networking.request_timeout = SETTINGS.request_timeout_seconds * 3
    settings.networking.connect_timeout = 10
    settings.posting.level = logging.WARNING  # kopf's own log-events: warnings and errors only
    if SETTINGS.peering:
        settings.peering.name, settings.peering.mandatory, settings.peering.standalone = (
            SETTINGS.peering,
            True,
            False,
        )
    else:
        settings.peering.standalone = True  # one replica (Deployment strategy Recreate)
    # Progress and diff-base in our own annotations; status belongs to the ladder alone.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/cleanup"
    memo.kube = kube.Kube.from_environment(SETTINGS.request_timeout_seconds)
    metrics.serve(SETTINGS.metrics_port)
    # kopf never restarts a watch stream that failed (nolar/kopf#1276): a dead one ends the process.
    memo.watch_guard = watch_guard.WatchGuard().start()
    memo.quarantine_review = asyncio.create_task(review_quarantines(memo.kube), name="rtj-quarantine-review")
    logger.info(
        "rtj operator started (metrics on :%s, interval %ss)",
        SETTINGS.metrics_port,
        SETTINGS.reconcile_interval_seconds,
    )


#: How often the operator looks for quarantines whose check is due (rtj.ladder.quarantine.review).
QUARANTINE_REVIEW_SECONDS = 60.0


async def review_quarantines(k: kube.Kube) -> None:
    """Lift the quarantines whose check is due and whose node shows no evidence; extend the others."""
    while True:
        await asyncio.sleep(QUARANTINE_REVIEW_SECONDS)
        now = datetime.now(UTC)
        for node in list(_NODE_STATE.values()):
            outcome = quarantine.review(node, now)
            try:
                if outcome.action == "lift":
                    if await k.patch_node(node.name, quarantine.lift_patch):
                        logger.info("%s", outcome.message)
                elif outcome.action == "extend":
                    later = now + timedelta(seconds=SETTINGS.quarantine_seconds)
                    await k.patch_node(node.name, lambda obj, u=later: quarantine.extend_patch(obj, u))
                    logger.info("node %s stays quarantined: %s", node.name, outcome.message)
            except kube.KubeError as exc:  # a Conflict or an outage: the next round retries
                logger.warning("quarantine review of node %s: %s", node.name, exc)


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    if getattr(memo, "quarantine_review", None) is not None:
        memo.quarantine_review.cancel()
    if getattr(memo, "watch_guard", None) is not None:
        await memo.watch_guard.stop()
    for key in list(_LOOPS):
        _stop_loop(key)
    if getattr(memo, "kube", None) is not None:
        memo.kube.close()


@kopf.on.probe(id="apiClient")
def api_client_ready(memo: kopf.Memo, **_: Any) -> bool:
    return getattr(memo, "kube", None) is not None


@kopf.on.probe(id="watches")
async def watches(**_: Any) -> list[str]:
    """kopf's running watch streams, by task name (rtj.watch_guard): /healthz shows what is watched."""
    return watch_guard.live_watches(asyncio.all_tasks())


# --- indexes (label-selected watches; values are small immutable observations) ----------------------
@kopf.index("pods", labels=OURS)
def rtj_pods(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    key, pod = (namespace, labels[contract.LABEL_JOB]), pod_from_dict(_plain(body))
    if pod.node:
        _JOBS_ON_NODE.setdefault(pod.node, set()).add(key)
    return {key: pod}


@kopf.index("coordination.k8s.io", "v1", "leases", labels=OURS)
def rtj_leases(
    namespace: str, labels: kopf.Labels, meta: kopf.Meta, spec: kopf.Spec, **_: Any
) -> dict[Any, Any]:
    key, name = (namespace, labels[contract.LABEL_JOB]), str(meta.get("name"))
    annotations = dict(meta.get("annotations") or {})
    arrived = datetime.now(UTC)
    owners = [{"kind": o.get("kind")} for o in meta.get("ownerReferences") or [] if isinstance(o, dict)]
    lease = {
        "metadata": {"name": name, "annotations": annotations, "ownerReferences": owners},
        "spec": {"renewTime": spec.get("renewTime")},
        # When this version arrived: bounds a future renewTime (see ladder.lease_from_dict).
        OBSERVED_AT: arrived,
    }
    _on_lease_event(key, name, annotations, spec.get("renewTime"), arrived)  # here: one call per event
    return {key: lease}


_LATE_LEASES = heartbeat_delivery.LateDeliveries()


def _on_lease_event(
    key: tuple[str, str], name: str, annotations: dict[str, Any], renew_time: Any, arrived: datetime
) -> None:
    """Measure how late a renewal arrived, and wake the job's pass when the Lease's content changed
    or a slot it found stale renewed; an ordinary renewal only moves a deadline later
    (rtj.ladder.wakeups). A Lease's first sighting is not measured: the operator's own (re)listing
    shows each Lease as old as it is, not as late."""
    job_loop = _LOOPS.get(key)
    if job_loop is None:
        return
    seen = job_loop.lease_renew_times.get(name)
    if seen is not None and renew_time != seen:
        _LATE_LEASES.observe(key[0], name, contract.parse_time(renew_time), arrived)
    job_loop.lease_renew_times[name] = renew_time
    digest, step = wakeups.read_heartbeat(annotations)
    # Every renewal, not only those that wake a pass: when the step last rose (the progress watchdog).
    renewed = contract.parse_time(renew_time)
    job_loop.memo.progress_seen = progress_seen(
        getattr(job_loop.memo, "progress_seen", None), step, min(renewed, arrived) if renewed else None
    )
    if job_loop.lease_digests.get(name) != digest or name in getattr(job_loop.memo, "watched_leases", ()):
        job_loop.lease_digests[name] = digest
        job_loop.wake.set()


@kopf.index(
    "services", labels={contract.LABEL_JOB: kopf.PRESENT, contract.LABEL_ROLE: contract.ROLE_RENDEZVOUS}
)
def rtj_services(namespace: str, labels: kopf.Labels, name: str, **_: Any) -> dict[Any, Any]:
    return {(namespace, labels[contract.LABEL_JOB]): name}


@kopf.index("nodes")
def rtj_nodes(name: str, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    plain = _plain(body)
    plain["metadata"]["annotations"] = dict(body.metadata.annotations or {})
    node = node_from_dict(plain)
    # What the ladder reads of a node changed (readiness, taints, health conditions, GPUs, our
    # records): wake the passes of the jobs with pods on it (a status report changing none of
    # these wakes nothing).
    if _NODE_STATE.get(name) != node:
        _NODE_STATE[name] = node
        for key in _JOBS_ON_NODE.get(name, ()):
            if (job_loop := _LOOPS.get(key)) is not None:
                job_loop.wake.set()
    return {name: node}


def rtj_workloads(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    """The job's Kueue Workload (rtj.ladder.kueue_admission): what the policy reads, not its pod sets."""
    key = (namespace, labels[contract.LABEL_JOB])
    status = dict(body.get("status") or {})
    return {
        key: {
            "metadata": dict(body.metadata),
            "spec": {"queueName": (body.get("spec") or {}).get("queueName")},
            "status": {k: status[k] for k in ("conditions", "admission", "admissionChecks") if k in status},
        }
    }


def wake_on_workload_change(namespace: str, labels: kopf.Labels, **_: Any) -> None:
    """Kueue admitted, evicted or finished the job's Workload (or it is gone): run the job's pass now."""
    job_loop = _LOOPS.get((namespace, labels.get(contract.LABEL_JOB, "")))
    if job_loop is not None:
        job_loop.wake.set()


if SETTINGS.kueue_enabled:  # only then may the operator read Workloads (the chart's kueue.enabled)
    _WORKLOADS = (kube.KUEUE_GROUP, kube.KUEUE_VERSION, "workloads")
    kopf.index(*_WORKLOADS, labels=OURS)(rtj_workloads)
    kopf.on.event(*_WORKLOADS, labels=OURS)(wake_on_workload_change)


#: Node -> jobs that had a pod bound to it (may name jobs whose pods have left: a spare wake-up).
_JOBS_ON_NODE: dict[str, set[tuple[str, str]]] = {}
#: Node -> what the ladder last read of it (also what the quarantine review goes over).
_NODE_STATE: dict[str, NodeObs] = {}


def _plain(body: kopf.Body) -> dict[str, Any]:
    return {
        "metadata": dict(body.get("metadata") or {}),
        "spec": dict(body.get("spec") or {}),
        "status": dict(body.get("status") or {}),
    }


# --- validation -------------------------------------------------------------------------------------
FSX_DISABLED = (
    "spec.checkpoint.fsx: this operator was installed without FSx support (it may not create the "
    "job's PersistentVolume); install the chart with fsx.enabled=true, or use checkpoint.pvc"
)


def parse_job(body: kopf.Body) -> tuple[ResilientTrainingJob | None, str]:
    """The job, or None and a message naming the field that makes it invalid."""
    try:
        job = ResilientTrainingJob.model_validate(_plain_job(body))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return None, f"{where}: {first.get('msg')}"
    # The CRD already refuses all of these; this is the net for a job stored before it did.
    violations = builders.privileged_violations(job)
    if violations:
        return None, "; ".join(violations) + " (privileged jobs are refused)"
    if job.spec.checkpoint.fsx is not None and not SETTINGS.fsx_enabled:
        return None, FSX_DISABLED
    return job, ""


def _plain_job(body: kopf.Body) -> dict[str, Any]:
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": dict(body.metadata),
        "spec": dict(body.spec),
        "status": dict(body.status),
    }


async def _mark_invalid(k: kube.Kube, body: kopf.Body, message: str) -> None:
    status = JobStatus.model_validate(dict(body.status)) if body.status else JobStatus()
    now = datetime.now(UTC)
    generation = body.metadata.get("generation")
    status.conditions = set_condition(
        status.conditions, ConditionType.FAILED, True, reasons.INVALID_SPEC, message, now, generation
    )
    status.state, status.reason, status.observed_generation = (
        JobState.FAILED,
        reasons.INVALID_SPEC,
        generation,
    )
    status.completion_time = status.completion_time or now
    await k.patch_job_status(
        body.metadata["namespace"], body.metadata["name"], status.model_dump(by_alias=True, mode="json"), None
    )
    await k.emit_event(_plain_job(body), "Warning", reasons.INVALID_SPEC, message)


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
async def admit(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Validate, then make sure the checkpoint volume exists (the job's loop of passes does the rest)."""
    job, message = parse_job(body)
    if job is None:
        await _mark_invalid(memo.kube, body, message)
        raise kopf.PermanentError(f"invalid spec: {message}")
    pv, pvc = builders.fsx_persistent_volume(job), builders.fsx_persistent_volume_claim(job)
    try:
        for obj in (pv, pvc):
            if obj is not None:
                await memo.kube.create(obj)
    except kube.KubeError as exc:
        if exc.invalid:
            message = f"the API server refused the job's checkpoint volume: {exc.message}"
            await _mark_invalid(memo.kube, body, message)
            raise kopf.PermanentError(message) from exc
        raise kopf.TemporaryError(f"checkpoint volume not created yet: {exc}", delay=5) from exc


def holds_cluster_state(spec: kopf.Spec, **_: Any) -> bool:
    """The job has what garbage collection cannot undo: a cluster-scoped FSx PV. Only then does the
    job carry kopf's finalizer (kopf adds it when this turns true and removes it when false): every
    other child is owned by the job and collected by garbage collection, so a job without one is
    deletable with no operator running (a namespace never stays Terminating for want of it). Node
    quarantines are the nodes' (rtj.ladder.quarantine): deleting a job leaves them."""
    return bool((spec.get("checkpoint") or {}).get("fsx"))


@kopf.on.delete(GROUP, VERSION, PLURAL, when=holds_cluster_state)
async def cleanup(body: kopf.Body, memo: kopf.Memo, namespace: str, name: str, **_: Any) -> None:
    """Undo what garbage collection cannot: the cluster-scoped FSx PV."""
    k: kube.Kube = memo.kube
    try:
        if (body.spec.get("checkpoint") or {}).get("fsx"):
            await k.delete("PersistentVolume", None, builders.fsx_pv_name(namespace, name))
    except kube.KubeError as exc:
        raise kopf.TemporaryError(f"cleanup not finished: {exc}", delay=5) from exc


# --- the pass ----------------------------------------------------------------------------------------
@kopf.on.event("pods", labels=OURS)
def wake_on_pod_change(namespace: str, labels: kopf.Labels, **_: Any) -> None:
    """A pod of the job changed (created, exited, deleted, gone): run the job's pass now."""
    job_loop = _LOOPS.get((namespace, labels.get(contract.LABEL_JOB, "")))
    if job_loop is not None:
        job_loop.wake.set()


@dataclass
class _JobLoop:
    """One job's passes, an asyncio task fed the newest job object by `track_job`."""

    uid: str
    body: kopf.Body
    #: kopf's memo of this object: per-job state kept across passes (last write, refusals, Events).
    memo: kopf.Memo
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: Lease name -> rtj.ladder.wakeups.heartbeat_digest of its last version seen.
    lease_digests: dict[str, str] = field(default_factory=dict)
    #: Lease name -> its renewTime last seen (rtj.heartbeat_delivery measures the next one).
    lease_renew_times: dict[str, Any] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None


#: (namespace, job) -> its loop.
_LOOPS: dict[tuple[str, str], _JobLoop] = {}


@kopf.on.event(GROUP, VERSION, PLURAL)
async def track_job(
    event: kopf.RawEvent,
    body: kopf.Body,
    memo: kopf.Memo,
    namespace: str,
    name: str,
    uid: str,
    rtj_pods: kopf.Index,
    rtj_leases: kopf.Index,
    rtj_services: kopf.Index,
    rtj_nodes: kopf.Index,
    **kwargs: Any,
) -> None:
    """Start, feed and stop each job's loop of passes.

    Not a kopf daemon (nor timer): kopf puts its finalizer on every object that has one, so a job
    whose operator is gone (`helm uninstall`) could never be deleted, nor its namespace (issue 13,
    case 6). An event handler needs no finalizer; the loop stops when the job is gone.
    """
    key = (namespace, name)
    current = _LOOPS.get(key)
    if current is not None and (current.uid != uid or event.get("type") == "DELETED"):
        _stop_loop(key)  # deleted, or a namesake replaced a deleted job
        current = None
    if event.get("type") == "DELETED":
        metrics.forget(namespace, name)
        return
    if current is None:
        current = _LOOPS[key] = _JobLoop(uid, body, memo)
        indexes = (rtj_pods, rtj_leases, rtj_services, rtj_nodes)  # live: kopf updates them in place
        workloads = kwargs.get("rtj_workloads")  # with the Kueue integration only
        current.task = asyncio.create_task(job_passes(current, namespace, name, *indexes, workloads))
    else:
        # The next pass reads it. Most events are this loop's own status writes: only a new
        # generation (spec), a deletion or a namesake wakes the pass.
        woken = _job_changed(current.body, body)
        current.body = body
        if woken:
            current.wake.set()


def _job_changed(old: kopf.Body, new: kopf.Body) -> bool:
    def meta(b: kopf.Body) -> tuple[Any, ...]:
        m = b.metadata
        return m.get("generation"), m.get("deletionTimestamp"), m.get("uid")

    return meta(old) != meta(new)


def _stop_loop(key: tuple[str, str]) -> None:
    job_loop = _LOOPS.pop(key, None)
    if job_loop is not None and job_loop.task is not None:
        job_loop.task.cancel()


async def job_passes(
    job_loop: _JobLoop,
    namespace: str,
    name: str,
    rtj_pods: kopf.Index,
    rtj_leases: kopf.Index,
    rtj_services: kopf.Index,
    rtj_nodes: kopf.Index,
    rtj_workloads: kopf.Index | None = None,
) -> None:
    """The job's passes: on a change, at the next heartbeat deadline, at the slow resync."""
    wake = job_loop.wake
    loop = asyncio.get_running_loop()
    while True:
        wake.clear()
        started = time.perf_counter()
        delay = SETTINGS.reconcile_interval_seconds
        try:
            deadline_in = await run_pass(
                job_loop.body, job_loop.memo, namespace, name, rtj_pods, rtj_leases, rtj_services, rtj_nodes,
                rtj_workloads,
            )  # fmt: skip
            if deadline_in is not None:
                delay = min(delay, max(0.0, deadline_in - (time.perf_counter() - started)))
        except Exception:  # a pass never crashes the operator; the next one retries
            logger.exception("pass for %s/%s failed", namespace, name)
            delay = RETRY_SECONDS
        finally:
            metrics.RECONCILE.observe(time.perf_counter() - started)
        until = loop.time() + delay
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout=delay)
        if wake.is_set():  # let the rest of a burst of events arrive first
            await asyncio.sleep(min(WAKE_DEBOUNCE_SECONDS, max(0.0, until - loop.time())))


async def run_pass(
    body: kopf.Body,
    memo: kopf.Memo,
    namespace: str,
    name: str,
    pods: kopf.Index,
    leases: kopf.Index,
    services: kopf.Index,
    nodes: kopf.Index,
    workloads: kopf.Index | None = None,
) -> float | None:
    """One pass; returns the seconds until it must run again: the job's next heartbeat deadline,
    sooner when something is left to retry (None: no deadline, the resync will do)."""
    if body.metadata.get("deletionTimestamp"):
        return None
    job = _parsed(memo, body)
    if job is None:
        return None  # admit() marked it Failed/InvalidSpec
    k: kube.Kube = memo.kube
    rv = str(body.metadata.get("resourceVersion", ""))
    # Read your own writes: kopf's copy may predate our last status writes, several of them while
    # its watch of the jobs is slow or re-listing.
    mine = own_writes(getattr(memo, "last_write", None), rv)
    if mine is not None:
        rv = mine.resource_version
        job = job.model_copy(update={"status": mine.status})
    now = datetime.now(UTC)
    job_pods = {p.name: p for p in pods.get((namespace, name), [])}
    workload = _workload(workloads, namespace, name, str(body.metadata.get("uid", "")))
    flavors = await _flavors(k, memo, workload)
    observed = Observed(
        pods=job_pods,
        leases={
            lease["metadata"]["name"]: lease_from_dict(lease, now)
            for lease in leases.get((namespace, name), [])
        },
        # Only the nodes the ladder reads, not a copy of the cluster's nodes: those of the job's pods
        # and of each slot's last pod (one that vanished is judged by its node: absent here reads
        # as NodeLost, a healthy node quarantined for a deleted pod).
        nodes={
            node: n
            for node in {p.node for p in job_pods.values()} | {s.node for s in job.status.node_slots}
            if node
            for n in nodes.get(node, [])
        },
        service_exists=bool(list(services.get((namespace, name), []))),
        refused=getattr(memo, "refused", {}).get(body.metadata.get("uid"), ""),
        create_refusal=getattr(memo, "create_refusal", None),
        events_posted=getattr(memo, "events_posted", None),
        progress_seen=getattr(memo, "progress_seen", None),
        workload=workload,
        flavors=flavors,
        api_failed_at=k.failed_at,
    )
    config = LadderConfig(
        fault_grace_seconds=SETTINGS.fault_grace_seconds,
        heartbeat_status_resolution_seconds=SETTINGS.heartbeat_status_resolution_seconds,
        kueue_enabled=SETTINGS.kueue_enabled,
        api_recovery_hold_seconds=SETTINGS.api_recovery_hold_seconds,
        quarantine_seconds=SETTINGS.quarantine_seconds,
    )
    placement = kueue_admission.placement(job, workload, flavors, SETTINGS.kueue_enabled)
    decision = decide(job, observed, now, config)
    if decision.status != job.status:
        try:
            new_rv = await k.patch_job_status(
                namespace, name, decision.status.model_dump(by_alias=True, mode="json"), rv
            )
        except kube.KubeError as exc:
            if exc.conflict or exc.not_found:
                logger.debug("status of %s/%s changed under this pass; next pass recomputes", namespace, name)
                return RETRY_SECONDS
            raise
        memo.last_write = OwnWrites((mine.replaced if mine else frozenset()) | {rv}, new_rv, decision.status)
        metrics.committed(namespace, name, decision.restarts, decision.recoveries)
        outcome = await act(k, job, decision, placement)
    else:
        outcome = await act(k, job, decision, placement)
    # Committed either way (just written, or unchanged since our write): post what it holds.
    await post_events(k, memo, body, decision.status)
    if outcome.invalid:
        # The API server refused a pod (or Service) built from an accepted spec: no retry can
        # succeed, so the next pass fails the job saying why instead of retrying forever. The CRD's
        # rules prevent every such case known (tests/reliability); this is the net for the rest.
        memo.refused = {body.metadata.get("uid"): "; ".join(outcome.invalid)}  # this job only, not a namesake
        return 0.0
    if remember_refusal(memo, namespace, name, outcome, now):
        return 0.0  # the next pass shows it on the job (condition + Event)
    if outcome.failed:
        return RETRY_SECONDS  # level-based: the next pass retries
    refusal: CreateRefusal | None = getattr(memo, "create_refusal", None)
    if outcome.refused is not None and refusal is not None:  # refused again: retried when its backoff ends
        return max(0.0, (create_refusals.retry_at(refusal) - now).total_seconds())
    status = decision.status
    metrics.set_conditions(
        namespace, name, frozenset(c.type for c in status.conditions if c.status == "True")
    )
    metrics.set_heartbeat_ages(namespace, name, decision.heartbeat_ages)
    metrics.set_goodput(namespace, name, goodput(status, now))
    ft = job.spec.fault_tolerance
    memo.watched_leases = wakeups.watched_leases(status, decision.heartbeat_ages, ft)
    return wakeups.next_deadline(decision.heartbeat_ages, ft, decision.due, now)


@dataclass(frozen=True)
class OwnWrites:
    """The status this operator last wrote, the resourceVersion it got, and every resourceVersion
    its writes replaced since kopf's copy of the job was last current. Not only the one before: a
    pass whose copy is two writes behind would otherwise write from that copy, conflict, and retry
    until the watch catches up, every status change and Event held back meanwhile."""

    replaced: frozenset[str]
    resource_version: str
    status: JobStatus


def own_writes(last: OwnWrites | None, resource_version: str) -> OwnWrites | None:
    """Our writes, when kopf's copy (at `resource_version`) is one they replaced; else None: the copy
    is current, or someone else changed the job since (the write's precondition then conflicts)."""
    return last if last is not None and resource_version in last.replaced else None


def _workload(workloads: kopf.Index | None, namespace: str, name: str, uid: str) -> WorkloadObs | None:
    """The job's own Workload (by its deterministic name: not a namesake's) from the index."""
    if workloads is None:
        return None
    wanted = kueue_admission.workload_name(name, uid)
    for obj in workloads.get((namespace, name), []):
        if (obj.get("metadata") or {}).get("name") == wanted:
            return workload_from_dict(obj)
    return None


async def _flavors(k: kube.Kube, memo: kopf.Memo, workload: WorkloadObs | None) -> dict[str, FlavorObs]:
    """The ResourceFlavors the Workload's admission names, read once per admission (a failed read
    fails the pass, which is retried: no pod is created without its admission's placement)."""
    cached: tuple[str, dict[str, FlavorObs]] = getattr(memo, "flavors", ("", {}))
    if workload is None or not workload.admitted:
        return {}
    key = repr(sorted(workload.assigned_flavors.items()))
    flavors = cached[1] if cached[0] == key else {}
    for name in sorted(kueue_admission.missing_flavors(workload, flavors)):
        obj = await k.get("ResourceFlavor", None, name)
        if obj is None:
            raise kube.KubeError(404, "NotFound", f"ResourceFlavor {name} named by Workload {workload.name}")
        flavors[name] = flavor_from_dict(obj)
    memo.flavors = (key, flavors)
    return flavors


def _parsed(memo: kopf.Memo, body: kopf.Body) -> ResilientTrainingJob | None:
    """parse_job, once per version of the job (most passes see an unchanged job)."""
    rv = body.metadata.get("resourceVersion")
    cached = getattr(memo, "parsed", None)
    if cached is None or cached[0] != rv or rv is None:
        memo.parsed = cached = (rv, parse_job(body)[0])
    return cached[1]


async def post_events(k: kube.Kube, memo: kopf.Memo, body: kopf.Body, status: JobStatus) -> None:
    """Post the committed status's unposted Events in order (rtj.ladder.event_outbox); the next pass
    drops those posted. Stops at the first failure, so a later Event never overtakes an earlier one."""
    posted = getattr(memo, "events_posted", None)
    plain = _plain_job(body)
    uid = str(body.metadata.get("uid", ""))
    for ev in status.unposted_events:
        if posted is not None and ev.seq <= posted:
            continue
        name = event_outbox.event_name(str(body.metadata.get("name", "")), uid, ev.seq)
        if not await k.emit_event(plain, ev.type, ev.reason, ev.message, name=name, when=ev.time):
            return
        memo.events_posted = posted = ev.seq


@dataclass
class ActOutcome:
    #: Why the API server refused objects the builders made as invalid (422: never retried).
    invalid: list[str] = field(default_factory=list)
    #: Creates refused for a reason that may end (403, ...): the newest (status, reason, message).
    refused: tuple[int, str, str] | None = None
    #: Whether any create was accepted (a remembered refusal is then over).
    created: bool = False
    #: Whether any other call failed (the next pass retries it).
    failed: bool = False


def remember_refusal(memo: kopf.Memo, namespace: str, name: str, outcome: ActOutcome, now: datetime) -> bool:
    """Keep the job's newest create refusal for the next pass (rtj.ladder.create_refusals); True when
    it is new. The log gets one line per new refusal message, not one per retry."""
    previous: CreateRefusal | None = getattr(memo, "create_refusal", None)
    if outcome.refused is not None:
        status, reason, message = outcome.refused
        metrics.create_refused(namespace, name, status)
        memo.create_refusal = create_refusals.next_refusal(previous, status, reason, message, now)
        if previous is None or previous.message != message:
            logger.warning("%s/%s: the API server refused a create (%s, retried with backoff): %s",
                           namespace, name, status, message)  # fmt: skip
            return True
        return False
    if outcome.created and previous is not None:
        memo.create_refusal = None
        logger.info("%s/%s: creates accepted again", namespace, name)
    return False


async def act(
    k: kube.Kube,
    job: ResilientTrainingJob,
    decision: Decision,
    placement: dict[str, kueue_admission.Placement] | None = None,
) -> ActOutcome:
    """Execute a decision's actions, bounded in parallel (failures are retried by the next pass).
    `placement`: what a Kueue admission adds to the pods of each pod set (rtj.ladder.kueue_admission)."""
    ns, name = job.metadata["namespace"], job.metadata["name"]
    bs = builders.BuildSettings(
        trainer_service_account=SETTINGS.trainer_service_account,
        termination_grace_seconds=SETTINGS.termination_grace_seconds,
    )
    gate = asyncio.Semaphore(PARALLEL_CALLS)

    def placed(pod: dict[str, Any]) -> dict[str, Any]:
        role = pod["metadata"]["labels"].get(contract.LABEL_ROLE, "")
        where = (placement or {}).get(kueue_admission.PODSET_OF_ROLE.get(role, ""))
        return (
            pod
            if where is None
            else builders.place(pod, where.node_selector, where.tolerations, where.labels)
        )

    outcome = ActOutcome()
    refusals: list[tuple[int, kube.KubeError]] = []

    async def one(action: Any) -> bool:
        async with gate:
            try:
                match action:
                    case DeletePod():
                        await k.delete("Pod", ns, action.name, action.uid, action.grace_seconds)
                    case CreateWorkerPod():
                        # The slot's replica Service first (AlreadyExists is success): created with
                        # the slot's first pod, kept for the job's life (owner reference).
                        if (svc := builders.replica_service(job, action.slot)) is not None:
                            await k.create(svc)
                        await k.create(
                            placed(
                                builders.worker_pod(
                                    job, action.slot, action.attempt, action.cause, action.avoid_nodes, bs
                                )
                            )
                        )
                    case CreateSparePod():
                        await k.create(
                            placed(
                                builders.spare_pod(job, action.index, action.attempt, action.avoid_nodes, bs)
                            )
                        )
                    case CreateRendezvousPod():
                        await k.create(placed(builders.rendezvous_pod(job, bs)))
                    case CreateRendezvousService():
                        await k.create(builders.rendezvous_service(job))
                    case TaintNode():
                        until = action.until or datetime.now(UTC)
                        await k.patch_node(
                            action.node,
                            lambda obj, a=action, u=until: quarantine.taint_patch(
                                obj, a.reason, a.job, a.evidence, u, datetime.now(UTC)
                            ),
                        )
                    case RecordNodeFault():
                        await k.patch_node(
                            action.node,
                            lambda obj, a=action: quarantine.fault_record_patch(obj, a.job, a.reason, a.time),
                        )
                    case PromoteSpare():
                        return await k.patch(
                            "Pod",
                            ns,
                            action.pod,
                            builders.promotion_patch(action.slot, action.attempt, action.cause),
                        )
                    case AssignLease():
                        await k.patch(
                            "Lease",
                            ns,
                            contract.lease_name(action.lease),
                            builders.assign_lease_patch(action.slot),
                        )
                    case FenceLease():
                        await k.patch(
                            "Lease",
                            ns,
                            contract.lease_name(action.lease),
                            builders.fence_lease_patch(action.reason),
                        )
                    case DeleteLease():
                        await k.delete("Lease", ns, contract.lease_name(action.lease))
                    case DeleteJob():
                        await k.delete_job(ns, name, str(job.metadata.get("uid", "")))
                    case CreateWorkload():
                        await k.create(builders.workload(job, bs))
                    case PatchWorkloadStatus():
                        await k.patch_workload_status(ns, action.name, action.status, action.resource_version)
            except kube.KubeError as exc:  # the next pass retries (level-based)
                if isinstance(action, CREATES) and create_refusals.is_retryable_refusal(exc.status):
                    # Logged once per new message by remember_refusal (a refusal repeats every retry).
                    refusals.append((decision.actions.index(action), exc))
                    return False
                logger.warning("%s/%s: %s failed: %s", ns, name, type(action).__name__, exc)
                outcome.failed = True
                if exc.invalid and isinstance(action, CREATES):
                    outcome.invalid.append(f"the API server refused {exc.message}")
                return False
            if isinstance(action, CREATES):
                outcome.created = True
            return True

    # Deletions first; the promotion signal on a spare's Lease only after its pod was relabelled
    # into the slot (the ladder's commit), so a trainer never joins for a slot the ladder still
    # sees empty.
    deletes = [a for a in decision.actions if isinstance(a, DeletePod)]
    signals = [a for a in decision.actions if isinstance(a, AssignLease)]
    others = [a for a in decision.actions if not isinstance(a, DeletePod | AssignLease)]
    await asyncio.gather(*(one(a) for a in deletes))
    results = await asyncio.gather(*(one(a) for a in others))
    failed = {a.pod for a, ok in zip(others, results, strict=True) if isinstance(a, PromoteSpare) and not ok}
    await asyncio.gather(*(one(a) for a in signals if a.lease not in failed))
    if refusals:
        # The first refused create in the decision's order, not the last to return: an unchanged
        # cause keeps an unchanged message (one Event), whatever order parallel creates finish in.
        exc = min(refusals, key=lambda r: r[0])[1]
        outcome.refused = (exc.status, exc.server_reason, exc.message)
    return outcome
