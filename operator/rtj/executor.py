"""A decision's actions as API calls: one function per kind of action (`_PERFORM`), run bounded in
parallel, in the order that keeps a promotion safe (deletions first; a spare's Lease signalled only
after its pod was relabelled into the slot).

Every action is level-based: one that fails is done again by the next pass, so a failure here is
reported (`ActOutcome`), never raised. Creates are told apart: one the API server refuses as invalid
(422) cannot succeed on a retry, one refused for a reason that may end (403, ...) is retried with
backoff (rtj.ladder.create_refusals). The clock is passed in (rtj.handlers reads it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rtj import builders, contract, creations, kube
from rtj.api.models import ResilientTrainingJob
from rtj.creations import CreateAction
from rtj.ladder import (
    Action,
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
    PatchWorkloadStatus,
    PromoteSpare,
    RecordNodeFault,
    RequestReachProbe,
    SetRenewPeriod,
    TaintNode,
    create_refusals,
    kueue_admission,
    quarantine,
)
from rtj.settings import Settings

#: Actions that create an object the builders made from the spec.
CREATES = create_refusals.CREATES
#: API calls one decision has in flight at most.
PARALLEL_CALLS = 16
logger = logging.getLogger("rtj.operator")


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


def build_settings(settings: Settings) -> builders.BuildSettings:
    """What the builders take of the operator's settings."""
    return builders.BuildSettings(
        trainer_service_account=settings.trainer_service_account,
        termination_grace_seconds=settings.termination_grace_seconds,
    )


@dataclass(frozen=True)
class _Call:
    """What every action's calls need: the client, the job, and the process's settings and clock."""

    k: kube.Kube
    job: ResilientTrainingJob
    bs: builders.BuildSettings
    clock: Callable[[], datetime]
    #: What a Kueue admission adds to the pods of each pod set (rtj.ladder.kueue_admission).
    placement: Mapping[str, kueue_admission.Placement]

    @property
    def ns(self) -> str:
        return str(self.job.metadata["namespace"])

    def placed(self, pod: dict[str, Any]) -> dict[str, Any]:
        role = pod["metadata"]["labels"].get(contract.LABEL_ROLE, "")
        where = self.placement.get(kueue_admission.PODSET_OF_ROLE.get(role, ""))
        return (
            pod
            if where is None
            else builders.place(pod, where.node_selector, where.tolerations, where.labels)
        )


# --- one function per kind of action: True when done (False: nothing to signal after it) ------------
async def _delete_pod(c: _Call, a: DeletePod) -> bool:
    await c.k.delete("Pod", c.ns, a.name, a.uid, a.grace_seconds)
    return True


async def _create(c: _Call, a: CreateAction) -> bool:
    """The objects the action makes (rtj.creations), its pods placed where Kueue admitted them."""
    for obj in creations.objects_to_create(c.job, a, c.bs):
        await c.k.create(c.placed(obj) if obj["kind"] == "Pod" else obj)
    return True


async def _taint_node(c: _Call, a: TaintNode) -> bool:
    now = a.time or c.clock()
    until = a.until or now
    await c.k.patch_node(
        a.node, lambda obj: quarantine.taint_patch(obj, a.reason, a.job, a.evidence, until, now)
    )
    return True


async def _record_node_fault(c: _Call, a: RecordNodeFault) -> bool:
    await c.k.patch_node(a.node, lambda obj: quarantine.fault_record_patch(obj, a.job, a.reason, a.time))
    return True


async def _promote_spare(c: _Call, a: PromoteSpare) -> bool:
    """False when the spare is gone: its Lease then gets no promotion signal."""
    return await c.k.patch("Pod", c.ns, a.pod, builders.promotion_patch(a.slot, a.attempt, a.cause))


async def _assign_lease(c: _Call, a: AssignLease) -> bool:
    await c.k.patch("Lease", c.ns, contract.lease_name(a.lease), builders.assign_lease_patch(a.slot))
    return True


async def _fence_lease(c: _Call, a: FenceLease) -> bool:
    await c.k.patch("Lease", c.ns, contract.lease_name(a.lease), builders.fence_lease_patch(a.reason))
    return True


async def _set_renew_period(c: _Call, a: SetRenewPeriod) -> bool:
    await c.k.patch("Lease", c.ns, contract.lease_name(a.lease), builders.renew_period_patch(a.seconds))
    return True


async def _request_reach_probe(c: _Call, a: RequestReachProbe) -> bool:
    await c.k.patch("Lease", c.ns, contract.lease_name(a.lease), builders.reach_probe_patch(a.probe))
    return True


async def _delete_lease(c: _Call, a: DeleteLease) -> bool:
    await c.k.delete("Lease", c.ns, contract.lease_name(a.lease))
    return True


async def _delete_job(c: _Call, a: DeleteJob) -> bool:
    await c.k.delete_job(c.ns, str(c.job.metadata["name"]), str(c.job.metadata.get("uid", "")))
    return True


async def _patch_workload_status(c: _Call, a: PatchWorkloadStatus) -> bool:
    await c.k.patch_workload_status(c.ns, a.name, a.status, a.resource_version)
    return True


_PERFORM: dict[type[Any], Callable[[_Call, Any], Awaitable[bool]]] = {
    DeletePod: _delete_pod,
    CreateWorkerPod: _create,
    CreateSparePod: _create,
    CreateRendezvousPod: _create,
    CreateRendezvousService: _create,
    TaintNode: _taint_node,
    RecordNodeFault: _record_node_fault,
    PromoteSpare: _promote_spare,
    AssignLease: _assign_lease,
    FenceLease: _fence_lease,
    SetRenewPeriod: _set_renew_period,
    RequestReachProbe: _request_reach_probe,
    DeleteLease: _delete_lease,
    DeleteJob: _delete_job,
    CreateWorkload: _create,
    PatchWorkloadStatus: _patch_workload_status,
}


@dataclass
class _Run:
    """One decision's actions under way: the calls in flight, and what their failures add up to."""

    call: _Call
    #: The decision's actions in its order (a refusal is reported by the first refused).
    actions: list[Action]
    gate: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(PARALLEL_CALLS))
    outcome: ActOutcome = field(default_factory=ActOutcome)
    #: (position in the decision, error) of each create refused for a reason that may end.
    refusals: list[tuple[int, kube.KubeError]] = field(default_factory=list)

    async def one(self, action: Action) -> bool:
        """Perform one action; False when it failed (or a promoted spare is gone)."""
        perform = _PERFORM.get(type(action))
        async with self.gate:
            try:
                done = await perform(self.call, action) if perform is not None else True
            except kube.KubeError as exc:  # the next pass retries (level-based)
                self._failed(action, exc)
                return False
            if isinstance(action, CREATES):
                self.outcome.created = True
            return done

    def _failed(self, action: Action, exc: kube.KubeError) -> None:
        if isinstance(action, CREATES) and create_refusals.is_retryable_refusal(exc.status):
            # Logged once per new message by rtj.job_pass.remember_refusal (it repeats every retry).
            self.refusals.append((self.actions.index(action), exc))
            return
        job = self.call.job.metadata
        logger.warning("%s/%s: %s failed: %s", job["namespace"], job["name"], type(action).__name__, exc)
        self.outcome.failed = True
        if exc.invalid and isinstance(action, CREATES):
            self.outcome.invalid.append(f"the API server refused {exc.message}")


def _as_decided(job: ResilientTrainingJob, decision: Decision) -> ResilientTrainingJob:
    """The job whose pods the builders render: with the heartbeat renew period the pass chose for
    the pods it creates (status.heartbeatIntervalSeconds, rtj.ladder.heartbeat_budget)."""
    period = decision.status.heartbeat_interval_seconds
    if period is None or period == job.status.heartbeat_interval_seconds:
        return job
    status = job.status.model_copy(update={"heartbeat_interval_seconds": period})
    return job.model_copy(update={"status": status})


async def act(
    k: kube.Kube,
    job: ResilientTrainingJob,
    decision: Decision,
    bs: builders.BuildSettings,
    clock: Callable[[], datetime],
    placement: Mapping[str, kueue_admission.Placement] | None = None,
) -> ActOutcome:
    """Execute a decision's actions, bounded in parallel (failures are retried by the next pass).
    `placement`: what a Kueue admission adds to the pods of each pod set (rtj.ladder.kueue_admission)."""
    run = _Run(_Call(k, _as_decided(job, decision), bs, clock, placement or {}), decision.actions)
    # Deletions first; the promotion signal on a spare's Lease only after its pod was relabelled
    # into the slot (the ladder's commit), so a trainer never joins for a slot the ladder still
    # sees empty.
    deletes = [a for a in decision.actions if isinstance(a, DeletePod)]
    signals = [a for a in decision.actions if isinstance(a, AssignLease)]
    others = [a for a in decision.actions if not isinstance(a, DeletePod | AssignLease)]
    await asyncio.gather(*(run.one(a) for a in deletes))
    results = await asyncio.gather(*(run.one(a) for a in others))
    failed = {a.pod for a, ok in zip(others, results, strict=True) if isinstance(a, PromoteSpare) and not ok}
    await asyncio.gather(*(run.one(a) for a in signals if a.lease not in failed))
    if run.refusals:
        # The first refused create in the decision's order, not the last to return: an unchanged
        # cause keeps an unchanged message (one Event), whatever order parallel creates finish in.
        exc = min(run.refusals, key=lambda r: r[0])[1]
        run.outcome.refused = (exc.status, exc.server_reason, exc.message)
    return run.outcome
