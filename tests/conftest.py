"""Fixtures shared by every test directory.

- `cluster` (session): the local control plane (rtj_local.LocalCluster) in the run dir ($RTJ_RUN_DIR,
  default .run/cluster). Reuses a healthy one, else starts one with 4 fake p5 nodes (with
  RTJ_E2E_NODES=kubelet: none, and reachable from pods for kubelet nodes). A cluster started
  by a session is stopped when the last session using it ends (RTJ_KEEP_CLUSTER=1 keeps it); one
  started with `make cluster-up` keeps running. Sessions sharing a run dir share the cluster.
- `kubeconfig` (session): admin kubeconfig path; $RTJ_KUBECONFIG if set (no local cluster is started
  for it), else the local cluster's.
- `kube` (session): a kubernetes.client.ApiClient built from `kubeconfig`.
- `namespace` (function): a fresh namespace, deleted after the test.

Each tier directory implies its mark (`TIER_MARKS`, added at collection), so no test file can miss
it: `-m unit` selects every test under tests/unit/. A file may add marks of its own (e.g. `slow`, or
`integration` for a trainer test that needs the cluster).

Wait with `rtj_local.wait.wait_for(predicate, timeout, interval, message)`; never sleep.
Fixtures for one test area belong in that directory's own conftest.py.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from rtj_local import node_kinds
from rtj_local.cluster import LocalCluster
from rtj_local.wait import wait_for

SESSION_NODES = 4
TESTS_ROOT = Path(__file__).parent
#: The mark each tier directory implies (the directories' tests carried these marks by hand before).
TIER_MARKS = {
    "unit": "unit",
    "integration": "integration",
    "reliability": "integration",
    "e2e": "e2e",
    "trainer": "trainer",
    "trainer_ckpt": "trainer",
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its tier directory's mark (see TIER_MARKS)."""
    for item in items:
        try:
            tier = item.path.relative_to(TESTS_ROOT).parts[0]
        except ValueError:  # collected from outside tests/
            continue
        if (mark := TIER_MARKS.get(tier)) and item.get_closest_marker(mark) is None:
            item.add_marker(mark)


def pytest_report_header() -> str:
    """Every run says which NVRx and torch it tests (the shipped ones: see tests/unit/test_nvrx_pin.py)."""

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    return (
        f"rtj: NVRx {version('nvidia-resiliency-ext')}, torch {version('torch')}, "
        f"Python {platform.python_version()}"
    )


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    local = LocalCluster()
    if node_kinds.e2e_nodes(os.environ) == node_kinds.KUBELET:
        local.acquire(nodes=0, real_nodes=True)
    else:
        local.acquire(nodes=SESSION_NODES)
    try:
        yield local
    finally:
        if not os.environ.get("RTJ_KEEP_CLUSTER"):
            local.release()


@pytest.fixture(scope="session")
def kubeconfig(request: pytest.FixtureRequest) -> Path:
    if path := os.environ.get("RTJ_KUBECONFIG"):
        return Path(path)
    return request.getfixturevalue("cluster").kubeconfig


@pytest.fixture(scope="session")
def kube(kubeconfig: Path) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(kubeconfig))
    try:
        yield api
    finally:
        api.close()


def _namespace_name(test_name: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:48].rstrip("-")
    return f"{base}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def namespace(kube: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """Creates a namespace named after the test and waits for its default ServiceAccount (pods are
    rejected before it exists); deletes it (without waiting) after the test."""
    core = client.CoreV1Api(kube)
    name = _namespace_name(request.node.name)
    core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name, labels={"rtj.test/namespace": "true"}))
    )

    def default_sa_exists() -> bool:
        return any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(name).items)

    wait_for(default_sa_exists, timeout=30, message=f"ServiceAccount {name}/default")
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")
