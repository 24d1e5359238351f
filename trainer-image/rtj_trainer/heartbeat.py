"""The pod's heartbeat agent: rank status files in, one heartbeat Lease out.

Every `heartbeat_interval_seconds` the agent reads the rank files (`report.RankReporter`) from the
pod-local status dir, aggregates them into a `contract.Heartbeat` (`Aggregator`, pure logic) and
creates or renews the pod's Lease (`LeaseWriter`): `spec.renewTime` is the heartbeat, the
`HEARTBEAT_ANNOTATION` holds the JSON, an ownerReference to the pod lets garbage collection
delete it with the pod. API errors are logged and retried at the next tick; nothing here may
crash the entrypoint.

A hot spare's agent (`standby=True`) reports `Standby` and renews every STANDBY_RENEW_SECONDS:
each renewal returns the Lease, and the operator's ASSIGNED_SLOT_ANNOTATION on it is the
promotion signal (`promoted` is set; from then on the agent reports what the ranks report).

Partition detection: every heartbeat carries the pod's reach endpoint (`reach.ReachResponder`). A
REACH_PROBE_ANNOTATION on the Lease with a new id makes the agent probe the peers it names
(`reach.probe`, on a thread of its own: the renewals go on meanwhile, one probe at a time) and
publish the `ReachReport` at once, not a renew period later.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol, cast

from rtj.contract import (
    API_GROUP,
    API_VERSION,
    ASSIGNED_SLOT_ANNOTATION,
    COLLATERAL_FAULT_REASONS,
    FAULT_SEVERITY_RANK,
    FENCED_ANNOTATION,
    HEARTBEAT_ANNOTATION,
    KIND,
    LABEL_JOB,
    MAX_COUNTER,
    RANK_FILE_PREFIX,
    RANK_FILE_SUFFIX,
    STANDBY_RENEW_SECONDS,
    CheckpointRef,
    ExitCode,
    Fault,
    FaultReason,
    FaultSeverity,
    Heartbeat,
    PodState,
    RankReport,
    ReachProbe,
    ReachReport,
    lease_duration_seconds,
    lease_name,
    micro_time,
    parse_rank_report,
    parse_reach_probe,
    parse_renew_period,
)

from .pids import pid_alive
from .rank_exit import RankExit, read_exit
from .reach import probe

log = logging.getLogger(__name__)


# Higher = more severe; the pod reports the most severe state any active rank is in.
_STATE_SEVERITY = {
    PodState.FINISHED: 0,
    PodState.TRAINING: 1,
    PodState.CHECKPOINTING: 2,
    PodState.STARTING: 3,
    PodState.IN_PROCESS_RESTARTING: 4,
    PodState.IN_JOB_RESTARTING: 5,
}


def read_rank_files(status_dir: str, prefix: str = RANK_FILE_PREFIX) -> list[RankReport]:
    """Every readable rank file in `status_dir` (a file being replaced is simply read next time);
    `prefix`: files of another kind in a rank file's format (`runtime_env.PERMANENT_FILE_PREFIX`)."""
    reports = []
    try:
        names = os.listdir(status_dir)
    except OSError:
        return []
    for name in names:
        if not (name.startswith(prefix) and name.endswith(RANK_FILE_SUFFIX)):
            continue
        try:
            with open(os.path.join(status_dir, name), "rb") as f:
                report = parse_rank_report(f.read())
        except OSError:
            continue
        if report is not None:
            reports.append(report)
    return reports


@dataclass
class Aggregator:
    """Folds rank reports into the pod's Heartbeat; keeps what must survive rank restarts.

    - state: the most severe state of the ranks; a rank whose process is gone (and did not
      finish) means the launcher is restarting its workers: InJobRestarting.
    - step: the minimum over ranks that reported one (the pod is only as far as its slowest rank);
      while no rank has reported yet (workers restarting), the last known step.
    - in-job restarts: how often the launcher restarted this pod's workers, seen as new worker
      PIDs per local rank (a restart caused by a peer pod's failure keeps the launcher's own
      TORCHELASTIC_RESTART_COUNT unchanged but is a restart here too); never less than that count.
    - in-process restarts: counted per worker generation (a restarted worker starts from 0
      again) and summed, so the reported total never goes down and never double-counts.
    - memory snapshot: the newest step every rank holds in the pod's memory tier (the minimum over
      ranks); while some rank has not reported one (a restarted worker), the last known. The
      replica step (the newest snapshot the peer pod holds for every rank) follows the same rule.
    - persist seconds: the longest any rank took to write its shard to the volume (never shrinks).
    - checkpoint: newest committed.
    - fault: of the current incident, hard over soft, a root cause over a collateral one
      (`PeerFailure`, `RankStopped`), then the newest. A soft fault the pod has recovered from (an
      update after it found every rank training) gives way to any newer fault: the next incident's
      collateral fault is news, the last incident's root cause is not.
    - a rank whose process is gone while it was starting or training had no chance to report why:
      the agent reports it (`RankExited`, or `RankStopped` for its launcher's SIGTERM unless it was
      silent past rankHangTimeoutSeconds: hung), with the exit code or signal the rank
      forkserver recorded (`rank_exit.RankExit`).
    """

    last_step: int = 0
    in_job_restarts: int = 0
    in_process_by_generation: dict[int, int] = field(default_factory=dict)
    #: local rank -> worker PIDs seen, in order; a PID's index is its generation.
    pids_by_local_rank: dict[int, list[int]] = field(default_factory=dict)
    checkpoint: CheckpointRef | None = None
    memory_snapshot_step: int | None = None
    replica_step: int | None = None
    persist_seconds: float | None = None
    checkpoints_skipped: int = 0
    fault: Fault | None = None
    #: The held fault is over: an update since found every rank training.
    fault_over: bool = False
    #: Rank pids whose end was already looked at, and the faults already weighed.
    exits_seen: set[int] = field(default_factory=set)
    faults_seen: set[Fault] = field(default_factory=set)
    #: Each local rank's report as last read: a rank restarted between two updates is seen gone
    #: only as a new pid, and this is what its predecessor last said.
    last_reports: dict[int, RankReport] = field(default_factory=dict)
    #: The job's rankHangTimeoutSeconds: how long a rank NVRx stops as hung was silent.
    rank_hang_timeout_seconds: float | None = None

    def update(
        self,
        reports: Iterable[RankReport],
        is_alive: Callable[[int], bool] = pid_alive,
        exit_of: Callable[[RankReport], RankExit | None] = lambda _report: None,
        now: datetime | None = None,
    ) -> Heartbeat:
        now = now or datetime.now(UTC)
        severity = -1
        state = PodState.STARTING
        steps: list[int] = []
        memory_steps: list[int | None] = []
        replica_steps: list[int | None] = []
        for report in reports:
            # Standby is the agent's own state, never a rank's: it reads as Starting.
            rank_state = report.state if report.state in _STATE_SEVERITY else PodState.STARTING
            pid = report.pid
            if report.local_rank is not None:
                before = self.last_reports.get(report.local_rank)
                if before is not None and before.pid != pid:  # restarted between two updates
                    self._rank_ended(before, exit_of, now)
                self.last_reports[report.local_rank] = report
            if rank_state is not PodState.FINISHED and pid is not None and not is_alive(pid):
                rank_state = PodState.IN_JOB_RESTARTING
                self._rank_ended(report, exit_of, now)
            if _STATE_SEVERITY[rank_state] > severity:
                severity, state = _STATE_SEVERITY[rank_state], rank_state

            if report.step is not None and rank_state is not PodState.IN_JOB_RESTARTING:
                steps.append(report.step)
            generation = self._generation(report.local_rank, pid)
            self.in_job_restarts = max(self.in_job_restarts, generation, report.in_job_restarts)
            self.in_process_by_generation[generation] = max(
                self.in_process_by_generation.get(generation, 0), report.in_process_restarts
            )
            self.checkpoints_skipped = max(self.checkpoints_skipped, report.checkpoints_skipped)
            if report.checkpoint is not None and (
                self.checkpoint is None or report.checkpoint.step > self.checkpoint.step
            ):
                self.checkpoint = report.checkpoint
            if report.fault is not None:
                self.record_fault(report.fault)
            memory_steps.append(report.memory_snapshot_step)
            replica_steps.append(report.replica_step)
            if report.persist_seconds is not None:
                self.persist_seconds = max(self.persist_seconds or 0.0, report.persist_seconds)
        if memory_steps and None not in memory_steps:
            self.memory_snapshot_step = min(s for s in memory_steps if s is not None)
        if replica_steps and None not in replica_steps:
            self.replica_step = min(s for s in replica_steps if s is not None)
        if steps:
            self.last_step = min(steps)
        if state in (PodState.TRAINING, PodState.CHECKPOINTING):
            self.fault_over = True
        return self.heartbeat(state)

    def _rank_ended(
        self, report: RankReport, exit_of: Callable[[RankReport], RankExit | None], now: datetime
    ) -> None:
        if report.pid is None or report.pid in self.exits_seen:
            return
        self.exits_seen.add(report.pid)
        if (fault := exit_fault(report, exit_of(report), now, self.rank_hang_timeout_seconds)) is not None:
            self.record_fault(fault)

    def _generation(self, local_rank: int | None, pid: int | None) -> int:
        if local_rank is None or pid is None:
            return 0
        pids = self.pids_by_local_rank.setdefault(local_rank, [])
        if pid not in pids:
            pids.append(pid)
        return pids.index(pid)

    def heartbeat(self, state: PodState) -> Heartbeat:
        return Heartbeat(
            state=state,
            in_process_restarts=min(sum(self.in_process_by_generation.values()), MAX_COUNTER),
            in_job_restarts=self.in_job_restarts,
            step=self.last_step,
            checkpoint=self.checkpoint,
            memory_snapshot_step=self.memory_snapshot_step,
            replica_step=self.replica_step,
            persist_seconds=self.persist_seconds,
            checkpoints_skipped=self.checkpoints_skipped,
            fault=self.fault,
        )

    def record_fault(self, fault: Fault) -> None:
        """A rank's fault, or one classified by the entrypoint itself (e.g. the launcher gave up):
        kept when it outranks the one held, or is newer than a soft one the pod recovered from.
        Each fault counts once: a rank file keeps its fault after the rank recovered."""
        if fault in self.faults_seen:
            return
        self.faults_seen.add(fault)
        held = self.fault
        if (
            held is None
            or _fault_priority(fault) > _fault_priority(held)
            or (self.fault_over and held.severity is FaultSeverity.SOFT and fault.time > held.time)
        ):
            self.fault, self.fault_over = fault, False


#: The rank states in which a rank's end is news: it reported no fault that explains it.
_UNEXPLAINED_END = (PodState.STARTING, PodState.TRAINING, PodState.CHECKPOINTING)


def exit_fault(
    report: RankReport, how: RankExit | None, now: datetime, rank_hang_timeout: float | None = None
) -> Fault | None:
    """The fault a rank gone in `report.state` did not report itself (None: it did, or it was
    stopped gracefully with ExitCode.TERMINATED after the pod's SIGTERM). `rank_hang_timeout`: the
    rankHangTimeoutSeconds after which NVRx stops a silent rank; a rank that ended at least
    that long after its last heartbeat (its last report, where it sent none) was hung, whatever
    signal ended it."""
    if report.state not in _UNEXPLAINED_END:
        return None
    if how is not None and how.code == ExitCode.TERMINATED:
        return None
    when = datetime.fromtimestamp(how.time, UTC) if how is not None else now
    ended = how.describe() if how is not None else "ended"
    doing = f"{ended} while {report.state.lower()}" + (
        f" at step {report.step}" if report.step is not None else ""
    )
    who = f"local rank {report.local_rank} (rank {report.rank}, pid {report.pid})"
    heard, last = (
        (report.heartbeat, "heartbeat") if report.heartbeat is not None else (report.updated, "report")
    )
    quiet = (when - heard).total_seconds() if heard is not None else None
    hung = rank_hang_timeout is not None and quiet is not None and quiet >= rank_hang_timeout
    if how is not None and how.signal == signal.SIGTERM and not hung:
        text = f"{who} {doing}: its launcher restarts the workers"
        return Fault(severity=FaultSeverity.SOFT, reason=FaultReason.RANK_STOPPED, message=text, time=when)
    text = f"{who} {doing}"
    if quiet is not None:
        text += f", {quiet:.0f}s after its last {last}"
    text += f": hung past rankHangTimeoutSeconds={rank_hang_timeout:g}" if hung else ", reporting no fault"
    return Fault(severity=FaultSeverity.SOFT, reason=FaultReason.RANK_EXITED, message=text, time=when)


def _fault_priority(fault: Fault) -> tuple[int, int, datetime]:
    """Permanent before hard before soft, a root cause before its collateral, then the newest."""
    return (
        FAULT_SEVERITY_RANK[fault.severity],
        0 if fault.reason in COLLATERAL_FAULT_REASONS else 1,
        fault.time,
    )


# --- Kubernetes side ---------------------------------------------------------------------------

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def load_api_client() -> Any | None:
    """In-cluster config when running in a pod, else KUBECONFIG (tests), else None (no Lease)."""
    try:
        from kubernetes import client, config
    except ImportError:
        log.warning("kubernetes client not installed: heartbeat Lease disabled")
        return None
    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST") and os.path.exists(
            os.path.join(SERVICE_ACCOUNT_DIR, "token")
        ):
            config.load_incluster_config()
            return client.ApiClient()
        kubeconfig = os.environ.get("KUBECONFIG")
        if kubeconfig:
            return config.new_client_from_config(config_file=kubeconfig)
    except Exception as exc:  # never let configuration problems stop training
        log.error("cannot configure the Kubernetes client (%s): heartbeat Lease disabled", type(exc).__name__)
        return None
    log.warning("no in-cluster config and no KUBECONFIG: heartbeat Lease disabled")
    return None


@dataclass
class PodIdentity:
    name: str
    namespace: str
    uid: str | None
    node_name: str | None = None
    pod_ip: str | None = None
    #: Labels the Lease with LABEL_JOB: the operator selects heartbeat Leases by that label.
    job_name: str | None = None
    #: Owns a Lease recreated after it vanished (contract.FENCED_ANNOTATION says why).
    job_uid: str | None = None


class LeaseWriter:
    """Creates and renews one pod's heartbeat Lease.

    Each request is bounded by the Lease's duration: the kubernetes client waits forever by
    default, and one write stuck on a dead connection (an API server restarted behind a Service
    IP) would stop every later heartbeat of a pod that trains fine. Past its duration the Lease
    is expired anyway; the next tick retries on a fresh connection."""

    def __init__(self, api_client: Any, pod: PodIdentity, lease_duration_seconds: int) -> None:
        from kubernetes import client

        self._api = client.CoordinationV1Api(api_client)
        self._pod = pod
        self.duration_seconds = lease_duration_seconds
        self._acquire_time: str | None = None
        #: A write of this writer succeeded before (a later 404 means the Lease vanished).
        self._written = False

    @property
    def duration_seconds(self) -> int:
        """The Lease's leaseDurationSeconds; each request's timeout follows it."""
        return self._duration

    @duration_seconds.setter
    def duration_seconds(self, seconds: int) -> None:
        self._duration = seconds
        self._timeout = max(5, seconds)

    def body(self, hb: Heartbeat, now: datetime, create: bool = False) -> dict[str, Any]:
        """The Lease as written: a renewal's merge patch, or (`create`) the new object with its owner."""
        now_s = micro_time(now)
        if self._acquire_time is None:
            self._acquire_time = now_s
        metadata: dict[str, Any] = {
            "name": lease_name(self._pod.name),
            "namespace": self._pod.namespace,
            "annotations": {HEARTBEAT_ANNOTATION: hb.to_annotation()},
        }
        if self._pod.job_name:
            metadata["labels"] = {LABEL_JOB: self._pod.job_name}
        if create and (owner := self._owner()) is not None:  # a renewal's patch never touches owners
            metadata["ownerReferences"] = [owner]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self._pod.name,
                "leaseDurationSeconds": self._duration,
                "acquireTime": self._acquire_time,
                "renewTime": now_s,
            },
        }

    def _owner(self) -> dict[str, str] | None:
        """The pod; for a Lease recreated after it vanished, the job: perhaps the pod object is gone
        (replaced while its node's kubelet was down), and garbage collection would delete a
        pod-owned Lease again before the operator could fence it (contract.FENCED_ANNOTATION)."""
        pod = self._pod
        if self._written and pod.job_uid and pod.job_name:
            return {
                "apiVersion": f"{API_GROUP}/{API_VERSION}",
                "kind": KIND,
                "name": pod.job_name,
                "uid": pod.job_uid,
            }
        if pod.uid:
            return {"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}
        return None

    def write(self, hb: Heartbeat, now: datetime) -> dict[str, str]:
        """Renew (merge patch: annotations written by others, e.g. the operator's, are kept) or
        create the Lease; returns the annotations of the Lease as the API server holds it now."""
        from kubernetes.client.exceptions import ApiException

        body = self.body(hb, now)
        name = body["metadata"]["name"]
        try:
            lease = self._api.patch_namespaced_lease(
                name, self._pod.namespace, body, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            # The client sends a dict body as it is (its type names only the model class).
            body = self.body(hb, now, create=True)
            lease = self._api.create_namespaced_lease(
                self._pod.namespace, cast(Any, body), _request_timeout=self._timeout
            )
        self._written = True
        return dict((lease.metadata.annotations if lease.metadata else None) or {})


class LeaseStore(Protocol):
    """Where the agent publishes a heartbeat: `LeaseWriter` (the API server), or a test's fake."""

    def write(self, hb: Heartbeat, now: datetime) -> dict[str, str]: ...


class HeartbeatAgent:
    """A daemon thread: aggregate the rank files and renew the Lease every interval.

    The Lease goes through `writer` when given, else a `LeaseWriter` on `api_client` (None and
    None: no Lease, e.g. outside a cluster). `reach_endpoint`: the pod's reach responder
    (host:port), published in every heartbeat; None: the pod has none."""

    def __init__(
        self,
        status_dir: str,
        pod: PodIdentity,
        interval_seconds: float,
        api_client: Any | None,
        standby: bool = False,
        writer: LeaseStore | None = None,
        rank_hang_timeout_seconds: float | None = None,
        reach_endpoint: str | None = None,
    ) -> None:
        self.status_dir = status_dir
        self.interval = interval_seconds
        self.standby = standby
        #: Set once the operator assigned this (standby) pod a node slot; `assigned_slot` holds it.
        self.promoted = threading.Event()
        #: Set once the operator fenced this pod (contract.FENCED_ANNOTATION); `fence_reason` says why.
        self.fenced = threading.Event()
        self.fence_reason = ""
        self.assigned_slot: str | None = None
        self.aggregator = Aggregator(rank_hang_timeout_seconds=rank_hang_timeout_seconds)
        self.reach_endpoint = reach_endpoint
        #: The answer to the newest reach probe taken (published with every heartbeat from then on).
        self.reach: ReachReport | None = None
        #: The id of the reach probe answered or being probed: a request with it again is ignored.
        self._reach_taken: str | None = None
        self._probing = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        #: Ends the wait between two renewals early: set by stop() and by a finished reach probe.
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rtj-heartbeat", daemon=True)
        if writer is None and api_client is not None:
            writer = LeaseWriter(api_client, pod, lease_duration_seconds(interval_seconds))
        self._writer = writer
        self.last: Heartbeat | None = None
        self._last_error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def _aggregate(self) -> Heartbeat:
        return self.aggregator.update(
            read_rank_files(self.status_dir),
            exit_of=lambda r: read_exit(self.status_dir, r.local_rank or 0, r.pid or 0),
        )

    def tick(self, final_state: PodState | None = None) -> Heartbeat:
        with self._lock:
            hb = self._aggregate()
            if final_state is not None:
                hb = hb.model_copy(update={"state": final_state})
            elif self.in_standby:
                hb = hb.model_copy(update={"state": PodState.STANDBY})
            hb = hb.model_copy(update={"reach_endpoint": self.reach_endpoint, "reach": self.reach})
            self.last = hb
            self._publish(hb)
            return hb

    def current_fault(self) -> Fault | None:
        """The pod's fault with the rank files as they are now (read, not published): what the
        entrypoint weighs once its launcher ended."""
        with self._lock:
            return self._aggregate().fault

    def record_fault(self, fault: Fault) -> None:
        """A fault the entrypoint classified itself while the pod lives on (a lost rendezvous):
        published with the next tick."""
        with self._lock:
            self.aggregator.record_fault(fault)

    def _publish(self, hb: Heartbeat) -> None:
        if self._writer is None:
            return
        started = datetime.now(UTC)
        try:
            annotations = self._writer.write(hb, started)
            took = (datetime.now(UTC) - started).total_seconds()
            if took > self.interval:  # renewals fall behind their interval
                log.warning(
                    "heartbeat Lease write took %.1f s (interval %.0f s): the API server is slow",
                    took,
                    self.interval,
                )
            self._take_assignment(annotations.get(ASSIGNED_SLOT_ANNOTATION))
            self._take_fence(annotations.get(FENCED_ANNOTATION))
            self._take_period(parse_renew_period(annotations))
            self._take_reach_probe(parse_reach_probe(annotations))
            if self._last_error:
                log.info("heartbeat Lease writes recovered")
                self._last_error = None
        except Exception as exc:
            # Log the kind and HTTP status only: an exception body may echo request headers.
            status, reason = getattr(exc, "status", "?"), getattr(exc, "reason", "")
            detail = f"{type(exc).__name__} status={status} reason={reason}"
            if detail != self._last_error:
                log.warning("heartbeat Lease write failed (retrying next tick): %s", detail)
            self._last_error = detail

    @property
    def in_standby(self) -> bool:
        return self.standby and not self.promoted.is_set()

    def _take_fence(self, reason: Any) -> None:
        if self.fenced.is_set() or not isinstance(reason, str) or not reason:
            return
        self.fence_reason = reason
        self.fenced.set()
        log.error("fenced by the operator (%s): this pod is no longer its slot's; stopping", reason)

    def _take_period(self, seconds: int | None) -> None:
        """The renew period the operator asks of this pod (its heartbeat budget): from the next
        renewal on, and the Lease's duration with it."""
        if seconds is None or seconds == self.interval:
            return
        log.info(
            "heartbeat renew period %g s -> %d s (the operator's heartbeat budget)", self.interval, seconds
        )
        self.interval = seconds
        if isinstance(self._writer, LeaseWriter):
            self._writer.duration_seconds = lease_duration_seconds(seconds)

    def _take_reach_probe(self, request: ReachProbe | None) -> None:
        """A new reach probe request: probed on a thread of its own, never on the heartbeat's. One
        at a time: a request arriving while another is probed is taken at a renewal after it."""
        if request is None or request.id == self._reach_taken or self._probing:
            return
        self._reach_taken, self._probing = request.id, True
        threading.Thread(target=self._probe, args=(request,), name="rtj-reach-prober", daemon=True).start()

    def _probe(self, request: ReachProbe) -> None:
        try:
            reached, unreachable = probe(request.peers)
            self.reach = ReachReport(
                probe=request.id, reached=reached, unreachable=unreachable, time=datetime.now(UTC)
            )
        except Exception:
            log.exception("reach probe %s failed", request.id)
            return
        finally:
            self._probing = False
        log.info("reach probe %s: reached slots %s, unreachable %s", request.id, reached, unreachable)
        self._wake.set()  # published by a renewal now, not a period later

    def _take_assignment(self, slot: Any) -> None:
        if not self.in_standby or not isinstance(slot, str) or not slot:
            return
        self.assigned_slot = slot
        self.promoted.set()
        log.info("hot spare promoted: the operator assigned node slot %s", slot)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:
                log.exception("heartbeat tick failed")
            self._wake.wait(min(self.interval, STANDBY_RENEW_SECONDS) if self.in_standby else self.interval)
            self._wake.clear()

    def stop(self, final_state: PodState | None, fault: Fault | None = None) -> Heartbeat:
        """Stop the thread and publish the last heartbeat (Finished, or the fault)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval + 5)
        if fault is not None:
            self.aggregator.record_fault(fault)
        return self.tick(final_state)
