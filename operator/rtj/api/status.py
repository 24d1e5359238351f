"""status: what the operator observed and did: conditions and the one-word state, restart counts
per ladder level, per-slot details (compact on the wire: rtj.api.status_slots) and per-spare
details, the newest fault, the last incidents, checkpoint and progress figures, and the Events not
yet known to be posted.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import (
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from rtj.api import status_slots
from rtj.api.schema import ApiModel
from rtj.api.status_slots import (
    NODE_SLOTS_SHOWN,
    SLOT_STATES_WITHOUT_POD,
    NodeSlotStatus,
    SlotCount,
    SlotState,
    SlotTable,
)

__all__ = [
    "INCIDENTS_KEPT",
    "INCIDENT_MESSAGE_MAX",
    "IN_MEMORY",
    "NODE_SLOTS_SHOWN",
    "SLOT_STATES_WITHOUT_POD",
    "CheckpointStatus",
    "Condition",
    "ConditionType",
    "EventRecord",
    "FaultStatus",
    "IncidentStatus",
    "JobState",
    "JobStatus",
    "NodeSlotStatus",
    "RestartCounts",
    "SlotCount",
    "SlotState",
    "SlotTable",
    "SpareStatus",
]


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


class InPlaceRestartStatus(ApiModel):
    model_config = ConfigDict(extra="ignore")

    available: bool = Field(
        False,
        description="New pods carry the restart rule (RestartAllContainers on exit code 76): every "
        "node the job's placement selects declares RestartAllContainersOnContainerExits.",
    )
    message: str = Field("", description="Why it is or is not available.")


class RestartCounts(ApiModel):
    model_config = ConfigDict(extra="ignore")

    in_process: int = Field(
        0,
        description="Level 1: in-process restart incidents. Counts incidents, not pods: one exception is 1 "
        "however many pods restart with it (their per-pod counts are in slotTable, per slot).",
    )
    in_job: int = Field(
        0,
        description="Level 2: ft_launcher in-job restart incidents, counted like inProcess; the in-job "
        "restarts a pod replacement causes on its peers are part of that replacement.",
    )
    in_place: int = Field(
        0,
        description="Level 2b: pods restarted in place on their node (faultTolerance.maxInPlaceRestarts); "
        "the in-job restarts it causes on the peers are part of it.",
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


class NodeWriteKind(StrEnum):
    QUARANTINE = "Quarantine"
    FAULT_RECORD = "FaultRecord"


class NodeWrite(ApiModel):
    """A write to a Node decided by a pass and not yet seen on the node (rtj.ladder.node_writes)."""

    model_config = ConfigDict(extra="ignore")

    kind: NodeWriteKind = Field(
        description="Quarantine: our taint with this job's evidence; FaultRecord: the pod fault in the "
        "node's record of recent faults."
    )
    node: str = Field(description="The node.")
    reason: str = Field(description="CamelCase reason of the evidence or fault.")
    message: str = Field("", description="The evidence (Quarantine).", max_length=512)
    time: datetime = Field(description="When the pass decided it (whole seconds; identifies the write).")
    until: datetime | None = Field(None, description="Quarantine: when the node is checked again.")
    boot_id: str = Field(
        "",
        description="Quarantine: the node's boot ID when the pass decided it; a node booted again since "
        "is not tainted for evidence from before its reboot.",
        max_length=128,
    )


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
    in_place_restart: InPlaceRestartStatus | None = Field(
        None,
        description="Whether the job's new pods can restart in place (level 2b), and why; pods created "
        "while it is unavailable are replaced instead.",
    )
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
    node_slots: list[NodeSlotStatus] = Field(
        default_factory=list,
        description=f"Per-slot details: every slot of a job of at most {NODE_SLOTS_SHOWN} nodes; of a "
        f"bigger one, at most {NODE_SLOTS_SHOWN} slots that are not plainly healthy (recovering, not "
        "Training, or their heartbeat Lease missing): recovering ones first, listed by slot, and "
        "every slot's bookkeeping in slotTable. Every pod's own detail is in `kubectl get pods "
        "-l training.resilient.dev/job-name=<job>` and its heartbeat Lease (named like the pod).",
    )
    node_slots_not_shown: int = Field(
        0, description="Slots that are not plainly healthy and nodeSlots leaves out (slotCounts counts all)."
    )
    slot_counts: list[SlotCount] = Field(default_factory=list, description="Slots per state.")
    slot_table: SlotTable | None = Field(
        None,
        description=f"Every slot's bookkeeping as columns (index = slot), for a job of more than "
        f"{NODE_SLOTS_SHOWN} nodes: what the operator reads back after a restart. Written by the "
        "operator, read by it; for people, nodeSlots and slotCounts.",
    )
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
    heartbeat_interval_seconds: int | None = Field(
        None,
        description="The heartbeat Lease renew period the operator gives the job's pods it creates now: "
        "faultTolerance.heartbeatIntervalSeconds, lengthened to keep all jobs within the operator's "
        "budget of heartbeat writes per second, at most a third of heartbeatTimeoutSeconds "
        "(condition HeartbeatBudgetExceeded when that bound binds). Running pods keep the period they "
        "were created with.",
    )
    training_finished_time: datetime | None = Field(
        None,
        description="When a worker pod was first seen Succeeded, or a live one's ranks Finished: from then "
        "on no pod is created; a slot whose pod faults, or that has no pod, is stopped instead "
        "(rtj.ladder.training_finished).",
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
    unapplied_node_writes: list[NodeWrite] = Field(
        default_factory=list,
        description="Quarantines and node fault records written with the status that decided them and "
        "not yet seen on their nodes (a restarted operator applies them).",
        max_length=64,
    )

    # --- the slots on the wire (rtj.api.status_slots) ----------------------------------------------
    @model_validator(mode="before")
    @classmethod
    def _slots_from_table(cls, data: Any) -> Any:
        """nodeSlots in memory: every slot, from slotTable when the status has one (else as written)."""
        if not isinstance(data, dict):
            return data
        table = data.get("slotTable", data.get("slot_table"))
        if table is None:
            return data
        slots = status_slots.decode(SlotTable.model_validate(table))
        rest = {k: v for k, v in data.items() if k not in _WIRE_ONLY}
        return {**rest, "nodeSlots": slots}

    @model_validator(mode="after")
    def _derived_counts(self) -> JobStatus:
        self.set_slots(self.node_slots)
        self.slot_table = None
        return self

    def set_slots(self, slots: list[NodeSlotStatus]) -> None:
        """nodeSlots (every slot, in memory) and what is derived from them: slotCounts, nodeSlotsNotShown."""
        self.node_slots = slots
        self.node_slots_not_shown = status_slots.shown(slots)[1]
        self.slot_counts = status_slots.counts(slots)

    @model_serializer(mode="wrap")
    def _slots_to_table(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        """On the wire: slotTable holds every slot, nodeSlots only those shown (plus counts); a small
        job is written whole (every slot in nodeSlots, no slotTable)."""
        if isinstance(info.context, dict) and info.context.get(IN_MEMORY):
            return handler(self)
        picked, not_shown = status_slots.shown(self.node_slots)
        whole = status_slots.whole(self.node_slots)
        if whole:
            data = handler(self)
        else:
            data = handler(self.model_copy(update={"node_slots": [self.node_slots[i] for i in picked]}))
        if not isinstance(data, dict):
            return data

        def key(name: str) -> str:
            alias = JobStatus.model_fields[name].alias
            return alias if info.by_alias and alias else name

        data[key("node_slots_not_shown")] = not_shown
        data[key("slot_counts")] = [
            c.model_dump(mode=info.mode, by_alias=info.by_alias) for c in status_slots.counts(self.node_slots)
        ]
        table = None if whole else status_slots.encode(self.node_slots)
        data[key("slot_table")] = table and table.model_dump(mode=info.mode, by_alias=info.by_alias)
        return data


#: model_dump(context={IN_MEMORY: True}): every slot in nodeSlots, no slotTable (a copy in memory).
IN_MEMORY = "rtj.inMemory"
#: Keys of the status that the validator derives from slotTable (their written values are not read).
_WIRE_ONLY = frozenset(
    {"nodeSlots", "node_slots", "slotTable", "slot_table", "slotCounts", "slot_counts"}
    | {"nodeSlotsNotShown", "node_slots_not_shown"}
)
