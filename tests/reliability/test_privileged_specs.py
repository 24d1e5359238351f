"""Jobs cannot reach the node through the operator: hostPath volumes are refused with a message that
says why, and host namespaces or privileged containers cannot even be expressed. Under
fieldValidation=Strict (kubectl's default) the field is refused by name; under the API server's own
default (Warn) it is pruned before it is stored, so the operator never sees it and the pods it
builds never carry it. (The RBAC side is tests/integration/test_rbac_operator.py; CEL messages of the
other rules are tests/integration/test_api_validation.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client.rest import ApiException
from rtj import builders, contract
from rtj.api.models import ResilientTrainingJob
from rtj_local.rawapi import RawApi

pytestmark = pytest.mark.integration

BASE = {
    "image": "trainer:1",
    "command": ["python", "train.py"],
    "nodes": 2,
    "checkpoint": {"pvc": {"claimName": "c"}},
}
#: (where, field, value): what a user might try to get a privileged pod.
ESCALATIONS = [
    ((), "hostNetwork", True),
    ((), "hostPID", True),
    ((), "hostIPC", True),
    ((), "privileged", True),
    (("podTemplate",), "hostNetwork", True),
    (("podTemplate",), "hostPID", True),
    (("podTemplate",), "hostIPC", True),
    # podTemplate.securityContext exists, but only with what `restricted` Pod Security admits.
    (("podTemplate", "securityContext"), "privileged", True),
    (("podTemplate", "securityContext"), "runAsNonRoot", False),
    (("podTemplate", "securityContext"), "capabilities", {"add": ["SYS_ADMIN"]}),
    (("podTemplate", "securityContext"), "allowPrivilegeEscalation", True),
    (("podTemplate",), "containers", [{"name": "trainer", "securityContext": {"privileged": True}}]),
]


def path(namespace: str) -> str:
    return f"/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/{namespace}/{contract.PLURAL}"


def job(name: str, where: tuple[str, ...], key: str, value: Any) -> dict[str, Any]:
    spec = json.loads(json.dumps(BASE))
    node = spec
    for part in where:
        node = node.setdefault(part, {})
    node[key] = value
    return {"apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}", "kind": contract.KIND,
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def message(exc: ApiException) -> str:
    return str(json.loads(exc.body).get("message", exc.body))


@pytest.mark.parametrize(("where", "key", "value"), ESCALATIONS, ids=lambda v: str(v)[:20])
def test_host_namespaces_and_privileged_cannot_be_expressed(
    raw: RawApi, crd: str, rel_namespace: str, where: tuple[str, ...], key: str, value: Any
) -> None:
    body = job("esc", where, key, value)
    with pytest.raises(ApiException) as err:
        raw.request("POST", path(rel_namespace), body, dryRun="All", fieldValidation="Strict")
    field = ".".join(("spec", *where, key))
    assert err.value.status in (400, 422) and f'unknown field "{field}"' in message(err.value)
    # Without Strict the server prunes the field: nothing privileged is stored or built.
    stored = raw.request("POST", path(rel_namespace), body, dryRun="All")
    assert key not in json.dumps(stored["spec"]), stored["spec"]
    stored["metadata"]["uid"] = "u"
    obj = ResilientTrainingJob.model_validate(stored)
    pod = builders.worker_pod(obj, 0, 0, "Initial")
    text = json.dumps(pod["spec"])
    assert not any(k in text for k in ("hostNetwork", "hostPID", "hostIPC", '"privileged": true', "hostPath"))
    assert builders.privileged_violations(obj) == []


@pytest.mark.parametrize("strict", [True, False])
def test_host_path_volume_is_refused_saying_why(
    raw: RawApi, crd: str, rel_namespace: str, strict: bool
) -> None:
    body = job("hp", ("podTemplate",), "volumes", [{"name": "host", "hostPath": {"path": "/"}}])
    with pytest.raises(ApiException) as err:
        raw.request(
            "POST", path(rel_namespace), body, dryRun="All", fieldValidation="Strict" if strict else None
        )
    text = message(err.value)
    assert err.value.status == 422 and "spec.podTemplate.volumes[0]" in text and "hostPath" in text, text
