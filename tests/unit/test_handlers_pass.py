"""handlers.run_pass and handlers.act against a fake at our own API wrapper, in kopf's manner: the
fake `Kube` records every request that reaches `Kube.request` (the one seam every call goes through)
and answers from a table; the raw kubernetes client underneath fails the test if anything reaches
it. The asserts are on the exact requests: order, paths, preconditions and patch payloads."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import kopf
import pytest
from ladder_testkit import NOW, make_job
from rtj import builders, contract, handlers, kube
from rtj.api.models import JobStatus, ResilientTrainingJob
from rtj.ladder import (
    AssignLease,
    CreateWorkerPod,
    CreateWorkload,
    Decision,
    DeletePod,
    JobEvent,
    LadderConfig,
    Observed,
    PatchWorkloadStatus,
    PromoteSpare,
    TaintNode,
    decide,
)
from rtj.ladder import kueue_admission as ka
from rtj.ladder.event_outbox import record
from rtj.settings import Settings

pytestmark = pytest.mark.unit

JOBS = f"/apis/{contract.API_GROUP}/{contract.API_VERSION}/namespaces/ns/{contract.PLURAL}"
STATUS = f"{JOBS}/train/status"
PODS = "/api/v1/namespaces/ns/pods"
MERGE = kube.MERGE_PATCH
FM = {"fieldManager": kube.FIELD_MANAGER}


class MustNotBeCalled:
    """Stands in for kubernetes.client.ApiClient under the fake: nothing may reach the raw client."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"must not be called: ApiClient.{name}")


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    body: Any = None
    query: dict[str, Any] | None = None
    content_type: str | None = None


class FakeKube(kube.Kube):
    """Our Kube with `request` replaced: records each call; answers `answers[(method, path)]` (a dict,
    or a KubeError to raise), else {}. Everything above `request` (create's AlreadyExists, delete's
    preconditions, the taint read-modify-write) is the real code."""

    def __init__(self, answers: dict[tuple[str, str], Any] | None = None) -> None:
        super().__init__(MustNotBeCalled(), request_timeout=1.0, workers=1)  # type: ignore[arg-type]
        self.calls: list[Call] = []
        self.answers = answers or {}

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        content_type: str | None = None,
    ) -> dict[str, Any]:
        self.calls.append(Call(method, path, copy.deepcopy(body), query, content_type))
        answer = self.answers.get((method, path))
        if isinstance(answer, kube.KubeError):
            raise answer
        return copy.deepcopy(answer) if answer is not None else {}


class FrozenClock(datetime):
    @classmethod
    def now(cls, tz: Any = None) -> datetime:  # type: ignore[override]
        return NOW


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    # handlers reads the clock as datetime.now(UTC); it has no clock parameter to pass one in.
    monkeypatch.setattr(handlers, "datetime", FrozenClock)


def job_body(job: ResilientTrainingJob, resource_version: str = "7") -> kopf.Body:
    raw = job.model_dump(by_alias=True, mode="json", exclude_none=True)
    raw["metadata"] = {**job.metadata, "resourceVersion": resource_version}
    return kopf.Body(raw)


def run_pass(
    fake: FakeKube, body: kopf.Body, memo: kopf.Memo | None = None
) -> tuple[float | None, kopf.Memo]:
    memo = memo or kopf.Memo()
    memo.kube = fake
    result = asyncio.run(handlers.run_pass(body, memo, "ns", "train", {}, {}, {}, {}))
    return result, memo


def expected_decision(job: ResilientTrainingJob) -> Decision:
    config = LadderConfig(
        fault_grace_seconds=handlers.SETTINGS.fault_grace_seconds,
        heartbeat_status_resolution_seconds=handlers.SETTINGS.heartbeat_status_resolution_seconds,
    )
    return decide(job, Observed(pods={}, leases={}, nodes={}, service_exists=False), NOW, config)


def names(calls: list[Call]) -> list[tuple[str, str, str]]:
    return sorted((c.method, c.path, (c.body or {}).get("metadata", {}).get("name", "")) for c in calls)


# --- run_pass ------------------------------------------------------------------------------------------
def test_a_new_job_writes_status_first_then_creates_its_children_then_posts_events() -> None:
    job = make_job().nodes(2).obj()
    fake = FakeKube({("PATCH", STATUS): {"metadata": {"resourceVersion": "8"}}})
    _, memo = run_pass(fake, job_body(job))
    want = expected_decision(job)

    status_write, *rest = fake.calls
    assert status_write == Call(
        "PATCH",
        STATUS,
        {"metadata": {"resourceVersion": "7"}, "status": want.status.model_dump(by_alias=True, mode="json")},
        FM,
        MERGE,
    )
    assert status_write.body["status"]["nodesDesired"] == 2
    creates = [c for c in rest if c.path != "/api/v1/namespaces/ns/events"]
    events = rest[len(creates) :]
    assert names(creates) == [
        ("POST", PODS, "train-n0-a0"),
        ("POST", PODS, "train-n1-a0"),
        ("POST", PODS, "train-rdzv"),
        ("POST", "/api/v1/namespaces/ns/services", "train-rdzv"),
    ]
    bs = builders.BuildSettings(
        trainer_service_account=handlers.SETTINGS.trainer_service_account,
        termination_grace_seconds=handlers.SETTINGS.termination_grace_seconds,
    )
    built = {
        "train-n0-a0": builders.worker_pod(job, 0, 0, "Initial", (), bs),
        "train-n1-a0": builders.worker_pod(job, 1, 0, "Initial", (), bs),
    }
    for c in creates:
        assert c.query == FM
        if c.body["metadata"]["name"] in built:
            assert c.body == built[c.body["metadata"]["name"]]
    assert [(e.method, e.body["reason"], e.body["involvedObject"]["name"]) for e in events] == [
        ("POST", ev.reason, "train") for ev in want.events
    ]
    assert (memo.last_write.replaced, memo.last_write.resource_version) == ({"7"}, "8")


def test_a_stale_pass_conflicts_on_the_status_write_and_does_nothing_else() -> None:
    conflict = kube.KubeError(409, "Conflict", '{"reason": "Conflict"}')
    fake = FakeKube({("PATCH", STATUS): conflict})
    result, memo = run_pass(fake, job_body(make_job().nodes(2).obj()))
    assert result == handlers.RETRY_SECONDS  # soon, not at the slow resync
    assert [(c.method, c.path) for c in fake.calls] == [("PATCH", STATUS)]
    assert not hasattr(memo, "last_write")


def test_a_pass_whose_call_failed_runs_again_soon() -> None:
    fake = FakeKube({("POST", PODS): kube.KubeError(500, "Internal Server Error")})
    result, _ = run_pass(fake, job_body(make_job().nodes(2).obj()))
    assert result == handlers.RETRY_SECONDS
    ok, _ = run_pass(FakeKube(), job_body(make_job().nodes(2).obj()))
    assert ok is None  # no heartbeats yet: nothing to wake for but a change or the resync


def test_a_failed_status_write_raises_before_any_action_or_event() -> None:
    fake = FakeKube({("PATCH", STATUS): kube.KubeError(500, "Internal Server Error")})
    with pytest.raises(kube.KubeError):
        run_pass(fake, job_body(make_job().nodes(2).obj()))
    assert [(c.method, c.path) for c in fake.calls] == [("PATCH", STATUS)]


def test_the_next_pass_reads_its_own_write_and_does_not_write_the_same_status_again() -> None:
    job = make_job().nodes(2).obj()
    fake = FakeKube({("PATCH", STATUS): {"metadata": {"resourceVersion": "8"}}})
    _, memo = run_pass(fake, job_body(job))
    fake.calls.clear()
    # kopf's copy of the job still predates the write (resourceVersion 7, no status).
    run_pass(fake, job_body(job), memo)
    assert [c for c in fake.calls if c.method == "PATCH"] == []
    assert [c for c in fake.calls if c.path.endswith("/events")] == []
    assert names(fake.calls) == [
        ("POST", PODS, "train-n0-a0"),  # creates repeat until the index shows the pods (AlreadyExists = ok)
        ("POST", PODS, "train-n1-a0"),
        ("POST", PODS, "train-rdzv"),
        ("POST", "/api/v1/namespaces/ns/services", "train-rdzv"),
    ]


def test_a_pod_the_api_server_refuses_fails_the_job_on_the_next_pass() -> None:
    refusal = kube.KubeError(
        422, "Unprocessable Entity", '{"message": "Pod \\"train-n0-a0\\" is invalid: x"}'
    )
    fake = FakeKube({("PATCH", STATUS): {"metadata": {"resourceVersion": "8"}}, ("POST", PODS): refusal})
    result, memo = run_pass(fake, job_body(make_job().nodes(2).obj()))
    assert result == 0.0  # run the next pass at once
    (message,) = memo.refused.values()
    assert 'the API server refused Pod "train-n0-a0" is invalid: x' in message
    assert list(memo.refused) == ["uid-train"]


def test_a_job_being_deleted_or_invalid_makes_no_request() -> None:
    deleting = make_job().obj()
    body = job_body(deleting)
    body_raw = dict(body)
    body_raw["metadata"] = {**body_raw["metadata"], "deletionTimestamp": "2026-01-01T12:00:00Z"}
    fake = FakeKube()
    assert run_pass(fake, kopf.Body(body_raw))[0] is None
    assert fake.calls == []


# --- act -------------------------------------------------------------------------------------------------
def act(fake: FakeKube, decision: Decision) -> handlers.ActOutcome:
    return asyncio.run(handlers.act(fake, make_job().nodes(2).spares(1).obj(), decision))


def test_act_deletes_first_and_signals_a_promoted_spare_only_after_relabelling_it() -> None:
    spare, lease_path = (
        "train-spare-0-a0",
        "/apis/coordination.k8s.io/v1/namespaces/ns/leases/train-spare-0-a0",
    )
    fake = FakeKube({("GET", "/api/v1/nodes/node-1"): {"metadata": {"resourceVersion": "3"}, "spec": {}}})
    decision = Decision(
        actions=[
            AssignLease(lease=spare, slot=1),
            PromoteSpare(pod=spare, slot=1, attempt=1, cause="HeartbeatTimeout"),
            TaintNode("node-1", "NodeNotReady", "ns/train", "node node-1 is not Ready", NOW),
            DeletePod(name="train-n1-a0", uid="uid-n1", grace_seconds=0),
        ]
    )
    assert act(fake, decision) == handlers.ActOutcome()
    first, *middle, last = fake.calls
    assert first == Call(
        "DELETE",
        f"{PODS}/train-n1-a0",
        {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Background",
            "preconditions": {"uid": "uid-n1"},
            "gracePeriodSeconds": 0,
        },
    )
    assert (
        Call(
            "PATCH",
            f"{PODS}/{spare}",
            {
                "metadata": {
                    "labels": {
                        contract.LABEL_ROLE: "worker",
                        contract.LABEL_SLOT: "1",
                        contract.LABEL_ATTEMPT: "1",
                    },
                    "annotations": {f"{contract.API_GROUP}/cause": "HeartbeatTimeout"},
                }
            },
            FM,
            MERGE,
        )
        in middle
    )
    taint = next(c for c in middle if c.method == "PATCH" and c.path == "/api/v1/nodes/node-1")
    (added,) = taint.body["spec"]["taints"]
    assert taint.body["metadata"]["resourceVersion"] == "3"  # read-modify-write under a precondition
    assert {k: added[k] for k in ("key", "value", "effect")} == {
        "key": contract.QUARANTINE_TAINT_KEY,
        "value": "NodeNotReady",  # the node's evidence, not a job's name
        "effect": "NoSchedule",
    }
    record = contract.parse_quarantine(taint.body["metadata"]["annotations"][contract.QUARANTINE_ANNOTATION])
    assert record is not None and record.until == NOW
    assert [(e.job, e.reason, e.message) for e in record.evidence] == [
        ("ns/train", "NodeNotReady", "node node-1 is not Ready")
    ]
    assert last == Call(
        "PATCH",
        lease_path,
        {"metadata": {"annotations": {contract.ASSIGNED_SLOT_ANNOTATION: "1"}}},
        FM,
        MERGE,
    )


def test_act_sends_no_promotion_signal_when_the_spare_is_gone() -> None:
    spare = "train-spare-0-a0"
    fake = FakeKube({("PATCH", f"{PODS}/{spare}"): kube.KubeError(404, "Not Found")})
    decision = Decision(
        actions=[
            PromoteSpare(pod=spare, slot=1, attempt=1, cause="PodFailed"),
            AssignLease(lease=spare, slot=1),
        ]
    )
    assert act(fake, decision) == handlers.ActOutcome()
    assert [(c.method, c.path) for c in fake.calls] == [("PATCH", f"{PODS}/{spare}")]


def test_act_treats_already_exists_as_success_and_reports_only_refused_creates() -> None:
    exists = kube.KubeError(409, "Conflict", '{"reason": "AlreadyExists"}')
    fake = FakeKube({("POST", PODS): exists})
    decision = Decision(
        actions=[CreateWorkerPod(slot=0, attempt=1, cause="PodFailed")], events=[JobEvent("Normal", "X", "")]
    )
    # AlreadyExists is a create that happened: nothing invalid, nothing refused.
    assert act(fake, decision) == handlers.ActOutcome(invalid=[], refused=None, created=True)
    (create,) = fake.calls
    assert (create.method, create.path, create.body["metadata"]["name"]) == ("POST", PODS, "train-n0-a1")


# --- issue 13: refusals that may end, Events that survive a crash -----------------------------------

FORBIDDEN = kube.KubeError(
    403,
    "Forbidden",
    '{"reason": "Forbidden", "message": "pods \\"train-n0-a0\\" is forbidden: error looking up service '
    'account ns/rtj-trainer: serviceaccount \\"rtj-trainer\\" not found"}',
)


def test_a_forbidden_create_is_remembered_for_the_next_pass_and_logged_once(caplog) -> None:
    fake = FakeKube({("PATCH", STATUS): {"metadata": {"resourceVersion": "8"}}, ("POST", PODS): FORBIDDEN})
    result, memo = run_pass(fake, job_body(make_job().nodes(2).obj()))
    assert result == 0.0  # the next pass shows it on the job at once
    refusal = memo.create_refusal
    assert (refusal.status, refusal.reason, refusal.failures) == (403, "Forbidden", 1)
    assert "service account" in refusal.message and not hasattr(memo, "refused")
    # The next pass: creates held back by the backoff (1 s; the clock is frozen), the condition written.
    fake.calls.clear()
    run_pass(fake, job_body(make_job().nodes(2).obj()), memo)
    assert [c for c in fake.calls if c.method == "POST" and c.path == PODS] == []
    (write,) = [c for c in fake.calls if c.method == "PATCH"]
    cond = next(c for c in write.body["status"]["conditions"] if c["type"] == "CreateRefused")
    assert cond["status"] == "True" and "service account" in cond["message"]
    assert sum("refused a create" in r.message for r in caplog.records) == 1


def test_unposted_events_in_status_are_posted_once_under_their_own_names() -> None:
    """A crash after the status write that held the Events, before posting them: the restarted
    operator (no memo) posts them; one already posted is AlreadyExists, i.e. done."""
    job = make_job().nodes(2).obj()
    status = expected_decision(job).status
    # As the status write of the pass that decided them left them (e.g. a pod failed, a node quarantined).
    record(
        status,
        [JobEvent("Warning", "PodFailed", "slot 0: ..."), JobEvent("Warning", "NodeQuarantined", "")],
        None,
        NOW,
    )
    written = job.model_copy(update={"status": status})
    seqs = [e.seq for e in status.unposted_events]
    assert seqs == [1, 2]
    names_ = [f"train.uidtrain.{seq}" for seq in seqs]
    exists = kube.KubeError(409, "Conflict", '{"reason": "AlreadyExists"}')
    fake = FakeKube({("POST", "/api/v1/namespaces/ns/events"): exists})
    _, memo = run_pass(fake, job_body(written))
    posted = [c.body["metadata"]["name"] for c in fake.calls if c.path.endswith("/events")]
    assert posted == names_
    assert memo.events_posted == seqs[-1]


# --- Kueue (rtj.ladder.kueue_admission) -----------------------------------------------------------------
WORKLOADS = "/apis/kueue.x-k8s.io/v1beta2/namespaces/ns/workloads"


def test_a_workload_create_the_server_refuses_is_a_create_refusal_not_a_log_line() -> None:
    """Kueue's CRDs not installed: the Workload's POST is a 404. It is reported as a refusal (condition
    CreateRefused + one Event, retried with backoff: rtj.ladder.create_refusals), not a failure."""
    job = make_job().labels(**{"kueue.x-k8s.io/queue-name": "team-a"}).obj()
    missing = kube.KubeError(404, "Not Found", "the server could not find the requested resource")
    fake = FakeKube({("POST", WORKLOADS): missing})
    outcome = asyncio.run(handlers.act(fake, job, Decision(actions=[CreateWorkload()])))
    assert outcome.refused is not None and outcome.refused[0] == 404, outcome
    assert not outcome.failed and not outcome.created


def test_act_creates_the_workload_and_patches_its_status_under_its_resource_version() -> None:
    job = make_job().labels(**{"kueue.x-k8s.io/queue-name": "team-a"}).obj()
    fake = FakeKube()
    status = {"conditions": [{"type": "Finished", "status": "True"}], "admission": None}
    decision = Decision(actions=[CreateWorkload(), PatchWorkloadStatus("wl-1", "42", status)])
    assert asyncio.run(handlers.act(fake, job, decision)) == handlers.ActOutcome(created=True)
    assert sorted(fake.calls, key=lambda c: c.method) == [
        Call(
            "PATCH",
            f"{WORKLOADS}/wl-1/status",
            {"status": status, "metadata": {"resourceVersion": "42"}},
            FM,
            MERGE,
        ),
        Call("POST", WORKLOADS, builders.workload(job, handlers_build_settings()), FM),
    ]


def handlers_build_settings() -> builders.BuildSettings:
    return builders.BuildSettings(
        trainer_service_account=handlers.SETTINGS.trainer_service_account,
        termination_grace_seconds=handlers.SETTINGS.termination_grace_seconds,
    )


def test_an_admitted_pass_reads_the_flavor_once_and_places_the_pods(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handlers, "SETTINGS", Settings(kueue_enabled=True))
    job = make_job().labels(**{ka.QUEUE_LABEL: "team-a"}).obj()
    wl_name = ka.workload_name("train", "uid-train")
    admitted = {
        "metadata": {"name": wl_name, "resourceVersion": "5"},
        "spec": {"queueName": "team-a"},
        "status": {
            "conditions": [
                {"type": "QuotaReserved", "status": "True"},
                {"type": "Admitted", "status": "True"},
            ],
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [
                    {"name": "workers", "flavors": {"cpu": "p5"}},
                    {"name": "rendezvous", "flavors": {"cpu": "p5"}},
                ],
            },
        },
    }
    flavor_path = "/apis/kueue.x-k8s.io/v1beta2/resourceflavors/p5"
    fake = FakeKube(
        {("GET", flavor_path): {"metadata": {"name": "p5"}, "spec": {"nodeLabels": {"pool": "a"}}}}
    )
    memo = kopf.Memo()
    memo.kube = fake
    index = {("ns", "train"): [admitted]}
    for _ in range(2):
        asyncio.run(handlers.run_pass(job_body(job), memo, "ns", "train", {}, {}, {}, {}, index))
    assert [c.path for c in fake.calls if c.method == "GET"] == [flavor_path]  # read once, then cached
    pods = [c.body for c in fake.calls if c.method == "POST" and c.path == PODS]
    assert {p["metadata"]["name"] for p in pods} >= {"train-n0-a0", "train-n1-a0", "train-rdzv"}
    for pod in pods:
        assert pod["spec"]["nodeSelector"]["pool"] == "a"
        assert pod["metadata"]["labels"][ka.PODSET_LABEL] in ("workers", "rendezvous")
    workload_calls = [c for c in fake.calls if c.path.startswith(WORKLOADS)]
    assert not [c for c in workload_calls if c.method == "POST"]  # the Workload exists: no create
    # Its PodsReady (no pod yet: WaitForStart), under the resourceVersion it was read at.
    for call in workload_calls:
        assert (call.method, call.path) == ("PATCH", f"{WORKLOADS}/{wl_name}/status"), call
        ready = next(c for c in call.body["status"]["conditions"] if c["type"] == ka.PODS_READY)
        assert (ready["status"], ready["reason"]) == ("False", ka.WAIT_FOR_START)
        assert call.body["metadata"]["resourceVersion"] == "5"


def test_a_copy_several_writes_behind_still_reads_the_last_write() -> None:
    """kopf's copy of the job stays at resourceVersion 7 (its watch is slow) while this operator
    writes 8, then 9: each pass writes from the newest of its own writes, none conflicts."""
    job = make_job().nodes(2).obj()
    fake = FakeKube({("PATCH", STATUS): {"metadata": {"resourceVersion": "8"}}})
    _, memo = run_pass(fake, job_body(job))
    # A second write (9), of a status this pass must change again (any will do: here an empty one).
    memo.last_write = handlers.OwnWrites(memo.last_write.replaced | {"8"}, "9", JobStatus())
    fake.calls.clear()
    fake.answers[("PATCH", STATUS)] = {"metadata": {"resourceVersion": "10"}}
    run_pass(fake, job_body(job), memo)  # decides from the status it wrote at 9: writes 9 -> 10
    (write,) = [c for c in fake.calls if c.method == "PATCH"]
    assert write.body["metadata"]["resourceVersion"] == "9"
    assert (memo.last_write.replaced, memo.last_write.resource_version) == ({"7", "8", "9"}, "10")


def test_a_copy_changed_by_someone_else_is_not_read_as_our_write() -> None:
    job = make_job().nodes(2).obj()
    fake = FakeKube({("PATCH", STATUS): {"metadata": {"resourceVersion": "8"}}})
    _, memo = run_pass(fake, job_body(job))
    fake.calls.clear()
    run_pass(fake, job_body(job, resource_version="12"), memo)  # a user's edit: not one we replaced
    assert [c.body["metadata"]["resourceVersion"] for c in fake.calls if c.method == "PATCH"] == ["12"]
    assert handlers.own_writes(memo.last_write, "7") is None  # the chain restarted from 12


class ConflictOnce(FakeKube):
    """The node changes between our read and our patch once (the node lifecycle controller adding
    its own taint as the node fails): the first PATCH of the node answers 409."""

    def __init__(self, answers: dict[tuple[str, str], Any]) -> None:
        super().__init__(answers)
        self.conflicts = 1

    async def request(
        self, method: str, path: str, body: Any = None, query: Any = None, content_type: Any = None
    ):
        if method == "PATCH" and path.startswith("/api/v1/nodes/") and self.conflicts:
            self.conflicts -= 1
            self.calls.append(Call(method, path, copy.deepcopy(body), query, content_type))
            raise kube.KubeError(409, "Conflict", '{"reason":"Conflict"}')
        return await super().request(method, path, body, query, content_type)


def test_a_quarantine_taint_that_meets_a_conflict_is_read_and_written_again() -> None:
    fake = ConflictOnce({("GET", "/api/v1/nodes/node-1"): {"metadata": {"resourceVersion": "3"}, "spec": {}}})
    decision = Decision(
        actions=[TaintNode("node-1", "NodeNotReady", "ns/train", "node node-1 is not Ready", NOW)]
    )
    assert act(fake, decision) == handlers.ActOutcome()
    node_calls = [(c.method, c.path) for c in fake.calls if c.path == "/api/v1/nodes/node-1"]
    assert node_calls == [("GET", "/api/v1/nodes/node-1"), ("PATCH", "/api/v1/nodes/node-1")] * 2


def test_a_quarantine_issued_again_after_a_crash_patches_the_node_once() -> None:
    """rtj.ladder.node_writes issues a taint again until the node shows it: the evidence carries the
    time the pass decided it (not the executor's clock), so the node that has it already is not
    patched again."""
    decided = NOW - timedelta(seconds=60)
    taint = TaintNode("node-1", "NodeNotReady", "ns/train", "node node-1 is not Ready", NOW, decided)
    fake = FakeKube({("GET", "/api/v1/nodes/node-1"): {"metadata": {"resourceVersion": "3"}, "spec": {}}})
    act(fake, Decision(actions=[taint]))
    [patch] = [c for c in fake.calls if c.method == "PATCH"]
    record = contract.parse_quarantine(patch.body["metadata"]["annotations"][contract.QUARANTINE_ANNOTATION])
    assert record is not None and [e.time for e in record.evidence] == [decided]
    tainted = {"metadata": {"resourceVersion": "4", **patch.body["metadata"]}, "spec": patch.body["spec"]}
    again = FakeKube({("GET", "/api/v1/nodes/node-1"): tainted})
    act(again, Decision(actions=[taint]))
    assert [(c.method, c.path) for c in again.calls] == [("GET", "/api/v1/nodes/node-1")]


# --- admit and cleanup: the job's FSx PV ---------------------------------------------------------------
PVS = "/api/v1/persistentvolumes"
PVCS = "/api/v1/namespaces/ns/persistentvolumeclaims"
SELECTOR = {"labelSelector": f"{contract.LABEL_JOB}=train,{contract.LABEL_JOB_NAMESPACE}=ns"}
PV_LABELS = {contract.LABEL_JOB: "train", contract.LABEL_JOB_NAMESPACE: "ns"}
FSX = {
    "fileSystemId": "fs-0123456789abcdef0",
    "dnsName": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
    "mountName": "abcdefgh",
}


def fsx_body(deleting: bool = False) -> kopf.Body:
    raw = dict(job_body(make_job().spec(checkpoint={"fsx": FSX}).obj()))
    if deleting:
        raw["metadata"] = {**raw["metadata"], "deletionTimestamp": "2026-01-01T12:00:00Z"}
    return kopf.Body(raw)


def labelled_pv(name: str, uid: str, labels: dict[str, str], phase: str = "Bound") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "uid": uid, "labels": labels},
        "spec": {"claimRef": {"namespace": "ns", "name": "train-checkpoints", "uid": "pvc-uid"}},
        "status": {"phase": phase},
    }


def memo_of(fake: FakeKube) -> kopf.Memo:
    memo = kopf.Memo()
    memo.kube = fake
    return memo


def test_admit_lists_the_jobs_pvs_then_creates_its_pv_and_the_pvc_naming_it() -> None:
    fake = FakeKube({("GET", PVS): {"items": []}})
    asyncio.run(handlers.admit(body=fsx_body(), memo=memo_of(fake)))
    assert [(c.method, c.path, c.query) for c in fake.calls] == [
        ("GET", PVS, SELECTOR),
        ("POST", PVS, FM),
        ("POST", PVCS, FM),
    ]
    pv, pvc = fake.calls[1].body, fake.calls[2].body
    assert pv["metadata"] == {"name": "rtj-ns.train-fsx", "labels": PV_LABELS}
    assert pvc["spec"]["volumeName"] == "rtj-ns.train-fsx"


def test_admit_after_an_upgrade_creates_no_pv_while_the_pvc_is_bound_to_the_old_one() -> None:
    """The PVC made by an earlier operator stays bound to `rtj-<ns>-<job>-fsx`: a PV under the new name
    would never bind, so none is made (builders.fsx_pv_to_create)."""
    old = labelled_pv("rtj-ns-train-fsx", "old-uid", PV_LABELS)
    exists = kube.KubeError(409, "Conflict", '{"reason":"AlreadyExists"}')  # the PVC of the operator before
    fake = FakeKube({("GET", PVS): {"items": [old]}, ("POST", PVCS): exists})
    asyncio.run(handlers.admit(body=fsx_body(), memo=memo_of(fake)))
    assert [(c.method, c.path) for c in fake.calls] == [("GET", PVS), ("POST", PVCS)]


def test_admit_of_a_pvc_job_reads_no_pv() -> None:
    fake = FakeKube()
    asyncio.run(handlers.admit(body=job_body(make_job().obj()), memo=memo_of(fake)))
    assert fake.calls == []


def test_cleanup_deletes_every_pv_its_labels_name_under_its_uid_and_no_other() -> None:
    """Listed by the job's labels, whatever their names (the old one too); a PV the server would not
    select is checked again, never deleted."""
    other = labelled_pv(
        "rtj-ns-train-fsx", "x-uid", {contract.LABEL_JOB: "train", contract.LABEL_JOB_NAMESPACE: "n"}
    )
    old = labelled_pv("rtj-ns-train-fsx", "old-uid", PV_LABELS)
    new = labelled_pv("rtj-ns.train-fsx", "new-uid", PV_LABELS)
    pvs = [old, new, other]
    fake = FakeKube({("GET", PVS): {"items": pvs}})
    asyncio.run(
        handlers.cleanup(memo=memo_of(fake), namespace="ns", name="train", body=fsx_body(deleting=True))
    )
    assert [(c.method, c.path, c.query) for c in fake.calls] == [
        ("GET", PVS, SELECTOR),
        ("DELETE", f"{PVS}/rtj-ns-train-fsx", None),
        ("DELETE", f"{PVS}/rtj-ns.train-fsx", None),
    ]
    assert [c.body["preconditions"] for c in fake.calls[1:]] == [{"uid": "old-uid"}, {"uid": "new-uid"}]


def test_cleanup_retries_while_the_pvs_cannot_be_listed() -> None:
    fake = FakeKube({("GET", PVS): kube.KubeError(503, "Service Unavailable")})
    with pytest.raises(kopf.TemporaryError):
        asyncio.run(handlers.cleanup(memo=memo_of(fake), namespace="ns", name="train"))


@pytest.mark.parametrize(
    ("fsx_enabled", "checkpoint", "holds"),
    [(True, {"fsx": FSX}, True), (True, {"pvc": {"claimName": "c"}}, False), (False, {"fsx": FSX}, False)],
    ids=["fsx-job", "pvc-job", "fsx-job-with-fsx-disabled"],
)
def test_only_an_fsx_job_under_an_operator_with_fsx_holds_the_finalizer(
    monkeypatch: pytest.MonkeyPatch, fsx_enabled: bool, checkpoint: dict[str, Any], holds: bool
) -> None:
    """With FSx disabled the operator creates no PV and has no right on PVs (the chart): a finalizer
    would leave its delete handler retrying a Forbidden LIST forever, a job that cannot be deleted."""
    monkeypatch.setattr(handlers, "SETTINGS", Settings(fsx_enabled=fsx_enabled))
    assert handlers.holds_cluster_state(kopf.Spec(kopf.Body({"spec": {"checkpoint": checkpoint}}))) is holds
