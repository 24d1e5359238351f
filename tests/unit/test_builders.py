"""Pure object builders: pods, rendezvous, volumes (no cluster)."""

from __future__ import annotations

import copy
import re

import pytest
from ladder_testkit import make_job
from rtj import builders, contract
from rtj.api.resource import MAX_JOB_NAME
from rtj.contract import CAUSE_ANNOTATION
from rtj.ladder import pod_from_dict

pytestmark = pytest.mark.unit


def fsx_job(**spec: object):
    fsx = {
        "fileSystemId": "fs-0123456789abcdef0",
        "dnsName": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
        "mountName": "abcdefgh",
    }
    return make_job().nodes(4).spec(checkpoint={"fsx": fsx}, **spec).obj()


def test_worker_pod_identity_and_placement() -> None:
    job = (
        make_job()
        .nodes(4)
        .spec(
            placement={
                "nodeSelector": {"eks.amazonaws.com/nodegroup": "p5"},
                "tolerations": [{"key": "dedicated", "operator": "Exists"}],
            }
        )
        .obj()
    )
    pod = builders.worker_pod(job, 2, 3, "HeartbeatTimeout", ("bad-node",))
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "train-n2-a3"
    assert meta["labels"] == {
        contract.LABEL_JOB: "train",
        contract.LABEL_ROLE: "worker",
        contract.LABEL_SLOT: "2",
        contract.LABEL_ATTEMPT: "3",
    }
    assert meta["annotations"][CAUSE_ANNOTATION] == "HeartbeatTimeout"
    assert (
        meta["ownerReferences"][0]["uid"] == "uid-train" and meta["ownerReferences"][0]["controller"] is True
    )
    assert spec["restartPolicy"] == "Never"
    assert spec["nodeSelector"] == {
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "eks.amazonaws.com/nodegroup": "p5",
    }
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert {"key": "dedicated", "operator": "Exists", "value": "", "effect": ""} in spec["tolerations"]
    anti = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    assert anti["labelSelector"]["matchLabels"] == {contract.LABEL_JOB: "train"}
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]
    assert {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["bad-node"]} in term[
        "matchExpressions"
    ]
    assert spec["serviceAccountName"] == "rtj-trainer"
    assert spec["terminationGracePeriodSeconds"] >= 60
    parsed = pod_from_dict(pod)
    assert (parsed.slot, parsed.attempt, parsed.role, parsed.cause) == (2, 3, "worker", "HeartbeatTimeout")


def test_user_node_affinity_terms_each_get_the_quarantine_exclusion() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                ]
            }
        }
    }
    job = make_job().spec(placement={"affinity": affinity}).obj()
    terms = builders.worker_pod(job, 0, 0, "Initial", ("n1",))["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert len(terms) == 2
    assert all(
        t["matchExpressions"][-1] == {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1"]}
        for t in terms
    )
    no_avoid = builders.worker_pod(job, 0, 0, "Initial")["spec"]["affinity"]
    assert no_avoid["nodeAffinity"] == affinity["nodeAffinity"]


def away_from(node: str, weight: int = builders.SUSPECT_NODE_WEIGHT) -> dict:
    """The preferred node affinity term against a slot's suspect node (rtj.ladder.suspect_node)."""
    elsewhere = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [node]}
    return {"weight": weight, "preference": {"matchExpressions": [elsewhere]}}


def test_a_replacement_prefers_nodes_other_than_its_slots_suspect_and_never_requires_it() -> None:
    job = make_job().obj()
    pod = builders.worker_pod(job, 1, 1, "HeartbeatTimeout", suspect_node="silent-node")
    assert pod["spec"]["affinity"]["nodeAffinity"] == {
        "preferredDuringSchedulingIgnoredDuringExecution": [away_from("silent-node")]
    }
    assert builders.SUSPECT_NODE_WEIGHT == 100
    # Nothing else changes: the same pod as without a suspect, less that one term.
    plain = builders.worker_pod(job, 1, 1, "HeartbeatTimeout")
    assert "nodeAffinity" not in plain["spec"]["affinity"]
    del pod["spec"]["affinity"]["nodeAffinity"]
    assert pod == plain


def test_the_suspect_term_is_added_to_the_users_affinity_not_over_it() -> None:
    user_prefers = {
        "weight": 10,
        "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
    }
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["p5"]}]}
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [user_prefers],
        },
        "podAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 5, "podAffinityTerm": {"topologyKey": "zone", "labelSelector": {}}}
            ]
        },
    }
    job = make_job().spec(placement={"affinity": affinity}).obj()
    before = copy.deepcopy(job.spec.placement.affinity)
    got = builders.worker_pod(job, 0, 2, "HeartbeatTimeout", ("quarantined",), suspect_node="silent-node")
    node = got["spec"]["affinity"]["nodeAffinity"]
    assert node["preferredDuringSchedulingIgnoredDuringExecution"] == [user_prefers, away_from("silent-node")]
    [term] = node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "pool", "operator": "In", "values": ["p5"]},
        {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["quarantined"]},
    ]
    assert got["spec"]["affinity"]["podAffinity"] == affinity["podAffinity"]
    assert got["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert job.spec.placement.affinity == before, "the job's spec is not changed"


def test_a_quarantined_suspect_needs_no_preference_the_requirement_keeps_the_pod_off() -> None:
    pod = builders.worker_pod(make_job().obj(), 0, 1, "NodeNotReady", ("bad",), suspect_node="bad")
    node = pod["spec"]["affinity"]["nodeAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in node
    [term] = node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == {
        "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["bad"]}]
    }


@pytest.mark.parametrize(
    ("gpus", "efa", "expect"),
    [
        (8, 32, {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32", "cpu": "180", "memory": "1800Gi"}),
        (0, 0, {"cpu": "180", "memory": "1800Gi"}),
    ],
)
def test_resources_omit_zero_devices(gpus: int, efa: int, expect: dict[str, str]) -> None:
    job = (
        make_job()
        .spec(
            gpusPerNode=gpus,
            resources={"efaPerNode": efa, "cpu": "180", "memory": "1800Gi", "sharedMemorySize": "128Gi"},
        )
        .obj()
    )
    spec = builders.worker_pod(job, 0, 0, "Initial")["spec"]
    container = spec["containers"][0]
    assert container["resources"] == {"requests": expect, "limits": expect}
    shm = next(v for v in spec["volumes"] if v["name"] == builders.SHM_VOLUME)
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "128Gi"}
    assert {"name": builders.SHM_VOLUME, "mountPath": "/dev/shm"} in container["volumeMounts"]


def test_trainer_env_carries_config_and_downward_api() -> None:
    job = make_job().nodes(4).spec(env=[{"name": "FOO", "value": "1"}]).obj()
    container = builders.worker_pod(job, 0, 0, "Initial")["spec"]["containers"][0]
    assert container["command"] == ["rtj-trainer", "launch"]
    env = {e["name"]: e for e in container["env"]}
    config = contract.TrainerConfig.from_env(env[contract.ENV_TRAINER_CONFIG]["value"])
    assert (
        config.nnodes == 4
        and config.rdzv_endpoint == "train-rdzv.ns.svc:29400"
        and config.rdzv_id == "uid-train"
    )
    assert config.command == ["python", "train.py"] and config.standby is False
    assert env["FOO"]["value"] == "1"
    assert [e["name"] for e in container["env"]].count(contract.ENV_TRAINER_CONFIG) == 1
    assert env[contract.ENV_NODE_NAME]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env[contract.ENV_POD_UID]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"


def test_the_spec_refuses_env_the_runtime_owns_and_names_set_twice() -> None:
    with pytest.raises(ValueError, match="RTJ_ are the runtime's: RTJ_TRAINER_CONFIG"):
        make_job().spec(env=[{"name": contract.ENV_TRAINER_CONFIG, "value": "spoof"}]).obj()
    with pytest.raises(ValueError, match=r"env\[1\]\.name 'FOO' is set twice"):
        make_job().spec(env=[{"name": "FOO", "value": "1"}, {"name": "FOO", "value": "2"}]).obj()


@pytest.mark.parametrize("pod_grace", [300, 30, 3])
def test_entrypoint_stops_ranks_before_the_kubelet_kills_the_pod(pod_grace: int) -> None:
    settings = builders.BuildSettings(termination_grace_seconds=pod_grace)
    pod = builders.worker_pod(make_job().obj(), 0, 0, "Initial", settings=settings)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    stop = int(env[contract.ENV_GRACEFUL_STOP_SECONDS])
    assert 1 <= stop < pod["spec"]["terminationGracePeriodSeconds"] == pod_grace


def test_spare_pod_runs_in_standby() -> None:
    pod = builders.spare_pod(make_job().obj(), 1, 2)
    assert pod["metadata"]["name"] == "train-spare-1-a2"
    assert pod["metadata"]["labels"][contract.LABEL_ROLE] == contract.ROLE_SPARE
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert contract.TrainerConfig.from_env(env[contract.ENV_TRAINER_CONFIG]["value"]).standby is True
    assert pod_from_dict(pod).spare_index == 1
    promoted = builders.promotion_patch(3, 4, "PodFailed")["metadata"]["labels"]
    assert promoted == {contract.LABEL_ROLE: "worker", contract.LABEL_SLOT: "3", contract.LABEL_ATTEMPT: "4"}


def test_rendezvous_pod_and_service() -> None:
    job = make_job().obj()
    pod, svc = builders.rendezvous_pod(job), builders.rendezvous_service(job)
    assert pod["metadata"]["name"] == svc["metadata"]["name"] == "train-rdzv"
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["rtj-trainer", "rendezvous"]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {contract.LABEL_JOB: "train", contract.LABEL_ROLE: "rendezvous"}
    assert svc["spec"]["ports"] == [{"name": "rdzv", "port": 29400, "targetPort": 29400, "protocol": "TCP"}]


def test_pvc_checkpoint_volume() -> None:
    job = make_job().obj()
    pod = builders.worker_pod(job, 0, 0, "Initial")
    vol = next(v for v in pod["spec"]["volumes"] if v["name"] == builders.CHECKPOINT_VOLUME)
    assert vol == {"name": builders.CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": "ckpt"}}
    assert builders.fsx_persistent_volume(job) is None and builders.fsx_persistent_volume_claim(job) is None


def test_fsx_static_pv_and_bound_pvc() -> None:
    job = fsx_job()
    pv, pvc = builders.fsx_persistent_volume(job), builders.fsx_persistent_volume_claim(job)
    assert pv is not None and pvc is not None
    assert pv["metadata"]["name"] == "rtj-ns.train-fsx"
    assert pv["metadata"]["labels"] == {contract.LABEL_JOB: "train", contract.LABEL_JOB_NAMESPACE: "ns"}
    assert "ownerReferences" not in pv["metadata"]
    assert pv["spec"]["csi"] == {
        "driver": "fsx.csi.aws.com",
        "volumeHandle": "fs-0123456789abcdef0",
        "volumeAttributes": {
            "dnsname": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
            "mountname": "abcdefgh",
        },
    }
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert pvc["spec"]["volumeName"] == "rtj-ns.train-fsx" and pvc["spec"]["storageClassName"] == ""
    assert pv["spec"]["claimRef"] == {"namespace": "ns", "name": pvc["metadata"]["name"]}
    claim = next(
        v
        for v in builders.worker_pod(job, 0, 0, "Initial")["spec"]["volumes"]
        if v["name"] == builders.CHECKPOINT_VOLUME
    )
    assert claim["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]


# --- the FSx PV: its name, and which PVs a job's create and cleanup act on ------------------------------
#: Kubernetes' DNS-1123 subdomain (apimachinery IsDNS1123Subdomain): what a PV's name must be, ≤ 253.
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def old_fsx_pv_name(namespace: str, job: str) -> str:
    """The name operators before this one gave the PV (ambiguous: the reason for fsx_pv_name)."""
    return f"rtj-{namespace}-{job}-fsx"


@pytest.mark.parametrize(
    ("one", "other"),
    [
        (("a-b", "c"), ("a", "b-c")),
        (("team-a", "llama-7b"), ("team", "a-llama-7b")),
        (("x", "y-z"), ("x-y", "z")),
    ],
    ids=["a-b/c vs a/b-c", "team-a/llama-7b vs team/a-llama-7b", "x/y-z vs x-y/z"],
)
def test_jobs_whose_old_pv_names_collided_get_pvs_of_their_own(
    one: tuple[str, str], other: tuple[str, str]
) -> None:
    assert old_fsx_pv_name(*one) == old_fsx_pv_name(*other)  # the bug
    assert builders.fsx_pv_name(*one) != builders.fsx_pv_name(*other)
    assert builders.fsx_pv_name(*one) == builders.fsx_pv_name(*one)  # deterministic: created once
    assert builders.fsx_pv_selector(*one) != builders.fsx_pv_selector(*other)


def test_every_way_to_split_a_name_into_namespace_and_job_gives_another_pv() -> None:
    words = ["ml", "team", "a", "llama", "70b", "run", "2"]
    splits = [("-".join(words[:i]), "-".join(words[i:])) for i in range(1, len(words))]
    assert len({old_fsx_pv_name(ns, job) for ns, job in splits}) == 1
    assert len({builders.fsx_pv_name(ns, job) for ns, job in splits}) == len(splits)


@pytest.mark.parametrize(
    ("namespace", "job"),
    [("a", "b"), ("n" * 63, "j" * MAX_JOB_NAME), ("0ns-9", "j0-b"), ("9" * 63, "a")],
    ids=["shortest", "longest", "digits-and-dashes", "numeric-namespace"],
)
def test_the_pv_name_is_a_bounded_dns_subdomain(namespace: str, job: str) -> None:
    name = builders.fsx_pv_name(namespace, job)
    assert DNS_SUBDOMAIN.match(name), name
    assert len(name) <= 4 + 63 + 1 + MAX_JOB_NAME + 4 == 130 <= 253


def pv_obj(
    name: str,
    labels: dict[str, str] | None,
    uid: str = "u",
    phase: str = "Available",
    claim: tuple[str, str] | None = ("ns", "train-checkpoints"),
    deleting: bool = False,
) -> dict[str, object]:
    meta: dict[str, object] = {"name": name, "uid": uid}
    if labels is not None:
        meta["labels"] = labels
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T10:00:00Z"
    spec = {"claimRef": {"namespace": claim[0], "name": claim[1]}} if claim else {}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


OURS = {contract.LABEL_JOB: "train", contract.LABEL_JOB_NAMESPACE: "ns"}


@pytest.mark.parametrize(
    ("pvs", "deleted"),
    [
        ([pv_obj("rtj-ns.train-fsx", OURS, "u1")], [("rtj-ns.train-fsx", "u1")]),
        ([pv_obj("rtj-ns-train-fsx", OURS, "u0")], [("rtj-ns-train-fsx", "u0")]),
        (
            [pv_obj("rtj-ns-train-fsx", OURS, "u0"), pv_obj("rtj-ns.train-fsx", OURS, "u1")],
            [("rtj-ns-train-fsx", "u0"), ("rtj-ns.train-fsx", "u1")],
        ),
        (
            [
                pv_obj(
                    "rtj-ns-train-fsx", {contract.LABEL_JOB: "ns-train", contract.LABEL_JOB_NAMESPACE: "rtj"}
                )
            ],
            [],
        ),
        (
            [pv_obj("rtj-ns.train-fsx", {contract.LABEL_JOB: "train", contract.LABEL_JOB_NAMESPACE: "ns-b"})],
            [],
        ),
        ([pv_obj("rtj-ns.train-fsx", {contract.LABEL_JOB: "train"})], []),
        ([pv_obj("rtj-ns.train-fsx", None)], []),
        ([pv_obj("rtj-ns.train-fsx", OURS, deleting=True)], []),
        ([pv_obj("rtj-ns.train-fsx", OURS, uid="")], []),
        ([], []),
    ],
    ids=[
        "ours",
        "ours-under-the-old-name",
        "both-after-an-upgrade",
        "another-jobs-under-our-old-name",
        "same-job-name-other-namespace",
        "no-namespace-label",
        "no-labels",
        "already-being-deleted",
        "no-uid-no-precondition",
        "none",
    ],
)
def test_the_cleanup_deletes_only_the_pvs_whose_labels_name_the_job(
    pvs: list[dict[str, object]], deleted: list[tuple[str, str]]
) -> None:
    assert builders.fsx_pvs_to_delete(pvs, "ns", "train") == deleted


@pytest.mark.parametrize(
    ("pvs", "creates"),
    [
        ([], True),
        ([pv_obj("rtj-ns-train-fsx", OURS, phase="Bound")], False),
        ([pv_obj("rtj-ns.train-fsx", OURS, phase="Bound")], False),
        ([pv_obj("rtj-ns-train-fsx", OURS, phase="Available")], True),
        ([pv_obj("rtj-ns-train-fsx", OURS, phase="Released")], True),
        ([pv_obj("rtj-ns-train-fsx", OURS, phase="Bound", claim=("ns", "other"))], True),
        ([pv_obj("rtj-ns-train-fsx", OURS, phase="Bound", claim=None)], True),
        (
            [
                pv_obj(
                    "rtj-ns-train-fsx",
                    {contract.LABEL_JOB: "x", contract.LABEL_JOB_NAMESPACE: "ns"},
                    phase="Bound",
                )
            ],
            True,
        ),
    ],
    ids=[
        "a-new-job",
        "upgrade-pvc-bound-to-the-old-pv",
        "pvc-bound-to-ours",
        "old-pv-not-bound",
        "old-pv-released",
        "bound-to-another-claim",
        "no-claim-ref",
        "another-jobs-pv-bound-to-our-claim-name",
    ],
)
def test_no_pv_is_created_while_the_jobs_pvc_is_bound_to_one_of_its_own(
    pvs: list[dict[str, object]], creates: bool
) -> None:
    job = fsx_job()
    pv = builders.fsx_pv_to_create(job, pvs)
    assert pv == (builders.fsx_persistent_volume(job) if creates else None)
    assert builders.fsx_pv_to_create(make_job().obj(), []) is None  # a PVC job has no PV


def test_pod_template_overrides_and_service_account() -> None:
    job = (
        make_job()
        .spec(
            podTemplate={
                "serviceAccountName": "custom",
                "labels": {"team": "a", contract.LABEL_JOB: "spoof"},
                "annotations": {"x": "y"},
                "priorityClassName": "high",
                "volumes": [{"name": "data", "emptyDir": {}}],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }
        )
        .obj()
    )
    pod = builders.worker_pod(
        job, 0, 0, "Initial", settings=builders.BuildSettings(trainer_service_account="sa")
    )
    assert pod["spec"]["serviceAccountName"] == "custom"
    assert (
        pod["metadata"]["labels"]["team"] == "a" and pod["metadata"]["labels"][contract.LABEL_JOB] == "train"
    )
    assert pod["spec"]["priorityClassName"] == "high"
    assert {"name": "data", "emptyDir": {}} in pod["spec"]["volumes"]
    assert builders.privileged_violations(job) == []
    default_sa = builders.worker_pod(
        make_job().obj(), 0, 0, "Initial", settings=builders.BuildSettings(trainer_service_account="sa")
    )
    assert default_sa["spec"]["serviceAccountName"] == "sa"


def test_privileged_overrides_are_named() -> None:
    """The CRD refuses hostPath too (CEL); the operator checks again for objects that bypassed it
    (e.g. an older CRD)."""
    job = (
        make_job()
        .spec(
            podTemplate={
                "volumes": [{"name": "ok", "emptyDir": {}}, {"name": "h", "hostPath": {"path": "/"}}]
            }
        )
        .obj()
    )
    assert builders.privileged_violations(job) == ["spec.podTemplate.volumes[1].hostPath must not be set"]


def all_pods(job) -> list[dict]:
    return [
        builders.worker_pod(job, 0, 0, "Initial"),
        builders.worker_pod(job, 1, 1, "HeartbeatTimeout", ("bad-node",), suspect_node="silent-node"),
        builders.spare_pod(job, 0, 0),
        builders.rendezvous_pod(job),
    ]


def test_every_pod_meets_the_restricted_pod_security_standard_by_default() -> None:
    for pod in all_pods(fsx_job()):
        spec = pod["spec"]
        # No runAsUser: the image's USER runs (the trainer image's is 10001), checked non-root by the kubelet.
        assert spec["securityContext"] == {
            "runAsNonRoot": True,
            "fsGroup": 10001,
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        }, pod["metadata"]["name"]
        for c in spec["containers"]:
            assert c["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            }
        assert not any(k in spec for k in ("hostNetwork", "hostPID", "hostIPC"))
        assert all("hostPath" not in v for v in spec.get("volumes", []))
        assert all("hostPort" not in p for c in spec["containers"] for p in c.get("ports", []))


def test_pod_security_override_is_applied_and_run_as_non_root_stays() -> None:
    security = {
        "runAsUser": 4242,
        "runAsGroup": 0,
        "fsGroup": 5000,
        "fsGroupChangePolicy": "Always",
        "supplementalGroups": [7, 8],
        "seccompProfile": {"type": "Localhost", "localhostProfile": "profiles/trainer.json"},
    }
    job = make_job().spec(podTemplate={"securityContext": security}).obj()
    for pod in all_pods(job):
        assert pod["spec"]["securityContext"] == {"runAsNonRoot": True, **security}


@pytest.mark.parametrize(
    "security",
    [
        {"runAsUser": 0},
        {"runAsNonRoot": False},
        {"privileged": True},
        {"seccompProfile": {"type": "Unconfined"}},
        {"seccompProfile": {"type": "Localhost"}},
        {"seccompProfile": {"type": "RuntimeDefault", "localhostProfile": "x.json"}},
        {"fsGroupChangePolicy": "Sometimes"},
    ],
    ids=str,
)
def test_pod_security_override_refuses_what_restricted_refuses(security: dict) -> None:
    with pytest.raises(ValueError):
        make_job().spec(podTemplate={"securityContext": security}).obj()


@pytest.mark.parametrize(
    ("instance_type", "cpu", "memory"),
    [("p5.48xlarge", "180", "1800Gi"), ("p5en.48xlarge", "180", "1800Gi"), ("p4d.24xlarge", "88", "1000Gi")],
)
def test_trainer_pods_are_guaranteed_with_instance_type_defaults(
    instance_type: str, cpu: str, memory: str
) -> None:
    job = make_job().spec(placement={"instanceType": instance_type}).obj()
    for pod in all_pods(job)[:2]:  # worker, spare
        res = pod["spec"]["containers"][0]["resources"]
        # Guaranteed QoS: cpu and memory requested and limited, requests == limits.
        assert res["requests"] == res["limits"]
        assert (res["limits"]["cpu"], res["limits"]["memory"]) == (cpu, memory)


def test_spec_resources_win_over_instance_defaults_and_unknown_types_have_none() -> None:
    job = make_job().spec(resources={"cpu": 96, "memory": "900Gi"}).obj()
    res = builders.worker_pod(job, 0, 0, "Initial")["spec"]["containers"][0]["resources"]
    assert (res["limits"]["cpu"], res["limits"]["memory"]) == ("96", "900Gi")
    unknown = make_job().spec(placement={"instanceType": "g6.48xlarge"}).obj()
    res = builders.worker_pod(unknown, 0, 0, "Initial")["spec"]["containers"][0]["resources"]
    assert "cpu" not in res["limits"] and "memory" not in res["limits"]


def test_shared_memory_size_comes_from_the_spec() -> None:
    job = make_job().spec(resources={"sharedMemorySize": "8Gi"}).obj()
    volumes = builders.worker_pod(job, 0, 0, "Initial")["spec"]["volumes"]
    shm = next(v for v in volumes if v["name"] == builders.SHM_VOLUME)
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}


@pytest.mark.parametrize(
    ("declared", "measured", "grace"),
    [
        pytest.param(None, None, 300, id="nothing known: the operator's setting"),
        pytest.param(10, None, 45, id="declared: 1.5 x 10 + 30"),
        pytest.param(10, 40.2, 91, id="the longer of declared and measured: ceil(1.5 x 40.2) + 30"),
        pytest.param(None, 2.0, 33, id="measured only: shorter than the setting"),
        pytest.param(5000, None, 3600, id="capped"),
    ],
)
def test_grace_period_is_sized_from_the_persist_time(
    declared: int | None, measured: float | None, grace: int
) -> None:
    ckpt = {"pvc": {"claimName": "ckpt"}} | ({"persistSeconds": declared} if declared else {})
    job = make_job().spec(checkpoint=ckpt).status(persistSeconds=measured).obj()
    assert builders.termination_grace_seconds(job, 300) == grace
    pod = builders.worker_pod(
        job, 0, 0, "Initial", settings=builders.BuildSettings(termination_grace_seconds=300)
    )
    assert pod["spec"]["terminationGracePeriodSeconds"] == grace
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert int(env[contract.ENV_GRACEFUL_STOP_SECONDS]) == builders.graceful_stop_seconds(grace)
    assert int(env[contract.ENV_TERMINATION_GRACE_SECONDS]) == grace  # the kubelet's SIGKILL


def test_every_pod_of_a_job_asks_node_autoscalers_not_to_remove_its_node() -> None:
    job = make_job().obj()
    pods = [
        builders.worker_pod(job, 0, 0, "Initial"),
        builders.spare_pod(job, 0, 0),
        builders.rendezvous_pod(job),
    ]
    for pod in pods:
        annotations = pod["metadata"]["annotations"]
        assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false", pod["metadata"]
        assert annotations["karpenter.sh/do-not-disrupt"] == "true", pod["metadata"]


def test_the_pod_template_may_let_autoscalers_remove_the_node() -> None:
    job = make_job().spec(podTemplate={"annotations": {"karpenter.sh/do-not-disrupt": "false"}}).obj()
    annotations = builders.worker_pod(job, 0, 0, "Initial")["metadata"]["annotations"]
    assert annotations["karpenter.sh/do-not-disrupt"] == "false"
    assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
