"""`helm test` of the installed chart, run for real: the hook pod is admitted, scheduled on one of the
stack's nodes and runs (as UID 65532, restricted security context) the chart's check that the API server
serves the CRD. On the node agent the release has operator.replicas=0 (the operator runs as a local
process), so the hook does not ask the operator; on kubelet nodes the operator is the chart's pod and the
hook also gets its /metrics through the metrics Service (cluster DNS, kube-proxy)."""

from __future__ import annotations

import json
import subprocess

import pytest
from e2e_helpers import OPERATOR_NAMESPACE, RELEASE
from rtj_local import node_kinds
from rtj_local.stack import CHART
from rtj_local.versions import bin_path

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def helm(e2e_stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_path("helm")), *args, f"--namespace={OPERATOR_NAMESPACE}",
         f"--kubeconfig={e2e_stack.cluster.kubeconfig}"],
        capture_output=True, text=True, timeout=200,
    )  # fmt: skip


def test_helm_test_passes_on_the_local_cluster(e2e_stack) -> None:
    # Every local node is p5-shaped, GPU taint included: the test pod (like the operator's) needs the
    # operator's tolerations there (a real cluster usually has nodes without GPUs for it).
    gpu = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    # --wait: on kubelet nodes the operator pod rolls with the new tolerations; the hook asks it.
    upgrade = helm(e2e_stack, "upgrade", RELEASE, str(CHART), "--reuse-values", "--wait", "--timeout=150s",
                   "--set-json", f"operator.tolerations={json.dumps(gpu)}")  # fmt: skip
    assert upgrade.returncode == 0, upgrade.stderr
    if e2e_stack.kind == node_kinds.KUBELET:  # the kubelet serves the hook pod's log through the API
        result = helm(e2e_stack, "test", RELEASE, "--timeout=150s", "--logs")
        log = out = result.stdout + result.stderr
        assert "operator answers: http://" in log, out
    else:  # no --logs: the local agent serves no kubelet API; it keeps each pod's log in its run dir
        result = helm(e2e_stack, "test", RELEASE, "--timeout=150s")
        out = result.stdout + result.stderr
        (path,) = (e2e_stack.run_dir / "agent" / "pods").glob(
            f"{OPERATOR_NAMESPACE}_{RELEASE}-*-test_*/container.log"
        )
        log = path.read_text()
    assert result.returncode == 0 and "Phase:          Succeeded" in out, out
    assert "CRD served: training.resilient.dev/v1alpha1 resilienttrainingjobs" in log
