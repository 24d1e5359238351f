"""`helm uninstall` of a release, run for real: the chart's post-delete hook Job (operator image,
`python -m rtj uninstall-cleanup`, its own ServiceAccount and RBAC) is admitted, scheduled on one of
the stack's nodes and runs, and the node the operator had quarantined is untainted when `helm
uninstall` returns, its other taints kept; the hook's objects are gone afterwards (hook-succeeded).

The stack's release runs no hook by default (rtj_local.stack.install_chart: no pod of the chart runs on
the node agent), so this row turns it on first; on the node agent, with the operator's GPU toleration
(every local node is p5-shaped, GPU taint included; a real cluster runs it where the operator runs).
This module's stack is its own: uninstalling the release ends it."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from e2e_helpers import OPERATOR_NAMESPACE, RELEASE
from kubernetes.client.exceptions import ApiException
from rtj import contract
from rtj_local import node_kinds
from rtj_local.nodes import GPU_TAINT
from rtj_local.rawapi import MERGE
from rtj_local.stack import CHART
from rtj_local.versions import bin_path

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

FOREIGN = {"key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule"}
HOOK = f"{RELEASE}-resilient-training-operator-uninstall"


def helm(e2e_stack: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_path("helm")), *args, f"--namespace={OPERATOR_NAMESPACE}",
         f"--kubeconfig={e2e_stack.cluster.kubeconfig}"],
        capture_output=True, text=True, timeout=200,
    )  # fmt: skip


def set_taints(e2e_stack: Any, node: str, taints: list[dict[str, Any]], record: str | None) -> None:
    patch = {
        "metadata": {"annotations": {contract.QUARANTINE_ANNOTATION: record}},
        "spec": {"taints": taints},
    }
    e2e_stack.raw.request("PATCH", f"/api/v1/nodes/{node}", patch, MERGE)


def test_helm_uninstall_lifts_the_quarantine_left_on_a_node(e2e_stack: Any) -> None:
    on = ["--set", "uninstallCleanup.enabled=true"]
    if e2e_stack.kind != node_kinds.KUBELET:  # ci/kubelet-values.yaml has the operator's tolerations
        gpu = [{"key": GPU_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}]
        on += ["--set-json", f"operator.tolerations={json.dumps(gpu)}"]
    upgrade = helm(e2e_stack, "upgrade", RELEASE, str(CHART), "--reuse-values", *on)
    assert upgrade.returncode == 0, upgrade.stderr

    node = e2e_stack.nodes[0]
    own = e2e_stack.raw.request("GET", f"/api/v1/nodes/{node}")["spec"].get("taints") or []
    ours = {"key": contract.QUARANTINE_TAINT_KEY, "value": "NodeNotReady", "effect": "NoSchedule"}
    now = datetime.now(UTC)
    record = contract.Quarantine(
        reason="NodeNotReady", since=now, until=now + timedelta(hours=1)
    ).model_dump_json()
    set_taints(e2e_stack, node, [*own, FOREIGN, ours], record)
    try:
        start = time.monotonic()
        result = helm(e2e_stack, "uninstall", RELEASE, "--wait", "--timeout=60s")
        seconds = time.monotonic() - start
        out = result.stdout + result.stderr
        assert result.returncode == 0, out
        after = e2e_stack.raw.request("GET", f"/api/v1/nodes/{node}")
        keys = [t["key"] for t in after["spec"].get("taints") or []]
        assert contract.QUARANTINE_TAINT_KEY not in keys, keys
        assert keys == [t["key"] for t in [*own, FOREIGN]], keys
        assert contract.QUARANTINE_ANNOTATION not in (after["metadata"].get("annotations") or {})
        # The hook succeeded, so Helm deleted its objects; nothing of it is left in the cluster.
        assert e2e_stack.raw.get(f"/apis/batch/v1/namespaces/{OPERATOR_NAMESPACE}/jobs/{HOOK}") is None
        assert e2e_stack.raw.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{HOOK}") is None
        assert e2e_stack.raw.get(f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/serviceaccounts/{HOOK}") is None
        if e2e_stack.kind != node_kinds.KUBELET:  # the agent keeps each pod's log in its run dir
            (log,) = (e2e_stack.run_dir / "agent" / "pods").glob(
                f"{OPERATOR_NAMESPACE}_{HOOK}-*/container.log"
            )
            text = log.read_text()
            assert (
                f"node {node}: quarantine lifted (taint {contract.QUARANTINE_TAINT_KEY}=NodeNotReady)" in text
            )
            assert "nothing left" in text, text
        print(f"helm uninstall with the hook: {seconds:.1f} s")
        assert seconds < 60, f"{seconds:.1f} s\n{out}"
    finally:
        with contextlib.suppress(ApiException):
            set_taints(e2e_stack, node, own, None)
