"""ResilientTrainingJob spec and status as pydantic models: the names the rest of the code imports.

These models are the one source of truth: `python -m rtj.api.crdgen` turns them into the CRD
(descriptions become `kubectl explain` docs; `json_schema_extra` carries CEL rules), and the
operator parses every object it reads through them. Wire names are camelCase (aliases).

They live in the modules of this package, each a part a reader can hold:
- `rtj.api.schema`: the base model, CEL and immutability rules, string types and their patterns
- `rtj.api.spec_job`: JobSpec (image, command, env, nodes, ...), composed of
  - `rtj.api.spec_pods`: placement, resources, podTemplate and the volumes every pod has
  - `rtj.api.spec_recovery`: checkpoint and faultTolerance (the escalation ladder's budgets)
- `rtj.api.status`: JobStatus, its conditions, states, slots, incidents and Events
- `rtj.api.resource`: ResilientTrainingJob, the object that holds spec and status
"""

from __future__ import annotations

from rtj.api.resource import ResilientTrainingJob
from rtj.api.schema import qualified_name_error
from rtj.api.spec_job import EnvVar, JobSpec
from rtj.api.spec_pods import (
    CHECKPOINT_VOLUME,
    RESERVED_VOLUMES,
    SHM_MOUNT_PATH,
    SHM_VOLUME,
    TRAINER_IMAGE_GID,
    Placement,
    PodSecurity,
    PodTemplateOverrides,
    Resources,
    SeccompProfile,
    Toleration,
)
from rtj.api.spec_recovery import Checkpoint, FaultTolerance, FsxSource, InProcessRestart, PvcSource
from rtj.api.status import (
    IN_MEMORY,
    INCIDENT_MESSAGE_MAX,
    INCIDENTS_KEPT,
    SLOT_STATES_WITHOUT_POD,
    CheckpointStatus,
    Condition,
    ConditionType,
    EventRecord,
    FaultStatus,
    IncidentStatus,
    InPlaceRestartStatus,
    JobState,
    JobStatus,
    NodeSlotStatus,
    NodeWrite,
    NodeWriteKind,
    RestartCounts,
    SlotCount,
    SlotState,
    SlotTable,
    SpareStatus,
)
from rtj.contract import PodState

__all__ = [
    "CHECKPOINT_VOLUME",
    "INCIDENTS_KEPT",
    "INCIDENT_MESSAGE_MAX",
    "IN_MEMORY",
    "RESERVED_VOLUMES",
    "SHM_MOUNT_PATH",
    "SHM_VOLUME",
    "SLOT_STATES_WITHOUT_POD",
    "TRAINER_IMAGE_GID",
    "Checkpoint",
    "CheckpointStatus",
    "Condition",
    "ConditionType",
    "EnvVar",
    "EventRecord",
    "FaultStatus",
    "FaultTolerance",
    "FsxSource",
    "InPlaceRestartStatus",
    "InProcessRestart",
    "IncidentStatus",
    "JobSpec",
    "JobState",
    "JobStatus",
    "NodeSlotStatus",
    "NodeWrite",
    "NodeWriteKind",
    "Placement",
    "PodSecurity",
    "PodState",
    "PodTemplateOverrides",
    "PvcSource",
    "ResilientTrainingJob",
    "Resources",
    "RestartCounts",
    "SeccompProfile",
    "SlotCount",
    "SlotState",
    "SlotTable",
    "SpareStatus",
    "Toleration",
    "qualified_name_error",
]
