"""How every pod of a job is made: spec.placement (instance type, node selector, tolerations,
affinity), spec.resources (EFA devices, CPU, memory, /dev/shm) and spec.podTemplate (service account,
pod security, labels, annotations, priority class, extra volumes and mounts); and the volumes the
operator gives every pod, whose names and paths a job may not reuse.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, field_validator, model_validator

from rtj.api.instances import instance_defaults_text
from rtj.api.schema import (
    DNS_LABEL_PATTERN,
    LABEL_VALUE_PATTERN,
    MOUNT_PATH_PATTERN,
    ApiModel,
    DnsLabel,
    LabelValue,
    Quantity,
    cel,
    check_qualified_keys,
    keys_are_qualified_names,
    matches_string_schema,
    qualified_name_cel,
    string_schema,
)

#: Volumes every trainer pod has; podTemplate.volumes must not reuse their names.
SHM_VOLUME = "rtj-dshm"
SHM_MOUNT_PATH = "/dev/shm"
CHECKPOINT_VOLUME = "rtj-checkpoints"
RESERVED_VOLUMES = (SHM_VOLUME, CHECKPOINT_VOLUME)
_RESERVED_VOLUMES_CEL = "[" + ", ".join(f"'{v}'" for v in RESERVED_VOLUMES) + "]"


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
                "self.key == '' || " + qualified_name_cel("self.key"),
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


#: The well-known label an EKS node group's nodes carry with their EC2 instance type.
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"


class Placement(ApiModel):
    """Where the pods run: one pod per node of an H100 node group."""

    instance_type: str = Field(
        "p5.48xlarge",
        description="EC2 instance type of the node group (matched against node.kubernetes.io/instance-type).",
        min_length=1,
        max_length=63,
        pattern=LABEL_VALUE_PATTERN,
    )
    node_selector: Annotated[dict[str, LabelValue], AfterValidator(check_qualified_keys)] = Field(
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

    def node_labels(self) -> dict[str, str]:
        """The labels a node needs for the job's pods: its instance type and nodeSelector."""
        return {INSTANCE_TYPE_LABEL: self.instance_type, **self.node_selector}


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


#: A pod annotation's value (podTemplate.annotations).
_AnnotationValue = Annotated[str, Field(max_length=2048)]


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
    labels: Annotated[dict[str, LabelValue], AfterValidator(check_qualified_keys)] = Field(
        default_factory=dict,
        description="Extra pod labels.",
        max_length=64,
        json_schema_extra=keys_are_qualified_names("podTemplate.labels"),
    )
    # 64 values of 2 KiB and their keys stay well under the API server's 256 KiB for all annotations.
    annotations: Annotated[dict[str, _AnnotationValue], AfterValidator(check_qualified_keys)] = Field(
        default_factory=dict,
        description="Extra pod annotations (values of at most 2048 characters).",
        max_length=64,
        json_schema_extra=keys_are_qualified_names("podTemplate.annotations"),
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
                    "name": string_schema("Volume name.", DNS_LABEL_PATTERN, 63),
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
                    "name": string_schema("Name of the volume to mount.", DNS_LABEL_PATTERN, 63),
                    "mountPath": string_schema("Absolute path in the container.", MOUNT_PATH_PATTERN, 1024),
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
            if not matches_string_schema(name, DNS_LABEL_PATTERN, 63):
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
            if not matches_string_schema(name, DNS_LABEL_PATTERN, 63):
                raise ValueError(f"volumeMounts[{i}].name must be a DNS label of at most 63 characters")
            if not matches_string_schema(path, MOUNT_PATH_PATTERN, 1024):
                raise ValueError(f"volumeMounts[{i}].mountPath must be an absolute path without ':'")
            if path in seen:
                raise ValueError(f"volumeMounts[{i}].mountPath {path!r} is used twice")
            seen.add(path)
        return mounts
