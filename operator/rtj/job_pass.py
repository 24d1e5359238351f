"""One pass of a job: observe (kopf's indexes) -> decide (pure) -> ONE status write (resourceVersion
precondition) -> act (rtj.executor) -> Events (from the status's outbox) -> metrics.

Status first: a pass computed from a stale copy conflicts and has no side effect at all; a pass whose
actions fail half-way is completed by the next pass (every action is level-based). What a pass keeps
for the next (its own writes, refusals, Events posted, flavors read) is the job's `rtj.memo.JobMemo`.
The settings and the clock are passed in (rtj.handlers reads them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import kopf

from rtj import executor, kube, metrics, validation
from rtj.api.models import JobStatus, ResilientTrainingJob
from rtj.executor import ActOutcome
from rtj.ladder import (
    Decision,
    LadderConfig,
    Observed,
    create_refusals,
    decide,
    event_outbox,
    goodput,
    kueue_admission,
    lease_from_dict,
    wakeups,
)
from rtj.ladder.observe import FlavorObs, Fleet, WorkloadObs, flavor_from_dict, workload_from_dict
from rtj.memo import JobMemo, OwnWrites, own_writes
from rtj.settings import Settings

#: A pass that did not finish (a conflict, a failed call) runs again this soon, not at the resync.
RETRY_SECONDS = 1.0
logger = logging.getLogger("rtj.operator")


@dataclass(frozen=True)
class Indexes:
    """kopf's indexes a pass reads (live: kopf updates them in place), keyed (namespace, job) but
    nodes (by name); `workloads` only with the Kueue integration."""

    pods: kopf.Index[Any, Any]
    leases: kopf.Index[Any, Any]
    services: kopf.Index[Any, Any]
    nodes: kopf.Index[Any, Any]
    workloads: kopf.Index[Any, Any] | None = None


def ladder_config(settings: Settings) -> LadderConfig:
    """What the ladder takes of the operator's settings."""
    return LadderConfig(
        fault_grace_seconds=settings.fault_grace_seconds,
        heartbeat_status_resolution_seconds=settings.heartbeat_status_resolution_seconds,
        kueue_enabled=settings.kueue_enabled,
        api_recovery_hold_seconds=settings.api_recovery_hold_seconds,
        quarantine_seconds=settings.quarantine_seconds,
        heartbeat_writes_per_second=settings.heartbeat_writes_per_second,
    )


async def run_pass(
    body: kopf.Body,
    memo: JobMemo,
    namespace: str,
    name: str,
    indexes: Indexes,
    settings: Settings,
    clock: Callable[[], datetime],
    fleet: Fleet | None = None,
) -> float | None:
    """One pass; returns the seconds until it must run again: the job's next heartbeat deadline,
    sooner when something is left to retry (None: no deadline, the resync will do). `fleet`: the
    heartbeating pods of the operator's other jobs (rtj.ladder.heartbeat_budget)."""
    if body.metadata.get("deletionTimestamp"):
        return None
    job = _parsed(memo, body, settings)
    if job is None:
        return None  # admit() marked it Failed/InvalidSpec
    rv = str(body.metadata.get("resourceVersion", ""))
    # Read your own writes: kopf's copy may predate our last status writes, several of them while
    # its watch of the jobs is slow or re-listing.
    mine = own_writes(memo.last_write, rv)
    if mine is not None:
        rv = mine.resource_version
        job = job.model_copy(update={"status": mine.status})
    now = clock()
    uid = str(body.metadata.get("uid", ""))
    workload = _workload(indexes.workloads, namespace, name, uid)
    flavors = await _flavors(memo, workload)
    observed = _observed(job, memo, (namespace, name), indexes, uid, workload, flavors, now, fleet)
    placement = kueue_admission.placement(job, workload, flavors, settings.kueue_enabled)
    decision = decide(job, observed, now, ladder_config(settings))
    if decision.status != job.status and not await _write_status(memo, namespace, name, decision, rv, mine):
        return RETRY_SECONDS
    outcome = await executor.act(
        memo.kube, job, decision, executor.build_settings(settings), clock, placement
    )
    # Committed either way (just written, or unchanged since our write): post what it holds.
    await post_events(memo, body, decision.status)
    return _next_run(memo, (namespace, name), job, decision, outcome, uid, now)


def _observed(
    job: ResilientTrainingJob,
    memo: JobMemo,
    key: tuple[str, str],
    indexes: Indexes,
    uid: str,
    workload: WorkloadObs | None,
    flavors: dict[str, FlavorObs],
    now: datetime,
    fleet: Fleet | None = None,
) -> Observed:
    """What the pass observed of the job (`key`: namespace, name), from kopf's indexes and its memo."""
    job_pods = {p.name: p for p in indexes.pods.get(key, [])}
    # Only the nodes the ladder reads, not a copy of the cluster's nodes: those of the job's pods
    # and of each slot's last pod (one that vanished is judged by its node: absent here reads as
    # NodeLost, a healthy node quarantined for a deleted pod).
    node_names = {p.node for p in job_pods.values()} | {s.node for s in job.status.node_slots}
    return Observed(
        pods=job_pods,
        leases={
            lease["metadata"]["name"]: lease_from_dict(lease, now) for lease in indexes.leases.get(key, [])
        },
        nodes={node: n for node in node_names if node for n in indexes.nodes.get(node, [])},
        all_nodes=tuple(n for nodes in indexes.nodes.values() for n in nodes),
        service_exists=bool(list(indexes.services.get(key, []))),
        refused=memo.refused.get(uid, ""),
        create_refusal=memo.create_refusal,
        events_posted=memo.events_posted,
        progress_seen=memo.progress_seen,
        workload=workload,
        flavors=flavors,
        api_failed_at=memo.kube.failed_at,
        fleet=fleet,
    )


async def _write_status(
    memo: JobMemo, namespace: str, name: str, decision: Decision, rv: str, mine: OwnWrites | None
) -> bool:
    """The pass's one status write, under `rv`; False when the job changed under the pass (a
    conflict, or gone): the next pass recomputes. Any other failure raises (no action, no Event)."""
    try:
        new_rv = await memo.kube.patch_job_status(
            namespace, name, decision.status.model_dump(by_alias=True, mode="json"), rv
        )
    except kube.KubeError as exc:
        if exc.conflict or exc.not_found:
            logger.debug("status of %s/%s changed under this pass; next pass recomputes", namespace, name)
            return False
        raise
    memo.last_write = OwnWrites((mine.replaced if mine else frozenset()) | {rv}, new_rv, decision.status)
    metrics.committed(namespace, name, decision.restarts, decision.recoveries)
    return True


def _next_run(
    memo: JobMemo,
    key: tuple[str, str],
    job: ResilientTrainingJob,
    decision: Decision,
    outcome: ActOutcome,
    uid: str,
    now: datetime,
) -> float | None:
    """After the actions: what the job's memo keeps of them, its metrics, and when its next pass is due."""
    namespace, name = key
    if outcome.invalid:
        # The API server refused a pod (or Service) built from an accepted spec: no retry can
        # succeed, so the next pass fails the job saying why instead of retrying forever. The CRD's
        # rules prevent every such case known (tests/reliability); this is the net for the rest.
        memo.refused = {uid: "; ".join(outcome.invalid)}  # this job only, not a namesake
        return 0.0
    if remember_refusal(memo, namespace, name, outcome, now):
        return 0.0  # the next pass shows it on the job (condition + Event)
    if outcome.failed:
        return RETRY_SECONDS  # level-based: the next pass retries
    refusal = memo.create_refusal
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


def _workload(
    workloads: kopf.Index[Any, Any] | None, namespace: str, name: str, uid: str
) -> WorkloadObs | None:
    """The job's own Workload (by its deterministic name: not a namesake's) from the index."""
    if workloads is None:
        return None
    wanted = kueue_admission.workload_name(name, uid)
    for obj in workloads.get((namespace, name), []):
        if (obj.get("metadata") or {}).get("name") == wanted:
            return workload_from_dict(obj)
    return None


async def _flavors(memo: JobMemo, workload: WorkloadObs | None) -> dict[str, FlavorObs]:
    """The ResourceFlavors the Workload's admission names, read once per admission (a failed read
    fails the pass, which is retried: no pod is created without its admission's placement)."""
    cached = memo.flavors
    if workload is None or not workload.admitted:
        return {}
    key = repr(sorted(workload.assigned_flavors.items()))
    flavors = dict(cached[1]) if cached[0] == key else {}
    for name in sorted(kueue_admission.missing_flavors(workload, flavors)):
        obj = await memo.kube.get("ResourceFlavor", None, name)
        if obj is None:
            raise kube.KubeError(404, "NotFound", f"ResourceFlavor {name} named by Workload {workload.name}")
        flavors[name] = flavor_from_dict(obj)
    memo.flavors = (key, flavors)
    return flavors


def _parsed(memo: JobMemo, body: kopf.Body, settings: Settings) -> ResilientTrainingJob | None:
    """parse_job, once per version of the job (most passes see an unchanged job)."""
    rv = body.metadata.get("resourceVersion")
    cached = memo.parsed
    if cached is None or cached[0] != rv or rv is None:
        memo.parsed = cached = (rv, validation.parse_job(body, settings.fsx_enabled)[0])
    return cached[1]


async def post_events(memo: JobMemo, body: kopf.Body, status: JobStatus) -> None:
    """Post the committed status's unposted Events in order (rtj.ladder.event_outbox); the next pass
    drops those posted. Stops at the first failure, so a later Event never overtakes an earlier one."""
    posted = memo.events_posted
    plain = validation.plain_job(body)
    uid = str(body.metadata.get("uid", ""))
    for ev in status.unposted_events:
        if posted is not None and ev.seq <= posted:
            continue
        name = event_outbox.event_name(str(body.metadata.get("name", "")), uid, ev.seq)
        if not await memo.kube.emit_event(plain, ev.type, ev.reason, ev.message, name=name, when=ev.time):
            return
        memo.events_posted = posted = ev.seq


def remember_refusal(memo: JobMemo, namespace: str, name: str, outcome: ActOutcome, now: datetime) -> bool:
    """Keep the job's newest create refusal for the next pass (rtj.ladder.create_refusals); True when
    it is new. The log gets one line per new refusal message, not one per retry."""
    previous = memo.create_refusal
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
