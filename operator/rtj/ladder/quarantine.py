"""Policy: a node's quarantine and its fault record, as patches of the Node (pure; rtj.kube sends them).

A quarantine is the node's, not a job's (rtj.ladder.blame decides when there is evidence):
- one taint, QUARANTINE_TAINT_KEY=<reason>:NoSchedule, whichever job found the evidence first;
- QUARANTINE_ANNOTATION records every job's evidence and when the node is checked again (`until`,
  pushed back by each new piece of evidence);
- at `until` the operator reviews the node (`review`): Ready, no unhealthy condition and every GPU
  allocatable lifts it; otherwise it is checked again a quarantine period later. An admin lifts it
  with `kubectl taint node <node> training.resilient.dev/quarantined-`; the record goes with the taint.
- a node that booted again since it was quarantined (`rebooted`: its status.nodeInfo.bootID differs
  from the one recorded; node auto repair reboots a node in place, keeping its Node object and our
  taint) is lifted as soon as it passes the same health check, not at `until`; while it still shows
  evidence it stays quarantined, extended only at `until` like any other. A replaced node is a new
  Node object, without the taint.
Deleting a job never lifts a quarantine. Uninstalling the operator lifts every one: the chart's
post-delete hook runs `python -m rtj uninstall-cleanup` (rtj.uninstall), which applies `lift_patch`
to every node.

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
from rtj.ladder.observe import NodeObs, node_boot_id, node_from_dict

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
        boot_id=old.boot_id if old is not None else node_boot_id(obj),
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


def rebooted(node: NodeObs) -> bool:
    """The quarantined node booted again since it was quarantined: a reboot (node auto repair's,
    an admin's) or a machine re-provisioned under the same name. Its boot ID now differs from the one
    its record holds, both known; a record without one (an earlier operator's) never says so."""
    record = node.quarantine
    return (
        node.quarantined
        and record is not None
        and bool(record.boot_id)
        and bool(node.boot_id)
        and node.boot_id != record.boot_id
    )


def review(node: NodeObs, now: datetime) -> Review:
    """Lift a quarantine the node shows no evidence for, at its check time (`until`) or, once the node
    `rebooted`, at once; at `until`, extend one it still shows evidence for. Before `until` a node
    that did not boot again, or did but still shows evidence, is left as it is. A taint without our
    record (an admin's, or an older operator's) is not ours to lift."""
    record = node.quarantine
    if not node.quarantined or record is None:
        return Review("")
    due, booted = now >= record.until, rebooted(node)
    if not due and not booted:
        return Review("")
    evidence = blame.node_health(node, node.name, nodes_known=True)
    if evidence is not None:
        return Review("extend", f"{evidence.reason}: {evidence.message}") if due else Review("")
    jobs = ", ".join(sorted({e.job for e in record.evidence})) or "no job"
    what = (
        f"{reasons.NODE_QUARANTINE_LIFTED}: node {node.name} quarantined since "
        f"{contract.kube_time(record.since)} ({record.reason}; evidence from {jobs})"
    )
    if due:
        return Review("lift", f"{what} shows no evidence now")
    return Review(
        "lift",
        f"{what} booted again (boot ID {record.boot_id} -> {node.boot_id}: rebooted or re-provisioned) "
        "and shows no evidence now",
    )


def lift_if_due(obj: dict[str, Any], now: datetime) -> dict[str, Any] | None:
    """`lift_patch` of the node as read just now, if `review` still lifts it (None otherwise): the
    review loop decided on the operator's cached copy; this decides again on the copy the patch is
    sent against (its resourceVersion), so evidence that pushed `until` back, or a node unhealthy
    again, meanwhile keeps the quarantine."""
    if review(node_from_dict(obj), now).action != "lift":
        return None
    return lift_patch(obj)
