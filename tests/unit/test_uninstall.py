"""rtj.uninstall (`python -m rtj uninstall-cleanup`, the chart's post-delete hook), against a fake at our
own kube.Kube.request: the exact requests it sends for each kind of node and job, Conflicts read again,
failures reported, the exit code. The same command against the real API server:
tests/integration/test_uninstall_cleanup.py."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
from rtj import contract, kube, uninstall
from rtj.ladder import quarantine

pytestmark = pytest.mark.unit

NODES = "/api/v1/nodes"
GROUP = f"/apis/{contract.API_GROUP}/{contract.API_VERSION}"
ALL_JOBS = f"{GROUP}/{contract.PLURAL}"
PVS = "/api/v1/persistentvolumes"
OURS = contract.FINALIZER
SELECTOR = f"{contract.LABEL_JOB}=gone,{contract.LABEL_JOB_NAMESPACE}=ns"
FOREIGN_TAINT = {"key": "example.com/maintenance", "value": "x", "effect": "NoSchedule"}
RECORD = contract.Quarantine(
    reason="NodeNotReady", since="2026-12-01T00:00:00Z", until="2026-12-01T01:00:00Z"
).model_dump_json()


class MustNotBeCalled:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"must not be called: ApiClient.{name}")


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    body: Any = None
    query: Any = field(default=None, compare=False)


class FakeKube(kube.Kube):
    """Records each request; answers `answers[(method, path)]`, a list taken in order (its last answer
    repeats), each a dict or a KubeError to raise; {} when none is given."""

    def __init__(self, answers: dict[tuple[str, str], list[Any]]) -> None:
        super().__init__(MustNotBeCalled(), request_timeout=1.0, workers=1)  # type: ignore[arg-type]
        self.calls: list[Call] = []
        self.answers = answers

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, Any] | None = None,
        content_type: str | None = None,
    ) -> dict[str, Any]:
        self.calls.append(Call(method, path, copy.deepcopy(body), copy.deepcopy(query)))
        queue = self.answers.get((method, path)) or [{}]
        answer = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(answer, kube.KubeError):
            raise answer
        return copy.deepcopy(answer)

    def writes(self) -> list[Call]:
        return [c for c in self.calls if c.method != "GET"]


def node(
    name: str, taints: list[dict[str, Any]], annotations: dict[str, str], rv: str = "5"
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": rv, "annotations": annotations},
        "spec": {"taints": taints},
    }


def job(name: str, finalizers: list[str], deleting: bool, fsx: bool = True, rv: str = "7") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "resourceVersion": rv, "finalizers": finalizers}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T10:00:00Z"
    checkpoint = {"fsx": {"fileSystemId": "fs-1"}} if fsx else {"pvc": {"claimName": "c"}}
    return {"metadata": meta, "spec": {"checkpoint": checkpoint}}


def pv(job_name: str, namespace: str = "ns", uid: str = "pv-uid", name: str = "") -> dict[str, Any]:
    labels = {contract.LABEL_JOB: job_name, contract.LABEL_JOB_NAMESPACE: namespace}
    return {"metadata": {"name": name or f"rtj-{namespace}.{job_name}-fsx", "uid": uid, "labels": labels}}


def conflict() -> kube.KubeError:
    return kube.KubeError(
        409, "Conflict", '{"reason": "Conflict", "message": "the object has been modified"}'
    )


def forbidden() -> kube.KubeError:
    return kube.KubeError(403, "Forbidden", '{"reason": "Forbidden", "message": "cannot patch resource"}')


def items(*objs: dict[str, Any]) -> dict[str, Any]:
    return {"items": list(objs)}


def run(fake: FakeKube, namespaces: tuple[str, ...] = (), delete_pvs: bool = True) -> tuple[list[str], int]:
    outcomes, left = asyncio.run(uninstall.cleanup(fake, namespaces, delete_pvs))
    return uninstall.report(outcomes, left)


# --- nodes ------------------------------------------------------------------------------------------------
def test_every_quarantine_of_ours_is_lifted_and_every_other_taint_kept() -> None:
    ours = {"key": contract.QUARANTINE_TAINT_KEY, "value": "NodeNotReady", "effect": "NoSchedule"}
    tainted = node("a", [FOREIGN_TAINT, ours], {contract.QUARANTINE_ANNOTATION: RECORD, "x": "y"})
    record_only = node("b", [], {contract.QUARANTINE_ANNOTATION: RECORD})
    clean = node("c", [FOREIGN_TAINT], {"x": "y"})
    fake = FakeKube({
        ("GET", NODES): [items(tainted, record_only, clean), items(clean)],  # listed, then listed again
        ("GET", f"{NODES}/a"): [tainted],
        ("GET", f"{NODES}/b"): [record_only],
        ("GET", ALL_JOBS): [items()],
    })  # fmt: skip
    lines, code = run(fake)
    assert fake.writes() == [
        Call("PATCH", f"{NODES}/a", quarantine.lift_patch(tainted)),
        Call("PATCH", f"{NODES}/b", quarantine.lift_patch(record_only)),
    ]
    # What lift_patch sends: the other taints whole, our record removed, under the node's resourceVersion.
    assert fake.writes()[0].body == {
        "metadata": {"resourceVersion": "5", "annotations": {contract.QUARANTINE_ANNOTATION: None}},
        "spec": {"taints": [FOREIGN_TAINT]},
    }
    assert lines == [
        f"node a: quarantine lifted (taint {contract.QUARANTINE_TAINT_KEY}=NodeNotReady)",
        "node b: quarantine lifted (record only)",
        "uninstall-cleanup: 2 node(s) and 0 job(s) done; nothing left",
    ]
    assert code == 0


def test_a_node_changed_meanwhile_is_read_and_patched_again() -> None:
    ours = {"key": contract.QUARANTINE_TAINT_KEY, "value": "HardwareFault", "effect": "NoSchedule"}
    before, after = node("a", [ours], {}, rv="5"), node("a", [ours, FOREIGN_TAINT], {}, rv="6")
    fake = FakeKube({
        ("GET", NODES): [items(before), items()],
        ("GET", f"{NODES}/a"): [before, after],
        ("PATCH", f"{NODES}/a"): [conflict(), {}],
        ("GET", ALL_JOBS): [items()],
    })  # fmt: skip
    _, code = run(fake)
    assert [c.body for c in fake.writes()] == [quarantine.lift_patch(before), quarantine.lift_patch(after)]
    assert fake.writes()[1].body["spec"]["taints"] == [FOREIGN_TAINT]  # the taint added meanwhile stays
    assert code == 0


# --- jobs -------------------------------------------------------------------------------------------------
def test_a_job_being_deleted_gets_its_pvs_deleted_then_only_our_finalizer_removed() -> None:
    """Every PV whose labels name the job, under this operator's name and an earlier one's
    (`rtj-<ns>-<job>-fsx`), each under its UID."""
    gone = job("gone", ["example.com/keep", OURS], deleting=True)
    old, new = pv("gone", uid="old-uid", name="rtj-ns-gone-fsx"), pv("gone", uid="new-uid")
    fake = FakeKube({
        ("GET", NODES): [items()],
        ("GET", ALL_JOBS): [items(gone), items()],
        ("GET", PVS): [items(old, new)],
    })  # fmt: skip
    lines, code = run(fake)
    [listed] = [c for c in fake.calls if c.path == PVS]
    assert listed.query == {"labelSelector": SELECTOR}
    delete_old, delete_new, patch = fake.writes()
    assert (delete_old.method, delete_old.path) == ("DELETE", f"{PVS}/rtj-ns-gone-fsx")
    assert (delete_new.method, delete_new.path) == ("DELETE", f"{PVS}/rtj-ns.gone-fsx")
    # That PV, not a namesake created since.
    assert [d.body["preconditions"] for d in (delete_old, delete_new)] == [
        {"uid": "old-uid"},
        {"uid": "new-uid"},
    ]
    assert patch == Call(
        "PATCH",
        f"{GROUP}/namespaces/ns/{contract.PLURAL}/gone",
        {"metadata": {"resourceVersion": "7", "finalizers": ["example.com/keep"]}},
    )
    assert lines[0] == (
        "job ns/gone: being deleted; finalizer removed; PV rtj-ns-gone-fsx, rtj-ns.gone-fsx deleted "
        "(reclaim policy Retain: the file system is untouched)"
    )
    assert code == 0


def test_a_job_not_being_deleted_keeps_its_pv_and_loses_only_the_finalizer() -> None:
    live = job("live", [OURS], deleting=False)
    fake = FakeKube({("GET", NODES): [items()], ("GET", ALL_JOBS): [items(live), items()]})
    lines, code = run(fake)
    assert fake.writes() == [
        Call("PATCH", f"{GROUP}/namespaces/ns/{contract.PLURAL}/live", {"metadata": {"resourceVersion": "7",
                                                                                   "finalizers": []}})
    ]  # fmt: skip
    assert not [c for c in fake.calls if c.path.startswith(PVS)]  # its PV is not even read
    assert "not being deleted; finalizer removed; its PV kept" in lines[0]
    selector = f"{contract.LABEL_JOB}=live,{contract.LABEL_JOB_NAMESPACE}=ns"
    assert lines[0].endswith(f"(once it is deleted: kubectl delete pv -l {selector})")
    assert code == 0


@pytest.mark.parametrize(
    ("listed", "delete_pvs", "said"),
    [
        ([pv("other", namespace="ns-x", name="rtj-ns.gone-fsx")], True, "no PV of the job left"),
        ([pv("gone", namespace="ns-x")], True, "no PV of the job left"),
        ([], True, "no PV of the job left"),
        ([pv("gone")], False, f"its PV not looked at (--keep-pvs; kubectl delete pv -l {SELECTOR})"),
    ],
    ids=["another-jobs-pv-under-its-name", "same-name-other-namespace", "pv-gone", "keep-pvs"],
)
def test_a_pv_that_is_not_the_jobs_is_never_deleted(
    listed: list[dict[str, Any]], delete_pvs: bool, said: str
) -> None:
    """The API server selects by label; a PV it answers that the labels do not name is still kept."""
    gone = job("gone", [OURS], deleting=True)
    fake = FakeKube({
        ("GET", NODES): [items()],
        ("GET", ALL_JOBS): [items(gone), items()],
        ("GET", PVS): [items(*listed)],
    })  # fmt: skip
    lines, code = run(fake, delete_pvs=delete_pvs)
    assert [c.method for c in fake.writes()] == ["PATCH"]  # the finalizer only
    assert lines[0].endswith(said) and code == 0
    if not delete_pvs:
        assert not [c for c in fake.calls if c.path.startswith(PVS)]


def test_a_pv_deleted_or_replaced_meanwhile_is_not_reported_deleted() -> None:
    """The delete's UID precondition fails (409) or the PV is gone (404): nothing of another is deleted."""
    gone = job("gone", [OURS], deleting=True)
    fake = FakeKube({
        ("GET", NODES): [items()],
        ("GET", ALL_JOBS): [items(gone), items()],
        ("GET", PVS): [items(pv("gone"))],
        ("DELETE", f"{PVS}/rtj-ns.gone-fsx"): [conflict()],
    })  # fmt: skip
    lines, code = run(fake)
    assert lines[0].endswith("finalizer removed; no PV of the job left") and code == 0


def test_jobs_without_our_finalizer_are_left_alone_and_namespaces_scope_the_jobs() -> None:
    plain = job("plain", ["example.com/keep"], deleting=True, fsx=False)
    path = f"{GROUP}/namespaces/ns/{contract.PLURAL}"
    fake = FakeKube({("GET", NODES): [items()], ("GET", path): [items(plain)]})
    lines, code = run(fake, namespaces=("ns",))
    assert fake.writes() == [] and code == 0
    assert [c.path for c in fake.calls if "resilienttrainingjobs" in c.path] == [path, path]  # never all
    assert lines == ["uninstall-cleanup: 0 node(s) and 0 job(s) done; nothing left"]


def test_a_job_changed_meanwhile_is_read_again_and_a_job_gone_meanwhile_is_done() -> None:
    old, new = job("a", [OURS], deleting=False, rv="7"), job("a", [OURS, "example.com/keep"], False, rv="8")
    path = f"{GROUP}/namespaces/ns/{contract.PLURAL}/a"
    fake = FakeKube({
        ("GET", NODES): [items()],
        ("GET", ALL_JOBS): [items(old), items()],
        ("PATCH", path): [conflict(), {}],
        ("GET", path): [new],
    })  # fmt: skip
    _, code = run(fake)
    assert [c.body for c in fake.writes()] == [
        {"metadata": {"resourceVersion": "7", "finalizers": []}},
        {"metadata": {"resourceVersion": "8", "finalizers": ["example.com/keep"]}},
    ]
    assert code == 0
    fake = FakeKube({
        ("GET", NODES): [items()],
        ("GET", ALL_JOBS): [items(old), items()],
        ("PATCH", path): [kube.KubeError(404, "Not Found")],
    })  # fmt: skip
    lines, code = run(fake)
    assert lines[0].startswith("job ns/a: not being deleted; finalizer already gone; its PV kept")
    assert code == 0


# --- failures -----------------------------------------------------------------------------------------------
def test_what_failed_and_what_is_left_are_named_and_the_exit_code_says_so() -> None:
    ours = {"key": contract.QUARANTINE_TAINT_KEY, "value": "NodeNotReady", "effect": "NoSchedule"}
    tainted = node("a", [ours], {})
    live = job("live", [OURS], deleting=False)
    fake = FakeKube({
        ("GET", NODES): [items(tainted)],
        ("GET", f"{NODES}/a"): [tainted],
        ("PATCH", f"{NODES}/a"): [forbidden()],
        ("GET", ALL_JOBS): [items(live)],
        ("PATCH", f"{GROUP}/namespaces/ns/{contract.PLURAL}/live"): [forbidden()],
    })  # fmt: skip
    lines, code = run(fake)
    assert code == uninstall.EXIT_LEFT != 0
    assert lines[0] == "job ns/live: finalizer NOT removed: Forbidden: cannot patch resource"
    assert lines[1].startswith("node a: quarantine NOT lifted (taint ") and "Forbidden" in lines[1]
    assert lines[2] == (
        "uninstall-cleanup: 0 node(s) and 0 job(s) done; FAILED: job ns/live, node a; "
        "still left: node a, job ns/live"
    )


def test_a_list_refused_is_a_failure_not_nothing_to_do() -> None:
    fake = FakeKube({("GET", NODES): [forbidden()], ("GET", ALL_JOBS): [items()]})
    lines, code = run(fake)
    assert lines[0] == "nodes: not listed: Forbidden: cannot patch resource"
    assert code == uninstall.EXIT_LEFT


def test_the_command_line() -> None:
    args = uninstall.parse_args(["--namespace=a", "--namespace", "b", "--keep-pvs"])
    assert args.namespace == ["a", "b"] and args.keep_pvs is True
    args = uninstall.parse_args([])
    assert args.namespace == [] and args.keep_pvs is False and args.request_timeout == 10.0
