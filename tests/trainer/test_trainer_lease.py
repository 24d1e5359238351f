"""The heartbeat Lease written by `rtj-trainer launch`, read back from the real API server.

A real Pod object gives the Lease its owner; the trainer (real processes on this host) writes the
Lease through KUBECONFIG; the test checks what the operator will read, and that garbage collection
removes the Lease with its pod.
"""

from __future__ import annotations

import contextlib
import math
import socket
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from rtj.contract import (
    FENCED_ANNOTATION,
    RENEW_PERIOD_ANNOTATION,
    ExitCode,
    FaultReason,
    PodState,
    lease_name,
    parse_heartbeat,
)
from rtj_local.wait import wait_for
from rtj_trainer.heartbeat import HeartbeatAgent, PodIdentity
from trainer_harness import ToyJob

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(300)]

HEARTBEAT_INTERVAL = 1.0


@pytest.fixture
def job(tmp_path: Path) -> Iterator[ToyJob]:
    j = ToyJob(
        tmp_path,
        nnodes=1,
        config={"heartbeatIntervalSeconds": HEARTBEAT_INTERVAL},
        env={"TOY_STEPS": "120", "RTJ_FAULT_INJECT": "exception:0:30"},
    )
    try:
        yield j
    finally:
        j.stop()


def _read_lease(coord: client.CoordinationV1Api, name: str, namespace: str) -> client.V1Lease | None:
    try:
        return coord.read_namespaced_lease(name, namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def _pod_object(core: client.CoreV1Api, namespace: str) -> client.V1Pod:
    """A real Pod object for the trainer's processes on this host: the owner of its Lease."""
    return core.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "toy-n0-a0"},
            "spec": {"containers": [{"name": "trainer", "image": "trainer:test"}]},
        },
    )


@pytest.mark.integration
def test_heartbeat_lease_content_and_lifecycle(
    job: ToyJob, kube: client.ApiClient, kubeconfig: Path, namespace: str
) -> None:
    core, coord = client.CoreV1Api(kube), client.CoordinationV1Api(kube)
    pod = _pod_object(core, namespace)
    job.start_rendezvous()
    job.start_pod(
        pod.metadata.name,
        extra_env={
            "KUBECONFIG": str(kubeconfig),
            "RTJ_POD_UID": pod.metadata.uid,
            "RTJ_NAMESPACE": namespace,
            "RTJ_NODE_NAME": "node-a",
        },
    )
    name = lease_name(pod.metadata.name)

    def training_lease():
        lease = _read_lease(coord, name, namespace)
        hb = lease and parse_heartbeat(lease.metadata.annotations)
        return (lease, hb) if hb and hb.state == PodState.TRAINING and hb.step > 0 else None

    lease, hb1 = wait_for(training_lease, 180, message="a Lease saying Training with a step")
    assert lease.spec.holder_identity == pod.metadata.name
    assert lease.spec.lease_duration_seconds == math.ceil(3 * HEARTBEAT_INTERVAL)
    [owner] = lease.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid, owner.api_version) == (
        "Pod",
        pod.metadata.name,
        pod.metadata.uid,
        "v1",
    )
    renew1: datetime = lease.spec.renew_time

    # Renewed, and the step moves.
    lease2, _hb2 = wait_for(
        lambda: (r := training_lease()) and r[0].spec.renew_time > renew1 and r[1].step > hb1.step and r,
        30,
        message="the Lease to be renewed with a newer step",
    )
    assert lease2.spec.acquire_time == lease.spec.acquire_time

    # The operator asks for another renew period on the Lease (its heartbeat budget): the agent
    # renews at it from the next renewal, its Lease's duration 3 x as long.
    coord.patch_namespaced_lease(
        name, namespace, {"metadata": {"annotations": {RENEW_PERIOD_ANNOTATION: "2"}}}
    )
    wait_for(
        lambda: (r := _read_lease(coord, name, namespace)) and r.spec.lease_duration_seconds == 6,
        30,
        message="the Lease renewed with the asked period (duration 6 s)",
    )

    assert job.wait_exit(pod.metadata.name, 240) == ExitCode.SUCCEEDED, job.dump_logs()
    final = parse_heartbeat(_read_lease(coord, name, namespace).metadata.annotations)
    assert final.state == PodState.FINISHED
    assert final.step == 120
    assert final.in_process_restarts == 1
    assert final.in_job_restarts == 0
    assert final.checkpoint is not None and final.checkpoint.step == 120
    assert final.fault is not None and final.fault.reason == FaultReason.RANK_EXCEPTION

    # Owned by the pod: garbage collection deletes it with the pod.
    core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    wait_for(
        lambda: _read_lease(coord, name, namespace) is None, 120, message="garbage collection of the Lease"
    )


def test_api_errors_never_stop_training(job: ToyJob, tmp_path: Path) -> None:
    """An unreachable API server: the Lease writes fail, are logged without secrets, training finishes."""
    bad = tmp_path / "kubeconfig"
    bad.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: sekrit-token-123}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    job.start_rendezvous()
    pod = job.start_pod("toy-n0-a0", extra_env={"KUBECONFIG": str(bad)})
    assert job.wait_exit("toy-n0-a0", 240) == ExitCode.SUCCEEDED
    text = pod.log_text()
    assert "heartbeat Lease write failed" in text
    assert "sekrit-token-123" not in text


def test_a_silent_api_server_cannot_stop_the_heartbeat(tmp_path: Path) -> None:
    """An API server that accepts connections and never answers (a dead peer behind a Service IP):
    each Lease write gives up after the Lease's duration and the next tick tries a new connection,
    instead of the heartbeat thread waiting forever on the first one."""
    accepted: list[socket.socket] = []
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.5)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                accepted.append(server.accept()[0])  # held open, never read nor answered

    threading.Thread(target=accept, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'https://127.0.0.1:{server.getsockname()[1]}', "
        "insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    agent = HeartbeatAgent(
        str(tmp_path),
        PodIdentity(name="p", namespace="default", uid=None),
        interval_seconds=1.0,  # a Lease of 3 s: each write gives up after 5 s
        api_client=k8s_config.new_client_from_config(config_file=str(kubeconfig)),
    )
    agent.start()
    try:
        wait_for(lambda: len(accepted) >= 3, 120, message="the heartbeat to try a third connection")
    finally:
        stop.set()
        for conn in accepted:  # first: a write still waiting (without its bound) fails now
            conn.close()
        server.close()
        agent.stop(None)


@pytest.mark.integration
def test_a_fenced_pod_stops_its_ranks_at_once_and_exits_fenced(
    tmp_path: Path, kube: client.ApiClient, kubeconfig: Path, namespace: str
) -> None:
    """The operator fenced this pod (its slot has a newer attempt, rtj.ladder.fencing): at its next
    renewal the agent reads the fence, the ranks are killed without a save, the pod exits FENCED."""
    core, coord = client.CoreV1Api(kube), client.CoordinationV1Api(kube)
    toy = ToyJob(
        tmp_path,
        nnodes=1,
        config={"heartbeatIntervalSeconds": HEARTBEAT_INTERVAL},
        env={"TOY_STEPS": "100000"},  # trains until stopped
    )
    try:
        pod = _pod_object(core, namespace)
        toy.start_rendezvous()
        toy.start_pod(
            pod.metadata.name,
            extra_env={
                "KUBECONFIG": str(kubeconfig),
                "RTJ_POD_UID": pod.metadata.uid,
                "RTJ_NAMESPACE": namespace,
            },
        )
        name = lease_name(pod.metadata.name)

        def training() -> bool:
            lease = _read_lease(coord, name, namespace)
            hb = lease and parse_heartbeat(lease.metadata.annotations)
            return bool(hb and hb.state == PodState.TRAINING and hb.step > 0)

        wait_for(training, 180, message="the pod training")
        coord.patch_namespaced_lease(
            name, namespace, {"metadata": {"annotations": {FENCED_ANNOTATION: "slot 0 is attempt 1 now"}}}
        )
        assert toy.wait_exit(pod.metadata.name, 60) == ExitCode.FENCED, toy.dump_logs()
        assert "fenced by the operator (slot 0 is attempt 1 now)" in toy.dump_logs()
        core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    finally:
        toy.stop()
