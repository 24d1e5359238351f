"""Policy: a node's quarantine and its fault record, as patches of the Node (pure; rtj.kube sends them).

A quarantine is the node's, not a job's (rtj.ladder.blame decides when there is evidence):
- one taint, QUARANTINE_TAINT_KEY=<reason>:NoSchedule, whichever job found the evidence first;
- QUARANTINE_ANNOTATION records every job's evidence and when the node is checked again (`until`,
  pushed back by each new piece of evidence);
- at `until` the operator reviews the node (`review`): Ready, no unhealthy condition and every GPU
  allocatable lifts it; otherwise it is checked again a quarantine period later. An admin lifts it
  with `kubectl taint node <node> training.resilient.dev/quarantined-`; the record goes with the taint.
Deleting a job never lifts a quarantine. Nothing lifts one once the operator is uninstalled:
docs/fault-classes.md gives the one command that does.

The same node failing pods of different jobs is evidence too: each job's pod faults without node
evidence are recorded on the node (NODE_FAULTS_ANNOTATION, entries older than
NODE_FAULT_WINDOW_SECONDS dropped), and blame.repeated_on_node reads that record.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from rtj import contract, reasons
from rtj.ladder import blame
from rtj.ladder.observe import NodeObs

#: Evidence entries kept per quarantine (the newest).
MAX_EVIDENCE = 8
#: Fault records kept per node (the newest).
MAX_FAULTS = 16


def _meta(obj: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    meta = obj.get("metadata") or {}
    taints = [t for t in (obj.get("spec") or {}).get("taints") or [] if isinstance(t, dict)]
    return taints, dict(meta.get("annotations") or {}), str(meta.get("resourceVersion", ""))


def taint_patch(
    obj: dict[str, Any], reason: str, job: str, evidence: str, until: datetime, now: datetime
) -> dict[str, Any] | None:
    """The merge patch that quarantines the node (or adds this job's evidence to its quarantine); None
    when the node shows this evidence already (the same job and time: rtj.ladder.node_writes issues a
    write again until it sees it)."""
    taints, annotations, version = _meta(obj)
    ours = [t for t in taints if t.get("key") == contract.QUARANTINE_TAINT_KEY]
    if not ours:
        taints = [
            *taints,
            {
                "key": contract.QUARANTINE_TAINT_KEY,
                "value": reason,
                "effect": "NoSchedule",
                "timeAdded": contract.kube_time(now),
            },
        ]
    old = contract.parse_quarantine(annotations.get(contract.QUARANTINE_ANNOTATION)) if ours else None
    if old is not None and any(e.job == job and e.time == now for e in old.evidence):
        return None
    entry = contract.QuarantineEvidence(job=job, reason=reason, message=evidence[:512], time=now)
    record = contract.Quarantine(
        reason=old.reason if old is not None else reason,
        since=old.since if old is not None else now,
        until=max(until, old.until) if old is not None else until,
        evidence=((*old.evidence, entry) if old is not None else (entry,))[-MAX_EVIDENCE:],
    )
    return {
        "metadata": {
            "resourceVersion": version,
            "annotations": {contract.QUARANTINE_ANNOTATION: record.model_dump_json()},
        },
        "spec": {"taints": taints},
    }


def lift_patch(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The merge patch that lifts our quarantine (None: the node has none)."""
    taints, annotations, version = _meta(obj)
    kept = [t for t in taints if t.get("key") != contract.QUARANTINE_TAINT_KEY]
    if len(kept) == len(taints) and contract.QUARANTINE_ANNOTATION not in annotations:
        return None
    return {
        "metadata": {"resourceVersion": version, "annotations": {contract.QUARANTINE_ANNOTATION: None}},
        "spec": {"taints": kept},
    }


def extend_patch(obj: dict[str, Any], until: datetime) -> dict[str, Any] | None:
    """Push the next check of a quarantine that still has evidence to `until`."""
    _taints, annotations, version = _meta(obj)
    old = contract.parse_quarantine(annotations.get(contract.QUARANTINE_ANNOTATION))
    if old is None:
        return None
    record = old.model_copy(update={"until": until})
    return {
        "metadata": {
            "resourceVersion": version,
            "annotations": {contract.QUARANTINE_ANNOTATION: record.model_dump_json()},
        }
    }


def fault_record_patch(obj: dict[str, Any], job: str, reason: str, time: datetime) -> dict[str, Any] | None:
    """Add a pod fault to the node's record, dropping entries older than the window (None: recorded)."""
    _taints, annotations, version = _meta(obj)
    old = contract.parse_node_faults(annotations.get(contract.NODE_FAULTS_ANNOTATION))
    if any(f.job == job and f.reason == reason and f.time == time for f in old):
        return None
    window = timedelta(seconds=contract.NODE_FAULT_WINDOW_SECONDS)
    kept = [f for f in old if time - f.time <= window]
    faults = [*kept, contract.NodeFault(job=job, reason=reason, time=time)][-MAX_FAULTS:]
    return {
        "metadata": {
            "resourceVersion": version,
            "annotations": {contract.NODE_FAULTS_ANNOTATION: contract.format_node_faults(faults)},
        }
    }


@dataclass(frozen=True)
class Review:
    #: "lift", "extend" or "" (not due, or not ours).
    action: str
    message: str = ""


def review(node: NodeObs, now: datetime) -> Review:
    """At its check time, lift a quarantine the node shows no evidence for, else extend it. A taint
    without our record (an admin's, or an older operator's) is not ours to lift."""
    record = node.quarantine
    if not node.quarantined or record is None or now < record.until:
        return Review("")
    evidence = blame.node_health(node, node.name, nodes_known=True)
    if evidence is not None:
        return Review("extend", f"{evidence.reason}: {evidence.message}")
    jobs = ", ".join(sorted({e.job for e in record.evidence})) or "no job"
    return Review(
        "lift",
        f"{reasons.NODE_QUARANTINE_LIFTED}: node {node.name} quarantined since "
        f"{contract.kube_time(record.since)} ({record.reason}; evidence from {jobs}) shows no evidence now",
    )
