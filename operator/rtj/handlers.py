"""kopf wiring: level-based. `kopf run -m rtj.handlers` or `python -m rtj`.

- Indexes of our pods, heartbeat Leases, rendezvous Services (label-selected: only objects
  carrying LABEL_JOB are watched) and Nodes, so a pass needs no LIST call.
- One loop per job (an asyncio task that `track_job` starts, feeds and stops from the job's watch
  events; not a kopf daemon, which would put a finalizer on every job) runs a pass (rtj.job_pass):
  observe (indexes) -> decide (pure) -> ONE status write (resourceVersion precondition) -> act
  (rtj.executor) -> Events (from the status's outbox) -> metrics. It runs on change, not on a clock
  (rtj.ladder.wakeups, issue 18): when the job or one of its pods changes, when a Lease's content
  (not its renewal) changes, when a stale slot renews, at the job's next heartbeat deadline, and at
  the slow resync RTJ_RECONCILE_INTERVAL_SECONDS (default 30 s). Measured by bench/operator_scale.py:
  a 1 s timer per job was most of the operator's CPU at 300 jobs, and a timer alone put 1-2
  intervals between a missed heartbeat deadline and the replacement pod.
- create/resume: validate the spec (rtj.validation: PermanentError + Failed/InvalidSpec) and ensure
  the checkpoint volume; delete: remove what garbage collection cannot (the cluster-scoped FSx PV),
  hence kopf's finalizer (contract.FINALIZER), on jobs that have one only (`holds_cluster_state`).
  Everything else is owned by the job and garbage collected. A node quarantine is the node's, not the
  job's (rtj.ladder.quarantine): deleting a job leaves it.
- The settings (SETTINGS) and the clock (`_now`) are read here and passed down; kopf's memos are
  read through their typed views (rtj.memo).

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
import functools
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf

from rtj import (
    builders,
    contract,
    executor,
    heartbeat_delivery,
    job_pass,
    kube,
    leader_election,
    metrics,
    validation,
    watch_guard,
)
from rtj.api.models import ResilientTrainingJob
from rtj.executor import ActOutcome
from rtj.job_pass import RETRY_SECONDS
from rtj.ladder import (
    OBSERVED_AT,
    Decision,
    heartbeat_budget,
    kueue_admission,
    node_from_dict,
    pod_from_dict,
    quarantine,
    wakeups,
)
from rtj.ladder.observe import NodeObs, progress_seen
from rtj.memo import JobMemo, OperatorMemo
from rtj.memo import OwnWrites as OwnWrites  # re-exported: tests and callers name them here
from rtj.memo import own_writes as own_writes
from rtj.settings import Settings

SETTINGS = Settings.from_env()
GROUP, VERSION, PLURAL = contract.API_GROUP, contract.API_VERSION, contract.PLURAL
OURS = {contract.LABEL_JOB: kopf.PRESENT}
#: Events of a job's pods arriving within this window wake its pass once.
WAKE_DEBOUNCE_SECONDS = 0.02
logger = logging.getLogger("rtj.operator")


def _now() -> datetime:
    """The operator's clock: read here only, and passed down (a test freezes it here)."""
    return datetime.now(UTC)


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
        settings.peering.standalone = True  # one active replica: alone, or elected (rtj.leader_election)
    # Progress and diff-base in our own annotations; status belongs to the ladder alone.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = contract.FINALIZER
    operator = OperatorMemo(memo)
    operator.kube = k = kube.Kube.from_environment(SETTINGS.request_timeout_seconds)
    if (election := leader_election.current()) is not None:
        k.write_fence = election.fence.check  # no write after the renew deadline (rtj.leader_election)
    metrics.LEADER.set(1)  # the active operator: elected, or alone
    metrics.serve(SETTINGS.metrics_port)
    # kopf never restarts a watch stream that failed (nolar/kopf#1276): a dead one ends the process.
    operator.watch_guard = watch_guard.WatchGuard().start()
    operator.quarantine_review = asyncio.create_task(review_quarantines(k), name="rtj-quarantine-review")
    logger.info(
        "rtj operator started (metrics on :%s, interval %ss)",
        SETTINGS.metrics_port,
        SETTINGS.reconcile_interval_seconds,
    )


#: How often the operator looks for quarantines whose check is due (rtj.ladder.quarantine.review).
#: A quarantined node that booted again is reviewed as soon as the node index sees it change
#: (`_REVIEW_WAKE`), not a round later.
QUARANTINE_REVIEW_SECONDS = 60.0


@dataclass
class _ReviewWake:
    """Runs the quarantine review at once, from kopf's index threads: set by the Node index when a
    quarantined node that booted again changes (rtj.ladder.quarantine.rebooted), so a node repaired
    by a reboot is lifted seconds after it reports healthy. Many wakes before a round: one round."""

    loop: asyncio.AbstractEventLoop | None = None
    event: asyncio.Event | None = None

    def start(self) -> asyncio.Event:
        """Bind to the running loop (the review task's)."""
        self.loop, self.event = asyncio.get_running_loop(), asyncio.Event()
        return self.event

    def set(self) -> None:
        if self.loop is not None and self.event is not None:
            self.loop.call_soon_threadsafe(self.event.set)


_REVIEW_WAKE = _ReviewWake()


async def review_quarantines(k: kube.Kube) -> None:
    """Lift the quarantines whose check is due, or whose node booted again, and whose node shows no
    evidence; extend the due others. One round goes over the Node index (no LIST), every
    QUARANTINE_REVIEW_SECONDS or when `_REVIEW_WAKE` is set."""
    wake = _REVIEW_WAKE.start()
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), QUARANTINE_REVIEW_SECONDS)
        wake.clear()
        now = _now()
        for node in list(_NODE_STATE.values()):
            outcome = quarantine.review(node, now)
            try:
                if outcome.action == "lift":
                    # Decided again on the node as read for the patch (its resourceVersion).
                    if await k.patch_node(node.name, functools.partial(quarantine.lift_if_due, now=now)):
                        logger.info("%s", outcome.message)
                elif outcome.action == "extend":
                    later = now + timedelta(seconds=SETTINGS.quarantine_seconds)
                    await k.patch_node(node.name, functools.partial(quarantine.extend_patch, until=later))
                    logger.info("node %s stays quarantined: %s", node.name, outcome.message)
            except kube.KubeError as exc:  # a Conflict or an outage: the next round retries
                logger.warning("quarantine review of node %s: %s", node.name, exc)


@kopf.on.cleanup()
async def shutdown(memo: kopf.Memo, **_: Any) -> None:
    operator = OperatorMemo(memo)
    if operator.quarantine_review is not None:
        operator.quarantine_review.cancel()
    if operator.watch_guard is not None:
        await operator.watch_guard.stop()
    for key in list(_LOOPS):
        _stop_loop(key)
    if operator.kube is not None:
        operator.kube.close()


@kopf.on.probe(id="apiClient")
def api_client_ready(memo: kopf.Memo, **_: Any) -> bool:
    return OperatorMemo(memo).kube is not None


@kopf.on.probe(id="watches")
async def watches(**_: Any) -> list[str]:
    """kopf's running watch streams, by task name (rtj.watch_guard): /healthz shows what is watched."""
    return watch_guard.live_watches(asyncio.all_tasks())


# --- indexes (label-selected watches; values are small immutable observations) ----------------------
# kopf types `namespace` str | None for every resource; a namespaced one's is a str.
@kopf.index("pods", labels=OURS)  # type: ignore[arg-type]
def rtj_pods(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Any, Any]:
    key, pod = (namespace, labels[contract.LABEL_JOB]), pod_from_dict(_plain(body))
    if pod.node:
        _JOBS_ON_NODE.setdefault(pod.node, set()).add(key)
    return {key: pod}


# kopf types `namespace` str | None for every resource; a namespaced one's is a str.
@kopf.index("coordination.k8s.io", "v1", "leases", labels=OURS)  # type: ignore[arg-type]
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
    reading = wakeups.read_heartbeat(annotations)
    # Every renewal, not only those that wake a pass: when the step last rose (the progress watchdog).
    renewed = contract.parse_time(renew_time)
    state = job_loop.state
    when = min(renewed, arrived) if renewed else None
    state.progress_seen = progress_seen(state.progress_seen, reading.step, when)
    if job_loop.lease_digests.get(name) != reading.digest or name in state.watched_leases:
        job_loop.lease_digests[name] = reading.digest
        job_loop.wake.set()
    elif job_loop.lease_progress.get(name) != reading.progress:
        job_loop.refresh_progress()
    job_loop.lease_progress[name] = reading.progress


@kopf.index(
    "services", labels={contract.LABEL_JOB: kopf.PRESENT, contract.LABEL_ROLE: contract.ROLE_RENDEZVOUS}
)
def rtj_services(namespace: str | None, labels: kopf.Labels, name: str, **_: Any) -> dict[Any, Any]:
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
        if quarantine.rebooted(node):  # repaired by a reboot? the review decides at once
            _REVIEW_WAKE.set()
    return {name: node}


def rtj_workloads(namespace: str | None, labels: kopf.Labels, body: kopf.Body, **_: Any) -> dict[Any, Any]:
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
    # kopf types `namespace` str | None for every resource; a namespaced one's is a str.
    kopf.on.event(*_WORKLOADS, labels=OURS)(wake_on_workload_change)  # type: ignore[arg-type]


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
def parse_job(body: kopf.Body) -> tuple[ResilientTrainingJob | None, str]:
    """The job, or None and a message naming the field that makes it invalid (rtj.validation, with
    this operator's settings)."""
    return validation.parse_job(body, SETTINGS.fsx_enabled)


@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.resume(GROUP, VERSION, PLURAL)
async def admit(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Validate, then make sure the checkpoint volume exists (the job's loop of passes does the rest)."""
    k = JobMemo(memo).kube
    job, message = parse_job(body)
    if job is None:
        await validation.mark_invalid(k, body, message, _now())
        raise kopf.PermanentError(f"invalid spec: {message}")
    pvc = builders.fsx_persistent_volume_claim(job)
    try:
        if pvc is not None:
            # No PV while the job's PVC is bound to one of its own (builders.fsx_pv_to_create: after an
            # upgrade, the PV of the name before); else ours, then the PVC naming it.
            pvs = await k.fsx_pvs(str(job.metadata["namespace"]), str(job.metadata["name"]))
            for obj in (builders.fsx_pv_to_create(job, pvs), pvc):
                if obj is not None:
                    await k.create(obj)
    except kube.KubeError as exc:
        if exc.invalid:
            message = f"the API server refused the job's checkpoint volume: {exc.message}"
            await validation.mark_invalid(k, body, message, _now())
            raise kopf.PermanentError(message) from exc
        raise kopf.TemporaryError(f"checkpoint volume not created yet: {exc}", delay=5) from exc


def holds_cluster_state(spec: kopf.Spec, **_: Any) -> bool:
    """The job may have what garbage collection cannot undo: a cluster-scoped FSx PV. Only then does
    the job carry kopf's finalizer (kopf adds it when this turns true and removes it when false):
    every other child is owned by the job and collected by garbage collection, so a job without one is
    deletable with no operator running (a namespace never stays Terminating for want of it). Node
    quarantines are the nodes' (rtj.ladder.quarantine): deleting a job leaves them.

    Never with FSx disabled (RTJ_FSX_ENABLED false, the chart's fsx.enabled=false): such an operator
    refuses the spec (rtj.validation) and creates no PV, and the chart grants it no right on PVs, so
    its delete handler could only retry a Forbidden LIST forever, a job that cannot be deleted. kopf
    then also removes the finalizer from jobs an operator with FSx put it on: their PVs, if any, stay
    (reclaim policy Retain; `kubectl delete pv -l <builders.fsx_pv_selector>`)."""
    return SETTINGS.fsx_enabled and bool((spec.get("checkpoint") or {}).get("fsx"))


# kopf types `namespace` str | None for every resource; a namespaced one's is a str.
@kopf.on.delete(GROUP, VERSION, PLURAL, when=holds_cluster_state)  # type: ignore[arg-type]
async def cleanup(memo: kopf.Memo, namespace: str, name: str, **_: Any) -> None:
    """Undo what garbage collection cannot: every FSx PV whose labels name this job, under this
    operator's name or an earlier one's (rtj.kube.Kube.delete_fsx_pvs; never a PV of another job),
    each under its UID. pv-protection holds each until garbage collection removed the job's PVC."""
    k = JobMemo(memo).kube
    try:
        deleted = await k.delete_fsx_pvs(namespace, name)
    except kube.KubeError as exc:
        raise kopf.TemporaryError(f"cleanup not finished: {exc}", delay=5) from exc
    if deleted:
        logger.info("job %s/%s deleted: PV %s deleted", namespace, name, ", ".join(deleted))


# --- the pass ----------------------------------------------------------------------------------------
# kopf types `namespace` str | None for every resource; a namespaced one's is a str.
@kopf.on.event("pods", labels=OURS)  # type: ignore[arg-type]
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
    #: kopf's memo of this object, where the job's state is kept across passes (`state`).
    memo: kopf.Memo
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    #: Lease name -> rtj.ladder.wakeups.heartbeat_digest of its last version seen.
    lease_digests: dict[str, str] = field(default_factory=dict)
    #: Lease name -> its renewTime last seen (rtj.heartbeat_delivery measures the next one).
    lease_renew_times: dict[str, Any] = field(default_factory=dict)
    #: Lease name -> rtj.ladder.wakeups.HeartbeatReading.progress of its last version seen.
    lease_progress: dict[str, str] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    #: The event loop the passes run in (the Lease index's sync handler runs in kopf's threads).
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    #: loop.time() when the last pass started; the progress refresh counts from it.
    last_pass_at: float = float("-inf")
    #: The timer of a pending progress refresh (None: no newer progress since the last pass).
    refresh_timer: asyncio.TimerHandle | None = None
    #: Newer progress was seen since the last pass (set from any thread; the timer is the loop's).
    progress_pending: bool = False

    def refresh_progress(self) -> None:
        """A renewal carried newer progress: run a pass RTJ_PROGRESS_REFRESH_SECONDS after the last
        one (at once if that is past), one pass for any number of such renewals meanwhile."""
        if not self.progress_pending:
            self.progress_pending = True
            self.loop.call_soon_threadsafe(self._arm_refresh)

    def _arm_refresh(self) -> None:
        if self.progress_pending and self.refresh_timer is None:
            due = self.last_pass_at + SETTINGS.progress_refresh_seconds - self.loop.time()
            self.refresh_timer = self.loop.call_later(max(0.0, due), self.wake.set)

    def pass_started(self) -> None:
        """A pass reads every Lease as it is now: the pending refresh is served."""
        self.last_pass_at = self.loop.time()
        self.progress_pending = False
        if self.refresh_timer is not None:
            self.refresh_timer.cancel()
            self.refresh_timer = None

    @property
    def state(self) -> JobMemo:
        """The job's state kept across passes: its memo, typed."""
        return JobMemo(self.memo)


#: (namespace, job) -> its loop.
_LOOPS: dict[tuple[str, str], _JobLoop] = {}


# kopf types namespace str | None (ours is namespaced), and passes the indexes as keyword arguments
# its handler type cannot name.
@kopf.on.event(GROUP, VERSION, PLURAL)  # type: ignore[arg-type]
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
    if job_loop is not None and job_loop.refresh_timer is not None:
        job_loop.refresh_timer.cancel()


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
        job_loop.pass_started()
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
    pods: kopf.Index[Any, Any],
    leases: kopf.Index[Any, Any],
    services: kopf.Index[Any, Any],
    nodes: kopf.Index[Any, Any],
    workloads: kopf.Index[Any, Any] | None = None,
) -> float | None:
    """One pass of the job (rtj.job_pass.run_pass), with this operator's settings and clock; returns
    the seconds until it must run again (None: no deadline, the resync will do)."""
    indexes = job_pass.Indexes(pods, leases, services, nodes, workloads)
    # The other jobs' pods share the heartbeat budget: O(jobs) per pass, from the loops' job objects.
    others = heartbeat_budget.fleet(j.body for key, j in _LOOPS.items() if key != (namespace, name))
    return await job_pass.run_pass(body, JobMemo(memo), namespace, name, indexes, SETTINGS, _now, others)


async def act(
    k: kube.Kube,
    job: ResilientTrainingJob,
    decision: Decision,
    placement: dict[str, kueue_admission.Placement] | None = None,
) -> ActOutcome:
    """Execute a decision's actions (rtj.executor.act), with this operator's settings and clock."""
    return await executor.act(k, job, decision, executor.build_settings(SETTINGS), _now, placement)
