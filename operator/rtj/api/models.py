"""ResilientTrainingJob spec and status as pydantic models.

These models are the one source of truth: `python -m rtj.api.crdgen` turns them into the CRD
(descriptions become `kubectl explain` docs; `json_schema_extra` carries CEL rules), and the
operator parses every object it reads through them. Wire names are camelCase (aliases).
"""

from __future__ import annotations

import re
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from rtj.api.instances import instance_defaults_text
from rtj.contract import DEFAULT_DO_NOT_RESTART_EXIT_CODES, PodState


def _int_to_str(value: Any) -> Any:
    # YAML `cpu: 180` is an integer; Kubernetes quantities accept both spellings (and 180.0, as
    # OpenAPI's `integer` does).
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if not -(2**63) <= value < 2**63:  # the API server reads a larger JSON integer as a float
            raise ValueError("an integer quantity must fit in 64 bits; write it as a string")
        return str(value)
    return value


_QUANTITY_SUFFIX = "(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?$"


def _quantity(pattern: str, minimum: int) -> Any:
    return Annotated[
        str,
        Field(
            pattern=pattern + _QUANTITY_SUFFIX,
            max_length=32,
            # minimum: the integer spelling is bounded too (the pattern sees only strings).
            json_schema_extra={"x-kubernetes-int-or-string": True, "minimum": minimum},
        ),
        BeforeValidator(_int_to_str),
    ]


#: A Kubernetes resource quantity ("180", "1800Gi", "500m"); an integer is accepted too (int-or-string).
Quantity = _quantity(r"^[0-9]+(\.[0-9]+)?", 0)
#: A quantity greater than zero (a volume's capacity).
PositiveQuantity = _quantity(r"^([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*)", 1)
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DnsLabel = Annotated[str, Field(pattern=DNS_LABEL_PATTERN, max_length=63)]

#: A label value: at most 63 characters, alphanumeric at both ends, `-_.` inside (or empty).
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
LabelValue = Annotated[str, Field(pattern=LABEL_VALUE_PATTERN, max_length=63)]
#: No whitespace at either end (Go's unicode.IsSpace, as the API server checks a container image).
TRIMMED_PATTERN = r"^[^\t\n\v\f\r\x{85}\p{Z}]([^\n]*[^\t\n\v\f\r\x{85}\p{Z}])?$"
#: A label or annotation key: an optional DNS-subdomain prefix (at most 253 characters) and "/",
#: then a name of at most 63 characters. The CRD checks keys with CEL (a map's keys have no schema),
#: the models with the same expression in Python (no backslashes: it is quoted into CEL as is).
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def _qualified_name_cel(expr: str) -> str:
    return f"{expr}.matches('{QUALIFIED_NAME_PATTERN}') && {expr}.indexOf('/') <= 253"


def qualified_name_error(key: str) -> str | None:
    """Why `key` is not a valid label/annotation key (None when it is)."""
    if re.fullmatch(QUALIFIED_NAME_PATTERN, key) and key.find("/") <= 253:
        return None
    return (
        f"{key!r} is not a valid key: an optional DNS-subdomain prefix and '/', then at most 63 "
        "characters, alphanumeric at both ends, '-', '_' or '.' inside"
    )


def _string_schema(description: str, pattern: str, max_length: int) -> dict[str, Any]:
    """A string field of an open (dict) item, as the CRD declares it; `_fits` checks it in Python."""
    return {"type": "string", "description": description, "maxLength": max_length, "pattern": pattern}


def _fits(value: Any, pattern: str, max_length: int) -> bool:
    """What the CRD's `pattern` and `maxLength` say of a field inside an open (dict) item."""
    return isinstance(value, str) and len(value) <= max_length and re.fullmatch(pattern, value) is not None


def _check_keys(mapping: dict[str, Any]) -> dict[str, Any]:
    for key in mapping:
        error = qualified_name_error(key)
        if error:
            raise ValueError(error)
    return mapping


def keys_are_qualified_names(what: str) -> dict[str, Any]:
    """The CEL rule that every key of the map `what` is a qualified name."""
    return cel(
        (
            f"self.all(k, {_qualified_name_cel('k')})",
            f"{what} keys must be qualified names: an optional DNS-subdomain prefix and '/', then at most "
            "63 characters, alphanumeric at both ends, '-', '_' or '.' inside",
        )
    )


#: An absolute path without ':' (a container runtime splits mount specs at ':').
MOUNT_PATH_PATTERN = r"^/[^:]*$"

#: Volumes every trainer pod has; podTemplate.volumes must not reuse their names.
SHM_VOLUME = "rtj-dshm"
SHM_MOUNT_PATH = "/dev/shm"
CHECKPOINT_VOLUME = "rtj-checkpoints"
RESERVED_VOLUMES = (SHM_VOLUME, CHECKPOINT_VOLUME)
_RESERVED_VOLUMES_CEL = "[" + ", ".join(f"'{v}'" for v in RESERVED_VOLUMES) + "]"


class ApiModel(BaseModel):
    """Wire-format base: camelCase names, unknown fields rejected (the CRD rejects them too)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


def cel(*rules: tuple[str, str] | tuple[str, str, str]) -> dict[str, Any]:
    """`json_schema_extra` for CEL rules given as (rule, message) or (rule, message, fieldPath).

    fieldPath (e.g. ".procsPerNode") makes the API server report the rejection at that field
    rather than at the object holding the rule.
    """
    out = []
    for rule, message, *field_path in rules:
        item = {"rule": rule, "message": message}
        if field_path:
            item["fieldPath"] = field_path[0]
        out.append(item)
    return {"x-kubernetes-validations": out}


def immutable(what: str, why: str = "") -> dict[str, Any]:
    """A transition rule on a field that exists in every version of the object (oldSelf is set on update)."""
    return cel(("self == oldSelf", _immutable_message(what, why)))


def _immutable_message(what: str, why: str = "") -> str:
    return f"{what} is immutable{f' ({why})' if why else ''}; create a new job to change it"


def immutable_optional(field: str, what: str, why: str) -> tuple[str, str, str]:
    """A transition rule, on the object holding the optional `field`, that it is neither set,
    unset nor changed (a rule on the field itself is not evaluated when it is added or removed)."""
    self_, old = f"self.{field}", f"oldSelf.{field}"
    return (
        f"has({self_}) == has({old}) && (!has({self_}) || {self_} == {old})",
        _immutable_message(what, why),
        f".{field}",
    )


#: Why the fields that define the training world are immutable: a replacement pod would join its
#: peers with another world (issue 13: a changed procsPerNode looped through 66 restarts).
_WORLD = (
    "a replacement pod would join its peers with a different world, and the job's checkpoints fit "
    "only the world they were written by"
)
_STORAGE = "the job's checkpoints are there: a replacement pod would resume from elsewhere than its peers"
#: Fields that change what every rank runs: only together with suspend (all pods are recreated).
_PROGRAM_FIELDS = ("command", "args", "env")


# ---------------------------------------------------------------------------------------------
# spec
# ---------------------------------------------------------------------------------------------
#: Environment variables the runtime owns (its config, the pod's identity): a job may not set them.
RUNTIME_ENV_PREFIX = "RTJ_"
RUNTIME_ENV_OWNED = f"env names starting with {RUNTIME_ENV_PREFIX} are the runtime's"


class EnvVar(ApiModel):
    """A plain environment variable of the trainer container."""

    model_config = ConfigDict(
        json_schema_extra=cel((f"!self.name.startsWith('{RUNTIME_ENV_PREFIX}')", RUNTIME_ENV_OWNED, ".name"))
    )

    name: str = Field(
        description=f"Environment variable name; not starting with {RUNTIME_ENV_PREFIX} (the runtime's).",
        pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$",
        max_length=256,
    )

    @field_validator("name")
    @classmethod
    def _not_the_runtimes(cls, name: str) -> str:
        if name.startswith(RUNTIME_ENV_PREFIX):
            raise ValueError(f"{RUNTIME_ENV_OWNED}: {name}")
        return name

    value: str = Field("", description="Value of the variable.", max_length=32768)


class Toleration(ApiModel):
    """A core/v1 Toleration of the trainer pods."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "self.key != '' || self.operator == 'Exists'",
                "operator must be Exists when key is empty",
                ".operator",
            ),
            (
                "self.operator != 'Exists' || self.value == ''",
                "value must be empty when operator is Exists",
                ".value",
            ),
            (
                "!has(self.tolerationSeconds) || self.effect == 'NoExecute'",
                "tolerationSeconds is only allowed with effect NoExecute",
                ".tolerationSeconds",
            ),
            (
                "self.key == '' || " + _qualified_name_cel("self.key"),
                "key must be a qualified name (an optional DNS-subdomain prefix and '/', then at most 63 "
                "characters, alphanumeric at both ends)",
                ".key",
            ),
        )
    )

    key: str = Field(
        "", description="Taint key the toleration applies to; empty matches all keys.", max_length=317
    )
    operator: Literal["Equal", "Exists"] = Field("Equal", description="Equal or Exists.")
    value: LabelValue = Field("", description="Taint value the toleration matches (operator Equal).")
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        "", description="NoSchedule, PreferNoSchedule or NoExecute; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        None,
        description="For NoExecute: how long the pod stays bound after the taint appears.",
        ge=0,
        le=2**31 - 1,
    )


class Placement(ApiModel):
    """Where the pods run: one pod per node of an H100 node group."""

    instance_type: str = Field(
        "p5.48xlarge",
        description="EC2 instance type of the node group (matched against node.kubernetes.io/instance-type).",
        min_length=1,
        max_length=63,
        pattern=LABEL_VALUE_PATTERN,
    )
    node_selector: Annotated[dict[str, LabelValue], AfterValidator(_check_keys)] = Field(
        default_factory=dict,
        description="Extra node labels the pods require (e.g. a node group or zone).",
        max_length=64,
        json_schema_extra=keys_are_qualified_names("placement.nodeSelector"),
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        description="Extra tolerations; the nvidia.com/gpu NoSchedule toleration is always added.",
        max_length=32,
    )
    affinity: dict[str, Any] | None = Field(
        None,
        description="A core/v1 Affinity merged into the pods' (node and pod affinity); the operator "
        "always adds anti-affinity so that no two pods of the job share a node.",
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
    )


class Resources(ApiModel):
    """Per-pod resources beyond the GPUs. CPU and memory are both requested and limited (equal), so
    that the pods are Guaranteed (the kubelet evicts them last, and the CPU manager may pin them)."""

    efa_per_node: int = Field(
        32,
        description="vpc.amazonaws.com/efa devices per pod (32 on p5.48xlarge; 0 disables EFA).",
        ge=0,
        le=32,
    )
    cpu: Quantity | None = Field(
        None,
        description='CPU request and limit per pod (e.g. "180"). Default: from placement.instanceType '
        f"({instance_defaults_text()}); an instance type not listed there has no default, and the pods "
        "are then BestEffort unless cpu and memory are set.",
    )
    memory: Quantity | None = Field(
        None,
        description='Memory request and limit per pod (e.g. "1800Gi"); it includes /dev/shm (memory-backed). '
        "Default: from placement.instanceType, like cpu.",
    )
    shared_memory_size: Quantity = Field(
        "64Gi",
        description="Size limit of the memory-backed /dev/shm volume (NCCL and data loaders need it); it "
        "counts against the pod's memory limit.",
    )


class PvcSource(ApiModel):
    """An existing PersistentVolumeClaim (ReadWriteMany when nodes > 1)."""

    claim_name: DnsLabel = Field(
        description="Name of an existing PersistentVolumeClaim in the job's namespace."
    )


class FsxSource(ApiModel):
    """An existing FSx for Lustre file system, mounted through a static PV/PVC on fsx.csi.aws.com."""

    file_system_id: str = Field(
        description="FSx file system id, e.g. fs-0123456789abcdef0.", pattern=r"^fs-[0-9a-f]{8,17}$"
    )
    dns_name: str = Field(
        description="DNS name of the file system, e.g. fs-0123….fsx.us-east-1.amazonaws.com.",
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        max_length=253,
    )
    mount_name: str = Field(
        description="Lustre mount name of the file system (from `aws fsx describe-file-systems`).",
        pattern=r"^[a-z0-9]{1,16}$",
    )
    storage_capacity: PositiveQuantity = Field("1200Gi", description="Capacity recorded on the static PV.")


PEER_REPLICA_NEEDS_SNAPSHOTS = "checkpoint.peerReplica needs checkpoint.memorySnapshotIntervalSteps > 0"


class Checkpoint(ApiModel):
    """Where and how often checkpoints are written. Exactly one of pvc or fsx."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            ("has(self.pvc) != has(self.fsx)", "exactly one of checkpoint.pvc or checkpoint.fsx must be set"),
            (
                f"self.mountPath != '{SHM_MOUNT_PATH}'",
                f"checkpoint.mountPath must not be {SHM_MOUNT_PATH} (the shared-memory volume's)",
                ".mountPath",
            ),
            immutable_optional("pvc", "checkpoint.pvc", _STORAGE),
            immutable_optional("fsx", "checkpoint.fsx", _STORAGE),
            (
                "!self.peerReplica || self.memorySnapshotIntervalSteps > 0",
                PEER_REPLICA_NEEDS_SNAPSHOTS,
                ".peerReplica",
            ),
        )
    )

    pvc: PvcSource | None = Field(None, description="Use an existing PVC for checkpoints. Immutable.")
    fsx: FsxSource | None = Field(
        None, description="Use an FSx for Lustre file system for checkpoints. Immutable."
    )
    mount_path: str = Field(
        "/checkpoints",
        description="Where the checkpoint volume is mounted in every pod. Immutable.",
        pattern=MOUNT_PATH_PATTERN,
        max_length=1024,
        json_schema_extra=immutable("checkpoint.mountPath", _STORAGE),
    )
    interval_steps: int = Field(
        100, description="Save a checkpoint every this many training steps.", ge=1, le=10_000_000
    )
    keep: int = Field(2, description="How many committed checkpoints to keep.", ge=1, le=100)

    @model_validator(mode="after")
    def _peer_replica_needs_snapshots(self) -> Checkpoint:
        if self.peer_replica and self.memory_snapshot_interval_steps == 0:
            raise ValueError(PEER_REPLICA_NEEDS_SNAPSHOTS)
        return self

    memory_snapshot_interval_steps: int = Field(
        0,
        description="Also snapshot the state into each pod's memory (/dev/shm, sized by "
        "resources.sharedMemorySize) every this many steps; in-job restarts resume from the newest "
        "snapshot every rank holds. 0 disables. Persisting to the volume keeps intervalSteps.",
        ge=0,
        le=10_000_000,
    )
    peer_replica: bool = Field(
        False,
        description="Replicate each pod's memory snapshots, in the background, to the pod of the next "
        "node slot (slot s to s+1 mod nodes: another node); a replacement pod (its node lost) fetches "
        "its shards from there instead of the volume (status.replicaStep). Needs "
        "memorySnapshotIntervalSteps > 0; does nothing with one node. resources.sharedMemorySize must "
        "hold, besides what NCCL uses, four snapshots of a pod's state (two own, the peer's replica and "
        "one arriving), and up to seven while a slow persist, a slow replication and the last replicated "
        "snapshot (kept: the step the peer holds) each hold an older own one.",
    )
    persist_seconds: int | None = Field(
        None,
        description="How long writing one checkpoint to the volume takes, as you measured it. The pods' "
        "terminationGracePeriodSeconds (time for the emergency save on SIGTERM) is 1.5 x the longer of "
        "this and the longest the pods measured (status.persistSeconds) + 30 s, at most 3600; with "
        "neither, the operator's default (RTJ_TERMINATION_GRACE_SECONDS). Applies to pods created "
        "after the change.",
        ge=1,
        le=86400,
    )


class InProcessRestart(ApiModel):
    """NVRx in-process restart: a rank's exception or hang is recovered inside the running processes."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "self.hardTimeoutSeconds > self.softTimeoutSeconds",
                "inProcessRestart.hardTimeoutSeconds must be greater than softTimeoutSeconds",
                ".hardTimeoutSeconds",
            ),
        )
    )

    enabled: bool = Field(True, description="Wrap the training function in NVRx inprocess.Wrapper.")
    soft_timeout_seconds: int = Field(
        60,
        description="A rank silent this long is considered hung and asked to restart in-process.",
        ge=1,
        le=86400,
    )
    hard_timeout_seconds: int = Field(
        90,
        description="A hung rank still silent this long is killed; the launcher takes over.",
        ge=2,
        le=86400,
    )
    max_restarts: int = Field(
        10, description="In-process restarts allowed per launcher cycle before escalating.", ge=0, le=10000
    )


class FaultTolerance(ApiModel):
    """The escalation ladder: each level has a budget."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "self.heartbeatTimeoutSeconds > self.heartbeatIntervalSeconds",
                "faultTolerance.heartbeatTimeoutSeconds must be greater than heartbeatIntervalSeconds",
                ".heartbeatTimeoutSeconds",
            ),
            (
                "self.startupTimeoutSeconds >= self.heartbeatTimeoutSeconds",
                "faultTolerance.startupTimeoutSeconds must be at least heartbeatTimeoutSeconds",
                ".startupTimeoutSeconds",
            ),
        )
    )

    heartbeat_interval_seconds: int = Field(
        10, description="How often each pod renews its heartbeat Lease.", ge=1, le=300
    )
    heartbeat_timeout_seconds: int = Field(
        60,
        description="A running pod whose heartbeat is older than this is a hard fault and is replaced.",
        ge=2,
        le=3600,
    )
    startup_timeout_seconds: int = Field(
        600, description="How long a new pod may take to send its first heartbeat.", ge=2, le=86400
    )
    rank_hang_timeout_seconds: int = Field(
        300,
        description="NVRx rank heartbeat timeout: a rank silent this long is restarted by ft_launcher.",
        ge=1,
        le=86400,
    )
    in_process_restart: InProcessRestart = Field(
        default_factory=InProcessRestart, description="Level 1: in-process restart."
    )
    max_in_job_restarts: int = Field(
        3, description="Level 2: ft_launcher in-job restarts per pod before the pod fails.", ge=0, le=1000
    )
    max_pod_reschedules: int = Field(
        4, description="Level 3: pod replacements allowed for the whole job before it fails.", ge=0, le=1000
    )
    max_job_restarts: int = Field(
        4,
        description="Job-level recoveries allowed (the rendezvous pod lost and recreated, workers failing "
        "right after it or together: no pod budget spent, no node quarantined) before the job fails.",
        ge=0,
        le=1000,
    )
    max_no_progress_cycles: int = Field(
        3, description="Restart cycles without a new checkpoint before NVRx stops (exit 93).", ge=1, le=1000
    )
    quarantine_faulty_nodes: bool = Field(
        True,
        description="Taint a node when a fault carries evidence against that node (NotReady or gone, an "
        "unhealthy hardware condition, lost GPUs, a hardware error its ranks report, pods of different "
        "jobs failing there) and keep replacements off it. The quarantine is the node's: lifted when the "
        "node shows no evidence at its check, never by deleting the job (docs/fault-classes.md).",
    )
    container_wait_timeout_seconds: int = Field(
        600,
        description="How long a pod's container may wait for its image (ErrImagePull, ImagePullBackOff) "
        "or its config (CreateContainerConfigError) before the job fails naming it (ImagePullFailed, "
        "ContainerConfigFailed); an invalid image name fails at once. Waiting spends no budget.",
        ge=10,
        le=86400,
    )
    progress_timeout_seconds: int = Field(
        1800,
        description="Progress watchdog: while every pod runs (or has finished), no pod reporting a new "
        "highest step for this long sets condition Stalled; as long again fails the job (NoProgress). "
        "Also ends a job whose workers wait forever for a peer that exited 0 early.",
        ge=10,
        le=7 * 86400,
    )
    do_not_restart_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        default_factory=lambda: list(DEFAULT_DO_NOT_RESTART_EXIT_CODES),
        description="Pod exit codes that mean the job must fail rather than restart (NVRx uses 93).",
        max_length=32,
    )


class SeccompProfile(ApiModel):
    """The pods' seccomp profile: the runtime's default, or one installed on the node. `Unconfined` is not
    offered (the `restricted` Pod Security Standard refuses it)."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "(self.type == 'Localhost') == has(self.localhostProfile)",
                "seccompProfile.localhostProfile must be set exactly when type is Localhost",
                ".localhostProfile",
            ),
        )
    )

    type: Literal["RuntimeDefault", "Localhost"] = Field(
        "RuntimeDefault", description="RuntimeDefault or Localhost."
    )
    localhost_profile: str | None = Field(
        None,
        description="For type Localhost: the profile's path relative to the kubelet's seccomp directory.",
        min_length=1,
        max_length=4096,
        pattern=r"^[^/].*$",
    )

    @model_validator(mode="after")
    def _localhost_profile_iff_localhost(self) -> SeccompProfile:
        if (self.type == "Localhost") != (self.localhost_profile is not None):
            raise ValueError("seccompProfile.localhostProfile must be set exactly when type is Localhost")
        return self


#: The trainer image's group (trainer-image/Dockerfile: user `trainer`, UID and GID 10001; Ubuntu 24.04
#: images already have UID 1000).
TRAINER_IMAGE_GID = 10001


class PodSecurity(ApiModel):
    """Pod-level security settings of every pod of the job (core/v1 PodSecurityContext), limited to what
    the `restricted` Pod Security Standard admits. The operator always adds runAsNonRoot: true, and to
    each container allowPrivilegeEscalation: false and capabilities.drop: [ALL]; GPUs and EFA need no
    more (their device plugins hand the devices to the container)."""

    run_as_user: int | None = Field(
        None,
        description="UID of the containers' processes; never 0. Default: the image's USER, which must then "
        "be numeric and not 0 (the pods run with runAsNonRoot; the trainer image's is 10001).",
        ge=1,
        le=2**31 - 1,
    )
    run_as_group: int | None = Field(
        None,
        description="Primary GID of the containers' processes. Default: the image's.",
        ge=0,
        le=2**31 - 1,
    )
    fs_group: int = Field(
        TRAINER_IMAGE_GID,
        description="Supplementary group that owns the pods' volumes (the checkpoint volume must be "
        "writable by runAsUser or this group; volumes whose driver ignores fsGroup, e.g. FSx for Lustre, "
        "need the file system's own permissions).",
        ge=0,
        le=2**31 - 1,
    )
    fs_group_change_policy: Literal["OnRootMismatch", "Always"] = Field(
        "OnRootMismatch",
        description="OnRootMismatch: change volume ownership only when the volume's root does not match "
        "fsGroup (a large checkpoint volume is not walked at every pod start); Always: every start.",
    )
    supplemental_groups: list[Annotated[int, Field(ge=0, le=2**31 - 1)]] = Field(
        default_factory=list, description="Further supplementary GIDs.", max_length=32
    )
    seccomp_profile: SeccompProfile = Field(
        default_factory=SeccompProfile, description="Seccomp profile of the pods."
    )


class PodTemplateOverrides(ApiModel):
    """Escape hatch for what the API does not cover. Applied to every pod of the job."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                # has(): the spelled-out default of podTemplate is checked too, without list defaults.
                f"!has(self.volumeMounts) || self.volumeMounts.all(m, m.name in {_RESERVED_VOLUMES_CEL} "
                "|| (has(self.volumes) && self.volumes.exists(v, v.name == m.name)))",
                "every podTemplate.volumeMounts[].name must name a volume of podTemplate.volumes "
                f"(or {', '.join(RESERVED_VOLUMES)})",
                ".volumeMounts",
            ),
        )
    )

    service_account_name: DnsLabel | None = Field(
        None,
        description="ServiceAccount of the trainer pods (it must be allowed to create and patch Leases).",
    )
    security_context: PodSecurity = Field(
        default_factory=PodSecurity,
        description="Security settings of every pod of the job, limited to what the `restricted` Pod "
        "Security Standard admits. The operator always adds runAsNonRoot: true and, to each container, "
        "allowPrivilegeEscalation: false and capabilities.drop: [ALL]; GPUs and EFA need no more.",
    )
    labels: Annotated[dict[str, LabelValue], AfterValidator(_check_keys)] = Field(
        default_factory=dict,
        description="Extra pod labels.",
        max_length=64,
        json_schema_extra=keys_are_qualified_names("podTemplate.labels"),
    )
    # 64 values of 2 KiB and their keys stay well under the API server's 256 KiB for all annotations.
    annotations: Annotated[dict[str, Annotated[str, Field(max_length=2048)]], AfterValidator(_check_keys)] = (
        Field(
            default_factory=dict,
            description="Extra pod annotations (values of at most 2048 characters).",
            max_length=64,
            json_schema_extra=keys_are_qualified_names("podTemplate.annotations"),
        )
    )
    priority_class_name: str | None = Field(None, description="PriorityClass of the pods.", max_length=253)
    volumes: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Extra core/v1 Volumes. hostPath volumes are refused: a job must not reach the node's "
        "filesystem through the operator (use a PersistentVolumeClaim the cluster admin provides). "
        f"Names are unique DNS labels other than {', '.join(RESERVED_VOLUMES)} (the operator's).",
        json_schema_extra={
            "items": {
                "type": "object",
                # CEL sees only declared properties (not preserved unknown ones), so hostPath is declared.
                "properties": {
                    "name": _string_schema("Volume name.", DNS_LABEL_PATTERN, 63),
                    "hostPath": {
                        "type": "object",
                        "description": "Refused (see volumes).",
                        "x-kubernetes-preserve-unknown-fields": True,
                    },
                },
                "required": ["name"],
                "x-kubernetes-preserve-unknown-fields": True,
                **cel(
                    (
                        "!has(self.hostPath)",
                        "hostPath volumes are not allowed in podTemplate.volumes",
                        ".hostPath",
                    ),
                    (
                        f"!(self.name in {_RESERVED_VOLUMES_CEL})",
                        f"volume names {', '.join(RESERVED_VOLUMES)} are the operator's",
                        ".name",
                    ),
                ),
            },
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
        max_length=64,
    )
    volume_mounts: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Extra core/v1 VolumeMounts of the trainer container: each names a volume of "
        f"podTemplate.volumes (or {', '.join(RESERVED_VOLUMES)}), at a path of its own other than "
        f"{SHM_MOUNT_PATH} and checkpoint.mountPath.",
        json_schema_extra={
            "items": {
                "type": "object",
                "properties": {
                    "name": _string_schema("Name of the volume to mount.", DNS_LABEL_PATTERN, 63),
                    "mountPath": _string_schema("Absolute path in the container.", MOUNT_PATH_PATTERN, 1024),
                },
                "required": ["name", "mountPath"],
                "x-kubernetes-preserve-unknown-fields": True,
            },
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["mountPath"],
        },
        max_length=64,
    )

    @field_validator("volumes")
    @classmethod
    def _volumes_are_named(cls, volumes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        # Mirrors the CRD's item schema, so that the models accept exactly what the API server does.
        seen: set[str] = set()
        for i, volume in enumerate(volumes):
            name = volume.get("name")
            if not _fits(name, DNS_LABEL_PATTERN, 63):
                raise ValueError(f"volumes[{i}].name must be a DNS label of 1 to 63 characters")
            if name in RESERVED_VOLUMES or name in seen:
                raise ValueError(f"volumes[{i}].name {name!r} is reserved or used twice")
            seen.add(name)
        return volumes

    @field_validator("volume_mounts")
    @classmethod
    def _mounts_are_named(cls, mounts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        seen: set[str] = set()
        for i, mount in enumerate(mounts):
            name, path = mount.get("name"), mount.get("mountPath")
            if not _fits(name, DNS_LABEL_PATTERN, 63):
                raise ValueError(f"volumeMounts[{i}].name must be a DNS label of at most 63 characters")
            if not _fits(path, MOUNT_PATH_PATTERN, 1024):
                raise ValueError(f"volumeMounts[{i}].mountPath must be an absolute path without ':'")
            if path in seen:
                raise ValueError(f"volumeMounts[{i}].mountPath {path!r} is used twice")
            seen.add(path)
        return mounts


class JobSpec(ApiModel):
    """What to run and how to keep it alive. image, nodes, gpusPerNode, procsPerNode and the
    checkpoint volume and mountPath are immutable; command, args and env change only together with
    suspend: true."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            (
                "!has(self.procsPerNode) || self.procsPerNode <= self.gpusPerNode || self.gpusPerNode == 0",
                "procsPerNode must not exceed gpusPerNode",
                ".procsPerNode",
            ),
            (
                "!has(self.podTemplate.volumeMounts) || self.podTemplate.volumeMounts.all(m, "
                f"m.mountPath != '{SHM_MOUNT_PATH}' && m.mountPath != self.checkpoint.mountPath)",
                f"podTemplate.volumeMounts must not use {SHM_MOUNT_PATH} or checkpoint.mountPath "
                "(the operator mounts its volumes there)",
                ".podTemplate.volumeMounts",
            ),
            immutable_optional("procsPerNode", "procsPerNode", _WORLD),
            *(
                (
                    f"self.suspend || "
                    f"(has(self.{f}) ? self.{f} : []) == (has(oldSelf.{f}) ? oldSelf.{f} : [])",
                    f"{f} may change only together with suspend: true (all pods are then recreated "
                    "with it on resume); a running job's replacement pods would run another program "
                    "than their peers",
                    f".{f}",
                )
                for f in _PROGRAM_FIELDS
            ),
        )
    )

    image: str = Field(
        description="Trainer image (with NVRx and the rtj-trainer entrypoint). Immutable.",
        min_length=1,
        max_length=512,
        pattern=TRIMMED_PATTERN,
        json_schema_extra=immutable("image"),
    )
    command: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        description="The training script to run per rank, e.g. [python, train.py]. ft_launcher runs it.",
        min_length=1,
        max_length=64,
    )
    args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list, description="Arguments of the training script.", max_length=256
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        description="Environment of the trainer; each name once.",
        max_length=256,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @field_validator("env")
    @classmethod
    def _env_names_unique(cls, env: list[EnvVar]) -> list[EnvVar]:
        seen: set[str] = set()
        for i, var in enumerate(env):
            if var.name in seen:
                raise ValueError(f"env[{i}].name {var.name!r} is set twice")
            seen.add(var.name)
        return env

    nodes: int = Field(
        description="Number of nodes, one pod per node. Immutable.",
        ge=1,
        le=10000,
        json_schema_extra=immutable("nodes"),
    )
    gpus_per_node: int = Field(
        8,
        description="GPUs per pod (nvidia.com/gpu); 8 on p5.48xlarge. Immutable.",
        ge=0,
        le=8,
        json_schema_extra=immutable("gpusPerNode", _WORLD),
    )
    procs_per_node: int | None = Field(
        None,
        description="Training processes (ranks) per pod; defaults to gpusPerNode (1 when it is 0). "
        "Immutable.",
        ge=1,
        le=64,
    )
    placement: Placement = Field(default_factory=Placement, description="Node-group placement.")
    resources: Resources = Field(default_factory=Resources, description="Per-pod resources.")
    checkpoint: Checkpoint = Field(description="Checkpoint volume and cadence.")
    fault_tolerance: FaultTolerance = Field(
        default_factory=FaultTolerance, description="Heartbeats, hang detection and the escalation budgets."
    )
    hot_spares: int = Field(
        0, description="Extra pods started ahead of time that take a failed pod's place.", ge=0, le=64
    )
    suspend: bool = Field(
        False, description="Remove the pods but keep status and checkpoints; set back to false to resume."
    )
    ttl_seconds_after_finished: int | None = Field(
        None, description="Delete the job this long after it Succeeded or Failed.", ge=0, le=2**31 - 1
    )
    pod_template: PodTemplateOverrides = Field(
        default_factory=PodTemplateOverrides, description="Extra pod settings (escape hatch)."
    )

    @property
    def procs(self) -> int:
        return self.procs_per_node or max(self.gpus_per_node, 1)


# ---------------------------------------------------------------------------------------------
# status
# ---------------------------------------------------------------------------------------------
class ConditionType(StrEnum):
    RUNNING = "Running"
    RECOVERING = "Recovering"
    DEGRADED = "Degraded"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    #: The API server refuses to create the job's pods (e.g. 403): retried with backoff.
    CREATE_REFUSED = "CreateRefused"
    #: No pod reported a new highest step for progressTimeoutSeconds while all pods ran.
    STALLED = "Stalled"
    #: Pods wait for something no restart fixes (rtj.ladder.blame): unschedulable, an image pulling
    #: or failing to, a missing Secret/ConfigMap. The reason names it, the message quotes the evidence.
    WAITING = "Waiting"


class Condition(ApiModel):
    model_config = ConfigDict(extra="ignore")

    type: str = Field(description="Condition type, e.g. Running, Recovering, Succeeded, Failed.")
    status: str = Field(description="True, False or Unknown.", pattern=r"^(True|False|Unknown)$")
    reason: str = Field("", description="CamelCase reason of the last transition.")
    message: str = Field("", description="Human-readable details.")
    last_transition_time: datetime | None = Field(None, description="When status last changed.")
    observed_generation: int | None = Field(None, description="The spec generation this was computed from.")


class RestartCounts(ApiModel):
    model_config = ConfigDict(extra="ignore")

    in_process: int = Field(
        0,
        description="Level 1: in-process restart incidents. Counts incidents, not pods: one exception is 1 "
        "however many pods restart with it (their per-pod counts are in nodeSlots).",
    )
    in_job: int = Field(
        0,
        description="Level 2: ft_launcher in-job restart incidents, counted like inProcess; the in-job "
        "restarts a pod replacement causes on its peers are part of that replacement.",
    )
    pod_reschedules: int = Field(
        0, description="Level 3: pods replaced for a fault (derived from pod attempts); not disruptions."
    )
    disruptions: int = Field(
        0,
        description="Pods replaced after an eviction, preemption, drain or a delete by someone else: no "
        "fault budget spent.",
    )
    in_process_incident_time: datetime | None = Field(
        None,
        description="When the last counted in-process incident began (its echoes within a heartbeat "
        "timeout are not counted again).",
    )
    in_job_incident_time: datetime | None = Field(
        None,
        description="When the last counted in-job incident began (its echoes within a heartbeat timeout "
        "are not counted again).",
    )
    job: int = Field(
        0,
        description="Job-level recoveries: workers failing together, or right after the rendezvous pod "
        "was lost; each counted once however many pods it replaced (rtj.ladder.job_level).",
    )


class CheckpointStatus(ApiModel):
    model_config = ConfigDict(extra="ignore")

    step: int = Field(description="Training step of the last committed checkpoint.")
    time: datetime = Field(description="When it was committed.")


class JobState(StrEnum):
    """status.state: the job's one-word summary (`kubectl get rtj`), derived from its conditions."""

    PENDING = "Pending"
    STARTING = "Starting"
    RUNNING = "Running"
    RECOVERING = "Recovering"
    SUSPENDED = "Suspended"
    #: Kueue: the job waits for its Workload's admission (or was evicted and queues again).
    QUEUED = "Queued"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class SlotState(StrEnum):
    """The operator's own states of a node slot; otherwise a slot shows its pod's heartbeat state
    (rtj.contract.PodState)."""

    PENDING = "Pending"
    #: Its pod waits for something no restart fixes (condition Waiting names it).
    WAITING = "Waiting"
    STARTING = "Starting"
    REPLACING = "Replacing"
    SILENT = "Silent"
    #: The pod heartbeated before and its Lease is gone (rtj.ladder.missing_lease): not known to train.
    LEASE_MISSING = "LeaseMissing"
    SUCCEEDED = "Succeeded"
    #: Stopped after its pod's ranks finished training (rtj.ladder.training_finished): only the exit
    #: failed. Not "Finished": that is a live pod's heartbeat state (its ranks done, the pod exiting).
    COMPLETED = "Completed"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


#: Slot states without a running pod ("": not observed yet).
SLOT_STATES_WITHOUT_POD = frozenset(
    {
        SlotState.PENDING,
        SlotState.WAITING,
        SlotState.REPLACING,
        SlotState.COMPLETED,
        SlotState.FAILED,
        SlotState.SUSPENDED,
        "",
    }
)


class NodeSlotStatus(ApiModel):
    model_config = ConfigDict(extra="ignore")

    slot: int = Field(description="Node slot (0 .. nodes-1).")
    pod: str = Field("", description="Pod currently in the slot.")
    node: str = Field("", description="Node the pod runs on.")
    attempt: int = Field(0, description="Attempt number of the pod in this slot.")
    state: str = Field(
        "",
        description="Pod state from its heartbeat, or the operator's: Pending, Starting, Replacing, Silent, "
        "LeaseMissing, Succeeded, Failed, Suspended.",
    )
    last_heartbeat_time: datetime | None = Field(None, description="Last heartbeat renewal seen.")
    lease_missing_since: datetime | None = Field(
        None,
        description="When the operator first saw the heartbeat Lease of a pod that had heartbeated "
        "missing (the trainer recreates it; silence still counts from lastHeartbeatTime).",
    )
    in_process_restarts: int = Field(
        0,
        description="In-process restarts the slot's current pod reported (last seen; the operator's "
        "bookkeeping for counting deltas exactly once).",
    )
    in_job_restarts: int = Field(
        0, description="In-job restarts the slot's current pod reported (last seen)."
    )
    last_fault_reason: str = Field("", description="Reason of the last fault seen in this slot.")
    recovering_since: datetime | None = Field(
        None, description="When the slot's ongoing recovery was detected; cleared once back to Training."
    )
    recovering_level: str = Field(
        "", description="Ladder level of the ongoing recovery (InProcess, InJob, Pod)."
    )


class SpareStatus(ApiModel):
    model_config = ConfigDict(extra="ignore")

    index: int = Field(description="Hot spare index (0 .. hotSpares-1).")
    pod: str = Field("", description="Spare pod currently standing by.")
    node: str = Field("", description="Node the spare runs on.")
    attempt: int = Field(0, description="Attempt number of the spare pod (the name encodes it).")
    state: str = Field("", description="Standby when ready to take over a slot.")


class FaultStatus(ApiModel):
    """The newest fault the operator saw in any slot (kubectl get rtj -o wide shows it)."""

    model_config = ConfigDict(extra="ignore")

    reason: str = Field(description="CamelCase reason (a ladder reason, or the pod's own for a soft fault).")
    slot: int | None = Field(None, description="Node slot of the pod.")
    pod: str = Field("", description="The pod.")
    node: str = Field("", description="The node the pod ran on.")
    time: datetime = Field(description="When the operator saw it.")


#: How many incidents status.incidents keeps (the newest; rtj.ladder.incidents).
INCIDENTS_KEPT = 5
#: The longest evidence message an incident keeps.
INCIDENT_MESSAGE_MAX = 256


class IncidentStatus(ApiModel):
    """One incident: one fault however many pods echo it, its class, evidence, action and cost."""

    model_config = ConfigDict(extra="ignore")

    seq: int = Field(description="Number of the incident in this job (1, 2, ...).")
    time: datetime = Field(description="When the operator saw the fault.")
    reason: str = Field(
        description="Its class: a fault class reason (docs/fault-classes.md), InProcessRestart, "
        "InJobRestart, a job-level reason (RendezvousLost, RendezvousRestart, PodsFailedTogether), or "
        "the reason the job failed with."
    )
    level: str = Field(
        "",
        description="Ladder level of its recovery: InProcess, InJob, Pod, Job or Disruption (empty for "
        "a wait or the job's end).",
    )
    action: str = Field(
        description="What the operator did: RestartedInProcess, RestartedInJob (pods untouched), Replaced "
        "(the pod replaced, a spare promoted if one stood by), ReplacedAtJobLevel, RecreatedRendezvous, "
        "Waited (condition Waiting, nothing restarted) or Failed (the job ended)."
    )
    slot: int | None = Field(None, description="Node slot where it began.")
    pod: str = Field("", description="Pod where it began.")
    node: str = Field("", description="Node that pod ran on.")
    pods: int = Field(
        1,
        description="Pods it touched: its own and the pods that echoed it (restarted with it, replaced "
        "in the same pass for the same reason, or waiting for the same reason).",
    )
    message: str = Field("", description="The evidence, truncated.", max_length=INCIDENT_MESSAGE_MAX)
    step: int | None = Field(None, description="Newest training step the pods reported when it was seen.")
    resume_step: int | None = Field(
        None,
        description="Estimated step its recovery resumed from: the step itself for an in-process restart "
        "(the ranks keep their state); the newest memory snapshot every pod held for an in-job restart; "
        "the newest peer replica every pod held for a replaced pod; at least the newest persisted "
        "checkpoint known when it recovered; at most the step the recovered pod first reported. An "
        "estimate from the heartbeats, which do not carry the step a pod resumed from.",
    )
    recovery_seconds: float | None = Field(
        None,
        description="Fault seen to its pod back in Training (heartbeat time); unset until then, and for "
        "a wait, the job's end or an incident a newer fault of the same slot superseded.",
    )
    steps_lost: int | None = Field(
        None,
        description="Estimated steps lost: step - resumeStep, once recovered (an estimate, see resumeStep).",
    )


class EventRecord(ApiModel):
    """An Event decided by a pass and not yet known to be posted (rtj.ladder.event_outbox)."""

    model_config = ConfigDict(extra="ignore")

    seq: int = Field(description="Sequence number of the Event in this job (names it).")
    type: str = Field(description="Normal or Warning.")
    reason: str = Field(description="CamelCase reason.")
    message: str = Field("", description="Human-readable message.")
    time: datetime = Field(description="When the pass decided it.")


class JobStatus(ApiModel):
    model_config = ConfigDict(extra="ignore")

    observed_generation: int | None = Field(None, description="Generation of the spec last acted on.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Current conditions.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    state: str = Field("", description="One-word summary for kubectl get (derived from conditions).")
    reason: str = Field("", description="Reason of the summary state.")
    nodes_desired: int = Field(0, description="Nodes the job wants.")
    nodes_ready: int = Field(0, description="Pods running and heartbeating.")
    restarts: RestartCounts = Field(default_factory=RestartCounts, description="Restarts per ladder level.")
    last_checkpoint: CheckpointStatus | None = Field(
        None, description="Last committed checkpoint of the job."
    )
    persist_seconds: float | None = Field(
        None,
        description="The longest any pod took to write its shard of a checkpoint to the volume "
        "(seconds; from the heartbeats; never shrinks). Sizes new pods' terminationGracePeriodSeconds "
        "(see checkpoint.persistSeconds).",
    )
    memory_snapshot_step: int | None = Field(
        None,
        description="Newest step every worker pod holds in its memory snapshot tier (an in-job restart "
        "resumes from it; checkpoint.memorySnapshotIntervalSteps). Refreshed with the slots' "
        "lastHeartbeatTime; lastCheckpoint is the newest persisted step.",
    )
    replica_step: int | None = Field(
        None,
        description="Newest memory snapshot step whose peer replica every worker pod's ranks saw "
        "committed on the next slot's pod (checkpoint.peerReplica): a replacement pod resumes from at "
        "least this step without the volume. Refreshed like memorySnapshotStep.",
    )
    node_slots: list[NodeSlotStatus] = Field(default_factory=list, description="Per-node details.")
    quarantined_nodes: list[str] = Field(default_factory=list, description="Nodes this job quarantined.")
    spares: list[SpareStatus] = Field(default_factory=list, description="Hot spares standing by.")
    lost_seconds: float = Field(
        0,
        description="Wall time during which some slot was recovering (summed when recoveries end); "
        "goodput = 1 - lostSeconds / (now - startTime).",
    )
    degraded_since: datetime | None = Field(None, description="When the ongoing recovery of some slot began.")
    rendezvous_pod_uid: str = Field(
        "", description="UID of the rendezvous pod last seen (a new UID means it was recreated)."
    )
    start_time: datetime | None = Field(None, description="When the job first ran.")
    completion_time: datetime | None = Field(None, description="When it Succeeded or Failed.")
    last_fault: FaultStatus | None = Field(None, description="The newest fault seen in any slot.")
    job_fault_time: datetime | None = Field(
        None,
        description="When the last job-level fault began (the rendezvous pod lost, pods failing "
        "together): worker failures shortly after it are recovered at job level.",
    )
    job_restart_time: datetime | None = Field(
        None, description="When the last job-level recovery was counted."
    )
    heartbeat_hold_end_time: datetime | None = Field(
        None,
        description="When the last outage hold (Degraded/HeartbeatsStale) ended: a slot last heard "
        "before then is timed from then, as no pod could renew while the heartbeat path was down.",
    )
    training_finished_time: datetime | None = Field(
        None,
        description="When a worker pod was first seen Succeeded: from then on no pod is created; a slot "
        "whose pod faults, or that has no pod, is stopped instead (rtj.ladder.training_finished).",
    )
    progress_step: int | None = Field(
        None, description="Highest training step seen (progress watchdog; refreshed coarsely)."
    )
    last_progress_time: datetime | None = Field(
        None,
        description="When progressStep last rose, or the watchdog was not armed (pods not all running).",
    )
    step: int | None = Field(
        None,
        description="Newest training step the pods reported (refreshed with the slots' lastHeartbeatTime).",
    )
    steps_per_second: float | None = Field(
        None,
        description="Training steps per second between the last two refreshes of step (unset when the "
        "step went back, e.g. a resume from an older checkpoint, or the job ended).",
    )
    incidents: list[IncidentStatus] = Field(
        default_factory=list,
        description=f"The job's last {INCIDENTS_KEPT} incidents, oldest first: each fault once however "
        "many pods echo it, with its class, evidence, action and cost (rtj.ladder.incidents).",
        max_length=INCIDENTS_KEPT,
    )
    last_event_seq: int = Field(0, description="Sequence number of the job's last Event.")
    unposted_events: list[EventRecord] = Field(
        default_factory=list,
        description="Events written with the status that decided them and not yet known to be posted "
        "(a restarted operator posts them, exactly once).",
        max_length=64,
    )


#: Longest job name: "<name>-rdzv" must be a DNS label (63).
MAX_JOB_NAME = 58


class ResilientTrainingJob(ApiModel):
    """A PyTorch training job kept alive through faults by NVRx and the operator's escalation ladder."""

    model_config = ConfigDict(
        extra="ignore",
        # Rules on the root object may read metadata.name: the rendezvous Service is <name>-rdzv
        # (a DNS-1035 label of at most 63 characters) and the name is a label value of every child.
        json_schema_extra=cel(
            (
                f"size(self.metadata.name) <= {MAX_JOB_NAME} "
                "&& self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
                f"metadata.name must be at most {MAX_JOB_NAME} characters of lowercase letters, digits and "
                "'-', starting with a letter and ending with a letter or digit (its rendezvous Service is "
                "<name>-rdzv)",
            ),
        ),
    )

    api_version: str = Field(description="API version.")
    kind: str = Field(description="Kind.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: JobSpec = Field(description="What to run and how to keep it alive.")
    status: JobStatus = Field(default_factory=JobStatus, description="What the operator observed.")


__all__ = [
    "Checkpoint",
    "CheckpointStatus",
    "Condition",
    "ConditionType",
    "EnvVar",
    "EventRecord",
    "FaultStatus",
    "FaultTolerance",
    "FsxSource",
    "InProcessRestart",
    "IncidentStatus",
    "JobSpec",
    "JobStatus",
    "NodeSlotStatus",
    "Placement",
    "PodSecurity",
    "PodState",
    "PodTemplateOverrides",
    "PvcSource",
    "ResilientTrainingJob",
    "Resources",
    "RestartCounts",
    "SeccompProfile",
    "SpareStatus",
    "Toleration",
]
