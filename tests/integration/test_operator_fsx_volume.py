"""The FSx checkpoint volume's cluster-scoped PV against the real API server and PV controller: every
job gets a PV of its own that its PVC binds to, even where the name before (`rtj-<ns>-<job>-fsx`)
gave two jobs the same PV; deleting a job deletes only the PVs whose labels name it; a job made by an
earlier operator keeps its PV named the old way, gets no second one, and deleting it deletes that PV.
The names and the decisions, without a cluster: tests/unit/test_builders.py (`fsx_*`)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kubernetes import client
from operator_harness import TRAINER_SERVICE_ACCOUNT, OperatorEnv, job_manifest, read_pv, until
from rtj import builders, contract
from rtj.api.models import ResilientTrainingJob
from rtj.api.resource import MAX_JOB_NAME
from rtj_local.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

#: Where kopf keeps what it handled (rtj.handlers.configure): written once the job's create/resume
#: handler (admit: the PV and PVC) succeeded.
HANDLED = f"{contract.API_GROUP}/last-handled-configuration"


def old_pv_name(namespace: str, job: str) -> str:
    """The name operators before this one gave a job's PV."""
    return f"rtj-{namespace}-{job}-fsx"


def pvs_of(core: client.CoreV1Api, namespace: str, job: str) -> set[str]:
    """The names of the PVs whose labels name the job."""
    selector = builders.fsx_pv_selector(namespace, job)
    return {pv.metadata.name for pv in core.list_persistent_volume(label_selector=selector).items}


def bound_to(core: client.CoreV1Api, namespace: str, job: str) -> str | None:
    """The PV the job's PVC is bound to (None while it is not bound)."""
    try:
        pvc = core.read_namespaced_persistent_volume_claim(f"{job}-checkpoints", namespace)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return pvc.spec.volume_name if pvc.status.phase == "Bound" else None


def delete_job(e: OperatorEnv, namespace: str, job: str) -> None:
    e.rtj.api.delete_namespaced_custom_object(
        contract.API_GROUP, contract.API_VERSION, namespace, contract.PLURAL, job
    )


def job_gone(e: OperatorEnv, namespace: str, job: str) -> bool:
    try:
        e.rtj.get(namespace, job)
    except client.ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def test_jobs_whose_old_pv_names_collide_each_get_their_own_pv_and_keep_it(
    env: Callable[..., OperatorEnv], kube: client.ApiClient, namespace: str
) -> None:
    """Namespace `<ns>` with job `b-c` and namespace `<ns>-b` with job `c`: the same PV by the old name
    (the second job's PVC never bound; deleting either job deleted the other's PV)."""
    core = client.CoreV1Api(kube)
    other = f"{namespace}-b"
    core.create_namespace({"metadata": {"name": other, "labels": {"rtj.test/namespace": "true"}}})
    try:
        core.create_namespaced_service_account(other, {"metadata": {"name": TRAINER_SERVICE_ACCOUNT}})
        e = env(nodes=1, also=[other])
        jobs = [(namespace, "b-c"), (other, "c")]
        assert old_pv_name(*jobs[0]) == old_pv_name(*jobs[1])
        for ns, job in jobs:
            e.rtj.create(ns, job_manifest(job, e.nodegroup, 1))

        # Each PVC bound to a PV of its own, which names that PVC and that job.
        for ns, job in jobs:
            wait_for(
                lambda ns=ns, job=job: bound_to(core, ns, job) == builders.fsx_pv_name(ns, job),
                timeout=60,
                message=lambda ns=ns, job=job: f"PVC {ns}/{job}-checkpoints bound: {bound_to(core, ns, job)}",
            )
        names = {builders.fsx_pv_name(ns, job) for ns, job in jobs}
        assert len(names) == 2
        for ns, job in jobs:
            pv = core.read_persistent_volume(builders.fsx_pv_name(ns, job))
            assert (pv.spec.claim_ref.namespace, pv.spec.claim_ref.name) == (ns, f"{job}-checkpoints")
            assert pv.metadata.labels == builders.fsx_pv_labels(ns, job)
            assert pvs_of(core, ns, job) == {builders.fsx_pv_name(ns, job)}

        # Deleting one job deletes its PV only.
        delete_job(e, other, "c")
        kept = builders.fsx_pv_name(namespace, "b-c")
        until(
            lambda: job_gone(e, other, "c") and read_pv(core, builders.fsx_pv_name(other, "c")) is None,
            None,
            60,
            e.explain("b-c"),
        )
        pv = read_pv(core, kept)
        assert pv is not None and pv.metadata.deletion_timestamp is None, "the other job's PV stays"
        assert bound_to(core, namespace, "b-c") == kept

        delete_job(e, namespace, "b-c")
        until(lambda: job_gone(e, namespace, "b-c") and read_pv(core, kept) is None, None, 60,
              lambda: f"job b-c and PV {kept} deleted\n{e.operator.log_tail()}")  # fmt: skip
    finally:
        custom = client.CustomObjectsApi(kube)
        args = (contract.API_GROUP, contract.API_VERSION, other, contract.PLURAL)
        for left in custom.list_namespaced_custom_object(*args)["items"]:
            custom.patch_namespaced_custom_object(
                *args, left["metadata"]["name"], {"metadata": {"finalizers": None}}
            )
            selector = builders.fsx_pv_selector(other, left["metadata"]["name"])
            core.delete_collection_persistent_volume(label_selector=selector)
        core.delete_namespace(other, propagation_policy="Background")


def test_a_job_made_by_an_earlier_operator_keeps_its_old_pv_and_deleting_it_deletes_that_pv(
    env: Callable[..., OperatorEnv],
) -> None:
    """An upgrade: the job, its PV named `rtj-<ns>-<job>-fsx` (with the job's labels) and its PVC bound
    to it, as the earlier operator left them. This operator creates no PV under the new name (it would
    never bind), and its delete handler deletes the old one (found by its labels)."""
    e = env(nodes=1)
    core, ns = e.core, e.namespace
    e.operator.stop()
    created = e.create_job("train", 1)
    job = ResilientTrainingJob.model_validate(created)
    old = old_pv_name(ns, "train")
    pv, pvc = builders.fsx_persistent_volume(job), builders.fsx_persistent_volume_claim(job)
    assert pv is not None and pvc is not None
    pv["metadata"]["name"] = pvc["spec"]["volumeName"] = old
    core.create_persistent_volume(pv)
    try:
        core.create_namespaced_persistent_volume_claim(ns, pvc)
        e.rtj.patch(ns, "train", {"metadata": {"finalizers": [contract.FINALIZER]}})
        wait_for(lambda: bound_to(core, ns, "train") == old, timeout=60, message=f"PVC bound to {old}")

        e.operator.start()  # the upgrade
        until(lambda: HANDLED in (e.job("train")["metadata"].get("annotations") or {}), None, 60,
              e.explain("train"))  # fmt: skip
        assert pvs_of(core, ns, "train") == {old}, "no second PV"
        assert bound_to(core, ns, "train") == old
        assert contract.FINALIZER in (e.job("train")["metadata"].get("finalizers") or [])

        delete_job(e, ns, "train")
        until(lambda: e.job_gone("train") and read_pv(core, old) is None, None, 60,
              lambda: f"job and PV {old} deleted\n{e.operator.log_tail()}")  # fmt: skip
        assert not pvs_of(core, ns, "train")
    finally:
        core.delete_collection_persistent_volume(label_selector=builders.fsx_pv_selector(ns, "train"))


def test_the_longest_pv_name_is_one_the_api_server_accepts(kube: client.ApiClient) -> None:
    """A 63-character namespace and a job name of MAX_JOB_NAME: the PV as the builder makes it, sent as
    a server-side dry run (PV names are DNS subdomains of at most 253 characters)."""
    manifest = job_manifest("j" * MAX_JOB_NAME, "group", 1)
    manifest["metadata"].update(namespace="n" * 63, uid="00000000-0000-0000-0000-000000000000")
    pv = builders.fsx_persistent_volume(ResilientTrainingJob.model_validate(manifest))
    assert pv is not None and len(pv["metadata"]["name"]) == 130
    made = client.CoreV1Api(kube).create_persistent_volume(pv, dry_run="All")
    assert made.metadata.name == pv["metadata"]["name"]
