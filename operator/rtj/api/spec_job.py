"""spec: what a job runs (image, command, args, env, nodes, GPUs and ranks per node), composed with
how its pods are made (spec_pods) and how it survives faults (spec_recovery); which fields are
immutable, and which change only together with suspend.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, field_validator

from rtj.api.schema import TRIMMED_PATTERN, ApiModel, cel, immutable, immutable_optional
from rtj.api.spec_pods import SHM_MOUNT_PATH, Placement, PodTemplateOverrides, Resources
from rtj.api.spec_recovery import Checkpoint, FaultTolerance

#: Why the fields that define the training world are immutable: a replacement pod would join its
#: peers with another world (issue 13: a changed procsPerNode looped through 66 restarts).
_WORLD = (
    "a replacement pod would join its peers with a different world, and the job's checkpoints fit "
    "only the world they were written by"
)
#: Fields that change what every rank runs: only together with suspend (all pods are recreated).
_PROGRAM_FIELDS = ("command", "args", "env")

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
