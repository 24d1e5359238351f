"""A hot spare (`TrainerConfig.standby`) against the real API server: the test plays the operator.

Two-node toy job (nnodes min = max = 2): one worker pod and one standby pod. The standby pod must
heartbeat `Standby` and stay out of the rendezvous (so no step can happen: one node is missing)
until the test writes ASSIGNED_SLOT_ANNOTATION on its Lease; then it launches, joins, and the job
trains, with the annotation kept by its later renewals.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from rtj.contract import ASSIGNED_SLOT_ANNOTATION, ExitCode, PodState, lease_name, parse_heartbeat
from rtj_local.wait import wait_for
from trainer_harness import ToyJob

pytestmark = [pytest.mark.trainer, pytest.mark.integration, pytest.mark.timeout(420)]


@pytest.fixture
def job(tmp_path: Path) -> Iterator[ToyJob]:
    j = ToyJob(tmp_path, nnodes=2, nproc_per_node=1, env={"TOY_STEPS": "40"})
    try:
        yield j
    finally:
        j.stop()


def standby_config(job: ToyJob) -> str:
    return json.dumps({**json.loads(job.trainer_config), "standby": True})


def lease_of(coord: client.CoordinationV1Api, name: str, namespace: str) -> client.V1Lease | None:
    try:
        return coord.read_namespaced_lease(lease_name(name), namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def pod_env(kubeconfig: Path, namespace: str, **more: str) -> dict[str, str]:
    return {"KUBECONFIG": str(kubeconfig), "RTJ_NAMESPACE": namespace, **more}


def wait_standby_renewals(coord: client.CoordinationV1Api, name: str, namespace: str, count: int) -> None:
    """Until the spare's Lease said Standby in `count` distinct renewals (so it kept waiting)."""
    seen: set[str] = set()

    def renewed() -> bool:
        lease = lease_of(coord, name, namespace)
        hb = lease and parse_heartbeat(lease.metadata.annotations)
        if hb is not None:
            assert hb.state == PodState.STANDBY, f"{name} left Standby unpromoted: {hb}"
            seen.add(str(lease.spec.renew_time))
        return len(seen) >= count

    wait_for(renewed, 180, message=f"{count} Standby renewals of {name}", interval=0.1)


def test_standby_launches_only_once_the_operator_assigns_a_slot(
    job: ToyJob, kube: client.ApiClient, kubeconfig: Path, namespace: str
) -> None:
    coord = client.CoordinationV1Api(kube)
    job.start_rendezvous()
    job.start_pod("toy-n0-a0", extra_env=pod_env(kubeconfig, namespace))
    spare = job.start_pod(
        "toy-spare-0-a0", extra_env=pod_env(kubeconfig, namespace, RTJ_TRAINER_CONFIG=standby_config(job))
    )
    wait_for(lambda: "pre-warmed" in spare.log_text(), 240, message="the spare to pre-warm ft_launcher")
    wait_standby_renewals(coord, spare.name, namespace, 4)
    assert job.events() == [], "a step ran with only one of two nodes: the spare joined unpromoted"
    assert "joins the rendezvous" not in spare.log_text()
    assert spare.proc.poll() is None

    t_assign = time.time()
    coord.patch_namespaced_lease(
        lease_name(spare.name), namespace, {"metadata": {"annotations": {ASSIGNED_SLOT_ANNOTATION: "1"}}}
    )
    wait_for(lambda: job.max_step() >= 3, 240, message="training on both nodes after the promotion")
    first = min(e["t"] for e in job.events())
    assert first > t_assign
    assert "standby: node slot 1 assigned" in spare.log_text()
    print(f"promotion -> first step: {first - t_assign:.2f} s")

    def spare_training() -> client.V1Lease | None:
        lease = lease_of(coord, spare.name, namespace)
        hb = lease and parse_heartbeat(lease.metadata.annotations)
        return lease if hb and hb.state == PodState.TRAINING else None

    lease = wait_for(spare_training, 120, message="the promoted spare's Lease to say Training")
    assert lease.metadata.annotations[ASSIGNED_SLOT_ANNOTATION] == "1", "renewals must keep the annotation"
    assert job.wait_exit(spare.name, 240) == ExitCode.SUCCEEDED
    assert job.wait_exit("toy-n0-a0", 120) == ExitCode.SUCCEEDED


def test_standby_stopped_before_promotion_exits_terminated_without_launching(
    job: ToyJob, kubeconfig: Path, namespace: str, kube: client.ApiClient
) -> None:
    coord = client.CoordinationV1Api(kube)
    spare = job.start_pod(
        "toy-spare-0-a0", extra_env=pod_env(kubeconfig, namespace, RTJ_TRAINER_CONFIG=standby_config(job))
    )
    wait_standby_renewals(coord, spare.name, namespace, 2)
    spare.proc.terminate()
    assert job.wait_exit(spare.name, 60) == ExitCode.TERMINATED
    assert "joins the rendezvous" not in spare.log_text()
    assert job.events() == []
