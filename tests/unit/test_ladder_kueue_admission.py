"""Table tests of the Kueue admission policy (rtj.ladder.kueue_admission), alone and through decide().

A job labelled kueue.x-k8s.io/queue-name (with the operator's Kueue integration on) runs only while
its Workload is admitted (Admitted True with status.admission) and not Evicted; the operator creates
the Workload, clears its admission after an eviction once no pod is left, and marks it Finished when
the job ends. Condition types and reasons as Kueue v0.17 writes them (apis/kueue/v1beta2)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from ladder_testkit import NOW, make_job, observe, running_status
from rtj import builders, reasons
from rtj.api.models import ResilientTrainingJob
from rtj.ladder import (
    CreateRendezvousPod,
    CreateWorkerPod,
    CreateWorkload,
    DeletePod,
    LadderConfig,
    Observed,
    PatchWorkloadStatus,
    TaintNode,
    decide,
)
from rtj.ladder import kueue_admission as ka
from rtj.ladder.observe import CreateRefusal, FlavorObs, flavor_from_dict, workload_from_dict

pytestmark = pytest.mark.unit

ON = LadderConfig(kueue_enabled=True)
WL = ka.workload_name("train", "uid-train")


def cond(type_: str, status: bool, reason: str = "R", message: str = "") -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-01-01T11:00:00Z",
    }


ADMISSION = {
    "clusterQueue": "cq",
    "podSetAssignments": [
        {"name": "workers", "flavors": {"cpu": "p5", "nvidia.com/gpu": "p5"}, "count": 2},
        {"name": "rendezvous", "flavors": {"cpu": "default"}, "count": 1},
    ],
}


def workload(
    *conditions: dict[str, Any], admission: dict[str, Any] | None = None, **status: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": WL, "resourceVersion": "7", "generation": 1},
        "spec": {"queueName": "team-a"},
        "status": {
            "conditions": list(conditions),
            **({"admission": admission} if admission else {}),
            **status,
        },
    }


PENDING = workload(cond("QuotaReserved", False, "Pending", "insufficient quota for cpu in flavor p5"))
ADMITTED = workload(cond("QuotaReserved", True), cond("Admitted", True, "Admitted"), admission=ADMISSION)
RESERVED_ONLY = workload(
    cond("QuotaReserved", True), cond("Admitted", False, "UnsatisfiedChecks"), admission=ADMISSION
)
EVICTED = workload(
    cond("QuotaReserved", True),
    cond("Admitted", True),
    cond("Evicted", True, "Preempted", "preempted by a higher priority workload"),
    admission=ADMISSION,
)
ADMITTED_NO_ADMISSION = workload(cond("QuotaReserved", True), cond("Admitted", True))
FINISHED = workload(cond("Finished", True, "Succeeded"))


def labelled(**spec: Any) -> Any:
    return make_job().labels(**{ka.QUEUE_LABEL: "team-a"}).spec(**spec)


def seen(obj: dict[str, Any] | None) -> Observed:
    obs = observe().obj()
    return Observed(pods=obs.pods, workload=workload_from_dict(obj) if obj else None)


# --- hold(): whether a job may run ---------------------------------------------------------------------
@dataclass
class HoldCase:
    id: str
    job: ResilientTrainingJob
    workload: dict[str, Any] | None
    enabled: bool = True
    reason: str | None = None
    message_has: str = ""


HOLD_CASES = [
    HoldCase("unlabelled job runs", make_job().obj(), None, reason=None),
    HoldCase("integration off: the label is ignored", labelled().obj(), None, enabled=False, reason=None),
    HoldCase(
        "no Workload yet: held",
        labelled().obj(),
        None,
        reason=reasons.WAITING_FOR_ADMISSION,
        message_has="LocalQueue team-a",
    ),
    HoldCase(
        "pending: held, saying why",
        labelled().obj(),
        PENDING,
        reason=reasons.WAITING_FOR_ADMISSION,
        message_has="insufficient quota",
    ),
    HoldCase(
        "quota reserved, checks not ready: held",
        labelled().obj(),
        RESERVED_ONLY,
        reason=reasons.WAITING_FOR_ADMISSION,
    ),
    HoldCase(
        "Admitted without status.admission: held",
        labelled().obj(),
        ADMITTED_NO_ADMISSION,
        reason=reasons.WAITING_FOR_ADMISSION,
    ),
    HoldCase("admitted: runs", labelled().obj(), ADMITTED, reason=None),
    HoldCase(
        "evicted while admitted: held",
        labelled().obj(),
        EVICTED,
        reason=reasons.WORKLOAD_EVICTED,
        message_has="Preempted",
    ),
    HoldCase("Workload finished: held", labelled().obj(), FINISHED, reason=reasons.WAITING_FOR_ADMISSION),
]


@pytest.mark.parametrize("case", HOLD_CASES, ids=[c.id for c in HOLD_CASES])
def test_hold(case: HoldCase) -> None:
    wl = workload_from_dict(case.workload) if case.workload else None
    got = ka.hold(case.job, wl, case.enabled)
    assert (got.reason if got else None) == case.reason
    if got is not None:
        assert case.message_has in got.message


# --- decide(): what a pass does ------------------------------------------------------------------------
@dataclass
class PassCase:
    id: str
    job: ResilientTrainingJob
    observed: Observed
    config: LadderConfig = field(default_factory=lambda: ON)
    state: str = ""
    reason: str = ""
    actions: list[type] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    patch: dict[str, Any] | None = None


def running_pods(obj: dict[str, Any] | None) -> Observed:
    obs = observe().running(2).obj()
    return Observed(
        pods=obs.pods, leases=obs.leases, nodes=obs.nodes, workload=workload_from_dict(obj) if obj else None
    )


PODS_READY = workload(
    cond("QuotaReserved", True),
    cond("Admitted", True),
    cond("PodsReady", True, ka.STARTED),
    admission=ADMISSION,
)
RECOVERING = workload(
    cond("QuotaReserved", True),
    cond("Admitted", True),
    cond("PodsReady", False, ka.WAIT_FOR_RECOVERY),
    admission=ADMISSION,
)


def node_lost(obj: dict[str, Any]) -> Observed:
    obs = observe().running(2).node("node-0").node("node-1", "Unknown").obj()
    return Observed(pods=obs.pods, leases=obs.leases, nodes=obs.nodes, workload=workload_from_dict(obj))


QUEUED_STATUS = {
    "state": "Queued",
    "reason": reasons.WAITING_FOR_ADMISSION,
    "conditions": [cond("Suspended", True, reasons.WAITING_FOR_ADMISSION)],
}
EVICTED_STATUS = {
    "state": "Queued",
    "reason": reasons.WORKLOAD_EVICTED,
    "conditions": [cond("Suspended", True, reasons.WORKLOAD_EVICTED)],
}

PASS_CASES = [
    PassCase(
        "new labelled job: creates its Workload, no pod, one Event",
        labelled().obj(),
        seen(None),
        state="Queued",
        reason=reasons.WAITING_FOR_ADMISSION,
        actions=[CreateWorkload],
        events=[reasons.WAITING_FOR_ADMISSION],
    ),
    PassCase(
        "still pending: nothing, no second Event",
        labelled().status(**QUEUED_STATUS).obj(),
        seen(PENDING),
        state="Queued",
        reason=reasons.WAITING_FOR_ADMISSION,
    ),
    PassCase(
        "admitted: pods created (rendezvous first), a resume not a fault",
        labelled().status(**QUEUED_STATUS).obj(),
        seen(ADMITTED),
        state="Pending",
        reason="PodsPending",
        actions=[CreateRendezvousPod, CreateWorkerPod, CreateWorkerPod, PatchWorkloadStatus],
        events=[reasons.RESUMED],
        patch={"PodsReady": ("False", ka.WAIT_FOR_START)},
    ),
    PassCase(
        "spec.suspend wins over an admission (no pod: PodsReady False, Kueue's timeout may evict it)",
        labelled(suspend=True).obj(),
        seen(ADMITTED),
        state="Suspended",
        reason=reasons.SUSPENDED,
        actions=[PatchWorkloadStatus],
        events=[reasons.SUSPENDED],
        patch={"PodsReady": ("False", ka.WAIT_FOR_START)},
    ),
    PassCase(
        "admitted, every slot training: PodsReady True (Started)",
        labelled().status(**running_status(2)).obj(),
        running_pods(ADMITTED),
        state="Running",
        actions=[PatchWorkloadStatus],
        patch={"PodsReady": ("True", ka.STARTED)},
    ),
    PassCase(
        "PodsReady already True: no write",
        labelled().status(**running_status(2)).obj(),
        running_pods(PODS_READY),
        state="Running",
    ),
    PassCase(
        "a node lost after PodsReady: False (WaitForRecovery) while its pod is replaced",
        labelled().status(**running_status(2)).obj(),
        node_lost(PODS_READY),
        state="Recovering",
        actions=[DeletePod, TaintNode, PatchWorkloadStatus],
        events=[reasons.NODE_NOT_READY, reasons.NODE_QUARANTINED],
        patch={"PodsReady": ("False", ka.WAIT_FOR_RECOVERY)},
    ),
    PassCase(
        "every slot training again after a recovery: True (Recovered)",
        labelled().status(**running_status(2)).obj(),
        running_pods(RECOVERING),
        state="Running",
        actions=[PatchWorkloadStatus],
        patch={"PodsReady": ("True", ka.RECOVERED)},
    ),
    PassCase(
        "integration off: the label is ignored",
        labelled().obj(),
        seen(None),
        config=LadderConfig(),
        state="Pending",
        reason="PodsPending",
        actions=[CreateRendezvousPod, CreateWorkerPod, CreateWorkerPod],
    ),
    PassCase(
        "evicted while running: every pod stopped gracefully, admission kept while pods live",
        labelled().status(**running_status(2)).obj(),
        running_pods(EVICTED),
        state="Queued",
        reason=reasons.WORKLOAD_EVICTED,
        actions=[DeletePod, DeletePod, DeletePod],
        events=[reasons.WORKLOAD_EVICTED],
    ),
    PassCase(
        "evicted, no pod left: admission cleared, requeued after a preemption",
        labelled().status(**EVICTED_STATUS).obj(),
        seen(EVICTED),
        state="Queued",
        reason=reasons.WORKLOAD_EVICTED,
        actions=[PatchWorkloadStatus],
        patch={
            "admission": None,
            "QuotaReserved": ("False", "Pending"),
            "Admitted": ("False", "NoReservation"),
            "Requeued": ("True", "Preempted"),
            "Evicted": ("True", "Preempted"),
        },
    ),
    PassCase(
        "job succeeded: Workload Finished (Succeeded)",
        labelled().status(**running_status(2)).obj(),
        Observed(
            pods=observe().rdzv().worker(0, phase="Succeeded").worker(1, phase="Succeeded").obj().pods,
            workload=workload_from_dict(ADMITTED),
        ),
        state="Succeeded",
        reason=reasons.ALL_PODS_SUCCEEDED,
        actions=[DeletePod, PatchWorkloadStatus],
        events=[reasons.ALL_PODS_SUCCEEDED],
        patch={"Finished": ("True", "Succeeded")},
    ),
    PassCase(
        "job failed before: Workload Finished (Failed)",
        labelled()
        .status(state="Failed", reason="InvalidSpec", conditions=[cond("Failed", True, "InvalidSpec")])
        .obj(),
        seen(ADMITTED),
        state="Failed",
        actions=[PatchWorkloadStatus],
        patch={"Finished": ("True", "Failed")},
    ),
    PassCase(
        "finished Workload of a finished job: left alone",
        labelled()
        .status(state="Failed", reason="InvalidSpec", conditions=[cond("Failed", True, "InvalidSpec")])
        .obj(),
        seen(FINISHED),
        state="Failed",
    ),
    PassCase(
        "finished job without a Workload: none created",
        labelled()
        .status(
            state="Succeeded",
            reason="AllPodsSucceeded",
            conditions=[cond("Succeeded", True, "AllPodsSucceeded")],
        )
        .obj(),
        seen(None),
        state="Succeeded",
    ),
]


@pytest.mark.parametrize("case", PASS_CASES, ids=[c.id for c in PASS_CASES])
def test_pass(case: PassCase) -> None:
    d = decide(case.job, case.observed, NOW, case.config)
    assert d.status.state == case.state
    if case.reason:
        assert d.status.reason == case.reason
    assert sorted(type(a).__name__ for a in d.actions) == sorted(t.__name__ for t in case.actions)
    assert [e.reason for e in d.events] == case.events
    if case.state == "Queued":
        assert not any(isinstance(a, CreateWorkerPod | CreateRendezvousPod) for a in d.actions)
        suspended = next(c for c in d.status.conditions if c.type == "Suspended")
        assert (suspended.status, suspended.reason) == ("True", case.reason)
    if case.patch is not None:
        (patch,) = [a for a in d.actions if isinstance(a, PatchWorkloadStatus)]
        assert (patch.name, patch.resource_version) == (WL, "7")
        by_type = {c["type"]: (c["status"], c["reason"]) for c in patch.status["conditions"]}
        for key, want in case.patch.items():
            if key == "admission":
                assert "admission" in patch.status and patch.status["admission"] is None
            else:
                assert by_type[key] == want, by_type
    if (
        case.state in ("Pending", "Running")
        and case.config.kueue_enabled
        and case.events == [reasons.RESUMED]
    ):
        assert d.status.restarts.pod_reschedules == 0


def test_a_refused_workload_create_shows_on_the_queued_job_and_waits_out_its_backoff() -> None:
    """Kueue's CRDs missing (404 on the Workload's create): condition CreateRefused and one Event on
    the queued job, reason CreateRefused; the create waits out the backoff (rtj.ladder.create_refusals)."""
    refusal = CreateRefusal(404, "NotFound", "the server could not find the requested resource", NOW, 3)
    d = decide(labelled().obj(), Observed(pods={}, create_refusal=refusal), NOW, ON)
    assert d.status.state == "Queued" and d.status.reason == reasons.CREATE_REFUSED
    refused = next(c for c in d.status.conditions if c.type == "CreateRefused")
    assert refused.status == "True" and "could not find the requested resource" in refused.message
    assert reasons.CREATE_REFUSED in [e.reason for e in d.events]
    assert not any(isinstance(a, CreateWorkload) for a in d.actions), "held back during the backoff"
    later = decide(
        labelled().obj(), Observed(pods={}, create_refusal=refusal), NOW + timedelta(seconds=5), ON
    )
    assert any(isinstance(a, CreateWorkload) for a in later.actions), "retried after the backoff (4 s)"


def test_eviction_then_readmission_counts_no_fault() -> None:
    """Running -> evicted (pods stopped) -> admission cleared -> re-admitted: pods recreated with the
    next attempt, cause Resume, no reschedule counted."""
    job = labelled().status(**running_status(2)).obj()
    d1 = decide(job, running_pods(EVICTED), NOW, ON)
    job = job.model_copy(update={"status": d1.status})
    d2 = decide(job, seen(EVICTED), NOW, ON)
    job = job.model_copy(update={"status": d2.status})
    d3 = decide(job, seen(ADMITTED), NOW, ON)
    creates = [a for a in d3.actions if isinstance(a, CreateWorkerPod)]
    assert [(a.slot, a.attempt, a.cause) for a in creates] == [(0, 1, "Resume"), (1, 1, "Resume")]
    assert d3.status.restarts.pod_reschedules == 0 and d3.status.restarts.job == 0


# --- names, placement, parsing, the Workload object -------------------------------------------------------
def test_workload_name_is_jobframeworks() -> None:
    digest = hashlib.sha1(b"ResilientTrainingJob\ntraining.resilient.dev\ntrain\nuid-1").hexdigest()[:5]
    assert ka.workload_name("train", "uid-1") == f"resilienttrainingjob-train-{digest}"
    assert ka.workload_name("train", "uid-2") != ka.workload_name("train", "uid-1")
    long = ka.workload_name("x" * 300, "u")
    assert len(long) == 253 and long.startswith("resilienttrainingjob-xxx")


def test_external_framework_name() -> None:
    assert ka.EXTERNAL_FRAMEWORK == "ResilientTrainingJob.v1alpha1.training.resilient.dev"


@dataclass
class PlaceCase:
    id: str
    workload: dict[str, Any]
    flavors: dict[str, FlavorObs]
    want: dict[str, tuple[dict[str, str], int]]


P5 = flavor_from_dict(
    {
        "metadata": {"name": "p5"},
        "spec": {
            "nodeLabels": {"pool": "p5"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }
)
DEFAULT = flavor_from_dict({"metadata": {"name": "default"}, "spec": {}})
PLACE_CASES = [
    PlaceCase(
        "flavor node labels and tolerations per pod set",
        ADMITTED,
        {"p5": P5, "default": DEFAULT},
        {"workers": ({"pool": "p5"}, 1), "rendezvous": ({}, 0)},
    ),
    PlaceCase(
        "admission check podSetUpdates are added",
        workload(
            cond("QuotaReserved", True),
            cond("Admitted", True),
            admission=ADMISSION,
            admissionChecks=[
                {
                    "name": "prov",
                    "state": "Ready",
                    "podSetUpdates": [
                        {"name": "workers", "nodeSelector": {"zone": "a"}, "tolerations": [{"key": "z"}]}
                    ],
                }
            ],
        ),
        {"p5": P5, "default": DEFAULT},
        {"workers": ({"pool": "p5", "zone": "a"}, 2), "rendezvous": ({}, 0)},
    ),
    PlaceCase("not admitted: nothing", PENDING, {"p5": P5}, {}),
]


@pytest.mark.parametrize("case", PLACE_CASES, ids=[c.id for c in PLACE_CASES])
def test_placement(case: PlaceCase) -> None:
    got = ka.placement(labelled().obj(), workload_from_dict(case.workload), case.flavors, True)
    assert {k: (v.node_selector, len(v.tolerations)) for k, v in got.items()} == case.want
    for name, p in got.items():
        assert p.labels[ka.PODSET_LABEL] == name


def test_missing_flavors_are_the_unread_ones() -> None:
    assert ka.missing_flavors(workload_from_dict(ADMITTED), {"p5": P5}) == {"default"}
    assert ka.missing_flavors(workload_from_dict(PENDING), {}) == set()


def test_parsing_is_total() -> None:
    for junk in ({}, {"status": {"conditions": "x", "admission": 3}}, {"status": {"admissionChecks": [1]}}):
        wl = workload_from_dict(junk)
        assert not wl.admitted and not wl.evicted and wl.assigned_flavors == {}


def test_workload_object_has_a_pod_set_per_kind_of_pod() -> None:
    job = labelled(resources={"cpu": "8", "memory": "64Gi"}).spares(1).nodes(3).obj()
    wl = builders.workload(job)
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2" and wl["kind"] == "Workload"
    assert wl["metadata"]["name"] == ka.workload_name("train", "uid-train")
    assert wl["metadata"]["ownerReferences"][0]["controller"] is True
    assert wl["spec"]["queueName"] == "team-a"
    podsets = {p["name"]: p for p in wl["spec"]["podSets"]}
    assert {n: p["count"] for n, p in podsets.items()} == {"workers": 3, "spares": 1, "rendezvous": 1}
    worker = builders.worker_pod(job, 0, 0, "Initial")["spec"]
    tpl = podsets["workers"]["template"]["spec"]
    assert tpl["containers"][0]["resources"] == worker["containers"][0]["resources"]
    assert tpl["nodeSelector"] == worker["nodeSelector"] and tpl["tolerations"] == worker["tolerations"]
    rdzv = builders.rendezvous_pod(job)["spec"]["containers"][0]["resources"]
    assert podsets["rendezvous"]["template"]["spec"]["containers"][0]["resources"] == rdzv
    assert "spares" not in {p["name"] for p in builders.workload(labelled().obj())["spec"]["podSets"]}


def test_place_adds_to_what_the_pod_has() -> None:
    pod = builders.worker_pod(labelled().obj(), 0, 0, "Initial")
    placed = builders.place(
        pod, {"pool": "p5"}, ({"key": "gpu", "operator": "Exists"},), {ka.PODSET_LABEL: "workers"}
    )
    assert placed["spec"]["nodeSelector"] == {**pod["spec"]["nodeSelector"], "pool": "p5"}
    assert placed["spec"]["tolerations"][-1] == {"key": "gpu", "operator": "Exists"}
    assert placed["metadata"]["labels"][ka.PODSET_LABEL] == "workers"
    assert pod["spec"]["nodeSelector"] != placed["spec"]["nodeSelector"]  # the built pod is not changed


@pytest.mark.parametrize(
    ("current", "ready", "want"),
    [
        (None, False, ka.WAIT_FOR_START),
        (None, True, ka.STARTED),
        (("False", ka.WAIT_FOR_START), False, ka.WAIT_FOR_START),
        (("False", ka.WAIT_FOR_START), True, ka.STARTED),
        (("True", ka.STARTED), False, ka.WAIT_FOR_RECOVERY),
        (("False", ka.WAIT_FOR_RECOVERY), False, ka.WAIT_FOR_RECOVERY),
        (("False", ka.WAIT_FOR_RECOVERY), True, ka.RECOVERED),
        (("True", ka.RECOVERED), True, ka.RECOVERED),
        (("True", ka.RECOVERED), False, ka.WAIT_FOR_RECOVERY),
        (("False", "PodsReady"), False, ka.WAIT_FOR_START),  # Kueue's older reason
    ],
)
def test_pods_ready_follows_jobframework(current: tuple[str, str] | None, ready: bool, want: str) -> None:
    stored = {"type": ka.PODS_READY, "status": current[0], "reason": current[1]} if current else None
    assert ka.pods_ready_reason(stored, ready) == want
