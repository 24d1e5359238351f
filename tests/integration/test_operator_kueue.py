"""Kueue admission of a labelled job (issue 16, docs/kueue.md) against the real API server, with
Kueue's own CRDs (KUEUE_VERSION's Go module, rtj_local.tools.kueue_crds) and the operator as a
process (RTJ_KUEUE_ENABLED=true). The test plays Kueue's scheduler: it writes the Workload's
admission, eviction and re-admission into its status, as Kueue v0.17 does."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
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
    reasons_of,
    running,
    until,
)
from rtj import builders, contract, reasons
from rtj.api.models import ResilientTrainingJob
from rtj.ladder import kueue_admission as ka
from test_operator_lifecycle import passes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

G, V = ka.WORKLOAD_GROUP, ka.WORKLOAD_VERSION
FLAVOR_LABEL = "rtj.test/flavor"
#: An eviction and a re-admission are no fault, and no disruption either (a resume, as after suspend).
NO_RESTARTS = {"inProcess": 0, "inJob": 0, "podReschedules": 0, "disruptions": 0, "job": 0}


@pytest.fixture
def flavor(kueue_api: client.CustomObjectsApi, namespace: str) -> Iterator[str]:
    """A ResourceFlavor whose node label only this test's nodes carry (labelled by the test)."""
    body = {
        "apiVersion": f"{G}/{V}",
        "kind": "ResourceFlavor",
        "metadata": {"name": namespace},
        "spec": {"nodeLabels": {FLAVOR_LABEL: namespace}},
    }
    kueue_api.create_cluster_custom_object(G, V, "resourceflavors", body)
    yield namespace
    kueue_api.delete_cluster_custom_object(G, V, "resourceflavors", namespace)


def _now() -> str:
    return contract.kube_time(datetime.now(UTC))


def _cond(type_: str, status: bool, reason: str, message: str = "") -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message or reason,
        "lastTransitionTime": _now(),
    }


def _conditions(wl: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (wl.get("status") or {}).get("conditions") or []}


def pods_ready(wl: dict[str, Any]) -> tuple[str, str] | None:
    c = _conditions(wl).get(ka.PODS_READY)
    return (c["status"], c["reason"]) if c else None


def test_kueue_admits_evicts_and_finishes_a_labelled_job(
    env: Callable[..., OperatorEnv], kueue_api: client.CustomObjectsApi, flavor: str
) -> None:
    e = env(nodes=2, RTJ_KUEUE_ENABLED="true")
    for node in e.nodes:
        e.core.patch_node(node, {"metadata": {"labels": {FLAVOR_LABEL: flavor}}})
    manifest = job_manifest("queued", e.nodegroup, 2)
    manifest["metadata"]["labels"] = {ka.QUEUE_LABEL: "team-a"}  # no spec.suspend: the label gates it
    created = e.rtj.create(e.namespace, manifest)
    name = ka.workload_name("queued", created["metadata"]["uid"])
    t = e.trainers("queued")

    def wl() -> dict[str, Any]:
        return kueue_api.get_namespaced_custom_object(G, V, e.namespace, "workloads", name)

    def set_status(status: dict[str, Any]) -> None:
        kueue_api.patch_namespaced_custom_object_status(
            G, V, e.namespace, "workloads", name, {"status": status}
        )

    def workload_exists() -> bool:
        try:
            wl()
        except client.ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # 1. Queued: the operator creates the Workload; nothing of the job starts.
    until(workload_exists, None, 60, e.explain("queued"))
    until(lambda: e.status("queued").get("state") == "Queued", None, 60, e.explain("queued"))
    seen = passes(e)
    until(lambda: passes(e) >= seen + 5, None, 60, e.explain("queued"))
    assert not t.pods() and not e.core.list_namespaced_service(e.namespace).items
    st = e.status("queued")
    suspended = next(c for c in st["conditions"] if c["type"] == "Suspended")
    assert st["reason"] == suspended["reason"] == reasons.WAITING_FOR_ADMISSION, st
    assert reasons_of(events(e.core, e.namespace, "queued")).count(reasons.WAITING_FOR_ADMISSION) == 1

    # The Workload: owned by the job, its queue, a pod set per kind of pod with the pods' requests.
    w = wl()
    owner = w["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        contract.KIND,
        created["metadata"]["uid"],
        True,
    )
    assert w["spec"]["queueName"] == "team-a"
    podsets = {p["name"]: p for p in w["spec"]["podSets"]}
    assert {n: p["count"] for n, p in podsets.items()} == {"workers": 2, "rendezvous": 1}
    job = ResilientTrainingJob.model_validate(e.job("queued"))
    want = builders.worker_pod(job, 0, 0, "Initial")["spec"]["containers"][0]["resources"]
    got = podsets["workers"]["template"]["spec"]["containers"][0]["resources"]
    assert got["requests"]["cpu"] == want["requests"]["cpu"] == "4" and got == want, (got, want)
    assert podsets["workers"]["template"]["spec"]["nodeSelector"] == {
        **builders.worker_pod(job, 0, 0, "Initial")["spec"]["nodeSelector"]
    }

    # 2. Kueue admits it (QuotaReserved, then Admitted, with podSetAssignments naming our flavor).
    admission = {
        "clusterQueue": "cq",
        "podSetAssignments": [
            {"name": "workers", "flavors": {"cpu": flavor, "memory": flavor}, "count": 2},
            {"name": "rendezvous", "flavors": {"cpu": flavor, "memory": flavor}, "count": 1},
        ],
    }
    admitted = [_cond("QuotaReserved", True, "QuotaReserved"), _cond("Admitted", True, "Admitted")]
    set_status({"admission": admission, "conditions": admitted})
    until(running(e, "queued", 2), t, 90, e.explain("queued"))
    for pod in e.workers("queued").values():
        assert pod.spec.node_selector[FLAVOR_LABEL] == flavor  # the flavor's node labels
        assert pod.metadata.labels[ka.PODSET_LABEL] == "workers"
    assert counters(e.status("queued")) == NO_RESTARTS
    # Every worker trains: PodsReady True, as jobframework writes it (Kueue's waitForPodsReady reads it).
    until(lambda: pods_ready(wl()) == ("True", ka.STARTED), t, 60, e.explain("queued"))

    # 3. Evicted (preempted): every pod stops; once none is left the operator clears the admission.
    set_status({"conditions": [*admitted, _cond("Evicted", True, "Preempted", "preempted by wl-x")]})
    until(lambda: not [p for p in t.pods() if not p.metadata.deletion_timestamp], t, 90, e.explain("queued"))
    st = e.status("queued")
    assert (st["state"], st["reason"]) == ("Queued", reasons.WORKLOAD_EVICTED), st

    def admission_cleared() -> bool:
        w = wl()
        c = _conditions(w)
        return "admission" not in w["status"] and c["QuotaReserved"]["status"] == "False"

    until(admission_cleared, None, 60, e.explain("queued"))
    c = _conditions(wl())
    assert c["QuotaReserved"]["reason"] == "Pending" and c["Admitted"]["status"] == "False"
    assert c["Requeued"]["status"] == "True" and c["Requeued"]["reason"] == "Preempted"
    assert reasons.WORKLOAD_EVICTED in reasons_of(events(e.core, e.namespace, "queued"))

    # 4. Re-admitted: it starts again, no fault counted (a resume, as after spec.suspend).
    set_status(
        {
            "admission": admission,
            "conditions": [
                _cond("QuotaReserved", True, "QuotaReserved"),
                _cond("Admitted", True, "Admitted"),
                _cond("Evicted", False, "QuotaReserved"),
                _cond("Requeued", False, "Preempted"),
            ],
        }
    )
    until(running(e, "queued", 2), t, 90, e.explain("queued"))
    assert counters(e.status("queued")) == NO_RESTARTS
    assert {p.metadata.labels[contract.LABEL_ATTEMPT] for p in e.workers("queued").values()} == {"2"}
    until(lambda: pods_ready(wl()) == ("True", ka.STARTED), t, 60, e.explain("queued"))

    # A worker fails: PodsReady False (WaitForRecovery) while it is replaced, True (Recovered) after.
    victim = e.workers("queued")[0].metadata.name
    end_pod(e.core, e.namespace, victim, 1)
    until(lambda: pods_ready(wl()) == ("False", ka.WAIT_FOR_RECOVERY), t, 60, e.explain("queued"))
    until(running(e, "queued", 2), t, 90, e.explain("queued"))
    until(lambda: pods_ready(wl()) == ("True", ka.RECOVERED), t, 60, e.explain("queued"))
    assert victim not in {p.metadata.name for p in e.workers("queued").values()}

    # 5. The job succeeds: the Workload is Finished (Succeeded), releasing its quota.
    for pod in list(e.workers("queued").values()):
        end_pod(e.core, e.namespace, pod.metadata.name, 0)
    until(lambda: is_true(e.job("queued"), "Succeeded"), None, 60, e.explain("queued"))
    until(
        lambda: _conditions(wl()).get("Finished", {}).get("status") == "True", None, 60, e.explain("queued")
    )
    assert _conditions(wl())["Finished"]["reason"] == "Succeeded"

    # 6. Deleting the job deletes its Workload (garbage collection: owner reference).
    e.rtj.api.delete_namespaced_custom_object(
        contract.API_GROUP, contract.API_VERSION, e.namespace, contract.PLURAL, "queued"
    )
    until(lambda: not workload_exists(), None, 60, "the Workload garbage collected")


def test_without_the_integration_the_label_is_ignored(
    env: Callable[..., OperatorEnv], kueue_api: client.CustomObjectsApi
) -> None:
    """The chart's default (kueue.enabled=false): no Workload, the job runs as any other."""
    e = env(nodes=2)
    manifest = job_manifest("plain", e.nodegroup, 2)
    manifest["metadata"]["labels"] = {ka.QUEUE_LABEL: "team-a"}
    e.rtj.create(e.namespace, manifest)
    until(running(e, "plain", 2), e.trainers("plain"), 90, e.explain("plain"))
    assert not kueue_api.list_namespaced_custom_object(G, V, e.namespace, "workloads")["items"]
