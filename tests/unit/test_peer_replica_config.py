"""The peer replica from the job spec to the pods: spec -> TrainerConfig, the per-slot Services,
the ring of slots (contract.replica_endpoints)."""

from __future__ import annotations

import pytest
from ladder_testkit import make_job
from pydantic import ValidationError
from rtj import contract
from rtj.api.models import Checkpoint
from rtj.builders import REPLICA_PORT, replica_service, trainer_config, worker_pod

pytestmark = pytest.mark.unit

ON = {"pvc": {"claimName": "ckpt"}, "memorySnapshotIntervalSteps": 10, "peerReplica": True}


def test_the_peer_replica_is_off_by_default() -> None:
    job = make_job().obj()
    assert trainer_config(job).peer_replica_port == 0
    assert replica_service(job, 0) is None


def test_the_peer_replica_needs_memory_snapshots() -> None:
    with pytest.raises(ValidationError, match="peerReplica needs"):
        Checkpoint.model_validate({"pvc": {"claimName": "ckpt"}, "peerReplica": True})


def test_each_slot_has_a_headless_service_selecting_its_worker_pod_on_its_own_port() -> None:
    job = make_job().spec(nodes=4, checkpoint=ON).obj()
    assert trainer_config(job).peer_replica_port == REPLICA_PORT
    svc = replica_service(job, 3)
    assert svc is not None
    name = job.metadata["name"]
    assert svc["metadata"]["name"] == contract.replica_service_name(name, 3)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["ports"] == [
        {"name": "replica", "port": REPLICA_PORT + 3, "targetPort": REPLICA_PORT + 3, "protocol": "TCP"}
    ]
    # Every attempt of slot 3 (and a spare promoted into it: its labels are patched) is selected.
    pod_labels = worker_pod(job, 3, 7, "Initial")["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["metadata"]["ownerReferences"][0]["uid"] == job.metadata["uid"]


def test_slots_replicate_around_a_ring_to_the_next_slot() -> None:
    own, peer = contract.replica_endpoints("train", "ml", 3, 4, REPLICA_PORT)
    assert own == f"train-p3.ml.svc:{REPLICA_PORT + 3}"
    assert peer == f"train-p0.ml.svc:{REPLICA_PORT}"
    assert (
        contract.replica_endpoints("train", "ml", 0, 4, REPLICA_PORT)[1]
        == f"train-p1.ml.svc:{REPLICA_PORT + 1}"
    )


@pytest.mark.parametrize("job", ["a" * 58, "a" * 57 + "b"])
def test_service_names_stay_dns_labels_and_distinct_for_long_job_names(job: str) -> None:
    names = {contract.replica_service_name(job, s) for s in (0, 9999)}
    assert all(len(n) <= 63 for n in names) and len(names) == 2
    assert contract.replica_service_name("a" * 58, 9999) != contract.replica_service_name(
        "a" * 57 + "b", 9999
    )


def test_the_replica_ports_must_fit_below_65536() -> None:
    cfg = trainer_config(make_job().spec(nodes=4, checkpoint=ON).obj())
    with pytest.raises(ValidationError, match="peerReplicaPort"):
        contract.TrainerConfig.model_validate({**cfg.model_dump(by_alias=True), "peerReplicaPort": 65534})
