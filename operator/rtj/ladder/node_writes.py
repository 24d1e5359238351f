"""Policy: writes to a Node that survive a crash, because they are part of the status write that
decided them.

A pass that quarantines a node (rtj.ladder.slots.quarantine) or records a pod fault on it writes the
decision into status.unappliedNodeWrites with the same status write that counts the pod's
replacement; the executor patches the node afterwards. Before, an operator killed between the two
lost the taint for good: the next pass found the slot already replaced and decided nothing more (the
reliability tier's churn test once ended with a NotReady node untainted). Now each pass reads the
nodes (Observed.all_nodes) for the writes still in status: one the node shows (our taint with this
job's evidence of that time; the fault in its record) is dropped, and any other is issued again. Both
patches are idempotent (rtj.ladder.quarantine.taint_patch, fault_record_patch), so issuing one again
before the node index shows the first changes nothing. A write whose node is gone, or older than a
quarantine period (its node would be reviewed by then), is dropped, and so is a quarantine of a node
that booted again since (its boot ID changed: the evidence was about the machine before the reboot).
"""

from __future__ import annotations

from datetime import datetime

from rtj.api.models import NodeWrite, NodeWriteKind
from rtj.ladder import predicates as p
from rtj.ladder.actions import Action, RecordNodeFault, TaintNode
from rtj.ladder.observe import NodeObs
from rtj.ladder.pass_state import Pass

#: Node writes kept in status at most (the oldest dropped): bounds status size.
MAX_UNAPPLIED = 32


def write_time(now: datetime) -> datetime:
    """A write's time, in whole seconds: it identifies the write on the node after both round trips
    (status and node annotation)."""
    return now.replace(microsecond=0)


def action(w: NodeWrite, job: str) -> Action:
    if w.kind == NodeWriteKind.QUARANTINE:
        return TaintNode(w.node, w.reason, job, w.message, w.until, w.time)
    return RecordNodeFault(w.node, job, w.reason, w.time)


def decide(ps: Pass, w: NodeWrite) -> None:
    """Record the write in status and issue it."""
    ps.st.unapplied_node_writes = [*ps.st.unapplied_node_writes, w][-MAX_UNAPPLIED:]
    ps.d.actions.append(action(w, ps.job_key))


def applied(w: NodeWrite, node: NodeObs, job: str) -> bool:
    """The node shows the write."""
    if w.kind == NodeWriteKind.QUARANTINE:
        record = node.quarantine
        return (
            node.quarantined
            and record is not None
            and any(e.job == job and e.time == w.time for e in record.evidence)
        )
    return any(f.job == job and f.reason == w.reason and f.time == w.time for f in node.faults)


def rebooted_since(w: NodeWrite, node: NodeObs) -> bool:
    """The node booted again since the pass decided its quarantine (its boot ID differs, both known):
    the evidence was about the machine before its reboot, as rtj.ladder.quarantine.review holds."""
    known = bool(w.boot_id and node.boot_id)
    return w.kind == NodeWriteKind.QUARANTINE and known and w.boot_id != node.boot_id


def carry(ps: Pass) -> None:
    """Issue again what status says was decided and its node does not show yet; drop the rest. Runs
    before the pass decides anything new. An empty node index (not filled yet) drops nothing."""
    if not ps.st.unapplied_node_writes:
        return
    nodes = {n.name: n for n in ps.obs.all_nodes}
    kept: list[NodeWrite] = []
    for w in ps.st.unapplied_node_writes:
        node = nodes.get(w.node)
        if nodes and node is None:
            continue  # the node is gone: nothing to taint or record
        if node is not None and (applied(w, node, ps.job_key) or rebooted_since(w, node)):
            continue
        if ps.now >= p.after(w.time, ps.cfg.quarantine_seconds):
            continue
        kept.append(w)
        ps.d.actions.append(action(w, ps.job_key))
    ps.st.unapplied_node_writes = kept
