"""Fixtures of the integration tests (real kube-apiserver from tests/conftest.py).

- `kubectl`, `helm` (session): run the pinned binaries against the test cluster's admin kubeconfig.
- `rtj_chart` (session): the operator chart installed as release `rtj` in `rtj-system` with
  ci/local-values.yaml (CRD + RBAC + Services; no operator pod: tests run the operator as a process),
  and the current CRD applied server-side (Helm never upgrades CRDs) and Established.
- `rtj_api` (session): a CustomObjectsApi bound to the ResilientTrainingJob resource (depends on
  `rtj_chart`, so asking for it installs the CRD).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from operator_harness import OperatorEnv, operator_env_factory
from rtj import contract
from rtj.api import crdgen
from rtj_local.tools import kueue_crds
from rtj_local.versions import REPO_ROOT, bin_path
from rtj_local.wait import wait_for

CHART = REPO_ROOT / "charts" / "resilient-training-operator"
RELEASE = "rtj"
RELEASE_NAMESPACE = "rtj-system"
CRD_NAME = f"{contract.PLURAL}.{contract.API_GROUP}"


@dataclass(frozen=True)
class Tool:
    """A CLI bound to the test cluster's kubeconfig. Calling it returns the CompletedProcess; check=True
    raises with stdout/stderr in the message."""

    binary: Path
    kubeconfig: Path

    def __call__(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(cmd[:1] + list(args))} failed ({result.returncode}):\n"
                                 f"{result.stdout}\n{result.stderr}")  # fmt: skip
        return result


@pytest.fixture(scope="session")
def kubectl(kubeconfig: Path) -> Tool:
    return Tool(bin_path("kubectl"), kubeconfig)


@pytest.fixture(scope="session")
def helm(kubeconfig: Path) -> Tool:
    return Tool(bin_path("helm"), kubeconfig)


def crd_established(kube: client.ApiClient) -> bool:
    crd = client.ApiextensionsV1Api(kube).read_custom_resource_definition(CRD_NAME)
    return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])


@dataclass
class ChartRelease:
    name: str
    namespace: str
    notes: str = ""  # what `helm install` printed (NOTES.txt)


@pytest.fixture(scope="session")
def rtj_chart(kube: client.ApiClient, helm: Tool, kubectl: Tool) -> Iterator[ChartRelease]:
    # On a reused cluster the CRD may predate this checkout: apply it as the chart README says to, and
    # first: Helm 4 applies crds/ server-side too and would conflict with kubectl's fields if it differs.
    crd_path = str(crdgen.OUTPUTS[1])
    kubectl("apply", "--server-side", "--force-conflicts", "-f", crd_path)
    helm(
        "upgrade",
        "--install",
        RELEASE,
        str(CHART),
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        "-f",
        str(CHART / "ci" / "local-values.yaml"),
        "--timeout",
        "2m",
    )  # fmt: skip  (no --wait: nothing to wait for but the CRD, awaited below)
    wait_for(lambda: crd_established(kube), timeout=30, message=f"CRD {CRD_NAME} Established")
    try:
        yield ChartRelease(RELEASE, RELEASE_NAMESPACE)
    finally:
        # The CRD stays (Helm never deletes crds/), and so do jobs other sessions may look at.
        helm("uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait", check=False)


@dataclass(frozen=True)
class RtjApi:
    """CustomObjectsApi calls for ResilientTrainingJobs; every write uses fieldValidation=Strict."""

    api: client.CustomObjectsApi

    def _args(self, namespace: str) -> tuple[str, str, str, str]:
        return contract.API_GROUP, contract.API_VERSION, namespace, contract.PLURAL

    def create(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.api.create_namespaced_custom_object(
            *self._args(namespace), body, field_validation="Strict"
        )

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        return self.api.get_namespaced_custom_object(*self._args(namespace), name)

    def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.api.patch_namespaced_custom_object(
            *self._args(namespace), name, patch, field_validation="Strict"
        )

    def replace(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.api.replace_namespaced_custom_object(
            *self._args(namespace), name, body, field_validation="Strict"
        )

    def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return self.api.patch_namespaced_custom_object_status(
            *self._args(namespace), name, patch, field_validation="Strict"
        )


@pytest.fixture(scope="session")
def rtj_api(kube: client.ApiClient, rtj_chart: ChartRelease) -> RtjApi:
    return RtjApi(client.CustomObjectsApi(kube))


@pytest.fixture
def install_chart(
    rtj_chart: ChartRelease, helm: Tool, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., ChartRelease]]:
    """Installs extra releases of the chart (`install_chart(release, namespace, "key=value", ...)`, without
    the CRD, which `rtj_chart` owns, and with no operator pod nor uninstall hook by default) and
    uninstalls them after the test: their ClusterRoles and bindings are cluster-scoped."""
    installed: list[ChartRelease] = []

    def install(
        release: str, namespace: str, *set_values: str, values: dict[str, Any] | None = None
    ) -> ChartRelease:
        # Suffixed like the test namespace: a run interrupted before uninstalling leaves cluster-scoped
        # ClusterRoles behind, which must not block the next run's install.
        release = f"{release}-{namespace.rsplit('-', 1)[-1]}"
        args = ["install", release, str(CHART), "--namespace", namespace, "--skip-crds", "--timeout", "2m"]
        # No pod of the chart: nor the uninstall hook's Job, which KWOK's p5 nodes (GPU taint) would not run.
        args += ["--set", "operator.replicas=0", "--set", "uninstallCleanup.enabled=false"]
        if values:
            path = tmp_path_factory.mktemp("values") / f"{release}.yaml"
            path.write_text(yaml.safe_dump(values))
            args += ["-f", str(path)]
        for value in set_values:
            args += ["--set", value]
        installed.append(ChartRelease(release, namespace))
        installed[-1].notes = helm(*args).stdout
        return installed[-1]

    try:
        yield install
    finally:
        for r in reversed(installed):
            helm("uninstall", r.name, "--namespace", r.namespace, "--wait", check=False)


# The operator as a real subprocess for one test (tests/integration/operator_harness.py).
@pytest.fixture
def env(
    kube: client.ApiClient, kubeconfig: Path, namespace: str, rtj_api: Any, tmp_path: Path
) -> Iterator[Callable[..., OperatorEnv]]:
    start, teardown = operator_env_factory(kube, kubeconfig, namespace, rtj_api, tmp_path)
    try:
        yield start
    finally:
        teardown()


# Kueue's API (docs/kueue.md): its CRDs from the Go module, applied to the session's cluster.
@pytest.fixture(scope="session")
def kueue_api(kube: client.ApiClient, kubectl: Any) -> client.CustomObjectsApi:
    """Kueue's CRDs (KUEUE_VERSION's Go module, rtj_local.tools.kueue_crds) applied, idempotently, and
    served (tests/integration/test_operator_kueue.py, the chart's Kueue RBAC)."""
    kubectl("apply", "--server-side", "-f", str(kueue_crds()), timeout=180)
    ext = client.ApiextensionsV1Api(kube)

    def established() -> bool:
        return all(
            any(
                c.type == "Established" and c.status == "True"
                for c in ext.read_custom_resource_definition(f"{plural}.kueue.x-k8s.io").status.conditions
                or []
            )
            for plural in ("workloads", "resourceflavors")
        )

    wait_for(established, timeout=60, message="Kueue's CRDs established")
    return client.CustomObjectsApi(kube)
