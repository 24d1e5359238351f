"""status: the node slots, and how they are written so that a big job's status stays small.

In memory (what the ladder reads and writes) `JobStatus.nodeSlots` holds one `NodeSlotStatus` per
slot. On the wire a 512-slot job would carry 512 of them (~200 KiB, every pass), so the status is
written in two parts (`JobStatus`'s serializer and validator, rtj.api.status):

- `slotTable`: every slot's bookkeeping in columns, one per field of `NodeSlotStatus`, index = slot;
  a column is left out when every slot has that field's default, a pod named after its slot and
  attempt is written `*`, a node without the domain all nodes share, states and reasons as indexes
  into the table's `values`, times as microseconds after the table's `epoch`. Exactly what the ladder
  reads back (after an operator restart too): attempts, soft-restart counts, recoveries, nodes.
- `nodeSlots`: at most `NODE_SLOTS_SHOWN` whole entries, of the slots that are not plainly healthy
  (recovering, not Training, Lease missing), recovering ones first, then by slot, plus
  `nodeSlotsNotShown` (how many such slots are left out) and `slotCounts` (slots per state).

A job of at most `NODE_SLOTS_SHOWN` slots is written whole, as before: every slot in `nodeSlots`,
no `slotTable` (its status is small anyway, and a person sees every slot).

A status without `slotTable` (written before it existed, or a test's) is read from `nodeSlots` as
before: every entry it lists.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field

from rtj.api.schema import ApiModel


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

#: The state of a slot whose pod trains (a Checkpointing heartbeat is shown as Training too).
TRAINING = "Training"
#: Whole entries status.nodeSlots shows at most on the wire (the rest: slotTable, slotCounts).
NODE_SLOTS_SHOWN = 16


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
    in_place_restarts: int = Field(
        0, description="In-place restarts of the slot's current pod (its trainer container's restartCount)."
    )
    last_fault_reason: str = Field("", description="Reason of the last fault seen in this slot.")
    recovering_since: datetime | None = Field(
        None, description="When the slot's ongoing recovery was detected; cleared once back to Training."
    )
    recovering_level: str = Field(
        "", description="Ladder level of the ongoing recovery (InProcess, InJob, Pod)."
    )
    suspect_node: str = Field(
        "",
        description="The node the slot's pod was last replaced from for a fault not proven its own "
        "(silence, a failed start or run, a partition; not the training script's own error, not a "
        "disruption). No evidence against it: nothing tainted, nothing counted; the slot's new pods "
        "only prefer other nodes (a preferred node affinity term). The latest such node only.",
    )


class SlotCount(ApiModel):
    model_config = ConfigDict(extra="ignore")

    state: str = Field(description="A slot state (nodeSlots[].state; Unknown: not observed yet).")
    slots: int = Field(description="How many slots are in it.")


#: Columns that hold times (microseconds after SlotTable.epoch; -1: unset).
_TIME_FIELDS = ("last_heartbeat_time", "lease_missing_since", "recovering_since")
#: Columns of few distinct values, written as indexes into SlotTable.values.
_INDEXED_FIELDS = ("state", "last_fault_reason", "recovering_level")
#: A pod named `<podPrefix>-n<slot>-a<attempt>` (the name the operator gives it).
NAMED_POD = "*"
#: An unset time in a time column.
NO_TIME = -1


def _col(description: str) -> Any:
    return Field(default_factory=list, description=description)


class SlotTable(ApiModel):
    """Every node slot's bookkeeping, one column (a list, index = slot) per field of nodeSlots[]; a
    column is empty when every slot has that field's default. What the operator reads back; for
    people, nodeSlots and slotCounts."""

    model_config = ConfigDict(extra="ignore")

    size: int = Field(0, description="Number of slots (the length of every column that is not empty).")
    slot: list[int] = _col("Slot numbers, when not 0 .. size-1.")
    epoch: datetime | None = Field(None, description="The time the time columns count from.")
    pod_prefix: str = Field(
        "", description="The prefix of the pods written *: <podPrefix>-n<slot>-a<attempt>."
    )
    pod: list[str] = _col("Pod of each slot: empty for none yet, * for <podPrefix>-n<slot>-a<attempt>.")
    node_domain: str = Field(
        "", description="The domain every node name ends in, left out of node: <node>.<nodeDomain>."
    )
    node: list[str] = _col("Node of each slot's pod (without .<nodeDomain>).")
    attempt: list[int] = _col("Attempt of each slot.")
    values: list[str] = _col("The strings state, lastFaultReason and recoveringLevel index.")
    state: list[int] = _col("State of each slot (an index into values).")
    last_heartbeat_time: list[int] = _col("Last heartbeat seen, microseconds after epoch (-1: none).")
    lease_missing_since: list[int] = _col("Lease seen missing since, microseconds after epoch (-1: not).")
    in_process_restarts: list[int] = _col("In-process restarts the slot's pod reported (last seen).")
    in_job_restarts: list[int] = _col("In-job restarts the slot's pod reported (last seen).")
    in_place_restarts: list[int] = _col("In-place restarts of each slot's pod (last seen).")
    last_fault_reason: list[int] = _col("Reason of the last fault seen in each slot (an index into values).")
    recovering_since: list[int] = _col("Recovery detected, microseconds after epoch (-1: not recovering).")
    recovering_level: list[int] = _col("Ladder level of each slot's ongoing recovery (an index into values).")
    suspect_node: list[str] = _col("The node each slot's new pods prefer not to run on (empty: none).")


def _micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _named(prefix: str, slot: NodeSlotStatus) -> str:
    return f"{prefix}-n{slot.slot}-a{slot.attempt}"


def _pod_prefix(slots: list[NodeSlotStatus]) -> str:
    """The most common prefix of pods named after their slot and attempt ("" when none is)."""
    prefixes: Counter[str] = Counter()
    for s in slots:
        suffix = f"-n{s.slot}-a{s.attempt}"
        if s.pod.endswith(suffix) and len(s.pod) > len(suffix):
            prefixes[s.pod[: -len(suffix)]] += 1
    return prefixes.most_common(1)[0][0] if prefixes else ""


def _node_domain(slots: list[NodeSlotStatus]) -> str:
    """The domain (after the first dot) every node name has, when they all have the same one."""
    domains = {s.node.partition(".")[2] for s in slots if s.node}
    return next(iter(domains)) if len(domains) == 1 else ""


def encode(slots: list[NodeSlotStatus]) -> SlotTable:
    """The slots as columns; decode(encode(slots)) == slots."""
    table: dict[str, Any] = {"size": len(slots)}
    values: dict[str, int] = {}
    if any(s.slot != i for i, s in enumerate(slots)):
        table["slot"] = [s.slot for s in slots]
    times = [t for s in slots for name in _TIME_FIELDS if (t := getattr(s, name)) is not None]
    epoch = min(times) if times else None
    table["epoch"] = epoch
    for name, info in NodeSlotStatus.model_fields.items():
        if name == "slot":
            continue
        column = [getattr(s, name) for s in slots]
        if all(v == info.default for v in column):
            continue
        if name in _TIME_FIELDS:
            assert epoch is not None
            table[name] = [NO_TIME if v is None else _micros(v - epoch) for v in column]
        elif name == "pod":
            prefix = table["pod_prefix"] = _pod_prefix(slots)
            table[name] = [NAMED_POD if prefix and s.pod == _named(prefix, s) else s.pod for s in slots]
        elif name == "node":
            domain = table["node_domain"] = _node_domain(slots)
            cut = len(domain) + 1 if domain else 0
            table[name] = [v[:-cut] if cut and v else v for v in column]
        elif name in _INDEXED_FIELDS:
            table[name] = [values.setdefault(v, len(values)) for v in column]
        else:
            table[name] = column
    table["values"] = list(values)
    return SlotTable(**table)


def decode(table: SlotTable) -> list[NodeSlotStatus]:
    """The slots the table holds (a column shorter than `size` reads as defaults past its end)."""
    columns = {name: getattr(table, name) for name in NodeSlotStatus.model_fields if name != "slot"}
    out: list[NodeSlotStatus] = []
    for i in range(table.size):
        fields: dict[str, Any] = {"slot": table.slot[i] if i < len(table.slot) else i}
        for name, column in columns.items():
            if i >= len(column):
                continue
            value = column[i]
            if name in _TIME_FIELDS:
                if value == NO_TIME or table.epoch is None:
                    continue
                value = table.epoch + timedelta(microseconds=value)
            elif name in _INDEXED_FIELDS:
                value = table.values[value] if 0 <= value < len(table.values) else ""
            elif name == "node" and value and table.node_domain:
                value = f"{value}.{table.node_domain}"
            fields[name] = value
        slot = NodeSlotStatus.model_validate(fields)
        if slot.pod == NAMED_POD:
            slot.pod = _named(table.pod_prefix, slot)
        out.append(slot)
    return out


def plainly_healthy(slot: NodeSlotStatus) -> bool:
    """Training, not recovering, its Lease there: nothing a person needs to see of it."""
    return slot.state == TRAINING and slot.recovering_since is None and slot.lease_missing_since is None


def whole(slots: list[NodeSlotStatus]) -> bool:
    """A job of at most NODE_SLOTS_SHOWN slots is written whole: every slot in nodeSlots, no slotTable."""
    return len(slots) <= NODE_SLOTS_SHOWN


def shown(slots: list[NodeSlotStatus]) -> tuple[list[int], int]:
    """Indexes of the slots nodeSlots shows (every slot of a small job, else at most NODE_SLOTS_SHOWN
    that are not plainly healthy: recovering first, then by slot; listed by slot), and how many slots
    that are not plainly healthy it leaves out."""
    if whole(slots):
        return list(range(len(slots))), 0
    unhealthy = [i for i, s in enumerate(slots) if not plainly_healthy(s)]
    first = sorted(unhealthy, key=lambda i: (slots[i].recovering_since is None, slots[i].slot))
    picked = first[:NODE_SLOTS_SHOWN]
    return sorted(picked, key=lambda i: slots[i].slot), len(unhealthy) - len(picked)


def counts(slots: list[NodeSlotStatus]) -> list[SlotCount]:
    """Slots per state, by state name."""
    per_state = Counter(s.state or "Unknown" for s in slots)
    return [SlotCount(state=state, slots=n) for state, n in sorted(per_state.items())]


def every_slot(status: dict[str, Any]) -> list[dict[str, Any]]:
    """Every slot of a status as the API server returns it (nodeSlots entries, wire names): from its
    slotTable, else (written before slotTable) its nodeSlots. For readers of the raw object: tests,
    benches (the operator parses the whole status: rtj.api.status.JobStatus)."""
    table = status.get("slotTable")
    if table is None:
        return list(status.get("nodeSlots") or [])
    return [s.model_dump(by_alias=True, mode="json") for s in decode(SlotTable.model_validate(table))]
