"""The chart's RBAC, checked by the real API server's authorizer (`kubectl auth can-i --as=<sa>`): the
operator ServiceAccount may do exactly what the operator does and nothing it does not need; the trainer
ServiceAccount may only write Leases in its own namespace."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.integration

GROUP = "training.resilient.dev"
JOBS = f"resilienttrainingjobs.{GROUP}"

# (verb, resource, extra kubectl args). Namespaced unless marked cluster-scoped by the test.
OPERATOR_NAMESPACED_YES = [
    *[(v, JOBS, ()) for v in ("get", "list", "watch", "patch", "delete")],
    *[(v, JOBS, ("--subresource=status",)) for v in ("get", "patch")],
    ("update", JOBS, ("--subresource=finalizers",)),
    *[(v, "pods", ()) for v in ("create", "delete", "get", "list", "watch", "patch")],
    *[(v, "services", ()) for v in ("create", "list", "watch")],
    ("create", "persistentvolumeclaims", ()),
    *[(v, "leases.coordination.k8s.io", ()) for v in ("get", "list", "watch", "patch", "delete")],
    ("create", "events", ()),
]
#: Only with fsx.enabled=true (the static PersistentVolume of an FSx checkpoint volume).
FSX_CLUSTER_YES = [(v, "persistentvolumes", ()) for v in ("create", "list", "delete")]
OPERATOR_CLUSTER_YES = [
    *[(v, "nodes", ()) for v in ("get", "list", "watch", "patch")],
    *[(v, "customresourcedefinitions.apiextensions.k8s.io", ()) for v in ("get", "list", "watch")],
]
OPERATOR_NO = [
    # Verbs the operator has no call for: children are removed by garbage collection.
    ("delete", "services", ()),
    ("delete", "persistentvolumeclaims", ()),
    ("get", "persistentvolumeclaims", ()),
    ("patch", "events", ()),
    ("create", "events.events.k8s.io", ()),
    ("get", "secrets", ()),
    ("list", "secrets", ()),
    ("create", "pods", ("--subresource=exec",)),
    ("create", "pods", ("--subresource=eviction",)),
    ("update", "pods", ()),
    ("update", "leases.coordination.k8s.io", ()),
    ("deletecollection", "pods", ()),
    ("get", "configmaps", ()),
    ("create", "configmaps", ()),
    ("create", "deployments.apps", ()),
    ("delete", "deployments.apps", ()),
    ("create", "leases.coordination.k8s.io", ()),
    ("create", JOBS, ()),
    ("update", "nodes", ()),
    ("delete", "nodes", ()),
    ("create", "namespaces", ()),
    ("delete", "namespaces", ()),
    ("patch", "customresourcedefinitions.apiextensions.k8s.io", ()),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io", ()),
    ("create", "clusterroles.rbac.authorization.k8s.io", ()),
    ("create", "rolebindings.rbac.authorization.k8s.io", ()),
    ("impersonate", "serviceaccounts", ()),
    # PersistentVolumes (fsx.enabled): listed by a job's labels, never read by name, watched or changed.
    *[(v, "persistentvolumes", ()) for v in ("get", "watch", "update", "patch")],
    ("create", "serviceaccounts", ("--subresource=token",)),
]
#: Only with kueue.enabled=true (docs/kueue.md): the job's Workload and the flavors its admission names.
WORKLOADS = "workloads.kueue.x-k8s.io"
KUEUE_NAMESPACED_YES = [
    *[(v, WORKLOADS, ()) for v in ("create", "list", "watch")],
    ("patch", WORKLOADS, ("--subresource=status",)),
]
KUEUE_CLUSTER_YES = [("get", "resourceflavors.kueue.x-k8s.io", ())]
KUEUE_NO = [
    *[(v, WORKLOADS, ()) for v in ("get", "update", "patch", "delete")],
    ("update", WORKLOADS, ("--subresource=status",)),
    *[(v, "resourceflavors.kueue.x-k8s.io", ()) for v in ("list", "create", "patch", "delete")],
    *[(v, "clusterqueues.kueue.x-k8s.io", ()) for v in ("get", "patch")],
    *[(v, "localqueues.kueue.x-k8s.io", ()) for v in ("get", "create")],
]
TRAINER_YES = [(v, "leases.coordination.k8s.io", ()) for v in ("create", "patch")]
TRAINER_NO = [
    *[(v, "leases.coordination.k8s.io", ()) for v in ("get", "update", "list", "watch", "delete")],
    ("get", "pods", ()),
    ("list", "pods", ()),
    ("get", "secrets", ()),
    ("create", "events", ()),
    ("get", JOBS, ()),
    ("patch", JOBS, ("--subresource=status",)),
    ("get", "configmaps", ()),
]


def can_i(kubectl, sa: str, verb: str, resource: str, extra: tuple[str, ...], namespace: str | None) -> bool:
    scope = ["-n", namespace] if namespace else []
    result = kubectl("auth", "can-i", verb, resource, *extra, *scope, f"--as={sa}", check=False)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), result.stdout + result.stderr
    return answer == "yes"


def check(kubectl, sa: str, rules, namespace: str | None, expected: bool) -> None:
    # One kubectl process per question, several at a time (each mostly waits on the API server).
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda rule: can_i(kubectl, sa, *rule, namespace), rules))
    wrong = [
        f"{verb} {resource} {' '.join(extra)}".strip()
        for (verb, resource, extra), answer in zip(rules, answers, strict=True)
        if answer != expected
    ]
    assert not wrong, (
        f"{sa} in {namespace or 'cluster scope'}: expected {'yes' if expected else 'no'} for {wrong}"
    )


def operator_sa(namespace: str, release: str) -> str:
    return f"system:serviceaccount:{namespace}:{release}-resilient-training-operator"


#: The leader election's Lease (rtj.leader_election), in the release namespace only: create (the API
#: cannot restrict it by name), get/update of the one Lease by name.
LEADER_LEASE_NO = [("create", "leases.coordination.k8s.io", ()), ("update", "leases.coordination.k8s.io", ())]


def leader_lease_yes(release: str) -> list[tuple[str, str, tuple[str, ...]]]:
    lease = f"leases.coordination.k8s.io/{release}-resilient-training-operator"
    return [("create", "leases.coordination.k8s.io", ()), ("get", lease, ()), ("update", lease, ())]


def test_operator_all_namespaces(kubectl, install_chart, namespace: str, kueue_api) -> None:
    release = install_chart("rbac-all", namespace, "fsx.enabled=true")
    sa = operator_sa(namespace, release.name)
    check(kubectl, sa, OPERATOR_NAMESPACED_YES, namespace, expected=True)
    check(kubectl, sa, OPERATOR_NAMESPACED_YES, "default", expected=True)  # ClusterRoleBinding: everywhere
    # The release namespace (here the test's) holds the leader Lease: creating Leases and updating that
    # one are allowed there, and nowhere else; updating any other Lease is not.
    check(kubectl, sa, leader_lease_yes(release.name), namespace, expected=True)
    other = ("update", "leases.coordination.k8s.io/some-pods-heartbeat", ())
    check(kubectl, sa, [other], namespace, expected=False)
    # (get is the heartbeat watch's, everywhere: OPERATOR_NAMESPACED_YES)
    check(kubectl, sa, [*LEADER_LEASE_NO, leader_lease_yes(release.name)[2]], "default", expected=False)
    check(kubectl, sa, [r for r in OPERATOR_NO if r not in LEADER_LEASE_NO], namespace, expected=False)
    check(
        kubectl,
        sa,
        [*OPERATOR_CLUSTER_YES, *FSX_CLUSTER_YES, ("list", "namespaces", ()), ("watch", "namespaces", ())],
        None,
        True,
    )
    check(kubectl, sa, OPERATOR_NO, None, expected=False)
    # kueue.enabled is false by default: no Kueue rights at all.
    check(kubectl, sa, [*KUEUE_NAMESPACED_YES, *KUEUE_NO], namespace, expected=False)
    check(kubectl, sa, KUEUE_CLUSTER_YES, None, expected=False)


def test_operator_gets_the_kueue_rights_it_uses_only_with_kueue_enabled(
    kubectl, install_chart, namespace: str, kueue_api
) -> None:
    """kueue_api: Kueue's CRDs are served (kubectl resolves the resource names through discovery)."""
    release = install_chart("rbac-kueue", namespace, "kueue.enabled=true")
    sa = operator_sa(namespace, release.name)
    check(kubectl, sa, KUEUE_NAMESPACED_YES, namespace, expected=True)
    check(kubectl, sa, KUEUE_CLUSTER_YES, None, expected=True)
    check(kubectl, sa, KUEUE_NO, namespace, expected=False)
    check(kubectl, sa, OPERATOR_NAMESPACED_YES, namespace, expected=True)  # the rest unchanged


def test_operator_watching_one_namespace_gets_namespaced_rights_only_there(
    kubectl, install_chart, namespace: str
) -> None:
    release = install_chart("rbac-ns", namespace, f"operator.watchNamespaces={{{namespace}}}")
    sa = operator_sa(namespace, release.name)
    check(kubectl, sa, OPERATOR_NAMESPACED_YES, namespace, expected=True)
    check(kubectl, sa, OPERATOR_NAMESPACED_YES, "default", expected=False)
    check(kubectl, sa, OPERATOR_CLUSTER_YES, None, expected=True)
    check(kubectl, sa, [("list", "namespaces", ())], None, expected=False)
    # fsx.enabled is false by default: no cluster-wide PersistentVolume rights.
    check(kubectl, sa, FSX_CLUSTER_YES, None, expected=False)


def test_trainer_can_only_write_leases_in_its_namespace(kubectl, install_chart, namespace: str) -> None:
    install_chart("rbac-trainer", namespace, f"trainer.namespaces={{{namespace}}}")
    sa = f"system:serviceaccount:{namespace}:rtj-trainer"
    check(kubectl, sa, TRAINER_YES, namespace, expected=True)
    check(kubectl, sa, TRAINER_NO, namespace, expected=False)
    check(kubectl, sa, TRAINER_YES, "default", expected=False)
    check(kubectl, sa, [("get", "nodes", ()), ("list", "persistentvolumes", ())], None, expected=False)


USER_EDIT_YES = [
    *[(v, JOBS, ()) for v in ("create", "get", "list", "watch", "update", "patch", "delete")],
    ("get", JOBS, ("--subresource=status",)),
]
USER_VIEW_YES = [(v, JOBS, ()) for v in ("get", "list", "watch")]
USER_NO_STATUS_WRITES = [(v, JOBS, ("--subresource=status",)) for v in ("update", "patch")]


def test_namespace_editors_and_viewers_get_jobs_through_aggregation(
    kubectl, install_chart, namespace: str
) -> None:
    from rtj_local.wait import wait_for

    install_chart("rbac-users", namespace)
    for user, role in (("alice", "edit"), ("bob", "view"), ("carol", "admin")):
        kubectl("create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}", f"--user={user}",
                "-n", namespace)  # fmt: skip
    # The controller-manager's ClusterRole aggregation copies the chart's rules into edit/view/admin.
    wait_for(
        lambda: (
            can_i(kubectl, "alice", "create", JOBS, (), namespace)
            and can_i(kubectl, "bob", "list", JOBS, (), namespace)
        ),
        timeout=60,
        message="the chart's rules aggregated into edit and view",
    )
    check(kubectl, "alice", USER_EDIT_YES, namespace, expected=True)
    check(kubectl, "carol", USER_EDIT_YES, namespace, expected=True)
    check(kubectl, "bob", USER_VIEW_YES, namespace, expected=True)
    check(kubectl, "bob", [("create", JOBS, ()), ("delete", JOBS, ())], namespace, expected=False)
    for user in ("alice", "bob", "carol"):
        check(kubectl, user, USER_NO_STATUS_WRITES, namespace, expected=False)
        check(kubectl, user, USER_VIEW_YES, "default", expected=False)  # a RoleBinding: its namespace only
