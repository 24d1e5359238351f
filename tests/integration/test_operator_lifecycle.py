"""Job lifecycle against the real API server: success, suspend/resume, deletion through garbage
collection, and an operator restart (crash) that changes nothing and counts nothing twice."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_harness import (
    OperatorEnv,
    counters,
    end_pod,
    events,
    is_true,
    job_manifest,
    lift_quarantine,
    make_node_not_ready,
    node_quarantine,
    quarantine_taint,
    reasons_of,
    running,
    until,
)
from rtj import builders, contract, reasons
from rtj.api.status_slots import every_slot
from rtj_local.cluster import LocalCluster
from rtj_local.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def passes(e: OperatorEnv) -> float:
    match = re.search(r"^rtj_reconcile_duration_seconds_count (\S+)$", e.operator.metrics(), re.M)
    return float(match.group(1)) if match else 0.0


def test_all_workers_succeeded_means_job_succeeded(env: Callable[..., OperatorEnv], kubectl: Any) -> None:
    e = env(nodes=2)
    e.create_job("train", 2)
    t = e.trainers("train")
    until(running(e, "train", 2), t, 90, e.explain("train"))
    for name in ("train-n0-a0", "train-n1-a0"):
        end_pod(e.core, e.namespace, name, 0)
    kubectl("wait", "--for=condition=Succeeded", "rtj/train", "-n", e.namespace, "--timeout=60s", timeout=70)
    st = e.status("train")
    assert st["state"] == "Succeeded" and st["reason"] == reasons.ALL_PODS_SUCCEEDED and st["completionTime"]
    until(
        lambda: not e.core.list_namespaced_pod(e.namespace, field_selector="metadata.name=train-rdzv").items,
        None,
        60,
        e.explain("train"),
    )
    assert {p.status.phase for p in e.workers("train").values()} == {"Succeeded"}, (
        "completed pods kept for logs"
    )


def test_finished_job_is_deleted_after_its_ttl(env: Callable[..., OperatorEnv]) -> None:
    e = env(nodes=1)
    e.create_job("train", 1, ttlSecondsAfterFinished=3)
    t = e.trainers("train")
    until(running(e, "train", 1), t, 90, e.explain("train"))
    end_pod(e.core, e.namespace, "train-n0-a0", 0)
    until(lambda: is_true(e.job("train"), "Succeeded"), None, 60, e.explain("train"))

    def deleted() -> bool:
        try:
            e.job("train")
        except client.ApiException as exc:
            if exc.status == 404:
                return True
            raise
        return False

    until(deleted, None, 60, e.explain("train"))
    until(lambda: not t.pods(), None, 60, e.explain("train"))  # garbage collection of the children


def test_suspend_removes_pods_and_resume_recreates_them(env: Callable[..., OperatorEnv]) -> None:
    e = env(nodes=2)
    e.create_job("train", 2)
    t = e.trainers("train")
    until(running(e, "train", 2), t, 90, e.explain("train"))
    t.heartbeats["train-n0-a0"] = contract.Heartbeat(state=contract.PodState.TRAINING, in_job_restarts=1)
    until(lambda: e.status("train")["restarts"]["inJob"] == 1, t, 30, e.explain("train"))

    e.rtj.patch(e.namespace, "train", {"spec": {"suspend": True}})
    until(lambda: is_true(e.job("train"), "Suspended") and not t.pods(), None, 60, e.explain("train"))
    st = e.status("train")
    assert (
        st["state"] == "Suspended" and st["restarts"]["inJob"] == 1 and not is_true(e.job("train"), "Running")
    )

    e.rtj.patch(e.namespace, "train", {"spec": {"suspend": False}})
    until(running(e, "train", 2), t, 90, e.explain("train"))
    assert sorted(p.metadata.name for p in e.workers("train").values()) == ["train-n0-a1", "train-n1-a1"]
    st = e.status("train")
    assert counters(st) == {"inProcess": 0, "inJob": 1, "podReschedules": 0, "disruptions": 0, "job": 0}, (
        "resume is not a reschedule"
    )
    evs = reasons_of(events(e.core, e.namespace, "train"))
    assert evs.count(reasons.SUSPENDED) == 1 and evs.count(reasons.RESUMED) == 1
    assert reasons.RENDEZVOUS_LOST not in evs


def test_job_created_suspended_starts_nothing_until_admitted(env: Callable[..., OperatorEnv]) -> None:
    """Kueue's contract with the jobs it queues: a job labelled kueue.x-k8s.io/queue-name is created
    (or set by Kueue's webhook) with spec.suspend=true and must start no pod, not even the rendezvous
    pod, until Kueue admits it by setting spec.suspend=false."""
    e = env(nodes=2)
    manifest = job_manifest("queued", e.nodegroup, 2, suspend=True)
    manifest["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team-a"}
    e.rtj.create(e.namespace, manifest)
    t = e.trainers("queued")
    until(lambda: is_true(e.job("queued"), "Suspended"), None, 60, e.explain("queued"))
    seen = passes(e)
    # Several more passes over the suspended job: still nothing created.
    until(lambda: passes(e) >= seen + 5, None, 30, e.explain("queued"))
    assert not t.pods()
    assert not e.core.list_namespaced_service(e.namespace).items
    st = e.status("queued")
    assert st["state"] == "Suspended" and st["nodesReady"] == 0

    e.rtj.patch(e.namespace, "queued", {"spec": {"suspend": False}})  # Kueue admits the workload
    until(running(e, "queued", 2), t, 90, e.explain("queued"))
    assert not is_true(e.job("queued"), "Suspended")
    assert counters(e.status("queued")) == {
        "inProcess": 0,
        "inJob": 0,
        "podReschedules": 0,
        "disruptions": 0,
        "job": 0,
    }


def test_fsx_job_fails_at_once_when_the_operator_has_no_fsx_support_and_stays_deletable(
    env: Callable[..., OperatorEnv],
    install_chart: Callable[..., Any],
    cluster: LocalCluster,
    kubectl: Any,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The operator as the chart runs it without fsx.enabled: RTJ_FSX_ENABLED=false, authenticated as
    the chart's ServiceAccount, which has no right on PersistentVolumes. The job fails at once and
    carries no finalizer: with one, its delete handler met Forbidden for ever and the job (and its
    namespace) could not be deleted."""
    release = install_chart("nofsx", namespace, f"operator.watchNamespaces={{{namespace}}}")
    sa = f"{release.name}-resilient-training-operator"
    as_sa = f"--as=system:serviceaccount:{namespace}:{sa}"

    def can_i(verb: str, resource: str) -> str:
        return kubectl("auth", "can-i", verb, resource, "-n", namespace, as_sa, check=False).stdout.strip()

    wait_for(lambda: can_i("watch", f"{contract.PLURAL}.{contract.API_GROUP}") == "yes", timeout=30,
             message="the chart's RBAC in force")  # fmt: skip
    assert can_i("list", "persistentvolumes") == can_i("delete", "persistentvolumes") == "no"
    kubeconfig = cluster.service_account_kubeconfig(namespace, sa, tmp_path / "operator.kubeconfig")
    # What the chart sets unless fsx.enabled, as the chart's ServiceAccount.
    e = env(nodes=1, RTJ_FSX_ENABLED="false", KUBECONFIG=str(kubeconfig))
    e.create_job("fsx", 1)  # the harness's jobs checkpoint on FSx
    until(lambda: is_true(e.job("fsx"), "Failed"), None, 60, e.explain("fsx"))
    st = e.status("fsx")
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == reasons.INVALID_SPEC and "fsx.enabled=true" in failed["message"]
    assert not e.trainers("fsx").pods()
    assert reasons.INVALID_SPEC in reasons_of(events(e.core, e.namespace, "fsx"))
    # kopf had handled the job (it adds a finalizer before any handler runs): none was added.
    assert contract.FINALIZER not in (e.job("fsx")["metadata"].get("finalizers") or [])

    e.rtj.api.delete_namespaced_custom_object(
        contract.API_GROUP, contract.API_VERSION, e.namespace, contract.PLURAL, "fsx"
    )
    until(lambda: e.job_gone("fsx"), None, 30, lambda: f"job fsx deleted\n{e.operator.log_tail()}")


def test_deletion_cleans_up_children_and_leaves_the_node_quarantine(env: Callable[..., OperatorEnv]) -> None:
    """Deleting a job removes its children (garbage collection; the finalizer, for the FSx PV) but
    not a node's quarantine (issue 25): that is a verdict on the node, lifted by the operator's
    review once the node shows no evidence (or by an admin), never by a job going away."""
    e = env(nodes=3)
    e.create_job("train", 2)
    t = e.trainers("train")
    until(running(e, "train", 2), t, 90, e.explain("train"))
    rdzv_node = e.core.read_namespaced_pod("train-rdzv", e.namespace).spec.node_name
    bad = next(p for _, p in sorted(e.workers("train").items()) if p.spec.node_name != rdzv_node)
    make_node_not_ready(e.core, bad.spec.node_name)  # evidence against the node
    try:
        until(
            lambda: e.status("train").get("quarantinedNodes") == [bad.spec.node_name],
            t,
            60,
            e.explain("train"),
        )
        until(running(e, "train", 2), t, 60, e.explain("train"))
        taint = quarantine_taint(e.core, bad.spec.node_name)
        assert taint is not None and taint.value == reasons.NODE_NOT_READY, taint
        coord = client.CoordinationV1Api(e.kube)
        pvc = e.core.read_namespaced_persistent_volume_claim("train-checkpoints", e.namespace)
        assert (
            pvc.spec.volume_name == builders.fsx_pv_name(e.namespace, "train") and pvc.status.phase == "Bound"
        )
        assert coord.list_namespaced_lease(e.namespace, label_selector=f"{contract.LABEL_JOB}=train").items

        e.rtj.api.delete_namespaced_custom_object(
            contract.API_GROUP, contract.API_VERSION, e.namespace, contract.PLURAL, "train"
        )

        def gone() -> bool:
            try:
                e.job("train")
                return False
            except client.ApiException as exc:
                if exc.status != 404:
                    raise
            # A pod on the dead node cannot finish terminating (no kubelet): forced, as an admin does.
            for pod in t.pods():
                if pod.metadata.deletion_timestamp and pod.spec.node_name == bad.spec.node_name:
                    e.core.delete_namespaced_pod(pod.metadata.name, e.namespace, grace_period_seconds=0)
            return (
                not t.pods()
                and not e.core.list_namespaced_service(e.namespace).items
                and not coord.list_namespaced_lease(
                    e.namespace, label_selector=f"{contract.LABEL_JOB}=train"
                ).items
            )

        until(gone, None, 90, e.explain("train"))  # garbage collection: pods -> Leases, job -> pods, Service
        taint = quarantine_taint(e.core, bad.spec.node_name)
        assert taint is not None and taint.value == reasons.NODE_NOT_READY, "the quarantine outlives the job"
        record = node_quarantine(e.core, bad.spec.node_name)
        assert record is not None and [ev.job for ev in record.evidence] == [f"{e.namespace}/train"], record

        # The finalizer deletes the FSx PV; pv-protection lets it go once GC removed its PVC.
        def pv_gone() -> bool:
            try:
                e.core.read_persistent_volume(builders.fsx_pv_name(e.namespace, "train"))
            except client.ApiException as exc:
                if exc.status == 404:
                    return True
                raise
            return False

        until(pv_gone, None, 60, e.explain("train"))
    finally:
        lift_quarantine(e.core, bad.spec.node_name)  # as an admin would after repairing the node
    assert quarantine_taint(e.core, bad.spec.node_name) is None
    assert node_quarantine(e.core, bad.spec.node_name) is None


def test_operator_restart_changes_nothing_and_counts_nothing_twice(
    env: Callable[..., OperatorEnv], kubectl: Any
) -> None:
    e = env(nodes=3)
    e.create_job("train", 2)
    t = e.trainers("train")
    until(running(e, "train", 2), t, 90, e.explain("train"))
    t.heartbeats["train-n0-a0"] = contract.Heartbeat(state=contract.PodState.TRAINING, in_process_restarts=3)
    until(lambda: e.status("train")["restarts"]["inProcess"] == 3, t, 30, e.explain("train"))
    end_pod(e.core, e.namespace, "train-n1-a0", 1)
    until(
        lambda: (p := e.workers("train").get(1)) is not None and p.metadata.name == "train-n1-a1",
        t,
        60,
        e.explain("train"),
    )
    until(running(e, "train", 2), t, 60, e.explain("train"))
    before = e.status("train")
    uids = {s: p.metadata.uid for s, p in e.workers("train").items()}
    n_events = len(events(e.core, e.namespace, "train"))

    e.operator.stop(kill=True)  # a crash, no clean shutdown; the trainers keep heartbeating
    e.operator.start(tick=t.beat)
    until(lambda: passes(e) >= 20, t, 60, e.explain("train"))  # ~10 s of passes by the new process
    after = e.status("train")
    assert (
        counters(after)
        == counters(before)
        == {"inProcess": 3, "inJob": 0, "podReschedules": 1, "disruptions": 0, "job": 0}
    ), e.explain("train")()

    # lastHeartbeatTime is refreshed coarsely (every 60 s) by design; everything else must be equal.
    def slots(st: dict[str, Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in s.items() if k != "lastHeartbeatTime"} for s in every_slot(st)]

    assert slots(after) == slots(before)
    assert {s: p.metadata.uid for s, p in e.workers("train").items()} == uids
    assert len(events(e.core, e.namespace, "train")) == n_events

    # A fault while the operator is down is counted exactly once when it comes back.
    e.operator.stop(kill=True)
    e.core.delete_namespaced_pod("train-n0-a0", e.namespace)
    e.operator.start(tick=t.beat)
    until(
        lambda: (p := e.workers("train").get(0)) is not None and p.metadata.name == "train-n0-a1",
        t,
        60,
        e.explain("train"),
    )
    until(running(e, "train", 2), t, 60, e.explain("train"))
    # A pod deleted by someone else is a disruption: no reschedule spent.
    assert counters(e.status("train")) == {
        "inProcess": 3,
        "inJob": 0,
        "podReschedules": 1,
        "disruptions": 1,
        "job": 0,
    }
    # What a user sees (shown with pytest -rP).
    print(kubectl("get", "rtj", "-n", e.namespace, "-o", "wide").stdout)
    print(kubectl("describe", "rtj", "train", "-n", e.namespace).stdout)


def test_pod_the_api_server_refuses_fails_the_job_saying_why(env: Callable[..., OperatorEnv]) -> None:
    # The CRD keeps podTemplate.volumes open (any core/v1 Volume), so it cannot see that this one
    # names two sources; the API server refuses the pod built from it, every time.
    e = env(nodes=1)
    bad = {"name": "data", "emptyDir": {}, "configMap": {"name": "x"}}
    e.create_job(
        "train", 1, podTemplate={"volumes": [bad], "volumeMounts": [{"name": "data", "mountPath": "/data"}]}
    )
    until(lambda: is_true(e.job("train"), "Failed"), None, 60, e.explain("train"))
    st = e.status("train")
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert st["reason"] == failed["reason"] == reasons.INVALID_SPEC, st
    assert 'Pod "train-n0-a0" is invalid' in failed["message"] and "spec.volumes[" in failed["message"], (
        failed
    )
    # The Event follows the status write that made the job Failed.
    until(
        lambda: reasons.INVALID_SPEC in reasons_of(events(e.core, e.namespace, "train")),
        None,
        30,
        "the Event",
    )
    assert not e.workers("train"), "no pod exists"
    # Failed is final: later passes create nothing and keep the reason.
    before = passes(e)
    until(lambda: passes(e) >= before + 2, None, 60, "two more passes")
    assert e.status("train")["reason"] == reasons.INVALID_SPEC
    assert not e.workers("train")


def test_job_is_deletable_when_its_operator_is_gone(env: Callable[..., OperatorEnv]) -> None:
    """issue 13, case 6: `helm uninstall` with jobs left; `kubectl delete rtj` then hung on the
    operator's finalizer. A job holding nothing that garbage collection cannot remove (a PVC for
    checkpoints) carries no finalizer, whatever it quarantined (a quarantine is the node's, issue 25);
    one with an FSx PV keeps it."""
    e = env(nodes=2)
    e.create_job("plain", 1, checkpoint={"pvc": {"claimName": "ckpt"}})
    e.create_job("fsx", 1)
    finalizer = contract.FINALIZER
    until(lambda: every_slot(e.status("plain")) and every_slot(e.status("fsx")), None, 60,
          e.explain("plain"))  # fmt: skip
    until(lambda: finalizer in (e.job("fsx")["metadata"].get("finalizers") or []), None, 30, e.explain("fsx"))
    assert finalizer not in (e.job("plain")["metadata"].get("finalizers") or [])
    until(lambda: [p for p in e.trainers("plain").pods()], None, 30, e.explain("plain"))
    e.operator.stop()
    e.rtj.api.delete_namespaced_custom_object(
        contract.API_GROUP, contract.API_VERSION, e.namespace, contract.PLURAL, "plain"
    )

    until(lambda: e.job_gone("plain"), None, 30, e.explain("plain"))
    until(lambda: not e.trainers("plain").pods(), None, 60, e.explain("plain"))  # garbage collected
