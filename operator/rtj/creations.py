"""What each create action of a decision makes: the objects, built by rtj.builders, in the order they
are created. One map from action to objects, for the operator's executor (rtj.executor, which adds a
Kueue admission's placement to the pods and creates them) and for the tests that check what a
decision would create (tests/reliability/states.py)."""

from __future__ import annotations

from typing import Any

from rtj import builders
from rtj.api.models import ResilientTrainingJob
from rtj.ladder.actions import (
    CreateRendezvousPod,
    CreateRendezvousService,
    CreateSparePod,
    CreateWorkerPod,
    CreateWorkload,
)

CreateAction = (
    CreateWorkerPod | CreateSparePod | CreateRendezvousPod | CreateRendezvousService | CreateWorkload
)


def objects_to_create(
    job: ResilientTrainingJob, action: CreateAction, settings: builders.BuildSettings | None = None
) -> list[dict[str, Any]]:
    """The objects `action` creates, in order. A worker's slot gets its replica Service (peer replica
    on) before its pod: created with the slot's first pod, kept for the job's life (AlreadyExists is
    success)."""
    bs = settings or builders.BuildSettings()
    match action:
        case CreateWorkerPod(
            slot=slot,
            attempt=attempt,
            cause=cause,
            avoid_nodes=avoid,
            in_place_restarts=n,
            suspect_node=suspect,
        ):
            service = builders.replica_service(job, slot)
            pod = builders.worker_pod(
                job, slot, attempt, cause, avoid, bs, in_place_restarts=n, suspect_node=suspect
            )
            return [pod] if service is None else [service, pod]
        case CreateSparePod(index=index, attempt=attempt, avoid_nodes=avoid, in_place_restarts=n):
            return [builders.spare_pod(job, index, attempt, avoid, bs, in_place_restarts=n)]
        case CreateRendezvousPod():
            return [builders.rendezvous_pod(job, bs)]
        case CreateRendezvousService():
            return [builders.rendezvous_service(job)]
        case CreateWorkload():
            return [builders.workload(job, bs)]
    raise TypeError(f"not a create action: {action!r}")
