"""`helm test` of the installed chart, run for real: the hook pod is admitted, scheduled on an agent
node and runs (as UID 65532, restricted security context) the chart's check that the API server serves
the CRD. The e2e release has operator.replicas=0 (the operator runs as a local process), so the hook
does not ask the operator; tests/unit/test_chart_render.py covers the rendering of that branch."""

from __future__ import annotations

import subprocess

import pytest
from e2e_helpers import OPERATOR_NAMESPACE, RELEASE
from rtj_local.versions import bin_path

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_helm_test_passes_on_the_local_cluster(e2e_stack) -> None:
    result = subprocess.run(
        [str(bin_path("helm")), "test", RELEASE, f"--namespace={OPERATOR_NAMESPACE}", "--logs",
         f"--kubeconfig={e2e_stack.cluster.kubeconfig}", "--timeout=4m"],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "CRD served: training.resilient.dev/v1alpha1 resilienttrainingjobs" in out, out
