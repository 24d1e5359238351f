"""`python -m rtj uninstall-cleanup` (rtj.uninstall, the chart's post-delete hook) against the real API
server, run exactly as the chart's hook Job runs it and with the hook's own ServiceAccount and RBAC as
the chart renders them: every quarantine of ours lifted (other taints kept), a job being deleted
unstuck (its FSx PV deleted), a live job released from the finalizer with its PV kept, so that
deleting it afterwards never waits for the operator that is gone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from operator_harness import OperatorEnv, read_pv
from rtj import builders, contract, uninstall
from rtj_local.cluster import LocalCluster
from rtj_local.wait import wait_for

CHART_ROOT = Path(__file__).resolve().parents[2] / "charts" / "resilient-training-operator"
FOREIGN = {"key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule"}

pytestmark = pytest.mark.integration


def hook_objects(helm: Any, release: str, namespace: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(the hook's ServiceAccount and RBAC, its Job) as `helm uninstall` would create them for a release
    in `namespace` watching only `namespace`, with FSx checkpoints on."""
    out = helm("template", release, str(CHART_ROOT), "--namespace", namespace,
               "--show-only", "templates/uninstall-hook.yaml", "--set", "fsx.enabled=true",
               "--set", f"operator.watchNamespaces={{{namespace}}}").stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(out) if d]
    (job,) = [d for d in docs if d["kind"] == "Job"]
    return [d for d in docs if d["kind"] != "Job"], job


def run_hook_command(job: dict[str, Any], kubeconfig: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    """The hook Job's command and args, with this checkout's Python, as the ServiceAccount of
    `kubeconfig`; (the process, its seconds)."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"][:1] == ["python"]
    argv = [sys.executable, *container["command"][1:], *(container.get("args") or [])]
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    env.pop("KUBERNETES_SERVICE_HOST", None)  # never the in-cluster config of whatever runs the tests
    start = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90)
    return proc, time.monotonic() - start


def quarantine_by_hand(core: client.CoreV1Api, name: str, taint: bool) -> None:
    """The node as the operator leaves a quarantine: our record, our taint (when `taint`) next to the
    node's own taints, plus a taint of someone else's."""
    now = datetime.now(UTC)
    record = contract.Quarantine(reason="NodeNotReady", since=now, until=now + timedelta(hours=1))
    taints = [core.api_client.sanitize_for_serialization(t) for t in core.read_node(name).spec.taints or []]
    taints.append(FOREIGN)
    if taint:
        taints.append({"key": contract.QUARANTINE_TAINT_KEY, "value": "NodeNotReady", "effect": "NoSchedule"})
    core.patch_node(
        name,
        {"metadata": {"annotations": {contract.QUARANTINE_ANNOTATION: record.model_dump_json()}},
         "spec": {"taints": taints}},
    )  # fmt: skip


def finalizers(e: OperatorEnv, job: str) -> list[str]:
    return list(e.job(job)["metadata"].get("finalizers") or [])


def test_uninstall_cleanup_lifts_our_quarantines_and_unsticks_jobs(
    env: Callable[..., OperatorEnv], helm: Any, kubectl: Any, cluster: LocalCluster, tmp_path: Path
) -> None:
    e = env(nodes=2)
    core, ns = e.core, e.namespace
    e.create_job("gone", 1)
    e.create_job("live", 1)
    pvs = {job: builders.fsx_pv_name(ns, job) for job in ("gone", "live")}
    for job in ("gone", "live"):
        wait_for(lambda job=job: contract.FINALIZER in finalizers(e, job), timeout=30, message=e.explain(job))
        wait_for(lambda job=job: read_pv(core, pvs[job]) is not None, timeout=30, message=f"PV {pvs[job]}")

    # Why the hook runs after Helm deleted the operator (post-delete), not before: while an operator
    # runs, kopf puts the finalizer back on a live job as soon as it is removed.
    e.rtj.patch(ns, "live", {"metadata": {"finalizers": []}})
    wait_for(lambda: contract.FINALIZER in finalizers(e, "live"), timeout=15,
             message="the running operator puts its finalizer back")  # fmt: skip

    e.operator.stop()  # `helm uninstall`: the operator is gone
    tainted, recorded = e.nodes
    quarantine_by_hand(core, tainted, taint=True)
    quarantine_by_hand(core, recorded, taint=False)
    taints_before = {n: core.read_node(n).spec.taints for n in e.nodes}
    e.rtj.api.delete_namespaced_custom_object(
        contract.API_GROUP, contract.API_VERSION, ns, contract.PLURAL, "gone"
    )
    wait_for(lambda: e.job("gone")["metadata"].get("deletionTimestamp"), timeout=10, message="gone deleting")

    release = f"un-{ns.rsplit('-', 1)[-1]}"
    rbac, hook_job = hook_objects(helm, release, ns)
    rbac_file = tmp_path / "hook-rbac.yaml"
    rbac_file.write_text(yaml.safe_dump_all(rbac))
    kubectl("apply", "-f", str(rbac_file))
    try:
        (sa,) = [d["metadata"]["name"] for d in rbac if d["kind"] == "ServiceAccount"]
        hook_kubeconfig = cluster.service_account_kubeconfig(ns, sa, tmp_path / "hook.kubeconfig")

        # Control: without the hook's rights nothing is done, and the command says so (exit 1).
        nobody = cluster.service_account_kubeconfig(ns, "default", tmp_path / "default.kubeconfig")
        refused, _ = run_hook_command(hook_job, nobody)
        assert refused.returncode == uninstall.EXIT_LEFT, refused.stdout + refused.stderr
        assert "nodes: not listed: Forbidden" in refused.stdout and "FAILED: " in refused.stdout
        assert any(t.key == contract.QUARANTINE_TAINT_KEY for t in core.read_node(tainted).spec.taints)

        # Wait until the API server's authorizer sees the hook's bindings, then the run itself.
        def authorized() -> bool:
            answer = kubectl("auth", "can-i", "patch", "nodes", f"--as=system:serviceaccount:{ns}:{sa}",
                             check=False).stdout.strip()  # fmt: skip
            return answer == "yes"

        wait_for(authorized, timeout=30, message="the hook's RBAC in force")
        proc, seconds = run_hook_command(hook_job, hook_kubeconfig)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out
        lines = proc.stdout.splitlines()
        assert (
            f"node {tainted}: quarantine lifted (taint {contract.QUARANTINE_TAINT_KEY}=NodeNotReady)" in lines
        )
        assert f"node {recorded}: quarantine lifted (record only)" in lines
        assert (
            f"job {ns}/gone: being deleted; finalizer removed; PV {pvs['gone']} deleted "
            "(reclaim policy Retain: the file system is untouched)"
        ) in lines, out
        live_line = f"job {ns}/live: not being deleted; finalizer removed; its PV kept"
        assert any(line.startswith(live_line) for line in lines), out
        assert f"kubectl delete pv -l {builders.fsx_pv_selector(ns, 'live')})" in out
        assert lines[-1].endswith("; nothing left"), out
        assert seconds < 30, f"{seconds:.1f} s"

        # Nodes: ours gone (taint and record), every other taint as it was.
        for name in e.nodes:
            node = core.read_node(name)
            assert contract.QUARANTINE_ANNOTATION not in (node.metadata.annotations or {})
            kept = [t for t in taints_before[name] if t.key != contract.QUARANTINE_TAINT_KEY]
            assert [(t.key, t.value, t.effect) for t in node.spec.taints] == [
                (t.key, t.value, t.effect) for t in kept
            ]
            assert any(t.key == FOREIGN["key"] for t in node.spec.taints)
        # The job being deleted is gone; its PV too once garbage collection removed the job's PVC.
        wait_for(lambda: e.job_gone("gone"), timeout=10, message="job gone deleted")
        wait_for(lambda: read_pv(core, pvs["gone"]) is None, timeout=60, message=f"PV {pvs['gone']} deleted")
        # The live job keeps its PV; released, it is deleted at once with no operator (nor would its
        # namespace wait), and its PV stays (the command's line names it).
        assert contract.FINALIZER not in finalizers(e, "live")
        live_pv = read_pv(core, pvs["live"])
        assert live_pv is not None and live_pv.metadata.deletion_timestamp is None
        e.rtj.api.delete_namespaced_custom_object(
            contract.API_GROUP, contract.API_VERSION, ns, contract.PLURAL, "live"
        )
        wait_for(lambda: e.job_gone("live"), timeout=10, message="job live deleted without an operator")
        assert read_pv(core, pvs["live"]) is not None

        again, _ = run_hook_command(hook_job, hook_kubeconfig)  # safe to run twice
        assert again.returncode == 0 and again.stdout.splitlines()[-1].endswith("; nothing left"), (
            again.stdout
        )
        print(f"uninstall-cleanup: {seconds:.2f} s for {len(lines) - 1} line(s)")
    finally:
        kubectl("delete", "-f", str(rbac_file), "--ignore-not-found", check=False)
        for job in pvs:
            core.delete_collection_persistent_volume(label_selector=builders.fsx_pv_selector(ns, job))


def test_the_hook_pod_is_admitted_under_the_restricted_pod_security_standard(
    kube: client.ApiClient, helm: Any, namespace: str
) -> None:
    """The API server's Pod Security admission, in a namespace enforcing `restricted`, admits the hook
    Job's pod as the chart renders it (a server-side dry run); a plain pod is refused there."""
    core = client.CoreV1Api(kube)
    core.patch_namespace(namespace, {"metadata": {"labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}})  # fmt: skip
    plain = {"metadata": {"name": "root"}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
    with pytest.raises(client.ApiException) as refused:
        core.create_namespaced_pod(namespace, plain, dry_run="All")
    assert refused.value.status == 403 and "restricted" in refused.value.body
    rbac, job = hook_objects(helm, f"psa-{namespace.rsplit('-', 1)[-1]}", namespace)
    (sa,) = [d for d in rbac if d["kind"] == "ServiceAccount"]
    core.create_namespaced_service_account(namespace, {"metadata": {"name": sa["metadata"]["name"]}})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "uninstall-cleanup"},
           "spec": job["spec"]["template"]["spec"]}  # fmt: skip
    admitted = core.create_namespaced_pod(namespace, pod, dry_run="All")
    assert admitted.spec.containers[0].security_context.allow_privilege_escalation is False
