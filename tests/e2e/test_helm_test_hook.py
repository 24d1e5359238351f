"""`helm test` of the installed chart, run for real: the hook pod is admitted, scheduled on an agent
node and runs (as UID 65532, restricted security context) the chart's check that the API server serves
the CRD. The e2e release has operator.replicas=0 (the operator runs as a local process), so the hook
does not ask the operator; tests/unit/test_chart_render.py covers the rendering of that branch."""

from __future__ import annotations

import json
import subprocess

import pytest
from e2e_helpers import OPERATOR_NAMESPACE, RELEASE
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
    upgrade = helm(e2e_stack, "upgrade", RELEASE, str(CHART), "--reuse-values",
                   "--set-json", f"operator.tolerations={json.dumps(gpu)}")  # fmt: skip
    assert upgrade.returncode == 0, upgrade.stderr
    # No --logs: the local agent serves no kubelet API; it keeps each pod's log in its run dir.
    result = helm(e2e_stack, "test", RELEASE, "--timeout=150s")
    out = result.stdout + result.stderr
    assert result.returncode == 0 and "Phase:          Succeeded" in out, out
    (log,) = (e2e_stack.run_dir / "agent" / "pods").glob(
        f"{OPERATOR_NAMESPACE}_{RELEASE}-*-test_*/container.log"
    )
    assert "CRD served: training.resilient.dev/v1alpha1 resilienttrainingjobs" in log.read_text()
