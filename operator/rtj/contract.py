"""The operator <-> trainer contract, written once and imported by both sides.

Every item says who writes it and who reads it. Only the standard library and pydantic are
imported here, so the trainer image can import this module without kopf, and the operator
without torch.

Channels:
- Pod labels and annotations: written by the operator's pod builder, read by the operator's
  index (and by users with `kubectl get pods -l ...`).
- The `RTJ_TRAINER_CONFIG` environment variable: a `TrainerConfig` as JSON, written by the
  operator's pod builder, read by the trainer entrypoint. Downward-API variables carry the pod's
  identity.
- The heartbeat Lease (`coordination.k8s.io/v1`, one per pod, named like the pod, owned by the
  pod so garbage collection removes it, labelled `LABEL_JOB=<job name>`: the operator selects
  Leases by that label): written by the trainer's heartbeat agent, read by the operator.
  `spec.renewTime` is the heartbeat; the `HEARTBEAT_ANNOTATION` holds a `Heartbeat`.
- The pod's exit code: written by the trainer entrypoint, read by the operator's ladder.
- Inside the pod, each rank's status file `<RTJ_STATUS_DIR>/rank-<LOCAL_RANK>.json`: a `RankReport`,
  written by the rank's `rtj_trainer.report.RankReporter`, read by the pod's heartbeat agent, which
  folds the ranks' reports into the Lease's `Heartbeat`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

API_GROUP = "training.resilient.dev"
API_VERSION = "v1alpha1"
KIND = "ResilientTrainingJob"
PLURAL = "resilienttrainingjobs"
SINGULAR = "resilienttrainingjob"
SHORT_NAME = "rtj"

# --- Labels (writer: operator pod/service builders; reader: operator index, users) ---------------
LABEL_JOB = f"{API_GROUP}/job-name"
#: Node slot of a worker pod: "0".."nodes-1". Spares carry no slot until promoted.
LABEL_SLOT = f"{API_GROUP}/node-slot"
#: Attempt number of the pod in its slot; the pod name encodes it too, and restart counts are
#: derived from it, so a crash between two API calls cannot double-count.
LABEL_ATTEMPT = f"{API_GROUP}/attempt"
LABEL_ROLE = f"{API_GROUP}/role"
ROLE_WORKER = "worker"
ROLE_SPARE = "spare"
ROLE_RENDEZVOUS = "rendezvous"
#: Label of a hot spare's index. Reader: operator ladder (observe).
LABEL_SPARE_INDEX = f"{API_GROUP}/spare-index"
#: Label on the cluster-scoped FSx PV naming the job's namespace (the job name is LABEL_JOB). Writer:
#: the operator's PV builder; readers: the operator's delete handler and `rtj.uninstall`, which delete a
#: PV only when these two labels name the job (whatever the PV's name), and users (`kubectl get pv -l`).
LABEL_JOB_NAMESPACE = f"{API_GROUP}/job-namespace"

# --- The job's finalizer (writer: kopf in the operator; removers: kopf, rtj.uninstall) -------------
#: kopf's finalizer (rtj.handlers: settings.persistence.finalizer), put only on jobs holding what
#: garbage collection cannot remove (their FSx PV: rtj.handlers.holds_cluster_state). kopf removes it
#: once the delete handler deleted that PV; `python -m rtj uninstall-cleanup` (rtj.uninstall) removes
#: it from every job when the operator is uninstalled.
FINALIZER = f"{API_GROUP}/cleanup"

# --- Pods (writer: operator pod builders and spare promotion; reader: operator ladder) ------------
#: The training container's name in worker and spare pods (its status is the pod's outcome).
TRAINER_CONTAINER = "trainer"
#: Pod annotation naming why the pod was created (Initial, Resume, or the fault reason it replaces):
#: a pod created for a fault counts as one reschedule even if the status write that recorded it was lost.
CAUSE_ANNOTATION = f"{API_GROUP}/cause"
#: CAUSE_ANNOTATION of a hot spare (until promotion names the fault it replaces) and of the rendezvous pod.
CAUSE_HOT_SPARE = "HotSpare"
CAUSE_RENDEZVOUS = "Rendezvous"

# --- Node quarantine (writer: operator; reader: scheduler via the pods' anti-affinity, users) -----
#: Taint key (effect NoSchedule) put on a node the operator quarantined on evidence against the
#: node (rtj.ladder.blame); its value is the evidence's reason (e.g. NodeUnhealthy). The quarantine
#: is the node's, not a job's: lifted by a decision about the node (rtj.ladder.quarantine), never
#: by deleting a job.
QUARANTINE_TAINT_KEY = f"{API_GROUP}/quarantined"
#: Annotation on a quarantined node: a `Quarantine` as JSON (why, since, until, every job's evidence).
QUARANTINE_ANNOTATION = f"{API_GROUP}/quarantine"
#: Annotation on a node: the recent pod faults of our jobs there that carried no evidence against
#: the node (`NodeFault` list as JSON). The same node failing pods of different jobs within
#: NODE_FAULT_WINDOW_SECONDS is evidence against it (rtj.ladder.blame.repeated_on_node).
NODE_FAULTS_ANNOTATION = f"{API_GROUP}/recent-faults"
NODE_FAULT_WINDOW_SECONDS = 3600
#: Node conditions whose status False says the node's hardware or OS is unhealthy: the EKS node
#: monitoring agent's (which EKS node auto repair acts on) and the kubelet's own.
NODE_HEALTH_CONDITIONS = frozenset(
    {"AcceleratedHardwareReady", "NetworkingReady", "StorageReady", "KernelReady", "ContainerRuntimeReady"}
)
#: Node conditions whose status True reports a problem (node-problem-detector's permanent ones and
#: the GPU problem conditions of NVIDIA's and EKS's detectors).
NODE_PROBLEM_CONDITIONS = frozenset(
    {"KernelDeadlock", "ReadonlyFilesystem", "GPUProblem", "XidError", "NVLinkError", "EFAProblem"}
)
#: The extended resource whose allocatable count dropping below capacity means a GPU was lost.
GPU_RESOURCE = "nvidia.com/gpu"

# --- Environment (writer: operator pod builder; reader: trainer entrypoint) ------------------------
ENV_TRAINER_CONFIG = "RTJ_TRAINER_CONFIG"
ENV_POD_NAME = "RTJ_POD_NAME"  # downward API: metadata.name
ENV_POD_UID = "RTJ_POD_UID"  # downward API: metadata.uid (owner reference of the Lease)
ENV_NAMESPACE = "RTJ_NAMESPACE"  # downward API: metadata.namespace
ENV_NODE_NAME = "RTJ_NODE_NAME"  # downward API: spec.nodeName
ENV_POD_IP = "RTJ_POD_IP"  # downward API: status.podIP
#: Where ranks write their status files for the heartbeat agent (written by the entrypoint for
#: its ranks; read by rtj_trainer's rank reporter). A pod-local directory.
ENV_STATUS_DIR = "RTJ_STATUS_DIR"
#: Seconds the entrypoint gives ranks between SIGTERM and SIGKILL on a graceful stop (a last
#: checkpoint). Written by the operator's pod builder (a margin under the pod's
#: terminationGracePeriodSeconds, so the kubelet never kills first); read by the entrypoint.
ENV_GRACEFUL_STOP_SECONDS = "RTJ_GRACEFUL_STOP_SECONDS"
#: The pod's terminationGracePeriodSeconds (written by the pod builder): when the kubelet's SIGKILL
#: comes. After its ranks exit, the entrypoint persists their emergency snapshots until just before
#: it (rtj_trainer.checkpoint.handoff); absent: until ENV_GRACEFUL_STOP_SECONDS.
ENV_TERMINATION_GRACE_SECONDS = "RTJ_TERMINATION_GRACE_SECONDS"
#: In-place restarts this pod may take (ExitCode.RESTART_IN_PLACE), written by the pod builder only
#: on a pod that carries the restart rule; absent or 0: the pod cannot restart in place (its in-job
#: budget spent is ExitCode.LAUNCHER_BUDGET_EXHAUSTED, a replacement). The entrypoint counts the
#: pod's container starts in its memory volume (it survives an in-place restart).
ENV_MAX_IN_PLACE_RESTARTS = "RTJ_MAX_IN_PLACE_RESTARTS"
#: The Node feature (status.declaredFeatures) a kubelet declares when it restarts all of a pod's
#: containers on a RestartAllContainers rule; the scheduler only places such pods there.
RESTART_ALL_CONTAINERS_FEATURE = "RestartAllContainersOnContainerExits"

# --- Heartbeat Lease (writer: trainer heartbeat agent; reader: operator) ---------------------------
HEARTBEAT_ANNOTATION = f"{API_GROUP}/heartbeat"
#: Labels the heartbeat agent MUST put on its Lease (writer: trainer heartbeat agent, copying the
#: values from its TrainerConfig/pod; reader: the operator's watch, which selects Leases by
#: LABEL_JOB so it never watches the cluster's other Leases, e.g. kubelet node leases).
LEASE_LABELS = (LABEL_JOB,)
#: Hot-spare promotion signal, on a spare pod's Lease (writer: operator; reader: the spare's
#: heartbeat agent, on its next renewal). Value: the node slot ("0".."nodes-1") the spare takes
#: over. A standby trainer (TrainerConfig.standby) starts ft_launcher and joins the rendezvous
#: only once this annotation is present; the agent must preserve it when renewing the Lease
#: (update with a merge patch or copy unknown annotations back).
ASSIGNED_SLOT_ANNOTATION = f"{API_GROUP}/assigned-slot"
#: Fencing (writer: operator; reader: the pod's heartbeat agent, on its next renewal): set on the
#: Lease of a pod that is no longer its slot's current attempt (its pod was replaced, e.g. on a node
#: whose kubelet stopped while the containers kept running). Value: why. The agent stops its ranks at
#: once (no save: the job has moved on) and the pod exits with ExitCode.FENCED. A Lease recreated
#: after it vanished is owned by the job, not by the (maybe deleted) pod, so that garbage
#: collection cannot remove it before the operator has fenced it.
FENCED_ANNOTATION = f"{API_GROUP}/fenced"
#: lastState.terminated.reason of every container of a pod its kubelet restarted in place
#: (RestartAllContainers removes the old containers: the exit code that asked for it, and an
#: OOMKilled reason, are not kept; Kubernetes 1.37).
RESTARTING_ALL_CONTAINERS_REASON = "RestartingAllContainers"
#: Renew period (writer: the operator's heartbeat budget, rtj.ladder.heartbeat_budget; reader: the
#: pod's heartbeat agent, on its next renewal): the seconds between renewals the operator asks of a
#: running pod once the budget's period for its job differs from the one the pod was created with
#: (TrainerConfig.heartbeatIntervalSeconds), so pods created before other jobs also keep the cluster
#: within the budget. The agent renews this often from then on (its Lease's duration 3 x as long).
RENEW_PERIOD_ANNOTATION = f"{API_GROUP}/renew-seconds"
#: Reachability probe (writer: the operator's partition policy, rtj.ladder.partition; reader: the
#: pod's heartbeat agent, on its next renewal): JSON {"id": str, "peers": {"<slot>": "host:port"}},
#: the reach endpoints (Heartbeat.reachEndpoint) of the peer pods this pod is to try. The agent
#: connects to each once (REACH_PROBE_TIMEOUT_SECONDS), reads REACH_BANNER, and publishes what it
#: found in its next heartbeat (Heartbeat.reach, with the same id) without waiting for the period.
REACH_PROBE_ANNOTATION = f"{API_GROUP}/reach-probe"
#: What a pod's reach responder (rtj_trainer.reach) sends on every connection: a peer that reads it
#: has a working path both ways, not only a TCP handshake.
REACH_BANNER = b"rtj-reach/1\n"
REACH_PROBE_TIMEOUT_SECONDS = 2.0
#: Peers each pod probes at most: its ring neighbours (slots s-k..s+k, k = half of this), so a
#: probe costs O(1) per pod and each slot is judged by up to this many peers, whatever the job's size.
REACH_MAX_PEERS = 8
#: Longest renew period accepted from RENEW_PERIOD_ANNOTATION (heartbeatIntervalSeconds' maximum).
MAX_RENEW_PERIOD_SECONDS = 300
#: Renew period of a standby hot spare's Lease, whatever TrainerConfig.heartbeatIntervalSeconds
#: says: how fast it sees its promotion (writer: the spare's heartbeat agent, renewing this often;
#: reader: the operator's heartbeat budget, rtj.ladder.heartbeat_budget, which counts each standby
#: spare as 1 / this many Lease writes per second).
STANDBY_RENEW_SECONDS = 0.5
#: Upper bound on counters and steps accepted from a Lease; larger values are malformed.
MAX_COUNTER = 2**53
#: Upper bound on a persist time accepted from a Lease (a day); larger values are malformed.
MAX_PERSIST_SECONDS = 86400.0


# --- Spec defaults a rank reads without the operator (writer: rtj.api; reader: RankEnv.from_env) -----
#: The job spec's defaults (rtj.api.spec_recovery) of what the entrypoint passes to every rank. A
#: script run outside a pod (no RTJ_* variables) gets the same values from RankEnv.from_env.
DEFAULT_CHECKPOINT_INTERVAL_STEPS = 100
DEFAULT_CHECKPOINTS_TO_KEEP = 2
DEFAULT_INPROCESS_SOFT_TIMEOUT_SECONDS = 60
DEFAULT_INPROCESS_HARD_TIMEOUT_SECONDS = 90
DEFAULT_INPROCESS_MAX_RESTARTS = 10
#: Learned hang budgets (rtj_trainer.hang_timeouts): max(floor, multiple x a section's median).
DEFAULT_HANG_DETECTION_FLOOR_SECONDS = 5
DEFAULT_HANG_DETECTION_MEDIAN_MULTIPLE = 20


# --- Exit codes (writer: trainer entrypoint; reader: operator ladder) ------------------------------
class ExitCode:
    SUCCEEDED = 0
    #: The launcher's in-job restart budget is spent: the pod is a hard fault, replace it.
    LAUNCHER_BUDGET_EXHAUSTED = 70
    #: The trainer config was invalid: retrying cannot help.
    CONFIG_ERROR = 78
    #: NVRx's "do not restart" (no progress across restart cycles).
    DO_NOT_RESTART = 93
    #: Stopped by SIGTERM (deletion, suspend) after a graceful stop.
    TERMINATED = 143
    #: Fenced: the operator replaced this pod (FENCED_ANNOTATION on its Lease); it stopped itself.
    FENCED = 75
    #: Restart this pod in place: the launcher's in-job budget is spent (or the launcher itself
    #: failed) on a pod whose node shows no evidence against it and which has in-place restarts left
    #: (ENV_MAX_IN_PLACE_RESTARTS). The pod's restart rule (`restartPolicyRules`, action
    #: RestartAllContainers, KEP-5532) makes the kubelet restart every container of the pod on the
    #: same node with its volumes, the memory tier's /dev/shm included; the memory snapshot was
    #: committed before (the restart skips grace periods).
    RESTART_IN_PLACE = 76


DEFAULT_DO_NOT_RESTART_EXIT_CODES = (ExitCode.DO_NOT_RESTART, ExitCode.CONFIG_ERROR)


class PodState(StrEnum):
    """What a pod reports it is doing (Heartbeat.state)."""

    STARTING = "Starting"
    TRAINING = "Training"
    IN_PROCESS_RESTARTING = "InProcessRestarting"
    IN_JOB_RESTARTING = "InJobRestarting"
    CHECKPOINTING = "Checkpointing"
    FINISHED = "Finished"
    #: The pod's last heartbeat after its SIGTERM: its ranks stopped gracefully (after committing
    #: what the grace allowed) and the pod is exiting; not finished, and not restarting its ranks.
    STOPPED = "Stopped"
    #: A hot spare started ahead of need, heartbeating, not in the rendezvous (TrainerConfig.standby).
    STANDBY = "Standby"


class FaultSeverity(StrEnum):
    #: Recovered below the pod level (in-process or in-job restart); informational.
    SOFT = "Soft"
    #: The pod knows it cannot recover (e.g. a GPU/EFA error): the operator replaces it.
    HARD = "Hard"
    #: No restart anywhere can help (a checkpoint written for another world size, a bad config):
    #: deterministic, so the trainer stops restarting and the operator fails the job on the first
    #: report (reason PermanentFault), replacing nothing and quarantining no node. Writer:
    #: rtj_trainer for a `rtj_trainer.permanent.PermanentError`; reader: the operator's ladder.
    PERMANENT = "Permanent"


#: Severity order (the more severe fault of a pod is the one its heartbeat carries).
FAULT_SEVERITY_RANK = {FaultSeverity.SOFT: 0, FaultSeverity.HARD: 1, FaultSeverity.PERMANENT: 2}


class FaultReason(StrEnum):
    """The `Fault.reason`s the trainer runtime reports (writer: rtj_trainer; reader: the operator,
    which shows them in status.lastFault and its Events). A training script may report reasons of
    its own, and a rank's `PermanentError` reports its class name (e.g. `WorldSizeMismatch`)."""

    #: In-process restart: the rank where the fault began.
    RANK_EXCEPTION = "RankException"
    #: In-process restart: a rank whose collectives broke because another rank failed, or that the
    #: job's restart stopped before they did (collateral).
    PEER_FAILURE = "PeerFailure"
    #: In-process restart: the rank made no progress within its hang budget (rtj_trainer.hang_timeouts).
    RANK_HANG = "RankHang"
    #: The launcher lost the job's rendezvous and is started again in the same pod (Soft).
    RENDEZVOUS_LOST = "RendezvousLost"
    #: The launcher's in-job restart budget is spent (Hard; exit code 70).
    LAUNCHER_BUDGET_EXHAUSTED = "LauncherBudgetExhausted"
    #: The same, on a pod that restarts in place instead (Soft; exit code 76).
    RESTARTING_IN_PLACE = "RestartingInPlace"
    #: NVRx saw no progress across restart cycles, or a doNotRestartExitCode (Soft; exit code 93).
    NO_PROGRESS = "NoProgress"
    #: A checkpoint shard could not be written: the volume is full (ENOSPC, EDQUOT), or another error.
    CHECKPOINT_STORAGE_FULL = "CheckpointStorageFull"
    CHECKPOINT_WRITE_FAILED = "CheckpointWriteFailed"
    #: The ranks could not agree to commit a checkpoint; it is abandoned, the previous one stays.
    CHECKPOINT_COMMIT_ABANDONED = "CheckpointCommitAbandoned"
    MEMORY_SNAPSHOT_FAILED = "MemorySnapshotFailed"
    #: A rank's process ended while starting or training without reporting a fault of its own:
    #: killed by a signal (NVRx's hang detection, the OOM killer, a person) or an exit code (Soft:
    #: the launcher restarts the workers). Written by the pod's heartbeat agent.
    RANK_EXITED = "RankExited"
    #: A rank its launcher stopped (SIGTERM) to restart the workers after a fault elsewhere.
    RANK_STOPPED = "RankStopped"
    #: Ranks the kernel killed for the container's own memory limit (its memory cgroup counted the
    #: kills): Permanent, the job's sizing; no restart helps and no node is blamed.
    CONTAINER_OOM_KILLED = "ContainerOOMKilled"
    #: A rank saw an error of its node's hardware (a CUDA device error, an NCCL/EFA transport
    #: error, an Xid): reported Hard, it is evidence against the node (the operator quarantines it).
    HARDWARE_ERROR = "HardwareError"


#: Fault reasons that are consequences of a fault elsewhere: a pod's heartbeat carries the root cause.
COLLATERAL_FAULT_REASONS = frozenset({FaultReason.PEER_FAILURE, FaultReason.RANK_STOPPED})
#: Pod-reported fault reasons that are evidence against the pod's node (a training script may
#: report its own, e.g. GpuXid, with these words in them: see is_hardware_fault).
HARDWARE_FAULT_REASONS = frozenset(
    {FaultReason.HARDWARE_ERROR, "GpuXid", "XidError", "EccError", "NvlinkError"}
)


def is_hardware_fault(reason: str) -> bool:
    return reason in HARDWARE_FAULT_REASONS


Counter = Annotated[int, Field(ge=0, le=MAX_COUNTER)]


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)


class Fault(_Model):
    """A fault the pod classified itself."""

    severity: FaultSeverity
    reason: str = Field(
        max_length=128,
        description="CamelCase: a FaultReason, or one of the training script's own (e.g. GpuXid).",
    )
    message: str = Field(default="", max_length=1024)
    time: datetime


class CheckpointRef(_Model):
    """The last committed checkpoint the pod knows of (committed = complete and atomic)."""

    step: Counter
    time: datetime


class ReachReport(_Model):
    """What a pod's agent found when it probed the peers REACH_PROBE_ANNOTATION named."""

    #: The probe's id (REACH_PROBE_ANNOTATION's "id"): a report answers one request.
    probe: str = Field(max_length=64)
    #: Slots whose reach endpoint answered, and those that did not (refused, timed out, no banner).
    reached: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=REACH_MAX_PEERS)
    unreachable: list[Annotated[int, Field(ge=0)]] = Field(default_factory=list, max_length=REACH_MAX_PEERS)
    time: datetime


class Heartbeat(_Model):
    """The JSON held in the Lease's HEARTBEAT_ANNOTATION."""

    state: PodState
    in_process_restarts: Counter = Field(0, alias="inProcessRestarts")
    in_job_restarts: Counter = Field(0, alias="inJobRestarts")
    step: Counter = 0
    checkpoint: CheckpointRef | None = None
    #: The newest node-local memory snapshot (TrainerConfig.memorySnapshotDir) every rank of the pod
    #: holds; an in-job restart resumes from it. Reader: the operator (status.memorySnapshotStep).
    memory_snapshot_step: Counter | None = Field(None, alias="memorySnapshotStep")
    #: The newest memory snapshot whose peer replica (TrainerConfig.peerReplicaPort) every rank of the
    #: pod has seen committed by the pod holding it. Reader: the operator (status.replicaStep).
    replica_step: Counter | None = Field(None, alias="replicaStep")
    #: The longest a rank of the pod took to write its shard of a checkpoint to the volume
    #: (seconds). Reader: the operator, which sizes new pods' terminationGracePeriodSeconds with it.
    persist_seconds: float | None = Field(None, alias="persistSeconds", ge=0, le=MAX_PERSIST_SECONDS)
    #: Checkpoints skipped or coalesced because the previous save was still draining.
    checkpoints_skipped: Counter = Field(0, alias="checkpointsSkipped")
    fault: Fault | None = None
    #: host:port of the pod's reach responder (rtj_trainer.reach), which peers probe.
    reach_endpoint: str | None = Field(None, alias="reachEndpoint", max_length=256)
    #: The pod's answer to the newest REACH_PROBE_ANNOTATION.
    reach: ReachReport | None = None

    def to_annotation(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_none=True)


def parse_renew_period(annotations: dict[str, Any] | None) -> int | None:
    """RENEW_PERIOD_ANNOTATION's seconds; None when absent or not a period in 1..MAX_RENEW_PERIOD_SECONDS."""
    raw = (annotations or {}).get(RENEW_PERIOD_ANNOTATION)
    if not isinstance(raw, str) or not raw.strip().isdigit():
        return None
    seconds = int(raw)
    return seconds if 1 <= seconds <= MAX_RENEW_PERIOD_SECONDS else None


class ReachProbe(_Model):
    """REACH_PROBE_ANNOTATION's content: a probe request and the peers to try, by slot."""

    id: str = Field(min_length=1, max_length=64)
    peers: dict[int, str] = Field(default_factory=dict, max_length=REACH_MAX_PEERS)

    def to_annotation(self) -> str:
        return self.model_dump_json()


def parse_reach_probe(annotations: dict[str, Any] | None) -> ReachProbe | None:
    """REACH_PROBE_ANNOTATION's request; None when absent or malformed (never raises)."""
    raw = (annotations or {}).get(REACH_PROBE_ANNOTATION)
    if not isinstance(raw, str) or len(raw) > 4096:
        return None
    try:
        return ReachProbe.model_validate_json(raw)
    except (ValidationError, ValueError):
        return None


def lease_duration_seconds(renew_period_seconds: float) -> int:
    """leaseDurationSeconds of a heartbeat Lease renewed every `renew_period_seconds` (3 periods)."""
    return max(1, math.ceil(3 * renew_period_seconds))


def parse_heartbeat(annotations: dict[str, Any] | None) -> Heartbeat | None:
    """The Heartbeat in a Lease's annotations, or None when absent or malformed.

    Malformed content is never an error for the reader: a Lease is written by the workload, and
    bad content must neither crash the operator nor trigger a reschedule on its own.
    """
    raw = (annotations or {}).get(HEARTBEAT_ANNOTATION)
    if not isinstance(raw, str) or len(raw) > 16384:
        return None
    try:
        return Heartbeat.model_validate_json(raw)
    except (ValidationError, ValueError):
        return None


# --- Rank status files (writer: rtj_trainer.report.RankReporter, one per rank; reader: the pod's
# heartbeat agent, rtj_trainer.heartbeat) ---------------------------------------------------------
RANK_FILE_PREFIX = "rank-"
RANK_FILE_SUFFIX = ".json"


def rank_file_name(local_rank: int) -> str:
    """`rank-<LOCAL_RANK>.json`, in the pod-local ENV_STATUS_DIR."""
    return f"{RANK_FILE_PREFIX}{local_rank}{RANK_FILE_SUFFIX}"


# Strict: a bool or a float in a rank file is not a count.
RankCounter = Annotated[int, Field(ge=0, le=MAX_COUNTER, strict=True)]


class RankReport(BaseModel):
    """One rank's status file: what the rank is doing, rewritten atomically as it changes.

    Mutable: the writer keeps one and updates it in place. The reader never fails on a field: a
    malformed one reads as its default (the file is written by the training script's process)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    rank: RankCounter | None = None
    local_rank: RankCounter | None = Field(None, alias="localRank")
    #: The worker process; a new PID in a local rank is an in-job restart of the pod's workers.
    pid: RankCounter | None = None
    state: PodState = PodState.STARTING
    step: RankCounter | None = None
    #: Counted per worker process (a restarted worker starts from 0 again).
    in_process_restarts: RankCounter = Field(0, alias="inProcessRestarts")
    #: The launcher's TORCHELASTIC_RESTART_COUNT when the worker started.
    in_job_restarts: RankCounter = Field(0, alias="inJobRestarts")
    checkpoint: CheckpointRef | None = None
    memory_snapshot_step: RankCounter | None = Field(None, alias="memorySnapshotStep")
    #: The newest memory snapshot of this rank that the peer pod committed as its replica.
    replica_step: RankCounter | None = Field(None, alias="replicaStep")
    persist_seconds: float | None = Field(
        None, alias="persistSeconds", ge=0, le=MAX_PERSIST_SECONDS, strict=True, allow_inf_nan=False
    )
    checkpoints_skipped: RankCounter = Field(0, alias="checkpointsSkipped")
    fault: Fault | None = None
    updated: datetime | None = None
    #: When the rank last sent ft_launcher's rank monitor a heartbeat (every heartbeat rewrites the
    #: file). A rank NVRx killed as hung was silent for rankHangTimeoutSeconds since this, not since
    #: `updated`: an event write (a memory snapshot) can come after the last heartbeat.
    heartbeat: datetime | None = None

    @field_validator("*", mode="wrap")
    @classmethod
    def _malformed_reads_as_default(
        cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> Any:
        try:
            return handler(value)
        except ValidationError:
            return cls.model_fields[str(info.field_name)].get_default()

    def to_file(self) -> str:
        return self.model_dump_json(by_alias=True)


def parse_rank_report(raw: str | bytes) -> RankReport | None:
    """A rank file's content as a RankReport; None when it is not a JSON object."""
    try:
        return RankReport.model_validate_json(raw)
    except ValidationError:
        return None


# TrainerConfig: no defaults (the operator writes every field, from the job spec, whose defaults are
# the API's: rtj.api.models) but the off state of the optional features (memory tier, standby), so a
# config that does not name them (an operator older than the trainer image) runs without them; and
# bounds that make a config the trainer can run (the API's limits are narrower). Validation errors
# name the field by its JSON name.
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
PositiveCount = Annotated[int, Field(ge=1, le=MAX_COUNTER)]
ExitStatus = Annotated[int, Field(ge=1, le=255)]


class InProcessConfig(_Model):
    enabled: bool
    soft_timeout_seconds: Seconds = Field(alias="softTimeoutSeconds")
    hard_timeout_seconds: Seconds = Field(alias="hardTimeoutSeconds")
    max_restarts: Counter = Field(alias="maxRestarts")

    @model_validator(mode="after")
    def _hard_after_soft(self) -> InProcessConfig:
        if self.hard_timeout_seconds <= self.soft_timeout_seconds:
            raise ValueError("hardTimeoutSeconds must be greater than softTimeoutSeconds")
        return self


class HangDetectionConfig(_Model):
    """Per-section hang budgets learned from the job's own times (reader: RankEnv.hang_detection)."""

    enabled: bool
    floor_seconds: Seconds = Field(alias="floorSeconds")
    median_multiple: float = Field(alias="medianMultiple", ge=1, le=10000, allow_inf_nan=False)


class TrainerConfig(_Model):
    """What the trainer entrypoint needs, as the operator computed it from the job spec."""

    job_name: str = Field(alias="jobName", min_length=1)
    #: The job's UID: owner of a heartbeat Lease recreated after it vanished (FENCED_ANNOTATION).
    job_uid: str | None = Field(None, alias="jobUid", min_length=1)
    command: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    args: list[str]
    nnodes: PositiveCount
    nproc_per_node: PositiveCount = Field(alias="nprocPerNode")
    #: host:port of the job's rendezvous (a Service in front of the rendezvous pod).
    rdzv_endpoint: str = Field(alias="rdzvEndpoint", pattern=r"^[^\s:]+:[0-9]{1,5}$")
    rdzv_id: str = Field(alias="rdzvId", min_length=1)
    max_in_job_restarts: Counter = Field(alias="maxInJobRestarts")
    heartbeat_interval_seconds: Seconds = Field(alias="heartbeatIntervalSeconds")
    #: NVRx rank heartbeat timeouts (hang detection below the pod level).
    rank_hang_timeout_seconds: Seconds = Field(alias="rankHangTimeoutSeconds")
    rank_initial_timeout_seconds: Seconds = Field(alias="rankInitialTimeoutSeconds")
    in_process: InProcessConfig = Field(alias="inProcess")
    #: Learned hang budgets under in-process restart; absent (an older operator): off, the fixed
    #: soft timeout alone.
    hang_detection: HangDetectionConfig | None = Field(None, alias="hangDetection")
    checkpoint_dir: str = Field(alias="checkpointDir", min_length=1)
    checkpoint_interval_steps: PositiveCount = Field(alias="checkpointIntervalSteps")
    checkpoints_to_keep: PositiveCount = Field(alias="checkpointsToKeep")
    #: Node-local memory snapshots (writer: operator, from spec.checkpoint; reader: ranks, via
    #: RankEnv): every this many steps into memory_snapshot_dir, a memory-backed volume of the pod;
    #: in-job restarts resume from them. 0 (off) when absent; then the directory may be absent too.
    memory_snapshot_interval_steps: Counter = Field(0, alias="memorySnapshotIntervalSteps")
    memory_snapshot_dir: str | None = Field(None, alias="memorySnapshotDir", min_length=1)
    #: Stage memory snapshots on the GPU where it has room (writer: operator, from
    #: spec.checkpoint.memorySnapshotGpuStaging; reader: ranks, via RankEnv); true when absent.
    memory_snapshot_gpu_staging: bool = Field(True, alias="memorySnapshotGpuStaging")
    #: The peer replica (writer: operator, from spec.checkpoint.peerReplica; readers: the entrypoint,
    #: which serves replicas, and the ranks, via the status dir's PEER_REPLICA_FILE): slot s listens
    #: on this port + s and streams its memory snapshots to slot (s + 1) mod nnodes, on another node
    #: (replica_endpoints). 0 (the default) turns it off; it needs the memory tier.
    peer_replica_port: int = Field(0, alias="peerReplicaPort", ge=0, le=65535)
    max_no_progress_cycles: PositiveCount = Field(alias="maxNoProgressCycles")
    do_not_restart_exit_codes: list[ExitStatus] = Field(alias="doNotRestartExitCodes")
    #: Hot spare (writer: operator pod builder; reader: trainer entrypoint): heartbeat in state
    #: STANDBY and wait for ASSIGNED_SLOT_ANNOTATION on the own Lease before launching.
    standby: bool = False

    @model_validator(mode="after")
    def _memory_tier_has_a_directory(self) -> TrainerConfig:
        if self.memory_snapshot_interval_steps > 0 and self.memory_snapshot_dir is None:
            raise ValueError("memorySnapshotDir must be set when memorySnapshotIntervalSteps is above 0")
        return self

    @model_validator(mode="after")
    def _replica_ports_fit(self) -> TrainerConfig:
        if self.peer_replica_port and not 1024 <= self.peer_replica_port <= 65536 - self.nnodes:
            raise ValueError("peerReplicaPort + nnodes - 1 must be a port number from 1024 to 65535")
        return self

    @property
    def rdzv_port(self) -> int:
        """The port of rdzv_endpoint (validated: host:port)."""
        return int(self.rdzv_endpoint.rpartition(":")[2])

    def to_env(self) -> str:
        return self.model_dump_json(by_alias=True)

    @classmethod
    def from_env(cls, value: str) -> TrainerConfig:
        return cls.model_validate(json.loads(value))


# --- Pod names (writer: operator builders; reader: operator ladder, local tools) ----------------
#: A worker pod's name, `<job>-n<slot>-a<attempt>`: deterministic, so a create repeated after a
#: crash is refused as AlreadyExists instead of making a second pod.
_WORKER_POD_NAME = re.compile(r"^(?P<job>.+)-n(?P<slot>\d+)-a(?P<attempt>\d+)$")


def worker_pod_name(job: str, slot: int, attempt: int) -> str:
    return f"{job}-n{slot}-a{attempt}"


def parse_worker_pod_name(name: str) -> tuple[int, int] | None:
    """(slot, attempt) of a worker pod name, or None when the name is not one."""
    match = _WORKER_POD_NAME.match(name)
    return (int(match["slot"]), int(match["attempt"])) if match else None


def spare_pod_name(job: str, index: int, attempt: int) -> str:
    return f"{job}-spare-{index}-a{attempt}"


def rendezvous_name(job: str) -> str:
    """The rendezvous pod's and Service's name (a DNS label: the job name is at most 58 long)."""
    return f"{job}-rdzv"


# --- Peer replica (writer: operator builders, Services; readers: the trainer entrypoint and ranks) --
#: In a worker pod's status dir (ENV_STATUS_DIR): {"replicaEndpoint", "peerEndpoint"} of its slot,
#: written by the entrypoint before its ranks start (a hot spare learns its slot at promotion).
PEER_REPLICA_FILE = "peer-replica.json"


def replica_service_name(job: str, slot: int) -> str:
    """The headless Service selecting the worker pod of `slot` (whatever its attempt, a promoted
    spare included): the stable name of that slot's replica server. A DNS label (<= 63)."""
    suffix = f"-p{slot}"
    if len(job) + len(suffix) > 63:  # long job names: a prefix and a hash keep it unique
        job = f"{job[:50]}-{hashlib.sha256(job.encode()).hexdigest()[:6]}"
    return f"{job}{suffix}"


def replica_endpoints(job: str, namespace: str, slot: int, nnodes: int, base_port: int) -> tuple[str, str]:
    """(this slot's replica server, the one it replicates to: slot (s + 1) mod nnodes) as host:port;
    each slot has its own port (base + slot), so pods sharing a host (the local cluster) never clash."""
    peer = (slot + 1) % nnodes

    def endpoint(s: int) -> str:
        return f"{replica_service_name(job, s)}.{namespace}.svc:{base_port + s}"

    return endpoint(slot), endpoint(peer)


def lease_name(pod_name: str) -> str:
    """The heartbeat Lease of a pod has the pod's name."""
    return pod_name


# --- Kubernetes time formats (writers: trainer heartbeat agent, operator, local tools; reader: operator)
def micro_time(t: datetime) -> str:
    """A Kubernetes MicroTime (a Lease's renewTime/acquireTime): RFC 3339 in UTC, microseconds."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def kube_time(t: datetime) -> str:
    """A Kubernetes Time (conditions' lastTransitionTime, a taint's timeAdded, an Event's times):
    RFC 3339 in UTC, whole seconds."""
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    """A Kubernetes Time/MicroTime (or a datetime) as an aware datetime; None when absent or
    malformed (the reader never raises on what a workload wrote). A naive value is taken as UTC."""
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str) and value:
        try:
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    else:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# --- Node records (writer: operator; readers: operator, users with kubectl describe node) ----------
#: The longest boot ID a quarantine record keeps (a kubelet reports a UUID: 36 characters).
MAX_BOOT_ID = 128


class NodeFault(_Model):
    """One pod fault of one job on a node, without evidence against the node (NODE_FAULTS_ANNOTATION)."""

    job: str = Field(max_length=317, description="namespace/name of the job")
    reason: str = Field(max_length=128)
    time: datetime


class QuarantineEvidence(_Model):
    job: str = Field(max_length=317)
    reason: str = Field(max_length=128)
    message: str = Field(default="", max_length=512)
    time: datetime


class Quarantine(_Model):
    """Why a node is quarantined (QUARANTINE_ANNOTATION): recorded once, with every job's evidence."""

    # Written with the API's own name for the boot ID (`bootID`); a record without it still parses.
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True, serialize_by_alias=True)

    reason: str = Field(max_length=128)
    since: datetime
    #: When the quarantine is next checked: lifted then if the node shows no evidence, else extended.
    until: datetime
    evidence: tuple[QuarantineEvidence, ...] = ()
    #: The node's status.nodeInfo.bootID when it was first quarantined ("" unknown, or a record an
    #: earlier operator wrote): a node that booted again since and shows no evidence is lifted before
    #: `until` (rtj.ladder.quarantine.review).
    boot_id: str = Field(default="", alias="bootID", max_length=MAX_BOOT_ID)


def parse_node_faults(value: Any) -> tuple[NodeFault, ...]:
    """The node's fault record; () when absent or malformed (anyone can write a node annotation)."""
    try:
        items = json.loads(value) if isinstance(value, str) else None
        return tuple(NodeFault.model_validate(i) for i in items) if isinstance(items, list) else ()
    except (ValueError, ValidationError):
        return ()


def format_node_faults(faults: tuple[NodeFault, ...] | list[NodeFault]) -> str:
    return json.dumps([f.model_dump(mode="json") for f in faults], separators=(",", ":"))


def parse_quarantine(value: Any) -> Quarantine | None:
    try:
        return Quarantine.model_validate_json(value) if isinstance(value, str) else None
    except ValueError:
        return None
