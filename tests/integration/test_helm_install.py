"""`helm install` against the real API server: the session release is deployed with the CRD, and an
operator pod of the chart is admitted in a namespace enforcing the `restricted` Pod Security Standard."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from rtj import contract
from rtj_local.wait import wait_for

CRD_NAME = f"{contract.PLURAL}.{contract.API_GROUP}"

pytestmark = pytest.mark.integration


def test_session_release_is_deployed_with_the_crd(rtj_chart, helm, kube) -> None:
    status = json.loads(helm("status", rtj_chart.name, "-n", rtj_chart.namespace, "-o", "json").stdout)
    assert status["info"]["status"] == "deployed"
    crd = client.ApiextensionsV1Api(kube).read_custom_resource_definition(CRD_NAME)
    assert crd.spec.names.short_names == ["rtj"]
    rbac = client.RbacAuthorizationV1Api(kube)
    names = {
        r.metadata.name for r in rbac.list_cluster_role(label_selector="app.kubernetes.io/instance=rtj").items
    }
    assert names == {
        f"rtj-resilient-training-operator-{s}" for s in ("cluster", "jobs", "trainer", "edit", "view")
    }


def restricted_namespace(kube, namespace: str) -> None:
    client.CoreV1Api(kube).patch_namespace(
        namespace,
        {"metadata": {"labels": {
            "pod-security.kubernetes.io/enforce": "restricted",
            "pod-security.kubernetes.io/enforce-version": "latest",
        }}},
    )  # fmt: skip


def test_operator_pod_is_admitted_under_the_restricted_pod_security_standard(
    kube, install_chart, namespace
) -> None:
    restricted_namespace(kube, namespace)
    core = client.CoreV1Api(kube)
    # Control: the namespace really enforces `restricted` (a plain root pod is refused).
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(
            namespace,
            {"metadata": {"name": "root"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}},
        )
    assert err.value.status == 403 and "restricted" in err.value.body

    release = install_chart(
        "psa",
        namespace,
        "operator.replicas=1",
        # Keep the pod off every node: this test is about admission, not about running the image.
        values={"operator": {"nodeSelector": {"rtj.test/no-such-node": "true"}}},
    )
    assert "kubectl get rtj" in release.notes

    def operator_pods() -> list[client.V1Pod]:
        return core.list_namespaced_pod(
            namespace, label_selector=f"app.kubernetes.io/instance={release.name}"
        ).items

    def failed_create_events() -> str:
        events = core.list_namespaced_event(namespace).items
        return "; ".join(e.message for e in events if e.reason == "FailedCreate") or "no FailedCreate events"

    (pod,) = wait_for(
        operator_pods, timeout=60, message=lambda: f"operator pod created ({failed_create_events()})"
    )
    (container,) = pod.spec.containers
    assert container.security_context.read_only_root_filesystem is True
    assert pod.spec.security_context.run_as_non_root is True
    assert pod.spec.service_account_name == f"{release.name}-resilient-training-operator"
    env = {e.name: e.value for e in container.env if e.value is not None}
    assert env["RTJ_TRAINER_SERVICE_ACCOUNT"] == "rtj-trainer"
    assert env["RTJ_FSX_ENABLED"] == "false"


def test_install_naming_a_missing_trainer_namespace_fails_first_and_leaves_no_release(
    helm, kube, install_chart, namespace
) -> None:
    missing = f"{namespace}-absent"
    with pytest.raises(AssertionError) as err:
        install_chart("nsmissing", namespace, f"trainer.namespaces={{{missing}}}")
    text = str(err.value)
    assert f"namespace(s) {missing} do not exist" in text and "kubectl create namespace" in text, text
    # Rendering failed before anything was created: no (failed) release to clean up or upgrade.
    releases = json.loads(helm("list", "-n", namespace, "-o", "json").stdout)  # every status
    assert releases == []


def test_install_can_create_the_trainer_namespaces_enforcing_restricted(
    helm, kube, install_chart, namespace
) -> None:
    created = f"{namespace}-made"
    core = client.CoreV1Api(kube)
    try:
        install_chart(
            "nsmade", namespace, f"trainer.namespaces={{{created}}}", "trainer.createNamespaces=true"
        )
        ns = core.read_namespace(created)
        assert ns.metadata.labels["pod-security.kubernetes.io/enforce"] == "restricted"
        sa = core.read_namespaced_service_account("rtj-trainer", created)
        assert sa.metadata.namespace == created
    finally:
        core.delete_namespace(created, propagation_policy="Background")
