"""rtj.creations: one map from a create action to the objects it makes, in creation order."""

from __future__ import annotations

import pytest
from ladder_testkit import make_job
from rtj import creations, executor
from rtj.ladder.actions import (
    CreateRendezvousPod,
    CreateRendezvousService,
    CreateSparePod,
    CreateWorkerPod,
    CreateWorkload,
)
from rtj.ladder.create_refusals import CREATES

pytestmark = pytest.mark.unit


def kinds(objs: list[dict]) -> list[str]:
    return [o["kind"] for o in objs]


def test_each_create_action_makes_its_objects() -> None:
    job = make_job().obj()
    assert kinds(creations.objects_to_create(job, CreateWorkerPod(0, 1, "Initial"))) == ["Pod"]
    assert kinds(creations.objects_to_create(job, CreateSparePod(0, 0))) == ["Pod"]
    assert kinds(creations.objects_to_create(job, CreateRendezvousPod())) == ["Pod"]
    assert kinds(creations.objects_to_create(job, CreateRendezvousService())) == ["Service"]
    assert kinds(creations.objects_to_create(job, CreateWorkload())) == ["Workload"]


def test_a_worker_with_the_peer_replica_gets_its_slot_service_first() -> None:
    job = make_job().spec(
        checkpoint={"pvc": {"claimName": "ckpt"}, "memorySnapshotIntervalSteps": 2, "peerReplica": True}
    )
    service, pod = creations.objects_to_create(job.obj(), CreateWorkerPod(1, 0, "Initial"))
    assert (service["kind"], pod["kind"]) == ("Service", "Pod")
    assert pod["metadata"]["name"].startswith("train-n1-")


def test_the_executor_creates_every_create_action_through_the_one_map() -> None:
    assert all(executor._PERFORM[kind] is executor._create for kind in CREATES)
