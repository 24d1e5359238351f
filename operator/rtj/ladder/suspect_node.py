"""Policy: a slot whose pod was replaced for a fault not proven its own keeps that pod's node as its
suspect, and the slot's new pods prefer other nodes (pure).

Evidence before blame (rtj.ladder.blame): a silent pod says nothing about which side failed, so its
node is neither quarantined nor counted against. With no preference at all, though, the scheduler
may put the replacement straight back on that node, and a node whose pod just went silent is often
the node that is dying: on kubelet nodes a worker replaced for its silence landed back on its node
moments before that node went NotReady, and was replaced again. So the replacement carries a
*preferred* node affinity term against the suspect (rtj.builders): never a required one, never a
taint, no budget or counter touched. Where the job needs every node its pods may use, the scheduler
still places the pod there.

Which faults make a suspect: those that spend the pod budget (`FaultClass.budget`: the cause is
unknown, or the node's), unless the pod's last report proves the training script's own error
(`blame.user_code`). Silence is never proven the pod's: its last report (an exception it recovered
from) says nothing about why it went silent. Not: waits (the pod never ran), disruptions (evicted,
preempted or deleted: nothing wrong with the node, or it is being drained and cordoned anyway),
PeersNotReady (its peers were missing), job-level recoveries (rtj.ladder.job_level: the job's own
fault, not a node's). A node with evidence against it is also quarantined (required: the builders
leave the preference out while it is).

One node per slot, the latest: a later such replacement names its own node; other replacements keep
it. It is status (nodeSlots[].suspectNode), so an operator restarted between the replacement and the
create builds the same pod.
"""

from __future__ import annotations

from rtj import reasons
from rtj.api.models import NodeSlotStatus
from rtj.ladder import blame
from rtj.ladder.observe import LeaseObs

#: A pod's silence: its cause is never proven the pod's own, whatever it last reported.
SILENCE = frozenset({reasons.HEARTBEAT_TIMEOUT, reasons.STARTUP_TIMEOUT})


def suspects(reason: str, lease: LeaseObs | None) -> bool:
    """Whether a pod replaced for `reason` makes its node the slot's suspect (`lease`: the pod's)."""
    cls = blame.CLASSES.get(reason)
    if cls is None or cls.act != blame.Act.REPLACE or not cls.budget:
        return False
    return reason in SILENCE or not blame.user_code(lease)


def note(slot: NodeSlotStatus, reason: str, lease: LeaseObs | None, node: str) -> None:
    """The slot's pod on `node` is replaced for `reason`: its node becomes the slot's suspect when
    the fault is not proven the pod's own (else the slot keeps the suspect it had)."""
    if node and suspects(reason, lease):
        slot.suspect_node = node
