"""How a job survives faults: spec.checkpoint (the volume, an existing PVC or an FSx for Lustre file
system; the cadence; the memory tier and its peer replica) and spec.faultTolerance (heartbeats, hang
detection and the budget of each level of the escalation ladder).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field, model_validator

from rtj.api.schema import (
    MOUNT_PATH_PATTERN,
    ApiModel,
    DnsLabel,
    PositiveQuantity,
    cel,
    immutable,
    immutable_optional,
)
from rtj.api.spec_pods import SHM_MOUNT_PATH
from rtj.contract import (
    DEFAULT_CHECKPOINT_INTERVAL_STEPS,
    DEFAULT_CHECKPOINTS_TO_KEEP,
    DEFAULT_DO_NOT_RESTART_EXIT_CODES,
    DEFAULT_HANG_DETECTION_FLOOR_SECONDS,
    DEFAULT_HANG_DETECTION_MEDIAN_MULTIPLE,
    DEFAULT_INPROCESS_HARD_TIMEOUT_SECONDS,
    DEFAULT_INPROCESS_MAX_RESTARTS,
    DEFAULT_INPROCESS_SOFT_TIMEOUT_SECONDS,
)

#: Why the checkpoint volume and its mountPath are immutable.
_STORAGE = "the job's checkpoints are there: a replacement pod would resume from elsewhere than its peers"


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
        DEFAULT_CHECKPOINT_INTERVAL_STEPS,
        description="Save a checkpoint every this many training steps.",
        ge=1,
        le=10_000_000,
    )
    keep: int = Field(
        DEFAULT_CHECKPOINTS_TO_KEEP, description="How many committed checkpoints to keep.", ge=1, le=100
    )

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
    memory_snapshot_gpu_staging: bool = Field(
        True,
        description="true: each memory snapshot is staged on the GPU when, after the first step, it has "
        "room for a copy of the rank's state: one device-to-device copy, and the step never waits for "
        "the host; a rank that then runs out of GPU memory gives the copy back and goes on with pinned "
        "host memory. false: always copied into pinned host memory; no extra GPU memory (for a job "
        "whose GPU memory use grows after the first step, e.g. an evaluation with larger activations).",
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
        DEFAULT_INPROCESS_SOFT_TIMEOUT_SECONDS,
        description="A rank silent this long is considered hung and asked to restart in-process.",
        ge=1,
        le=86400,
    )
    hard_timeout_seconds: int = Field(
        DEFAULT_INPROCESS_HARD_TIMEOUT_SECONDS,
        description="A hung rank still silent this long is killed; the launcher takes over.",
        ge=2,
        le=86400,
    )
    max_restarts: int = Field(
        DEFAULT_INPROCESS_MAX_RESTARTS,
        description="In-process restarts allowed per launcher cycle before escalating.",
        ge=0,
        le=10000,
    )


class HangDetection(ApiModel):
    """Hang budgets each rank learns from its own section times, under in-process restart."""

    enabled: bool = Field(
        True,
        description="Learn a budget per section (start-up, step, checkpoint) from the rank's own times: a "
        "rank silent longer than max(floorSeconds, medianMultiple x that section's running median) is "
        "aborted and restarted in-process; at most inProcessRestart.softTimeoutSeconds, which applies "
        "alone when off or until 5 durations of a section were seen.",
    )
    floor_seconds: int = Field(
        DEFAULT_HANG_DETECTION_FLOOR_SECONDS,
        description="The shortest learned budget, in seconds.",
        ge=1,
        le=86400,
    )
    median_multiple: int = Field(
        DEFAULT_HANG_DETECTION_MEDIAN_MULTIPLE,
        description="A section's budget is this many times its running median duration (at least "
        "floorSeconds).",
        ge=2,
        le=10000,
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
    hang_detection: HangDetection = Field(
        default_factory=HangDetection,
        description="Learned per-section hang budgets: a stalled step is caught in seconds and "
        "recovered in-process.",
    )
    max_in_job_restarts: int = Field(
        3, description="Level 2: ft_launcher in-job restarts per pod before the pod fails.", ge=0, le=1000
    )
    max_in_place_restarts: int = Field(
        2,
        description="Level 2b: in-place restarts per pod (the kubelet restarts every container of the pod "
        "on its node, its memory snapshots kept) when its in-job budget is spent on a node with no "
        "evidence against it; then the pod is replaced. Used where the nodes declare "
        "RestartAllContainersOnContainerExits (Kubernetes 1.35+; status.inPlaceRestart says); 0: never.",
        ge=0,
        le=100,
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
