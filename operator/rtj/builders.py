"""Pure builders: Kubernetes objects (plain dicts) for one job's children. No I/O.

Names are deterministic (`<job>-n<slot>-a<attempt>`, `<job>-spare-<k>-a<n>`, `<job>-rdzv`), every
namespaced child carries an owner reference to the job (garbage collection removes it), so creating
twice is harmless (AlreadyExists = success).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rtj import contract
from rtj.api.instances import INSTANCE_DEFAULTS
from rtj.api.models import CHECKPOINT_VOLUME, SHM_MOUNT_PATH, SHM_VOLUME, ResilientTrainingJob
from rtj.contract import CAUSE_ANNOTATION, LABEL_JOB_NAMESPACE, LABEL_SPARE_INDEX, TRAINER_CONTAINER
from rtj.ladder import kueue_admission as ka
from rtj.settings import Settings

RDZV_PORT = 29400
#: The peer replica: slot s's replica server listens on this port + s (contract.replica_endpoints).
REPLICA_PORT = 29600
RDZV_PORT_NAME = "rdzv"
GPU_RESOURCE = "nvidia.com/gpu"
EFA_RESOURCE = "vpc.amazonaws.com/efa"
HOSTNAME_LABEL = "kubernetes.io/hostname"
FSX_DRIVER = "fsx.csi.aws.com"
#: Every pod of a job asks node autoscalers not to remove its node to pack pods tighter: the Kubernetes
#: Cluster Autoscaler skips a node running a pod that is not safe to evict in its scale-down, and
#: Karpenter makes no voluntary disruption (consolidation, drift, expiry) of one running a
#: do-not-disrupt pod. Either would otherwise stop a training pod for nothing its job did (a
#: disruption: the pod replaced from its last save). Forced removals (a drain, node repair, a spot
#: interruption) are not held. podTemplate.annotations may set either the other way.
AUTOSCALER_HOLD_ANNOTATIONS = {
    "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
    "karpenter.sh/do-not-disrupt": "true",
}
_DOWNWARD_ENV = (
    (contract.ENV_POD_NAME, "metadata.name"),
    (contract.ENV_POD_UID, "metadata.uid"),
    (contract.ENV_NAMESPACE, "metadata.namespace"),
    (contract.ENV_NODE_NAME, "spec.nodeName"),
    (contract.ENV_POD_IP, "status.podIP"),
)


_DEFAULTS = Settings()


@dataclass(frozen=True)
class BuildSettings:
    """Operator-wide settings the builders need: a subset of rtj.settings.Settings, its defaults."""

    trainer_service_account: str = _DEFAULTS.trainer_service_account
    #: Long enough for the trainer's last checkpoint on SIGTERM (suspend, deletion).
    termination_grace_seconds: int = _DEFAULTS.termination_grace_seconds


def _name(job: ResilientTrainingJob) -> str:
    return str(job.metadata["name"])


def _ns(job: ResilientTrainingJob) -> str:
    return str(job.metadata["namespace"])


def owner_reference(job: ResilientTrainingJob) -> dict[str, Any]:
    return {
        "apiVersion": f"{contract.API_GROUP}/{contract.API_VERSION}",
        "kind": contract.KIND,
        "name": _name(job),
        "uid": str(job.metadata["uid"]),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def rdzv_endpoint(job: ResilientTrainingJob) -> str:
    return f"{contract.rendezvous_name(_name(job))}.{_ns(job)}.svc:{RDZV_PORT}"


def pvc_name(job: ResilientTrainingJob) -> str:
    """The PVC the pods mount: the user's, or ours bound to the FSx PV."""
    ckpt = job.spec.checkpoint
    return ckpt.pvc.claim_name if ckpt.pvc is not None else f"{_name(job)}-checkpoints"


def fsx_pv_name(namespace: str, job_name: str) -> str:
    """The name of the job's FSx PV: `rtj-<namespace>.<job>-fsx`, never another job's.

    PVs are cluster-scoped, so the name must tell the namespace from the job's name. The dot does: a
    namespace is a DNS label (no dot), so the first dot ends it whatever the job's name holds. The
    name before, `rtj-<namespace>-<job>-fsx`, gave namespace `a-b`/job `c` and namespace `a`/job `b-c`
    the same PV. Readable in `kubectl get pv`, and bounded without a hash: at most 4 + 63 + 1 + 58 + 4
    = 130 characters (namespace 63, job name MAX_JOB_NAME 58), a valid DNS subdomain (each part
    between dots starts and ends with a letter or digit). Only creating needs the name: the job's PVs
    are found by their labels (`fsx_pv_labels`), so one named the earlier way is still the job's."""
    return f"rtj-{namespace}.{job_name}-fsx"


def fsx_pv_labels(namespace: str, job_name: str) -> dict[str, str]:
    """The labels that make a PV the job's: the only thing the job's cleanup goes by (`fsx_pvs_to_delete`)."""
    return {contract.LABEL_JOB: job_name, LABEL_JOB_NAMESPACE: namespace}


def fsx_pv_selector(namespace: str, job_name: str) -> str:
    """The label selector of the job's PVs (the LIST its cleanup and its create decision send)."""
    return ",".join(f"{key}={value}" for key, value in fsx_pv_labels(namespace, job_name).items())


def _is_jobs_pv(pv: dict[str, Any], namespace: str, job_name: str) -> bool:
    labels = (pv.get("metadata") or {}).get("labels") or {}
    return all(labels.get(key) == value for key, value in fsx_pv_labels(namespace, job_name).items())


def fsx_pvs_to_delete(pvs: list[dict[str, Any]], namespace: str, job_name: str) -> list[tuple[str, str]]:
    """(name, uid) of each PV the job's cleanup deletes: every PV whose labels name this job, whatever
    its name (`fsx_pv_name`, or `rtj-<namespace>-<job>-fsx` of an earlier operator, or both after an
    upgrade), and not already being deleted. A PV whose labels name another job is never one, even
    under this job's name. The uid goes into the delete's precondition: a PV replaced since it was
    listed is not deleted."""
    doomed = []
    for pv in pvs:
        meta = pv.get("metadata") or {}
        mine = _is_jobs_pv(pv, namespace, job_name) and meta.get("name") and meta.get("uid")
        if mine and not meta.get("deletionTimestamp"):
            doomed.append((str(meta["name"]), str(meta["uid"])))
    return doomed


def fsx_pv_to_create(job: ResilientTrainingJob, pvs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The FSx PV to create for the job, given the job's PVs (listed by `fsx_pv_selector`): None without
    `checkpoint.fsx`, and None while the job's PVC is bound to one of them.

    Why not create it then: after an upgrade from the name `rtj-<namespace>-<job>-fsx`, a running
    job's PVC stays bound to its PV of that name (a PVC's volumeName never changes). A PV under the new
    name would never bind (its claimRef names a PVC bound to another PV): it would sit Available until
    the job's cleanup deleted it. Bound is read on the PVs' side (phase Bound, claimRef naming the
    job's PVC), from the LIST the cleanup needs anyway, so the operator needs no read right on PVCs.
    A job whose PVC is not bound to a PV of its own gets the PV as a new job does (AlreadyExists is
    success)."""
    pv = fsx_persistent_volume(job)
    if pv is None:
        return None
    claim = (_ns(job), pvc_name(job))
    for other in pvs:
        ref = (other.get("spec") or {}).get("claimRef") or {}
        if (
            _is_jobs_pv(other, _ns(job), _name(job))
            and (other.get("status") or {}).get("phase") == "Bound"
            and (ref.get("namespace"), ref.get("name")) == claim
        ):
            return None
    return pv


def trainer_config(job: ResilientTrainingJob, standby: bool = False) -> contract.TrainerConfig:
    spec, ft = job.spec, job.spec.fault_tolerance
    ip = ft.in_process_restart
    return contract.TrainerConfig(
        job_name=_name(job),
        job_uid=str(job.metadata["uid"]) if job.metadata.get("uid") else None,
        command=list(spec.command),
        args=list(spec.args),
        nnodes=spec.nodes,
        nproc_per_node=spec.procs,
        rdzv_endpoint=rdzv_endpoint(job),
        # The job's UID: a new job with the same name never joins an old rendezvous.
        rdzv_id=str(job.metadata.get("uid", _name(job))),
        max_in_job_restarts=ft.max_in_job_restarts,
        # The period the ladder chose against the heartbeat budget (rtj.ladder.heartbeat_budget);
        # the spec's until a pass has chosen one.
        heartbeat_interval_seconds=job.status.heartbeat_interval_seconds or ft.heartbeat_interval_seconds,
        rank_hang_timeout_seconds=ft.rank_hang_timeout_seconds,
        rank_initial_timeout_seconds=ft.startup_timeout_seconds,
        in_process=contract.InProcessConfig(
            enabled=ip.enabled,
            soft_timeout_seconds=ip.soft_timeout_seconds,
            hard_timeout_seconds=ip.hard_timeout_seconds,
            max_restarts=ip.max_restarts,
        ),
        hang_detection=contract.HangDetectionConfig(
            enabled=ft.hang_detection.enabled,
            floor_seconds=ft.hang_detection.floor_seconds,
            median_multiple=ft.hang_detection.median_multiple,
        ),
        checkpoint_dir=spec.checkpoint.mount_path,
        checkpoint_interval_steps=spec.checkpoint.interval_steps,
        checkpoints_to_keep=spec.checkpoint.keep,
        memory_snapshot_interval_steps=spec.checkpoint.memory_snapshot_interval_steps,
        memory_snapshot_dir=f"{SHM_MOUNT_PATH}/rtj-snapshots",
        memory_snapshot_gpu_staging=spec.checkpoint.memory_snapshot_gpu_staging,
        peer_replica_port=REPLICA_PORT if spec.checkpoint.peer_replica else 0,
        max_no_progress_cycles=ft.max_no_progress_cycles,
        do_not_restart_exit_codes=list(ft.do_not_restart_exit_codes),
        standby=standby,
    )


def privileged_violations(job: ResilientTrainingJob) -> list[str]:
    """What makes the job's pods privileged, as 'field must not ...' messages (empty: none)."""
    out: list[str] = []
    template = job.spec.pod_template.model_dump(by_alias=True)
    for i, vol in enumerate(job.spec.pod_template.volumes):
        if "hostPath" in vol:
            out.append(f"spec.podTemplate.volumes[{i}].hostPath must not be set")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if template.get(key):
            out.append(f"spec.podTemplate.{key} must not be true")
    return out


def _tolerations(job: ResilientTrainingJob) -> list[dict[str, Any]]:
    tols: list[dict[str, Any]] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    for t in job.spec.placement.tolerations:
        tols.append(t.model_dump(by_alias=True, exclude_none=True))
    return tols


#: The weight of the preferred node affinity term against a slot's suspect node (the most a term may
#: have): a soft preference, never a requirement (rtj.ladder.suspect_node).
SUSPECT_NODE_WEIGHT = 100


def _affinity(
    job: ResilientTrainingJob, avoid_nodes: tuple[str, ...], suspect_node: str = ""
) -> dict[str, Any]:
    """The user's placement.affinity, plus: one pod of the job per node (required pod anti-affinity);
    off the quarantined `avoid_nodes` (required, in every node selector term); off `suspect_node`
    where the scheduler has a choice (a preferred term, added to the user's), unless it is avoided
    already."""
    user = dict(job.spec.placement.affinity or {})
    spread = {
        "labelSelector": {
            "matchLabels": {contract.LABEL_JOB: _name(job)},
            "matchExpressions": [
                {
                    "key": contract.LABEL_ROLE,
                    "operator": "In",
                    "values": [contract.ROLE_WORKER, contract.ROLE_SPARE],
                }
            ],
        },
        "topologyKey": HOSTNAME_LABEL,
    }
    anti = dict(user.get("podAntiAffinity") or {})
    anti["requiredDuringSchedulingIgnoredDuringExecution"] = [
        *(anti.get("requiredDuringSchedulingIgnoredDuringExecution") or []),
        spread,
    ]
    affinity: dict[str, Any] = {**user, "podAntiAffinity": anti}
    if avoid_nodes:
        avoid = {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": list(avoid_nodes)}
        node = dict(user.get("nodeAffinity") or {})
        required = dict(node.get("requiredDuringSchedulingIgnoredDuringExecution") or {})
        terms = required.get("nodeSelectorTerms") or [{}]
        # Terms are ORed: the exclusion must be in every term.
        required["nodeSelectorTerms"] = [
            {**term, "matchExpressions": [*(term.get("matchExpressions") or []), avoid]} for term in terms
        ]
        node["requiredDuringSchedulingIgnoredDuringExecution"] = required
        affinity["nodeAffinity"] = node
    if suspect_node and suspect_node not in avoid_nodes:
        node = dict(affinity.get("nodeAffinity") or {})
        elsewhere = {"key": HOSTNAME_LABEL, "operator": "NotIn", "values": [suspect_node]}
        node["preferredDuringSchedulingIgnoredDuringExecution"] = [
            *(node.get("preferredDuringSchedulingIgnoredDuringExecution") or []),
            {"weight": SUSPECT_NODE_WEIGHT, "preference": {"matchExpressions": [elsewhere]}},
        ]
        affinity["nodeAffinity"] = node
    return affinity


def _resources(job: ResilientTrainingJob) -> dict[str, Any]:
    """Requests equal to limits (a Guaranteed pod): GPUs, EFA, and CPU/memory from the spec or, when
    unset, the instance type's defaults (rtj.api.instances)."""
    res = job.spec.resources
    shape = INSTANCE_DEFAULTS.get(job.spec.placement.instance_type)
    limits: dict[str, str] = {}
    if job.spec.gpus_per_node > 0:
        limits[GPU_RESOURCE] = str(job.spec.gpus_per_node)
    if res.efa_per_node > 0:
        limits[EFA_RESOURCE] = str(res.efa_per_node)
    cpu = res.cpu or (shape.cpu if shape else None)
    memory = res.memory or (shape.memory if shape else None)
    if cpu:
        limits["cpu"] = cpu
    if memory:
        limits["memory"] = memory
    return {"requests": dict(limits), "limits": limits} if limits else {}


def container_security_context() -> dict[str, Any]:
    """Every container the operator builds: what the `restricted` Pod Security Standard requires."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def pod_security_context(job: ResilientTrainingJob) -> dict[str, Any]:
    """The pods' securityContext: the spec's settings (restricted-compliant by construction) plus
    runAsNonRoot, which is never optional."""
    spec = job.spec.pod_template.security_context.model_dump(by_alias=True, exclude_none=True)
    if not spec["supplementalGroups"]:
        del spec["supplementalGroups"]
    return {"runAsNonRoot": True, **spec}


#: terminationGracePeriodSeconds = PERSIST_FACTOR x persist time + EMERGENCY_SAVE_MARGIN_SECONDS: an
#: emergency save abandons the save in flight and writes the newest step once (the factor covers
#: persist times varying between saves); the margin covers the ranks agreeing on a step, the
#: device-to-host copy, the memory-tier write and the entrypoint's own margin (graceful_stop_seconds).
PERSIST_FACTOR = 1.5
EMERGENCY_SAVE_MARGIN_SECONDS = 30
MAX_TERMINATION_GRACE_SECONDS = 3600


def termination_grace_seconds(job: ResilientTrainingJob, default: int) -> int:
    """The grace period of the job's new pods: from the longer of the declared persist time
    (spec.checkpoint.persistSeconds) and the longest the pods measured (status.persistSeconds);
    `default` (the operator's setting) while neither is known."""
    known = [s for s in (job.spec.checkpoint.persist_seconds, job.status.persist_seconds) if s is not None]
    if not known:
        return default
    grace = math.ceil(PERSIST_FACTOR * max(known)) + EMERGENCY_SAVE_MARGIN_SECONDS
    return min(MAX_TERMINATION_GRACE_SECONDS, grace)


def graceful_stop_seconds(termination_grace_seconds: int) -> int:
    """The entrypoint's SIGTERM->SIGKILL budget: a margin under the pod's grace period, so the
    entrypoint's own kill (and its last checkpoint) happens before the kubelet's."""
    return max(1, termination_grace_seconds - min(15, termination_grace_seconds // 3))


def _env(
    job: ResilientTrainingJob,
    config: contract.TrainerConfig,
    graceful_stop_seconds: int,
    in_place_restarts: int = 0,
    termination_grace: int | None = None,
) -> list[dict[str, Any]]:
    ours = {
        contract.ENV_TRAINER_CONFIG,
        contract.ENV_GRACEFUL_STOP_SECONDS,
        contract.ENV_TERMINATION_GRACE_SECONDS,
        contract.ENV_MAX_IN_PLACE_RESTARTS,
        *(name for name, _ in _DOWNWARD_ENV),
    }
    env: list[dict[str, Any]] = [
        {"name": e.name, "value": e.value} for e in job.spec.env if e.name not in ours
    ]
    env.append({"name": contract.ENV_TRAINER_CONFIG, "value": config.to_env()})
    env.append({"name": contract.ENV_GRACEFUL_STOP_SECONDS, "value": str(graceful_stop_seconds)})
    if termination_grace is not None:
        env.append({"name": contract.ENV_TERMINATION_GRACE_SECONDS, "value": str(termination_grace)})
    if in_place_restarts:
        env.append({"name": contract.ENV_MAX_IN_PLACE_RESTARTS, "value": str(in_place_restarts)})
    env.extend({"name": n, "valueFrom": {"fieldRef": {"fieldPath": f}}} for n, f in _DOWNWARD_ENV)
    return env


def _training_pod(
    job: ResilientTrainingJob,
    name: str,
    labels: dict[str, str],
    cause: str,
    avoid_nodes: tuple[str, ...],
    standby: bool,
    settings: BuildSettings,
    in_place_restarts: int = 0,
    suspect_node: str = "",
) -> dict[str, Any]:
    tpl = job.spec.pod_template
    grace = termination_grace_seconds(job, settings.termination_grace_seconds)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": tpl.service_account_name or settings.trainer_service_account,
        "terminationGracePeriodSeconds": grace,
        "nodeSelector": job.spec.placement.node_labels(),
        "tolerations": _tolerations(job),
        "affinity": _affinity(job, avoid_nodes, suspect_node),
        "securityContext": pod_security_context(job),
        "containers": [_trainer_container(job, standby, grace, in_place_restarts)],
        "volumes": _volumes(job),
    }
    if tpl.priority_class_name:
        pod_spec["priorityClassName"] = tpl.priority_class_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": _ns(job),
            "labels": {**tpl.labels, **labels},
            "annotations": {**AUTOSCALER_HOLD_ANNOTATIONS, **tpl.annotations, CAUSE_ANNOTATION: cause},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": pod_spec,
    }


#: The container rule that restarts the whole pod in place (rtj.ladder.in_place, KEP-5532): on the
#: trainer's RESTART_IN_PLACE exit the kubelet restarts every container of the pod on its node.
IN_PLACE_RESTART_RULE = {
    "action": "RestartAllContainers",
    "exitCodes": {"operator": "In", "values": [contract.ExitCode.RESTART_IN_PLACE]},
}


def _trainer_container(
    job: ResilientTrainingJob, standby: bool, grace: int, in_place_restarts: int = 0
) -> dict[str, Any]:
    """The pod's one container: `rtj-trainer launch` with the job's TrainerConfig; with
    `in_place_restarts`, the rule that restarts the pod in place on the trainer's exit code 76
    (every other exit ends the container, as the pod's restartPolicy Never does)."""
    spec = job.spec
    rules: dict[str, Any] = {}
    if in_place_restarts:
        rules = {"restartPolicy": "Never", "restartPolicyRules": [IN_PLACE_RESTART_RULE]}
    return {
        "name": TRAINER_CONTAINER,
        "image": spec.image,
        "command": ["rtj-trainer", "launch"],
        **rules,
        "env": _env(
            job, trainer_config(job, standby=standby), graceful_stop_seconds(grace), in_place_restarts, grace
        ),
        "resources": _resources(job),
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": SHM_VOLUME, "mountPath": SHM_MOUNT_PATH},
            {"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.mount_path},
            *spec.pod_template.volume_mounts,
        ],
    }


def _volumes(job: ResilientTrainingJob) -> list[dict[str, Any]]:
    """/dev/shm (memory-backed: the memory tier), the checkpoint volume, and the template's own."""
    shm = {"medium": "Memory", "sizeLimit": job.spec.resources.shared_memory_size}
    return [
        {"name": SHM_VOLUME, "emptyDir": shm},
        {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": pvc_name(job)}},
        *job.spec.pod_template.volumes,
    ]


def worker_pod(
    job: ResilientTrainingJob,
    slot: int,
    attempt: int,
    cause: str,
    avoid_nodes: tuple[str, ...] = (),
    settings: BuildSettings | None = None,
    *,
    in_place_restarts: int = 0,
    suspect_node: str = "",
) -> dict[str, Any]:
    """The pod of `slot`'s `attempt`: off the quarantined `avoid_nodes` (required), and preferring
    nodes other than the slot's `suspect_node` (rtj.ladder.suspect_node)."""
    labels = {
        contract.LABEL_JOB: _name(job),
        contract.LABEL_ROLE: contract.ROLE_WORKER,
        contract.LABEL_SLOT: str(slot),
        contract.LABEL_ATTEMPT: str(attempt),
    }
    return _training_pod(
        job,
        contract.worker_pod_name(_name(job), slot, attempt),
        labels,
        cause,
        avoid_nodes,
        False,
        settings or BuildSettings(),
        in_place_restarts,
        suspect_node,
    )


def spare_pod(
    job: ResilientTrainingJob,
    index: int,
    attempt: int,
    avoid_nodes: tuple[str, ...] = (),
    settings: BuildSettings | None = None,
    *,
    in_place_restarts: int = 0,
) -> dict[str, Any]:
    labels = {
        contract.LABEL_JOB: _name(job),
        contract.LABEL_ROLE: contract.ROLE_SPARE,
        LABEL_SPARE_INDEX: str(index),
        contract.LABEL_ATTEMPT: str(attempt),
    }
    return _training_pod(
        job,
        contract.spare_pod_name(_name(job), index, attempt),
        labels,
        contract.CAUSE_HOT_SPARE,
        avoid_nodes,
        True,
        settings or BuildSettings(),
        in_place_restarts,
    )


def promotion_patch(slot: int, attempt: int, cause: str) -> dict[str, Any]:
    """Merge patch turning a standby spare into the worker of `slot` (the ladder's commit)."""
    return {
        "metadata": {
            "labels": {
                contract.LABEL_ROLE: contract.ROLE_WORKER,
                contract.LABEL_SLOT: str(slot),
                contract.LABEL_ATTEMPT: str(attempt),
            },
            "annotations": {CAUSE_ANNOTATION: cause},
        }
    }


def assign_lease_patch(slot: int) -> dict[str, Any]:
    return {"metadata": {"annotations": {contract.ASSIGNED_SLOT_ANNOTATION: str(slot)}}}


def renew_period_patch(seconds: int) -> dict[str, Any]:
    return {"metadata": {"annotations": {contract.RENEW_PERIOD_ANNOTATION: str(seconds)}}}


def reach_probe_patch(probe: contract.ReachProbe) -> dict[str, Any]:
    return {"metadata": {"annotations": {contract.REACH_PROBE_ANNOTATION: probe.to_annotation()}}}


def fence_lease_patch(reason: str) -> dict[str, Any]:
    return {"metadata": {"annotations": {contract.FENCED_ANNOTATION: reason[:512]}}}


def rendezvous_pod(job: ResilientTrainingJob, settings: BuildSettings | None = None) -> dict[str, Any]:
    settings = settings or BuildSettings()
    name = contract.rendezvous_name(_name(job))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": _ns(job),
            "labels": {contract.LABEL_JOB: _name(job), contract.LABEL_ROLE: contract.ROLE_RENDEZVOUS},
            "annotations": {**AUTOSCALER_HOLD_ANNOTATIONS, CAUSE_ANNOTATION: contract.CAUSE_RENDEZVOUS},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": job.spec.pod_template.service_account_name
            or settings.trainer_service_account,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 5,
            "tolerations": _tolerations(job),
            "securityContext": pod_security_context(job),
            **(
                {"priorityClassName": job.spec.pod_template.priority_class_name}
                if job.spec.pod_template.priority_class_name
                else {}
            ),
            "containers": [
                {
                    "name": "rendezvous",
                    "image": job.spec.image,
                    "command": ["rtj-trainer", "rendezvous"],
                    "env": _env(job, trainer_config(job), graceful_stop_seconds(5)),
                    "ports": [{"name": RDZV_PORT_NAME, "containerPort": RDZV_PORT, "protocol": "TCP"}],
                    "securityContext": container_security_context(),
                    "resources": {
                        "requests": {"cpu": "250m", "memory": "256Mi"},
                        # nvrx-control imports torch (~700 MB RSS measured on NVRx 0.7.0, torch 2.15).
                        "limits": {"cpu": "1", "memory": "2Gi"},
                    },
                }
            ],
        },
    }


def rendezvous_service(job: ResilientTrainingJob) -> dict[str, Any]:
    name = contract.rendezvous_name(_name(job))
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": _ns(job),
            "labels": {contract.LABEL_JOB: _name(job), contract.LABEL_ROLE: contract.ROLE_RENDEZVOUS},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {contract.LABEL_JOB: _name(job), contract.LABEL_ROLE: contract.ROLE_RENDEZVOUS},
            "ports": [
                {"name": RDZV_PORT_NAME, "port": RDZV_PORT, "targetPort": RDZV_PORT, "protocol": "TCP"}
            ],
        },
    }


def replica_service(job: ResilientTrainingJob, slot: int) -> dict[str, Any] | None:
    """The headless Service naming slot `slot`'s replica server (None: peer replica off). It selects
    the slot's worker pod by label, so every attempt and a promoted spare get the same DNS name;
    not-ready addresses are published, as the replica is needed while pods start."""
    if not job.spec.checkpoint.peer_replica:
        return None
    selector = {contract.LABEL_JOB: _name(job), contract.LABEL_ROLE: contract.ROLE_WORKER}
    port = REPLICA_PORT + slot
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": contract.replica_service_name(_name(job), slot),
            "namespace": _ns(job),
            "labels": {contract.LABEL_JOB: _name(job), contract.LABEL_SLOT: str(slot)},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {**selector, contract.LABEL_SLOT: str(slot)},
            "ports": [{"name": "replica", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def fsx_persistent_volume(job: ResilientTrainingJob) -> dict[str, Any] | None:
    """The static PV for an FSx checkpoint volume (cluster-scoped: no owner reference; the job's
    delete handler, under the operator's finalizer, deletes it by its labels; reclaim policy Retain
    never touches the file system)."""
    fsx = job.spec.checkpoint.fsx
    if fsx is None:
        return None
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": fsx_pv_name(_ns(job), _name(job)),
            "labels": fsx_pv_labels(_ns(job), _name(job)),
        },
        "spec": {
            "capacity": {"storage": fsx.storage_capacity},
            "volumeMode": "Filesystem",
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "mountOptions": ["flock"],
            "claimRef": {"namespace": _ns(job), "name": pvc_name(job)},
            "csi": {
                "driver": FSX_DRIVER,
                "volumeHandle": fsx.file_system_id,
                "volumeAttributes": {"dnsname": fsx.dns_name, "mountname": fsx.mount_name},
            },
        },
    }


def fsx_persistent_volume_claim(job: ResilientTrainingJob) -> dict[str, Any] | None:
    fsx = job.spec.checkpoint.fsx
    if fsx is None:
        return None
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": pvc_name(job),
            "namespace": _ns(job),
            "labels": {contract.LABEL_JOB: _name(job)},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": fsx_pv_name(_ns(job), _name(job)),
            "resources": {"requests": {"storage": fsx.storage_capacity}},
        },
    }


# --- Kueue (rtj.ladder.kueue_admission) --------------------------------------------------------------
#: What of a pod's spec a Workload pod set's template keeps: what Kueue reads to count quota (the
#: containers' requests and limits, overhead) and to pick flavors (node selector, affinity,
#: tolerations), not the pod's environment or volumes.
_PODSET_SPEC_KEYS = (
    "nodeSelector",
    "affinity",
    "tolerations",
    "priorityClassName",
    "runtimeClassName",
    "overhead",
)


def _podset(name: str, count: int, pod: dict[str, Any]) -> dict[str, Any]:
    spec = pod["spec"]
    template_spec: dict[str, Any] = {k: spec[k] for k in _PODSET_SPEC_KEYS if spec.get(k)}
    for key in ("initContainers", "containers"):
        if spec.get(key):
            template_spec[key] = [
                {"name": c["name"], "image": c["image"], "resources": c.get("resources") or {}}
                for c in spec[key]
            ]
    template_spec["restartPolicy"] = spec.get("restartPolicy", "Never")
    return {"name": name, "count": count, "template": {"spec": template_spec}}


def workload(job: ResilientTrainingJob, settings: BuildSettings | None = None) -> dict[str, Any]:
    """The job's Kueue Workload (kueue.x-k8s.io/v1beta2): one pod set per kind of pod the job runs,
    each with the requests, limits and placement of the pods the operator will create."""
    bs = settings or BuildSettings()
    podsets = [_podset(ka.PODSET_WORKERS, job.spec.nodes, worker_pod(job, 0, 0, "", (), bs))]
    if job.spec.hot_spares:
        podsets.append(_podset(ka.PODSET_SPARES, job.spec.hot_spares, spare_pod(job, 0, 0, (), bs)))
    podsets.append(_podset(ka.PODSET_RENDEZVOUS, 1, rendezvous_pod(job, bs)))
    return {
        "apiVersion": f"{ka.WORKLOAD_GROUP}/{ka.WORKLOAD_VERSION}",
        "kind": "Workload",
        "metadata": {
            "name": ka.workload_name(_name(job), str(job.metadata.get("uid", ""))),
            "namespace": _ns(job),
            "labels": {contract.LABEL_JOB: _name(job), ka.JOB_UID_LABEL: str(job.metadata.get("uid", ""))},
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {"queueName": ka.queue_name(job), "podSets": podsets},
    }


def place(pod: dict[str, Any], node_selector: dict[str, str], tolerations: tuple[dict[str, Any], ...],
          labels: dict[str, str]) -> dict[str, Any]:  # fmt: skip
    """The pod with what its Kueue admission adds (jobframework's RunWithPodSetsInfo): the flavor's
    node labels merged into its nodeSelector, its tolerations appended, Kueue's pod set label."""
    spec = {**pod["spec"], "nodeSelector": {**(pod["spec"].get("nodeSelector") or {}), **node_selector}}
    if tolerations:
        spec["tolerations"] = [*(pod["spec"].get("tolerations") or []), *tolerations]
    meta = {**pod["metadata"], "labels": {**(pod["metadata"].get("labels") or {}), **labels}}
    return {**pod, "metadata": meta, "spec": spec}
