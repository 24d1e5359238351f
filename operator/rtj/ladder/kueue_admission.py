"""Policy: a job labelled `kueue.x-k8s.io/queue-name` runs only while Kueue admits its Workload.

Kueue (v0.17, `integrations.externalFrameworks`) queues, admits and evicts Workload objects, not our
jobs: as for any "external framework", the job's own controller creates the Workload and starts or
stops the job on Kueue's word (Kueue's pkg/controller/jobframework does this for built-in kinds;
this module is that logic for a ResilientTrainingJob, written from jobframework/reconciler.go):

- One Workload per job, owned by it (controller ownerReference, GC deletes it), named as
  jobframework names its Workloads (`workload_name`), `spec.queueName` from the label, pod sets
  `workers` (spec.nodes), `spares` (spec.hotSpares, when any) and `rendezvous` (1) rendered by
  rtj.builders.workload from the pods the job runs.
- The label alone gates the job: no webhook sets `spec.suspend` for us, so a labelled job holds
  (no pod, no Service; state Queued, condition Suspended with reason WaitingForAdmission) until its
  Workload has `Admitted` True (Kueue sets it once `QuotaReserved` is True and every admission check
  is Ready) and is not `Evicted`. `spec.suspend: true` still wins (rtj.ladder.decide looks at it
  first).
- Evicted: the job stops like a suspend (pods deleted; counters kept, no fault counted); once no
  pod of the job is left, the operator clears the admission as jobframework does (QuotaReserved
  False with reason Pending, Admitted False, `status.admission` removed, Requeued True for a
  preemption or node failures), so the Workload queues again and its quota is released.
- Finished job (Succeeded or Failed): the Workload gets `Finished` True with reason Succeeded or
  Failed, which releases its quota.
- PodsReady, as jobframework writes it for its kinds (generatePodsReadyCondition): while admitted,
  True once every worker slot has a pod past its start (reason Started, or Recovered after a
  recovery), False with WaitForStart until then and WaitForRecovery while a slot's pod is replaced
  or silent after that. Kueue's waitForPodsReady (on by default from v0.19) evicts a Workload whose
  PodsReady stays False past its timeout (WaitForStart) or recoveryTimeout (WaitForRecovery), so
  without it every admitted job would be evicted at the timeout. Soft restarts (in-process,
  in-job, in place) keep the pods: PodsReady stays True through them.
- Admission placement: the node labels and tolerations of the ResourceFlavors the admission
  assigned to a pod set (and an admission check's podSetUpdates) are added to its pods
  (`placement`), with the label `kueue.x-k8s.io/podset`.

Only with the operator's `kueue_enabled` setting (chart `kueue.enabled`): without it the label is
ignored, as before. Pure: no I/O, clock passed in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rtj import contract, reasons
from rtj.api.models import (
    SLOT_STATES_WITHOUT_POD,
    JobState,
    JobStatus,
    NodeSlotStatus,
    ResilientTrainingJob,
    SlotState,
)
from rtj.ladder.actions import Action, CreateWorkload, PatchWorkloadStatus
from rtj.ladder.observe import FlavorObs, PodObs, WorkloadObs

#: The label a user sets on a job to queue it in that LocalQueue of its namespace.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
#: Label Kueue's jobframework puts on a Workload: the owner job's UID.
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
#: Label Kueue's jobframework puts on admitted pods: their pod set.
PODSET_LABEL = "kueue.x-k8s.io/podset"
WORKLOAD_GROUP, WORKLOAD_VERSION, WORKLOAD_PLURAL = "kueue.x-k8s.io", "v1beta2", "workloads"
#: The value of Kueue's `integrations.externalFrameworks` entry for our kind (`Kind.version.group`).
EXTERNAL_FRAMEWORK = f"{contract.KIND}.{contract.API_VERSION}.{contract.API_GROUP}"

PODSET_WORKERS, PODSET_SPARES, PODSET_RENDEZVOUS = "workers", "spares", "rendezvous"
PODSET_OF_ROLE = {
    contract.ROLE_WORKER: PODSET_WORKERS,
    contract.ROLE_SPARE: PODSET_SPARES,
    contract.ROLE_RENDEZVOUS: PODSET_RENDEZVOUS,
}

# Workload condition types and reasons (Kueue v0.17 apis/kueue/v1beta2/workload_types.go).
ADMITTED, QUOTA_RESERVED, EVICTED, FINISHED, REQUEUED = (
    "Admitted",
    "QuotaReserved",
    "Evicted",
    "Finished",
    "Requeued",
)
PODS_READY = "PodsReady"
#: PodsReady reasons (Kueue's WorkloadWaitForStart, WorkloadWaitForRecovery, WorkloadStarted,
#: WorkloadRecovered) and jobframework's messages.
WAIT_FOR_START, WAIT_FOR_RECOVERY, STARTED, RECOVERED = (
    "WaitForStart",
    "WaitForRecovery",
    "Started",
    "Recovered",
)
_PODS_READY_MESSAGES = {
    WAIT_FOR_START: "Not all pods are ready or succeeded",
    WAIT_FOR_RECOVERY: "At least one pod has failed, waiting for recovery",
    STARTED: "All pods reached readiness and the workload is running",
    RECOVERED: "All pods reached readiness and the workload is running",
}
#: Slot states whose pod is not ready in Kueue's sense: none, still starting, or silent.
_NOT_READY = SLOT_STATES_WITHOUT_POD | {SlotState.STARTING, SlotState.SILENT}
#: Eviction reasons after which jobframework sets Requeued True (the others: False).
_REQUEUED_AFTER = frozenset({"Preempted", "NodeFailures"})
_WORKLOAD_NAME_MAX = 253
_HASH_LENGTH = 5


def queue_name(job: ResilientTrainingJob) -> str:
    labels = job.metadata.get("labels") or {}
    value = labels.get(QUEUE_LABEL) if isinstance(labels, dict) else None
    return value if isinstance(value, str) else ""


def managed(job: ResilientTrainingJob, enabled: bool) -> bool:
    """Kueue gates this job: the integration is on and the job names a queue."""
    return enabled and bool(queue_name(job))


def workload_name(job_name: str, job_uid: str) -> str:
    """jobframework.GetWorkloadNameForOwnerWithGVK: `<kind>-<name>` (truncated) + 5 hex digits of
    sha1(kind, group, name, uid): deterministic, and a namesake job gets another Workload."""
    prefix = f"{contract.KIND.lower()}-{job_name}"[: _WORKLOAD_NAME_MAX - 1 - _HASH_LENGTH]
    digest = hashlib.sha1("\n".join((contract.KIND, contract.API_GROUP, job_name, job_uid)).encode())
    return f"{prefix}-{digest.hexdigest()[:_HASH_LENGTH]}"


@dataclass(frozen=True)
class Hold:
    """Why a Kueue-managed job may run no pod now (the Suspended condition's reason and message)."""

    reason: str
    message: str


def hold(job: ResilientTrainingJob, workload: WorkloadObs | None, enabled: bool) -> Hold | None:
    """None: the job may run (not managed, or its Workload is admitted and not evicted)."""
    if not managed(job, enabled):
        return None
    queue = queue_name(job)
    if workload is None:
        return Hold(
            reasons.WAITING_FOR_ADMISSION,
            f"queued in LocalQueue {queue}: no pod runs until Kueue admits Workload {_wl_name(job)}",
        )
    if workload.evicted:
        return Hold(
            reasons.WORKLOAD_EVICTED,
            f"Workload {workload.name} evicted by Kueue ({workload.evicted_reason}): "
            f"{workload.evicted_message}; pods stopped until Kueue admits it again",
        )
    if workload.finished:
        return Hold(reasons.WAITING_FOR_ADMISSION, f"Workload {workload.name} is Finished; nothing runs")
    if workload.deleting:
        return Hold(reasons.WAITING_FOR_ADMISSION, f"Workload {workload.name} is being deleted")
    if not workload.admitted:
        why = f": {workload.pending_message}" if workload.pending_message else ""
        return Hold(
            reasons.WAITING_FOR_ADMISSION,
            f"Workload {workload.name} waits in LocalQueue {queue} for Kueue's admission{why}",
        )
    return None


def _wl_name(job: ResilientTrainingJob) -> str:
    return workload_name(str(job.metadata.get("name", "")), str(job.metadata.get("uid", "")))


def workload_actions(
    job: ResilientTrainingJob,
    workload: WorkloadObs | None,
    status: JobStatus,
    pods: dict[str, PodObs],
    enabled: bool,
    now: datetime,
    slots: Sequence[NodeSlotStatus] = (),
) -> list[Action]:
    """What the Workload needs after this pass's status and `slots`: created, Finished, its
    admission cleared after an eviction once no pod of the job is left, or its PodsReady changed
    (level-based: repeated until seen)."""
    if not managed(job, enabled):
        return []
    finished = status.state in (JobState.SUCCEEDED, JobState.FAILED)
    if workload is None:
        return [] if finished else [CreateWorkload()]
    if workload.finished or workload.deleting:
        return []
    if finished:
        succeeded = status.state == JobState.SUCCEEDED
        conditions = set_condition(
            workload.conditions,
            FINISHED,
            True,
            "Succeeded" if succeeded else "Failed",
            f"ResilientTrainingJob {status.state}: {status.reason}",
            now,
            workload.generation,
        )
        return [PatchWorkloadStatus(workload.name, workload.resource_version, {"conditions": conditions})]
    if workload.evicted and workload.quota_reserved and not any(p.live or p.deleting for p in pods.values()):
        conditions = set_condition(
            workload.conditions,
            REQUEUED,
            workload.evicted_reason in _REQUEUED_AFTER,
            workload.evicted_reason or EVICTED,
            workload.evicted_message,
            now,
            workload.generation,
        )
        conditions = set_condition(
            conditions, QUOTA_RESERVED, False, "Pending", workload.evicted_message, now, workload.generation
        )
        conditions = set_condition(
            conditions, ADMITTED, False, "NoReservation", "The workload has no reservation", now,
            workload.generation,
        )  # fmt: skip
        return [
            PatchWorkloadStatus(
                workload.name, workload.resource_version, {"conditions": conditions, "admission": None}
            )
        ]
    if workload.admitted and not workload.evicted:
        return pods_ready_actions(workload, pods_ready(slots), now)
    return []


def pods_ready(slots: Sequence[NodeSlotStatus]) -> bool:
    """Every worker slot has a pod past its start (Kueue's "all pods ready")."""
    return bool(slots) and all(s.state not in _NOT_READY for s in slots)


def pods_ready_reason(current: dict[str, Any] | None, ready: bool) -> str:
    """jobframework's generatePodsReadyCondition for an admitted Workload: the PodsReady reason that
    follows `current` (the condition as stored, if any); the status is `ready`."""
    reason = (current or {}).get("reason")
    if ready:
        return RECOVERED if reason in (WAIT_FOR_RECOVERY, RECOVERED) else STARTED
    if current is not None and (current.get("status") == "True" or reason == WAIT_FOR_RECOVERY):
        return WAIT_FOR_RECOVERY
    return WAIT_FOR_START


def pods_ready_actions(workload: WorkloadObs, ready: bool, now: datetime) -> list[Action]:
    """The PodsReady patch, when the condition is to change (one write per transition)."""
    current = next((c for c in workload.conditions if c.get("type") == PODS_READY), None)
    reason = pods_ready_reason(current, ready)
    value = "True" if ready else "False"
    if current is not None and (current.get("status"), current.get("reason")) == (value, reason):
        return []
    conditions = set_condition(
        workload.conditions, PODS_READY, ready, reason, _PODS_READY_MESSAGES[reason], now, workload.generation
    )
    return [PatchWorkloadStatus(workload.name, workload.resource_version, {"conditions": conditions})]


def set_condition(
    conditions: Sequence[dict[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None,
) -> list[dict[str, Any]]:
    """A Workload's metav1.Conditions with one set (apimeta.SetStatusCondition: the transition time
    moves only when the status flips); the others as they were."""
    value = "True" if status else "False"
    out: list[dict[str, Any]] = []
    found = False
    for c in conditions:
        if c.get("type") != type_:
            out.append(dict(c))
            continue
        found = True
        changed = c.get("status") != value
        out.append(
            {
                **c,
                "status": value,
                "reason": reason,
                "message": message[:32768],
                "lastTransitionTime": contract.kube_time(now) if changed else c.get("lastTransitionTime"),
                **({"observedGeneration": generation} if generation is not None else {}),
            }
        )
    if not found:
        out.append(
            {
                "type": type_,
                "status": value,
                "reason": reason,
                "message": message[:32768],
                "lastTransitionTime": contract.kube_time(now),
                **({"observedGeneration": generation} if generation is not None else {}),
            }
        )
    return out


@dataclass(frozen=True)
class Placement:
    """What an admission adds to the pods of one pod set (jobframework's PodSetInfo)."""

    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    labels: dict[str, str] = field(default_factory=dict)


def placement(
    job: ResilientTrainingJob,
    workload: WorkloadObs | None,
    flavors: dict[str, FlavorObs],
    enabled: bool,
) -> dict[str, Placement]:
    """Pod set name -> what its pods get from the admission (podset.FromAssignment, then each
    admission check's podSetUpdates). Empty when the job is not managed or not admitted."""
    if not managed(job, enabled) or workload is None or not workload.admitted:
        return {}
    out: dict[str, Placement] = {}
    for podset, flavor_names in workload.assigned_flavors.items():
        selector: dict[str, str] = {}
        tolerations: list[dict[str, Any]] = []
        for name in dict.fromkeys(flavor_names):
            flavor = flavors.get(name)
            if flavor is not None:
                selector.update(flavor.node_labels)
                tolerations.extend(flavor.tolerations)
        update = workload.podset_updates.get(podset)
        labels = {PODSET_LABEL: podset}
        if update is not None:
            selector.update(update.node_selector)
            tolerations.extend(update.tolerations)
            labels = {**update.labels, **labels}
        out[podset] = Placement(selector, tuple(tolerations), labels)
    return out


def missing_flavors(workload: WorkloadObs | None, flavors: dict[str, FlavorObs]) -> set[str]:
    """ResourceFlavors an admission names that the operator has not read yet."""
    if workload is None or not workload.admitted:
        return set()
    return {n for names in workload.assigned_flavors.values() for n in names if n not in flavors}
