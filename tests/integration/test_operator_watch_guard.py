"""rtj.watch_guard on the real operator (`python -m rtj`) against the real API server.

- /healthz's `watches` probe lists kopf's watch streams for pods, Leases, Services, jobs and Nodes by
  the task names the guard relies on (so a kopf that named them otherwise fails here, not in a cluster);
  a clean stop (SIGTERM) does not trip the guard.
- A watch kopf gives up on (nolar/kopf#1276; here: Leases refused by RBAC, so every list is a 403)
  ends the process with EXIT_WATCH_LOST after kopf's retries, instead of an operator blind to
  heartbeats.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from operator_harness import OperatorEnv
from rtj import contract
from rtj.watch_guard import EXIT_WATCH_LOST
from rtj_local.stack import OperatorProcess
from rtj_local.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def healthz(op: OperatorProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{op.health_port}/healthz", timeout=5) as resp:
        return json.loads(resp.read())


def test_healthz_lists_the_watch_streams_by_the_names_the_guard_relies_on(
    env: Callable[..., OperatorEnv],
) -> None:
    e = env(nodes=0)
    ns = e.namespace
    expected = {
        f"watcher for pods.v1@{ns}",
        f"watcher for leases.v1.coordination.k8s.io@{ns}",
        f"watcher for services.v1@{ns}",
        f"watcher for {contract.PLURAL}.{contract.API_VERSION}.{contract.API_GROUP}@{ns}",
        "watcher for nodes.v1@None",
    }
    seen: list[str] = []

    def listed() -> bool:  # kopf caches probe results for 10 s: the first may predate the watchers
        seen[:] = healthz(e.operator).get("watches") or []
        return expected <= set(seen)

    wait_for(listed, timeout=60, interval=1, message=lambda: f"watches {seen}\n{e.operator.log_tail(40)}")
    assert seen == sorted(seen)
    # A clean stop cancels every watcher: not a death, the exit code is kopf's own.
    e.operator.stop()
    assert e.operator.proc is not None and e.operator.proc.returncode == 0, e.operator.log_tail(40)


@pytest.fixture
def no_leases_kubeconfig(
    kube: client.ApiClient, kubeconfig: Path, namespace: str, tmp_path: Path
) -> Iterator[Path]:
    """A ServiceAccount that may do everything the operator does except reading Leases."""
    core, rbac = client.CoreV1Api(kube), client.RbacAuthorizationV1Api(kube)
    name = f"rtj-no-leases-{namespace}"[:63]
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "operator"}})
    every = ["*"]
    rbac.create_cluster_role(
        {
            "metadata": {"name": name},
            "rules": [
                {"apiGroups": [""], "resources": every, "verbs": every},
                {"apiGroups": [contract.API_GROUP, "kueue.x-k8s.io"], "resources": every, "verbs": every},
                {
                    "apiGroups": ["apiextensions.k8s.io"],
                    "resources": ["customresourcedefinitions"],
                    "verbs": ["get", "list", "watch"],
                },
            ],
        }
    )
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name}
    subject = {"kind": "ServiceAccount", "name": "operator", "namespace": namespace}
    rbac.create_cluster_role_binding({"metadata": {"name": name}, "roleRef": role_ref, "subjects": [subject]})
    token = core.create_namespaced_service_account_token(
        "operator", namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    admin = yaml.safe_load(kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == context["cluster"])
    path = tmp_path / "no-leases.kubeconfig"
    sa_context = {"cluster": cluster["name"], "user": "sa", "namespace": namespace}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "sa",
        "clusters": [cluster],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": sa_context}],
    }
    path.write_text(yaml.safe_dump(config))
    try:
        yield path
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


def test_a_lease_watch_kopf_gives_up_on_ends_the_operator_with_its_exit_code(
    rtj_api: Any, no_leases_kubeconfig: Path, namespace: str, tmp_path: Path
) -> None:
    op = OperatorProcess.for_namespace(no_leases_kubeconfig, namespace, tmp_path / "operator.log")
    try:
        op.start()  # healthy first: kopf retries the refused list for about a minute
        wait_for(
            lambda: op.proc is not None and op.proc.poll() is not None,
            timeout=150,
            interval=1,
            message=lambda: f"the operator still runs without its Lease watch\n{op.log_tail(40)}",
        )
        assert op.proc is not None and op.proc.returncode == EXIT_WATCH_LOST, op.log_tail(40)
        log = op.log_tail(200)
        assert (
            f"kopf's watcher for leases.v1.coordination.k8s.io@{namespace} has ended (APIForbiddenError"
            in log
        )
        assert "nolar/kopf#1276" in log
    finally:
        op.stop(grace=10)
