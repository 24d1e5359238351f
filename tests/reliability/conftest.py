"""Fixtures of the reliability tests (faults in our own parts lose nothing).

- `raw` (session): plain-JSON API access as the cluster admin (rtj_local.rawapi.RawApi).
- `crd` (session): the current ResilientTrainingJob CRD applied server-side and Established.
- `rel_namespace` (function): a namespace with the trainer ServiceAccount, deleted afterwards.

The operator harness (the real operator process, SIGKILL/restart, fake trainers writing heartbeat
Leases through rtj.contract) lives in `harness.py` next to this file.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from rtj import contract
from rtj.api import crdgen
from rtj_local.cluster import LocalCluster
from rtj_local.rawapi import RawApi
from rtj_local.wait import wait_for

CRD_NAME = f"{contract.PLURAL}.{contract.API_GROUP}"


@pytest.fixture(scope="session")
def raw(kubeconfig: Path) -> RawApi:
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.connection_pool_maxsize = 32
    return RawApi(client.ApiClient(cfg))


def _established(raw: RawApi) -> bool:
    crd = raw.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}")
    conditions = ((crd or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


@pytest.fixture(scope="session")
def crd(cluster: LocalCluster, raw: RawApi) -> str:
    """The CRD of this checkout (a reused cluster may hold an older one), applied server-side."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crdgen.OUTPUTS[0]))
    wait_for(lambda: _established(raw), timeout=30, message=f"CRD {CRD_NAME} Established")
    return CRD_NAME


@pytest.fixture
def rel_namespace(raw: RawApi, namespace: str) -> Iterator[str]:
    """`namespace` plus the trainer ServiceAccount the operator's pods use."""
    with contextlib.suppress(ApiException):
        raw.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts",
            {"metadata": {"name": "rtj-trainer"}},
        )
    yield namespace
